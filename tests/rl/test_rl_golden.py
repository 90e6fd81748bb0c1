"""Hand-computed golden values for every estimator and loss, on 2-turn rows of 8 positions.

The standard row (positions 0..7):

    position      0       1     2     3      4     5     6     7
    kind          prompt  turn0 turn0 tool   turn1 turn1 turn1 pad
    mask          0       1     1     0      1     1     1     0
    reward        0       0     0.5   0      0     0     1.0   0
    value         9       0.2   0.3   9      0.5   0.6   0.7   9      (9 = garbage, must be ignored)

Every expected number below is derived by hand in the comments.
"""

from __future__ import annotations

import math

import pytest
import torch

from critic_audit.rl import (
    DecoupledGAEConfig,
    GAEConfig,
    GRPOConfig,
    GSPOLossConfig,
    MAEConfig,
    MPOLossConfig,
    PPOLossConfig,
    RolloutBatch,
    SAOConfig,
    SAOLossConfig,
    VAPOConfig,
    ValueLossConfig,
    agg_loss,
    compute_advantages,
    explained_variance,
    get_policy_loss,
    positive_nll_loss,
    value_loss,
)

D = torch.float64
MASK = [0, 1, 1, 0, 1, 1, 1, 0]
POLICY = [1, 2, 4, 5, 6]


def standard_batch(**kw) -> RolloutBatch:
    return RolloutBatch(
        token_rewards=torch.tensor([[0, 0, 0.5, 0, 0, 0, 1.0, 0]], dtype=D),
        values=torch.tensor([[9, 0.2, 0.3, 9, 0.5, 0.6, 0.7, 9]], dtype=D),
        response_mask=torch.tensor([MASK], dtype=torch.bool),
        **kw,
    )


def at_policy(x: torch.Tensor) -> list[float]:
    return [float(x[0, t]) for t in POLICY]


def assert_zero_at_masked(x: torch.Tensor) -> None:
    assert [float(x[0, t]) for t in (0, 3, 7)] == [0.0, 0.0, 0.0]


# ---------------------------------------------------------------------------------------------
# estimators
# ---------------------------------------------------------------------------------------------


def test_mae_golden():
    # Turns: turn0 = {1, 2}, turn1 = {4, 5, 6}. R_0 = 0.5, R_1 = 1.0; V_0 = V[1] = 0.2, V_1 = V[4] = 0.5, V_2 = 0.
    # delta_1 = 1.0 + 0 - 0.5 = 0.5;  delta_0 = 0.5 + 0.5 - 0.2 = 0.8
    # A_turn_1 = 0.5;  A_turn_0 = 0.8 + 0.8 * 0.5 = 1.2
    # turn 0: G_0 = 0.5 + 0.5 = 1.0; d = [0.3 - 0.2, 1.0 - 0.3] = [0.1, 0.7]
    #   a = [0.1 + 0.95 * 0.7, 0.7] = [0.765, 0.7], mean 0.7325 -> A = [1.2325, 1.1675]
    # turn 1: G_1 = 1.0; d = [0.1, 0.1, 1.0 - 0.7 = 0.3]
    #   a_2 = 0.3, a_1 = 0.1 + 0.95 * 0.3 = 0.385, a_0 = 0.1 + 0.95 * 0.385 = 0.46575
    #   mean = 1.15075 / 3 = 0.38358333 -> A = [0.58216667, 0.50141667, 0.41641667]
    # returns (lam_critic 1, gamma 1): reward-to-go: turn0 tokens 1.5, turn1 tokens 1.0
    adv, ret = compute_advantages("mae", standard_batch(), MAEConfig(whiten=False))
    expected = [1.2325, 1.1675, 0.58216667, 0.50141667, 0.41641667]
    assert at_policy(adv) == pytest.approx(expected, abs=1e-7)
    assert at_policy(ret) == pytest.approx([1.5, 1.5, 1.0, 1.0, 1.0], abs=1e-12)
    assert_zero_at_masked(adv)
    assert_zero_at_masked(ret)


