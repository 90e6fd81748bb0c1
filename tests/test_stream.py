"""Streaming decomposition from Parquet: identical to the in-memory path at any batch size."""

import math

import numpy as np
import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from polars.testing import assert_frame_equal

from critic_audit.analysis.audit import _select
from critic_audit.analysis.decompose import decompose
from critic_audit.analysis.stream import decompose_parquet
from critic_audit.errors import ConfigError, SchemaError

SCHEMA = {"trajectory_id": pl.String, "position": pl.Int32, "turn": pl.Int32,
          "response_mask": pl.Boolean, "value": pl.Float32}


def _table(trajs) -> pl.DataFrame:
    """Tokens table from a list of trajectories, each a list of (response_mask, value or None) rows.

    ``turn`` is the index of the maximal run of policy rows (docs/tables.md); ids sort like their index.
    """
    cols = {c: [] for c in SCHEMA}
    for b, rows in enumerate(trajs):
        k, prev = -1, False
        for p, (m, v) in enumerate(rows):
            if m and not prev:
                k += 1
            prev = m
            cols["trajectory_id"].append(f"t{b:03d}")
            cols["position"].append(3 * p)
            cols["turn"].append(k if m else None)
            cols["response_mask"].append(m)
            cols["value"].append(v if (v is not None or not m) else 0.0)
    return pl.DataFrame(cols, schema=SCHEMA)


def _in_memory(tokens: pl.DataFrame, scope: str) -> pl.DataFrame:
    """The audit's path: select, index trajectories, decompose the whole table at once."""
    sel = _select(tokens, scope)
    ids = tokens["trajectory_id"].unique(maintain_order=True)
    index = pl.DataFrame({"trajectory_id": ids, "_b": np.arange(len(ids), dtype=np.int64)})
    sel = sel.join(index, on="trajectory_id", how="left", maintain_order="left")
    stats = decompose(sel["_b"].to_numpy(), sel["seg"].to_numpy(), sel["value"].cast(pl.Float64).to_numpy(),
                      num_trajectories=len(ids))
    return stats.insert_column(0, ids)


value_st = st.one_of(st.floats(-50, 50, allow_nan=False, width=32), st.none(),
                     st.sampled_from([1.0, 1.0, 2.5, 1e6 + 0.25, math.nan]))
row_st = st.tuples(st.booleans(), value_st)
traj_st = st.lists(row_st, min_size=1, max_size=25)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(traj_st, min_size=1, max_size=8), st.integers(1, 40), st.integers(1, 60),
       st.sampled_from(["assistant", "all"]))
def test_stream_equals_in_memory(tmp_path, trajs, batch_rows, row_group, scope):
    # batch_rows from 1 puts batch edges inside trajectories and inside turns; row groups add edges.
    tokens = _table(trajs)
    path = tmp_path / f"tok_{batch_rows}_{row_group}.parquet"
    tokens.write_parquet(path, row_group_size=row_group)
    got = decompose_parquet(path, scope=scope, batch_rows=batch_rows)
    assert_frame_equal(got, _in_memory(tokens, scope), check_exact=True)


def test_stream_across_files_and_folder(tmp_path):
    rng = np.random.default_rng(0)
    trajs = [[(bool(rng.random() < 0.6), float(rng.normal())) for _ in range(int(rng.integers(1, 60)))]
             for _ in range(40)]
    tokens = _table(trajs)
    # split inside a trajectory: the last trajectory of part 1 continues in part 2
    a, b = tokens.slice(0, 700), tokens.slice(700)
    folder = tmp_path / "parts"
    folder.mkdir()
    a.write_parquet(folder / "part-0.parquet")
    b.write_parquet(folder / "part-1.parquet")
    for scope in ("assistant", "all"):
        ref = _in_memory(tokens, scope)
        assert_frame_equal(decompose_parquet(folder, scope=scope, batch_rows=64), ref, check_exact=True)
        files = [folder / "part-0.parquet", folder / "part-1.parquet"]
        assert_frame_equal(decompose_parquet(files, scope=scope, batch_rows=5), ref, check_exact=True)
    # in the wrong order, the last trajectory of part 0 is split around the others
    with pytest.raises(SchemaError, match="not contiguous|positions"):
        decompose_parquet([folder / "part-1.parquet", folder / "part-0.parquet"])


