"""The critic-quality gate (critic_audit.analysis.quality): golden values, loop references, the rules."""

import dataclasses

import numpy as np
import polars as pl
import pytest

from critic_audit.analysis.audit import AuditConfig, audit, recommend
from critic_audit.analysis.decompose import explained_variance
from critic_audit.analysis.quality import GateConfig, TrajectorySums, quality_gate, wilson_interval
from critic_audit.summary import AuditSummary, Breakdown, CriticQuality, Fraction, Interval, QualityGate, Recommendation, Share


def test_outcome_split():
    from critic_audit.analysis.quality import outcome_split

    assert outcome_split(np.array([0, 1, 0, 0, 1.0])).tolist() == [False, True, False, False, True]
    # graded: thresholds 0 -> 1|4, 0.5 -> 3|2 (most balanced), 0.7 -> 4|1
    assert outcome_split(np.array([0, 0.5, 0.5, 0.7, 1.0])).tolist() == [False, False, False, True, True]
    assert not outcome_split(np.array([1.0, 1.0])).any()


def test_wilson_golden():
    # hand-computed: z = 1.959964; 0/5 -> [0, z^2/(n+z^2)] = [0, 0.4345]; 5/10 -> 0.5 +- 0.2634
    lo, hi = wilson_interval(0, 5)
    assert lo == 0.0 and hi == pytest.approx(3.841459 / (5 + 3.841459), abs=1e-6)
    lo, hi = wilson_interval(5, 10)
    assert (lo, hi) == pytest.approx((0.236593, 0.763407), abs=1e-6)
    lo, hi = wilson_interval(20, 20)
    assert hi == 1.0 and lo == pytest.approx(0.838875, abs=1e-6)
    assert wilson_interval(0, 0) is None


def _synth(n_per_stratum=(30,), value_of=None, seed=0, tokens=8, reward_scale=(1.0,), shift=(0.0,)):
    """Token-level synthetic trajectories; returns (TrajectorySums, per-token arrays for references)."""
    rng = np.random.default_rng(seed)
    rows = {k: [] for k in ("stratum", "reward", "mean_value", "n_tokens", "err_mean", "err_m2", "positive")}
    tok = {"stratum": [], "v": [], "r": []}
    for s, n in enumerate(n_per_stratum):
        for i in range(n):
            success = bool(i % 2)
            r = float(success) * reward_scale[s] + shift[s]
            v = value_of(success, rng, tokens) if value_of else rng.normal(size=tokens)
            v = np.asarray(v, dtype=np.float64) * reward_scale[s] + shift[s]
            e = r - v
            rows["stratum"].append(s)
            rows["reward"].append(r)
            rows["mean_value"].append(v.mean())
            rows["n_tokens"].append(float(tokens))
            rows["err_mean"].append(e.mean())
            rows["err_m2"].append(((e - e.mean()) ** 2).sum())
            rows["positive"].append(success)
            tok["stratum"] += [s] * tokens
            tok["v"] += list(v)
            tok["r"] += [r] * tokens
    t = TrajectorySums(**{k: np.asarray(v) for k, v in rows.items()})
    return t, {k: np.asarray(v) for k, v in tok.items()}


def good(success, rng, n):
    return 0.2 + 0.6 * success + 0.05 * rng.normal(size=n)


def test_good_critic_passes_and_matches_loop_references():
    t, tok = _synth((20, 16), good, reward_scale=(1.0, 50.0), shift=(0.0, -100.0))
    g = quality_gate(t, GateConfig(n_boot=300, n_perm=300))
    assert g.status == "passed" and g.passed and g.reasons == ()
    # loop references: the n-weighted mean of per-stratum Pearson r, the N-weighted mean of per-stratum EV
    rs, ns, evs, Ns = [], [], [], []
    for s in (0, 1):
        m = t.stratum == s
        rs.append(np.corrcoef(t.mean_value[m], t.reward[m])[0, 1])
        ns.append(m.sum())
        mt = tok["stratum"] == s
        evs.append(explained_variance(tok["v"][mt], tok["r"][mt]))
        Ns.append(mt.sum())
    assert g.corr_within_stratum.estimate == pytest.approx(np.dot(rs, ns) / sum(ns), rel=1e-9)
    assert g.explained_variance_within_stratum.estimate == pytest.approx(np.dot(evs, Ns) / sum(Ns), rel=1e-9)
    assert g.corr_within_stratum.p_value == pytest.approx(1 / 301)
    lo, hi = g.explained_variance_within_stratum.ci95
    assert 0 < lo <= g.explained_variance_within_stratum.estimate <= hi


