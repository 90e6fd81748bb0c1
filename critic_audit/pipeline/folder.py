"""The output folder of ``analyze``: refuse what is not ours to replace, write one audit's files, and
publish the staged folder atomically with its manifest (:mod:`critic_audit.outputs`).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import polars as pl

from critic_audit.analysis.audit import AuditResult
from critic_audit.critic.options import ScoringConfig
from critic_audit.outputs import (
    check_out_path, check_replaceable, check_writable, lock_folder, publish, refuse_input_clash,
)
from critic_audit.summary import AuditSummary


def check_output_folder(out_dir: Path, inputs: Sequence[str | Path] = (), *, overwrite: bool = False) -> Path:
    """Resolve ``out_dir`` and refuse to replace what is not ours to replace.

    An existing folder is replaced only when everything in it is critic-audit's (its manifest,
    :mod:`critic_audit.outputs`); with ``overwrite`` the output is written next to files the tool did
    not write, which are never replaced or removed. It may never be one of the inputs or hold one, nor
    ``/``, the home or the current folder.

    Raises:
        ConfigError: the folder would destroy an input or files critic-audit did not write.
    """
    out_dir = check_out_path(out_dir)
    refuse_input_clash(out_dir, inputs)
    check_replaceable(out_dir, overwrite=overwrite, writes=OUTPUT_NAMES)
    check_writable(out_dir)  # before the work: a read-only folder would otherwise fail at the end
    return out_dir


#: The top-level names an analyze output folder may hold.
OUTPUT_NAMES = ("summary.json", "config.json", "trajectories.parquet", "tokens.parquet", "report.md", "report.html",
                "plots", "critics", "turns.parquet", "traces.parquet", "steps.json")


_PLOT_DIRS = ("plots",)


def publish_folder(tmp: Path, out_dir: Path, overwrite: bool, *, critics: Sequence[str] = ()) -> None:
    """Put the staged output ``tmp`` in place of ``out_dir`` (:func:`critic_audit.outputs.publish`):
    its manifest names every file, and the plot folders (re-rendered whole by ``critic-audit plot``)."""
    dirs = [*_PLOT_DIRS, *(f"critics/{c}/plots" for c in critics)]
    publish(tmp, out_dir, kind="analyze", dirs=[d for d in dirs if (tmp / d).is_dir()], overwrite=overwrite)


def write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2, default=str, allow_nan=False) + "\n")


def write_summary(path: Path, summary: AuditSummary) -> None:
    """``summary.json``: :meth:`critic_audit.AuditSummary.to_json`, the one writer of the file."""
    path.write_text(summary.to_json())


def write_folder(folder: Path, result: AuditResult, summary: AuditSummary, tokens: pl.DataFrame,
                 config: dict[str, Any], plots: bool) -> None:
    """One audit's folder: ``summary.json``, ``config.json``, the tables and (``plots``) the plots and reports."""
    folder.mkdir(parents=True, exist_ok=True)
    write_summary(folder / "summary.json", summary)
    write_json(folder / "config.json", config)
    from critic_audit.io.tables import write_tables

    write_tables(folder, result.per_trajectory, tokens)
    if plots:
        from critic_audit.report import render_folder

        render_folder(folder, tokens, result.per_trajectory, summary)


def one_process_per_out(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Run ``fn(inputs, out_dir, ...)`` holding ``out_dir``'s lock (:func:`critic_audit.outputs.lock_folder`):
    a second ``analyze`` on the same folder from another process is refused at once."""
    @functools.wraps(fn)
    def locked(inputs: Sequence[str | Path], out_dir: str | Path, **kwargs: Any) -> Any:
        with lock_folder(check_out_path(out_dir), command="critic-audit analyze"):
            return fn(inputs, out_dir, **kwargs)
    return locked


def run_options(scoring: ScoringConfig | None) -> dict[str, Any]:
    """The run-wide options of ``scoring`` (allow-pickle; the scoring cache: resume, keep, chunk size)
    as ``config.json`` records them at its top level (``allow_pickle``, ``scoring_cache``; no config:
    ``False`` and None)."""
    cache = scoring.cache if scoring is not None else None
    return {"allow_pickle": bool(scoring is not None and scoring.allow_pickle),
            "scoring_cache": None if cache is None else cache.as_dict()}
