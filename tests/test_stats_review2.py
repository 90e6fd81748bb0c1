"""Review 2's statistics items: the design effect where the data cannot estimate it (#3)."""

import math

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from critic_audit.analysis.audit import AuditConfig, audit
from critic_audit.analysis.clusters import design_effect, max_design_effect
from critic_audit.analysis.quality import GateConfig, wilson_interval
from critic_audit.report import report_markdown
from critic_audit.summary import AuditSummary

Z = 1.959963984540054


def test_agreeing_trajectories_count_their_clusters_golden():
    # 28 trajectories in 7 tasks of 4, all flags true: deff = sum n_c^2 / n = 7 * 16 / 28 = 4, n_eff = 7;
    # Wilson at 7 of 7: low end n / (n + z^2) = 7 / (7 + 3.8415) = 0.64567 (was [0.879, 1] at n = 28)
    cl = np.repeat(np.arange(7), 4)
    assert design_effect(np.ones(28, bool), cl) == 4.0
    assert design_effect(np.zeros(28, bool), cl) == 4.0
    lo, hi = wilson_interval(28 / 4, 28 / 4)
    assert lo == pytest.approx(7 / (7 + Z * Z), rel=1e-12) and hi == 1.0
    assert lo == pytest.approx(0.64567, abs=1e-5) and lo < 0.7
    # unequal sizes 1 and 3: sum n_c^2 / n = 10 / 4 = 2.5, n_eff = 16 / 10 = 1.6 (< 2 clusters)
    assert design_effect(np.ones(4, bool), np.array([0, 1, 1, 1])) == 2.5
    # one cluster: no between-cluster variance at all, n_eff = 1 whatever p
    assert design_effect(np.array([1, 1, 0, 1, 1, 0, 1, 1], bool), np.zeros(8)) == 8.0
    assert max_design_effect(np.array([4, 4, 4])) == 4.0 and max_design_effect(np.array([], int)) == 1.0


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 6), st.floats(0, 1)), min_size=1, max_size=12), st.integers(0, 2**31))
def test_design_effect_bounds(clusters, seed):
    """1 <= deff <= n (n_eff between 1 and n); a constant flag gives exactly the ICC = 1 bound, n^2 / sum n_c^2
    (loop reference)."""
    rng = np.random.default_rng(seed)
    sizes = [m for m, _ in clusters]
    cl = np.repeat(np.arange(len(sizes)), sizes)
    flags = np.concatenate([rng.random(m) < q for m, q in clusters])
    n = cl.size
    d = design_effect(flags, cl)
    assert d >= 1.0
    if len(sizes) < 2 or flags.all() or not flags.any():
        assert d == pytest.approx(sum(m * m for m in sizes) / n, rel=1e-12) and d <= n
    ref = sum(m * m for m in sizes) / n
    assert design_effect(np.ones(n, bool), cl) == pytest.approx(ref, rel=1e-12)
    assert n / design_effect(np.zeros(n, bool), cl) == pytest.approx(n * n / sum(m * m for m in sizes))
    if all(m == sizes[0] for m in sizes):
        assert n / ref == pytest.approx(len(sizes))


def _agreeing(n_tasks=7, trials=4, seed=0):
    """n_tasks x trials trajectories, 3 turns x 4 tokens with turn levels reward + 0, 0.1, 0.2 (+ noise 0.01): every
    SS_B > SS_W; tasks alternate success, values follow the outcome."""
    rng = np.random.default_rng(seed)
    rows, ids, groups, rewards = [], [], [], []
    for t in range(n_tasks):
        for j in range(trials):
            i = f"t{t}_{j}"
            r = float(t % 2)
            ids.append(i), groups.append(f"task{t}"), rewards.append(r)
            for k in range(3):
                rows += [(i, k * 10 + q, k, True, float(r + 0.1 * k + 0.01 * rng.normal())) for q in range(4)]
    n = len(ids)
    tokens = pl.DataFrame(rows, schema={"trajectory_id": pl.String, "position": pl.Int32, "turn": pl.Int32,
                                        "response_mask": pl.Boolean, "value": pl.Float32}, orient="row")
    trajs = pl.DataFrame({"trajectory_id": ids, "group_id": groups, "checkpoint": [None] * n, "source": ["s"] * n,
                          "reward": rewards, "success": [r > 0 for r in rewards], "num_turns": [3] * n,
                          "metadata": ["{}"] * n},
                         schema_overrides={"group_id": pl.String, "checkpoint": pl.String, "num_turns": pl.Int32})
    return trajs, tokens


