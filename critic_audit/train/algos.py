"""``--algo NAME`` -> an advantage estimator and a policy-loss preset of :mod:`critic_audit.rl`.

| algo | estimator | loss preset | critic | default G | extras |
|---|---|---|---|---|---|
| mpo | mae | mpo (turn ratio) | yes | 1 | G > 1 only cuts distinct prompts (MAE reads no group) |
| grpo | grpo | grpo | no | 4 | |
| dr_grpo | dr_grpo | dr_grpo (C = max response tokens) | no | 4 | |
| dapo | grpo | dapo (clip-higher) | no | 4 | dynamic sampling (drop all-equal groups) |
| gspo | grpo | gspo | no | 4 | |
| ppo | gae | ppo | yes | 1 | |
| vc_ppo | decoupled_gae | vc_ppo | yes | 1 | value pretraining: 10 steps (optim.value_warmup_steps) |
| vapo | vapo | vapo (clip-higher) | yes | 1 | 0.1 x NLL on successful rows; value warmup: 10 steps |
| sao | sao | sao (double-sided mask) | yes | 1 | |

DAPO's dynamic sampling here drops the all-equal groups from the loss instead of sampling more groups
[ours: equal environment-step budget for every algorithm]; overlong shaping is not applied.

VC-PPO (arXiv:2503.01491) and VAPO (arXiv:2504.05118) pretrain the value model before the policy moves;
their default ``optim.value_warmup_steps`` is 10 training steps [ours: the papers' tens of steps of
value pretraining, scaled to the 200-step default run], every other algorithm's is 0.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from critic_audit.errors import ConfigError
from critic_audit.rl import get_advantage_estimator, get_policy_loss, policy_loss_preset
from critic_audit.train.config import AlgoConfig

__all__ = ["Algorithm", "build_algorithm"]

_TABLE: dict[str, tuple[str, bool, int, float, bool, int]] = {
    # name: (estimator, uses critic, default group size, NLL coefficient, dynamic sampling, value warmup steps)
    "mpo": ("mae", True, 1, 0.0, False, 0),
    "grpo": ("grpo", False, 4, 0.0, False, 0),
    "dr_grpo": ("dr_grpo", False, 4, 0.0, False, 0),
    "dapo": ("grpo", False, 4, 0.0, True, 0),
    "gspo": ("grpo", False, 4, 0.0, False, 0),
    "ppo": ("gae", True, 1, 0.0, False, 0),
    "vc_ppo": ("decoupled_gae", True, 1, 0.0, False, 10),
    "vapo": ("vapo", True, 1, 0.1, False, 10),
    "sao": ("sao", True, 1, 0.0, False, 0),
}


@dataclass(frozen=True)
class Algorithm:
    """A resolved algorithm: what the trainer calls."""

    name: str
    estimator: str
    estimator_config: Any
    loss_fn: Any
    loss_config: Any
    uses_critic: bool
    group_size: int
    nll_coef: float
    dynamic_sampling: bool
    value_warmup_steps: int = 0


def _replace(config: Any, overrides: dict[str, Any], what: str) -> Any:
    names = {f.name for f in dataclasses.fields(config)}
    unknown = sorted(set(overrides) - names)
    if unknown:
        raise ConfigError(f"unknown option {what}.{unknown[0]} for {type(config).__name__}",
                          fix=f"known: {', '.join(sorted(names))}")
    fixed = {k: tuple(v) if isinstance(v, list) else v for k, v in overrides.items()}
    try:
        return dataclasses.replace(config, **fixed)
    except TypeError as e:  # a value the config's checks cannot compare
        raise ConfigError(f"bad value in {what} ({e})") from None
    except ConfigError as e:  # name the full key: "lam = 2 ..." -> "algo.advantage.lam = 2 ..."
        if e.problem.split(" ", 1)[0] in names:
            raise ConfigError(f"{what}.{e.problem}", fix=e.fix) from None
        raise


def build_algorithm(cfg: AlgoConfig, group_size: int | None, max_response_tokens: int,
                    value_warmup_steps: int | None = None) -> Algorithm:
    """Resolve ``cfg`` (with the run's group size, the longest possible response, the Dr. GRPO
    constant C, and ``optim.value_warmup_steps``: None = the algorithm's default).

    Raises:
        ConfigError: an unknown override key or a bad value; a group method with G = 1.
    """
    estimator, critic, g_default, nll, dyn, warmup = _TABLE[cfg.name]
    est_fn = get_advantage_estimator(estimator)
    est_cfg = _replace(est_fn.config_cls(), dict(cfg.advantage), "algo.advantage")
    if cfg.policy_loss is not None:
        try:
            loss_fn = get_policy_loss(cfg.policy_loss)
        except ValueError as e:
            raise ConfigError(str(e), fix="use ppo, gspo, mpo or sao") from None
        loss_cfg = loss_fn.config_cls()
    else:
        loss_fn, loss_cfg = policy_loss_preset(cfg.name)
    loss_over = dict(cfg.loss)
    if getattr(loss_cfg, "loss_agg_mode", None) == "seq-mean-token-sum-norm" and loss_cfg.loss_norm_constant is None:
        loss_over.setdefault("loss_norm_constant", float(max_response_tokens))
    loss_cfg = _replace(loss_cfg, loss_over, "algo.loss")
    g = group_size if group_size is not None else g_default
    if not critic and g < 2:
        raise ConfigError(f"{cfg.name} compares rollouts of one prompt but rollout.group_size = {g}",
                          fix="set rollout.group_size >= 2")
    return Algorithm(
        name=cfg.name, estimator=estimator, estimator_config=est_cfg, loss_fn=loss_fn, loss_config=loss_cfg,
        uses_critic=critic, group_size=g, nll_coef=nll if cfg.nll_coef is None else cfg.nll_coef,
        dynamic_sampling=dyn if cfg.dynamic_sampling is None else cfg.dynamic_sampling,
        value_warmup_steps=(warmup if value_warmup_steps is None else value_warmup_steps) if critic else 0,
    )
