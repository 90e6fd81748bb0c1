"""``fit-critic`` end to end: read rollouts with rewards, tokenize with the backbone's tokenizer, split
off held-out trajectories (whole groups / tasks, seeded), fit a value model to Monte-Carlo returns on the
rest, judge it on the held-out side with the quality gate, and save a critic folder.

Methods: ``head`` (closed-form ridge head on the frozen backbone), ``layers`` (the top K layers + head
trained on cached activations of the frozen lower layers), ``lora`` (LoRA adapters + head, merged).
The held-out figures (within-source explained variance and correlation with 95% intervals, the gate's
verdict; for ``layers`` / ``lora`` also the ridge head's on the same split) are written beside the
critic (``held_out.json`` and ``critic_audit.json``).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from critic_audit.critic.options import HeadFitOptions
from critic_audit.errors import ConfigError, CriticAuditError, InputError, UsageError
from critic_audit.io.inputs import read_inputs
from critic_audit.io.records import ReadOptions
from critic_audit.outputs import check_out_path, check_writable, refuse_input_clash
from critic_audit.pipeline.scoring import Progress
from critic_audit.turns import TokenizeConfig, tokenize_conversations

HELD_OUT_FILE = "held_out.json"


@dataclasses.dataclass(frozen=True)
class FitOptions(HeadFitOptions):
    """How ``fit-critic`` fits (besides reading and tokenizing): ``ridge``, ``weighting``, ``dtype``,
    ``token_budget`` (:class:`~critic_audit.critic.options.HeadFitOptions`, handed on to the head fit or
    to ``train``), and:"""

    method: str = "head"
    """``head``, ``layers`` or ``lora``."""
    held_out: float = 0.2
    """Share of each source's trajectories held out (whole groups / tasks)."""
    seed: int = 0
    """Seed of the split (and of the training order)."""
    train: Any = None
    """A :class:`critic_audit.critic.train.TrainConfig` for ``layers`` / ``lora`` (method, seed,
    ridge, weighting, dtype and token budget are taken from the fields above)."""


def _check_outcomes(rewards: Sequence[float], n_min: int) -> None:
    """One line when there are too few trajectories or a single outcome."""
    r = np.asarray(rewards, dtype=np.float64)
    if r.size < n_min:
        raise InputError(f"only {r.size} trajectories with policy tokens and a reward; a fit with a held-out "
                         f"split needs at least {n_min}", fix="add rollouts (both outcomes) or fit on more files")
    if np.unique(r).size < 2:
        raise InputError(f"all {r.size} trajectories have reward {r[0]:g}: a single outcome, nothing for a value "
                         "to explain", fix="fit on rollouts with both successes and failures")


def _split(units: list[tuple[str, str]], rewards: np.ndarray, fraction: float, seed: int) -> tuple[np.ndarray, int]:
    """The held-out mask (:func:`held_out_split`) of the first seed from ``seed`` whose two sides both
    hold at least 2 trajectories of each outcome; returns ``(mask, seed used)``."""
    from critic_audit.analysis.quality import outcome_split
    from critic_audit.critic.split import held_out_split

    pos = outcome_split(rewards)
    for s in range(seed, seed + 100):
        held = held_out_split(units, fraction, s)
        sides = [pos[held], pos[~held]]
        if all(side.sum() >= 2 and (~side).sum() >= 2 for side in sides):
            return held, s
    raise InputError(f"no held-out split of whole groups (fraction {fraction}) gives both sides 2 trajectories of "
                     "each outcome", fix="fit on more groups / tasks, or change --held-out")


