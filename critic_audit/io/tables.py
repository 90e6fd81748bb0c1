"""The one reader and writer of canonical tables (``docs/tables.md``): a folder with ``tokens.parquet``
(and ``trajectories.parquet``), a tokens Parquet file, or a verl dump folder
(``step_*.tokens.parquet`` with ``step_*.trajectories.parquet``); and the helpers that read an
``analyze`` output folder back (:func:`load_audit_folder`, :func:`prior_summary`).

Every table read is checked by :func:`critic_audit.schema.validate` (columns, dtypes, keys and the
row rules of :data:`critic_audit.schema.TOKEN_ROW_RULES`).
"""

from __future__ import annotations

import math

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import polars as pl

from critic_audit.errors import InputError, SchemaError
from critic_audit.io.detect import entry_error, entry_problem
from critic_audit.io.records import MAX_MAGNITUDE, ReadOptions, ReadReport, short, type_name
from critic_audit.io.tokenized import tokenized_columns
from critic_audit.schema import (  # noqa: F401  (PRE_SCORING_EXCLUSIONS: re-exported)
    PRE_SCORING_EXCLUSIONS,
    TABLE_SCHEMAS,
    TRAJECTORY_SCHEMA,
    bad_value_rows,
    cast_columns,
    concat_tables,
    loads,
    read_parquet,
    validate,
)

__all__ = ["read_tables", "write_tables", "has_nonfinite_reward", "canonical_trajectories", "read_file", "sniff_file", "PRE_SCORING_EXCLUSIONS",
           "load_audit_folder", "prior_summary", "refuse_multi_critic_folder", "check_side_summaries",
           "side_summary_problem", "may_hold_unfit_rows"]

def sniff_file(path: Path, head: str, options: ReadOptions) -> bool:
    """A Parquet file that is not tokenized rows (a tokens table, or a corrupt file to report)."""
    if not path.name.lower().endswith(".parquet"):
        return False
    try:
        return not tokenized_columns(list(pl.read_parquet_schema(path)))
    except Exception:  # corrupt: the reader reports it
        return True


#: a streamed audit's ``turns.parquet`` (the turn means that stand for its tokens)
TURN_MEANS_SCHEMA = {"trajectory_id": pl.String(), "turn": pl.Int32(), "n_tokens": pl.Int64(), "mean_value": pl.Float64()}


def _parquet(path: Path, fix: str) -> pl.DataFrame:
    problem = entry_problem(path)  # unreadable (permissions), a FIFO, a broken link: one line, --lenient skips it
    if problem is not None:
        raise entry_error(path, problem)
    try:
        return read_parquet(path)  # pyarrow: a corrupt page raises instead of aborting
    except Exception as e:  # pyarrow/polars raise many types for a corrupt file
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise InputError(f"cannot read Parquet ({msg})", path=path, fix=fix) from None


def read_parquet_file(path: str | Path, fix: str = "re-run critic-audit analyze to rewrite the folder") -> pl.DataFrame:
    """The Parquet file ``path`` as a polars DataFrame, or one line naming it (``analyze``, ``monitor``,
    ``plot`` alike).

    Raises:
        InputError: the file cannot be read (permissions, not a regular file, a broken link) or is not
            valid Parquet (``cannot read Parquet (<the reader's first line>)``), with ``fix``.
    """
    return _parquet(Path(path), fix)


