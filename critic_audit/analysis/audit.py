"""The critic-structure audit over canonical tables: per-trajectory statistics, headline, breakdowns.

Definitions: docs/audit.md (eta-squared and the other one-way ANOVA statistics per
trajectory, exclusions, critic quality); the measurement it reproduces is the MPO paper's
(arXiv:2610.35013: median eta2 0.895, 93.8% of trajectories with SS_B > SS_W).
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from critic_audit.analysis.clusters import (ClusterLayout, bootstrap_sums_ci, cluster_bootstrap_ci, design_effect,
                                           has_clusters, max_design_effect)
from critic_audit.analysis.decompose import bootstrap_ci, decompose
from critic_audit.analysis.quality import (MIN_CONFIDENT_BOOTSTRAP, check_bootstrap_and_seed, GateConfig, TrajectorySums, pooled_ev, outcome_split,
                                           quality_gate, wilson_interval)
from critic_audit.errors import ConfigError, SchemaError
from critic_audit.summary import (AuditSummary, Boundary, Breakdown, Coverage, CriticQuality, FitOverlap, Fraction,
                                  Interval, PooledVerdict, QualityGate, Recommendation, Share, Truncation)

SCOPES = ("assistant", "all")

#: Trajectory columns a breakdown can use directly (any other name is looked up in ``metadata``).
GROUPABLE = ("success", "source", "checkpoint", "group_id", "num_turns", "turn_bucket", "reward")

#: The MPO paper's figures, reported beside ours for orientation (arXiv:2610.35013).
PAPER_REFERENCE = {"median_eta2": 0.895, "frac_ss_between_gt_within": 0.938}


@dataclasses.dataclass(frozen=True)
class AuditConfig:
    """Options of the decomposition.

    Attributes:
        scope: ``"assistant"`` (default) uses the values of policy tokens only, one group per
            assistant turn; ``"all"`` adds every other token with a value, each maximal run of
            non-policy tokens (user, tool, template) being its own group.
        n_boot: bootstrap resamples for the 95% intervals.
        seed: seed of the bootstrap (same seed, same intervals).
        turn_buckets: upper edges (inclusive) of the number-of-turns buckets of the breakdown.
        group_by: extra trajectory columns to break every headline number down by (``success``,
            ``source``, ``checkpoint`` and ``turn_bucket`` are always reported).
        turn_level_eta2: [ours] recommend turn-level credit when the median eta2 and the fraction
            SS_B > SS_W are both at least this.
        token_level_eta2: [ours] recommend keeping token-level credit when the median eta2 is at most this.
        gate: the critic-quality gate's thresholds (:class:`critic_audit.analysis.quality.GateConfig`:
            ``min_per_outcome`` trajectories of each outcome for any credit verdict, below which it is
            ``not_enough_data``; ``min_corr`` and ``alpha`` for the within-stratum correlation of mean
            value and reward; ``min_explained_variance``; ``n_perm`` permutations). Its ``n_boot`` and
            ``seed`` are this config's: one bootstrap setting per audit.
        min_group_n: breakdown rows with fewer audited trajectories are flagged ``low_n`` and get no
            verdict of their own.
        low_coverage: below this share of the rollouts' assistant turns audited, the headline warns.
    """

    scope: str = "assistant"
    n_boot: int = 2000
    seed: int = 0
    turn_buckets: tuple[int, ...] = (2, 3, 5, 10, 20)
    group_by: tuple[str, ...] = ()
    turn_level_eta2: float = 0.7
    token_level_eta2: float = 0.3
    gate: GateConfig = GateConfig()
    min_group_n: int = 10
    low_coverage: float = 0.8

    def __post_init__(self) -> None:
        if self.scope not in SCOPES:
            raise ConfigError(f"unknown scope {self.scope!r}", fix="use --scope assistant or --scope all")
        if self.gate.min_per_outcome < 1:
            raise ConfigError(f"min_per_outcome must be at least 1, got {self.gate.min_per_outcome}",
                              fix="use e.g. 5")
        check_bootstrap_and_seed(self.n_boot, self.seed, min_boot=1)

    def as_dict(self) -> dict[str, Any]:
        """The options as ``config.json`` records them: flat, the gate's thresholds beside the others
        (its ``n_boot`` and ``seed`` are this config's)."""
        d = dataclasses.asdict(self)
        gate = d.pop("gate")
        return {**d, **{k: v for k, v in gate.items() if k not in ("n_boot", "seed")}}


@dataclasses.dataclass
class AuditResult:
    """Output of :func:`audit`.

    Attributes:
        per_trajectory: one row per trajectory: the trajectories table's columns plus the statistics of
            :func:`critic_audit.analysis.decompose.decompose`.
        summary: the headline, exclusions, critic quality and breakdowns, typed
            (:class:`critic_audit.summary.AuditSummary`; its ``run`` left to the caller: :mod:`critic_audit.pipeline`).
    """

    per_trajectory: pl.DataFrame
    summary: AuditSummary

    def with_summary(self, **fields: Any) -> AuditResult:
        """This result with the named fields of its summary replaced (:func:`dataclasses.replace`: a
        field :class:`~critic_audit.summary.AuditSummary` does not declare is a ``TypeError``)."""
        return dataclasses.replace(self, summary=dataclasses.replace(self.summary, **fields))


def refuse_missing_values(tokens: pl.DataFrame, *, path: str | None = None) -> None:
    """Refuse policy tokens (``response_mask`` true) whose ``value`` is null: the critic was not run on
    them (``analyze`` and ``monitor`` alike).

    Raises:
        SchemaError: ``N policy token(s) have no critic value``, naming ``path`` and the row (0-based,
            in table order) of the first one.
    """
    missing = tokens.select((pl.col("response_mask") & pl.col("value").is_null()).alias("m"))["m"]
    n = int(missing.sum() or 0)
    if n:
        first = int(missing.arg_true()[0])
        raise SchemaError(f"{n} policy token(s) have no critic value", path=path,
                          record=first if path is not None else None,
                          fix="pass --critic to score them, or fill the value column")


def _select(tokens: pl.DataFrame, scope: str) -> pl.DataFrame:
    """Tokens that enter the decomposition, with a per-trajectory segment index ``seg``. Only the
    columns the audit reads are kept, and rows are filtered before the sort (the filter is row-wise, so
    the result is the same; the copies are smaller)."""
    keep = [c for c in ("trajectory_id", "position", "turn", "response_mask", "value") if c in tokens.columns]
    order = ["trajectory_id", "position"]
    if scope == "assistant":
        return (tokens.select(keep).filter(pl.col("response_mask")).sort(order, maintain_order=True)
                .with_columns(seg=pl.col("turn").cast(pl.Int64)))
    # scope all: each maximal run of response_mask within a trajectory is one segment
    t = tokens.select(keep).filter(pl.col("value").is_not_null() | pl.col("response_mask")).sort(order,
                                                                                                  maintain_order=True)
    change = (pl.col("response_mask") != pl.col("response_mask").shift(1)).fill_null(True)
    return t.with_columns(seg=change.cum_sum().over("trajectory_id").cast(pl.Int64))


def _bucket_label(k: int, edges: tuple[int, ...]) -> str:
    lo = 1
    for e in edges:
        if k <= e:
            return f"{lo}-{e}" if lo != e else f"{e}"
        lo = e + 1
    return f">{edges[-1]}"


def _group_stats(df: pl.DataFrame, config: AuditConfig) -> Breakdown:
    inc = df.filter(pl.col("excluded").is_null())
    clusters = cluster_codes(inc)
    return Breakdown(n=df.height, n_included=inc.height, low_n=inc.height < config.min_group_n,
                     eta2_median=_ci_entry(inc["eta2"].to_numpy(), "median", config, clusters),
                     frac_ss_between_gt_within=_frac_entry(inc["reading_a"], clusters))


def cluster_codes(df: pl.DataFrame) -> np.ndarray | None:
    """(rows,) int64 cluster code of each row of a trajectories table: its ``group_id`` within its
    (source, checkpoint) (the rollouts of one prompt, the trials of one task), a row without a
    ``group_id`` a cluster of its own; None when no cluster holds two rows (or no ``group_id``
    column): the intervals then resample trajectories (:mod:`critic_audit.analysis.clusters`)."""
    if "group_id" not in df.columns or df.height < 2 or df["group_id"].null_count() == df.height:
        return None
    cols = [pl.col(c).cast(pl.String).fill_null("") if c in df.columns else pl.lit("") for c in ("source", "checkpoint")]
    gid = pl.col("group_id").cast(pl.String)
    key = df.with_row_index("_row").select(
        *cols, gid.is_null().alias("_own"),
        pl.when(gid.is_null()).then(pl.col("_row").cast(pl.String)).otherwise(gid).alias("_g")).hash_rows().to_numpy()
    codes = np.unique(key, return_inverse=True)[1].reshape(-1).astype(np.int64)
    return codes if has_clusters(codes) else None


def _ci_entry(x: np.ndarray, stat: str, config: AuditConfig, clusters: np.ndarray | None = None) -> Interval:
    """The bootstrap estimate with its 95% interval; the interval is None with fewer than 2 trajectories
    (it would be 0 wide). With ``clusters`` (:func:`cluster_codes`) whole clusters are resampled
    (:func:`critic_audit.analysis.clusters.cluster_bootstrap_ci`; ``n_clusters`` says how many; None
    with fewer than 2 clusters)."""
    n = int(np.isfinite(np.asarray(x, dtype=np.float64)).sum())
    if clusters is None:
        est, lo, hi = bootstrap_ci(x, stat, n_boot=config.n_boot, seed=config.seed)
        return Interval(estimate=_num(est), ci95=(_num(lo), _num(hi)) if n >= 2 else None)
    est, lo, hi, k = cluster_bootstrap_ci(x, clusters, stat, n_boot=config.n_boot, seed=config.seed)
    return Interval(estimate=_num(est), ci95=(_num(lo), _num(hi)) if n >= 2 and k >= 2 else None,
                    n_clusters=k if n else None)


def _frac_entry(flags: pl.Series, clusters: np.ndarray | None = None) -> Fraction:
    """A fraction of trajectories ``k`` of ``n``, its interval the Wilson score's (None when n = 0).
    With ``clusters`` (:func:`cluster_codes`, one per row of ``flags``) the interval is Wilson's at the
    effective sample size ``n / deff`` (:func:`critic_audit.analysis.clusters.design_effect`), widened where
    needed to reach the interval of ``n`` of ``n`` (low end) and of 0 of ``n`` (high end) at the effective n
    of agreeing trajectories (``n^2 / sum n_c^2``): one disagreeing trajectory cannot make a side surer than
    none would (its design effect, estimated from that one trajectory, is near 1). The entry then says so:
    ``widened`` True and ``widened_to_n_effective`` that n (``design_effect`` / ``n_effective`` stay the
    estimate's, which the interval no longer rests on)."""
    keep = flags.is_not_null().to_numpy()
    f = flags.drop_nulls().cast(pl.Boolean)
    n, k = f.len(), int(f.sum()) if f.len() else 0
    if clusters is None or n == 0:
        ci = wilson_interval(k, n)
        return Fraction(estimate=k / n if n else None, ci95=tuple(ci) if ci else None, k=k, n=n)
    deff = design_effect(f.to_numpy(), clusters[keep])
    raw = ci = wilson_interval(k / deff, n / deff)
    m = n / max_design_effect(ClusterLayout(clusters[keep]).lens)
    if ci is not None:  # never surer of a side than data that all agree would make it (docs/audit.md)
        ci = (min(ci[0], wilson_interval(m, m)[0]), max(ci[1], wilson_interval(0, m)[1]))
    widened = ci is not None and tuple(ci) != tuple(raw)
    return Fraction(estimate=k / n, ci95=tuple(ci) if ci else None, k=k, n=n, design_effect=deff,
                    n_effective=n / deff, widened=widened, widened_to_n_effective=m if widened else None)


def _num(x: Any) -> Any:
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def natural_key(v: Any) -> tuple:
    """A sort key (``sorted(keys, key=natural_key)``) of natural order: numbers numerically, and strings
    by their text and number runs
    ("step_2" < "step_10"; turn buckets "1-2" < "3" < "11-20" < ">20"); nulls last."""
    import re

    if v is None:
        return (2,)
    if isinstance(v, (int, float, bool)):
        return (0, ((0, float(v), ""),))
    parts = re.split(r"(\d+(?:\.\d+)?)", str(v))
    return (1, tuple((0, float(p), "") if i % 2 else (1, 0.0, p) for i, p in enumerate(parts)))


def breakdown(per_trajectory: pl.DataFrame, by: str, config: AuditConfig = AuditConfig()) -> dict[str, Breakdown]:
    """Headline statistics per value of a trajectory column (``success``, ``source``, ...) or of a
    field of the trajectories' ``metadata`` JSON (e.g. ``trial``), in natural order.

    Returns ``{str(value): Breakdown}`` (``n``, ``n_included``, ``low_n``, ``eta2_median``,
    ``frac_ss_between_gt_within``); null values are labelled ``"unknown"``. Intervals of groups with fewer than 2 audited trajectories
    are null.

    Raises:
        ConfigError: ``by`` is neither a column nor a metadata field of any trajectory.
    """
    if by not in per_trajectory.columns:
        field = None
        if "metadata" in per_trajectory.columns:
            field = per_trajectory["metadata"].str.json_path_match(f"$.{by}")
        if field is None or field.null_count() == field.len():
            raise ConfigError(f"no trajectory column or metadata field {by!r} to break down by",
                              fix=f"use one of {', '.join(GROUPABLE)} or a metadata field")
        per_trajectory = per_trajectory.with_columns(field.alias(by))
    out = {}
    # one pass over the table (a filter per value cost ~10 ms each: a run's hundreds of checkpoints)
    groups = {k[0]: g for k, g in per_trajectory.partition_by(by, as_dict=True, maintain_order=True).items()}
    for key in sorted(groups, key=natural_key):
        out["unknown" if key is None else str(key)] = _group_stats(groups[key], config)
    return out


def audit(
    trajectories: pl.DataFrame,
    tokens: pl.DataFrame,
    config: AuditConfig = AuditConfig(),
    *,
    pre_excluded: dict[str, str] | None = None,
    fitted_ids: Collection[str] | None = None,
    truncation: Truncation | Mapping[str, Any] | None = None,
    sampled: bool = False,
) -> AuditResult:
    """Decompose critic values into between-turn and within-turn variance, per trajectory and overall.

    Args:
        trajectories: the trajectories table (:data:`critic_audit.schema.TRAJECTORY_SCHEMA`), B rows.
        tokens: the tokens table (:data:`critic_audit.schema.TOKEN_SCHEMA`) with ``value`` filled for
            the policy tokens (``response_mask`` True; ``turn`` = assistant-turn index k).
        config: :class:`AuditConfig`.
        pre_excluded: trajectory id -> reason for trajectories excluded before scoring (no assistant
            turn, over-long); they count in the exclusions but have no token rows.
        fitted_ids: trajectory ids the critic was fitted on (``fit-critic`` records them); the quality
            gate judges the critic on the others only.
        truncation: :class:`critic_audit.summary.Truncation` (or its ``summary.json`` object, key order
            kept): ``trajectories``, ``turns`` and ``policy_tokens`` cut by the length limit before
            scoring, for the coverage line (turns read come from ``num_turns``, the episode length),
            and optionally the limit itself: ``max_length`` (tokens), ``cut_by`` (``"max_length"``:
            ``--max-length``; ``"critic_context"``: the critic's context) and ``critic_context``
            (tokens), which the messages about over-long trajectories name (:func:`length_limit`).
        sampled: the trajectories are a sample of those read (``--limit`` left some out): a verdict
            by checkpoint names the latest checkpoint *sampled*, which need not be the run's latest.

    Returns:
        :class:`AuditResult`.

    Raises:
        SchemaError: policy tokens without a value (the critic was not run), or token rows whose
            trajectory is not in the trajectories table.
    """
    refuse_missing_values(tokens)
    sel = _select(tokens, config.scope)
    ids = trajectories["trajectory_id"]
    index = pl.DataFrame({"trajectory_id": ids, "_b": np.arange(len(ids), dtype=np.int64)})
    sel = sel.join(index, on="trajectory_id", how="left", maintain_order="left")
    orphan = sel.filter(pl.col("_b").is_null())
    if orphan.height:
        raise SchemaError(f"{orphan.height} token row(s) belong to trajectories missing from the trajectories table",
                          record=f"trajectory {orphan['trajectory_id'][0]!r}",
                          fix="write both tables from the same rollouts")
    stats = decompose(
        sel["_b"].to_numpy(), sel["seg"].to_numpy(), sel["value"].to_numpy(),
        num_trajectories=len(ids),
    )
    per = pl.concat([trajectories, stats], how="horizontal")
    return _finish(per, config, pre_excluded, sel.lazy(), fitted_ids, truncation, sampled)


def audit_parquet(
    trajectories: pl.DataFrame,
    tokens_path: str | Path,
    config: AuditConfig = AuditConfig(),
    *,
    pre_excluded: dict[str, str] | None = None,
    fitted_ids: Collection[str] | None = None,
    truncation: Truncation | Mapping[str, Any] | None = None,
    batch_rows: int = 1 << 20,
) -> AuditResult:
    """:func:`audit` for a tokens table on disk, streamed: memory stays bounded by ``batch_rows``.

    The per-trajectory statistics come from :func:`critic_audit.analysis.stream.decompose_parquet`
    (identical to :func:`audit`'s); critic quality from a streaming polars scan. Requires each
    trajectory's rows contiguous, positions increasing (any order of trajectories), with every policy
    token valued.

    Raises:
        SchemaError: a trajectory's rows split or positions not increasing, a policy token without a value, or token rows whose trajectory is
            not in ``trajectories``.
    """
    from critic_audit.analysis.stream import decompose_parquet

    stats = decompose_parquet(tokens_path, scope=config.scope, batch_rows=batch_rows)
    unknown = stats.join(trajectories.select("trajectory_id"), on="trajectory_id", how="anti").height
    if unknown:
        raise SchemaError(f"{unknown} trajectory id(s) in the tokens table are missing from the trajectories table",
                          path=str(tokens_path), fix="write both tables from the same rollouts")
    per = trajectories.join(stats, on="trajectory_id", how="left", maintain_order="left")
    per = per.with_columns(excluded=pl.when(pl.col("n_tokens").is_null()).then(pl.lit("no_tokens"))
                           .otherwise(pl.col("excluded")),
                           n_tokens=pl.col("n_tokens").fill_null(0), n_turns=pl.col("n_turns").fill_null(0),
                           n_boundary_steps=pl.col("n_boundary_steps").fill_null(0),
                           n_within_steps=pl.col("n_within_steps").fill_null(0))
    return _finish(per, config, pre_excluded, pl.scan_parquet(tokens_path), fitted_ids, truncation)


#: Per-trajectory sums of the critic-quality gate, as a streamed audit's trajectories.parquet holds them
#: (public name -> the column :func:`audit` computes from the tokens): policy tokens with a reward, and
#: the mean and the sum of squared deviations of ``reward - value`` over them (null without a reward).
QUALITY_SUMS = {"quality_n_tokens": "_qn", "quality_err_mean": "_qem", "quality_err_m2": "_qm2"}


def audit_from_sums(trajectories: pl.DataFrame, sums: np.ndarray, quality: np.ndarray,
                    config: AuditConfig = AuditConfig(), *, pre_excluded: dict[str, str] | None = None,
                    fitted_ids: Collection[str] | None = None,
                    truncation: Truncation | Mapping[str, Any] | None = None,
                    ready: Callable[[str, Any], None] | None = None) -> AuditResult:
    """:func:`audit` from per-trajectory sufficient statistics instead of the tokens table (a streamed
    audit: :class:`critic_audit.analysis.stream.AuditStream`).

    Args:
        trajectories: the trajectories table, B rows.
        sums: (B, :data:`critic_audit.analysis.decompose.NSUMS`) float64, row b = trajectory b's kernel
            sums (:func:`critic_audit.analysis.decompose.trajectory_sums`; zeros without tokens).
        quality: (B, 3) float64: policy tokens with a reward, mean and sum of squared deviations of
            ``reward - value`` over them (NaN without a reward or tokens).
        config, pre_excluded, fitted_ids, truncation: as :func:`audit`.
        ready: ``ready("per_trajectory", table)`` as soon as the per-trajectory table (the result's) is
            complete, before the summary's intervals and gates are computed, then
            ``ready("by_checkpoint", rows)`` with the summary's checkpoint breakdown before the other
            intervals (a streamed ``analyze`` draws its plots from them meanwhile, in another process).

    Returns:
        :class:`AuditResult`, its summary identical to :func:`audit`'s on the same tokens; the
        per-trajectory table also holds the quality sums (:data:`QUALITY_SUMS`, private names).
    """
    from critic_audit.analysis.decompose import statistics_frame

    per = pl.concat([trajectories, statistics_frame(sums)], how="horizontal")
    per = per.with_columns([pl.Series(name, quality[:, i], dtype=pl.Float64).fill_nan(None)
                            for i, name in enumerate(QUALITY_SUMS.values())])
    return _finish(per, config, pre_excluded, None, fitted_ids, truncation, ready=ready)


def audit_from_table(per: pl.DataFrame, config: AuditConfig = AuditConfig(), *,
                     truncation: Truncation | Mapping[str, Any] | None = None) -> AuditResult:
    """:func:`audit` again on the per-trajectory table a streamed audit wrote (its statistics and
    :data:`QUALITY_SUMS` columns): new bootstrap, thresholds and breakdowns, the same scope.

    Raises:
        SchemaError: a statistic or quality column is missing.
    """
    need = ["eta2", "reading_a", "n_tokens", "n_turns", *QUALITY_SUMS]
    missing = [c for c in need if c not in per.columns]
    if missing:
        raise SchemaError(f"trajectories table lacks the audit column(s) {missing}",
                          fix="pass an output folder written by critic-audit analyze")
    per = per.rename(QUALITY_SUMS).drop("turn_bucket", strict=False)
    return _finish(per, config, None, None, None, truncation)


def _finish(per: pl.DataFrame, config: AuditConfig, pre_excluded: dict[str, str] | None, tokens: pl.LazyFrame | None,
            fitted_ids: Collection[str] | None, truncation: Truncation | Mapping[str, Any] | None,
            sampled: bool = False, ready: Callable[[str, Any], None] | None = None) -> AuditResult:
    """Exclusions before scoring, turn buckets, and the summary, from the per-trajectory table
    (``ready``: told the completed table, then the checkpoint breakdown: :func:`audit_from_sums`)."""
    pre = pre_excluded or {}
    if pre:
        pre_df = pl.DataFrame({"trajectory_id": list(pre), "_pre": list(pre.values())},
                              schema={"trajectory_id": pl.String, "_pre": pl.String})
        per = per.join(pre_df, on="trajectory_id", how="left", maintain_order="left").with_columns(
            excluded=pl.coalesce("_pre", "excluded")).drop("_pre")
    per = per.with_columns(
        turn_bucket=pl.col("num_turns").map_elements(lambda k: _bucket_label(int(k), config.turn_buckets),
                                                      return_dtype=pl.String)
    )
    if ready is not None:
        ready("per_trajectory", per)
    tr = truncation if truncation is None or isinstance(truncation, Truncation) else Truncation.from_dict(truncation)
    inc = per.filter(pl.col("excluded").is_null())
    whole = _group_stats(per, config)
    medians = {}
    clusters = cluster_codes(inc)
    medians_ci = {}
    for col in ("omega2", "icc1", "f_stat"):
        vals = inc[col].fill_nan(None).drop_nulls()
        medians[col] = _num(float(np.median(vals.to_numpy())) if vals.len() else None)
        medians_ci[col] = _ci_entry(inc[col].fill_null(float("nan")).to_numpy(), "median", config, clusters)
    qper = per if tokens is None else _with_token_sums(per, tokens)  # None: the sums are columns of per
    by_checkpoint = _by_checkpoint(qper, config, fitted_ids)  # (each interval and gate seeded: any order)
    if ready is not None:
        ready("by_checkpoint", by_checkpoint)
    summary = AuditSummary(
        truncated=tr, scope=config.scope, n_trajectories=per.height, n_included=inc.height,
        excluded=dict(Counter(x for x in per["excluded"].to_list() if x is not None)),
        n_turns_included=int(inc["n_turns"].sum()) if inc.height else 0,
        n_tokens_included=int(inc["n_tokens"].sum()) if inc.height else 0,
        coverage=coverage(per, tr, config),
        eta2_median=whole.eta2_median, frac_ss_between_gt_within=whole.frac_ss_between_gt_within,
        frac_var_turn_means_gt_mean_within_var=_frac_entry(inc["reading_b"], clusters),
        frac_f_gt_1=_frac_entry(inc["reading_c"], clusters),
        omega2_median=medians["omega2"], icc1_median=medians["icc1"], f_stat_median=medians["f_stat"],
        medians_ci=medians_ci, boundary=_boundary(inc, config, clusters), critic_quality=_quality(qper, config, fitted_ids),
        by_success=breakdown(per, "success", config), by_source=breakdown(per, "source", config),
        by_checkpoint=by_checkpoint, by_turn_bucket=breakdown(per, "turn_bucket", config),
        breakdowns={col: breakdown(per, col, config) for col in config.group_by} or None,
        min_group_n=config.min_group_n, paper_reference=PAPER_REFERENCE)
    return AuditResult(per, dataclasses.replace(summary, recommendation=_headline_verdict(summary, config, sampled)))


def _boundary(inc: pl.DataFrame, config: AuditConfig | None = None, clusters: np.ndarray | None = None) -> Boundary:
    """Value changes at turn boundaries against those within turns, over the included trajectories; with
    ``config``, each ratio's 95% bootstrap interval over trajectories (or ``clusters``: whole clusters), the
    ratio of the resample's sums (:func:`critic_audit.analysis.clusters.bootstrap_sums_ci`)."""
    b_abs, w_abs = inc["boundary_abs"].sum(), inc["within_abs"].sum()
    n_b, n_w = inc["n_boundary_steps"].sum(), inc["n_within_steps"].sum()
    out = Boundary(
        share_of_abs_variation=_num(b_abs / (b_abs + w_abs)) if (b_abs + w_abs) else None,
        mean_boundary_over_mean_within_step=_num((b_abs / n_b) / (w_abs / n_w)) if n_b and n_w and w_abs else None,
        n_boundary_steps=int(n_b), n_within_steps=int(n_w))
    if config is None or inc.height < 2:
        return out
    cols = inc.select(pl.col("boundary_abs", "within_abs", "n_boundary_steps", "n_within_steps")
                      .cast(pl.Float64).fill_null(0.0)).to_numpy()
    share, ratio = bootstrap_sums_ci(cols, clusters, (lambda t: t[:, 0] / (t[:, 0] + t[:, 1]),
                                                      lambda t: (t[:, 0] / t[:, 2]) / (t[:, 1] / t[:, 3])),
                                     n_boot=config.n_boot, seed=config.seed)
    return dataclasses.replace(out, share_ci95=share[1:] if share else None, step_ratio_ci95=ratio[1:] if ratio else None,
                               resampled=("clusters" if clusters is not None else "trajectories")
                               if share or ratio else None)


def _headline_verdict(summary: AuditSummary, config: AuditConfig, sampled: bool = False) -> Recommendation:
    """:func:`recommend` on the pooled numbers; with several checkpoints (different critics, whose
    pooled numbers mix them) the verdict is the latest checkpoint's, the pooled one kept beside it
    (``sampled``: of a ``--limit`` sample, so the latest checkpoint *sampled*, and the text says so)."""
    pooled = recommend(summary, config)
    rows = summary.by_checkpoint or {}
    if len(rows) < 2 or pooled.verdict == "not_assessed":
        return pooled
    key = next((k for k in reversed(rows) if k != "unknown"), list(rows)[-1])
    row = rows[key]
    n_aud = sum(1 for r in rows.values() if r.n_included)
    lead = (f"{n_aud} checkpoints audited"
            + (f" ({len(rows) - n_aud} more with no audited trajectory)" if n_aud < len(rows) else "")
            + ", each critic judged on its own rollouts (see the table by checkpoint); the pooled numbers mix "
            "different critics. ")
    latest = "latest checkpoint sampled" if sampled else "latest checkpoint"
    # the pooled numbers mix different critics: kept for reference, never a confident verdict of their own
    beside = {"checkpoint": key, "pooled": PooledVerdict(verdict=pooled.verdict, confident=False, mixes_critics=True,
                                                         confident_if_one_critic=pooled.confident)}
    if row.low_n or not row.recommendation:
        return dataclasses.replace(
            pooled, verdict="not_enough_data", confident=False,
            text=lead + f"The {latest}, {key}, has {row.n_included} audited trajectories (< {config.min_group_n}): "
                        "no verdict.",
            reasons=(f"{latest} {key}: {row.n_included} audited trajectories < {config.min_group_n}",), **beside)
    r = row.recommendation
    return dataclasses.replace(r, text=lead + f"{latest.capitalize()}, {key}: {r.text}", **beside)


#: Verdicts that recommend a credit granularity; every other verdict says why none is given.
CONFIDENT_VERDICTS = ("turn_level", "token_level", "multiscale")

#: Every verdict :func:`recommend` gives.
VERDICTS = ("no_data", "not_assessed", "quality_unmeasured", "not_enough_data", "critic_too_weak",
            "inconclusive", *CONFIDENT_VERDICTS)


def coverage(per: pl.DataFrame, truncation: Truncation | None, config: AuditConfig = AuditConfig()) -> Coverage:
    """What share of the rollouts the headline rests on: trajectories, assistant turns and policy tokens
    audited out of those read.

    Turns read are the episodes' real lengths (``num_turns`` of the trajectories table, before any
    truncation); policy tokens read are those tokenized, plus those ``--max-length`` cut
    (``truncation.policy_tokens``). Returns :class:`Coverage`: ``trajectories``, ``turns`` and ``tokens``
    (each a :class:`Share`), ``low`` (turn share below ``config.low_coverage``) and ``warning``.
    """
    tr = truncation or Truncation()
    inc = per.filter(pl.col("excluded").is_null())

    def entry(audited: int, read: int) -> Share:
        return Share(audited=audited, read=read, share=_num(audited / read) if read else None)

    turns_audited = int(inc["n_turns"].sum()) if inc.height else 0
    if config.scope != "assistant":  # groups include user/tool segments: count the assistant turns kept
        turns_audited = int(inc["num_turns"].sum()) if inc.height else 0
    turns = entry(turns_audited, int(per["num_turns"].sum()) if per.height else 0)
    low = turns.share is not None and turns.share < config.low_coverage
    warning = None
    if low:
        why = []
        limit = length_limit(tr) or "the length limit"
        if tr.turns:
            why.append(f"{tr.turns} cut by {limit}")
        if per.height - inc.height:
            n_long = int(per["excluded"].is_in(list(OVERLONG_EXCLUSIONS)).sum())
            why.append(f"{per.height - inc.height} trajectories excluded"
                       + (f", {n_long} of them longer than {limit}" if n_long else ""))
        why_s = f" ({'; '.join(why)})" if why else ""
        warning = (f"no assistant turn was audited{why_s}" if not turns.audited else
                   f"only {turns.audited} of {turns.read} assistant turns ({100 * turns.share:.1f}%) were "
                   f"audited{why_s}: the figures describe the turns kept, which may not represent whole episodes")
    return Coverage(trajectories=entry(inc.height, per.height), turns=turns,
                    tokens=entry(int(inc["n_tokens"].sum()) if inc.height else 0,
                                 (int(per["n_tokens"].sum()) if per.height else 0) + int(tr.policy_tokens or 0)),
                    low=low, warning=warning)


def coverage_labels(scope: str) -> dict[str, str]:
    """What the coverage counts are of, in words, by scope: ``{"turns", "tokens", "groups"}``.

    ``assistant``: the groups are the assistant turns, the tokens the policy tokens. ``all``: the
    tokens are every scored token (policy and user/tool/template), the groups add the non-assistant
    runs, and the turn count is the assistant turns of the audited trajectories."""
    if scope == "assistant":
        return {"turns": "assistant turns", "tokens": "policy tokens", "groups": "groups (assistant turns)"}
    return {"turns": "assistant turns (in audited trajectories)", "tokens": "tokens (every scored token, not only policy)",
            "groups": "groups (assistant turns and user/tool/template runs)"}


#: Exclusions of trajectories longer than the length limit (critic_audit.turns).
OVERLONG_EXCLUSIONS = ("overlong_no_complete_turn", "overlong_dropped")


def length_limit(truncation: Truncation | None) -> str | None:
    """The limit that cut over-long trajectories, in words: ``"--max-length N"`` when ``--max-length``
    set it, ``"the critic's context (N tokens)"`` when the critic's did; None when unknown."""
    n = truncation.max_length if truncation else None
    if n is None:
        return None
    return f"--max-length {n}" if truncation.cut_by == "max_length" else f"the critic's context ({n} tokens)"


def overlong_note(truncation: Truncation | None, excluded: Mapping[str, int]) -> str | None:
    """One sentence on the trajectories the length limit cut or excluded, naming the limit and the fix;
    its counts are those of ``excluded`` (``overlong_*``) and ``truncation.trajectories``. None when
    the limit cut nothing."""
    truncation = truncation or Truncation()
    no_turn, dropped = excluded.get("overlong_no_complete_turn", 0), excluded.get("overlong_dropped", 0)
    kept = int(truncation.trajectories or 0)
    if not (no_turn or dropped or kept):
        return None
    limit = length_limit(truncation) or "the length limit"
    parts = ([f"{kept} truncated to it (kept, later turns dropped)"] if kept else []) + \
        ([f"{no_turn} excluded (not one complete assistant turn fits: overlong_no_complete_turn)"] if no_turn else []) + \
        ([f"{dropped} dropped (--overlong drop: overlong_dropped)"] if dropped else [])
    ctx = truncation.critic_context
    if truncation.cut_by == "max_length" and ctx and (ctx if truncation.max_length is None else truncation.max_length) < ctx:
        fix = f"raise --max-length (up to the critic's context, {ctx} tokens)"
    elif ctx:
        fix = f"use a critic with a longer context (this one reads {ctx} tokens)"
    else:
        fix = "raise --max-length up to the critic's context, or use a critic with a longer context"
    if dropped:
        fix += ", or --overlong truncate to keep the complete turns that fit"
    if not (no_turn or dropped):
        return f"{kept} {'trajectory is' if kept == 1 else 'trajectories are'} longer than {limit}: {parts[0]}."
    total = kept + no_turn + dropped
    return (f"{total} {'trajectory is' if total == 1 else 'trajectories are'} longer than {limit}: "
            f"{', '.join(parts)}; to audit them, {fix}.")


def _by_checkpoint(per: pl.DataFrame, config: AuditConfig, fitted_ids: Collection[str] | None) -> dict[str, Breakdown]:
    """The checkpoint breakdown; with several checkpoints (a training run's critics) each row is
    ``judged``: with at least ``min_group_n`` audited trajectories it gets its own critic quality and
    verdict, below that a None verdict."""
    rows = breakdown(per, "checkpoint", config)
    if len(rows) < 2:
        return rows
    parts = {("unknown" if k[0] is None else str(k[0])): g
             for k, g in per.partition_by("checkpoint", as_dict=True, maintain_order=True).items()}
    for key, row in rows.items():
        if row.low_n:
            rows[key] = dataclasses.replace(row, judged=True, recommendation=None)
            continue
        part = parts[key]
        inc = part.filter(pl.col("excluded").is_null())
        clusters = cluster_codes(inc)
        row = dataclasses.replace(row, judged=True, critic_quality=_quality(part, config, fitted_ids, per_source=False),
                                  frac_var_turn_means_gt_mean_within_var=_frac_entry(inc["reading_b"], clusters),
                                  frac_f_gt_1=_frac_entry(inc["reading_c"], clusters))
        own = AuditSummary(eta2_median=row.eta2_median, frac_ss_between_gt_within=row.frac_ss_between_gt_within,
                           critic_quality=row.critic_quality, excluded={})
        rows[key] = dataclasses.replace(row, recommendation=recommend(own, config))
    return rows


def recommend(summary: AuditSummary, config: AuditConfig = AuditConfig()) -> Recommendation:
    """A plain recommendation on credit granularity from the headline (``summary``: its ``eta2_median``,
    ``frac_ss_between_gt_within``, ``critic_quality.gate``, ``coverage``, ``excluded`` and ``truncated``)
    and the critic's quality gate.

    Rules ([ours]; thresholds in :class:`AuditConfig`, stated in the output), in order:

    1. nothing audited: ``no_data``, with the exclusions; ``--scope all``: ``not_assessed``.
    2. no reward varies: ``quality_unmeasured``.
    3. fewer than ``min_per_outcome`` judged trajectories with one of the outcomes: ``not_enough_data``.
    4. the gate fails (:mod:`critic_audit.analysis.quality`: the correlation of mean value and reward
       not positive, below ``min_corr`` or not significant at ``alpha``; the explained variance below
       ``min_explained_variance`` or its 95% interval reaching 0): ``critic_too_weak``.
    5. Median eta2 and fraction (a) both >= ``turn_level_eta2``: ``turn_level`` (MPO's turn GAE,
       arXiv:2610.35013).
    6. Median eta2 <= ``token_level_eta2``: ``token_level`` (PPO/GAE, or MPO with beta = 1).
    7. Otherwise ``multiscale`` (MPO with the intra-turn refinement, beta = 1).
    8. Rules 5-7 are applied to the point estimates, then to their 95% intervals (median eta2:
       bootstrap; fraction (a): Wilson): when the interval of a figure the verdict rests on contains
       its threshold (or there is no interval), the verdict is ``inconclusive`` (not confident; ``leans``
       holds the point estimates' verdict, the text says to audit more rollouts). ``multiscale`` rests
       on median eta2 against ``token_level_eta2`` and on median eta2 or fraction (a) against
       ``turn_level_eta2`` (either one clearly below suffices).
    9. Intervals from fewer than ``MIN_CONFIDENT_BOOTSTRAP`` (200) bootstrap resamples (``n_boot``) support
       no confident verdict: ``inconclusive`` (``leans`` the estimates' verdict; the text asks for
       ``--bootstrap 2000``).

    Returns :class:`Recommendation` (``verdict``, ``confident``, ``text``, ``reasons``, ``thresholds``;
    ``inconclusive`` adds ``leans``); ``confident`` is True for the three credit verdicts only; their
    ``reasons`` list the deciding figures with their intervals against the thresholds.
    """
    g = config.gate
    th = {"turn_level_eta2": config.turn_level_eta2, "token_level_eta2": config.token_level_eta2,
          "min_explained_variance": g.min_explained_variance, "min_corr": g.min_corr,
          "min_per_outcome": g.min_per_outcome, "alpha": g.alpha}
    eta = summary.eta2_median.estimate if summary.eta2_median else None
    gate = (summary.critic_quality.gate if summary.critic_quality else None) or QualityGate()

    def out(verdict: str, text: str, reasons: Collection[str] = ()) -> Recommendation:
        cov = summary.coverage
        if verdict in CONFIDENT_VERDICTS and cov and cov.low:
            text += f" Caution: {cov.warning}."
        return Recommendation(verdict=verdict, confident=verdict in CONFIDENT_VERDICTS, text=text,
                              reasons=tuple(reasons), thresholds=th)

    if eta is None:
        exc = summary.excluded or {}
        why = ", ".join(f"{k}: {v}" for k, v in sorted(exc.items())) or "no trajectories"
        flat = " The critic gives every token the same value (flat_critic): it carries no signal." \
            if exc and set(exc) == {"flat_critic"} else ""
        long_ = overlong_note(summary.truncated, exc)
        return out("no_data", f"No trajectory could be audited ({why}).{flat}{' ' + long_ if long_ else ''}",
                   [f"excluded: {why}"])
    if config.scope != "assistant":
        return out("not_assessed", (f"With --scope {config.scope} the groups include user/tool/template segments, so "
                                    "the numbers describe the whole sequence, not the policy's turns; the "
                                    "recommendation on credit granularity is made with --scope assistant."))
    status = gate.status
    reasons = list(gate.reasons)
    if status in (None, "unmeasured"):
        return out("quality_unmeasured", (f"The critic's quality could not be measured (no rewards, or rewards "
                                          f"that do not vary within any source), so the structure of its values "
                                          f"(median eta2 {eta:.3f}) is reported without a recommendation."), reasons)
    if status == "not_enough_data":
        return out("not_enough_data", (f"Not enough data to judge the critic: {'; '.join(reasons)}. The structure "
                                       f"of its values (median eta2 {eta:.3f}) is reported without a "
                                       "recommendation; audit more rollouts with both outcomes."), reasons)
    if status != "passed":
        return out("critic_too_weak", (f"The critic does not explain the outcome ({'; '.join(reasons)}), so the "
                                       f"structure of its values (median eta2 {eta:.3f}) is not evidence for a "
                                       "credit granularity. Train or fit a stronger critic, then audit again."),
                   reasons)
    return _credit_verdict(summary, config, out)


def _side(entry: Interval | Fraction | None, threshold: float, *, strict_above: bool) -> tuple[str, str]:
    """Where a figure lies against a threshold: ``("above" | "below" | "straddles", its text)``.

    ``strict_above`` False: "above" means ``>= threshold`` (median eta2 and fraction (a) against
    ``turn_level_eta2``); True: "above" means ``> threshold`` (median eta2 against ``token_level_eta2``,
    "below" being ``<= threshold``). The figure is decided only when its whole 95% interval lies on one
    side; an interval that contains the threshold, or no interval (fewer than 2 trajectories), is
    ``"straddles"``."""
    est = entry.estimate if entry else None
    ci = entry.ci95 if entry else None
    if ci is None or ci[0] is None or ci[1] is None:
        few = "clusters (groups / tasks)" if isinstance(entry, Interval) and entry.n_clusters is not None \
            else "trajectories"
        return "straddles", f"{est:.3f} (no interval: fewer than 2 {few})"
    lo, hi = float(ci[0]), float(ci[1])
    text = f"{est:.3f} [{lo:.3f}, {hi:.3f}]"
    if (lo > threshold) if strict_above else (lo >= threshold):
        return "above", text
    if (hi <= threshold) if strict_above else (hi < threshold):
        return "below", text
    return "straddles", text


def _credit_verdict(summary: AuditSummary, config: AuditConfig, out: Any) -> Recommendation:
    """Rules 5-8 of :func:`recommend`: the credit verdict of a critic that passed the gate, confident
    only when the 95% interval of every figure it rests on lies on one side of its threshold."""
    eta_e, frac_e = summary.eta2_median or Interval(), summary.frac_ss_between_gt_within or Fraction()
    eta, frac = eta_e.estimate, frac_e.estimate
    hi_t, lo_t = config.turn_level_eta2, config.token_level_eta2
    eta_hi, eta_hi_s = _side(eta_e, hi_t, strict_above=False)
    eta_lo, _ = _side(eta_e, lo_t, strict_above=True)
    if frac is None:
        frac_hi, frac_s = "straddles", "n/a"
    else:
        frac_hi, frac_s = _side(frac_e, hi_t, strict_above=False)
    eta_name, frac_name = "median eta2", "fraction (a) SS_B > SS_W"
    # the point estimates' verdict (rules 5-7 on the estimates alone)
    if eta >= hi_t and (frac or 0) >= hi_t:
        leans = "turn_level"
    elif eta <= lo_t:
        leans = "token_level"
    else:
        leans = "multiscale"
    # which figures decide it, and does each interval clear its threshold? (figure, threshold) pairs
    straddling: list[tuple[str, float]] = []
    if leans == "turn_level":
        reasons = [f"{eta_name} {eta_hi_s} >= {hi_t}", f"{frac_name} {frac_s} >= {hi_t}"]
        straddling += [(f"{eta_name} {eta_hi_s}", hi_t)] if eta_hi != "above" else []
        straddling += [(f"{frac_name} {frac_s}", hi_t)] if frac_hi != "above" else []
    elif leans == "token_level":
        reasons = [f"{eta_name} {eta_hi_s} <= {lo_t}"]
        straddling += [(f"{eta_name} {eta_hi_s}", lo_t)] if eta_lo != "below" else []
    else:
        # multiscale: clearly above the token-level threshold, and clearly short of turn level
        # (median eta2 or fraction (a) below turn_level_eta2; one of them clearly below suffices)
        reasons = [f"{eta_name} {eta_hi_s} > {lo_t}"]
        straddling += [(f"{eta_name} {eta_hi_s}", lo_t)] if eta_lo != "above" else []
        short = [(f"{eta_name} {eta_hi_s}", eta_hi)] if eta < hi_t else []
        short += [(f"{frac_name} {frac_s}", frac_hi)] if frac is not None and frac < hi_t else []
        clear = [f"{t} < {hi_t}" for t, side in short if side == "below"]
        reasons += clear or [f"{t} < {hi_t}" for t, _ in short]
        straddling += [] if clear else [(t, hi_t) for t, _ in short]
    if not straddling and config.n_boot < MIN_CONFIDENT_BOOTSTRAP:
        rec = out("inconclusive", (
            f"Inconclusive: the 95% intervals come from only {config.n_boot} bootstrap resample(s) (fewer than "
            f"{MIN_CONFIDENT_BOOTSTRAP}), too few to rest a confident verdict on. The point estimates lean to "
            f"{leans} (median eta2 {eta:.3f}" + (f", {100 * frac:.1f}% of trajectories with SS_B > SS_W" if frac is not None
                                                  else "") + f"); rerun with --bootstrap 2000."),
            [f"bootstrap resamples {config.n_boot} < {MIN_CONFIDENT_BOOTSTRAP}"]
            + [f"point estimates ({leans}): {r}" for r in reasons])
        return dataclasses.replace(rec, leans=leans)
    if straddling:
        which = " and ".join(f"{fig} contains {t}" for fig, t in straddling)
        rec = out("inconclusive", (
            f"Inconclusive: the 95% interval of {which}, so these rollouts cannot settle the credit granularity. "
            f"The point estimates lean to {leans} (median eta2 {eta:.3f}"
            + (f", {100 * frac:.1f}% of trajectories with SS_B > SS_W" if frac is not None else "")
            + "); audit more rollouts to narrow the intervals."),
            [f"interval contains the threshold: {fig} vs {t}" for fig, t in straddling]
            + [f"point estimates ({leans}): {r}" for r in reasons])
        return dataclasses.replace(rec, leans=leans)
    if leans == "turn_level":
        return out("turn_level", (f"Median eta2 {eta_hi_s} and {100 * frac:.1f}% of trajectories with SS_B > SS_W "
                                  f"(95% interval {frac_s}; both intervals >= {hi_t}): the value moves between "
                                  "turns, not inside them. Turn-level credit (MPO's turn GAE; a small beta) fits "
                                  "this critic."), reasons)
    if leans == "token_level":
        return out("token_level", (f"Median eta2 {eta_hi_s}, its 95% interval <= {lo_t}: most value variance lies "
                                   "inside turns. Keep token-level credit (PPO/GAE), or MPO with the intra-turn "
                                   "refinement on (beta = 1)."), reasons)
    text = "; ".join(reasons)
    return out("multiscale", (f"{text[0].upper()}{text[1:]} (95% intervals clear of the thresholds): the value moves both "
                              "between and inside turns. MPO with the intra-turn refinement (beta = 1) uses both "
                              "scales."), reasons)


def critic_quality(per_trajectory: pl.DataFrame, selected_tokens: pl.DataFrame, config: AuditConfig = AuditConfig(),
                   *, fitted_ids: Collection[str] | None = None) -> CriticQuality:
    """How well the critic predicts outcomes (AUDIT.md, "Critic quality"), and its quality gate.

    ``explained_variance`` pools every policy token of the included trajectories (target = the
    trajectory's reward: the Monte-Carlo return with gamma = 1 and an outcome reward);
    ``corr_mean_value_reward`` is the Pearson correlation of each trajectory's mean value with its reward;
    both are None when the rollouts carry no rewards. ``gate`` is
    :func:`critic_audit.analysis.quality.quality_gate` on the included trajectories with a reward that
    are not in ``fitted_ids`` (the critic's own fit data, when ``fit-critic`` recorded it);
    ``by_source`` the same per source when there are several.
    """
    return critic_quality_lazy(per_trajectory, selected_tokens.lazy(), config, fitted_ids=fitted_ids)


def critic_quality_lazy(per_trajectory: pl.DataFrame, tokens: pl.LazyFrame, config: AuditConfig = AuditConfig(),
                        *, fitted_ids: Collection[str] | None = None) -> CriticQuality:
    """:func:`critic_quality` over a lazy tokens table (streamed: one group-by over policy tokens)."""
    return _quality(_with_token_sums(per_trajectory, tokens), config, fitted_ids)


def _with_token_sums(per: pl.DataFrame, tokens: pl.LazyFrame) -> pl.DataFrame:
    """``per`` with ``_qn``, ``_qem``, ``_qm2``: each trajectory's policy tokens and the mean and the
    sum of squared deviations of ``reward - value`` over them (null without a reward)."""
    if "_b" in tokens.collect_schema().names():  # audit()'s rows carry their trajectory's row in per
        return _with_indexed_token_sums(per, tokens)
    err = pl.col("reward") - pl.col("value").cast(pl.Float64)
    sums = (tokens.filter(pl.col("response_mask") & pl.col("value").is_not_null())
            .select("trajectory_id", "value")
            .join(per.lazy().filter(pl.col("reward").is_not_null()).select("trajectory_id", "reward"),
                  on="trajectory_id", how="inner")
            .group_by("trajectory_id")
            .agg(_qn=pl.len().cast(pl.Float64), _qem=err.mean(), _qm2=((err - err.mean()) ** 2).sum())
            .collect(engine="streaming"))
    return per.join(sums, on="trajectory_id", how="left", maintain_order="left")


def _with_indexed_token_sums(per: pl.DataFrame, tokens: pl.LazyFrame) -> pl.DataFrame:
    """:func:`_with_token_sums` for tokens whose ``_b`` is the row of their trajectory in ``per`` (as
    :func:`audit` builds them): the same three sums with numpy ``bincount`` over ``_b``, no join on the
    string ids (a few arrays of the policy tokens instead of a joined copy of them)."""
    df = (tokens.filter(pl.col("response_mask") & pl.col("value").is_not_null())
          .select(pl.col("_b").cast(pl.Int64), pl.col("value").cast(pl.Float64)).collect())
    b, v = df["_b"].to_numpy(), df["value"].to_numpy()
    del df
    reward = per["reward"].cast(pl.Float64).fill_null(np.nan).to_numpy()
    r = reward[b]
    ok = ~np.isnan(r)
    b, err = b[ok], r[ok] - v[ok]
    n_rows = per.height
    n = np.bincount(b, minlength=n_rows).astype(np.float64)
    mean = np.bincount(b, weights=err, minlength=n_rows) / np.where(n > 0, n, 1.0)
    # sum of squared deviations from each trajectory's own mean (two passes, as err.mean() then the sum)
    m2 = np.bincount(b, weights=(err - mean[b]) ** 2, minlength=n_rows)
    have = n > 0
    return per.with_columns(_qn=pl.Series(np.where(have, n, np.nan)).fill_nan(None),
                            _qem=pl.Series(np.where(have, mean, np.nan)).fill_nan(None),
                            _qm2=pl.Series(np.where(have, m2, np.nan)).fill_nan(None))


def _gate_inputs(df: pl.DataFrame) -> TrajectorySums:
    strata = df.select(pl.col("source").cast(pl.String).fill_null(""),
                       pl.col("checkpoint").cast(pl.String).fill_null("")).hash_rows().to_numpy()
    reward = df["reward"].cast(pl.Float64).to_numpy()
    success = df["success"].drop_nulls().to_numpy().astype(bool) if df["success"].null_count() == 0 else None
    return TrajectorySums(stratum=np.unique(strata, return_inverse=True)[1] if strata.size else strata,
                          reward=reward, mean_value=df["value_mean"].cast(pl.Float64).to_numpy(),
                          n_tokens=df["_qn"].to_numpy(), err_mean=df["_qem"].to_numpy(),
                          err_m2=df["_qm2"].to_numpy(), positive=outcome_split(reward),
                          success=success, cluster=cluster_codes(df))


def _gate_config(config: AuditConfig) -> GateConfig:
    """The gate's thresholds with this audit's bootstrap resamples and seed."""
    return dataclasses.replace(config.gate, n_boot=config.n_boot, seed=config.seed)


def _quality(per: pl.DataFrame, config: AuditConfig, fitted_ids: Collection[str] | None = None,
             *, per_source: bool = True) -> CriticQuality:
    """Critic quality of the included, rewarded, valued trajectories of ``per`` (with token sums)."""
    inc = per.filter(pl.col("excluded").is_null() & pl.col("reward").is_not_null() & pl.col("_qn").is_not_null()
                     & pl.col("value_mean").is_finite())
    ev = corr = None
    if inc.height >= 2:
        n, em, m2, r = (inc[c].cast(pl.Float64).to_numpy() for c in ("_qn", "_qem", "_qm2", "reward"))
        ev, _ = pooled_ev(n, em, m2, r)
        mv = inc["value_mean"].to_numpy()
        corr = float(np.corrcoef(mv, r)[0, 1]) if np.std(mv) > 0 and np.std(r) > 0 else float("nan")
    held, fit_overlap = inc, None
    if fitted_ids:
        fit = pl.Series(list(fitted_ids), dtype=pl.String).implode()
        in_fit = inc["trajectory_id"].cast(pl.String).is_in(fit)
        n_overlap = int(in_fit.sum())
        held = inc.filter(~in_fit)
        fit_overlap = FitOverlap(n_in_fit_data=n_overlap, n_held_out=held.height,
                                 note=(f"{n_overlap} of these {inc.height} trajectories are the critic's own fit "
                                       "data (fit-critic): the gate judges the critic on the other "
                                       f"{held.height} only") if n_overlap else "none of these trajectories is in "
                                      "the critic's fit data")
    gate = quality_gate(_gate_inputs(held), _gate_config(config))
    overlap = fit_overlap.n_in_fit_data if fit_overlap else None
    if overlap and gate.status in ("unmeasured", "not_enough_data") and inc.height:
        gate = dataclasses.replace(gate, status="not_enough_data", reasons=(
            f"{overlap} of the {inc.height} audited trajectories are the critic's own fit data (fit-critic), where "
            f"its quality is in-sample; {held.height} are held out", *gate.reasons))
    by_source = None
    if per_source and held["source"].n_unique() > 1:
        by_source = {("unknown" if k is None else str(k)): quality_gate(
            _gate_inputs(held.filter(pl.col("source").is_null() if k is None else pl.col("source") == k)),
            _gate_config(config)) for k in sorted(held["source"].unique().to_list(), key=natural_key)}
    return CriticQuality(explained_variance=_num(ev), corr_mean_value_reward=_num(corr), n_trajectories=inc.height,
                         n_tokens=int(inc["_qn"].sum()) if inc.height else 0, fit_overlap=fit_overlap, gate=gate,
                         by_source=by_source)
