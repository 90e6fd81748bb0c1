"""Issue 35 (an audit never misleads about what it measured) and issue 38 items 1-3 (crash classes)."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest


# --- 35.1: --limit is a random sample of sources when there are more sources than the limit -------

def test_limit_sample_every_source_has_its_chance_over_seeds():
    """17 environments x 5 rollouts, --limit 8: the old allocation broke its ties by source name and kept
    the alphabetically first 8 environments for every seed. Over 2,000 seeds each source's inclusion
    rate must be 8/17 = 0.471; its binomial SD over 2,000 seeds is sqrt(p(1-p)/2000) = 0.0112, and we
    allow 5 SD (0.056): a fair sampler fails this with probability < 1e-5 per source."""
    from critic_audit.pipeline.analyze import limit_sample

    ids = {f"env_{i:02d}": [f"env_{i:02d}_{k}" for k in range(5)] for i in range(17)}
    n_seeds, limit = 2000, 8
    hits = {s: 0 for s in ids}
    for seed in range(n_seeds):
        got = limit_sample(ids, limit, seed)
        assert sum(len(v) for v in got.values()) == limit
        assert all(len(v) <= 1 for v in got.values())  # quota 8/17 < 1: floor 0 or ceil 1
        for s, v in got.items():
            hits[s] += bool(v)
    p = limit / len(ids)
    tol = 5 * math.sqrt(p * (1 - p) / n_seeds)
    rates = {s: h / n_seeds for s, h in hits.items()}
    assert all(abs(r - p) < tol for r in rates.values()), rates


def test_limit_sample_unequal_sources_expected_share_is_the_quota():
    """Sources of 1..6 trajectories (21), --limit 5: each source keeps floor or ceil of its quota
    5 * n / 21, and on average (2,000 seeds) exactly the quota; binomial SD of the ceil indicator
    <= 0.5 / sqrt(2000) = 0.0112, tolerance 5 SD."""
    from critic_audit.pipeline.analyze import limit_sample

    ids = {f"s{n}": [f"s{n}_{k}" for k in range(n)] for n in range(1, 7)}
    total, limit, n_seeds = 21, 5, 2000
    sums = {s: 0 for s in ids}
    for seed in range(n_seeds):
        got = limit_sample(ids, limit, seed)
        assert sum(len(v) for v in got.values()) == limit
        for s, v in got.items():
            q = limit * len(ids[s]) / total
            assert math.floor(q) <= len(v) <= math.ceil(q)
            sums[s] += len(v)
    tol = 5 * 0.5 / math.sqrt(n_seeds)
    for s, v in sums.items():
        assert abs(v / n_seeds - limit * len(ids[s]) / total) < tol, (s, v / n_seeds)


def test_limit_info_names_the_sources_sampled_and_those_with_none():
    from critic_audit.pipeline.analyze import limit_sample, limit_summary

    ids = {f"env_{i:02d}": [f"env_{i:02d}_{k}" for k in range(5)] for i in range(17)}
    kept = limit_sample(ids, 8, seed=3)
    info = limit_summary(ids, kept, 8, 3)
    sampled = sorted(s for s, v in kept.items() if v)
    assert list(info.sources_sampled) == sampled and len(sampled) == 8
    assert list(info.sources_not_sampled) == sorted(set(ids) - set(sampled))
    assert info.by_source["env_00"].read == 5 and info.trajectories_kept == 8
    from critic_audit.summary import AuditSummary, RunInfo

    text = AuditSummary(run=RunInfo(limit=info)).sample_text
    assert text == AuditSummary.from_dict({"limit": info.to_dict()}).sample_text  # as read back from summary.json
    assert text.endswith(f"; no trajectory from 9 of 17 sources: {', '.join(info.sources_not_sampled[:5])} "
                         "and 4 more")


# --- 38.2: extreme log-prob values are findings, not an OverflowError ------------------------------

def _lp_rows(tmp_path, sampler, trainer):
    mask = [0] + [1] * (len(sampler) - 1)
    r = {"id": "x", "input_ids": list(range(len(mask))), "response_mask": mask, "reward": 1.0,
         "rollout_log_probs": sampler, "old_log_probs": trainer}
    p = tmp_path / "r.jsonl"
    p.write_text(json.dumps(r) + "\n")
    return p


@pytest.mark.parametrize("trainer", [[None, 800.0, -1.0], [None, -1.0, 1e300], [None, -1e300, -1.0],
                                     [None, 710.0, 710.0], [None, -1.7e308, 1.7e308], [None] + [-1.0] * 12])
def test_extreme_log_probs_are_findings_not_an_overflow(tmp_path, trainer):
    """Each crashed check_logprob_mismatch with OverflowError (math.exp of a sum of deltas); the last:
    12 tokens of delta 90 (each under the 100-nat bound) sum to 1080."""
    from critic_audit.check import check_rollouts

    sampler = [None, -1.0, -1.0] if len(trainer) == 3 else [None] + [-91.0] * 12
    p = _lp_rows(tmp_path, sampler, trainer)
    res = check_rollouts([p])
    c = next(c for c in res.checks if c.id == "logprob_mismatch")
    assert c.status == "fail"  # log-probs above 0 or weights off every floor
    json.dumps(res.as_dict(), allow_nan=False, default=str)  # the JSON report stays strict JSON
    for k in ("seq_product_weight_min", "seq_product_weight_median", "seq_geomean_weight_median"):
        v = c.measured[k]
        assert v is None or (math.isfinite(v) and v >= 0)
    if len(trainer) == 3:
        assert c.counts["extreme_deltas"] >= 1 and "broken log-prob pair" in c.summary
    else:
        assert c.counts["extreme_deltas"] == 0 and c.counts["trajectories_collapsed"] == 1
        assert any("= 1.092e+469 over 12 tokens" in e.detail for e in c.examples)  # exp(1080), in log10


# --- 38.1: a summary.json of an unexpected shape beside tables is validated before it is used ----------

_BAD_SUMMARIES = [3, [1, 2], "x", {"truncated": 5}, {"truncated": {"trajectories": "many"}},
                  {"inference": [1]}, {"template_system": 7}, {"critics": 4}, {"critics": [1, 2]},
                  {"critics": {"a": 1}}]


def _table_copy(tmp_path, summary):
    import shutil

    from conftest import SAMPLE

    d = tmp_path / "tables"
    shutil.copytree(SAMPLE / "credit_ppo_run" / "rollouts" / "step_000019", d)
    (d / "summary.json").write_text(json.dumps(summary))
    return d


@pytest.mark.parametrize("summary", _BAD_SUMMARIES, ids=lambda s: json.dumps(s)[:20])
def test_bad_side_summary_beside_tables_strict_names_it_lenient_counts_it(tmp_path, summary):
    from typer.testing import CliRunner

    from critic_audit.cli import app

    d = _table_copy(tmp_path, summary)
    base = ["analyze", str(d), "--no-plots", "--bootstrap", "10"]
    res = CliRunner().invoke(app, [*base, "--out", str(tmp_path / "o1")])
    assert res.exit_code == 1, res.output
    flat = " ".join(res.output.split())
    assert "summary.json" in flat and "unexpected" not in flat.lower() and "Traceback" not in flat
    assert "--lenient" in flat
    res = CliRunner().invoke(app, [*base, "--lenient", "--out", str(tmp_path / "o2")])
    assert res.exit_code == 0, res.output
    s = json.loads((tmp_path / "o2" / "summary.json").read_text())
    assert s["input"]["skipped_files"] == {"bad_side_summary": 1}
    assert s["input"]["skipped_file_examples"]["bad_side_summary"] == [str(d / "summary.json")]


@pytest.mark.parametrize("summary", _BAD_SUMMARIES, ids=lambda s: json.dumps(s)[:20])
def test_bad_summary_in_a_critic_comparison_folder_is_no_crash(tmp_path, summary):
    """A folder with summary.json and no tokens table is checked for a several-critic audit; a summary
    of another shape crashed refuse_multi_critic_folder (AttributeError, KeyError, TypeError)."""
    from critic_audit.errors import CriticAuditError
    from critic_audit.io.tables import load_audit_folder, refuse_multi_critic_folder

    d = tmp_path / "cmp"
    (d / "critics" / "a").mkdir(parents=True)
    (d / "summary.json").write_text(json.dumps(summary))
    refuse_multi_critic_folder(d)  # not a several-critic folder: nothing to refuse
    with pytest.raises(CriticAuditError, match="no tokens.parquet"):
        load_audit_folder(d)


# --- 38.3: an unreadable file or folder below an input is one clean line (or skipped with --lenient) --

def deny(monkeypatch, folders=(), files=()):
    """Simulate a user without permission on ``folders`` (mode 000: not listable, nothing below them
    reachable) and ``files`` (mode 000: not openable), as the OS does for a non-root user; the tests
    run as root in CI containers, where chmod denies nothing. Patches the os / io entry points that
    pathlib, open() and the readers' entry checks go through."""
    import builtins
    import errno
    import io
    import os
    from pathlib import Path

    folders = [os.path.abspath(f) for f in folders]
    files = [os.path.abspath(f) for f in files]

    def below(p):
        try:
            return None if isinstance(p, int) else os.path.abspath(os.fsdecode(os.fspath(p)))
        except TypeError:
            return None

    def fail(p):
        raise PermissionError(errno.EACCES, "Permission denied", os.fspath(p))

    def inside(r):
        return r is not None and any(r.startswith(f + os.sep) for f in folders)

    def wrap_stat(orig):
        def f(p, *a, **k):
            if inside(below(p)):
                fail(p)
            return orig(p, *a, **k)
        return f

    def wrap_list(orig):
        def f(p=".", *a, **k):
            r = below(p)
            if r in folders or inside(r):
                fail(p)
            return orig(p, *a, **k)
        return f

    def wrap_open(orig):
        def f(p, *a, **k):
            r = below(p)
            if r in files or r in folders or inside(r):
                fail(p)
            return orig(p, *a, **k)
        return f

    for name, w in (("stat", wrap_stat), ("lstat", wrap_stat), ("scandir", wrap_list), ("listdir", wrap_list),
                    ("open", wrap_open)):
        monkeypatch.setattr(os, name, w(getattr(os, name)))
    monkeypatch.setattr(builtins, "open", wrap_open(builtins.open))
    monkeypatch.setattr(io, "open", wrap_open(io.open))
    # polars and pyarrow open files in Rust / C++: their readers are denied the same paths
    import polars as pl
    import pyarrow.parquet as pq

    for mod, names in ((pl, ("read_parquet", "scan_parquet", "read_parquet_schema")),
                       (pq, ("read_table", "ParquetFile", "read_schema", "read_metadata"))):
        for name in names:
            monkeypatch.setattr(mod, name, wrap_open(getattr(mod, name)))
    return Path


