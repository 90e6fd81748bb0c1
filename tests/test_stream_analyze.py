"""analyze streamed (verl dump folders, canonical tables, audit folders): the same summary and
per-trajectory statistics as the in-memory path, a folder that plot / monitor / analyze read again."""

import json

import numpy as np
import polars as pl
import pytest
from polars.testing import assert_frame_equal

from critic_audit.analysis.audit import AuditConfig
from critic_audit.analysis.monitor import MonitorConfig, monitor, turn_means
from critic_audit.analysis.stream import StepHistogram
from critic_audit.errors import ConfigError, SchemaError
from critic_audit.io.tables import load_audit_folder
from critic_audit.io.verl_dump import dump_verl_batch
from critic_audit.pipeline import analyze

RUN_ONLY = {"seconds", "streamed", "tokens_source"}


def _dump(folder, steps=3, rows=12, prompt=5, resp=60, seed=0, nan_row=None):
    """A verl run: ``steps`` batches with multi-turn response masks, values and per-token rewards."""
    rng = np.random.default_rng(seed)
    for step in range(steps):
        mask = np.zeros((rows, resp), dtype=bool)
        level = np.zeros((rows, resp))
        for i in range(rows):
            pos = int(rng.integers(0, 3))
            while pos < resp:
                n = int(rng.integers(3, 15))
                mask[i, pos:pos + n] = True
                level[i, pos:pos + n] = rng.normal()
                pos += n + int(rng.integers(1, 6))
        reward = rng.integers(0, 2, size=rows).astype(np.float64)
        values = (level + 0.3 * rng.normal(size=(rows, resp)) + reward[:, None]).astype(np.float32)
        if step == 0:
            values[1] = 0.5  # a flat critic row (excluded) and a one-turn row
            mask[2] = False
            mask[2, 4:9] = True
        if nan_row is not None and step == 1:
            values[nan_row, np.flatnonzero(mask[nan_row])[0]] = np.inf  # (NaN is written as null)
        tlr = np.zeros((rows, resp), dtype=np.float32)
        tlr[np.arange(rows), resp - 1] = reward
        dump_verl_batch({"prompts": rng.integers(0, 1000, size=(rows, prompt)),
                         "responses": rng.integers(0, 1000, size=(rows, resp)), "response_mask": mask,
                         "values": values, "token_level_rewards": tlr,
                         "uid": np.array([f"p{i // 4}" for i in range(rows)], dtype=object)},
                        folder, step=step * 10)
    return folder


def _both(tmp_path, inputs, cfg, **kw):
    s = analyze(inputs, tmp_path / "s", scoring=None, audit_config=cfg, plots=False, overwrite=True, **kw)
    m = analyze(inputs, tmp_path / "m", scoring=None, audit_config=cfg, plots=False, overwrite=True, stream=False)
    return s, m


def _same_summary(a, b, ignore=()):
    da, db = a.summary.to_dict(), b.summary.to_dict()
    for k in (*RUN_ONLY, *ignore):
        da.pop(k, None), db.pop(k, None)
    assert da == db


@pytest.mark.parametrize("scope", ["assistant", "all"])
def test_dump_folder_streamed_equals_in_memory(tmp_path, scope):
    run = _dump(tmp_path / "run", nan_row=3)
    cfg = AuditConfig(n_boot=200, scope=scope, group_by=("group_id",), min_group_n=3)
    s, m = _both(tmp_path, [run], cfg)
    assert s.tokens is None and m.tokens is not None and s.summary.to_dict()["streamed"]
    _same_summary(s, m)
    assert s.summary.to_dict()["excluded"] == m.summary.to_dict()["excluded"]
    assert set(m.summary.to_dict()["excluded"]) >= {"flat_critic", "non_finite_value"}
    assert len(m.summary.to_dict()["by_checkpoint"]) == 3
    cols = m.result.per_trajectory.columns
    assert_frame_equal(s.result.per_trajectory.select(cols), m.result.per_trajectory, check_exact=True)
    assert not (tmp_path / "s" / "tokens.parquet").exists()
    # what the streamed folder holds instead: turn means identical to the tokens' (monitor's reader)
    turns = pl.read_parquet(tmp_path / "s" / "turns.parquet")
    ref = turn_means(m.tokens)
    assert turns["trajectory_id"].to_list() == ref["trajectory_id"].to_list()
    assert turns["n_tokens"].to_list() == ref["n_tokens"].to_list()
    np.testing.assert_allclose(turns["mean_value"].to_numpy(), ref["mean_value"].to_numpy(), rtol=1e-12)


