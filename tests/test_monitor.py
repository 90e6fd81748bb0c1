"""`critic-audit monitor`: robust z of the turn-mean change, AUROC against failure, the CLI."""

import json
import math
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from critic_audit.analysis.monitor import (
    MonitorConfig,
    _auroc_resamples,
    auroc,
    bootstrap_auroc,
    monitor,
    robust_scale,
    turn_means,
    turn_scores,
)
from critic_audit.cli import app
from critic_audit.errors import ConfigError, InputError

runner = CliRunner()

TOKEN_DTYPES = {"trajectory_id": pl.String, "position": pl.Int32, "token_id": pl.Int32, "role": pl.String,
                "turn": pl.Int32, "response_mask": pl.Boolean, "value": pl.Float32}


def tokens_from_means(means: dict[str, list[float]], *, per_turn: int = 2, spread: float = 0.25,
                      user_tokens: int = 2) -> pl.DataFrame:
    """A tokens table whose turn k of trajectory t has mean ``means[t][k]`` (values m -/+ spread),
    with a user message (no value on the policy side, null turn) before every assistant turn."""
    rows = []
    for tid, ms in means.items():
        pos = 0
        for k, m in enumerate(ms):
            for _ in range(user_tokens):
                rows.append((tid, pos, 7, "user", None, False, None if pos == 0 else 99.0))
                pos += 1
            offs = np.linspace(-spread, spread, per_turn) if per_turn > 1 else [0.0]
            for o in offs:
                rows.append((tid, pos, 5, "assistant", k, True, m + o))
                pos += 1
    return pl.DataFrame(rows, schema=TOKEN_DTYPES, orient="row")


# Turn means of the hand-computed case.
MEANS = {"A": [0.0, 1.0, 3.0], "B": [5.0, 5.0, 4.0, 10.0], "C": [2.0, 2.5]}


def test_turn_means():
    tm = turn_means(tokens_from_means(MEANS, per_turn=4))
    assert tm.columns == ["trajectory_id", "turn", "n_tokens", "mean_value"]
    assert tm.schema["turn"] == pl.Int32 and tm.schema["mean_value"] == pl.Float64
    assert tm.height == 9 and tm["n_tokens"].to_list() == [4] * 9  # user tokens (value 99) are ignored
    assert tm["mean_value"].to_list() == pytest.approx([m for ms in MEANS.values() for m in ms], abs=1e-6)


def test_robust_z_by_hand_previous():
    # d_k = m_k - m_{k-1}:  A: 1, 2   B: 0, -1, 6   C: 0.5
    # sorted d = [-1, 0, 0.5, 1, 2, 6]            -> median = (0.5 + 1) / 2 = 0.75
    # |d - 0.75| = [0.25, 1.25, 0.75, 1.75, 5.25, 0.25]
    #   sorted = [0.25, 0.25, 0.75, 1.25, 1.75, 5.25] -> MAD = (0.75 + 1.25) / 2 = 1.0
    # scale = 1.4826 * 1.0;  z(6) = 5.25 / 1.4826 = 3.5411 > 3.5 (flagged); z(-1) = -1.75 / 1.4826 = -1.1804
    sc = turn_scores(turn_means(tokens_from_means(MEANS)))
    assert sc["trajectory_id"].to_list() == ["A", "A", "B", "B", "B", "C"]
    assert sc["turn"].to_list() == [1, 2, 1, 2, 3, 1]
    assert sc["delta"].to_list() == pytest.approx([1, 2, 0, -1, 6, 0.5], abs=1e-6)
    expect = [(d - 0.75) / 1.4826 for d in (1, 2, 0, -1, 6, 0.5)]
    assert sc["z"].to_list() == pytest.approx(expect, abs=1e-5)
    assert sc["z"][4] == pytest.approx(3.54108, abs=1e-4)
    assert sc["abs_z"].to_list() == pytest.approx([abs(z) for z in expect], abs=1e-5)
    assert sc["flagged"].to_list() == [False, False, False, False, True, False]
    # a threshold just above z(6) flags nothing
    assert not turn_scores(turn_means(tokens_from_means(MEANS)), config=MonitorConfig(threshold=3.6))["flagged"].any()


