"""``critic-audit train --engine verl``: our run configuration as verl overrides (no verl import).

:func:`verl_run_spec` maps a :class:`~critic_audit.train.config.TrainConfig` (already checked by
:func:`~critic_audit.train.algos.build_algorithm`) onto verl's Hydra keys and the ``critic_audit``
options of the plugin:

==============================  ============================================================================
ours                            verl
==============================  ============================================================================
``algo.name``                   ``algorithm.adv_estimator``, ``actor.policy_loss.loss_mode``,
                                ``actor.loss_agg_mode`` (table :data:`ALGORITHMS`)
``algo.advantage.*``            ``algorithm.gamma`` / ``algorithm.lam`` (verl's estimators), or
                                ``critic_audit.*`` (ours: lam, lam_intra, beta, lam_critic, alpha, whiten)
``algo.loss.eps_low/eps_high``  ``actor.clip_ratio_low`` / ``actor.clip_ratio_high``
``algo.loss.mode`` (mpo)        ``critic_audit.ratio_mode``; ``log_ratio_clamp`` likewise
``model.policy``                ``actor_rollout_ref.model.path`` (``smollm2-135m``: the converted folder)
``model.critic``                ``critic.model.path`` (``policy``: the policy's folder)
``steps``                       ``trainer.total_training_steps``
``seed``                        ``data.seed``, ``actor_rollout_ref.rollout.seed``
``rollout.prompts_per_step``    ``data.train_batch_size``
``rollout.group_size``          ``actor_rollout_ref.rollout.n``
``rollout.temperature``         ``actor_rollout_ref.rollout.temperature``
``optim.lr`` / ``critic_lr``    ``actor.optim.lr`` / ``critic.optim.lr`` (only when set: the built-in
                                defaults suit its tiny model, verl's a real one)
``optim.ppo_epochs``            ``actor.ppo_epochs``, ``critic.ppo_epochs``
``optim.num_minibatches``       ``actor.ppo_mini_batch_size`` = prompts per step / num_minibatches
``optim.micro_batch_size``      ``*.ppo_micro_batch_size_per_gpu``, ``*.log_prob_micro_batch_size_per_gpu``
                                (default min(4, rollouts per mini-batch))
``optim.grad_clip``             ``actor.grad_clip``, ``critic.grad_clip``
``env.max_turns``               ``actor_rollout_ref.rollout.multi_turn.max_assistant_turns`` (with
                                ``multi_turn.enable`` and the ``tool_agent`` loop)
``env.max_new_tokens``          ``data.max_response_length`` = max_new_tokens x max_turns (verl bounds the
                                whole multi-turn response; only when set)
``log.save_every``              ``trainer.save_freq``
``log.rollouts_every``          ``critic_audit.dump_every`` (rollouts with values in ``OUT/rollouts``)
==============================  ============================================================================

Not carried (verl has its own): the environment (verl runs an agent loop with a tool config over a
prompt dataset: ``--verl data.train_files=...``), the ``tiny`` model, VAPO's positive-sample NLL,
value pretraining. They are listed in the spec's ``notes``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from critic_audit.algorithms import ALGORITHM_SPECS
from critic_audit.errors import ConfigError
from critic_audit.rl import MPOLossConfig
from critic_audit.train.algos import Algorithm, build_algorithm
from critic_audit.train.config import TrainConfig

__all__ = ["ALGORITHMS", "VerlRunSpec", "verl_run_spec"]

#: our algorithm -> (verl adv_estimator, verl loss_mode), from :data:`critic_audit.algorithms.ALGORITHM_SPECS`
ALGORITHMS: dict[str, tuple[str, str]] = {s.name: (s.verl_estimator, s.verl_loss_mode) for s in ALGORITHM_SPECS.values()}
_OUR_ESTIMATOR_KEYS = ("lam", "lam_intra", "beta", "lam_critic", "lam_actor", "alpha", "whiten")


@dataclass(frozen=True)
class VerlRunSpec:
    """What the launcher gets: verl overrides, the ``critic_audit`` options, and notes for the user."""

    overrides: list[str]
    options: dict[str, Any]
    notes: list[str] = field(default_factory=list)

    def argv(self) -> list[str]:
        """The launcher's command-line arguments (overrides, then ``critic_audit.KEY=VALUE``)."""
        opts = [f"critic_audit.{k}={_fmt(v)}" for k, v in sorted(self.options.items())]
        return [*self.overrides, *opts]


