"""The shared record layer of every reader: one options type, where a record sits, field pickers and
coercers, the lenient guard and its report, the id registry, and streaming record iteration (JSONL
line by line, JSON files whole).

Readers (:mod:`critic_audit.io.chat`, ``responses``, ``react``, ``swe``, ``atif``, ``tokenized``, ...)
import their record helpers from here; :mod:`critic_audit.io.formats` lists them. Their public
``iter_<fmt>`` / ``read_<fmt>`` pair comes from :func:`critic_audit.io.detect.format_readers`.
Layering: ``records -> schema, errors`` (never ``detect``: the readers import both, and ``detect``
imports this module, so this module importing ``detect`` would make a cycle). See ``docs/input_formats.md``.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from critic_audit.errors import ConfigError, InputError, UsageError

#: The largest magnitude of a reward or a critic value the audit reads (larger ones are refused, naming the
#: file, the record and the field): no real reward or value is that large, and below it the audit's sums
#: of squares stay finite (1e200 a token, 1e209 over 1e9 tokens) where a 1e300 reward overflowed them and
#: read as "the reward does not vary".
MAX_MAGNITUDE = 1e100

__all__ = [
    "MAX_MAGNITUDE",
    "ReadOptions", "ReadReport", "RecordContext", "Fields", "IdRegistry",
    "record_fields", "fields_conversation", "success_of", "reward_from_note", "guarded", "convert_records", "error", "reason_of",
    "finite_number", "number_array",
    "iter_jsonl", "iter_json_records", "load_json", "read_text", "AS_JSONL", "describe_document",
    "MESSAGES_KEYS", "REWARD_KEYS", "SUCCESS_KEYS", "ID_KEYS", "GROUP_KEYS", "CHECKPOINT_KEYS",
    "JSONL_SUFFIXES", "JSON_SUFFIXES",
]

#: Auto-detected field names, tried in this order (the first one present in a record is used).
MESSAGES_KEYS = ("messages", "traj", "conversation", "conversations", "trajectory", "chat", "dialog")
REWARD_KEYS = ("reward", "score", "return", "outcome_reward")
SUCCESS_KEYS = ("success", "is_success", "resolved", "correct", "solved")
ID_KEYS = ("id", "trajectory_id", "traj_id", "uid")
GROUP_KEYS = ("group_id", "prompt_id", "task_id", "question_id", "instance_id")
CHECKPOINT_KEYS = ("checkpoint", "step", "global_step")

#: File extensions read as JSONL without trying whole-file JSON first.
JSONL_SUFFIXES = (".jsonl", ".ndjson")
#: JSON-family file extensions.
JSON_SUFFIXES = (".json", ".jsonl", ".ndjson")

#: How reasoning items / reasoning text are handled in chat-like formats.
REASONING_MODES = ("text", "drop")
#: Assistant items inside a Responses *request* input: ``context`` (not policy turns) or ``policy``.
REQUEST_ASSISTANT_MODES = ("context", "policy")
#: Token ids carried by the input (ATIF ``completion_token_ids``): ``auto`` scores them when every
#: agent step carries them; ``text`` always re-renders the text with the critic's chat template.
#: ``--token-ids``: auto (stored ids, verified against the critic's tokenizer; re-rendered from the text where
#: they are not its), text (always re-render the text), trust (stored ids, unverified)
TOKEN_ID_MODES = ("auto", "text", "trust")

_KEY_FIELDS = ("messages_key", "reward_key", "success_key", "id_key", "group_key", "checkpoint_key", "labels_key")


@dataclass(frozen=True)
class ReadOptions:
    """How rollout inputs are read: one options type for every format (``docs/input_formats.md``).
    Every ``*_key`` left as None is auto-detected per record.

    Attributes:
        format: ``auto`` (detected per file) or a name of :data:`critic_audit.io.formats.FORMATS`.
        messages_key: the field holding the messages. Auto: the first present of :data:`MESSAGES_KEYS`.
        reward_key: the outcome reward. Auto: the first present of :data:`REWARD_KEYS`.
        success_key: the boolean success label. Auto: the first present of :data:`SUCCESS_KEYS`.
        id_key: the trajectory id. Auto: :data:`ID_KEYS`; without one, an object keyed by id uses its
            key, and anything else gets ``{file label}:{index}`` (the file label is the file's stem,
            or its collection where stems collide).
        group_key: the group (prompt/task) id, stringified. Auto: :data:`GROUP_KEYS` (then the format's
            own group fields, e.g. NeMo Gym's ``_ng_task_index``).
        checkpoint_key: the checkpoint / training-step label. Auto: :data:`CHECKPOINT_KEYS`.
        source: data-set name stored on every conversation. Default: the file's collection (its stem,
            or the folder that tells it apart where stems collide; see ``docs/input_formats.md``).
        checkpoint: constant checkpoint label for every conversation; overrides the checkpoint field.
        success_threshold: None: the automatic rule (:func:`success_of`); a number: success =
            ``reward >= success_threshold`` (used only without a success field).
        require_reward: True: a record without a reward is an error; False: reward None.
        lenient: False: the first bad record raises :class:`InputError`; True: bad records are skipped
            and counted per reason in :class:`ReadReport`.
        labels: a file of success labels joined on an id (SWE-bench results, a JSON/JSONL mapping
            ``id -> resolved``, or a verifier result file for ATIF).
        labels_key: the join key (the id field of the label records and of the rollouts).
        reasoning: ``text``: reasoning is written as plain text before the turn's content; ``drop``.
        request_assistant: assistant items inside a Responses request input (replayed earlier turns, a
            fixed greeting): ``context`` (default; rendered, not policy turns) or ``policy``.
        token_ids: ``auto``: ATIF files whose agent steps all carry prompt and completion token ids are
            scored on exactly those tokens; ``text``: re-render every file's text.

    Raises:
        ConfigError: an unknown format / mode, a non-finite threshold, or an empty field name.
    """

    format: str = "auto"
    messages_key: str | None = None
    reward_key: str | None = None
    success_key: str | None = None
    id_key: str | None = None
    group_key: str | None = None
    checkpoint_key: str | None = None
    source: str | None = None
    checkpoint: str | None = None
    success_threshold: float | None = None
    require_reward: bool = True
    lenient: bool = False
    labels: str | Path | None = None
    labels_key: str | None = None
    reasoning: str = "text"
    request_assistant: str = "context"
    token_ids: str = "auto"

    def __post_init__(self) -> None:
        from critic_audit.io.formats import FORMAT_CHOICES

        if self.format not in FORMAT_CHOICES:
            raise UsageError(f"unknown input format {self.format!r}", fix=f"use one of {list(FORMAT_CHOICES)}")
        for name, value, modes in (("reasoning", self.reasoning, REASONING_MODES),
                                   ("request_assistant", self.request_assistant, REQUEST_ASSISTANT_MODES),
                                   ("token_ids", self.token_ids, TOKEN_ID_MODES)):
            if value not in modes:
                raise UsageError(f"unknown {name} mode {value!r}", fix=f"use one of {list(modes)}")
        t = self.success_threshold
        if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t)):
            raise UsageError(f"success_threshold must be a finite number or None, got {t!r}",
                              fix="pass a number such as 0.5, or leave it unset for the automatic rule")
        for f in _KEY_FIELDS:
            v = getattr(self, f)
            if v is not None and (not isinstance(v, str) or not v):
                raise UsageError(f"{f} must be a non-empty string or None, got {v!r}",
                                  fix=f"pass the field name as a string for {f}")

    def as_dict(self) -> dict[str, Any]:
        """The options as JSON-ready values (for ``config.json``)."""
        return {k: (str(v) if isinstance(v, Path) else v) for k, v in self.__dict__.items()}


@dataclass
class ReadReport:
    """What the readers did: the format read per input, the records read, joined and skipped, and the
    files a folder search passed over.

    ``skipped`` counts skipped records per reason; ``examples`` keeps the first error message of each
    reason, so that a user can find one offending record. ``skipped_files`` counts files per reason
    (``not_rollout_file``: a file no format reads, e.g. ``notes.txt`` or ``config.json``) and
    ``skipped_file_list`` lists every one of them (path, reason, size in bytes, and ``rows``: the file
    holds record-like rows, JSON objects one per line or an array of them, so it may be rollouts that
    no reader claims); ``skipped_file_examples`` keeps the first five paths per reason. ``notes``: facts
    about how inputs were read (e.g. an ATIF file without token ids, re-rendered), counted; a note whose
    name holds ``joined`` counts documents read into another document's rollout (ATIF continuations).
    ``records_read``: the trajectories the readers gave (set by the caller that read them all,
    :func:`critic_audit.io.inputs.read_all`). ``as_dict()["records"]``: ``read + joined + skipped ==
    total``, every record the input holds accounted for. ``rows_read``: how the tokenized rollouts
    were read, counted: ``columnar`` (whole columns at once, :mod:`critic_audit.io.tokenized`'s fast
    path; step rows: their token lists as numpy views of the columns) or ``row_by_row`` (a JSON file,
    an irregular JSONL file, or a row holding a bad entry); not part of
    :meth:`as_dict` (the summary's input report), a figure for benchmarks and tests.
    """

    formats: dict[str, str] = field(default_factory=dict)
    skipped: Counter = field(default_factory=Counter)
    examples: dict[str, str] = field(default_factory=dict)
    skipped_files: Counter = field(default_factory=Counter)
    skipped_file_examples: dict[str, list[str]] = field(default_factory=dict)
    notes: Counter = field(default_factory=Counter)
    rows_read: Counter = field(default_factory=Counter)
    skipped_file_list: list[dict[str, Any]] = field(default_factory=list)
    records_read: int | None = None

    def skip(self, error: InputError) -> None:
        """Count the record(s) ``error`` refuses: one, or ``error.records`` where a reader set it (an
        ATIF document skipped with its embedded subagent trajectories)."""
        reason = reason_of(error)
        self.skipped[reason] += int(getattr(error, "records", 1))
        self.examples.setdefault(reason, str(error))

    def skip_file(self, path: Path, reason: str, *, rows: bool = False) -> None:
        """Count the file ``path`` as passed over for ``reason`` and list it (``rows``: it holds
        record-like rows)."""
        self.skipped_files[reason] += 1
        ex = self.skipped_file_examples.setdefault(reason, [])
        if len(ex) < 5:
            ex.append(str(path))
        try:
            size = Path(path).stat().st_size
        except OSError:
            size = None
        self.skipped_file_list.append({"path": str(path), "reason": reason, "bytes": size, "rows": rows})

    @property
    def joined(self) -> int:
        """Documents joined into another document's rollout (notes named ``*joined*``)."""
        return int(sum(v for k, v in self.notes.items() if "joined" in k))

    def records(self) -> dict[str, int | None]:
        """``{"read", "joined", "skipped", "total"}`` (and ``"copies_dropped"`` when some were): every record of the input read,
        joined, skipped, or dropped as a later copy of a rollout read from another file (``--lenient``:
        ``notes["duplicate_trajectories"]``, :mod:`critic_audit.io.copies`); ``total`` None until
        ``records_read`` is set."""
        skipped = int(sum(self.skipped.values()))
        copies = int(self.notes.get("duplicate_trajectories", 0))
        read = self.records_read
        out: dict[str, int | None] = {"read": read, "joined": self.joined, "skipped": skipped}
        if copies:
            out["copies_dropped"] = copies
        out["total"] = None if read is None else read + self.joined + skipped + copies
        return out

    def rows_like_skipped(self, n: int = 3) -> list[dict[str, Any]]:
        """The ``n`` largest skipped files that hold record-like rows (rollouts no reader claims?)."""
        hits = [f for f in self.skipped_file_list if f.get("rows")]
        return sorted(hits, key=lambda f: -(f.get("bytes") or 0))[:n]

    def as_dict(self) -> dict[str, Any]:
        return {"formats": dict(self.formats), "skipped": dict(sorted(self.skipped.items())),
                "skipped_total": int(sum(self.skipped.values())), "skipped_examples": dict(self.examples),
                "skipped_files": dict(sorted(self.skipped_files.items())),
                "skipped_files_total": int(sum(self.skipped_files.values())),
                "skipped_file_examples": dict(self.skipped_file_examples),
                "skipped_file_list": list(self.skipped_file_list), "records": self.records(),
                "notes": dict(self.notes)}


def short(value: Any, limit: int = 60) -> str:
    """A one-line repr of ``value``, cut to ``limit`` characters."""
    r = repr(value)
    return r if len(r) <= limit else r[: limit - 3] + "..."


def type_name(value: Any) -> str:
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


def keys_seen(d: Mapping[str, Any], limit: int = 12) -> str:
    keys = [str(k) for k in d]
    shown = ", ".join(repr(k) for k in keys[:limit])
    if len(keys) > limit:
        shown += f", ... ({len(keys)} keys)"
    return f"[{shown}]"


class RecordContext:
    """Where a record sits, for error messages and ``Conversation.record``."""

    __slots__ = ("path", "index", "line", "key", "tid", "file_label", "reward_from")

    def __init__(self, path: Path, index: int, line: int | None = None, key: str | None = None,
                 file_label: str | None = None) -> None:
        self.path = path
        self.index = index
        self.line = line
        self.key = key
        self.tid: str | None = None
        self.file_label = file_label if file_label is not None else path.stem
        #: the success field a missing reward was read from (:func:`record_fields`), for the report's notes
        self.reward_from: str | None = None

    def label(self, with_id: bool = True) -> str:
        extra = []
        if self.line is not None:
            extra.append(f"line {self.line}")
        if self.key is not None:
            extra.append(f"key {short(self.key, 40)}")
        if with_id and self.tid is not None and self.tid != self.key:
            extra.append(f"id {short(self.tid, 40)}")
        return f"{self.index} ({', '.join(extra)})" if extra else str(self.index)

    def error(self, problem: str, fix: str) -> InputError:
        return InputError(problem, path=self.path, record=self.label(), fix=fix)

    @property
    def record(self) -> str:
        """``Conversation.record``: ``{file name}: record {index (line, key)}``."""
        return f"{self.path.name}: record {self.label(with_id=False)}"


def pick(record: Mapping[str, Any], explicit: str | None, candidates: Sequence[str]) -> str | None:
    """The field to use: ``explicit`` if given (even when absent), else the first candidate present."""
    if explicit is not None:
        return explicit if explicit in record else None
    for k in candidates:
        if k in record:
            return k
    return None


def label_value(value: Any, what: str, field: str, ctx: RecordContext) -> str | None:
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
        f"{what} field {field!r} is {type_name(value)} {short(value)}, not a string or number",
        fix=f"make {field!r} a string or a number, or name another field with --{what.replace(' ', '-')}-key",
    )



