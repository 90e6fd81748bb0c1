"""critic-audit's advantage estimators and policy losses, registered in verl's own registries.

verl imports this module by itself: ``pip install "critic-audit[verl]"`` declares it under the
``verl.plugins`` entry point, which ``import verl`` loads in every process (driver, trainer and
Ray workers alike; ``VERL_USE_EXTERNAL_PLUGINS=none`` turns that off). It only *adds* names;
verl's own estimators and losses are untouched.

Registered (the arithmetic is :mod:`critic_audit.rl`'s; formulas and sources in docs/algorithms.md):

- advantage estimators (``algorithm.adv_estimator=...``): ``mpo`` (multiscale advantage estimation,
  arXiv:2610.35013), ``decoupled_gae`` (VC-PPO, arXiv:2503.01491), ``vapo`` (arXiv:2504.05118),
  ``sao`` (arXiv:2607.07508). Also under ``critic_audit.<name>``, the only name registered when
  verl already has one of that name.
- policy losses (``actor.policy_loss.loss_mode=...``): ``mpo`` (whole-turn importance ratio,
  arXiv:2610.35013) and ``sao`` (double-sided hard mask), also as ``critic_audit.<name>``.

A reward on a masked token (verl's last response token, when a multi-turn response ends in a tool
output) raises :class:`critic_audit.rl.MaskedRewardError`; ``+critic_audit.masked_rewards=move`` moves it
onto the last policy token and reports the count as the step metric ``critic_audit/masked_rewards_moved``
(:mod:`critic_audit.integrations.verl.rewards`).

All of these need critic values, and verl's ``compute_advantage`` hands none to a registered
estimator: run them through :mod:`critic_audit.integrations.verl.main` (or
:func:`~critic_audit.integrations.verl.trainer.values_to_estimators`), else the estimator stops with
:class:`CriticValuesMissing` instead of running without a critic.

Tensor conventions are verl's: B rows, R response tokens; ``response_mask`` (B, R) 1 = token generated
by the policy, 0 = tool / user tokens inside a multi-turn response and padding. A turn is a maximal run
of 1s in ``response_mask``. ``values`` (B, R) float, V of the state before response token t.
"""

from __future__ import annotations

import functools
import math
from enum import Enum
from typing import Any

import numpy as np
import torch
from torch import Tensor
from verl.trainer.ppo import core_algos

from critic_audit.algorithms import verl_plugin_estimators, verl_plugin_losses
from critic_audit.errors import ConfigError, CriticAuditError
from critic_audit.integrations.verl.options import read_options
from critic_audit.integrations.verl.rewards import masked_reward_metrics, move_masked_rewards, place_masked_rewards
from critic_audit.rl import (
    DecoupledGAEConfig,
    MAEConfig,
    MPOLossConfig,
    RolloutBatch,
    SAOConfig,
    SAOLossConfig,
    VAPOConfig,
    compute_advantages,
    get_policy_loss,
)

__all__ = [
    "ESTIMATORS",
    "POLICY_LOSSES",
    "CriticValuesMissing",
    "estimator_config",
    "masked_reward_metrics",
    "move_masked_rewards",
    "registered_estimators",
    "registered_losses",
]

#: verl name -> critic_audit.rl estimator name, from the algorithm table (the names verl lacks)
ESTIMATORS: dict[str, str] = verl_plugin_estimators()
#: verl name -> critic_audit.rl policy loss name, from the algorithm table (the names verl lacks)
POLICY_LOSSES: dict[str, str] = verl_plugin_losses()

_REGISTERED_ESTIMATORS: dict[str, str] = {}
_REGISTERED_LOSSES: dict[str, str] = {}


class CriticValuesMissing(CriticAuditError):
    """A critic-based estimator of ours was called by verl without critic values."""


def registered_estimators() -> dict[str, str]:
    """verl name -> our estimator name, for every name this plugin registered in verl."""
    return dict(_REGISTERED_ESTIMATORS)


