"""Plots (checked through their artists), the recommendation rules, report.md/html, `critic-audit plot`."""

import base64
import json

import numpy as np
import polars as pl
import pytest
from matplotlib.collections import PolyCollection
from matplotlib.patches import Rectangle
from typer.testing import CliRunner

from critic_audit import plots as P
from critic_audit.analysis.audit import AuditConfig, audit
from critic_audit.analysis.quality import GateConfig
from critic_audit.cli import app
from critic_audit.report import render_folder, report_markdown


def _tables(n=6, turns=3, tokens_per_turn=4, seed=0):
    """Synthetic audited tables: half successes; values = turn level + small within-turn noise."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        pos = 0
        for k in range(turns):
            pos += 3  # 3 non-policy tokens before each turn
            level = rng.normal()
            for j in range(tokens_per_turn):
                rows.append((f"t{i}", pos, k, True, float(level + 0.01 * rng.normal())))
                pos += 1
    tokens = pl.DataFrame(rows, schema={"trajectory_id": pl.String, "position": pl.Int32, "turn": pl.Int32,
                                        "response_mask": pl.Boolean, "value": pl.Float32}, orient="row")
    trajs = pl.DataFrame({"trajectory_id": [f"t{i}" for i in range(n)], "group_id": [None] * n,
                          "checkpoint": ["c1" if i < n // 2 else "c2" for i in range(n)],
                          "source": ["s"] * n, "reward": [float(i % 2) for i in range(n)],
                          "success": [bool(i % 2) for i in range(n)], "num_turns": [turns] * n,
                          "metadata": ["{}"] * n},
                         schema_overrides={"group_id": pl.String, "num_turns": pl.Int32})
    return trajs, tokens


def test_value_traces_shades_every_turn():
    trajs, tokens = _tables()
    res = audit(trajs, tokens, AuditConfig(n_boot=50))
    fig = P.plot_value_traces(tokens, res.per_trajectory)
    for ax in fig.axes:
        spans = [p for p in ax.patches if isinstance(p, (Rectangle,))] + [c for c in ax.collections if isinstance(c, PolyCollection)]
        assert len(spans) == 3  # one shaded span per assistant turn
        assert len(ax.lines) == 3  # one value segment per turn
        ys = np.concatenate([ln.get_ydata() for ln in ax.lines])
        tid = ax.get_title().split(": ")[1].split()[0]
        want = tokens.filter(pl.col("trajectory_id") == tid)["value"].to_numpy()
        assert np.allclose(np.sort(ys), np.sort(want))


def test_eta2_hist_median_line_and_ecdf():
    trajs, tokens = _tables()
    res = audit(trajs, tokens, AuditConfig(n_boot=50))
    fig = P.plot_eta2_hist(res.per_trajectory)
    ax = fig.axes[0]
    med = float(np.median(res.per_trajectory["eta2"].to_numpy()))
    assert any(np.allclose(ln.get_xdata(), [med, med]) for ln in ax.lines)
    assert sum(p.get_height() for p in ax.patches) == 6  # every trajectory counted once
    fig2 = P.plot_eta2_ecdf(res.per_trajectory, "success")
    assert len(fig2.axes[0].lines) == 2 + 1  # two classes + the 0.5 guide
    fig3 = P.plot_eta2_box(res.per_trajectory, "checkpoint")
    assert [t.get_text() for t in fig3.axes[0].get_xticklabels()] == ["c1", "c2"]


def test_step_sizes_split_boundary_and_within():
    tokens = pl.DataFrame({"trajectory_id": ["a"] * 5, "position": [1, 2, 5, 6, 7], "turn": [0, 0, 1, 1, 1],
                           "response_mask": [True] * 5, "value": [1.0, 2.0, 5.0, 7.0, 6.0]})
    b, w = P.step_sizes(tokens)
    assert sorted(b.tolist()) == [3.0] and sorted(w.tolist()) == [1.0, 1.0, 2.0]


def test_turn_position_means():
    trajs, tokens = _tables()
    res = audit(trajs, tokens, AuditConfig(n_boot=50))
    df = P.turn_position_means(tokens, res.per_trajectory)
    assert df.height == 6 and set(df["n"].to_list()) == {3}
    # hand check one cell: mean over successful trajectories of their turn-0 means
    ok = tokens.join(trajs.select("trajectory_id", "success"), on="trajectory_id").filter(pl.col("success") & (pl.col("turn") == 0))
    want = ok.group_by("trajectory_id").agg(pl.col("value").mean())["value"].mean()
    got = df.filter(pl.col("success") & (pl.col("turn") == 0))["mean"][0]
    assert got == pytest.approx(want, rel=1e-6)


def test_report_files_and_plot_command(tmp_path):
    trajs, tokens = _tables()
    res = audit(trajs, tokens, AuditConfig(n_boot=50, group_by=("checkpoint",)))
    trajs_out = res.per_trajectory
    trajs_out.write_parquet(tmp_path / "trajectories.parquet")
    tokens.write_parquet(tmp_path / "tokens.parquet")
    (tmp_path / "summary.json").write_text(res.summary.to_json())
    render_folder(tmp_path, tokens, trajs_out, res.summary)
    md = (tmp_path / "report.md").read_text()
    assert f"{res.summary.eta2_median.estimate:.3f}" in md
    assert "**Verdict: " in md and "Thresholds of the verdict" in md
    html = (tmp_path / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 8 and "<table>" in html  # 7 + eta2/EV by checkpoint
    # re-render through the CLI after deleting the plots
    import shutil

    shutil.rmtree(tmp_path / "plots")
    r = CliRunner().invoke(app, ["plot", str(tmp_path)])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "plots" / "eta2_ecdf.svg").exists()
    bad = CliRunner().invoke(app, ["plot", str(tmp_path / "nope")])
    assert bad.exit_code == 1 and "no such folder" in bad.output and "Traceback" not in bad.output


def test_markdown_breakdowns_listed():
    trajs, tokens = _tables()
    res = audit(trajs, tokens, AuditConfig(n_boot=50, group_by=("checkpoint",)))
    md = report_markdown(res.summary, [])
    assert "## By success" in md and "## By checkpoint" in md and "| c1 |" in md


def test_audit_parquet_equals_in_memory(tmp_path):
    from critic_audit.analysis.audit import audit_parquet

    trajs, tokens = _tables(n=9, turns=4, seed=3)
    # one trajectory only in the trajectories table (no tokens): excluded as no_tokens by both
    extra = trajs.head(1).with_columns(trajectory_id=pl.lit("zz"))
    trajs = pl.concat([trajs, extra])
    tokens = tokens.sort("trajectory_id", "position")
    path = tmp_path / "tokens.parquet"
    tokens.write_parquet(path, row_group_size=7)
    cfg = AuditConfig(n_boot=100)
    mem = audit(trajs, tokens, cfg)
    streamed = audit_parquet(trajs, path, cfg, batch_rows=5)
    a, b = mem.summary, streamed.summary
    assert a.excluded == b.excluded == {"no_tokens": 1}
    assert a.eta2_median == b.eta2_median
    assert a.frac_ss_between_gt_within == b.frac_ss_between_gt_within
    assert a.critic_quality.explained_variance == pytest.approx(b.critic_quality.explained_variance, abs=1e-9)
    da, db = a.boundary.to_dict(), b.boundary.to_dict()  # (with the ratios' intervals: lists)
    assert da.keys() == db.keys() and "share_ci95" in da
    for k, v in da.items():
        assert v == db[k] if isinstance(v, str) else v == pytest.approx(db[k])
    cols = ["trajectory_id", "eta2", "omega2", "excluded"]
    assert mem.per_trajectory.select(cols).equals(streamed.per_trajectory.select(cols))


def test_breakdown_natural_order_metadata_and_small_groups():
    from critic_audit.analysis.audit import breakdown

    trajs, tokens = _tables(n=6)
    trajs = trajs.with_columns(group_id=pl.Series(["12", "4", "38", "4", "12", "8"]),
                               metadata=pl.Series([f'{{"trial": {i % 2}}}' for i in range(6)]))
    res = audit(trajs, tokens, AuditConfig(n_boot=50))
    by = breakdown(res.per_trajectory, "group_id", AuditConfig(n_boot=50))
    assert list(by) == ["4", "8", "12", "38"]
    assert by["8"].eta2_median.ci95 is None and by["4"].eta2_median.ci95 is not None
    trial = breakdown(res.per_trajectory, "trial", AuditConfig(n_boot=50))
    assert list(trial) == ["0", "1"] and trial["0"].n == 3
    with pytest.raises(Exception, match="no trajectory column or metadata field 'nope'"):
        breakdown(res.per_trajectory, "nope")


def test_labels_are_escaped_and_nothing_outside_plots_is_embedded(tmp_path):
    """Issue 12 item 3: a label naming a local file must neither embed it nor form a Markdown image."""
    secret = tmp_path / "secret.png"
    secret.write_bytes(b"\x89PNG SECRET-BYTES")
    evil = f"x\n![leak]({secret})\ny"
    trajs, tokens = _tables(n=12)
    trajs = trajs.with_columns(checkpoint=pl.Series([evil if i % 2 else "c1" for i in range(12)]),
                               source=pl.lit(evil), group_id=pl.lit(f"[link]({secret})"))
    res = audit(trajs, tokens, AuditConfig(n_boot=50, gate=GateConfig(n_perm=50), group_by=("group_id",)))
    out = tmp_path / "out"
    out.mkdir()
    render_folder(out, tokens, res.per_trajectory, res.summary)
    md = (out / "report.md").read_text()
    for line in md.splitlines():  # the only image lines are the tool's own plots
        if line.startswith("!["):
            assert line.startswith("![") and "](plots/" in line and str(secret) not in line
    assert "\\!\\[leak\\]" in md  # escaped, visible as text
    page = (out / "report.html").read_text()
    assert "SECRET-BYTES" not in page and base64.b64encode(secret.read_bytes()).decode() not in page
    assert f'href="{secret}"' not in page and "<img" in page
    assert page.count("data:image/png;base64,") == 8  # 7 plots + eta2/EV by checkpoint
    # the renderer never reads a file a crafted line names, even one under plots/ with an unknown stem
    from critic_audit.report import report_html

    (out / "plots" / "other.png").write_bytes(b"OTHER")
    crafted = f"![leak]({secret})\n![other](plots/other.png)\n![eta2_hist](plots/../secret.png)\n"
    assert "base64" not in report_html(crafted, out)


def test_report_order_folding_and_links(tmp_path):
    trajs, tokens = _tables(n=12)
    res = audit(trajs, tokens, AuditConfig(n_boot=50, gate=GateConfig(n_perm=50)))
    md = report_markdown(res.summary, ["eta2_hist"])
    i_verdict, i_cov, i_q, i_head = (md.index(k) for k in ("**Verdict:", "**Coverage.**", "## Critic quality",
                                                            "## Headline"))
    assert i_verdict < i_cov < i_q < i_head
    assert "## By source" not in md and "every trajectory has source = s (12 audited)" in md  # folded
    from critic_audit.report import _inline

    assert _inline("[summary.json](summary.json)") == '<a href="summary.json">summary.json</a>'
    assert _inline("[x](/etc/passwd)") == "[x](/etc/passwd)"  # not a link to the folder's own files
    assert _inline("a \\*\\*b\\*\\* **c**") == "a **b** <b>c</b>"


def test_low_n_rows_flagged_without_verdict():
    trajs, tokens = _tables(n=24)
    trajs = trajs.with_columns(checkpoint=pl.Series(["a"] * 20 + ["b"] * 4))
    s = audit(trajs, tokens, AuditConfig(n_boot=50, gate=GateConfig(n_perm=50))).summary
    assert s.by_checkpoint["b"].low_n and s.by_checkpoint["b"].recommendation is None
    assert "recommendation" in s.by_checkpoint["b"].to_dict()  # judged on its own: the key is there, null
    assert not s.by_checkpoint["a"].low_n and s.by_checkpoint["a"].recommendation.verdict
    # the latest checkpoint has too few trajectories: the headline gives no verdict
    assert s.recommendation.verdict == "not_enough_data" and s.recommendation.checkpoint == "b"
    assert "| b (low n, < 10)" not in report_markdown(s, [])  # checkpoints have their own table
    assert "low n (< 10): no verdict" in report_markdown(s, [])


def test_degenerate_inputs_render_without_warnings(tmp_path):
    """Flat critic, one outcome only, nothing included: a verdict with its reason and no library warnings."""
    import warnings

    cases = {}
    trajs, tokens = _tables(n=8)
    cases["flat"] = (trajs, tokens.with_columns(value=pl.lit(0.5, dtype=pl.Float32)))
    cases["one_outcome"] = (trajs.with_columns(success=pl.lit(True), reward=pl.lit(1.0)), tokens)
    cases["single_turn"] = (trajs.with_columns(num_turns=pl.lit(1, dtype=pl.Int32)),
                            tokens.with_columns(turn=pl.lit(0, dtype=pl.Int32)))
    for name, (tr, tk) in cases.items():
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            res = audit(tr, tk, AuditConfig(n_boot=20, gate=GateConfig(n_perm=20)))
            render_folder(tmp_path / name, tk, res.per_trajectory, res.summary)
        rec = res.summary.recommendation
        assert not rec.confident and rec.text, name
        assert (tmp_path / name / "report.html").exists()


def _gate_paragraphs(md):
    return [ln for ln in md.splitlines() if ln.startswith("Quality gate")]


@pytest.mark.parametrize("drop_last", [False, True])
def test_gate_line_describes_the_verdicts_checkpoint(tmp_path, drop_last):
    """A training run's critics by checkpoint: the verdict is the latest checkpoint's, and so is the gate
    shown with it (its own 16 trajectories, not the 160 pooled); the pooled gate follows, labelled.
    Without step 200 the latest checkpoint is step_179, whose critic fails its gate."""
    import shutil

    from conftest import SAMPLE

    src = SAMPLE / "credit_ppo_run" / "rollouts"
    runs = tmp_path / "rollouts"
    shutil.copytree(src, runs, ignore=shutil.ignore_patterns("step_000199") if drop_last else None)
    out = tmp_path / "audit"
    res = CliRunner().invoke(app, ["analyze", str(runs), "--out", str(out), "--no-plots", "--bootstrap", "50"])
    assert res.exit_code == 0, res.output
    s = json.loads((out / "summary.json").read_text())
    rec = s["recommendation"]
    key = "step_179" if drop_last else "step_199"
    assert rec["checkpoint"] == key
    own = s["by_checkpoint"][key]["critic_quality"]["gate"]
    pooled = s["critic_quality"]["gate"]
    assert own["status"] == ("failed" if drop_last else "passed")
    # step_199: 13/16 with SS_B > SS_W, Wilson [0.570, 0.934] contains 0.7: inconclusive, leaning to turn_level
    assert rec["verdict"] == ("critic_too_weak" if drop_last else "inconclusive")
    if not drop_last:
        assert not rec["confident"] and rec["leans"] == "turn_level"
        assert "[0.570, 0.934] contains 0.7" in rec["text"] and "audit more rollouts" in rec["text"]
    md = report_markdown(s, [])  # report.md's text (--no-plots writes no report)
    first, second = _gate_paragraphs(md)
    assert first.startswith(f"Quality gate of the latest checkpoint, step\\_{key[5:]} (the verdict's data): "
                            f"**{own['status']}** ({own['n_positive']} higher-outcome and {own['n_negative']} "
                            "lower-outcome trajectories judged, 1 source/checkpoint strata)")
    assert own["n_positive"] + own["n_negative"] == 16
    assert second.startswith("Quality gate pooled over all checkpoints (different critics; for reference, not the "
                             f"verdict's): **{pooled['status']}** ({pooled['n_positive']} higher-outcome and "
                             f"{pooled['n_negative']} lower-outcome")
    assert pooled["n_positive"] + pooled["n_negative"] == (144 if drop_last else 160)
    assert md.index(first) < md.index(second)


def test_gate_line_of_one_critic_is_unlabelled():
    trajs, tokens = _tables(n=6)
    s = audit(trajs.with_columns(checkpoint=pl.lit("c1")), tokens, AuditConfig(n_boot=20, min_group_n=2)).summary
    (line,) = _gate_paragraphs(report_markdown(s, []))
    assert line.startswith(f"Quality gate: **{s.critic_quality.gate.status.replace('_', ' ')}**")


# --- labels that say what is drawn (issue 26) -------------------------------------------------------

def _legend_texts(ax) -> list[str]:
    leg = ax.get_legend()
    return [t.get_text() for t in leg.get_texts()] if leg else []


def test_turn_position_legend_names_turn_indexes_and_the_checkpoint():
    trajs, tokens = _tables(n=8, turns=3)
    # the last turn of two trajectories missing: counts fall from k=0 to k=2
    tokens = tokens.filter(~(pl.col("trajectory_id").is_in(["t5", "t7"]) & (pl.col("turn") == 2)))
    res = audit(trajs, tokens, AuditConfig(n_boot=20))
    ax = P.plot_turn_position(tokens, res.per_trajectory).axes[0]
    texts = _legend_texts(ax)
    # checkpoint c2 only (t4..t7): successes t5, t7 (turn 2 missing), failures t4, t6
    assert texts == ["success (trajectories: n=2 at k=0 to n=2 at k=1)",
                     "failure (trajectories: n=2 at k=0 to n=2 at k=2)"]
    assert "checkpoint c2, the latest of 2" in ax.get_title()
    # the line holds the latest checkpoint's values only
    want = (tokens.join(trajs.select("trajectory_id", "success", "checkpoint"), on="trajectory_id")
            .filter((pl.col("checkpoint") == "c2") & ~pl.col("success") & (pl.col("turn") == 0))
            .group_by("trajectory_id").agg(pl.col("value").mean())["value"].mean())
    fail_line = [ln for ln in ax.lines if ln.get_color() == P.FAILURE_COLOR][0]
    assert fail_line.get_ydata()[0] == pytest.approx(want, rel=1e-6)


def test_figure2_pairs_a_success_and_a_failure_of_one_source():
    trajs, tokens = _tables(n=6, turns=3)
    # source "a": successes only (t1, t3); source "b": a success and failures (t0, t2, t4, t5)
    trajs = trajs.with_columns(checkpoint=pl.lit("c"),
                               source=pl.when(pl.col("trajectory_id").is_in(["t1", "t3"])).then(pl.lit("a"))
                               .otherwise(pl.lit("b")))
    res = audit(trajs, tokens, AuditConfig(n_boot=20))
    ex = P.pick_examples(res.per_trajectory)
    src = dict(zip(trajs["trajectory_id"], trajs["source"]))
    assert ex["source"] == "b" and src[ex["success"]] == "b" and src[ex["failure"]] == "b"
    fig = P.plot_value_traces(tokens, res.per_trajectory)
    drawn = [ax.get_title().split(": ")[1].split()[0] for ax in fig.axes]
    assert {src[t] for t in drawn} == {"b"} and "source b" in fig._suptitle.get_text()
    grid = P.plot_value_grid(tokens, res.per_trajectory)
    titled = [ax.get_title().split(": ")[1].split()[0] for ax in grid.axes if ax.get_title()]
    assert titled and {src[t] for t in titled} == {"b"}


def test_without_rewards_the_traces_are_drawn_outcome_unknown():
    trajs, tokens = _tables(n=6, turns=3)
    trajs = trajs.with_columns(reward=pl.lit(None, dtype=pl.Float64), success=pl.lit(None, dtype=pl.Boolean),
                               checkpoint=pl.lit("c"))
    res = audit(trajs, tokens, AuditConfig(n_boot=20))
    fig = P.plot_value_traces(tokens, res.per_trajectory)
    assert len(fig.axes) == 2 and all(len(ax.lines) == 3 for ax in fig.axes)  # one segment per turn
    assert all(ax.get_title().startswith("outcome unknown: ") for ax in fig.axes)
    assert "outcome unknown" in fig._suptitle.get_text()
    grid = P.plot_value_grid(tokens, res.per_trajectory)
    assert sum(bool(ax.lines) for ax in grid.axes) >= 2
    ax = P.plot_turn_position(tokens, res.per_trajectory).axes[0]
    assert _legend_texts(ax) == ["outcome unknown (trajectories: n=6 at k=0 to n=6 at k=2)"]


def test_scope_all_coverage_labels_what_is_counted(tmp_path):
    """--scope all counts every scored token and groups user/tool runs too: the table and report.md
    used to call 1898 scored tokens "policy tokens" (the policy's are fewer) and say nothing of the 96
    groups; they now name what is counted."""
    from conftest import SAMPLE

    src = SAMPLE / "credit_ppo_run" / "rollouts" / "step_000019"
    out = tmp_path / "a"
    res = CliRunner().invoke(app, ["analyze", str(src), "--scope", "all", "--out", str(out), "--no-plots",
                                   "--bootstrap", "20"])
    assert res.exit_code == 0, res.output
    s = json.loads((out / "summary.json").read_text())
    n_tok, n_groups = s["coverage"]["tokens"]["audited"], s["n_turns_included"]
    assert (n_tok, n_groups, s["coverage"]["turns"]["audited"]) == (1898, 96, 48)
    md = report_markdown(s, [])
    cov = next(ln for ln in md.splitlines() if ln.startswith("**Coverage.**"))
    assert "policy tokens" not in cov and "1898 of 1898 tokens (every scored token, not only policy)" in cov
    assert "96 groups (assistant turns and user/tool/template runs)" in cov
    assert "policy tokens audited" not in res.output and "tokens (every scored token" in res.output
    # the default scope keeps its labels
    s["scope"] = "assistant"
    assert "policy tokens" in next(ln for ln in report_markdown(s, []).splitlines() if ln.startswith("**Coverage.**"))


def test_coverage_line_counts_skipped_input(tmp_path):
    """Records skipped by --lenient and stray files in a folder were only on stderr and in summary.json;
    report.md (and report.html, rendered from it) now count them on the coverage line, by reason."""
    from conftest import SAMPLE

    from critic_audit.report import report_html

    out = tmp_path / "a"
    res = CliRunner().invoke(app, ["analyze", str(SAMPLE / "credit_ppo_run" / "rollouts" / "step_000019"),
                                   "--out", str(out), "--no-plots", "--bootstrap", "20"])
    assert res.exit_code == 0, res.output
    s = json.loads((out / "summary.json").read_text())
    cov_line = lambda md: next(ln for ln in md.splitlines() if ln.startswith("**Coverage.**"))  # noqa: E731
    assert "skipped" not in cov_line(report_markdown(s, []))
    s["input"] = {**(s.get("input") or {}), "skipped": {"malformed_json": 2, "no_assistant_turn": 1},
                  "skipped_total": 3, "skipped_files": {"not_a_rollout_file": 1}, "skipped_files_total": 1}
    md = report_markdown(s, [])
    line = cov_line(md)
    assert ("Not read: 3 input records skipped (malformed\\_json: 2, no\\_assistant\\_turn: 1); 1 input file "
            "skipped (not\\_a\\_rollout\\_file: 1), not counted above") in line
    assert "3 input records skipped" in report_html(md, out)


def test_limit_sample_is_named_wherever_coverage_is_shown(tmp_path):
    """--limit 5 audited 5 of the 16 trajectories read, but the table said "trajectories included / read
    5 / 5" and report.md "5 of 5 trajectories (100.0%)", never naming the sample; both now say it, and
    that the shares are of the sample."""
    from conftest import SAMPLE

    from critic_audit.report import report_html
    from critic_audit.summary import AuditSummary

    out = tmp_path / "a"
    res = CliRunner().invoke(app, ["analyze", str(SAMPLE / "credit_ppo_run" / "rollouts" / "step_000019"),
                                   "--limit", "5", "--out", str(out), "--no-plots", "--bootstrap", "20"])
    assert res.exit_code == 0, res.output
    d = json.loads((out / "summary.json").read_text())
    n_read = d["limit"]["trajectories_read"]
    assert d["limit"]["trajectories_kept"] == 5 < n_read
    s = AuditSummary.from_dict(d)
    assert s.to_dict() == d  # nothing new in summary.json
    want = f"a sample of 5 of {n_read} trajectories read (--limit, stratified by source, seed 0)"
    assert s.sample_text == want
    flat = " ".join(res.stdout.split())
    assert want in flat and "trajectories included / sampled" in flat and "trajectories included / read" not in flat
    md = report_markdown(d, [])
    cov = next(ln for ln in md.splitlines() if ln.startswith("**Coverage.**"))
    assert cov.startswith(f"**Coverage.** A sample of 5 of {n_read} trajectories read (--limit, stratified by "
                          "source, seed 0); of the sample: 5 of 5 trajectories (100.0%)")
    assert f"A sample of 5 of {n_read} trajectories read" in report_html(md, out)
    d.pop("limit")  # no --limit: the coverage line is as before
    assert "sample" not in next(ln for ln in report_markdown(d, []).splitlines() if ln.startswith("**Coverage.**"))


@pytest.mark.parametrize("limit", [60, 120])
def test_limit_sample_verdict_names_the_latest_checkpoint_sampled(tmp_path, limit):
    """A --limit sample may leave out the run's latest checkpoint: the by-checkpoint verdict is the
    latest one *sampled*, and its text and reasons are written saying so (the whole run: they do not;
    a sample that keeps every trajectory is not a sample); so does the report's gate title."""
    import shutil

    from conftest import SAMPLE
    from critic_audit.pipeline.analyze import is_sample
    from critic_audit.report import _verdict_gate_lines
    from critic_audit.summary import Breakdown, Recommendation, Sample

    runs = tmp_path / "rollouts"  # 10 checkpoints of 16: --limit 60 keeps 6 each, below min_group_n (no verdict)
    shutil.copytree(SAMPLE / "credit_ppo_run" / "rollouts", runs)
    recs = {}
    for name, extra in (("all", []), ("sample", ["--limit", str(limit)])):
        out = tmp_path / name
        res = CliRunner().invoke(app, ["analyze", str(runs), "--out", str(out), "--no-plots", "--bootstrap", "20",
                                       *extra])
        assert res.exit_code == 0, res.output
        recs[name] = json.loads((out / "summary.json").read_text())["recommendation"]
    key = recs["sample"]["checkpoint"]
    assert "latest checkpoint sampled" not in recs["all"]["text"] + " ".join(recs["all"].get("reasons") or [])
    said = "The latest checkpoint sampled, " if limit == 60 else "Latest checkpoint sampled, "
    assert f"{said}{key}" in recs["sample"]["text"]
    assert all("latest checkpoint " not in r or f"latest checkpoint sampled {key}:" in r
               for r in recs["sample"].get("reasons") or [])
    assert is_sample(Sample(trajectories_kept=limit, trajectories_read=160))
    assert not is_sample(None) and not is_sample(Sample(trajectories_kept=20, trajectories_read=20))
    rec = Recommendation.from_dict({"checkpoint": "step_179"})
    rows = {"step_179": Breakdown.from_dict({"n_included": 4})}
    assert _verdict_gate_lines(None, rec, rows, 10, True)[0].startswith("Quality gate of the latest checkpoint "
                                                                          "sampled, step\\_179")
    assert _verdict_gate_lines(None, rec, rows, 10)[0].startswith("Quality gate of the latest checkpoint, step")


def test_a_limit_above_the_trajectories_read_says_no_sampling_was_needed(tmp_path):
    """``--limit 100`` on 16 trajectories printed "a sample of 16 of 16 trajectories" (reviewer): now
    "no sampling needed", in the table and the report, and the shares are not called the sample's."""
    import json

    from typer.testing import CliRunner

    from conftest import SAMPLE
    from critic_audit.cli import app
    from critic_audit.report import report_markdown
    from critic_audit.summary import AuditSummary

    out = tmp_path / "a"
    res = CliRunner().invoke(app, ["analyze", str(SAMPLE / "credit_ppo_run" / "rollouts" / "step_000019"),
                                   "--limit", "100", "--out", str(out), "--no-plots", "--bootstrap", "20"])
    assert res.exit_code == 0, res.output
    d = json.loads((out / "summary.json").read_text())
    assert d["limit"]["trajectories_kept"] == d["limit"]["trajectories_read"] == 16
    s = AuditSummary.from_dict(d)
    assert s.sample_text is None
    assert s.unsampled_text == "no sampling needed: --limit 100 covers all 16 trajectories read"
    flat = " ".join(res.output.split())
    assert "no sampling needed: --limit 100 covers all 16 trajectories read" in flat
    assert "a sample of" not in flat and "trajectories included / read" in flat
    cov = next(ln for ln in report_markdown(d, []).splitlines() if ln.startswith("**Coverage.**"))
    assert cov.startswith("**Coverage.** No sampling needed: --limit 100 covers all 16 trajectories read: 16 of 16")
    assert "of the sample" not in cov


def test_plots_of_many_checkpoints_stay_a_bounded_width_with_every_kth_label():
    # 96 checkpoints (a long verl run): every box drawn, the figure at most P.MAX_WIDTH inches wide,
    # every 3rd checkpoint labelled (96 / 40 rounded up); a few checkpoints keep every label.
    n = 96
    per = pl.DataFrame({"checkpoint": [f"step_{i}" for i in range(n) for _ in range(4)],
                        "eta2": np.linspace(0.1, 0.9, 4 * n), "excluded": [None] * (4 * n)},
                       schema_overrides={"excluded": pl.String})
    fig = P.plot_eta2_box(per, "checkpoint")
    ax = fig.axes[0]
    assert fig.get_size_inches()[0] == P.MAX_WIDTH
    assert [t.get_text() for t in ax.get_xticklabels()] == [f"step_{i}" for i in range(0, n, 3)]
    from matplotlib.collections import LineCollection

    meds = [c for c in ax.collections if isinstance(c, LineCollection)][1].get_segments()
    want = [np.median(per.filter(pl.col("checkpoint") == f"step_{i}")["eta2"].to_numpy()) for i in range(n)]
    assert len(meds) == n and np.allclose([seg[0][1] for seg in meds], want)  # one median per checkpoint
    assert np.allclose(ax.lines[0].get_ydata(), [np.mean(np.linspace(0.1, 0.9, 4 * n)[4 * i:4 * i + 4]) for i in range(n)])
    from critic_audit.summary import Breakdown, Interval

    rows = {f"step_{i}": Breakdown(eta2_median=Interval(estimate=0.5, ci95=(0.4, 0.6))) for i in range(n)}
    fig2 = P.plot_eta2_ev_by_checkpoint(rows)
    assert fig2.get_size_inches()[0] == P.MAX_WIDTH
    assert len(fig2.axes[1].get_xticklabels()) == 32
    few = P.plot_eta2_box(per.filter(pl.col("checkpoint").is_in(["step_1", "step_2"])), "checkpoint")
    assert [t.get_text() for t in few.axes[0].get_xticklabels()] == ["step_1", "step_2"]
    assert few.get_size_inches()[0] == 5
    import matplotlib.pyplot as plt

    plt.close("all")
