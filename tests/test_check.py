"""``critic-audit check``: every check on a hand-built rollout with the bug and one without, with the
counts, examples and figures computed by hand; the readers' per-token side arrays; the CLI."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from critic_audit.check import CheckConfig, CheckRollout, check_rollouts, check_verl_batch, run_checks
from critic_audit.check.markers import expected_turns, turn_markers
from critic_audit.cli import app
from critic_audit.schema import Conversation
from critic_audit.turns import ChatRenderer
from conftest import conv

runner = CliRunner()


def by_id(report, check_id):
    return next(c for c in report.checks if c.id == check_id)


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def row(tid, mask, *, reward=1.0, ids=None, **extra):
    """A verl-style sequence row: ids 10, 11, ... unless given."""
    n = len(mask)
    return {"trajectory_id": tid, "input_ids": ids if ids is not None else list(range(10, 10 + n)),
            "response_mask": mask, "reward": reward, **extra}


def rendered(tokenizer, turns=3, i=0):
    """A conversation rendered with the ChatML template: (messages, ids, template mask)."""
    msgs = conv(i, turns, 1.0)["traj"]
    tc = ChatRenderer(tokenizer).tokenize(Conversation(f"r{i}", msgs))
    return msgs, tc.input_ids.astype(np.int64), tc.response_mask.copy()


def rollout(tid, ids, mask, **kw):
    return CheckRollout(tid, token_ids=np.asarray(ids, dtype=np.int64), response_mask=np.asarray(mask, dtype=bool), **kw)


# ----------------------------------------------------------------------------------------------- rewards

MASK = [0, 0, 1, 1, 0, 0, 1, 1]  # turn 0 = positions 2-3, tool text 4-5, turn 1 = 6-7


def test_reward_on_masked_token_from_tokenized_rows(tmp_path):
    bad = [0, 0, 0, 0, 0, 1.0, 0, 0]  # on the tool token two after turn 0 ends (miles #1827)
    good = [0, 0, 0, 0, 0, 0, 0, 1.0]
    p = write_jsonl(tmp_path / "rows.jsonl", [row("bad", MASK, token_level_rewards=bad),
                                              row("good", MASK, token_level_rewards=good)])
    c = by_id(check_rollouts([p]), "reward_on_masked_token")
    assert c.status == "fail"
    assert c.counts == {"trajectories_checked": 2, "trajectories": 1, "tokens": 1, "on_padding": 0}
    assert c.measured["share_of_reward_mass"] == pytest.approx(0.5)
    e = c.examples[0]
    assert (e.trajectory_id, e.turn, e.position) == ("bad", 0, 5)
    assert "2 token(s) after turn 0 ends" in e.detail

    p2 = write_jsonl(tmp_path / "ok.jsonl", [row("good", MASK, token_level_rewards=good)])
    assert by_id(check_rollouts([p2]), "reward_on_masked_token").status == "pass"


def test_the_reader_keeps_reward_positions_and_counts_padding(tmp_path):
    """io side arrays: the tables sum the rewards; TokenSequence.token_arrays keeps where they sit."""
    from critic_audit.io import iter_tokenized

    rec = row("a", MASK, reward=[0, 0, 0, 0, 0, 0.5, 0, 0.5], attention_mask=[1] * 7 + [0],
              rollout_log_probs=[-0.5] * 8)
    p = write_jsonl(tmp_path / "rows.jsonl", [rec])
    (seq,) = list(iter_tokenized(p))
    assert seq.reward == 1.0  # the row's sum, as before
    np.testing.assert_array_equal(seq.token_arrays["token_rewards"], [0, 0, 0, 0, 0, 0.5, 0])
    assert seq.metadata["rewards_on_padding"] == 1 and seq.metadata["token_rewards_field"] == "reward"
    assert len(seq.token_arrays["rollout_log_probs"]) == 7 and "rollout_log_probs" not in seq.metadata
    c = by_id(check_rollouts([p]), "reward_on_masked_token")
    assert (c.status, c.counts["tokens"], c.counts["on_padding"]) == ("fail", 1, 1)


def test_reward_on_masked_token_through_a_verl_dump(tmp_path):
    """dump_verl_batch keeps token_level_rewards per position in its side file; check reads it."""
    import torch

    from critic_audit.io.verl_dump import dump_verl_batch, side_file

    rewards = torch.zeros(2, 6)
    rewards[0, 5] = 1.0  # row 0: on the trailing tool token (response ends with a masked observation)
    rewards[1, 4] = 1.0  # row 1: on its last policy token
    batch = {"prompts": torch.tensor([[5, 6], [5, 6]]), "responses": torch.arange(12).reshape(2, 6) + 20,
             "response_mask": torch.tensor([[1, 1, 0, 0, 1, 0], [1, 1, 0, 0, 1, 0]]), "token_level_rewards": rewards,
             "uid": np.array(["u", "u"], dtype=object)}
    dump_verl_batch(batch, tmp_path / "dump", step=3)
    assert side_file(tmp_path / "dump", 3).exists()
    rep = check_rollouts([tmp_path / "dump"])
    c = by_id(rep, "reward_on_masked_token")
    assert c.status == "fail" and c.counts["tokens"] == 1
    assert (c.examples[0].trajectory_id, c.examples[0].turn, c.examples[0].position) == ("step3:0", 1, 7)
    g = by_id(rep, "groups_all_equal")  # both rows of uid u have reward 1
    assert g.status == "fail" and g.counts["groups_all_equal"] == 1


def test_rewards_per_turn_by_layout(tmp_path):
    two_in_turn_1 = [0, 0, 0, 0, 0, 0, 0.5, 0.5]
    per_turn = [0, 0, 0, 0.2, 0, 0, 0, 0.8]
    rows = [row("two", MASK, token_level_rewards=two_in_turn_1), row("each", MASK, token_level_rewards=per_turn)]
    p = write_jsonl(tmp_path / "rows.jsonl", rows)
    c = by_id(check_rollouts([p]), "rewards_per_turn")
    assert c.status == "fail"
    assert c.counts == {"trajectories_checked": 2, "turns_checked": 4, "turns_with_several": 1, "trajectories": 1}
    assert (c.examples[0].trajectory_id, c.examples[0].turn, c.examples[0].position) == ("two", 1, 7)
    out = by_id(check_rollouts([p], CheckConfig(reward_layout="outcome")), "rewards_per_turn")
    assert out.status == "fail" and out.counts["trajectories_with_several"] == 2  # both have two rewards
    ok = write_jsonl(tmp_path / "ok.jsonl", [row("each", MASK, token_level_rewards=per_turn)])
    assert by_id(check_rollouts([ok]), "rewards_per_turn").status == "pass"
    assert by_id(check_rollouts([p], CheckConfig(reward_layout="token")), "rewards_per_turn").status == "skipped"


def test_turn_rewards_sum_catches_dropped_turn_rewards(tmp_path):
    recs = [conv(0, 3, 1.0), conv(1, 3, 1.5), conv(2, 2, 1.0)]
    recs[0]["turn_rewards"] = [0.0, 0.0, 1.0]  # fine: sums to the outcome, one per turn
    recs[1]["turn_rewards"] = [1.0]  # SkyRL #226: only the last turn's reward kept (outcome 1.5)
    recs[2]["turn_rewards"] = [0.5, 0.25]  # two entries for two turns, but 0.75 != 1.0
    p = tmp_path / "chat.json"
    p.write_text(json.dumps(recs))
    c = by_id(check_rollouts([p]), "turn_rewards_sum")
    assert c.status == "fail"
    assert c.counts == {"trajectories_checked": 3, "sum_differs": 2, "length_differs": 1}
    details = [e.detail for e in c.examples]
    assert details[0] == "the series has 1 entries for 3 turns ([1])"
    assert "sum to 0.75, the outcome is 1" in " ".join(details)
    p.write_text(json.dumps(recs[:1]))
    assert by_id(check_rollouts([p]), "turn_rewards_sum").status == "pass"


def test_token_level_rewards_beside_a_scalar_outcome_form_a_series(tmp_path):
    rec = row("a", MASK, reward=1.0, token_level_rewards=[0, 0, 0, 0.25, 0, 0, 0, 0.5])
    c = by_id(check_rollouts([write_jsonl(tmp_path / "r.jsonl", [rec])]), "turn_rewards_sum")
    assert c.status == "fail" and "sum to 0.75, the outcome is 1" in c.examples[0].detail


def test_groups_all_equal_and_the_dapo_share():
    def mk(tid, g, r):
        return CheckRollout(tid, group_id=g, reward=r)

    rs = [mk("a", "g1", 1), mk("b", "g1", 1), mk("c", "g2", 0), mk("d", "g2", 1),
          mk("e", "g3", 0), mk("f", "g3", 0), mk("g", "g3", 0), mk("h", "g4", 1)]
    c = by_id(run_checks(rs), "groups_all_equal")
    assert c.status == "warn"
    assert c.counts == {"groups_checked": 3, "groups_all_equal": 2, "trajectories_dropped": 5,
                        "trajectories_checked": 7, "singleton_groups": 1}
    assert c.measured["share_of_trajectories"] == pytest.approx(5 / 7)
    assert c.examples[0].detail == "group g3: 3 rollouts, every reward 0"
    assert by_id(run_checks(rs[:2] + rs[4:7]), "groups_all_equal").status == "fail"  # no group has a signal
    assert by_id(run_checks(rs[2:4]), "groups_all_equal").status == "pass"


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.sampled_from([0.0, 0.5, 1.0, 1.0 + 1e-7])), min_size=2, max_size=24),
       st.sampled_from([0.0, 1e-6]))
def test_groups_all_equal_agrees_with_the_dapo_filter(pairs, atol):
    """The check's numpy filter drops the rows critic_audit.rl.dynamic_sampling_filter (DAPO eq. 11) drops."""
    import torch

    from critic_audit.rl import dynamic_sampling_filter

    rs = [CheckRollout(f"t{i}", group_id=f"g{g}", reward=r) for i, (g, r) in enumerate(pairs)]
    multi = [(g, r) for g, r in pairs if sum(h == g for h, _ in pairs) >= 2]
    c = by_id(run_checks(rs, CheckConfig(reward_atol=atol)), "groups_all_equal")
    if not multi:
        assert c.status == "skipped"
        return
    res = dynamic_sampling_filter(torch.tensor([r for _, r in multi], dtype=torch.float64),
                                  torch.tensor([g for g, _ in multi]), atol=atol)
    assert c.counts["trajectories_dropped"] == int((~res.keep).sum())
    assert c.counts["groups_all_equal"] == res.num_groups_all_equal