def test_mae_beta_zero_and_in_place_golden():
    # beta = 0: one value per turn, A_turn = [1.2, 0.5]
    adv, _ = compute_advantages("mae", standard_batch(), MAEConfig(beta=0.0, whiten=False))
    assert at_policy(adv) == pytest.approx([1.2, 1.2, 0.5, 0.5, 0.5], abs=1e-12)
    # in_place: turn 0 d = [0 + 0.3 - 0.2, 0.5 + 1.0 * 0.5 - 0.3] = [0.1, 0.7]: same as turn_end here
    # because the only intra-turn reward sits on the turn's last token; turn 1 likewise.
    adv2, _ = compute_advantages("mae", standard_batch(), MAEConfig(intra_turn_rewards="in_place", whiten=False))
    assert at_policy(adv2) == pytest.approx([1.2325, 1.1675, 0.58216667, 0.50141667, 0.41641667], abs=1e-7)


def test_mae_in_place_differs_when_reward_mid_turn():
    # Reward 0.5 moved to position 1 (first token of turn 0). R_0 unchanged, so A_turn unchanged.
    # turn_end: d = [0.3 - 0.2, 1.0 - 0.3] = [0.1, 0.7]     -> a = [0.765, 0.7], A = [1.2325, 1.1675]
    # in_place: d = [0.5 + 0.3 - 0.2, 0 + 0.5 - 0.3] = [0.6, 0.2] -> a = [0.6 + 0.19, 0.2] = [0.79, 0.2],
    #           mean 0.495 -> A = [1.2 + 0.295, 1.2 - 0.295] = [1.495, 0.905]
    b = RolloutBatch(
        token_rewards=torch.tensor([[0, 0.5, 0, 0, 0, 0, 1.0, 0]], dtype=D),
        values=standard_batch().values,
        response_mask=standard_batch().response_mask,
    )
    a1, _ = compute_advantages("mae", b, MAEConfig(whiten=False))
    a2, _ = compute_advantages("mae", b, MAEConfig(whiten=False, intra_turn_rewards="in_place"))
    assert at_policy(a1)[:2] == pytest.approx([1.2325, 1.1675], abs=1e-12)
    assert at_policy(a2)[:2] == pytest.approx([1.495, 0.905], abs=1e-12)


def test_gae_golden_skips_masked_tokens():
    # Policy tokens in order: 1 (V .2), 2 (V .3, r .5), 4 (V .5), 5 (V .6), 6 (V .7, r 1).
    # The next value of token 2 is V[4] = 0.5 (not the garbage V[3] = 9).
    # deltas: 0 + .3 - .2 = .1; .5 + .5 - .3 = .7; .6 - .5 = .1; .7 - .6 = .1; 1 + 0 - .7 = .3
    # A_6 = .3; A_5 = .1 + .95 * .3 = .385; A_4 = .1 + .95 * .385 = .46575
    # A_2 = .7 + .95 * .46575 = 1.1424625; A_1 = .1 + .95 * 1.1424625 = 1.185339375
    # returns = A + V: 1.385339375, 1.4424625, .96575, .985, 1.0
    adv, ret = compute_advantages("gae", standard_batch(), GAEConfig(whiten=False))
    assert at_policy(adv) == pytest.approx([1.185339375, 1.1424625, 0.46575, 0.385, 0.3], abs=1e-12)
    assert at_policy(ret) == pytest.approx([1.385339375, 1.4424625, 0.96575, 0.985, 1.0], abs=1e-12)
    assert_zero_at_masked(adv)


def test_decoupled_gae_golden():
    # advantages as GAE with lam 0.95; returns with lam 1 = reward-to-go: 1.5, 1.5, 1, 1, 1
    adv, ret = compute_advantages("decoupled_gae", standard_batch(), DecoupledGAEConfig(whiten=False))
    assert at_policy(adv) == pytest.approx([1.185339375, 1.1424625, 0.46575, 0.385, 0.3], abs=1e-12)
    assert at_policy(ret) == pytest.approx([1.5, 1.5, 1.0, 1.0, 1.0], abs=1e-12)


