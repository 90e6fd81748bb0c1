"""Vectorized code against plain-Python loops on random batches, and the spec's properties.

Random batches (hypothesis): 1-4 rows, 1-12 tokens, rows of several kinds (random masks with masked spans,
one-turn rows, trailing padding, all-masked rows), float64 so the comparisons can be tight.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rl_loop_reference as ref
from critic_audit.rl import (
    AGG_MODES,
    DecoupledGAEConfig,
    GAEConfig,
    MAEConfig,
    MPOLossConfig,
    RolloutBatch,
    SAOConfig,
    VAPOConfig,
    agg_loss,
    compute_advantages,
    get_policy_loss,
    list_advantage_estimators,
    list_policy_losses,
    masked_whiten,
    reverse_linear_scan,
    turn_ids_from_mask,
    turn_log_ratios,
)

D = torch.float64
SETTINGS = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
unit = st.floats(0.0, 1.0)


@st.composite
def masks(draw, max_rows: int = 4, max_tokens: int = 12) -> torch.Tensor:
    B = draw(st.integers(1, max_rows))
    T = draw(st.integers(1, max_tokens))
    rows = []
    for _ in range(B):
        kind = draw(st.sampled_from(["random", "random", "one_turn", "padded", "empty"]))
        if kind == "empty":
            row = [False] * T
        elif kind == "one_turn":
            start = draw(st.integers(0, T - 1))
            end = draw(st.integers(start + 1, T))
            row = [start <= t < end for t in range(T)]
        else:
            row = draw(st.lists(st.booleans(), min_size=T, max_size=T))
            if kind == "padded":
                pad = draw(st.integers(1, T))
                row = row[: T - pad] + [False] * pad
        rows.append(row)
    return torch.tensor(rows, dtype=torch.bool)


@st.composite
def batches(draw, max_rows: int = 4, max_tokens: int = 12) -> RolloutBatch:
    mask = draw(masks(max_rows, max_tokens))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    B, T = mask.shape
    rewards = torch.randn(B, T, generator=g, dtype=D) * (torch.rand(B, T, generator=g) < 0.4) * mask
    values = torch.randn(B, T, generator=g, dtype=D)
    values = torch.where(mask, values, torch.full_like(values, 1e6))  # garbage at masked tokens
    old = -torch.rand(B, T, generator=g, dtype=D) * 3
    logp = old + 0.3 * torch.randn(B, T, generator=g, dtype=D)
    groups = torch.tensor(draw(st.lists(st.integers(0, 2), min_size=B, max_size=B)))
    return RolloutBatch(rewards, values, mask, old_log_probs=old, log_probs=logp, group_ids=groups)


def rows(batch: RolloutBatch):
    for b in range(batch.batch_size):
        yield (
            batch.token_rewards[b].tolist(),
            batch.values[b].tolist(),
            batch.response_mask[b].tolist(),
        )


def as_tensor(rows_out: list[list[float]]) -> torch.Tensor:
    return torch.tensor(rows_out, dtype=D)


# ---------------------------------------------------------------------------------------------
# vectorized == loop
# ---------------------------------------------------------------------------------------------


@SETTINGS
@given(st.lists(st.floats(-3, 3), min_size=1, max_size=70), st.data())
def test_scan_matches_loop(x, data):
    c = data.draw(st.lists(st.sampled_from([0.0, 0.5, 0.95, 1.0, 1e-3]), min_size=len(x), max_size=len(x)))
    got = reverse_linear_scan(torch.tensor([x], dtype=D), torch.tensor([c], dtype=D))
    assert got[0].tolist() == pytest.approx(ref.reverse_scan_row(x, c), abs=1e-12)


@SETTINGS
@given(masks())
def test_turn_ids_match_loop(mask):
    got = turn_ids_from_mask(mask)
    assert got.tolist() == [ref.turn_ids_row(row) for row in mask.tolist()]


@SETTINGS
@given(batches(), st.floats(0.5, 1.0), unit)
def test_gae_matches_loop(batch, gamma, lam):
    adv, ret = compute_advantages("gae", batch, GAEConfig(gamma=gamma, lam=lam, whiten=False))
    outs = [ref.policy_gae_row(r, v, m, gamma, lam) for r, v, m in rows(batch)]
    assert torch.allclose(adv, as_tensor([o[0] for o in outs]), atol=1e-9)
    assert torch.allclose(ret, as_tensor([o[1] for o in outs]), atol=1e-9)


@SETTINGS
@given(batches(), st.floats(0.5, 1.0), unit, unit)
def test_decoupled_gae_matches_loop(batch, gamma, lam_actor, lam_critic):
    cfg = DecoupledGAEConfig(gamma=gamma, lam_actor=lam_actor, lam_critic=lam_critic, whiten=False)
    adv, ret = compute_advantages("decoupled_gae", batch, cfg)
    adv_ref = [ref.policy_gae_row(r, v, m, gamma, lam_actor)[0] for r, v, m in rows(batch)]
    ret_ref = [ref.policy_gae_row(r, v, m, gamma, lam_critic)[1] for r, v, m in rows(batch)]
    assert torch.allclose(adv, as_tensor(adv_ref), atol=1e-9)
    assert torch.allclose(ret, as_tensor(ret_ref), atol=1e-9)


@SETTINGS
@given(batches(), st.sampled_from(["vapo", "sao"]), st.floats(0.01, 3.0))
def test_length_adaptive_gae_matches_loop(batch, name, alpha):
    cfg = (VAPOConfig if name == "vapo" else SAOConfig)(alpha=alpha, whiten=False)
    adv, ret = compute_advantages(name, batch, cfg)
    adv_ref, ret_ref = [], []
    for r, v, m in rows(batch):
        lam = ref.length_lambda(sum(m), alpha)
        adv_ref.append(ref.policy_gae_row(r, v, m, 1.0, lam)[0])
        ret_ref.append(ref.policy_gae_row(r, v, m, 1.0, 1.0)[1])
    assert torch.allclose(adv, as_tensor(adv_ref), atol=1e-9)
    assert torch.allclose(ret, as_tensor(ret_ref), atol=1e-9)


@SETTINGS
@given(batches(), st.floats(0.5, 1.0), unit, unit, st.floats(0.0, 2.0), unit, st.booleans())
def test_mae_matches_loop(batch, gamma, lam, lam_intra, beta, lam_critic, in_place):
    cfg = MAEConfig(
        gamma=gamma, lam=lam, lam_intra=lam_intra, beta=beta, lam_critic=lam_critic, whiten=False,
        intra_turn_rewards="in_place" if in_place else "turn_end",
    )
    adv, ret = compute_advantages("mae", batch, cfg)
    outs = [ref.mae_row(r, v, m, gamma, lam, lam_intra, beta, lam_critic, in_place) for r, v, m in rows(batch)]
    assert torch.allclose(adv, as_tensor([o[0] for o in outs]), atol=1e-9)
    assert torch.allclose(ret, as_tensor([o[1] for o in outs]), atol=1e-9)


@SETTINGS
@given(batches(), st.sampled_from(["grpo", "dr_grpo", "rloo"]))
def test_group_estimators_match_loop(batch, name):
    adv, ret = compute_advantages(name, batch)
    scores = batch.token_rewards.sum(dim=1).tolist()
    per_row = ref.group_advantages(scores, batch.group_ids.tolist(), name)
    mask = batch.response_mask
    expected = torch.where(mask, torch.tensor(per_row, dtype=D).unsqueeze(1).expand_as(adv), torch.zeros_like(adv))
    assert torch.allclose(adv, expected, atol=1e-9)
    assert torch.allclose(ret, as_tensor([ref.reward_to_go_row(r, m) for r, _, m in rows(batch)]), atol=1e-9)


@SETTINGS
@given(batches(), st.sampled_from(["product", "geomean"]))
def test_turn_log_ratios_match_loop(batch, mode):
    log_rho, lengths = turn_log_ratios(batch.log_probs, batch.old_log_probs, batch.turn_ids, mode)
    for b, (lp, old, m) in enumerate(
        zip(batch.log_probs.tolist(), batch.old_log_probs.tolist(), batch.response_mask.tolist())
    ):
        expected = ref.turn_log_ratio_row(lp, old, m, mode)
        K = len(expected)
        assert log_rho[b, :K].tolist() == pytest.approx(expected, abs=1e-9)
        assert torch.all(log_rho[b, K:] == 0) and torch.all(lengths[b, K:] == 0)
        assert lengths[b, :K].tolist() == [len(t) for t in ref.turns_of_row(m)]


@SETTINGS
@given(batches())
def test_whiten_matches_loop(batch):
    x = torch.randn(batch.token_rewards.shape, dtype=D)
    m = batch.response_mask
    got = masked_whiten(x, m)
    vals = x[m].tolist()
    if len(vals) >= 2:
        assert got[m].tolist() == pytest.approx(ref.whiten(vals), abs=1e-9)
    assert torch.all(got[~m] == 0)


# ---------------------------------------------------------------------------------------------
# the spec's properties
# ---------------------------------------------------------------------------------------------


def _per_turn(x: torch.Tensor, batch: RolloutBatch):
    for b in range(batch.batch_size):
        for positions in ref.turns_of_row(batch.response_mask[b].tolist()):
            yield b, positions, x[b, positions]


@SETTINGS
@given(batches(), unit, unit, st.floats(0.1, 3.0))
def test_mae_turn_mean_is_turn_advantage(batch, lam, lam_intra, beta):
    full, _ = compute_advantages("mae", batch, MAEConfig(lam=lam, lam_intra=lam_intra, beta=beta, whiten=False))
    flat, _ = compute_advantages("mae", batch, MAEConfig(lam=lam, lam_intra=lam_intra, beta=0.0, whiten=False))
    for b, positions, values in _per_turn(full, batch):
        # beta = 0: one value per turn
        assert torch.all(flat[b, positions] == flat[b, positions[0]])
        # mean over the turn of A_{k,j} = A_turn_k
        assert float(values.mean()) == pytest.approx(float(flat[b, positions[0]]), abs=1e-9)


@SETTINGS
@given(batches(max_tokens=8))
def test_mae_one_turn_lam1_is_return_minus_first_value(batch):
    # keep only the first turn of each row
    tid = batch.turn_ids
    m = tid == 0
    b1 = RolloutBatch(torch.where(m, batch.token_rewards, torch.zeros_like(batch.token_rewards)), batch.values, m)
    adv, _ = compute_advantages("mae", b1, MAEConfig(lam=1.0, beta=0.0, whiten=False))
    for b in range(b1.batch_size):
        pos = m[b].nonzero().flatten().tolist()
        if pos:
            R = float(b1.token_rewards[b].sum())
            assert float(adv[b, pos[0]]) == pytest.approx(R - float(b1.values[b, pos[0]]), abs=1e-12)


@SETTINGS
@given(batches(), st.sampled_from([float("nan"), float("inf"), -1e30, 0.0]))
def test_masked_values_change_nothing(batch, garbage):
    other = RolloutBatch(
        batch.token_rewards,
        torch.where(batch.response_mask, batch.values, torch.full_like(batch.values, garbage)),
        batch.response_mask,
        group_ids=batch.group_ids,
    )
    for name in list_advantage_estimators():
        a1, r1 = compute_advantages(name, batch)
        a2, r2 = compute_advantages(name, other)
        assert torch.equal(a1, a2), name
        assert torch.equal(r1, r2), name
        assert torch.all(a1[~batch.response_mask] == 0) and torch.all(r1[~batch.response_mask] == 0)


@SETTINGS
@given(batches(), st.lists(st.floats(-5, 5), min_size=3, max_size=3))
def test_group_estimators_unchanged_by_group_constant(batch, shifts):
    # add shifts[g] to every row of group g (on its last policy token; rows without one are skipped)
    has = batch.response_mask.any(dim=1)
    T = batch.num_tokens
    last = torch.where(batch.response_mask, torch.arange(T), -1).max(dim=1).values.clamp(min=0)
    r = batch.token_rewards.clone()
    for b in range(batch.batch_size):
        if has[b]:
            r[b, last[b]] += shifts[int(batch.group_ids[b])]
    # a row without a policy token contributes R = 0 to its group, so only shift groups where every row has one
    full_groups = {int(g) for g in batch.group_ids if bool(has[batch.group_ids == g].all())}
    shifted = RolloutBatch(r, batch.values, batch.response_mask, group_ids=batch.group_ids)
    for name in ("grpo", "dr_grpo", "rloo"):
        a1, _ = compute_advantages(name, batch)
        a2, _ = compute_advantages(name, shifted)
        for b in range(batch.batch_size):
            g = int(batch.group_ids[b])
            if g in full_groups and int((batch.group_ids == g).sum()) > 1:
                assert torch.allclose(a1[b], a2[b], atol=1e-6), (name, b)


@SETTINGS
@given(batches(), st.integers(1, 5))
def test_estimators_unchanged_by_padding(batch, pad):
    B, T = batch.token_rewards.shape

    def padded(x: torch.Tensor, fill: float) -> torch.Tensor:
        return torch.cat([x, torch.full((B, pad), fill, dtype=x.dtype)], dim=1)

    other = RolloutBatch(
        padded(batch.token_rewards, 0.0),
        padded(batch.values, float("nan")),
        padded(batch.response_mask, False),
        group_ids=batch.group_ids,
    )
    for name in list_advantage_estimators():
        a1, r1 = compute_advantages(name, batch)
        a2, r2 = compute_advantages(name, other)
        assert torch.allclose(a1, a2[:, :T], atol=1e-12), name
        assert torch.allclose(r1, r2[:, :T], atol=1e-12), name
        assert torch.all(a2[:, T:] == 0)


@SETTINGS
@given(batches(), st.integers(1, 4), st.sampled_from(AGG_MODES))
def test_losses_unchanged_by_padding(batch, pad, mode):
    B, T = batch.token_rewards.shape
    adv = torch.randn(B, T, dtype=D)

    def padded(x: torch.Tensor, fill) -> torch.Tensor:
        x = torch.cat([x, torch.full((B, pad), fill, dtype=x.dtype)], dim=1)
        return torch.cat([x, torch.full((1, T + pad), fill, dtype=x.dtype)], dim=0)  # plus a fully masked row

    for name in list_policy_losses():
        loss_fn = get_policy_loss(name)
        cfg = loss_fn.config_cls(loss_agg_mode=mode, loss_norm_constant=7.0)
        lp1 = batch.log_probs.clone().requires_grad_(True)
        l1, m1 = loss_fn(lp1, batch.old_log_probs, adv, batch.response_mask, config=cfg)
        lp2 = padded(batch.log_probs, float("nan")).requires_grad_(True)
        l2, m2 = loss_fn(
            lp2, padded(batch.old_log_probs, 3.0), padded(adv, float("nan")),
            padded(batch.response_mask, False), config=cfg,
        )
        assert l1.item() == pytest.approx(l2.item(), abs=1e-12), name
        l1.backward()
        l2.backward()
        assert torch.allclose(lp1.grad, lp2.grad[:B, :T], atol=1e-12), name
        assert torch.all(lp2.grad[:, T:] == 0) and torch.all(lp2.grad[B:] == 0)
        for key in m1:
            if not (math.isnan(m1[key]) and math.isnan(m2[key])):
                assert m1[key] == pytest.approx(m2[key], abs=1e-9), (name, key)


@SETTINGS
@given(batches(), st.sampled_from(["product", "geomean"]))
def test_mpo_gradient_is_rho_times_grad_logp(batch, mode):
    """Inside the clip range, d loss / d logp_j = -(1/N) A_j rho_k, and through a softmax policy
    d loss / d theta = -(1/N) sum_j A_j rho_k grad_theta logp_j."""
    B, T = batch.token_rewards.shape
    mask = batch.response_mask
    N = max(int(mask.sum()), 1)
    g = torch.Generator().manual_seed(0)
    vocab = 5
    theta = torch.randn(B, T, vocab, generator=g, dtype=D, requires_grad=True)
    actions = torch.randint(0, vocab, (B, T), generator=g)
    logp = torch.log_softmax(theta, dim=-1).gather(-1, actions.unsqueeze(-1)).squeeze(-1)
    old = (logp + 0.2 * torch.randn(B, T, generator=g, dtype=D)).detach()
    adv = torch.randn(B, T, generator=g, dtype=D)
    cfg = MPOLossConfig(mode=mode, eps_low=0.999, eps_high=1e9)  # nothing clipped
    loss, _ = get_policy_loss("mpo")(logp, old, adv, mask, config=cfg)
    loss.backward()

    log_rho, _ = turn_log_ratios(logp.detach(), old, batch.turn_ids, mode)
    rho_tok = torch.exp(torch.gather(log_rho, 1, batch.turn_ids.clamp(min=0)))
    coef = torch.where(mask, -adv * rho_tok / N, torch.zeros_like(adv))  # d loss / d logp_j
    # grad_theta logp_j = onehot(a_j) - softmax(theta_j)
    grad_logp = torch.nn.functional.one_hot(actions, vocab).to(D) - torch.softmax(theta.detach(), dim=-1)
    expected = coef.unsqueeze(-1) * grad_logp
    assert torch.allclose(theta.grad, expected, atol=1e-10)


def test_mpo_gradient_zero_on_clipped_tokens():
    # one turn of 2 tokens with log rho = 0.5 (rho 1.65 > 1.2) and A > 0: clipped, no gradient;
    # a second turn with log rho = 0.05 (inside): gradient -A rho / N
    mask = torch.tensor([[1, 1, 0, 1, 1]], dtype=torch.bool)
    old = torch.zeros(1, 5, dtype=D)
    logp = torch.tensor([[0.25, 0.25, 0.0, 0.05, 0.0]], dtype=D, requires_grad=True)
    adv = torch.tensor([[1.0, 1.0, 0.0, 1.0, 1.0]], dtype=D)
    loss, metrics = get_policy_loss("mpo")(logp, old, adv, mask)
    loss.backward()
    rho = math.exp(0.05)
    assert logp.grad[0].tolist() == pytest.approx([0.0, 0.0, 0.0, -rho / 4, -rho / 4], abs=1e-12)
    assert metrics["actor/turn_clipfrac"] == 0.5


@SETTINGS
@given(batches())
def test_agg_modes_reduce_to_token_mean_for_uniform_rows(batch):
    # a constant loss of 2.0: every mean mode gives 2.0; token-sum modes give 2 * mean length
    m = batch.response_mask
    loss = torch.full(m.shape, 2.0, dtype=D)
    if not bool(m.any()):
        assert agg_loss(loss, m, "token-mean").item() == 0.0
        return
    assert agg_loss(loss, m, "token-mean").item() == pytest.approx(2.0)
    assert agg_loss(loss, m, "seq-mean-token-mean").item() == pytest.approx(2.0)
    lengths = m.sum(dim=1)
    mean_len = float(lengths[lengths > 0].double().mean())
    assert agg_loss(loss, m, "seq-mean-token-sum").item() == pytest.approx(2.0 * mean_len)


def test_scan_is_differentiable_and_agrees():
    # y = scan(x, c) is linear in x: d sum(w * y) / d x_j = sum_{t <= j} w_t prod_{m=t}^{j-1} c_m
    # with c = [.5, .5, .5], w = [1, 1, 1]: grads = [1, 1 + .5, 1 + .5 + .25] = [1, 1.5, 1.75]
    x = torch.tensor([[1.0, 2.0, 3.0]], dtype=D, requires_grad=True)
    c = torch.full((1, 3), 0.5, dtype=D)
    y = reverse_linear_scan(x, c)
    # forward: y_2 = 3, y_1 = 2 + 1.5 = 3.5, y_0 = 1 + 1.75 = 2.75
    assert y[0].tolist() == [2.75, 3.5, 3.0]
    y.sum().backward()
    assert x.grad[0].tolist() == [1.0, 1.5, 1.75]
