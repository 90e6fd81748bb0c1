"""The critic-structure audit over canonical tables: per-trajectory statistics, headline, breakdowns.

Definitions: docs/audit.md (eta-squared and the other one-way ANOVA statistics per
trajectory, exclusions, critic quality); the measurement it reproduces is the MPO paper's
(arXiv:2610.35013: median eta2 0.895, 93.8% of trajectories with SS_B > SS_W).
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from critic_audit.analysis.decompose import bootstrap_ci, decompose
from critic_audit.errors import ConfigError, SchemaError

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
        min_explained_variance: [ours] below this explained variance, and with
            ``|corr(mean V, reward)| < min_corr``, the critic is judged to explain too little for its
            structure to recommend anything.
        min_corr: [ours] see ``min_explained_variance``.
    """

    scope: str = "assistant"
    n_boot: int = 2000
    seed: int = 0
    turn_buckets: tuple[int, ...] = (2, 3, 5, 10, 20)
    group_by: tuple[str, ...] = ()
    turn_level_eta2: float = 0.7
    token_level_eta2: float = 0.3
    min_explained_variance: float = 0.05
    min_corr: float = 0.3

    def __post_init__(self) -> None:
        if self.scope not in SCOPES:
            raise ConfigError(f"unknown scope {self.scope!r}", fix="use --scope assistant or --scope all")
        if self.n_boot < 1:
            raise ConfigError(f"--bootstrap must be at least 1, got {self.n_boot}", fix="use e.g. --bootstrap 2000")


@dataclasses.dataclass
class AuditResult:
    """Output of :func:`audit`.

    Attributes:
        per_trajectory: one row per trajectory: the trajectories table's columns plus the statistics of
            :func:`critic_audit.analysis.decompose.decompose`.
        summary: the headline, exclusions, critic quality and breakdowns (JSON-serialisable).
    """

    per_trajectory: pl.DataFrame
    summary: dict[str, Any]


def _select(tokens: pl.DataFrame, scope: str) -> pl.DataFrame:
    """Tokens that enter the decomposition, with a per-trajectory segment index ``seg``."""
    t = tokens.sort(["trajectory_id", "position"], maintain_order=True)
    if scope == "assistant":
        return t.filter(pl.col("response_mask")).with_columns(seg=pl.col("turn").cast(pl.Int64))
    # scope all: each maximal run of response_mask within a trajectory is one segment
    t = t.filter(pl.col("value").is_not_null() | pl.col("response_mask"))
    change = (pl.col("response_mask") != pl.col("response_mask").shift(1)).fill_null(True)
    return t.with_columns(seg=change.cum_sum().over("trajectory_id").cast(pl.Int64))


def _bucket_label(k: int, edges: tuple[int, ...]) -> str:
    lo = 1
    for e in edges:
        if k <= e:
            return f"{lo}-{e}" if lo != e else f"{e}"
        lo = e + 1
    return f">{edges[-1]}"


def _group_stats(df: pl.DataFrame, config: AuditConfig) -> dict[str, Any]:
    inc = df.filter(pl.col("excluded").is_null())
    eta = inc["eta2"].to_numpy()
    out: dict[str, Any] = {"n": df.height, "n_included": inc.height}
    out["eta2_median"] = _ci_entry(eta, "median", config)
    out["frac_ss_between_gt_within"] = _ci_entry(inc["reading_a"].cast(pl.Float64).to_numpy(), "mean", config)
    return out


def _ci_entry(x: np.ndarray, stat: str, config: AuditConfig) -> dict[str, Any]:
    """``{"estimate", "ci95"}``; the interval is null with fewer than 2 trajectories (it would be 0 wide)."""
    est, lo, hi = bootstrap_ci(x, stat, n_boot=config.n_boot, seed=config.seed)
    n = int(np.isfinite(np.asarray(x, dtype=np.float64)).sum())
    return {"estimate": _num(est), "ci95": [_num(lo), _num(hi)] if n >= 2 else None}