def test_vapo_golden():
    # l = 5 policy tokens. alpha = 0.5: lam = 1 - 1 / 2.5 = 0.6
    # A_6 = .3; A_5 = .1 + .6 * .3 = .28; A_4 = .1 + .6 * .28 = .268
    # A_2 = .7 + .6 * .268 = .8608; A_1 = .1 + .6 * .8608 = .61648
    adv, ret = compute_advantages("vapo", standard_batch(), VAPOConfig(alpha=0.5, whiten=False))
    assert at_policy(adv) == pytest.approx([0.61648, 0.8608, 0.268, 0.28, 0.3], abs=1e-12)
    assert at_policy(ret) == pytest.approx([1.5, 1.5, 1.0, 1.0, 1.0], abs=1e-12)
    # default alpha = 0.05: 1 - 1 / 0.25 = -3, clamped to 0: A = the TD errors
    adv0, _ = compute_advantages("vapo", standard_batch(), VAPOConfig(whiten=False))
    assert at_policy(adv0) == pytest.approx([0.1, 0.7, 0.1, 0.1, 0.3], abs=1e-12)


def test_sao_golden():
    # alpha = 1.5, l = 5: lam = 1 - 1 / 7.5 = 13/15
    # A_6 = .3; A_5 = .1 + 13/15 * .3 = .36; A_4 = .1 + 13/15 * .36 = .412
    # A_2 = .7 + 13/15 * .412 = 1.05706667; A_1 = .1 + 13/15 * 1.05706667 = 1.01612444
    adv, _ = compute_advantages("sao", standard_batch(), SAOConfig(whiten=False))
    assert at_policy(adv) == pytest.approx([1.01612444, 1.05706667, 0.412, 0.36, 0.3], abs=1e-7)


def group_batch() -> RolloutBatch:
    # 4 rows with the standard layout. R = 1.5, 0.0, 1.0 (group 0) and 1.0 (group 1, alone).
    r = torch.zeros(4, 8, dtype=D)
    r[0, 2], r[0, 6] = 0.5, 1.0
    r[2, 6] = 1.0
    r[3, 6] = 1.0
    return RolloutBatch(
        token_rewards=r,
        values=torch.zeros(4, 8, dtype=D),
        response_mask=torch.tensor([MASK] * 4, dtype=torch.bool),
        group_ids=torch.tensor([0, 0, 0, 1]),
    )


def test_grpo_golden():
    # group 0: mean = 2.5 / 3 = 0.8333333; deviations .6666667, -.8333333, .1666667
    # squares .4444444 + .6944444 + .0277778 = 1.1666667; / (3 - 1) = .5833333; std = .7637626
    # A = .6666667 / .7637626 = .8728716, -1.0910895, .2182179; row 3 alone: mean 0, std 1 -> 1 / (1 + 1e-6)
    adv, ret = compute_advantages("grpo", group_batch())
    expected = [0.8728716, -1.0910895, 0.2182179, 1.0 / (1.0 + 1e-6)]
    got = [float(adv[i, 4]) for i in range(4)]
    assert got == pytest.approx(expected, abs=2e-6)
    # same advantage on every policy token, 0 at masked ones
    assert torch.all(adv[:, POLICY] == adv[:, [1]])
    assert torch.all(adv[:, [0, 3, 7]] == 0)
    # returns: reward-to-go; row 0 turn0 tokens 1.5, turn1 tokens 1.0
    assert [float(ret[0, t]) for t in POLICY] == [1.5, 1.5, 1.0, 1.0, 1.0]


