"""Clustered rollouts (a GRPO group, the trials of one task: ``group_id``): the gate's bootstrap resamples
whole clusters and its permutation test permutes within and among clusters; the headline's median-eta2
bootstrap resamples clusters and the fractions' Wilson intervals use the design effect. Without clusters
every figure is the trajectory version's, draw for draw."""

import dataclasses
import math

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from critic_audit.analysis import clusters as CL
from critic_audit.analysis import quality as Q
from critic_audit.analysis.audit import AuditConfig, audit, cluster_codes
from critic_audit.analysis.clusters import ClusterLayout, cluster_bootstrap_ci, design_effect
from critic_audit.analysis.decompose import HAVE_NUMBA, bootstrap_ci
from critic_audit.analysis.quality import GateConfig, TrajectorySums, outcome_split, quality_gate, wilson_interval


def _sums(rows: dict) -> TrajectorySums:
    d = {k: np.asarray(v) for k, v in rows.items()}
    return TrajectorySums(positive=outcome_split(d["reward"]), **d)


def _add(rows: dict, stratum: int, cluster, r: float, v: np.ndarray) -> None:
    e = r - v
    for k, x in (("stratum", stratum), ("reward", r), ("mean_value", v.mean()), ("n_tokens", float(v.size)),
                 ("err_mean", e.mean()), ("err_m2", ((e - e.mean()) ** 2).sum()), ("cluster", cluster)):
        rows.setdefault(k, []).append(x)


def _shared_outcomes(pos=(0.9, 0.75, 0.6, 0.35), neg=(0.1, 0.3, 0.45, 0.5), trials=4, tokens=10) -> TrajectorySums:
    """8 tasks of 4 trials; every trial of a task has the task's outcome and nearly its value (task value +
    0.02 per trial index, a fixed wiggle over tokens): 32 trajectories that carry 8 tasks' evidence."""
    rows: dict = {}
    for c, (r, v0) in enumerate([(1.0, v) for v in pos] + [(0.0, v) for v in neg]):
        for j in range(trials):
            _add(rows, 0, c, r, v0 + 0.02 * (j - 1.5) + 0.05 * np.sin(np.arange(tokens) + j))
    return _sums(rows)


def test_shared_outcomes_make_the_trajectory_interval_narrow_and_the_cluster_interval_wide():
    t = _shared_outcomes()
    cfg = GateConfig(n_boot=2000, n_perm=2000)
    by_traj = quality_gate(dataclasses.replace(t, cluster=None), cfg)
    by_task = quality_gate(t, cfg)
    assert by_traj.resampled == "trajectories" and by_traj.n_clusters is None
    assert by_task.resampled == "clusters" and by_task.n_clusters == 8
    ev_t, ev_c = by_traj.explained_variance_within_stratum, by_task.explained_variance_within_stratum
    assert ev_t.estimate == ev_c.estimate  # the estimate does not depend on the resampling unit
    # trajectories: 32 "independent" draws, the interval clear of 0 and the gate passes
    assert by_traj.status == "passed" and ev_t.ci95[0] > 0.15
    # tasks: 8 draws of 4 copies each, about sqrt(4) = 2 times wider, reaching below 0; the test over 8
    # tasks (70 ways to split them 4:4) cannot reach p < 0.05 with this ordering
    assert by_task.status == "failed" and ev_c.ci95[0] < 0
    w_t, w_c = ev_t.ci95[1] - ev_t.ci95[0], ev_c.ci95[1] - ev_c.ci95[0]
    assert 1.7 < w_c / w_t < 2.6
    assert by_traj.corr_within_stratum.p_value < 0.005 < 0.05 <= by_task.corr_within_stratum.p_value
    c_t, c_c = by_traj.corr_within_stratum.ci95, by_task.corr_within_stratum.ci95
    assert c_c[1] - c_c[0] > 1.5 * (c_t[1] - c_t[0])


