"""How a rollout ends (issue 36 items 1-3): the truncation flag against the stop token and the caps,
rollouts ending on an observation or on an unanswered tool call, rows cut at the response cap. Each
check on planted rows with and without its bug (counts computed by hand in the comments), through
the readers (tokenized JSONL, chat JSONL, verl batches), and on the real files of tests/data and
sample_data."""

from __future__ import annotations

import json

import numpy as np
import pytest

from critic_audit.check import CheckConfig, CheckRollout, check_rollouts, check_verl_batch, run_checks
from conftest import DATA, SAMPLE
from test_check import by_id, write_jsonl

NEW = ("truncation_flag", "ends_on_observation", "unanswered_tool_call", "response_cap_cut", "mismatch_by_length", "untrained_turns", "reward_in_observation",
       "turn_boundary_tokens")


def tok_row(tid, ids, mask, **extra):
    return {"trajectory_id": tid, "input_ids": ids, "response_mask": mask, "reward": 1.0, **extra}


# Stop token 2 (inferred: it ends 5 of the 8 policy turns below); prompt ids 10, 11; tool ids 30, 31.
TWO_TURNS = [0, 0, 1, 1, 1, 0, 0, 1, 1, 1]  # turn 0 = positions 2-4, turn 1 = 7-9: response = 8 tokens
STOPPED = [10, 11, 20, 21, 2, 30, 31, 22, 23, 2]
CUT = [10, 11, 20, 21, 2, 30, 31, 22, 23, 24]  # turn 1 ends on 24: no stop token


def flag_rows(bug: bool):
    rows = [tok_row("stopped", STOPPED, TWO_TURNS, truncated=False),
            tok_row("cut_flagged", CUT, TWO_TURNS, finish_reason="length"),
            tok_row("short_no_stop", [10, 11, 20, 21, 25], [0, 0, 1, 1, 1], truncated=False)]
    if bug:
        rows += [tok_row("cut_unflagged", CUT, TWO_TURNS, truncated=False),  # OpenRLHF #1327
                 tok_row("spurious", [10, 11, 20, 2], [0, 0, 1, 1], is_truncated=True)]  # AReaL #1637
    return rows


def test_truncation_flag_with_and_without_the_bug(tmp_path):
    # with the bug: turn ends 2,2 | 2,24 | 25 | 2,24 | 2 -> id 2 ends 5 of 8 turns (62%): the stop token;
    # responses 8, 8, 3, 8, 2 -> cap 8 inferred (3 rows reach it)
    rep = check_rollouts([write_jsonl(tmp_path / "bug.jsonl", flag_rows(True))])
    c = by_id(rep, "truncation_flag")
    assert c.status == "fail"
    assert c.counts == {"trajectories_checked": 5, "flagged_truncated": 2, "unflagged_at_cap": 1,
                        "flagged_on_stop_token": 1, "unflagged_without_stop_below_cap": 1}
    assert c.measured["response_cap"] == 8.0 and c.measured["share_unflagged_at_cap"] == pytest.approx(0.2)
    assert "inferred from the data: id 2" in c.summary and "62% of the 8 policy turns" in c.summary
    first = c.examples[0]
    assert (first.trajectory_id, first.turn, first.position) == ("cut_unflagged", 1, 9)
    assert [e.trajectory_id for e in c.examples] == ["cut_unflagged", "spurious"]
    # without it: 2,2 | 2,24 | 25 -> 3 of 5 (60%); responses 8, 8, 3 -> cap 8 (2 rows)
    ok = by_id(check_rollouts([write_jsonl(tmp_path / "ok.jsonl", flag_rows(False))]), "truncation_flag")
    assert ok.status == "pass" and ok.counts["unflagged_at_cap"] == 0 and ok.counts["flagged_on_stop_token"] == 0


def test_truncation_flag_at_the_per_turn_cap_and_the_reverse_only(tmp_path):
    # --max-turn-tokens 3: turn 1 of cut_unflagged has 3 tokens and no stop token; no response cap inferred
    # (responses 8 and 3 and 2: only one row at 8)
    rows = [tok_row("stopped", STOPPED, TWO_TURNS, truncated=False),
            tok_row("cut_unflagged", CUT, TWO_TURNS, truncated=False),
            tok_row("spurious", [10, 11, 20, 2], [0, 0, 1, 1], is_truncated=True)]
    p = write_jsonl(tmp_path / "rows.jsonl", rows)
    c = by_id(check_rollouts([p], CheckConfig(max_turn_tokens=3, max_response_tokens=100)), "truncation_flag")
    assert c.status == "fail" and c.counts["unflagged_at_cap"] == 1 and "= --max-turn-tokens" in c.examples[0].detail
    r = by_id(check_rollouts([write_jsonl(tmp_path / "rev.jsonl", [rows[0], rows[2]])]), "truncation_flag")
    assert r.status == "warn" and r.counts["flagged_on_stop_token"] == 1
    assert (r.examples[0].trajectory_id, r.examples[0].turn, r.examples[0].position) == ("spurious", 0, 3)


def test_truncation_flag_skips_without_a_flag_or_a_stop_token(tmp_path):
    no_flag = [tok_row("a", STOPPED, TWO_TURNS), tok_row("b", CUT, TWO_TURNS)]
    c = by_id(check_rollouts([write_jsonl(tmp_path / "a.jsonl", no_flag)]), "truncation_flag")
    assert c.status == "skipped" and "truncation flag" in c.reason
    # every turn ends on another id: no stop token to infer (the most common ends 1 of 2 turns... 50% of 2 is
    # reached by a single id only when it ends both)
    mixed = [tok_row("a", [10, 20, 21], [0, 1, 1], truncated=False), tok_row("b", [10, 20, 22], [0, 1, 1], truncated=False)]
    c = by_id(check_rollouts([write_jsonl(tmp_path / "b.jsonl", mixed)]), "truncation_flag")
    assert c.status == "skipped" and "no id ends most policy turns" in c.reason


