"""Clusters of trajectories for the intervals and the test: the rollouts of one prompt (a GRPO group,
``uid``) or the trials of one task (tau-bench ``task_id``), which the readers put in ``group_id``.

Trajectories of one cluster are not independent (trials of one task mostly share their outcome), so an
interval that resamples trajectories treats correlated draws as independent and comes out too narrow.
When some cluster holds more than one trajectory, the audit's intervals resample whole clusters
instead (the cluster bootstrap: Davison & Hinkley 1997, *Bootstrap Methods and their Application*,
section 3.8; Field & Welsh 2007, JRSS-B 69:369, "randomize clusters"), and a fraction's Wilson
interval uses the design-effect-adjusted effective sample size (Kish 1965, *Survey Sampling*; Korn &
Graubard 1998, Survey Methodology 24:193; Dean & Pagano 2015, J. Survey Stat. Methodol. 3:484).
Without clusters (every cluster of one trajectory) nothing here is used and every figure is what the
trajectory bootstrap gives. A cluster is a ``group_id`` within one (source, checkpoint) stratum; a
trajectory without a ``group_id`` is a cluster of its own.

Everything is deterministic given the seed; with all clusters of size 1 :func:`cluster_bootstrap_ci`
draws the same resamples as :func:`critic_audit.analysis.decompose.bootstrap_ci` and returns the same
interval (bit for bit where numba computes the latter's medians; else up to the last bit of the
average of a middle pair).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["ClusterLayout", "has_clusters", "cluster_bootstrap_ci", "design_effect",
           "max_design_effect", "bootstrap_sums_ci"]


class ClusterLayout:
    """Trajectories grouped by cluster, clusters in the order of their first trajectory.

    Attributes:
        members: (n,) int64 positions of the trajectories, cluster by cluster (within a cluster in
            their own order).
        starts: (K,) int64 where each cluster's members start in ``members``.
        lens: (K,) int64 trajectories per cluster.
        local: (n,) int64 each trajectory's cluster (0..K-1).
    """

    __slots__ = ("members", "starts", "lens", "local")

    def __init__(self, codes: np.ndarray) -> None:
        codes = np.asarray(codes)
        if codes.size == 0:
            self.local = self.members = self.starts = self.lens = np.zeros(0, np.int64)
            return
        _, first, inv = np.unique(codes, return_index=True, return_inverse=True)
        rank = np.empty(first.size, np.int64)
        rank[np.argsort(first, kind="stable")] = np.arange(first.size)
        self.local = rank[inv.reshape(-1)]
        self.members = np.argsort(self.local, kind="stable").astype(np.int64)
        self.lens = np.bincount(self.local, minlength=first.size).astype(np.int64)
        self.starts = (np.cumsum(self.lens) - self.lens).astype(np.int64)

    @property
    def n_clusters(self) -> int:
        return int(self.lens.size)


def has_clusters(codes: np.ndarray | None) -> bool:
    """True when some cluster code is shared by more than one trajectory."""
    if codes is None or np.asarray(codes).size < 2:
        return False
    _, counts = np.unique(np.asarray(codes), return_counts=True)
    return bool(counts.max() > 1)


_KERNEL: list = []


def _median_kernel():
    """Compiled medians of cluster resamples (None without numba), built once: per resample, the
    trajectories drawn counted by rank, the middle order statistic(s) found by a search in the counts'
    running sum; the same figures as :func:`_weighted_stat`, without an (R, n) matrix."""
    if not _KERNEL:
        from critic_audit.analysis.decompose import HAVE_NUMBA

        _KERNEL.append(None)
        if HAVE_NUMBA:
            from numba import njit

            @njit(cache=True, nogil=True)
            def medians(draw, starts, lens, member_rank, xs, out):  # pragma: no cover - compiled
                counts = np.zeros(xs.shape[0], dtype=np.int64)
                for b in range(draw.shape[0]):
                    counts[:] = 0
                    total = 0
                    for c in draw[b]:
                        for q in range(starts[c], starts[c] + lens[c]):
                            counts[member_rank[q]] += 1
                        total += lens[c]
                    cum = np.cumsum(counts)
                    lo = np.searchsorted(cum, (total - 1) // 2, side="right")
                    hi = np.searchsorted(cum, total // 2, side="right")
                    out[b] = xs[lo] if lo == hi else (xs[lo] + xs[hi]) / 2.0

            _KERNEL[0] = medians
    return _KERNEL[0]


def _weighted_stat(w: np.ndarray, x: np.ndarray, stat: str) -> np.ndarray:
    """Per row of ``w`` ((R, n) multiplicities of the trajectories of ``x``, sorted ascending for the
    median): the mean, or the median of the sample holding ``x[i]`` ``w[r, i]`` times: its middle order
    statistic(s) found by counting (``(x[lo] + x[hi]) / 2`` for an even count, as the trajectory
    bootstrap's compiled medians take them), no sort per resample."""
    m = w.sum(axis=1)
    if stat == "mean":
        return (w * x).sum(axis=1) / m
    cum = np.cumsum(w, axis=1)
    lo = np.argmax(cum > ((m - 1) // 2)[:, None], axis=1)
    hi = np.argmax(cum > (m // 2)[:, None], axis=1)
    return np.where(lo == hi, x[lo], (x[lo] + x[hi]) / 2.0)


def cluster_bootstrap_ci(x: np.ndarray, cluster: np.ndarray, stat: str = "median", *, n_boot: int = 2000,
                         seed: int = 0, level: float = 0.95) -> tuple[float, float, float, int]:
    """Point estimate and seeded percentile cluster-bootstrap interval of a statistic over trajectories.

    Each resample draws K clusters with replacement out of the K clusters (whole clusters, every
    trajectory of a drawn cluster in), and computes the statistic over the trajectories drawn.

    Args:
        x: (n,) per-trajectory values (float, or bool for a fraction); NaNs are dropped (with them
            their trajectories; a cluster left empty is no cluster).
        cluster: (n,) cluster code of each trajectory (any numpy dtype).
        stat: ``"median"`` or ``"mean"``.
        n_boot: resamples; seed: of ``numpy.random.default_rng``; level: coverage.

    Returns:
        ``(estimate, low, high, n_clusters)``; NaN figures (and 0) when ``x`` has no finite value.
        With every cluster of size 1 it equals :func:`critic_audit.analysis.decompose.bootstrap_ci`
        (the same draws: the k-th cluster is the k-th trajectory).
    """
    x = np.asarray(x, dtype=np.float64)
    ok = np.isfinite(x)
    x, codes = x[ok], np.asarray(cluster)[ok]
    if x.size == 0:
        return float("nan"), float("nan"), float("nan"), 0
    fn = {"median": np.median, "mean": np.mean}[stat]
    lay = ClusterLayout(codes)
    K = lay.n_clusters
    rng = np.random.default_rng(seed)
    out = np.empty(n_boot)
    chunk = max(1, 2_000_000 // x.size)
    order = np.argsort(x, kind="stable")
    xs = x[order]
    kernel = _median_kernel() if stat == "median" else None
    if kernel is not None:
        rank = np.empty(x.size, dtype=np.int64)
        rank[order] = np.arange(x.size)
        member_rank = rank[lay.members]
    for s in range(0, n_boot, chunk):
        e = min(n_boot, s + chunk)
        draw = rng.integers(0, K, size=(e - s, K))
        if kernel is not None:
            kernel(draw, lay.starts, lay.lens, member_rank, xs, out[s:e])
            continue
        counts = np.bincount((draw + K * np.arange(e - s)[:, None]).ravel(), minlength=(e - s) * K)
        w = counts.reshape(e - s, K)[:, lay.local[order]].astype(np.float64)  # multiplicities, sorted by x
        out[s:e] = _weighted_stat(w, xs, stat)
    alpha = (1 - level) / 2
    lo, hi = np.quantile(out, [alpha, 1 - alpha])
    return float(fn(x)), float(lo), float(hi), K


_SUMS: list = []


def _sums_kernel():
    """Compiled column sums of cluster resamples (None without numba), built once: per resample, the
    drawn clusters' sums added in draw order (no (R, K) count matrix)."""
    if not _SUMS:
        from critic_audit.analysis.decompose import HAVE_NUMBA

        _SUMS.append(None)
        if HAVE_NUMBA:
            from numba import njit

            @njit(cache=True, nogil=True)
            def sums(draw, per_c, out):  # pragma: no cover - compiled
                m = per_c.shape[1]
                for b in range(draw.shape[0]):
                    for j in range(m):
                        out[b, j] = 0.0
                    for c in draw[b]:
                        for j in range(m):
                            out[b, j] += per_c[c, j]

            _SUMS[0] = sums
    return _SUMS[0]


def bootstrap_sums_ci(cols: np.ndarray, cluster: np.ndarray | None, stats: Sequence[Any], *, n_boot: int = 2000,
                      seed: int = 0, level: float = 0.95) -> list[tuple[float, float, float] | None]:
    """Seeded percentile bootstrap intervals of statistics of column sums (ratios of sums: the boundary
    share of ``|dV|``, the boundary : within step ratio), resampling whole clusters, or trajectories when
    ``cluster`` is None (each its own cluster): each resample draws K of the K units with replacement
    and sums ``cols`` over the trajectories drawn (Davison & Hinkley 1997, section 3.8); every statistic
    is computed on the same resamples.

    Args:
        cols: (n, m) float per-trajectory sums (e.g. boundary |dV|, within |dV|, their step counts).
        cluster: (n,) cluster codes, or None.
        stats: functions of (R, m) summed columns -> (R,) statistic (NaN where undefined; those resamples
            are dropped).
        n_boot, seed, level: resamples, ``numpy.random.default_rng`` seed, coverage.

    Returns:
        One ``(estimate, low, high)`` per statistic; None with fewer than 2 units, or when the statistic is
        undefined on the data or on more than half of the resamples.
    """
    cols = np.asarray(cols, dtype=np.float64).reshape(len(cols), -1)
    codes = np.arange(len(cols)) if cluster is None else np.asarray(cluster)
    lay = ClusterLayout(codes)
    K = lay.n_clusters
    with np.errstate(divide="ignore", invalid="ignore"):
        ests = [float(f(cols.sum(axis=0)[None, :])[0]) for f in stats]
    if K < 2 or not any(math.isfinite(e) for e in ests):
        return [None] * len(stats)
    per_c = np.zeros((K, cols.shape[1]))
    np.add.at(per_c, lay.local, cols)
    rng = np.random.default_rng(seed)
    summed = np.empty((n_boot, cols.shape[1]))
    chunk = max(1, 2_000_000 // K)
    kernel = _sums_kernel()
    for s0 in range(0, n_boot, chunk):
        e = min(n_boot, s0 + chunk)
        draw = rng.integers(0, K, size=(e - s0, K))
        if kernel is not None:
            kernel(draw, per_c, summed[s0:e])
            continue
        counts = np.bincount((draw + K * np.arange(e - s0)[:, None]).ravel(), minlength=(e - s0) * K)
        summed[s0:e] = counts.reshape(e - s0, K).astype(np.float64) @ per_c
    alpha = (1 - level) / 2
    out: list[tuple[float, float, float] | None] = []
    for f, est in zip(stats, ests):
        with np.errstate(divide="ignore", invalid="ignore"):
            r = f(summed)
        ok = r[np.isfinite(r)]
        if not math.isfinite(est) or ok.size < n_boot / 2:
            out.append(None)
            continue
        lo, hi = np.quantile(ok, [alpha, 1 - alpha])
        out.append((est, float(lo), float(hi)))
    return out


def design_effect(flags: np.ndarray, cluster: np.ndarray) -> float:
    """Design effect of a fraction estimated from clustered trajectories: the variance of ``k / n``
    over clusters (ratio estimator, clusters drawn with replacement: ``C / (C - 1) * sum_c (k_c - p
    n_c)^2 / n^2``) over the binomial ``p (1 - p) / n`` (Kish 1965), at least 1 (Korn & Graubard 1998
    truncate it there).

    When the data cannot estimate it (``p`` is 0 or 1: every trajectory agrees, so the between-cluster
    variance is 0 whatever the clustering; or a single cluster), the design effect is the largest the
    cluster sizes allow, that of an intra-cluster correlation of 1 (Kish 1965, section 5.4:
    ``deff = 1 + (m - 1) rho``; for unequal sizes ``sum_c n_c^2 / n``, the weighted-cluster form), so
    ``n / deff = n^2 / sum_c n_c^2``: the number of clusters when they are of one size, fewer when not.
    A fallback of 1 there would treat 28 agreeing trajectories in 7 tasks as 28 independent draws.

    Args:
        flags: (n,) bool per trajectory (nulls already dropped).
        cluster: (n,) cluster code of each trajectory.

    Returns:
        float in ``[1, n]`` (1 for ``n = 0``).
    """
    y = np.asarray(flags, dtype=np.float64)
    n = y.size
    if n == 0:
        return 1.0
    lay = ClusterLayout(np.asarray(cluster))
    C = lay.n_clusters
    p = float(y.mean())
    if C < 2 or p <= 0.0 or p >= 1.0:
        return max_design_effect(lay.lens)
    k_c = np.bincount(lay.local, weights=y, minlength=C)
    var_c = C / (C - 1) * float(np.sum((k_c - p * lay.lens) ** 2)) / (n * n)
    deff = var_c / (p * (1 - p) / n)
    return max(1.0, deff) if math.isfinite(deff) else max_design_effect(lay.lens)


def max_design_effect(sizes: np.ndarray) -> float:
    """The design effect at an intra-cluster correlation of 1, ``sum_c n_c^2 / n`` for cluster sizes
    ``n_c`` ((C,) ints, ``n = sum_c n_c``): every cluster counts as one draw, weighted by its size, so the
    effective sample size ``n / deff = n^2 / sum_c n_c^2`` is C for equal sizes (Kish 1965, *Survey
    Sampling*, section 5.4). 1 for no trajectories."""
    sizes = np.asarray(sizes, dtype=np.float64)
    n = float(sizes.sum())
    return float(np.sum(sizes * sizes)) / n if n > 0 else 1.0
