"""Between-turn / within-turn decomposition of critic values, per trajectory (vectorized).

Definitions: ``shared/spec/AUDIT.md``; the measurement comes from the MPO paper (arXiv:2610.35013),
the statistics are the one-way ANOVA decomposition with turns as groups (eta-squared, omega-squared,
F, ICC(1)).

For trajectory b with K turns (groups), turn k holding ``n_k`` values ``v_{k,j}``, ``N = sum n_k``,
turn mean ``m_k`` and token-weighted grand mean ``m``::

    SS_T = sum_{k,j} (v_{k,j} - m)^2
    SS_B = sum_k n_k (m_k - m)^2
    SS_W = sum_{k,j} (v_{k,j} - m_k)^2            (SS_T = SS_B + SS_W)
    eta2 = SS_B / SS_T
    MS_B = SS_B / (K - 1),  MS_W = SS_W / (N - K)
    omega2 = (SS_B - (K - 1) MS_W) / (SS_T + MS_W)
    F = MS_B / MS_W
    ICC1 = (MS_B - MS_W) / (MS_B + (n0 - 1) MS_W),  n0 = (N - sum n_k^2 / N) / (K - 1)

The three readings of "between-turn variance exceeds within-turn variance": (a) ``SS_B > SS_W``;
(b) the unweighted population variance of the K turn means exceeds the mean of the K within-turn
population variances; (c) ``F > 1``.

Boundary jumps: for consecutive selected tokens of one trajectory, ``|v_{i+1} - v_i|`` is a *within*
step when both are in one turn and a *boundary* step otherwise.

Everything is computed with ``numpy.bincount`` over flat arrays (no Python loop over trajectories) in
float64, with per-trajectory centring before squaring (two passes), so values far from zero do not lose
precision.
"""

from __future__ import annotations

import numpy as np
import polars as pl

#: Exclusion reasons produced by :func:`decompose` (counted in the audit summary).
EXCLUDE_NO_TOKENS = "no_tokens"
EXCLUDE_NON_FINITE = "non_finite_value"
EXCLUDE_SINGLE_TURN = "single_turn"
EXCLUDE_FLAT = "flat_critic"


def _segment_codes(traj: np.ndarray, seg: np.ndarray) -> np.ndarray:
    """Group code per token: a new group starts wherever the trajectory or the segment changes."""
    n = traj.shape[0]
    change = np.empty(n, dtype=bool)
    if n:
        change[0] = True
        np.not_equal(traj[1:], traj[:-1], out=change[1:])
        change[1:] |= seg[1:] != seg[:-1]
    return np.cumsum(change, dtype=np.int64) - 1


