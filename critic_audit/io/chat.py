"""Read OpenAI chat-completions conversations into :class:`critic_audit.schema.Conversation` records.

Accepted containers (auto-detected; see ``docs/input_formats.md``):

* a JSON array of records;
* a JSON object keyed by trajectory id whose values are records;
* a single JSON record (an object with a messages field), or a single bare list of messages;
* JSONL / NDJSON, one record per line (by extension ``.jsonl``/``.ndjson``, or by content);
* a directory: every ``*.json``, ``*.jsonl`` and ``*.ndjson`` file directly inside it, in sorted order.

A record is an object holding a list of messages (under ``messages``, ``traj``, ... or the key
named by :attr:`ChatReadOptions.messages_key`), or a bare list of messages.

Every problem with the input raises :class:`critic_audit.errors.InputError` whose one-line message
names the file, the record (index, and id when known) and the fix.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from critic_audit.errors import ConfigError, InputError
from critic_audit.schema import ROLES, Conversation

__all__ = [
    "ChatReadOptions",
    "read_chat",
    "iter_chat",
    "write_chat_jsonl",
    "MESSAGES_KEYS",
    "REWARD_KEYS",
    "SUCCESS_KEYS",
    "ID_KEYS",
    "GROUP_KEYS",
    "CHECKPOINT_KEYS",
    "ROLE_ALIASES",
]

#: Auto-detected field names, tried in this order (the first one present in a record is used).
MESSAGES_KEYS = ("messages", "traj", "conversation", "conversations", "trajectory", "chat", "dialog")
REWARD_KEYS = ("reward", "score", "return", "outcome_reward")
SUCCESS_KEYS = ("success", "is_success", "resolved", "correct", "solved")
ID_KEYS = ("id", "trajectory_id", "traj_id", "uid")
GROUP_KEYS = ("group_id", "prompt_id", "task_id", "question_id", "instance_id")
CHECKPOINT_KEYS = ("checkpoint", "step", "global_step")

#: Roles accepted besides :data:`critic_audit.schema.ROLES`, and the role they are read as.
ROLE_ALIASES = {"developer": "system", "function": "tool"}

#: File extensions read as JSONL without trying whole-file JSON first.
JSONL_SUFFIXES = (".jsonl", ".ndjson")
#: File extensions read from a directory.
DIR_SUFFIXES = (".json", ".jsonl", ".ndjson")

#: Content-part types whose ``text`` is kept (other parts, e.g. images, are dropped).
_TEXT_PART_TYPES = ("text", "input_text", "output_text")


@dataclass(frozen=True)
class ChatReadOptions:
    """How to read chat files. Every ``*_key`` left as None is auto-detected per record."""

    messages_key: str | None = None
    """Field holding the list of messages. Auto: the first present of :data:`MESSAGES_KEYS`
    (``messages, traj, conversation, conversations, trajectory, chat, dialog``)."""

    reward_key: str | None = None
    """Field holding the outcome reward. Auto: the first present of :data:`REWARD_KEYS`
    (``reward, score, return, outcome_reward``)."""

    success_key: str | None = None
    """Field holding the boolean success label. Auto: the first present of :data:`SUCCESS_KEYS`
    (``success, is_success, resolved, correct, solved``)."""

    id_key: str | None = None
    """Field holding the trajectory id. Auto: the first present of :data:`ID_KEYS`
    (``id, trajectory_id, traj_id, uid``). Without one, an object keyed by id uses its key, and
    anything else gets ``{file stem}:{index}``."""

    group_key: str | None = None
    """Field holding the group (prompt/task) id, stringified. Auto: the first present of
    :data:`GROUP_KEYS` (``group_id, prompt_id, task_id, question_id, instance_id``). None without one."""

    checkpoint_key: str | None = None
    """Field holding the checkpoint / training-step label, stringified. Auto: the first present of
    :data:`CHECKPOINT_KEYS` (``checkpoint, step, global_step``)."""

    source: str | None = None
    """Data-set name stored on every conversation. Default: the stem of the file it came from."""

    checkpoint: str | None = None
    """Constant checkpoint label for every conversation; overrides the checkpoint field."""

    success_threshold: float = 0.5
    """Without a success field, ``success = reward >= success_threshold``."""

    require_reward: bool = True
    """True: a record without a reward is an error. False: it is read with reward None, and success
    from its success field or None."""

    def __post_init__(self) -> None:
        t = self.success_threshold
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t):
            raise ConfigError(
                f"success_threshold must be a finite number, got {t!r}",
                fix="pass a number such as 0.5",
            )
        for f in ("messages_key", "reward_key", "success_key", "id_key", "group_key", "checkpoint_key"):
            v = getattr(self, f)
            if v is not None and (not isinstance(v, str) or not v):
                raise ConfigError(f"{f} must be a non-empty string or None, got {v!r}",
                                  fix=f"pass the field name as a string for {f}")


# --------------------------------------------------------------------------------------------- helpers


def _short(value: Any, limit: int = 60) -> str:
    """A one-line repr of ``value``, cut to ``limit`` characters."""
    r = repr(value)
    return r if len(r) <= limit else r[: limit - 3] + "..."


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, (list, tuple)):
        return "array"
    if isinstance(value, Mapping):
        return "object"
    return type(value).__name__


def _keys_seen(d: Mapping[str, Any], limit: int = 12) -> str:
    keys = [str(k) for k in d]
    shown = ", ".join(repr(k) for k in keys[:limit])
    if len(keys) > limit:
        shown += f", ... ({len(keys)} keys)"
    return f"[{shown}]"


class _Ctx:
    """Where a record sits, for error messages and ``Conversation.record``."""

    __slots__ = ("path", "index", "line", "key", "tid")

    def __init__(self, path: Path, index: int, line: int | None = None, key: str | None = None) -> None:
        self.path = path
        self.index = index
        self.line = line
        self.key = key
        self.tid: str | None = None

    def label(self, with_id: bool = True) -> str:
        extra = []
        if self.line is not None:
            extra.append(f"line {self.line}")
        if self.key is not None:
            extra.append(f"key {_short(self.key, 40)}")
        if with_id and self.tid is not None and self.tid != self.key:
            extra.append(f"id {_short(self.tid, 40)}")
        return f"{self.index} ({', '.join(extra)})" if extra else str(self.index)

    def error(self, problem: str, fix: str) -> InputError:
        return InputError(problem, path=self.path, record=self.label(), fix=fix)


def _pick(record: Mapping[str, Any], explicit: str | None, candidates: Sequence[str]) -> str | None:
    """The field to use: ``explicit`` if given (even when absent), else the first candidate present."""
    if explicit is not None:
        return explicit if explicit in record else None
    for k in candidates:
        if k in record:
            return k
    return None


def _label_value(value: Any, what: str, field: str, ctx: _Ctx) -> str | None:
    """Stringify an id / group / checkpoint value (string or number); None stays None."""
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, float) and math.isfinite(value):
        return str(int(value)) if value.is_integer() else repr(value)
    raise ctx.error(
        f"{what} field {field!r} is {_type_name(value)} {_short(value)}, not a string or number",
        fix=f"make {field!r} a string or a number, or name another field with --{what.replace(' ', '-')}-key",
    )


# --------------------------------------------------------------------------------------------- messages


def _content(value: Any, m_index: int, ctx: _Ctx) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list):
        texts: list[str] = []
        for p_index, part in enumerate(value):
            if isinstance(part, str):
                texts.append(part)
                continue
            if isinstance(part, Mapping):
                ptype = part.get("type")
                if ptype in _TEXT_PART_TYPES or (ptype is None and "text" in part):
                    text = part.get("text")
                    if not isinstance(text, str):
                        raise ctx.error(
                            f"message {m_index}: content part {p_index} has text of type {_type_name(text)}, "
                            "not a string",
                            fix='write text parts as {"type": "text", "text": "..."}',
                        )
                    texts.append(text)
                    continue
                if isinstance(ptype, str):
                    continue  # image_url, input_audio, ...: not text, dropped
            raise ctx.error(
                f"message {m_index}: content part {p_index} is {_type_name(part)} {_short(part)}, "
                "not a content-part object",
                fix='write content as a string or a list of {"type": "text", "text": "..."} parts',
            )
        return "".join(texts) if texts else None
    raise ctx.error(
        f"message {m_index}: content is {_type_name(value)} {_short(value)}, not a string, null or a list of parts",
        fix='write content as a string, null, or a list of {"type": "text", "text": "..."} parts',
    )


def _arguments(value: Any, m_index: int, c_index: int, ctx: _Ctx) -> Any:
    """Parse a JSON-string ``arguments`` into an object; keep the raw string where it is not one."""
    if value is None:
        return {}
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except (ValueError, RecursionError):
            return value
        return parsed if isinstance(parsed, dict) else value
    raise ctx.error(
        f"message {m_index}: tool call {c_index} has arguments of type {_type_name(value)}, "
        "not a JSON string or object",
        fix="write function.arguments as a JSON-encoded string (OpenAI format) or an object",
    )


def _opt_str(value: Any, what: str, m_index: int, ctx: _Ctx) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    raise ctx.error(
        f"message {m_index}: {what} is {_type_name(value)} {_short(value)}, not a string",
        fix=f"write {what} as a string",
    )


def _tool_calls(value: Any, m_index: int, ctx: _Ctx) -> list[dict[str, Any]]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise ctx.error(
            f"message {m_index}: tool_calls is {_type_name(value)}, not a list",
            fix='write tool_calls as [{"id", "type": "function", "function": {"name", "arguments"}}]',
        )
    calls = []
    for c_index, call in enumerate(value):
        fn = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
            raise ctx.error(
                f"message {m_index}: tool call {c_index} is not "
                '{"id", "type": "function", "function": {"name": str, "arguments"}}',
                fix="write each tool call in the OpenAI chat-completions format",
            )
        ctype = call.get("type")
        if ctype is None:
            ctype = "function"
        elif not isinstance(ctype, str):
            raise ctx.error(f"message {m_index}: tool call {c_index} has type of type {_type_name(ctype)}",
                            fix='write "type": "function"')
        calls.append({
            "id": _opt_str(call.get("id"), f"tool call {c_index} id", m_index, ctx),
            "type": ctype,
            "function": {"name": fn["name"], "arguments": _arguments(fn.get("arguments"), m_index, c_index, ctx)},
        })
    return calls


def _message(m: Any, m_index: int, ctx: _Ctx) -> dict[str, Any]:
    """Normalize one message to the canonical shape (see ``docs/input_formats.md``)."""
    if not isinstance(m, Mapping):
        raise ctx.error(
            f"message {m_index} is {_type_name(m)} {_short(m)}, not an object",
            fix='write each message as {"role": ..., "content": ...}',
        )
    role = m.get("role")
    if not isinstance(role, str) or role.strip().lower() not in (*ROLES, *ROLE_ALIASES):
        got = "no role" if "role" not in m else f"unknown role {_short(role)}"
        fix = f"use one of the roles {list(ROLES)} (developer and function are read as system and tool)"
        if "role" not in m and "from" in m:
            fix = "convert ShareGPT-style {from, value} messages to OpenAI {role, content} messages"
        raise ctx.error(f"message {m_index} has {got}", fix=fix)
    role = role.strip().lower()
    role = ROLE_ALIASES.get(role, role)
    out: dict[str, Any] = {"role": role, "content": _content(m.get("content"), m_index, ctx)}
    name = _opt_str(m.get("name"), "name", m_index, ctx)
    if role == "assistant":
        calls = _tool_calls(m.get("tool_calls"), m_index, ctx)
        legacy = m.get("function_call")
        if legacy is not None:  # deprecated single function call -> one tool call without id
            calls += _tool_calls([{"type": "function", "function": legacy}], m_index, ctx)
        if calls:
            out["tool_calls"] = calls
    elif role == "tool":
        tcid = _opt_str(m.get("tool_call_id"), "tool_call_id", m_index, ctx)
        if tcid is not None:
            out["tool_call_id"] = tcid
    if name is not None:
        out["name"] = name
    return out


# --------------------------------------------------------------------------------------------- records


def _reward(value: Any, field: str, ctx: _Ctx) -> float:
    bad_fix = f"write {field!r} as a number (or true/false), or name another field with --reward-key"
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    if isinstance(value, str):
        try:
            r = float(value.strip())
        except ValueError:
            raise ctx.error(f"reward {field!r} is the non-numeric string {_short(value)}", fix=bad_fix) from None
    elif isinstance(value, (int, float)):
        try:
            r = float(value)
        except OverflowError:
            raise ctx.error(f"reward {field!r} = {_short(value)} is too large", fix=bad_fix) from None
    else:
        raise ctx.error(f"reward {field!r} is {_type_name(value)} {_short(value)}, not a number", fix=bad_fix)
    if math.isnan(r):
        raise ctx.error(f"reward {field!r} is NaN",
                        fix="give the record a finite reward, or drop the record")
    if math.isinf(r):
        raise ctx.error(f"reward {field!r} is infinite ({_short(value)})",
                        fix="give the record a finite reward, or drop the record")
    return r


def _success(value: Any, field: str, ctx: _Ctx) -> bool | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    raise ctx.error(
        f"success field {field!r} is {_type_name(value)} {_short(value)}, not true/false",
        fix=f"write {field!r} as true/false (or 0/1), or name another field with --success-key",
    )


def _conversation(
    raw: Any, ctx: _Ctx, opts: ChatReadOptions, source: str
) -> Conversation:
    """Turn one raw record into a Conversation (ctx.tid is set as soon as the id is known)."""
    record: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
    # the id first, so that every later error can name it
    id_key = _pick(record, opts.id_key, ID_KEYS)
    tid = None
    if id_key is not None:
        tid = _label_value(record[id_key], "id", id_key, ctx)
    ctx.tid = tid  # named in errors (a key or a generated id adds nothing to the record label)
    if tid is None:
        tid = ctx.key if ctx.key is not None else f"{ctx.path.stem}:{ctx.index}"

    if isinstance(raw, list):
        raw_messages: Any = raw
        m_key = None
    elif isinstance(raw, Mapping):
        m_key = _pick(record, opts.messages_key, MESSAGES_KEYS)
        if m_key is None:
            wanted = repr(opts.messages_key) if opts.messages_key else f"any of {list(MESSAGES_KEYS)}"
            raise ctx.error(
                f"no messages list: record has no field {wanted}; keys seen: {_keys_seen(record)}",
                fix="name the messages field with --messages-key",
            )
        raw_messages = record[m_key]
    else:
        raise ctx.error(
            f"record is {_type_name(raw)} {_short(raw)}, not an object or a list of messages",
            fix='write each record as {"messages": [...], "reward": ...} or a list of messages',
        )

    used = {k for k in (m_key, id_key) if k is not None}
    if not isinstance(raw_messages, list):
        raise ctx.error(
            f"messages field {m_key!r} is {_type_name(raw_messages)} {_short(raw_messages, 40)}, "
            "not a list of messages",
            fix="convert the record to a list of OpenAI chat messages, or name the right field with --messages-key",
        )
    messages = [_message(m, i, ctx) for i, m in enumerate(raw_messages)]

    from critic_audit.io.common import InputOptions, record_fields

    # reward, success (reward >= opts.success_threshold without a success field), group, checkpoint
    fields = record_fields(record, ctx, opts, InputOptions(success_threshold=opts.success_threshold),
                           default_id=tid)
    used |= fields.used
    reward, success, group, checkpoint = fields.reward, fields.success, fields.group_id, fields.checkpoint

    metadata = {str(k): v for k, v in record.items() if k not in used}
    return Conversation(
        trajectory_id=tid,
        messages=messages,
        reward=reward,
        success=success,
        group_id=group,
        checkpoint=checkpoint,
        source=source,
        metadata=metadata,
        record=f"{ctx.path.name}: record {ctx.label(with_id=False)}",
    )


# --------------------------------------------------------------------------------------------- containers


def _read_text(path: Path) -> str:
    try:
        data = path.read_bytes()
    except OSError as e:
        raise InputError(f"cannot read the file ({e.strerror or e})", path=path,
                         fix="check the path and its permissions") from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise InputError(f"not UTF-8 text (bad byte at offset {e.start})", path=path,
                         fix="write the file as UTF-8 JSON or JSONL") from None


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _decode_problem(e: json.JSONDecodeError, line: int | None = None) -> str:
    return f"malformed JSON at line {line if line is not None else e.lineno}, column {e.colno}: {e.msg}"


def _looks_like_messages(items: list[Any], opts: ChatReadOptions) -> bool:
    """A top-level array that is one bare conversation (every item a message object with a role)."""
    keys = (opts.messages_key,) if opts.messages_key else MESSAGES_KEYS
    return bool(items) and all(
        isinstance(x, Mapping) and isinstance(x.get("role"), str) and not any(k in x for k in keys)
        for x in items
    )


def _records_of_json(doc: Any, path: Path, opts: ChatReadOptions) -> Iterator[tuple[Any, _Ctx]]:
    if isinstance(doc, list):
        if _looks_like_messages(doc, opts):
            yield doc, _Ctx(path, 0)
            return
        for i, rec in enumerate(doc):
            yield rec, _Ctx(path, i)
        return
    if isinstance(doc, Mapping):
        keys = (opts.messages_key,) if opts.messages_key else MESSAGES_KEYS
        if any(k in doc for k in keys):  # one record
            yield doc, _Ctx(path, 0)
            return
        if doc and all(isinstance(v, (Mapping, list)) for v in doc.values()):  # keyed by id
            for i, (k, rec) in enumerate(doc.items()):
                yield rec, _Ctx(path, i, key=str(k))
            return
        if not doc:
            return
        wanted = repr(opts.messages_key) if opts.messages_key else f"any of {list(MESSAGES_KEYS)}"
        raise InputError(
            "unknown format: a JSON object that is neither one record (no messages field "
            f"{wanted}) nor an object of records keyed by id; keys seen: {_keys_seen(doc)}",
            path=path,
            fix="name the messages field with --messages-key, or write an array / JSONL of records",
        )
    raise InputError(
        f"unknown format: the top-level JSON value is {_type_name(doc)} {_short(doc, 40)}, "
        "not an array or object of records",
        path=path,
        fix="write a JSON array of records, an object keyed by id, or JSONL (one record per line)",
    )


def _records_of_jsonl(text: str, path: Path) -> Iterator[tuple[Any, _Ctx]]:
    index = 0
    # split on "\n" only: str.splitlines() would also split inside strings holding U+2028 etc.
    for line_no, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise InputError(
                _decode_problem(e, line_no), path=path, record=f"{index} (line {line_no})",
                fix="make every line one complete JSON record (JSONL), or repair the JSON",
            ) from None
        except (ValueError, RecursionError) as e:  # nesting too deep, an integer too long, ...
            raise InputError(f"unreadable JSON at line {line_no} ({_first_line(e)})", path=path,
                             record=f"{index} (line {line_no})", fix="simplify the record") from None
        yield rec, _Ctx(path, index, line=line_no)
        index += 1


def _records_of_file(path: Path, opts: ChatReadOptions) -> Iterator[tuple[Any, _Ctx]]:
    text = _read_text(path)
    if path.suffix.lower() in JSONL_SUFFIXES:  # an empty JSONL file holds no records
        yield from _records_of_jsonl(text, path)
        return
    if not text.strip():
        raise InputError("the file is empty", path=path,
                         fix="write a JSON array of records, an object keyed by id, or JSONL")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        if e.msg == "Extra data":  # several JSON values: JSONL by content
            yield from _records_of_jsonl(text, path)
            return
        raise InputError(_decode_problem(e), path=path,
                         fix="repair the JSON (for one record per line, name the file .jsonl)") from None
    except (ValueError, RecursionError) as e:  # nesting too deep, an integer too long, ...
        raise InputError(f"unreadable JSON ({_first_line(e)})", path=path, fix="simplify the records") from None
    yield from _records_of_json(doc, path, opts)


def _files(path: Path) -> list[Path]:
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.is_file() and p.suffix.lower() in DIR_SUFFIXES)
        if not files:
            raise InputError(
                "the directory holds no *.json, *.jsonl or *.ndjson files", path=path,
                fix="point at a chat file, or at a directory of them",
            )
        return files
    if not path.exists():
        raise InputError("no such file or directory", path=path, fix="check the path")
    return [path]


def iter_chat(path: str | Path, options: ChatReadOptions | None = None) -> Iterator[Conversation]:
    """Yield the conversations of a chat file or directory, one at a time, in file order.

    Raises:
        InputError: missing file, empty directory, unknown format, malformed JSON, a bad message,
            a missing / non-numeric / NaN reward, or a duplicate trajectory id.
    """
    opts = options if options is not None else ChatReadOptions()
    root = Path(path)
    seen: dict[str, tuple[Path, str]] = {}
    for file in _files(root):
        source = opts.source if opts.source is not None else file.stem
        for raw, ctx in _records_of_file(file, opts):
            conv = _conversation(raw, ctx, opts, source)
            prev = seen.get(conv.trajectory_id)
            if prev is not None:
                other = f"record {prev[1]}" if prev[0] == file else f"{prev[0]}: record {prev[1]}"
                raise ctx.error(
                    f"duplicate trajectory id {conv.trajectory_id!r} (also {other})",
                    fix="make the ids unique, name another id field with --id-key, "
                        "or read the files one at a time",
                )
            seen[conv.trajectory_id] = (file, ctx.label(with_id=False))
            yield conv


def read_chat(path: str | Path, options: ChatReadOptions | None = None) -> list[Conversation]:
    """Read every conversation of a chat file or directory (see :func:`iter_chat`)."""
    return list(iter_chat(path, options))


# --------------------------------------------------------------------------------------------- writing


#: Fields :func:`write_chat_jsonl` writes; metadata keys may not reuse them.
_WRITTEN = ("id", "messages", "reward", "success", "group_id", "checkpoint")


def write_chat_jsonl(convs: Sequence[Conversation], path: str | Path) -> Path:
    """Write conversations as JSONL that :func:`read_chat` reads back to equal records.

    Each line is ``{"id", "messages", "reward", "success", "group_id", "checkpoint", **metadata}``.
    ``source`` is not written (it is the file stem, or ChatReadOptions.source, on reading), nor is
    ``record``.

    Raises:
        ValueError: a metadata key collides with one of the written fields.
    """
    from critic_audit.outputs import atomic_write

    return atomic_write(path, lambda tmp: _write_chat_lines(convs, tmp))


def _write_chat_lines(convs: Sequence[Conversation], out: Path) -> None:
    with out.open("w", encoding="utf-8") as fh:
        for c in convs:
            clash = [k for k in c.metadata if k in _WRITTEN]
            if clash:
                raise ValueError(f"{c.trajectory_id!r}: metadata key(s) {clash} collide with written fields")
            rec = {
                "id": c.trajectory_id,
                "messages": c.messages,
                "reward": c.reward,
                "success": c.success,
                "group_id": c.group_id,
                "checkpoint": c.checkpoint,
                **c.metadata,
            }
            fh.write(json.dumps(rec, ensure_ascii=False, default=str) + "\n")