def _nemo_tree(root, rewards):
    """resources_servers/<env>/data/example_rollouts.jsonl per env; rewards: env -> [(group, reward)]
    (NeMo Gym's _ng_task_index numbers the groups 0, 1, ... in every environment)."""
    from test_io_formats import nemo_record

    for env, rs in rewards.items():
        recs = []
        for i, (g, rew) in enumerate(rs):
            r = nemo_record(i, rew)
            del r["task_index"]
            r["_ng_task_index"] = g
            recs.append(r)
        (root / "resources_servers" / env / "data").mkdir(parents=True)
        write_jsonl(root / "resources_servers" / env / "data" / "example_rollouts.jsonl", recs)
    return root


def test_groups_of_two_collections_with_the_same_ids_are_not_pooled(tmp_path):
    # tau2's group 0 has a spread; sokoban's group 0 is all-equal: pooled by id alone they would hide it
    root = _nemo_tree(tmp_path / "Gym", {"tau2": [(0, 1.0), (0, 0.0), (1, 1.0)], "sokoban": [(0, 1.0), (0, 1.0)]})
    rep = check_rollouts([root])
    c = by_id(rep, "groups_all_equal")
    assert c.status == "warn"
    assert c.counts == {"groups_checked": 2, "groups_all_equal": 1, "trajectories_dropped": 2,
                        "trajectories_checked": 4, "singleton_groups": 1}
    assert c.examples[0].detail == "group sokoban/0: 2 rollouts, every reward 1"
    # every group check keys by (collection, group id)
    t = by_id(rep, "turns_per_group")
    assert t.counts["groups_checked"] == 2 and t.counts["trajectories_checked"] == 4


def test_returns_reset_across_a_tool_span(tmp_path):
    reset = [0, 0, 0, 0, 0, 0, 1, 1]  # verl #7278: the return stops at the observation
    carried = [0, 0, 1, 1, 0, 0, 1, 1]
    rows = [row("reset", MASK, returns=reset), row("carried", MASK, returns=carried)]
    c = by_id(check_rollouts([write_jsonl(tmp_path / "r.jsonl", rows)]), "returns_reset")
    assert c.status == "fail"
    assert c.counts == {"trajectories_checked": 2, "turns_with_zero_return": 1, "trajectories": 1}
    assert (c.examples[0].trajectory_id, c.examples[0].turn, c.examples[0].position) == ("reset", 0, 2)
    ok = write_jsonl(tmp_path / "ok.jsonl", [row("carried", MASK, returns=carried)])
    assert by_id(check_rollouts([ok]), "returns_reset").status == "pass"


# ----------------------------------------------------------------------------------------------- masks


def test_markers_of_chatml(tokenizer):
    mk, reason = turn_markers(tokenizer)
    assert reason == ""
    assert tokenizer.decode(list(mk.header)) == "<|im_start|>assistant\n"
    assert tokenizer.decode(list(mk.end)) == "<|im_end|>" and tokenizer.decode(list(mk.glue)) == "\n"
    _, ids, mask = rendered(tokenizer)
    spans = expected_turns(ids, mk)
    expected = np.zeros(len(ids), dtype=bool)
    for a, b, closed in spans:
        assert closed
        expected[a:b] = True
    np.testing.assert_array_equal(expected, mask)  # the template's turns are exactly turns.py's mask