def test_truncation_flag_uses_the_tokenizer_end_token(tokenizer):
    from critic_audit.schema import Conversation
    from critic_audit.turns import ChatRenderer

    msgs = [{"role": "user", "content": "Search Paris."}, {"role": "assistant", "content": "Paris is the capital."}]
    tc = ChatRenderer(tokenizer).tokenize(Conversation("x", msgs))
    ids, mask = tc.input_ids.astype(np.int64), tc.response_mask.astype(bool)
    last = int(np.flatnonzero(mask)[-1])
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert ids[last] == end
    good = CheckRollout("good", token_ids=ids[:last + 1], response_mask=mask[:last + 1], truncated=False)
    cut = CheckRollout("cut", token_ids=ids[:last], response_mask=mask[:last], truncated=False)
    rep = run_checks([good, cut], CheckConfig(max_response_tokens=int(mask[:last].sum())), tokenizer=tokenizer)
    c = by_id(rep, "truncation_flag")
    # cut: its response (first policy token to the end) = the cap, and it stops before <|im_end|>
    assert c.status == "fail" and c.counts["unflagged_at_cap"] == 1 and c.examples[0].trajectory_id == "cut"
    assert "the tokenizer's end-of-turn / EOS token" in c.summary


# ------------------------------------------------------------------------------------------ observation


def test_ends_on_observation_token_rows_and_conversations(tmp_path):
    obs = [10, 11, 20, 2, 30, 31, 32]
    rows = [tok_row("unflagged", obs, [0, 0, 1, 1, 0, 0, 0]),  # 3 trailing context tokens > 2: OpenRLHF #1352
            tok_row("truncated", obs, [0, 0, 1, 1, 0, 0, 0], truncated=True),
            tok_row("done", obs, [0, 0, 1, 1, 0, 0, 0], done=True),
            tok_row("glue", [10, 11, 20, 2, 198], [0, 0, 1, 1, 0]),  # one separator token: not an observation
            tok_row("padded", [10, 11, 20, 2, 198, 0, 0, 0], [0, 0, 1, 1, 0, 0, 0, 0])]  # separator + pad 0: padding
    chats = [{"id": "said_not_done", "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"},
                                                   {"role": "user", "content": "r"}],
              "reward": 1.0, "truncated": False, "terminated": False},
             {"id": "tool_reply", "messages": [{"role": "user", "content": "q"}, _call("search"),  # context exhausted
                                               {"role": "tool", "content": "r"}], "reward": 1.0},
             {"id": "transfer", "messages": [{"role": "user", "content": "q"}, _call("transfer_to_human_agents"),
                                             {"role": "tool", "content": "Transfer successful"}], "reward": 0.0},
             {"id": "episode_over", "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"},
                                                 {"role": "user", "content": "Episode finished"}], "reward": 1.0},
             {"id": "flagged", "messages": [{"role": "user", "content": "q"}, _call("search"),
                                            {"role": "tool", "content": "r"}], "reward": 1.0, "truncated": True}]
    rep = check_rollouts([write_jsonl(tmp_path / "rows.jsonl", rows), write_jsonl(tmp_path / "chat.jsonl", chats)])
    c = by_id(rep, "ends_on_observation")
    assert c.status == "warn"
    # conversations: all 5 end on observations; findings: said_not_done (both flags false), tool_reply (the reply to
    # a search call, unflagged); transfer (terminal tool), episode_over (a user message) and flagged are not
    assert c.counts == {"trajectories_checked": 10, "rows_checked": 5, "rows_ending_on_observation": 3,
                        "rows_unflagged": 1, "conversations_checked": 5, "conversations_ending_on_observation": 5,
                        "conversations_unflagged": 2, "rows_ending_on_padding": 1}
    e = c.examples[0]
    assert (e.trajectory_id, e.turn, e.position) == ("unflagged", 0, 4) and "3 context tokens" in e.detail
    assert [x.trajectory_id for x in c.examples[1:]] == ["said_not_done", "tool_reply"]
    assert "tool reply to search" in c.examples[2].detail
    ok = by_id(check_rollouts([write_jsonl(tmp_path / "ok.jsonl", rows[1:]), write_jsonl(tmp_path / "ok2.jsonl", chats[2:])]),
               "ends_on_observation")
    assert ok.status == "pass" and ok.counts["rows_ending_on_observation"] == 2 and ok.counts["rows_unflagged"] == 0
    assert ok.counts["conversations_ending_on_observation"] == 3 and ok.counts["conversations_unflagged"] == 0


def test_ends_on_observation_in_a_verl_batch():
    import torch

    # row 0 ends with 3 masked tool tokens, row 1 on its policy token (padding cut by attention_mask)
    batch = {"prompts": torch.tensor([[5, 6], [5, 6]]), "responses": torch.tensor([[20, 2, 30, 31, 32], [20, 21, 2, 0, 0]]),
             "response_mask": torch.tensor([[1, 1, 0, 0, 0], [1, 1, 1, 0, 0]]),
             "attention_mask": torch.tensor([[1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0, 0]])}
    c = by_id(check_verl_batch(batch), "ends_on_observation")
    assert c.status == "warn" and c.counts["rows_checked"] == 2 and c.counts["rows_unflagged"] == 1
    assert (c.examples[0].trajectory_id, c.examples[0].position) == ("row0", 2)


def _call(name):
    return {"role": "assistant", "content": None,
            "tool_calls": [{"id": "c", "type": "function", "function": {"name": name, "arguments": "{}"}}]}


