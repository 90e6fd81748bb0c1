"""Every common layout of tokenized rows takes the column-wise path (issue 33 part 2): scalar or
per-token rewards, float32 / float64, int32 / int64 ids, left padding, list / large_list, nulls off
the mask, one row group or several; a per-token reward list is summed into the outcome (analyze and
check's group checks, issue 36 item 8); a bad entry is still named by row and field (strict) or
skipped and counted (lenient), found by masks over the whole column."""

from __future__ import annotations

import warnings

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from critic_audit.check import check_rollouts
from critic_audit.check.columns import Columns
from critic_audit.errors import InputError
from critic_audit.io.inputs import read_tables
from critic_audit.io.records import ReadOptions, ReadReport
from critic_audit.io.tokenized import iter_tokenized, read_tokenized

MASK = [0, 0, 1, 1, 0, 1, 1, 1]  # prompt 0-1, turn 0 = 2-3, tool 4, turn 1 = 5-7


def _table(layout: str, n: int = 8) -> pa.Table:
    """n rows of 8 tokens (groups of 4 by uid) in ``layout``."""
    rng = np.random.default_rng(0)
    t = len(MASK)
    ids = rng.integers(0, 1000, size=(n, t))
    mask = np.tile(MASK, (n, 1))
    values = rng.normal(size=(n, t))
    lp = -rng.random(size=(n, t))
    reward = (np.arange(n) % 2).astype(float)
    rewards = np.zeros((n, t))
    rewards[:, -1] = reward
    ft = pa.float64() if layout == "float64" else pa.float32()
    it = pa.int32() if layout == "int32_leftpad" else pa.int64()
    large = layout == "large_list"
    off = mask == 0
    lst = (lambda a, typ, nulls=None: pa.array([list(r) for r in a], pa.large_list(typ) if large else pa.list_(typ))
           if nulls is None else pa.array([[None if z else x for x, z in zip(r, q)] for r, q in zip(a, nulls)],
                                          pa.large_list(typ) if large else pa.list_(typ)))
    cols = {"trajectory_id": [f"r{i}" for i in range(n)], "uid": [f"g{i // 4}" for i in range(n)]}
    if layout != "token_reward":
        cols["reward"] = pa.array(reward)
    cols["input_ids"] = lst(ids, it)
    cols["response_mask"] = lst(mask, it)
    if layout == "int32_leftpad":  # the first row's prompt is padded on the left
        att = np.ones((n, t), dtype=int)
        att[0, :2] = 0
        cols["attention_mask"] = lst(att, it)
    nulls = off if layout == "nulls_off_mask" else None
    cols["values"] = lst(values, ft, nulls)
    cols["old_log_probs"] = lst(lp, ft, nulls)
    cols["rollout_log_probs"] = lst(lp, ft, nulls)
    if layout in ("token_reward", "both_rewards"):
        cols["token_level_rewards"] = lst(rewards, ft)
    return pa.table(cols)


LAYOUTS = ("scalar_reward", "token_reward", "both_rewards", "float64", "int32_leftpad", "large_list",
           "nulls_off_mask", "one_row_group", "jsonl", "step_rows")  # benchmarks/bench_layouts.py's matrix


def _layout_file(tmp_path, layout: str):
    """The layout's file: 8 rows in Parquet (4 a row group, or one group), JSON lines, or step rows."""
    if layout == "jsonl":
        import json

        p = tmp_path / "rows.jsonl"
        p.write_text("".join(json.dumps(r) + "\n" for r in _table("scalar_reward").to_pylist()))
        return p
    p = tmp_path / "rows.parquet"
    if layout == "step_rows":
        pq.write_table(_step_table(), p, row_group_size=3)  # a rollout's steps span two row groups
    else:
        pq.write_table(_table(layout), p, row_group_size=8 if layout == "one_row_group" else 4)
    return p


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_common_layout_is_read_column_wise(tmp_path, monkeypatch, layout):
    """Each layout's rows are all read by the column-wise path, by check and by analyze's table reader:
    ``ReadReport.rows_read`` counts them, and the row-by-row converter of dict rows is never called
    (monkeypatched to fail); check and analyze see the same trajectories and rewards."""
    import critic_audit.io.tokenized as tokenized

    def row_by_row(*a, **k):
        raise AssertionError("a row went to the row-by-row path")

    monkeypatch.setattr(tokenized, "_sequence_row", row_by_row)
    p = _layout_file(tmp_path, layout)
    n = 4 if layout == "step_rows" else 8
    want = [0.0, 0.25, 0.5, 0.75] if layout == "step_rows" else [0.0, 1.0] * 4
    rep = ReadReport()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no numpy warning reaches the user (float32 against 1e100, NaN sums)
        seqs = list(iter_tokenized(p, report=rep))
    assert rep.rows_read == {"columnar": n}
    assert [s.reward for s in seqs] == want
    report = check_rollouts([p])
    assert report.input["rows_read"] == {"columnar": n} and report.n_trajectories == n
    rep = ReadReport()
    trajs, _ = read_tokenized(p, report=rep)
    assert rep.rows_read == {"columnar": n} and trajs.height == n
    assert trajs["reward"].to_list() == want