def test_gate_is_deterministic():
    t, _ = _synth((24,), lambda s, rng, n: 0.1 * s + rng.normal(size=n), seed=3)
    cfg = GateConfig(n_boot=200, n_perm=200, seed=7)
    assert quality_gate(t, cfg) == quality_gate(t, cfg)


def test_negative_correlation_fails():
    t, _ = _synth((30,), lambda s, rng, n: 0.8 - 0.6 * s + 0.05 * rng.normal(size=n))
    g = quality_gate(t, GateConfig(n_boot=200, n_perm=200))
    assert g.status == "failed"
    assert any("falls as the reward rises" in r for r in g.reasons)


def test_too_few_or_one_outcome_is_not_enough_data():
    t, _ = _synth((2,), good)  # blackjack with n = 2: corr +1.000
    g = quality_gate(t, GateConfig())
    assert g.status == "not_enough_data" and "1 success and 1 failure" in g.reasons[0]
    t, _ = _synth((12,), good)
    t.positive[:] = True
    t.success = np.ones(12, bool)
    assert "all 12 are successes" in quality_gate(t, GateConfig()).reasons[0]


def test_reward_scale_of_one_source_cannot_make_a_correlation():
    # values know nothing within either source, but the -100 source has lower values: a pooled
    # correlation would be large; the within-source one is not
    rng = np.random.default_rng(0)

    def noise(success, rng_, n):
        return rng.normal(size=n)

    t, _ = _synth((30, 30), noise, reward_scale=(1.0, 1.0), shift=(0.0, -100.0))
    pooled = np.corrcoef(t.mean_value, t.reward)[0, 1]
    assert pooled > 0.9
    g = quality_gate(t, GateConfig(n_boot=200, n_perm=500))
    assert g.status == "failed" and abs(g.corr_within_stratum.estimate) < 0.4


def test_pure_noise_false_positive_rate_small():
    """Critics of pure noise (a value unrelated to the outcome): the gate passes at most alpha of them."""
    passed = 0
    for seed in range(60):
        t, _ = _synth((20,), lambda s, rng, n: 0.5 + 0.3 * rng.normal() + 0.05 * rng.normal(size=n), seed=seed)
        passed += quality_gate(t, GateConfig(n_boot=200, n_perm=200, seed=seed)).passed
    assert passed <= 3  # alpha 0.05 of 60, and the EV floor makes it rarer still


def _tables(n, value_of, seed=0, turns=3, per_turn=5, sources=None):
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        for k in range(turns):
            for j in range(per_turn):
                rows.append((f"t{i}", k * 10 + j, k, True, float(value_of(i, k, rng))))
    tokens = pl.DataFrame(rows, schema={"trajectory_id": pl.String, "position": pl.Int32, "turn": pl.Int32,
                                        "response_mask": pl.Boolean, "value": pl.Float32}, orient="row")
    trajs = pl.DataFrame({"trajectory_id": [f"t{i}" for i in range(n)], "group_id": [None] * n,
                          "checkpoint": [None] * n, "source": sources or ["s"] * n,
                          "reward": [float(i % 2) for i in range(n)], "success": [bool(i % 2) for i in range(n)],
                          "num_turns": [turns] * n, "metadata": ["{}"] * n},
                         schema_overrides={"group_id": pl.String, "checkpoint": pl.String, "num_turns": pl.Int32})
    return trajs, tokens


CFG = AuditConfig(n_boot=200, gate=GateConfig(n_perm=200))


def test_audit_verdicts_end_to_end():
    # a critic that explains the outcome, value moving between turns: turn_level
    trajs, tokens = _tables(30, lambda i, k, rng: (i % 2) * 0.6 + 0.1 * np.random.default_rng(100 * i + k).normal()
                           + 0.01 * rng.normal())
    s = audit(trajs, tokens, CFG).summary
    assert s.critic_quality.gate.status == "passed"
    assert s.recommendation.verdict == "turn_level" and s.recommendation.confident
    # the same critic, but it was fitted on these very rollouts: nothing held out -> no confident verdict
    s = audit(trajs, tokens, CFG, fitted_ids=trajs["trajectory_id"].to_list()).summary
    assert s.critic_quality.fit_overlap.n_in_fit_data == 30
    assert s.recommendation.verdict == "not_enough_data" and not s.recommendation.confident
    # fitted on half: judged on the other half
    s = audit(trajs, tokens, CFG, fitted_ids=[f"t{i}" for i in range(10)]).summary
    assert s.critic_quality.gate.n_trajectories == 20