def _run_copy(tmp_path):
    import shutil

    from conftest import SAMPLE

    run = tmp_path / "run"
    shutil.copytree(SAMPLE / "credit_ppo_run" / "rollouts", run, ignore=shutil.ignore_patterns("*.parquet"))
    for step in ("step_000019", "step_000039", "step_000059"):
        shutil.copytree(SAMPLE / "credit_ppo_run" / "rollouts" / step, run / step, dirs_exist_ok=True)
    for extra in sorted(run.iterdir())[3:]:
        shutil.rmtree(extra)
    return run


@pytest.mark.parametrize("where", ["step folder", "tokens.parquet", "trajectories.parquet"])
def test_unreadable_table_folder_or_file_below_an_input_is_one_line(tmp_path, monkeypatch, where):
    """A training run's rollouts/ with one step folder (or one of its tables) unreadable: analyze crashed
    in expand_table_folders with PermissionError; now one line naming it (strict), or skipped and counted
    (--lenient) while the other steps are audited."""
    from typer.testing import CliRunner

    from critic_audit.cli import app

    run = _run_copy(tmp_path)
    bad = run / "step_000039" if where == "step folder" else run / "step_000039" / where
    deny(monkeypatch, folders=[bad] if where == "step folder" else [], files=[] if where == "step folder" else [bad])
    base = ["analyze", str(run), "--no-plots", "--bootstrap", "10"]
    res = CliRunner().invoke(app, [*base, "--out", str(tmp_path / "o1")])
    assert res.exit_code == 1 and isinstance(res.exception, SystemExit), res.exception
    flat = " ".join(res.output.split())
    assert f"{bad}: cannot" in flat and "Permission denied" in flat and "--lenient" in flat, flat
    res = CliRunner().invoke(app, [*base, "--lenient", "--out", str(tmp_path / "o2")])
    assert res.exit_code == 0, res.output
    monkeypatch.undo()
    s = json.loads((tmp_path / "o2" / "summary.json").read_text())
    reason = "unreadable_folder" if where == "step folder" else "unreadable_file"
    assert s["input"]["skipped_files"] == {reason: 1}
    assert s["input"]["skipped_file_examples"][reason] == [str(bad)]
    assert s["n_trajectories"] == 32  # the two readable steps, 16 each