def test_mask_boundaries_hole_and_spill(tokenizer):
    _, ids, mask = rendered(tokenizer)
    end = turn_markers(tokenizer)[0].end[0]
    k = np.where(mask, np.cumsum(mask & ~np.r_[False, mask[:-1]]) - 1, -1)
    hole = mask.copy()
    end0 = int(np.flatnonzero(k == 0)[-1])
    assert ids[end0] == end
    hole[end0] = False  # the end-of-turn token of turn 0 masked: the model never learns to stop
    spill = mask.copy()
    tool = np.arange(end0 + 1, int(np.flatnonzero(k == 1)[0]))  # everything between turn 0 and turn 1
    spill[tool[-4:]] = True  # the last 4 context tokens before turn 1 (the assistant header) trained on
    rs = [rollout("ok", ids, mask), rollout("hole", ids, hole), rollout("spill", ids, spill)]
    c = by_id(run_checks(rs, tokenizer=tokenizer), "mask_boundaries")
    assert c.status == "fail"
    assert c.counts == {"trajectories_checked": 3, "trajectories_without_markers": 0, "trajectories": 2,
                        "hole_tokens": 1, "turns_with_hole": 1, "end_tokens_masked": 1, "spill_tokens": 4}
    ex = {e.trajectory_id: e for e in c.examples}
    assert (ex["hole"].turn, ex["hole"].position) == (0, end0) and "'<|im_end|>'" in ex["hole"].detail
    assert ex["spill"].position == int(tool[-4])
    assert by_id(run_checks(rs[:1], tokenizer=tokenizer), "mask_boundaries").status == "pass"
    assert by_id(run_checks(rs), "mask_boundaries").status == "skipped"  # no tokenizer


def test_a_tokenizer_that_does_not_match_the_ids_skips_every_template_check(tokenizer):
    _, ids, mask = rendered(tokenizer)
    mk = turn_markers(tokenizer)[0]
    other = (ids + 3) % len(tokenizer)  # the same rollout under another tokenizer's ids
    ends = np.flatnonzero(mask)[[2, 9]]
    other[ends] = mk.end[0]  # two of its ids happen to be this template's end-of-turn id
    assert not expected_turns(other, mk) and not np.isin(other[ends + 1], mk.glue).any()
    rs = [rollout("other", other, mask)]
    rep = run_checks(rs, tokenizer=tokenizer)
    for cid in ("mask_boundaries", "turn_separators", "truncation", "empty_turns"):
        c = by_id(rep, cid)
        assert c.status == "skipped", (cid, c.summary)
        assert c.reason == ("the template's turn tokens appear in none of the 1 rollouts with token ids: the "
                            "tokenizer does not match these token ids"), cid
    # retokenization also needs the messages, which this rollout lacks: that is named first (issue 35.5)
    assert by_id(rep, "retokenization").reason.startswith("no rollout carries both token ids")
    # the matching tokenizer still checks them
    ok = run_checks([rollout("ok", ids, mask)], tokenizer=tokenizer)
    assert [by_id(ok, c).status for c in ("mask_boundaries", "turn_separators", "truncation")] == ["pass"] * 3


def test_turn_separators_dropped_newline(tokenizer):
    _, ids, mask = rendered(tokenizer)
    mk = turn_markers(tokenizer)[0]
    first_end = int(np.flatnonzero(ids == mk.end[0])[1])  # [0] closes the system prompt
    keep = np.ones(len(ids), dtype=bool)
    keep[first_end + 1] = False  # verl #6501: the '\n' after <|im_end|> dropped at the turn boundary
    rs = [rollout("ok", ids, mask), rollout("dropped", ids[keep], mask[keep])]
    c = by_id(run_checks(rs, tokenizer=tokenizer), "turn_separators")
    ends = np.flatnonzero(ids == mk.end[0])
    assert len(ends) == 8 and ends[-1] == len(ids) - 2  # system + 3 x (user, assistant) + user; then a last '\n'
    assert c.status == "fail"
    assert c.counts == {"trajectories_checked": 2, "boundaries_checked": 16, "separators_missing": 1,
                        "trajectories": 1}
    assert (c.examples[0].trajectory_id, c.examples[0].position) == ("dropped", first_end + 1)
    assert by_id(run_checks(rs[:1], tokenizer=tokenizer), "turn_separators").status == "pass"


def test_empty_turns_in_messages_and_tokens(tokenizer, tmp_path):
    recs = [conv(0, 3, 1.0), conv(1, 2, 0.0)]
    recs[0]["traj"][4]["content"] = "   "  # the second assistant turn: blank, no tool call
    p = tmp_path / "chat.json"
    p.write_text(json.dumps(recs))
    c = by_id(check_rollouts([p]), "empty_turns")
    assert c.status == "warn"
    assert c.counts == {"trajectories_checked": 2, "turns_checked": 5, "empty_turns": 1, "trajectories": 1}
    assert (c.examples[0].trajectory_id, c.examples[0].turn) == ("t0", 1)
    mk = turn_markers(tokenizer)[0]
    end, h = mk.end[0], list(mk.header)
    only_end = rollout("tok", [5, *h, end, 7, *h, 40, 41, end],  # turn 0 is just <|im_end|>
                       [0] * (1 + len(h)) + [1, 0] + [0] * len(h) + [1, 1, 1])
    c2 = by_id(run_checks([only_end], tokenizer=tokenizer), "empty_turns")
    assert (c2.status, c2.counts["empty_turns"], c2.examples[0].position) == ("warn", 1, 1 + len(h))
    p.write_text(json.dumps(recs[1:]))
    assert by_id(check_rollouts([p]), "empty_turns").status == "pass"


def test_turn_length_limit_and_truncation(tmp_path):
    mask = [0, 1, 1, 1, 1, 1, 0, 1, 1, 1]  # turn 0: 5 tokens, turn 1: 3 tokens
    p = write_jsonl(tmp_path / "r.jsonl", [row("a", mask), row("b", [0, 1, 1, 0, 1], finish_reason="length")])
    rep = check_rollouts([p], CheckConfig(max_turn_tokens=3))
    c = by_id(rep, "turn_length_limit")
    assert c.status == "fail"
    assert c.counts == {"trajectories_checked": 2, "turns_checked": 4, "turns_over_limit": 1, "turns_at_limit": 1,
                        "trajectories": 1}
    assert (c.examples[0].trajectory_id, c.examples[0].turn, c.examples[0].position) == ("a", 0, 1)
    t = by_id(rep, "truncation")  # a: turn 1 stops at exactly 3 tokens; b: finish_reason length
    assert t.status == "warn" and t.counts == {"trajectories_checked": 2, "trajectories": 2, "truncated_with_reward": 2}
    assert by_id(check_rollouts([p], CheckConfig(max_turn_tokens=6)), "turn_length_limit").status == "pass"
    ok = write_jsonl(tmp_path / "ok.jsonl", [row("a", mask)])
    assert by_id(check_rollouts([ok], CheckConfig(max_turn_tokens=6)), "truncation").status == "pass"
    assert by_id(check_rollouts([ok]), "truncation").status == "skipped"  # nothing says whether it was cut