def _num(x: Any) -> Any:
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def _natural_key(v: Any) -> tuple:
    """Natural order: numbers numerically, and strings by their text and number runs
    ("step_2" < "step_10"; turn buckets "1-2" < "3" < "11-20" < ">20"); nulls last."""
    import re

    if v is None:
        return (2,)
    if isinstance(v, (int, float, bool)):
        return (0, ((0, float(v), ""),))
    parts = re.split(r"(\d+(?:\.\d+)?)", str(v))
    return (1, tuple((0, float(p), "") if i % 2 else (1, 0.0, p) for i, p in enumerate(parts)))


def breakdown(per_trajectory: pl.DataFrame, by: str, config: AuditConfig = AuditConfig()) -> dict[str, Any]:
    """Headline statistics per value of a trajectory column (``success``, ``source``, ...) or of a
    field of the trajectories' ``metadata`` JSON (e.g. ``trial``), in natural order.

    Returns a dict ``{str(value): {"n", "n_included", "eta2_median", "frac_ss_between_gt_within"}}``;
    null values are labelled ``"unknown"``. Intervals of groups with fewer than 2 audited trajectories
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
    keys = sorted(per_trajectory[by].unique().to_list(), key=_natural_key)
    for key in keys:
        part = per_trajectory.filter(pl.col(by).is_null() if key is None else pl.col(by) == key)
        out["unknown" if key is None else str(key)] = _group_stats(part, config)
    return out


def audit(
    trajectories: pl.DataFrame,
    tokens: pl.DataFrame,
    config: AuditConfig = AuditConfig(),
    *,
    pre_excluded: dict[str, str] | None = None,
) -> AuditResult:
    """Decompose critic values into between-turn and within-turn variance, per trajectory and overall.

    Args:
        trajectories: the trajectories table (:data:`critic_audit.schema.TRAJECTORY_SCHEMA`), B rows.
        tokens: the tokens table (:data:`critic_audit.schema.TOKEN_SCHEMA`) with ``value`` filled for
            the policy tokens (``response_mask`` True; ``turn`` = assistant-turn index k).
        config: :class:`AuditConfig`.
        pre_excluded: trajectory id -> reason for trajectories excluded before scoring (no assistant
            turn, over-long); they count in the exclusions but have no token rows.

    Returns:
        :class:`AuditResult`.

    Raises:
        SchemaError: policy tokens without a value (the critic was not run), or token rows whose
            trajectory is not in the trajectories table.
    """
    sel = _select(tokens, config.scope)
    missing = sel.filter(pl.col("response_mask") & pl.col("value").is_null()).height
    if missing:
        raise SchemaError(f"{missing} policy token(s) have no critic value",
                          fix="pass --critic to score them, or fill the value column")
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
    return _finish(per, config, pre_excluded, critic_quality(per, sel))


def audit_parquet(
    trajectories: pl.DataFrame,
    tokens_path: str | Path,
    config: AuditConfig = AuditConfig(),
    *,
    pre_excluded: dict[str, str] | None = None,
    batch_rows: int = 1 << 20,
) -> AuditResult:
    """:func:`audit` for a tokens table on disk, streamed: memory stays bounded by ``batch_rows``.

    The per-trajectory statistics come from :func:`critic_audit.analysis.stream.decompose_parquet`
    (identical to :func:`audit`'s); critic quality from a streaming polars scan. Requires the table
    sorted by ``(trajectory_id, position)`` with every policy token valued.

    Raises:
        SchemaError: unsorted rows, a policy token without a value, or token rows whose trajectory is
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
    return _finish(per, config, pre_excluded, critic_quality_lazy(per, pl.scan_parquet(tokens_path)))


def _finish(per: pl.DataFrame, config: AuditConfig, pre_excluded: dict[str, str] | None,
            quality: dict[str, Any]) -> AuditResult:
    """Exclusions before scoring, turn buckets, and the summary, from the per-trajectory table."""
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

    inc = per.filter(pl.col("excluded").is_null())
    summary: dict[str, Any] = {
        "scope": config.scope,
        "n_trajectories": per.height,
        "n_included": inc.height,
        "excluded": dict(Counter(x for x in per["excluded"].to_list() if x is not None)),
        "n_turns_included": int(inc["n_turns"].sum()) if inc.height else 0,
        "n_tokens_included": int(inc["n_tokens"].sum()) if inc.height else 0,
    }
    summary.update({k: v for k, v in _group_stats(per, config).items() if k not in ("n", "n_included")})
    for reading, label in (("reading_b", "frac_var_turn_means_gt_mean_within_var"), ("reading_c", "frac_f_gt_1")):
        summary[label] = _ci_entry(inc[reading].cast(pl.Float64).to_numpy(), "mean", config)
    for col in ("omega2", "icc1", "f_stat"):
        vals = inc[col].fill_nan(None).drop_nulls()
        summary[f"{col}_median"] = _num(float(np.median(vals.to_numpy())) if vals.len() else None)
    b_abs, w_abs = inc["boundary_abs"].sum(), inc["within_abs"].sum()
    n_b, n_w = inc["n_boundary_steps"].sum(), inc["n_within_steps"].sum()
    summary["boundary"] = {
        "share_of_abs_variation": _num(b_abs / (b_abs + w_abs)) if (b_abs + w_abs) else None,
        "mean_boundary_over_mean_within_step": _num((b_abs / n_b) / (w_abs / n_w)) if n_b and n_w and w_abs else None,
        "n_boundary_steps": int(n_b),
        "n_within_steps": int(n_w),
    }
    summary["critic_quality"] = quality
    summary["by_success"] = breakdown(per, "success", config)
    summary["by_source"] = breakdown(per, "source", config)
    summary["by_checkpoint"] = breakdown(per, "checkpoint", config)
    summary["by_turn_bucket"] = breakdown(per, "turn_bucket", config)
    for col in config.group_by:
        summary.setdefault("breakdowns", {})[col] = breakdown(per, col, config)
    summary["paper_reference"] = PAPER_REFERENCE
    summary["recommendation"] = recommend(summary, config)
    return AuditResult(per, summary)


def recommend(summary: dict[str, Any], config: AuditConfig = AuditConfig()) -> dict[str, Any]:
    """A plain recommendation on credit granularity from the headline and the critic's quality.

    Rules ([ours]; thresholds in :class:`AuditConfig`, stated in the output):

    1. The critic explains too little (explained variance < ``min_explained_variance`` and
       ``|corr(mean V, reward)| < min_corr``, or no rewards to judge it): no recommendation from
       structure; improve or train the critic first.
    2. Median eta2 and fraction (a) both >= ``turn_level_eta2``: the value moves between turns; turn-level
       credit (MPO's turn GAE, arXiv:2610.35013) fits.
    3. Median eta2 <= ``token_level_eta2``: the value moves mostly inside turns; keep token-level credit
       (PPO/GAE), or MPO with the intra-turn refinement on (beta = 1).
    4. Otherwise: both scales carry variance; MPO with the intra-turn refinement (beta = 1).

    Returns ``{"verdict", "text", "thresholds"}``; verdict is one of ``critic_too_weak``,
    ``turn_level``, ``token_level``, ``multiscale``, ``no_data``, ``quality_unmeasured`` (no usable
    rewards) and ``not_assessed`` (``--scope all``).
    """
    th = {"turn_level_eta2": config.turn_level_eta2, "token_level_eta2": config.token_level_eta2,
          "min_explained_variance": config.min_explained_variance, "min_corr": config.min_corr}
    eta = (summary.get("eta2_median") or {}).get("estimate")
    frac = (summary.get("frac_ss_between_gt_within") or {}).get("estimate")
    q = summary.get("critic_quality") or {}
    ev, corr = q.get("explained_variance"), q.get("corr_mean_value_reward")
    if eta is None:
        return {"verdict": "no_data", "text": "No trajectory could be audited (see the exclusions).", "thresholds": th}
    if config.scope != "assistant":
        return {"verdict": "not_assessed",
                "text": (f"With --scope {config.scope} the groups include user/tool/template segments, so the "
                         "numbers describe the whole sequence, not the policy's turns; the recommendation on credit "
                         "granularity is made with --scope assistant."), "thresholds": th}
    if ev is None and corr is None:
        return {"verdict": "quality_unmeasured",
                "text": (f"The critic's quality could not be measured (no rewards, rewards all equal, or fewer than "
                         f"2 audited trajectories with rewards), so the structure of its values (median eta2 "
                         f"{eta:.3f}) is reported without a recommendation."), "thresholds": th}
    weak = ((ev is None or ev < config.min_explained_variance) and (corr is None or abs(corr) < config.min_corr))
    if weak:
        ev_s = "n/a" if ev is None else f"{ev:.3f}"
        corr_s = "n/a" if corr is None else f"{corr:.3f}"
        text = (f"The critic explains too little of the outcome (explained variance {ev_s} < "
                f"{config.min_explained_variance}, |corr(mean V, reward)| {corr_s} < {config.min_corr}), so the "
                f"structure of its values (median eta2 {eta:.3f}) is not evidence for a credit granularity. "
                "Train or fit a stronger critic, then audit again.")
        return {"verdict": "critic_too_weak", "text": text, "thresholds": th}
    if eta >= config.turn_level_eta2 and (frac or 0) >= config.turn_level_eta2:
        text = (f"Median eta2 {eta:.3f} and {100 * frac:.1f}% of trajectories with SS_B > SS_W (both >= "
                f"{config.turn_level_eta2}): the value moves between turns, not inside them. Turn-level credit "
                "(MPO's turn GAE; a small beta) fits this critic.")
        return {"verdict": "turn_level", "text": text, "thresholds": th}
    if eta <= config.token_level_eta2:
        text = (f"Median eta2 {eta:.3f} <= {config.token_level_eta2}: most value variance lies inside turns. "
                "Keep token-level credit (PPO/GAE), or MPO with the intra-turn refinement on (beta = 1).")
        return {"verdict": "token_level", "text": text, "thresholds": th}
    text = (f"Median eta2 {eta:.3f} lies between {config.token_level_eta2} and {config.turn_level_eta2}: both "
            "scales carry variance. MPO with the intra-turn refinement (beta = 1) uses both.")
    return {"verdict": "multiscale", "text": text, "thresholds": th}


def critic_quality(per_trajectory: pl.DataFrame, selected_tokens: pl.DataFrame) -> dict[str, Any]:
    """How well the critic predicts outcomes on the same rollouts (AUDIT.md, "Critic quality").

    ``explained_variance`` pools every policy token of the included trajectories (target = the
    trajectory's reward: the Monte-Carlo return with gamma = 1 and an outcome reward);
    ``corr_mean_value_reward`` is the Pearson correlation of each trajectory's mean value with its reward.
    Both are None when the rollouts carry no rewards.
    """
    return critic_quality_lazy(per_trajectory, selected_tokens.lazy())


def critic_quality_lazy(per_trajectory: pl.DataFrame, tokens: pl.LazyFrame) -> dict[str, Any]:
    """:func:`critic_quality` over a lazy tokens table (streamed: five running sums over policy tokens)."""
    inc = per_trajectory.filter(pl.col("excluded").is_null() & pl.col("reward").is_not_null())
    if inc.height < 2:
        return {"explained_variance": None, "corr_mean_value_reward": None, "n_trajectories": inc.height}
    # EV = 1 - Var(R - V) / Var(R), pooled over tokens, from running sums (float64)
    sums = (tokens.filter(pl.col("response_mask"))
            .join(inc.lazy().select("trajectory_id", "reward"), on="trajectory_id", how="inner")
            .select(n=pl.len(), sr=pl.col("reward").sum(), srr=(pl.col("reward") ** 2).sum(),
                    se=(pl.col("reward") - pl.col("value").cast(pl.Float64)).sum(),
                    see=((pl.col("reward") - pl.col("value").cast(pl.Float64)) ** 2).sum())
            .collect(engine="streaming").row(0, named=True))
    n = sums["n"]
    var_r = sums["srr"] / n - (sums["sr"] / n) ** 2 if n else 0.0
    var_e = sums["see"] / n - (sums["se"] / n) ** 2 if n else 0.0
    ev = 1.0 - var_e / var_r if n and var_r > 1e-12 * max(1.0, sums["srr"] / n) else float("nan")
    mv, rw = inc["value_mean"].to_numpy(), inc["reward"].to_numpy()
    corr = float(np.corrcoef(mv, rw)[0, 1]) if np.std(mv) > 0 and np.std(rw) > 0 else float("nan")
    return {
        "explained_variance": _num(ev),
        "corr_mean_value_reward": _num(corr),
        "n_trajectories": inc.height,
        "n_tokens": int(n),
    }
