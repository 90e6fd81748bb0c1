"""Shared pieces of the non-chat readers: options, the lenient-skip report, streaming record
iteration (JSONL line by line, JSON files whole) and the reward -> success rule.

See ``docs/input_formats.md`` ("Other formats").
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from critic_audit.errors import ConfigError, InputError

if TYPE_CHECKING:
    import polars as pl
from critic_audit.io.chat import JSONL_SUFFIXES, _Ctx, _read_text, _decode_problem, _first_line, _keys_seen, _short, _type_name

__all__ = ["InputOptions", "ReadReport", "FORMATS", "success_of", "iter_json_records", "reason_of"]

#: Formats ``--format`` accepts (``auto`` detects one per input).
FORMATS = ("auto", "chat", "responses", "react", "swe", "tokenized")

#: How reasoning items / reasoning text are handled in chat-like formats.
REASONING_MODES = ("text", "drop")


@dataclass(frozen=True)
class InputOptions:
    """Options of the non-chat readers (the chat field names stay in :class:`ChatReadOptions`).

    Attributes:
        format: one of :data:`FORMATS`; ``auto`` detects the format of each input.
        lenient: False (default): the first bad record raises :class:`InputError`. True: bad records
            are skipped and counted per reason in :class:`ReadReport`.
        labels: a file of success labels joined on an id (SWE-bench results, or a JSON/JSONL mapping
            ``id -> resolved``); see ``docs/input_formats.md``.
        labels_key: the join key: the field of the label records holding the id, and the field of a
            rollout (top level or its ``info``) holding it. Default ``instance_id``.
        success_threshold: None: the automatic rule (:func:`success_of`); a number: success =
            ``reward >= success_threshold``.
        reasoning: ``text``: reasoning (Responses ``reasoning`` items) is written as plain text before
            the turn's content; ``drop``: it is left out.
    """

    format: str = "auto"
    lenient: bool = False
    labels: str | Path | None = None
    labels_key: str | None = None
    success_threshold: float | None = None
    reasoning: str = "text"

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise ConfigError(f"unknown input format {self.format!r}", fix=f"use one of {list(FORMATS)}")
        if self.reasoning not in REASONING_MODES:
            raise ConfigError(f"unknown reasoning mode {self.reasoning!r}", fix=f"use one of {list(REASONING_MODES)}")
        t = self.success_threshold
        if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t)):
            raise ConfigError(f"success_threshold must be a finite number or None, got {t!r}",
                              fix="pass a number such as 0.5, or leave it unset for the automatic rule")
        if self.labels_key is not None and (not isinstance(self.labels_key, str) or not self.labels_key):
            raise ConfigError(f"labels_key must be a non-empty string, got {self.labels_key!r}",
                              fix="pass the name of the id field, e.g. instance_id")


@dataclass
class ReadReport:
    """What the readers did: the format read per input, and (lenient mode) the records skipped.

    ``skipped`` counts skipped records per reason; ``examples`` keeps the first error message of
    each reason, so that a user can find one offending record.
    """

    formats: dict[str, str] = field(default_factory=dict)
    skipped: Counter = field(default_factory=Counter)
    examples: dict[str, str] = field(default_factory=dict)

    def skip(self, error: InputError) -> None:
        reason = reason_of(error)
        self.skipped[reason] += 1
        self.examples.setdefault(reason, str(error))

    def as_dict(self) -> dict[str, Any]:
        return {"formats": dict(self.formats), "skipped": dict(sorted(self.skipped.items())),
                "skipped_total": int(sum(self.skipped.values())), "skipped_examples": dict(self.examples)}


def error(ctx: _Ctx, reason: str, problem: str, fix: str) -> InputError:
    """An :class:`InputError` for the record at ``ctx`` tagged with a short ``reason`` (lenient counts)."""
    e = ctx.error(problem, fix=fix)
    e.reason = reason  # type: ignore[attr-defined]
    return e


def reason_of(e: InputError) -> str:
    """The short reason of an error (``bad_record`` for errors raised by the chat helpers)."""
    return getattr(e, "reason", "bad_record")


def guarded(convert: Callable[[], Any], lenient: bool, report: ReadReport | None) -> Any:
    """Run ``convert``; in lenient mode a record error is counted and None returned."""
    try:
        return convert()
    except InputError as e:
        if not lenient:
            raise
        (report if report is not None else ReadReport()).skip(e)
        return None


def success_of(reward: float, threshold: float | None) -> bool:
    """The success rule for formats without a success field.

    With ``threshold`` given: ``reward >= threshold``. Without (the automatic rule): a reward inside
    [0, 1] is read on the 0/1 scale (success when ``>= 0.5``, as the chat reader's default), and a
    reward outside [0, 1] (games scored 10 / -2, penalties down to -100) is a success when ``> 0``.
    """
    if threshold is not None:
        return reward >= threshold
    if 0.0 <= reward <= 1.0:
        return reward >= 0.5
    return reward > 0.0


# --------------------------------------------------------------------------------------------- records


def read_text(path: Path) -> str:
    """The file as UTF-8 text (one InputError line for an unreadable or non-UTF-8 file)."""
    return _read_text(path)


def iter_jsonl(path: Path, lenient: bool = False, report: ReadReport | None = None) -> Iterator[tuple[Any, _Ctx]]:
    """Stream a JSONL file line by line (blank lines skipped). A malformed line is an InputError, or
    with ``lenient`` a skipped record counted as ``malformed_json``."""
    index = 0
    try:
        fh = path.open("r", encoding="utf-8-sig", newline="")
    except OSError as e:
        raise InputError(f"cannot read the file ({e.strerror or e})", path=path,
                         fix="check the path and its permissions") from None
    with fh:
        line_no = 0
        while True:
            try:
                line = fh.readline()
            except UnicodeDecodeError as e:
                raise InputError(f"not UTF-8 text (after line {line_no}: {e.reason})", path=path,
                                 fix="write the file as UTF-8") from None
            if not line:
                return
            line_no += 1
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except (ValueError, RecursionError) as e:  # JSONDecodeError is a ValueError
                if isinstance(e, json.JSONDecodeError):
                    problem = _decode_problem(e, line_no)
                    fix = "make every line one complete JSON record (JSONL), or repair the JSON"
                else:
                    problem, fix = f"unreadable JSON at line {line_no} ({_first_line(e)})", "simplify the record"
                err = InputError(problem, path=path, record=f"{index} (line {line_no})", fix=fix)
                err.reason = "malformed_json"  # type: ignore[attr-defined]
                if not lenient:
                    raise err from None
                (report or ReadReport()).skip(err)
                index += 1
                continue
            yield rec, _Ctx(path, index, line=line_no)
            index += 1


def load_json(path: Path) -> Any:
    """Parse a whole JSON file (``Extra data`` -> the caller should read it as JSONL: returns a marker)."""
    text = read_text(path)
    if not text.strip():
        raise InputError("the file is empty", path=path, fix="write a JSON array of records, an object, or JSONL")
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        if e.msg == "Extra data":
            return _JSONL
        raise InputError(_decode_problem(e), path=path,
                         fix="repair the JSON (for one record per line, name the file .jsonl)") from None
    except (ValueError, RecursionError) as e:
        raise InputError(f"unreadable JSON ({_first_line(e)})", path=path, fix="simplify the records") from None


class _JsonlMarker:
    pass


_JSONL = _JsonlMarker()


def iter_json_records(
    path: Path,
    is_record: Callable[[Mapping[str, Any]], bool],
    what: str,
    lenient: bool = False,
    report: ReadReport | None = None,
) -> Iterator[tuple[Any, _Ctx]]:
    """The records of a JSON / JSONL file: JSONL (by extension or content) line by line; a JSON array
    item by item; a JSON object that ``is_record`` accepts as one record; an object keyed by id."""
    if path.suffix.lower() in JSONL_SUFFIXES:
        yield from iter_jsonl(path, lenient, report)
        return
    doc = load_json(path)
    if doc is _JSONL:
        yield from iter_jsonl(path, lenient, report)
        return
    if isinstance(doc, list):
        for i, rec in enumerate(doc):
            yield rec, _Ctx(path, i)
        return
    if isinstance(doc, Mapping):
        if is_record(doc):
            yield doc, _Ctx(path, 0)
            return
        if doc and all(isinstance(v, Mapping) for v in doc.values()):
            for i, (k, rec) in enumerate(doc.items()):
                yield rec, _Ctx(path, i, key=str(k))
            return
        if not doc:
            return
        raise InputError(
            f"unknown format: a JSON object that is neither one {what} record nor an object of records "
            f"keyed by id; keys seen: {_keys_seen(doc)}",
            path=path, fix="write an array or JSONL of records, or pick the format with --format",
        )
    raise InputError(
        f"unknown format: the top-level JSON value is {_type_name(doc)} {_short(doc, 40)}, not an array "
        "or object of records", path=path,
        fix="write a JSON array of records, an object keyed by id, or JSONL (one record per line)",
    )


def files_of(path: Path, suffixes: tuple[str, ...], what: str) -> list[Path]:
    """``path`` itself, or the files with one of ``suffixes`` directly inside the directory ``path``."""
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.is_file() and p.name.lower().endswith(suffixes))
        if not files:
            raise InputError(f"the directory holds no {what} files ({', '.join('*' + s for s in suffixes)})",
                             path=path, fix=f"point at a {what} file or a directory of them")
        return files
    if not path.exists():
        raise InputError("no such file or directory", path=path, fix="check the path")
    return [path]


# --------------------------------------------------------------------------------------------- fields


@dataclass
class Fields:
    """The id / reward / success / group / checkpoint of a record, and the fields they used."""

    trajectory_id: str
    reward: float | None
    success: bool | None
    group_id: str | None
    checkpoint: str | None
    used: set[str]


def record_fields(
    record: Mapping[str, Any],
    ctx: _Ctx,
    opts: Any,
    iopts: InputOptions,
    *,
    default_id: str | None = None,
    extra_group_keys: tuple[str, ...] = (),
    require_reward: bool | None = None,
) -> Fields:
    """Read the id, reward, success, group and checkpoint of ``record`` with the chat reader's
    candidates and options (``opts`` is a :class:`ChatReadOptions`); success without a success field
    follows :func:`success_of`."""
    from critic_audit.io.chat import (
        CHECKPOINT_KEYS, GROUP_KEYS, ID_KEYS, REWARD_KEYS, SUCCESS_KEYS, _label_value, _pick, _reward, _success,
    )

    used: set[str] = set()
    id_key = _pick(record, opts.id_key, ID_KEYS)
    tid = None
    if id_key is not None:
        used.add(id_key)
        tid = _label_value(record[id_key], "id", id_key, ctx)
    ctx.tid = tid
    if tid is None:
        tid = default_id or (ctx.key if ctx.key is not None else f"{ctx.path.stem}:{ctx.index}")

    r_key = _pick(record, opts.reward_key, REWARD_KEYS)
    reward = None
    raw_reward: Any = None
    if r_key is not None:
        used.add(r_key)
        raw_reward = record[r_key]
        if raw_reward is not None:
            reward = _reward(raw_reward, r_key, ctx)
    s_key = _pick(record, opts.success_key, SUCCESS_KEYS)
    success = None
    if s_key is not None:
        used.add(s_key)
        success = _success(record[s_key], s_key, ctx)
    need = opts.require_reward if require_reward is None else require_reward
    if reward is None and need:
        wanted = repr(opts.reward_key) if opts.reward_key else f"any of {list(REWARD_KEYS)}"
        problem = f"missing reward: no field {wanted}" if r_key is None else f"missing reward: {r_key!r} is null"
        raise error(ctx, "missing_reward", problem,
                    "add a numeric reward field, name it with --reward-key, or pass --no-reward")
    if success is None:
        if isinstance(raw_reward, bool):
            success = raw_reward
        elif reward is not None:
            success = success_of(reward, iopts.success_threshold)

    g_key = _pick(record, opts.group_key, (*GROUP_KEYS, *extra_group_keys))
    group = None
    if g_key is not None:
        used.add(g_key)
        group = _label_value(record[g_key], "group", g_key, ctx)
    c_key = _pick(record, opts.checkpoint_key, CHECKPOINT_KEYS)
    checkpoint = None
    if c_key is not None:
        used.add(c_key)
        checkpoint = _label_value(record[c_key], "checkpoint", c_key, ctx)
    if opts.checkpoint is not None:
        checkpoint = opts.checkpoint
    return Fields(tid, reward, success, group, checkpoint, used)


class IdRegistry:
    """Duplicate trajectory ids across the records of one input."""

    def __init__(self) -> None:
        self.seen: dict[str, str] = {}

    def check(self, tid: str, ctx: _Ctx) -> None:
        where = f"{ctx.path.name}: record {ctx.label(with_id=False)}"
        prev = self.seen.get(tid)
        if prev is not None:
            raise error(ctx, "duplicate_id", f"duplicate trajectory id {tid!r} (also {prev})",
                        "make the ids unique, name another id field with --id-key, or read the files one at a time")
        self.seen[tid] = where


def _write_atomic(path: str | Path, write: Callable[[str], None]) -> Path:
    """``write(tmp)`` to a temporary sibling of ``path``, then renamed onto it
    (:func:`critic_audit.outputs.atomic_write`)."""
    from critic_audit.outputs import atomic_write

    return atomic_write(path, lambda tmp: write(str(tmp)))


def write_parquet_atomic(df: pl.DataFrame, path: str | Path) -> Path:
    """Write ``df`` to ``path`` as Parquet through a temporary sibling and ``os.replace``: a reader
    never sees a partial file and an interrupted write leaves the previous file intact.

    Raises:
        ConfigError: the parent folder cannot be created or written.
    """
    return _write_atomic(path, df.write_parquet)


def write_text_atomic(text: str, path: str | Path) -> Path:
    """Write UTF-8 ``text`` to ``path`` atomically, as :func:`write_parquet_atomic` does.

    Raises:
        ConfigError: the parent folder cannot be created or written.
    """
    return _write_atomic(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