def registered_losses() -> dict[str, str]:
    """verl name -> our policy-loss name, for every name this plugin registered in verl."""
    return dict(_REGISTERED_LOSSES)


def _name(x: Any) -> str:
    return x.value if isinstance(x, Enum) else str(x)


# ----------------------------------------------------------------------------------------------
# advantage estimators
# ----------------------------------------------------------------------------------------------


def estimator_config(ours: str, algo_config: Any, options: dict[str, Any]) -> Any:
    """The critic_audit.rl config of estimator ``ours`` from verl's ``algorithm`` node (gamma) and the
    ``critic_audit`` options (:mod:`critic_audit.integrations.verl.options`); library defaults fill
    the rest.

    Raises:
        ConfigError: an out-of-range value (from the config dataclass).
    """
    gamma = float(_get(algo_config, "gamma", 1.0))
    o = options
    common = {"gamma": gamma, **({"whiten": o["whiten"]} if "whiten" in o else {})}
    if ours == "mae":
        keys = ("lam", "lam_intra", "beta", "lam_critic")
        return MAEConfig(**common, **{k: float(o[k]) for k in keys if k in o})
    if ours == "decoupled_gae":
        return DecoupledGAEConfig(**common, **{k: float(o[k]) for k in ("lam_actor", "lam_critic") if k in o})
    if ours in ("vapo", "sao"):
        cls = VAPOConfig if ours == "vapo" else SAOConfig
        return cls(**common, **{k: float(o[k]) for k in ("alpha", "lam_critic") if k in o})
    raise ConfigError(f"no verl adapter for estimator {ours!r}")


def _get(cfg: Any, key: str, default: Any) -> Any:
    if cfg is None:
        return default
    getter = getattr(cfg, "get", None)
    if callable(getter):
        value = getter(key, default)
    else:
        value = getattr(cfg, key, default)
    return default if value is None else value


def _group_ids(index: Any, n: int) -> Tensor | None:
    if index is None:
        return None
    arr = np.asarray(index, dtype=object).reshape(-1)
    if arr.shape[0] != n:
        return None
    _, inverse = np.unique(arr.astype(str), return_inverse=True)
    return torch.as_tensor(inverse, dtype=torch.long)


def _make_estimator(verl_name: str, ours: str):
    def estimator(
        token_level_rewards: Tensor,
        response_mask: Tensor,
        config: Any = None,
        index: Any = None,
        values: Tensor | None = None,
        **_: Any,
    ) -> tuple[Tensor, Tensor]:
        """critic-audit's ``{ours}`` estimator for verl: (B, R) advantages and returns (float32)."""
        if values is None:
            raise CriticValuesMissing(
                f"verl called the advantage estimator {verl_name!r} without critic values",
                fix="launch with `python -m critic_audit.integrations.verl.main` (or wrap verl's trainer in "
                    "critic_audit.integrations.verl.trainer.values_to_estimators()) and keep critic.enable=True",
            )
        options = read_options()
        # a reward on a masked token: refused (MaskedRewardError) unless critic_audit.masked_rewards=move,
        # which moves it onto the last policy token and counts it (critic_audit/masked_rewards_moved)
        rewards = place_masked_rewards(token_level_rewards.float(), response_mask,
                                       options.get("masked_rewards", "raise"))
        batch = RolloutBatch(
            token_rewards=rewards,
            values=values.float(),
            response_mask=response_mask.bool(),
            group_ids=_group_ids(index, rewards.shape[0]),
        )
        cfg = estimator_config(ours, config, options)
        out = compute_advantages(ours, batch, cfg)
        return out.advantages, out.returns

    estimator.__name__ = f"critic_audit_{verl_name}_advantage"
    estimator.__doc__ = (estimator.__doc__ or "").format(ours=ours)
    estimator.critic_audit_estimator = ours  # type: ignore[attr-defined]
    return estimator


# ----------------------------------------------------------------------------------------------
# policy losses
# ----------------------------------------------------------------------------------------------