def test_wilson_at_the_design_effects_effective_n_golden():
    # 10 clusters of 4 whose trajectories share the flag, 7 clusters positive: p = 0.7,
    # cluster variance C/(C-1) sum (k_c - p m)^2 / n^2 = p(1-p)/(C-1), binomial p(1-p)/n:
    # deff = n / (C - 1) = 40/9, n_eff = 9, k_eff = 6.3
    flags = np.repeat([1, 1, 1, 1, 1, 1, 1, 0, 0, 0], 4).astype(bool)
    cl = np.repeat(np.arange(10), 4)
    assert design_effect(flags, cl) == pytest.approx(40 / 9, rel=1e-12)
    z = 1.959963984540054
    n, p = 9.0, 0.7
    den = 1 + z * z / n
    center, half = (p + z * z / (2 * n)) / den, z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    assert wilson_interval(6.3, 9.0) == pytest.approx((center - half, center + half), rel=1e-12)
    assert (center - half, center + half) == pytest.approx((0.38249, 0.89785), abs=1e-5)  # by hand
    # no clustering within clusters (one trajectory each, or flags that vary inside every cluster as in the
    # whole): at least 1, never below; a constant flag has no design effect
    assert design_effect(flags, np.arange(40)) == pytest.approx(40 / 39)
    assert design_effect(np.tile([True, False], 20), np.repeat(np.arange(10), 4)) == 1.0
    # every trajectory agrees: no estimate, the largest design effect the sizes allow (2 clusters of 4: 4)
    assert design_effect(np.ones(8, bool), np.repeat(np.arange(2), 4)) == 4.0


# --- loop references -----------------------------------------------------------------------------------

def _loop_stats(t, pick):
    x, y, n = t.mean_value[pick], t.reward[pick], t.n_tokens[pick]
    r = np.nan
    if x.std() > 1e-12 and y.std() > 1e-12:
        r = np.mean((x - x.mean()) * (y - y.mean())) / (x.std() * y.std())
    N = n.sum()
    mu_e, mu_r = (n * t.err_mean[pick]).sum() / N, (n * y).sum() / N
    var_e = (t.err_m2[pick].sum() + (n * (t.err_mean[pick] - mu_e) ** 2).sum()) / N
    var_r = (n * (y - mu_r) ** 2).sum() / N
    ev = 1 - var_e / var_r if var_r > 1e-12 * max(1.0, mu_r ** 2) else np.nan
    return r, ev, N


def _loop_cluster_bootstrap(t, strata, n_boot, seed):
    """Per resample: draw K of the stratum's K clusters (in first-appearance order) with replacement,
    concatenate their trajectories, compute the stratum's corr and EV; pool as the gate does."""
    rng = np.random.default_rng(seed)
    acc = np.zeros((4, n_boot))
    for idx in strata:
        if idx.size < 2:
            continue
        codes = t.cluster[idx]
        order = list(dict.fromkeys(codes.tolist()))
        groups = [idx[codes == c] for c in order]
        chunk = max(1, 1_000_000 // idx.size)
        for s in range(0, n_boot, chunk):
            e = min(n_boot, s + chunk)
            draws = rng.integers(0, len(groups), size=(e - s, len(groups)))
            for b in range(s, e):
                pick = np.concatenate([groups[c] for c in draws[b - s]])
                r, ev, N = _loop_stats(t, pick)
                if np.isfinite(r):
                    acc[0, b] += pick.size * r
                    acc[1, b] += pick.size
                if np.isfinite(ev):
                    acc[2, b] += ev * N
                    acc[3, b] += N
    with np.errstate(invalid="ignore", divide="ignore"):
        return acc[0] / acc[1], acc[2] / acc[3]


def _uneven(seed=4):
    """Three strata: constant reward (no corr, no EV), clusters of 1 to 6 trajectories, one trajectory."""
    rng = np.random.default_rng(seed)
    rows: dict = {}
    for s, n_clusters in ((0, 2), (1, 9), (2, 11), (3, 1)):
        for c in range(n_clusters):
            size = 1 if s == 3 else int(rng.integers(1, 7))
            p = 1.0 if s == 0 else rng.random()
            off = rng.normal()
            for _ in range(size):
                r = float(rng.random() < p)
                _add(rows, s, f"{s}-{c}", r, 0.3 * off + 0.4 * r + rng.normal(size=int(rng.integers(1, 40))))
    return _sums(rows)


@pytest.mark.parametrize("compiled", [True, False])
def test_cluster_bootstrap_replicates_match_a_per_resample_loop(monkeypatch, compiled):
    if not compiled:
        monkeypatch.setattr(Q, "_KERNEL", [None])
    t = _uneven()
    strata = [np.nonzero(t.stratum == s)[0] for s in range(4)]
    lays = Q.cluster_layouts(t, strata)
    assert lays is not None and [lay.n_clusters for lay in lays] == [2, 9, 11, 1]
    got = Q._bootstrap(t, strata, 300, np.random.default_rng(9), lays)
    want = _loop_cluster_bootstrap(t, strata, 300, 9)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-13)