def test_unreadable_harbor_agent_folder_is_one_line(tmp_path, monkeypatch):
    import shutil

    from typer.testing import CliRunner

    from critic_audit.cli import app

    job = tmp_path / "job"
    shutil.copytree(Path(__file__).parent / "data" / "harbor" / "job-golden", job)
    deny(monkeypatch, folders=[job / "hello-world__linear" / "agent"])
    res = CliRunner().invoke(app, ["check", str(job)])
    assert res.exit_code == 1 and "agent: cannot list the folder (Permission denied)" in " ".join(res.output.split())
    res = CliRunner().invoke(app, ["check", str(job), "--lenient", "--json"])
    assert res.exit_code in (0, 3), res.output


# --- 35.3: monitor marks the AUROC of a critic that failed the quality gate -----------------------------

def _noise_critic_folder(tmp_path):
    """The shipped PPO run's 160 trajectories (11 successes) with values replaced by seeded noise: a
    critic that does not explain the outcome; analyze re-audits it (its gate fails) into a folder."""
    import numpy as np
    import polars as pl
    from typer.testing import CliRunner

    from conftest import SAMPLE
    from critic_audit.cli import app

    steps = sorted((SAMPLE / "credit_ppo_run" / "rollouts").glob("step_*"))
    tr = pl.concat([pl.read_parquet(s / "trajectories.parquet") for s in steps], how="diagonal_relaxed")
    tk = pl.concat([pl.read_parquet(s / "tokens.parquet") for s in steps], how="diagonal_relaxed")
    noise = np.random.default_rng(0).normal(size=tk.height)
    tk = tk.with_columns(pl.when(pl.col("value").is_not_null()).then(pl.Series(noise)).otherwise(None)
                         .cast(tk.schema["value"]).alias("value"))
    src = tmp_path / "noise"
    src.mkdir()
    tr.drop([c for c in ("checkpoint",) if c in tr.columns]).write_parquet(src / "trajectories.parquet")
    tk.write_parquet(src / "tokens.parquet")
    res = CliRunner().invoke(app, ["analyze", str(src), "--out", str(tmp_path / "audit"), "--no-plots",
                                   "--bootstrap", "50"])
    assert res.exit_code == 0, res.output
    return tmp_path / "audit"


