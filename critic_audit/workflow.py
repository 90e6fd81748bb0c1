"""End-to-end workflows behind the CLI: ``analyze`` (read, tokenize, score, decompose, write) and
``fit-critic``. Library code: no typer or rich; progress goes through a callback
``progress(stage: str, done: int, total: int)``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import polars as pl

from critic_audit import __version__
from critic_audit.analysis.audit import AuditConfig, AuditResult, audit
from critic_audit.errors import ConfigError, InputError
from critic_audit.io.detect import ResolvedInput, qualify_ids, read_conversations, resolve_inputs
from critic_audit.io.formats import FORMATS
from critic_audit.io.records import ReadOptions, ReadReport
from critic_audit.schema import Conversation, conversations_to_trajectories, read_parquet
from critic_audit.outputs import check_out_path, check_replaceable, lock_folder, publish, staging
from critic_audit.turns import (
    EXCLUDE_NO_ASSISTANT,
    EXCLUDE_OVERLONG_DROPPED,
    EXCLUDE_OVERLONG_NO_TURN,
    EXCLUDE_STARTS_WITH_ASSISTANT,
    TokenizeConfig,
    TokenizeResult,
    token_table,
    tokenize_conversations,
)

#: Exclusions decided before scoring (carried over when an audit's tables are read back).
PRE_SCORING_EXCLUSIONS = (EXCLUDE_NO_ASSISTANT, EXCLUDE_OVERLONG_DROPPED, EXCLUDE_OVERLONG_NO_TURN,
                          EXCLUDE_STARTS_WITH_ASSISTANT)

Progress = Callable[[str, int, int], None]


@dataclasses.dataclass(frozen=True)
class ScoringConfig:
    """How the critic runs.

    Attributes:
        critic: the critic checkpoint folder (Hugging Face token-classification layout).
        device: ``auto`` (CUDA when present, else CPU), ``cpu`` or ``cuda``.
        dtype: backbone compute dtype: ``float32`` (default: a bf16 backbone moves the values by
            ~2.5 % of their scale and eta2 with them, see docs/critics.md), ``bfloat16``, ``float16``
            or ``auto`` (float32 on CPU, bfloat16 on CUDA). The value head always runs in float32.
        token_budget: most padded tokens (rows x length) in one forward pass.
        trust_remote_code: allow checkpoints whose config asks for custom code.
        workers: scoring workers, each with its own device (1: score in this process).
        backend: how several workers run: ``processes`` (one per GPU of this machine) or ``ray``
            (Ray actors, across nodes; also with one worker). See ``critic_audit.critic.distributed``.
        ray_address: the Ray cluster to join (``auto``: the one ``ray start`` made; None: a local one).
        threads: torch CPU threads for scoring, in this process or per worker (None: torch's default
            in-process; the CPUs divided among the workers). On CPU, values are bit-identical across
            ``workers`` only at the same threads (oneDNN rounds differently at another count).
    """

    critic: str
    device: str = "auto"
    dtype: str = "float32"
    token_budget: int = 16384
    trust_remote_code: bool = False
    workers: int = 1
    backend: str = "processes"
    ray_address: str | None = None
    threads: int | None = None

    def __post_init__(self) -> None:
        if self.threads is not None and self.threads < 1:
            raise ConfigError(f"--threads must be at least 1, got {self.threads}", fix="use e.g. --threads 1")
        if self.token_budget < 1:
            raise ConfigError(f"--token-budget must be at least 1, got {self.token_budget}",
                              fix="use e.g. --token-budget 16384")
        if self.workers < 1:
            raise ConfigError(f"--workers must be at least 1, got {self.workers}", fix="use e.g. --workers 2")
        if self.backend not in ("processes", "ray"):
            raise ConfigError(f"--backend must be processes or ray, got {self.backend!r}",
                              fix="use --backend processes (this machine) or --backend ray")
        if self.ray_address is not None and self.backend != "ray":
            raise ConfigError("--ray-address is for the ray backend", fix="add --backend ray")

    @property
    def distributed(self) -> bool:
        """Scoring goes to workers (several, or a Ray actor) instead of this process."""
        return self.workers > 1 or self.backend == "ray"


def read_inputs(paths: Sequence[str | Path], options: ReadOptions = ReadOptions(), *,
                report: ReadReport | None = None,
                resolved: Sequence[ResolvedInput] | None = None) -> list[Conversation]:
    """Read rollouts of the conversation formats (``options.format``, or detected per file) from several
    files or folders (searched recursively; stray files skipped and counted in ``report``). A
    trajectory id found in several files is qualified with its file's label (``env_a/7``); lenient mode
    (``options.lenient``) skips bad records and counts them in ``report``. ``resolved``: the inputs as
    :func:`critic_audit.io.detect.resolve_inputs` resolved them (not resolved again).

    Raises:
        InputError: a file cannot be read, a bad record (strict mode), or an input holds tables.
    """
    rep = report if report is not None else ReadReport()
    res = list(resolved) if resolved is not None else resolve_inputs(list(paths), options, rep)
    convs: list[Conversation] = []
    labels: list[str] = []
    for r in res:
        tables = [f for f in r.files if f.kind == "tables"]
        if tables and len(tables) == len(r.files) and resolved is None:
            raise InputError(f"this input is {tables[0].format} data, not conversations", path=tables[0].path,
                             fix="pass it to analyze as a table input, or force another --format")
        for spec in r.files:
            if spec.kind != "conversations":
                continue
            try:
                file_convs = list(read_conversations(spec, options, rep))
            except InputError as e:
                # lenient: record errors were skipped inside; what escapes is about the whole file (not
                # UTF-8, not JSON): skip and count the file, unless it was named on its own
                if not options.lenient or e.path != str(spec.path) or Path(spec.path) == Path(r.path):
                    raise
                rep.skip_file(Path(spec.path), "unreadable_file")
                continue
            convs += file_convs
            labels += [spec.label] * len(file_convs)
    n = qualify_ids(convs, labels)
    if n:
        rep.notes["trajectory_ids_qualified_with_file"] += n
    return convs


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
    """``(path, trajectories, tokens, pre_excluded)`` of every table file of ``resolved``, each read once."""
    out, labels = [], []
    for r in resolved:
        for spec in r.files:
            if spec.kind == "tables":
                tr, tk, pre = FORMATS[spec.format].reader().read_file(spec, options, report)
                out.append((spec.path, tr, tk, pre))
                labels.append(spec.label)
    return _qualify_table_ids(out, labels, report)


def _qualify_table_ids(parts: list[tuple[Path, pl.DataFrame, pl.DataFrame, dict[str, str]]], labels: list[str],
                       report: ReadReport) -> list[tuple[Path, pl.DataFrame, pl.DataFrame, dict[str, str]]]:
    """A trajectory id found in more than one table file becomes ``{file label}/{id}`` in each (as
    :func:`critic_audit.io.detect.qualify_ids` does for conversations)."""
    seen: dict[str, int] = {}
    for _, tr, _, _ in parts:
        for tid in set(tr["trajectory_id"].cast(pl.String).to_list()):
            seen[tid] = seen.get(tid, 0) + 1
    shared = {t for t, n in seen.items() if n > 1}
    if not shared:
        return parts
    out = []
    for (path, tr, tk, pre), label in zip(parts, labels):
        mine = [t for t in set(tr["trajectory_id"].cast(pl.String).to_list()) if t in shared]
        if mine:
            mapping = {t: f"{label}/{t}" for t in mine}
            tr = tr.with_columns(pl.col("trajectory_id").cast(pl.String).replace(mapping))
            tk = tk.with_columns(pl.col("trajectory_id").cast(pl.String).replace(mapping))
            pre = {mapping.get(k, k): v for k, v in pre.items()}
            report.notes["trajectory_ids_qualified_with_file"] += len(mine)
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
    trajs = pl.concat([x[1] for x in parts], how="vertical_relaxed")
    tokens = pl.concat([x[2] for x in parts], how="vertical_relaxed")
    return trajs, tokens, {k: v for x in parts for k, v in x[3].items()}


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
    for p in inputs:
        rp = Path(p).expanduser().resolve()
        if rp == out_dir or out_dir in rp.parents:
            raise ConfigError(f"the output folder {out_dir} is (or holds) the input {p}",
                              fix="pass another --out, e.g. --out audit_out2")
    check_replaceable(out_dir, overwrite=overwrite, writes=OUTPUT_NAMES)
    return out_dir


#: The top-level names an analyze output folder may hold.
OUTPUT_NAMES = ("summary.json", "config.json", "trajectories.parquet", "tokens.parquet", "report.md", "report.html",
                "plots", "critics")


_PLOT_DIRS = ("plots",)


def _publish(tmp: Path, out_dir: Path, overwrite: bool, *, critics: Sequence[str] = ()) -> None:
    """Put the staged output ``tmp`` in place of ``out_dir`` (:func:`critic_audit.outputs.publish`):
    its manifest names every file, and the plot folders (re-rendered whole by ``critic-audit plot``)."""
    dirs = [*_PLOT_DIRS, *(f"critics/{c}/plots" for c in critics)]
    publish(tmp, out_dir, kind="analyze", dirs=[d for d in dirs if (tmp / d).is_dir()], overwrite=overwrite)


def _write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2, default=str, allow_nan=False) + "\n")


@dataclasses.dataclass
class AnalyzeOutcome:
    """What :func:`analyze` produced: the audit result, the tokens table (None when streamed) and the
    output folder."""

    result: AuditResult
    tokens: pl.DataFrame | None
    out_dir: Path


def critic_labels(scorings: Sequence[ScoringConfig]) -> list[str]:
    """Short unique labels for critics, usable as folder names: the folder name, prefixed by its
    parent's name where names collide (``runA_critic``), then numbered (``critic-2``)."""
    paths = [Path(sc.critic).expanduser().resolve() for sc in scorings]
    names = [p.name or "critic" for p in paths]
    if len(set(names)) < len(names):
        names = [f"{p.parent.name}_{p.name}" if p.parent.name else p.name for p in paths]
    seen: dict[str, int] = {}
    out = []
    for n in names:
        seen[n] = seen.get(n, 0) + 1
        out.append(n if seen[n] == 1 else f"{n}-{seen[n]}")
    return out


