"""Launch verl's PPO trainer with critic-audit's plugin: ``python -m critic_audit.integrations.verl.main``.

Takes verl's own Hydra overrides (``data.train_files=... actor_rollout_ref.model.path=...``) plus
``critic_audit.KEY=VALUE`` options (:mod:`critic_audit.integrations.verl.options`), and then does what
verl's ``python -m verl.trainer.main_ppo`` does, with four differences:

1. the ``critic_audit`` options are checked and put into :data:`OPTIONS_ENV` of the driver and, through
   ``ray_kwargs.ray_init.runtime_env.env_vars``, of every Ray worker on every node;
2. ``VERL_USE_EXTERNAL_MODULES`` gains :mod:`critic_audit.integrations.verl.trainer`, so that each
   process registers our trainer (the estimators and losses come with ``import verl`` through the
   ``verl.plugins`` entry point);
3. ``trainer.v1.trainer_mode`` defaults to ``critic_audit_sync`` (verl's synchronous trainer, with critic
   values handed to our estimators and per-step rollout dumps);
4. ``critic.enable`` defaults to true when ``algorithm.adv_estimator`` is one of ours (they all need a
   critic; verl turns its critic on for ``gae`` only).

``--print-config`` prints the composed configuration (YAML) after verl's ``validate_config`` has
accepted it, and exits without starting Ray.
Errors in the options or the overrides stop with one line (``CRITIC_AUDIT_DEBUG=1``: traceback).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from critic_audit.algorithms import verl_plugin_estimators
from critic_audit.errors import ConfigError, CriticAuditError
from critic_audit.integrations.verl.options import OPTIONS_ENV, validate_options

__all__ = ["compose_verl_config", "check_config", "main", "parse_value", "prepare_environment", "split_overrides"]

TRAINER_MODULE = "critic_audit.integrations.verl.trainer"
TRAINER_MODE = "critic_audit_sync"
#: the plugin's estimators (from the algorithm table): each needs the critic
_OUR_ESTIMATORS = tuple(verl_plugin_estimators())


def parse_value(text: str) -> Any:
    """A Hydra-like scalar: ``true``/``false``, ``null``, an int, a float, else the string."""
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("null", "none", "~"):
        return None
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text.strip().strip("'\"")


def split_overrides(args: Sequence[str]) -> tuple[dict[str, Any], list[str]]:
    """Split ``critic_audit.KEY=VALUE`` (also ``+critic_audit.KEY=VALUE``) from verl's overrides.

    Raises:
        ConfigError: a ``critic_audit`` override without ``=``, or an unknown key.
    """
    ours: dict[str, Any] = {}
    rest: list[str] = []
    for arg in args:
        bare = arg.lstrip("+")
        if bare.startswith("critic_audit."):
            key, sep, value = bare[len("critic_audit."):].partition("=")
            if not sep:
                raise ConfigError(f"override {arg!r} has no value", fix=f"write {bare}=VALUE")
            ours[key] = parse_value(value)
        else:
            rest.append(arg)
    return validate_options(ours), rest


def _has_override(overrides: Sequence[str], key: str) -> bool:
    return any(o.lstrip("+~").split("=", 1)[0] == key for o in overrides)


def _override_value(overrides: Sequence[str], key: str) -> str | None:
    for o in reversed(overrides):
        k, sep, v = o.lstrip("+").partition("=")
        if sep and k == key:
            return v
    return None


def default_overrides(overrides: Sequence[str]) -> list[str]:
    """Our defaults (trainer mode, critic on for our estimators) for those keys the user left unset."""
    out: list[str] = []
    if not _has_override(overrides, "trainer.v1.trainer_mode"):
        out.append(f"trainer.v1.trainer_mode={TRAINER_MODE}")
    est = _override_value(overrides, "algorithm.adv_estimator")
    if est is not None and est.removeprefix("critic_audit.") in _OUR_ESTIMATORS:
        if not _has_override(overrides, "critic.enable"):
            out.append("critic.enable=True")
    return out


def compose_verl_config(overrides: Sequence[str], config_name: str = "ppo_trainer") -> Any:
    """verl's trainer config (an OmegaConf DictConfig) with ``overrides`` applied, as its Hydra
    entry point would compose it.

    Raises:
        ConfigError: Hydra refused an override (the message names it).
    """
    import verl.trainer
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    config_dir = Path(verl.trainer.__file__).parent / "config"
    try:
        with initialize_config_dir(config_dir=str(config_dir), version_base=None):
            return compose(config_name=config_name, overrides=list(overrides))
    except (HydraException, OmegaConfBaseException) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(f"verl rejected the overrides: {first}",
                          fix="check the key against `--print-config`; new keys need a leading '+'") from None


def prepare_environment(options: dict[str, Any], environ: dict[str, str] | None = None) -> dict[str, str]:
    """Set :data:`OPTIONS_ENV` and add our trainer module to ``VERL_USE_EXTERNAL_MODULES``; returns
    the variables that every Ray worker needs too."""
    env = os.environ if environ is None else environ
    modules = [m for m in env.get("VERL_USE_EXTERNAL_MODULES", "").split(",") if m]
    if TRAINER_MODULE not in modules:
        modules.append(TRAINER_MODULE)
    worker_env = {OPTIONS_ENV: json.dumps(options, sort_keys=True), "VERL_USE_EXTERNAL_MODULES": ",".join(modules)}
    env.update(worker_env)
    return worker_env


def _attach_worker_env(config: Any, worker_env: dict[str, str]) -> None:
    from omegaconf import OmegaConf

    for k, v in worker_env.items():
        OmegaConf.update(config, f"ray_kwargs.ray_init.runtime_env.env_vars.{k}", v, force_add=True)


def _root_message(e: BaseException) -> str:
    """The innermost cause's message, on one line (Hydra wraps the dataclass checks' errors)."""
    while (e.__cause__ or e.__context__) is not None and str(e.__cause__ or e.__context__):
        e = e.__cause__ or e.__context__  # type: ignore[assignment]
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= 400 else text[:397] + "..."


def check_config(config: Any) -> None:
    """verl's own ``validate_config`` (what its entry point runs before starting Ray: batch sizes,
    micro-batch sizes, the typed worker configs), with its output on stderr.

    Raises:
        ConfigError: verl refused the configuration (its message, on one line).
    """
    import contextlib

    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config
    from verl.utils.device import auto_set_device

    if not config.trainer.use_v1:
        raise ConfigError("trainer.use_v1=False selects verl's legacy trainer, which this launcher does not wrap",
                          fix="keep trainer.use_v1=True (verl's default)")
    try:
        with contextlib.redirect_stdout(sys.stderr):
            auto_set_device(config)
            validate_config(config=config, use_reference_policy=need_reference_policy(config),
                            use_critic=need_critic(config))
    except Exception as e:  # noqa: BLE001  (verl raises assertions and Hydra instantiation errors)
        raise ConfigError(f"verl rejected the configuration: {_root_message(e)}",
                          fix="set the key it names (`--print-config` shows the composed configuration)") from None


def build(args: Sequence[str], *, check: bool = True) -> tuple[Any, dict[str, Any]]:
    """Options and composed verl config from the command line (no side effect but the environment);
    checked by verl's ``validate_config`` unless ``check`` is false."""
    options, rest = split_overrides(args)
    overrides = rest + default_overrides(rest)
    worker_env = prepare_environment(options)
    config = compose_verl_config(overrides)
    _attach_worker_env(config, worker_env)
    if check:
        check_config(config)
    return config, options


def run(config: Any) -> None:
    """What verl's ``main_ppo.main`` does with a composed, checked config: start Ray, train."""
    import torch
    from verl.trainer.main_ppo import TaskRunnerV1, run_ppo

    if not torch.cuda.is_available() and config.actor_rollout_ref.rollout.name in ("vllm", "sglang", "trtllm"):
        sys.stderr.write(f"warning: no GPU visible; verl's {config.actor_rollout_ref.rollout.name} rollout needs one, "
                         "and Ray will wait for GPU resources that never come (stop with Ctrl-C)\n")
    run_ppo(config, task_runner_class=TaskRunnerV1)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    print_only = "--print-config" in args
    args = [a for a in args if a != "--print-config"]
    try:
        config, _ = build(args)
        if print_only:
            from omegaconf import OmegaConf

            sys.stdout.write(OmegaConf.to_yaml(config))
            return 0
        run(config)
    except CriticAuditError as e:
        if os.environ.get("CRITIC_AUDIT_DEBUG"):
            raise
        sys.stderr.write(f"error: {e}\n")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