def test_truncation_from_a_turn_without_its_end_token(tokenizer):
    _, ids, mask = rendered(tokenizer)
    end = int(np.flatnonzero(mask)[-1])  # <|im_end|> of the last turn
    cut = ids[:end], mask[:end]  # the last turn stops before it (cut at the length limit)
    c = by_id(run_checks([rollout("ok", ids, mask), rollout("cut", *cut)], tokenizer=tokenizer), "truncation")
    assert c.status == "warn" and c.counts["trajectories"] == 1
    assert c.examples[0].trajectory_id == "cut" and c.examples[0].turn == 2
    assert c.examples[0].position == len(cut[0]) - 1


# ----------------------------------------------------------------------------------------------- tokens vs text


def test_retokenization_context_and_content_drift(tokenizer, tmp_path):
    msgs, ids, mask = rendered(tokenizer)
    k = np.where(mask, np.cumsum(mask & ~np.r_[False, mask[:-1]]) - 1, -1)
    # content drift: one merged token of turn 2 sampled as its single bytes (same text, other ids)
    pos = next(int(p) for p in np.flatnonzero(k == 2) if len(tokenizer.convert_ids_to_tokens(int(ids[p]))) > 1)
    pieces = tokenizer.convert_tokens_to_ids(list(tokenizer.convert_ids_to_tokens(int(ids[pos]))))
    split_ids = np.concatenate([ids[:pos], pieces, ids[pos + 1:]])
    split_mask = np.concatenate([mask[:pos], [True] * len(pieces), mask[pos + 1:]])
    assert tokenizer.decode(split_ids.tolist()) == tokenizer.decode(ids.tolist())
    # context drift: the separator before turn 1 dropped (verl #6501)
    sep = int(np.flatnonzero(k == 0)[-1]) + 1
    drop = np.ones(len(ids), dtype=bool)
    drop[sep] = False
    rows = [{"id": "ok", "input_ids": ids.tolist(), "response_mask": mask.astype(int).tolist(), "messages": msgs},
            {"id": "content", "input_ids": split_ids.tolist(), "response_mask": split_mask.astype(int).tolist(),
             "messages": msgs},
            {"id": "context", "input_ids": ids[drop].tolist(), "response_mask": mask[drop].astype(int).tolist(),
             "messages": msgs}]
    tok_dir = tmp_path / "tok"
    tokenizer.save_pretrained(tok_dir)
    p = write_jsonl(tmp_path / "rows.jsonl", rows)
    c = by_id(check_rollouts([p], tokenizer=tok_dir), "retokenization")
    assert c.status == "fail"
    assert c.counts == {"trajectories_checked": 3, "not_renderable": 0, "turns_checked": 9,
                        "turns_with_context_drift": 1, "turns_with_content_drift": 1, "turn_count_differs": 0,
                        "trajectories": 2}
    ex = {e.trajectory_id: e for e in c.examples}
    assert (ex["context"].turn, ex["context"].position) == (1, sep)
    assert (ex["content"].turn, ex["content"].position) == (2, pos)
    content_only = by_id(check_rollouts([write_jsonl(tmp_path / "c.jsonl", rows[:2])], tokenizer=tok_dir),
                         "retokenization")
    assert content_only.status == "warn"  # sampled ids off the canonical split: harmless unless re-tokenized
    clean = by_id(check_rollouts([write_jsonl(tmp_path / "o.jsonl", rows[:1])], tokenizer=tok_dir), "retokenization")
    assert clean.status == "pass" and clean.measured["share_of_turns_drifting"] == 0.0


# ----------------------------------------------------------------------------------------------- log-probs


def test_logprob_mismatch_golden_values(tmp_path):
    mask = [0, 1, 1, 0, 1, 1]
    sampler = [None, -1.0, -1.0, None, -0.5, -0.5]
    trainer = [None, -1.1, -0.9, None, -0.5, -0.5]
    p = write_jsonl(tmp_path / "r.jsonl", [row("a", mask, rollout_log_probs=sampler, old_log_probs=trainer)])
    c = by_id(check_rollouts([p]), "logprob_mismatch")
    k3 = [math.expm1(-0.1) + 0.1, math.expm1(0.1) - 0.1, 0.0, 0.0]
    assert c.status == "warn"  # mean k3 0.0025 > kl_warn 1e-3; no weight collapses
    assert by_id(check_rollouts([p], CheckConfig(kl_warn=0.01)), "logprob_mismatch").status == "pass"
    assert c.measured["k3_token_mean"] == pytest.approx(sum(k3) / 4, rel=1e-9)
    assert c.measured["max_abs_delta"] == pytest.approx(0.1, rel=1e-9)
    assert c.measured["turn_k3_max"] == pytest.approx((k3[0] + k3[1]) / 2, rel=1e-9)
    assert c.measured["seq_product_weight_min"] == pytest.approx(1.0, abs=1e-12)  # -0.1 + 0.1
    assert c.counts["tokens_checked"] == 4 and c.counts["trajectories_collapsed"] == 0


def test_logprob_product_weight_collapses_over_a_long_turn(tmp_path):
    """NeMo-RL #2269: a small per-token bias (delta -0.07) over 40 tokens: the product weight is
    exp(-2.8) = 0.061 while the geometric mean stays exp(-0.07) = 0.932."""
    n = 40
    mask = [0] + [1] * n
    rows = [row("long", mask, rollout_log_probs=[None] + [-1.0] * n, old_log_probs=[None] + [-1.07] * n),
            row("short", [0, 1], rollout_log_probs=[None, -1.0], old_log_probs=[None, -1.07])]
    c = by_id(check_rollouts([write_jsonl(tmp_path / "r.jsonl", rows)]), "logprob_mismatch")
    assert c.status == "fail"
    assert c.counts["trajectories_collapsed"] == 1 and c.counts["turns_collapsed"] == 1
    assert c.measured["seq_product_weight_min"] == pytest.approx(math.exp(-2.8), rel=1e-9)
    assert c.measured["seq_geomean_weight_min"] == pytest.approx(math.exp(-0.07), rel=1e-9)
    assert c.examples[0].trajectory_id == "long" and "= 0.06081" in c.examples[0].detail
    short = by_id(check_rollouts([write_jsonl(tmp_path / "s.jsonl", rows[1:])]), "logprob_mismatch")
    assert short.status == "warn" and short.counts["trajectories_collapsed"] == 0  # same bias, one token: k3 only
    loose = by_id(check_rollouts([tmp_path / "r.jsonl"], CheckConfig(weight_floor=0.0)), "logprob_mismatch")
    assert loose.status == "warn"  # the floor disabled: no collapse, but mean k3 0.0024 > 1e-3
    assert loose.measured["k3_token_mean"] == pytest.approx(math.expm1(-0.07) + 0.07, rel=1e-9)