def test_dr_grpo_and_rloo_golden():
    # dr_grpo: R - mean: .6666667, -.8333333, .1666667; singleton: 1.0 - 0
    adv, _ = compute_advantages("dr_grpo", group_batch())
    assert [float(adv[i, 1]) for i in range(4)] == pytest.approx([2 / 3, -5 / 6, 1 / 6, 1.0], abs=1e-12)
    # rloo: baselines (0 + 1) / 2 = .5, (1.5 + 1) / 2 = 1.25, (1.5 + 0) / 2 = .75; singleton baseline 0
    adv, _ = compute_advantages("rloo", group_batch())
    assert [float(adv[i, 1]) for i in range(4)] == pytest.approx([1.0, -1.25, 0.25, 1.0], abs=1e-12)
    # grpo with norm_by_std=False equals dr_grpo
    adv_g, _ = compute_advantages("grpo", group_batch(), GRPOConfig(norm_by_std=False))
    assert [float(adv_g[i, 1]) for i in range(4)] == pytest.approx([2 / 3, -5 / 6, 1 / 6, 1.0], abs=1e-12)


def test_whitening_golden():
    # beta = 0 MAE: [1.2, 1.2, .5, .5, .5]; mean = 3.9 / 5 = .78
    # deviations .42, .42, -.28, -.28, -.28; squares sum = 2 * .1764 + 3 * .0784 = .588; var = .588 / 4 = .147
    # whitened: .42 / sqrt(.147) = 1.0954451, -.28 / sqrt(.147) = -.7302967
    adv, _ = compute_advantages("mae", standard_batch(), MAEConfig(beta=0.0, whiten=True))
    assert at_policy(adv) == pytest.approx([1.0954451, 1.0954451, -0.7302967, -0.7302967, -0.7302967], abs=1e-6)
    assert_zero_at_masked(adv)


# ---------------------------------------------------------------------------------------------
# losses. Token log-ratios d = logp - old at policy tokens 1, 2, 4, 5, 6: [0.3, -0.05, 0.3, 0.0, -0.2]
# old_logp = -1 everywhere, so logp = [-0.7, -1.05, -0.7, -1.0, -1.2]; NaN at masked positions.
# ratios r = exp(d): 1.3498588, 0.9512294, 1.3498588, 1.0, 0.8187308
# advantages at policy tokens: [1, 1, -1, -1, 2]
# ---------------------------------------------------------------------------------------------


def loss_inputs():
    old = torch.full((1, 8), -1.0, dtype=D)
    logp = torch.full((1, 8), float("nan"), dtype=D)
    logp[0, POLICY] = torch.tensor([-0.7, -1.05, -0.7, -1.0, -1.2], dtype=D)
    adv = torch.full((1, 8), 123.0, dtype=D)  # garbage at masked positions
    adv[0, POLICY] = torch.tensor([1.0, 1.0, -1.0, -1.0, 2.0], dtype=D)
    mask = torch.tensor([MASK], dtype=torch.bool)
    return logp.requires_grad_(True), old, adv, mask


def test_ppo_loss_golden():
    # token 1: A = 1, r = 1.3498588 -> max(-1.3498588, -1.2) = -1.2 (clipped)
    # token 2: A = 1, r = .9512294 -> -.9512294
    # token 4: A = -1, r = 1.3498588 -> max(1.3498588, 1.2) = 1.3498588 (unclipped branch)
    # token 5: A = -1, r = 1 -> 1.0
    # token 6: A = 2, r = .8187308 (inside [.8, 1.2]) -> -1.6374615
    # token-mean: (-1.2 - .9512294 + 1.3498588 + 1.0 - 1.6374615) / 5 = -1.4388321 / 5 = -.2877664
    logp, old, adv, mask = loss_inputs()
    loss, metrics = get_policy_loss("ppo")(logp, old, adv, mask)
    assert loss.item() == pytest.approx(-0.2877664, abs=1e-6)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(0.2)
    # k1 = mean(old - new) = -(0.3 - 0.05 + 0.3 + 0 - 0.2) / 5 = -0.07
    assert metrics["actor/ppo_kl"] == pytest.approx(-0.07, abs=1e-9)
    # k3 = mean(r - 1 - d): (.3498588 - .3) + (-.0487706 + .05) + (.0498588) + 0 + (-.1812692 + .2)
    #    = .0498588 + .0012294 + .0498588 + 0 + .0187308 = .1196778 / 5 = .0239356
    assert metrics["actor/approx_kl_k3"] == pytest.approx(0.0239356, abs=1e-6)
    loss.backward()
    assert torch.isfinite(logp.grad).all()
    # gradient: d loss / d logp_t = -A_t r_t / 5 on unclipped tokens, 0 on the clipped one and masked ones
    # token 2: -.9512294 / 5 = -.1902459; token 4: 1.3498588 / 5 = .2699718; token 6: -2 * .8187308 / 5 = -.3274923
    g = logp.grad[0]
    assert [float(g[t]) for t in (0, 1, 2, 3, 4, 5, 6, 7)] == pytest.approx(
        [0, 0, -0.1902459, 0, 0.2699718, 0.2, -0.3274923, 0], abs=1e-6
    )


