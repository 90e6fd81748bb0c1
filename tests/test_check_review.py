"""Defects a fresh-eyes review of ``critic-audit check`` found, each pinned by a hand-computed case."""
from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from critic_audit.check import check_rollouts
from critic_audit.errors import InputError
from critic_audit.io.records import ReadOptions, ReadReport
from critic_audit.io.tokenized import read_tokenized

_ROW = {"input_ids": [1, 2, 3], "response_mask": [0, 1, 1], "reward": 1}


@pytest.mark.parametrize("bad, text, shown", [("NaN", "nan", float("nan")), ("Infinity", "inf", float("inf")),
                                              ("1e400", "inf", float("inf")), ("-Infinity", "-inf", float("-inf"))])
def test_a_nonfinite_per_token_reward_beside_a_scalar_reward_is_refused(tmp_path, bad, text, shown):
    """token_level_rewards [0, 0, NaN] beside reward 1 was read as [0, 0, 0]: reward_on_masked_token
    passed and turn_rewards_sum failed ("sum to 0, the outcome is 1"). Strict: one line naming the
    field and index 2; lenient: the row skipped (bad_values) and the finite one checked. Row path
    (JSONL) and column path (Parquet) alike."""
    f = tmp_path / "rows.jsonl"
    f.write_text('{"id": "a", "input_ids": [1,2,3], "response_mask": [0,1,1], "reward": 1, '
                 f'"token_level_rewards": [0, 0, {bad}]}}\n'
                 + json.dumps({"id": "b", **_ROW, "token_level_rewards": [0, 0, 1]}) + "\n")
    rows = [{"id": "a", **_ROW, "token_level_rewards": [0.0, 0.0, shown]},
            {"id": "b", **_ROW, "token_level_rewards": [0.0, 0.0, 1.0]}]
    p = tmp_path / "rows.parquet"
    pq.write_table(pa.Table.from_pylist(rows), p)
    for path in (f, p):
        with pytest.raises(InputError, match=rf"record 0\b.*token_level_rewards\[2\] = {text} is not a finite number"):
            check_rollouts([path])
        with pytest.raises(InputError, match=rf"token_level_rewards\[2\] = {text} is not a finite number"):
            read_tokenized(path)
        report = check_rollouts([path], read_options=ReadOptions(lenient=True))
        sums = next(c for c in report.checks if c.id == "turn_rewards_sum")
        assert report.n_trajectories == 1 and sums.status == "pass", sums
        rep = ReadReport()
        trajs, _ = read_tokenized(path, ReadOptions(lenient=True), rep)
        assert trajs["trajectory_id"].to_list() == ["b"] and rep.skipped == {"bad_values": 1}


def test_a_mask_only_defect_is_not_a_boundary_or_retokenization_failure(tokenizer):
    """Ids identical to the template's rendering, the mask of assistant turn 1 (of 3) set to 0: the ids
    at every boundary are the template's, so turn_boundary_tokens and retokenization pass (3 turns
    compared, located by their ids); untrained_turns names the unmasked turn. Before: 'extra' boundary
    tokens and 'the mask has 2 turns, the messages render 3'."""
    import numpy as np

    from conftest import conv
    from critic_audit.check import CheckRollout, run_checks
    from critic_audit.schema import Conversation
    from critic_audit.turns import ChatRenderer

    msgs = conv(0, 3, 1.0)["traj"]
    tc = ChatRenderer(tokenizer).tokenize(Conversation("x", msgs))
    ids, mask = tc.input_ids.astype(np.int64), tc.response_mask.astype(bool)
    starts = np.flatnonzero(mask & ~np.concatenate([[False], mask[:-1]]))
    assert len(starts) == 3
    off = mask.copy()
    run = np.flatnonzero(mask)[np.flatnonzero(mask) >= starts[1]]
    off[run[run < starts[2]]] = False
    r = CheckRollout("m", token_ids=ids, response_mask=off, messages=msgs, reward=1.0)
    got = {c.id: c for c in run_checks([r], tokenizer=tokenizer).checks}
    assert got["turn_boundary_tokens"].status == "pass", got["turn_boundary_tokens"].summary
    assert got["turn_boundary_tokens"].counts["turns_checked"] == 3
    assert got["retokenization"].status == "pass", got["retokenization"].summary
    assert got["retokenization"].counts["turns_checked"] == 3
    assert "fail" in {got["untrained_turns"].status, got["mask_boundaries"].status} \
        or "warn" in {got["untrained_turns"].status, got["mask_boundaries"].status}