def test_unanswered_tool_call(tmp_path):
    loop = [{"role": "user", "content": "q"}, _call("search"), {"role": "tool", "content": "r"}]
    chats = [{"id": "unanswered", "messages": loop + [_call("search")], "reward": 0.0},
             {"id": "finish", "messages": loop + [_call("finish")], "reward": 1.0},  # a terminal action
             {"id": "single", "messages": [{"role": "user", "content": "call a tool"}, _call("tool_A")], "reward": 1.0},
             {"id": "flagged", "messages": loop + [_call("search")], "reward": 0.0, "truncated": True}]
    c = by_id(check_rollouts([write_jsonl(tmp_path / "chat.jsonl", chats)]), "unanswered_tool_call")
    assert c.status == "warn"
    assert c.counts == {"trajectories_checked": 4, "trajectories": 1, "ending_on_terminal_call": 1}
    assert c.examples[0].trajectory_id == "unanswered" and "search" in c.examples[0].detail
    ok = by_id(check_rollouts([write_jsonl(tmp_path / "ok.jsonl", chats[1:])]), "unanswered_tool_call")
    assert ok.status == "pass" and ok.counts["trajectories"] == 0


def test_unanswered_tool_call_in_token_rows_with_a_tokenizer(tokenizer):
    from critic_audit.schema import Conversation
    from critic_audit.turns import ChatRenderer

    call = '<tool_call>\n{"name": "search", "arguments": {"q": "Paris"}}\n</tool_call>'
    msgs = [{"role": "user", "content": "Search Paris."}, {"role": "assistant", "content": call},
            {"role": "user", "content": "Observation: Paris is the capital."}, {"role": "assistant", "content": call}]
    tc = ChatRenderer(tokenizer).tokenize(Conversation("x", msgs))
    ids, mask = tc.input_ids.astype(np.int64), tc.response_mask.astype(bool)
    last = int(np.flatnonzero(mask)[-1])
    r = CheckRollout("calls", token_ids=ids[:last + 1], response_mask=mask[:last + 1])
    c = by_id(run_checks([r], tokenizer=tokenizer), "unanswered_tool_call")
    assert c.status == "warn" and c.counts["trajectories"] == 1
    assert (c.examples[0].turn, c.examples[0].position) == (1, last)
    r.truncated = True
    assert by_id(run_checks([r], tokenizer=tokenizer), "unanswered_tool_call").status == "pass"


# ------------------------------------------------------------------------------------------ cap


def test_response_cap_cut(tmp_path):
    # same rows as the flag test: at the inferred cap of 8: stopped, cut_flagged, cut_unflagged; cut inside a
    # turn (ends on 24): cut_flagged, cut_unflagged; unflagged: cut_unflagged (2 turns: multi-turn)
    c = by_id(check_rollouts([write_jsonl(tmp_path / "bug.jsonl", flag_rows(True))]), "response_cap_cut")
    assert c.status == "warn"
    assert c.counts == {"trajectories_checked": 5, "at_cap": 3, "cut_inside_turn": 2, "cut_unflagged": 1,
                        "cut_unflagged_multi_turn": 1, "over_cap": 0}
    e = c.examples[0]
    assert (e.trajectory_id, e.turn, e.position) == ("cut_unflagged", 1, 9) and "after 3 of its tokens" in e.detail
    ok = by_id(check_rollouts([write_jsonl(tmp_path / "ok.jsonl", flag_rows(False))]), "response_cap_cut")
    assert ok.status == "pass" and ok.counts["cut_inside_turn"] == 1 and ok.counts["cut_unflagged"] == 0
    # an explicit cap of 3: short_no_stop (3 tokens, ends on 25, single turn) is cut there; the two 8-token rows
    # are over it
    big = by_id(check_rollouts([write_jsonl(tmp_path / "ok2.jsonl", flag_rows(False))], CheckConfig(max_response_tokens=3)),
                "response_cap_cut")
    assert big.status == "warn" and big.counts == {"trajectories_checked": 3, "at_cap": 1, "cut_inside_turn": 1,
                                                   "cut_unflagged": 1, "cut_unflagged_multi_turn": 0, "over_cap": 2}


def test_a_stop_token_ends_strictly_more_than_half_of_the_turns():
    """review 3 #10: "most" policy turns is strictly more than half; an id ending exactly 50% is no stop
    token (response_cap_cut and truncation_flag both say so); 3 of 5 (60%) is."""
    def rows(ends):
        return [CheckRollout(f"r{k}", token_ids=np.array([10, 11, 20, 21, e] + [22] * k),
                             response_mask=np.array([0, 0, 1, 1, 1] + [0] * k), truncated=False)
                for k, e in enumerate(ends)]

    half = run_checks(rows([2, 2, 21, 22]))  # id 2 ends 2 of 4 turns
    for cid in ("response_cap_cut", "truncation_flag"):
        c = by_id(half, cid)
        assert c.status == "skipped" and "no id ends most policy turns" in c.reason, (cid, c.reason)
        assert "the most common, 2, ends 50% of 4" in c.reason
    most = by_id(run_checks(rows([2, 2, 2, 21, 22])), "truncation_flag")  # 3 of 5
    assert most.status != "skipped" and "inferred from the data: id 2" in most.summary
    assert "60% of the 5 policy turns" in most.summary


def _rows(spec):
    """CheckRollouts from (id, ids, mask) triples, no truncation flag."""
    return [CheckRollout(t, token_ids=np.array(i), response_mask=np.array(m)) for t, i, m in spec]


