"""Advantage estimators: one input type (:class:`RolloutBatch`), one signature, one registry.

Every estimator is called as ``estimator(batch, config=None) -> AdvantageOutput(advantages, returns)``:

- ``batch``: a :class:`~critic_audit.rl.batch.RolloutBatch` (B rows, T tokens);
- ``config``: the estimator's own frozen config dataclass (``None`` = its defaults);
- ``advantages``, ``returns``: (B, T) float, in the rewards' dtype, exactly 0 at masked tokens.
  ``returns`` are the critic's regression targets.

Values at masked tokens are never read (they may even be NaN). Every recurrence over tokens is one call
of :func:`~critic_audit.rl.scan.reverse_linear_scan` (log2 T vectorized steps, no loop over tokens);
"GAE over policy tokens only" means the next value of a policy token is the *next policy token's* value,
skipping prompt / tool-output tokens in between, which is what a multi-turn episode needs.

Estimators (name: source):

- ``mae``: Multiscale advantage estimation, MPO (arXiv:2610.35013), turn-level GAE plus a centred
  intra-turn correction.
- ``gae``: PPO's GAE (arXiv:1506.02438, 1707.06347) over policy tokens only.
- ``decoupled_gae``: VC-PPO (arXiv:2503.01491), lam_actor for advantages, lam_critic = 1 for returns.
- ``vapo``: VAPO (arXiv:2504.05118), length-adaptive lam = 1 - 1 / (alpha * l).
- ``sao``: SAO (arXiv:2607.07508), skip-observation GAE with length-adaptive lam (alpha 1.5).
- ``grpo``: GRPO (arXiv:2402.03300), group-normalised outcome.
- ``dr_grpo``: Dr. GRPO (arXiv:2503.20783), group-centred outcome, no std.
- ``rloo``: REINFORCE leave-one-out (Ahmadian et al., arXiv:2402.14740).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable, Literal, NamedTuple

import torch
from torch import Tensor

from critic_audit.errors import ConfigError, SchemaError
from critic_audit.rl.batch import RolloutBatch, gather_next, next_policy_index, turn_layout
from critic_audit.rl.scan import reverse_linear_scan

__all__ = [
    "AdvantageOutput",
    "DecoupledGAEConfig",
    "DrGRPOConfig",
    "GAEConfig",
    "GRPOConfig",
    "MAEConfig",
    "RLOOConfig",
    "SAOConfig",
    "VAPOConfig",
    "compute_advantages",
    "get_advantage_estimator",
    "list_advantage_estimators",
    "masked_whiten",
    "register_advantage",
]


class AdvantageOutput(NamedTuple):
    """What every estimator returns. Both (B, T) float, 0 at masked tokens."""

    advantages: Tensor
    returns: Tensor


AdvantageFn = Callable[[RolloutBatch, Any], AdvantageOutput]

_ADVANTAGE_ESTIMATORS: dict[str, AdvantageFn] = {}


def register_advantage(name: str, config_cls: type) -> Callable[[Callable], AdvantageFn]:
    """Register an estimator ``fn(batch, config) -> AdvantageOutput`` under ``name``.

    The registered function accepts ``config=None`` (meaning ``config_cls()``), refuses a config of
    another type, and runs under ``torch.no_grad()``. ``fn.config_cls`` holds the config class.

    Raises:
        ValueError: ``name`` is already registered.
    """

    def decorator(fn: Callable[[RolloutBatch, Any], AdvantageOutput]) -> AdvantageFn:
        if name in _ADVANTAGE_ESTIMATORS:
            raise ValueError(f"advantage estimator {name!r} is already registered")

        @functools.wraps(fn)
        def wrapped(batch: RolloutBatch, config: Any = None) -> AdvantageOutput:
            if config is None:
                config = config_cls()
            if not isinstance(config, config_cls):
                raise ConfigError(
                    f"estimator {name!r} takes a {config_cls.__name__}, got {type(config).__name__}"
                )
            if not isinstance(batch, RolloutBatch):
                raise SchemaError(f"estimator {name!r} takes a RolloutBatch, got {type(batch).__name__}")
            with torch.no_grad():
                return fn(batch, config)

        wrapped.config_cls = config_cls  # type: ignore[attr-defined]
        wrapped.estimator_name = name  # type: ignore[attr-defined]
        _ADVANTAGE_ESTIMATORS[name] = wrapped
        return wrapped

    return decorator


def list_advantage_estimators() -> list[str]:
    """The registered estimator names, sorted."""
    return sorted(_ADVANTAGE_ESTIMATORS)


def get_advantage_estimator(name: str) -> AdvantageFn:
    """The estimator registered under ``name``.

    Raises:
        ValueError: unknown name (the message lists the known ones).
    """
    try:
        return _ADVANTAGE_ESTIMATORS[name]
    except KeyError:
        known = ", ".join(list_advantage_estimators())
        raise ValueError(f"unknown advantage estimator {name!r}; known: {known}") from None


def compute_advantages(name: str, batch: RolloutBatch, config: Any = None) -> AdvantageOutput:
    """``get_advantage_estimator(name)(batch, config)``."""
    return get_advantage_estimator(name)(batch, config)


# ----------------------------------------------------------------------------------------------
# configs
# ----------------------------------------------------------------------------------------------


def _check_unit(name: str, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ConfigError(f"{name} = {value} is outside [0, 1]", fix=f"set {name} in [0, 1]")


@dataclass(frozen=True)
class MAEConfig:
    """Multiscale advantage estimation (MPO, arXiv:2610.35013, spec section 1)."""

    gamma: float = 1.0
    """Discount per turn (credit decays once per interaction, not per token). Paper default 1."""
    lam: float = 0.80
    """Turn-level GAE lambda. Paper ablation default 0.80."""
    lam_intra: float = 0.95
    """Lambda of the local GAE inside a turn (discount 1 inside the turn). Paper default 0.95."""
    beta: float = 1.00
    """Weight of the centred intra-turn correction; 0 gives one advantage per turn. Paper default 1."""
    lam_critic: float = 1.0
    """Lambda of the critic targets (spec section 3: 1, so with gamma 1 every target is the episode
    return). [ours: the targets discount by gamma per turn boundary and by 1 inside a turn, matching
    the turn-level TD error]"""
    intra_turn_rewards: Literal["turn_end", "in_place"] = "turn_end"
    """[ours] Where a reward inside a turn enters the intra-turn TD errors. ``turn_end`` (the spec):
    the whole R_k is in the turn's target G_k at its last token. ``in_place``: r_t enters
    d_{k,j} = r_{k,j} + V_{k,j+1} - V_{k,j} at its own token. Identical when rewards sit only on turn
    ends; the turn-level advantage does not depend on it."""
    whiten: bool = True
    """[ours: on, as in PPO practice] Masked whitening of the advantages over the batch
    (:func:`masked_whiten`). The turn-mean property holds before whitening."""

    def __post_init__(self) -> None:
        for name in ("gamma", "lam", "lam_intra", "lam_critic"):
            _check_unit(name, getattr(self, name))
        if self.beta < 0:
            raise ConfigError(f"beta = {self.beta} is negative", fix="set beta >= 0")
        if self.intra_turn_rewards not in ("turn_end", "in_place"):
            raise ConfigError(
                f"intra_turn_rewards = {self.intra_turn_rewards!r}", fix="use 'turn_end' or 'in_place'"
            )


@dataclass(frozen=True)
class GAEConfig:
    """PPO's token GAE over policy tokens only (arXiv:1506.02438; PPO 1707.06347)."""

    gamma: float = 1.0
    """Discount per policy token. Spec default 1."""
    lam: float = 0.95
    """GAE lambda, for advantages and returns alike (classic PPO). Spec default 0.95."""
    whiten: bool = True
    """[ours: on, as verl's GAE] Masked whitening of the advantages over the batch."""

    def __post_init__(self) -> None:
        _check_unit("gamma", self.gamma)
        _check_unit("lam", self.lam)