def test_golden_through_stream(tmp_path):
    # turns [1,2,3] and [5,7] with tool tokens between: SS_B = 19.2, SS_W = 4 (test_decompose golden)
    rows = [(False, None), (True, 1.0), (True, 2.0), (True, 3.0), (False, 9.0), (True, 5.0), (True, 7.0)]
    tokens = _table([rows])
    tokens.write_parquet(tmp_path / "t.parquet")
    row = decompose_parquet(tmp_path / "t.parquet", batch_rows=2).row(0, named=True)
    assert row["trajectory_id"] == "t000" and row["n_turns"] == 2 and row["n_tokens"] == 5
    assert row["ss_between"] == pytest.approx(19.2) and row["ss_within"] == pytest.approx(4.0)
    all_row = decompose_parquet(tmp_path / "t.parquet", scope="all", batch_rows=3).row(0, named=True)
    assert all_row["n_turns"] == 3 and all_row["n_tokens"] == 6  # the tool token is its own group


def test_unsorted_trajectories_raise(tmp_path):
    tokens = _table([[(True, 1.0), (True, 2.0)], [(True, 3.0), (False, 1.0), (True, 4.0)]])
    # a trajectory reappears after another one started (within one batch and across batch edges)
    shuffled = pl.concat([tokens.slice(0, 1), tokens.slice(2, 2), tokens.slice(1, 1), tokens.slice(4)])
    shuffled.write_parquet(tmp_path / "u.parquet")
    for batch_rows in (1, 2, 100):
        with pytest.raises(SchemaError, match=r"rows of trajectory 't000' are not contiguous"):
            decompose_parquet(tmp_path / "u.parquet", batch_rows=batch_rows)
    # ids in decreasing order: each trajectory contiguous, so accepted (table order kept)
    desc = tokens.sort("trajectory_id", descending=True, maintain_order=True)
    desc.write_parquet(tmp_path / "d.parquet")
    for batch_rows in (1, 2, 100):
        got = decompose_parquet(tmp_path / "d.parquet", batch_rows=batch_rows)
        assert got["trajectory_id"].to_list() == ["t001", "t000"]
        assert_frame_equal(got, _in_memory(desc, "assistant"), check_exact=True)
    # positions out of order inside a trajectory, and a duplicate key
    tokens.with_columns(position=pl.Series([3, 0, 0, 3, 6], dtype=pl.Int32)).write_parquet(tmp_path / "p.parquet")
    with pytest.raises(SchemaError, match="positions"):
        decompose_parquet(tmp_path / "p.parquet", batch_rows=1)
    tokens.with_columns(position=pl.Series([0, 3, 0, 3, 3], dtype=pl.Int32)).write_parquet(tmp_path / "q.parquet")
    with pytest.raises(SchemaError, match="positions"):
        decompose_parquet(tmp_path / "q.parquet", batch_rows=100)


def test_stream_input_errors(tmp_path):
    tokens = _table([[(True, 1.0), (True, 2.0)]])
    tokens.with_columns(value=pl.lit(None, pl.Float32)).write_parquet(tmp_path / "nv.parquet")
    with pytest.raises(SchemaError, match="no critic value"):
        decompose_parquet(tmp_path / "nv.parquet")
    tokens.drop("turn").write_parquet(tmp_path / "nt.parquet")
    with pytest.raises(SchemaError, match="missing column 'turn'"):
        decompose_parquet(tmp_path / "nt.parquet")
    assert decompose_parquet(tmp_path / "nt.parquet", scope="all").height == 1  # turn not needed
    with pytest.raises(ConfigError):
        decompose_parquet(tmp_path / "nt.parquet", scope="tokens")
    with pytest.raises(ConfigError):
        decompose_parquet(tmp_path / "nt.parquet", batch_rows=0)


def test_empty_table(tmp_path):
    _table([]).write_parquet(tmp_path / "e.parquet")
    out = decompose_parquet(tmp_path / "e.parquet")
    assert out.height == 0 and out.columns[0] == "trajectory_id" and "eta2" in out.columns


def test_stream_reads_the_tools_own_tokens_in_input_order(tmp_path):
    """The tool writes trajectories in input order ('step20-9' before 'step20-10', not lexicographic):
    the streaming path reads its own tokens.parquet, identical to the in-memory decomposition."""
    from conftest import SAMPLE

    from critic_audit.io.inputs import read_tables

    _, tokens, _ = read_tables(SAMPLE / "credit_ppo_run" / "rollouts" / "step_000019")
    ids = tokens["trajectory_id"].unique(maintain_order=True).to_list()
    assert ids.index("step20-9") < ids.index("step20-10")  # not sorted by id
    tokens.write_parquet(tmp_path / "tokens.parquet")
    ref = _in_memory(tokens, "assistant")
    for batch_rows in (7, 1 << 20):
        got = decompose_parquet(tmp_path / "tokens.parquet", batch_rows=batch_rows)
        assert got["trajectory_id"].to_list() == ids
        assert_frame_equal(got, ref, check_exact=True)