def test_response_cap_cut_needs_evidence_of_a_cap():
    """review 2 #19: a batch of one width is no evidence of a cap, and an inferred cap is reported only
    when most rows at it end inside a turn, more often than the shorter rows."""
    # one width: 6 rows of 4 response tokens, 4 end on 2 (the stop token, 67%), 2 on 24: was 'cut at the cap'
    same = _rows([(f"r{k}", [10, 11, 20, 21, 22, 2 if k < 4 else 24], [0, 0, 1, 1, 1, 1]) for k in range(6)])
    c = by_id(run_checks(same), "response_cap_cut")
    assert c.status == "skipped" and "a fixed width" in c.reason and "every one of the 6 rows has 4" in c.reason
    assert by_id(run_checks(same, config=CheckConfig(max_response_tokens=4)), "response_cap_cut").status == "warn"
    # evidence: 3 of the 4 rows at 8 tokens end on 24 (75%), none of the 4 shorter rows (3 tokens) ends inside a turn
    ev = _rows([(f"cut{k}", CUT, TWO_TURNS) for k in range(3)] + [("stopped", STOPPED, TWO_TURNS)]
               + [(f"short{k}", [10, 11, 20, 21, 2], [0, 0, 1, 1, 1]) for k in range(4)])
    c = by_id(run_checks(ev), "response_cap_cut")
    assert c.status == "warn" and c.counts["at_cap"] == 4 and c.counts["cut_unflagged"] == 3
    assert c.measured["share_at_cap_cut"] == pytest.approx(0.75) and c.measured["share_below_cap_inside_turn"] == 0.0
    # no evidence: 3 of 4 shorter rows (two turns, 4 response tokens) end on 25 too (75%, as often as at the
    # cap): stop id 2 ends 5 of 8 turns at the cap + 5 of 8 shorter = 10 of 16 (more than half)
    no = ev[:4] + _rows([(f"short{k}", [10, 11, 20, 2, 30, 31, 21, 25 if k < 3 else 2], [0, 0, 1, 1, 0, 0, 1, 1])
                         for k in range(4)])
    c = by_id(run_checks(no), "response_cap_cut")
    assert c.status == "skipped" and "3 of 4 rows at the longest response (8 tokens) end inside a turn, against 3 " \
        "of 4 shorter rows" in c.reason
    # most rows at the cap end on the stop token (1 of 3 cut, 33%): no evidence either
    few = _rows([("cut", CUT, TWO_TURNS), ("s1", STOPPED, TWO_TURNS), ("s2", STOPPED, TWO_TURNS),
                 ("short", [10, 11, 20, 21, 2], [0, 0, 1, 1, 1])])
    assert by_id(run_checks(few), "response_cap_cut").status == "skipped"
    # the cap given: the same rows are cut at it
    c = by_id(run_checks(no, config=CheckConfig(max_response_tokens=8)), "response_cap_cut")
    assert c.status == "warn" and c.counts["cut_unflagged"] == 3


# ------------------------------------------------------------------------------------------ real files

REAL = [DATA / "atif", DATA / "harbor", DATA / "hotpotqa_distractor_rl", DATA / "nemo_gym" / "aviary",
        DATA / "nemo_gym" / "blackjack", DATA / "nemo_gym" / "competitive_coding_challenges",
        DATA / "nemo_gym" / "graphwalks", DATA / "nemo_gym" / "hermes_agent", DATA / "openhands" / "native", DATA / "openhands" / "multi_swe_bench", DATA / "swe",
        DATA / "verifiers", DATA / "inspect", DATA / "prime_rl", DATA / "tau2", DATA / "tau_bench", DATA / "areal",
        DATA / "verl_rollouts" / "rollout_data" / "1.jsonl", SAMPLE / "credit_ppo_run", SAMPLE / "fireact_hotpotqa",
        SAMPLE / "tau_bench_airline"]


@pytest.mark.parametrize("path", REAL, ids=lambda p: p.parent.name if p.suffix else p.name)
def test_real_files_stay_clean(path):
    """The planted-free files of every container get no warning from these checks."""
    from critic_audit.io.records import ReadOptions

    rep = check_rollouts([path], read_options=ReadOptions(require_reward=False, lenient=True))
    for cid in NEW:
        c = by_id(rep, cid)
        assert c.status in ("pass", "skipped"), (cid, c.summary, [e.detail for e in c.examples])


def test_real_files_where_the_checks_run():
    # critic-audit's own PPO run: 160 token rows, every one ending on a policy token (no observation after it);
    # the truncation flag is there (false) but no id ends most turns (the env has no stop token): skipped
    rep = check_rollouts([SAMPLE / "credit_ppo_run"])
    c = by_id(rep, "ends_on_observation")
    assert c.status == "pass" and c.counts["rows_checked"] == 160 and c.counts["rows_ending_on_observation"] == 0
    assert "no id ends most policy turns" in by_id(rep, "truncation_flag").reason
    # tau-bench conversations end on the reply to a transfer call / the user's ###STOP###: counted, not warned
    c = by_id(check_rollouts([SAMPLE / "tau_bench_airline"]), "ends_on_observation")
    assert c.status == "pass" and c.counts["conversations_checked"] == 20
    assert c.counts["conversations_ending_on_observation"] > 0 and c.counts["conversations_unflagged"] == 0
    # NeMo Gym rows with token ids: <|im_end|> (151645) ends every turn (inferred); at a cap of 959 response
    # tokens one row reaches it and ends on the stop token: not cut
    rep = check_rollouts([DATA / "nemo_gym" / "competitive_coding_challenges"], CheckConfig(max_response_tokens=959))
    c = by_id(rep, "response_cap_cut")
    assert c.status == "pass" and c.counts["at_cap"] == 1 and c.counts["cut_inside_turn"] == 0
    assert "id 151645" in c.summary


# ------------------------------------------------------------------------------------------ mismatch by length