def loss_config(ours: str, actor_config: Any, options: dict[str, Any]) -> Any:
    """Our loss config from verl's actor config (clip range) and the ``critic_audit`` options."""
    clip = float(_get(actor_config, "clip_ratio", 0.2))
    eps_low = float(_get(actor_config, "clip_ratio_low", clip))
    eps_high = float(_get(actor_config, "clip_ratio_high", clip))
    if ours == "mpo":
        extra = {}
        if "ratio_mode" in options:
            extra["mode"] = options["ratio_mode"]
        if "log_ratio_clamp" in options:
            extra["log_ratio_clamp"] = float(options["log_ratio_clamp"])
        return MPOLossConfig(eps_low=eps_low, eps_high=eps_high, **extra)
    if ours == "sao":
        return SAOLossConfig(eps_low=eps_low, eps_high=eps_high)
    raise ConfigError(f"no verl adapter for policy loss {ours!r}")


def _verl_aggregate(loss_mat: Tensor, mask: Tensor, *, mode: str, global_info: dict[str, Any],
                    weights: Tensor | None) -> Tensor:
    if weights is not None:  # verl's rollout-correction importance weights (TIS), per token
        loss_mat = loss_mat * weights
    return core_algos.agg_loss(loss_mat=loss_mat, loss_mask=mask, loss_agg_mode=mode, **global_info)


def _make_loss(verl_name: str, ours: str):
    fn = get_policy_loss(ours)

    def policy_loss(
        old_log_prob: Tensor,
        log_prob: Tensor,
        advantages: Tensor,
        response_mask: Tensor,
        loss_agg_mode: str = "token-mean",
        config: Any = None,
        rollout_is_weights: Tensor | None = None,
        **_: Any,
    ) -> tuple[Tensor, dict[str, float]]:
        """critic-audit's ``{ours}`` policy loss for verl; aggregated by verl's ``agg_loss`` over the
        global batch (``config.global_batch_info``), so micro-batching and data parallelism give the
        gradients verl's own losses would."""
        cfg = loss_config(ours, config, read_options())
        global_info = dict(_get(config, "global_batch_info", {}) or {})
        aggregate = functools.partial(_verl_aggregate, mode=loss_agg_mode, global_info=global_info,
                                      weights=rollout_is_weights)
        loss, metrics = fn(log_prob, old_log_prob, advantages, response_mask.bool(), None, cfg, aggregate=aggregate)
        # verl averages metrics over micro-batches: leave out the undefined ones (empty buckets)
        return loss, {k: v for k, v in metrics.items() if isinstance(v, float) and math.isfinite(v)}

    policy_loss.__name__ = f"critic_audit_{verl_name}_policy_loss"
    policy_loss.__doc__ = (policy_loss.__doc__ or "").format(ours=ours)
    policy_loss.critic_audit_loss = ours  # type: ignore[attr-defined]
    return policy_loss


# ----------------------------------------------------------------------------------------------
# registration
# ----------------------------------------------------------------------------------------------


def register() -> None:
    """Register our estimators and losses in verl (idempotent; called on import)."""
    for verl_name, ours in ESTIMATORS.items():
        fn = _make_estimator(verl_name, ours)
        for name in (f"critic_audit.{verl_name}", verl_name):
            existing = core_algos.ADV_ESTIMATOR_REGISTRY.get(name)
            if existing is not None and getattr(existing, "critic_audit_estimator", None) is None:
                continue  # verl's own: keep it; ours stays reachable as critic_audit.<name>
            core_algos.ADV_ESTIMATOR_REGISTRY[name] = fn
            _REGISTERED_ESTIMATORS[name] = ours
    for verl_name, ours in POLICY_LOSSES.items():
        fn = _make_loss(verl_name, ours)
        for name in (f"critic_audit.{verl_name}", verl_name):
            existing = core_algos.POLICY_LOSS_REGISTRY.get(name)
            if existing is not None and getattr(existing, "critic_audit_loss", None) is None:
                continue
            core_algos.register_policy_loss(name)(fn)
            _REGISTERED_LOSSES[name] = ours


register()