def test_per_token_rewards_are_summed_into_the_outcome(tmp_path):
    """Rows whose only reward is verl's token_level_rewards: the outcome is their sum (a null is 0),
    for analyze's tables and for check, whose group checks then run; hand-computed."""
    rows = [
        {"trajectory_id": "a", "uid": "g", "input_ids": [1, 2, 3, 4], "response_mask": [0, 1, 1, 1],
         "token_level_rewards": [0.0, 0.25, None, 0.5]},  # 0.25 + 0.5
        {"trajectory_id": "b", "uid": "g", "input_ids": [1, 2, 3, 4], "response_mask": [0, 1, 1, 1],
         "token_level_rewards": [0.0, 0.0, 0.0, 2.0]},
        {"trajectory_id": "c", "uid": "h", "input_ids": [1, 2, 3, 4], "response_mask": [0, 1, 1, 1],
         "token_level_rewards": [0.0, -1.0, 0.0, 1.0]},  # 0
        {"trajectory_id": "d", "uid": "h", "input_ids": [1, 2, 3, 4], "response_mask": [0, 1, 1, 1],
         "token_level_rewards": [0.0, 0.0, 0.0, 0.0]},
    ]
    p = tmp_path / "rows.parquet"
    pq.write_table(pa.Table.from_pylist(rows), p)
    jl = tmp_path / "rows.jsonl"
    jl.write_text("".join(__import__("json").dumps(r) + "\n" for r in rows))
    for path in (p, jl):  # column-wise (Parquet) and row by row (JSONL): the same sums
        trajs, _ = read_tokenized(path)  # analyze requires a reward: no "missing reward"
        assert trajs["reward"].to_list() == [0.75, 2.0, 0.0, 0.0]
        assert trajs["success"].to_list() == [True, True, False, False]
        assert '"reward_summed_from": "token_level_rewards"' in trajs["metadata"][0]
    report = check_rollouts([p])
    equal = next(c for c in report.checks if c.id == "groups_all_equal")
    assert equal.status != "skipped", equal.reason
    assert equal.counts["groups_checked"] == 2 and equal.counts["groups_all_equal"] == 1  # h: 0 and 0
    turns = next(c for c in report.checks if c.id == "turns_per_group")
    assert turns.status != "skipped", turns.reason
    # a scalar reward wins over the sum; --reward-key names another field
    rows2 = [{**r, "reward": 5.0} for r in rows]
    pq.write_table(pa.Table.from_pylist(rows2), p)
    assert read_tokenized(p)[0]["reward"].to_list() == [5.0] * 4


def test_a_nonfinite_per_token_reward_is_named_or_skipped(tmp_path):
    rows = [{"trajectory_id": x, "input_ids": [1, 2], "response_mask": [0, 1], "token_level_rewards": [0.0, v]}
            for x, v in (("a", 1.0), ("b", float("nan")), ("c", 0.0))]
    p = tmp_path / "rows.parquet"
    pq.write_table(pa.Table.from_pylist(rows), p)
    with pytest.raises(InputError, match=r"record 1 .*token_level_rewards"):
        read_tokenized(p)
    rep = ReadReport()
    trajs, _ = read_tokenized(p, ReadOptions(lenient=True), rep)
    assert trajs["trajectory_id"].to_list() == ["a", "c"] and sum(rep.skipped.values()) == 1