def test_bad_input_verdicts():
    # flat critic: every trajectory excluded, the verdict names it
    trajs, tokens = _tables(12, lambda i, k, rng: 0.5)
    r = audit(trajs, tokens, CFG).summary.recommendation
    assert r.verdict == "no_data" and "flat_critic" in r.text
    # one outcome only
    trajs, tokens = _tables(12, lambda i, k, rng: rng.normal())
    trajs = trajs.with_columns(success=pl.lit(True), reward=pl.lit(1.0))
    r = audit(trajs, tokens, CFG).summary.recommendation
    assert r.verdict == "not_enough_data" and "all 12 are successes" in r.text
    # all successes, but graded rewards that vary: judged on the reward (random values: too weak)
    trajs = trajs.with_columns(reward=pl.Series([1.0, 0.9] * 6))
    r = audit(trajs, tokens, CFG).summary.recommendation
    assert r.verdict == "critic_too_weak" and r.reasons
    # no rewards at all
    trajs = trajs.with_columns(reward=pl.lit(None, dtype=pl.Float64), success=pl.lit(None, dtype=pl.Boolean))
    assert audit(trajs, tokens, CFG).summary.recommendation.verdict == "quality_unmeasured"


def _gate(status, reasons=()):
    return CriticQuality(gate=QualityGate(status=status, reasons=tuple(reasons)))


def _fig(est, half=0.04):
    """A figure with a narrow 95% interval (clear of every threshold the rules below use)."""
    return Interval(estimate=est, ci95=None if est is None else (max(0.0, est - half), min(1.0, est + half)))


@pytest.mark.parametrize("eta,frac,gate,verdict", [
    (0.9, 0.95, _gate("passed"), "turn_level"),
    (0.9, 0.5, _gate("passed"), "multiscale"),
    (0.2, 0.1, _gate("passed"), "token_level"),
    (0.5, 0.5, _gate("passed"), "multiscale"),
    (0.9, 0.95, _gate("failed", ["corr -0.75 < 0"]), "critic_too_weak"),
    (0.2, 0.1, _gate("not_enough_data", ["1 successes and 1 failures"]), "not_enough_data"),
    (0.9, 0.95, _gate("unmeasured"), "quality_unmeasured"),
    (0.9, 0.95, CriticQuality(), "quality_unmeasured"),
    (None, None, _gate("passed"), "no_data"),
])
def test_recommendation_rules(eta, frac, gate, verdict):
    s = AuditSummary(eta2_median=_fig(eta), frac_ss_between_gt_within=_fig(frac), critic_quality=gate)
    r = recommend(s, AuditConfig())
    assert r.verdict == verdict
    assert r.confident == (verdict in ("turn_level", "token_level", "multiscale"))
    assert r.thresholds["turn_level_eta2"] == 0.7
    if r.confident:  # a credit verdict lists its deciding figures with their intervals
        assert r.reasons and all("[" in x for x in r.reasons)
    if eta is not None:
        assert recommend(s, AuditConfig(scope="all")).verdict == "not_assessed"


@pytest.mark.parametrize("eta,eta_ci,frac,frac_ci,leans,named", [
    # the shipped sample's last checkpoint: fraction (a) 13/16 = 0.8125, Wilson [0.570, 0.934] crosses 0.7
    (0.956, [0.795, 0.974], 0.8125, [0.570, 0.934], "turn_level", "fraction (a) SS_B > SS_W 0.812 [0.570, 0.934]"),
    (0.85, [0.65, 0.9], 0.9, [0.8, 0.95], "turn_level", "median eta2 0.850 [0.650, 0.900]"),
    (0.2, [0.1, 0.35], 0.1, [0.0, 0.2], "token_level", "median eta2 0.200 [0.100, 0.350]"),
    (0.5, [0.25, 0.6], 0.5, [0.4, 0.6], "multiscale", "median eta2 0.500 [0.250, 0.600]"),
    (0.6, [0.5, 0.75], 0.6, [0.45, 0.75], "multiscale", "fraction (a) SS_B > SS_W 0.600 [0.450, 0.750]"),
    (0.9, None, 1.0, None, "turn_level", "no interval"),
])
def test_recommendation_inconclusive_when_interval_contains_threshold(eta, eta_ci, frac, frac_ci, leans, named):
    s = AuditSummary(eta2_median=Interval(estimate=eta, ci95=eta_ci and tuple(eta_ci)),
                     frac_ss_between_gt_within=Fraction(estimate=frac, ci95=frac_ci and tuple(frac_ci)),
                     critic_quality=_gate("passed"))
    r = recommend(s, AuditConfig())
    assert r.verdict == "inconclusive" and not r.confident and r.leans == leans
    assert named in r.text and "audit more rollouts" in r.text and f"lean to {leans}" in r.text
    assert any(x.startswith("interval contains the threshold") and named in x for x in r.reasons)
    # the same point estimates with intervals clear of the thresholds: the confident verdict
    s = dataclasses.replace(s, eta2_median=_fig(eta, 0.01), frac_ss_between_gt_within=_fig(frac, 0.01))
    assert recommend(s, AuditConfig()).verdict == leans