def test_kendall_trend_golden():
    from critic_audit.check.drift import kendall_trend

    assert kendall_trend([1, 2, 3, 4, 5]) == (1.0, pytest.approx(1 / 120))
    assert kendall_trend([5, 4, 3, 2, 1]) == (-1.0, 1.0)
    tau, p = kendall_trend([1, 3, 2, 4])  # one discordant pair of 6: P(<= 1 inversion) = (1 + 3) / 24
    assert tau == pytest.approx(4 / 6) and p == pytest.approx(1 / 6)
    tau, p = kendall_trend([2, 2, 2])  # all ties: tau 0, 1.5 "discordant" -> P(<= 1 inversion) = 3 / 6
    assert tau == 0.0 and p == pytest.approx(0.5)


def test_kendall_trend_matches_scipy_exact():
    stats = pytest.importorskip("scipy.stats")
    from critic_audit.check.drift import kendall_trend

    rng = np.random.default_rng(0)
    for n in (4, 6, 9):
        for _ in range(5):
            y = rng.normal(size=n)
            ref = stats.kendalltau(np.arange(n), y, method="exact", alternative="greater")
            tau, p = kendall_trend(y)
            assert tau == pytest.approx(ref.statistic) and p == pytest.approx(ref.pvalue)


def _lp_rows(lengths, gap):
    """Rows of one prompt token then ``n`` policy tokens, sampler log-prob -1, trainer -1 + gap(row, position)."""
    out = []
    for i, n in enumerate(lengths):
        p = np.arange(n)
        out.append(CheckRollout(f"r{i}", token_ids=np.arange(n + 1), response_mask=np.r_[False, np.ones(n, bool)],
                                sampler_log_probs=np.r_[np.nan, np.full(n, -1.0)],
                                trainer_log_probs=np.r_[np.nan, -1.0 + gap(i, n, p)]))
    return out


def test_mismatch_grows_with_position():
    # 4 rows of 2048 policy tokens, |delta| = 1e-4 * position: bins 0_64 .. 1024_2048 (6), means 1e-4 * (31.5,
    # 95.5, 191.5, 383.5, 767.5, 1535.5): tau 1, p = 1 / 6! = 1/720; one length bin (2048_4096)
    rep = run_checks(_lp_rows([2048] * 4, lambda i, n, p: 1e-4 * p))
    c = by_id(rep, "mismatch_by_length")
    assert c.status == "warn" and c.counts == {"trajectories_checked": 4, "tokens_checked": 8192, "position_bins": 6,
                                               "length_bins": 1}
    assert c.measured["mean_abs_delta_position_0_64"] == pytest.approx(1e-4 * 31.5)
    assert c.measured["mean_abs_delta_position_1024_2048"] == pytest.approx(1e-4 * 1535.5)
    assert c.measured["kendall_tau_position"] == 1.0 and c.measured["p_position"] == pytest.approx(1 / 720)
    assert c.measured["kendall_tau_length"] is None and "by position:" in c.summary and "by length:" not in c.summary
    e = c.examples[0]
    assert (e.trajectory_id, e.turn, e.position) == ("r0", 0, 2048) and "response position 2047" in e.detail


def test_mismatch_grows_with_sequence_length():
    # rows of 64, 128, 256, 512, 1024 tokens (2 each), |delta| = 1e-5 * length on every token of the row:
    # length bins 64_128 .. 1024_2048, means 6.4e-4 .. 1.024e-2: tau 1, p = 1/120
    rep = run_checks(_lp_rows([64, 64, 128, 128, 256, 256, 512, 512, 1024, 1024], lambda i, n, p: 1e-5 * n + 0 * p))
    c = by_id(rep, "mismatch_by_length")
    assert c.status == "warn" and c.counts["length_bins"] == 5
    assert c.measured["mean_abs_delta_length_64_128"] == pytest.approx(6.4e-4)
    assert c.measured["p_length"] == pytest.approx(1 / 120) and "by length:" in c.summary
    assert any(e.trajectory_id in ("r8", "r9") and e.turn is None for e in c.examples)


def test_mismatch_without_growth_passes():
    c = by_id(run_checks(_lp_rows([2048] * 4, lambda i, n, p: np.full(n, 0.01))), "mismatch_by_length")
    assert c.status == "pass" and c.measured["kendall_tau_position"] == 0.0  # every bin 0.01: ties
    # a growing gap below the floor (1e-3 nats) does not warn: last bin 1e-7 * 1535.5
    c = by_id(run_checks(_lp_rows([2048] * 4, lambda i, n, p: 1e-7 * p)), "mismatch_by_length")
    assert c.status == "pass" and c.measured["p_position"] == pytest.approx(1 / 720)
    # no log-probs: skipped
    assert by_id(run_checks([CheckRollout("x", token_ids=np.arange(3), response_mask=np.ones(3, bool))]),
                 "mismatch_by_length").status == "skipped"


def test_mismatch_by_length_in_a_verl_batch():
    import torch

    t = 1024
    old = torch.full((2, t), -1.0)
    rollout = old - 1e-4 * torch.arange(t).float()  # the gap grows with the position
    batch = {"prompts": torch.tensor([[5, 6], [5, 6]]), "responses": torch.arange(2 * t).reshape(2, t) % 50 + 20,
             "response_mask": torch.ones(2, t, dtype=torch.long), "old_log_probs": old, "rollout_log_probs": rollout}
    c = by_id(check_verl_batch(batch), "mismatch_by_length")
    assert c.status == "warn" and c.counts["position_bins"] == 5  # 0_64 .. 512_1024


# ------------------------------------------------------------------------------------------ untrained turns


