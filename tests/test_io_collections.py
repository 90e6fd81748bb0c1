"""Issue 14: whole collections in one run (recursive folders, stray files, collection sources, qualified
ids), NeMo Gym fields, ATIF (exact token ids / re-rendered text, rewards from extra or the verifier),
the format registry, the canonical-table row rules, inputs read once for several critics."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

from critic_audit.cli import app
from critic_audit.errors import InputError, SchemaError
from critic_audit.io import ReadOptions, ReadReport, read_responses, resolve_inputs
from critic_audit.io.formats import FORMAT_CHOICES, FORMATS, format_help
from critic_audit.schema import check_token_rows, token_row_violations
from critic_audit.io.inputs import read_inputs, read_tables

from conftest import DATA, conv, make_tokenizer
from test_io_formats import nemo_record, tokenized_rows, write_jsonl

ATIF = DATA / "atif"
runner = CliRunner()


def _nemo_tree(root: Path) -> Path:
    """A NeMo Gym checkout: every environment writes resources_servers/<env>/data/example_rollouts.jsonl."""
    for env, n in (("tau2", 3), ("sokoban", 2)):
        recs = []
        for i in range(n):
            r = nemo_record(i, 1.0 if i % 2 == 0 else 0.0)
            del r["task_index"]
            r["_ng_task_index"] = i // 2  # NeMo Gym's group field
            recs.append(r)
        (root / "resources_servers" / env / "data").mkdir(parents=True)
        write_jsonl(root / "resources_servers" / env / "data" / "example_rollouts.jsonl", recs)
        # the task inputs beside the rollouts: requests without output items, not rollouts
        write_jsonl(root / "resources_servers" / env / "data" / "example.jsonl",
                    [{"responses_create_params": r["responses_create_params"], "_ng_task_index": 0} for r in recs])
    (root / "resources_servers" / "tau2" / "notes.txt").write_text("todo: more seeds\n")
    (root / "resources_servers" / "sokoban" / "config.json").write_text(json.dumps({"seed": 1, "max_steps": 30}))
    (root / ".git").mkdir()
    (root / ".git" / "HEAD").write_text("ref: refs/heads/main\n")  # hidden: not even counted
    return root


def test_nemo_gym_tree_in_one_run(tmp_path):
    root = _nemo_tree(tmp_path / "Gym")
    rep = ReadReport()
    convs = read_inputs([root], report=rep)
    # environments as sources, ids from the environment (stems collide), sorted walk (sokoban < tau2)
    assert [c.source for c in convs] == ["sokoban"] * 2 + ["tau2"] * 3
    assert [c.trajectory_id for c in convs] == ["sokoban:0", "sokoban:1", "tau2:0", "tau2:1", "tau2:2"]
    # _ng_task_index, per file: task 0 of sokoban is not task 0 of tau2 (issue 34.1); "1" is in one file only
    assert [c.group_id for c in convs] == ["sokoban/0", "sokoban/0", "tau2/0", "tau2/0", "1"]
    assert all("_ng_task_index" not in c.metadata for c in convs)
    assert rep.skipped_files == {"not_rollout_file": 2, "nemo_gym_task_inputs": 2} and rep.skipped == {}
    assert rep.formats == {str(root): "responses"}
    # a task-input file named on its own is refused in one line saying what it is
    with pytest.raises(InputError, match=r"example.jsonl: NeMo Gym task inputs \(requests without a response"):
        read_inputs([root / "resources_servers" / "tau2" / "data" / "example.jsonl"])


def test_stray_files_skipped_without_lenient_and_counted_in_summary(tmp_path, critic_dir):
    root = _nemo_tree(tmp_path / "Gym")
    res = runner.invoke(app, ["analyze", str(root), "--critic", str(critic_dir), "--out", str(tmp_path / "o"),
                              "--json", "--no-plots", "--bootstrap", "20"])
    assert res.exit_code == 0, res.output
    s = json.loads(res.stdout)
    assert s["n_trajectories"] == 5
    assert s["input"]["skipped_files"] == {"not_rollout_file": 2, "nemo_gym_task_inputs": 2}
    assert s["input"]["skipped_total"] == 0
    cfg = json.loads((tmp_path / "o" / "config.json").read_text())
    assert cfg["read_options"]["format"] == "auto" and cfg["read_options"]["lenient"] is False
    assert cfg["read_options"]["request_assistant"] == "context"
    assert cfg["input_files"] == {str(root): {"format": "responses", "kind": "conversations", "files": 2}}
    assert sorted(s["by_source"]) == ["sokoban", "tau2"]
    assert cfg["allow_pickle"] is False and cfg["scoring_cache"]["resume"] is True
    assert cfg["scoring_cache"]["chunk_tokens"] is None and cfg["scoring_cache"]["chunk_seconds"] == 60.0


def test_explicit_ids_colliding_across_files_are_qualified(tmp_path):
    """Two FireAct model files keyed by the same question ids: both models in one run."""
    for model in ("llama", "gpt"):
        (tmp_path / f"{model}.json").write_text(json.dumps({
            str(q): {"traj": conv(q, 1, 1.0)["traj"], "reward": model == "gpt"} for q in (7, 9)}))  # two runs: the
    # same id with the same content in two files would be two copies of one export (refused: test_input_review1)
    convs = read_inputs([tmp_path / "gpt.json", tmp_path / "llama.json"])
    assert [c.trajectory_id for c in convs] == ["gpt/7", "gpt/9", "llama/7", "llama/9"]
    assert [c.source for c in convs] == ["gpt", "gpt", "llama", "llama"]
    assert [c.metadata["id_in_file"] for c in convs] == ["7", "9", "7", "9"]


def test_same_stem_in_one_folder(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps([conv(0, 1, 1.0)["traj"]]))
    (tmp_path / "a.jsonl").write_text(json.dumps({"messages": conv(1, 1, 0.0)["traj"], "reward": 0}) + "\n")
    convs = read_inputs([tmp_path], ReadOptions(require_reward=False))
    assert [c.trajectory_id for c in convs] == ["a.json:0", "a.jsonl:0"]
    assert [c.source for c in convs] == ["a", "a"]


def test_request_assistant_items_are_context_by_default(tmp_path):
    rec = nemo_record(0, 1.0)
    rec["responses_create_params"]["input"] += [
        {"role": "assistant", "content": "Hi! How can I help you today?"},  # tau2's fixed greeting
        {"role": "user", "content": "The weather, please."}]
    p = write_jsonl(tmp_path / "tau2.jsonl", [rec])
    [c] = read_responses(p)
    greeting = c.messages[2]
    assert greeting == {"role": "assistant", "content": "Hi! How can I help you today?", "context": True}
    assert c.num_turns == 2 and c.metadata["context_turns"] == 1  # the output's two turns
    [c2] = read_responses(p, ReadOptions(request_assistant="policy"))
    assert c2.num_turns == 3 and "context" not in c2.messages[2]
    # the tokenizer renders the greeting but gives it no turn: one turn, its tokens are the output's
    from critic_audit.turns import tokenize_conversations

    tok = make_tokenizer()
    [t] = tokenize_conversations([c], tok).conversations
    [t2] = tokenize_conversations([c2], tok).conversations
    assert t.num_turns == 2 and t2.num_turns == 3
    assert len(t.input_ids) == len(t2.input_ids)  # same rendering
    assert int(t.response_mask.sum()) < int(t2.response_mask.sum())
    assert "Hi! How can I help" in tok.decode(t2.input_ids[t2.turn == 0])
    assert "Hi! How can I help" not in tok.decode(t.input_ids[t.response_mask])


# --------------------------------------------------------------------------------------------- registry


def test_format_choices_and_help_derive_from_the_registry():
    assert FORMAT_CHOICES == ("auto", "tokenized", "prime_tokens", "vf_traces", "atif", "openhands", "swe", "inspect", "tau2", "taubench", "verl_rollouts", "areal", "verifiers", "responses",
                              "react", "chat")
    assert "tables" in FORMATS and "tables" not in FORMAT_CHOICES  # detected, not forced
    h = format_help()
    assert all(f"{n} (" in h for n in FORMAT_CHOICES[1:])
    with pytest.raises(Exception, match="unknown input format 'xml'"):
        ReadOptions(format="xml")
    res = runner.invoke(app, ["analyze", "--help"])
    assert "atif" in res.output and "Harbor" in res.output


def test_forced_format_reads_only_rollout_files_of_a_folder(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    write_jsonl(d / "a.jsonl", [nemo_record(0, 1.0)])
    (d / "notes.txt").write_text("x")
    rep = ReadReport()
    convs = read_inputs([d], ReadOptions(format="responses"), report=rep)
    assert len(convs) == 1 and rep.skipped_files == {"not_rollout_file": 1}


# --------------------------------------------------------------------------------------------- atif


def test_atif_job_folder(tmp_path):
    rep = ReadReport()
    [res] = resolve_inputs([ATIF], ReadOptions(), rep)
    kinds = {f.path.parent.parent.name: (f.format, f.kind, f.source) for f in res.files}
    assert kinds == {"trial-1": ("atif", "tables", "job-demo"), "trial-2": ("atif", "conversations", "job-demo")}
    # SOURCE.md and the job's config.json are not trajectories; trial-1's verifier/reward.txt is read as
    # its reward, not counted as a skipped file
    assert rep.skipped_files == {"not_rollout_file": 2}
    assert sorted(Path(p).name for p in rep.skipped_file_examples["not_rollout_file"]) == ["SOURCE.md", "config.json"]
    [c] = read_inputs([ATIF], report=rep)
    assert c.trajectory_id == "sess-0002" and c.source == "job-demo"
    assert (c.reward, c.success, c.group_id) == (0.0, False, "count-files")  # from extra
    assert c.num_turns == 2  # the is_copied_context step is context
    assert [m["role"] for m in c.messages] == ["user", "assistant", "tool", "assistant", "assistant"]
    assert c.messages[1]["content"] == "ls then count\n\nCounting."
    assert c.messages[1]["tool_calls"][0]["function"] == {"name": "bash", "arguments": {"cmd": "ls | wc -l"}}
    assert c.messages[2] == {"role": "tool", "content": "3", "tool_call_id": "call_a"}
    assert c.messages[3]["context"] is True
    assert c.metadata["tokens"] == "re-rendered text (no completion_token_ids)"
    assert rep.notes["atif_rerendered_text: no completion_token_ids"] == 1


def test_atif_exact_token_ids():
    """Step 1: prompt [1, 40, 41], completion [50, 51]; step 2's prompt adds [60, 61], completion
    [70, 71, 72]: the policy tokens are exactly the completions, turn k = agent step k."""
    trajs, tokens, pre = read_tables(ATIF / "job-demo" / "trial-1" / "agent" / "trajectory.json")
    assert tokens["token_id"].to_list() == [1, 40, 41, 50, 51, 60, 61, 70, 71, 72]
    assert tokens["response_mask"].to_list() == [False] * 3 + [True] * 2 + [False] * 2 + [True] * 3
    assert tokens["turn"].to_list() == [None] * 3 + [0, 0] + [None] * 2 + [1, 1, 1]
    [row] = trajs.to_dicts()
    assert (row["trajectory_id"], row["reward"], row["success"], row["num_turns"]) == ("sess-0001", 1.0, True, 2)
    assert row["source"] == "job-demo"
    assert json.loads(row["metadata"])["reward_from"] == "verifier/reward.txt"
    # --token-ids text re-renders the same file
    [c] = read_inputs([ATIF / "job-demo" / "trial-1"], ReadOptions(token_ids="text"))
    assert c.num_turns == 2 and c.metadata["tokens"] == "re-rendered text (token_ids=text)"


def test_atif_ids_that_do_not_chain_are_re_rendered(tmp_path):
    doc = json.loads((ATIF / "job-demo" / "trial-1" / "agent" / "trajectory.json").read_text())
    doc["steps"][3]["metrics"]["prompt_token_ids"] = [1, 99, 41, 50, 51]  # rewrites an earlier token
    p = tmp_path / "t.json"
    p.write_text(json.dumps(doc))
    [res] = resolve_inputs([p])
    assert res.files[0].kind == "conversations"
    [c] = read_inputs([p], ReadOptions(require_reward=False))
    assert c.metadata["tokens"] == "re-rendered text (token ids do not chain)" and c.reward is None


def test_atif_invalid_and_missing_reward(tmp_path):
    doc = json.loads((ATIF / "job-demo" / "trial-2" / "agent" / "trajectory.json").read_text())
    bad = dict(doc, steps=[dict(doc["steps"][0], step_id=2)])
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(bad))
    with pytest.raises(InputError, match=r"bad.json: record 0: not a valid ATIF trajectory: .*step_id=2 is not "
                                         r"sequential"):
        read_inputs([p])
    p.write_text(json.dumps({k: v for k, v in doc.items() if k != "extra"}))
    with pytest.raises(InputError, match="missing reward.*verifier"):
        read_inputs([p])
    rep = ReadReport()
    assert read_inputs([p], ReadOptions(lenient=True), report=rep) == [] and rep.skipped == {"missing_reward": 1}
    labels = tmp_path / "labels.json"
    labels.write_text(json.dumps({"sess-0002": True}))
    [c] = read_inputs([p], ReadOptions(labels=labels))
    assert (c.reward, c.success) == (1.0, True)


def test_token_ids_beyond_the_critic_vocabulary_are_refused(tmp_path, critic_dir):
    doc = json.loads((ATIF / "job-demo" / "trial-1" / "agent" / "trajectory.json").read_text())
    doc["steps"][3]["metrics"]["completion_token_ids"] = [70, 71, 4000]  # the tiny critic has 300 ids
    p = tmp_path / "t.json"
    p.write_text(json.dumps(doc))
    res = runner.invoke(app, ["analyze", str(p), "--critic", str(critic_dir), "--out", str(tmp_path / "o"),
                              "--json", "--no-plots", "--no-reward", "--token-ids", "trust"])
    assert res.exit_code == 1  # trusted as they are: refused in one line
    out = " ".join(res.output.split())
    assert "token id 4000 at position" in out and "outside the critic's vocabulary [0, 300)" in out
    assert str(p) in out and "--token-ids text" in out
    # by default the ids are verified first: not the critic's, so the file's text is re-rendered (issue 35.2)
    res = runner.invoke(app, ["analyze", str(p), "--critic", str(critic_dir), "--out", str(tmp_path / "o2"),
                              "--json", "--no-plots", "--no-reward"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["inference"]["token_ids"]["out_of_vocabulary"] == 1


def test_analyze_atif_job_scores_exact_tokens(tmp_path, critic_dir):
    # the file's ids are synthetic (1, 40, 41, ...): verified against the critic's tokenizer they do not
    # decode to the text and are re-rendered (issue 35.2); --token-ids trust scores them as they are
    res = runner.invoke(app, ["analyze", str(ATIF), "--critic", str(critic_dir), "--out", str(tmp_path / "v"),
                              "--json", "--no-plots", "--bootstrap", "20"])
    assert res.exit_code == 0, res.output
    ids = json.loads(res.stdout)["inference"]["token_ids"]
    assert (ids["checked"], ids["verified"], ids["rerendered"], ids["text_mismatch"]) == (1, 0, 1, 1)
    res = runner.invoke(app, ["analyze", str(ATIF), "--critic", str(critic_dir), "--out", str(tmp_path / "o"),
                              "--json", "--no-plots", "--bootstrap", "20", "--token-ids", "trust"])
    assert res.exit_code == 0, res.output
    s = json.loads(res.stdout)
    assert s["n_trajectories"] == 2
    assert any(w.startswith("1 ATIF trajectory file(s) were scored on the policy's own token ids") for w in s["warnings"])
    assert any(w.startswith("1 ATIF trajectory file(s) carry no usable token ids") for w in s["warnings"])
    assert s["input"]["notes"] == {"atif_exact_token_ids": 1, "atif_rerendered_text: no completion_token_ids": 1}
    tokens = pl.read_parquet(tmp_path / "o" / "tokens.parquet").filter(pl.col("trajectory_id") == "sess-0001")
    assert tokens["token_id"].to_list() == [1, 40, 41, 50, 51, 60, 61, 70, 71, 72]
    assert tokens.filter(pl.col("response_mask"))["value"].null_count() == 0


# --------------------------------------------------------------------------------------------- tables


def _tokens(turns: list, mask: list) -> pl.DataFrame:
    n = len(turns)
    return pl.DataFrame({"trajectory_id": ["a"] * n, "position": list(range(n)), "token_id": [1] * n,
                         "role": [None] * n, "turn": turns, "response_mask": mask, "value": [None] * n},
                        schema_overrides={"turn": pl.Int32, "value": pl.Float32})


def test_token_row_rules():
    ok = _tokens([None, 0, 0, None, 1], [False, True, True, False, True])
    assert token_row_violations(ok) == {}
    bad = _tokens([None, 0, None, 1, 0, 0], [False, True, True, True, True, True])
    assert token_row_violations(bad) == {
        "policy_token_without_turn": (1, "trajectory 'a' position 2"),
        "turn_reappears": (1, "trajectory 'a' turn 0 again at position 4"),
    }
    with pytest.raises(SchemaError, match=r"breaks 2 row rule\(s\): policy_token_without_turn: 1 .*turn_reappears: 1"):
        check_token_rows(bad, path="x/tokens.parquet")


def test_canonical_table_with_a_reappearing_turn_is_an_error(tmp_path):
    """Audited before as n_turns = 4 with only a numpy warning."""
    d = tmp_path / "t"
    d.mkdir()
    _tokens([None, 0, 1, 0, 1], [False, True, True, True, True]).write_parquet(d / "tokens.parquet")
    with pytest.raises(SchemaError, match="turn_reappears: 2 .*first: trajectory 'a' turn 0 again at position 3"):
        read_tables(d)


def test_lenient_skips_counted_once_with_two_critics(tmp_path, critic_dir):
    rows = tokenized_rows(3, values=False)
    rows[1]["response_mask"] = rows[1]["response_mask"][:-1]  # length_mismatch
    p = write_jsonl(tmp_path / "rows.jsonl", rows)
    c2 = tmp_path / "critic2"
    shutil.copytree(critic_dir, c2)
    res = runner.invoke(app, ["analyze", str(p), "--critic", str(critic_dir), "--critic", str(c2), "--lenient",
                              "--out", str(tmp_path / "o"), "--json", "--no-plots", "--bootstrap", "20"])
    assert res.exit_code == 0, res.output
    s = json.loads(res.stdout)
    assert s["input"]["skipped"] == {"length_mismatch": 1}


def test_a_corrupt_jsonl_in_a_folder_is_an_error_and_lenient_skips_and_counts_the_file(tmp_path):
    d = tmp_path / "runs"
    d.mkdir()
    write_jsonl(d / "good.jsonl", [conv(i, 2, 1.0) for i in range(3)])
    (d / "broken.jsonl").write_bytes(b"\xff\xfe\x00junk\x81\x82 not json\n")
    (d / "empty.jsonl").write_text("")  # empty: no rollout file, skipped as such
    with pytest.raises(InputError, match=r"broken\.jsonl: not UTF-8 text \(in its first line"):
        read_inputs([d])
    rep = ReadReport()
    convs = read_inputs([d], ReadOptions(lenient=True), report=rep)
    assert len(convs) == 3
    assert dict(rep.skipped_files) == {"unreadable_file": 1, "not_rollout_file": 1}
    assert not rep.skipped  # the file is counted once, as a file


def test_token_id_tables_from_two_jobs_with_the_same_ids_are_qualified(tmp_path, critic_dir):
    root = tmp_path / "atif2"
    for job in ("jobA", "jobB"):
        shutil.copytree(ATIF / "job-demo", root / job)
    # two byte-identical jobs are two copies of one export: refused, or under --lenient each rollout audited
    # once (jobB's copies dropped and counted; jobA's keep their own ids: no other kept file shares them)
    res = runner.invoke(app, ["analyze", str(root), "--critic", str(critic_dir), "--out", str(tmp_path / "o"),
                              "--no-plots", "--no-reward", "--lenient"])
    assert res.exit_code == 0, res.output
    assert "2 trajectories repeat another file's id and content" in res.output
    trajs = pl.read_parquet(tmp_path / "o" / "trajectories.parquet")
    ids = trajs["trajectory_id"].to_list()
    assert len(ids) == len(set(ids)) == 2
    assert trajs["source"].to_list() == ["jobA", "jobA"]
    assert not any(i.startswith(("jobA/", "jobB/")) for i in ids)
    # check reads the same tree the same way
    from critic_audit.check import load_rollouts

    got = sorted(r.trajectory_id for r in load_rollouts([root], read_options=ReadOptions(require_reward=False,
                                                                                         lenient=True)))
    assert got == sorted(ids)
    with pytest.raises(InputError, match="has the same id and content as in"):
        load_rollouts([root])