def test_canonical_folders_and_audit_folder_streamed(tmp_path):
    from conftest import SAMPLE

    cfg = AuditConfig(n_boot=100)
    rollouts = SAMPLE / "credit_ppo_run" / "rollouts"  # one step_N/ canonical folder per step
    s, m = _both(tmp_path, [rollouts], cfg)
    _same_summary(s, m)
    # an in-memory analyze folder (tokens.parquet) analysed again: streamed = in memory
    s2, m2 = _both(tmp_path / "again", [tmp_path / "m"], cfg)
    _same_summary(s2, m2)
    assert s2.summary.to_dict()["inference"]["values_from"]


def test_streamed_folder_plot_monitor_reanalyze(tmp_path):
    from critic_audit.report import rerender

    run = _dump(tmp_path / "run", steps=2, rows=16)
    cfg = AuditConfig(n_boot=150)
    s = analyze([run], tmp_path / "s", scoring=None, audit_config=cfg, plots=True)
    m = analyze([run], tmp_path / "m", scoring=None, audit_config=cfg, plots=True, stream=False)
    out = tmp_path / "s"
    for stem in ("value_traces", "value_grid", "step_distributions", "turn_position", "eta2_hist"):
        assert (out / "plots" / f"{stem}.png").exists()
    assert (out / "report.html").exists()
    # the traced trajectories' tokens are the in-memory tokens of those trajectories
    traces = pl.read_parquet(out / "traces.parquet")
    ids = traces["trajectory_id"].unique().to_list()
    assert ids
    ref = m.tokens.filter(pl.col("trajectory_id").is_in(ids) & pl.col("response_mask"))
    assert traces.sort("trajectory_id", "position")["value"].to_list() == \
        ref.sort("trajectory_id", "position")["value"].to_list()
    (out / "plots" / "eta2_hist.png").unlink()
    rerender(out)
    assert (out / "plots" / "eta2_hist.png").exists()
    # monitor on the streamed folder reads the turn means: the same result as on the tokens
    mcfg = MonitorConfig(n_boot=100)
    a = monitor(*load_audit_folder(out), mcfg)
    b = monitor(*load_audit_folder(tmp_path / "m"), mcfg)
    assert a.summary["counts"] == b.summary["counts"]
    assert a.summary["auroc"]["max_abs_z"]["estimate"] == pytest.approx(b.summary["auroc"]["max_abs_z"]["estimate"])
    # analyze on the streamed folder: from its statistics, identical to the first audit (and with a new seed,
    # identical to the in-memory path at that seed)
    again = analyze([out], tmp_path / "again", scoring=None, audit_config=cfg, plots=True)
    _same_summary(again, s, ignore=("inputs", "input", "inference"))
    assert again.summary.to_dict()["inference"]["values_from"] == [[str(run)]]
    cfg2 = AuditConfig(n_boot=150, seed=7, turn_level_eta2=0.5)
    _same_summary(analyze([out], tmp_path / "a2", scoring=None, audit_config=cfg2, plots=False),
                  analyze([run], tmp_path / "m2", scoring=None, audit_config=cfg2, plots=False, stream=False),
                  ignore=("inputs", "input", "inference"))
    # another scope: the folder's inputs are read again (the README's re-audit with --scope all)
    cfg3 = AuditConfig(n_boot=150, scope="all")
    _same_summary(analyze([out], tmp_path / "a3", scoring=None, audit_config=cfg3, plots=False),
                  analyze([run], tmp_path / "m3", scoring=None, audit_config=cfg3, plots=False, stream=False),
                  ignore=("inputs", "input"))
    import shutil

    shutil.rmtree(run)
    with pytest.raises(ConfigError, match="scope"):
        analyze([out], tmp_path / "a4", scoring=None, audit_config=cfg3, plots=False)