def _audit_one(
    inputs: Sequence[str | Path],
    scoring: ScoringConfig | None,
    read_options: ReadOptions,
    tokenize: TokenizeConfig,
    audit_config: AuditConfig,
    progress: Progress | None,
    convs: list[Conversation] | None,
    tables: Sequence[tuple[Path, pl.DataFrame, pl.DataFrame, dict[str, str]]],
    report: ReadReport,
) -> tuple[AuditResult, pl.DataFrame, int | None]:
    """Tokenize with this critic's tokenizer, score and audit the inputs read once by :func:`analyze`
    (``convs``: the conversations; ``tables``: the table inputs); returns (result, tokens, context)."""
    chat_inputs = list(inputs) if convs else []
    table_inputs = [t[0] for t in tables]
    trajs_parts: list[pl.DataFrame] = []
    token_parts: list[pl.DataFrame] = []
    pre_excluded: dict[str, str] = {}
    inference: dict[str, Any] = {}
    truncation: dict[str, Any] = {"trajectories": 0, "turns": 0, "policy_tokens": 0}
    fitted_ids: list[str] | None = None

    carried: list[dict[str, Any]] = []
    warnings: list[str] = []
    for p, tr, tk, pre in tables:
        pre_excluded.update(pre)
        trajs_parts.append(tr)
        token_parts.append(tk)
        prior = _prior_summary(p)
        if prior:
            carried.append(prior)
            for k in ("trajectories", "turns", "policy_tokens"):
                truncation[k] += int((prior.get("truncated") or {}).get(k, 0))
            for k in ("max_length", "cut_by", "critic_context"):  # the limit the saved audit applied
                if (prior.get("truncated") or {}).get(k) is not None:
                    truncation.setdefault(k, prior["truncated"][k])

    critic = None
    needs_values = any(t.filter(pl.col("response_mask") & pl.col("value").is_null()).height for t in token_parts)
    if chat_inputs or needs_values:
        if scoring is None:
            where = ", ".join(str(p) for p in (chat_inputs or table_inputs))
            raise ConfigError(f"{where}: no critic values to audit", fix="pass --critic CHECKPOINT_DIR")
        from critic_audit.critic import inspect_critic, load_critic  # torch/transformers load only when needed

        if scoring.distributed:  # the workers load the critic; this process needs its tokenizer
            critic = inspect_critic(scoring.critic, trust_remote_code=scoring.trust_remote_code)
            inference = {"critic": str(scoring.critic), "device": None, "dtype": None}
        else:
            critic = load_critic(scoring.critic, device=scoring.device, dtype=scoring.dtype,
                                 trust_remote_code=scoring.trust_remote_code)
            inference = {"critic": str(scoring.critic), "device": str(critic.device),
                         "dtype": str(critic.dtype).replace("torch.", "")}
        inference.update(token_budget=scoring.token_budget, backend=scoring.backend if scoring.distributed else
                         "in-process", workers=scoring.workers)
        fitted_ids = _fitted_ids(scoring.critic)

    if chat_inputs:
        max_len = tokenize.max_length or critic.max_length
        if max_len > critic.max_length:
            raise ConfigError(f"--max-length {max_len} exceeds the critic's context {critic.max_length}",
                              fix=f"use at most {critic.max_length}")
        tcfg = dataclasses.replace(tokenize, max_length=max_len)
        tok_res: TokenizeResult = tokenize_conversations(
            convs or [], critic.tokenizer, tcfg,
            progress=(lambda d, n: progress("tokenize", d, n)) if progress else None)
        truncation = {"trajectories": tok_res.truncated_trajectories, "turns": tok_res.truncated_turns,
                      "policy_tokens": tok_res.truncated_policy_tokens, "max_length": max_len,
                      "cut_by": "max_length" if tokenize.max_length else "critic_context",
                      "critic_context": critic.max_length}
        pre_excluded.update(tok_res.excluded)
        unk = getattr(critic.tokenizer, "unk_token_id", None)
        if unk is not None:
            n_unk = sum(int((c.input_ids[c.response_mask] == unk).sum()) for c in tok_res.conversations)
            n_pol = sum(int(c.response_mask.sum()) for c in tok_res.conversations)
            if n_unk:
                warnings.append(f"{n_unk} of {n_pol} policy tokens are the critic tokenizer's unknown token: it cannot "
                                "represent this text, so the values are not those of the original token ids "
                                "(audit the saved tokens table instead, or use a critic with a byte-level tokenizer)")
        trajs_parts.append(conversations_to_trajectories(convs or []))
        token_parts.append(token_table(tok_res.conversations))

    trajectories = pl.concat(trajs_parts, how="vertical_relaxed") if len(trajs_parts) > 1 else trajs_parts[0]
    tokens = pl.concat(token_parts, how="vertical_relaxed") if len(token_parts) > 1 else token_parts[0]
    dup = trajectories.height - trajectories["trajectory_id"].n_unique()
    if dup:
        raise InputError(f"{dup} trajectory id(s) appear in more than one input",
                         fix="give every rollout a unique id")

    if critic is not None:
        for p, tk in zip(table_inputs, token_parts):  # before scoring: name the file and the trajectory
            _check_scorable(tk, critic, p)
        _check_vocabulary(tokens, critic, report, warnings)
        tokens = _score_missing(tokens, critic, scoring, inference, progress)

    result = audit(trajectories, tokens, audit_config, pre_excluded=pre_excluded, fitted_ids=fitted_ids,
                   truncation=truncation)
    result.summary["truncated"] = truncation
    if not inference and carried:
        # values re-audited from saved tables: say which critic produced them
        inference = {"values_from": [c.get("inputs") for c in carried],
                     "critic": [(c.get("inference") or {}).get("critic") for c in carried]}
    result.summary["inference"] = inference or None
    result.summary["warnings"] = warnings
    result.summary["inputs"] = [str(p) for p in inputs]
    result.summary["critic_audit_version"] = __version__
    return result, tokens, (critic.max_length if critic else None)