def _unfit_rows(df: pl.DataFrame, table: str, path: Path, options: ReadOptions | None,
                report: ReadReport | None) -> set[str]:
    """The trajectories of ``df`` (a ``table`` as read from ``path``) with a row whose value does not
    fit its column's dtype (:func:`critic_audit.schema.bad_value_rows`: a fractional ``turn``, a
    ``response_mask`` of 2), counted in ``report`` as ``bad_table_value`` under ``--lenient``.

    Raises:
        SchemaError: such a row, not lenient: naming the file, the trajectory (and position), the column
            and the value.
    """
    got = bad_value_rows(df, TABLE_SCHEMAS[table]) if "trajectory_id" in df.columns else None
    if got is None:
        return set()
    rows, what, i = got
    ids = set(df.filter(rows)["trajectory_id"].cast(pl.String).to_list())
    row = df.row(i, named=True)
    pos = row.get("position")
    pos = int(pos) if isinstance(pos, float) and pos.is_integer() else pos
    at = f"trajectory {str(row['trajectory_id'])!r}" + (f" position {pos}" if "position" in row else "")
    fix = "write the column with its canonical dtype (docs/tables.md), or pass --lenient to skip such trajectories"
    n = f"{len(ids)} trajector{'y' if len(ids) == 1 else 'ies'} with such rows"
    if options is None or not options.lenient:
        raise SchemaError(f"{table} table: {what} ({n})", path=path, record=at, fix=fix)
    err = InputError(f"{table} table: {what} ({n}, skipped)", path=path, record=at, fix=fix)
    err.reason, err.records = "bad_table_value", len(ids)  # type: ignore[attr-defined]
    (report if report is not None else ReadReport()).skip(err)
    return ids


def may_hold_unfit_rows(path: str | Path, table: str) -> bool:
    """The Parquet ``table`` file at ``path`` stores a canonical column in a dtype whose rows may not all
    fit it (a float ``turn``, an integer ``response_mask``: :func:`critic_audit.schema.bad_value_rows`),
    told from its schema alone; False for a file whose schema cannot be read (its reader names it)."""
    try:
        schema = pl.read_parquet_schema(path)
    except Exception:  # noqa: BLE001 - a corrupt file: the reader reports it
        return False
    want = TABLE_SCHEMAS[table]
    return any(c in want and t != want[c] and t.is_numeric() and (want[c].is_integer() or want[c] == pl.Boolean)
               for c, t in schema.items())


def _without(df: pl.DataFrame, ids: set[str]) -> pl.DataFrame:
    return df.filter(~pl.col("trajectory_id").cast(pl.String).is_in(list(ids))) if ids else df


def has_nonfinite_reward(path: str | Path) -> bool:
    """The trajectories table at ``path`` has a NaN, +-inf or out-of-range (> 1e100) ``reward`` (read alone: the streamed
    reader hands such tables to the in-memory one, which refuses or skips those rows); False for a file
    without a float reward column or that cannot be read (its reader names it)."""
    try:
        df = pl.read_parquet(path, columns=["reward"])
    except Exception:  # noqa: BLE001 - no reward column, or corrupt: the reader reports it
        return False
    r = df["reward"]
    return r.dtype.is_float() and bool((r.is_nan() | (r.abs() > MAX_MAGNITUDE)).fill_null(False).any())


def _nonfinite_rewards(trajs: pl.DataFrame, path: Path, options: ReadOptions | None,
                       report: ReadReport | None) -> set[str]:
    """The trajectories whose ``reward`` is NaN, +-inf or beyond +-``MAX_MAGNITUDE`` (1e100; a null is "no
    reward"), refused as JSON input refuses them; counted as ``bad_reward`` under ``--lenient``.

    Raises:
        InputError: such a row, not lenient: naming the file, the row and trajectory, and the value.
    """
    if "reward" not in trajs.columns or not trajs.schema["reward"].is_float() or "trajectory_id" not in trajs.columns:
        return set()
    bad = trajs.select(pl.col("reward").is_nan() | (pl.col("reward").abs() > MAX_MAGNITUDE)).to_series().fill_null(False)
    if not bad.any():
        return set()
    rows = bad.arg_true()
    i = int(rows[0])
    tid, r = trajs["trajectory_id"][i], trajs["reward"][i]
    what = ("is NaN" if math.isnan(r) else f"is infinite ({r})" if math.isinf(r) else
            f"= {r:g} is out of range (|reward| > {MAX_MAGNITUDE:g}: the audit's statistics would overflow)")
    fix = (f"give the trajectory a finite reward{'' if math.isnan(r) or math.isinf(r) else ' of ordinary size'} "
           "(null where it has none), or pass --lenient to skip it")
    n = f"{len(rows)} such row{'s' if len(rows) != 1 else ''}"
    err = InputError(f"trajectories table: reward {what} ({n}{', skipped' if options and options.lenient else ''})",
                     path=path, record=f"{i} (trajectory {str(tid)!r})", fix=fix)
    if options is None or not options.lenient:
        raise err
    ids = set(trajs.filter(bad)["trajectory_id"].cast(pl.String).to_list())
    err.reason, err.records = "bad_reward", len(ids)  # type: ignore[attr-defined]
    (report if report is not None else ReadReport()).skip(err)
    return ids


