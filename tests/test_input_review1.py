"""Input defects found by a fresh-eyes review (review1): non-finite table rewards, duplicated exports in
one folder, suffix-less / piped / gzip-compressed inputs, a success field without a reward."""

from __future__ import annotations

import math
from pathlib import Path

import polars as pl
import pytest

from critic_audit.errors import InputError
from critic_audit.io import ReadOptions, ReadReport


def _tables(d: Path, reward_b: float) -> Path:
    """Trajectories a, b, c of 4 tokens (2 policy tokens, turn 0); b's reward is ``reward_b``."""
    d.mkdir()
    rows = [{"trajectory_id": t, "position": p, "token_id": 5 + p, "turn": 0 if p >= 2 else None,
             "response_mask": p >= 2, "value": 0.25 * p} for t in "abc" for p in range(4)]
    pl.DataFrame(rows).write_parquet(d / "tokens.parquet")
    pl.DataFrame({"trajectory_id": ["a", "b", "c"], "reward": [1.0, reward_b, None], "num_turns": [1, 1, 1]}
                 ).write_parquet(d / "trajectories.parquet")
    return d


@pytest.mark.parametrize("reward, what", [(math.inf, "is infinite (inf)"), (-math.inf, "is infinite (-inf)"),
                                          (math.nan, "is NaN")])
def test_a_non_finite_table_reward_is_refused_or_skipped_like_json(tmp_path, reward, what):
    from critic_audit.io.tables import read_tables
    from critic_audit.pipeline.stream import stream_plan

    d = _tables(tmp_path / "t", reward)
    with pytest.raises(InputError) as e:
        read_tables(d)
    assert str(e.value) == (f"{d / 'trajectories.parquet'}: record 1 (trajectory 'b'): trajectories table: reward "
                            f"{what} (1 such row) (fix: give the trajectory a finite reward (null where it has none), "
                            "or pass --lenient to skip it)")
    rep = ReadReport()
    trajs, tokens, _ = read_tables(d, ReadOptions(lenient=True), rep)
    assert trajs["trajectory_id"].to_list() == ["a", "c"] and trajs["reward"].to_list() == [1.0, None]
    assert tokens["trajectory_id"].unique().sort().to_list() == ["a", "c"] and rep.skipped == {"bad_reward": 1}
    # analyze streams tables: such a table is read in memory instead, which refuses or skips the row
    assert stream_plan([d], ReadOptions())[1] == (f"{d / 'trajectories.parquet'} holds a NaN or infinite reward "
                                                  "(read in memory, which refuses or skips it)")
    assert stream_plan([_tables(tmp_path / "ok", 0.0)], ReadOptions())[1] is None


def _token_rows(path: Path) -> Path:
    import json

    rows = [{"trajectory_id": f"t{i}", "input_ids": [1, 2, 3, 4], "response_mask": [0, 0, 1, 1], "reward": float(i % 2)}
            for i in range(4)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _read(path: Path):
    from critic_audit.check import load_rollouts

    return load_rollouts([path], read_options=ReadOptions())


@pytest.mark.parametrize("layout", ["no_suffix", "gzip", "gzip_no_suffix", "parquet_no_suffix", "json_array_no_suffix",
                                    "pipe_of_gzip"])
def test_suffixless_compressed_and_piped_inputs_are_read_by_content(tmp_path, layout):
    import gzip
    import json
    import os
    import threading

    src = _token_rows(tmp_path / "ok.jsonl")
    want = [("t0", 0.0), ("t1", 1.0), ("t2", 0.0), ("t3", 1.0)]
    if layout == "no_suffix":
        path = tmp_path / "okfile"
        path.write_bytes(src.read_bytes())
    elif layout in ("gzip", "gzip_no_suffix", "pipe_of_gzip"):
        path = tmp_path / ("okgz" if layout == "gzip_no_suffix" else "ok.jsonl.gz")
        path.write_bytes(gzip.compress(src.read_bytes()))
    elif layout == "parquet_no_suffix":
        path = tmp_path / "okpq"
        pl.read_ndjson(src).write_parquet(path)
    else:
        path = tmp_path / "okarr"
        path.write_text(json.dumps([json.loads(x) for x in src.read_text().splitlines()]), encoding="utf-8")
    if layout == "pipe_of_gzip":  # a named pipe giving the gzip bytes, as <(cat ok.jsonl.gz) does
        data, path = path.read_bytes(), tmp_path / "63"
        os.mkfifo(path)
        threading.Thread(target=lambda: path.write_bytes(data), daemon=True).start()
    got = _read(path)
    assert [(r.trajectory_id, r.reward) for r in got] == want
    assert [(list(r.token_ids), [bool(x) for x in r.response_mask]) for r in got] == [([1, 2, 3, 4], [False, False, True, True])] * 4


def test_a_corrupt_gzip_file_is_one_error_line(tmp_path):
    import gzip

    path = tmp_path / "ok.jsonl.gz"
    path.write_bytes(gzip.compress(_token_rows(tmp_path / "ok.jsonl").read_bytes())[:40])
    with pytest.raises(InputError) as e:
        _read(path)
    assert str(e.value) == (f"{path}: gzip-compressed file that does not decompress (Compressed file ended before the "
                            "end-of-stream marker was reached) (fix: repair it, or decompress it and point at the result)")


def test_a_success_field_stands_for_a_missing_reward_and_is_noted(tmp_path):
    import json

    from critic_audit.io import read_chat

    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    path = tmp_path / "s.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in [
        {"id": "a", "messages": msgs, "success": True}, {"id": "b", "messages": msgs, "success": 0},
        {"id": "c", "messages": msgs, "success": True, "reward": 0.25}]), encoding="utf-8")
    rep = ReadReport()
    got = read_chat(path, ReadOptions(), rep)
    assert [(c.trajectory_id, c.reward, c.success) for c in got] == [("a", 1.0, True), ("b", 0.0, False), ("c", 0.25, True)]
    assert rep.notes == {"reward_from_success_field ('success': true -> 1.0, false -> 0.0; no reward field)": 2}
    # without a reward requirement the reward stays unknown; a --reward-key the record lacks is still refused
    assert [c.reward for c in read_chat(path, ReadOptions(require_reward=False))] == [None, None, 0.25]
    with pytest.raises(InputError) as e:
        read_chat(path, ReadOptions(reward_key="score"))
    assert "record 0 (line 1, id 'a'): missing reward: no field 'score'" in str(e.value)
    path.write_text(json.dumps({"id": "d", "messages": msgs}) + "\n", encoding="utf-8")
    with pytest.raises(InputError, match="missing reward: no field any of"):
        read_chat(path)