def held_out_quality(values: Sequence[np.ndarray], rewards: Sequence[float], strata: Sequence[str],
                     seed: int = 0, groups: Sequence[str | None] | None = None) -> dict[str, Any]:
    """The quality gate (:func:`critic_audit.analysis.quality.quality_gate`) of values on held-out
    trajectories: within-source correlation of the mean value with the reward and within-source
    explained variance of the token values against the return, with 95% intervals.

    Args:
        values: per trajectory, float values of its selected policy tokens.
        rewards: per trajectory, its return.
        strata: per trajectory, its source (strata of the gate).
        groups: per trajectory, its ``group_id`` (the task / prompt) or None: when a group holds
            several held-out trajectories, the gate's intervals and test resample whole groups
            (:func:`critic_audit.analysis.quality.quality_gate`).
    """
    import polars as pl

    from critic_audit.analysis.audit import cluster_codes
    from critic_audit.analysis.quality import GateConfig, TrajectorySums, outcome_split, quality_gate

    r = np.asarray(rewards, dtype=np.float64)
    names = sorted(set(strata))
    err = [r[i] - np.asarray(v, dtype=np.float64) for i, v in enumerate(values)]
    t = TrajectorySums(stratum=np.array([names.index(s) for s in strata]), reward=r,
                       mean_value=np.array([float(np.mean(v)) for v in values]),
                       n_tokens=np.array([float(len(v)) for v in values]),
                       err_mean=np.array([float(e.mean()) for e in err]),
                       err_m2=np.array([float(((e - e.mean()) ** 2).sum()) for e in err]),
                       positive=outcome_split(r),
                       cluster=None if groups is None else cluster_codes(pl.DataFrame(
                           {"source": list(strata), "group_id": [None if g is None else str(g) for g in groups]},
                           schema={"source": pl.String, "group_id": pl.String})))
    return quality_gate(t, GateConfig(seed=seed)).to_dict()  # fit-critic's JSON (held_out.json, the critic's metadata)


def _read(inputs: Sequence[str | Path], read_options: ReadOptions, tokenize: TokenizeConfig, bdir: Path,
          progress: Progress | None) -> tuple[list, Any, dict]:
    from critic_audit.critic import load_tokenizer

    try:
        convs = read_inputs(inputs, read_options)
    except CriticAuditError as exc:
        if exc.fix and "--no-reward" in exc.fix:  # the readers' way out; fit-critic has no such option
            fix = re.sub(r",? or (pass )?--no-reward", "", exc.fix) + " (fit-critic fits values to rewards)"
            raise type(exc)(exc.problem, path=exc.path, record=exc.record, fix=fix) from exc
        raise
    _check_outcomes([c.reward for c in convs if c.reward is not None], 2)
    tokenizer = load_tokenizer(bdir)
    ctx = int(json.loads((Path(bdir) / "config.json").read_text()).get("max_position_embeddings") or 2048)
    tcfg = dataclasses.replace(tokenize, max_length=min(tokenize.max_length or ctx, ctx))
    res = tokenize_conversations(convs, tokenizer, tcfg,
                                 progress=(lambda d, n: progress("tokenize", d, n)) if progress else None)
    return convs, res, {c.trajectory_id: c for c in convs}


def check_outputs(inputs: Sequence[str | Path], out_dir: str | Path, head_out: str | Path | None,
                  overwrite: bool) -> None:
    """Refuse, before the fit (a refusal after it would lose the work), an ``out_dir`` or ``head_out``
    that is (or holds) an input (:func:`critic_audit.outputs.refuse_input_clash`), cannot be created
    (:func:`critic_audit.outputs.check_writable`), or would replace a folder or file without
    ``overwrite`` (:func:`critic_audit.critic.fit.prepare_critic_out`).

    Raises:
        ConfigError: as above, one line naming the option, the path and the fix.
    """
    from critic_audit.critic.fit import prepare_critic_out

    refuse_input_clash(out_dir, inputs, example="critic_out")
    check_writable(prepare_critic_out(Path(out_dir), overwrite))
    if head_out is None:
        return
    refuse_input_clash(head_out, inputs, option="--head-out", example="head.safetensors")
    hp = check_out_path(head_out, option="--head-out", example="head.safetensors")
    if hp.is_dir():
        raise ConfigError(f"--head-out {head_out} is a folder; it names one file",
                          fix=f"pass a file path, e.g. --head-out {Path(head_out) / 'head.safetensors'}")
    if hp.exists() and not overwrite:
        raise ConfigError(f"--head-out {head_out} exists; it is not replaced without --overwrite",
                          fix="pass another path, or --overwrite to replace it")
    check_writable(hp, option="--head-out")