@pytest.mark.parametrize("stat,compiled", [("median", True), ("median", False), ("mean", False)])
def test_cluster_bootstrap_ci_matches_a_loop(monkeypatch, stat, compiled):
    if not compiled:
        monkeypatch.setattr(CL, "_KERNEL", [None])
    rng = np.random.default_rng(2)
    cl = np.repeat(np.arange(15), rng.integers(1, 6, 15))
    x = rng.random(cl.size) + 0.2 * cl
    x[3] = np.nan  # dropped with its trajectory
    est, lo, hi, k = cluster_bootstrap_ci(x, cl, stat, n_boot=500, seed=5)
    ok = np.isfinite(x)
    xs, cs = x[ok], cl[ok]
    groups = [xs[cs == c] for c in dict.fromkeys(cs.tolist())]
    draws = np.random.default_rng(5).integers(0, len(groups), size=(500, len(groups)))
    fn = {"median": np.median, "mean": np.mean}[stat]
    meds = [fn(np.concatenate([groups[c] for c in row])) for row in draws]
    assert k == 15 and est == fn(xs)
    # np.median averages the middle pair its own way, a weighted mean sums in another order: to the last bits
    assert (lo, hi) == pytest.approx(tuple(np.quantile(meds, [0.025, 0.975])), rel=1e-13)


# --- without clusters nothing changes ----------------------------------------------------------------

@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(-5, 5, allow_nan=False), min_size=1, max_size=60), st.integers(0, 2**31),
       st.sampled_from(["median", "mean"]))
def test_clusters_of_one_give_the_trajectory_bootstrap(x, seed, stat):
    x = np.asarray(x)
    est, lo, hi = bootstrap_ci(x, stat, n_boot=300, seed=seed)
    got = cluster_bootstrap_ci(x, np.arange(x.size)[::-1], stat, n_boot=300, seed=seed)
    if stat == "median" and HAVE_NUMBA:  # the same draws counted by the same ranks
        assert got == (est, lo, hi, x.size)
    else:  # a mean by weights sums in another order; np.median averages the middle pair its own way
        assert got[:3] == pytest.approx((est, lo, hi), rel=1e-12, abs=1e-12) and got[3] == x.size


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 10_000), st.lists(st.integers(2, 25), min_size=1, max_size=3))
def test_gate_with_clusters_of_one_is_the_trajectory_gate(seed, sizes):
    rng = np.random.default_rng(seed)
    rows: dict = {}
    for s, n in enumerate(sizes):
        for i in range(n):
            r = float(i % 2)
            _add(rows, s, f"{s}/{i}", r, 0.2 * r + rng.normal(size=int(rng.integers(1, 20))))
    t = _sums(rows)
    strata = [np.nonzero(t.stratum == s)[0] for s in range(len(sizes))]
    singles = [ClusterLayout(np.arange(idx.size)) for idx in strata]
    # the kernel's sums with clusters of one are the trajectory draws' sums: identical
    a = Q._bootstrap(t, strata, 200, np.random.default_rng(seed), None)
    b = Q._bootstrap(t, strata, 200, np.random.default_rng(seed), singles)
    for u, v in zip(a, b):
        np.testing.assert_allclose(u, v, rtol=1e-12, atol=1e-14)
        if Q._resample_kernel() is not None:
            assert np.array_equal(u, v, equal_nan=True)
    corr = Q._strata_corr(t.mean_value, t.reward, strata)
    if math.isfinite(corr):
        assert Q._permutation_p(t, strata, corr, 200, np.random.default_rng(seed)) == \
            Q._permutation_p(t, strata, corr, 200, np.random.default_rng(seed), singles)
    # and the gate never sees such clusters: the trajectory version, the same object
    cfg = GateConfig(n_boot=200, n_perm=200, seed=seed, min_per_outcome=1)
    assert quality_gate(t, cfg) == quality_gate(dataclasses.replace(t, cluster=None), cfg)