def test_untrained_turn_without_logprobs():
    # turns at 1-2, 4-5, 7-8; turn 1 has no sampler log-prob while turns 0 and 2 have them
    mask = np.array([0, 1, 1, 0, 1, 1, 0, 1, 1], bool)
    lp = np.array([np.nan, -0.1, -0.2, np.nan, np.nan, np.nan, np.nan, -0.3, -0.4])
    bad = CheckRollout("bad", token_ids=np.arange(9), response_mask=mask, sampler_log_probs=lp)
    good = CheckRollout("good", token_ids=np.arange(9), response_mask=mask, sampler_log_probs=np.where(mask, -0.1, np.nan))
    c = by_id(run_checks([bad, good]), "untrained_turns")
    assert c.status == "warn" and c.counts["turns_without_logprobs"] == 1 and c.counts["rows_with_logprobs_checked"] == 2
    assert (c.examples[0].trajectory_id, c.examples[0].turn, c.examples[0].position) == ("bad", 1, 4)
    assert by_id(run_checks([good]), "untrained_turns").status == "pass"


def test_untrained_assistant_turn_masked_out(tokenizer):
    from critic_audit.check.markers import expected_turns, turn_markers
    from critic_audit.schema import Conversation
    from critic_audit.turns import ChatRenderer

    msgs = [{"role": "user", "content": "Search Paris."}, {"role": "assistant", "content": "Action: search[Paris]"},
            {"role": "user", "content": "Observation: Paris is the capital."},
            {"role": "assistant", "content": "Action: search[France]"},
            {"role": "user", "content": "Observation: France."}, {"role": "assistant", "content": "Paris."}]
    tc = ChatRenderer(tokenizer).tokenize(Conversation("x", msgs))
    ids, mask = tc.input_ids.astype(np.int64), tc.response_mask.astype(bool)
    spans = expected_turns(ids, turn_markers(tokenizer)[0])
    assert len(spans) == 3
    a, b, _ = spans[1]
    realigned = mask.copy()
    realigned[a:b] = False  # turn 1 kept as context (agentcore realign)
    rep = run_checks([CheckRollout("realigned", token_ids=ids, response_mask=realigned),
                      CheckRollout("kept", token_ids=ids, response_mask=mask)], tokenizer=tokenizer)
    c = by_id(rep, "untrained_turns")
    assert c.status == "fail" and c.counts["assistant_turns_masked_out"] == 1 and c.counts["trajectories"] == 1
    assert (c.examples[0].trajectory_id, c.examples[0].turn, c.examples[0].position) == ("realigned", 1, a)
    assert "while a later turn trains" in c.examples[0].detail
    assert by_id(run_checks([CheckRollout("kept", token_ids=ids, response_mask=mask)], tokenizer=tokenizer),
                 "untrained_turns").status == "pass"


def test_untrained_turn_from_messages_without_a_tokenizer(tmp_path):
    msgs = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a1"}, {"role": "tool", "content": "r"},
            {"role": "assistant", "content": "a2"}]
    rows = [tok_row("dropped", [10, 20, 21, 30, 31, 22, 23], [0, 0, 0, 0, 0, 1, 1], messages=msgs),  # 1 run of 2
            tok_row("kept", [10, 20, 21, 30, 31, 22, 23], [0, 1, 1, 0, 0, 1, 1], messages=msgs)]
    c = by_id(check_rollouts([write_jsonl(tmp_path / "rows.jsonl", rows)]), "untrained_turns")
    assert c.status == "fail" and c.counts["turns_missing_from_mask"] == 1 and c.counts["rows_with_messages_checked"] == 2
    assert c.examples[0].trajectory_id == "dropped"
    ok = by_id(check_rollouts([write_jsonl(tmp_path / "ok.jsonl", rows[1:])]), "untrained_turns")
    assert ok.status == "pass"


def test_untrained_turns_on_a_real_atif_row():
    # the exact-token ATIF demo: 2 steps, each with its log-probs -> checked, nothing missing
    c = by_id(check_rollouts([DATA / "atif"]), "untrained_turns")
    assert c.status == "pass" and c.counts["rows_with_logprobs_checked"] == 1 and c.counts["turns_without_logprobs"] == 0


# ------------------------------------------------------------------------------------------ reward leak


def _gsm8k(tid, parsed, reward, final="The answer is 72."):
    """verl's GSM8K tool agent: the tool replies f"Current parsed {answer=} {reward=}"."""
    return {"id": tid, "reward": reward, "messages": [
        {"role": "user", "content": "What is 8 * 9?"}, _call("calc_gsm8k_reward"),
        {"role": "tool", "content": f"Current parsed answer='{parsed}' reward={float(parsed == '72')}"},
        {"role": "assistant", "content": final}]}


def test_reward_in_observation(tmp_path):
    rows = [_gsm8k("leak", "72", 1.0),  # reward=1.0 shown before the last turn, = the outcome
            _gsm8k("other", "70", 1.0),  # reward=0.0 shown: a figure, not the outcome
            {"id": "after", "reward": 1.0, "messages": [{"role": "user", "content": "q"},
                                                        {"role": "assistant", "content": "Action: finish[72]"},
                                                        {"role": "user", "content": "Episode finished, reward = True"}]}]
    c = by_id(check_rollouts([write_jsonl(tmp_path / "chat.jsonl", rows)]), "reward_in_observation")
    assert c.status == "warn"
    assert c.counts == {"trajectories_checked": 3, "observations_checked": 3, "stating_an_outcome": 2,
                        "matching_the_reward": 1, "after_the_last_turn": 1, "trajectories": 1}
    e = c.examples[0]
    assert (e.trajectory_id, e.turn, e.position) == ("leak", 0, None) and "reward = 1" in e.detail
    ok = by_id(check_rollouts([write_jsonl(tmp_path / "ok.jsonl", rows[1:])]), "reward_in_observation")
    assert ok.status == "pass" and ok.counts["stating_an_outcome"] == 1


