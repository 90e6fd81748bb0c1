"""MPO and its baselines: advantages, importance ratios, losses and critic targets.

Glossary: B rows (one trajectory per row), T tokens, K turns, G rollouts per prompt. Log-probabilities in
nats. ``response_mask`` 1 = policy (assistant) token, 0 = prompt / tool output / padding.

- :class:`RolloutBatch`: the one input type of every advantage estimator.
- Advantage estimators, one signature ``fn(batch, config=None) -> AdvantageOutput(advantages, returns)``,
  in a registry: ``mae`` (MPO), ``gae``, ``decoupled_gae``, ``vapo``, ``sao``, ``grpo``, ``dr_grpo``, ``rloo``.
- Policy losses, one signature ``fn(log_probs, old_log_probs, advantages, response_mask, turn_ids=None,
  config=None) -> (loss, metrics)``, in a registry: ``ppo``, ``gspo``, ``mpo``, ``sao``.
- :func:`agg_loss`, :func:`value_loss`, :func:`positive_nll_loss`, :func:`kl_penalty`; diagnostics;
  DAPO's dynamic sampling and overlong shaping.

The formulas and their sources: ``docs/algorithms.md`` and the spec (MPO, arXiv:2610.35013).
"""

from critic_audit.rl.advantages import (
    AdvantageOutput,
    DecoupledGAEConfig,
    DrGRPOConfig,
    GAEConfig,
    GRPOConfig,
    MAEConfig,
    RLOOConfig,
    SAOConfig,
    VAPOConfig,
    compute_advantages,
    get_advantage_estimator,
    list_advantage_estimators,
    masked_whiten,
    register_advantage,
)
from critic_audit.rl.batch import (
    MaskedRewardError,
    RolloutBatch,
    TurnLayout,
    turn_ids_from_mask,
    turn_layout,
)
from critic_audit.rl.dapo import (
    DynamicSamplingResult,
    OverlongShapingConfig,
    add_to_last_policy_token,
    dynamic_sampling_filter,
    overlong_penalty,
)
from critic_audit.rl.diagnostics import (
    DEFAULT_LENGTH_BUCKETS,
    approx_kl,
    explained_variance,
    turn_log_ratios,
    turn_ratio_metrics,
)
from critic_audit.rl.losses import (
    AGG_MODES,
    GSPOLossConfig,
    MPOLossConfig,
    PPOLossConfig,
    SAOLossConfig,
    ValueLossConfig,
    agg_loss,
    get_policy_loss,
    kl_penalty,
    list_policy_losses,
    policy_loss_preset,
    positive_nll_loss,
    register_policy_loss,
    value_loss,
)
from critic_audit.rl.scan import reverse_linear_scan

__all__ = [
    "AGG_MODES",
    "DEFAULT_LENGTH_BUCKETS",
    "AdvantageOutput",
    "DecoupledGAEConfig",
    "DrGRPOConfig",
    "DynamicSamplingResult",
    "GAEConfig",
    "GRPOConfig",
    "GSPOLossConfig",
    "MAEConfig",
    "MPOLossConfig",
    "MaskedRewardError",
    "OverlongShapingConfig",
    "PPOLossConfig",
    "RLOOConfig",
    "RolloutBatch",
    "SAOConfig",
    "SAOLossConfig",
    "TurnLayout",
    "VAPOConfig",
    "ValueLossConfig",
    "add_to_last_policy_token",
    "agg_loss",
    "approx_kl",
    "compute_advantages",
    "dynamic_sampling_filter",
    "explained_variance",
    "get_advantage_estimator",
    "get_policy_loss",
    "kl_penalty",
    "list_advantage_estimators",
    "list_policy_losses",
    "masked_whiten",
    "overlong_penalty",
    "policy_loss_preset",
    "positive_nll_loss",
    "register_advantage",
    "register_policy_loss",
    "reverse_linear_scan",
    "turn_ids_from_mask",
    "turn_layout",
    "turn_log_ratios",
    "turn_ratio_metrics",
    "value_loss",
]