def test_logprob_placeholders(tmp_path):
    """Flash-RL #19: log-prob 1 as a placeholder: on a masked token counted, on a policy token a fail."""
    mask = [0, 1, 1, 0]
    rows = [row("masked", mask, rollout_log_probs=[1.0, -0.2, -0.3, 1.0], old_log_probs=[1.0, -0.2, -0.3, 1.0]),
            row("policy", mask, rollout_log_probs=[1.0, 1.0, -0.3, 1.0], old_log_probs=[1.0, -0.2, -0.3, 1.0])]
    p = write_jsonl(tmp_path / "r.jsonl", rows)
    c = by_id(check_rollouts([p]), "logprob_mismatch")
    assert c.status == "fail"
    assert c.counts["impossible_log_probs"] == 1 and c.counts["placeholders_on_masked_tokens"] == 4
    assert (c.examples[0].trajectory_id, c.examples[0].turn, c.examples[0].position) == ("policy", 0, 1)
    ok = by_id(check_rollouts([write_jsonl(tmp_path / "o.jsonl", rows[:1])]), "logprob_mismatch")
    assert ok.status == "pass" and ok.counts["placeholders_on_masked_tokens"] == 2


def test_policy_recomputes_the_trainer_side(tmp_path, tokenizer):
    """--policy: the policy's log-probs through the scoring batches equal a plain full forward."""
    import torch
    from transformers import AutoModelForCausalLM

    from conftest import make_critic_dir

    pol = make_critic_dir(tmp_path / "policy", with_head=False)
    model = AutoModelForCausalLM.from_pretrained(pol).eval()
    seqs = [np.array([1, 40, 41, 42, 2, 50, 51]), np.array([1, 60, 61, 62]), np.array([1, 70, 71, 72, 73, 74, 75, 76])]
    ref = []
    with torch.no_grad():
        for s in seqs:
            lp = torch.log_softmax(model(torch.as_tensor(s)[None]).logits[0].double(), -1)
            ref.append(np.r_[np.nan, lp[:-1].gather(1, torch.as_tensor(s[1:])[:, None])[:, 0].numpy()])
    sampler = [r.copy() for r in ref]
    sampler[2][1:] += 0.5  # a sampler 0.5 nats off on all 7 policy tokens of s2
    rows = [row(f"s{i}", [0] + [1] * (len(s) - 1), ids=s.tolist(), rollout_log_probs=[None] + lp[1:].tolist())
            for i, (s, lp) in enumerate(zip(seqs, sampler))]
    p = write_jsonl(tmp_path / "r.jsonl", rows)
    rep = check_rollouts([p], policy=pol, token_budget=8, dtype="float32", device="cpu")
    c = by_id(rep, "logprob_mismatch")
    assert any("recomputed with --policy" in n for n in rep.notes)
    assert c.status == "fail"  # exp(-0.5 * 7) = 0.030 < 0.1
    assert c.counts["trajectories_collapsed"] == 1 and c.examples[0].trajectory_id == "s2"
    assert c.measured["max_abs_delta"] == pytest.approx(0.5, abs=1e-5)
    from critic_audit.check.policy import load_policy, policy_log_probs

    m, _, dev = load_policy(pol, device="cpu", dtype="float32")
    got = policy_log_probs(m, dev, seqs, token_budget=8, chunk=3)
    for g, r in zip(got, ref):
        np.testing.assert_allclose(g[1:], r[1:], rtol=0, atol=1e-5)
        assert np.isnan(g[0])


# ----------------------------------------------------------------------------------------------- groups, lengths


def test_turns_per_group_baseline_bias():
    def mk(tid, g, r, k):
        return rollout(tid, [0] * (2 * k), [0, 1] * k, group_id=g, reward=r)

    # g: 1 turn (reward 1) beside 4 turns (reward 0): per-trajectory baseline 0.5, per-turn (1 + 0) / 5 = 0.2
    rs = [mk("a", "g", 1.0, 1), mk("b", "g", 0.0, 4), mk("c", "h", 1.0, 2), mk("d", "h", 0.0, 2)]
    c = by_id(run_checks(rs), "turns_per_group")
    assert c.status == "warn"
    assert c.counts == {"groups_checked": 2, "groups_with_unequal_turns": 1, "groups_biased": 1,
                        "trajectories_checked": 4}
    assert c.measured["max_baseline_bias"] == pytest.approx(0.3) and c.measured["max_turns_ratio"] == 4.0
    assert c.examples[0].trajectory_id == "b" and "per-turn baseline 0.2 vs per-trajectory 0.5 (30%" in c.examples[0].detail
    assert by_id(run_checks(rs[2:]), "turns_per_group").status == "pass"


def test_turn_length_inequality():
    long = rollout("long", [0] * 303, [0] + [1] * 2 + [0] + [1] * 299)  # 2 tokens beside 299
    even = rollout("even", [0] * 9, [0, 1, 1, 1, 0, 1, 1, 1, 1])  # 3 and 4
    c = by_id(run_checks([long, even]), "turn_length_inequality")
    assert c.status == "warn" and c.counts == {"trajectories_checked": 2, "trajectories": 1}
    assert c.measured["max_length_ratio"] == pytest.approx(149.5)
    # Gini of (3, 4): |3 - 4| * 2 / (2 * 4 * 3.5) = 1 / 14
    assert by_id(run_checks([even]), "turn_length_inequality").measured["median_gini"] == pytest.approx(1 / 14)
    assert (c.examples[0].trajectory_id, c.examples[0].turn) == ("long", 1)
    assert by_id(run_checks([even]), "turn_length_inequality").status == "pass"


# ----------------------------------------------------------------------------------------------- verl batch, CLI


def test_check_verl_batch_metrics():
    import torch

    rewards = torch.zeros(2, 5)
    rewards[0, 4] = 1.0  # masked (the trailing tool token)
    rewards[1, 3] = 1.0
    batch = {"responses": torch.arange(10).reshape(2, 5), "response_mask": torch.tensor([[1, 1, 0, 1, 0]] * 2),
             "attention_mask": torch.ones(2, 7, dtype=torch.long), "token_level_rewards": rewards,
             "rollout_log_probs": torch.full((2, 5), -1.0), "old_log_probs": torch.full((2, 5), -1.0),
             "uid": np.array(["u", "v"], dtype=object)}
    rep = check_verl_batch(batch)
    m = rep.metrics()
    assert m["critic_audit/check/reward_on_masked_token/status"] == 2.0
    assert m["critic_audit/check/reward_on_masked_token/tokens"] == 1.0
    assert m["critic_audit/check/logprob_mismatch/status"] == 0.0
    assert m["critic_audit/check/logprob_mismatch/k3_token_mean"] == 0.0
    assert "critic_audit/check/mask_boundaries/status" not in m  # skipped checks are left out