def _fmt(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def _model_path(name: str, what: str) -> str:
    if name == "tiny":
        raise ConfigError(f"{what} = 'tiny' is the built-in trainer's random model; verl loads a Hugging Face folder",
                          fix=f"--set {what}=smollm2-135m or a local model folder")
    if name == "smollm2-135m":
        from critic_audit.critic.backbones import cached_backbone

        return str(cached_backbone(name))
    p = Path(name).expanduser()
    if not (p / "config.json").is_file():
        raise ConfigError(f"{what} = {name!r} is not a Hugging Face model folder (no config.json)",
                          fix="give a local folder saved with save_pretrained, or smollm2-135m")
    return str(p.resolve())


def verl_run_spec(cfg: TrainConfig, out_dir: str | Path, extra: list[str] | tuple[str, ...] = ()) -> VerlRunSpec:
    """The verl overrides and plugin options of a run of ``cfg`` writing into ``out_dir``.

    ``extra`` (verl overrides given by the user, ``--verl KEY=VALUE``) come last and win.

    Raises:
        ConfigError: a setting verl cannot take (the ``tiny`` model, a model folder without config.json,
            a group method with G = 1, prompts per step not divisible by optim.num_minibatches, a
            supervised warm start).
    """
    if cfg.sft.file is not None:
        raise ConfigError("sft.file (a supervised warm start) belongs to the built-in trainer; --engine verl "
                          "does not run it", fix="fine-tune with verl's SFT trainer (verl.trainer.fsdp_sft_trainer) "
                          "and pass that model folder as model.policy, or drop --sft")
    algo = build_algorithm(cfg.algo, cfg.rollout.group_size, cfg.env.max_new_tokens * cfg.env.max_turns,
                           cfg.optim.value_warmup_steps)
    run = _Run(cfg, algo, Path(out_dir).resolve())
    for part in (_algorithm_overrides, _model_overrides, _batch_overrides, _carried_overrides):
        part(run)
    return VerlRunSpec(overrides=run.ov + list(extra), options=run.options, notes=run.notes)


@dataclass
class _Run:
    """A run being translated: its config, resolved algorithm and output folder, and what the parts of
    :func:`verl_run_spec` have gathered so far (verl overrides in order, plugin options, notes)."""

    cfg: TrainConfig
    algo: Algorithm
    out: Path
    ov: list[str] = field(default_factory=list)
    options: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def _algorithm_overrides(run: _Run) -> None:
    """The estimator and policy loss (verl's, or ours through the plugin options), dynamic sampling,
    and whether a critic is trained."""
    cfg, algo, ov, options = run.cfg, run.algo, run.ov, run.options
    estimator, loss_mode = ALGORITHMS[cfg.algo.name]
    if cfg.algo.policy_loss is not None:  # an explicit loss overrides the preset's
        loss_mode = {"ppo": "vanilla"}.get(cfg.algo.policy_loss, cfg.algo.policy_loss)
    ov += [
        f"algorithm.adv_estimator={estimator}",
        f"actor_rollout_ref.actor.policy_loss.loss_mode={loss_mode}",
    ]
    est = algo.estimator_config
    est_fields = {f.name: getattr(est, f.name) for f in dataclasses.fields(est)}
    ov.append(f"algorithm.gamma={est_fields.get('gamma', 1.0)}")
    if estimator == "gae":
        ov.append(f"algorithm.lam={est_fields['lam']}")
    elif estimator == "grpo":
        ov.append(f"algorithm.norm_adv_by_std_in_grpo={_fmt(cfg.algo.name != 'dr_grpo')}")
    else:  # ours
        options.update({k: v for k, v in est_fields.items() if k in _OUR_ESTIMATOR_KEYS})
    loss = algo.loss_config
    ov += [
        f"actor_rollout_ref.actor.clip_ratio_low={loss.eps_low}",
        f"actor_rollout_ref.actor.clip_ratio_high={loss.eps_high}",
        f"actor_rollout_ref.actor.loss_agg_mode={loss.loss_agg_mode}",
    ]
    if loss.loss_agg_mode == "seq-mean-token-sum-norm" and loss.loss_norm_constant is not None:
        ov.append(f"actor_rollout_ref.actor.loss_scale_factor={int(loss.loss_norm_constant)}")
    if isinstance(loss, MPOLossConfig):
        options["ratio_mode"] = loss.mode
        options["log_ratio_clamp"] = loss.log_ratio_clamp
    if algo.dynamic_sampling:
        ov += ["algorithm.filter_groups.enable=True", "algorithm.filter_groups.metric=reward"]
    if algo.nll_coef:
        run.notes.append(f"{cfg.algo.name}: the positive-sample NLL term (coefficient {algo.nll_coef}) has no verl "
                         "counterpart and is left out")
    if algo.uses_critic:
        ov += ["critic.enable=True", f"critic.ppo_epochs={cfg.optim.ppo_epochs}"]
        if cfg.optim.grad_clip is not None:
            ov.append(f"critic.grad_clip={cfg.optim.grad_clip}")
    else:
        ov.append("critic.enable=False")


def _model_overrides(run: _Run) -> None:
    """The policy's model folder, and the critic's when one is trained."""
    cfg = run.cfg
    policy = _model_path(cfg.model.policy, "model.policy")
    run.ov.append(f"actor_rollout_ref.model.path={policy}")
    if run.algo.uses_critic:
        if cfg.model.critic == "random":
            raise ConfigError("model.critic = 'random' has no verl counterpart (verl's critic starts from a model folder)",
                              fix="--set model.critic=policy or a model folder")
        critic = policy if cfg.model.critic == "policy" else _model_path(cfg.model.critic, "model.critic")
        run.ov.append(f"critic.model.path={critic}")


def _batch_overrides(run: _Run) -> None:
    """Steps, seeds, batch, mini- and micro-batch sizes, the multi-turn agent loop and the trainer's
    output (checkpoints under ``out``)."""
    cfg, algo, out = run.cfg, run.algo, run.out
    n_prompts = cfg.rollout.prompts(algo.group_size)
    if n_prompts % cfg.optim.num_minibatches:
        raise ConfigError(f"rollout.prompts_per_step = {n_prompts} is not divisible by optim.num_minibatches = "
                          f"{cfg.optim.num_minibatches} (verl's mini-batches hold whole prompt groups)",
                          fix="make prompts_per_step a multiple of num_minibatches")
    mini = n_prompts // cfg.optim.num_minibatches
    # rollouts per GPU in one forward/backward (verl requires it): ours, or 4 (at most a mini-batch's rollouts)
    micro = cfg.optim.micro_batch_size or min(4, mini * algo.group_size)
    run.ov += [
        f"trainer.total_training_steps={cfg.steps}",
        f"data.seed={cfg.seed}",
        f"actor_rollout_ref.rollout.seed={cfg.seed}",
        f"data.train_batch_size={n_prompts}",
        f"actor_rollout_ref.rollout.n={algo.group_size}",
        f"actor_rollout_ref.rollout.temperature={cfg.rollout.temperature}",
        f"actor_rollout_ref.actor.ppo_epochs={cfg.optim.ppo_epochs}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={mini}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={micro}",
        f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={micro}",
        # multi-turn: verl's tool agent loop (tools from rollout.multi_turn.tool_config_path)
        "actor_rollout_ref.rollout.multi_turn.enable=True",
        "actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent",
        f"actor_rollout_ref.rollout.multi_turn.max_assistant_turns={cfg.env.max_turns}",
        f"trainer.save_freq={cfg.log.save_every}",
        f"trainer.default_local_dir={out / 'checkpoints'}",
        "trainer.logger=[console]",
        f"trainer.experiment_name={out.name}",
    ]
    if algo.uses_critic:
        run.ov.append(f"critic.ppo_micro_batch_size_per_gpu={micro}")


def _carried_overrides(run: _Run) -> None:
    """Learning rates and the response length only where set away from the built-in trainer's
    defaults (noting the ones left at verl's), gradient clipping, rollout dumps, the critic warmup."""
    cfg, algo, ov = run.cfg, run.algo, run.ov
    # values sized for the built-in trainer's tiny model are not carried; verl's defaults stay unless set
    defaults = TrainConfig()
    kept = []
    if cfg.optim.lr != defaults.optim.lr:
        ov.append(f"actor_rollout_ref.actor.optim.lr={cfg.optim.lr}")
    else:
        kept.append("optim.lr (verl: actor lr 1e-6)")
    if algo.uses_critic:
        if cfg.optim.critic_lr != defaults.optim.critic_lr:
            ov.append(f"critic.optim.lr={cfg.optim.critic_lr}")
        else:
            kept.append("optim.critic_lr (verl: critic lr 1e-5)")
    if cfg.env.max_new_tokens != defaults.env.max_new_tokens or cfg.env.max_turns != defaults.env.max_turns:
        ov.append(f"data.max_response_length={cfg.env.max_new_tokens * cfg.env.max_turns}")
    else:
        kept.append("env.max_new_tokens (verl: data.max_response_length 512 for the whole multi-turn response)")
    if kept:
        run.notes.append("left at verl's defaults, set them with --set to carry ours: " + "; ".join(kept))
    if cfg.optim.grad_clip is not None:
        ov.append(f"actor_rollout_ref.actor.grad_clip={cfg.optim.grad_clip}")
    if cfg.log.rollouts_every > 0:
        run.options.update(dump_dir=str(run.out / "rollouts"), dump_every=cfg.log.rollouts_every)
    if cfg.env.name != defaults.env.name:
        run.notes.append(f"env.name = {cfg.env.name!r} is the built-in trainer's: verl runs its own agent loop on "
                         "the prompts of data.train_files (give them with --verl)")
    if algo.uses_critic and algo.value_warmup_steps:
        ov.append(f"trainer.critic_warmup={algo.value_warmup_steps}")


LAUNCHER = "critic_audit.integrations.verl.main"


def write_verl_run(spec: VerlRunSpec, out_dir: str | Path, python: str | None = None) -> dict[str, Path]:
    """Write ``OUT/verl/launch.sh`` (the launcher's command line, re-runnable by hand and on a Ray cluster)
    and ``OUT/verl/config.yaml`` (verl's full composed configuration, from ``--print-config``).

    Returns the paths. Raises:
        ConfigError: verl refused an override or an option (the launcher's one-line message).
    """
    import shlex
    import subprocess
    import sys

    from critic_audit.io.common import write_text_atomic

    py = python or sys.executable
    folder = Path(out_dir) / "verl"
    folder.mkdir(parents=True, exist_ok=True)
    argv = spec.argv()
    lines = " \\\n    ".join(shlex.quote(a) for a in argv)
    script = (
        "#!/usr/bin/env bash\n"
        "# Written by `critic-audit train --engine verl`. On a Ray cluster: `ray start --head` on the head node,\n"
        "# `ray start --address=HEAD:6379` on the others, then run this script on the head node\n"
        "# (add trainer.nnodes=N trainer.n_gpus_per_node=G).\n"
        "set -euo pipefail\n"
        f"exec {shlex.quote(py)} -m {LAUNCHER} \\\n    {lines} \\\n    \"$@\"\n"
    )
    # verl composes and checks the configuration first: nothing is written for one it refuses
    proc = subprocess.run([py, "-m", LAUNCHER, "--print-config", *argv], capture_output=True, text=True)
    if proc.returncode != 0:
        msg = (proc.stderr.strip().splitlines() or ["verl could not compose the configuration"])[-1]
        raise ConfigError(msg.removeprefix("error: "))
    config = folder / "config.yaml"
    write_text_atomic(proc.stdout, config)
    launch = folder / "launch.sh"
    write_text_atomic(script, launch)
    launch.chmod(0o755)
    return {"launch": launch, "config": config}