def _check_vocabulary(tokens: pl.DataFrame, critic: Any, report: ReadReport, warnings: list[str]) -> None:
    """Policy token ids read from the input (tokenized rows, ATIF token ids) are scored as they are:
    refuse ids the critic's tokenizer does not have, and say which ATIF files were scored on their own
    ids and which were re-rendered.

    Raises:
        ConfigError: a token id to score is outside the critic's vocabulary.
    """
    todo = tokens.filter(pl.col("response_mask") & pl.col("value").is_null())
    size = len(critic.tokenizer)
    top = int(todo["token_id"].max()) if todo.height else -1
    if top >= size:
        raise ConfigError(f"the input's token ids reach {top}, beyond the critic's vocabulary of {size}: the critic's "
                          "tokenizer is not the policy's", fix="use a critic with the policy's tokenizer, or re-render "
                          "the text (ATIF: --token-ids text)")
    n = report.notes.get("atif_exact_token_ids", 0)
    if n:
        warnings.append(f"{n} ATIF trajectory file(s) were scored on the policy's own token ids (prompt_token_ids + "
                        "completion_token_ids): the values mean something only if the critic's tokenizer is the policy's")
    rerendered = sum(v for k, v in report.notes.items() if k.startswith("atif_rerendered_text"))
    if rerendered:
        warnings.append(f"{rerendered} ATIF trajectory file(s) carry no usable token ids: their text was re-rendered "
                        "with the critic's chat template, so the tokens scored are not the policy's own (see "
                        "input.notes)")