def test_low_coverage_warns():
    from critic_audit.analysis.audit import coverage

    trajs, tokens = _tables(12, lambda i, k, rng: rng.normal())
    trajs = trajs.with_columns(num_turns=pl.lit(30, dtype=pl.Int32))  # episodes of 30 turns, 3 kept
    tr = {"trajectories": 12, "turns": 324, "policy_tokens": 1000, "max_length": 512, "cut_by": "max_length",
          "critic_context": 2048}
    s = audit(trajs, tokens, CFG, truncation=tr).summary
    cov = s.coverage
    assert cov.turns == Share(audited=36, read=360, share=0.1)
    assert cov.tokens.audited == 180 and cov.tokens.read == 1180
    assert cov.low and "36 of 360" in cov.warning and "(324 cut by --max-length 512)" in cov.warning
    # the critic's own context cut: the warning says so, never --max-length
    s = audit(trajs, tokens, CFG, truncation={**tr, "cut_by": "critic_context", "max_length": 2048}).summary
    assert "(324 cut by the critic's context (2048 tokens))" in s.coverage.warning
    assert "--max-length" not in s.coverage.warning
    assert not coverage(audit(*_tables(12, lambda i, k, rng: rng.normal()), CFG).per_trajectory, None).low


def test_audit_config_holds_the_gate_config():
    from critic_audit.analysis.audit import _gate_config
    from critic_audit.errors import ConfigError

    c = AuditConfig(n_boot=7, seed=3, gate=GateConfig(min_corr=0.5, n_perm=9))
    assert _gate_config(c) == GateConfig(min_corr=0.5, n_perm=9, n_boot=7, seed=3)  # one bootstrap setting
    d = c.as_dict()  # config.json: flat, as before
    assert "gate" not in d and (d["min_corr"], d["n_perm"], d["n_boot"], d["seed"], d["alpha"]) == (0.5, 9, 7, 3, 0.05)
    th = recommend(AuditSummary(eta2_median=Interval()), c).thresholds
    assert (th["min_corr"], th["min_per_outcome"], th["min_explained_variance"]) == (0.5, 5, 0.05)
    with pytest.raises(ConfigError, match="min_per_outcome must be at least 1"):
        AuditConfig(gate=GateConfig(min_per_outcome=0))


def test_checkpoint_count_counts_audited_checkpoints():
    """The by-checkpoint verdict said "3 checkpoints audited" when one had no audited trajectory."""
    from critic_audit.analysis.audit import _headline_verdict

    row = Breakdown(n=16, n_included=16, low_n=False, judged=True,
                    recommendation=Recommendation(verdict="critic_too_weak", confident=False, text="weak."))
    rows = {"step_1": Breakdown(n=4, n_included=0, low_n=True, judged=True), "step_2": row, "step_3": row}
    s = AuditSummary(eta2_median=Interval(estimate=0.5, ci95=(0.4, 0.6)), critic_quality=_gate("passed"),
                     by_checkpoint=rows, frac_ss_between_gt_within=Fraction(estimate=0.5, ci95=(0.4, 0.6)))
    rec = _headline_verdict(s, AuditConfig())
    assert rec.text.startswith("2 checkpoints audited (1 more with no audited trajectory), each critic")
    assert rec.checkpoint == "step_3"


def _loop_bootstrap(t: TrajectorySums, strata, n_boot: int, seed: int):
    """Reference of the gate's bootstrap replicates: each resample's correlation and pooled explained
    variance from numpy on its own 1-D arrays (the same draws as the gate: one matrix per stratum)."""
    rng = np.random.default_rng(seed)
    c_num, c_den, e_num, e_den = (np.zeros(n_boot) for _ in range(4))
    for idx in strata:
        if idx.size < 2:
            continue
        picks = idx[rng.integers(0, idx.size, size=(n_boot, idx.size))]
        for b, pick in enumerate(picks):
            x, y, n = t.mean_value[pick], t.reward[pick], t.n_tokens[pick]
            if x.std() > 1e-12 and y.std() > 1e-12:
                c_num[b] += idx.size * np.mean((x - x.mean()) * (y - y.mean())) / (x.std() * y.std())
                c_den[b] += idx.size
            N = n.sum()
            mu_e, mu_r = (n * t.err_mean[pick]).sum() / N, (n * y).sum() / N
            var_e = (t.err_m2[pick].sum() + (n * (t.err_mean[pick] - mu_e) ** 2).sum()) / N
            var_r = (n * (y - mu_r) ** 2).sum() / N
            if var_r > 1e-12 * max(1.0, mu_r ** 2):
                e_num[b] += (1 - var_e / var_r) * N
                e_den[b] += N
    with np.errstate(invalid="ignore", divide="ignore"):
        return c_num / c_den, e_num / e_den


