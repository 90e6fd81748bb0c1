"""Defects of the second fresh-eyes review (docs/../review2 items 6, 12, 18, 19) in ``critic-audit check``,
each pinned by a hand-built case with its exact outcome."""
from __future__ import annotations

import json

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