@dataclass(frozen=True)
class DecoupledGAEConfig:
    """VC-PPO's decoupled GAE (arXiv:2503.01491): separate lambdas for actor and critic."""

    gamma: float = 1.0
    """Discount per policy token."""
    lam_actor: float = 0.95
    """Lambda of the advantages. Paper default 0.95."""
    lam_critic: float = 1.0
    """Lambda of the returns (critic targets). Paper default 1 (unbiased Monte Carlo targets)."""
    whiten: bool = True
    """[ours: on] Masked whitening of the advantages over the batch."""

    def __post_init__(self) -> None:
        for name in ("gamma", "lam_actor", "lam_critic"):
            _check_unit(name, getattr(self, name))


def _check_length_adaptive(cfg: Any) -> None:
    """Checks shared by the length-adaptive configs (VAPO, SAO)."""
    _check_unit("gamma", cfg.gamma)
    _check_unit("lam_critic", cfg.lam_critic)
    if cfg.alpha <= 0:
        raise ConfigError(f"alpha = {cfg.alpha} must be > 0")


@dataclass(frozen=True)
class VAPOConfig:
    """VAPO's length-adaptive GAE (arXiv:2504.05118): lam_policy = 1 - 1 / (alpha * l)."""

    gamma: float = 1.0
    """Discount per policy token."""
    alpha: float = 0.05
    """Length-adaptive coefficient. Paper default 0.05. l is the row's number of policy tokens
    [ours: for multi-turn rows, observation tokens are not counted]. lam is clamped to [0, 1]
    [ours: short rows, l < 1 / alpha, would otherwise get a negative lambda]."""
    lam_critic: float = 1.0
    """Lambda of the returns (critic targets). Paper default 1."""
    whiten: bool = True
    """[ours: on] Masked whitening of the advantages over the batch."""

    def __post_init__(self) -> None:
        _check_length_adaptive(self)