def test_a_turn_reward_series_or_flag_of_the_wrong_type_is_named_or_skipped(tmp_path):
    """turn_rewards ["a"] was ignored (turn_rewards_sum skipped) and truncated "maybe" read as unknown.
    Strict: one line naming the record and field; lenient: both skipped (bad_field) and the third
    record checked (its series [1] sums to its reward 1: pass). Chat and token rows alike."""
    msgs = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "x"}]
    f = tmp_path / "chat.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in (
        {"id": "a", "messages": msgs, "reward": 1, "turn_rewards": ["a"]},
        {"id": "b", "messages": msgs, "reward": 1, "truncated": "maybe"},
        {"id": "c", "messages": msgs, "reward": 1, "turn_rewards": [1]})))
    with pytest.raises(InputError, match=r"record 0 .*'a': turn_rewards is \['a'\], not a list of numbers"):
        check_rollouts([f])
    rep = ReadReport()
    from critic_audit.check.data import load_rollouts

    got = load_rollouts([f], read_options=ReadOptions(lenient=True, require_reward=False), report=rep)
    assert [r.trajectory_id for r in got] == ["c"] and rep.skipped == {"bad_field": 2}
    report = check_rollouts([f], read_options=ReadOptions(lenient=True, require_reward=False))
    assert next(c for c in report.checks if c.id == "turn_rewards_sum").status == "pass"
    t = tmp_path / "tok.jsonl"
    t.write_text(json.dumps({"id": "t", **_ROW, "truncated": "maybe"}) + "\n")
    u = tmp_path / "tok2.jsonl"  # its own file: the JSONL reader reads a mixed-type column as strings
    u.write_text(json.dumps({"id": "u", **_ROW, "truncated": True}) + "\n")
    with pytest.raises(InputError, match=r"record t: trajectory 't': truncated is 'maybe', not true / false"):
        check_rollouts([t])
    rep = ReadReport()
    got = load_rollouts([t, u], read_options=ReadOptions(lenient=True, require_reward=False), report=rep)
    assert [(r.trajectory_id, r.truncated) for r in got] == [("u", True)] and rep.skipped == {"bad_field": 1}


def test_tau2_termination_reason_sets_the_truncation_and_termination_flags(tmp_path):
    """tau2's TerminationReason (tau2/data_model/simulation.py: user_stop, agent_stop, max_steps,
    too_many_errors): max_steps / too_many_errors is a cut (truncated), agent / user stop an end
    (terminated). The 4 simulations of the telecom subset, two of them rewritten as cut: truncation
    warns on exactly those 2 of 4; before, max_steps was read as no flag at all."""
    from conftest import DATA
    from critic_audit.check.data import load_rollouts

    doc = json.loads((DATA / "tau2" / "telecom_gpt-4o_subset.json").read_text())
    sims = doc["simulations"]
    sims[0]["termination_reason"], sims[1]["termination_reason"] = "max_steps", "too_many_errors"
    sims[2]["termination_reason"] = "agent_stop"
    f = tmp_path / "results.json"
    f.write_text(json.dumps(doc))
    got = {r.trajectory_id: (r.truncated, r.terminated) for r in load_rollouts([f])}
    assert [got[s["id"]] for s in sims] == [(True, False), (True, False), (False, True), (False, True)]
    c = next(c for c in check_rollouts([f]).checks if c.id == "truncation")
    assert c.status == "warn" and c.counts["trajectories"] == 2 and c.counts["trajectories_checked"] == 4


def _lp_rollout(tid, sampler, trainer):
    import numpy as np

    from critic_audit.check import CheckRollout

    mask = np.array([0, 1, 1, 0, 1, 1], dtype=bool)
    return CheckRollout(tid, token_ids=np.arange(1, 7), response_mask=mask, reward=1.0,
                        sampler_log_probs=np.array(sampler, dtype=np.float64),
                        trainer_log_probs=np.array(trainer, dtype=np.float64))


def test_a_turn_of_zero_sampler_log_probs_is_missing_in_logprob_mismatch_too():
    """Turn 1's sampler log-probs are all 0.0 (verl's fill): untrained_turns names it; logprob_mismatch
    used to compare them (delta -1 and -2: max |delta| 2, k3 = (e^-1 - 1 + 1 + e^-2 - 1 + 2) / 4 = 0.41);
    now the turn is missing (2 tokens, 1 turn), the 2 tokens of turn 0 agree exactly (k3 0, |delta| 0),
    and the warning says why."""
    from critic_audit.check import run_checks

    r = _lp_rollout("z", [0, -0.5, -0.2, 0, 0.0, 0.0], [0, -0.5, -0.2, 0, -1.0, -2.0])
    got = {c.id: c for c in run_checks([r]).checks}
    c = got["logprob_mismatch"]
    assert c.counts["tokens_checked"] == 2 and c.counts["tokens_missing"] == 2
    assert c.counts["turns_without_sampler_log_probs"] == 1
    assert c.measured["max_abs_delta"] == 0.0 and c.measured["k3_token_mean"] == 0.0
    assert c.status == "warn" and "warn: 2 policy token(s) lack a finite log-prob on either side, 1 turn(s) with " \
        "every sampler log-prob exactly 0.0" in c.summary
    assert got["untrained_turns"].status != "pass"
    # a single 0.0 on a 1-token turn may be real: compared (the rule untrained_turns applies)
    one = _lp_rollout("o", [0, -0.5, -0.2, 0, 0.0, -0.1], [0, -0.5, -0.2, 0, -0.3, -0.1])
    assert next(c for c in run_checks([one]).checks if c.id == "logprob_mismatch").counts["tokens_checked"] == 4


