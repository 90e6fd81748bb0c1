"""Detect the format of a rollout input and read it with the matching reader.

Formats (``--format``; ``auto`` detects one per input, see :func:`detect_format`):

========== ============================================================ =====================
format     input                                                        becomes
========== ============================================================ =====================
chat       OpenAI chat-completions records (:mod:`critic_audit.io.chat`) Conversation records
responses  OpenAI Responses records, NeMo Gym rollouts                  Conversation records
react      ReAct transcripts (string field, Reflexion ``.txt`` logs)    Conversation records
swe        SWE-agent / mini-swe-agent ``*.traj`` / ``*.traj.json``      Conversation records
tokenized  token-id rows (verl-style, verifiers steps), verl dumps      canonical tables
========== ============================================================ =====================

Canonical-table folders (``tokens.parquet``) and folders written by
:func:`critic_audit.io.verl_dump.dump_verl_batch` (``step_*.tokens.parquet``) are table inputs too.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import polars as pl

from critic_audit.errors import InputError
from critic_audit.io.chat import DIR_SUFFIXES, JSONL_SUFFIXES, MESSAGES_KEYS, ChatReadOptions, _Ctx
from critic_audit.io.common import FORMATS, InputOptions, ReadReport, guarded, iter_jsonl, load_json, _JSONL
from critic_audit.schema import TRAJECTORY_SCHEMA, Conversation, read_parquet, validate

__all__ = ["detect_format", "is_table_format", "iter_conversations", "read_table_input", "FORMATS",
           "CONVERSATION_FORMATS", "TABLE_FORMATS"]

#: ``mixed``: a folder whose files hold different conversation formats (each file read with its own).
CONVERSATION_FORMATS = ("chat", "responses", "react", "swe", "mixed")
#: ``tables``: canonical tables (a folder with tokens.parquet, a tokens Parquet file, a verl dump folder).
TABLE_FORMATS = ("tokenized", "tables")
_TEXT_SUFFIXES = (".txt", ".log")


def _record_format(rec: Any, messages_key: str | None = None) -> str:
    from critic_audit.io.react import is_react_record
    from critic_audit.io.responses import is_responses_record
    from critic_audit.io.swe import is_swe_record
    from critic_audit.io.tokenized import is_tokenized_record

    if is_tokenized_record(rec):
        return "tokenized"
    if is_swe_record(rec):
        return "swe"
    if is_responses_record(rec):
        return "responses"
    if is_react_record(rec, messages_key):
        return "react"
    return "chat"


def _first_record(path: Path) -> Any:
    """The first record of a JSON / JSONL file (None when there is none or it does not parse)."""
    try:
        if path.suffix.lower() in JSONL_SUFFIXES:
            doc = _JSONL
        else:
            doc = load_json(path)
        if doc is _JSONL:
            for rec, _ in iter_jsonl(path, lenient=True):
                return rec
            return None
    except InputError:
        return None
    if isinstance(doc, list):
        return doc[0] if doc else None
    if isinstance(doc, Mapping):
        if any(k in doc for k in MESSAGES_KEYS) or _record_format(doc) != "chat":
            return doc
        vals = [v for v in doc.values() if isinstance(v, Mapping)]
        return vals[0] if vals and len(vals) == len(doc) else doc
    return None


def _file_format(path: Path, messages_key: str | None) -> str:
    from critic_audit.io.react import looks_like_reflexion_log
    from critic_audit.io.swe import TRAJ_SUFFIXES
    from critic_audit.io.tokenized import tokenized_columns

    name = path.name.lower()
    if name.endswith(TRAJ_SUFFIXES):
        return "swe"
    if name.endswith(".parquet"):
        try:
            cols = pl.read_parquet_schema(path)
        except Exception:  # corrupt: let the table reader report it
            return "tables"
        return "tokenized" if tokenized_columns(list(cols)) else "tables"
    if name.endswith(_TEXT_SUFFIXES) or not name.endswith(DIR_SUFFIXES):
        try:
            with path.open("r", encoding="utf-8-sig", errors="replace") as fh:
                head = fh.read(20000)
        except OSError:
            return "chat"
        if looks_like_reflexion_log(head):
            return "react"
        if name.endswith(_TEXT_SUFFIXES):
            return "react"
    return _record_format(_first_record(path), messages_key)


_CACHE: dict[tuple[Any, ...], str] = {}


def detect_format(path: str | Path, messages_key: str | None = None) -> str:
    """The format of a file or folder: one of :data:`CONVERSATION_FORMATS`, ``tokenized`` or ``tables``.

    Rules, in order: a folder with ``tokens.parquet`` or ``step_*.tokens.parquet`` -> ``tables``; a
    ``*.traj`` / ``*.traj.json`` file, or a folder holding any (at any depth) -> ``swe``; a Parquet file
    with ``input_ids`` + ``response_mask`` (or ``prompt_ids`` + ``completion_ids``) -> ``tokenized``,
    other Parquet -> ``tables``; a ``.txt`` / ``.log`` file -> ``react``; a JSON / JSONL file by its
    first record (token ids -> ``tokenized``; ``history`` or ``messages`` + SWE ``info`` -> ``swe``;
    ``responses_create_params`` / ``response.output`` / typed ``output`` items -> ``responses``; a
    transcript string with ``Thought:`` / ``Action:`` lines -> ``react``; anything else -> ``chat``). A
    folder takes the format of its files when they agree; otherwise ``chat`` (and the chat reader names
    the first file it cannot read); files of different conversation formats make the folder
    ``mixed``: each file is read with its own format.

    Raises:
        InputError: the path does not exist.
    """
    p = Path(path)
    try:
        st = p.stat()
    except OSError:
        raise InputError("no such file or directory", path=p, fix="check the path") from None
    if p.is_dir():
        return _detect(p, messages_key)
    key = (str(p.resolve()), st.st_mtime_ns, st.st_size, messages_key)  # a file is parsed once
    if key not in _CACHE:
        if len(_CACHE) > 256:
            _CACHE.clear()
        _CACHE[key] = _detect(p, messages_key)
    return _CACHE[key]


def _detect(p: Path, messages_key: str | None) -> str:
    if p.is_dir():
        if (p / "tokens.parquet").exists() or any(p.glob("step_*.tokens.parquet")):
            return "tables"
        from critic_audit.io.swe import TRAJ_SUFFIXES

        if any(q.name.lower().endswith(TRAJ_SUFFIXES) for q in p.rglob("*") if q.is_file()):
            return "swe"
        files = sorted(q for q in p.iterdir() if q.is_file() and not q.name.startswith(".")
                       and q.name.lower().endswith((*DIR_SUFFIXES, ".parquet", *_TEXT_SUFFIXES)))
        kinds = {detect_format(q, messages_key) for q in files}
        if len(kinds) == 1:
            return kinds.pop()
        if len(kinds) > 1 and kinds <= set(CONVERSATION_FORMATS):
            return "mixed"
        return "chat"
    return _file_format(p, messages_key)


def is_table_format(fmt: str) -> bool:
    return fmt in TABLE_FORMATS


# --------------------------------------------------------------------------------------------- reading


def _lenient_chat(path: Path, opts: ChatReadOptions, report: ReadReport | None) -> Iterator[Conversation]:
    """The chat reader, record by record, skipping (and counting) bad records."""
    from critic_audit.io.chat import _conversation, _files, _records_of_json
    from critic_audit.io.common import IdRegistry

    ids = IdRegistry()
    for file in _files(path):
        source = opts.source if opts.source is not None else file.stem
        if file.suffix.lower() in JSONL_SUFFIXES:
            records: Iterator[tuple[Any, _Ctx]] = iter_jsonl(file, True, report)
        else:
            doc = load_json(file)
            records = iter_jsonl(file, True, report) if doc is _JSONL else _records_of_json(doc, file, opts)
        for raw, ctx in records:
            def convert(raw: Any = raw, ctx: _Ctx = ctx, source: str = source) -> Conversation:
                conv = _conversation(raw, ctx, opts, source)
                ids.check(conv.trajectory_id, ctx)
                return conv

            conv = guarded(convert, True, report)
            if conv is not None:
                yield conv


def _apply_labels(convs: Iterator[Conversation], iopts: InputOptions) -> Iterator[Conversation]:
    """Join ``--labels`` onto conversations of the non-SWE formats (the key: the metadata field
    ``labels_key`` when present, else the trajectory id); ids the file does not know are left alone."""
    from critic_audit.io.swe import load_labels

    labels = load_labels(iopts.labels, iopts.labels_key)
    for c in convs:
        key = c.metadata.get(iopts.labels_key) if iopts.labels_key else None
        label = labels.get(str(key) if key is not None else c.trajectory_id)
        if label is not None:
            c.success = label
            if c.reward is None:
                c.reward = 1.0 if label else 0.0
        yield c


def iter_conversations(
    path: str | Path,
    fmt: str,
    options: ChatReadOptions | None = None,
    input_options: InputOptions | None = None,
    report: ReadReport | None = None,
) -> Iterator[Conversation]:
    """Yield the conversations of ``path`` read as ``fmt`` (one of :data:`CONVERSATION_FORMATS`).

    Strict mode (default) raises :class:`InputError` at the first bad record; lenient mode
    (``input_options.lenient``) skips bad records and counts them in ``report``.
    """
    opts = options or ChatReadOptions()
    iopts = input_options or InputOptions()
    p = Path(path)
    if fmt == "mixed":
        return _mixed(p, opts, iopts, report)
    if fmt == "chat":
        from critic_audit.io.chat import iter_chat

        it = _lenient_chat(p, opts, report) if iopts.lenient else iter_chat(p, opts)
    elif fmt == "responses":
        from critic_audit.io.responses import iter_responses

        it = iter_responses(p, opts, iopts, report)
    elif fmt == "react":
        from critic_audit.io.react import iter_react

        it = iter_react(p, opts, iopts, report)
    elif fmt == "swe":
        from critic_audit.io.swe import iter_swe

        return iter_swe(p, opts, iopts, report)
    else:
        raise InputError(f"the format {fmt!r} does not hold conversations", path=p,
                         fix=f"use one of {list(CONVERSATION_FORMATS)}, or read it as a table input")
    return _apply_labels(it, iopts) if iopts.labels is not None else it


def _mixed(folder: Path, opts: ChatReadOptions, iopts: InputOptions,
           report: ReadReport | None) -> Iterator[Conversation]:
    """A folder of files in different conversation formats, file by file (ids unique across them)."""
    from critic_audit.io.common import IdRegistry

    ids = IdRegistry()
    files = sorted(q for q in folder.iterdir() if q.is_file() and not q.name.startswith(".")
                   and q.name.lower().endswith((*DIR_SUFFIXES, *_TEXT_SUFFIXES)))
    for q in files:
        fmt = detect_format(q, opts.messages_key)
        for c in iter_conversations(q, fmt, opts, iopts, report):
            ids.check(c.trajectory_id, _Ctx(q, 0))
            yield c


def read_table_input(
    path: str | Path,
    fmt: str,
    options: ChatReadOptions | None = None,
    input_options: InputOptions | None = None,
    report: ReadReport | None = None,
) -> tuple[pl.DataFrame, pl.DataFrame] | None:
    """Canonical ``(trajectories, tokens)`` of a ``tokenized`` input or a verl dump folder; None for
    a canonical-table folder / tokens file (the workflow's own reader handles those)."""
    from critic_audit.io.tokenized import read_tokenized

    p = Path(path)
    if fmt == "tokenized" and not (p.is_dir() and any(p.glob("step_*.tokens.parquet"))):
        return read_tokenized(p, options, input_options, report)
    if p.is_dir() and not (p / "tokens.parquet").exists() and any(p.glob("step_*.tokens.parquet")):
        return read_step_pairs(p)
    return None


def read_step_pairs(folder: Path) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Every ``step_*.tokens.parquet`` (with its ``step_*.trajectories.parquet``) of a verl dump folder."""
    trajs, toks = [], []
    for tok_path in sorted(folder.glob("step_*.tokens.parquet")):
        traj_path = tok_path.with_name(tok_path.name.replace(".tokens.parquet", ".trajectories.parquet"))
        try:
            tk = read_parquet(tok_path)  # pyarrow: a corrupt page raises instead of aborting
            tr = read_parquet(traj_path) if traj_path.exists() else None
        except Exception as e:  # pyarrow/polars raise many types for a corrupt file
            raise InputError(f"cannot read Parquet ({str(e).splitlines()[0] if str(e) else type(e).__name__})",
                             path=tok_path, fix="re-write this step with dump_verl_batch, or delete the pair") from None
        tk = validate(tk, "tokens", path=str(tok_path))
        if tr is None:
            tr = tk.group_by("trajectory_id", maintain_order=True).agg(
                num_turns=pl.col("turn").n_unique() - pl.col("turn").is_null().any().cast(pl.UInt32))
        tr = validate(tr, "trajectories", path=str(traj_path)).select(list(TRAJECTORY_SCHEMA))
        trajs.append(tr)
        toks.append(tk)
    trajectories = pl.concat(trajs, how="vertical_relaxed")
    tokens = pl.concat(toks, how="vertical_relaxed")
    trajectories = validate(trajectories, "trajectories", path=str(folder))
    tokens = validate(tokens, "tokens", path=str(folder))
    return trajectories, tokens