# --- the permutation test under H0 with clustered rewards ----------------------------------------------

def _clustered_null(seed, n_tasks=8, trials=8):
    """H0: values know nothing of the outcome. Each task has its own success rate (Beta(0.3, 0.3): most
    tasks mostly succeed or mostly fail) and its own value offset, independently."""
    rng = np.random.default_rng(seed)
    rows: dict = {}
    for c in range(n_tasks):
        p, off = rng.beta(0.3, 0.3), rng.normal()
        for _ in range(trials):
            r = float(rng.random() < p)
            _add(rows, 0, c, r, 0.5 + 0.3 * off + 0.05 * rng.normal() + 0.1 * rng.normal(size=20))
    return _sums(rows)


def test_cluster_permutation_test_keeps_its_level_under_clustered_h0():
    """200 seeded null data sets of 8 tasks x 8 trials: permuting trajectories rejects 31.5% of them at
    alpha = 0.05 (the trials of a task move together in value and in outcome); the cluster permutation
    6.5% (1,000 sets: 25.9% against 6.2%)."""
    rej = {"trajectories": 0, "clusters": 0}
    n = 0
    for seed in range(200):
        t = _clustered_null(seed)
        strata = [np.arange(t.reward.size)]
        corr = Q._strata_corr(t.mean_value, t.reward, strata)
        if not math.isfinite(corr):
            continue
        n += 1
        rng = np.random.default_rng(seed)
        rej["trajectories"] += Q._permutation_p(t, strata, corr, 400, rng) < 0.05
        rng = np.random.default_rng(seed)
        rej["clusters"] += Q._permutation_p(t, strata, corr, 400, rng, Q.cluster_layouts(t, strata)) < 0.05
    assert n == 200
    assert rej["trajectories"] / n > 0.18
    assert rej["clusters"] / n <= 0.08  # binomial(200, 0.05): 0.08 is 2 sd above


def test_cluster_permutation_test_still_finds_a_real_association():
    rng = np.random.default_rng(0)
    rows: dict = {}
    for c in range(12):
        p = rng.beta(0.5, 0.5)
        for _ in range(4):
            r = float(rng.random() < p)
            _add(rows, 0, c, r, 0.5 * r + 0.1 * rng.normal(size=10))
    g = quality_gate(_sums(rows), GateConfig(n_boot=500, n_perm=500))
    assert g.resampled == "clusters" and g.corr_within_stratum.p_value < 0.01


# --- through the audit: the table's group_id, streamed = in memory -------------------------------------

def _tables(groups, seed=0):
    """One trajectory per entry of ``groups`` (its group_id or None), 3 turns x 4 tokens; every other group
    (in order of appearance) succeeds, values move between turns and follow the outcome."""
    rng = np.random.default_rng(seed)
    rows, n = [], len(groups)
    order = {g: k for k, g in enumerate(dict.fromkeys(g for g in groups if g is not None))}
    reward = [float(order[g] % 2) if g is not None else float(i % 2) for i, g in enumerate(groups)]
    for i in range(n):
        base = 0.6 * reward[i] + 0.2 * rng.normal()
        for k in range(3):
            lvl = base + 0.3 * rng.normal()
            rows += [(f"t{i}", k * 10 + j, k, True, float(lvl + 0.05 * rng.normal())) for j in range(4)]
    tokens = pl.DataFrame(rows, schema={"trajectory_id": pl.String, "position": pl.Int32, "turn": pl.Int32,
                                        "response_mask": pl.Boolean, "value": pl.Float32}, orient="row")
    trajs = pl.DataFrame({"trajectory_id": [f"t{i}" for i in range(n)], "group_id": groups,
                          "checkpoint": [None] * n, "source": ["s"] * n, "reward": reward,
                          "success": [r > 0 for r in reward], "num_turns": [3] * n, "metadata": ["{}"] * n},
                         schema_overrides={"group_id": pl.String, "checkpoint": pl.String, "num_turns": pl.Int32})
    return trajs, tokens