def test_keep_tokens_and_refusals(tmp_path):
    run = _dump(tmp_path / "run", steps=2)
    cfg = AuditConfig(n_boot=50)
    s = analyze([run], tmp_path / "s", scoring=None, audit_config=cfg, plots=False, keep_tokens=True)
    m = analyze([run], tmp_path / "m", scoring=None, audit_config=cfg, plots=False, stream=False)
    assert_frame_equal(pl.read_parquet(tmp_path / "s" / "tokens.parquet"), m.tokens)
    with pytest.raises(ConfigError, match="--limit"):
        analyze([run], tmp_path / "x", scoring=None, audit_config=cfg, plots=False, stream=True, limit=5)
    chat = tmp_path / "chat.jsonl"
    chat.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"},
                                             {"role": "assistant", "content": "yo"}]}) + "\n")
    with pytest.raises(ConfigError, match="--stream cannot read"):
        analyze([chat], tmp_path / "y", scoring=None, audit_config=cfg, plots=False, stream=True)


def test_stream_errors_name_file_and_record(tmp_path):
    run = _dump(tmp_path / "run", steps=2)
    tok = run / "step_00000010.tokens.parquet"
    t = pl.read_parquet(tok)
    first_policy = int(t.with_row_index().filter(pl.col("response_mask"))["index"][0])
    bad = t.with_columns(value=pl.when(pl.int_range(pl.len()) == first_policy).then(None).otherwise(pl.col("value")))
    bad.write_parquet(tok)
    with pytest.raises(SchemaError, match="no critic value") as e:
        analyze([run], tmp_path / "s", scoring=None, plots=False, stream=True)
    assert e.value.path.endswith("step_00000010.tokens.parquet") and str(first_policy) in str(e.value.record)
    # token rows of a trajectory its trajectories table lacks
    t.with_columns(trajectory_id=pl.lit("ghost")).head(3).write_parquet(tok)
    with pytest.raises(SchemaError, match="ghost"):
        analyze([run], tmp_path / "s", scoring=None, plots=False, stream=True)


def test_step_histogram_counts_and_quantile():
    rng = np.random.default_rng(1)
    x = np.abs(rng.standard_cauchy(5000))
    x[:7] = 0.0
    bnd = rng.random(x.size) < 0.3
    h = StepHistogram()
    h.add(x[:2000], bnd[:2000])
    h.add(x[2000:], bnd[2000:])
    assert h.n.tolist() == [int(bnd.sum()), int((~bnd).sum())]
    assert h.total[0] == pytest.approx(x[bnd].sum(), rel=1e-12)
    assert h.counts.sum() == x.size and h.counts[:, 0].sum() == 7
    q = h.quantile(0.99)
    assert np.quantile(x, 0.99) <= q <= np.quantile(x, 0.99) * 10 ** (1 / h.PER_DECADE) * 1.0001
    back = StepHistogram.from_dict(json.loads(json.dumps(h.as_dict())))
    assert (back.counts == h.counts).all() and (back.n == h.n).all()
    rep, cnt = h.points(1)
    assert cnt.sum() == (~bnd).sum() and rep[0] == 0.0


def test_ids_shared_by_two_inputs_are_read_in_memory(tmp_path):
    """Two dump folders of the same steps share their trajectory ids: the in-memory reader qualifies them
    with the folders' labels, so they are not streamed (auto) or refused (--stream)."""
    a, b = _dump(tmp_path / "a", steps=1), _dump(tmp_path / "b", steps=1, seed=5)
    cfg = AuditConfig(n_boot=50)
    res = analyze([a, b], tmp_path / "o", scoring=None, audit_config=cfg, plots=False)
    assert res.tokens is not None and res.result.per_trajectory["trajectory_id"].n_unique() == 24
    with pytest.raises(ConfigError, match="is in"):
        analyze([a, b], tmp_path / "p", scoring=None, audit_config=cfg, plots=False, stream=True)