@dataclass(frozen=True)
class SAOConfig:
    """SAO's skip-observation GAE (arXiv:2607.07508), one rollout per prompt, critic baseline.

    Defaults are UNVERIFIED: the paper body was not read, only the spec's summary.
    """

    gamma: float = 1.0
    """Discount per policy token (observation tokens are skipped)."""
    alpha: float = 1.5
    """Length-adaptive coefficient, lam_policy = 1 - 1 / (alpha * l), l = policy tokens of the row,
    clamped to [0, 1] [ours]. Default 1.5 (unverified)."""
    lam_critic: float = 1.0
    """Lambda of the returns (critic targets)."""
    whiten: bool = True
    """[ours: on] Masked whitening of the advantages over the batch."""

    def __post_init__(self) -> None:
        _check_length_adaptive(self)


@dataclass(frozen=True)
class GRPOConfig:
    """GRPO's group-normalised outcome advantage (arXiv:2402.03300)."""

    epsilon: float = 1e-6
    """Added to the group std before dividing."""
    norm_by_std: bool = True
    """Divide by the group std (False gives Dr. GRPO's advantage)."""


@dataclass(frozen=True)
class DrGRPOConfig:
    """Dr. GRPO (arXiv:2503.20783): the group-centred outcome, no std division. No options."""


@dataclass(frozen=True)
class RLOOConfig:
    """REINFORCE leave-one-out (arXiv:2402.14740): the baseline is the mean of the *other* rows of
    the group. No options."""


# ----------------------------------------------------------------------------------------------
# shared pieces
# ----------------------------------------------------------------------------------------------