def test_robust_z_by_hand_running_mean():
    # d_k = m_k - mean(m_0..m_{k-1}):  A: 1 - 0 = 1, 3 - 0.5 = 2.5
    #   B: 5 - 5 = 0, 4 - 5 = -1, 10 - 14/3 = 5.3333   C: 0.5
    # sorted d = [-1, 0, 0.5, 1, 2.5, 5.3333]      -> median = 0.75
    # |d - 0.75| sorted = [0.25, 0.25, 0.75, 1.75, 1.75, 4.5833] -> MAD = (0.75 + 1.75) / 2 = 1.25
    sc = turn_scores(turn_means(tokens_from_means(MEANS)), config=MonitorConfig(reference="running_mean"))
    d = [1, 2.5, 0, -1, 10 - 14 / 3, 0.5]
    assert sc["delta"].to_list() == pytest.approx(d, abs=1e-5)
    assert sc["reference"].to_list() == pytest.approx([0, 0.5, 5, 5, 14 / 3, 2], abs=1e-5)
    assert sc["z"].to_list() == pytest.approx([(x - 0.75) / (1.4826 * 1.25) for x in d], abs=1e-5)
    assert not sc["flagged"].any()


def test_mad_zero_falls_back_to_mean_abs_dev():
    # d = [0, 0, 0, 0, 1]: median 0, MAD 0; mean |d - 0| = 0.2 -> scale = 1.2533 * 0.2 = 0.25066
    center, scale, method = robust_scale(np.array([0, 0, 0, 0, 1.0]))
    assert (center, method) == (0.0, "mean_abs_dev")
    assert scale == pytest.approx(0.25066)
    tok = tokens_from_means({"a": [1, 1, 1], "b": [2, 2, 2], "c": [0, 1]})
    sc = turn_scores(turn_means(tok))
    assert sc["z"].to_list() == pytest.approx([0, 0, 0, 0, 1 / 0.25066], abs=1e-4)
    assert sc["flagged"].to_list() == [False] * 4 + [True]


def test_flat_critic_raises():
    with pytest.raises(InputError, match="flat"):
        turn_scores(turn_means(tokens_from_means({"a": [1, 2, 3], "b": [0, 1]})))  # every change is +1
    with pytest.raises(InputError, match="2 or more"):
        turn_scores(turn_means(tokens_from_means({"a": [1.0], "b": [2.0]})))


def test_skips_single_turn_and_missing_values():
    from critic_audit.errors import SchemaError

    tok = tokens_from_means({**MEANS, "single": [1.0], "holey": [1.0, 2.0, 3.0]})
    holey = tok.with_columns(value=pl.when((pl.col("trajectory_id") == "holey") & (pl.col("turn") == 1))
                             .then(None).otherwise(pl.col("value")))
    traj = pl.DataFrame({"trajectory_id": ["A", "B", "C", "single", "holey", "no_tokens"],
                         "success": [True, False, None, True, False, True]})
    # policy tokens without a value are refused, as analyze refuses them (2 tokens of turn 1 of "holey";
    # the first at row 46 of the table: 4 rows a turn (2 user, 2 assistant): A 12, B 16, C 8, single 4, then
    # holey's turn 0 (4) and turn 1's user tokens (2))
    with pytest.raises(SchemaError) as e:
        monitor(traj, holey, MonitorConfig(n_boot=50), tokens_path="x/tokens.parquet")
    assert str(e.value).startswith("x/tokens.parquet: record 46: 2 policy token(s) have no critic value")
    # a turn-means table with a null mean (no token of the turn has a value) is skipped
    means = turn_means(tok).with_columns(mean_value=pl.when((pl.col("trajectory_id") == "holey") & (pl.col("turn") == 1))
                                         .then(None).otherwise(pl.col("mean_value")))
    res = monitor(traj, means, MonitorConfig(n_boot=50))
    c = res.summary["counts"]
    assert c["skipped"] == {"fewer_than_2_turns": 1, "missing_value": 1, "no_policy_tokens": 1}
    assert c["trajectories_read"] == 6 and c["trajectories_scored"] == 3 and c["turns_scored"] == 6
    assert res.turn_scores["z"].to_list() == pytest.approx([(d - 0.75) / 1.4826 for d in (1, 2, 0, -1, 6, 0.5)],
                                                           abs=1e-5)


# --- AUROC -----------------------------------------------------------------------------------------

def brute_auroc(s, y):
    pos = [a for a, b in zip(s, y) if b]
    neg = [a for a, b in zip(s, y) if not b]
    if not pos or not neg:
        return float("nan")
    tot = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p in pos for n in neg)
    return tot / (len(pos) * len(neg))