@pytest.mark.parametrize("compiled", [True, False])
def test_gate_bootstrap_replicates_match_a_per_resample_loop(monkeypatch, compiled):
    # The compiled kernel (numba) and the numpy fallback give each resample's statistics of the same
    # draws: equal to the loop reference up to float rounding (sums in another order).
    from critic_audit.analysis import quality as Q

    if not compiled:
        monkeypatch.setattr(Q, "_KERNEL", [None])
    rng = np.random.default_rng(4)
    B = 90
    reward = rng.integers(0, 2, B).astype(float)
    reward[:5] = 1.0  # stratum 0: constant reward (no correlation, no EV), stratum 3: one trajectory
    mv = 0.4 * reward + rng.normal(size=B)
    n = rng.integers(1, 500, B).astype(float)
    t = TrajectorySums(stratum=np.r_[[0] * 5, [1] * 40, [2] * 44, [3]], reward=reward, mean_value=mv, n_tokens=n,
                       err_mean=reward - mv + 0.1 * rng.normal(size=B), err_m2=rng.random(B) * n,
                       positive=reward > 0)
    strata = [np.nonzero(t.stratum == s)[0] for s in range(4)]
    got = Q._bootstrap(t, strata, 300, np.random.default_rng(9))
    want = _loop_bootstrap(t, strata, 300, 9)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-13)


@pytest.mark.parametrize("n_boot,verdict", [(1, "inconclusive"), (199, "inconclusive"), (200, "turn_level")])
def test_too_few_bootstrap_resamples_support_no_confident_verdict(n_boot, verdict):
    """analyze --bootstrap 1 printed "median eta2 0.996 [0.997, 0.997]" (an interval excluding its own estimate)
    with a confident turn_level: intervals from fewer than 200 resamples now give inconclusive, leaning to the
    estimates' verdict and asking for --bootstrap 2000."""
    from critic_audit.analysis.quality import MIN_CONFIDENT_BOOTSTRAP

    assert MIN_CONFIDENT_BOOTSTRAP == 200
    s = AuditSummary(eta2_median=Interval(estimate=0.996, ci95=(0.997, 0.997)),
                     frac_ss_between_gt_within=_fig(0.95), critic_quality=_gate("passed"))
    r = recommend(s, AuditConfig(n_boot=n_boot))
    assert r.verdict == verdict and r.confident == (verdict == "turn_level")
    if verdict == "inconclusive":
        assert r.leans == "turn_level"
        assert r.text.startswith(f"Inconclusive: the 95% intervals come from only {n_boot} bootstrap resample(s) "
                                 "(fewer than 200), too few to rest a confident verdict on.")
        assert r.text.endswith("rerun with --bootstrap 2000.")
        assert r.reasons[0] == f"bootstrap resamples {n_boot} < 200"


def test_block_permutation_kernel_gives_numpys_bits():
    """The permutation test's whole-block step (clusters of one size permuted among themselves, times
    zx) runs in a numba kernel: the same null sums, bit for bit, as numpy's take_along_axis and product."""
    from critic_audit.analysis import quality as Q
    from critic_audit.analysis.clusters import ClusterLayout

    if Q._gather_kernel() is None:
        pytest.skip("numba not installed")
    rng = np.random.default_rng(5)
    for lens in ([8] * 32, [1, 2, 2, 3, 3, 3, 8, 8, 1, 5] * 4, [2] * 300):
        cl = np.repeat(np.arange(len(lens)), lens)
        rng.shuffle(cl)
        zx, zy = rng.normal(size=cl.size), rng.normal(size=cl.size)
        fast = Q._block_permuted_sums(zx, zy, ClusterLayout(cl), 500, np.random.default_rng(1))
        kernel, Q._GATHER[0] = Q._GATHER[0], None
        try:
            slow = Q._block_permuted_sums(zx, zy, ClusterLayout(cl), 500, np.random.default_rng(1))
        finally:
            Q._GATHER[0] = kernel
        assert fast.tolist() == slow.tolist()