def masked_whiten(x: Tensor, mask: Tensor, shift_mean: bool = True, eps: float = 1e-8) -> Tensor:
    """Whiten ``x`` over the masked tokens of the whole batch: (x - mean) / sqrt(var + eps).

    Args:
        x: (B, T) float.
        mask: (B, T) bool or 0/1; 1 = token counted (and kept), 0 = ignored and set to 0.
        shift_mean: False adds the mean back (scale only).
        eps: added to the variance.

    Returns:
        (B, T) float, 0 at masked tokens. The variance is the unbiased one (n - 1), as verl's
        ``masked_whiten``; with fewer than two tokens the result is ``x - mean``.
    """
    m = mask.bool()
    n = m.sum()
    if int(n) == 0:
        return torch.zeros_like(x)
    xm = torch.where(m, x, torch.zeros_like(x))
    mean = xm.sum() / n
    centred = torch.where(m, x - mean, torch.zeros_like(x))
    if int(n) < 2:
        return centred
    # var = sum (x - mean)^2 / (n - 1)
    var = (centred**2).sum() / (n - 1)
    out = centred * torch.rsqrt(var + eps)
    if not shift_mean:
        out = torch.where(m, out + mean, out)
    return out


def _policy_token_gae(
    batch: RolloutBatch, discount: Tensor | float, lam: Tensor | float, next_index: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """GAE over policy tokens only (masked tokens skipped), as one reverse scan.

    ``discount`` (scalar or (B, T)) multiplies the *next policy token's* value; ``lam`` is scalar or
    (B, 1). The row's end is terminal (V after the last policy token = 0). ``next_index``: a
    precomputed :func:`next_policy_index`. Returns (advantages, returns), 0 at masked tokens.
    """
    m = batch.response_mask
    r = batch.token_rewards
    zeros = torch.zeros_like(r)
    values = torch.where(m, batch.values.to(r.dtype), zeros)
    if next_index is None:
        next_index = next_policy_index(m)
    next_values = gather_next(values, next_index)
    # delta_t = r_t + gamma * V_{next policy token} - V_t
    delta = torch.where(m, r + discount * next_values - values, zeros)
    # A_t = delta_t + gamma * lam * A_{next policy token}; a masked token passes A on unchanged (c = 1)
    coef = torch.where(m, discount * lam * torch.ones_like(r), torch.ones_like(r))
    advantages = torch.where(m, reverse_linear_scan(delta, coef), zeros)
    # R_t = A_t + V_t
    returns = torch.where(m, advantages + values, zeros)
    return advantages, returns


def _length_adaptive_lambda(batch: RolloutBatch, alpha: float) -> Tensor:
    """(B, 1) lam = clamp(1 - 1 / (alpha * l), 0, 1), l = policy tokens per row (VAPO 2504.05118)."""
    length = batch.response_lengths().to(batch.token_rewards.dtype)
    # lam_policy = 1 - 1 / (alpha * l)
    lam = 1.0 - 1.0 / (alpha * length)
    return lam.clamp(0.0, 1.0).unsqueeze(1)


def _maybe_whiten(advantages: Tensor, batch: RolloutBatch, whiten: bool) -> Tensor:
    return masked_whiten(advantages, batch.response_mask) if whiten else advantages


def _reward_to_go(batch: RolloutBatch) -> Tensor:
    """(B, T) undiscounted sum of the rewards from token t on; 0 at masked tokens."""
    r = batch.token_rewards
    rtg = torch.flip(torch.cumsum(torch.flip(r, [1]), dim=1), [1])
    return torch.where(batch.response_mask, rtg, torch.zeros_like(r))


def _group_stats(scores: Tensor, group_ids: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per row: (group mean, unbiased group std, group size) of ``scores`` (B,) over ``group_ids``."""
    _, inverse = torch.unique(group_ids, return_inverse=True)
    n_groups = int(inverse.max()) + 1 if inverse.numel() else 0
    count = torch.zeros(n_groups, dtype=scores.dtype, device=scores.device)
    count.scatter_add_(0, inverse, torch.ones_like(scores))
    total = torch.zeros_like(count).scatter_add_(0, inverse, scores)
    mean = (total / count)[inverse]
    sq = torch.zeros_like(count).scatter_add_(0, inverse, (scores - mean) ** 2)
    # std = sqrt(sum (R - mean)^2 / (G - 1)), as torch.std
    std = torch.sqrt(sq / (count - 1).clamp(min=1))[inverse]
    return mean, std, count[inverse]


def _require_groups(batch: RolloutBatch, name: str) -> Tensor:
    if batch.group_ids is None:
        raise SchemaError(
            f"estimator {name!r} needs group_ids", fix="pass RolloutBatch(group_ids=...) of shape (B,)"
        )
    return batch.group_ids


def _broadcast_sequence(adv: Tensor, batch: RolloutBatch) -> Tensor:
    """(B,) -> (B, T), on policy tokens only."""
    r = batch.token_rewards
    return torch.where(batch.response_mask, adv.unsqueeze(1).to(r.dtype).expand_as(r), torch.zeros_like(r))


# ----------------------------------------------------------------------------------------------
# estimators
# ----------------------------------------------------------------------------------------------


@register_advantage("mae", MAEConfig)
def mae_advantages(batch: RolloutBatch, config: MAEConfig) -> AdvantageOutput:
    """MPO's multiscale advantage estimation (arXiv:2610.35013, spec section 1).

    Turn scale (turn k = k-th maximal run of policy tokens; V_k = V at its first token; R_k = sum of
    its rewards; V_K = 0):

        delta_k  = R_k + gamma * V_{k+1} - V_k
        A_turn_k = sum_l (gamma * lam)^l delta_{k+l}

    Token scale [ours: exact form], a local GAE truncated at the turn's end, discount 1 inside:

        d_{k,j} = V_{k,j+1} - V_{k,j}  (j < n_k - 1),   d_{k,n_k-1} = G_k - V_{k,n_k-1},  G_k = R_k + gamma V_{k+1}
        a_{k,j} = sum_l lam_intra^l d_{k,j+l}
        A_{k,j} = A_turn_k + beta * (a_{k,j} - mean_j a_{k,j})

    Returns are critic targets with ``lam_critic`` (default 1): with gamma = 1 every policy token's
    target is the sum of the rewards from its turn on (the episode return for an outcome reward).

    Args:
        batch: B rows, T tokens; uses token_rewards, values, response_mask, turn_ids.
        config: :class:`MAEConfig`.

    Returns:
        AdvantageOutput, (B, T) each, 0 at masked tokens; whitened over the batch if ``config.whiten``.
    """
    m = batch.response_mask
    r = batch.token_rewards
    zeros = torch.zeros_like(r)
    values = torch.where(m, batch.values.to(r.dtype), zeros)
    layout = turn_layout(batch.turn_ids)
    B, K = layout.turn_lengths.shape
    tid = layout.turn_ids.clamp(min=0)

    # turn-level quantities, (B, K): scatter into K + 1 slots (slot K collects masked tokens)
    R_turn = torch.zeros(B, K + 1, dtype=r.dtype, device=r.device).scatter_add_(1, layout.index, r)[:, :K]
    V_turn = torch.zeros(B, K + 1, dtype=r.dtype, device=r.device).scatter_add_(
        1, layout.index, torch.where(layout.is_first, values, zeros)
    )[:, :K]
    # V_{k+1}, with V_K = 0 (absent turns of short rows already hold 0)
    V_turn_next = torch.nn.functional.pad(V_turn[:, 1:], (0, 1))
    # delta_k = R_k + gamma * V_{k+1} - V_k
    delta_turn = R_turn + config.gamma * V_turn_next - V_turn
    # A_turn_k = delta_k + gamma * lam * A_turn_{k+1}
    A_turn = reverse_linear_scan(delta_turn, torch.full_like(delta_turn, config.gamma * config.lam))
    # G_k = R_k + gamma * V_{k+1}
    G_turn = R_turn + config.gamma * V_turn_next

    # token-level, inside each turn
    next_values = gather_next(values, layout.next_index)
    G_tok = torch.gather(G_turn, 1, tid)
    if config.intra_turn_rewards == "turn_end":
        # d_{k,j} = V_{k,j+1} - V_{k,j};  d_{k,n_k-1} = G_k - V_{k,n_k-1}
        d = torch.where(layout.is_last, G_tok - values, next_values - values)
    else:
        # d_{k,j} = r_{k,j} + V_{k,j+1} - V_{k,j};  d_{k,n_k-1} = r_{k,n_k-1} + gamma V_{k+1} - V_{k,n_k-1}
        V_next_turn_tok = torch.gather(V_turn_next, 1, tid)
        d = r + torch.where(layout.is_last, config.gamma * V_next_turn_tok, next_values) - values
    d = torch.where(m, d, zeros)
    # a_{k,j} = d_{k,j} + lam_intra * a_{k,j+1}, cut at the turn's last token (c = 0)
    coef = torch.where(m, torch.where(layout.is_last, zeros, zeros + config.lam_intra), zeros + 1.0)
    a = torch.where(m, reverse_linear_scan(d, coef), zeros)
    a_sum = torch.zeros(B, K + 1, dtype=r.dtype, device=r.device).scatter_add_(1, layout.index, a)[:, :K]
    # mean_j a_{k,j} = sum_j a_{k,j} / n_k
    a_mean = a_sum / layout.turn_lengths.clamp(min=1).to(r.dtype)
    # A_{k,j} = A_turn_k + beta * (a_{k,j} - mean_j a_{k,j})
    advantages = torch.gather(A_turn, 1, tid) + config.beta * (a - torch.gather(a_mean, 1, tid))
    advantages = torch.where(m, advantages, zeros)

    # critic targets: discount 1 inside a turn, gamma across a turn boundary, lambda = lam_critic
    discount = torch.where(layout.is_last, zeros + config.gamma, zeros + 1.0)
    _, returns = _policy_token_gae(batch, discount, config.lam_critic, layout.next_index)
    return AdvantageOutput(_maybe_whiten(advantages, batch, config.whiten), returns)


@register_advantage("gae", GAEConfig)
def gae_advantages(batch: RolloutBatch, config: GAEConfig) -> AdvantageOutput:
    """PPO's GAE over policy tokens only (arXiv:1506.02438, 1707.06347).

        delta_t = r_t + gamma * V_{t'} - V_t,    A_t = delta_t + gamma * lam * A_{t'},   R_t = A_t + V_t

    where t' is the next *policy* token after t (masked tokens skipped; V = 0 after the last one).

    Returns:
        AdvantageOutput, (B, T) each, 0 at masked tokens.
    """
    advantages, returns = _policy_token_gae(batch, config.gamma, config.lam)
    return AdvantageOutput(_maybe_whiten(advantages, batch, config.whiten), returns)


@register_advantage("decoupled_gae", DecoupledGAEConfig)
def decoupled_gae_advantages(batch: RolloutBatch, config: DecoupledGAEConfig) -> AdvantageOutput:
    """VC-PPO's decoupled GAE (arXiv:2503.01491): advantages with lam_actor, returns with lam_critic.

    Both are :func:`gae_advantages`'s recurrence over policy tokens; the returns are
    ``A_t(lam_critic) + V_t`` (with lam_critic = 1: the discounted reward-to-go).
    """
    advantages, _ = _policy_token_gae(batch, config.gamma, config.lam_actor)
    _, returns = _policy_token_gae(batch, config.gamma, config.lam_critic)
    return AdvantageOutput(_maybe_whiten(advantages, batch, config.whiten), returns)


@register_advantage("vapo", VAPOConfig)
def vapo_advantages(batch: RolloutBatch, config: VAPOConfig) -> AdvantageOutput:
    """VAPO's length-adaptive GAE (arXiv:2504.05118): lam_policy = 1 - 1 / (alpha * l) per row.

    l is the row's number of policy tokens; lam is clamped to [0, 1] [ours]. Returns use lam_critic.
    """
    lam = _length_adaptive_lambda(batch, config.alpha)
    advantages, _ = _policy_token_gae(batch, config.gamma, lam)
    _, returns = _policy_token_gae(batch, config.gamma, config.lam_critic)
    return AdvantageOutput(_maybe_whiten(advantages, batch, config.whiten), returns)


@register_advantage("sao", SAOConfig)
def sao_advantages(batch: RolloutBatch, config: SAOConfig) -> AdvantageOutput:
    """SAO's skip-observation GAE (arXiv:2607.07508; defaults unverified): GAE over policy tokens
    only with lam_policy = 1 - 1 / (alpha * l), alpha = 1.5, critic targets with lam_critic = 1.
    """
    lam = _length_adaptive_lambda(batch, config.alpha)
    advantages, _ = _policy_token_gae(batch, config.gamma, lam)
    _, returns = _policy_token_gae(batch, config.gamma, config.lam_critic)
    return AdvantageOutput(_maybe_whiten(advantages, batch, config.whiten), returns)


@register_advantage("grpo", GRPOConfig)
def grpo_advantages(batch: RolloutBatch, config: GRPOConfig) -> AdvantageOutput:
    """GRPO (arXiv:2402.03300): ``A_i = (R_i - mean_G R) / (std_G R + eps)`` on every policy token.

    R_i is the row's summed reward; groups come from ``batch.group_ids``; one row per trajectory, so a
    trajectory with many turns counts once in its group's statistics. std is the unbiased one. A group
    of one row gets mean 0 and std 1 [ours: as verl], i.e. A = R. Returns are the undiscounted
    reward-to-go (a Monte Carlo critic target), values are not read.

    Raises:
        SchemaError: ``batch.group_ids`` is None.
    """
    group_ids = _require_groups(batch, "grpo")
    scores = batch.sequence_rewards()
    mean, std, count = _group_stats(scores, group_ids)
    single = count < 2
    mean = torch.where(single, torch.zeros_like(mean), mean)
    std = torch.where(single, torch.ones_like(std), std)
    if config.norm_by_std:
        # A_i = (R_i - mean_G R) / (std_G R + eps)
        adv = (scores - mean) / (std + config.epsilon)
    else:
        # A_i = R_i - mean_G R
        adv = scores - mean
    return AdvantageOutput(_broadcast_sequence(adv, batch), _reward_to_go(batch))


@register_advantage("dr_grpo", DrGRPOConfig)
def dr_grpo_advantages(batch: RolloutBatch, config: DrGRPOConfig) -> AdvantageOutput:
    """Dr. GRPO (arXiv:2503.20783): ``A_i = R_i - mean_G R`` on every policy token (no std).

    A group of one row gets mean 0 [ours: as verl]. Returns: undiscounted reward-to-go.

    Raises:
        SchemaError: ``batch.group_ids`` is None.
    """
    return grpo_advantages.__wrapped__(batch, GRPOConfig(norm_by_std=False))  # type: ignore[attr-defined]


@register_advantage("rloo", RLOOConfig)
def rloo_advantages(batch: RolloutBatch, config: RLOOConfig) -> AdvantageOutput:
    """RLOO (arXiv:2402.14740): ``A_i = R_i - (sum_{j != i} R_j) / (G - 1)`` on every policy token.

    A group of one row has no other row: baseline 0 [ours: as verl], A = R. Returns: reward-to-go.

    Raises:
        SchemaError: ``batch.group_ids`` is None.
    """
    group_ids = _require_groups(batch, "rloo")
    scores = batch.sequence_rewards()
    mean, _, count = _group_stats(scores, group_ids)
    # baseline_i = (G * mean - R_i) / (G - 1)
    baseline = torch.where(count > 1, (count * mean - scores) / (count - 1).clamp(min=1), torch.zeros_like(mean))
    return AdvantageOutput(_broadcast_sequence(scores - baseline, batch), _reward_to_go(batch))