def test_auroc_golden():
    assert auroc([3, 4, 5, 0, 1, 2], [True] * 3 + [False] * 3) == 1.0
    assert auroc([3, 4, 5, 0, 1, 2], [False] * 3 + [True] * 3) == 0.0
    assert auroc([1.0] * 6, [True, False] * 3) == 0.5
    # positives [1, 2, 2], negatives [2, 0]. All scores [1, 2, 2, 2, 0]: ranks 0->1, 1->2, 2,2,2 -> 4 (avg of
    # 3, 4, 5). R_pos = 2 + 4 + 4 = 10; U = 10 - 3 * 4 / 2 = 4; AUROC = 4 / (3 * 2) = 2/3.
    # Pairwise: (1,2) 0, (1,0) 1, (2,2) .5, (2,0) 1, (2,2) .5, (2,0) 1 -> 4 / 6.
    assert auroc([1, 2, 2, 2, 0], [True, True, True, False, False]) == pytest.approx(2 / 3)
    assert math.isnan(auroc([1, 2], [True, True]))
    with pytest.raises(ValueError):
        auroc([1, float("nan")], [True, False])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(-5, 5), st.booleans()), min_size=1, max_size=40))
def test_auroc_matches_pairwise(data):
    s = [float(a) / 2 for a, _ in data]  # small integer grid: many ties
    y = [b for _, b in data]
    got, want = auroc(s, y), brute_auroc(s, y)
    assert (math.isnan(got) and math.isnan(want)) or got == pytest.approx(want, abs=1e-12)


def test_vectorized_resamples_match_auroc():
    rng = np.random.default_rng(3)
    s = rng.integers(0, 6, size=30).astype(float)
    y = rng.random(30) < 0.4
    _, codes = np.unique(s, return_inverse=True)
    pos, neg = np.flatnonzero(y), np.flatnonzero(~y)
    pi = pos[rng.integers(0, pos.size, size=(25, pos.size))]
    ni = neg[rng.integers(0, neg.size, size=(25, neg.size))]
    got = _auroc_resamples(codes, int(codes.max()) + 1, pi, ni)
    want = [auroc(np.r_[s[a], s[b]], np.r_[np.ones(a.size, bool), np.zeros(b.size, bool)]) for a, b in zip(pi, ni)]
    assert got == pytest.approx(want, abs=1e-12)


def test_bootstrap_reproducible():
    rng = np.random.default_rng(0)
    s = rng.normal(size=80)
    y = s + rng.normal(size=80) > 0
    a = bootstrap_auroc(s, y, n_boot=500, seed=7)
    assert a == bootstrap_auroc(s, y, n_boot=500, seed=7)
    assert a != bootstrap_auroc(s, y, n_boot=500, seed=8)
    est, lo, hi = a
    assert est == auroc(s, y) and lo <= est <= hi and 0 <= lo < hi <= 1
    est0, lo0, hi0 = bootstrap_auroc(s, y, n_boot=0)
    assert est0 == est and math.isnan(lo0) and math.isnan(hi0)


# --- synthetic: failures carry a value drop at a random turn --------------------------------------

def synthetic(n: int = 200, seed: int = 0, drop: float = 0.5):
    rng = np.random.default_rng(seed)
    means, success = {}, {}
    for i in range(n):
        k_n = int(rng.integers(3, 10))
        steps = rng.normal(0.0, 0.05, size=k_n)
        steps[0] = rng.normal(0.4, 0.1)
        ok = bool(rng.random() < 0.5)
        if not ok:
            steps[int(rng.integers(1, k_n))] -= drop
        means[f"t{i:03d}"] = list(np.cumsum(steps))
        success[f"t{i:03d}"] = ok
    tok = tokens_from_means(means, per_turn=6, spread=0.02)
    traj = pl.DataFrame({"trajectory_id": list(success), "success": list(success.values()),
                         "reward": [float(v) for v in success.values()]})
    return traj, tok


@pytest.mark.parametrize("reference", ["previous", "running_mean"])
def test_injected_drop_detected(reference):
    traj, tok = synthetic()
    res = monitor(traj, tok, MonitorConfig(reference=reference, n_boot=300, seed=1))
    a = res.summary["auroc"]
    assert a["max_abs_z"]["estimate"] > 0.9 and a["largest_drop"]["estimate"] > 0.9
    lo, hi = a["max_abs_z"]["ci95"]
    assert lo <= a["max_abs_z"]["estimate"] <= hi
    assert 0.3 < a["num_turns"]["estimate"] < 0.7  # the baseline knows nothing here
    f = res.summary["any_flag"]
    assert f["precision"] > 0.8 and f["recall"] > 0.8
    assert res.flagged["z"].min() < -3.5  # the drops are negative z
    # per-trajectory scores agree with the turn table
    per = res.per_trajectory
    g = res.turn_scores.group_by("trajectory_id").agg(pl.col("abs_z").max()).sort("trajectory_id")
    assert per["max_abs_z"].to_list() == pytest.approx(g["abs_z"].to_list())
    json.dumps(res.summary, allow_nan=False)