def test_monitor_marks_the_auroc_of_a_critic_that_failed_the_gate(tmp_path):
    from typer.testing import CliRunner

    from critic_audit.cli import app

    audit = _noise_critic_folder(tmp_path)
    gate = json.loads((audit / "summary.json").read_text())["critic_quality"]["gate"]
    assert gate["status"] == "failed"
    res = CliRunner().invoke(app, ["monitor", str(audit), "--json", "--bootstrap", "50"])
    assert res.exit_code == 0, res.output
    s = json.loads(res.stdout)
    assert s["critic_gate"]["status"] == "failed" and s["critic_gate"]["reasons"] == gate["reasons"]
    for k in ("max_abs_z", "largest_drop"):
        assert s["auroc"][k]["estimate"] is not None
        assert s["auroc"][k]["caveat"].startswith("the critic failed the quality gate")
    assert "caveat" not in s["auroc"]["num_turns"]  # the baseline uses no critic
    res = CliRunner().invoke(app, ["monitor", str(audit), "--bootstrap", "50"])
    flat = " ".join(res.stdout.split())
    est = f"{s['auroc']['max_abs_z']['estimate']:.3f}"
    assert f"{est} [" in flat and "critic failed the quality gate" in flat.split("largest drop")[0]
    # a folder without its summary.json: the critic's quality is unknown, said too
    (audit / "summary.json").unlink()
    s = json.loads(CliRunner().invoke(app, ["monitor", str(audit), "--json", "--bootstrap", "20"]).stdout)
    assert s["critic_gate"]["status"] == "unmeasured" and "caveat" in s["auroc"]["max_abs_z"]