def _fitted_ids(critic: str | Path) -> list[str] | None:
    """The trajectory ids ``fit-critic`` fitted this critic on (its ``critic_audit.json``), if recorded."""
    try:
        meta = json.loads((Path(critic) / "critic_audit.json").read_text())
    except (OSError, ValueError):
        return None
    ids = (meta.get("fit") or {}).get("trajectory_ids") if isinstance(meta, dict) else None
    return [str(i) for i in ids] if isinstance(ids, list) else None


def _write_folder(folder: Path, result: AuditResult, tokens: pl.DataFrame, config: dict[str, Any], plots: bool) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    _write_json(folder / "summary.json", result.summary)
    _write_json(folder / "config.json", config)
    from critic_audit.io.tables import write_tables

    write_tables(folder, result.per_trajectory, tokens)
    if plots:
        from critic_audit.report import render_folder

        render_folder(folder, tokens, result.per_trajectory, result.summary)


def _one_process_per_out(fn: Callable[..., AnalyzeOutcome]) -> Callable[..., AnalyzeOutcome]:
    """Run ``fn(inputs, out_dir, ...)`` holding ``out_dir``'s lock (:func:`critic_audit.outputs.lock_folder`):
    a second ``analyze`` on the same folder from another process is refused at once."""
    @functools.wraps(fn)
    def locked(inputs: Sequence[str | Path], out_dir: str | Path, **kwargs: Any) -> AnalyzeOutcome:
        with lock_folder(check_out_path(out_dir), command="critic-audit analyze"):
            return fn(inputs, out_dir, **kwargs)
    return locked


