"""Inference-time signal: does a sharp change of the turn-level value predict failure?

Definition: docs/audit.md, section "Inference-time signal". A practitioner proposal: use the
turn-level value as a cheap anomaly signal at inference; when one turn's value departs sharply from the
previous turns, retry or hand the episode to a person. This module scores every turn and measures how
well the score separates failed from successful trajectories (AUROC), so a team can decide whether the
signal is worth wiring in. Library code: no typer or rich.

For trajectory b with turn means ``m_0, ..., m_{K-1}`` (mean critic value over the turn's policy
tokens), each turn k >= 1 gets a change::

    reference "previous"      d_k = m_k - m_{k-1}                       (default)
    reference "running_mean"  d_k = m_k - mean(m_0, ..., m_{k-1})      [ours]

(the running mean is the unweighted mean of the previous turn means: each turn counts once, whatever
its length). Over every scored turn of the whole data set, or of each checkpoint when the trajectories
carry several (``checkpoint`` column: each checkpoint's critic has its own value scale, so one median
and MAD across them would measure the gap between critics, not a turn's change) [ours]::

    z_k = (d_k - median(d)) / (1.4826 * MAD(d)),   MAD(d) = median(|d - median(d)|)

the robust (modified) z of Iglewicz and Hoaglin (1993); 1.4826 makes ``1.4826 * MAD`` estimate the
standard deviation of normal data. A turn is flagged when ``|z_k| > threshold`` (default 3.5, their
recommended cut-off). When more than half of the changes are equal, ``MAD = 0``; the scale then falls
back to ``1.2533 * mean(|d - median(d)|)`` (``sqrt(pi / 2)`` times the mean absolute deviation, again
a normal-consistent estimate of the standard deviation; taken about the median [ours]); when that is 0
too (a scale of rounding noise, at or below ``SCALE_RTOL`` times the size of the changes or of the
values, counts as 0 [ours]), every change is the same and the monitor has nothing to measure (:class:`InputError`; with
several checkpoints, such a checkpoint's trajectories are skipped as ``critic_flat_across_turns``).

Per trajectory: the largest ``|z|`` (score of "any sharp change") and the most negative signed ``z``
(a drop in value; scored as ``-min z`` so that larger means a larger drop). Each is compared with
FAILURE (``success == False`` is the positive class) by the AUROC on the trajectories that carry a
success label, with a seeded stratified bootstrap 95% interval. As a baseline the AUROC of the number
of turns is reported too: the largest of more turns tends to be larger, and failed episodes are often
longer, so a score is only interesting where it beats that baseline.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from critic_audit.analysis.quality import check_bootstrap_and_seed, wilson_interval
from critic_audit.errors import ConfigError, InputError, UsageError

REFERENCES = ("previous", "running_mean")

#: ``1 / Phi^{-1}(3/4)``: ``MAD * MAD_TO_SD`` estimates the standard deviation of normal data.
MAD_TO_SD = 1.4826
#: ``sqrt(pi / 2)``: ``mean |x - mu| * MEANAD_TO_SD`` estimates the standard deviation of normal data.
MEANAD_TO_SD = 1.2533
#: A robust scale at or below this fraction of the changes' (or the values') size is float rounding, not
#: a spread (about 8 float32 epsilons, 1.19e-7 each) [ours]: :func:`robust_scale` treats it as 0.
SCALE_RTOL = 1e-6

#: Reasons a trajectory gets no turn score (counted in :attr:`MonitorResult.summary`).
SKIP_NO_POLICY_TOKENS = "no_policy_tokens"
SKIP_FEWER_THAN_2_TURNS = "fewer_than_2_turns"
SKIP_MISSING_VALUE = "missing_value"
SKIP_NON_FINITE = "non_finite_value"
SKIP_FLAT_CHECKPOINT = "critic_flat_across_turns"


@dataclasses.dataclass(frozen=True)
class MonitorConfig:
    """Options of the monitor.

    Attributes:
        threshold: flag a turn when its robust ``|z|`` exceeds this (dimensionless, > 0). Default 3.5,
            the cut-off Iglewicz and Hoaglin recommend for the modified z.
        reference: what "departs from the previous turns" means. ``"previous"`` (default): the change
            from the previous turn's mean, ``m_k - m_{k-1}``. ``"running_mean"`` [ours]: the change from
            the unweighted mean of all previous turn means, ``m_k - mean(m_0..m_{k-1})``.
        n_boot: bootstrap resamples of the AUROC intervals (0: no interval).
        seed: seed of ``numpy.random.default_rng`` for the bootstrap (same seed, same intervals).
        min_per_class: labelled trajectories needed in each class (failures and successes) for an
            AUROC; below it the AUROC is withheld (null, with the counts and a note) [ours; the quality
            gate's ``min_per_outcome``]. With 3 successes the AUROC can only take 3 x n_fail + 1
            values and its interval is mostly the resampling of those 3.
    """

    threshold: float = 3.5
    reference: str = "previous"
    n_boot: int = 2000
    seed: int = 0
    min_per_class: int = 5

    def __post_init__(self) -> None:
        if not (isinstance(self.threshold, (int, float)) and math.isfinite(self.threshold) and self.threshold > 0):
            raise UsageError(f"threshold must be a positive number, got {self.threshold!r}",
                              fix="use e.g. --threshold 3.5")
        if self.reference not in REFERENCES:
            raise UsageError(f"unknown reference {self.reference!r}",
                              fix="use --reference previous or --reference running_mean")
        check_bootstrap_and_seed(self.n_boot, self.seed, min_boot=0)
        if not isinstance(self.min_per_class, int) or self.min_per_class < 1:
            raise ConfigError(f"min_per_class must be an integer >= 1, got {self.min_per_class!r}",
                              fix="use e.g. min_per_class=5")


@dataclasses.dataclass
class MonitorResult:
    """Output of :func:`monitor`.

    Attributes:
        turn_scores: one row per scored turn (k >= 1), the table of :func:`turn_scores`.
        flagged: the flagged turns, columns ``trajectory_id`` (str), ``turn`` (int32), ``z`` (float64),
            sorted by ``|z|`` descending.
        per_trajectory: one row per scored trajectory: ``trajectory_id``, ``n_turns`` (int64, turns with
            values), ``episode_turns`` (int64, the episode's real length from ``num_turns``: the baseline),
            ``max_abs_z``, ``min_z`` (float64), ``n_flagged`` (int64), ``any_flag`` (bool), ``success``
            (bool, null when unlabelled).
        summary: counts, the robust centre and scale, the AUROCs with their intervals, precision and
            recall of "any flag", notes and the config (JSON-serialisable: NaN becomes None).
    """

    turn_scores: pl.DataFrame
    flagged: pl.DataFrame
    per_trajectory: pl.DataFrame
    summary: dict[str, Any]

    def top_flagged(self, top: int) -> pl.DataFrame:
        """The ``top`` flagged turns with the largest ``|z|`` (``flagged``'s columns plus the trajectory's
        ``success``); ``top`` 0 gives none.

        Raises:
            UsageError: ``top`` is not an integer >= 0 (``--top``).
        """
        check_top(top)
        return self.flagged.head(top).join(self.per_trajectory.select("trajectory_id", "success"),
                                           on="trajectory_id", how="left", maintain_order="left")


def check_top(top: Any) -> None:
    """Refuse a ``--top`` (flagged turns to list) that is not an integer >= 0.

    Raises:
        UsageError: one line naming ``--top``, the value and the fix.
    """
    if isinstance(top, bool) or not isinstance(top, int) or top < 0:
        raise UsageError(f"--top must be an integer >= 0 (flagged turns to list), got {top!r}",
                         fix="use e.g. --top 20, or --top 0 to list none")


def is_turn_means(table: pl.DataFrame) -> bool:
    """``table`` holds turn means (``trajectory_id``, ``turn``, ``n_tokens``, ``mean_value``: a streamed
    audit's ``turns.parquet``), not token rows."""
    return {"trajectory_id", "turn", "n_tokens", "mean_value"} <= set(table.columns) and \
        "response_mask" not in table.columns


def turn_means(tokens: pl.DataFrame) -> pl.DataFrame:
    """Mean critic value of each assistant turn over its policy tokens.

    Args:
        tokens: the tokens table (docs/tables.md): ``trajectory_id`` (str), ``turn`` (int, null for
            non-policy tokens), ``response_mask`` (bool), ``value`` (float, may be null). Only rows with
            ``response_mask`` true and a non-null ``turn`` count. A table of turn means already
            (:func:`is_turn_means`) is returned in this function's dtypes and order.

    Returns:
        One row per (trajectory_id, turn), sorted by both: ``trajectory_id`` (str), ``turn`` (int32),
        ``n_tokens`` (int64, policy tokens of the turn that carry a value), ``mean_value`` (float64,
        critic value units; null when no token of the turn has a value, NaN/inf when one is non-finite).

    Raises:
        InputError: a required column is missing.
    """
    if is_turn_means(tokens):  # already the turn means (a streamed audit's turns.parquet)
        return (tokens.select(pl.col("trajectory_id").cast(pl.String), pl.col("turn").cast(pl.Int32),
                              pl.col("n_tokens").cast(pl.Int64), pl.col("mean_value").cast(pl.Float64))
                .sort("trajectory_id", "turn"))
    missing = [c for c in ("trajectory_id", "turn", "response_mask", "value") if c not in tokens.columns]
    if missing:
        raise InputError(f"tokens table lacks column(s) {missing}", fix="pass a tokens table (docs/tables.md)")
    return (
        tokens.lazy()
        .filter(pl.col("response_mask") & pl.col("turn").is_not_null())
        .group_by("trajectory_id", "turn")
        .agg(n_tokens=pl.col("value").is_not_null().sum().cast(pl.Int64),
             mean_value=pl.col("value").cast(pl.Float64).mean())
        .with_columns(pl.col("trajectory_id").cast(pl.String), pl.col("turn").cast(pl.Int32))
        .sort("trajectory_id", "turn")
        .collect()
    )


def robust_scale(d: np.ndarray, magnitude: float = 0.0) -> tuple[float, float, str]:
    """Centre and scale of the robust z over a set of changes.

    Args:
        d: (n,) finite float changes (critic value units), n >= 1.
        magnitude: the typical size of the values the changes are taken between (value units; the
            median ``|turn mean|``), for the rounding tolerance below; 0: the changes alone.

    Returns:
        ``(center, scale, method)``: ``center = median(d)``; ``scale = 1.4826 * MAD`` with
        ``method = "mad"``, or, when ``MAD`` is 0 up to rounding, ``scale = 1.2533 * mean(|d -
        median(d)|)`` with ``method = "mean_abs_dev"``. ``z = (d - center) / scale``. A scale at or
        below ``SCALE_RTOL * max(|center|, median |d|, magnitude)`` (:data:`SCALE_RTOL` = 1e-6, about
        8 float32 epsilons) is rounding noise, not a spread [ours]: it counts as 0.

    Raises:
        InputError: ``d`` is empty, or every change equals the median up to rounding (the critic is
            flat across turns: no scale).
    """
    d = np.asarray(d, dtype=np.float64)
    if d.size == 0:
        raise InputError("no turn to score: no trajectory has 2 or more assistant turns with values",
                         fix="monitor needs multi-turn trajectories scored by a critic")
    center = float(np.median(d))
    dev = np.abs(d - center)
    tol = SCALE_RTOL * max(abs(center), float(np.median(np.abs(d))), abs(float(magnitude)))
    mad = float(np.median(dev))
    if MAD_TO_SD * mad > tol:
        return center, MAD_TO_SD * mad, "mad"
    mean_ad = float(dev.mean())
    if MEANAD_TO_SD * mean_ad > tol:
        return center, MEANAD_TO_SD * mean_ad, "mean_abs_dev"
    rounding = f" up to float rounding (spread {MEANAD_TO_SD * mean_ad:.3g})" if mean_ad > 0 else ""
    raise InputError(
        f"the critic is flat across turns: all {d.size} turn-mean changes equal {center:g}{rounding}, so the "
        "robust z has no scale", fix="check that the values come from a trained critic")


def _valid_turns(means: pl.DataFrame) -> tuple[pl.DataFrame, dict[str, str]]:
    """Keep trajectories whose turn means are all finite and number >= 2; the others with a reason."""
    per = means.group_by("trajectory_id").agg(
        n=pl.len(),
        missing=pl.col("mean_value").is_null().any(),
        bad=(~pl.col("mean_value").is_finite()).any())
    reason = (pl.when(pl.col("missing")).then(pl.lit(SKIP_MISSING_VALUE))
              .when(pl.col("bad")).then(pl.lit(SKIP_NON_FINITE))
              .when(pl.col("n") < 2).then(pl.lit(SKIP_FEWER_THAN_2_TURNS)))
    per = per.with_columns(reason=reason)
    skipped = per.filter(pl.col("reason").is_not_null())
    keep = per.filter(pl.col("reason").is_null())["trajectory_id"]
    return (means.filter(pl.col("trajectory_id").is_in(keep.implode())),
            dict(zip(skipped["trajectory_id"].to_list(), skipped["reason"].to_list())))


def _magnitude(df: pl.DataFrame) -> float:
    """The median ``|mean_value|`` of the scored turns (0 for none): the size the rounding scales with."""
    m = df["mean_value"].abs().median() if df.height else None
    return float(m) if m is not None else 0.0


def _score(means: pl.DataFrame, config: MonitorConfig,
           checkpoints: dict[str, str] | None = None) -> tuple[pl.DataFrame, dict[str, Any], dict[str, str]]:
    """Changes and robust z; with ``checkpoints`` (trajectory_id -> checkpoint, two or more distinct)
    the centre and scale are taken within each checkpoint."""
    means, skipped = _valid_turns(means)
    means = means.sort("trajectory_id", "turn")
    prev = pl.col("mean_value").shift(1).over("trajectory_id")
    if config.reference == "previous":
        ref = prev
    else:
        # mean of the previous turn means: (cumulative sum up to k-1) / k, k = 0-based rank in trajectory
        k = pl.int_range(pl.len()).over("trajectory_id")
        ref = pl.col("mean_value").cum_sum().shift(1).over("trajectory_id") / k
    df = (means.with_columns(reference=ref)
          .filter(pl.col("reference").is_not_null())
          .with_columns(delta=pl.col("mean_value") - pl.col("reference")))
    from critic_audit.analysis.audit import natural_key

    if not checkpoints:
        center, scale, method = robust_scale(df["delta"].to_numpy(), _magnitude(df))
        df = df.with_columns(z=(pl.col("delta") - center) / scale)
        info: dict[str, Any] = {"center": center, "scale": scale, "scale_method": method, "n_changes": df.height}
    else:
        df = df.with_columns(checkpoint=pl.col("trajectory_id").replace_strict(checkpoints, default=None,
                                                                              return_dtype=pl.String))
        parts, by, flat_error = [], {}, None
        for (ck,), part in df.group_by("checkpoint", maintain_order=True):
            try:
                c, sc, m = robust_scale(part["delta"].to_numpy(), _magnitude(part))
            except InputError as e:  # this checkpoint's critic is flat: its trajectories are skipped
                flat_error = e
                skipped.update(dict.fromkeys(part["trajectory_id"].unique().to_list(), SKIP_FLAT_CHECKPOINT))
                by[ck] = {"center": None, "scale": None, "scale_method": "flat", "n_changes": part.height}
                continue
            parts.append(part.with_columns(z=(pl.col("delta") - c) / sc))
            by[ck] = {"center": c, "scale": sc, "scale_method": m, "n_changes": part.height}
        if not parts:
            raise flat_error or InputError("no turn to score", fix="monitor needs multi-turn trajectories")
        df = pl.concat(parts).sort("trajectory_id", "turn")
        info = {"center": None, "scale": None, "scale_method": "per_checkpoint", "n_changes": df.height,
                "by_checkpoint": dict(sorted(by.items(), key=lambda kv: natural_key(str(kv[0]))))}  # step_19 < step_119
    df = df.with_columns(abs_z=pl.col("z").abs()).with_columns(flagged=pl.col("abs_z") > config.threshold)
    df = df.select("trajectory_id", "turn", "n_tokens", "mean_value", "reference", "delta", "z", "abs_z", "flagged")
    return df, info, skipped


def turn_scores(turn_means_df: pl.DataFrame, *, config: MonitorConfig = MonitorConfig()) -> pl.DataFrame:
    """Robust z of each turn's change in mean value (see the module docstring for the definitions).

    Args:
        turn_means_df: the table of :func:`turn_means`.
        config: ``reference`` (how the change is taken) and ``threshold`` (flag cut-off) are used.

    Returns:
        One row per turn k >= 1 of each trajectory with 2 or more turns whose turn means are all
        finite, sorted by ``(trajectory_id, turn)``: ``trajectory_id`` (str), ``turn`` (int32),
        ``n_tokens`` (int64), ``mean_value`` (float64, m_k), ``reference`` (float64, m_{k-1} or the
        running mean), ``delta`` (float64, d_k = mean_value - reference, value units), ``z`` (float64,
        signed robust z, dimensionless), ``abs_z`` (float64), ``flagged`` (bool, ``abs_z > threshold``).
        The median and MAD are taken over every ``delta`` of the table.

    Raises:
        InputError: no turn can be scored, or the critic is flat across turns (see :func:`robust_scale`).
    """
    return _score(turn_means_df, config)[0]


def _average_ranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks of ``x``; tied values share the mean of the ranks they span."""
    _, inv, counts = np.unique(x, return_inverse=True, return_counts=True)
    upper = np.cumsum(counts)  # rank of the last element of each tie block
    return (upper - (counts - 1) / 2.0)[inv.reshape(-1)]


def auroc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Area under the ROC curve of ``scores`` for the positive class ``labels == True``.

    Computed as the Mann-Whitney U of the positives over the negatives, ``U = R_pos - n_pos (n_pos + 1)
    / 2`` with ``R_pos`` the sum of the positives' average ranks (ties share the mean of their ranks),
    divided by ``n_pos * n_neg``. Equivalently the probability that a random positive scores above a
    random negative, counting a tie as one half: 1 is perfect separation, 0.5 chance (and all ties),
    0 perfectly reversed.

    Args:
        scores: (n,) finite float scores (higher = more likely positive).
        labels: (n,) bool; True is the positive class.

    Returns:
        The AUROC in [0, 1]; NaN when either class is empty.

    Raises:
        ValueError: shapes differ, or a score is not finite.
    """
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    y = np.asarray(labels, dtype=bool).reshape(-1)
    if s.shape != y.shape:
        raise ValueError(f"scores and labels must have one shape, got {s.shape} and {y.shape}")
    if not np.isfinite(s).all():
        raise ValueError("scores must be finite")
    n_pos = int(y.sum())
    n_neg = y.size - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    r_pos = float(_average_ranks(s)[y].sum())
    return (r_pos - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg)


def _auroc_resamples(codes: np.ndarray, n_codes: int, pos_idx: np.ndarray, neg_idx: np.ndarray) -> np.ndarray:
    """AUROC of each resample. ``codes``: (n,) dense rank of each score (0..n_codes-1, equal scores one
    code); ``pos_idx``: (B, n_pos) and ``neg_idx``: (B, n_neg) indices into ``codes``. For each resample,
    ``U = sum over drawn positives of (#drawn negatives below + 0.5 #drawn negatives tied)``."""
    B, n_neg = neg_idx.shape
    n_pos = pos_idx.shape[1]
    neg_codes = codes[neg_idx] + (np.arange(B) * n_codes)[:, None]
    at = np.bincount(neg_codes.reshape(-1), minlength=B * n_codes).reshape(B, n_codes).astype(np.float64)
    below = np.cumsum(at, axis=1) - at
    pc = codes[pos_idx]
    u = (np.take_along_axis(below, pc, axis=1) + 0.5 * np.take_along_axis(at, pc, axis=1)).sum(axis=1)
    return u / (n_pos * n_neg)


def bootstrap_auroc(scores: np.ndarray, labels: np.ndarray, *, n_boot: int = 2000, seed: int = 0,
                    level: float = 0.95) -> tuple[float, float, float]:
    """AUROC with a seeded percentile bootstrap interval over trajectories.

    Each resample draws trajectories with replacement within each class (stratified, as pROC's default
    for ``ci.auc``): the positives and the negatives keep their counts, so every resample has both
    classes and the interval reflects the sampling of scores, not of the class balance.

    Args:
        scores: (n,) finite float per-trajectory scores.
        labels: (n,) bool, True = positive class.
        n_boot: resamples (0: no interval).
        seed: seed of ``numpy.random.default_rng``; the same seed gives the same interval.
        level: coverage of the interval.

    Returns:
        ``(estimate, low, high)``: all NaN when a class is empty; ``low``/``high`` NaN when ``n_boot == 0``.

    Raises:
        ValueError: as :func:`auroc`.
    """
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    y = np.asarray(labels, dtype=bool).reshape(-1)
    est = auroc(s, y)
    nan = float("nan")
    if math.isnan(est) or n_boot <= 0:
        return est, nan, nan
    _, codes = np.unique(s, return_inverse=True)
    codes = codes.reshape(-1)
    n_codes = int(codes.max()) + 1
    pos, neg = np.flatnonzero(y), np.flatnonzero(~y)
    rng = np.random.default_rng(seed)
    out = np.empty(n_boot)
    chunk = max(1, 2_000_000 // max(n_codes, s.size))
    for st in range(0, n_boot, chunk):
        e = min(n_boot, st + chunk)
        pi = pos[rng.integers(0, pos.size, size=(e - st, pos.size))]
        ni = neg[rng.integers(0, neg.size, size=(e - st, neg.size))]
        out[st:e] = _auroc_resamples(codes, n_codes, pi, ni)
    alpha = (1 - level) / 2
    lo, hi = np.quantile(out, [alpha, 1 - alpha])
    return est, float(lo), float(hi)


def _num(x: Any) -> Any:
    """JSON-safe float: NaN and inf become None."""
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def _checkpoints(trajectories: pl.DataFrame) -> dict[str, str] | None:
    """trajectory_id -> checkpoint when the trajectories carry two or more checkpoints, else None."""
    if "checkpoint" not in trajectories.columns:
        return None
    t = trajectories.select(pl.col("trajectory_id").cast(pl.String), pl.col("checkpoint").cast(pl.String))
    t = t.unique("trajectory_id", keep="first")
    if t["checkpoint"].drop_nulls().n_unique() < 2:
        return None
    return dict(zip(t["trajectory_id"].to_list(), t["checkpoint"].to_list()))


def _too_few(n_fail: int, n_succ: int, config: MonitorConfig) -> str | None:
    """Why an AUROC over ``n_fail`` failures and ``n_succ`` successes is withheld, or None."""
    if n_fail == 0 or n_succ == 0:
        return "needs both outcomes"
    if min(n_fail, n_succ) < config.min_per_class:
        return (f"too few per class ({n_fail} failure(s), {n_succ} success(es); at least "
                f"{config.min_per_class} of each)")
    return None


def _auroc_entry(scores: np.ndarray, labels: np.ndarray, score: str, config: MonitorConfig, seed_offset: int) -> dict:
    """``{"score", "estimate", "ci95", "n_failures", "n_successes"}``; estimate and interval null, with a
    ``withheld`` reason, below ``config.min_per_class`` of either class."""
    y = np.asarray(labels, dtype=bool)
    n_fail, n_succ = int(y.sum()), int(y.size - y.sum())
    entry = {"score": score, "estimate": None, "ci95": None, "n_failures": n_fail, "n_successes": n_succ}
    why = _too_few(n_fail, n_succ, config)
    if why is not None:
        return {**entry, "withheld": why}
    est, lo, hi = bootstrap_auroc(scores, labels, n_boot=config.n_boot, seed=config.seed + seed_offset)
    ci = None if math.isnan(lo) else [_num(lo), _num(hi)]
    return {**entry, "estimate": _num(est), "ci95": ci}


_GATE_WORDS = {"failed": "failed the quality gate", "not_enough_data": "was not checked by the quality gate "
               "(not enough data)", "unmeasured": "was not measured by the quality gate"}


def gate_caveat(gate: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The summary's ``critic_gate`` for the audit's critic-quality gate ``gate`` (``summary.json``'s
    ``critic_quality.gate``: ``status``, ``reasons``; ``{}`` when the audit has none): ``status``,
    ``reasons`` and ``caveat``, the words set beside every AUROC of a critic that did not pass (a
    signal from a critic whose values do not explain the outcome is no evidence the signal works);
    None when the gate passed."""
    gate = gate or {}
    status = gate.get("status") or ("passed" if gate.get("passed") else "unmeasured")
    if status == "passed":
        return None
    reasons = [str(r) for r in gate.get("reasons") or ()]
    caveat = (f"the critic {_GATE_WORDS.get(status, status)}"
              + (f" ({reasons[0]})" if reasons else "")
              + ": its values are not shown to explain the outcome, so this AUROC is no evidence of a signal")
    return {"status": status, "reasons": reasons, "caveat": caveat}


def _mark(entry: dict[str, Any] | None, caveat: dict[str, Any] | None) -> None:
    if entry is not None and caveat is not None:
        entry["caveat"] = caveat["caveat"]


def _checkpoints_caveat(by: Mapping[str, dict], gates: Mapping[str, Any]) -> dict[str, Any] | None:
    """Mark each checkpoint's AUROC of ``by`` (in place) with the caveat of its own checkpoint's gate
    (``gates``: checkpoint -> gate, a missing one unmeasured); return the caveat of the pooled AUROCs
    when any pooled checkpoint critic did not pass (``status`` the worst one's, ``reasons``,
    ``caveat`` saying how many, ``checkpoints``: ``n``, ``not_passed`` checkpoint -> status), else None."""
    per = {k: gate_caveat(gates.get(k) or {}) for k in by}
    for k, entry in by.items():
        _mark(entry.get("auroc_max_abs_z"), per[k])
    bad = {k: c["status"] for k, c in per.items() if c is not None}
    if not bad:
        return None
    counts = {st: list(bad.values()).count(st) for st in dict.fromkeys(bad.values())}
    why = ", ".join(f"{n} {_GATE_WORDS.get(st, st).removeprefix('was ')}" for st, n in counts.items())
    head = f"{len(bad)} of {len(by)} checkpoint critics did not pass the quality gate ({why}: {', '.join(bad)})"
    status = next((st for st in ("failed", "not_enough_data", "unmeasured") if st in counts), next(iter(counts)))
    return {"status": status, "reasons": [head],
            "caveat": f"{head}: the pooled AUROC mixes their scores, so it is no evidence of a signal",
            "checkpoints": {"n": len(by), "not_passed": bad}}


def _apply_gates(summary: dict[str, Any], by: Mapping[str, dict], critic_gate: Mapping[str, Any] | None,
                 checkpoint_gates: Mapping[str, Any] | None) -> None:
    """Set the summary's ``critic_gate`` and the AUROCs' caveats (see :func:`monitor`), in place."""
    pooled = None if critic_gate is None else gate_caveat(critic_gate)
    if by and checkpoint_gates is not None:
        ck = _checkpoints_caveat(by, checkpoint_gates)
        pooled = ck if pooled is None else ({**pooled, "checkpoints": ck["checkpoints"]} if ck else pooled)
    elif pooled is not None:  # no gate per checkpoint: the pooled one stands for all
        for v in by.values():
            _mark(v.get("auroc_max_abs_z"), pooled)
    if pooled is None:
        return
    summary["critic_gate"] = pooled
    _mark(summary["auroc"]["max_abs_z"], pooled)
    _mark(summary["auroc"]["largest_drop"], pooled)
    summary["notes"].insert(0, pooled["caveat"][0].upper() + pooled["caveat"][1:])


def monitor(trajectories: pl.DataFrame, tokens: pl.DataFrame, config: MonitorConfig = MonitorConfig(), *,
            critic_gate: Mapping[str, Any] | None = None,
            checkpoint_gates: Mapping[str, Any] | None = None,
            tokens_path: str | None = None) -> MonitorResult:
    """Score every turn by the robust z of its change in value and measure how well it predicts failure.

    Args:
        trajectories: the trajectories table (``trajectory_id`` str; ``success`` bool, null when
            unknown); trajectories absent from it are treated as unlabelled.
        tokens: the tokens table with critic values on the policy tokens (docs/tables.md), or its
            turn means (a streamed audit's ``turns.parquet``: :func:`is_turn_means`).
        config: see :class:`MonitorConfig`.
        critic_gate: the audit's critic-quality gate (``summary.json["critic_quality"]["gate"]``;
            ``{}``: the audit has none). When given and not passed, the summary's ``critic_gate``
            (:func:`gate_caveat`) says so and every AUROC of a critic score (not the number-of-turns
            baseline) carries its ``caveat``; None: not checked.
        checkpoint_gates: with two or more checkpoints, each one's gate (``summary.json["by_checkpoint"]
            [checkpoint]["critic_quality"]["gate"]``; a missing or null one: unmeasured). Each
            checkpoint's AUROC carries the caveat of its own gate; when any checkpoint critic did not
            pass, the pooled AUROCs carry a caveat saying how many, and ``critic_gate`` (the pooled
            gate's, or this one when the pooled gate passed) holds ``checkpoints`` (``n``,
            ``not_passed`` checkpoint -> status). None: the pooled ``critic_gate`` stands for all.
        tokens_path: the file ``tokens`` was read from, named in the error about missing values.

    Returns:
        A :class:`MonitorResult`. Its ``summary`` holds ``counts`` (``trajectories_read``,
        ``trajectories_scored``, ``turns_scored``, ``flagged_turns``, ``flagged_trajectories``,
        ``labelled``, ``failures``, ``skipped`` by reason), ``robust`` (``center``, ``scale``,
        ``scale_method``; with two or more checkpoints in ``trajectories.checkpoint``, ``center`` and
        ``scale`` are null, ``scale_method`` is ``"per_checkpoint"`` and ``by_checkpoint`` maps each
        checkpoint to its ``center``, ``scale``, ``scale_method``, ``n_changes``, ``trajectories`` and
        ``auroc_max_abs_z``: the z of a turn is taken with its own checkpoint's centre and scale),
        ``auroc`` (``max_abs_z``, ``largest_drop`` = ``-min z``, ``num_turns``
        baseline; each ``{"score", "estimate", "ci95", "n_failures", "n_successes"}``, estimate and
        interval null, with a ``withheld`` reason, without ``config.min_per_class`` labelled
        trajectories of each outcome), ``any_flag`` (``precision`` = P(failure | flagged), ``recall`` = P(flagged |
        failure), ``flag_rate``, ``failure_rate``), ``notes`` and ``config``.

    Raises:
        InputError: the tokens carry no critic value on any policy token; no trajectory has 2 or more
            scored turns; the critic is flat across turns. SchemaError: some policy tokens
            (``response_mask`` true) have no value while others have one: refused as ``analyze``
            refuses them (a turn mean over part of a turn would pass for the turn's).
    """
    means = turn_means(tokens)
    if means.height == 0:
        raise InputError("the tokens table has no assistant (policy) tokens",
                         fix="pass an audit folder written by critic-audit analyze")
    if means["n_tokens"].sum() == 0:
        raise InputError("the tokens table carries no critic value on any policy token",
                         fix="score it first: critic-audit analyze ... --critic CRITIC_FOLDER")
    if not is_turn_means(tokens):
        from critic_audit.analysis.audit import refuse_missing_values

        refuse_missing_values(tokens, path=tokens_path)
    checkpoints = _checkpoints(trajectories)
    scores, robust, skipped = _score(means, config, checkpoints)
    per, labels = _per_trajectory(scores, means, trajectories)
    flagged = (scores.filter(pl.col("flagged")).sort("abs_z", "trajectory_id", "turn", descending=[True, False, False])
               .select("trajectory_id", "turn", "z"))
    known, reasons = _skip_counts(labels, tokens, means, skipped)

    lab = per.filter(pl.col("success").is_not_null())
    fail = (~lab["success"]).to_numpy().astype(bool)
    n_fail = int(fail.sum())
    notes = _label_notes(lab.height, n_fail, config)
    if checkpoints:
        notes += _by_checkpoint(lab, checkpoints, robust["by_checkpoint"], config)
    summary = {
        "counts": {
            "trajectories_read": len(known),
            "trajectories_scored": per.height,
            "turns_scored": scores.height,
            "flagged_turns": flagged.height,
            "flagged_trajectories": int(per["any_flag"].sum()),
            "labelled": lab.height,
            "failures": n_fail,
            "skipped": dict(sorted(reasons.items())),
        },
        "robust": {"center": _num(robust["center"]), "scale": _num(robust["scale"]),
                   "scale_method": robust["scale_method"],
                   **({"by_checkpoint": {str(k): {**v, "center": _num(v["center"]), "scale": _num(v["scale"])}
                                         for k, v in robust["by_checkpoint"].items()}} if checkpoints else {})},
        "auroc": _aurocs(lab, fail, config),
        "any_flag": _any_flag(lab, fail),
        "notes": notes,
        "config": dataclasses.asdict(config),
    }
    _apply_gates(summary, robust.get("by_checkpoint") or {}, critic_gate, checkpoint_gates)
    return MonitorResult(turn_scores=scores, flagged=flagged, per_trajectory=per, summary=summary)


def _per_trajectory(scores: pl.DataFrame, means: pl.DataFrame,
                    trajectories: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The :attr:`MonitorResult.per_trajectory` table, and the labels it was joined with
    (``trajectory_id``, ``success``, ``_episode_turns``: one row per trajectory of ``trajectories``)."""
    per = (scores.group_by("trajectory_id")
           .agg(max_abs_z=pl.col("abs_z").max(), min_z=pl.col("z").min(),
                n_flagged=pl.col("flagged").sum().cast(pl.Int64))
           .join(means.group_by("trajectory_id").agg(n_turns=pl.len().cast(pl.Int64)), on="trajectory_id")
           .with_columns(any_flag=pl.col("n_flagged") > 0))
    labels = trajectories.select(pl.col("trajectory_id").cast(pl.String),
                                 pl.col("success").cast(pl.Boolean) if "success" in trajectories.columns
                                 else pl.lit(None, dtype=pl.Boolean).alias("success"),
                                 # the episode's real length (before --max-length truncation), for the baseline
                                 pl.col("num_turns").cast(pl.Int64).alias("_episode_turns")
                                 if "num_turns" in trajectories.columns
                                 else pl.lit(None, dtype=pl.Int64).alias("_episode_turns")).unique("trajectory_id")
    per = (per.join(labels, on="trajectory_id", how="left")
           .with_columns(episode_turns=pl.coalesce("_episode_turns", "n_turns"))
           .select("trajectory_id", "n_turns", "episode_turns", "max_abs_z", "min_z", "n_flagged", "any_flag",
                   "success")
           .sort("trajectory_id"))
    return per, labels


def _skip_counts(labels: pl.DataFrame, tokens: pl.DataFrame, means: pl.DataFrame,
                 skipped: dict[str, str]) -> tuple[set[str], dict[str, int]]:
    """The trajectory ids known to the tables, and the skipped trajectories counted by reason (those
    of ``skipped``, then the known ones without policy tokens)."""
    known = set(labels["trajectory_id"].to_list()) | set(tokens["trajectory_id"].cast(pl.String).unique().to_list())
    with_turns = set(means["trajectory_id"].to_list())
    reasons: dict[str, int] = {}
    for r in list(skipped.values()) + [SKIP_NO_POLICY_TOKENS] * len(known - with_turns):
        reasons[r] = reasons.get(r, 0) + 1
    return known, reasons


def _label_notes(n_labelled: int, n_fail: int, config: MonitorConfig) -> list[str]:
    """The notes on the labelled trajectories (none, one outcome only, too few per class) and on the
    bootstrap."""
    notes: list[str] = []
    n_succ = n_labelled - n_fail
    if n_labelled == 0:
        notes.append("no scored trajectory carries a success label: AUROC, precision and recall are null")
    elif n_fail == 0 or n_succ == 0:
        notes.append(f"the labelled trajectories are all {'successes' if n_fail == 0 else 'failures'}: "
                     "AUROC is null (it needs both outcomes)")
    elif min(n_fail, n_succ) < config.min_per_class:
        notes.append(f"too few labelled trajectories per class for an AUROC: {n_fail} failure(s) and {n_succ} "
                     f"success(es), at least {config.min_per_class} of each needed; the AUROCs are withheld "
                     "(null) and the precision and recall rest on these few")
    if config.n_boot == 0:
        notes.append("no bootstrap (n_boot = 0): AUROCs without interval")
    return notes


def _by_checkpoint(lab: pl.DataFrame, checkpoints: dict[str, str], by: dict[str, dict],
                   config: MonitorConfig) -> list[str]:
    """Add ``trajectories`` and ``auroc_max_abs_z`` to each checkpoint's entry of ``by`` (in place; the
    AUROC null where the critic is flat), from the labelled rows ``lab`` of the per-trajectory table;
    returns the notes on the checkpoints."""
    notes = [f"the trajectories come from {len(by)} checkpoints: the robust z is taken within each "
             "checkpoint (each checkpoint's critic has its own value scale); robust.by_checkpoint holds "
             "each one's centre, scale and AUROC"]
    flat = [str(k) for k, v in by.items() if v["scale_method"] == "flat"]
    if flat:
        notes.append(f"checkpoint(s) {', '.join(flat)}: the critic is flat across turns there (no scale); "
                     f"their trajectories are skipped ({SKIP_FLAT_CHECKPOINT})")
    ck_of = pl.DataFrame({"trajectory_id": list(checkpoints), "_ck": list(checkpoints.values())},
                         schema={"trajectory_id": pl.String, "_ck": pl.String})
    lab_ck = lab.join(ck_of, on="trajectory_id", how="left")
    for i, (ck, entry) in enumerate(by.items()):
        part = lab_ck.filter(pl.col("_ck").eq_missing(ck))
        entry["trajectories"] = part.height
        entry["auroc_max_abs_z"] = (_auroc_entry(part["max_abs_z"].to_numpy(), (~part["success"]).to_numpy()
                                                 .astype(bool), "max |z| (this checkpoint)", config, 10 + i)
                                    if entry["scale_method"] != "flat" else None)
    return notes


def _aurocs(lab: pl.DataFrame, fail: np.ndarray, config: MonitorConfig) -> dict[str, dict]:
    """The summary's ``auroc``: max |z|, the largest drop and the number-of-turns baseline against
    failure (``fail``, bool per row of the labelled per-trajectory rows ``lab``)."""
    return {
        "max_abs_z": _auroc_entry(lab["max_abs_z"].to_numpy(), fail, "max |z| over the trajectory's turns", config, 0),
        "largest_drop": _auroc_entry(-lab["min_z"].to_numpy(), fail, "-min z (the largest drop in value)", config, 1),
        "num_turns": _auroc_entry(lab["episode_turns"].to_numpy().astype(np.float64), fail,
                                  "number of turns of the episode (baseline, no critic; the real length, "
                                  "not the count left after truncation)", config, 2),
    }


def _any_flag(lab: pl.DataFrame, fail: np.ndarray) -> dict[str, Any]:
    """The summary's ``any_flag``: precision and recall of "any turn flagged" for failure over the
    labelled per-trajectory rows ``lab`` (``fail`` bool per row), each with its Wilson score 95% interval
    over trajectories (``precision_ci95``, ``recall_ci95``; Wilson 1927; None without a denominator), with
    the flag and failure rates."""
    n_fail = int(fail.sum())
    flag = lab["any_flag"].to_numpy().astype(bool)
    tp = int((flag & fail).sum())
    n_flag = int(flag.sum())
    return {
        "precision": _num(tp / n_flag) if n_flag else None,
        "precision_ci95": wilson_interval(tp, n_flag) if n_flag else None,
        "recall": _num(tp / n_fail) if n_fail else None,
        "recall_ci95": wilson_interval(tp, n_fail) if n_fail else None,
        "flag_rate": _num(flag.mean()) if flag.size else None,
        "failure_rate": _num(n_fail / lab.height) if lab.height else None,
        "flagged_labelled": int(flag.sum()),
        "flagged_failures": tp,
    }


def monitor_folder(folder: str | Path, config: MonitorConfig = MonitorConfig()) -> MonitorResult:
    """:func:`monitor` of an ``analyze`` output folder (``critic-audit monitor FOLDER``): its tables
    (:func:`critic_audit.io.tables.load_audit_folder`) and the critic gates of its ``summary.json``.

    Raises:
        InputError: the folder's ``summary.json`` cannot be read, or as
            :func:`critic_audit.io.tables.load_audit_folder` and :func:`monitor`.
        SchemaError: that ``summary.json`` is not JSON or not an audit summary (one line naming it, as
            ``plot`` says: a corrupt summary is not taken for a missing one, which would read "critic
            quality unmeasured"); as :func:`monitor` (policy tokens without a value, naming ``tokens.parquet``).
    """
    from critic_audit.io.tables import load_audit_folder, prior_summary
    from critic_audit.summary import read_summary

    p = Path(folder)
    trajectories, tokens = load_audit_folder(p)
    if (p / "summary.json").exists():  # read as plot reads it: a corrupt one is one line naming it
        read_summary(p / "summary.json")
    audit_summary = prior_summary(p) or {}
    by_ck = audit_summary.get("by_checkpoint") or {}
    return monitor(trajectories, tokens, config,
                   critic_gate=(audit_summary.get("critic_quality") or {}).get("gate") or {},
                   checkpoint_gates={k: (v.get("critic_quality") or {}).get("gate") for k, v in by_ck.items()},
                   tokens_path=str(p / "tokens.parquet") if not is_turn_means(tokens) else None)