def test_step_bins_looked_up_equal_the_log10_formula():
    """StepHistogram.add_consecutive looks a step's bin up in a table of mantissa cells; every bin equals
    the formula floor((log10(d) - LO) * PER_DECADE) (clipped; 0 for d = 0) evaluated step by step, for
    steps of every size, on and next to the bin edges, zeros, subnormals and values off the table."""
    from critic_audit.analysis.stream import StepHistogram

    rng = np.random.default_rng(3)
    edges = 10.0 ** (StepHistogram.LO + np.arange(2401) / StepHistogram.PER_DECADE)
    near = np.concatenate([np.nextafter(edges, 0), edges, np.nextafter(edges, np.inf),
                           edges * (1 - 1e-13), edges * (1 + 1e-13)])
    d = np.concatenate([np.abs(rng.normal(size=20000)), np.abs(rng.standard_cauchy(20000)) * 10.0 ** rng.integers(-16, 16, 20000),
                        near, [0.0, 5e-324, 1e-310, 1e-20, 1e20, 1e300]])
    v = np.zeros(2 * d.size)
    v[1::2] = d  # steps: d[0], d[0], d[1], d[1], ...
    h = StepHistogram()
    h.add_consecutive(np.zeros(v.size, np.int64), np.zeros(v.size, np.int64), v, np.ones(1, bool))
    want = np.zeros_like(h.counts)
    for x in np.abs(np.diff(v)).tolist():
        k = 0 if x == 0 else min(max(math.floor((math.log10(x) - h.LO) * h.PER_DECADE), -1), h.EDGES.size - 3) + 2
        want[1, k] += 1
    assert (h.counts == want).all() and h.n.tolist() == [0, v.size - 1]


def _formula_counts(h, v: np.ndarray) -> np.ndarray:
    """The within-turn counts of the steps of ``v`` binned by the formula itself, step by step."""
    want = np.zeros_like(h.counts)
    for x in np.abs(np.diff(v)).tolist():
        k = 0 if x == 0 else min(max(math.floor((math.log10(x) - h.LO) * h.PER_DECADE), -1), h.EDGES.size - 3) + 2
        want[1, k] += 1
    return want


def test_step_bins_of_two_layouts_in_one_process_each_equal_the_formula():
    """The looked-up bin table belongs to one bin layout: a histogram with other settings (other LO,
    PER_DECADE, number of bins) used after the default one, and the default one again after it, each
    get the formula's bins (a table kept from the first call would give the second one wrong bins)."""
    from critic_audit.analysis.stream import StepHistogram

    class Coarse(StepHistogram):
        LO, HI, PER_DECADE = -6, 6, 7
        EDGES = np.concatenate([[0.0], 10.0 ** (LO + np.arange((HI - LO) * PER_DECADE + 1) / PER_DECADE), [np.inf]])

    rng = np.random.default_rng(5)
    d = np.concatenate([np.abs(rng.standard_cauchy(5000)) * 10.0 ** rng.integers(-9, 9, 5000), [0.0, 1e-7, 1e7]])
    v = np.zeros(2 * d.size)
    v[1::2] = d
    z = np.zeros(v.size, np.int64)
    for cls in (StepHistogram, Coarse, StepHistogram, Coarse):
        h = cls()
        h.add_consecutive(z, z, v, np.ones(1, bool))
        assert h.counts.shape[1] == cls.EDGES.size
        assert (h.counts == _formula_counts(h, v)).all() and h.n.tolist() == [0, v.size - 1]


def test_runs_of_dictionary_chunks_cross_chunks_and_dictionaries():
    """The ids of a whole file come as one dictionary chunk per row group, each with its own
    dictionary: a run that crosses chunks, or whose string has another index in the next chunk, is one
    run; the same string after another one is a new run."""
    import pyarrow as pa

    from critic_audit.analysis.stream import _runs

    a = pa.array(["t1", "t1", "t2", "t2"]).dictionary_encode()
    b = pa.DictionaryArray.from_arrays(pa.array([1, 1, 0, 2], pa.int32()), pa.array(["t3", "t2", "t1"]))
    c = pa.array(["t1", "t4"]).dictionary_encode()
    starts, names = _runs(pa.chunked_array([a, pa.array([], a.type), b, c]))
    assert starts.tolist() == [0, 2, 6, 7, 9] and names.to_list() == ["t1", "t2", "t3", "t1", "t4"]
    flat = pa.array(["t1", "t1", "t2", "t2", "t2", "t2", "t3", "t1", "t1", "t4"])
    s2, n2 = _runs(flat)
    assert s2.tolist() == starts.tolist() and n2.to_list() == names.to_list()
