"""Defects of the second fresh-eyes review (docs/../review2 items 6, 12, 18, 19) in ``critic-audit check``,
each pinned by a hand-built case with its exact outcome."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest
from typer.testing import CliRunner

from critic_audit.check import check_rollouts
from critic_audit.cli import app
from critic_audit.errors import InputError
from critic_audit.io.records import ReadOptions


def _chat(tmp_path, name="chat.jsonl", drop=None, null=None):
    """8 chat rollouts, rewards 0, 1, 0, 1, ...; ``drop``: the record index without a reward field,
    ``null``: the index whose reward is null."""
    recs = []
    for i in range(8):
        r = {"id": f"t{i}", "group": f"g{i // 4}", "messages": [{"role": "user", "content": "q"},
                                                              {"role": "assistant", "content": f"a{i}"}],
             "reward": float(i % 2)}
        if i == drop:
            del r["reward"]
        if i == null:
            r["reward"] = None
        recs.append(r)
    p = tmp_path / name
    p.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return p


def check_opts(**kw):
    return ReadOptions(require_reward=False, **kw)


# ------------------------------------------------------------------------------------------ #6 rewards


def test_a_reward_key_no_record_has_is_an_error(tmp_path):
    p = _chat(tmp_path)
    with pytest.raises(InputError) as e:
        check_rollouts([p], read_options=check_opts(reward_key="typo"))
    msg = str(e.value)
    assert msg.startswith(f"{p}: missing reward: none of the 8 rollouts has a field 'typo' (or it is null in every one)")
    assert "--reward-key typo names a field no record has" in msg
    with pytest.raises(InputError, match="none of the 8 rollouts has a field 'typo'"):  # --lenient would skip all: still an error
        check_rollouts([p], read_options=check_opts(reward_key="typo", lenient=True))
    res = CliRunner().invoke(app, ["check", str(p), "--reward-key", "typo"])
    assert res.exit_code == 1 and "has a field 'typo'" in res.output and "Traceback" not in res.output
    assert check_rollouts([p], read_options=check_opts(reward_key="reward")).status == "pass"


@pytest.mark.parametrize("drop, null, said", [(5, None, "chat.jsonl: record 5 (line 6): missing reward: no non-null field any "
                                                        "of ['reward', 'score'"), (None, 2, "chat.jsonl: record 2 (line 3)")])
def test_a_record_without_a_reward_among_rewarded_ones_fails_as_in_analyze(tmp_path, drop, null, said):
    p = _chat(tmp_path, drop=drop, null=null)
    with pytest.raises(InputError) as e:
        check_rollouts([p])
    assert str(e.value).startswith(said) and "while 7 of the 8 rollouts of 'chat' have one" in str(e.value)
    rep = check_rollouts([p], read_options=check_opts(lenient=True))  # --lenient: skipped and counted
    assert rep.n_trajectories == 7 and rep.input["skipped"] == {"missing_reward": 1}
    assert "1 of 8 rollouts have no reward beside rewarded ones of their file: skipped (--lenient)" in rep.notes
    res = CliRunner().invoke(app, ["check", str(p)])
    assert res.exit_code == 1 and said in res.output and "Traceback" not in res.output


def test_rollouts_with_no_reward_at_all_are_checked_with_a_note(tmp_path):
    p = tmp_path / "none.jsonl"
    p.write_text("".join(json.dumps({"id": f"t{i}", "messages": [{"role": "user", "content": "q"},
                                                                 {"role": "assistant", "content": "a"}]}) + "\n"
                         for i in range(4)))
    rep = check_rollouts([p])
    assert rep.n_trajectories == 4
    assert "4 of 4 rollouts carry no reward (no field any of ['reward', 'score', 'return', 'outcome_reward']; none): " \
        "the reward checks read the other 0" in rep.notes


def test_a_file_without_rewards_beside_rewarded_ones_is_kept_with_a_note():
    """prime-rl's token exports dropped their rewards column (tests/data/prime_rl: step 3, 4 rows); the
    older exports beside them carry one: the 4 are checked, noted, not an error."""
    from conftest import DATA

    rep = check_rollouts([DATA / "prime_rl"])
    assert rep.n_trajectories == 12
    assert any(n.startswith("4 of 12 rollouts carry no reward (no field any of") and "outputs)" in n
               and n.endswith("read the other 8") for n in rep.notes)


# ------------------------------------------------------------------------------------------ #18 skipped files


def test_a_folder_without_rollout_files_names_the_files_it_skipped(tmp_path):
    from conftest import SAMPLE

    res = CliRunner().invoke(app, ["check", str(SAMPLE / "hotpotqa_distractor_rl")])
    assert res.exit_code == 1
    line = " ".join(res.output.split())  # rich wraps the line
    assert ("the folder holds no rollout file (3 other file(s) skipped: hotpotqa_distractor_sample100.jsonl "
            "(not_rollout_file, record-like rows), LICENSE (not_rollout_file), SOURCE.md (not_rollout_file))") in line
    assert "pick it with --format" in line
    # five skipped files: the first three named (record-like rows first, then by name) and the count of the rest
    sub = tmp_path / "d"
    sub.mkdir()
    for name in ("a.txt", "b.txt", "c.txt", "d.txt"):
        (sub / name).write_text("x")
    (tmp_path / "rows.jsonl").write_text('{"question": "q", "answer": "a"}\n')
    with pytest.raises(InputError) as e:
        check_rollouts([tmp_path])
    msg = str(e.value)
    assert "(5 other file(s) skipped: rows.jsonl (" in msg and "record-like rows), d/a.txt (" in msg
    assert "d/b.txt (" in msg and "and 2 more)" in msg and "d/c.txt" not in msg


# ------------------------------------------------------------------------------------------ #12 verl layout


def _verl_batch():
    """Two rows in verl's DataProto layout: prompts [2, 3] (left-padded with id 0), responses [2, 6]
    (right-padded with 0), input_ids = prompts + responses, attention_mask over all 9, response_mask over
    the 6 response tokens (0 on the tool tokens 40, 41 and the padding), values and token rewards over
    the responses."""
    prompts = np.array([[0, 11, 12], [13, 14, 15]])
    responses = np.array([[21, 22, 40, 41, 23, 0], [24, 25, 26, 0, 0, 0]])
    resp_att = (responses != 0).astype(np.int64)
    response_mask = np.array([[1, 1, 0, 0, 1, 0], [1, 1, 1, 0, 0, 0]])
    values = np.array([[.1, .2, .3, .4, .5, 0.], [.6, .7, .8, 0., 0., 0.]])
    rewards = np.zeros((2, 6))
    rewards[0, 4], rewards[1, 2] = 1.0, 0.5
    return {"prompts": prompts, "responses": responses, "input_ids": np.concatenate([prompts, responses], 1),
            "attention_mask": np.concatenate([(prompts != 0).astype(np.int64), resp_att], 1),
            "response_mask": response_mask, "values": values, "token_level_rewards": rewards}


def _verl_rows(batch, drop=()):
    return [{"trajectory_id": f"r{i}", **{k: v[i].tolist() for k, v in batch.items() if k not in drop}}
            for i in range(2)]


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl"])
@pytest.mark.parametrize("drop", [(), ("prompts",), ("responses",)])
def test_verl_dataproto_layout_is_read_as_dump_verl_batch_reads_it(tmp_path, suffix, drop):
    """review 2 #12: response_mask (and values, token rewards) over the R response tokens beside input_ids
    of P + R was refused ("response_mask has 6 entries, input_ids 9"); read now exactly as dump_verl_batch
    writes the same batch: same ids, mask, values and rewards, column-wise (Parquet, JSONL) and row by row."""
    import polars as pl
    import pyarrow as pa
    import pyarrow.parquet as pq

    from critic_audit.io.tokenized import read_tokenized
    from critic_audit.io.verl_dump import dump_verl_batch

    batch = _verl_batch()
    rows = _verl_rows(batch, drop)
    f = tmp_path / f"rows{suffix}"
    if suffix == ".parquet":
        pq.write_table(pa.Table.from_pylist(rows), f)
    else:
        f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    traj, tok = read_tokenized(f)
    ref_traj, ref_tok = (pl.read_parquet(x) for x in dump_verl_batch(batch, tmp_path / "dump", step=0))
    cols = ["token_id", "response_mask", "value"]
    assert tok.select(cols).equals(ref_tok.sort("trajectory_id", "position").select(cols))
    assert traj["reward"].to_list() == ref_traj.sort("trajectory_id")["reward"].to_list() == [1.0, 0.5]
    # hand-computed: row 0 keeps 11 12 | 21 22 40 41 23 (8 tokens), policy tokens 21 22 and 23
    r0 = tok.filter(pl.col("trajectory_id") == "r0")
    assert r0["token_id"].to_list() == [11, 12, 21, 22, 40, 41, 23]
    assert r0["response_mask"].to_list() == [False, False, True, True, False, False, True]
    assert r0.filter(pl.col("response_mask"))["value"].to_list() == pytest.approx([.1, .2, .5])
    rep = check_rollouts([f])
    assert rep.n_trajectories == 2
    sums = next(c for c in rep.checks if c.id == "reward_on_masked_token")
    assert sums.status == "pass", sums


def test_a_short_response_mask_without_prompts_or_responses_is_still_refused(tmp_path):
    batch = _verl_batch()
    f = tmp_path / "rows.jsonl"
    rows = _verl_rows(batch, ("prompts", "responses"))
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(InputError, match=r"record 0 .*response_mask has 6 entries, input_ids 9"):
        check_rollouts([f])
    rows[0]["responses"] = [9] * 6  # responses that are not input_ids' last 6: not the verl layout
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(InputError, match=r"response_mask has 6 entries, input_ids 9"):
        check_rollouts([f])


# ------------------------------------------------------------------------------------------ #11 README


def test_readme_first_screen_has_the_cheap_command_and_the_two_required_ones():
    """review 2 #11: the first screen (the first 25 lines) holds the pip install line with the CPU torch
    wheel the set-up script installs, the seconds-long analyze of the shipped PPO run, demo.sh and test.sh."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    first = "\n".join((root / "README.md").read_text().splitlines()[:25])
    pin = re.search(r"pip install -q (torch==[\d.]+)", (root / "scripts" / "setup.sh").read_text()).group(1)
    assert f"pip install {pin} && pip install -e ." in first
    assert "\ncritic-audit analyze sample_data/credit_ppo_run/rollouts --out audit_trained\n" in first
    assert "\nbash scripts/demo.sh" in first and "\nbash scripts/test.sh" in first