# --- 35.6: the messages a user meets first -------------------------------------------------------------

def _invoke(args, cwd):
    import os

    from typer.testing import CliRunner

    from critic_audit.cli import app

    old = os.getcwd()
    os.chdir(cwd)
    try:
        res = CliRunner().invoke(app, args)
    finally:
        os.chdir(old)
    return res, " ".join(res.output.split())


def test_a_csv_is_told_csv_is_no_rollout_format_and_the_formats_are_named(tmp_path):
    from critic_audit.io.formats import FORMATS

    (tmp_path / "r.csv").write_text("id,reward\n1,0.5\n")
    for cmd in ("check", "analyze"):
        res, flat = _invoke([cmd, "r.csv", *(["--out", "o"] if cmd == "analyze" else [])], tmp_path)
        assert res.exit_code == 1, flat
        assert "r.csv: CSV is not a rollout format" in flat and "repair the JSON" not in flat
        assert all(f.name in flat for f in FORMATS.values() if f.selectable), flat


def test_a_broken_jsonl_line_points_to_lenient(tmp_path):
    (tmp_path / "r.jsonl").write_text('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", '
                                      '"content": "yo"}], "reward": 1}\n{"messages": [broken\n')
    res, flat = _invoke(["check", "r.jsonl"], tmp_path)
    assert res.exit_code == 1 and "line 2" in flat and "--lenient" in flat, flat
    res, flat = _invoke(["check", "r.jsonl", "--lenient"], tmp_path)
    assert res.exit_code in (0, 3), flat


def test_a_value_head_passed_as_critic_points_to_build_critic(tmp_path):
    from conftest import SAMPLE

    (tmp_path / "r.jsonl").write_text('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", '
                                      '"content": "yo"}], "reward": 1}\n')
    head = SAMPLE / "critic" / "smollm2_value_head.safetensors"
    res, flat = _invoke(["analyze", "r.jsonl", "--critic", str(head), "--out", "o"], tmp_path)
    assert res.exit_code == 1, flat
    assert f"critic-audit build-critic --head {head} --out my_critic" in flat and "then --critic my_critic" in flat


def test_version_option():
    from typer.testing import CliRunner

    from critic_audit.cli import app
    from critic_audit.version import __version__

    res = CliRunner().invoke(app, ["--version"])
    assert res.exit_code == 0 and res.output.strip() == f"critic-audit {__version__}"


