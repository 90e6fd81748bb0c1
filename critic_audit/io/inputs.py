"""Read the inputs of ``analyze``, ``check`` and ``fit-critic``: every path resolved once
(:func:`critic_audit.io.detect.resolve_inputs`), each file read once with its registered reader.

:func:`read_all` is the one entry point the commands use: conversations (ids qualified across every
input, ``{label}/{id}``), table inputs (ids qualified across table files) and the resolved inputs, with
one :class:`~critic_audit.io.records.ReadReport`. Layering: ``io -> schema, errors``.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path

import polars as pl

from critic_audit.errors import InputError
from critic_audit.io.detect import (
    ENTRY_PROBLEMS, FileSpec, ResolvedInput, entry_error, entry_problem, kept_after_id_policy, read_conversations,
    resolve_inputs,
)
from critic_audit.io.formats import FORMATS
from critic_audit.io.records import ReadOptions, ReadReport
from critic_audit.schema import Conversation, concat_tables

__all__ = ["InputSet", "TablePart", "TokenFile", "read_all", "token_files", "read_inputs", "read_tables", "read_table_specs",
           "qualify_all", "is_table_input",
           "expand_table_folders"]

#: One table file as read: ``(path, trajectories, tokens, pre_excluded)``.
TablePart = tuple[Path, pl.DataFrame, pl.DataFrame, dict[str, str]]


@dataclasses.dataclass
class InputSet:
    """Every input of a command, resolved and read once (:func:`read_all`).

    Attributes:
        resolved: each path as resolved (files, format, kind, label), in the order given.
        conversations: the conversations of every conversation file (ids qualified across all of them),
            or None when no input holds conversations.
        tables: each table file read (``tables=True``), ids qualified across table files; empty otherwise.
        report: what was skipped and noted while reading.
        conversation_files: the file of each conversation (``conversation_files[i]`` read
            ``conversations[i]``), for a caller that applies the id policy itself (``qualify=False``).
    """

    resolved: list[ResolvedInput]
    conversations: list[Conversation] | None
    tables: list[TablePart]
    report: ReadReport
    conversation_files: list[FileSpec] = dataclasses.field(default_factory=list)

    @property
    def conversation_inputs(self) -> list[Path]:
        """The inputs that hold conversation files."""
        return [r.path for r in self.resolved if any(f.kind == "conversations" for f in r.files)]


def read_all(paths: Sequence[str | Path], options: ReadOptions = ReadOptions(), *, report: ReadReport | None = None,
             tables: bool = True, qualify: bool = True) -> InputSet:
    """Resolve ``paths`` once and read every file once: the table files (unless ``tables=False``: a
    caller that reads them its own way finds them in ``resolved``), then the conversations. One id
    policy across both (:func:`critic_audit.io.detect.apply_id_policy`): a trajectory id found in more
    than one file becomes ``{file label}/{id}``, a group id found in more than one file (collection,
    for formats whose groups span files) ``{label}/{group}``; ``qualify=False`` leaves the ids as read
    (the caller applies the policy with ``InputSet.conversation_files``, as ``check`` does).

    Raises:
        InputError: a file cannot be read, a bad record (strict mode). SchemaError: a table breaks its
            schema.
    """
    rep = report if report is not None else ReadReport()
    resolved = resolve_inputs(list(paths), options, rep)
    chat_inputs = [r.path for r in resolved if any(f.kind == "conversations" for f in r.files)]
    parts, part_specs = _read_table_parts(resolved, options, rep) if tables else ([], [])
    convs, conv_specs = _read_conversation_files(resolved, options, rep, named=False) if chat_inputs else ([], [])
    if qualify:
        parts = qualify_all(convs, conv_specs, parts, part_specs, rep, lenient=options.lenient)
    rep.records_read = len(convs) + sum(tr.height for _, tr, _, _ in parts)
    return InputSet(resolved, convs if chat_inputs else None, parts, rep, conv_specs)


def read_inputs(paths: Sequence[str | Path], options: ReadOptions = ReadOptions(), *,
                report: ReadReport | None = None,
                resolved: Sequence[ResolvedInput] | None = None) -> list[Conversation]:
    """Read rollouts of the conversation formats (``options.format``, or detected per file) from several
    files or folders (searched recursively; stray files skipped and counted in ``report``). A
    trajectory id found in several files is qualified with its file's label (``env_a/7``), a group id
    too (:func:`critic_audit.io.detect.apply_id_policy`); lenient mode (``options.lenient``) skips bad
    records and counts them in ``report``. ``resolved``: the inputs as
    :func:`critic_audit.io.detect.resolve_inputs` resolved them (not resolved again).

    Raises:
        InputError: a file cannot be read, a bad record (strict mode), or an input holds tables.
    """
    rep = report if report is not None else ReadReport()
    res = list(resolved) if resolved is not None else resolve_inputs(list(paths), options, rep)
    convs, specs = _read_conversation_files(res, options, rep, named=resolved is None)
    return kept_after_id_policy(convs, specs, rep, lenient=options.lenient)


def _read_conversation_files(res: Sequence[ResolvedInput], options: ReadOptions, rep: ReadReport, *,
                             named: bool) -> tuple[list[Conversation], list[FileSpec]]:
    """The conversations of every conversation file of ``res`` (ids as read) and the file of each.
    ``named``: an input of table files only is an error (it was named as conversations)."""
    convs: list[Conversation] = []
    specs: list[FileSpec] = []
    for r in res:
        tables = [f for f in r.files if f.kind == "tables"]
        if tables and len(tables) == len(r.files) and named:
            raise InputError(f"this input is {tables[0].format} data, not conversations", path=tables[0].path,
                             fix="pass it to analyze as a table input, or force another --format")
        for spec in r.files:
            if spec.kind != "conversations":
                continue
            before = (Counter(rep.skipped), Counter(rep.notes))
            try:
                file_convs = list(read_conversations(spec, options, rep))
            except InputError as e:
                # lenient: record errors were skipped inside; what escapes is about the whole file (not
                # UTF-8, not JSON): skip and count the file, unless it was named on its own
                found = Path(spec.origin or spec.path)  # the user's file (not its decompressed copy)
                inside = found != Path(r.path)  # found in a folder, not named on its own
                if not options.lenient and inside:
                    raise _stray_hint(e, found, Path(r.path)) from e
                if not options.lenient or e.path != str(spec.path) or not inside:
                    raise
                rep.skipped, rep.notes = before  # a file skipped whole counts once, as a file: none of its
                rep.skip_file(found, "unreadable_file")  # records (some were counted before it broke)
                continue
            convs += file_convs
            specs += [spec] * len(file_convs)
    return convs, specs


def _stray_hint(e: InputError, file: Path, folder: Path) -> InputError:
    """``e`` for a file found inside ``folder``, its fix naming the way past a stray file: move it out,
    or ``--lenient`` (bad records and unreadable files skipped and counted)."""
    hint = (f"if {file.name} is not a rollout file, move it out of {folder} or pass --lenient (skips bad "
            "records and files, counted in the summary)")
    fix = f"{e.fix}; {hint}" if e.fix else hint
    return type(e)(e.problem, path=e.path, record=e.record, fix=fix)


@dataclasses.dataclass
class TokenFile:
    """One table file read with the per-token fields the canonical tables drop (:func:`token_files`):
    either ``sequences`` (:class:`critic_audit.io.tokenized.TokenSequence` with their ``token_arrays``:
    rewards, log-probs, returns, advantages, turn ids), or the canonical ``trajectories`` / ``tokens``
    tables with ``side``, the verl dump's side table (:func:`critic_audit.io.verl_dump.read_side_tables`;
    None: the file has none).

    Attributes:
        path: the file (or dump folder) read.
        label: its label (a trajectory id found in several files is qualified as ``{label}/{id}``).
        spec: the file as resolved (for :func:`critic_audit.io.detect.apply_id_policy`).
        sequences: an iterator of token sequences (read lazily), or None.
        trajectories, tokens, side: polars tables when ``sequences`` is None.
    """

    path: Path
    label: str
    sequences: Iterator | None = None
    spec: FileSpec | None = None
    trajectories: pl.DataFrame | None = None
    tokens: pl.DataFrame | None = None
    side: pl.DataFrame | None = None


def token_files(resolved: Sequence[ResolvedInput], options: ReadOptions, report: ReadReport) -> Iterator[TokenFile]:
    """Every table file of ``resolved`` (``read_all(..., tables=False).resolved``), in order, read with
    its per-token fields: as token sequences where the format's reader yields them (tokenized rows,
    NeMo Gym and ATIF records with token ids), else as canonical tables with the dump's side table.

    Raises:
        InputError: a file cannot be read, a bad record (strict mode). SchemaError: a table or side
            file breaks its schema.
    """
    from critic_audit.io.verl_dump import read_side_tables

    for r in resolved:
        for spec in r.files:
            if spec.kind != "tables":
                continue
            reader = FORMATS[spec.format].reader()
            if hasattr(reader, "iter_sequences"):
                yield TokenFile(Path(spec.path), spec.label, sequences=reader.iter_sequences(spec, options, report),
                                spec=spec)
            else:
                trajs, tokens, _ = reader.read_file(spec, options, report)
                yield TokenFile(Path(spec.path), spec.label, trajectories=trajs, tokens=tokens,
                                side=read_side_tables(Path(spec.path)), spec=spec)


def is_table_input(path: str | Path, options: ReadOptions | None = None) -> bool:
    """True when every file of ``path`` is read as tables: a canonical-table folder (``tokens.parquet``),
    a tokens Parquet file, a verl dump folder (``step_*.tokens.parquet``), tokenized rows, or ATIF
    files with token ids. False for a missing or unreadable path."""
    try:
        [r] = resolve_inputs([path], options or ReadOptions(), ReadReport())
    except InputError:
        return False
    return r.kind == "tables"


def read_table_specs(resolved: Sequence[ResolvedInput], options: ReadOptions,
                     report: ReadReport) -> list[tuple[Path, pl.DataFrame, pl.DataFrame, dict[str, str]]]:
    """``(path, trajectories, tokens, pre_excluded)`` of every table file of ``resolved``, each read once,
    ids qualified across the table files (:func:`qualify_all`)."""
    parts, specs = _read_table_parts(resolved, options, report)
    return qualify_all([], [], parts, specs, report)


def _read_table_parts(resolved: Sequence[ResolvedInput], options: ReadOptions,
                      report: ReadReport) -> tuple[list[TablePart], list[FileSpec]]:
    out, specs = [], []
    for r in resolved:
        for spec in r.files:
            if spec.kind == "tables":
                try:
                    tr, tk, pre = FORMATS[spec.format].reader().read_file(spec, options, report)
                except InputError as e:  # lenient: an unreadable table file is skipped and counted
                    if not (options.lenient and getattr(e, "reason", None) in ENTRY_PROBLEMS and e.path):
                        raise
                    report.skip_file(Path(e.path), e.reason)  # type: ignore[attr-defined]
                    continue
                out.append((spec.path, tr, tk, pre))
                specs.append(spec)
    return out, specs


class _Row:
    """One trajectory row of a table part, for :func:`apply_id_policy`."""

    __slots__ = ("trajectory_id", "group_id", "token_ids", "response_mask", "reward")

    def __init__(self, tid: str, gid: str | None) -> None:
        self.trajectory_id, self.group_id = tid, gid
        self.token_ids = self.response_mask = self.reward = None  # set where the id is in several files


def _row_contents(parts: list[TablePart], rows: list[list[_Row]], specs: Sequence[FileSpec]) -> None:
    """Give the table rows whose id is found in several files their content (token ids, mask, reward),
    so that two copies of one export are told from two runs that reuse ids
    (:mod:`critic_audit.io.copies`); nothing is read when every id is in one file."""
    where: dict[str, set[str]] = {}
    for rs, spec in zip(rows, specs):
        for x in rs:
            where.setdefault(x.trajectory_id, set()).add(spec.label)
    repeated = {t for t, labels in where.items() if len(labels) > 1}
    for (_, tr, tk, _), rs in zip(parts, rows) if repeated else ():
        mine = [x for x in rs if x.trajectory_id in repeated]
        if not mine:
            continue
        sub = tk.with_columns(pl.col("trajectory_id").cast(pl.String)).filter(
            pl.col("trajectory_id").is_in([x.trajectory_id for x in mine])).sort("trajectory_id", "position")
        agg = sub.group_by("trajectory_id", maintain_order=True).agg(pl.col("token_id").cast(pl.Int64),
                                                                      pl.col("response_mask").cast(pl.Int8))
        tokens = {t: (ids, mask) for t, ids, mask in agg.iter_rows()}
        rewards = (dict(zip(tr["trajectory_id"].cast(pl.String).to_list(), tr["reward"].to_list()))
                   if "reward" in tr.columns else {})
        for x in mine:
            x.token_ids, x.response_mask = tokens.get(x.trajectory_id, (None, None))
            x.reward = rewards.get(x.trajectory_id)


def qualify_all(convs: list[Conversation], conv_specs: Sequence[FileSpec], parts: list[TablePart],
                part_specs: Sequence[FileSpec], report: ReadReport, *, lenient: bool = False) -> list[TablePart]:
    """Apply the one id policy (:func:`critic_audit.io.detect.apply_id_policy`) across conversations
    (in place) and table parts (returned with their trajectory ids, group ids and ``pre_excluded`` keys
    renamed): ``analyze`` and ``check`` give a file's rollouts the same ids. With ``lenient``, a rollout
    repeated with the same id and content in another file is kept once: its later copies are removed from
    ``convs`` (in place) and from the parts' tables (counted in ``report.notes["duplicate_trajectories"]``)."""
    rows: list[list[_Row]] = []
    for _, tr, _, _ in parts:
        tids = tr["trajectory_id"].cast(pl.String).to_list()
        gids = tr["group_id"].cast(pl.String).to_list() if "group_id" in tr.columns else [None] * len(tids)
        rows.append([_Row(t, g) for t, g in zip(tids, gids)])
    _row_contents(parts, rows, part_specs)
    flat = [x for rs in rows for x in rs]
    flat_specs = [s for rs, s in zip(rows, part_specs) for _ in rs]
    before = [(x.trajectory_id, x.group_id) for x in flat]
    kept = {id(x) for x in kept_after_id_policy([*convs, *flat], [*conv_specs, *flat_specs], report, lenient=lenient)}
    convs[:] = [c for c in convs if id(c) in kept]
    out, k = [], 0
    for (path, tr, tk, pre), rs in zip(parts, rows):
        old = before[k:k + len(rs)]
        dropped = [o[0] for o, x in zip(old, rs) if id(x) not in kept]
        k += len(rs)
        if dropped:  # copies of rollouts read from another file: audited once
            tr = tr.filter(~pl.col("trajectory_id").cast(pl.String).is_in(dropped))
            tk = tk.filter(~pl.col("trajectory_id").cast(pl.String).is_in(dropped))
            pre = {key: v for key, v in pre.items() if key not in set(dropped)}
        tmap = {o[0]: x.trajectory_id for o, x in zip(old, rs) if o[0] != x.trajectory_id}
        gmap = {o[1]: x.group_id for o, x in zip(old, rs) if o[1] is not None and o[1] != x.group_id}
        if tmap:
            tr = tr.with_columns(pl.col("trajectory_id").cast(pl.String).replace(tmap))
            tk = tk.with_columns(pl.col("trajectory_id").cast(pl.String).replace(tmap))
            pre = {tmap.get(key, key): v for key, v in pre.items()}
        if gmap:
            tr = tr.with_columns(pl.col("group_id").cast(pl.String).replace(gmap))
        out.append((path, tr, tk, pre))
    return out