def test_a_logprob_mismatch_warning_names_its_reason():
    """prime-rl: mean k3 3e-05 and max |delta| 0.01 (both under the thresholds) warned with no word of
    why: one sampler entry NaN (tokens_missing 1). The summary now says it."""
    from critic_audit.check import run_checks

    r = _lp_rollout("p", [0, -0.5, float("nan"), 0, -0.3, -0.1], [0, -0.5, -0.2, 0, -0.3, -0.11])
    c = next(c for c in run_checks([r]).checks if c.id == "logprob_mismatch")
    assert c.counts["tokens_missing"] == 1 and c.counts["tokens_checked"] == 3
    assert c.status == "warn" and c.summary.endswith("; warn: 1 policy token(s) lack a finite log-prob on either side")


def test_an_end_token_doubled_right_after_the_turns_own_is_doubled(tokenizer):
    """A second <|im_end|> right after turn 0's own (mask 0): the context before turn 1 starts with it,
    so the repeat sits across the turn's edge; it was reported 'extra'."""
    import numpy as np

    from conftest import conv
    from critic_audit.check import CheckRollout, run_checks
    from critic_audit.check.boundaries import boundary_diff
    from critic_audit.schema import Conversation
    from critic_audit.turns import ChatRenderer

    assert boundary_diff(np.array([7, 9, 5]), np.array([9, 5]), frozenset({7}), np.array([4, 7])) == ("doubled", 0, [7])
    assert boundary_diff(np.array([7, 9, 5]), np.array([9, 5]), frozenset({7}), np.array([4, 8])) == ("extra", 0, [7])
    msgs = conv(0, 3, 1.0)["traj"]
    tc = ChatRenderer(tokenizer).tokenize(Conversation("x", msgs))
    ids, mask = tc.input_ids.astype(np.int64), tc.response_mask.astype(bool)
    e = int(np.flatnonzero(mask[:-1] & ~mask[1:])[0])  # turn 0's last token, its <|im_end|>
    assert tokenizer.decode([int(ids[e])]) == "<|im_end|>"
    r = CheckRollout("d", token_ids=np.insert(ids, e + 1, ids[e]), response_mask=np.insert(mask, e + 1, False),
                     messages=msgs)
    c = next(c for c in run_checks([r], tokenizer=tokenizer).checks if c.id == "turn_boundary_tokens")
    assert c.counts["boundaries_doubled"] == 1 and c.counts["boundaries_extra"] == 0
    assert [(x.turn, x.position) for x in c.examples] == [(1, e + 1)]


def test_wording_of_a_clean_ending_and_of_a_bad_examples_option(tmp_path):
    """'(0 of 1 token rows end on one, all flagged)' when no row ends on an observation; 'examples = -1
    must be >= 0' unlike the other option errors ('--max-turn-tokens -1 must be >= 1')."""
    from typer.testing import CliRunner

    from critic_audit.check import CheckConfig
    from critic_audit.cli import app
    from critic_audit.errors import UsageError

    f = tmp_path / "rows.jsonl"
    f.write_text(json.dumps({"id": "a", **_ROW}) + "\n")
    c = next(c for c in check_rollouts([f]).checks if c.id == "ends_on_observation")
    assert c.summary == "no unflagged rollout ends on an observation (none of 1 token rows ends on one)"
    with pytest.raises(UsageError, match=r"^--examples -1 must be >= 0 \(fix: use e.g. --examples 5\)$"):  # review 2 #16
        CheckConfig(examples=-1)
    res = CliRunner().invoke(app, ["check", "--examples", "-1", str(f)])
    assert res.exit_code == 2 and "--examples -1 must be >= 0" in res.output


def test_no_transformers_or_torch_warning_on_stderr(tmp_path, tokenizer, capfd):
    """--tokenizer: a BPE tokenizer saved with clean_up_tokenization_spaces true made every decode warn
    (transformers ignores the clean-up for BPE): it is loaded with the flag false, the text unchanged.
    --policy: read-only id arrays (Arrow views) made torch warn 'The given NumPy array is not writable'."""
    import warnings

    import numpy as np

    from conftest import make_critic_dir
    from critic_audit.check import _load_tokenizer
    from critic_audit.check.policy import load_policy, policy_log_probs

    d = tmp_path / "tok"
    tokenizer.save_pretrained(d)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    (d / "tokenizer_config.json").write_text(json.dumps({**cfg, "clean_up_tokenization_spaces": True}))
    tok = _load_tokenizer(d, False)
    assert tok.clean_up_tokenization_spaces is False
    ids = tokenizer("a , b .")["input_ids"]
    assert tok.decode(ids) == tokenizer.decode(ids, clean_up_tokenization_spaces=False) == "a , b ."
    assert "clean_up_tokenization_spaces" not in capfd.readouterr().err
    model, _, dev = load_policy(make_critic_dir(tmp_path / "policy", with_head=False), device="cpu", dtype="float32")
    seq = np.array([1, 40, 41, 42])
    seq.setflags(write=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lp = policy_log_probs(model, dev, [seq])
    assert np.isnan(lp[0][0]) and np.isfinite(lp[0][1:]).all() and (lp[0][1:] < 0).all()