@pytest.mark.parametrize("args", [
    ["analyze", "r.jsonl", "--critic", "c", "--dtype", "float13", "--out", "o"],
    ["analyze", "r.jsonl", "--critic", "c", "--device", "cpux", "--out", "o"],
    ["analyze", "r.jsonl", "--critic", "c", "--threads", "0", "--out", "o"],
    ["analyze", "r.jsonl", "--critic", "c", "--token-budget", "0", "--out", "o"],
    ["analyze", "r.jsonl", "--critic", "c", "--bootstrap", "-1", "--out", "o"],
    ["analyze", "r.jsonl", "--critic", "c", "--overlong", "zz", "--out", "o"],
    ["analyze", "r.jsonl", "--critic", "c", "--format", "zz", "--out", "o"],
    ["analyze", "r.jsonl", "--critic", "c", "--limit", "0", "--out", "o"],
    ["monitor", "nowhere", "--threshold", "-1"],
    ["check", "r.jsonl", "--bootstrap", "abc"],
], ids=lambda a: a[-3] if a[0] == "analyze" else a[-2])
def test_bad_option_values_are_usage_errors_exit_2(tmp_path, args):
    """One rule: a bad option value exits 2 (click's unknown option, a bad number, --limit 0 always
    did; --dtype float13 and the other values the library refuses exited 1), with one line."""
    (tmp_path / "r.jsonl").write_text('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", '
                                      '"content": "yo"}], "reward": 1}\n')
    res, flat = _invoke(args, tmp_path)
    assert res.exit_code == 2, flat
    assert "Traceback" not in res.output


# --- 35.7: the test command's cost is in the README, with a quick subset ---------------------------------

def test_readme_states_the_test_commands_cost_and_a_quick_subset():
    import re

    root = Path(__file__).resolve().parents[1]
    readme = " ".join((root / "README.md").read_text().split())
    m = re.search(r"\*\*What the test command costs\*\*: (.*?)(?= ## |$)", readme)
    assert m, "the README says what scripts/test.sh installs and how long it takes"
    said = m.group(1)
    assert re.search(r"\d+(\.\d+)? GB", said) and re.search(r"\d+ minutes", said) and "verl" in said
    quick = re.search(r"`(QUICK=1 bash scripts/test\.sh[^`]*)`", said)
    assert quick, "a quick subset for a contributor"
    script = (root / "scripts" / "test.sh").read_text()
    assert 'if [ -n "${QUICK:-}" ]' in script and '-m "not slow" "$@"' in script  # the subset the README offers
    assert "CRITIC_AUDIT_REQUIRE_VERL=1" in script and 'pytest tests "$@"' in script  # CI still runs everything


# --- 35.2: stored token ids are verified against the critic's tokenizer ---------------------------------

def _ng_record(tok, user, answer, rid, corrupt=None):
    """A NeMo Gym rollout (one model call) whose prompt / generation token ids are ``tok``'s rendering of
    its text; ``corrupt``: ids of "another tokenizer" (``shift``: in the vocabulary, another text;
    ``oov``: ids beyond it, as the synthetic ids of Harbor's fake LLM server)."""
    prompt = tok.apply_chat_template([{"role": "user", "content": user}], tokenize=True, add_generation_prompt=True)
    prompt = list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)
    gen = tok.encode(answer, add_special_tokens=False) + [tok.convert_tokens_to_ids("<|im_end|>")]
    if corrupt == "shift":
        prompt, gen = [(i + 7) % 250 + 3 for i in prompt], [(i + 7) % 250 + 3 for i in gen]
    elif corrupt == "oov":
        gen = [60000 + k for k in range(len(gen))]
    item = {"id": f"msg{rid}", "type": "message", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": answer, "annotations": []}],
            "prompt_token_ids": prompt, "generation_token_ids": gen, "generation_log_probs": [-0.1] * len(gen)}
    return {"responses_create_params": {"input": [{"role": "user", "content": user, "type": "message"}]},
            "response": {"id": f"resp{rid}", "output": [item]}, "reward": float(rid % 2),
            "_ng_task_index": rid, "_ng_rollout_index": 0}