def test_no_drop_is_chance():
    traj, tok = synthetic(drop=0.0, seed=5)
    a = monitor(traj, tok, MonitorConfig(n_boot=300)).summary["auroc"]
    lo, hi = a["max_abs_z"]["ci95"]
    assert lo < 0.5 < hi


def test_config_validation():
    with pytest.raises(ConfigError):
        MonitorConfig(threshold=0)
    with pytest.raises(ConfigError):
        MonitorConfig(reference="last")
    with pytest.raises(ConfigError):
        MonitorConfig(n_boot=-1)


# --- CLI -------------------------------------------------------------------------------------------

def write_folder(path: Path, traj: pl.DataFrame, tok: pl.DataFrame) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    tok.write_parquet(path / "tokens.parquet")
    traj.write_parquet(path / "trajectories.parquet")
    return path


def _run(*args):
    return runner.invoke(app, ["monitor", *[str(a) for a in args]])


def _assert_one_line_error(res, *needles, code: int = 1):
    assert res.exit_code == code, res.output
    text = res.stderr if hasattr(res, "stderr") else res.output
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), text
    assert "Traceback" not in text
    for n in needles:
        assert n in lines[0], (n, lines[0])


def test_cli_table_json_and_out(tmp_path):
    traj, tok = synthetic(n=80, seed=2)
    folder = write_folder(tmp_path / "audit", traj, tok)
    res = _run(folder, "--top", 3, "--bootstrap", 100)
    assert res.exit_code == 0, res.output
    assert "AUROC for failure: max |z|" in res.stdout and "largest drop" in res.stdout
    assert "top 3 of" in res.stdout

    out = tmp_path / "sub" / "scores.parquet"
    res = _run(folder, "--json", "--bootstrap", 100, "--reference", "running_mean", "--threshold", 4,
               "--out", out)
    assert res.exit_code == 0, res.output
    s = json.loads(res.stdout)
    assert s["config"] == {"threshold": 4.0, "reference": "running_mean", "n_boot": 100, "seed": 0, "min_per_class": 5}
    assert s["auroc"]["max_abs_z"]["estimate"] > 0.9
    assert len(s["top_flagged"]) == min(20, s["counts"]["flagged_turns"])
    assert all(abs(r["z"]) > 4 for r in s["top_flagged"])
    written = pl.read_parquet(out)
    assert written.height == s["counts"]["turns_scored"]
    assert {"trajectory_id", "turn", "delta", "z", "abs_z", "flagged"} <= set(written.columns)
    assert [p.name for p in out.parent.iterdir()] == ["scores.parquet"]  # no temporary left behind


def test_cli_without_success_labels(tmp_path):
    traj, tok = synthetic(n=40, seed=3)
    folder = write_folder(tmp_path / "a", traj.with_columns(success=pl.lit(None, dtype=pl.Boolean)), tok)
    res = _run(folder, "--json", "--bootstrap", 50)
    assert res.exit_code == 0, res.output
    s = json.loads(res.stdout)
    assert all(v["estimate"] is None and v["ci95"] is None for v in s["auroc"].values())
    assert s["any_flag"]["precision"] is None and any("success label" in n for n in s["notes"])
    res = _run(folder, "--bootstrap", 50)
    assert res.exit_code == 0 and "note:" in res.stdout and "n/a" in res.stdout


def test_cli_bad_inputs(tmp_path):
    _assert_one_line_error(_run(tmp_path / "missing"), "no such folder")
    (tmp_path / "empty").mkdir()
    _assert_one_line_error(_run(tmp_path / "empty"), "no tokens.parquet (tokens with values), nor turns.parquet "
                           "with trajectories.parquet (a streamed audit's turn means) in the folder (none of them)")
    (tmp_path / "empty" / "turns.parquet").write_bytes(b"")  # turn means without their trajectories
    _assert_one_line_error(_run(tmp_path / "empty"), "nor turns.parquet with trajectories.parquet", "(it has turns.parquet)")
    # an unknown option value is a usage error: exit 2 (docs/monitor.md)
    _assert_one_line_error(_run(tmp_path / "empty", "--reference", "bogus"), "unknown reference", code=2)
    traj, tok = synthetic(n=10)
    folder = write_folder(tmp_path / "novalues", traj, tok.with_columns(value=pl.lit(None, dtype=pl.Float32)))
    _assert_one_line_error(_run(folder), "no critic value")
    flat = write_folder(tmp_path / "flat", traj, tok.with_columns(value=pl.lit(0.5, dtype=pl.Float32)))
    _assert_one_line_error(_run(flat), "flat")
    good = write_folder(tmp_path / "good", traj, tok)
    _assert_one_line_error(_run(good, "--reference", "last"), "unknown reference", code=2)