def test_reward_in_observation_in_token_rows(tokenizer):
    from critic_audit.check.leaks import stated_outcomes
    from critic_audit.schema import Conversation
    from critic_audit.turns import ChatRenderer

    assert stated_outcomes("Current parsed answer='72' reward=1.0") == [("reward", 1.0)]
    assert stated_outcomes("score: 0; correct = True") == [("score", 0.0), ("correct", 1.0)]
    msgs = [{"role": "user", "content": "What is 8 * 9?"}, {"role": "assistant", "content": "72"},
            {"role": "user", "content": "Current parsed answer='72' reward=1.0"},
            {"role": "assistant", "content": "The answer is 72."}]
    tc = ChatRenderer(tokenizer).tokenize(Conversation("x", msgs))
    ids, mask = tc.input_ids.astype(np.int64), tc.response_mask.astype(bool)
    first_end = int(np.flatnonzero(mask[:-1] & ~mask[1:])[0]) + 1  # the first token after turn 0
    r = CheckRollout("leak", token_ids=ids, response_mask=mask, reward=1.0)
    c = by_id(run_checks([r], tokenizer=tokenizer), "reward_in_observation")
    assert c.status == "warn" and c.counts["matching_the_reward"] == 1
    assert (c.examples[0].turn, c.examples[0].position) == (0, first_end)
    r.reward = 0.0
    assert by_id(run_checks([r], tokenizer=tokenizer), "reward_in_observation").status == "pass"


def test_reward_in_observation_on_a_real_file():
    # FireAct HotpotQA: every trajectory ends on "Observation: Episode finished, reward = True/False", after the
    # last turn: counted, not warned
    c = by_id(check_rollouts([SAMPLE / "fireact_hotpotqa"]), "reward_in_observation")
    assert c.status == "pass" and c.counts["after_the_last_turn"] == 40 and c.counts["matching_the_reward"] == 0


# ------------------------------------------------------------------------------------------ boundary tokens


def test_boundary_diff_kinds():
    from critic_audit.check.boundaries import boundary_diff

    b = frozenset({1, 2, 9})
    assert boundary_diff(np.array([1, 5, 6]), np.array([9, 1, 5, 6]), b) == ("lost", 0, [9])  # Qwen: "\n" (9) lost
    assert boundary_diff(np.array([7, 7, 9, 5]), np.array([7, 9, 5]), frozenset({7})) == ("doubled", 1, [7])  # GLM
    assert boundary_diff(np.array([3, 2, 1, 4]), np.array([3, 4]), b) == ("extra", 1, [2, 1])  # slime
    assert boundary_diff(np.array([3, 5, 4]), np.array([3, 6, 4]), b) is None  # content only: retokenization's
    assert boundary_diff(np.array([3, 4]), np.array([3, 4]), b) is None


def test_turn_boundary_tokens_lost_and_doubled(tokenizer):
    from conftest import conv
    from critic_audit.schema import Conversation
    from critic_audit.turns import ChatRenderer

    msgs = conv(0, 3, 1.0)["traj"]
    tc = ChatRenderer(tokenizer).tokenize(Conversation("x", msgs))
    ids, mask = tc.input_ids.astype(np.int64), tc.response_mask.astype(bool)
    e = int(np.flatnonzero(mask[:-1] & ~mask[1:])[0])  # the last token of turn 0 (<|im_end|>)
    assert tokenizer.decode([int(ids[e + 1])]) == "\n"  # the template's separator
    lost = CheckRollout("lost", token_ids=np.delete(ids, e + 1), response_mask=np.delete(mask, e + 1), messages=msgs)
    doubled = CheckRollout("doubled", token_ids=np.insert(ids, e + 2, ids[e + 2]),
                           response_mask=np.insert(mask, e + 2, False), messages=msgs)
    clean = CheckRollout("clean", token_ids=ids, response_mask=mask, messages=msgs)
    c = by_id(run_checks([lost, doubled, clean], tokenizer=tokenizer), "turn_boundary_tokens")
    assert c.status == "fail"
    assert c.counts == {"trajectories_checked": 3, "turns_checked": 9, "trajectories": 2, "boundaries_lost": 1,
                        "boundaries_doubled": 1, "boundaries_extra": 0, "boundaries_differs": 0}
    got = {(x.trajectory_id, x.turn, x.position) for x in c.examples}
    assert got == {("lost", 1, e + 1), ("doubled", 1, e + 3)}
    assert by_id(run_checks([clean], tokenizer=tokenizer), "turn_boundary_tokens").status == "pass"
    assert by_id(run_checks([clean]), "turn_boundary_tokens").status == "skipped"  # no tokenizer


@pytest.mark.parametrize("turns", [2, 3])
def test_no_false_alarm_on_template_built_rows(tokenizer, turns):
    """Rows the chat template built (ids, mask, messages, rewards, a flag) pass or skip every new check.
    (conftest's conv with one turn ends on the tool's reply to its search call: ends_on_observation's
    finding, by design.)"""
    from conftest import conv
    from critic_audit.schema import Conversation
    from critic_audit.turns import ChatRenderer

    rs = []
    for i in range(4):
        msgs = conv(i, turns, float(i % 2))["traj"]
        tc = ChatRenderer(tokenizer).tokenize(Conversation(f"r{i}", msgs))
        rs.append(CheckRollout(f"r{i}", token_ids=tc.input_ids.astype(np.int64),
                               response_mask=tc.response_mask.astype(bool), messages=msgs, reward=float(i % 2),
                               truncated=False))
    rep = run_checks(rs, tokenizer=tokenizer)
    for cid in NEW:
        c = by_id(rep, cid)
        assert c.status in ("pass", "skipped"), (cid, c.summary, [e.detail for e in c.examples])
    assert by_id(rep, "turn_boundary_tokens").counts["turns_checked"] == 4 * turns
    assert by_id(rep, "truncation_flag").status == "pass"