def test_cli_check_exit_status_json_and_report(tmp_path):
    bad = write_jsonl(tmp_path / "bad.jsonl", [row("bad", MASK, token_level_rewards=[0, 0, 0, 0, 0, 1.0, 0, 0])])
    res = runner.invoke(app, ["check", str(bad), "--json", "--out", str(tmp_path / "report.json")])
    assert res.exit_code == 3, res.output  # a finding: 3, never click's 2 (usage) nor 1 (user error)
    doc = json.loads(res.stdout)
    assert doc["status"] == "fail" and doc["n_trajectories"] == 1
    assert json.loads((tmp_path / "report.json").read_text()) == doc
    c = next(c for c in doc["checks"] if c["id"] == "reward_on_masked_token")
    assert c["examples"][0] == {"trajectory_id": "bad", "turn": 0, "position": 5,
                                "detail": "reward 1 on a masked token, 2 token(s) after turn 0 ends"}
    good = write_jsonl(tmp_path / "good.jsonl", [row("g", MASK, token_level_rewards=[0, 0, 0, 0, 0, 0, 0, 1.0])])
    res = runner.invoke(app, ["check", str(good)])
    assert res.exit_code == 0, res.output
    assert "reward_on_masked_token" in res.stdout and "overall pass" in res.stdout
    truncated = write_jsonl(tmp_path / "t.jsonl", [row("t", MASK, finish_reason="length")])
    assert runner.invoke(app, ["check", str(truncated)]).exit_code == 0  # a warning
    assert runner.invoke(app, ["check", str(truncated), "--strict"]).exit_code == 3
    res = runner.invoke(app, ["check", str(tmp_path / "missing.jsonl")])
    assert res.exit_code == 1 and "no such file" in res.output and "Traceback" not in res.output
    res = runner.invoke(app, ["check", str(good), "--reward-layout", "bogus"])
    assert res.exit_code == 2 and "unknown reward layout" in res.output  # a bad option value: a usage error


def test_cli_check_exit_codes_tell_findings_from_usage_and_user_errors(tmp_path):
    bad = write_jsonl(tmp_path / "bad.jsonl", [row("bad", MASK, token_level_rewards=[0, 0, 0, 0, 0, 1.0, 0, 0])])
    assert runner.invoke(app, ["check", str(bad)]).exit_code == 3  # a fail-level finding
    # usage errors: an unknown option, a missing argument, a non-number for a number, a bad option value
    assert runner.invoke(app, ["check", str(bad), "--stirct"]).exit_code == 2
    assert runner.invoke(app, ["check"]).exit_code == 2
    assert runner.invoke(app, ["check", str(bad), "--examples", "many"]).exit_code == 2
    assert runner.invoke(app, ["check", str(bad), "--weight-floor", "2"]).exit_code == 2
    # user errors: a missing file
    assert runner.invoke(app, ["check", str(tmp_path / "nope.jsonl")]).exit_code == 1
    res = runner.invoke(app, ["check", "--help"])
    assert res.exit_code == 0 and "3 a fail-level check fired" in " ".join(res.output.split())


def test_cli_check_out_never_replaces_a_file_it_did_not_write(tmp_path, monkeypatch):
    good = write_jsonl(tmp_path / "good.jsonl", [row("g", MASK, token_level_rewards=[0, 0, 0, 0, 0, 0, 0, 1.0])])
    mine = tmp_path / "notes.json"
    mine.write_text('{"my": "notes"}\n')
    res = runner.invoke(app, ["check", str(good), "--out", str(mine)])
    assert res.exit_code == 1 and "is not a report critic-audit check wrote" in res.output and "--overwrite" in res.output
    assert mine.read_text() == '{"my": "notes"}\n'  # untouched
    # a previous report is replaced (its tool marker); --overwrite replaces any file
    rep = tmp_path / "check.json"
    assert runner.invoke(app, ["check", str(good), "--out", str(rep)]).exit_code == 0
    doc = json.loads(rep.read_text())
    assert doc["tool"] == "critic-audit check" and doc["status"] == "pass"
    assert runner.invoke(app, ["check", str(good), "--out", str(rep)]).exit_code == 0
    assert runner.invoke(app, ["check", str(good), "--out", str(mine), "--overwrite"]).exit_code == 0
    assert json.loads(mine.read_text())["tool"] == "critic-audit check"
    # folders, the root, an empty path: one clean line each, nothing unexpected
    monkeypatch.chdir(tmp_path)
    for bad, says in ((str(tmp_path), "is a folder; the report is one JSON file"), ("/", "is a folder"),
                      ("", "--out is empty")):  # (review 2 item 15)
        res = runner.invoke(app, ["check", str(good), "--out", bad])
        assert res.exit_code == 1, (bad, res.output)
        assert says in res.output and "unexpected" not in res.output and "Errno" not in res.output, res.output
        assert len(res.output.strip().splitlines()) == 1


def test_cli_check_reports_skipped_files_and_records(tmp_path):
    root = _nemo_tree(tmp_path / "Gym", {"tau2": [(0, 1.0), (0, 0.0)]})
    (root / "resources_servers" / "tau2" / "notes.txt").write_text("todo: more seeds\n")
    (root / "resources_servers" / "tau2" / "config.json").write_text(json.dumps({"seed": 1}))
    res = runner.invoke(app, ["check", str(root), "--json"])
    assert res.exit_code == 0, res.output
    assert "skipped 2 file(s) not read as rollouts" in res.stderr
    doc = json.loads(res.stdout)
    assert doc["n_trajectories"] == 2 and doc["input"]["skipped_files"] == {"not_rollout_file": 2}
    note = next(n for n in doc["notes"] if "file(s)" in n)
    assert note.startswith("skipped 2 file(s) not read as rollouts: not_rollout_file: 2 (e.g. ")
    assert "notes.txt" in note and "config.json" in note
    # a bad record in lenient mode: a note and a stderr line
    rows = write_jsonl(tmp_path / "rows.jsonl", [row("ok", MASK)])
    with open(rows, "a") as fh:
        fh.write("{not json\n")
    res = runner.invoke(app, ["check", str(rows), "--lenient", "--json"])
    assert res.exit_code == 0, res.output
    assert "skipped 1 bad record(s)" in res.stderr
    doc = json.loads(res.stdout)
    assert doc["n_trajectories"] == 1 and doc["input"]["skipped_total"] == 1
    assert any(n.startswith("skipped 1 bad record(s): ") and "(e.g. " in n for n in doc["notes"])


