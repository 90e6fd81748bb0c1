"""Odd input and the errors that name it (issue 12, items 4 and 7): lone UTF-16 surrogates anywhere in a
record, corrupt or non-UTF-8 Parquet, and errors that name the file, the record and the fix."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from critic_audit.cli import app
from critic_audit.errors import CheckpointError, InputError, SchemaError
from critic_audit.io.records import ReadOptions, ReadReport
from critic_audit.io.inputs import read_inputs, read_tables

runner = CliRunner()
LONE = "\\ud800"  # a valid JSON escape; alone it is half an emoji (U+1F600 is \\ud83d\\ude00)

CHAT = '{"id": "a", "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}], "reward": 1}'
GOOD = '{"id": "b", "messages": [{"role": "user", "content": "\\ud83d\\ude00"}, {"role": "assistant", "content": "ok"}], "reward": 0}'
TOKENS = '{"id": "a", "input_ids": [1, 2, 3], "response_mask": [0, 1, 1], "reward": 1}'
TOKENS_GOOD = '{"id": "b", "input_ids": [1, 2, 3], "response_mask": [0, 1, 1], "reward": 0}'
RESPONSES = ('{"id": "a", "input": [{"role": "user", "content": "q"}], "output": [{"type": "message", "role": '
             '"assistant", "content": [{"type": "output_text", "text": "yo"}]}], "reward": 1}')

CASES = {  # where the surrogate goes -> (record, the field named in the error)
    "id": (CHAT.replace('"a"', f'"a{LONE}"'), "id"),
    "content": (CHAT.replace('"yo"', f'"y{LONE}o"'), "messages[1].content"),
    "metadata": (CHAT[:-1] + f', "note": "x{LONE}"}}', "metadata.note"),
    "metadata key": (CHAT[:-1] + f', "n{LONE}": 1}}', "the key metadata.n\\ud800"),
    "group": (CHAT[:-1] + f', "group_id": "g{LONE}"}}', "group_id"),
    "tool call": (CHAT.replace('"content": "yo"', '"content": null, "tool_calls": [{"type": "function", "function": '
                               f'{{"name": "f{LONE}", "arguments": "{{}}"}}}}]'), "messages[1].tool_calls[0].function.name"),
    "responses": (RESPONSES.replace('"yo"', f'"y{LONE}"'), "messages[1].content"),
    "token row id": (TOKENS.replace('"a"', f'"a{LONE}"'), "id"),
    "token row ids": (TOKENS.replace("[1, 2, 3]", f'["{LONE}", 2, 3]'), "input_ids[0]"),
    "token row metadata": (TOKENS[:-1] + f', "x": "{LONE}"}}', "x"),
}


def _read(path: Path, lenient: bool, tokens: bool):
    rep = ReadReport()
    opts = ReadOptions(lenient=lenient)
    if tokens:
        trajs, _, _ = read_tables(path, options=opts, report=rep)
        return trajs["trajectory_id"].to_list(), rep
    return [c.trajectory_id for c in read_inputs([path], opts, report=rep)], rep


@pytest.mark.parametrize("suffix", [".jsonl", ".json"])
@pytest.mark.parametrize("case", list(CASES))
def test_lone_surrogates_are_one_line_errors_and_skipped_when_lenient(tmp_path, case, suffix):
    bad, field = CASES[case]
    tokens = case.startswith("token")
    good = TOKENS_GOOD if tokens else RESPONSES.replace('"a"', '"b"') if case == "responses" else GOOD
    path = tmp_path / f"in{suffix}"
    path.write_text(f"{good}\n{bad}\n" if suffix == ".jsonl" else f"[{good}, {bad}]")
    with pytest.raises(InputError) as e:
        _read(path, False, tokens)
    msg = str(e.value)
    assert "lone UTF-16 surrogate" in msg and field in msg and "record 1" in msg and path.name in msg
    assert "--lenient" in msg and "\n" not in msg
    msg.encode("utf-8")  # printable: the surrogate itself is escaped
    ids, rep = _read(path, True, tokens)
    assert ids == ["b"] and rep.skipped == {"invalid_unicode": 1}


def test_surrogates_through_the_cli(tmp_path, critic_dir):
    path = tmp_path / "r.jsonl"
    path.write_text(CASES["content"][0] + "\n")
    res = runner.invoke(app, ["analyze", str(path), "--critic", str(critic_dir), "--out", str(tmp_path / "o"),
                              "--no-plots"])
    assert res.exit_code == 1
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and f"{path}: record 0 (line 1" in lines[0], res.output
    path.write_text(GOOD + "\n" + CASES["content"][0] + "\n")
    res = runner.invoke(app, ["analyze", str(path), "--critic", str(critic_dir), "--out", str(tmp_path / "o"),
                              "--no-plots", "--lenient", "--bootstrap", "20", "--json"])
    assert res.exit_code == 0, res.output
    s = json.loads(res.stdout)
    assert s["input"]["skipped"] == {"invalid_unicode": 1} and s["n_trajectories"] == 1


def _bad_utf8_parquet(path: Path) -> None:
    data = b"abc\xff\xfeighi"  # row 1's id is not UTF-8
    offsets = pa.array([0, 3, 6, 9], type=pa.int32())
    ids = pa.Array.from_buffers(pa.string(), 3, [None, offsets.buffers()[1], pa.py_buffer(data)])
    pq.write_table(pa.table({"trajectory_id": ids, "input_ids": [[1, 2, 3]] * 3, "response_mask": [[0, 1, 1]] * 3,
                             "reward": [1.0, 0.0, 1.0]}), path, row_group_size=1)


def _corrupt_parquet(path: Path) -> None:
    n = 50
    pq.write_table(pa.table({"trajectory_id": [f"t{i}" for i in range(n)], "input_ids": [[1, 2, 3, 4] * 50] * n,
                             "response_mask": [[0, 1, 1, 1] * 50] * n, "reward": [1.0] * n}), path, row_group_size=10)
    b = bytearray(path.read_bytes())
    for i in range(len(b) // 3, len(b) // 3 + 40):  # a data page of row group 3
        b[i] ^= 0xFF
    path.write_bytes(bytes(b))


def test_parquet_invalid_utf8_names_the_row(tmp_path):
    path = tmp_path / "rows.parquet"
    _bad_utf8_parquet(path)
    with pytest.raises(InputError, match=r"rows.parquet: record 1: invalid UTF-8 in a string column"):
        _read(path, False, True)
    ids, rep = _read(path, True, True)
    assert ids == ["abc", "ghi"] and rep.skipped == {"bad_parquet": 1}


def test_parquet_corrupt_data_page_names_the_row_group(tmp_path):
    path = tmp_path / "rows.parquet"
    _corrupt_parquet(path)
    with pytest.raises(InputError) as e:
        _read(path, False, True)
    assert "cannot read Parquet row group" in str(e.value) and "rows.parquet" in str(e.value)
    ids, rep = _read(path, True, True)
    assert rep.skipped["bad_parquet"] + len(ids) == 50 and rep.skipped["bad_parquet"] % 10 == 0 and len(ids) >= 40


# ---------------------------------------------------------------------------------------- item 7


def _tables(folder: Path, token_ids=(1, 2, 3), traj_ids=("t0",), tok_traj="t0") -> Path:
    folder.mkdir()
    n = len(token_ids)
    pl.DataFrame({"trajectory_id": [tok_traj] * n, "position": list(range(n)), "token_id": list(token_ids),
                  "role": ["assistant"] * n, "turn": [0] * n, "response_mask": [True] * n,
                  "value": [None] * n}, schema_overrides={"value": pl.Float32}).write_parquet(folder / "tokens.parquet")
    pl.DataFrame({"trajectory_id": list(traj_ids), "reward": [1.0] * len(traj_ids)}).write_parquet(
        folder / "trajectories.parquet")
    return folder


def test_orphan_token_rows_name_the_file_and_trajectory(tmp_path):
    folder = _tables(tmp_path / "t", traj_ids=("other",))
    with pytest.raises(SchemaError) as e:
        read_tables(folder)
    msg = str(e.value)
    assert str(folder / "tokens.parquet") in msg and "trajectory 't0'" in msg and "trajectories.parquet" in msg


def test_token_ids_outside_the_vocabulary_name_file_and_trajectory(tmp_path, critic_dir):
    folder = _tables(tmp_path / "t", token_ids=(1, 2, 49152))
    res = runner.invoke(app, ["analyze", str(folder), "--critic", str(critic_dir), "--out", str(tmp_path / "o"),
                              "--no-plots"])
    assert res.exit_code == 1
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1, res.output
    assert str(folder) in lines[0] and "trajectory 't0'" in lines[0] and "token id 49152 at position 2" in lines[0]
    assert "vocabulary [0, " in lines[0] and "unexpected" not in res.output


def test_pickle_refusal_mentions_allow_pickle(tmp_path, critic_dir):
    import shutil

    import torch
    from safetensors.torch import load_file

    from critic_audit.critic import load_critic

    pk = tmp_path / "pickled"
    shutil.copytree(critic_dir, pk)
    torch.save(load_file(pk / "model.safetensors"), pk / "pytorch_model.bin")
    (pk / "model.safetensors").unlink()
    with pytest.raises(CheckpointError) as e:
        load_critic(pk, device="cpu")
    assert "--allow-pickle" in str(e.value) and "weights_only=True" in str(e.value)
    load_critic(pk, device="cpu", allow_pickle=True)  # the flag reads it


def test_own_summary_json_given_as_rollouts_is_named(tmp_path, critic_dir):
    """``analyze OUT/summary.json``: one line saying it is critic-audit's summary.json, with the fix
    (analyze the folder, or plot it), which works; also for the previous release's summary (no
    summary_version) and a comparison's. Other unknown JSON objects keep the --messages-key advice,
    a folder search still skips summary.json as no rollout file, and --format chat reads it as told."""
    from conftest import conv

    src = tmp_path / "r.jsonl"
    src.write_text("".join(json.dumps(conv(i, 2, float(i % 2))) + "\n" for i in range(6)))
    out = tmp_path / "out"
    res = runner.invoke(app, ["analyze", str(src), "--critic", str(critic_dir), "--out", str(out), "--no-plots",
                              "--bootstrap", "20"])
    assert res.exit_code == 0, res.output
    summary = out / "summary.json"
    res = runner.invoke(app, ["analyze", str(summary), "--out", str(tmp_path / "o3"), "--no-plots"])
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert res.exit_code == 1 and len(lines) == 1, res.output
    assert "critic-audit's own summary.json" in lines[0] and "--messages-key" not in lines[0]
    assert f"critic-audit analyze {out} --out NEW" in lines[0] and f"critic-audit plot {out}" in lines[0]
    res = runner.invoke(app, ["analyze", str(out), "--out", str(tmp_path / "again"), "--no-plots", "--bootstrap", "20"])
    assert res.exit_code == 0, res.output  # the advice works

    d = json.loads(summary.read_text())
    old = tmp_path / "old" / "summary.json"  # the previous release: no summary_version
    old.parent.mkdir()
    old.write_text(json.dumps({k: v for k, v in d.items() if k != "summary_version"}))
    cmp_ = tmp_path / "cmp" / "summary.json"
    cmp_.parent.mkdir()
    cmp_.write_text(json.dumps({"critics": ["a", "b"], "n_trajectories": 6, "per_critic": {}}))
    for p in (old, cmp_):
        with pytest.raises(InputError, match="critic-audit's own summary.json") as e:
            read_inputs([p])
        assert f"critic-audit plot {p.parent}" in str(e.value)
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"n_trajectories": 6, "eta2_median": 0.1}))  # some, not all, keys
    with pytest.raises(InputError, match="unknown format") as e:
        read_inputs([other])
    assert "--messages-key" in str(e.value)
    folder = tmp_path / "old"
    (folder / "r.jsonl").write_text(src.read_text())
    rep = ReadReport()
    assert len(read_inputs([folder], report=rep)) == 6 and rep.skipped_files == {"not_rollout_file": 1}
    with pytest.raises(InputError, match="unknown format") as e:
        read_inputs([old], ReadOptions(format="chat"))