@settings(max_examples=50, deadline=None)
@given(st.floats(-100, 100), st.floats(0.01, 100), st.integers(0, 10_000))
def test_z_invariant_to_shift_and_scale_of_values(shift, scale, seed):
    # z is a ratio of differences of turn means: an affine map v -> a + b v (b > 0) leaves it unchanged.
    rng = np.random.default_rng(seed)
    means = {f"t{i}": list(rng.normal(size=int(rng.integers(2, 6)))) for i in range(8)}
    tok = tokens_from_means(means, per_turn=3, spread=0.1)
    base = turn_scores(turn_means(tok.with_columns(pl.col("value").cast(pl.Float64))))
    moved = turn_scores(turn_means(tok.with_columns(pl.col("value").cast(pl.Float64) * scale + shift)))
    assert moved["z"].to_list() == pytest.approx(base["z"].to_list(), abs=1e-6 * (1 + abs(shift) / scale))


def test_num_turns_baseline_uses_the_real_episode_length():
    """Truncation keeps 3 turns of every episode; failures were longer: the baseline must see that."""
    rng = np.random.default_rng(0)
    means = {f"t{i}": list(np.cumsum(rng.normal(size=3))) for i in range(20)}
    tok = tokens_from_means(means)
    success = [i % 2 == 0 for i in range(20)]
    traj = pl.DataFrame({"trajectory_id": list(means), "success": success,
                         "num_turns": [5 if s else 12 for s in success]}, schema_overrides={"num_turns": pl.Int32})
    res = monitor(traj, tok, MonitorConfig(n_boot=50))
    assert res.summary["auroc"]["num_turns"]["estimate"] == 1.0  # failures longer: a perfect baseline
    assert res.per_trajectory["n_turns"].to_list() == [3] * 20
    assert sorted(set(res.per_trajectory["episode_turns"].to_list())) == [5, 12]
    # without num_turns the baseline falls back to the turns with values (all 3: chance)
    res = monitor(traj.drop("num_turns"), tok, MonitorConfig(n_boot=50))
    assert res.summary["auroc"]["num_turns"]["estimate"] == 0.5  # every trajectory ties at 3


def test_several_checkpoints_are_scaled_each_on_its_own():
    """Each checkpoint's critic has its own value scale: the robust z is taken within each checkpoint.
    Checkpoint step_2's values are step_1's times 100: both get the hand-computed z of MEANS."""
    means = {**{f"s1-{t}": ms for t, ms in MEANS.items()}, **{f"s2-{t}": [100 * m for m in ms] for t, ms in MEANS.items()}}
    traj = pl.DataFrame({"trajectory_id": list(means), "checkpoint": ["step_1"] * 3 + ["step_2"] * 3,
                         "success": [True, False, True] * 2})
    res = monitor(traj, tokens_from_means(means), MonitorConfig(n_boot=0))
    expect = [(d - 0.75) / 1.4826 for d in (1, 2, 0, -1, 6, 0.5)]  # test_robust_z_by_hand_previous
    sc = res.turn_scores
    assert sc["z"].to_list() == pytest.approx(expect + expect, abs=1e-5)
    assert sc["flagged"].to_list() == [False, False, False, False, True, False] * 2
    r = res.summary["robust"]
    assert r["scale_method"] == "per_checkpoint" and r["center"] is None and r["scale"] is None
    assert r["by_checkpoint"]["step_1"]["center"] == pytest.approx(0.75)
    assert r["by_checkpoint"]["step_1"]["scale"] == pytest.approx(1.4826)
    assert r["by_checkpoint"]["step_2"]["center"] == pytest.approx(75.0)
    assert r["by_checkpoint"]["step_2"]["scale"] == pytest.approx(148.26)
    assert r["by_checkpoint"]["step_2"]["n_changes"] == 6 and r["by_checkpoint"]["step_2"]["trajectories"] == 3
    assert any("2 checkpoints" in n for n in res.summary["notes"])
    json.dumps(res.summary, allow_nan=False)