def decompose(traj: np.ndarray, seg: np.ndarray, values: np.ndarray, num_trajectories: int | None = None) -> pl.DataFrame:
    """Per-trajectory decomposition of values into between-segment and within-segment variance.

    Args:
        traj: (N,) int trajectory index in ``[0, B)`` of each selected token.
        seg: (N,) int segment (turn) index of each token within its trajectory. Tokens of one
            segment must be contiguous once sorted by ``(traj, position)``.
        values: (N,) float critic values ``V_t`` of the selected tokens (any float dtype; computed in
            float64). Non-finite values exclude their trajectory.
        num_trajectories: B; default ``traj.max() + 1``.

    The arrays must be in ``(traj, position)`` order (as the tokens table is stored); when ``traj`` is
    not non-decreasing they are sorted stably by ``traj``.

    Returns:
        A DataFrame with B rows (row b = trajectory b) and columns ``n_tokens`` (N), ``n_turns`` (K),
        ``value_mean``, ``ss_total``, ``ss_between``, ``ss_within``, ``eta2``, ``omega2``, ``f_stat``,
        ``icc1``, ``var_turn_means``, ``mean_within_var``, ``reading_a``, ``reading_b``, ``reading_c``,
        ``boundary_abs``, ``within_abs``, ``n_boundary_steps``, ``n_within_steps``, ``boundary_share``,
        ``boundary_ratio``, ``excluded`` (null when included, else one of ``no_tokens``,
        ``non_finite_value``, ``single_turn``, ``flat_critic``). Statistics of excluded trajectories are
        null. ``omega2``, ``f_stat`` and ``icc1`` are NaN when N == K (no within-turn degrees of freedom).
    """
    traj = np.asarray(traj, dtype=np.int64)
    seg = np.asarray(seg, dtype=np.int64)
    v = np.asarray(values, dtype=np.float64)
    if not (traj.shape == seg.shape == v.shape):
        raise ValueError(f"traj, seg and values must have one shape, got {traj.shape}, {seg.shape}, {v.shape}")
    B = int(num_trajectories if num_trajectories is not None else (traj.max() + 1 if traj.size else 0))
    if traj.size and np.any(traj[1:] < traj[:-1]):
        order = np.argsort(traj, kind="stable")
        traj, seg, v = traj[order], seg[order], v[order]

    finite = np.isfinite(v)
    bad_traj = np.bincount(traj[~finite], minlength=B) > 0 if not finite.all() else np.zeros(B, bool)
    v = np.where(finite, v, 0.0)

    g = _segment_codes(traj, seg)
    G = int(g[-1] + 1) if g.size else 0
    # trajectory of each group (first token of the group)
    first = np.ones(traj.shape[0], dtype=bool)
    if traj.size:
        first[1:] = g[1:] != g[:-1]
    g_traj = traj[first]

    N = np.bincount(traj, minlength=B).astype(np.float64)
    K = np.bincount(g_traj, minlength=B).astype(np.float64)
    n_g = np.bincount(g, minlength=G).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        m = np.bincount(traj, weights=v, minlength=B) / N
        d = v - m[traj]  # centred on the trajectory mean (two-pass)
        md_g = np.bincount(g, weights=d, minlength=G) / n_g  # turn mean minus grand mean
        r = d - md_g[g]  # deviation from the turn mean
        ss_t = np.bincount(traj, weights=d * d, minlength=B)
        ss_w_g = np.bincount(g, weights=r * r, minlength=G)
        ss_w = np.bincount(g_traj, weights=ss_w_g, minlength=B)
        ss_b = np.bincount(g_traj, weights=n_g * md_g * md_g, minlength=B)

        eta2 = ss_b / ss_t
        ms_b = ss_b / (K - 1)
        ms_w = np.where(N > K, ss_w / (N - K), np.nan)
        f_stat = ms_b / ms_w
        omega2 = (ss_b - (K - 1) * ms_w) / (ss_t + ms_w)
        sum_n2 = np.bincount(g_traj, weights=n_g * n_g, minlength=B)
        n0 = (N - sum_n2 / N) / (K - 1)
        icc1 = (ms_b - ms_w) / (ms_b + (n0 - 1) * ms_w)
        # (b): unweighted population variance of turn means vs mean within-turn population variance
        mean_md = np.bincount(g_traj, weights=md_g, minlength=B) / K
        var_turn_means = np.bincount(g_traj, weights=md_g * md_g, minlength=B) / K - mean_md * mean_md
        var_turn_means = np.maximum(var_turn_means, 0.0)
        mean_within_var = np.bincount(g_traj, weights=ss_w_g / n_g, minlength=B) / K

    # Boundary vs within steps between consecutive selected tokens of one trajectory.
    if traj.size > 1:
        same_traj = traj[1:] == traj[:-1]
        step = np.abs(np.diff(v))
        boundary = same_traj & (g[1:] != g[:-1])
        within = same_traj & ~boundary
        t_step = traj[1:]
        b_abs = np.bincount(t_step[boundary], weights=step[boundary], minlength=B)
        w_abs = np.bincount(t_step[within], weights=step[within], minlength=B)
        n_b = np.bincount(t_step[boundary], minlength=B)
        n_w = np.bincount(t_step[within], minlength=B)
    else:
        b_abs = w_abs = np.zeros(B)
        n_b = n_w = np.zeros(B, dtype=np.int64)
    with np.errstate(invalid="ignore", divide="ignore"):
        boundary_share = b_abs / (b_abs + w_abs)
        boundary_ratio = (b_abs / n_b) / (w_abs / n_w)

    # Flat critic: every value of the trajectory identical (exact test via max - min).
    flat = np.zeros(B, dtype=bool)
    if traj.size:
        starts = np.flatnonzero(np.r_[True, traj[1:] != traj[:-1]])
        present = traj[starts]
        vmax = np.maximum.reduceat(v, starts)
        vmin = np.minimum.reduceat(v, starts)
        flat[present] = vmax == vmin

    reason = np.full(B, None, dtype=object)
    reason[flat] = EXCLUDE_FLAT
    reason[K < 2] = EXCLUDE_SINGLE_TURN
    reason[bad_traj] = EXCLUDE_NON_FINITE
    reason[N == 0] = EXCLUDE_NO_TOKENS
    incl = np.array([r is None for r in reason])

    def stat(x: np.ndarray) -> np.ndarray:
        return np.where(incl, x, np.nan)

    df = pl.DataFrame(
        {
            "n_tokens": N.astype(np.int64),
            "n_turns": K.astype(np.int64),
            "value_mean": stat(m),
            "ss_total": stat(ss_t),
            "ss_between": stat(ss_b),
            "ss_within": stat(ss_w),
            "eta2": stat(eta2),
            "omega2": stat(omega2),
            "f_stat": stat(f_stat),
            "icc1": stat(icc1),
            "var_turn_means": stat(var_turn_means),
            "mean_within_var": stat(mean_within_var),
            "boundary_abs": stat(b_abs),
            "within_abs": stat(w_abs),
            "n_boundary_steps": n_b.astype(np.int64),
            "n_within_steps": n_w.astype(np.int64),
            "boundary_share": stat(boundary_share),
            "boundary_ratio": stat(boundary_ratio),
            "excluded": pl.Series(list(reason), dtype=pl.String),
        }
    )
    nan_cols = [c for c, t in df.schema.items() if t == pl.Float64]
    df = df.with_columns(
        reading_a=pl.when(pl.col("excluded").is_null()).then(pl.col("ss_between") > pl.col("ss_within")),
        reading_b=pl.when(pl.col("excluded").is_null()).then(pl.col("var_turn_means") > pl.col("mean_within_var")),
        reading_c=pl.when(pl.col("excluded").is_null()).then(pl.col("f_stat").fill_nan(None) > 1.0),
    )
    # Excluded trajectories: null (not NaN) statistics.
    df = df.with_columns([pl.when(pl.col("excluded").is_null()).then(pl.col(c)) for c in nan_cols])
    return df