def test_agreeing_clusters_make_the_verdict_inconclusive():
    trajs, tokens = _agreeing()
    s = audit(trajs, tokens, AuditConfig(n_boot=300, gate=GateConfig(n_perm=300))).summary
    for f in (s.frac_ss_between_gt_within, s.frac_var_turn_means_gt_mean_within_var, s.frac_f_gt_1):
        assert (f.k, f.n, f.design_effect, f.n_effective) == (28, 28, 4.0, 7.0)
        assert f.ci95[0] == pytest.approx(7 / (7 + Z * Z), rel=1e-9)
        assert f.widened is False and f.widened_to_n_effective is None  # Wilson's at n_eff 7 already
    assert "widened" not in report_markdown(s, [])
    rec = s.recommendation
    assert rec.verdict == "inconclusive" and not rec.confident and rec.leans == "turn_level"
    # the same trajectories without groups: 28 independent draws, Wilson low end 28 / (28 + z^2) > 0.7
    plain = audit(trajs.with_columns(group_id=pl.lit(None, pl.String)), tokens,
                  AuditConfig(n_boot=300, gate=GateConfig(n_perm=300))).summary
    assert plain.frac_ss_between_gt_within.ci95[0] == pytest.approx(28 / (28 + Z * Z), rel=1e-9)
    assert math.isclose(28 / (28 + Z * Z), 0.87936, abs_tol=1e-5)