def test_ppo_dual_clip_golden():
    # token 4 gets d = 1.5: r = 4.4816891, A = -1 -> clip loss max(4.4816891, 1.2) = 4.4816891 > 3 -> capped at 3
    # sum = -1.2 - .9512294 + 3 + 1 - 1.6374615 = .2113091; / 5 = .0422618; clipfrac_lower = 1 / 5
    logp, old, adv, mask = loss_inputs()
    with torch.no_grad():
        logp[0, 4] = 0.5
    loss, metrics = get_policy_loss("ppo")(logp, old, adv, mask, config=PPOLossConfig(dual_clip_c=3.0))
    assert loss.item() == pytest.approx(0.0422618, abs=1e-6)
    assert metrics["actor/pg_clipfrac_lower"] == pytest.approx(0.2)


def test_ppo_clip_higher_golden():
    # eps_high = 0.4: token 1's r = 1.3498588 < 1.4 no longer clipped -> -1.3498588
    # sum = -1.3498588 - .9512294 + 1.3498588 + 1 - 1.6374615 = -1.5886909; / 5 = -.3177382
    logp, old, adv, mask = loss_inputs()
    loss, metrics = get_policy_loss("ppo")(logp, old, adv, mask, config=PPOLossConfig(eps_high=0.4))
    assert loss.item() == pytest.approx(-0.3177382, abs=1e-6)
    assert metrics["actor/pg_clipfrac"] == 0.0


def test_gspo_loss_golden():
    # log s = (.3 - .05 + .3 + 0 - .2) / 5 = .07; s = exp(.07) = 1.0725082 on every token
    # eps .2/.2: inside, loss = -sum(A) * s / 5 = -2 * 1.0725082 / 5 = -.4290033
    logp, old, adv, mask = loss_inputs()
    loss, _ = get_policy_loss("gspo")(logp, old, adv, mask, config=GSPOLossConfig(eps_low=0.2, eps_high=0.2))
    assert loss.item() == pytest.approx(-0.4290033, abs=1e-6)
    # defaults eps 3e-4 / 4e-4: A > 0 tokens clipped to -1.0004 (3 of them, A = 1, 1, 2 -> -1.0004, -1.0004, -2.0008)
    # A < 0 tokens keep 1.0725082 each. sum = -4.0016 + 2.1450164 = -1.8565836; / 5 = -.3713167
    loss, metrics = get_policy_loss("gspo")(logp, old, adv, mask)
    assert loss.item() == pytest.approx(-0.3713167, abs=1e-6)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(0.6)
    assert metrics["actor/seq_clipfrac"] == 1.0