def read_tables(path: str | Path, *, options: ReadOptions | None = None,
                report: ReadReport | None = None) -> tuple[pl.DataFrame, pl.DataFrame, dict[str, str]]:
    """Read one table input: canonical tables (:func:`critic_audit.io.tables.read_tables`), tokenized
    rollouts or ATIF files with token ids (converted), as one ``(trajectories, tokens, pre_excluded)``.

    Raises:
        InputError: the path is missing or not a table input. SchemaError: a table breaks its schema.
    """
    opts = options or ReadOptions()
    rep = report if report is not None else ReadReport()
    p = Path(path)
    if not p.exists():
        raise InputError("no such file", path=p, fix="check the path")
    parts = read_table_specs(resolve_inputs([p], opts, rep), opts, rep)
    if not parts:
        raise InputError("this input holds no tables", path=p, fix="pass a canonical-table folder or tokenized rows")
    trajs = concat_tables([x[1] for x in parts], "trajectories", path=str(p))
    tokens = concat_tables([x[2] for x in parts], "tokens", path=str(p))
    return trajs, tokens, {k: v for x in parts for k, v in x[3].items()}


def _table_folder(d: Path) -> bool | tuple[str, str]:
    """Whether ``d`` is a canonical-table folder, or why it cannot be told (an
    :func:`~critic_audit.io.detect.entry_problem`: unreadable, a broken link, ...)."""
    problem = entry_problem(d)
    if problem is not None:
        return problem
    try:
        return d.is_dir() and (d / "tokens.parquet").exists()
    except OSError as e:  # a folder that can be listed but not searched
        return "unreadable_folder", e.strerror or str(e)


