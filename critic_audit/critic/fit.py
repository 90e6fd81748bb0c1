"""Fit a value head on a frozen backbone and save it as a token-classification critic.

Method (the minimum of VC-PPO-style value pretraining): Monte-Carlo targets with lambda = 1 and
gamma = 1, so every policy token's target is its trajectory's return. For every token ``t >= 1`` with
``response_mask[t]`` true, the feature is the backbone's last hidden state at position ``t-1``
(float32; the same t-1 convention as :func:`critic_audit.critic.score_values`) and the target is the
return. The head is the closed-form ridge regression with an unpenalised bias; ``X^T W X`` and
``X^T W y`` are accumulated in float64 across batches, so memory is O(hidden^2) whatever the data size.

Token weighting: a 40-turn trajectory has far more policy tokens than a 3-turn one, and its tokens all
share one target. Weighting every token equally (``"token"``) lets long trajectories dominate the fit
(and the explained variance), although each trajectory is one outcome sample. ``"trajectory"``
(default) weights each trajectory's tokens by ``1/n`` so that every trajectory counts once, which
matches how returns are sampled; use ``"token"`` to reproduce a per-token MSE value loss.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from critic_audit.critic.checkpoint import quiet_transformers, read_config, weight_files
from critic_audit.critic.infer import iter_hidden_states
from critic_audit.critic.load import HEAD_PREFIX, load_tokenizer, resolve_device, resolve_dtype
from critic_audit.critic.options import HeadFitOptions
from critic_audit.critic.scored import PassStats
from critic_audit.errors import CheckpointError, ConfigError

Progress = Callable[[int, int], None]
WEIGHTINGS = ("token", "trajectory")
METADATA_FILE = "critic_audit.json"


@dataclass(frozen=True)
class FitConfig(HeadFitOptions):
    """Options of :func:`fit_value_head`: ``ridge``, ``weighting``, ``dtype``, ``token_budget``
    (:class:`~critic_audit.critic.options.HeadFitOptions`), and:"""

    device: str = "auto"
    """``auto`` (cuda if available, else cpu), ``cpu``, ``cuda``, ``cuda:N``."""

    max_length: int | None = None
    """Refuse sequences longer than this (default: the backbone's max_position_embeddings)."""

    trust_remote_code: bool = False
    """Allow backbones whose config has ``auto_map`` (custom code)."""


@dataclass
class FitResult:
    """A fitted value head: ``value = weight @ h + bias``.

    Attributes:
        weight: float32 array (hidden,).
        bias: float.
        metrics: ``n_trajectories`` (with at least one selected token), ``n_tokens``,
            ``explained_variance`` (R^2 = 1 - MSE / Var(target) on the fit data, under the fit
            weighting; None when the targets do not vary), ``explained_variance_token`` and
            ``explained_variance_trajectory`` (under each weighting), ``mse``, ``target_mean``,
            ``target_std``, ``ridge_lambda`` (absolute penalty), ``hidden_size``, ``weighting``,
            ``seconds``, ``tokens_per_s``, ``padding_efficiency``.
        config: the :class:`FitConfig` used.
    """

    weight: np.ndarray
    bias: float
    metrics: dict[str, Any] = field(default_factory=dict)
    config: FitConfig = field(default_factory=FitConfig)


def load_backbone(
    backbone_dir: str | Path,
    *,
    device: str | torch.device = "auto",
    dtype: str | torch.dtype = "auto",
    trust_remote_code: bool = False,
) -> tuple[torch.nn.Module, torch.device, torch.dtype, Any]:
    """Load the base model of a causal-LM (or token-classification) folder, frozen, in eval mode.

    Returns ``(backbone, device, dtype, config)``.
    """
    path = Path(backbone_dir)
    dev = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, dev)
    read_config(path, trust_remote_code=trust_remote_code)
    weight_files(path)
    from transformers import AutoConfig, AutoModel

    try:
        with quiet_transformers():
            config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
            model = AutoModel.from_pretrained(path, dtype=torch_dtype, trust_remote_code=trust_remote_code)
    except ValueError as exc:
        raise CheckpointError(f"cannot load the backbone ({str(exc).splitlines()[0]})", path=path) from exc
    model.eval().requires_grad_(False).to(dev)
    return model, dev, torch_dtype, config