def _pair(tok_path: Path, traj_path: Path, fix: str, options: ReadOptions | None = None,
          report: ReadReport | None = None) -> tuple[pl.DataFrame, pl.DataFrame, dict[str, str]]:
    tokens = _parquet(tok_path, fix)
    trajs = _parquet(traj_path, fix) if traj_path.exists() else None
    drop = _unfit_rows(tokens, "tokens", tok_path, options, report)  # --lenient: those trajectories left out
    if trajs is not None and "trajectory_id" in trajs.columns:
        drop |= _unfit_rows(_without(trajs, drop), "trajectories", traj_path, options, report)
        drop |= _nonfinite_rewards(_without(trajs, drop), traj_path, options, report)
        trajs = _without(trajs, drop)
    tokens = _without(tokens, drop)
    tokens = validate(tokens, "tokens", path=str(tok_path))
    if trajs is None:  # no trajectories table: derive one (no rewards)
        trajs = tokens.group_by("trajectory_id", maintain_order=True).agg(
            num_turns=pl.col("turn").n_unique() - pl.col("turn").is_null().any().cast(pl.UInt32))
    trajs, pre = canonical_trajectories(trajs, path=str(traj_path))
    orphans = tokens.select("trajectory_id").unique().join(trajs.select("trajectory_id"), on="trajectory_id", how="anti")
    if orphans.height:
        first = orphans.sort("trajectory_id")["trajectory_id"][0]
        n_rows = tokens.filter(pl.col("trajectory_id").is_in(orphans["trajectory_id"].implode())).height
        raise SchemaError(f"{n_rows} token row(s) of {orphans.height} trajectory id(s) are missing from "
                          f"{traj_path.name}", path=tok_path, record=f"trajectory {first!r}",
                          fix="write both tables from the same rollouts (or remove trajectories.parquet to "
                              "derive it from the tokens)")
    return trajs, tokens, pre


def canonical_trajectories(trajs: pl.DataFrame, *, path: str | None = None) -> tuple[pl.DataFrame, dict[str, str]]:
    """A trajectories table reduced to its canonical columns, and the pre-scoring exclusions an earlier
    audit recorded in its ``excluded`` column (by trajectory id).

    Raises:
        SchemaError: the table breaks its schema.
    """
    pre: dict[str, str] = {}
    trajs = validate(trajs, "trajectories", path=path)
    if "excluded" in trajs.columns:
        ex = cast_columns(trajs.select("trajectory_id", "excluded"), {"excluded": pl.String()}, "trajectories",
                          path=path)
        rows = ex.filter(pl.col("excluded").is_in(list(PRE_SCORING_EXCLUSIONS)))
        pre = dict(zip(rows["trajectory_id"].to_list(), rows["excluded"].to_list()))
    return trajs.select(list(TRAJECTORY_SCHEMA)), pre