def _ng_inputs(tmp_path, tokenizer):
    d = tmp_path / "in"
    d.mkdir()
    good = [_ng_record(tokenizer, f"Search the flight {i} and book it.", f"Thought: I need to search {i}.", i)
            for i in range(6)]
    other = [_ng_record(tokenizer, f"Search the flight {i} and book it.", f"Action: search[Paris {i}]", i,
                        "shift" if i < 4 else "oov") for i in range(6)]
    (d / "good.jsonl").write_text("".join(json.dumps(r) + "\n" for r in good))
    (d / "other.jsonl").write_text("".join(json.dumps(r) + "\n" for r in other))
    return d, good, other


def test_ids_match_text_golden(tokenizer):
    from critic_audit.pipeline.token_ids import ids_match_text

    msgs = [{"role": "user", "content": "Search the flight."}, {"role": "assistant", "content": "Thought: book it."}]
    ids = tokenizer.apply_chat_template(msgs, tokenize=True)
    ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    assert ids_match_text(ids, msgs, tokenizer) is None
    assert ids_match_text([(i + 7) % 250 + 3 for i in ids], msgs, tokenizer) == "text_mismatch"
    assert ids_match_text([*ids, len(tokenizer)], msgs, tokenizer) == "out_of_vocabulary"
    assert ids_match_text([5, 6], [{"role": "assistant", "content": None}], tokenizer) is None  # no text to compare


def test_stored_ids_of_another_tokenizer_are_rerendered_and_counted(tmp_path, critic_dir, tokenizer):
    """Before: the 4 in-vocabulary ids of another tokenizer were scored as the critic's (a warning only),
    the 2 out-of-vocabulary ones stopped the audit; now all 6 are re-rendered from their text, the 6 of
    the critic's own tokenizer are verified and scored on their ids, and stderr and summary.json count it."""
    import polars as pl
    from typer.testing import CliRunner

    from critic_audit.cli import app

    d, good, other = _ng_inputs(tmp_path, tokenizer)
    base = ["analyze", str(d), "--critic", str(critic_dir), "--no-plots", "--bootstrap", "10"]
    res = CliRunner().invoke(app, [*base, "--out", str(tmp_path / "o")])
    assert res.exit_code == 0, res.output
    s = json.loads((tmp_path / "o" / "summary.json").read_text())
    info = s["inference"]["token_ids"]
    assert info == {"checked": 12, "verified": 6, "out_of_vocabulary": 2, "text_mismatch": 4, "unverified": 0,
                    "files": [str(d / "other.jsonl")], "rerendered": 6}
    flat = " ".join(res.output.split())
    assert "token ids: 6 of 12 trajectory(ies) carry token ids the critic's tokenizer did not write" in flat
    tk = pl.read_parquet(tmp_path / "o" / "tokens.parquet")
    own = tk.filter(pl.col("trajectory_id") == "good/0/0")["token_id"].to_list()
    r = good[0]["response"]["output"][0]
    assert own == r["prompt_token_ids"] + r["generation_token_ids"]  # verified: scored on the stored ids
    redone = tk.filter(pl.col("trajectory_id") == "other/0/0")["token_id"].to_list()
    assert redone != other[0]["response"]["output"][0]["prompt_token_ids"] + other[0]["response"]["output"][0][
        "generation_token_ids"]
    text = tokenizer.decode(redone)
    assert "Action: search[Paris 0]" in text and "Search the flight 0 and book it." in text  # re-rendered
    assert s["n_trajectories"] == 12
    # --token-ids trust: the stored ids as they are (the out-of-vocabulary ones refused in one line)
    res = CliRunner().invoke(app, [*base, "--token-ids", "trust", "--out", str(tmp_path / "t")])
    assert res.exit_code == 1 and "outside the critic's vocabulary" in " ".join(res.output.split())
    (d / "other.jsonl").write_text("".join(json.dumps(r) + "\n" for r in other[:4]))
    res = CliRunner().invoke(app, [*base, "--token-ids", "trust", "--out", str(tmp_path / "t2")])
    assert res.exit_code == 0, res.output
    tk = pl.read_parquet(tmp_path / "t2" / "tokens.parquet")
    r = other[0]["response"]["output"][0]
    assert tk.filter(pl.col("trajectory_id") == "other/0/0")["token_id"].to_list() == \
        r["prompt_token_ids"] + r["generation_token_ids"]
    s = json.loads((tmp_path / "t2" / "summary.json").read_text())
    assert s["inference"]["token_ids"] == {"mode": "trust", "checked": 0, "trusted": 10, "verified": 0,
                                           "out_of_vocabulary": 0, "text_mismatch": 0, "unverified": 0,
                                           "files": [], "rerendered": 0}  # was null
    assert s["input"]["notes"]["responses_exact_token_ids"] == 10
    assert "scored on the policy's own token ids" in " ".join(res.output.split())  # trusted: still said