@pytest.mark.parametrize("suffix", ["parquet", "one_row_group", "jsonl"])
def test_tokenized_rows_file_streamed_equals_in_memory(tmp_path, monkeypatch, suffix):
    """One file of tokenized rows with values (verl-style rows): streamed chunk by chunk (more rows than one
    chunk of the reader; one row group read in batches; JSONL in pieces of about 10 lines), the same
    summary, per-trajectory statistics and value traces as in memory."""
    import critic_audit.io.tokenized as T
    from critic_audit.pipeline.stream import TRACE_COLUMNS, trace_ids

    rng = np.random.default_rng(3)
    rows = []
    for i in range(300):
        n = int(rng.integers(20, 60))
        mask = np.zeros(n, dtype=np.int64)
        pos = int(rng.integers(2, 6))
        while pos < n:
            k = int(rng.integers(3, 10))
            mask[pos:pos + k] = 1
            pos += k + int(rng.integers(1, 5))
        reward = float(rng.integers(0, 2))
        vals = (rng.normal(size=n) + reward).astype(np.float32)
        rows.append({"trajectory_id": f"r{i}", "uid": f"p{i // 4}", "input_ids": rng.integers(0, 500, n).tolist(),
                     "response_mask": mask.tolist(), "values": [float(v) for v in vals], "reward": reward})
    path = tmp_path / f"rows.{'jsonl' if suffix == 'jsonl' else 'parquet'}"
    if suffix != "jsonl":
        pl.DataFrame(rows).write_parquet(path, row_group_size=64 if suffix == "parquet" else len(rows))
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        monkeypatch.setattr(T, "JSONL_PIECE_BYTES", 10 * len(path.read_bytes()) // len(rows))
    cfg = AuditConfig(n_boot=100)
    s, m = _both(tmp_path, [path], cfg)
    assert s.tokens is None and s.summary.to_dict()["streamed"] and m.tokens is not None
    _same_summary(s, m)
    cols = m.result.per_trajectory.columns
    assert_frame_equal(s.result.per_trajectory.select(cols), m.result.per_trajectory, check_exact=True)
    traces = pl.read_parquet(tmp_path / "s" / "traces.parquet")
    traced = pl.Series(trace_ids(m.result.per_trajectory)).implode()
    assert traces.height and traces["trajectory_id"].n_unique() >= 2
    assert_frame_equal(traces, m.tokens.filter(pl.col("trajectory_id").is_in(traced) & pl.col("response_mask"))
                       .select(list(TRACE_COLUMNS)))
    k = analyze([path], tmp_path / "k", scoring=None, audit_config=cfg, plots=False, keep_tokens=True)
    assert k.summary.to_dict()["streamed"]
    assert_frame_equal(pl.read_parquet(tmp_path / "k" / "tokens.parquet"), m.tokens)


def test_a_tokens_table_without_a_value_column_asks_for_a_critic(tmp_path):
    """``value`` is optional in docs/tables.md (the tokens are to be scored): without it and without
    --critic the error asks for a critic, as for chat input, streamed or not (was: 'missing column
    'value' ... write the tokens table with the canonical columns')."""
    from typer.testing import CliRunner

    from conftest import SAMPLE
    from critic_audit.cli import app

    step = SAMPLE / "credit_ppo_run" / "rollouts" / "step_000019"
    src = tmp_path / "novalue"
    src.mkdir()
    pl.read_parquet(step / "tokens.parquet").drop("value").write_parquet(src / "tokens.parquet")
    pl.read_parquet(step / "trajectories.parquet").write_parquet(src / "trajectories.parquet")
    for extra in ([], ["--stream"], ["--no-stream"]):
        res = CliRunner().invoke(app, ["analyze", str(src), "--out", str(tmp_path / "o"), "--no-plots", *extra])
        assert res.exit_code == 1, res.output
        flat = " ".join(res.output.split())
        assert "no critic values to audit" in flat and "fix: pass --critic CHECKPOINT_DIR" in flat, flat
        assert "canonical columns" not in flat and "Traceback" not in flat


def test_a_streamed_analyze_imports_neither_pandas_nor_torch(tmp_path):
    # Fixed costs of a streamed audit: no critic, so no torch / transformers; pyarrow's read_table
    # (pyarrow.dataset), to_numpy and pa.array would import pandas (~0.5 s), polars' conversion of a
    # dictionary array pyarrow.compute: the stream avoids them.
    import os
    import subprocess
    import sys

    run = _dump(tmp_path / "run")
    code = ("import sys\nfrom critic_audit.cli import main\ntry:\n    main()\nexcept SystemExit as e:\n"
            "    assert not e.code, e.code\n"
            "heavy = ('pandas', 'torch', 'transformers', 'pyarrow.dataset', 'pyarrow.compute')\n"
            "print('IMPORTED', sorted(m for m in heavy if m in sys.modules))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    out = subprocess.run([sys.executable, "-c", code, "analyze", str(run), "--out", str(tmp_path / "a")],
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "IMPORTED []"
    assert (tmp_path / "a" / "plots" / "value_traces.png").exists()


def test_analyze_of_tokenized_rows_without_plots_imports_no_plotting_pandas_or_torch(tmp_path):
    """A tokenized-rows file with values (Parquet with nulls off the mask, left padding, one row group;
    JSONL), audited without plots: neither matplotlib (the traced trajectories are picked by
    analysis.examples) nor pandas (the reader converts pyarrow arrays from their buffers: pyarrow's
    to_numpy imports it, as does pyarrow.compute.fill_null) nor torch / transformers is imported. The
    JSONL holds a string column with a value spelled like a number ("7"), which the reader checks was a
    JSON string (was: that check imported pandas, ~0.3 s)."""
    import os
    import subprocess
    import sys

    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"trajectory_id": f"r{i}", "uid": f"g{i // 2}", "input_ids": [0, 5, 6, 7, 8, 9],
             "attention_mask": [0, 1, 1, 1, 1, 1], "response_mask": [0, 0, 1, 1, 0, 1],
             "values": [None, None, 0.5 * i, 0.25, None, 1.0 - i], "reward": float(i % 2)} for i in range(6)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "rows.parquet")
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps({k: v for k, v in r.items() if k != "values"}
                                                            | {"values": [x or 0.0 for x in r["values"]],
                                                               "note": "7" if r["trajectory_id"] == "r3" else "x"})
                                                 + "\n" for r in rows))
    code = ("import sys\nfrom critic_audit.pipeline import analyze\n"
            f"for f in ('rows.parquet', 'rows.jsonl'):\n"
            f"    r = analyze([{str(tmp_path)!r} + '/' + f], {str(tmp_path)!r} + '/out_' + f, scoring=None, plots=False)\n"
            "    assert r.result.per_trajectory.height == 6 and r.summary.to_dict()['streamed']\n"
            "print('IMPORTED', sorted(m for m in ('pandas', 'matplotlib', 'torch', 'transformers') if m in sys.modules))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "IMPORTED []"
    assert pl.read_parquet(tmp_path / "out_rows.parquet" / "traces.parquet").height


def test_keep_tokens_of_tokenized_rows_read_leniently_leaves_the_skipped_row_out(tmp_path, monkeypatch):
    """--lenient --keep-tokens on tokenized rows holding a non-finite value: the row is skipped and
    counted once, and tokens.parquet holds the other rows (the copy was converted strictly: it raised
    on the row the audit had skipped). The rows are converted once: tokens.parquet is written as the
    audit converts them (was: converted a second time for the copy)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    import critic_audit.io.tokenized as T
    from critic_audit.io.records import ReadOptions

    calls, chunks = [], T.iter_table_chunks

    def counted(spec, *a, **k):
        calls.append(spec.path)
        return chunks(spec, *a, **k)

    monkeypatch.setattr(T, "iter_table_chunks", counted)

    rows = [{"trajectory_id": f"r{i}", "uid": f"g{i // 2}", "input_ids": [1, 2, 3, 4], "response_mask": [0, 1, 1, 1],
             "values": [0.0, 0.1 * i, float("nan") if i == 2 else 0.2, 0.3], "reward": float(i % 2)} for i in range(6)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "rows.parquet")
    res = analyze([tmp_path / "rows.parquet"], tmp_path / "o", scoring=None, plots=False, keep_tokens=True,
                  read_options=ReadOptions(lenient=True), audit_config=AuditConfig(n_boot=50))
    s = res.summary.to_dict()
    assert s["streamed"] and s["input"]["skipped"] == {"bad_values": 1} and res.result.per_trajectory.height == 5
    tokens = pl.read_parquet(tmp_path / "o" / "tokens.parquet")
    assert tokens["trajectory_id"].unique(maintain_order=True).to_list() == ["r0", "r1", "r3", "r4", "r5"]
    assert tokens.height == 5 * 4
    assert tokens.filter(pl.col("trajectory_id") == "r3")["value"].to_list() == pytest.approx([0.0, 0.3, 0.2, 0.3])
    assert calls == [tmp_path / "rows.parquet"]  # converted once, for the audit and the copy together


def test_read_ahead_keeps_the_order_and_raises_where_the_item_was():
    from critic_audit.errors import InputError
    from critic_audit.pipeline.stream import read_ahead

    assert list(read_ahead(iter(range(7)))) == list(range(7))
    assert list(read_ahead(iter([]))) == []

    def files():
        yield "a"
        yield "b"
        raise InputError("cannot read Parquet (bad page)", path="c.parquet", fix="re-write the tokens table")

    it = read_ahead(files())
    assert [next(it), next(it)] == ["a", "b"]
    with pytest.raises(InputError, match="c.parquet"):
        next(it)


def test_readme_names_the_files_a_streamed_audit_writes(tmp_path):
    """README: a streamed audit (values shipped, like audit_trained/) holds turns.parquet and traces.parquet,
    no per-token Parquet unless --keep-tokens; an audit scored in memory holds tokens.parquet."""
    from pathlib import Path

    run = _dump(tmp_path / "run", steps=1)
    analyze([run], tmp_path / "s", scoring=None, audit_config=AuditConfig(n_boot=200), plots=False)
    names = {p.name for p in (tmp_path / "s").glob("*.parquet")}
    assert names == {"trajectories.parquet", "turns.parquet", "traces.parquet"}
    readme = " ".join((Path(__file__).parents[1] / "README.md").read_text().split())
    assert "while `audit_trained/` (values shipped, so the audit is streamed) holds `turns.parquet` and " \
           "`traces.parquet` instead (per-token Parquet only with `--keep-tokens`)" in readme
    assert "per-trajectory and per-token Parquet" not in readme


@pytest.mark.parametrize("stream", [None, False])
def test_reanalysis_of_a_limit_audit_keeps_its_sample_record(tmp_path, stream):
    """analyze AUDIT_FOLDER of a --limit audit used to drop the sampling record (limit null, "6 / 6 read"
    where the audit said "a sample of 6 of 160"): the earlier summary's limit is carried, streamed or in memory."""
    run = _dump(tmp_path / "run", steps=2, rows=16)
    cfg = AuditConfig(n_boot=200)
    first = analyze([run], tmp_path / "a", scoring=None, audit_config=cfg, plots=False, limit=6)
    assert first.summary.sample_text == "a sample of 6 of 32 trajectories read (--limit, stratified by source, seed 0)"
    again = analyze([tmp_path / "a"], tmp_path / "b", scoring=None, audit_config=cfg, plots=False, stream=stream)
    assert again.summary.n_trajectories == 6
    assert again.summary.run.limit == first.summary.run.limit
    assert again.summary.sample_text == first.summary.sample_text
    written = json.loads((tmp_path / "b" / "summary.json").read_text())["limit"]
    assert written["trajectories_read"] == 32 and written["trajectories_kept"] == 6 and written["limit"] == 6
    # an audit without --limit carries none
    analyze([run], tmp_path / "c", scoring=None, audit_config=cfg, plots=False)
    assert analyze([tmp_path / "c"], tmp_path / "d", scoring=None, audit_config=cfg, plots=False,
                   stream=stream).summary.run.limit is None