def read_tables(path: str | Path, options: ReadOptions | None = None,
                report: ReadReport | None = None) -> tuple[pl.DataFrame, pl.DataFrame, dict[str, str]]:
    """Read canonical tables (see the module docstring).

    Returns ``(trajectories, tokens, pre_excluded)``: the trajectories table reduced to its canonical
    columns (an earlier audit's statistics are dropped), the tokens table, and the exclusions made
    before scoring that an earlier audit recorded (no assistant turn, over-long), by trajectory id.
    With ``options.lenient``, a trajectory with a row whose value does not fit its column's dtype (a
    fractional ``turn``, a ``response_mask`` of 2: :func:`critic_audit.schema.bad_value_rows`) is left
    out and counted in ``report`` (``bad_table_value``), its token rows and trajectories row alike.

    Raises:
        InputError: the file is missing or not Parquet. SchemaError: a table breaks its schema or a
            row rule; a row's value does not fit its column (not lenient), naming the trajectory.
    """
    p = Path(path)
    steps = sorted(p.glob("step_*.tokens.parquet")) if p.is_dir() and not (p / "tokens.parquet").exists() else []
    if steps:
        parts = [_pair(t, t.with_name(t.name.replace(".tokens.parquet", ".trajectories.parquet")),
                       "re-write this step with dump_verl_batch, or delete the pair", options, report) for t in steps]
        trajs = validate(concat_tables([x[0] for x in parts], "trajectories", path=str(p)), "trajectories", path=str(p))
        tokens = validate(concat_tables([x[1] for x in parts], "tokens", path=str(p)), "tokens", path=str(p))
        return trajs, tokens, {k: v for x in parts for k, v in x[2].items()}
    tok_path = p / "tokens.parquet" if p.is_dir() else p
    if not tok_path.exists():
        raise InputError("no such file", path=tok_path, fix="check the path")
    traj = tok_path.parent / "trajectories.parquet"
    if tok_path.name == "turns.parquet" and (tok_path.parent / "summary.json").is_file() and not traj.exists():
        raise InputError(f"no such file: the audit folder {tok_path.parent} lacks it (its turns.parquet holds turn "
                         "means, not tokens, and is audited with it)", path=traj,
                         fix="restore trajectories.parquet, or run critic-audit analyze on the original rollouts again")
    return _pair(tok_path, tok_path.parent / "trajectories.parquet",
                 "pass a Parquet file written by critic-audit or in the layout of docs/tables.md", options, report)


def read_file(spec: Any, options: ReadOptions, report: ReadReport) -> tuple[pl.DataFrame, pl.DataFrame, dict[str, str]]:
    """The registry's entry point: :func:`read_tables` of ``spec.path``."""
    return read_tables(spec.path, options, report)


def write_tables(folder: str | Path, trajectories: pl.DataFrame | None, tokens: pl.DataFrame | None, *,
                 prefix: str = "") -> tuple[Path, Path]:
    """Write ``{prefix}trajectories.parquet`` and ``{prefix}tokens.parquet`` into ``folder``, each
    atomically (tokens last, so that a reader that looks for the tokens file sees complete pairs).
    A table given as None is not written. Returns the two paths.

    Raises:
        InputError: the folder cannot be created or written.
    """
    from critic_audit.io.common import write_parquet_atomic

    d = Path(folder)
    traj_path, tok_path = d / f"{prefix}trajectories.parquet", d / f"{prefix}tokens.parquet"
    for df, path in ((trajectories, traj_path), (tokens, tok_path)):
        if df is not None:
            write_parquet_atomic(df, path)
    return traj_path, tok_path


# ------------------------------------------------------------------------ audit folders