def test_mpo_loss_product_golden():
    # turn 0 (tokens 1, 2): log rho = .3 - .05 = .25, rho = 1.2840254; turn 1 (4, 5, 6): .3 + 0 - .2 = .1, rho = 1.1051709
    # turn 0, A = 1: max(-1.2840254, -1.2) = -1.2 each (clipped); turn 1: A = -1 -> 1.1051709 twice;
    # A = 2 -> -2.2103418. sum = -2.4 + 2.2103418 - 2.2103418 = -2.4; token-mean = -.48
    logp, old, adv, mask = loss_inputs()
    loss, metrics = get_policy_loss("mpo")(logp, old, adv, mask)
    assert loss.item() == pytest.approx(-0.48, abs=1e-6)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(0.4)
    assert metrics["actor/turn_clipfrac"] == pytest.approx(0.5)
    # turn-ratio diagnostics, both turns in bucket [1,64):
    # product log rho {.25, .1}: unbiased var = 2 * .075^2 / 1 = .01125
    # geomean log rho {.125, .0333333}: var = (.0916667)^2 / 2 = .0042014
    assert metrics["actor/turn_ratio/product/log_rho_var/[1,64)"] == pytest.approx(0.01125, abs=1e-9)
    assert metrics["actor/turn_ratio/geomean/log_rho_var/[1,64)"] == pytest.approx(0.0042014, abs=1e-7)
    assert metrics["actor/turn_ratio/turn_count/[1,64)"] == 2
    assert metrics["actor/turn_ratio/turn_count/[64,256)"] == 0
    assert math.isnan(metrics["actor/turn_ratio/product/log_rho_var/[64,256)"])
    # geomean rho: 1.1331485 (in band), 1.0338951 (in band) -> clip fraction 0
    assert metrics["actor/turn_ratio/geomean/clipfrac"] == 0.0
    assert metrics["actor/turn_ratio/product/clipfrac"] == pytest.approx(0.5)


def test_mpo_loss_geomean_golden():
    # turn 0: rho = exp(.125) = 1.1331485, A = 1 -> -1.1331485 twice
    # turn 1: rho = exp(.0333333) = 1.0338951 -> A = -1: 1.0338951 twice, A = 2: -2.0677902
    # sum = -2.2662970 + 2.0677902 - 2.0677902 = -2.2662970; / 5 = -.4532594
    logp, old, adv, mask = loss_inputs()
    loss, metrics = get_policy_loss("mpo")(logp, old, adv, mask, config=MPOLossConfig(mode="geomean"))
    assert loss.item() == pytest.approx(-0.4532594, abs=1e-6)
    assert metrics["actor/pg_clipfrac"] == 0.0


def test_sao_loss_golden():
    # all ratios inside (0.8, 5.0): w = r. l_t = -w A logp:
    # t1: -(1.3498588 * 1 * -.7) = .9449012; t2: -(.9512294 * 1 * -1.05) = .9987909
    # t4: -(1.3498588 * -1 * -.7) = -.9449012; t5: -(1 * -1 * -1) = -1; t6: -(.8187308 * 2 * -1.2) = 1.9649539
    # sum = 1.9637448; / 5 = .3927490
    logp, old, adv, mask = loss_inputs()
    loss, metrics = get_policy_loss("sao")(logp, old, adv, mask)
    assert loss.item() == pytest.approx(0.3927490, abs=1e-6)
    assert metrics["actor/pg_clipfrac"] == 0.0
    # eps_low = .15: band (0.85, 5): token 6 (r = .8187308) masked out -> sum = -.0012091; / 5 = -.0002418
    loss, metrics = get_policy_loss("sao")(logp, old, adv, mask, config=SAOLossConfig(eps_low=0.15))
    assert loss.item() == pytest.approx(-0.0002418, abs=1e-6)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(0.2)
    loss.backward()
    # gradient -w A / 5: token 6 masked -> 0; token 1: -1.3498588 / 5 = -.2699718
    assert float(logp.grad[0, 6]) == 0.0
    assert float(logp.grad[0, 1]) == pytest.approx(-0.2699718, abs=1e-6)