def test_several_checkpoints_keep_the_signal_of_each_critic():
    """Two checkpoints whose critics differ 100x in scale: one pooled MAD would give z of +-1000 on one
    and ~0 on the other; per checkpoint each keeps the AUROC it has alone."""
    t1, k1 = synthetic(n=120, seed=0)
    t2, k2 = synthetic(n=120, seed=1)
    k2 = k2.with_columns(pl.col("trajectory_id") + "-b", pl.col("value") * 100)
    t2 = t2.with_columns(pl.col("trajectory_id") + "-b")
    traj = pl.concat([t1.with_columns(checkpoint=pl.lit("step_1")), t2.with_columns(checkpoint=pl.lit("step_2"))])
    res = monitor(traj, pl.concat([k1, k2]), MonitorConfig(n_boot=0))
    alone = [monitor(t, k, MonitorConfig(n_boot=0)) for t, k in ((t1, k1), (t2, k2))]
    z_alone = pl.concat([a.turn_scores for a in alone]).sort("trajectory_id", "turn")["z"].to_numpy()
    np.testing.assert_allclose(res.turn_scores["z"].to_numpy(), z_alone, rtol=1e-5, atol=1e-5)
    assert res.turn_scores["abs_z"].max() < 50
    by = res.summary["robust"]["by_checkpoint"]
    for ck, a in zip(("step_1", "step_2"), alone):
        assert by[ck]["auroc_max_abs_z"]["estimate"] == pytest.approx(a.summary["auroc"]["max_abs_z"]["estimate"])
    assert res.summary["auroc"]["max_abs_z"]["estimate"] > 0.9
    # one checkpoint whose critic is flat across turns is skipped, by reason; the other is still scored
    flat = k2.with_columns(value=pl.lit(1.0, dtype=pl.Float32))
    res = monitor(traj, pl.concat([k1, flat]), MonitorConfig(n_boot=0))
    assert res.summary["counts"]["skipped"] == {"critic_flat_across_turns": 120}
    assert res.summary["counts"]["trajectories_scored"] == 120
    np.testing.assert_allclose(res.turn_scores["z"].to_numpy(), alone[0].turn_scores["z"].to_numpy(), atol=1e-5)


def test_cli_out_never_replaces_a_file_it_did_not_write(tmp_path):
    from critic_audit.outputs import MANIFEST, write_manifest

    traj, tok = synthetic(n=40, seed=4)
    folder = write_folder(tmp_path / "audit", traj, tok)
    mine = tmp_path / "notes.parquet"  # (a name not ending in .parquet is refused by its suffix first)
    mine.write_text("my notes")
    _assert_one_line_error(_run(folder, "--out", mine, "--bootstrap", 20), "not a file critic-audit wrote", "--overwrite")
    assert mine.read_text() == "my notes"
    other = tmp_path / "mine.parquet"
    pl.DataFrame({"x": [1]}).write_parquet(other)
    _assert_one_line_error(_run(folder, "--out", other, "--bootstrap", 20), "not replaced without --overwrite")
    assert pl.read_parquet(other).columns == ["x"]
    _assert_one_line_error(_run(folder, "--out", tmp_path, "--bootstrap", 20), "is a folder", "turn_scores.parquet")
    _assert_one_line_error(_run(folder, "--out", "/", "--bootstrap", 20), "filesystem root")
    # its own file is replaced again without --overwrite; --overwrite replaces the user's
    ours = tmp_path / "scores.parquet"
    for _ in range(2):
        assert _run(folder, "--out", ours, "--bootstrap", 20).exit_code == 0
    res = _run(folder, "--out", other, "--overwrite", "--bootstrap", 20)
    assert res.exit_code == 0 and "abs_z" in pl.read_parquet(other).columns
    # inside a folder critic-audit wrote (an audit folder, this one or another): refused before the work,
    # since analyze --out FOLDER --overwrite replaces that folder whole (review 3 new #2)
    write_manifest(folder, "audit")
    before = json.loads((folder / MANIFEST).read_text())
    other_audit = write_folder(tmp_path / "audit2", traj, tok)
    write_manifest(other_audit, "audit")
    for target in (folder / "turn_scores.parquet", other_audit / "mon.parquet"):
        _assert_one_line_error(_run(folder, "--out", target, "--bootstrap", 20), "a folder critic-audit wrote",
                               "replaces whole", f"pass a path outside {target.parent}")
        assert not target.exists()
    assert json.loads((folder / MANIFEST).read_text()) == before
    # beside the audit folder it is fine
    assert _run(folder, "--out", tmp_path / "mon.parquet", "--bootstrap", 20).exit_code == 0
    assert pl.read_parquet(tmp_path / "mon.parquet").height > 0