def test_input_notes_count_the_rerendered_trajectories_as_rerendered(tmp_path, critic_dir, tokenizer):
    """``input.notes.responses_exact_token_ids`` said 3 when all 3 were re-rendered (reviewer): the
    re-rendered ones are counted as such."""
    from typer.testing import CliRunner

    from critic_audit.cli import app

    d, good, other = _ng_inputs(tmp_path, tokenizer)
    (d / "good.jsonl").unlink()
    (d / "other.jsonl").write_text("".join(json.dumps(r) + "\n" for r in other[:3]))
    res = CliRunner().invoke(app, ["analyze", str(d), "--critic", str(critic_dir), "--no-plots", "--bootstrap", "10",
                                   "--out", str(tmp_path / "o")])
    assert res.exit_code == 0, res.output
    s = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert s["inference"]["token_ids"]["rerendered"] == 3
    notes = s["input"]["notes"]
    assert "responses_exact_token_ids" not in notes and notes["responses_ids_rerendered: not_the_critic_tokenizer"] == 3


# --- 35.5: a check skipped for want of --tokenizer runs when it is given, or names what is missing -------

def _chat_and_token_rows(tmp_path, tokenizer):
    from conftest import conv
    from critic_audit.schema import Conversation
    from critic_audit.turns import ChatRenderer

    chat = tmp_path / "good.jsonl"
    chat.write_text("".join(json.dumps(conv(i, 2 + i % 3, float(i % 2))) + "\n" for i in range(8)))
    rows = []
    for i in range(8):
        msgs = conv(i, 2 + i % 3, 1.0, tool=False)["traj"]
        tc = ChatRenderer(tokenizer).tokenize(Conversation(f"r{i}", msgs))
        rows.append({"trajectory_id": f"r{i}", "input_ids": tc.input_ids.tolist(),
                     "response_mask": tc.response_mask.astype(int).tolist(), "reward": float(i % 2), "messages": msgs})
    tok = tmp_path / "rows.jsonl"
    tok.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return chat, tok


def test_check_skips_naming_tokenizer_run_when_it_is_given(tmp_path, tokenizer, critic_dir):
    """On chat data, mask_boundaries, turn_separators, retokenization and turn_boundary_tokens said
    "needs --tokenizer" and stayed skipped with it; a skip reason that asks for --tokenizer must now
    be one that --tokenizer lifts (on chat data and on token data with its messages)."""
    import re

    from critic_audit.check import check_rollouts

    for data in _chat_and_token_rows(tmp_path, tokenizer):
        without = {c.id: c for c in check_rollouts([data]).checks}
        given = {c.id: c for c in check_rollouts([data], tokenizer=critic_dir).checks}
        asked = [cid for cid, c in without.items() if c.status == "skipped" and re.match(r"(needs|pass) --tokenizer",
                                                                                      c.reason or "")]
        for cid in asked:
            assert given[cid].status != "skipped", (data.name, cid, given[cid].reason)
        if data.name == "good.jsonl":
            for cid in ("mask_boundaries", "turn_separators", "retokenization", "turn_boundary_tokens"):
                assert without[cid].reason == given[cid].reason and "token data" in without[cid].reason
        else:
            assert {"mask_boundaries", "turn_separators", "retokenization", "turn_boundary_tokens"} <= set(asked)