@_one_process_per_out
def analyze(
    inputs: Sequence[str | Path],
    out_dir: str | Path,
    *,
    scoring: ScoringConfig | Sequence[ScoringConfig] | None,
    read_options: ReadOptions = ReadOptions(),
    tokenize: TokenizeConfig = TokenizeConfig(),
    audit_config: AuditConfig = AuditConfig(),
    plots: bool = True,
    progress: Progress | None = None,
    stream: bool = False,
    overwrite: bool = False,
) -> AnalyzeOutcome:
    """Run the audit end to end and write the output folder atomically.

    Inputs are rollout files/folders of any supported format (``read_options.format``, auto-detected
    per file by default; folders searched recursively; ``docs/input_formats.md``) or canonical-table
    folders (``tokens.parquet`` + ``trajectories.parquet``); tables whose policy tokens all carry a value
    skip critic inference. Inputs are resolved and read once, whatever the number of critics. The
    summary's ``input`` entry holds the format read per input, the records skipped per reason and the
    files skipped per reason; ``config.json`` records every option that shaped the result.

    ``stream=True`` audits one canonical-table input whose values are all present without loading its
    tokens table: the decomposition reads it in row batches (tables larger than memory); the output
    folder then refers to the input's ``tokens.parquet`` instead of copying it.

    The output folder (replaced only once everything is written) holds ``summary.json``,
    ``trajectories.parquet`` (per-trajectory statistics), ``tokens.parquet`` (canonical tokens table
    with values), ``config.json`` (the resolved configuration), ``plots/``, ``report.md`` and a
    self-contained ``report.html``.

    With several critics (e.g. the critic checkpoints of one training run) every critic scores the same
    rollouts: each gets a complete single-critic folder under ``critics/<label>/``, and the top level
    holds the comparison: ``summary.json`` (``by_critic``: median eta2 and fraction per critic, with
    intervals; ``per_critic``: each critic's headline, quality and recommendation),
    ``trajectories.parquet`` (all critics, with a ``critic`` column), the eta2 box plot and ECDF per
    critic, and the reports.

    Raises:
        InputError, SchemaError, TemplateError, CheckpointError, ConfigError: bad input or options;
            ConfigError also when another process is writing ``out_dir`` (its lock).
    """
    t0 = time.perf_counter()
    if not inputs:
        raise ConfigError("no input given", fix="pass one or more rollout files or folders")
    inputs = expand_table_folders(inputs)
    out_dir = check_output_folder(Path(out_dir), inputs, overwrite=overwrite)
    for p in inputs:
        _refuse_multi_critic_folder(p)
    _report = ReadReport()
    if stream:
        return _analyze_stream(inputs, out_dir, audit_config, plots, t0, overwrite)
    scorings: list[ScoringConfig | None]
    if scoring is None:
        scorings = [None]
    elif isinstance(scoring, ScoringConfig):
        scorings = [scoring]
    else:
        scorings = list(scoring) or [None]
    resolved = resolve_inputs(list(inputs), read_options, _report)  # once: path -> files, format, kind
    chat_inputs = [r.path for r in resolved if any(f.kind == "conversations" for f in r.files)]
    tables = read_table_specs(resolved, read_options, _report)
    convs = read_inputs(chat_inputs, read_options, report=_report, resolved=resolved) if chat_inputs else None
    if chat_inputs and not convs:
        raise InputError("no rollouts in the input", path=chat_inputs[0] if len(chat_inputs) == 1 else None,
                         fix="pass a file with at least one record")
    if convs:
        _check_group_by(audit_config, convs)
    base_config = {
        "inputs": [str(p) for p in inputs],
        "out": str(out_dir),
        "read_options": read_options.as_dict(),
        "input_files": {str(r.path): {"format": r.format, "kind": r.kind, "files": len(r.files)} for r in resolved},
        "tokenize": {**dataclasses.asdict(tokenize), "chat_template": bool(tokenize.chat_template)},
        "audit": audit_config.as_dict(),
        **_run_options(),
    }
    if len(scorings) == 1:
        result, tokens, ctx = _audit_one(inputs, scorings[0], read_options, tokenize, audit_config, progress, convs,
                                         tables, _report)
        config = {**base_config, "scoring": dataclasses.asdict(scorings[0]) if scorings[0] else None,
                  "critic_max_length": ctx}
        with staging(out_dir) as tmp:
            result.summary["seconds"] = round(time.perf_counter() - t0, 2)
            result.summary["input"] = _report.as_dict()
            _write_folder(tmp, result, tokens, config, plots)
            _publish(tmp, out_dir, overwrite)
        return AnalyzeOutcome(result, tokens, out_dir)

    labels = critic_labels([sc for sc in scorings if sc is not None])
    with staging(out_dir) as tmp:
        pers, per_summary, first_tokens = [], {}, None
        for label, sc in zip(labels, scorings):
            def prog(stage: str, d: int, n: int, _label: str = label) -> None:
                if progress:
                    progress(f"{stage} [{_label}]", d, n)

            result, tokens, ctx = _audit_one(inputs, sc, read_options, tokenize, audit_config, prog, convs,
                                             tables, _report)
            config = {**base_config, "scoring": dataclasses.asdict(sc), "critic_max_length": ctx}
            _write_folder(tmp / "critics" / label, result, tokens, config, plots)
            pers.append(result.per_trajectory.with_columns(critic=pl.lit(label)))
            per_summary[label] = {k: result.summary.get(k) for k in (
                "n_included", "eta2_median", "frac_ss_between_gt_within", "frac_f_gt_1", "omega2_median",
                "critic_quality", "recommendation", "inference", "excluded", "coverage")}
            first_tokens = tokens if first_tokens is None else first_tokens
        per_all = pl.concat(pers, how="vertical_relaxed")
        from critic_audit.analysis.audit import breakdown

        summary = {
            "critics": labels,
            "n_trajectories": int(per_all["trajectory_id"].n_unique()),
            "by_critic": breakdown(per_all, "critic", audit_config),
            "per_critic": per_summary,
            "inputs": [str(p) for p in inputs],
            "critic_audit_version": __version__,
            "seconds": round(time.perf_counter() - t0, 2),
            "input": _report.as_dict(),
        }
        config = {**base_config, "scoring": [dataclasses.asdict(sc) for sc in scorings]}
        _write_json(tmp / "summary.json", summary)
        _write_json(tmp / "config.json", config)
        per_all.write_parquet(tmp / "trajectories.parquet")
        if plots:
            from critic_audit.report import render_comparison

            render_comparison(tmp, per_all, summary)
        _publish(tmp, out_dir, overwrite, critics=labels)
    return AnalyzeOutcome(AuditResult(per_all, summary), first_tokens, out_dir)


def _run_options() -> dict[str, Any]:
    """The run-wide options the CLI sets as context (resume, scoring cache, chunk size, allow-pickle),
    for ``config.json``."""
    from critic_audit.critic.options import ALLOW_PICKLE, current_options

    cache = current_options()
    return {"allow_pickle": ALLOW_PICKLE.get(),
            "scoring_cache": None if cache is None else {"root": str(cache.root), "resume": cache.resume,
                                                         "keep": cache.keep, "chunk_tokens": cache.chunk_tokens}}