@pytest.mark.parametrize("turns", [1, 2, 4])
@pytest.mark.parametrize("tool", [True, False])
def test_no_false_alarm_on_correctly_built_rollouts(tokenizer, turns, tool):
    """Token ids and masks built by the chat template itself (turns.py) pass every template check, for
    conversations with and without tool calls and 1-4 turns."""
    rs = []
    for i in range(4):
        msgs = conv(i, turns, float(i % 2), tool=tool)["traj"]
        tc = ChatRenderer(tokenizer).tokenize(Conversation(f"r{i}", msgs))
        rs.append(rollout(f"r{i}", tc.input_ids, tc.response_mask, messages=msgs, group_id="g", reward=float(i % 2)))
    rep = run_checks(rs, tokenizer=tokenizer)
    for cid in ("mask_boundaries", "turn_separators", "retokenization", "empty_turns", "truncation"):
        c = by_id(rep, cid)
        assert c.status == "pass", (cid, c.summary, [e.detail for e in c.examples])
    assert by_id(rep, "mask_boundaries").counts["trajectories_checked"] == 4
    assert by_id(rep, "retokenization").counts["turns_checked"] == 4 * turns


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 5), st.integers(2, 30))
def test_logprob_figures_match_a_plain_loop_and_approx_kl(seed, b, t):
    """The check's k3 equals critic_audit.rl.approx_kl on the same tokens; the product / geomean
    weights and the turn collapse counts equal a loop over rows and turns."""
    import torch

    from critic_audit.rl import approx_kl

    rng = np.random.default_rng(seed)
    mask = rng.random((b, t)) < 0.6
    mask[:, 0] = True
    sampler = -rng.gamma(1.0, 1.0, (b, t))
    trainer = sampler + rng.normal(0, 0.3, (b, t))
    rs = [rollout(f"r{i}", np.zeros(t), mask[i], sampler_log_probs=sampler[i], trainer_log_probs=trainer[i])
          for i in range(b)]
    c = by_id(run_checks(rs, CheckConfig(weight_floor=0.5)), "logprob_mismatch")
    ref = approx_kl(torch.as_tensor(trainer), torch.as_tensor(sampler), torch.as_tensor(mask))
    assert c.measured["k3_token_mean"] == pytest.approx(ref["k3"], rel=1e-9, abs=1e-12)
    prods, geos, collapsed_turns = [], [], 0
    for i in range(b):
        d = (trainer[i] - sampler[i])[mask[i]]
        prods.append(d.sum())
        geos.append(d.mean())
        k = np.where(mask[i], np.cumsum(mask[i] & ~np.r_[False, mask[i][:-1]]) - 1, -1)
        for q in range(k.max() + 1):
            s = (trainer[i] - sampler[i])[k == q].sum()
            collapsed_turns += not (math.log(0.5) <= s <= -math.log(0.5))
    assert c.measured["seq_product_weight_min"] == pytest.approx(math.exp(min(prods)), rel=1e-9)
    assert c.measured["seq_geomean_weight_median"] == pytest.approx(math.exp(np.median(geos)), rel=1e-9)
    assert c.counts["turns_collapsed"] == collapsed_turns
    assert c.counts["trajectories_collapsed"] == sum(not (math.log(0.5) <= p <= -math.log(0.5)) for p in prods)


def test_policy_errors_are_one_line(tmp_path):
    from conftest import make_critic_dir

    pol = make_critic_dir(tmp_path / "policy", with_head=False, max_pos=8)
    too_long = write_jsonl(tmp_path / "long.jsonl", [row("long", [0] + [1] * 9, rollout_log_probs=[-1.0] * 10)])
    res = runner.invoke(app, ["check", str(too_long), "--policy", str(pol), "--device", "cpu"])
    assert res.exit_code == 1 and "10 tokens, more than the policy's context of 8" in res.output
    bad_ids = write_jsonl(tmp_path / "ids.jsonl", [row("v", [0, 1], ids=[1, 5000], rollout_log_probs=[-1.0] * 2)])
    res = runner.invoke(app, ["check", str(bad_ids), "--policy", str(pol), "--device", "cpu"])
    assert res.exit_code == 1 and "outside the policy's vocabulary" in res.output
    res = runner.invoke(app, ["check", str(bad_ids), "--tokenizer", str(tmp_path / "nowhere")])
    assert res.exit_code == 1 and "no such tokenizer folder" in res.output


def _policy_without(tmp_path, name, drop=(), *, tie=None, reshape=None):
    """A tiny Llama causal LM (conftest's, untied) saved with the weights ``drop`` removed from its
    safetensors, ``tie_word_embeddings`` set to ``tie`` (when given) and ``reshape`` (name -> shape)
    weights replaced by zeros of another shape."""
    import torch
    from safetensors.torch import load_file, save_file

    from conftest import make_critic_dir

    pol = make_critic_dir(tmp_path / name, with_head=False)
    state = load_file(pol / "model.safetensors")
    for k in drop:
        del state[k]
    for k, shape in (reshape or {}).items():
        state[k] = torch.zeros(shape)
    save_file(state, pol / "model.safetensors", metadata={"format": "pt"})
    if tie is not None:
        cfg = json.loads((pol / "config.json").read_text())
        (pol / "config.json").write_text(json.dumps({**cfg, "tie_word_embeddings": tie}))
    return pol


def _one_line(res):
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert res.exit_code == 1 and len(lines) == 1, res.output
    return lines[0]


def test_policy_missing_weights_are_refused_not_randomly_initialised(tmp_path):
    """--policy on a folder without lm_head (tie_word_embeddings false): from_pretrained would fill it
    with random weights and score garbage; it is one ConfigError line naming the folder, the weight
    and a fix. Several missing: the first three and the count; another shape: named too."""
    from critic_audit.check.policy import load_policy
    from critic_audit.errors import ConfigError

    rows = write_jsonl(tmp_path / "r.jsonl", [row("a", [0, 1, 1], ids=[1, 40, 41], rollout_log_probs=[None, -1.0, -1.0])])
    pol = _policy_without(tmp_path, "nohead", ["lm_head.weight"])
    line = _one_line(runner.invoke(app, ["check", str(rows), "--tokenizer", str(pol), "--policy", str(pol),
                                         "--device", "cpu"]))
    assert str(pol) in line and "1 weight(s) of the policy are missing from the checkpoint" in line
    assert "randomly initialised: lm_head.weight (fix: pass the complete checkpoint" in line
    with pytest.raises(ConfigError, match="lm_head.weight"):
        load_policy(pol, device="cpu", dtype="float32")

    layer = [f"model.layers.1.{k}.weight" for k in ("mlp.down_proj", "mlp.gate_proj", "mlp.up_proj", "self_attn.k_proj",
                                                    "self_attn.o_proj")]
    pol = _policy_without(tmp_path, "nolayer", layer)
    with pytest.raises(ConfigError) as e:
        load_policy(pol, device="cpu", dtype="float32")
    assert "5 weight(s)" in str(e.value) and ", ".join(sorted(layer)[:3]) + ", ... (2 more)" in str(e.value)

    pol = _policy_without(tmp_path, "shape", reshape={"lm_head.weight": (7, 32)})
    with pytest.raises(ConfigError) as e:
        load_policy(pol, device="cpu", dtype="float32")
    assert "of another shape than config.json's and would be randomly initialised: lm_head.weight" in str(e.value)


def test_policy_head_tied_to_the_embeddings_loads(tmp_path):
    """No lm_head in the file but tie_word_embeddings true: transformers ties it to the embeddings, no
    weight is new, and the log-probs are the tied model's (head = embedding matrix)."""
    import torch

    from critic_audit.check.policy import load_policy, policy_log_probs

    pol = _policy_without(tmp_path, "tied", ["lm_head.weight"], tie=True)
    m, _, dev = load_policy(pol, device="cpu", dtype="float32")
    emb = m.get_input_embeddings().weight
    assert torch.equal(m.get_output_embeddings().weight, emb)
    seq = np.array([1, 40, 41, 42, 2, 50])
    with torch.no_grad():
        h = m.model(torch.as_tensor(seq)[None]).last_hidden_state[0]
        ref = torch.log_softmax((h @ emb.T).double(), -1)[:-1].gather(1, torch.as_tensor(seq[1:])[:, None])[:, 0]
    got = policy_log_probs(m, dev, [seq], token_budget=8)[0]
    np.testing.assert_allclose(got[1:], ref.numpy(), rtol=0, atol=1e-5)