def _summary_problem(d: Any) -> str | None:
    """What keeps ``d`` (a parsed ``summary.json``) from being read as an audit summary where the tables'
    readers use it (``truncated``, ``inference``, ``template_system``, ``critics``), or None."""
    if not isinstance(d, dict):
        return f"holds {type_name(d)} {short(d)}, expected an object (an audit's summary)"
    for key in ("truncated", "inference", "template_system"):
        if d.get(key) is not None and not isinstance(d[key], dict):
            return f"'{key}' is {type_name(d[key])} {short(d[key])}, expected an object"
    for key, v in (d.get("truncated") or {}).items():
        if key in ("trajectories", "turns", "policy_tokens") and v is not None and \
                (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            return f"'truncated.{key}' is {type_name(v)} {short(v)}, expected a count"
    critics = d.get("critics")
    if critics is not None and not (isinstance(critics, list) and all(isinstance(c, str) and c for c in critics)):
        return f"'critics' is {type_name(critics)} {short(critics)}, expected a list of critic labels"
    return None


def side_summary_problem(path: str | Path) -> tuple[Path, str] | None:
    """The ``summary.json`` beside the tables at ``path`` (a folder, or a table file's folder) and what
    is wrong with it (not readable, not JSON, or of another shape than an audit's summary); None when
    there is none or it is fine. :func:`prior_summary` reads only a fine one."""
    p = Path(path)
    summ = (p if p.is_dir() else p.parent) / "summary.json"
    try:
        if not summ.is_file():
            return None
        d = loads(summ.read_text())
    except OSError as e:
        return summ, f"cannot be read ({e.strerror or e})"
    except ValueError as e:
        return summ, f"is not JSON ({str(e).splitlines()[0]})"
    problem = _summary_problem(d)
    return (summ, problem) if problem else None


def check_side_summaries(paths: Sequence[str | Path], *, lenient: bool, report: ReadReport | None) -> None:
    """Validate the ``summary.json`` beside each table input before it is used: refused in one line
    (strict) or skipped and counted as ``bad_side_summary`` in ``report.skipped_files`` (lenient).

    Raises:
        InputError: a summary is unreadable, not JSON or of another shape, and ``lenient`` is False.
    """
    for p in paths:
        bad = side_summary_problem(p)
        if bad is None:
            continue
        if not lenient:
            raise InputError(f"the summary.json beside the tables {bad[1]}", path=bad[0],
                             fix="remove or repair it (it is an earlier audit's summary), or pass --lenient to "
                                 "skip it")
        if report is not None:
            report.skip_file(bad[0], "bad_side_summary")


def prior_summary(path: str | Path) -> dict[str, Any] | None:
    """The summary.json of an earlier audit whose tables are being re-audited, if any (None also when
    :func:`side_summary_problem` finds it unreadable or of another shape)."""
    p = Path(path)
    summ = (p if p.is_dir() else p.parent) / "summary.json"
    if side_summary_problem(p) is not None:
        return None
    try:
        return loads(summ.read_text()) if summ.is_file() else None
    except (OSError, ValueError):
        return None


def load_audit_folder(path: str | Path) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Read an output folder of ``critic-audit analyze`` (``tokens.parquet``, ``trajectories.parquet``).

    Returns:
        ``(trajectories, tokens)`` as :func:`read_tables` returns them; for a folder written streamed
        (no ``tokens.parquet``), ``(trajectories.parquet, turns.parquet)`` as written: the turn means
        stand for the tokens (:func:`critic_audit.analysis.monitor.turn_means` reads either).

    Raises:
        InputError: the folder is missing, is not a folder, or has neither ``tokens.parquet`` nor
            ``turns.parquet`` with ``trajectories.parquet`` (the message names both); a table
            cannot be read. SchemaError: a table breaks its schema.
    """
    p = Path(path)
    if not p.exists():
        raise InputError("no such folder", path=p, fix="pass the --out folder of critic-audit analyze")
    if not p.is_dir():
        raise InputError("not a folder", path=p, fix="pass the --out folder of critic-audit analyze")
    refuse_multi_critic_folder(p)
    if not (p / "tokens.parquet").exists() and (p / "turns.parquet").exists() \
            and (p / "trajectories.parquet").exists():  # a streamed audit: its turn means
        turns = _parquet(p / "turns.parquet", "re-run critic-audit analyze")
        return _parquet(p / "trajectories.parquet", "re-run critic-audit analyze"), \
            cast_columns(turns, TURN_MEANS_SCHEMA, "turns", path=str(p / "turns.parquet"))
    if not (p / "tokens.parquet").exists():
        have = ", ".join(n for n in ("trajectories.parquet", "turns.parquet") if (p / n).exists())
        raise InputError("no tokens.parquet (tokens with values), nor turns.parquet with trajectories.parquet "
                         f"(a streamed audit's turn means) in the folder ({f'it has {have}' if have else 'none of them'})",
                         path=p, fix="pass the --out folder of critic-audit analyze")
    trajectories, tokens, _ = read_tables(p)
    return trajectories, tokens


def refuse_multi_critic_folder(path: str | Path) -> None:
    """Refuse the top level of a several-critic ``analyze`` folder (its ``summary.json`` lists
    ``critics`` and it has no tokens table), naming one of its critic folders to pass instead.

    Raises:
        InputError: ``path`` is such a folder.
    """
    p = Path(path)
    summ = p / "summary.json"
    if p.is_dir() and summ.exists() and not (p / "tokens.parquet").exists():
        critics = None if side_summary_problem(p) else loads(summ.read_text()).get("critics")
        if critics:  # a summary of another shape is no several-critic folder's: the folder's reader says what it lacks
            raise InputError("this is a several-critic audit folder (no tokens table at its top level)", path=p,
                             fix=f"pass one of its critic folders, e.g. {p / 'critics' / critics[0]}")