def test_cluster_codes_of_the_table():
    trajs, _ = _tables(["a", "a", None, "b", None, "b"])
    codes = cluster_codes(trajs)
    assert codes is not None and codes[0] == codes[1] and codes[3] == codes[5]
    assert len(set(codes.tolist())) == 4  # each null group_id its own cluster
    # the same group_id in two sources (or checkpoints) is two clusters; distinct ids: no clusters
    two = trajs.with_columns(source=pl.Series(["x", "y", "x", "x", "y", "x"]))
    c2 = cluster_codes(two)
    assert c2[0] != c2[1] and c2[3] == c2[5]
    assert cluster_codes(trajs.with_columns(group_id=pl.Series([f"g{i}" for i in range(6)]))) is None
    assert cluster_codes(trajs.with_columns(group_id=pl.lit(None, pl.String))) is None


def test_audit_resamples_groups_and_says_so():
    groups = [f"task{i // 4}" for i in range(40)]
    trajs, tokens = _tables(groups)
    cfg = AuditConfig(n_boot=300, gate=GateConfig(n_perm=300))
    s = audit(trajs, tokens, cfg).summary
    plain = audit(trajs.with_columns(group_id=pl.lit(None, pl.String)), tokens, cfg).summary
    assert s.eta2_median.n_clusters == 10 and plain.eta2_median.n_clusters is None
    assert s.eta2_median.estimate == plain.eta2_median.estimate
    ci = s.eta2_median.ci95
    assert ci == cluster_bootstrap_ci(audit(trajs, tokens, cfg).per_trajectory["eta2"].to_numpy(),
                                      np.repeat(np.arange(10), 4), n_boot=300, seed=0)[1:3]
    g = s.critic_quality.gate
    assert g.resampled == "clusters" and g.n_clusters == 10 and plain.critic_quality.gate.resampled == "trajectories"
    f = s.frac_ss_between_gt_within
    assert f.design_effect >= 1 and f.n_effective == pytest.approx(f.n / f.design_effect)
    raw = wilson_interval(f.k / f.design_effect, f.n / f.design_effect)
    # widened to 40 of 40's low end / 0 of 40's high end at n_eff 10 (10 groups of 4) where it is narrower
    z2 = 1.959963984540054 ** 2
    assert f.ci95 == pytest.approx((min(raw[0], 10 / (10 + z2)), max(raw[1], z2 / (10 + z2))))
    assert plain.frac_ss_between_gt_within.design_effect is None
    d = s.to_dict()
    assert d["critic_quality"]["gate"]["resampled"] == "clusters" and d["eta2_median"]["n_clusters"] == 10
    assert "n_clusters" not in plain.to_dict()["eta2_median"]
    from critic_audit.report import report_markdown

    md = report_markdown(d, [])
    assert "bootstrap over 10 clusters" in md and "resample whole clusters (10 groups / tasks" in md
    assert "resample trajectories within source and checkpoint" in report_markdown(plain.to_dict(), [])


def test_streamed_equals_in_memory_with_groups(tmp_path):
    """A verl dump whose uid puts 4 rows of a batch in one group: the streamed audit resamples the same
    9 clusters (3 steps x 3 groups) as the in-memory one, with the same figures."""
    from test_stream_analyze import _both, _dump, _same_summary

    run = _dump(tmp_path / "run", nan_row=3)
    s, m = _both(tmp_path, [run], AuditConfig(n_boot=200, min_group_n=3))
    _same_summary(s, m)
    d = s.summary.to_dict()
    assert d["eta2_median"]["n_clusters"] == 9 and d["critic_quality"]["gate"]["resampled"] == "clusters"
    assert d["frac_ss_between_gt_within"]["design_effect"] >= 1