def test_cli_max_response_tokens(tmp_path):
    from typer.testing import CliRunner

    from critic_audit.cli import app

    p = write_jsonl(tmp_path / "rows.jsonl", flag_rows(True))
    res = CliRunner().invoke(app, ["check", str(p), "--json", "--max-response-tokens", "8"])
    assert res.exit_code == 3, res.output  # truncation_flag fails
    doc = json.loads(res.stdout)
    c = next(c for c in doc["checks"] if c["id"] == "truncation_flag")
    assert c["counts"]["unflagged_at_cap"] == 1 and "--max-response-tokens 8" in c["summary"]
    assert doc["config"]["max_response_tokens"] == 8
    res = CliRunner().invoke(app, ["check", str(p), "--max-response-tokens", "0"])
    assert res.exit_code == 2 and "--max-response-tokens 0 must be >= 1" in res.output  # a bad option value


def test_unanswered_tool_call_in_a_verl_rollout_dump():
    """verl's own rollout_data_dir writer (tests/data/verl_rollouts, written by another hand for the reader):
    of 3 multi-turn tool rollouts the last ends on a calc call that got no <tool_response>."""
    c = by_id(check_rollouts([DATA / "verl_rollouts" / "rollout_data" / "2.jsonl"]), "unanswered_tool_call")
    assert c.status == "warn" and c.counts == {"trajectories_checked": 3, "trajectories": 1, "ending_on_terminal_call": 0}
    assert c.examples[0].trajectory_id == "step2:2" and "calc" in c.examples[0].detail


def test_truncation_flag_without_a_known_cap(tmp_path):
    # responses 8 and 3: no common longest -> no cap; cut_unflagged ends on 24 with truncated false: warn, and the
    # same rows with --max-response-tokens 8 fail (at the cap) / pass with a cap of 20 (below it: a stop string)
    rows = [tok_row("stopped", [10, 11, 20, 2], [0, 0, 1, 1], truncated=False),
            tok_row("stopped2", [10, 11, 20, 21, 2], [0, 0, 1, 1, 1], truncated=False),
            tok_row("cut_unflagged", CUT, TWO_TURNS, truncated=False)]
    p = write_jsonl(tmp_path / "rows.jsonl", rows)  # turn ends: 2, 2, 2, 24 -> stop 2 (75%)
    c = by_id(check_rollouts([p]), "truncation_flag")
    assert c.status == "warn" and c.counts["unflagged_without_stop_below_cap"] == 1 and "no cap known" in c.summary
    assert (c.examples[0].trajectory_id, c.examples[0].turn, c.examples[0].position) == ("cut_unflagged", 1, 9)
    assert by_id(check_rollouts([p], CheckConfig(max_response_tokens=8)), "truncation_flag").status == "fail"
    assert by_id(check_rollouts([p], CheckConfig(max_response_tokens=20)), "truncation_flag").status == "pass"


def test_untrained_turn_with_placeholder_logprobs_in_a_verl_batch():
    import torch

    # one row, turns at 0-2 and 5-7 (tool tokens 3-4); rollout_log_probs 0.0 on turn 1 (the sampler never scored it)
    mask = torch.tensor([[1, 1, 1, 0, 0, 1, 1, 1]])
    lp = torch.tensor([[-0.1, -0.2, -0.3, 0.0, 0.0, 0.0, 0.0, 0.0]])
    batch = {"prompts": torch.tensor([[5, 6]]), "responses": torch.arange(8).reshape(1, 8) + 20, "response_mask": mask,
             "rollout_log_probs": lp, "old_log_probs": lp - 0.01}
    c = by_id(check_verl_batch(batch), "untrained_turns")
    assert c.status == "warn" and c.counts["turns_without_logprobs"] == 1
    assert (c.examples[0].trajectory_id, c.examples[0].turn, c.examples[0].position) == ("row0", 1, 5)
    batch["rollout_log_probs"] = torch.where(mask.bool(), torch.full_like(lp, -0.2), torch.zeros_like(lp))
    assert by_id(check_verl_batch(batch), "untrained_turns").status == "pass"


def test_cap_and_mismatch_checks_on_prime_rl_exports():
    """prime-rl's own TokenExporter (tests/data/prime_rl): 12 single-turn rows, id 2 ends every turn (inferred),
    6 rows at the longest response (16 tokens, the inferred cap) all end on it: none cut; both log-probs on 183
    policy tokens in one position bin: no trend to test, nothing flagged."""
    rep = check_rollouts([DATA / "prime_rl"])
    c = by_id(rep, "response_cap_cut")
    assert c.status == "pass" and c.counts["at_cap"] == 6 and c.counts["cut_inside_turn"] == 0
    assert c.measured["response_cap"] == 16.0 and "ends 100% of the 12 policy turns" in c.summary
    m = by_id(rep, "mismatch_by_length")
    assert m.status == "pass" and m.counts == {"trajectories_checked": 12, "tokens_checked": 183, "position_bins": 1,
                                               "length_bins": 1}
    assert m.measured["kendall_tau_position"] is None


def test_ends_on_observation_on_a_cut_openhands_history():
    """tests/data/openhands/opendevin_2024: OpenDevin's example output with its history cut to the first 2
    [action, observation] pairs (SOURCE.md: derived): the row ends on the observation of a `run` action, with
    49 turns left and no flag. A real record that ends on an observation, unmarked: the check's finding."""
    c = by_id(check_rollouts([DATA / "openhands" / "opendevin_2024"]), "ends_on_observation")
    assert c.status == "warn" and c.counts["conversations_unflagged"] == 1
    assert c.examples[0].trajectory_id == "sphinx-doc__sphinx-8721" and "tool reply to run" in c.examples[0].detail
