"""Read SWE-agent / mini-swe-agent trajectory files into :class:`Conversation` records, with success
labels joined from a separate results file.

* SWE-agent: ``<instance>.traj`` (or ``.traj.json``) ``{"trajectory": [...], "history": [...],
  "info": {...}}``; ``history`` holds the messages the model saw (roles system/user/assistant/tool,
  ``tool_calls`` in the chat-completions layout, content strings or text-part lists). Without
  ``history`` the messages are rebuilt from ``trajectory`` (the first step's ``query``, then each
  step's ``response`` and ``observation``).
* mini-swe-agent: ``<instance>.traj.json`` ``{"messages": [...], "info": {...}}``.

A message with the non-standard role ``exit`` (and any other role outside system/user/assistant/tool)
is dropped and counted in the metadata field ``dropped_roles``. Long observations are kept whole; the
tokenizer's truncation policy (``--max-length``, ``--overlong``) deals with them.

**Labels** (:func:`load_labels`): SWE-bench's results JSON (``resolved_ids`` or ``resolved`` lists;
an instance it lists elsewhere, e.g. in ``unresolved_ids``, is unresolved), a JSON object
``{id: bool}`` or ``{id: {"resolved": bool}}``, or a JSON array / JSONL of ``{"instance_id", "resolved"}``
records.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from critic_audit.errors import InputError
from critic_audit.io.chat import SUCCESS_KEYS, ChatReadOptions, _Ctx, _message, _short, _type_name
from critic_audit.io.common import (
    IdRegistry, InputOptions, ReadReport, error, guarded, iter_jsonl, load_json, _JSONL,
)
from critic_audit.schema import ROLES, Conversation

__all__ = ["Labels", "load_labels", "iter_swe", "read_swe", "is_swe_record", "swe_files", "instance_id_of"]

TRAJ_SUFFIXES = (".traj.json", ".traj")
DEFAULT_LABELS_KEY = "instance_id"
#: Lists of a SWE-bench results JSON that name instances (resolved or not).
_REPORT_LISTS = ("submitted_ids", "completed_ids", "unresolved_ids", "error_ids", "empty_patch_ids",
                 "incomplete_ids", "unstopped_ids")
_RESOLVED_LISTS = ("resolved_ids", "resolved")
#: Fields of ``info`` left out of the metadata (the patch can be large).
_INFO_DROP = ("submission",)


def is_swe_record(rec: Any) -> bool:
    """A SWE-agent / mini-swe-agent trajectory (used by format detection)."""
    if not isinstance(rec, Mapping):
        return False
    if isinstance(rec.get("history"), list) and ("trajectory" in rec or "info" in rec):
        return True
    info = rec.get("info")
    if isinstance(rec.get("messages"), list) and isinstance(info, Mapping):
        if any(k in info for k in ("exit_status", "submission", "mini_version", "model_stats")):
            return True
    fmt = rec.get("trajectory_format")
    return isinstance(fmt, str) and fmt.startswith("mini-swe-agent")


def swe_files(path: Path) -> list[Path]:
    """``path`` itself, or every ``*.traj`` / ``*.traj.json`` below the directory ``path`` (recursive:
    SWE-agent writes ``<run>/<instance>/<instance>.traj``), in sorted order."""
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.name.lower().endswith(TRAJ_SUFFIXES))
        if not files:
            raise InputError("the directory holds no *.traj / *.traj.json files", path=path,
                             fix="point at a SWE-agent or mini-swe-agent output folder")
        return files
    if not path.exists():
        raise InputError("no such file or directory", path=path, fix="check the path")
    return [path]


def _stem(file: Path) -> str:
    name = file.name
    for s in TRAJ_SUFFIXES + (".json",):
        if name.lower().endswith(s):
            return name[: -len(s)]
    return file.stem


def instance_id_of(rec: Mapping[str, Any], file: Path, key: str | None) -> str:
    """The join key of a trajectory: ``key`` (default ``instance_id``) at the top level or in
    ``info``, else the file name without ``.traj`` / ``.traj.json``."""
    k = key or DEFAULT_LABELS_KEY
    info = rec.get("info") if isinstance(rec.get("info"), Mapping) else {}
    for src in (rec, info):
        v = src.get(k)
        if isinstance(v, (str, int)) and not isinstance(v, bool):
            return str(v)
    return _stem(file)


# --------------------------------------------------------------------------------------------- labels


@dataclass
class Labels:
    """Success labels by id. ``listed``: every id the file names; ``closed``: an id the file does not
    name is unresolved (a SWE-bench report with only a resolved list)."""

    resolved: dict[str, bool]
    path: str
    closed: bool = False

    def get(self, key: str) -> bool | None:
        if key in self.resolved:
            return self.resolved[key]
        return False if self.closed else None


def _bool_label(v: Any, where: str, path: Path) -> bool:
    if isinstance(v, Mapping):
        for k in SUCCESS_KEYS:
            if k in v:
                v = v[k]
                break
        else:
            raise InputError(f"{where}: no resolved field (keys {sorted(map(str, v))[:8]})", path=path,
                             fix='write {"resolved": true|false} per instance')
    if isinstance(v, bool):
        return v
    if isinstance(v, (int, float)) and v in (0, 1):
        return bool(v)
    raise InputError(f"{where}: label {_short(v)} is not true/false", path=path,
                     fix="write each label as true/false")


def load_labels(path: str | Path, key: str | None = None) -> Labels:
    """Read a labels file (see the module docstring). ``key``: the id field of label records
    (default ``instance_id``).

    Raises:
        InputError: a missing or unreadable file, or a layout that is none of the accepted ones.
    """
    p = Path(path)
    k = key or DEFAULT_LABELS_KEY
    if not p.is_file():
        raise InputError("no such labels file", path=p, fix="check the --labels path")
    doc = load_json(p) if not p.name.lower().endswith((".jsonl", ".ndjson")) else _JSONL
    records: list[tuple[Any, str]]
    if doc is _JSONL:
        records = [(rec, f"record {ctx.index} (line {ctx.line})") for rec, ctx in iter_jsonl(p)]
    elif isinstance(doc, Mapping) and any(isinstance(doc.get(n), list) for n in _RESOLVED_LISTS):
        lists = [n for n in _RESOLVED_LISTS if isinstance(doc.get(n), list)]
        resolved = {str(x): True for x in doc[lists[0]]}
        named = [n for n in _REPORT_LISTS if isinstance(doc.get(n), list)]
        out = {str(x): False for n in named for x in doc[n]}
        out.update(resolved)
        return Labels(out, str(p), closed=not named)
    elif isinstance(doc, Mapping):
        return Labels({str(i): _bool_label(v, f"id {_short(i, 40)}", p) for i, v in doc.items()}, str(p))
    elif isinstance(doc, list):
        records = [(rec, f"record {i}") for i, rec in enumerate(doc)]
    else:
        raise InputError(f"labels file holds {_type_name(doc)}, not an object or array", path=p,
                         fix='write {"<instance_id>": true|false, ...}, SWE-bench results JSON, or JSONL records')
    out = {}
    for rec, where in records:
        if not isinstance(rec, Mapping) or k not in rec:
            raise InputError(f"{where} has no id field {k!r}", path=p,
                             fix=f"give every label record the field {k!r}, or name it with --labels-key")
        out[str(rec[k])] = _bool_label(rec, where, p)
    return Labels(out, str(p))


# --------------------------------------------------------------------------------------------- trajectories


def _messages_from_steps(steps: list[Any], ctx: _Ctx) -> list[Any]:
    msgs: list[Any] = []
    for i, st in enumerate(steps):
        if not isinstance(st, Mapping):
            raise error(ctx, "bad_step", f"trajectory step {i} is {_type_name(st)}, not an object",
                        "write SWE-agent trajectory steps as objects")
        if i == 0 and isinstance(st.get("query"), list):
            msgs.extend(m for m in st["query"] if not (isinstance(m, Mapping) and m.get("role") == "assistant"))
        resp = st.get("response")
        if resp is None:
            resp = "\n".join(str(st.get(k) or "") for k in ("thought", "action")).strip()
        msgs.append({"role": "assistant", "content": resp})
        if st.get("observation") is not None:
            msgs.append({"role": "user", "content": st["observation"]})
    return msgs


def _conversation(raw: Any, ctx: _Ctx, file: Path, opts: ChatReadOptions, iopts: InputOptions,
                  labels: Labels | None, source: str) -> Conversation:
    if not isinstance(raw, Mapping):
        raise error(ctx, "not_an_object", f"trajectory file holds {_type_name(raw)} {_short(raw)}, not an object",
                    'write {"history": [...], "info": {...}} (SWE-agent) or {"messages": [...], "info": {...}}')
    iid = instance_id_of(raw, file, iopts.labels_key)
    ctx.tid = iid
    if isinstance(raw.get("history"), list):
        raw_msgs, used = raw["history"], "history"
    elif isinstance(raw.get("messages"), list):
        raw_msgs, used = raw["messages"], "messages"
    elif isinstance(raw.get("trajectory"), list):
        raw_msgs, used = _messages_from_steps(raw["trajectory"], ctx), "trajectory"
    else:
        raise error(ctx, "no_messages", f"no history / messages / trajectory list; keys {sorted(map(str, raw))[:10]}",
                    "point at SWE-agent *.traj or mini-swe-agent *.traj.json files")
    msgs = []
    dropped: dict[str, int] = {}
    for i, m in enumerate(raw_msgs):
        if isinstance(m, Mapping):
            role = m.get("role")
            if isinstance(role, str) and role.strip().lower() not in (*ROLES, "developer", "function"):
                dropped[role] = dropped.get(role, 0) + 1
                continue
            if role == "tool" and m.get("tool_call_id") is None and isinstance(m.get("tool_call_ids"), list) \
                    and m["tool_call_ids"]:
                m = {**m, "tool_call_id": m["tool_call_ids"][0]}
        msgs.append(_message(m, i, ctx))
    info = raw.get("info") if isinstance(raw.get("info"), Mapping) else {}
    success = None
    if labels is not None:
        success = labels.get(iid)
        if success is None and opts.require_reward:
            raise error(ctx, "no_label", f"instance {iid!r} has no label in {labels.path}",
                        "add it to the labels file, check --labels-key, or pass --no-reward")
    elif opts.require_reward:
        raise error(ctx, "no_label", "SWE trajectories carry no success label",
                    "pass --labels RESULTS_FILE (SWE-bench results JSON or id -> resolved), or --no-reward")
    reward = None if success is None else (1.0 if success else 0.0)
    meta: dict[str, Any] = {"instance_id": iid, "messages_from": used}
    meta.update({f"info_{k}": v for k, v in info.items() if k not in _INFO_DROP})
    if dropped:
        meta["dropped_roles"] = dropped
    return Conversation(trajectory_id=iid, messages=msgs, reward=reward, success=success, group_id=iid,
                        checkpoint=opts.checkpoint, source=source, metadata=meta,
                        record=f"{file.name}: record 0")


def iter_swe(
    path: str | Path,
    options: ChatReadOptions | None = None,
    input_options: InputOptions | None = None,
    report: ReadReport | None = None,
) -> Iterator[Conversation]:
    """Yield one conversation per trajectory file below ``path``; the trajectory id and group id are
    the instance id (:func:`instance_id_of`), success and reward (1/0) come from
    ``input_options.labels``.

    Raises:
        InputError: a bad trajectory (strict mode), an instance with no label (unless
            ``require_reward=False``), a bad labels file, or two files of one instance.
    """
    opts = options or ChatReadOptions()
    iopts = input_options or InputOptions()
    labels = load_labels(iopts.labels, iopts.labels_key) if iopts.labels is not None else None
    ids = IdRegistry()
    root = Path(path)
    for file in swe_files(root):
        source = opts.source if opts.source is not None else (root.name if root.is_dir() else _stem(file))
        ctx = _Ctx(file, 0)

        def convert(file: Path = file, ctx: _Ctx = ctx) -> Conversation:
            doc = load_json(file)
            if doc is _JSONL:
                raise error(ctx, "malformed_json", "several JSON values in one trajectory file",
                            "write one trajectory object per *.traj file")
            conv = _conversation(doc, ctx, file, opts, iopts, labels, source)
            ids.check(conv.trajectory_id, ctx)
            return conv

        conv = guarded(convert, iopts.lenient, report)
        if conv is not None:
            yield conv


def read_swe(path: str | Path, options: ChatReadOptions | None = None,
             input_options: InputOptions | None = None, report: ReadReport | None = None) -> list[Conversation]:
    """Read every trajectory below ``path`` (see :func:`iter_swe`)."""
    return list(iter_swe(path, options, input_options, report))

