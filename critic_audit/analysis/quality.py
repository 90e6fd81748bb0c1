"""Critic quality and the gate a critic must pass before its structure is read as evidence.

A critic whose values do not predict the outcome says nothing about credit granularity, however its
variance splits between and within turns. The gate ([ours]; docs/audit.md, "The quality gate") asks,
on trajectories the critic was not fitted on:

1. **enough data**: at least ``min_per_outcome`` trajectories with each outcome (success and failure);
   below it the verdict is ``not_enough_data``;
2. **the right sign, significantly**: the within-stratum correlation of each trajectory's mean value
   with its reward is positive, at least ``min_corr``, and a one-sided stratified permutation test
   rejects "no association" at ``alpha`` (rewards permuted within each stratum, seeded);
3. **explained variance above zero**: the within-stratum explained variance of the token values
   against the trajectory's return is at least ``min_explained_variance`` and the lower end of its
   stratified bootstrap 95% interval is above 0.

Strata are the (source, checkpoint) pairs: rewards are standardised within each, so one source whose
rewards are on another scale (a -100 beside 0/1 rewards) cannot create or hide a correlation, and a
run's checkpoints (different critics) are judged each against its own rollouts. Formulas:

- within-stratum correlation ``r = sum_s n_s r_s / sum_s n_s`` with ``r_s`` the Pearson correlation of
  (trajectory mean value, reward) in stratum s over its ``n_s`` trajectories (strata where either is
  constant are left out);
- within-stratum explained variance ``EV = sum_s N_s EV_s / sum_s N_s``, ``EV_s = 1 - Var_s(R - V) /
  Var_s(R)`` over the ``N_s`` policy tokens of stratum s (the PPO diagnostic, e.g. arXiv:2503.01491,
  computed per stratum: a constant offset per source is forgiven, the reward scale is not).

Clustered rollouts (a GRPO group's samples of one prompt, the trials of one task: ``cluster``, from
``group_id``): when a cluster holds more than one trajectory, the bootstrap resamples whole clusters
within each stratum (the cluster bootstrap, Davison & Hinkley 1997, section 3.8) and the permutation
test permutes within clusters and whole clusters among those of equal size (Winkler et al. 2015,
NeuroImage 123:253); trajectories of one task that share their outcome would otherwise count as
independent evidence and the intervals come out too narrow. Without such clusters both are unchanged.

Everything is deterministic given ``seed``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from critic_audit.analysis.clusters import ClusterLayout
from critic_audit.summary import Interval, QualityGate, Tested

__all__ = ["GateConfig", "TrajectorySums", "cluster_layouts", "outcome_split", "pooled_ev", "quality_gate",
           "wilson_interval"]


#: Most bootstrap resamples an audit or monitor accepts (``--bootstrap``). [ours: 2000 gives percentile
#: intervals whose Monte Carlo error is small next to their width; 100,000 is far beyond any need, and a
#: larger value would only exhaust memory.]
MAX_BOOTSTRAP = 100_000

#: Fewest bootstrap resamples whose 95% intervals may support a confident credit verdict. [ours: the 2.5th
#: and 97.5th percentiles of B resamples rest on about 0.025 * B of them each: 5 at B = 200; below that a
#: percentile interval is noise (B = 1 gives a zero-width interval that may exclude its own estimate).
#: Fewer resamples are computed and shown, but the verdict is ``inconclusive``.]
MIN_CONFIDENT_BOOTSTRAP = 200


def check_bootstrap_and_seed(n_boot: int, seed: Any, *, min_boot: int) -> None:
    """Refuse a ``--bootstrap`` outside ``[min_boot, MAX_BOOTSTRAP]`` or a ``--seed`` that is not an int >= 0.

    Raises:
        UsageError: one line naming the option, the value and the fix.
    """
    from critic_audit.errors import UsageError

    if n_boot < min_boot:
        raise UsageError(f"--bootstrap must be at least {min_boot}, got {n_boot}", fix="use e.g. --bootstrap 2000")
    if n_boot > MAX_BOOTSTRAP:
        raise UsageError(f"--bootstrap must be at most {MAX_BOOTSTRAP:,}, got {n_boot}",
                          fix="use e.g. --bootstrap 2000")
    if not isinstance(seed, int) or seed < 0:
        raise UsageError(f"--seed must be an integer >= 0 (a numpy random seed), got {seed!r}",
                          fix=f"use e.g. --seed {abs(seed) if isinstance(seed, int) else 0}")


@dataclasses.dataclass(frozen=True)
class GateConfig:
    """Thresholds of the quality gate ([ours]; docs/audit.md reports their measured false-positive rate).

    Attributes:
        min_per_outcome: trajectories needed with each outcome (success / failure).
        min_clusters: where the intervals resample clusters (groups, a task's trials), the clusters needed
            among the trajectories judged: with fewer, a percentile cluster bootstrap has a handful of
            distinct resamples and its interval ends sit on the estimate (its coverage falls well below 95%
            with few clusters: Cameron, Gelbach & Miller 2008, Rev. Econ. Stat. 90:414), so the gate says
            ``not_enough_data`` instead of judging.
        alpha: one-sided level of the permutation test of the correlation.
        min_corr: the within-stratum correlation must be at least this.
        min_explained_variance: the within-stratum explained variance must be at least this, and its
            bootstrap interval must lie above 0.
        n_perm: permutations of the test.
        n_boot: bootstrap resamples of the intervals.
        seed: seed of both.
    """

    min_per_outcome: int = 5
    min_clusters: int = 6
    alpha: float = 0.05
    min_corr: float = 0.1
    min_explained_variance: float = 0.05
    n_perm: int = 2000
    n_boot: int = 2000
    seed: int = 0


@dataclasses.dataclass
class TrajectorySums:
    """Per-trajectory inputs of the gate, B rows (float64 unless stated).

    Attributes:
        stratum: (B,) int stratum index (one per (source, checkpoint) pair).
        reward: (B,) the trajectory's reward R (its return with gamma = 1).
        mean_value: (B,) mean critic value over its policy tokens.
        n_tokens: (B,) policy tokens.
        err_mean: (B,) mean over its policy tokens of ``R - V``.
        err_m2: (B,) sum over its policy tokens of ``(R - V - err_mean)^2``.
        positive: (B,) bool outcome: the higher side of :func:`outcome_split` (success for 0/1 rewards).
        success: (B,) bool success labels where known (for the messages only), or None.
        cluster: (B,) cluster code of each trajectory (its ``group_id``: the rollouts of one prompt, the
            trials of one task; a trajectory without one has a code of its own), or None. A cluster is
            a code within a stratum. When some cluster holds more than one trajectory the intervals
            resample whole clusters and the test permutes whole clusters (:func:`quality_gate`).
    """

    stratum: np.ndarray
    reward: np.ndarray
    mean_value: np.ndarray
    n_tokens: np.ndarray
    err_mean: np.ndarray
    err_m2: np.ndarray
    positive: np.ndarray
    success: np.ndarray | None = None
    cluster: np.ndarray | None = None


def wilson_interval(k: float, n: float, level: float = 0.95) -> tuple[float, float] | None:
    """Wilson score interval of a binomial fraction k/n (Wilson 1927, JASA 22:209).

    Unlike the bootstrap or the normal interval it does not collapse at 0 or n successes (0 of 5:
    [0, 0.43]). ``k`` and ``n`` may be fractional: an effective sample size ``n / deff`` and ``k``
    scaled with it (clustered trajectories, :func:`critic_audit.analysis.clusters.design_effect`).
    Returns None when ``n <= 0``.
    """
    if n <= 0:
        return None
    from statistics import NormalDist

    z = NormalDist().inv_cdf(0.5 + level / 2)
    p = k / n
    den = 1 + z * z / n
    center = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    lo = 0.0 if k == 0 else max(0.0, center - half)
    hi = 1.0 if k == n else min(1.0, center + half)
    return lo, hi


def outcome_split(reward: np.ndarray) -> np.ndarray:
    """(B,) bool: the higher-outcome side of the most balanced split of the rewards.

    For 0/1 rewards it is ``reward == 1`` (success); for graded rewards the threshold is the reward
    value that makes the smaller side largest (ties: the lowest such value).
    """
    r = np.asarray(reward, dtype=np.float64)
    if r.size == 0:
        return np.zeros(0, bool)
    u = np.unique(r)
    if u.size < 2:
        return np.zeros(r.size, bool)
    below = np.searchsorted(np.sort(r), u[:-1], side="right")  # #(r <= u_i)
    best = int(np.argmax(np.minimum(below, r.size - below)))
    return r > u[best]


def _strata_corr(x: np.ndarray, y: np.ndarray, strata: list[np.ndarray]) -> float:
    """``sum_s n_s r_s / sum_s n_s`` over strata (index arrays) where x and y both vary."""
    num = den = 0.0
    for idx in strata:
        xs, ys = x[idx], y[idx]
        sx, sy = xs.std(), ys.std()
        if idx.size < 2 or sx <= 1e-12 * max(1.0, abs(xs.mean())) or sy <= 1e-12 * max(1.0, abs(ys.mean())):
            continue
        num += idx.size * float(np.mean((xs - xs.mean()) * (ys - ys.mean())) / (sx * sy))
        den += idx.size
    return num / den if den else float("nan")


def pooled_ev(n: np.ndarray, em: np.ndarray, m2: np.ndarray, r: np.ndarray, axis: int = -1) -> tuple[np.ndarray, np.ndarray]:
    """Explained variance ``1 - Var(R - V) / Var(R)`` pooled over the tokens of several trajectories,
    from per-trajectory sums (trajectories along ``axis``; any leading axes are batch axes, e.g.
    bootstrap replicates).

    Args:
        n: policy tokens per trajectory (float64).
        em: mean of ``R - V`` over each trajectory's policy tokens.
        m2: sum over each trajectory's tokens of ``(R - V - em)^2``.
        r: each trajectory's reward R.

    Returns:
        ``(EV, N)``: NaN where the rewards do not vary; N the total tokens. Exact (Chan et al.'s
        pooled-variance combination), not a sum of squares minus a squared sum.
    """
    N = n.sum(axis=axis)
    with np.errstate(invalid="ignore", divide="ignore"):
        mu_e = (n * em).sum(axis=axis) / N
        mu_r = (n * r).sum(axis=axis) / N
        var_e = (m2.sum(axis=axis) + (n * (em - np.expand_dims(mu_e, axis)) ** 2).sum(axis=axis)) / N
        var_r = (n * (r - np.expand_dims(mu_r, axis)) ** 2).sum(axis=axis) / N
        ok = var_r > 1e-12 * np.maximum(1.0, mu_r ** 2)
        ev = np.where(ok, 1.0 - var_e / np.where(ok, var_r, 1.0), np.nan)
    return ev, N


def _pooled_ev(t: TrajectorySums, strata: list[np.ndarray]) -> float:
    num = den = 0.0
    for idx in strata:
        ev, N = pooled_ev(t.n_tokens[idx], t.err_mean[idx], t.err_m2[idx], t.reward[idx])
        if np.isfinite(ev):
            num += float(ev) * float(N)
            den += float(N)
    return num / den if den else float("nan")


_KERNEL: list[Any] = []


def _resample_kernel() -> Any:
    """The compiled per-resample statistics of :func:`_bootstrap` (None without numba), built once."""
    if _KERNEL:
        return _KERNEL[0]
    from critic_audit.analysis.decompose import HAVE_NUMBA

    _KERNEL.append(None)
    if not HAVE_NUMBA:
        return None
    from numba import njit

    @njit(cache=True, nogil=True, error_model="numpy")
    def resample(draw, starts, lens, members, x, y, n, em, m2, out):  # pragma: no cover - compiled
        # row b of draw: the clusters drawn; their members (trajectory rows) in draw order. A
        # trajectory resample is the case of clusters of one (starts = 0..n-1, lens = 1, members =
        # the stratum's rows): the same draws summed in the same order.
        for b in range(draw.shape[0]):
            sx = sy = sn = sne = snr = sm2 = 0.0
            m = 0
            for j in range(draw.shape[1]):
                c = draw[b, j]
                for q in range(starts[c], starts[c] + lens[c]):
                    i = members[q]
                    sx += x[i]
                    sy += y[i]
                    sn += n[i]
                    sne += n[i] * em[i]
                    snr += n[i] * y[i]
                    sm2 += m2[i]
                m += lens[c]
            mx, my, mu_e, mu_r = sx / m, sy / m, sne / sn, snr / sn
            vx = vy = cxy = ve = vr = 0.0
            for j in range(draw.shape[1]):
                c = draw[b, j]
                for q in range(starts[c], starts[c] + lens[c]):
                    i = members[q]
                    dx, dy, de, dr = x[i] - mx, y[i] - my, em[i] - mu_e, y[i] - mu_r
                    vx += dx * dx
                    vy += dy * dy
                    cxy += dx * dy
                    ve += n[i] * (de * de)
                    vr += n[i] * (dr * dr)
            sdx, sdy = np.sqrt(vx / m), np.sqrt(vy / m)
            out[b, 0] = (cxy / m) / (sdx * sdy) if (sdx > 1e-12) & (sdy > 1e-12) else np.nan
            var_e, var_r = (sm2 + ve) / sn, vr / sn
            ok = var_r > 1e-12 * max(1.0, mu_r * mu_r)
            out[b, 1] = 1.0 - var_e / var_r if ok else np.nan
            out[b, 2] = sn
            out[b, 3] = m

    _KERNEL[0] = resample
    return resample


def _trajectory_resamples(t: TrajectorySums, pick: np.ndarray) -> np.ndarray:
    """numpy: (R, 4) corr (NaN where either side is constant), EV, tokens N and trajectories m of each
    row of ``pick`` ((R, m) trajectory rows drawn)."""
    x, y = t.mean_value[pick], t.reward[pick]
    sx, sy = x.std(axis=1), y.std(axis=1)
    ok = (sx > 1e-12) & (sy > 1e-12)
    with np.errstate(invalid="ignore", divide="ignore"):
        r = ((x - x.mean(1, keepdims=True)) * (y - y.mean(1, keepdims=True))).mean(1) / (sx * sy)
    ev, N = pooled_ev(t.n_tokens[pick], t.err_mean[pick], t.err_m2[pick], y, axis=1)
    return np.stack([np.where(ok, r, np.nan), ev, N, np.full(pick.shape[0], float(pick.shape[1]))], axis=1)


def _cluster_resamples(t: TrajectorySums, idx: np.ndarray, lay: ClusterLayout, draw: np.ndarray) -> np.ndarray:
    """numpy: :func:`_trajectory_resamples` of cluster draws ((R, K) clusters of ``lay`` over the
    stratum's rows ``idx``), each trajectory weighted by how often its cluster was drawn."""
    R, K = draw.shape
    counts = np.bincount((draw + K * np.arange(R)[:, None]).ravel(), minlength=R * K).reshape(R, K)
    w = counts[:, lay.local].astype(np.float64)  # (R, n_s) multiplicity of each trajectory of idx
    x, y = t.mean_value[idx], t.reward[idx]
    m = w.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        dx = x - ((w * x).sum(axis=1) / m)[:, None]
        dy = y - ((w * y).sum(axis=1) / m)[:, None]
        sx, sy = np.sqrt((w * dx * dx).sum(axis=1) / m), np.sqrt((w * dy * dy).sum(axis=1) / m)
        ok = (sx > 1e-12) & (sy > 1e-12)
        r = (w * dx * dy).sum(axis=1) / m / (sx * sy)
    yb = np.broadcast_to(y, w.shape)
    ev, N = pooled_ev(w * t.n_tokens[idx], np.broadcast_to(t.err_mean[idx], w.shape), w * t.err_m2[idx], yb, axis=1)
    return np.stack([np.where(ok, r, np.nan), ev, N, m], axis=1)


def _bootstrap(t: TrajectorySums, strata: list[np.ndarray], n_boot: int, rng: np.random.Generator,
               layouts: list[ClusterLayout] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Stratified bootstrap replicates of (within-stratum corr, within-stratum EV).

    ``layouts`` None: trajectories are drawn with replacement within each stratum. Otherwise
    ``layouts[k]`` gives the clusters of stratum k (positions within ``strata[k]``) and each resample
    draws as many whole clusters, with replacement, as the stratum holds (the cluster bootstrap); a
    stratum's correlation is then weighted by the trajectories drawn. With numba, each resample's
    statistics come from a compiled two-pass kernel over its draws (sums in draw order, so equal to
    numpy's pairwise sums up to float rounding), without copying the draws; clusters of one
    trajectory give the trajectory bootstrap's draws and sums exactly."""
    acc = np.zeros((4, n_boot))  # corr numerator, denominator; EV numerator, denominator
    kernel = _resample_kernel()
    cols = [np.ascontiguousarray(a, dtype=np.float64) for a in (t.mean_value, t.reward, t.n_tokens, t.err_mean, t.err_m2)]
    for k, idx in enumerate(strata):
        if idx.size < 2:
            continue
        lay = layouts[k] if layouts is not None else None
        units = idx.size if lay is None else lay.n_clusters
        if kernel is not None:
            one = np.ones(units, np.int64)
            starts, lens, members = ((np.arange(units, dtype=np.int64), one, idx.astype(np.int64)) if lay is None
                                     else (lay.starts, lay.lens, idx[lay.members].astype(np.int64)))
        chunk = max(1, 1_000_000 // idx.size)
        for s in range(0, n_boot, chunk):
            e = min(n_boot, s + chunk)
            draw = rng.integers(0, units, size=(e - s, units))
            if kernel is not None:
                out = np.empty((e - s, 4))
                kernel(draw, starts, lens, members, *cols, out)
            elif lay is None:
                out = _trajectory_resamples(t, idx[draw])
            else:
                out = _cluster_resamples(t, idx, lay, draw)
            ok, okv = np.isfinite(out[:, 0]), np.isfinite(out[:, 1])
            acc[0, s:e] += np.where(ok, out[:, 3] * out[:, 0], 0.0)
            acc[1, s:e] += np.where(ok, out[:, 3], 0.0)
            acc[2, s:e] += np.where(okv, out[:, 1] * out[:, 2], 0.0)
            acc[3, s:e] += np.where(okv, out[:, 2], 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return acc[0] / acc[1], acc[2] / acc[3]


def _permutation_p(t: TrajectorySums, strata: list[np.ndarray], observed: float, n_perm: int,
                   rng: np.random.Generator, layouts: list[ClusterLayout] | None = None) -> float:
    """One-sided p of the within-stratum correlation: rewards permuted within each stratum.

    With ``layouts`` (clusters, as :func:`_bootstrap`), the permutations respect the clusters (Winkler
    et al. 2015, "Multi-level block permutation", NeuroImage 123:253): within each stratum, the
    rewards are shuffled within each cluster (within-block exchangeability: the trials of one task, the
    samples of one prompt are exchangeable) and whole clusters' reward vectors are permuted among the
    clusters of the same size (whole-block exchangeability). A shared outcome of a cluster stays
    shared, so a clustered reward cannot look like an association; a cluster whose size no other
    cluster of its stratum has keeps its rewards (only shuffled within it)."""
    num = np.zeros(n_perm)
    den = 0.0
    for k, idx in enumerate(strata):
        x, y = t.mean_value[idx], t.reward[idx]
        sx, sy = x.std(), y.std()
        if idx.size < 2 or sx <= 1e-12 or sy <= 1e-12:
            continue
        zx, zy = (x - x.mean()) / sx, (y - y.mean()) / sy
        if layouts is None:
            perm = rng.permuted(np.broadcast_to(zy, (n_perm, idx.size)), axis=1)
            num += idx.size * (perm @ zx) / idx.size
        else:
            num += _block_permuted_sums(zx, zy, layouts[k], n_perm, rng)
        den += idx.size
    if not den:
        return float("nan")
    null = num / den
    return float((1 + np.sum(null >= observed - 1e-12)) / (1 + n_perm))


def _block_permuted_sums(zx: np.ndarray, zy: np.ndarray, lay: ClusterLayout, n_perm: int,
                         rng: np.random.Generator) -> np.ndarray:
    """(n_perm,) ``sum_i zx_i zy_pi(i)`` of one stratum under within- and whole-block permutations of
    ``zy`` (:func:`_permutation_p`), the clusters taken size by size (ascending)."""
    total = np.zeros(n_perm)
    for size in np.unique(lay.lens):
        which = np.nonzero(lay.lens == size)[0]  # clusters of this size, in order
        rows = lay.members[(lay.starts[which][:, None] + np.arange(size)).ravel()].reshape(which.size, size)
        y = np.broadcast_to(zy[rows], (n_perm, which.size, size))
        if size > 1:
            y = rng.permuted(y, axis=2)  # within each cluster
        if which.size > 1:
            order = rng.permuted(np.broadcast_to(np.arange(which.size), (n_perm, which.size)), axis=1)
            gather = _gather_kernel()
            if gather is not None:  # whole clusters among equal sizes, times zx: one pass, the same products
                # laid out as numpy lays out take_along_axis's result (the gathered axis outermost),
                # so that the sum below adds in the same order
                prod = np.empty((which.size, n_perm, size)).transpose(1, 0, 2)
                gather(y, order, np.ascontiguousarray(zx[rows]), prod)
                total += prod.sum(axis=(1, 2))
                continue
            y = np.take_along_axis(y, order[:, :, None], axis=1)  # whole clusters among equal sizes
        total += (y * zx[rows]).sum(axis=(1, 2))
    return total


_GATHER: list[Any] = []


def _gather_kernel() -> Any:
    """The compiled ``out[p, c, j] = y[p, order[p, c], j] * w[c, j]`` of :func:`_block_permuted_sums`
    (None without numba), built once: numpy's ``take_along_axis`` then the product, without the
    gathered copy (it cost more than the permutations); the same products in the same layout, so the
    sums that follow are the same bits."""
    if _GATHER:
        return _GATHER[0]
    from critic_audit.analysis.decompose import HAVE_NUMBA

    _GATHER.append(None)
    if not HAVE_NUMBA:
        return None
    from numba import njit

    @njit(cache=True, nogil=True)
    def gather(y, order, w, out):  # pragma: no cover - compiled
        for c in range(out.shape[1]):  # (out is laid out c, p, j)
            for p in range(out.shape[0]):
                o = order[p, c]
                for j in range(out.shape[2]):
                    out[p, c, j] = y[p, o, j] * w[c, j]

    _GATHER[0] = gather
    return gather


def cluster_layouts(t: TrajectorySums, strata: list[np.ndarray]) -> list[ClusterLayout] | None:
    """The clusters of each stratum (:class:`critic_audit.analysis.clusters.ClusterLayout` over the
    stratum's positions), or None when ``t.cluster`` is None or no cluster holds two trajectories (the
    trajectory bootstrap and test then apply, unchanged)."""
    if t.cluster is None:
        return None
    lays = [ClusterLayout(np.asarray(t.cluster)[idx]) for idx in strata]
    return lays if any(lay.lens.size and lay.lens.max() > 1 for lay in lays) else None


def _num(x: float | None) -> float | None:
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def quality_gate(t: TrajectorySums, config: GateConfig = GateConfig()) -> QualityGate:
    """Judge whether the critic explains the outcome well enough for its structure to be read.

    Args:
        t: per-trajectory sums of the trajectories to judge (held out from the critic's fit).
        config: :class:`GateConfig`.

    Returns:
        :class:`critic_audit.summary.QualityGate`: ``passed``, ``status``, ``reasons``, ``n_trajectories``,
        ``n_positive``, ``n_negative``, ``n_strata``, ``corr_within_stratum`` (estimate, ci95, p_value),
        ``explained_variance_within_stratum`` (estimate, ci95), ``thresholds``, ``resampled``
        (``"trajectories"``, or ``"clusters"`` with ``n_clusters``); ``status`` is ``passed``,
        ``failed``, ``not_enough_data`` (too few trajectories with one of the outcomes) or ``unmeasured``
        (no reward varies within any stratum).

    Clusters: when ``t.cluster`` puts two or more trajectories of one stratum in one cluster (a group,
    a task's trials), the bootstrap resamples whole clusters within each stratum and the permutation
    test permutes within and among clusters (:func:`_permutation_p`), so correlated trajectories are
    not counted as independent; otherwise both are exactly the trajectory versions (the same draws).
    """
    th = dataclasses.asdict(config)
    n = int(t.reward.size)
    n_pos = int(t.positive.sum())
    n_neg = n - n_pos
    strata = [np.nonzero(t.stratum == s)[0] for s in np.unique(t.stratum)] if n else []
    rng = np.random.default_rng(config.seed)
    corr = _strata_corr(t.mean_value, t.reward, strata) if n else float("nan")
    ev = _pooled_ev(t, strata) if n else float("nan")
    gate = QualityGate(passed=False, n_trajectories=n, n_positive=n_pos, n_negative=n_neg,
                       thresholds={k: th[k] for k in ("min_per_outcome", "min_clusters", "alpha", "min_corr",
                                                       "min_explained_variance")},
                       n_strata=len(strata), corr_within_stratum=Tested(estimate=_num(corr)),
                       explained_variance_within_stratum=Interval(estimate=_num(ev)))
    if n == 0:
        return dataclasses.replace(gate, status="unmeasured", reasons=("no audited trajectory carries a reward",))
    if min(n_pos, n_neg) < config.min_per_outcome:
        return dataclasses.replace(gate, status="not_enough_data", reasons=(_too_few(t, n_pos, n_neg, config),))
    if not math.isfinite(corr) or not math.isfinite(ev):
        return dataclasses.replace(gate, status="unmeasured", reasons=(
            "the reward (or the mean value) is constant within every source and checkpoint",))
    lays = cluster_layouts(t, strata)
    if lays is not None:
        few = _too_few_clusters(lays, config.min_clusters)
        if few:
            return dataclasses.replace(gate, status="not_enough_data", resampled="clusters",
                                       n_clusters=sum(lay.n_clusters for lay in lays), reasons=(few,))
    p = _permutation_p(t, strata, corr, config.n_perm, rng, lays)
    bc, be = _bootstrap(t, strata, config.n_boot, rng, lays)
    unit = {"resampled": "trajectories"} if lays is None else {
        "resampled": "clusters", "n_clusters": sum(lay.n_clusters for lay in lays)}
    one_cluster = unit.get("n_clusters") == 1  # resampling one cluster says nothing: no interval
    if one_cluster:
        bc = be = np.full(config.n_boot, np.nan)

    def ci(x: np.ndarray) -> tuple[float | None, float | None] | None:
        x = x[np.isfinite(x)]
        return tuple(_num(v) for v in np.quantile(x, [0.025, 0.975])) if x.size else None  # type: ignore[return-value]

    ev_ci = ci(be)
    reasons = []
    if corr < 0:
        reasons.append(f"the mean value falls as the reward rises (corr {corr:.3f} < 0)")
    elif corr < config.min_corr:
        reasons.append(f"corr(mean V, reward) {corr:.3f} < {config.min_corr}")
    if p >= config.alpha:
        reasons.append(f"the correlation is not significant (permutation p = {p:.3f} >= {config.alpha})")
    if ev < config.min_explained_variance:
        reasons.append(f"explained variance {ev:.3f} < {config.min_explained_variance}")
    if one_cluster:
        reasons.append("no 95% interval of the explained variance: the trajectories judged form one cluster "
                       "(one group / task), and resampling it says nothing about other groups")
    elif ev_ci is None or ev_ci[0] is None or ev_ci[0] <= 0:
        lo = "n/a" if not ev_ci or ev_ci[0] is None else f"{ev_ci[0]:.3f}"
        reasons.append(f"the explained variance's 95% interval reaches 0 or below (low end {lo})")
    return dataclasses.replace(gate, passed=not reasons, status="passed" if not reasons else "failed",
                               reasons=tuple(reasons), **unit,
                               corr_within_stratum=Tested(estimate=_num(corr), ci95=ci(bc), p_value=_num(p)),
                               explained_variance_within_stratum=Interval(estimate=_num(ev), ci95=ev_ci))


def _too_few_clusters(lays: list[ClusterLayout], min_clusters: int) -> str | None:
    """Why clustered trajectories cannot be judged, or None: fewer than ``min_clusters`` clusters (the
    cluster bootstrap's interval ends sit on the estimate), or fewer than ``min_clusters`` clusters that
    share their size with another cluster of their stratum (the block permutation test swaps only
    clusters of equal size, so with rewards shared within clusters and every size different it cannot
    reach a small p, whatever the critic: a p-value of 1 would read as a weak critic)."""
    k = sum(lay.n_clusters for lay in lays)
    if k < min_clusters:
        return (f"the trajectories judged form {k} cluster{'s' if k != 1 else ''} (groups / tasks); intervals that "
                f"resample clusters need at least {min_clusters} to say anything about other groups")
    movable = 0
    for lay in lays:
        _, inv, counts = np.unique(lay.lens, return_inverse=True, return_counts=True)
        movable += int(np.sum(counts[inv] >= 2))
    if movable < min_clusters:
        return (f"only {movable} of the {k} clusters (groups / tasks) share their size with another cluster of "
                f"their source and checkpoint; the permutation test swaps whole clusters of equal size, so it needs "
                f"at least {min_clusters} such clusters (audit groups of equal size, e.g. the same number of "
                "samples per prompt)")
    return None


def _too_few(t: TrajectorySums, n_pos: int, n_neg: int, config: GateConfig) -> str:
    """Why the gate cannot judge: the outcomes among the judged trajectories, against ``min_per_outcome``."""
    n = n_pos + n_neg
    binary = np.unique(t.reward).size <= 2
    hi, lo = ("successes", "failures") if binary else ("higher-reward", "lower-reward")
    if n and min(n_pos, n_neg) == 0:
        have = f"all {n} {'share one reward' if not binary else 'have the same outcome'}"
        if binary and t.success is not None and t.success.size:
            have = f"all {n} are {'successes' if t.success.all() else 'failures' if not t.success.any() else 'one outcome'}"
    elif binary:  # "1 success and 2 failures"
        have = (f"{n_pos} {'success' if n_pos == 1 else 'successes'} and "
                f"{n_neg} {'failure' if n_neg == 1 else 'failures'}")
    else:
        have = f"{n_pos} {hi} and {n_neg} {lo} trajectories"
    return f"{have} among the trajectories judged; the gate needs at least {config.min_per_outcome} of each"