@pytest.mark.parametrize("field, bad, message", [
    ("input_ids", -5, r"input_ids\[3\] = -5 is not a token id"),
    ("response_mask", 2, r"response_mask\[3\] = 2 is not 0/1"),
    ("values", float("inf"), r"values\[3\] = inf is not a finite number"),
    ("input_ids", None, r"input_ids\[3\] = None is not a token id"),
])
def test_a_bad_entry_names_its_row_and_field(tmp_path, field, bad, message):
    """Row 5 of 8 holds one bad entry: strict names record 5 and the field's entry; lenient skips it
    alone and reads the 7 others column-wise."""
    table = _table("scalar_reward")
    col = table.column(field).to_pylist()
    col[5][3] = bad
    table = table.set_column(table.column_names.index(field), field, pa.array(col, table.schema.field(field).type))
    p = tmp_path / "rows.parquet"
    pq.write_table(table, p, row_group_size=4)
    with pytest.raises(InputError, match=r"rows.parquet: record 5 \(id 'r5'\).*" + message):
        read_tokenized(p)
    with pytest.raises(InputError, match=r"record 5 \(id 'r5'\).*" + message):
        check_rollouts([p])
    rep = ReadReport()
    trajs, _ = read_tokenized(p, ReadOptions(lenient=True), rep)
    assert trajs.height == 7 and "r5" not in trajs["trajectory_id"].to_list()
    assert sum(rep.skipped.values()) == 1 and rep.rows_read == {"columnar": 7, "row_by_row": 1}


def test_segment_sums_equal_a_loop(tmp_path):
    """Columns.row_sum / turn_sum (np.add.reduceat over the segment bounds) against a loop, empty rows
    and rows that end on a policy token included."""
    rng = np.random.default_rng(1)
    for _ in range(200):
        b = int(rng.integers(1, 6))
        lens = rng.integers(0, 8, size=b)
        offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
        n = int(offsets[-1])
        mask = rng.random(n) < 0.6
        x = rng.normal(size=n).astype(np.float32 if rng.random() < 0.5 else np.float64)
        cols = Columns._build(offsets, mask, np.ones(b, bool), {}, {}, {}, [str(i) for i in range(b)])
        where = rng.random(n) < 0.5
        for w in (None, where):
            xx = x.astype(np.float64) if w is None else np.where(w, x.astype(np.float64), 0.0)
            want_rows = [float(xx[offsets[i]:offsets[i + 1]].sum()) for i in range(b)]
            want_turns = [float(xx[a:z].sum()) for a, z in zip(cols.turn_start, cols.turn_stop)]
            np.testing.assert_allclose(cols.row_sum(x, w), want_rows, atol=1e-9)
            np.testing.assert_allclose(cols.turn_sum(x, w), want_turns, atol=1e-9)


