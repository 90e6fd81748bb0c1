"""verifiers v1 traces.jsonl (prime-rl rollouts/step_N/<kind>/<subset>/, vf-eval v1): every record version
read token-exact; expectations computed independently from the raw JSON lines (a plain walk of each
trace's node graph), not from the reader."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from critic_audit.cli import app
from critic_audit.errors import InputError
from critic_audit.io import ReadOptions, ReadReport
from critic_audit.io.detect import detect_file

from conftest import DATA

VF = DATA / "prime_rl_traces"
EPISODE = VF / "episode_v2026_08_21/rollouts/step_2/train"
TRACE = VF / "trace_v2026_08_15/rollouts/step_1/train/effective/traces.jsonl"
ROLLOUT = VF / "rollout_v2026_07_09/rollouts/step_0/train/effective/traces.jsonl"
STREAM = VF / "stream_v2026_09_02"  # prime-rl >= 2026-09-02: monitors/file/traces/stream/<n>.jsonl[.zst]
CHUNKS = STREAM / "monitors/file/traces/stream"


def _text(path: Path) -> str:
    """The file's text; a ``.zst`` chunk decompressed across all its frames (the seek table's skippable
    frame yields nothing)."""
    if path.suffix != ".zst":
        return path.read_text()
    import zstandard

    with path.open("rb") as fh:
        return zstandard.ZstdDecompressor().stream_reader(fh, read_across_frames=True).read().decode()


def _sequences(path, opts):
    from critic_audit.io.detect import resolve_inputs
    from critic_audit.io.inputs import token_files

    rep = ReadReport()
    res = resolve_inputs([path], opts, rep)
    return [s for tf in token_files(res, opts, rep) for s in tf.sequences], rep


def _oracle(path: Path) -> list[dict]:
    """Every branch of every trace of the file, from the raw JSON: a leaf is a node no node names as
    parent; tokens, mask, sampled log-probs and turns along the leaf's root path; reward = sum of
    score * weight (or the plain float) over non-null rewards."""
    out = []
    for line in _text(path).splitlines():
        rec = json.loads(line)
        traces = rec["traces"] if "traces" in rec else [rec]
        for t in traces:
            nodes = t["nodes"]
            parents = {n.get("parent") for n in nodes}
            leaves = [i for i in range(len(nodes)) if i not in parents]
            scored = [v for v in t["rewards"].values() if v is not None]
            reward = sum(v["score"] * v.get("weight", 1.0) if isinstance(v, dict) else v for v in scored) \
                if scored else None
            for k, leaf in enumerate(leaves):
                path_ = []
                i = leaf
                while i is not None:
                    path_.insert(0, i)
                    i = nodes[i].get("parent")
                ids, mask, lps, turns = [], [], [], 0
                for i in path_:
                    ids += nodes[i]["token_ids"]
                    mask += nodes[i]["mask"]
                    lps += nodes[i]["logprobs"]
                    turns += any(nodes[i]["mask"])
                tid = (f"{rec['id']}/{t['id']}" if "traces" in rec else t["id"]) + (f"/b{k}" if len(leaves) > 1 else "")
                out.append({"id": tid, "ids": ids, "mask": mask, "logprobs": lps, "turns": turns, "reward": reward})
    return out


@pytest.mark.parametrize("path", [EPISODE / "effective/traces.jsonl", EPISODE / "all/traces.jsonl", TRACE, ROLLOUT])
def test_every_version_token_exact_against_the_raw_json(path):
    seqs, rep = _sequences(path, ReadOptions(require_reward=False))
    want = _oracle(path)
    assert rep.formats[str(path)] == "vf_traces" and detect_file(path) == "vf_traces"
    assert [s.trajectory_id for s in seqs] == [w["id"] for w in want]
    for s, w in zip(seqs, want):
        assert s.token_ids.tolist() == w["ids"] and s.response_mask.tolist() == w["mask"]
        assert int(s.turn_starts.sum()) == w["turns"]
        assert s.reward == pytest.approx(w["reward"]) if w["reward"] is not None else s.reward is None
        lp = s.token_arrays["rollout_log_probs"]
        assert np.isnan(lp[~s.response_mask]).all()  # no log-prob off the sampled tokens
        got = [None if math.isnan(x) else x for x in lp[s.response_mask]]
        assert got == w["logprobs"]


def test_episode_file_counts_groups_steps_and_sides():
    seqs, rep = _sequences(EPISODE / "effective/traces.jsonl", ReadOptions())
    # 4 episodes, one trace each; e3's trace branches in two (compaction): 5 rollouts
    assert len(seqs) == 5 and not rep.skipped
    assert [s.group_id for s in seqs] == ["step2:g0"] * 2 + ["step2:g1"] * 3
    assert {s.checkpoint for s in seqs} == {"2"} and {s.source for s in seqs} == {"train/effective"}
    # rewards: 1, 0, 1 + 0.5 * 0.2 (a weighted second reward), 0 (+ a null reward: not scored, not 0)
    assert [s.reward for s in seqs] == pytest.approx([1.0, 0.0, 1.1, 0.0, 0.0])
    assert [s.success for s in seqs] == [True, False, True, False, False]
    # the tool trace: two sampled turns of 2 and 3 tokens; its null log-prob is marked non-finite, never 0
    tool = seqs[2]
    assert int(tool.response_mask.sum()) == 5 and int(tool.turn_starts.sum()) == 2
    assert int(tool.nonfinite["rollout_log_probs"].sum()) == 1
    assert tool.token_arrays["advantages"][tool.response_mask].tolist() == [0.25] * 5
    assert "advantages" not in seqs[3].token_arrays  # never assigned: no side array (not zeros)
    m = seqs[0].metadata
    assert (m["env"], m["kind"], m["agent"], m["policy_start"], m["policy_end"]) == ("gsm8k", "train", "agent", 2, 3)
    # the branches share the prefix up to node 1 and differ after it
    b0, b1 = seqs[3], seqs[4]
    assert b0.token_ids[:4].tolist() == b1.token_ids[:4].tolist() == [50, 51, 15, 52]
    assert (len(b0.token_ids), len(b1.token_ids)) == (8, 8)


def test_all_file_errored_episodes_strict_and_no_reward():
    f = EPISODE / "all/traces.jsonl"
    # the errored episode's trace was never scored: a strict read says so in one line
    with pytest.raises(InputError, match=r"traces.jsonl.*record 5 .*was not scored.*--no-reward"):
        _sequences(f, ReadOptions())
    seqs, rep = _sequences(f, ReadOptions(require_reward=False))
    assert len(seqs) == 6 and seqs[-1].reward is None and seqs[-1].metadata["ok"] is False
    # the episode that failed before any trace: one record, nothing to read: counted as skipped, not an error
    assert rep.skipped == {"episode_without_traces": 1} and "SandboxError" in rep.examples["episode_without_traces"]
    assert rep.notes["vf_trace_without_rewards"] == 1
    assert rep.notes["vf_traces_step_has_all_and_effective (the same episodes in both: read one subset)"] == 1
    # effective/ read alone: no note (all/ beside it is not read)
    assert not _sequences(EPISODE / "effective/traces.jsonl", ReadOptions())[1].notes
    # lenient: the unscored episode is skipped and counted too
    seqs, rep = _sequences(f, ReadOptions(lenient=True))
    assert len(seqs) == 5 and rep.skipped == {"missing_reward": 1, "episode_without_traces": 1}


def test_older_versions_groups_and_checkpoints():
    seqs, _ = _sequences(TRACE, ReadOptions())
    # 2026-08-15: no group on the line: the rollouts of one task (task.key) of the step
    assert [s.group_id for s in seqs] == ["step1:task:k0", "step1:task:k0", "step1:task:k1"]
    assert [s.checkpoint for s in seqs] == ["1"] * 3 and [s.reward for s in seqs] == [1.0, 0.0, 1.0]
    seqs, _ = _sequences(ROLLOUT, ReadOptions())
    # 2026-07-09: group_id on the line; eval_step is the eval row's step; plain-float rewards
    assert [s.group_id for s in seqs] == ["step0:9b2c", "step0:9b2c", "step0:77aa"]
    assert [s.reward for s in seqs] == [1.0, 0.0, 0.5]
    assert [s.metadata["kind"] for s in seqs] == ["train", "train", "eval"]
    assert all("advantages" not in s.token_arrays for s in seqs)


def _bad_copy(tmp_path, edit) -> Path:
    d = tmp_path / "run" / "rollouts" / "step_7" / "train" / "effective"
    d.mkdir(parents=True)
    lines = (EPISODE / "effective/traces.jsonl").read_text().splitlines()
    rec = json.loads(lines[1])
    edit(rec)
    lines[1] = json.dumps(rec)
    (d / "traces.jsonl").write_text("\n".join(lines) + "\n")
    return d / "traces.jsonl"


@pytest.mark.parametrize("edit, reason, needle", [
    (lambda r: r["traces"][0]["nodes"][2]["mask"].pop(), "bad_tokens", "mask"),
    (lambda r: r["traces"][0]["nodes"][2].update(logprobs=[-1.0]), "bad_values", "logprobs"),
    (lambda r: r["traces"][0]["nodes"][1].update(parent=9), "bad_record", "parent"),
    (lambda r: r["traces"][0].update(rewards={"correct": "yes"}), "bad_record", "reward 'correct'"),
    (lambda r: r["traces"][0]["agent"].update(name="\ud800x"), "invalid_unicode", "surrogate in metadata.agent"),
    (lambda r: r["traces"][0]["nodes"].append({"message": {"role": "user", "content": "x"}, "token_ids": []}),
     "no_token_ids", "branch without token ids"),
])
def test_bad_record_one_line_then_lenient(tmp_path, edit, reason, needle):
    f = _bad_copy(tmp_path, edit)
    with pytest.raises(InputError) as e:
        _sequences(f, ReadOptions())
    msg = str(e.value)
    assert "traces.jsonl" in msg and "record 1" in msg and needle in msg and "\n" not in msg.strip()
    seqs, rep = _sequences(f, ReadOptions(lenient=True))
    # the skipped line counts the rollouts it holds: its trace's leaves (a parent pointing past the
    # nodes leaves node 0 childless: 2 leaves), counted here from the raw line
    nodes = json.loads(f.read_text().splitlines()[1])["traces"][0]["nodes"]
    leaves = sum(1 for i in range(len(nodes)) if i not in {n.get("parent") for n in nodes})
    assert len(seqs) == 4 and rep.skipped == {reason: max(1, leaves)}
    assert leaves == (2 if reason in ("no_token_ids",) or needle == "parent" else 1)
    assert {s.checkpoint for s in seqs} == {"2"}  # the record's run.work.step, not the folder's step_7


def test_cli_check_reads_the_run_folder_and_one_line_error(tmp_path):
    run = tmp_path / "out"
    shutil.copytree(VF / "episode_v2026_08_21", run)
    res = CliRunner().invoke(app, ["check", str(run / "rollouts/step_2/train/effective"), "--json"])
    assert res.exit_code == 3, res.output  # a check fails: the null log-prob at a sampled token
    checks = {c["id"]: c for c in json.loads(res.stdout)["checks"]}
    assert checks["nonfinite_log_probs"]["status"] == "fail"
    assert "rollout_log_probs: 1 NaN" in checks["nonfinite_log_probs"]["summary"]
    f = _bad_copy(tmp_path, lambda r: r["traces"][0]["nodes"][2]["mask"].pop())
    res = CliRunner().invoke(app, ["check", str(f), "--json"])
    lines = [ln for ln in res.stderr.strip().splitlines() if ln.strip()]
    assert res.exit_code == 1 and lines[0].startswith("error:") and "Traceback" not in res.stderr
    assert "traces.jsonl" in res.stderr and "record 1" in res.stderr and "write token_ids and mask" in res.stderr


def test_text_only_traces_are_read_as_conversations(tmp_path):
    """A file whose traces carry no token ids (vf-eval against an API, eval relay turns): each branch's
    messages, expected from the raw nodes along the path."""
    from critic_audit.io.inputs import read_inputs

    d = tmp_path / "rollouts/step_2/eval/effective"
    d.mkdir(parents=True)
    rows = [json.loads(x) for x in (EPISODE / "effective/traces.jsonl").read_text().splitlines()]
    for r in rows:
        for n in r["traces"][0]["nodes"]:
            for k in ("token_ids", "mask", "logprobs", "advantages"):
                n.pop(k, None)
    # a tool call as verifiers v1 writes it ({id, name, arguments}), and a prompt-supplied assistant message
    rows[2]["traces"][0]["nodes"][1]["message"]["tool_calls"] = [{"id": "c1", "name": "calc", "arguments": '{"x": 1}'}]
    rows[2]["traces"][0]["nodes"][2]["message"].update(tool_call_id="c1")
    rows[3]["traces"][0]["nodes"][1]["sampled"] = False
    (d / "traces.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    rep = ReadReport()
    convs = read_inputs([d / "traces.jsonl"], ReadOptions(), report=rep)
    assert rep.formats[str(d / "traces.jsonl")] == "vf_traces"
    want = _oracle_messages(rows)
    assert [c.trajectory_id for c in convs] == [w[0] for w in want]
    assert [[m["role"] for m in c.messages] for c in convs] == [w[1] for w in want]
    assert [c.reward for c in convs] == pytest.approx([1.0, 0.0, 1.1, 0.0, 0.0])
    assert [c.group_id for c in convs] == ["step2:g0"] * 2 + ["step2:g1"] * 3
    assert convs[2].messages[1]["tool_calls"] == [{"id": "c1", "type": "function",
                                                   "function": {"name": "calc", "arguments": {"x": 1}}}]
    assert convs[2].messages[2]["tool_call_id"] == "c1" and convs[2].num_turns == 2
    assert convs[3].messages[1].get("context") is True and convs[3].num_turns == 1  # not a policy turn


def _oracle_messages(rows):
    out = []
    for r in rows:
        nodes = r["traces"][0]["nodes"]
        parents = {n.get("parent") for n in nodes}
        leaves = [i for i in range(len(nodes)) if i not in parents]
        for k, leaf in enumerate(leaves):
            roles, i = [], leaf
            while i is not None:
                roles.insert(0, nodes[i]["message"]["role"])
                i = nodes[i].get("parent")
            tid = f"{r['id']}/{r['traces'][0]['id']}" + (f"/b{k}" if len(leaves) > 1 else "")
            out.append((tid, roles))
    return out


def test_the_chunked_stream_is_read_token_exact_sealed_and_live():
    """prime-rl's trace stream (#3444, #3465): a sealed chunk (zstd, seekable frames of 700 bytes here,
    lines spanning frames, the seek table in a skippable frame) and the live plain chunk; the index,
    annotations, live deltas and metrics beside them are passed over by name."""
    seqs, rep = _sequences(STREAM, ReadOptions())
    want = _oracle(CHUNKS / "00000.jsonl.zst") + _oracle(CHUNKS / "00001.jsonl")
    assert [s.trajectory_id for s in seqs] == [w["id"] for w in want] == ["e0/t0", "e1/t1", "e2/t2", "e3/t3/b0",
                                                                         "e3/t3/b1"]
    for s, w in zip(seqs, want):
        assert s.token_ids.tolist() == w["ids"] and s.response_mask.tolist() == w["mask"]
        assert s.reward == pytest.approx(w["reward"])
    assert [s.checkpoint for s in seqs] == ["3", "3", "3", "4", "4"]  # run.work.step of each episode
    assert {s.source for s in seqs} == {"stream"}
    assert rep.skipped == {"episode_without_traces": 1}  # e4 failed before any trace
    assert rep.skipped_files == {"prime_rl_trace_index": 2, "prime_rl_trace_annotations": 1,
                                 "prime_rl_live_trace": 1, "prime_rl_metrics": 1}


def test_a_sealed_chunk_names_itself_in_errors_and_keeps_its_place(tmp_path):
    """A bad line inside a .zst chunk: the error names the .zst file (not its decompressed copy in a
    temporary folder), the line and the fix. A user-compressed rollouts/step_0/... file keeps the step of
    its folder (the 2026-07-09 train rows carry none)."""
    import zstandard

    d = tmp_path / "run/monitors/file/traces/stream"
    d.mkdir(parents=True)
    lines = _text(CHUNKS / "00000.jsonl.zst").splitlines()
    rec = json.loads(lines[1])
    rec["traces"][0]["nodes"][2]["mask"].pop()
    lines[1] = json.dumps(rec)
    (d / "00000.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(("\n".join(lines) + "\n").encode()))
    res = CliRunner().invoke(app, ["check", str(tmp_path / "run")])
    err = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.exit_code == 1 and len(err) == 1, res.output
    assert err[0].startswith(f"error: {d / '00000.jsonl.zst'}: record 1 (line 2): ") and "write token_ids and mask" in err[0]
    assert "critic-audit-in-" not in res.stderr
    step0 = tmp_path / "r/rollouts/step_0/train/effective"
    step0.mkdir(parents=True)
    (step0 / "traces.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(ROLLOUT.read_bytes()))
    seqs, rep = _sequences(tmp_path / "r", ReadOptions())
    assert [s.checkpoint for s in seqs] == ["0", "0", "0"] and {s.source for s in seqs} == {"train/effective"}


def test_a_sealed_chunk_without_zstandard_is_one_line(tmp_path, monkeypatch):
    import sys

    shutil.copytree(STREAM, tmp_path / "run")
    monkeypatch.setitem(sys.modules, "zstandard", None)  # not installed
    with pytest.raises(InputError) as e:
        _sequences(tmp_path / "run", ReadOptions())
    want = (f"{tmp_path / 'run/monitors/file/traces/stream/00000.jsonl.zst'}: zstd-compressed file "
            "(the zstandard package is not installed) (fix: decompress it, pass <(zstd -dc FILE), or "
            "pip install zstandard)")
    assert str(e.value) == want
    with pytest.raises(InputError) as e:  # --lenient does not skip it as unreadable: nothing is wrong with it
        _sequences(tmp_path / "run", ReadOptions(lenient=True))
    assert str(e.value) == want


def test_all_beside_effective_a_folder_reads_effective_and_both_named_is_refused():
    """rollouts/step_2/train holds all/ and effective/ (the same 4 episodes, all/ 2 more): a folder
    search reads effective/ (the shipped cohort) and counts all/ as skipped (was: both read, refused as
    two copies, or under --lenient every shipped episode counted twice); all/ named alone is read;
    both named: one line saying which to pass."""
    seqs, rep = _sequences(EPISODE, ReadOptions())
    assert [s.trajectory_id for s in seqs] == ["e0/t0", "e1/t1", "e2/t2", "e3/t3/b0", "e3/t3/b1"]
    assert rep.skipped_files == {"prime_rl_all_beside_effective": 1}
    seqs, rep = _sequences(EPISODE / "all", ReadOptions(require_reward=False))
    assert len(seqs) == 6 and not rep.skipped_files
    res = CliRunner().invoke(app, ["check", str(EPISODE / "all"), str(EPISODE / "effective")])
    err = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.exit_code == 1 and err == [
        f"error: {EPISODE / 'all/traces.jsonl'}: holds the same episodes as {EPISODE / 'effective/traces.jsonl'} "
        "(two subsets of one export, both given) (fix: pass one of them: effective/ (the cohort the trainer "
        "learned from; what a folder search reads) or all/ (every arrival, errored episodes included))"], res.output