def bootstrap_ci(x: np.ndarray, stat: str = "median", *, n_boot: int = 2000, seed: int = 0,
                 level: float = 0.95) -> tuple[float, float, float]:
    """Point estimate and seeded percentile bootstrap interval of a statistic over trajectories.

    Args:
        x: (n,) per-trajectory values (float, or bool for a fraction); NaNs are dropped.
        stat: ``"median"`` or ``"mean"`` (a fraction is the mean of a bool).
        n_boot: resamples (trajectories drawn with replacement).
        seed: seed of ``numpy.random.default_rng``; the same seed gives the same interval.
        level: coverage of the interval.

    Returns:
        ``(estimate, low, high)``; all NaN when ``x`` has no finite value.
    """
    x = np.asarray(x, dtype=np.float64)
    x = x[np.isfinite(x)]
    if x.size == 0:
        return (float("nan"),) * 3
    fn = {"median": np.median, "mean": np.mean}[stat]
    rng = np.random.default_rng(seed)
    est = float(fn(x))
    out = np.empty(n_boot)
    chunk = max(1, 2_000_000 // x.size)
    for s in range(0, n_boot, chunk):
        e = min(n_boot, s + chunk)
        idx = rng.integers(0, x.size, size=(e - s, x.size))
        out[s:e] = fn(x[idx], axis=1)
    alpha = (1 - level) / 2
    lo, hi = np.quantile(out, [alpha, 1 - alpha])
    return est, float(lo), float(hi)


def explained_variance(values: np.ndarray, returns: np.ndarray) -> float:
    """Explained variance ``1 - Var(returns - values) / Var(returns)`` over all given tokens at once.

    Args:
        values: (N,) critic values of the policy tokens of the whole data set.
        returns: (N,) the return target of each token (with gamma = 1 and outcome rewards: its
            trajectory's reward).

    Returns:
        The explained variance (1 is perfect, 0 no better than the mean, negative worse); NaN when the
        returns have no variance.
    """
    values = np.asarray(values, dtype=np.float64)
    returns = np.asarray(returns, dtype=np.float64)
    ok = np.isfinite(values) & np.isfinite(returns)
    values, returns = values[ok], returns[ok]
    var_r = returns.var()
    if values.size == 0 or var_r == 0:
        return float("nan")
    return float(1.0 - (returns - values).var() / var_r)