def test_order_quantile_and_median_equal_numpy():
    """check's quantile / median of a whole column (a sampled bracket, a partition of the entries
    inside it) give np.quantile's / np.median's number exactly: normal, heavy-tailed, sorted, periodic
    and tied data, float32 and float64, odd and even lengths, a NaN (numpy's answer), short arrays
    (numpy itself); on a long plain column the bracket is taken (not the fallback)."""
    from critic_audit.check import kit

    rng = np.random.default_rng(0)
    for it in range(120):
        n = int(rng.choice([1, 2, 5, 1000, 140_000, 140_001, 300_000]))
        kind = it % 5
        x = (rng.normal(size=n) if kind == 0 else rng.integers(0, 5, size=n).astype(float) if kind == 1
             else np.sort(rng.random(n)) if kind == 2 else np.abs(rng.standard_cauchy(n)) if kind == 3
             else np.tile(rng.random(7), n // 7 + 1)[:n]).astype(np.float32 if it % 2 else np.float64)
        if rng.random() < 0.1:
            x[rng.integers(0, n)] = np.nan
        for q in (0.0, 0.5, 0.99, 0.999, float(rng.random())):
            np.testing.assert_equal(kit.order_quantile(x, q), float(np.quantile(x, q)))
        np.testing.assert_equal(kit.order_median(x), float(np.median(x)))
    x = rng.normal(size=300_000)
    assert kit._order_stats(x, (149_999, 150_000)) is not None and kit._order_stats(x, (296_999, 297_000)) is not None


def test_row_sums_of_per_token_rewards_equal_a_loop():
    """The outcome summed from per-token rewards (the column-wise reader's ``_row_sums``: only entries
    other than 0 gathered) equals a loop adding every entry in order, bit for bit: nulls (NaN without
    a code) as 0, coded entries as NaN / +inf / -inf, -0.0 entries, empty rows."""
    import math

    from critic_audit.io.tokenized import _row_sums

    rng = np.random.default_rng(3)
    for _ in range(500):
        lens = rng.integers(0, 7, size=int(rng.integers(0, 6)))
        offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
        n = int(offsets[-1])
        x = np.where(rng.random(n) < 0.5, 0.0, rng.normal(size=n) * 10.0 ** rng.integers(-8, 8, size=n))
        x = x.astype(np.float32 if rng.random() < 0.5 else np.float64)
        x[rng.random(n) < 0.1], x[rng.random(n) < 0.05] = np.nan, -0.0
        codes = np.where(np.isnan(x) & (rng.random(n) < 0.5), rng.integers(1, 4, size=n), 0).astype(np.int8)
        want = []
        for a, b in zip(offsets[:-1], offsets[1:]):
            total = 0.0
            for v, c in zip(x[a:b].tolist(), codes[a:b].tolist()):
                total += (math.nan, math.inf, -math.inf)[c - 1] if c else (0.0 if math.isnan(v) else v)
            want.append(total)
        got = _row_sums(x, codes if codes.any() else None, offsets)
        assert got.dtype == np.float64
        np.testing.assert_array_equal(got, np.asarray(want, dtype=np.float64))


def _same_sequences(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert (x.trajectory_id, x.reward, x.success, x.group_id, x.checkpoint) == \
            (y.trajectory_id, y.reward, y.success, y.group_id, y.checkpoint)
        np.testing.assert_array_equal(x.token_ids, y.token_ids)
        np.testing.assert_array_equal(x.response_mask, y.response_mask)
        assert (x.values is None) == (y.values is None)
        if x.values is not None:
            np.testing.assert_allclose(x.values, y.values, rtol=1e-6, equal_nan=True)
        assert set(x.token_arrays) == set(y.token_arrays)
        for k in x.token_arrays:
            np.testing.assert_allclose(x.token_arrays[k], y.token_arrays[k], rtol=1e-6, equal_nan=True)
        assert (x.turn_starts is None) == (y.turn_starts is None)
        if x.turn_starts is not None:
            np.testing.assert_array_equal(x.turn_starts, y.turn_starts)
        assert x.metadata == y.metadata


def test_jsonl_rows_are_read_column_wise_as_the_row_reader_reads_them(tmp_path):
    """A JSONL file of plain rows is parsed column-wise, row i named as line i + 1; the same rows in a
    JSON array (the row-by-row reader) give the same sequences. A blank line sends the file to the
    line reader, which still names the right line."""
    import json

    rows = _table("nulls_off_mask").to_pylist()
    for r in rows:
        r["step"], r["note"] = 3, "é"
    jl, js = tmp_path / "rows.jsonl", tmp_path / "rows.json"
    jl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    js.write_text(json.dumps(rows))
    rep, ref = ReadReport(), ReadReport()
    _same_sequences(list(iter_tokenized(jl, report=rep)), list(iter_tokenized(js, report=ref)))
    assert rep.rows_read == {"columnar": 8} and ref.rows_read == {"row_by_row": 8}
    rows[6]["input_ids"][1] = -1
    jl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(InputError, match=r"rows.jsonl: record 6 \(line 7, id 'r6'\).*input_ids\[1\] = -1"):
        read_tokenized(jl)
    jl.write_text("\n" + "".join(json.dumps(r) + "\n" for r in rows))  # a blank first line
    with pytest.raises(InputError, match=r"record 6 \(line 8, id 'r6'\).*input_ids\[1\] = -1"):
        read_tokenized(jl)


@pytest.mark.parametrize("holes", [False, True])
def test_padded_rows_are_read_column_wise_as_the_row_reader_reads_them(tmp_path, holes):
    """``attention_mask`` padding on the left, on the right, on both ends, a row padded throughout and
    (``holes``) a row whose kept tokens are split: the rows read in place (one kept run each) or with
    the kept tokens gathered (a split row) give the sequences the row-by-row reader gives (the same rows
    as a JSON array): tokens, values, per-token rewards and log-probs, a NaN log-prob at a kept token
    marked, rewards on padding counted; check_rollouts counts the same trajectories."""
    import json

    att = [[0, 0, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 0, 0], [0, 1, 1, 1, 1, 1, 1, 0], [0] * 8,
           [1, 1, 0, 1, 1, 1, 1, 1] if holes else [1] * 8, [0, 0, 0, 1, 1, 1, 1, 1]]
    rows = []
    for i, a in enumerate(att):
        lp = [-0.1 * (j + 1) for j in range(8)]
        lp[5] = float("nan") if i == 2 else lp[5]
        tr = [0.0] * 8
        tr[7], tr[0] = float(i % 2), (0.5 if i == 0 else 0.0)  # row 0: a reward on its padding
        rows.append({"trajectory_id": f"r{i}", "uid": f"g{i // 2}", "input_ids": [100 + 10 * i + j for j in range(8)],
                     "attention_mask": a, "response_mask": [int(x and j >= 3) for j, x in enumerate(a)],
                     "values": [0.25 * j for j in range(8)], "rollout_log_probs": lp,
                     "token_level_rewards": tr})
    p, js = tmp_path / "rows.parquet", tmp_path / "rows.json"
    pq.write_table(pa.Table.from_pylist(rows), p, row_group_size=4)
    js.write_text(json.dumps(rows))
    rep, ref = ReadReport(), ReadReport()
    got = list(iter_tokenized(p, report=rep))
    _same_sequences(got, list(iter_tokenized(js, report=ref)))
    assert rep.rows_read == {"columnar": 6} and ref.rows_read == {"row_by_row": 6}
    np.testing.assert_array_equal(got[0].token_ids, [102, 103, 104, 105, 106, 107])
    np.testing.assert_array_equal(got[2].token_arrays["rollout_log_probs"][[3, 4]], [-0.5, np.nan])
    assert got[2].nonfinite["rollout_log_probs"].tolist() == [0, 0, 0, 0, 1, 0]
    assert len(got[3].token_ids) == 0 and got[0].metadata["rewards_on_padding"] == 1
    np.testing.assert_array_equal(got[4].token_ids, [140, 141, 143, 144, 145, 146, 147] if holes else
                                  [140 + j for j in range(8)])
    assert check_rollouts([p]).n_trajectories == check_rollouts([js]).n_trajectories == 6


@pytest.mark.parametrize("case", ["plain", "late_key", "spaced_key", "late_float", "escaped_quote", "missing_and_late_key"])
def test_jsonl_schema_from_the_first_lines_only_when_no_later_line_has_another_key(tmp_path, monkeypatch, case):
    """A JSONL file of 130 rows: polars infers the schema from the first 100 lines only when the keys of
    the file total 130 x the columns found there (one parse, ``plain``); a key that only line 121 holds
    (``late_key``: kept, as the row reader keeps it), a key spaced from its colon or a string holding
    an escaped quote before a colon (the count could be wrong), or a later line whose type differs
    (``late_float``) take every line's schema. Every case gives the row reader's sequences."""
    import json

    import polars as pl

    rows = _table("scalar_reward", n=130).to_pylist()
    for r in rows:
        r["step"], r["note"] = 3, "x"
    if case in ("late_key", "missing_and_late_key"):
        rows[120]["late"] = "only here"
    if case == "missing_and_late_key":  # lines x columns stays 130 x the first lines' columns (diff review #4)
        del rows[5]["note"]
    elif case == "late_float":
        rows[120]["step"] = 2.5
    elif case == "escaped_quote":
        rows[7]["note"] = 'say "a": b'
    lines = [json.dumps(r) for r in rows]
    if case == "spaced_key":
        lines[120] = lines[120].replace('"note":', '"note" :')
    jl, js = tmp_path / "rows.jsonl", tmp_path / "rows.json"
    jl.write_text("".join(x + "\n" for x in lines))
    js.write_text(json.dumps(rows))
    inferred = []
    read = pl.read_ndjson
    monkeypatch.setattr(pl, "read_ndjson", lambda *a, **k: inferred.append(k.get("infer_schema_length")) or read(*a, **k))
    rep = ReadReport()
    got = list(iter_tokenized(jl, report=rep))
    _same_sequences(got, list(iter_tokenized(js)))
    assert inferred == ([100] if case == "plain" else [100, None])
    late = case in ("late_key", "missing_and_late_key")
    assert rep.rows_read == ({"row_by_row": 130} if late else {"columnar": 130})
    if late:
        assert got[120].metadata["late"] == "only here" and "late" not in got[119].metadata


@pytest.mark.parametrize("tail", ["", "\n", "\r\n", "\n\n \t\r\n", " " * 70_000 + "\n"])
@pytest.mark.parametrize("bom", [False, True])
def test_jsonl_blank_space_at_the_end_is_not_read(tmp_path, tail, bom):
    """The blank space a JSONL file ends with (none, LF, CR LF, blank lines, more than one 64 KiB block
    of it), after a byte order mark or not, shifts no row: the rows read column-wise, as the row
    reader reads them; a file of only blank space holds no row."""
    import json

    rows = _table("scalar_reward").to_pylist()
    jl, js = tmp_path / "rows.jsonl", tmp_path / "rows.json"
    jl.write_bytes((b"\xef\xbb\xbf" if bom else b"") + "\n".join(json.dumps(r) for r in rows).encode() + tail.encode())
    js.write_text(json.dumps(rows))
    rep = ReadReport()
    _same_sequences(list(iter_tokenized(jl, report=rep)), list(iter_tokenized(js)))
    assert rep.rows_read == {"columnar": 8}
    jl.write_bytes((b"\xef\xbb\xbf" if bom else b"") + tail.encode())
    assert list(iter_tokenized(jl, options=ReadOptions(lenient=True))) == []


def test_step_rows_are_read_as_arrays_as_the_row_reader_reads_them(tmp_path):
    """Parquet step rows (one row per model call) read with their token lists as numpy views give the
    same rollouts as the same rows as a JSON array; a prompt that does not extend is still named."""
    import json

    prompt, c1, env, c2 = [1, 2, 3], [10, 11], [20, 21, 22], [12, 13, 14]
    rows = []
    for g in range(4):  # two rows (steps) per rollout
        rows.append({"example_id": g, "prompt_ids": prompt, "completion_ids": c1, "completion_mask": [1, 1],
                     "completion_logprobs": [-0.5, -0.25], "reward": 0.0})
        rows.append({"example_id": g, "prompt_ids": prompt + c1 + env, "completion_ids": c2,
                     "completion_mask": [1, 1, 0], "completion_logprobs": [-1.0, -2.0, -3.0], "reward": g / 4})
    p, js = tmp_path / "steps.parquet", tmp_path / "steps.json"
    pq.write_table(pa.Table.from_pylist(rows), p, row_group_size=3)  # a rollout spans two row groups
    js.write_text(json.dumps(rows))
    rep = ReadReport()
    got = list(iter_tokenized(p, report=rep))
    _same_sequences(got, list(iter_tokenized(js)))
    assert rep.rows_read == {"columnar": 4} and [s.reward for s in got] == [0.0, 0.25, 0.5, 0.75]
    np.testing.assert_array_equal(got[0].token_ids, prompt + c1 + env + c2)
    np.testing.assert_array_equal(got[0].response_mask, [0, 0, 0, 1, 1, 0, 0, 0, 1, 1, 0])
    np.testing.assert_array_equal(got[0].token_arrays["rollout_log_probs"][[3, 4, 8, 9, 10]],
                                  [-0.5, -0.25, -1.0, -2.0, -3.0])
    rows[5]["prompt_ids"] = [9] + rows[5]["prompt_ids"]
    pq.write_table(pa.Table.from_pylist(rows), p, row_group_size=3)
    with pytest.raises(InputError, match=r"steps.parquet: record 4: step 1's prompt_ids do not extend"):
        read_tokenized(p)


@pytest.mark.parametrize("null", [True, False])
@pytest.mark.parametrize("finite", [True, False])
def test_number_array_over_whole_lists_equals_the_entry_loop(null, finite):
    """number_array (entry types as one set, one conversion) gives what the one-entry-at-a-time loop
    gives: booleans, strings, nested lists and integers beyond float64 refused; nulls as NaN only with
    ``null``; NaN / inf refused only with ``finite``; float subclasses (numpy scalars) accepted."""
    import math

    from critic_audit.io.records import number_array

    def loop(v):  # the reference: one entry at a time
        out = []
        for x in v:
            if x is None and null:
                out.append(math.nan)
            elif isinstance(x, bool) or not isinstance(x, (int, float)):
                return None
            else:
                try:
                    f = float(x)
                except OverflowError:
                    return None
                if finite and not math.isfinite(f):
                    return None
                out.append(f)
        return np.asarray(out, dtype=np.float64)

    cases = [[], [1, 2.5, -3], [1, None, 2.0], [True, 1], [1, "2"], [[1]], [10**400], [2**63, 1.0],
             [float("nan"), 1.0], [float("inf")], [None, float("nan")], [np.float64(1.5), 2], [None]]
    for v in cases:
        got, want = number_array(v, null=null, finite=finite), loop(v)
        assert (got is None) == (want is None), v
        if got is not None:
            np.testing.assert_array_equal(got, want)
            assert got.dtype == np.float64


def _step_table() -> pa.Table:
    rows = []
    for g in range(4):  # two rows (steps) per rollout
        rows.append({"example_id": g, "prompt_ids": [1, 2, 3], "completion_ids": [10, 11], "completion_mask": [1, 1],
                     "completion_logprobs": [-0.5, -0.25], "reward": 0.0})
        rows.append({"example_id": g, "prompt_ids": [1, 2, 3, 10, 11, 20], "completion_ids": [12, 13],
                     "completion_mask": [1, 1], "completion_logprobs": [-1.0, -2.0], "reward": g / 4})
    return pa.Table.from_pylist(rows)


@pytest.mark.parametrize("layout", ["one_row_group", "int32_leftpad", "steps", "jsonl", "jsonl_crlf"])
def test_a_file_read_in_bounded_pieces_gives_the_tables_of_the_whole_file(tmp_path, monkeypatch, layout):
    """analyze's table reader reads a row group larger than its chunk in batches
    (``ParquetFile.iter_batches``; a rollout's step rows may span two) and a JSONL file in pieces of
    whole lines (LF or CR LF): the same canonical tables as the whole file read at once, every row
    column-wise, row i still line i + 1."""
    import json

    from polars.testing import assert_frame_equal

    import critic_audit.io.tokenized as T

    table = _step_table() if layout == "steps" else _table(layout, n=12)
    if layout.startswith("jsonl"):
        p = tmp_path / "rows.jsonl"
        end = "\r\n" if layout == "jsonl_crlf" else "\n"
        p.write_bytes("".join(json.dumps(r) + end for r in table.to_pylist()).encode())
    else:
        p = tmp_path / "rows.parquet"
        pq.write_table(table, p, row_group_size=table.num_rows)  # one row group
    whole, rep_whole = read_tokenized(p, report=(r0 := ReadReport())), r0
    monkeypatch.setattr(T, "_TABLE_CHUNK", 3)
    monkeypatch.setattr(T, "JSONL_PIECE_BYTES", 700)  # about one line a piece
    rep = ReadReport()
    parts = read_tables(p, report=rep)  # analyze's reader (no per-token side arrays kept)
    for a, b in zip(parts, whole):
        assert_frame_equal(a, b)
    assert rep.rows_read == rep_whole.rows_read == {"columnar": whole[0].height}
    assert whole[0].height == (4 if layout == "steps" else 12)
    if layout.startswith("jsonl"):
        rows = table.to_pylist()
        rows[9]["input_ids"][1] = -1
        p.write_text("".join(json.dumps(r) + "\n" for r in rows))
        with pytest.raises(InputError, match=r"rows.jsonl: record 9 \(line 10, id 'r9'\).*input_ids\[1\] = -1"):
            read_tables(p)


def test_an_irregular_jsonl_piece_hands_the_rest_of_the_file_to_the_line_reader(tmp_path, monkeypatch):
    """A blank line or a malformed line in a later piece: the pieces before it were read column-wise,
    the line reader reads the rest, naming a bad line by its record and line (strict) or skipping and
    counting it (lenient); no row is read twice or lost."""
    import json

    import critic_audit.io.tokenized as T

    monkeypatch.setattr(T, "JSONL_PIECE_BYTES", 700)
    rows = _table("scalar_reward", n=12).to_pylist()
    lines = [json.dumps(r) for r in rows]
    p = tmp_path / "rows.jsonl"
    ids = [f"r{i}" for i in range(12)]
    p.write_text("\n".join(lines[:7] + [""] + lines[7:]) + "\n")  # a blank line after record 6
    rep = ReadReport()
    trajs, _, _ = read_tables(p, report=rep)
    assert trajs["trajectory_id"].to_list() == ids
    assert rep.rows_read["columnar"] >= 3 and rep.rows_read["row_by_row"] >= 5 and sum(rep.rows_read.values()) == 12
    rows[9]["values"][2] = "x"
    p.write_text("\n".join(json.dumps(r) for r in rows[:7]) + "\n\n" + "\n".join(json.dumps(r) for r in rows[7:]))
    with pytest.raises(InputError, match=r"rows.jsonl: record 9 \(line 11, id 'r9'\).*values"):
        read_tables(p)
    lines[8] = lines[8][:-1]  # malformed JSON on line 9
    p.write_text("\n".join(lines) + "\n")
    with pytest.raises(InputError, match=r"rows.jsonl: record 8 \(line 9\)"):
        read_tables(p)
    rep = ReadReport()
    trajs, _, _ = read_tables(p, options=ReadOptions(lenient=True), report=rep)
    assert trajs["trajectory_id"].to_list() == ids[:8] + ids[9:] and rep.skipped == {"malformed_json": 1}


def test_a_corrupt_page_in_a_batched_row_group_names_its_rows(tmp_path, monkeypatch):
    """A row group read in batches whose data page is corrupt: strict names the row group and the rows
    from the failing batch on; lenient skips and counts those rows and keeps the rows read before."""
    import critic_audit.io.tokenized as T

    n = 50
    p = tmp_path / "rows.parquet"
    values = np.random.default_rng(0).normal(size=(n, 200)).tolist()
    pq.write_table(pa.table({"trajectory_id": [f"t{i}" for i in range(n)], "input_ids": [[1, 2, 3, 4] * 50] * n,
                             "response_mask": [[0, 1, 1, 1] * 50] * n, "values": values, "reward": [1.0] * n}),
                   p, row_group_size=n, data_page_size=4096, compression="snappy", use_dictionary=False)
    col = pq.ParquetFile(p).metadata.row_group(0).column(3)  # values
    assert col.path_in_schema == "values.list.element"
    clean = p.read_bytes()

    def rows_before_error(data: bytes) -> int | None:
        p.write_bytes(data)
        got = 0
        try:
            for rb in pq.ParquetFile(p).iter_batches(batch_size=8):
                got += rb.num_rows
        except Exception:  # noqa: BLE001 - the corrupt page
            return got
        return None

    for at in range(col.data_page_offset, col.data_page_offset + col.total_compressed_size, 97):
        b = bytearray(clean)  # a page header past the first batch of 8 rows
        b[at:at + 64] = bytes(x ^ 0xFF for x in b[at:at + 64])
        if (rows_before_error(bytes(b)) or 0) >= 8:
            break
    else:
        pytest.fail("no page header found to corrupt")
    monkeypatch.setattr(T, "_TABLE_CHUNK", 8)
    with pytest.raises(InputError, match=r"rows.parquet: record \d+: cannot read Parquet row group 0 \(rows \d+-49"):
        read_tables(p)
    rep = ReadReport()
    trajs, _, _ = read_tables(p, options=ReadOptions(lenient=True), report=rep)
    kept = trajs["trajectory_id"].to_list()
    assert kept == [f"t{i}" for i in range(len(kept))] and rep.skipped == {"bad_parquet": n - len(kept)}
    assert 8 <= len(kept) < n