def test_fit_critics_held_out_gate_resamples_groups():
    from critic_audit.pipeline.fit import held_out_quality

    t = _shared_outcomes()
    rng = np.random.default_rng(0)
    values = [t.mean_value[i] + 0.01 * rng.normal(size=5) for i in range(t.reward.size)]
    groups = [f"task{c}" for c in t.cluster]
    by_task = held_out_quality(values, t.reward, ["s"] * t.reward.size, 0, groups)
    by_traj = held_out_quality(values, t.reward, ["s"] * t.reward.size, 0)
    assert by_task["resampled"] == "clusters" and by_task["n_clusters"] == 8
    assert by_traj["resampled"] == "trajectories" and "n_clusters" not in by_traj
    lo_c, hi_c = by_task["corr_within_stratum"]["ci95"]
    lo_t, hi_t = by_traj["corr_within_stratum"]["ci95"]
    assert hi_c - lo_c > 1.5 * (hi_t - lo_t)


def test_one_group_gives_no_interval():
    """16 samples of one prompt: resampling the one cluster is always the same sample, so no interval is
    given (median eta2: none, and a verdict is not confident; the gate: not_enough_data, fewer than 6 clusters)."""
    trajs, tokens = _tables(["p0"] * 16)
    trajs = trajs.with_columns(reward=pl.Series([float(i % 2) for i in range(16)]),
                               success=pl.Series([bool(i % 2) for i in range(16)]))
    s = audit(trajs, tokens, AuditConfig(n_boot=200, gate=GateConfig(n_perm=200))).summary
    assert s.eta2_median.n_clusters == 1 and s.eta2_median.ci95 is None
    g = s.critic_quality.gate
    assert g.resampled == "clusters" and g.n_clusters == 1 and g.status == "not_enough_data"
    assert g.explained_variance_within_stratum.ci95 is None and g.corr_within_stratum.ci95 is None
    assert g.reasons == ("the trajectories judged form 1 cluster (groups / tasks); intervals that resample "
                         "clusters need at least 6 to say anything about other groups",)
    from critic_audit.analysis.audit import _side

    assert _side(s.eta2_median, 0.7, strict_above=False)[1].endswith("(no interval: fewer than 2 clusters (groups / tasks))")


@pytest.mark.parametrize("k", [2, 3, 5])
def test_a_handful_of_clusters_is_not_enough_data(k):
    """k < min_clusters (6) groups of 10 trajectories whose values follow the outcome: a percentile cluster
    bootstrap over k clusters has a handful of distinct resamples (an interval end equal to the estimate),
    so the gate says not_enough_data and no credit verdict is given (review 3: 2 x 10 gave a confident
    token_level). Six groups are judged."""
    groups = [f"p{g}" for g in range(k) for _ in range(10)]
    trajs, tokens = _tables(groups)
    s = audit(trajs, tokens, AuditConfig(n_boot=200, gate=GateConfig(n_perm=200, min_per_outcome=1))).summary
    g = s.critic_quality.gate
    assert g.status == "not_enough_data" and g.n_clusters == k and g.resampled == "clusters"
    assert g.reasons == (f"the trajectories judged form {k} clusters (groups / tasks); intervals that resample "
                         "clusters need at least 6 to say anything about other groups",)
    assert s.recommendation.verdict == "not_enough_data" and not s.recommendation.confident
    six = audit(*_tables([f"p{g}" for g in range(6) for _ in range(10)]),
                AuditConfig(n_boot=200, gate=GateConfig(n_perm=200, min_per_outcome=1))).summary.critic_quality.gate
    assert six.status != "not_enough_data" and six.n_clusters == 6


def test_clusters_of_all_different_sizes_are_not_enough_data():
    """Rewards shared within tasks of 2..13 trials (every size different): the block permutation test can
    swap no cluster, so its p is 1 whatever the critic; the gate says not_enough_data (diff review #1), not
    critic_too_weak. The same number of tasks, 4 trials each, is judged (and passes: values follow the outcome)."""
    uneven = [f"t{k}" for k in range(12) for _ in range(k + 2)]
    g = audit(*_tables(uneven), AuditConfig(n_boot=200, gate=GateConfig(n_perm=200))).summary.critic_quality.gate
    assert g.status == "not_enough_data" and g.n_clusters == 12
    assert g.reasons[0].startswith("only 0 of the 12 clusters (groups / tasks) share their size with another")
    even = [f"t{k}" for k in range(12) for _ in range(4)]
    g4 = audit(*_tables(even), AuditConfig(n_boot=200, gate=GateConfig(n_perm=200))).summary.critic_quality.gate
    assert g4.status == "passed" and g4.n_clusters == 12