def test_policy_pickle_weights_need_allow_pickle(tmp_path):
    """A pickle-only policy folder (pytorch_model.bin) is refused as analyze refuses a pickle critic
    (the same line and fix, naming --allow-pickle), before the input is read; --allow-pickle reads it
    and gives the same log-probs as the safetensors folder it came from."""
    import shutil

    import torch
    from safetensors.torch import load_file

    from conftest import make_critic_dir
    from critic_audit.check.policy import load_policy, policy_log_probs
    from critic_audit.critic import load_critic
    from critic_audit.errors import CheckpointError

    safe = make_critic_dir(tmp_path / "safe", with_head=False)
    pk = tmp_path / "pickled"
    shutil.copytree(safe, pk)
    torch.save(load_file(pk / "model.safetensors"), pk / "pytorch_model.bin")
    (pk / "model.safetensors").unlink()
    rows = write_jsonl(tmp_path / "r.jsonl", [row("a", [0, 1, 1, 1], ids=[1, 40, 41, 42],
                                                  rollout_log_probs=[None, -1.0, -1.0, -1.0])])
    with pytest.raises(CheckpointError) as by_check:
        load_policy(pk, device="cpu")
    with pytest.raises(CheckpointError) as by_critic:
        load_critic(pk, device="cpu")
    assert (by_check.value.problem, by_check.value.fix) == (by_critic.value.problem, by_critic.value.fix)
    assert "--allow-pickle" in by_check.value.fix and "weights_only=True" in by_check.value.fix
    line = _one_line(runner.invoke(app, ["check", str(tmp_path / "nowhere.jsonl"), "--policy", str(pk), "--device", "cpu"]))
    assert str(pk) in line and "only pickle weights (pytorch_model.bin)" in line and "--allow-pickle" in line
    res = runner.invoke(app, ["check", str(rows), "--policy", str(pk), "--device", "cpu", "--allow-pickle", "--json"])
    assert res.exit_code in (0, 3), res.output
    assert any("recomputed with --policy" in n for n in json.loads(res.stdout)["notes"])
    seq = np.array([1, 40, 41, 42, 2, 50])
    lps = []
    for d in (pk, safe):
        model, _, dev = load_policy(d, device="cpu", dtype="float32", allow_pickle=True)
        lps.append(policy_log_probs(model, dev, [seq])[0])
    np.testing.assert_array_equal(lps[0], lps[1])
    res = runner.invoke(app, ["check", str(rows), "--policy", str(safe), "--device", "cpu", "--json"])
    assert res.exit_code in (0, 3), res.output  # safetensors folders need no flag


def test_conversations_with_a_tokenizer_get_lengths_not_mask_checks(tokenizer, tmp_path):
    """For conversations the tokenizer renders ids and a mask (as analyze does): the length checks use
    them; the mask / separator checks would test the template against itself and skip."""
    p = tmp_path / "chat.json"
    p.write_text(json.dumps([conv(i, 3, float(i % 2)) for i in range(4)]))
    tok_dir = tmp_path / "tok"
    tokenizer.save_pretrained(tok_dir)
    rep = check_rollouts([p], CheckConfig(max_turn_tokens=10), tokenizer=tok_dir)
    for cid in ("mask_boundaries", "turn_separators", "retokenization"):
        assert by_id(rep, cid).status == "skipped", cid
    over = 0
    for i in range(4):
        _, ids, mask = rendered(tokenizer, turns=3, i=i)
        k = np.where(mask, np.cumsum(mask & ~np.r_[False, mask[:-1]]) - 1, -1)
        over += sum(int((k == t).sum()) > 10 for t in range(3))
    assert over >= 4  # the turns "Thought: step k of i. Action: search[Paris]" are longer than 10 tokens
    lim = by_id(rep, "turn_length_limit")
    assert lim.counts["turns_checked"] == 12 and lim.counts["trajectories_checked"] == 4
    assert lim.status == "fail" and lim.counts["turns_over_limit"] == over
    assert "the message itself is that long" in lim.examples[0].detail


def test_check_reads_several_json_files_as_analyze_does(tmp_path):
    """``check A.json B.json`` with the same ids in both: qualified ``{file label}/{id}`` exactly as
    ``analyze`` reads them (io.inputs.read_all), not refused as repeated ids; --labels is applied."""
    from critic_audit.check.data import load_rollouts
    from critic_audit.io.inputs import read_all
    from critic_audit.io.records import ReadOptions

    a, b = tmp_path / "A.json", tmp_path / "B.json"
    a.write_text(json.dumps([conv(0, 2, 1.0), conv(1, 2, 0.0)]))
    b.write_text(json.dumps([conv(0, 2, 0.0), conv(1, 3, 1.0)]))
    res = runner.invoke(app, ["check", str(a), str(b), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["n_trajectories"] == 4
    opts = ReadOptions(require_reward=False)
    got = sorted(r.trajectory_id for r in load_rollouts([a, b], read_options=opts))
    assert got == ["A/t0", "A/t1", "B/t0", "B/t1"]
    assert got == sorted(c.trajectory_id for c in read_all([a, b], opts).conversations)
    # --labels (a shared read option): rewards come from the labels file when the rollouts have none
    rows = [{k: v for k, v in conv(i, 2, 0.0).items() if k != "reward"} for i in range(2)]
    c = tmp_path / "C.json"
    c.write_text(json.dumps(rows))
    labels = tmp_path / "labels.json"
    labels.write_text(json.dumps({"t0": True, "t1": False}))
    lab = load_rollouts([c], read_options=ReadOptions(require_reward=False, labels=labels))
    assert {r.trajectory_id: r.reward for r in lab} == {"t0": 1.0, "t1": 0.0}
    res = runner.invoke(app, ["check", str(c), "--labels", str(labels), "--json"])
    assert res.exit_code == 0, res.output


def test_cli_check_overall_says_how_many_checks_ran(tmp_path):
    """Plain chat files: most checks skip; "overall pass" must say it rests on the few that ran, and a
    note says a skipped check is not a pass (exit status unchanged: a pass stays 0)."""
    p = tmp_path / "chat.json"
    p.write_text(json.dumps([conv(0, 3, 1.0), conv(1, 2, 0.0)]))
    res = runner.invoke(app, ["check", str(p), "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    n, ran = len(doc["checks"]), sum(c["status"] != "skipped" for c in doc["checks"])
    assert 0 < ran < n and doc["checks_ran"] == ran and doc["checks_total"] == n
    assert doc["overall"] == f"{doc['status']} ({ran} of {n} checks ran; {n - ran} skipped: see reasons)"
    assert any("a skipped check is not a pass" in x for x in doc["notes"])
    res = runner.invoke(app, ["check", str(p)])
    assert res.exit_code == 0, res.output
    flat = " ".join(res.stdout.split())
    assert f"overall {doc['status']} ({ran} of {n} checks ran; {n - ran} skipped: see reasons)" in flat
    assert "a skipped check is not a pass" in flat