def _as_targets(ret: Any, n: int, i: int) -> np.ndarray:
    """A trajectory's return (scalar -> every token) or per-token targets (array of length n)."""
    arr = np.asarray(ret, dtype=np.float64)
    if arr.ndim == 0:
        arr = np.full(n, float(arr))
    elif arr.shape != (n,):
        raise ConfigError(f"returns[{i}] has shape {arr.shape}; expected a scalar or ({n},)")
    return arr


class Moments:
    """Weighted raw moments of z = [x, 1] and y, in float64."""

    def __init__(self, d: int, device: torch.device) -> None:
        self.zz = torch.zeros(d + 1, d + 1, dtype=torch.float64, device=device)
        self.zy = torch.zeros(d + 1, dtype=torch.float64, device=device)
        self.yy = 0.0

    def add(self, z: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> None:
        wz = z * w[:, None]
        self.zz += z.T @ wz
        self.zy += wz.T @ y
        self.yy += float((w * y * y).sum())

    def numpy(self) -> tuple[np.ndarray, np.ndarray, float]:
        return self.zz.cpu().numpy(), self.zy.cpu().numpy(), self.yy


def solve_ridge(zz: np.ndarray, zy: np.ndarray, yy: float, ridge: float) -> tuple[np.ndarray, float, float]:
    """Ridge with unpenalised bias from raw moments. Returns (weight, bias, absolute lambda)."""
    d = zz.shape[0] - 1
    sw = zz[d, d]
    mx = zz[:d, d] / sw
    my = zy[d] / sw
    cxx = zz[:d, :d] / sw - np.outer(mx, mx)
    cxy = zy[:d] / sw - mx * my
    scale = float(np.trace(cxx)) / d if d else 0.0
    lam = ridge * (scale if scale > 0 else 1.0)
    a = cxx + lam * np.eye(d)
    try:
        if lam <= 0:
            raise np.linalg.LinAlgError
        w = np.linalg.solve(a, cxy)
    except np.linalg.LinAlgError:
        w = np.linalg.lstsq(a, cxy, rcond=None)[0]
    b = float(my - mx @ w)
    return w, b, lam


def _r2(zz: np.ndarray, zy: np.ndarray, yy: float, w: np.ndarray, b: float) -> tuple[float | None, float, float]:
    """(R^2, MSE, Var(y)) of prediction w.x + b under the moments' weighting; R^2 is None (JSON-safe)
    when the targets do not vary."""
    d = zz.shape[0] - 1
    sw = zz[d, d]
    theta = np.append(w, b)
    mse = (yy - 2 * theta @ zy + theta @ zz @ theta) / sw
    var = yy / sw - (zy[d] / sw) ** 2
    mse = max(float(mse), 0.0)
    r2 = 1.0 - mse / var if var > 1e-12 * max(1.0, yy / sw) else None
    return r2, mse, float(var)


def fit_value_head(
    backbone_dir: str | Path,
    sequences: Sequence[np.ndarray],
    response_masks: Sequence[np.ndarray],
    returns: Sequence[float] | Sequence[np.ndarray],
    *,
    config: FitConfig = FitConfig(),
    progress: Progress | None = None,
) -> FitResult:
    """Fit a linear value head on the frozen backbone in ``backbone_dir`` (closed-form ridge).

    Args:
        backbone_dir: a Hugging Face causal-LM folder (e.g. from :func:`cached_backbone`) or an
            existing critic folder (its head is ignored).
        sequences: token-id arrays (the backbone's tokenizer).
        response_masks: boolean arrays of the same lengths; True marks policy (assistant) tokens.
        returns: per trajectory, its return (float; Monte-Carlo target of every selected token), or a
            float array of the sequence's length with a target per token.
        config: :class:`FitConfig`.
        progress: optional ``progress(done_tokens, total_tokens)``.

    Selected tokens are ``t >= 1`` with ``response_masks[i][t]``; their feature is ``h[t-1]``.

    Raises:
        ConfigError: mismatched lengths, non-finite returns, bad options, fewer than 2 selected tokens.
        CheckpointError: the backbone folder cannot be loaded.
    """
    if config.weighting not in WEIGHTINGS:
        raise ConfigError(f"weighting must be one of {WEIGHTINGS}, got {config.weighting!r}")
    if not (config.ridge >= 0 and math.isfinite(config.ridge)):
        raise ConfigError(f"ridge must be a finite number >= 0, got {config.ridge}")
    if not (len(sequences) == len(response_masks) == len(returns)):
        raise ConfigError(
            f"sequences ({len(sequences)}), response_masks ({len(response_masks)}) and returns "
            f"({len(returns)}) must have the same length"
        )
    data = fit_rows(sequences, response_masks, returns)
    n_tokens = int(sum(int(m.sum()) for m in data.masks))
    if n_tokens < 2:
        raise ConfigError(f"only {n_tokens} selected token(s) to fit on", fix="pass trajectories with policy tokens")

    backbone, dev, _, hf_config = load_backbone(
        backbone_dir, device=config.device, dtype=config.dtype, trust_remote_code=config.trust_remote_code
    )
    max_length = config.max_length or int(getattr(hf_config.get_text_config(), "max_position_embeddings", 0) or 0)
    check_fits_backbone(data, max_length, int(backbone.get_input_embeddings().num_embeddings))
    d = int(hf_config.get_text_config().hidden_size)
    t0 = time.perf_counter()
    mom, passes = _accumulate(backbone, dev, data, d, token_budget=config.token_budget, progress=progress)
    fit_mom = mom[config.weighting].numpy()
    w, b, lam = solve_ridge(*fit_mom, config.ridge)
    metrics: dict[str, Any] = {
        "n_trajectories": len(data.seqs),
        "n_trajectories_skipped": len(sequences) - len(data.seqs),
        "n_tokens": n_tokens,
        "weighting": config.weighting,
        "hidden_size": d,
        "ridge": config.ridge,
        "ridge_lambda": lam,
    }
    metrics.update(_fit_quality(mom, config.weighting, w, b))
    seconds = time.perf_counter() - t0
    metrics.update(
        seconds=seconds,
        tokens_per_s=passes.tokens_per_s,
        padding_efficiency=passes.padding_efficiency,
    )
    return FitResult(weight=w.astype(np.float32), bias=float(b), metrics=metrics, config=config)


def head_values(backbone_dir: str | Path, data: "FitData", rows: Sequence[int], weight: np.ndarray, bias: float,
                *, config: FitConfig = FitConfig()) -> list[np.ndarray]:
    """The values ``weight @ h[t-1] + bias`` (float64) of the selected tokens of ``data``'s ``rows``
    under the frozen backbone (e.g. a head fitted on other rows, judged on these), in mask order."""
    backbone, dev, _, _ = load_backbone(backbone_dir, device=config.device, dtype=config.dtype,
                                        trust_remote_code=config.trust_remote_code)
    w = torch.as_tensor(np.asarray(weight, dtype=np.float64), device=dev)
    out: dict[int, np.ndarray] = {}
    with torch.inference_mode():
        for idx, hs in iter_hidden_states(backbone, dev, [data.seqs[j] for j in rows],
                                          token_budget=config.token_budget):
            for i, h in zip(idx, hs, strict=True):
                sel = torch.as_tensor(data.masks[rows[i]][: len(h)], device=dev)
                out[rows[i]] = (h[sel].double() @ w + bias).cpu().numpy()
    return [out[j] for j in rows]


@dataclass
class FitData:
    """The trajectories with at least one selected token (``t >= 1`` with its response mask set).

    Attributes:
        seqs: their 1-D token-id arrays, length L each.
        masks: bool arrays (L-1,), ``masks[j][t-1]`` true when token t is selected (feature ``h[t-1]``).
        targets: float64 arrays (L-1,), ``targets[j][t-1]`` the target of token t.
        keep: each one's index in the caller's ``sequences``.
    """

    seqs: list[np.ndarray] = field(default_factory=list)
    masks: list[np.ndarray] = field(default_factory=list)
    targets: list[np.ndarray] = field(default_factory=list)
    keep: list[int] = field(default_factory=list)


def fit_rows(sequences: Sequence[np.ndarray], response_masks: Sequence[np.ndarray],
              returns: Sequence[float] | Sequence[np.ndarray]) -> FitData:
    """The :class:`FitData` of the arguments of :func:`fit_value_head`.

    Raises:
        ConfigError: a sequence not 1-D or its mask of another shape; returns of the wrong shape or
            not finite on a policy token.
    """
    data = FitData()
    for i, (s, m, r) in enumerate(zip(sequences, response_masks, returns, strict=True)):
        s = np.asarray(s)
        m = np.asarray(m, dtype=bool)
        if s.ndim != 1 or m.shape != s.shape:
            raise ConfigError(f"sequence {i} has shape {s.shape} but its response mask has shape {m.shape}")
        y = _as_targets(r, len(s), i)
        if not np.all(np.isfinite(y[m])):
            raise ConfigError(f"returns[{i}] is not finite", fix="drop or fix trajectories without a reward")
        sel = m[1:]  # token t >= 1 selected -> feature at t-1
        if sel.any():
            data.keep.append(i)
            data.seqs.append(s)
            data.masks.append(sel)
            data.targets.append(y[1:])
    return data


def check_fits_backbone(data: FitData, max_length: int, vocab: int) -> None:
    """Refuse sequences longer than ``max_length`` (0: no limit) or with token ids outside
    ``[0, vocab)`` (:class:`ConfigError` naming the caller's sequence index)."""
    for j, s in enumerate(data.seqs):
        if max_length and len(s) > max_length:
            raise ConfigError(
                f"sequence {data.keep[j]} has {len(s)} tokens, more than the backbone's context of {max_length}",
                fix="truncate sequences before fitting",
            )
        if s.size and (s.min() < 0 or s.max() >= vocab):
            raise ConfigError(f"sequence {data.keep[j]} has token ids outside [0, {vocab})")


def _accumulate(backbone: torch.nn.Module, dev: torch.device, data: FitData, d: int, *, token_budget: int,
                progress: Progress | None) -> tuple[dict[str, Moments], PassStats]:
    """The moments of ``z = [h[t-1], 1]`` (hidden size ``d``) and the targets over the selected tokens,
    under each weighting (``"token"``: 1 per token, ``"trajectory"``: 1/n per trajectory's n tokens),
    and the forward passes (:class:`~critic_audit.critic.infer.HiddenStates`: scoring's backbone path)."""
    mom = {"token": Moments(d, dev), "trajectory": Moments(d, dev)}
    with torch.inference_mode():
        batches = iter_hidden_states(backbone, dev, data.seqs, token_budget=token_budget, progress=progress)
        for idx, hs in batches:
            for j, h in zip(idx, hs, strict=True):
                mask = data.masks[j][: len(h)]
                sel = torch.as_tensor(mask, device=dev)
                x = h[sel].double()
                y = torch.as_tensor(data.targets[j][: len(h)][mask], dtype=torch.float64, device=dev)
                z = torch.cat([x, torch.ones(len(x), 1, dtype=torch.float64, device=dev)], dim=1)
                ones = torch.ones(len(x), dtype=torch.float64, device=dev)
                mom["token"].add(z, y, ones)
                mom["trajectory"].add(z, y, ones / len(x))
    return mom, batches.stats


def _fit_quality(mom: dict[str, Moments], weighting: str, w: np.ndarray, b: float) -> dict[str, Any]:
    """``explained_variance_token`` and ``explained_variance_trajectory`` of the head ``(w, b)``, with
    ``explained_variance``, ``mse``, ``target_mean`` and ``target_std`` under ``weighting`` (after
    that weighting's ``explained_variance_*``, in the order of ``mom``)."""
    out: dict[str, Any] = {}
    d = len(w)
    for name, m in mom.items():
        zz, zy, yy = m.numpy()
        r2, mse, var = _r2(zz, zy, yy, w, b)
        out[f"explained_variance_{name}"] = r2
        if name == weighting:
            out.update(
                explained_variance=r2,
                mse=mse,
                target_mean=float(zy[d] / zz[d, d]),
                target_std=math.sqrt(max(var, 0.0)),
            )
    return out


# ---------------------------------------------------------------------------------------------
# Saving heads and critics


def _head_arrays(weight: Any, bias: Any) -> tuple[torch.Tensor, torch.Tensor]:
    w = torch.as_tensor(np.asarray(weight, dtype=np.float32)).reshape(1, -1).contiguous()
    b = torch.as_tensor(np.asarray(bias, dtype=np.float32)).reshape(1).contiguous()
    if not (torch.isfinite(w).all() and torch.isfinite(b).all()):
        raise ConfigError("the value head has non-finite weights")
    return w, b


def save_head(weight: Any, bias: float, path: str | Path, *, metadata: dict | None = None) -> Path:
    """Write a value head as a tiny safetensors file: ``score.weight`` [1, hidden], ``score.bias`` [1]
    (float32), with ``metadata`` as JSON in the header. Atomic (temp file, then rename)."""
    from safetensors.torch import save_file

    from critic_audit.outputs import atomic_write

    path = Path(path)
    w, b = _head_arrays(weight, bias)
    header = {"format": "pt", "critic_audit": json.dumps(metadata or {}, default=str)}
    atomic_write(path, lambda tmp: save_file({f"{HEAD_PREFIX}.weight": w, f"{HEAD_PREFIX}.bias": b}, str(tmp),
                                             metadata=header))
    return path


def load_head(path: str | Path) -> tuple[np.ndarray, float]:
    """Read a head written by :func:`save_head` (or any safetensors file with ``score.weight``).

    Returns ``(weight (hidden,) float32, bias)``."""
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise CheckpointError("value head file does not exist", path=path, fix="write one with save_head")
    try:
        with safe_open(str(path), framework="pt") as sf:
            keys = set(sf.keys())
            if f"{HEAD_PREFIX}.weight" not in keys:
                raise CheckpointError(f"no {HEAD_PREFIX}.weight in the head file", path=path)
            w = sf.get_tensor(f"{HEAD_PREFIX}.weight").float()
            b = sf.get_tensor(f"{HEAD_PREFIX}.bias").float() if f"{HEAD_PREFIX}.bias" in keys else torch.zeros(1)
    except CheckpointError:
        raise
    except Exception as exc:
        raise CheckpointError(f"unreadable safetensors head ({exc})", path=path) from exc
    if w.ndim != 2 or w.shape[0] != 1 or b.numel() != 1:
        raise CheckpointError(f"head has shape {list(w.shape)}; expected [1, hidden]", path=path)
    return w.reshape(-1).numpy(), float(b.reshape(()))


def _head_metadata(path: Path) -> dict:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as sf:
        raw = (sf.metadata() or {}).get("critic_audit")
    try:
        return json.loads(raw) if raw else {}
    except json.JSONDecodeError:
        return {}


def prepare_critic_out(out_dir: Path, overwrite: bool) -> Path:
    """``out_dir`` resolved; an existing non-empty folder is replaced only with ``overwrite`` and only
    when it is entirely critic-audit's (:mod:`critic_audit.outputs`). ``fit-critic`` calls it before
    the fit too, so that a refusal never comes after the work.

    Raises:
        ConfigError: ``out_dir`` is a file, a folder not empty (without ``overwrite``), or holds files
            critic-audit did not write.
    """
    from critic_audit.outputs import check_out_path, check_replaceable

    out_dir = check_out_path(out_dir)
    if out_dir.exists():
        if not out_dir.is_dir():
            raise ConfigError("output path exists and is not a folder", path=out_dir)
        if any(out_dir.iterdir()):
            if not overwrite:
                raise ConfigError("output folder exists and is not empty", path=out_dir,
                                  fix="choose another folder or pass --overwrite")
            check_replaceable(out_dir, overwrite=False)
    return out_dir


def save_critic(
    backbone_dir: str | Path,
    weight: Any,
    bias: float,
    out_dir: str | Path,
    *,
    metadata: dict | None = None,
    overwrite: bool = False,
    trust_remote_code: bool = False,
    state: dict[str, torch.Tensor] | None = None,
    extra_files: dict[str, str] | None = None,
) -> Path:
    """Write backbone + value head as a token-classification critic folder.

    ``state`` (optional) replaces weights of the token-classification model by name (e.g. the top
    layers trained by ``fit-critic --method layers``: ``model.layers.29.mlp.up_proj.weight``, or every
    weight of a merged LoRA fit); its ``score.*`` entries override ``weight`` and ``bias``. A name the
    model does not have, or a tensor of another shape, is refused. ``extra_files`` (name -> text) are
    written into the folder as well (e.g. the held-out evaluation).

    The folder loads with :func:`load_critic` and with plain
    ``AutoModelForTokenClassification.from_pretrained(out_dir, num_labels=1)``: config.json
    (``num_labels=1``, ``architectures=["<Base>ForTokenClassification"]``), ``model.safetensors``
    (backbone weights under the token-classification prefix, e.g. ``model.layers...``, in their stored
    dtype, plus float32 ``score.weight`` [1, hidden] and ``score.bias`` [1]), the tokenizer files, and
    ``critic_audit.json`` (fit metadata). Written into a temporary folder and renamed into place.

    Raises:
        ConfigError: ``out_dir`` is a non-empty folder and ``overwrite`` is False; bad head shape.
        CheckpointError: the backbone cannot be loaded or has no token-classification class.
    """
    backbone_dir = Path(backbone_dir)
    out_dir = prepare_critic_out(Path(out_dir), overwrite)
    w, b = _head_arrays(weight, bias)
    read_config(backbone_dir, trust_remote_code=trust_remote_code)
    weight_files(backbone_dir)
    from transformers import AutoConfig, AutoModelForTokenClassification

    with quiet_transformers():
        config = AutoConfig.from_pretrained(backbone_dir, trust_remote_code=trust_remote_code)
        hidden = int(config.get_text_config().hidden_size)
        if w.shape[1] != hidden:
            raise ConfigError(f"head has {w.shape[1]} inputs but the backbone's hidden size is {hidden}")
        config.num_labels = 1
        config.token_classification_bias = True
        try:
            model = AutoModelForTokenClassification.from_pretrained(
                backbone_dir, config=config, dtype="auto", trust_remote_code=trust_remote_code
            )
        except ValueError as exc:
            raise CheckpointError(
                f"this architecture has no token-classification model ({str(exc).splitlines()[0]})",
                path=backbone_dir,
            ) from exc
        head = torch.nn.Linear(hidden, 1, bias=True, dtype=torch.float32)
        with torch.no_grad():
            head.weight.copy_(w)
            head.bias.copy_(b)
        model.score = head
        if state:
            _apply_state(model, state, backbone_dir)
        tokenizer = load_tokenizer(backbone_dir, trust_remote_code=trust_remote_code)
        from critic_audit.outputs import publish, staging

        with staging(out_dir) as tmp:
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            from critic_audit.version import __version__

            meta = {
                "format": "critic-audit token-classification critic",
                "critic_audit_version": __version__,
                "backbone": str(backbone_dir),
                "hidden_size": hidden,
                "value_convention": "values[t] = head(h[t-1]); values[0] undefined",
                "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                **(metadata or {}),
            }
            (tmp / METADATA_FILE).write_text(json.dumps(meta, indent=2, default=str) + "\n")
            for name, text in (extra_files or {}).items():
                (tmp / name).write_text(text)
            # transformers 5 derives num_labels from id2label; older readers (verl, TRL) look for the key.
            cfg_file = tmp / "config.json"
            cfg = json.loads(cfg_file.read_text())
            cfg["num_labels"] = 1
            cfg_file.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
            publish(tmp, out_dir, kind="critic")
    return out_dir


def _apply_state(model: torch.nn.Module, state: dict[str, torch.Tensor], where: Path) -> None:
    """Copy ``state`` into ``model`` by name (cast to each weight's dtype); refuse unknown names or shapes."""
    own = model.state_dict()
    unknown = [k for k in state if k not in own]
    if unknown:
        raise CheckpointError(f"{len(unknown)} trained weight(s) the backbone does not have, e.g. {unknown[0]}",
                              path=where, fix="use the backbone the weights were trained on")
    bad = [k for k, v in state.items() if tuple(v.shape) != tuple(own[k].shape)]
    if bad:
        raise CheckpointError(f"trained weight {bad[0]} has shape {list(state[bad[0]].shape)}, the backbone's "
                              f"{list(own[bad[0]].shape)}", path=where, fix="use the backbone the weights were trained on")
    with torch.no_grad():
        for k, v in state.items():
            own[k].copy_(v.to(own[k].dtype))


def save_delta(state: dict[str, torch.Tensor], path: str | Path, *, metadata: dict | None = None,
               dtype: torch.dtype = torch.bfloat16) -> Path:
    """Write trained weights (e.g. the top layers + norm + head of ``fit-critic --method layers``) as one
    safetensors file: ``score.*`` in float32, the others in ``dtype``, ``metadata`` as JSON in the
    header. :func:`build_critic` puts them over the backbone. Atomic."""
    from safetensors.torch import save_file

    from critic_audit.outputs import atomic_write

    tensors = {k: v.detach().cpu().to(torch.float32 if k.startswith(f"{HEAD_PREFIX}.") else dtype).contiguous()
               for k, v in state.items()}
    header = {"format": "pt", "critic_audit": json.dumps(metadata or {}, default=str)}
    atomic_write(Path(path), lambda tmp: save_file(tensors, str(tmp), metadata=header))
    return Path(path)


def _delta_weights(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a head / delta file except ``score.*``, as float32."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as sf:
        return {k: sf.get_tensor(k).float() for k in sf.keys() if not k.startswith(f"{HEAD_PREFIX}.")}


def build_critic(
    backbone_dir: str | Path, head_path: str | Path, out_dir: str | Path, *, overwrite: bool = False
) -> Path:
    """Combine a backbone folder and a head saved by :func:`save_head` (or trained weights saved by
    :func:`save_delta`: top layers + head) into a critic folder (see :func:`save_critic`); the file's
    metadata goes into ``critic_audit.json``.

    Raises:
        CheckpointError: unreadable file, no ``score.weight``, or weights the backbone does not have.
    """
    head_path = Path(head_path)
    weight, bias = load_head(head_path)
    meta = {"head_file": str(head_path), **_head_metadata(head_path)}
    return save_critic(backbone_dir, weight, bias, out_dir, metadata=meta, overwrite=overwrite,
                       state=_delta_weights(head_path) or None)


def fit_metadata(result: FitResult) -> dict:
    """JSON-ready metadata of a fit (config + metrics) for :func:`save_critic` / :func:`save_head`."""
    return {
        "fit": {
            "method": "frozen-backbone ridge, MC targets (lambda=1, gamma=1)",
            "config": asdict(result.config),
            "metrics": result.metrics,
        }
    }