def _chat_group_rows(path, n=12):
    """n chat rollouts, 4 per task (group_id), 3 assistant turns each, reward alternating by task."""
    import json

    rows = []
    for i in range(n):
        msgs = [{"role": "user", "content": f"q{i}"}]
        for k in range(3):
            msgs += [{"role": "assistant", "content": f"a{i} {k}"}, {"role": "user", "content": f"u{k}"}]
        rows.append(json.dumps({"id": str(i), "group_id": f"task{i // 4}", "reward": float((i // 4) % 2),
                                "messages": msgs[:-1]}))
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return path


def test_lenient_copies_are_audited_once_and_reported(tmp_path):
    """#9: a.jsonl and its copy b.jsonl: --lenient reads 12 rollouts in 3 tasks, not 24 in 6 clusters; the
    copies are counted in input.notes and named in report.md's coverage line."""
    from critic_audit.io.inputs import read_all
    from critic_audit.io.records import ReadOptions, ReadReport

    d = tmp_path / "mix"
    d.mkdir()
    _chat_group_rows(d / "a.jsonl")
    (d / "b.jsonl").write_bytes((d / "a.jsonl").read_bytes())
    rep = ReadReport()
    convs = read_all([d], ReadOptions(lenient=True), report=rep).conversations
    assert [c.trajectory_id for c in convs] == [str(i) for i in range(12)]
    assert sorted({c.group_id for c in convs}) == ["task0", "task1", "task2"]  # not a/task0 and b/task0
    assert rep.notes["duplicate_trajectories"] == 12
    from critic_audit.report import report_markdown
    from critic_audit.summary import AuditSummary

    s = AuditSummary(n_trajectories=12, n_included=0).to_dict()
    s["input"] = {"notes": {"duplicate_trajectories": 12}}
    md = report_markdown(s, [])
    assert "Copies: 12 rollouts repeated another file's id and content (copies of one export), dropped" in md


# --- #4: rewards and values beyond MAX_MAGNITUDE (1e100) are refused in one line, by analyze and check ---

def _tok_rows(path, reward_of_t1=1.0, value=None):
    """4 tokenized rows (JSONL) with values; row t1's reward and its values[2] set by the caller."""
    import json

    rows = []
    for i in range(4):
        vals = [None, None, 0.1 * i, 0.2 * i, None, 0.3 * i, 0.4 * i]
        if i == 1 and value is not None:
            vals[2] = value
        rows.append({"trajectory_id": f"t{i}", "input_ids": [1, 2, 3, 4, 5, 6, 7],
                     "response_mask": [0, 0, 1, 1, 0, 1, 1], "values": vals,
                     "reward": reward_of_t1 if i == 1 else float(i % 2)})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.mark.parametrize("suffix", ["jsonl", "parquet"])
def test_out_of_range_reward_and_value_are_refused_naming_record_and_field(tmp_path, suffix):
    from critic_audit.check import load_rollouts
    from critic_audit.errors import InputError
    from critic_audit.io.inputs import read_all
    from critic_audit.io.records import MAX_MAGNITUDE, ReadOptions, ReadReport

    assert MAX_MAGNITUDE == 1e100

    def make(name, **kw):
        p = _tok_rows(tmp_path / f"{name}.jsonl", **kw)
        if suffix == "parquet":
            pl.read_ndjson(p).write_parquet(tmp_path / f"{name}.parquet")
            p.unlink()
            p = tmp_path / f"{name}.parquet"
        return p

    line = " (line 2, id 't1')" if suffix == "jsonl" else " (id 't1')"
    huge = make("huge", reward_of_t1=1e300)
    want = (f"{huge}: record 1{line}: reward 'reward' = 1e+300 is out of range (|reward| > 1e+100: the audit's "
            "statistics would overflow) (fix: give the record a reward of ordinary size, or drop the record)")
    for read in (lambda o: read_all([huge], o), lambda o: load_rollouts([huge], read_options=o)):
        with pytest.raises(InputError) as e:
            read(ReadOptions())
        assert str(e.value) == want
    bigv = make("bigv", value=-1e300)
    with pytest.raises(InputError) as e:
        load_rollouts([bigv], read_options=ReadOptions())
    assert str(e.value) == (f"{bigv}: record 1{line}: values[2] = -1e+300 is out of range (|x| > 1e+100: the audit's "
                            "statistics would overflow) (fix: write values at its real scale (null where unknown))")
    with pytest.raises(InputError, match=r"values\[2\] = -1e\+300 is out of range"):
        read_all([bigv], ReadOptions())
    # --lenient skips the row and counts it; the bound itself is read
    rep = ReadReport()
    got = load_rollouts([huge], read_options=ReadOptions(lenient=True), report=rep)
    assert [r.trajectory_id for r in got] == ["t0", "t2", "t3"] and sum(rep.skipped.values()) == 1
    edge = make("edge", reward_of_t1=-1e100, value=1e100)
    assert sorted(r.trajectory_id for r in load_rollouts([edge], read_options=ReadOptions())) == ["t0", "t1", "t2", "t3"]


def test_out_of_range_reward_in_canonical_tables_is_refused(tmp_path):
    from critic_audit.errors import InputError
    from critic_audit.io.tables import read_tables

    d = tmp_path / "canon"
    d.mkdir()
    trajs, tokens = _agreeing(n_tasks=2, trials=2)
    trajs.with_columns(reward=pl.Series([0.0, -1e300, 1.0, 1.0])).write_parquet(d / "trajectories.parquet")
    tokens.write_parquet(d / "tokens.parquet")
    with pytest.raises(InputError) as e:
        read_tables(d)
    assert str(e.value) == (f"{d / 'trajectories.parquet'}: record 1 (trajectory 't0_1'): trajectories table: reward = "
                            "-1e+300 is out of range (|reward| > 1e+100: the audit's statistics would overflow) (1 such "
                            "row) (fix: give the trajectory a finite reward of ordinary size (null where it has none), "
                            "or pass --lenient to skip it)")


# --- #5 / #13: why a checkpoint gets no credit verdict; p-values as the test can show them ---

def test_format_p_golden():
    from critic_audit.summary import format_p

    assert [format_p(p) for p in (None, 1 / 2001, 0.000999, 0.001, 0.0029985, 0.215, 1.0)] == [
        "n/a", "< 0.001", "< 0.001", "0.001", "0.003", "0.215", "1.000"]


def _two_checkpoints():
    """ck1: values follow the reward (gate passes); ck2: values are noise (corr ~ 0: critic_too_weak)."""
    a, ta = _agreeing(n_tasks=10, trials=4, seed=1)
    b, tb = _agreeing(n_tasks=6, trials=4, seed=2)
    rng = np.random.default_rng(5)
    b = b.with_columns(trajectory_id="b" + pl.col("trajectory_id"), checkpoint=pl.lit("ck2"),
                       group_id="b" + pl.col("group_id"))
    tb = tb.with_columns(trajectory_id="b" + pl.col("trajectory_id"),
                         value=pl.Series(0.1 * (tb["turn"].to_numpy() + rng.normal(size=tb.height))).cast(pl.Float32))
    a = a.with_columns(checkpoint=pl.lit("ck1"))
    return pl.concat([a, b]), pl.concat([ta, tb])


def test_reports_say_why_a_checkpoint_is_critic_too_weak():
    from critic_audit.report import md_escape, report_markdown
    from critic_audit.summary import no_credit_reasons

    trajs, tokens = _two_checkpoints()
    s = audit(trajs, tokens, AuditConfig(n_boot=300, min_group_n=5, gate=GateConfig(n_perm=300))).summary
    ck2 = s.by_checkpoint["ck2"]
    assert ck2.recommendation.verdict == "critic_too_weak"
    why = no_credit_reasons(s.by_checkpoint)
    assert [k for k, _, _ in why] == ["ck2"] and why[0][2] == tuple(ck2.critic_quality.gate.reasons) and why[0][2]
    md = report_markdown(s.to_dict(), [])
    assert "Why these checkpoints get no credit verdict (the failed quality-gate conditions):" in md
    assert f"- ck2: critic_too_weak: {md_escape('; '.join(why[0][2]))}" in md
    assert "explained variance -0.057 < 0.05" in why[0][2]
    from critic_audit.cli_render import checkpoint_reasons

    assert checkpoint_reasons(s) == [f"  ck2: critic_too_weak: {'; '.join(why[0][2])}"]
    g = ck2.critic_quality.gate
    c = g.corr_within_stratum
    row = next(x for x in md.splitlines() if x.startswith("| ck2 |"))
    assert row.startswith(f"| ck2 | 24 ({g.n_positive} / {g.n_negative}) |")
    assert f"| {c.estimate:.3f} (p {c.p_value:.3f}) | critic_too_weak |" in row
    g1 = s.by_checkpoint["ck1"].critic_quality.gate
    assert g1.corr_within_stratum.p_value < 0.001 or f"(p {g1.corr_within_stratum.p_value:.3f})" in md
    assert "p 0.000" not in md and "p = 0.000" not in md


# --- #13: intervals of omega2 / ICC / F, of the boundary ratios, of monitor's precision / recall ---

def test_bootstrap_sums_ci_loop_reference():
    """The ratio of resampled sums, against a loop over the same draws (one chunk: R x K < 2e6)."""
    from critic_audit.analysis.clusters import bootstrap_sums_ci

    rng = np.random.default_rng(3)
    cols = np.column_stack([rng.random(12), rng.random(12) + 0.5])
    codes = np.repeat(np.arange(4), 3)

    def stat(t):
        return t[:, 0] / (t[:, 0] + t[:, 1])

    [got] = bootstrap_sums_ci(cols, codes, [stat], n_boot=500, seed=7)
    per_c = np.array([cols[codes == c].sum(axis=0) for c in range(4)])
    draw = np.random.default_rng(7).integers(0, 4, size=(500, 4))
    ref = [stat(per_c[row].sum(axis=0)[None, :])[0] for row in draw]
    assert got[0] == pytest.approx(cols[:, 0].sum() / cols.sum(), rel=1e-12)
    assert got[1:] == pytest.approx(tuple(np.quantile(ref, [0.025, 0.975])), rel=1e-12)
    # trajectories (cluster None): each its own unit; identical trajectories: a zero-width interval
    same = np.tile([[1.0, 3.0]], (10, 1))
    assert bootstrap_sums_ci(same, None, [stat], n_boot=200)[0] == pytest.approx((0.25, 0.25, 0.25))
    assert bootstrap_sums_ci(cols[:1], None, [stat]) == [None]  # one unit: no interval
    # undefined on the data (no |dV| at all): no interval; 1 of 10 rows defined: most resamples still hold it
    assert bootstrap_sums_ci(np.zeros((10, 2)), None, [stat], n_boot=200) == [None]
    sparse = np.zeros((10, 2))
    sparse[0] = [1.0, 1.0]
    assert bootstrap_sums_ci(sparse, None, [stat], n_boot=200) == [(0.5, 0.5, 0.5)]


def test_structure_figures_carry_intervals_over_the_headline_unit():
    from critic_audit.analysis.clusters import bootstrap_sums_ci, cluster_bootstrap_ci
    from critic_audit.report import report_markdown

    trajs, tokens = _agreeing(n_tasks=7, trials=4)
    res = audit(trajs, tokens, AuditConfig(n_boot=300, gate=GateConfig(n_perm=300)))
    s, per = res.summary, res.per_trajectory
    codes = np.repeat(np.arange(7), 4)
    for key in ("omega2", "icc1", "f_stat"):
        iv = s.medians_ci[key]
        assert iv.n_clusters == 7 and iv.estimate == pytest.approx(getattr(s, f"{key}_median"))
        assert iv.ci95 == pytest.approx(cluster_bootstrap_ci(per[key].to_numpy(), codes, n_boot=300, seed=0)[1:3])
    b = s.boundary
    cols = per.select(pl.col("boundary_abs", "within_abs", "n_boundary_steps", "n_within_steps").cast(pl.Float64)).to_numpy()
    [ref] = bootstrap_sums_ci(cols, codes, [lambda t: t[:, 0] / (t[:, 0] + t[:, 1])], n_boot=300, seed=0)
    assert b.resampled == "clusters" and b.share_ci95 == pytest.approx(ref[1:])
    assert b.share_ci95[0] <= b.share_of_abs_variation <= b.share_ci95[1]
    assert b.step_ratio_ci95[0] <= b.mean_boundary_over_mean_within_step <= b.step_ratio_ci95[1]
    md = report_markdown(s.to_dict(), [])
    lo, hi = s.medians_ci["omega2"].ci95
    assert f"| median omega2 | {s.omega2_median:.3f} (95% CI {lo:.3f} to {hi:.3f}) |" in md
    assert "in-sample point estimates (not the gate's figures" in md
    # an older summary (no intervals): the figures are labelled point estimates
    old = s.to_dict()
    del old["medians_ci"]
    for k in ("share_ci95", "step_ratio_ci95", "resampled"):
        del old["boundary"][k]
    md_old = report_markdown(old, [])
    assert f"| median omega2 | {s.omega2_median:.3f} (point estimate, no interval) |" in md_old


def test_monitor_precision_and_recall_have_wilson_intervals():
    from test_monitor import synthetic

    from critic_audit.analysis.monitor import MonitorConfig, monitor

    traj, tok = synthetic()
    res = monitor(traj, tok, MonitorConfig(n_boot=100, seed=1))
    f = res.summary["any_flag"]
    per = res.per_trajectory
    lab = per.filter(pl.col("success").is_not_null())
    n_fail = int((~lab["success"]).sum())
    assert f["precision_ci95"] == pytest.approx(wilson_interval(f["flagged_failures"], f["flagged_labelled"]))
    assert f["recall_ci95"] == pytest.approx(wilson_interval(f["flagged_failures"], n_fail))
    assert f["precision_ci95"][0] <= f["precision"] <= f["precision_ci95"][1]
    assert wilson_interval(3, 4) == pytest.approx((0.30064, 0.95441), abs=1e-5)  # docs/monitor.md's example


def test_copies_dropped_are_part_of_the_coverage():
    from critic_audit.io.records import ReadReport
    from critic_audit.pipeline.analyze import with_run
    from critic_audit.summary import AuditSummary

    trajs, tokens = _agreeing(n_tasks=3, trials=2)
    s = audit(trajs, tokens, AuditConfig(n_boot=50, gate=GateConfig(n_perm=50))).summary
    rep = ReadReport()
    rep.notes["duplicate_trajectories"] += 6
    out = with_run(s, input=rep)
    assert out.coverage.duplicates_dropped == 6 and out.coverage.trajectories == s.coverage.trajectories
    d = out.to_dict()
    assert d["coverage"]["duplicates_dropped"] == 6
    assert AuditSummary.from_json(out.to_json()).coverage.duplicates_dropped == 6
    assert "duplicates_dropped" not in with_run(s, input=ReadReport()).to_dict()["coverage"]


def test_one_disagreeing_trajectory_makes_no_side_surer_than_none():
    """27 of 28 in 7 tasks of 4 (the one failure inside a task): its design effect, estimated from that
    one trajectory, is 28/27 (n_eff 27, Wilson low end 0.82 alone); the interval is widened to 28 of 28's
    low end 7 / (7 + z^2) = 0.646, so the verdict is inconclusive as for 28 of 28."""
    trajs, tokens = _agreeing()
    # trajectory t3_1 (task 3): its turn levels reversed within the turn -> SS_B < SS_W
    tokens = tokens.with_columns(value=pl.when(pl.col("trajectory_id") == "t3_1")
                                 .then(pl.Series(np.tile([0.0, 1.0], tokens.height // 2)).cast(pl.Float32))
                                 .otherwise(pl.col("value")))
    s = audit(trajs, tokens, AuditConfig(n_boot=300, gate=GateConfig(n_perm=300))).summary
    f = s.frac_ss_between_gt_within
    assert (f.k, f.n) == (27, 28)
    # deff: p = 27/28, clusters 6 x (4 - 4p)^2 + (3 - 4p)^2 = 6/49 + 36/49 = 6/7; C/(C-1) = 7/6 -> 1/784 x ...
    assert f.design_effect == pytest.approx((7 / 6) * (6 / 7) / 784 / ((27 / 28) * (1 / 28) / 28), rel=1e-12)
    assert f.design_effect == pytest.approx(28 / 27, rel=1e-12)
    raw = wilson_interval(27 / f.design_effect, 28 / f.design_effect)
    assert raw[0] > 0.8  # what the estimate alone would claim
    assert f.ci95 == pytest.approx((7 / (7 + Z * Z), raw[1]), rel=1e-12)
    assert s.recommendation.verdict == "inconclusive"
    # review 3 new #5: the widening is recorded (to n_eff 28^2 / (7 x 4^2) = 7) and the report says so
    assert f.widened is True and f.widened_to_n_effective == pytest.approx(7.0, rel=1e-12)
    d = s.to_dict()["frac_ss_between_gt_within"]
    assert d["widened"] is True and d["widened_to_n_effective"] == pytest.approx(7.0)
    assert AuditSummary.from_json(s.to_json()).frac_ss_between_gt_within.widened_to_n_effective == pytest.approx(7.0)
    md = report_markdown(s, [])
    assert "design effect (1.04 for (a)); (a)'s interval is widened to the one all-agreeing data would give at 7 " \
           "effective trajectories" in md


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 5), st.floats(0, 1)), min_size=2, max_size=10), st.integers(0, 2**31))
def test_fraction_interval_envelope(clusters, seed):
    """With clusters: the interval contains Wilson's at n / deff and reaches 0-of-n's and n-of-n's ends at
    n_eff = n^2 / sum n_c^2 (loop reference of the sizes)."""
    rng = np.random.default_rng(seed)
    sizes = [m for m, _ in clusters]
    flags = np.concatenate([rng.random(m) < q for m, q in clusters])
    codes = np.repeat(np.arange(len(sizes)), sizes)
    n = flags.size
    if max(sizes) < 2:
        return  # no cluster of several trajectories: no design effect
    from critic_audit.analysis.audit import _frac_entry

    f = _frac_entry(pl.Series(flags), codes)
    k, d = int(flags.sum()), f.design_effect
    raw = wilson_interval(k / d, n / d)
    m = n * n / sum(x * x for x in sizes)
    assert f.ci95[0] == pytest.approx(min(raw[0], wilson_interval(m, m)[0]), rel=1e-12)
    assert f.ci95[1] == pytest.approx(max(raw[1], wilson_interval(0, m)[1]), rel=1e-12)
    wide = f.ci95[0] < raw[0] or f.ci95[1] > raw[1]
    assert f.widened is wide and f.widened_to_n_effective == (pytest.approx(m, rel=1e-12) if wide else None)