def expand_table_folders(inputs: Sequence[str | Path]) -> list[str | Path]:
    """Replace a folder that holds canonical-table folders (e.g. a training run's ``rollouts/`` with
    one ``step_N/`` per step) by those folders, in name order; other inputs pass through."""
    out: list[str | Path] = []
    for p in inputs:
        q = Path(p)
        if q.is_dir() and not (q / "tokens.parquet").exists() and not (q / "summary.json").exists():
            subs = sorted(d for d in q.iterdir() if d.is_dir() and (d / "tokens.parquet").exists())
            if subs and not any(f.is_file() and f.suffix in (".json", ".jsonl", ".parquet") for f in q.iterdir()):
                out.extend(subs)
                continue
        out.append(p)
    return out


def _prior_summary(path: str | Path) -> dict[str, Any] | None:
    """The summary.json of an earlier audit whose tables are being re-audited, if any."""
    p = Path(path)
    summ = (p if p.is_dir() else p.parent) / "summary.json"
    try:
        return json.loads(summ.read_text()) if summ.exists() else None
    except (OSError, ValueError):
        return None


def load_audit_folder(path: str | Path) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Read an output folder of ``critic-audit analyze`` (``tokens.parquet``, ``trajectories.parquet``).

    Returns:
        ``(trajectories, tokens)`` as :func:`read_tables` returns them.

    Raises:
        InputError: the folder is missing, is not a folder, or has no ``tokens.parquet``; a table
            cannot be read. SchemaError: a table breaks its schema.
    """
    p = Path(path)
    if not p.exists():
        raise InputError("no such folder", path=p, fix="pass the --out folder of critic-audit analyze")
    if not p.is_dir():
        raise InputError("not a folder", path=p, fix="pass the --out folder of critic-audit analyze")
    _refuse_multi_critic_folder(p)
    if not (p / "tokens.parquet").exists():
        raise InputError("no tokens.parquet in the folder", path=p,
                         fix="pass the --out folder of critic-audit analyze")
    trajectories, tokens, _ = read_tables(p)
    return trajectories, tokens


def _refuse_multi_critic_folder(path: str | Path) -> None:
    p = Path(path)
    summ = p / "summary.json"
    if p.is_dir() and summ.exists() and not (p / "tokens.parquet").exists():
        try:
            critics = json.loads(summ.read_text()).get("critics")
        except (OSError, ValueError):
            critics = None
        if critics:
            raise InputError("this is a several-critic audit folder (no tokens table at its top level)", path=p,
                             fix=f"pass one of its critic folders, e.g. {p / 'critics' / critics[0]}")


def _check_group_by(config: AuditConfig, convs: Sequence[Conversation]) -> None:
    """Fail before scoring when a --group-by column is neither a trajectory column nor a metadata key."""
    from critic_audit.analysis.audit import GROUPABLE

    for col in config.group_by:
        if col in GROUPABLE:
            continue
        if not any(col in c.metadata for c in convs):
            keys = sorted({k for c in convs for k in c.metadata})[:12]
            raise ConfigError(f"no trajectory column or metadata field {col!r} to group by",
                              fix=f"use one of {', '.join(GROUPABLE)}" + (f" or a metadata field ({', '.join(keys)})" if keys else ""))


def _analyze_stream(inputs: Sequence[str | Path], out_dir: Path, audit_config: AuditConfig, plots: bool,
                    t0: float, overwrite: bool = False) -> AnalyzeOutcome:
    """``analyze --stream``: one canonical-table input, values present, tokens never loaded whole."""
    from pyarrow import ArrowException

    from critic_audit.analysis.audit import audit_parquet

    if len(inputs) != 1 or not is_table_input(inputs[0]):
        raise ConfigError("--stream audits exactly one canonical-table input (a folder with tokens.parquet)",
                          fix="pass one folder written by analyze, train or the verl dump, or drop --stream")
    p = Path(inputs[0])
    tok_path = (p / "tokens.parquet" if p.is_dir() else p).resolve()
    traj_path = tok_path.parent / "trajectories.parquet"
    if not tok_path.exists() or not traj_path.exists():
        raise InputError("--stream needs tokens.parquet and trajectories.parquet side by side", path=p,
                         fix="pass a canonical-table folder")
    from critic_audit.io.tables import canonical_trajectories

    try:
        raw = read_parquet(traj_path)
    except Exception as e:  # noqa: BLE001 - pyarrow raises many types for a corrupt file
        raise InputError(f"cannot read Parquet ({(str(e).strip().splitlines() or [type(e).__name__])[0]})",
                         path=traj_path, fix="pass a canonical-table folder written by critic-audit") from None
    trajs, pre = canonical_trajectories(raw, path=str(traj_path))
    try:
        result = audit_parquet(trajs, tok_path, audit_config, pre_excluded=pre)
    except (OSError, UnicodeDecodeError, ArrowException) as e:  # a corrupt page, found while streaming
        raise InputError(f"cannot read Parquet ({(str(e).strip().splitlines() or [type(e).__name__])[0]})",
                         path=tok_path, fix="re-write the tokens table, or audit it without --stream") from None
    result.summary.update(inputs=[str(p) for p in inputs], critic_audit_version=__version__, inference=None,
                          tokens_source=str(tok_path), streamed=True)
    with staging(out_dir) as tmp:
        result.summary["seconds"] = round(time.perf_counter() - t0, 2)
        _write_json(tmp / "summary.json", result.summary)
        _write_json(tmp / "config.json", {"inputs": [str(p)], "stream": True, "audit": audit_config.as_dict()})
        result.per_trajectory.write_parquet(tmp / "trajectories.parquet")
        if plots:
            from critic_audit.report import render_folder

            render_folder(tmp, pl.scan_parquet(tok_path), result.per_trajectory, result.summary)
        _publish(tmp, out_dir, overwrite)
    return AnalyzeOutcome(result, None, out_dir)


def _check_scorable(tokens: pl.DataFrame, critic: Any, path: str | Path) -> None:
    """The trajectories of a table input that the critic will score fit its vocabulary and context.

    Raises:
        InputError: a token id outside ``[0, vocab)`` or a trajectory longer than the critic's context,
            naming the file, the trajectory and the position.
    """
    need = tokens.filter(pl.col("response_mask") & pl.col("value").is_null())["trajectory_id"].unique()
    if need.len() == 0:
        return
    todo = tokens.filter(pl.col("trajectory_id").is_in(need.implode()))
    vocab = getattr(critic, "vocab_size", None)
    if vocab is None:
        from critic_audit.critic.infer import _vocab_size

        vocab = _vocab_size(critic)
    if vocab is not None:
        bad = todo.filter((pl.col("token_id") < 0) | (pl.col("token_id") >= vocab) | pl.col("token_id").is_null())
        if bad.height:
            row = bad.sort(["trajectory_id", "position"]).row(0, named=True)
            raise InputError(
                f"token id {row['token_id']} at position {row['position']} is outside the critic's vocabulary "
                f"[0, {vocab}) ({bad.height} such token(s) in {bad['trajectory_id'].n_unique()} trajectory(ies))",
                path=path, record=f"trajectory {row['trajectory_id']!r}",
                fix="these token ids come from another tokenizer: score them with a critic of that tokenizer, or "
                    "audit the chat rollouts so that the critic's tokenizer renders them (ATIF: --token-ids text)")
    max_len = getattr(critic, "max_length", None)
    if max_len:
        lengths = todo.group_by("trajectory_id").agg(n=pl.len()).filter(pl.col("n") > max_len)
        if lengths.height:
            row = lengths.sort("trajectory_id").row(0, named=True)
            raise InputError(f"{row['n']} tokens, more than the critic's context of {max_len} "
                             f"({lengths.height} such trajectory(ies))", path=path,
                             record=f"trajectory {row['trajectory_id']!r}",
                             fix="audit with a critic of a longer context, or drop the over-long trajectories")


def _score_missing(tokens: pl.DataFrame, critic: Any, scoring: ScoringConfig, inference: dict[str, Any],
                   progress: Progress | None, *, cache_dir: str | Path | None = None,
                   keep_cache: bool = False) -> pl.DataFrame:
    """Fill ``value`` for every trajectory whose policy tokens lack one, with the critic.

    Scoring is resumable (``critic_audit.critic.score_values_cached``) inside a
    ``critic_audit.critic.scoring_cache`` block (the CLI's ``--resume``, on by default: the cache is
    ``<out>.scoring-cache/``, removed when the block ends without error unless kept), or when
    ``cache_dir`` is given (removed after scoring unless ``keep_cache``).

    With ``scoring.distributed``, ``critic`` is a ``CriticInfo`` and the chunks are scored by workers
    (``critic_audit.critic.score_values_distributed``; without a cache, in a temporary folder)."""
    from critic_audit.critic import score_values
    from critic_audit.critic.cache import current_options, score_values_cached
    from critic_audit.critic.infer import torch_threads

    opts = current_options()
    if cache_dir is None and opts is not None and opts.resume:
        cache_dir, keep_cache, chunk_tokens = opts.root, True, opts.chunk_tokens  # the block removes it
    else:
        chunk_tokens = opts.chunk_tokens if opts is not None else None

    need = tokens.filter(pl.col("response_mask") & pl.col("value").is_null())["trajectory_id"].unique(maintain_order=True)
    if need.len() == 0:
        return tokens
    todo = tokens.filter(pl.col("trajectory_id").is_in(need.implode())).sort(["trajectory_id", "position"])
    groups = todo.partition_by("trajectory_id", maintain_order=True, as_dict=False)
    seqs = [g["token_id"].to_numpy() for g in groups]
    stats: dict[str, Any] = {}
    prog = (lambda d, n: progress("score", d, n)) if progress else None
    kw = {"chunk_tokens": chunk_tokens} if chunk_tokens else {}
    if scoring.distributed:
        values = _score_distributed(critic, seqs, scoring, cache_dir, keep_cache, prog, stats, kw)
        inference.update({k: stats.get(k) for k in ("devices", "startup_seconds", "worker_seconds")},
                         device=stats["device_type"], dtype=stats["dtype"])
        if cache_dir is not None:
            inference["scoring_cache"] = {k: stats.get(k) for k in ("cache_dir", "n_chunks", "resumed_chunks")}
    elif cache_dir is not None:
        with torch_threads(scoring.threads):
            values = score_values_cached(critic, seqs, cache_dir, token_budget=scoring.token_budget, progress=prog,
                                         stats=stats, keep=keep_cache, **kw)
        inference["scoring_cache"] = {k: stats.get(k) for k in ("cache_dir", "n_chunks", "resumed_chunks")}
    else:
        with torch_threads(scoring.threads):
            values = score_values(critic, seqs, token_budget=scoring.token_budget, progress=prog, stats=stats)
    if scoring.threads is not None:
        inference["threads"] = scoring.threads
    scored = pl.concat([
        g.with_columns(value=pl.Series(v, dtype=pl.Float32).fill_nan(None)) for g, v in zip(groups, values)
    ])
    rest = tokens.filter(~pl.col("trajectory_id").is_in(need.implode()))
    inference.update({k: stats.get(k) for k in ("n_sequences", "real_tokens", "computed_tokens",
                                                  "padding_efficiency", "shared_prefix_tokens", "strategy",
                                                  "seconds", "tokens_per_s")})
    return pl.concat([rest, scored]).sort(["trajectory_id", "position"], maintain_order=True)


def _score_distributed(info: Any, seqs: list, scoring: ScoringConfig, cache_dir: str | Path | None, keep: bool,
                       progress: Callable[[int, int], None] | None, stats: dict[str, Any],
                       kw: dict[str, Any]) -> list:
    """``score_values_distributed`` for ``scoring``; without a cache folder, in a temporary one."""
    from critic_audit.critic.distributed import CriticSpec, score_values_distributed
    from critic_audit.critic.options import ALLOW_PICKLE

    spec = CriticSpec(scoring.critic, device=scoring.device, dtype=scoring.dtype, allow_pickle=ALLOW_PICKLE.get(),
                      trust_remote_code=scoring.trust_remote_code)
    with tempfile.TemporaryDirectory(prefix="critic-audit-scoring-") if cache_dir is None else \
            contextlib.nullcontext(cache_dir) as root:
        return score_values_distributed(spec, seqs, root, workers=scoring.workers, backend=scoring.backend,
                                        ray_address=scoring.ray_address, token_budget=scoring.token_budget,
                                        threads=scoring.threads, progress=progress, stats=stats, keep=keep, info=info, **kw)


def fit_critic(
    inputs: Sequence[str | Path],
    out_dir: str | Path,
    *,
    backbone: str = "smollm2-135m",
    read_options: ReadOptions = ReadOptions(),
    tokenize: TokenizeConfig = TokenizeConfig(),
    ridge: float = 1e-3,
    weighting: str = "trajectory",
    dtype: str = "auto",
    token_budget: int = 16384,
    head_out: str | Path | None = None,
    overwrite: bool = False,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Fit a value head on a frozen backbone to Monte-Carlo returns and save a critic folder.

    The target of every policy token is its trajectory's reward (the return with gamma = 1 and
    lambda = 1: VC-PPO's value pretraining, arXiv:2503.01491). Rollouts must carry rewards.

    Returns:
        A dict with the output paths and the fit metrics (explained variance on the fit data, tokens,
        seconds).

    Raises:
        InputError: unreadable rollouts or a missing reward. CheckpointError: the backbone cannot be
        prepared. ConfigError: bad options.
    """
    from critic_audit.critic import FitConfig, cached_backbone, fit_metadata, fit_value_head, load_tokenizer, save_critic, save_head

    if not read_options.require_reward:
        raise ConfigError("fit-critic needs rewards", fix="drop --no-reward and give every rollout a reward")
    for p in inputs:
        if not Path(p).exists():
            raise InputError("no such file or folder", path=p, fix="check the path")
    convs = read_inputs(inputs, read_options)
    bdir = cached_backbone(backbone)
    tokenizer = load_tokenizer(bdir)
    ctx = int(json.loads((Path(bdir) / "config.json").read_text()).get("max_position_embeddings") or 2048)
    tcfg = dataclasses.replace(tokenize, max_length=min(tokenize.max_length or ctx, ctx))
    res = tokenize_conversations(convs, tokenizer, tcfg,
                                 progress=(lambda d, n: progress("tokenize", d, n)) if progress else None)
    reward = {c.trajectory_id: c.reward for c in convs}
    seqs = [t.input_ids for t in res.conversations]
    masks = [t.response_mask for t in res.conversations]
    rets = [float(reward[t.trajectory_id]) for t in res.conversations]
    fit = fit_value_head(bdir, seqs, masks, rets,
                         config=FitConfig(ridge=ridge, weighting=weighting, dtype=dtype, token_budget=token_budget),
                         progress=(lambda d, n: progress("fit", d, n)) if progress else None)
    meta = fit_metadata(fit)
    meta["fit"]["inputs"] = [str(p) for p in inputs]
    meta["fit"]["n_conversations"] = len(convs)
    meta["fit"]["trajectory_ids"] = [t.trajectory_id for t in res.conversations]  # the audit holds these out
    meta["fit"]["excluded"] = res.excluded_counts
    path = save_critic(bdir, fit.weight, fit.bias, out_dir, metadata=meta, overwrite=overwrite)
    info: dict[str, Any] = {"critic": str(path), "metrics": fit.metrics, "excluded": res.excluded_counts,
                            "truncated_trajectories": res.truncated_trajectories}
    if head_out is not None:
        info["head"] = str(save_head(fit.weight, fit.bias, head_out, metadata=meta))
    return info