def _chat_rows(path: Path, answer: str) -> Path:
    import json

    path.write_text("".join(json.dumps({"id": str(i), "reward": float(i % 2), "messages": [
        {"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": answer}]}) + "\n" for i in range(3)),
        encoding="utf-8")
    return path


def test_two_copies_of_one_export_in_a_folder_are_refused_or_counted(tmp_path):
    from critic_audit.io.inputs import read_all

    d = tmp_path / "dup"
    d.mkdir()
    _chat_rows(d / "a.jsonl", "same")
    _chat_rows(d / "b.jsonl", "same")
    with pytest.raises(InputError) as e:
        read_all([d], ReadOptions())
    assert str(e.value) == (f"{d / 'b.jsonl'}: trajectory '0' has the same id and content as in {d / 'a.jsonl'} (3 "
                            "trajectories repeated across 2 files: two copies of one export?) (fix: read one copy (move "
                            "the other out of the folder), or pass --lenient to audit each once (the copies dropped, "
                            "counted as duplicate_trajectories))")
    rep = ReadReport()
    got = read_all([d], ReadOptions(lenient=True), report=rep)
    # lenient: each rollout once (the first file's copy, its own id), the 3 later copies dropped and counted
    assert [c.trajectory_id for c in got.conversations] == ["0", "1", "2"]
    assert rep.notes["duplicate_trajectories"] == 3
    # two runs that reuse ids (other content): qualified by file, no error, nothing counted
    _chat_rows(d / "b.jsonl", "another run")
    rep = ReadReport()
    assert len(read_all([d], ReadOptions(), report=rep).conversations) == 6 and "duplicate_trajectories" not in rep.notes


def test_a_jsonl_and_its_parquet_copy_are_one_export_for_analyze_and_check(tmp_path):
    from critic_audit.check import load_rollouts
    from critic_audit.io.inputs import read_all

    d = tmp_path / "dup"
    d.mkdir()
    src = _token_rows(d / "a.jsonl")
    pl.read_ndjson(src).write_parquet(d / "a.parquet")
    want = "trajectory 't0' has the same id and content as in"
    with pytest.raises(InputError, match=want):
        read_all([d], ReadOptions())
    with pytest.raises(InputError, match=want):
        load_rollouts([d], read_options=ReadOptions(require_reward=False))
    rep = ReadReport()
    got = load_rollouts([d], read_options=ReadOptions(require_reward=False, lenient=True), report=rep)
    assert rep.notes["duplicate_trajectories"] == 4 and sorted(r.trajectory_id for r in got) == ["t0", "t1", "t2", "t3"]
    rep = ReadReport()
    tabs = read_all([d], ReadOptions(lenient=True), report=rep).tables
    assert sum(tr.height for _, tr, _, _ in tabs) == 4 and rep.notes["duplicate_trajectories"] == 4
    assert sorted(x for _, tr, _, _ in tabs for x in tr["trajectory_id"].cast(pl.String).to_list()) == [
        "t0", "t1", "t2", "t3"]
    pl.read_ndjson(src).with_columns(reward=pl.lit(0.5)).write_parquet(d / "a.parquet")  # another run, same ids
    assert len(load_rollouts([d], read_options=ReadOptions(require_reward=False))) == 8