def finite_number(x: Any) -> float | None:
    """``x`` as a finite float when it is a JSON number (int or float, not a boolean) that a float64
    holds: None for anything else (a string, a boolean, null, NaN, +-inf, an integer beyond +-1.8e308)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    try:
        f = float(x)
    except OverflowError:  # an integer beyond the float64 range (JSON allows any number of digits)
        return None
    return f if math.isfinite(f) else None


_NUMBER_TYPES = frozenset({int, float})
_NUMBER_OR_NULL_TYPES = frozenset({int, float, type(None)})


def number_array(v: Any, *, null: bool = True, finite: bool = True) -> Any:
    """A list of JSON numbers as a (n,) float64 numpy array, or None when ``v`` is not one.

    Type-checked before converting (numpy would read ``"1.5"`` and ``true`` as numbers and raise
    OverflowError on an integer beyond the float64 range): every entry must be an int or float (not a
    boolean) within the float64 range; ``null`` entries become NaN when ``null``; with ``finite`` a NaN
    or infinite float is refused too. A numpy array or other object with ``tolist`` is read as its list.
    Whole-list work (the entry types as one set, one conversion, one finiteness test); entries of other
    types than exactly int / float / None (subclasses) are checked one by one.
    """
    import numpy as np

    if hasattr(v, "tolist") and not isinstance(v, (list, str)):
        v = v.tolist()
    if not isinstance(v, list):
        return None
    if not set(map(type, v)) <= (_NUMBER_OR_NULL_TYPES if null else _NUMBER_TYPES):
        return _number_array_loop(v, null, finite)
    try:
        out = np.asarray(v, dtype=np.float64)  # None -> NaN
    except OverflowError:  # an integer beyond the float64 range
        return None
    if out.ndim != 1:
        return None
    if finite and not np.isfinite(out).all():
        nulls = v.count(None) if null else 0  # a null is NaN here, and allowed
        if np.isinf(out).any() or int(np.isnan(out).sum()) != nulls:
            return None
    return out


def _number_array_loop(v: list, null: bool, finite: bool) -> Any:
    """:func:`number_array` one entry at a time (lists holding subclasses of int / float, or others)."""
    import numpy as np

    out = np.empty(len(v), dtype=np.float64)
    for i, x in enumerate(v):
        if x is None and null:
            out[i] = np.nan
            continue
        if isinstance(x, float) and not finite and not isinstance(x, bool):
            out[i] = x
            continue
        f = finite_number(x)
        if f is None:
            return None
        out[i] = f
    return out


def reward_value(value: Any, field: str, ctx: RecordContext) -> float:
    bad_fix = f"write {field!r} as a number (or true/false), or name another field with --reward-key"
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    if isinstance(value, str):
        try:
            r = float(value.strip())
        except ValueError:
            raise ctx.error(f"reward {field!r} is the non-numeric string {short(value)}", fix=bad_fix) from None
    elif isinstance(value, (int, float)):
        try:
            r = float(value)
        except OverflowError:
            raise ctx.error(f"reward {field!r} = {short(value)} is too large", fix=bad_fix) from None
    else:
        raise ctx.error(f"reward {field!r} is {type_name(value)} {short(value)}, not a number", fix=bad_fix)
    if math.isnan(r):
        raise ctx.error(f"reward {field!r} is NaN",
                        fix="give the record a finite reward, or drop the record")
    if math.isinf(r):
        raise ctx.error(f"reward {field!r} is infinite ({short(value)})",
                        fix="give the record a finite reward, or drop the record")
    if abs(r) > MAX_MAGNITUDE:
        raise ctx.error(f"reward {field!r} = {r:g} is out of range (|reward| > {MAX_MAGNITUDE:g}: the audit's "
                        "statistics would overflow)", fix="give the record a reward of ordinary size, or drop the record")
    return r


def success_value(value: Any, field: str, ctx: RecordContext) -> bool | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    raise ctx.error(
        f"success field {field!r} is {type_name(value)} {short(value)}, not true/false",
        fix=f"write {field!r} as true/false (or 0/1), or name another field with --success-key",
    )


def read_text(path: Path) -> str:
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


def first_line(e: BaseException) -> str:
    """The first line of an error's message, in the user's terms: Python's integer-digit limit
    ("Exceeds the limit (4300 digits) for integer string conversion ... sys.set_int_max_str_digits()")
    reads as a number too large to read."""
    text = str(e).strip()
    if isinstance(e, ValueError) and "integer string conversion" in text:
        import re
        import sys

        m = re.search(r"value has (\d+) digits", text)
        digits = f" ({m.group(1)} digits)" if m else ""
        return (f"a number{digits} is too large to read: integers have at most "
                f"{sys.get_int_max_str_digits()} digits; write it shorter or as a string")
    return text.splitlines()[0] if text else type(e).__name__


def decode_problem(e: json.JSONDecodeError, line: int | None = None) -> str:
    """Where a JSON text breaks, in the user's terms: ``"malformed JSON at line 3, column 17: ..."``.

    ``e`` comes from parsing a whole document (``line`` None: ``e``'s line and column are the file's)
    or one JSONL line without its line break (``line``: that line's number in the file; ``e``'s
    column is within it). An error at the end of the input (nothing but whitespace from ``e.pos``
    on: a record cut off mid-way) names the end of the last line that holds anything, where the break
    is, not the column past it that ``json`` reports.
    """
    end = len(e.doc.rstrip())
    if e.pos >= end:
        last = line if line is not None else e.doc.count("\n", 0, end) + 1
        return f"malformed JSON at the end of line {last} (the JSON stops before it is complete): {e.msg}"
    return f"malformed JSON at line {line if line is not None else e.lineno}, column {e.colno}: {e.msg}"


def error(ctx: RecordContext, reason: str, problem: str, fix: str) -> InputError:
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


def convert_records(records: Iterator[tuple[Any, RecordContext]], convert: Callable[[Any, RecordContext], Any],
                    lenient: bool, report: ReadReport | None) -> Iterator[Any]:
    """``convert(raw, ctx)`` for each record of one file, ids unique within the file (the converted
    object's ``trajectory_id``); in lenient mode a bad record is counted in ``report`` and skipped."""
    ids = IdRegistry()
    for raw, ctx in records:
        def one(raw: Any = raw, ctx: RecordContext = ctx) -> Any:
            try:
                out = convert(raw, ctx)
            except InputError as e:  # a Conversation's own check knows no path: name the file in full
                if e.path is None and getattr(e, "reason", None) in ("invalid_unicode", "too_deep"):
                    from critic_audit.schema import value_error

                    raise value_error((e.reason, e.field), path=ctx.path, record=ctx.label()) from None
                raise
            ids.check(out.trajectory_id, ctx)
            return out

        out = guarded(one, lenient, report)
        if out is not None:
            if ctx.reward_from is not None and report is not None:
                report.notes[reward_from_note(ctx.reward_from)] += 1
            yield out


def reward_from_note(field: str) -> str:
    """The ``input.notes`` key counting records whose reward was read from the success field ``field``."""
    return f"reward_from_success_field ({field!r}: true -> 1.0, false -> 0.0; no reward field)"


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


def iter_jsonl(path: Path, lenient: bool = False, report: ReadReport | None = None,
               file_label: str | None = None, *, skip_lines: int = 0) -> Iterator[tuple[Any, RecordContext]]:
    """Stream a JSONL file line by line (blank lines skipped). A malformed line is an InputError, or
    with ``lenient`` a skipped record counted as ``malformed_json``. ``skip_lines``: the first lines,
    none of them blank (already read as records ``0..skip_lines - 1``), are passed over unparsed."""
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
                where = f"in line {line_no + 1}" if line_no else "in its first line"
                raise InputError(f"not UTF-8 text ({where}: {e.reason})", path=path,
                                 fix="write the file as UTF-8 (with --lenient a folder search skips the file and "
                                     "counts it)") from None
            if not line:
                return
            line_no += 1
            if line_no <= skip_lines:
                index += 1
                continue
            if not line.strip():
                continue
            try:
                rec = json.loads(line.rstrip("\r\n"))  # without its line break: an error's column is the line's
            except (ValueError, RecursionError) as e:  # JSONDecodeError is a ValueError
                if isinstance(e, json.JSONDecodeError):
                    problem = decode_problem(e, line_no)
                    fix = ("make every line one complete JSON record (JSONL), or repair the JSON; or pass --lenient to "
                           "skip bad lines (counted)")
                else:
                    problem, fix = f"unreadable JSON at line {line_no} ({first_line(e)})", "simplify the record"
                err = InputError(problem, path=path, record=f"{index} (line {line_no})", fix=fix)
                err.reason = "malformed_json"  # type: ignore[attr-defined]
                if not lenient:
                    raise err from None
                (report or ReadReport()).skip(err)
                index += 1
                continue
            yield rec, RecordContext(path, index, line=line_no, file_label=file_label)
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
            return AS_JSONL
        raise InputError(decode_problem(e), path=path,
                         fix="repair the JSON (for one record per line, name the file .jsonl)") from None
    except (ValueError, RecursionError) as e:
        raise InputError(f"unreadable JSON ({first_line(e)})", path=path, fix="simplify the records") from None


class _JsonlMarker:
    pass


AS_JSONL = _JsonlMarker()
"""Returned by :func:`load_json` for a file holding several JSON values: read it as JSONL."""


def describe_document(doc: Any, path: Path) -> str:
    """What a whole-file document ``doc`` (:func:`load_json` of ``path``) is, for an error saying it is not
    the document a format expects: an object's sorted keys, several JSONL records and the first one's
    keys (``doc is AS_JSONL``), else its JSON type."""
    if doc is AS_JSONL:
        first = next((rec for rec, _ in iter_jsonl(path, lenient=True)), None)
        keys = f", the first with keys {short(sorted(map(str, first)), 80)}" if isinstance(first, Mapping) else ""
        return f"several JSON records, one per line (JSONL){keys}"
    if isinstance(doc, Mapping):
        return f"an object with keys {short(sorted(map(str, doc)), 80)}"
    return f"a JSON {type_name(doc)}"


def iter_json_records(
    path: Path,
    is_record: Callable[[Mapping[str, Any]], bool],
    what: str,
    lenient: bool = False,
    report: ReadReport | None = None,
    file_label: str | None = None,
) -> Iterator[tuple[Any, RecordContext]]:
    """The records of a JSON / JSONL file: JSONL (by extension or content) line by line; a JSON array
    item by item; a JSON object that ``is_record`` accepts as one record; an object keyed by id."""
    if path.suffix.lower() in JSONL_SUFFIXES:
        yield from iter_jsonl(path, lenient, report, file_label)
        return
    doc = load_json(path)
    if doc is AS_JSONL:
        yield from iter_jsonl(path, lenient, report, file_label)
        return
    if isinstance(doc, list):
        for i, rec in enumerate(doc):
            yield rec, RecordContext(path, i, file_label=file_label)
        return
    if isinstance(doc, Mapping):
        if is_record(doc):
            yield doc, RecordContext(path, 0, file_label=file_label)
            return
        if doc and all(isinstance(v, Mapping) for v in doc.values()):
            for i, (k, rec) in enumerate(doc.items()):
                yield rec, RecordContext(path, i, key=str(k), file_label=file_label)
            return
        if not doc:
            return
        raise InputError(
            f"unknown format: a JSON object that is neither one {what} record nor an object of records "
            f"keyed by id; keys seen: {keys_seen(doc)}",
            path=path, fix="write an array or JSONL of records, or pick the format with --format",
        )
    raise InputError(
        f"unknown format: the top-level JSON value is {type_name(doc)} {short(doc, 40)}, not an array "
        "or object of records", path=path,
        fix="write a JSON array of records, an object keyed by id, or JSONL (one record per line)",
    )


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
    ctx: RecordContext,
    opts: ReadOptions,
    *,
    default_id: str | None = None,
    extra_group_keys: tuple[str, ...] = (),
    require_reward: bool | None = None,
) -> Fields:
    """Read the id, reward, success, group and checkpoint of ``record``: each from the field named in
    ``opts`` or the first present of its candidates (:data:`ID_KEYS`, ...; ``extra_group_keys`` after
    :data:`GROUP_KEYS`); success without a success field follows :func:`success_of`. A required reward
    that is missing (no field or null, no ``--reward-key``) is read from the success field when there
    is one (true -> 1.0, false -> 0.0; ``ctx.reward_from`` names it). Without an id
    field: ``default_id``, the record's key, or ``{label}:{index}``.

    Raises:
        InputError: a field of the wrong type, a NaN / infinite reward, or a missing reward when one is
            required (reasons ``bad_record``, ``missing_reward``).
    """

    used: set[str] = set()
    id_key = pick(record, opts.id_key, ID_KEYS)
    tid = None
    if id_key is not None:
        used.add(id_key)
        tid = label_value(record[id_key], "id", id_key, ctx)
    ctx.tid = tid
    if tid is None:
        tid = default_id or (ctx.key if ctx.key is not None else f"{ctx.file_label}:{ctx.index}")

    r_key = pick(record, opts.reward_key, REWARD_KEYS)
    reward = None
    raw_reward: Any = None
    if r_key is not None:
        used.add(r_key)
        raw_reward = record[r_key]
        if raw_reward is not None:
            reward = reward_value(raw_reward, r_key, ctx)
    s_key = pick(record, opts.success_key, SUCCESS_KEYS)
    success = None
    if s_key is not None:
        used.add(s_key)
        success = success_value(record[s_key], s_key, ctx)
    need = opts.require_reward if require_reward is None else require_reward
    if reward is None and need and success is not None and opts.reward_key is None:
        reward, ctx.reward_from = float(success), s_key  # a success field stands for the reward: 1.0 / 0.0
    if reward is None and need:
        wanted = repr(opts.reward_key) if opts.reward_key else f"any of {list(REWARD_KEYS)}"
        problem = f"missing reward: no field {wanted}" if r_key is None else f"missing reward: {r_key!r} is null"
        raise error(ctx, "missing_reward", problem,
                    "add a numeric reward field, name it with --reward-key, or pass --no-reward")
    if success is None:
        if isinstance(raw_reward, bool):
            success = raw_reward
        elif reward is not None:
            success = success_of(reward, opts.success_threshold)

    g_key = pick(record, opts.group_key, (*GROUP_KEYS, *extra_group_keys))
    group = None
    if g_key is not None:
        used.add(g_key)
        group = label_value(record[g_key], "group", g_key, ctx)
    c_key = pick(record, opts.checkpoint_key, CHECKPOINT_KEYS)
    checkpoint = None
    if c_key is not None:
        used.add(c_key)
        checkpoint = label_value(record[c_key], "checkpoint", c_key, ctx)
    if opts.checkpoint is not None:
        checkpoint = opts.checkpoint
    return Fields(tid, reward, success, group, checkpoint, used)