def test_auroc_withheld_below_the_minimum_per_class(tmp_path):
    """3 successes beside many failures: no AUROC figure, the counts and the reason instead."""
    traj, tok = synthetic(n=80, seed=2)
    succ = traj.filter(pl.col("success"))["trajectory_id"].to_list()
    keep = set(traj.filter(~pl.col("success"))["trajectory_id"].to_list()) | set(succ[:3])
    traj3 = traj.filter(pl.col("trajectory_id").is_in(list(keep)))
    tok3 = tok.filter(pl.col("trajectory_id").is_in(list(keep)))
    s = monitor(traj3, tok3, MonitorConfig(n_boot=50)).summary
    n_fail = s["counts"]["failures"]
    assert s["counts"]["labelled"] - n_fail == 3 and n_fail >= 5
    for entry in s["auroc"].values():
        assert entry["estimate"] is None and entry["ci95"] is None
        assert (entry["n_failures"], entry["n_successes"]) == (n_fail, 3)
        assert "too few per class" in entry["withheld"]
    assert any("too few labelled trajectories per class" in n for n in s["notes"])
    # the same data with a lower minimum gives the figure
    low = monitor(traj3, tok3, MonitorConfig(n_boot=50, min_per_class=3)).summary["auroc"]["max_abs_z"]
    assert low["estimate"] is not None and "withheld" not in low
    # the CLI table says so instead of a number
    res = _run(write_folder(tmp_path / "a", traj3, tok3), "--bootstrap", 50)
    assert res.exit_code == 0, res.output
    assert "withheld: too few per class (" in res.stdout and "AUROC" in res.stdout
    with pytest.raises(ConfigError, match="min_per_class"):
        MonitorConfig(min_per_class=0)


def test_pooled_auroc_is_marked_when_checkpoint_critics_failed_their_gate():
    """The pooled gate passing is no evidence when the checkpoints' own critics failed theirs: each
    checkpoint's AUROC is marked by its own gate, the pooled AUROCs say how many of the pooled
    critics did not pass (reviewer: credit_ppo_run, 9 of 10 failed, AUROC 0.655 unmarked)."""
    from critic_audit.cli_render import monitor_tables

    traj, tok = synthetic(n=150, seed=2)
    traj = traj.with_columns(checkpoint=pl.Series(["step_1", "step_2", "step_3"] * 50))
    ok = {"status": "passed", "passed": True, "reasons": []}
    bad = {"status": "failed", "passed": False, "reasons": ["explained variance 0.000 < 0.05"]}
    gates = {"step_1": bad, "step_2": ok}  # step_3: no gate (too few trajectories): unmeasured
    s = monitor(traj, tok, MonitorConfig(n_boot=50), critic_gate=ok, checkpoint_gates=gates).summary
    by = s["robust"]["by_checkpoint"]
    assert by["step_1"]["auroc_max_abs_z"]["caveat"].startswith("the critic failed the quality gate (explained")
    assert "caveat" not in by["step_2"]["auroc_max_abs_z"]
    assert by["step_3"]["auroc_max_abs_z"]["caveat"].startswith("the critic was not measured")
    g = s["critic_gate"]
    assert g["status"] == "failed" and g["checkpoints"] == {"n": 3, "not_passed": {"step_1": "failed",
                                                                                   "step_3": "unmeasured"}}
    for k in ("max_abs_z", "largest_drop"):
        assert s["auroc"][k]["caveat"].startswith("2 of 3 checkpoint critics did not pass the quality gate")
    assert "caveat" not in s["auroc"]["num_turns"] and s["notes"][0].startswith("2 of 3 checkpoint critics")
    table = monitor_tables(s, pl.DataFrame(), 3.5, "previous")[0]
    cells = list(table.columns[1].cells)
    assert cells[-4].endswith("(2 of 3 checkpoint critics did not pass the quality gate)")
    assert "(" not in cells[-2]  # the baseline: no mark
    # all checkpoint critics passed: nothing marked, no critic_gate
    s = monitor(traj, tok, MonitorConfig(n_boot=0), critic_gate=ok,
                checkpoint_gates={k: ok for k in ("step_1", "step_2", "step_3")}).summary
    assert "critic_gate" not in s and "caveat" not in s["auroc"]["max_abs_z"]
    # no gate per checkpoint given: the pooled one stands for all (a failed pooled gate marks each)
    s = monitor(traj, tok, MonitorConfig(n_boot=0), critic_gate=bad).summary
    assert all(v["auroc_max_abs_z"]["caveat"].startswith("the critic failed") for v in s["robust"]["by_checkpoint"].values())


