"""No stopping-time bias: episodes that stop at different turns, with intermediate rewards.

verl RFC #7244: normalising per-turn advantages per turn *index* and summing them subtracts a baseline
whose number of terms is set by the episode's own stopping turn; the baseline then depends on the action
("take another turn?"), and the policy gradient is biased by the accumulated intermediate-reward mean.
MAE's baseline is the critic's V at the turn's first token, a function of the state only, so with exact
values E[A_turn_0 | a_0] = Q(s_0, a_0) - V(s_0) for every lambda.

The environment (exact enumeration, i.e. the infinite-group limit):

    turn 0: the agent answers now ("stop", prob 1/2) or calls a tool ("tool", prob 1/2)
      stop: the episode ends after turn 0; outcome reward 1 w.p. p_stop, else 0 (on turn 0's last token)
      tool: intermediate reward c on turn 0's last token; tool output (masked); turn 1 ends the episode
            with outcome reward 1 w.p. p_tool, else 0

    Q(stop) = p_stop;  Q(tool) = c + p_tool;  V(s_0) = (Q(stop) + Q(tool)) / 2;  V(s_1) = p_tool

Layout (8 positions): prompt | turn0 turn0 | tool tool | turn1 turn1 | pad; stop rows end after turn 0.
"""

from __future__ import annotations

import pytest
import torch

from critic_audit.rl import MAEConfig, RolloutBatch, compute_advantages

D = torch.float64
STOP_MASK = [0, 1, 1, 0, 0, 0, 0, 0]
TOOL_MASK = [0, 1, 1, 0, 0, 1, 1, 0]


def episodes(c: float, p_stop: float, p_tool: float):
    """Four trajectories (stop/success, stop/failure, tool/success, tool/failure), their probabilities,
    the exact values, and whether each took the tool."""
    q_stop, q_tool = p_stop, c + p_tool
    v0, v1 = (q_stop + q_tool) / 2, p_tool
    r = torch.zeros(4, 8, dtype=D)
    r[0, 2] = 1.0  # stop, success
    r[2, 2] = r[3, 2] = c  # tool: intermediate reward
    r[2, 6] = 1.0  # tool, success
    v = torch.zeros(4, 8, dtype=D)
    v[:, 1:3] = v0  # every turn-0 token: V(s_0)
    v[2:, 5:7] = v1  # turn-1 tokens: V(s_1)
    mask = torch.tensor([STOP_MASK, STOP_MASK, TOOL_MASK, TOOL_MASK], dtype=torch.bool)
    probs = torch.tensor([0.5 * p_stop, 0.5 * (1 - p_stop), 0.5 * p_tool, 0.5 * (1 - p_tool)], dtype=D)
    tool = torch.tensor([False, False, True, True])
    return RolloutBatch(r, v, mask), probs, tool, q_stop, q_tool


def conditional_mean(x: torch.Tensor, probs: torch.Tensor, sel: torch.Tensor) -> float:
    return float((x * probs)[sel].sum() / probs[sel].sum())


def per_turn_index_normalised(batch: RolloutBatch, probs: torch.Tensor) -> torch.Tensor:
    """The biased construction (MT-GRPO-style, mean only): Ahat_{i,k} = R_{i,k} - mean over episodes that
    reached turn k of R_{.,k}; the advantage of turn 0 is sum_{k < K_i} Ahat_{i,k}. Returns (B,)."""
    tid = batch.turn_ids
    K = int(tid.max()) + 1
    R = torch.stack([torch.where(tid == k, batch.token_rewards, 0).sum(1) for k in range(K)], 1)
    has = torch.stack([(tid == k).any(1) for k in range(K)], 1)
    means = torch.stack([(R[:, k] * probs)[has[:, k]].sum() / probs[has[:, k]].sum() for k in range(K)])
    return torch.where(has, R - means, torch.zeros_like(R)).sum(1)


def test_reference_construction_is_biased_and_ours_is_not():
    # c = .3, p_stop = .4, p_tool = .5: Q(stop) = .4, Q(tool) = .8, V(s_0) = .6, V(s_1) = .5
    # true advantages: A(stop) = -.2, A(tool) = +.2; Q(tool) - Q(stop) = .4
    # per-turn-index normalisation: turn-0 rewards 1 (p .2), 0 (p .2), .3 (p .5) -> m_0 = .2 + .15 = .35
    #   turn-1 rewards (tool episodes only) 1 / 0, equally likely -> m_1 = .5
    #   E[A | stop] = .4 - .35 = .05;  E[A | tool] = (.3 - .35) + (.5 - .5) = -.05  -> difference -.1 (wrong sign)
    # ours (turn-level GAE, exact V, any lambda): stop: R - .6 -> E = .4 - .6 = -.2
    #   tool: delta_0 = .3 + .5 - .6 = .2, delta_1 = R_1 - .5 (mean 0) -> E = .2
    batch, probs, tool, q_stop, q_tool = episodes(0.3, 0.4, 0.5)
    biased = per_turn_index_normalised(batch, probs)
    assert conditional_mean(biased, probs, ~tool) == pytest.approx(0.05)
    assert conditional_mean(biased, probs, tool) == pytest.approx(-0.05)
    for lam in (0.0, 0.5, 0.8, 1.0):
        adv, _ = compute_advantages("mae", batch, MAEConfig(lam=lam, beta=0.0, whiten=False))
        a0 = adv[:, 1]  # turn 0's advantage (beta = 0: one value per turn)
        assert conditional_mean(a0, probs, ~tool) == pytest.approx(-0.2, abs=1e-12)
        assert conditional_mean(a0, probs, tool) == pytest.approx(0.2, abs=1e-12)


@pytest.mark.parametrize("c", [-0.5, 0.0, 0.3, 1.0])
@pytest.mark.parametrize("p_stop, p_tool", [(0.1, 0.9), (0.7, 0.2), (0.5, 0.5)])
@pytest.mark.parametrize("beta", [0.0, 1.0])
def test_mae_turn_advantage_is_unbiased(c, p_stop, p_tool, beta):
    batch, probs, tool, q_stop, q_tool = episodes(c, p_stop, p_tool)
    v0 = (q_stop + q_tool) / 2
    for lam in (0.0, 0.8, 1.0):
        adv, _ = compute_advantages("mae", batch, MAEConfig(lam=lam, beta=beta, whiten=False))
        # the mean over turn 0's tokens is A_turn_0 (beta > 0 only redistributes within the turn)
        a0 = adv[:, 1:3].mean(dim=1)
        assert conditional_mean(a0, probs, ~tool) == pytest.approx(q_stop - v0, abs=1e-12)
        assert conditional_mean(a0, probs, tool) == pytest.approx(q_tool - v0, abs=1e-12)
    # the per-turn-index construction is off by exactly the turn-1 group mean, p_tool, whenever p_tool != 0
    biased = per_turn_index_normalised(batch, probs)
    gap = conditional_mean(biased, probs, tool) - conditional_mean(biased, probs, ~tool)
    assert gap == pytest.approx((q_tool - q_stop) - p_tool, abs=1e-12)


def test_mae_row_does_not_depend_on_other_rows():
    # no per-turn-index statistics: a row's advantage is the same alone or beside episodes that stop elsewhere
    batch, _, _, _, _ = episodes(0.3, 0.4, 0.5)
    together, _ = compute_advantages("mae", batch, MAEConfig(whiten=False))
    for b in range(4):
        alone, _ = compute_advantages("mae", batch.select(slice(b, b + 1)), MAEConfig(whiten=False))
        assert torch.equal(alone[0], together[b])