@pytest.mark.parametrize("reward, what", [(math.inf, "is infinite (inf)"), (math.nan, "is NaN")])
def test_a_non_finite_reward_in_tokenized_parquet_rows_is_refused_or_skipped(tmp_path, reward, what):
    from critic_audit.check import load_rollouts

    path = _token_rows(tmp_path / "ok.jsonl")
    rows = pl.read_ndjson(path).with_columns(reward=pl.Series([0.0, reward, 0.0, 1.0]))
    rows.write_parquet(tmp_path / "rows.parquet")
    with pytest.raises(InputError) as e:
        load_rollouts([tmp_path / "rows.parquet"], read_options=ReadOptions())
    assert str(e.value) == (f"{tmp_path / 'rows.parquet'}: record 1 (id 't1'): reward 'reward' {what} "
                            "(fix: give the record a finite reward, or drop the record)")
    rep = ReadReport()
    got = load_rollouts([tmp_path / "rows.parquet"], read_options=ReadOptions(lenient=True), report=rep)
    assert [r.trajectory_id for r in got] == ["t0", "t2", "t3"] and sum(rep.skipped.values()) == 1


def _chat_lines(ids: list[str], reward: float = 1.0) -> bytes:
    import json

    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    return "".join(json.dumps({"id": i, "messages": msgs, "reward": reward}) + "\n" for i in ids).encode()


def test_compressed_files_in_a_folder_are_found_by_content(tmp_path):
    """A folder search reads gzip / zstd files by their first bytes, as a file named on its own (was:
    by suffix only, so ``b.jsonl.gz``, a suffix-less zstd ``blob`` and ``a.json.gz`` beside ``a.json``
    were passed over as not_rollout_file): each under its own name; a plain suffix-less file is still
    passed over; an identical compressed copy is refused as a copy naming the user's file."""
    import gzip
    import json

    import zstandard

    from critic_audit.io.inputs import read_all

    d = tmp_path / "run"
    d.mkdir()
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    (d / "a.json").write_text(json.dumps([{"id": "a0", "messages": msgs, "reward": 1.0}]))
    (d / "a.json.gz").write_bytes(gzip.compress(json.dumps([{"id": "z0", "messages": msgs, "reward": 0.0}]).encode()))
    (d / "b.jsonl.gz").write_bytes(gzip.compress(_chat_lines(["b0", "b1"])))
    (d / "blob").write_bytes(zstandard.ZstdCompressor().compress(_chat_lines(["c0"], 0.5)))
    (d / "notes").write_bytes(_chat_lines(["n0"]))  # plain, no suffix: not a rollout file in a folder
    rep = ReadReport()
    res = read_all([d], ReadOptions(), report=rep)
    got = sorted((c.trajectory_id, c.reward, c.source) for c in res.conversations)
    assert got == [("a0", 1.0, "a"), ("b0", 1.0, "b"), ("b1", 1.0, "b"), ("c0", 0.5, "blob"), ("z0", 0.0, "a")]
    specs = {str(s.origin or s.path): s for r in res.resolved for s in r.files}
    assert sorted(Path(k).name for k in specs) == ["a.json", "a.json.gz", "b.jsonl.gz", "blob"]
    assert specs[str(d / "a.json.gz")].label != specs[str(d / "a.json")].label  # two files, two labels
    assert rep.skipped_files == {"not_rollout_file": 1}
    (d / "blob").unlink()
    (d / "notes").unlink()
    (d / "b.jsonl").write_bytes(gzip.decompress((d / "b.jsonl.gz").read_bytes()))  # the same export, twice
    with pytest.raises(InputError) as e:
        read_all([d], ReadOptions())
    msg = str(e.value)
    assert msg.startswith(f"{d / 'b.jsonl.gz'}: ") or f"as in {d / 'b.jsonl.gz'} " in msg
    assert "two copies of one export" in msg and "critic-audit-in-" not in msg


def test_a_bad_compressed_file_in_a_folder_is_named_and_lenient_skips_it(tmp_path):
    """A bad record inside a compressed file found in a folder: the line names the user's file (not its
    temporary copy) and the stray-file hint; a file that does not decompress is one line, or skipped
    and counted under --lenient."""
    import gzip

    from critic_audit.io.inputs import read_all

    d = tmp_path / "run"
    d.mkdir()
    (d / "ok.jsonl").write_bytes(_chat_lines(["a"]))
    (d / "bad.jsonl.gz").write_bytes(gzip.compress(_chat_lines(["b"]) + b'{"id": "c", "messages": 3}\n'))
    with pytest.raises(InputError) as e:
        read_all([d], ReadOptions())
    assert str(e.value).startswith(f"{d / 'bad.jsonl.gz'}: record 1 (line 2")
    assert "if bad.jsonl.gz is not a rollout file, move it out of" in str(e.value)
    (d / "bad.jsonl.gz").write_bytes(gzip.compress(_chat_lines(["b"]))[:30])  # cut: does not decompress
    with pytest.raises(InputError) as e:
        read_all([d], ReadOptions())
    assert str(e.value).startswith(f"{d / 'bad.jsonl.gz'}: gzip-compressed file that does not decompress")
    rep = ReadReport()
    res = read_all([d], ReadOptions(lenient=True), report=rep)
    assert [c.trajectory_id for c in res.conversations] == ["a"] and rep.skipped_files == {"unreadable_file": 1}