def test_changes_equal_up_to_rounding_are_flat_not_z_scores_of_noise():
    """Turn changes equal up to float rounding (a spread of 1e-9 on changes of 1) have no scale: the
    same clean error as exactly equal changes, not z-scores of rounding noise (reviewer: scale 4.98e-09
    from mean_abs_dev)."""
    noise = np.array([0, 0, 0, 0, 4e-9])
    with pytest.raises(InputError, match=r"flat across turns: all 5 turn-mean changes equal 1 up to float rounding"):
        robust_scale(1.0 + noise)
    with pytest.raises(InputError, match="flat"):  # changes of 0 between values of about 1000: float32 noise
        robust_scale(np.array([0, 0, 1e-5, -1e-5, 0, 2e-5]), magnitude=1000.0)
    assert robust_scale(np.array([0, 0, 1e-5, -1e-5, 0, 2e-5]), magnitude=1.0)[2] == "mad"  # a real spread there
    # MAD of rounding noise with a real outlier: falls back to the mean absolute deviation, as MAD = 0 does
    center, scale, method = robust_scale(np.array([1.0, 1.0 + 1e-9, 1.0 - 1e-9, 1.0, 2.0]))
    assert (center, method) == (1.0, "mean_abs_dev") and scale == pytest.approx(1.2533 * (1 + 2e-9) / 5)
    # through the monitor: values whose turn-to-turn changes are all +1 up to rounding
    tok = tokens_from_means({"a": [0.0, 1.0, 2.0000005], "b": [5.0, 5.9999995, 7.0]})  # float32 values
    with pytest.raises(InputError, match="up to float rounding"):
        turn_scores(turn_means(tok))


def test_cli_out_suffix_top_and_root_are_refused_before_the_work(tmp_path):
    """--out scores.csv used to write Parquet under a .csv name; --top -1 was accepted; --out / suggested a
    folder (e.g. --out audit_out) for an option that names a file. Each is one line, nothing written."""
    traj, tok = synthetic(n=20, seed=1)
    folder = write_folder(tmp_path / "audit", traj, tok)
    _assert_one_line_error(_run(folder, "--out", tmp_path / "scores.csv"),
                           f"--out {tmp_path / 'scores.csv'} does not end in .parquet; this option writes a Parquet file",
                           "pass e.g. --out scores.parquet")
    assert not (tmp_path / "scores.csv").exists()
    _assert_one_line_error(_run(folder, "--top", -1), "--top must be an integer >= 0 (flagged turns to list), got -1",
                           "--top 0 to list none", code=2)
    _assert_one_line_error(_run(folder, "--out", "/"), "--out / is the filesystem root",
                           "pass a file of its own, e.g. --out turn_scores.parquet")
    res = _run(folder, "--top", 0, "--bootstrap", 0, "--json")
    assert res.exit_code == 0 and json.loads(res.stdout)["top_flagged"] == []


def test_checkpoints_in_natural_order_in_the_note_and_robust():
    """The note on checkpoint critics that did not pass lists step_19 before step_119 (natural order, not text
    order), and robust.by_checkpoint is in that order too."""
    traj, tok = synthetic(n=60, seed=2)
    names = ["step_119", "step_19", "step_139"]
    traj = traj.with_columns(checkpoint=pl.Series(names * 20))
    bad = {"status": "failed", "passed": False, "reasons": ["explained variance 0.000 < 0.05"]}
    s = monitor(traj, tok, MonitorConfig(n_boot=0), checkpoint_gates=dict.fromkeys(names, bad)).summary
    assert list(s["robust"]["by_checkpoint"]) == ["step_19", "step_119", "step_139"]
    assert s["notes"][0].startswith("3 of 3 checkpoint critics did not pass the quality gate "
                                    "(3 failed the quality gate: step_19, step_119, step_139)")


def test_cli_refuses_what_analyze_refuses_and_names_a_corrupt_summary(tmp_path):
    """monitor was looser than analyze: it scored trajectories some of whose policy tokens have no value,
    and read a truncated summary.json as a missing one ("critic quality unmeasured"). Both are one line
    naming the file now."""
    traj, tok = synthetic(n=16, seed=5)
    pol = tok.with_row_index("row").filter(pl.col("response_mask"))
    first = int(pol["row"][0])
    some = tok.with_row_index("row").with_columns(
        value=pl.when(pl.col("row").is_in(pol["row"].head(4).implode())).then(None).otherwise(pl.col("value"))).drop("row")
    folder = write_folder(tmp_path / "some", traj, some)
    _assert_one_line_error(_run(folder, "--bootstrap", 0),
                           f"{folder / 'tokens.parquet'}: record {first}: 4 policy token(s) have no critic value",
                           "pass --critic to score them, or fill the value column")
    good = write_folder(tmp_path / "good", traj, tok)
    (good / "summary.json").write_text('{"n_trajectories": 16, "n_included"')  # cut short
    _assert_one_line_error(_run(good, "--bootstrap", 0), f"{good / 'summary.json'}: not JSON (")
    (good / "summary.json").unlink()  # no summary at all: scored, without a gate
    assert _run(good, "--bootstrap", 0).exit_code == 0