def test_positive_nll_golden():
    # rows: standard logp (positive) and a second row (negative, ignored)
    # NLL = -mean(-.7, -1.05, -.7, -1.0, -1.2) = 4.65 / 5 = .93; weighted by .1 -> .093
    logp, _, _, mask = loss_inputs()
    logp2 = torch.cat([logp, torch.full((1, 8), -5.0, dtype=D)])
    loss, metrics = positive_nll_loss(logp2, mask.repeat(2, 1), torch.tensor([True, False]))
    assert loss.item() == pytest.approx(0.093, abs=1e-9)
    assert metrics["actor/nll_loss"] == pytest.approx(0.93, abs=1e-9)


def test_value_loss_golden():
    # V = [.2, .3, .5, .6, .7], targets [1.5, 1.5, 1, 1, 1]: squares 1.69 + 1.44 + .25 + .16 + .09 = 3.63
    # 0.5 * 3.63 / 5 = .363
    b = standard_batch()
    _, ret = compute_advantages("decoupled_gae", b)
    v = b.values.clone().requires_grad_(True)
    loss, metrics = value_loss(v, ret, b.response_mask)
    assert loss.item() == pytest.approx(0.363, abs=1e-12)
    # clipping c = 0.2, new V[1] = .6 from old .2: clipped to .4 -> (.4 - 1.5)^2 = 1.21 > (.6 - 1.5)^2 = .81
    # squares 1.21 + 1.44 + .25 + .16 + .09 = 3.15 -> .315; clip fraction 1 / 5
    v2 = b.values.clone()
    v2[0, 1] = 0.6
    loss, metrics = value_loss(v2, ret, b.response_mask, old_values=b.values, config=ValueLossConfig(cliprange_value=0.2))
    assert loss.item() == pytest.approx(0.315, abs=1e-12)
    assert metrics["critic/vf_clipfrac"] == pytest.approx(0.2)


def test_agg_loss_golden():
    # row 0: [1, 2, 3] on policy tokens, row 1: [4] (other entries garbage, masked)
    loss = torch.tensor([[1.0, 2.0, 3.0, 99.0], [4.0, float("nan"), 7.0, 7.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])
    # token-mean = 10 / 4; seq-mean-token-mean = (2 + 4) / 2; seq-mean-token-sum = (6 + 4) / 2; sum-norm C=10: 5 / 10
    assert float(agg_loss(loss, mask, "token-mean")) == 2.5
    assert float(agg_loss(loss, mask, "seq-mean-token-mean")) == 3.0
    assert float(agg_loss(loss, mask, "seq-mean-token-sum")) == 5.0
    assert float(agg_loss(loss, mask, "seq-mean-token-sum-norm", norm_constant=10)) == 0.5
    with pytest.raises(ValueError, match="known: token-mean"):
        agg_loss(loss, mask, "token-sum")
    with pytest.raises(ValueError, match="norm_constant"):
        agg_loss(loss, mask, "seq-mean-token-sum-norm")


def test_explained_variance_golden():
    # returns [1, 2, 3, 4], values [1, 2, 3, 3] (+ a masked garbage entry)
    # residuals [0, 0, 0, 1]: var = .25 - .0625 = .1875; var(returns) = 1.25; EV = 1 - .15 = .85
    v = torch.tensor([[1.0, 2.0, 50.0], [3.0, 3.0, 0.0]])
    r = torch.tensor([[1.0, 2.0, -7.0], [3.0, 4.0, 0.0]])
    m = torch.tensor([[1, 1, 0], [1, 1, 0]])
    assert explained_variance(v, r, m) == pytest.approx(0.85, abs=1e-12)
    # the mean of per-row EVs differs (row 0: 1.0; row 1: 1 - .25 / .25 = 0.0 -> .5): batch-wide is not an average
    ev_rows = [explained_variance(v[i : i + 1], r[i : i + 1], m[i : i + 1]) for i in range(2)]
    assert ev_rows == pytest.approx([1.0, 0.0])
    assert math.isnan(explained_variance(v, torch.ones_like(r), m))