class IdRegistry:
    """Duplicate trajectory ids across the records of one input."""

    def __init__(self) -> None:
        self.seen: dict[str, str] = {}

    def check(self, tid: str, ctx: RecordContext) -> None:
        where = f"{ctx.path.name}: record {ctx.label(with_id=False)}"
        prev = self.seen.get(tid)
        if prev is not None:
            raise error(ctx, "duplicate_id", f"duplicate trajectory id {tid!r} (also {prev})",
                        "make the ids unique, name another id field with --id-key, or read the files one at a time")
        self.seen[tid] = where




def fields_conversation(f: Fields, messages: list[dict[str, Any]], metadata: dict[str, Any], source: str,
                        ctx: RecordContext) -> Any:
    """The :class:`critic_audit.schema.Conversation` of a record whose fields ``f`` are read: its
    ``messages``, ``source`` and ``metadata`` (plus ``context_turns``, the assistant messages marked
    ``"context": true``, when there are any).

    Raises:
        InputError: a value the schema refuses (invalid unicode, too deep), as ``Conversation`` does.
    """
    from critic_audit.schema import Conversation

    n_context = sum(1 for m in messages if m.get("context"))
    if n_context:
        metadata["context_turns"] = n_context
    return Conversation(trajectory_id=f.trajectory_id, messages=messages, reward=f.reward, success=f.success,
                        group_id=f.group_id, checkpoint=f.checkpoint, source=source, metadata=metadata,
                        record=ctx.record)
