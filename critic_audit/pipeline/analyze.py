"""``analyze`` end to end: read the inputs once (:func:`critic_audit.io.inputs.read_all`), tokenize
with each critic's tokenizer, score (:mod:`critic_audit.pipeline.scoring`), decompose
(:func:`critic_audit.analysis.audit.audit`) and write the output folder atomically
(:mod:`critic_audit.pipeline.folder`). Library code: no typer or rich; progress goes through a
callback ``progress(stage: str, done: int, total: int)``.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import polars as pl

from critic_audit.version import __version__
from critic_audit.analysis.audit import AuditConfig, AuditResult, audit
from critic_audit.errors import ConfigError, InputError, UsageError
from critic_audit.io.inputs import TablePart, expand_table_folders, read_all
from critic_audit.io.records import ReadOptions, ReadReport
from critic_audit.io.tables import check_side_summaries, prior_summary, refuse_multi_critic_folder
from critic_audit.outputs import staging
from critic_audit.pipeline.folder import (
    check_output_folder, one_process_per_out, publish_folder, run_options, write_folder, write_json, write_summary,
)
from critic_audit.pipeline.scoring import (
    Progress, ScoringConfig, check_scorable, check_vocabulary, critic_fitted_ids, critic_labels, score_missing,
)
from critic_audit.pipeline.token_ids import verify_stored_ids
from critic_audit.schema import (  # noqa: F401  (PRE_SCORING_EXCLUSIONS: re-exported)
    PRE_SCORING_EXCLUSIONS,
    Conversation,
    concat_tables,
    conversations_to_trajectories,
)
from critic_audit.summary import (SUMMARY_VERSION, AuditSummary, CriticComparison, InputReport, PerCritic, Sample,
                                  SourceSample, Truncation)
from critic_audit.turns import (
    TokenizeConfig,
    TokenizeResult,
    template_system_warning,
    token_table,
    tokenize_conversations,
)


@dataclasses.dataclass
class AnalyzeOutcome:
    """What :func:`analyze` produced: the audit result (its ``summary`` the one written), the tokens
    table (None when streamed), the output folder and the summary as written (``summary.json``)."""

    result: AuditResult
    tokens: pl.DataFrame | None
    out_dir: Path
    summary: AuditSummary | None = None


def with_run(summary: AuditSummary, *, inputs: Sequence[str | Path] | None = None, seconds: float | None = None,
             input: ReadReport | None = None, warnings: Sequence[str] | None = None, **run: Any) -> AuditSummary:
    """``summary`` with its :class:`critic_audit.summary.RunInfo` fields set (the others kept) and
    ``summary_version``: ``inputs`` as absolute paths (:func:`absolute_path`; with ``critic_audit_version``), ``seconds`` rounded to
    0.01 s, ``input`` (a :class:`~critic_audit.io.records.ReadReport`) as an
    :class:`~critic_audit.summary.InputReport`; ``run``: other ``RunInfo`` fields as they are (one it
    does not declare is a ``TypeError``)."""
    if inputs is not None:  # absolute: a re-audit from another folder finds them (--scope all)
        run.update(inputs=tuple(absolute_path(p) for p in inputs), critic_audit_version=__version__)
    if seconds is not None:
        run["seconds"] = round(seconds, 2)
    if input is not None:
        run["input"] = InputReport.from_dict(input.as_dict())
        dup = input.notes.get("duplicate_trajectories", 0)
        if dup and summary.coverage is not None:  # copies dropped by --lenient: part of the coverage
            summary = dataclasses.replace(summary, coverage=dataclasses.replace(summary.coverage, duplicates_dropped=dup))
    if warnings is not None:
        run["warnings"] = tuple(warnings)
    return dataclasses.replace(summary, run=dataclasses.replace(summary.run, **run, summary_version=SUMMARY_VERSION))


def _cwd() -> str | None:
    try:
        return os.getcwd()
    except OSError:  # the working folder was removed
        return None


def absolute_path(p: str | Path) -> str:
    """``p`` as the absolute path ``summary.json`` and ``config.json`` record (``~`` expanded, ``..``
    folded, symlinks kept), so that a later run from another folder finds the same input."""
    return os.path.abspath(os.path.expanduser(str(p)))


def is_sample(limit_info: Sample | None) -> bool:
    """A ``--limit`` sample left trajectories out (``limit_info``: :func:`limit_summary`; None: no
    limit): the audit then names the latest checkpoint *sampled* (``audit(sampled=True)``)."""
    return limit_info is not None and limit_info.left_out


def carried_limit(inputs: Sequence[str | Path], priors: Sequence[Mapping[str, Any]], n_trajectories: int) -> Sample | None:
    """The ``--limit`` sample an earlier audit recorded, carried into its re-analysis (``analyze AUDIT_FOLDER``
    without ``--limit``), so the coverage still says "a sample of 6 of 60" and not "6 / 6 read".

    Args:
        inputs: the re-analysis' inputs; carried only for one input (the audit folder).
        priors: the earlier audits' ``summary.json`` objects (:func:`critic_audit.io.tables.prior_summary`).
        n_trajectories: trajectories the re-analysis reads; carried only when it equals the sample's
            ``trajectories_kept`` (the tables are that sample, nothing added or dropped).

    Returns:
        The earlier :class:`~critic_audit.summary.Sample`, or None (no limit recorded, several inputs, a
        record of another shape, or another number of trajectories).
    """
    from critic_audit.errors import SchemaError

    if len(inputs) != 1 or len(priors) != 1 or not isinstance(priors[0].get("limit"), Mapping):
        return None
    try:
        lim = Sample.from_dict(priors[0]["limit"], where="summary.limit")
    except (SchemaError, TypeError, ValueError):
        return None
    return lim if lim.trajectories_kept == n_trajectories else None


def _stable_hash(text: str) -> int:
    import zlib

    return zlib.crc32(text.encode("utf-8"))


def limit_sample(ids_by_source: dict[str, list[str]], limit: int, seed: int) -> dict[str, list[str]]:
    """A reproducible sample of ``limit`` trajectory ids, stratified by source.

    Allocation: each source's quota is ``limit * n_source / n_total``; it keeps the floor or the ceiling
    of it, by systematic sampling (Madow 1949) over the sources in an order shuffled by the seed: a start
    ``u ~ U[0, 1)`` and the points ``u, u + 1, ...`` on the sources' cumulative quotas. Every source
    keeps its share within one trajectory, the total is exactly ``limit``, and over seeds a source's
    expected count is exactly its quota (with more sources than ``limit``, each source of equal size is
    sampled with the same probability, whatever its name). Within a source the ids are sorted and
    permuted by ``numpy.random.default_rng([seed, crc32(source)])``: the same ids, limit and seed always
    give the same sample, whatever the reading order.

    Args:
        ids_by_source: source -> its trajectory ids (each id once).
        limit: trajectories to keep (>= 1).
        seed: the sampling seed (the CLI's ``--seed``).

    Returns:
        source -> the ids kept, in sorted order (every source present, possibly with no id; all ids when
        ``limit`` is at least their number).

    Raises:
        ConfigError: ``limit < 1``.
    """
    import math

    import numpy as np

    if limit < 1:
        raise UsageError(f"--limit must be at least 1, got {limit}", fix="use e.g. --limit 200")
    total = sum(len(v) for v in ids_by_source.values())
    if limit >= total:
        return {s: sorted(v) for s, v in ids_by_source.items()}
    names = sorted(ids_by_source)
    alloc = np.random.default_rng([seed, _stable_hash("--limit allocation")])
    start = alloc.random() * total  # scaled by total: the cumulative quotas are the integers limit * n
    take, cum = {}, 0
    for i in alloc.permutation(len(names)):
        s = names[i]
        lo, cum = cum, cum + limit * len(ids_by_source[s])
        take[s] = math.ceil((cum - start) / total) - math.ceil((lo - start) / total)
    out = {}
    for s, ids in ids_by_source.items():
        order = sorted(ids)
        rng = np.random.default_rng([seed, _stable_hash(s)])
        out[s] = sorted(order[i] for i in rng.permutation(len(order))[: take[s]])
    return out


def limit_summary(by_source: dict[str, list[str]], kept: dict[str, list[str]], limit: int,
                  seed: int) -> Sample:
    """The summary's ``limit`` (:class:`critic_audit.summary.Sample`) of a :func:`limit_sample`: the
    limit, the seed, trajectories read and kept (in all and per source) and the sources sampled and
    those that got no trajectory."""
    return Sample(limit=limit, seed=seed, trajectories_read=sum(len(v) for v in by_source.values()),
                  trajectories_kept=sum(len(v) for v in kept.values()), stratified_by="source",
                  by_source={s: SourceSample(read=len(by_source[s]), kept=len(kept[s])) for s in sorted(by_source)},
                  sources_sampled=tuple(sorted(s for s in by_source if kept[s])),
                  sources_not_sampled=tuple(sorted(s for s in by_source if not kept[s])))


def _apply_limit(convs: list[Conversation] | None, tables: list[TablePart], limit: int,
                 seed: int) -> tuple[list[Conversation] | None, list[TablePart], Sample]:
    """Keep a :func:`limit_sample` of the conversations and table trajectories read; returns them and
    the summary's ``limit`` (:func:`limit_summary`)."""
    by_source: dict[str, list[str]] = {}
    for c in convs or []:
        by_source.setdefault(c.source or "unknown", []).append(c.trajectory_id)
    for _, tr, _, _ in tables:
        srcs = tr["source"].cast(pl.String).fill_null("unknown").to_list() if "source" in tr.columns \
            else ["unknown"] * tr.height
        for tid, src in zip(tr["trajectory_id"].cast(pl.String).to_list(), srcs):
            by_source.setdefault(src, []).append(tid)
    kept = limit_sample(by_source, limit, seed)
    keep = {t for ids in kept.values() for t in ids}
    out_convs = None if convs is None else [c for c in convs if c.trajectory_id in keep]
    ids = pl.Series(sorted(keep), dtype=pl.String).implode()
    out_tables = [(p, tr.filter(pl.col("trajectory_id").cast(pl.String).is_in(ids)),
                   tk.filter(pl.col("trajectory_id").cast(pl.String).is_in(ids)),
                   {k: v for k, v in pre.items() if k in keep}) for p, tr, tk, pre in tables]
    return out_convs, out_tables, limit_summary(by_source, kept, limit, seed)


def _audit_one(
    inputs: Sequence[str | Path],
    scoring: ScoringConfig | None,
    read_options: ReadOptions,
    tokenize: TokenizeConfig,
    audit_config: AuditConfig,
    progress: Progress | None,
    convs: list[Conversation] | None,
    tables: Sequence[TablePart],
    report: ReadReport,
    sampled: bool = False,
) -> tuple[AuditResult, pl.DataFrame, int | None]:
    """Tokenize with this critic's tokenizer, score and audit the inputs read once by :func:`analyze`
    (``convs``: the conversations; ``tables``: the table inputs; ``sampled``: a ``--limit`` sample,
    :func:`is_sample`); returns (result, tokens, context)."""
    warnings: list[str] = []
    critic, inference, fitted_ids = None, {}, None
    needs_values = any(t[2].filter(pl.col("response_mask") & pl.col("value").is_null()).height for t in tables)
    if convs or needs_values:
        if scoring is None:
            where = ", ".join(str(p) for p in (list(inputs) if convs else [t[0] for t in tables]))
            raise ConfigError(f"{where}: no critic values to audit", fix="pass --critic CHECKPOINT_DIR")
        critic, inference = _open_critic(scoring)
        fitted_ids = critic_fitted_ids(scoring.critic)
    if needs_values:  # stored ids of another tokenizer: re-rendered from their text
        tables, redo, ids_info = verify_stored_ids(tables, critic.tokenizer, read_options, warnings, report)
        convs = [*(convs or []), *redo] or None
        inference.update({"token_ids": ids_info} if ids_info else {})
    chat_inputs = list(inputs) if convs else []
    table_inputs = [t[0] for t in tables]
    trajs_parts, token_parts, pre_excluded, truncation, carried = _table_parts(tables)
    template_system = next((c["template_system"] for c in carried if c.get("template_system")), None)
    if chat_inputs:
        trajs, toks, excluded, truncation, template_system = _tokenize_chat(convs or [], critic, tokenize, progress,
                                                                            warnings)
        pre_excluded.update(excluded)
        trajs_parts.append(trajs)
        token_parts.append(toks)

    trajectories = concat_tables(trajs_parts, "trajectories") if len(trajs_parts) > 1 else trajs_parts[0]
    tokens = concat_tables(token_parts, "tokens") if len(token_parts) > 1 else token_parts[0]
    dup = trajectories.height - trajectories["trajectory_id"].n_unique()
    if dup:
        raise InputError(f"{dup} trajectory id(s) appear in more than one input",
                         fix="give every rollout a unique id")

    if critic is not None:
        for p, tr, tk in zip(table_inputs, trajs_parts, token_parts):  # before scoring: name the file and trajectory
            check_scorable(tk, critic, p, tr)
        check_vocabulary(tokens, critic, report, warnings, ids_verified=(inference.get("token_ids") or {}).get("mode") != "trust"
                         and "token_ids" in inference)
        tokens, ran = score_missing(tokens, critic, scoring, progress)
        if ran is not None:
            inference.update(ran.as_inference())

    result = audit(trajectories, tokens, audit_config, pre_excluded=pre_excluded, fitted_ids=fitted_ids,
                   truncation=truncation, sampled=sampled)  # the summary's "truncated"
    if not inference and carried:
        # values re-audited from saved tables: say which critic produced them
        inference = _values_from(carried)
    # how the tokens were rendered (saved tables: as then), and the run so far
    summary = with_run(dataclasses.replace(result.summary, template_system=template_system),
                       inference=inference or None, warnings=warnings, inputs=inputs)
    return dataclasses.replace(result, summary=summary), tokens, (critic.max_length if critic else None)


def _values_from(carried: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """``inference`` of values re-audited from saved tables: their inputs and the critic that scored them."""
    return {"values_from": [c.get("inputs") for c in carried],
            "critic": [(c.get("inference") or {}).get("critic") for c in carried]}


def _table_parts(tables: Sequence[TablePart]) -> tuple[list[pl.DataFrame], list[pl.DataFrame], dict[str, str],
                                                       Truncation, list[dict[str, Any]]]:
    """The table inputs' ``(trajectories, tokens)`` parts, their pre-scoring exclusions, the truncation
    their earlier audits recorded (summed; the limit the first of them to record one applied) and those
    audits' summaries (``summary.json`` as read, :func:`critic_audit.io.tables.prior_summary`)."""
    trajs_parts, token_parts, pre_excluded, carried = [], [], {}, []
    for p, tr, tk, pre in tables:
        pre_excluded.update(pre)
        trajs_parts.append(tr)
        token_parts.append(tk)
        prior = prior_summary(p)
        if prior:
            carried.append(prior)
    cut = [c.get("truncated") or {} for c in carried]

    def first(k: str) -> Any:  # the limit the saved audits applied
        return next((t[k] for t in cut if t.get(k) is not None), None)

    truncation = Truncation(**{k: sum(int(t.get(k, 0)) for t in cut) for k in ("trajectories", "turns", "policy_tokens")},
                            max_length=first("max_length"), cut_by=first("cut_by"), critic_context=first("critic_context"))
    return trajs_parts, token_parts, pre_excluded, truncation, carried


def _open_critic(scoring: ScoringConfig) -> tuple[Any, dict[str, Any]]:
    """The critic of ``scoring`` (loaded here, or inspected only when workers score) and the start of
    the summary's ``inference``."""
    from critic_audit.critic import inspect_critic, load_critic  # torch/transformers load only when needed

    if scoring.distributed:  # the workers load the critic; this process needs its tokenizer
        critic = inspect_critic(scoring.critic, trust_remote_code=scoring.trust_remote_code,
                                allow_pickle=scoring.allow_pickle)
        inference = {"critic": str(scoring.critic), "device": None, "dtype": None}
    else:
        critic = load_critic(scoring.critic, device=scoring.device, dtype=scoring.dtype,
                             trust_remote_code=scoring.trust_remote_code, allow_pickle=scoring.allow_pickle)
        inference = {"critic": str(scoring.critic), "device": str(critic.device),
                     "dtype": str(critic.dtype).replace("torch.", "")}
    inference.update(token_budget=scoring.token_budget, backend=scoring.backend if scoring.distributed else
                     "in-process", workers=scoring.workers)
    return critic, inference


def _tokenize_chat(convs: list[Conversation], critic: Any, tokenize: TokenizeConfig, progress: Progress | None,
                   warnings: list[str]) -> tuple[pl.DataFrame, pl.DataFrame, dict[str, str], Truncation,
                                                 dict[str, Any] | None]:
    """Render the conversations with the critic's tokenizer: ``(trajectories, tokens, excluded,
    truncation, template_system)``; a system prompt the chat template invented, or a policy token the
    tokenizer cannot represent, adds a warning.

    Raises:
        ConfigError: ``--max-length`` beyond the critic's context.
    """
    max_len = tokenize.max_length or critic.max_length
    if max_len > critic.max_length:
        raise ConfigError(f"--max-length {max_len} exceeds the critic's context {critic.max_length}",
                          fix=f"use at most {critic.max_length}")
    tcfg = dataclasses.replace(tokenize, max_length=max_len)
    tok_res: TokenizeResult = tokenize_conversations(
        convs, critic.tokenizer, tcfg, progress=(lambda d, n: progress("tokenize", d, n)) if progress else None)
    truncation = Truncation(trajectories=tok_res.truncated_trajectories, turns=tok_res.truncated_turns,
                            policy_tokens=tok_res.truncated_policy_tokens, max_length=max_len,
                            cut_by="max_length" if tokenize.max_length else "critic_context",
                            critic_context=critic.max_length)
    if tok_res.template_system:
        warnings.append(template_system_warning(tok_res.template_system))
    unk = getattr(critic.tokenizer, "unk_token_id", None)
    if unk is not None:
        n_unk = sum(int((c.input_ids[c.response_mask] == unk).sum()) for c in tok_res.conversations)
        n_pol = sum(int(c.response_mask.sum()) for c in tok_res.conversations)
        if n_unk:
            warnings.append(f"{n_unk} of {n_pol} policy tokens are the critic tokenizer's unknown token: it cannot "
                            "represent this text, so the values are not those of the original token ids "
                            "(audit the saved tokens table instead, or use a critic with a byte-level tokenizer)")
    return (conversations_to_trajectories(convs), token_table(tok_res.conversations), tok_res.excluded, truncation,
            tok_res.template_system)


def _removes_scoring_cache(fn: Callable[..., AnalyzeOutcome]) -> Callable[..., AnalyzeOutcome]:
    """``analyze`` that, once it has returned, removes the scoring cache of each of its ``scoring``
    configs (:meth:`~critic_audit.critic.CacheOptions.remove_after_success`: unless ``keep``; with
    ``resume=False`` an existing cache is left alone); after an exception the caches stay, to resume."""
    @functools.wraps(fn)
    def run(inputs: Sequence[str | Path], out_dir: str | Path, **kwargs: Any) -> AnalyzeOutcome:
        outcome = fn(inputs, out_dir, **kwargs)
        for sc in _given(kwargs.get("scoring")):
            if sc.cache is not None:
                sc.cache.remove_after_success()
        return outcome
    return run


@one_process_per_out
@_removes_scoring_cache
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
    stream: bool | None = None,
    overwrite: bool = False,
    limit: int | None = None,
    keep_tokens: bool = False,
) -> AnalyzeOutcome:
    """Run the audit end to end and write the output folder atomically.

    Inputs are rollout files/folders of any supported format (``read_options.format``, auto-detected
    per file by default; folders searched recursively; ``docs/input_formats.md``) or canonical-table
    folders (``tokens.parquet`` + ``trajectories.parquet``); tables whose policy tokens all carry a value
    skip critic inference. Inputs are resolved and read once, whatever the number of critics. The
    summary's ``input`` entry holds the format read per input, the records skipped per reason and the
    files skipped per reason; ``config.json`` records every option that shaped the result.

    ``stream=None`` (default): canonical tables with values (``tokens.parquet`` folders, verl dumps,
    ``analyze`` folders), without critic or ``limit``, are streamed (:mod:`critic_audit.pipeline.stream`;
    no tokens written unless ``keep_tokens``); ``True`` insists, ``False`` reads into memory.

    ``limit``: audit a reproducible sample of that many trajectories, stratified by source
    (:func:`limit_sample`, seeded by ``audit_config.seed``), drawn before tokenizing and scoring;
    ``summary.json["limit"]`` records it (read and kept per source).

    ``scoring`` says how each critic runs (:class:`ScoringConfig`: device, dtype, token budget,
    workers, ``allow_pickle``) and where its scoring is cached (``scoring.cache``,
    :class:`~critic_audit.critic.CacheOptions`: resumed from a kept cache; the cache root is removed
    when ``analyze`` returns unless ``keep``, and stays after an exception). A ``ScoringConfig`` without
    ``critic`` scores nothing: the inputs must carry their values.

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
    _report = ReadReport()
    inputs = expand_table_folders(inputs, lenient=read_options.lenient, report=_report)
    out_dir = check_output_folder(Path(out_dir), inputs, overwrite=overwrite)
    for p in inputs:
        refuse_multi_critic_folder(p)
    scorings = _scoring_list(scoring)
    config_for = functools.partial(_base_config, inputs, out_dir, read_options, tokenize, audit_config, limit, scoring)
    if (streamed := _try_stream(inputs, out_dir, scorings, read_options, audit_config, config_for, plots=plots,
                                stream=stream, limit=limit, keep_tokens=keep_tokens, overwrite=overwrite, t0=t0,
                                report=_report)):
        return streamed
    read = read_all(inputs, read_options, report=_report)  # once: path -> files, format, kind; each file read
    resolved, chat_inputs, tables, convs = read.resolved, read.conversation_inputs, read.tables, read.conversations
    check_side_summaries([t[0] for t in tables], lenient=read_options.lenient, report=_report)
    if chat_inputs and not convs:
        raise InputError("no rollouts in the input", path=chat_inputs[0] if len(chat_inputs) == 1 else None,
                         fix="pass a file with at least one record")
    convs, tables, limit_info = (convs, tables, None) if limit is None else \
        _apply_limit(convs, list(tables), limit, audit_config.seed)
    if limit is None and not convs:  # a re-analysis of a --limit audit keeps its sampling record
        limit_info = carried_limit(inputs, [q for t in tables if (q := prior_summary(t[0]))],
                                   sum(t[1]["trajectory_id"].n_unique() for t in tables))
    if convs:
        _check_group_by(audit_config, convs)
    base_config = config_for(resolved)
    if len(scorings) == 1:
        result, tokens, ctx = _audit_one(inputs, scorings[0], read_options, tokenize, audit_config, progress, convs,
                                         tables, _report, is_sample(limit_info))
        config = {**base_config, "scoring": scorings[0].as_dict() if scorings[0] else None, "critic_max_length": ctx}
        with staging(out_dir, inside=True) as tmp:
            summary = with_run(result.summary, seconds=time.perf_counter() - t0, input=_report, limit=limit_info)
            write_folder(tmp, result, summary, tokens, config, plots)
            publish_folder(tmp, out_dir, overwrite)
        return AnalyzeOutcome(dataclasses.replace(result, summary=summary), tokens, out_dir, summary)

    return _analyze_critics(inputs, out_dir, scorings, read_options, tokenize, audit_config, progress, convs, tables,
                            _report, base_config, plots=plots, overwrite=overwrite, t0=t0, limit_info=limit_info)


def _base_config(inputs: Sequence[str | Path], out_dir: Path, read_options: ReadOptions, tokenize: TokenizeConfig,
                 audit_config: AuditConfig, limit: int | None, scoring: ScoringConfig | Sequence[ScoringConfig] | None,
                 resolved: Sequence[Any]) -> dict[str, Any]:
    """``config.json``'s entries every audit records (the inputs as ``resolved``, the options)."""
    return {
        "inputs": [absolute_path(p) for p in inputs],
        "cwd": _cwd(),  # where the run ran (older folders recorded relative inputs: stream.original_inputs)
        "out": str(out_dir),
        "read_options": read_options.as_dict(),
        "input_files": {str(r.path): {"format": r.format, "kind": r.kind, "files": len(r.files)} for r in resolved},
        "tokenize": {**dataclasses.asdict(tokenize), "chat_template": bool(tokenize.chat_template)},
        "audit": audit_config.as_dict(),
        "limit": limit,
        **run_options((_given(scoring) or [None])[0]),
    }


def _given(scoring: ScoringConfig | Sequence[ScoringConfig] | None) -> list[ScoringConfig]:
    """``analyze``'s ``scoring`` as a list of the configs given (with a critic or not)."""
    if scoring is None:
        return []
    return [scoring] if isinstance(scoring, ScoringConfig) else list(scoring)


def _scoring_list(scoring: ScoringConfig | Sequence[ScoringConfig] | None) -> list[ScoringConfig | None]:
    """``analyze``'s critics as a list: ``[None]`` (values given, no critic), one critic, or several
    (configs without a ``critic`` only carry run-wide options: :func:`_given`)."""
    return [sc for sc in _given(scoring) if sc.critic is not None] or [None]


def _analyze_critics(inputs: Sequence[str | Path], out_dir: Path, scorings: list[ScoringConfig], read_options: ReadOptions,
                     tokenize: TokenizeConfig, audit_config: AuditConfig, progress: Progress | None,
                     convs: list[Conversation] | None, tables: Sequence[TablePart], _report: ReadReport,
                     base_config: dict[str, Any], *, plots: bool, overwrite: bool, t0: float,
                     limit_info: dict[str, Any] | None) -> AnalyzeOutcome:
    """Several critics on the same rollouts (read once): a complete folder per critic under
    ``critics/<label>/`` and the comparison at the top level (see :func:`analyze`)."""
    labels = critic_labels([sc for sc in scorings if sc is not None])
    with staging(out_dir, inside=True) as tmp:
        pers, per_summary, first_tokens = [], {}, None
        for label, sc in zip(labels, scorings):
            def prog(stage: str, d: int, n: int, _label: str = label) -> None:
                if progress:
                    progress(f"{stage} [{_label}]", d, n)

            result, tokens, ctx = _audit_one(inputs, sc, read_options, tokenize, audit_config, prog, convs,
                                             tables, copy.deepcopy(_report), is_sample(limit_info))  # per critic
            config = {**base_config, **run_options(sc), "scoring": sc.as_dict(), "critic_max_length": ctx}
            write_folder(tmp / "critics" / label, result, with_run(result.summary, limit=limit_info), tokens, config,
                         plots)
            pers.append(result.per_trajectory.with_columns(critic=pl.lit(label)))
            per_summary[label] = _per_critic(result.summary)
            first_tokens = tokens if first_tokens is None else first_tokens
        per_all = pl.concat(pers, how="vertical_relaxed")
        from critic_audit.analysis.audit import breakdown

        comparison = AuditSummary(comparison=CriticComparison(
            critics=tuple(labels), n_trajectories=int(per_all["trajectory_id"].n_unique()),
            by_critic=breakdown(per_all, "critic", audit_config), per_critic=per_summary))
        summary = with_run(comparison, inputs=inputs, seconds=time.perf_counter() - t0, input=_report, limit=limit_info)
        config = {**base_config, "scoring": [sc.as_dict() for sc in scorings]}
        write_summary(tmp / "summary.json", summary)
        write_json(tmp / "config.json", config)
        per_all.write_parquet(tmp / "trajectories.parquet")
        if plots:
            from critic_audit.report import render_comparison

            render_comparison(tmp, per_all, summary)
        publish_folder(tmp, out_dir, overwrite, critics=labels)
    return AnalyzeOutcome(AuditResult(per_all, summary), first_tokens, out_dir, summary)


def _per_critic(s: AuditSummary) -> PerCritic:
    """One critic's headline in a comparison (``per_critic``)."""
    return PerCritic(n_included=s.n_included or 0, eta2_median=s.eta2_median,
                     frac_ss_between_gt_within=s.frac_ss_between_gt_within, frac_f_gt_1=s.frac_f_gt_1,
                     omega2_median=s.omega2_median, critic_quality=s.critic_quality, recommendation=s.recommendation,
                     inference=s.run.inference, excluded=s.excluded, coverage=s.coverage)


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


def _try_stream(inputs: Sequence[str | Path], out_dir: Path, scorings: list[ScoringConfig | None],
                read_options: ReadOptions, audit_config: AuditConfig, config_for: Callable[[Sequence[Any]], dict[str, Any]],
                *, plots: bool, stream: bool | None,
                limit: int | None, keep_tokens: bool, overwrite: bool, t0: float,
                report: ReadReport) -> AnalyzeOutcome | None:
    """The streamed audit when ``stream`` asks for it or (None) the inputs allow it (see :func:`analyze`);
    None when the in-memory path runs instead.

    Raises:
        ConfigError: ``stream=True`` with inputs that cannot be streamed, a critic or ``limit``.
    """
    from critic_audit.pipeline import stream as S

    source = list(inputs)
    if len(inputs) == 1 and S.stats_folder(inputs[0]):  # an earlier streamed audit: its statistics
        if limit is not None or scorings != [None]:
            raise ConfigError(f"{inputs[0]} holds an audit's statistics, not its tokens: nothing to sample or score",
                              fix="drop --limit / --critic, or audit the original tables")
        original = S.original_inputs(Path(inputs[0]), audit_config)  # another scope: its tokens, read again
        if original is None:
            run = S.reaudit(Path(inputs[0]), audit_config)
            report.formats[str(inputs[0])] = "audit statistics"
            from critic_audit.io.tables import prior_summary

            return _write_streamed(inputs, out_dir, run, [prior_summary(inputs[0]) or {}], config_for([]),
                                   plots=plots, keep_tokens=False, overwrite=overwrite, t0=t0, report=report)
        source, stream = original, True
    if stream is False:
        return None
    why = ("--limit samples trajectories in memory" if limit is not None else
           "a critic scores tokens in memory" if scorings != [None] else None)
    parts: list[Any] = []
    resolved: list[Any] = []
    plan_report = copy.deepcopy(report)  # the report of the inputs as streamed (left unused when they are not)
    if why is None:
        parts, why, resolved = S.stream_plan(source, read_options, plan_report)
    if why is not None:
        if stream:
            raise ConfigError(f"--stream cannot read these inputs in batches: {why}",
                              fix="drop --stream (the inputs are then read into memory)")
        return None
    check_side_summaries(list(dict.fromkeys(x.input for x in parts)), lenient=read_options.lenient, report=plan_report)
    _, _, _, truncation, carried = _table_parts([(p, None, None, {}) for p in dict.fromkeys(x.input for x in parts)])
    from critic_audit.plot_process import PLOT_PROCESS_MIN_BYTES, start_plot_process

    size = sum(t.stat().st_size for t in dict.fromkeys(x.tokens for x in parts) if t.is_file())
    # a large input's plots are drawn by a second process while the summary is computed
    plotter = start_plot_process() if plots and size >= PLOT_PROCESS_MIN_BYTES else None
    try:
        run = S.run_stream(parts, audit_config, truncation=truncation, options=read_options, report=plan_report,
                           keep_tokens=keep_tokens,
                           ready=None if plotter is None else functools.partial(_feed_plots, plotter))
        plan_report.records_read = run.result.per_trajectory.height  # as read_all counts table inputs
        run.result = run.result.with_summary(template_system=next((c["template_system"] for c in carried
                                                                    if c.get("template_system")), None))
        return _write_streamed(inputs, out_dir, run, carried, config_for(resolved), plots=plots,
                               keep_tokens=keep_tokens, overwrite=overwrite, t0=t0, report=plan_report,
                               plotter=plotter)
    finally:
        if plotter is not None:
            plotter.close()


def _collect_plots(plotter: Any, folder: Path) -> list[str] | None:
    """The stems of the plots ``plotter`` drew, moved into ``folder/plots``; None when its process ended
    before drawing them (the caller draws them itself)."""
    from critic_audit.plot_process import PlotProcessError

    try:
        return plotter.collect(folder)
    except PlotProcessError:
        return None


def _feed_plots(plotter: Any, event: str, value: Any) -> None:
    """Hand a streamed audit's plot inputs to ``plotter`` (a :class:`critic_audit.plot_process.PlotProcess`)
    as :func:`critic_audit.pipeline.stream.run_stream` tells them: every plot but the checkpoint one
    from the per-trajectory table and the aggregates, then that one from the checkpoint breakdown."""
    if event == "plot_inputs":
        per, traces, turns, steps = value
        plotter.draw(traces, per, turns=turns, steps=steps)
    elif event == "by_checkpoint" and len(value) > 1:
        plotter.draw(pl.DataFrame(), pl.DataFrame(), summary=AuditSummary(by_checkpoint=value),
                     stems=["eta2_ev_by_checkpoint"])


def _write_streamed(inputs: Sequence[str | Path], out_dir: Path, run: Any, carried: list[dict[str, Any]],
                    base_config: dict[str, Any], *, plots: bool, keep_tokens: bool, overwrite: bool, t0: float,
                    report: ReadReport, plotter: Any = None) -> AnalyzeOutcome:
    """Write a streamed audit's folder (:func:`critic_audit.pipeline.stream.write_stream_files`); the
    plots come from ``plotter`` (a :class:`critic_audit.plot_process.PlotProcess` already drawing them)
    when it has them in hand, else they are drawn here."""
    from critic_audit.pipeline.stream import write_stream_files

    result = run.result
    summary = with_run(result.summary, inference=_values_from(carried) if carried else None, warnings=[],
                       inputs=inputs)
    config = {**base_config, "scoring": None, "critic_max_length": None,
              "stream": {"parts": len(run.parts), "keep_tokens": keep_tokens}}
    with staging(out_dir, inside=True) as tmp:
        summary = with_run(summary, seconds=time.perf_counter() - t0, input=report,
                           limit=carried_limit(inputs, carried, result.summary.n_trajectories),
                           streamed=True, tokens_source="tokens.parquet" if keep_tokens else None)
        write_summary(tmp / "summary.json", summary)
        write_json(tmp / "config.json", config)
        write_stream_files(tmp, run, keep_tokens=keep_tokens)
        stems = _collect_plots(plotter, tmp) if plots and plotter is not None and plotter.jobs else None
        if stems is not None:
            from critic_audit.report import write_reports

            write_reports(tmp, summary, stems)
        elif plots:
            from critic_audit.report import render_folder

            render_folder(tmp, run.traces, result.per_trajectory, summary, turns=run.turns, steps=run.steps)
        publish_folder(tmp, out_dir, overwrite)
    return AnalyzeOutcome(dataclasses.replace(result, summary=summary), None, out_dir, summary)