def fit_critic(
    inputs: Sequence[str | Path],
    out_dir: str | Path,
    *,
    backbone: str = "smollm2-135m",
    read_options: ReadOptions = ReadOptions(),
    tokenize: TokenizeConfig = TokenizeConfig(),
    options: FitOptions = FitOptions(),
    head_out: str | Path | None = None,
    overwrite: bool = False,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Fit a value model to Monte-Carlo returns on the fit side of a held-out split; save a critic folder.

    The target of every policy token is its trajectory's reward (the return with gamma = 1 and
    lambda = 1: VC-PPO's value pretraining, arXiv:2503.01491). Rollouts must carry rewards, have both
    outcomes and number at least :data:`critic_audit.critic.split.MIN_TRAJECTORIES`.

    Returns:
        A dict with the output paths, the held-out figures (``held_out``: per method, the gate's
        verdict with the within-source explained variance and correlation and their 95% intervals),
        the split and the fit's costs. Nothing is written when the input is refused.

    Raises:
        InputError: unreadable rollouts, a missing reward, a single outcome, too few trajectories, no
        usable split. CheckpointError: the backbone cannot be prepared. ConfigError: bad options.
    """
    from critic_audit.critic import cached_backbone
    from critic_audit.critic.fit import check_fits_backbone, fit_rows
    from critic_audit.critic.split import MIN_TRAJECTORIES, split_units

    if not read_options.require_reward:
        raise ConfigError("fit-critic needs rewards", fix="drop --no-reward and give every rollout a reward")
    if options.method not in ("head", "layers", "lora"):
        raise UsageError(f"--method must be head, layers or lora, got {options.method!r}", fix="use e.g. --method head")
    if not 0 < options.held_out < 1:
        raise UsageError(f"--held-out must be in (0, 1), got {options.held_out}", fix="use e.g. --held-out 0.2")
    if options.train is not None:  # checked with --method head too: a bad option is never silently ignored
        dataclasses.replace(options.train, method="lora" if options.method == "lora" else "layers").check()
    if head_out is not None and options.method == "lora":
        raise UsageError("--head-out writes a head or top layers; a LoRA fit changes every layer",
                         fix="use the critic folder (--out) of a lora fit")
    for p in inputs:
        if not Path(p).exists():
            raise InputError("no such file or folder", path=p, fix="check the path")
    check_outputs(inputs, out_dir, head_out, overwrite)
    bdir = Path(cached_backbone(backbone))
    convs, res, by_id = _read(inputs, read_options, tokenize, bdir, progress)
    tcs = res.conversations
    data = fit_rows([t.input_ids for t in tcs], [t.response_mask for t in tcs],
                    [float(by_id[t.trajectory_id].reward) for t in tcs])
    kept = [by_id[tcs[i].trajectory_id] for i in data.keep]
    rewards = np.array([c.reward for c in kept], dtype=np.float64)
    _check_outcomes(rewards, MIN_TRAJECTORIES)
    ctx = int(json.loads((bdir / "config.json").read_text()).get("max_position_embeddings") or 0)
    vocab = int(json.loads((bdir / "config.json").read_text()).get("vocab_size") or 0)
    check_fits_backbone(data, ctx, vocab or 2**62)
    units = split_units([c.source for c in kept], [c.group_id for c in kept], [c.trajectory_id for c in kept])
    held, seed_used = _split(units, rewards, options.held_out, options.seed)
    train_rows = [int(i) for i in np.nonzero(~held)[0]]
    held_rows = [int(i) for i in np.nonzero(held)[0]]
    fitted = _fit(bdir, data, train_rows, held_rows, options, progress)
    strata = [str(kept[j].source) for j in held_rows]
    groups = [kept[j].group_id for j in held_rows]
    report = {name: held_out_quality(v, rewards[held_rows], strata, options.seed, groups)
              for name, v in fitted["held_out_values"].items()}
    split = {"unit": "group_id, else the trajectory (one per task)", "fraction": options.held_out,
             "seed": seed_used, "n_fit": len(train_rows), "n_held_out": len(held_rows),
             "held_out_ids": [kept[j].trajectory_id for j in held_rows]}
    held_doc = {"method": options.method, "split": split, "held_out": report, "history": fitted.get("history"),
                "costs": fitted["costs"]}
    meta = {"fit": {"method": options.method, "target": "Monte-Carlo return (gamma = 1, lambda = 1)",
                    "weighting": options.weighting, "config": fitted["config"],
                    "in_sample": fitted.get("in_sample"), "held_out": report, "split": split,
                    "costs": fitted["costs"], "inputs": [str(p) for p in inputs], "n_conversations": len(convs),
                    # fit and held-out trajectories alike (the held-out side chose the epoch): the audit skips them
                    "trajectory_ids": [c.trajectory_id for c in kept], "excluded": res.excluded_counts}}
    from critic_audit.critic.fit import save_critic, save_delta, save_head

    path = save_critic(bdir, fitted["weight"], fitted["bias"], out_dir, metadata=meta, overwrite=overwrite,
                       state=fitted.get("state"),
                       extra_files={HELD_OUT_FILE: json.dumps(held_doc, indent=2, default=str) + "\n"})
    info: dict[str, Any] = {"critic": str(path), "method": options.method, "held_out": _brief(report),
                            "split": {k: v for k, v in split.items() if k != "held_out_ids"},
                            "costs": fitted["costs"], "excluded": res.excluded_counts,
                            "truncated_trajectories": res.truncated_trajectories}
    if head_out is not None:
        info["head"] = str(save_delta(fitted["state"], head_out, metadata=meta) if fitted.get("state")
                           else save_head(fitted["weight"], fitted["bias"], head_out, metadata=meta))
    if fitted.get("cleanup"):
        fitted["cleanup"]()
    return info


def _brief(report: dict[str, dict]) -> dict[str, Any]:
    """Per method: status, the EV and correlation with their intervals (the held-out figures)."""
    return {name: {"status": g["status"], "reasons": g["reasons"],
                   "explained_variance": g["explained_variance_within_stratum"],
                   "correlation": g["corr_within_stratum"], "n_trajectories": g["n_trajectories"]}
            for name, g in report.items()}


def _fit(bdir: Path, data: Any, train_rows: list[int], held_rows: list[int], options: FitOptions,
         progress: Progress | None) -> dict[str, Any]:
    """Run the method; returns weight, bias, state (or None), held-out values per method, costs, config."""
    import time

    from critic_audit.critic.fit import FitConfig, FitData, fit_value_head, head_values

    if options.method == "head":
        cfg = FitConfig(**options.head_fit_fields())
        sub = FitData(seqs=[data.seqs[j] for j in train_rows], masks=[data.masks[j] for j in train_rows],
                      targets=[data.targets[j] for j in train_rows], keep=train_rows)
        t0 = time.perf_counter()
        fit = fit_value_head(bdir, sub.seqs, [np.concatenate([[False], m]) for m in sub.masks],
                             [np.concatenate([[np.nan], t]) for t in sub.targets], config=cfg,
                             progress=(lambda d, n: progress("fit", d, n)) if progress else None)
        vals = head_values(bdir, data, held_rows, fit.weight, fit.bias, config=cfg)
        in_sample = {f"in_sample_{k}" if k.startswith("explained_variance") else k: v for k, v in fit.metrics.items()}
        return {"weight": fit.weight, "bias": fit.bias, "state": None, "held_out_values": {"head": vals},
                "in_sample": in_sample, "config": dataclasses.asdict(cfg),
                "costs": {"seconds": time.perf_counter() - t0, "fit_tokens_per_s": fit.metrics.get("tokens_per_s")}}
    from critic_audit.critic.train import TrainConfig, remove_work, train_value_model

    base = options.train or TrainConfig(method=options.method)
    cfg = dataclasses.replace(base, method=options.method, seed=options.seed, **options.head_fit_fields())
    res = train_value_model(bdir, data, train_rows, held_rows, cfg, progress=progress)
    epochs = [h for h in res.history if h["epoch"] > 0]
    costs = {k: res.metrics.get(k) for k in ("seconds", "cache_tokens_per_s", "cache_bytes", "best_epoch",
                                              "epochs_run", "stopped_early", "trained_parameters")}
    costs["epoch_tokens_per_s"] = [h["tokens_per_s"] for h in epochs]
    return {"weight": res.state["score.weight"].numpy().reshape(-1), "bias": float(res.state["score.bias"]),
            # epoch 0 kept: the backbone's own weights + the ridge head (the head alone is the delta)
            "state": res.state if res.metrics["best_epoch"] > 0 else None,
            "held_out_values": {options.method: res.held_out_values, "head": res.head_values},
            "history": res.history, "config": dataclasses.asdict(cfg), "costs": costs,
            "cleanup": lambda: remove_work(res)}
