"""``analyze`` streamed: canonical tables that already carry the critic's values (a folder with
``tokens.parquet`` and ``trajectories.parquet``, such a tokens file, a verl dump folder of many
``step_*`` pairs, an earlier ``analyze`` folder) are audited without loading their tokens: the
trajectories tables are read whole (one row per trajectory), the tokens files in row batches
(:class:`critic_audit.analysis.stream.AuditStream`), and the summary comes from the per-trajectory
sufficient statistics (:func:`critic_audit.analysis.audit.audit_from_sums`), identical to the in-memory
path. Memory: one batch plus the longest trajectory plus O(trajectories + turns).

The output folder is a normal audit folder without a copy of the tokens (unless ``keep_tokens``):
``trajectories.parquet`` (statistics and the critic-quality sums), ``turns.parquet`` (mean value of
every assistant turn: ``monitor`` and the turn-position plot), ``traces.parquet`` (the policy tokens of
the trajectories drawn in the value-trace plots), ``steps.json`` (the histogram of value steps), and
the summary, config, plots and reports. :func:`stats_folder` recognises such a folder, which
``analyze`` re-audits from its statistics (:func:`reaudit`), and ``plot`` / ``monitor`` read.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from critic_audit.analysis.audit import QUALITY_SUMS, AuditConfig, AuditResult, audit_from_sums, audit_from_table
from critic_audit.analysis.stream import AuditStream, StepHistogram, file_batches, token_columns
from critic_audit.errors import ConfigError, InputError
from critic_audit.io.records import ReadOptions, ReadReport
from critic_audit.summary import Truncation

#: Files of a streamed audit folder beside the usual ones.
STREAM_FILES = ("turns.parquet", "traces.parquet", "steps.json")


@dataclasses.dataclass
class StreamPart:
    """One ``(trajectories, tokens)`` file pair of an input (``input``: the path resolved to it), or one
    file of tokenized rows (``spec``: its :class:`critic_audit.io.detect.FileSpec`; ``trajectories``
    None), converted chunk by chunk."""

    input: Path
    trajectories: Path | None
    tokens: Path
    spec: Any = None


@dataclasses.dataclass
class StreamedAudit:
    """A streamed audit: the result, the aggregates the plots and ``monitor`` read, the inputs' parts,
    the options they were read with, and ``kept_tokens``: the canonical token rows of a tokenized-rows
    part, written while it was converted (``--keep-tokens``: the rows are converted once), or None."""

    result: AuditResult
    turns: pl.DataFrame
    steps: StepHistogram
    traces: pl.DataFrame
    parts: list[StreamPart]
    pre_excluded: dict[str, str]
    options: ReadOptions = dataclasses.field(default_factory=ReadOptions)
    kept_tokens: Path | None = None


def stream_plan(inputs: Sequence[str | Path], options: ReadOptions,
                report: ReadReport | None = None) -> tuple[list[StreamPart], str | None, list[Any]]:
    """The file pairs of ``inputs`` in reading order, None and the inputs as resolved
    (:func:`critic_audit.io.detect.resolve_inputs`); or ``([], why, [])`` when they cannot be streamed:
    every input must be canonical tables with a trajectories table beside each tokens file (tokenized
    rows, ATIF and conversations are read in memory). A table file that cannot be read (permissions, a
    broken link, a FIFO) is refused in one line, or with ``options.lenient`` skipped and counted in
    ``report.skipped_files``.

    Raises:
        InputError: an unreadable table file (not lenient).
    """
    from critic_audit.io.detect import entry_error, entry_problem, resolve_inputs
    from critic_audit.io.tables import has_nonfinite_reward, may_hold_unfit_rows

    rep = report if report is not None else ReadReport()
    try:
        resolved = resolve_inputs(list(inputs), options, rep)
    except InputError as e:
        return [], str(e), []
    parts: list[StreamPart] = []
    specs = [spec for r in resolved for spec in r.files]
    if len(specs) == 1 and specs[0].format == "tokenized":  # one file: no id is qualified across files
        return [StreamPart(Path(specs[0].path), None, Path(specs[0].path), specs[0])], None, resolved
    for r in resolved:
        for spec in r.files:
            if spec.format != "tables":
                return [], f"{spec.path} is {spec.format} data, not canonical tables (streamed: one file alone)", []
            p = Path(spec.path)
            if p.is_dir() and not (p / "tokens.parquet").exists():
                toks = sorted(p.glob("step_*.tokens.parquet"))
                pairs = [(t.with_name(t.name.replace(".tokens.parquet", ".trajectories.parquet")), t) for t in toks]
            else:
                tok = p / "tokens.parquet" if p.is_dir() else p
                pairs = [(tok.parent / "trajectories.parquet", tok)]
            for tr, tk in pairs:
                if not tr.exists():
                    return [], f"{tk} has no {tr.name} beside it", []
                bad = next(((f, why) for f in (tk, tr) if (why := entry_problem(f)) is not None), None)
                if bad is not None:  # unreadable (permissions), a FIFO, a broken link: one line, or skipped
                    if not options.lenient:
                        raise entry_error(*bad)
                    rep.skip_file(bad[0], bad[1][0])
                    continue
                if options.lenient and (may_hold_unfit_rows(tk, "tokens") or may_hold_unfit_rows(tr, "trajectories")):
                    return [], (f"{tk.parent} stores a column in another dtype than the canonical one, whose rows "
                                "--lenient may have to skip (read in memory)"), []
                if has_nonfinite_reward(tr):
                    return [], f"{tr} holds a NaN or infinite reward (read in memory, which refuses or skips it)", []
                parts.append(StreamPart(p, tr, tk))
    if not parts:
        return [], "no table input", []
    shared = _shared_ids(parts)
    if shared is not None:
        return [], shared, []
    return parts, None, resolved


def _shared_ids(parts: list[StreamPart]) -> str | None:
    """Why the parts cannot be streamed as they are: a trajectory id found in two inputs (the in-memory
    reader qualifies it with its file's label); None when every input's ids are its own."""
    import pyarrow.parquet as pq

    owner: dict[str, Path] = {}
    for part in parts:
        if part.trajectories is None:
            continue
        try:
            ids = pq.ParquetFile(part.trajectories).read(columns=["trajectory_id"]).column(0).to_pylist()  # no pyarrow.dataset (pandas) import
        except Exception:  # noqa: BLE001 - unreadable or without ids: the reader names it
            continue
        for t in ids:
            first = owner.setdefault(str(t), part.input)
            if first != part.input:
                return f"trajectory id {t!r} is in {first} and {part.input} (qualified with file labels in memory)"
    return None


def _read_trajectories(part: StreamPart) -> tuple[pl.DataFrame, dict[str, str]]:
    from critic_audit.io.tables import canonical_trajectories
    from critic_audit.schema import read_parquet

    try:
        raw = read_parquet(part.trajectories)
    except Exception as e:  # noqa: BLE001 - pyarrow raises many types for a corrupt file
        raise InputError(f"cannot read Parquet ({(str(e).strip().splitlines() or [type(e).__name__])[0]})",
                         path=part.trajectories, fix="re-write this table, or delete the pair") from None
    return canonical_trajectories(raw, path=str(part.trajectories))


#: columns of the value-trace tokens (``traces.parquet``): the policy tokens of the traced trajectories
TRACE_COLUMNS = {"trajectory_id": pl.String, "position": pl.Int32, "turn": pl.Int32, "response_mask": pl.Boolean,
                 "value": pl.Float32}


def _token_rows_arrow(tk: pl.DataFrame) -> Any:
    """Canonical token rows as the Arrow table ``tokens.parquet`` holds (:data:`critic_audit.schema.TOKEN_SCHEMA`;
    a column the rows lack is null)."""
    from critic_audit.schema import TOKEN_SCHEMA

    target = pl.DataFrame(schema=TOKEN_SCHEMA).to_arrow().schema
    tk = tk.with_columns([pl.lit(None, dtype=t).alias(c) for c, t in TOKEN_SCHEMA.items() if c not in tk.columns])
    return tk.select(list(TOKEN_SCHEMA)).cast(TOKEN_SCHEMA).to_arrow().cast(target)  # type: ignore[arg-type]


def _stream_rows(part: StreamPart, stream: AuditStream, options: ReadOptions, report: ReadReport,
                 spill: Path, keep: Path | None = None) -> pl.DataFrame:
    """Feed a tokenized-rows part to ``stream`` chunk by chunk (each chunk's trajectories registered
    before its tokens); returns its trajectories table. Each chunk's policy tokens
    (:data:`TRACE_COLUMNS`) are appended to the Arrow IPC file ``spill`` (LZ4: about 8 bytes a policy
    token), from which the value traces are taken once the traced trajectories are known
    (:func:`_spilled_traces`), and with ``keep`` its canonical token rows to the Parquet file ``keep``
    (``--keep-tokens``): the rows are read and converted once."""
    import pyarrow.ipc as ipc
    import pyarrow.parquet as pq

    from critic_audit.io.tokenized import iter_table_chunks, sequences_to_tables
    from critic_audit.schema import TOKEN_SCHEMA

    trajs, row0 = [], 0
    cols = token_columns(stream.scope)
    schema = pl.DataFrame(schema=TRACE_COLUMNS).to_arrow().schema
    with ipc.new_file(spill, schema, options=ipc.IpcWriteOptions(compression="lz4")) as w, \
            (pq.ParquetWriter(keep, pl.DataFrame(schema=TOKEN_SCHEMA).to_arrow().schema) if keep is not None
             else contextlib.nullcontext()) as kw:
        for tr, tk in iter_table_chunks(part.spec, options, report):
            k = stream.add_trajectories(tr["trajectory_id"].to_list(),
                                        tr["reward"].cast(pl.Float64).fill_null(np.nan).to_numpy())
            stream.add_tokens(tk.select(cols), part.tokens, row0, part=k)
            w.write_table(tk.filter(pl.col("response_mask")).select(list(TRACE_COLUMNS)).to_arrow().cast(schema))
            if kw is not None:
                kw.write_table(_token_rows_arrow(tk))
            row0 += tk.height
            trajs.append(tr)
    return pl.concat(trajs, how="vertical") if trajs else sequences_to_tables([])[0]


#: ``ready(event, value)``: a streamed audit's plot inputs as they are complete, before its summary is:
#: ``("plot_inputs", (per_trajectory, traces, turns, steps))``, then ``("by_checkpoint", rows)``
Ready = Callable[[str, Any], None]


def run_stream(parts: list[StreamPart], config: AuditConfig, *, batch_rows: int = 1 << 20,
               truncation: Truncation | None = None, options: ReadOptions | None = None,
               report: ReadReport | None = None, keep_tokens: bool = False,
               ready: Ready | None = None) -> StreamedAudit:
    """Audit ``parts`` streamed (module docstring): trajectories first, then every tokens file in
    batches of ``batch_rows`` rows, then the value-trace tokens and the summary. ``keep_tokens``: a
    tokenized-rows part also writes its canonical token rows as it converts them
    (:attr:`StreamedAudit.kept_tokens`, a temporary file that :func:`write_stream_files` moves into the
    folder; removed at exit otherwise). ``ready``: told what the plots draw (the per-trajectory table,
    the value-trace tokens, the turn means, the step histogram; then the checkpoint breakdown:
    :data:`Ready`) as soon as each is complete, before the summary's other intervals and gates are
    computed (``analyze`` draws the plots in another process meanwhile).

    Raises:
        InputError, SchemaError: an unreadable file, a table that breaks its schema, token rows of a
            trajectory missing from its trajectories table, a trajectory id in two parts, rows out of
            order (:func:`critic_audit.analysis.stream.decompose_parquet`).
    """
    from critic_audit.schema import concat_tables

    stream = AuditStream(config.scope)
    if len(parts) == 1 and parts[0].spec is not None:  # one file of tokenized rows
        import tempfile

        keep = _kept_tokens_file() if keep_tokens else None
        with tempfile.TemporaryDirectory(prefix="critic-audit-traces-") as tmp:
            spill = Path(tmp) / "policy_tokens.arrow"
            trajectories = _stream_rows(parts[0], stream, options or ReadOptions(),
                                        report if report is not None else ReadReport(), spill, keep)
            run = _finish_stream(stream, trajectories, parts, config, {}, truncation, spill, ready)
            return dataclasses.replace(run, options=options or ReadOptions(), kept_tokens=keep)
    trajs, pre = [], {}
    for part in parts:
        tr, pr = _read_trajectories(part)
        pre.update(pr)
        stream.add_trajectories(tr["trajectory_id"].to_list(), tr["reward"].cast(pl.Float64).fill_null(np.nan).to_numpy(),
                                pre_excluded=pr)
        trajs.append(tr)
    trajectories = concat_tables(trajs, "trajectories") if len(trajs) > 1 else trajs[0]
    cols = token_columns(config.scope)
    batches = (b for k, part in enumerate(parts) for b in file_batches(part.tokens, cols, batch_rows, part=k))
    for rb, path, row0, k in read_ahead(batches):
        stream.add_tokens(rb, path, row0, part=k)
    return _finish_stream(stream, trajectories, parts, config, pre, truncation, None, ready)


def _kept_tokens_file() -> Path:
    """A temporary ``tokens.parquet`` path for :attr:`StreamedAudit.kept_tokens` (its folder removed at exit)."""
    import atexit
    import shutil
    import tempfile

    folder = tempfile.mkdtemp(prefix="critic-audit-tokens-")
    atexit.register(shutil.rmtree, folder, True)
    return Path(folder) / "tokens.parquet"


def read_ahead(items: Iterator[Any]) -> Iterator[Any]:
    """``items`` with the next one produced on a worker thread while the caller handles the current one
    (a Parquet read releases the GIL, and so do the stream's numba kernels: on two free cores the read
    of file k+1 overlaps the reduction of file k). One item ahead at most; an exception raised while
    producing an item is raised here, in order."""
    from concurrent.futures import ThreadPoolExecutor

    end = object()
    with ThreadPoolExecutor(1, thread_name_prefix="critic-audit-read") as pool:
        pending = pool.submit(next, items, end)
        while True:
            item = pending.result()
            if item is end:
                return
            pending = pool.submit(next, items, end)
            yield item


def _finish_stream(stream: AuditStream, trajectories: pl.DataFrame, parts: list[StreamPart], config: AuditConfig,
                   pre: dict[str, str], truncation: Truncation | None,
                   spill: Path | None = None, ready: Ready | None = None) -> StreamedAudit:
    """The audit of a fed stream: turn means, value-trace tokens (from ``spill``, the policy tokens
    :func:`_stream_rows` wrote, when given; else read again from the tokens files), then ``ready`` with
    them (:func:`run_stream`) and the summary."""
    out = stream.finish()
    rows, turn, n, mean = out["turns"]
    ids = trajectories["trajectory_id"]
    turns = pl.DataFrame({"trajectory_id": ids.gather(rows) if rows.size else ids.clear(),
                          "turn": pl.Series(turn, dtype=pl.Int32), "n_tokens": pl.Series(n, dtype=pl.Int64),
                          "mean_value": pl.Series(mean, dtype=pl.Float64)}).sort("trajectory_id", "turn")
    traced: list[pl.DataFrame] = []

    def table_ready(event: str, value: Any) -> None:  # the traces depend on the per-trajectory table alone
        if event == "per_trajectory":
            traced.append(_spilled_traces(value, spill) if spill is not None else
                          trace_tokens(value, [p.tokens for p in parts], out["part"]))
            value = (value, traced[0], turns, out["steps"])
        if ready is not None:
            ready("plot_inputs" if event == "per_trajectory" else event, value)

    result = audit_from_sums(trajectories, out["sums"], out["quality"], config, pre_excluded=pre,
                             truncation=truncation, ready=table_ready)
    return StreamedAudit(result, turns, out["steps"], traced[0], parts, pre)


def _spilled_traces(per: pl.DataFrame, spill: Path) -> pl.DataFrame:
    """:func:`trace_tokens` of a tokenized-rows file: the traced trajectories' rows of ``spill`` (the
    policy tokens :func:`_stream_rows` wrote, in file order)."""
    ids = pl.Series(trace_ids(per), dtype=pl.String).implode()
    return pl.scan_ipc(spill).filter(pl.col("trajectory_id").is_in(ids)).collect()


def trace_ids(per: pl.DataFrame) -> list[str]:
    """The trajectories the value-trace plots draw (:func:`critic_audit.analysis.examples.pick_examples`)."""
    from critic_audit.analysis.examples import pick_examples

    ids: list[str] = []
    for ex in (pick_examples(per), pick_examples(per, per_class=3)):
        for k in ("success", "failure", "unknown"):
            v = ex.get(k)
            ids += [v] if isinstance(v, str) else list(v or [])
    return sorted(set(ids))


def trace_tokens(per: pl.DataFrame, files: list[Path], part: np.ndarray) -> pl.DataFrame:
    """The policy tokens of the :func:`trace_ids` trajectories, read again from the tokens files that
    hold them (``part``: each trajectory's file number, in ``per``'s row order)."""
    ids = trace_ids(per)
    cols, schema = list(TRACE_COLUMNS), TRACE_COLUMNS
    if not ids:
        return pl.DataFrame(schema=schema)
    rows = per.with_row_index("_r").filter(pl.col("trajectory_id").is_in(pl.Series(ids).implode()))["_r"].to_numpy()
    frames = []
    for k in sorted(set(part[rows].tolist())):
        frames.append(pl.scan_parquet(files[k]).select(cols)
                      .filter(pl.col("trajectory_id").cast(pl.String).is_in(pl.Series(ids).implode())
                              & pl.col("response_mask"))
                      .collect().cast(schema))  # type: ignore[arg-type]
    return pl.concat(frames) if frames else pl.DataFrame(schema=schema)


def stats_folder(path: str | Path) -> bool:
    """``path`` is an audit folder written streamed (``summary.json``, ``trajectories.parquet`` with the
    statistics, ``turns.parquet``, no ``tokens.parquet``): :func:`reaudit` audits it again."""
    p = Path(path)
    return (p.is_dir() and not (p / "tokens.parquet").exists()
            and all((p / f).exists() for f in ("summary.json", "trajectories.parquet", *STREAM_FILES)))


def original_inputs(folder: Path, config: AuditConfig) -> list[str] | None:
    """None when a :func:`stats_folder`'s statistics answer ``config`` (the same scope); else the inputs
    it was audited from, to stream again with the new scope.

    Inputs are recorded absolute; a folder written by an older version recorded them relative to the
    folder its run ran in, tried here in turn: its ``config.json`` ``cwd`` (when recorded), the current
    folder, the audit folder and the folder holding it (the first where every input exists).

    Raises:
        ConfigError: another scope, and the original inputs are gone (or are statistics themselves).
    """
    from critic_audit.io.tables import prior_summary

    prior = prior_summary(folder) or {}
    if not prior.get("scope") or prior["scope"] == config.scope:
        return None
    src = [str(p) for p in prior.get("inputs") or []]
    for base in _input_bases(folder):
        found = [str(base / p) for p in src]  # an absolute p stays itself
        if src and all(Path(p).exists() and not stats_folder(p) for p in found):
            return found
    raise ConfigError(f"{folder} was audited with --scope {prior['scope']}; its statistics cannot be re-selected "
                      f"for --scope {config.scope}, and its inputs ({', '.join(src) or 'none recorded'}) are not "
                      "there to read again", fix=f"use --scope {prior['scope']}, or audit the original tables")


def _input_bases(folder: Path) -> list[Path]:
    """Where :func:`original_inputs` looks for inputs recorded relative: the recorded ``cwd``, the
    current folder, the audit folder, its parent."""
    try:
        cwd = json.loads((folder / "config.json").read_text()).get("cwd")
    except (OSError, ValueError, AttributeError):
        cwd = None
    bases = [Path(cwd)] if isinstance(cwd, str) and cwd else []
    with contextlib.suppress(OSError):  # (the current folder may have been removed)
        bases.append(Path.cwd())
    return [*bases, Path(folder), Path(os.path.abspath(folder)).parent]


def reaudit(folder: Path, config: AuditConfig) -> StreamedAudit:
    """The audit of a :func:`stats_folder` again, from its per-trajectory statistics: new intervals,
    thresholds and breakdowns; the scope is the folder's.

    Raises:
        ConfigError: another ``--scope`` than the folder's (its tokens are not there to select again).
        InputError, SchemaError: a file of the folder cannot be read or lacks its columns.
    """
    from critic_audit.io.tables import prior_summary

    prior = prior_summary(folder) or {}
    if prior.get("scope") and prior["scope"] != config.scope:
        raise ConfigError(f"{folder} was audited with --scope {prior['scope']}; its statistics cannot be "
                          f"re-selected for --scope {config.scope}", fix=f"use --scope {prior['scope']}, or "
                          "audit the original tables (or a folder written with --keep-tokens)")
    per = _read(folder / "trajectories.parquet")
    trunc = prior.get("truncated")
    result = audit_from_table(per, config, truncation=trunc).with_summary(template_system=prior.get("template_system"))
    traces, turns, steps = read_aggregates(folder)
    return StreamedAudit(result, turns, steps, traces, [], {})


def read_aggregates(folder: Path) -> tuple[pl.DataFrame, pl.DataFrame, StepHistogram]:
    """``(traces, turns, steps)`` of a :func:`stats_folder`.

    Raises:
        InputError: a file cannot be read.
    """
    turns, traces = _read(folder / "turns.parquet"), _read(folder / "traces.parquet")
    try:
        steps = StepHistogram.from_dict(json.loads((folder / "steps.json").read_text()))
    except (OSError, ValueError, AttributeError) as e:
        raise InputError(f"cannot read steps.json ({e})", path=folder, fix="re-run critic-audit analyze") from None
    return traces, turns, steps


def _read(path: Path) -> pl.DataFrame:
    from critic_audit.io.tables import read_parquet_file

    return read_parquet_file(path)


def write_stream_files(folder: Path, run: StreamedAudit, *, keep_tokens: bool) -> None:
    """The tables of a streamed audit folder (module docstring); ``keep_tokens``: also ``tokens.parquet``,
    the canonical token rows of every part in reading order: the rows a tokenized-rows part wrote as it
    was converted (:attr:`StreamedAudit.kept_tokens`, moved in), else copied batch by batch."""
    import shutil

    from critic_audit.io.common import write_parquet_atomic

    per = run.result.per_trajectory.rename({v: k for k, v in QUALITY_SUMS.items()})
    write_parquet_atomic(per, folder / "trajectories.parquet")
    write_parquet_atomic(run.turns, folder / "turns.parquet")
    write_parquet_atomic(run.traces, folder / "traces.parquet")
    (folder / "steps.json").write_text(json.dumps(run.steps.as_dict()) + "\n")
    if keep_tokens and run.kept_tokens is not None and run.kept_tokens.exists():
        shutil.move(run.kept_tokens, folder / "tokens.parquet")
    elif keep_tokens:
        _copy_tokens(run.parts, folder / "tokens.parquet", run.options)


def _copy_tokens(parts: list[StreamPart], out: Path, options: ReadOptions) -> None:
    """The canonical token rows of ``parts`` into ``out``, batch by batch (tokenized rows not kept by
    :func:`run_stream` converted again with the ``options`` they were audited with: the rows
    ``--lenient`` skipped stay out)."""
    import pyarrow.parquet as pq

    from critic_audit.io.tokenized import iter_table_chunks
    from critic_audit.schema import TOKEN_SCHEMA

    with pq.ParquetWriter(out, pl.DataFrame(schema=TOKEN_SCHEMA).to_arrow().schema) as w:
        for part in parts:
            if part.spec is not None:
                for _, tk in iter_table_chunks(part.spec, options, ReadReport()):
                    w.write_table(_token_rows_arrow(tk))
                continue
            pf = pq.ParquetFile(part.tokens)
            for rb in pf.iter_batches(batch_size=1 << 20):
                df = pl.from_arrow(rb)
                assert isinstance(df, pl.DataFrame)
                w.write_table(_token_rows_arrow(df))