def expand_table_folders(inputs: Sequence[str | Path], *, lenient: bool = False,
                         report: ReadReport | None = None) -> list[str | Path]:
    """Replace a folder that holds canonical-table folders (e.g. a training run's ``rollouts/`` with
    one ``step_N/`` per step) by those folders, in name order; other inputs pass through (an input that
    cannot be read passes through too: its reader names it). An entry of such a folder that cannot be
    read (permissions, a broken link, a FIFO) is refused in one line, or with ``lenient`` skipped and
    counted in ``report.skipped_files``.

    Raises:
        InputError: an unreadable entry of a folder of table folders (not ``lenient``).
    """
    out: list[str | Path] = []
    for p in inputs:
        q = Path(p)
        try:
            plain = q.is_dir() and not (q / "tokens.parquet").exists() and not (q / "summary.json").exists()
            entries = sorted(q.iterdir()) if plain else []
        except OSError:  # the input itself: resolve_inputs names it
            out.append(p)
            continue
        kinds = {d: _table_folder(d) for d in entries}
        subs = [d for d, k in kinds.items() if k is True]
        if subs and not any(d.suffix in (".json", ".jsonl", ".parquet") and k is False for d, k in kinds.items()):
            for d, k in kinds.items():
                if isinstance(k, tuple) and not lenient:
                    raise entry_error(d, k)
                if isinstance(k, tuple) and report is not None:
                    report.skip_file(d, k[0])
            out.extend(subs)
            continue
        out.append(p)
    return out
