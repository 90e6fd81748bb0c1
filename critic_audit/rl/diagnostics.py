"""Diagnostics computed beside the losses: KL estimates, explained variance, turn-ratio statistics.

Shapes: B rows, T tokens, K turns. Log-probabilities in nats. ``mask`` 1 = policy token (counted),
0 = prompt / tool output / padding (ignored).
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor

from critic_audit.rl.batch import turn_layout

__all__ = [
    "DEFAULT_LENGTH_BUCKETS",
    "approx_kl",
    "bucket_label",
    "explained_variance",
    "masked_mean",
    "turn_log_ratios",
    "turn_ratio_metrics",
]

DEFAULT_LENGTH_BUCKETS: tuple[int, ...] = (1, 64, 256, 1024, 4096)
"""Lower edges of the turn-length buckets (tokens): [1, 64), [64, 256), [256, 1024), [1024, 4096),
[4096, inf)."""


def masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    """Mean of ``x`` over ``mask == 1`` (0 when the mask is empty). NaN-safe at masked positions."""
    m = mask.bool()
    total = torch.where(m, x, torch.zeros_like(x)).sum()
    return total / m.sum().clamp(min=1)


def approx_kl(log_probs: Tensor, old_log_probs: Tensor, mask: Tensor) -> dict[str, float]:
    """Estimates of KL(pi_old || pi_theta) per token, averaged over policy tokens (Schulman, 2020).

    Args:
        log_probs, old_log_probs: (B, T) float, nats.
        mask: (B, T), 1 = policy token.

    Returns:
        ``{"k1": ..., "k3": ...}``: k1 = mean(old - new) (unbiased, can be negative);
        k3 = mean(r - 1 - log r) with r = exp(new - old) (unbiased and >= 0).
    """
    with torch.no_grad():
        log_ratio = log_probs - old_log_probs
        log_ratio = log_ratio.to(torch.promote_types(log_ratio.dtype, torch.float32))
        # k1 = -log r
        k1 = masked_mean(-log_ratio, mask)
        # k3 = r - 1 - log r
        k3 = masked_mean(torch.expm1(log_ratio) - log_ratio, mask)
    return {"k1": float(k1), "k3": float(k3)}


def explained_variance(values: Tensor, returns: Tensor, mask: Tensor) -> float:
    """Explained variance of the critic over the whole batch: 1 - Var[R - V] / Var[R].

    Pass every value, return and mask of the step at once: an average of per-micro-batch explained
    variances is not the batch's explained variance.

    Args:
        values: (B, T) float, the critic's V_t.
        returns: (B, T) float, the critic targets.
        mask: (B, T), 1 = token counted (policy token), 0 = ignored.

    Returns:
        A float in (-inf, 1]; 1 is a perfect critic, 0 no better than the mean return. NaN when the
        returns have zero variance or no token is counted. Population variances (n), as CleanRL.
    """
    with torch.no_grad():
        m = mask.bool()
        if int(m.sum()) == 0:
            return math.nan
        v = values[m].double()
        y = returns[m].double()
        var_y = torch.var(y, unbiased=False)
        if float(var_y) == 0.0:
            return math.nan
        # EV = 1 - Var[y - v] / Var[y]
        return float(1.0 - torch.var(y - v, unbiased=False) / var_y)


def turn_log_ratios(
    log_probs: Tensor,
    old_log_probs: Tensor,
    turn_ids: Tensor,
    mode: Literal["product", "geomean"] = "product",
) -> tuple[Tensor, Tensor]:
    """log rho_k per turn (MPO, arXiv:2610.35013, spec section 2).

        log rho_k = sum_{j in turn k} (logp_{k,j} - old_logp_{k,j})     mode "product"
        log rho_k = mean_{j in turn k} (logp_{k,j} - old_logp_{k,j})    mode "geomean"

    Args:
        log_probs, old_log_probs: (B, T) float, nats. Differentiable through ``log_probs``.
        turn_ids: (B, T) int64, k at policy tokens, -1 at masked tokens.
        mode: "product" (the paper) or "geomean" [ours].

    Returns:
        (log_rho, lengths): (B, K) float (0 for absent turns) and (B, K) int64 n_k.

    Raises:
        ValueError: unknown mode.
    """
    if mode not in ("product", "geomean"):
        raise ValueError(f"unknown turn ratio mode {mode!r}; known: product, geomean")
    layout = turn_layout(turn_ids)
    B, K = layout.turn_lengths.shape
    m = turn_ids >= 0
    diff = torch.where(m, log_probs - old_log_probs, torch.zeros_like(log_probs))
    sums = torch.zeros(B, K + 1, dtype=diff.dtype, device=diff.device).scatter_add(1, layout.index, diff)
    log_rho = sums[:, :K]
    if mode == "geomean":
        log_rho = log_rho / layout.turn_lengths.clamp(min=1).to(diff.dtype)
    return log_rho, layout.turn_lengths


def bucket_label(lo: int, hi: int | None) -> str:
    """The metric-key label of a length bucket, e.g. ``[64,256)`` or ``[4096,inf)``."""
    return f"[{lo},{'inf' if hi is None else hi})"


def turn_ratio_metrics(
    log_probs: Tensor,
    old_log_probs: Tensor,
    turn_ids: Tensor,
    eps_low: float,
    eps_high: float,
    buckets: tuple[int, ...] = DEFAULT_LENGTH_BUCKETS,
    prefix: str = "actor/turn_ratio",
) -> dict[str, float]:
    """Per-step statistics of the turn ratios, for both modes, bucketed by turn length.

    For each mode in (product, geomean) and each length bucket [lo, hi):
    ``{prefix}/{mode}/clipfrac`` (fraction of turns with rho outside [1 - eps_low, 1 + eps_high]),
    ``{prefix}/{mode}/log_rho_var`` (variance of log rho_k over all turns), and per bucket
    ``{prefix}/{mode}/clipfrac/[lo,hi)``, ``{prefix}/{mode}/log_rho_var/[lo,hi)``; plus
    ``{prefix}/turn_count/[lo,hi)``. A variance over fewer than two turns is NaN; a clip fraction
    over no turn is NaN. Unbiased variances.

    The answer, with data, to "does the product ratio's variance grow with turn length?" (spec 2).
    """
    out: dict[str, float] = {}
    with torch.no_grad():
        edges = list(buckets) + [None]
        for mode in ("product", "geomean"):
            log_rho, lengths = turn_log_ratios(log_probs.detach(), old_log_probs, turn_ids, mode)
            present = lengths > 0
            # a turn is clipped when rho leaves [1 - eps_low, 1 + eps_high]
            rho = torch.exp(log_rho.double().clamp(max=50.0))
            clipped = (rho < 1.0 - eps_low) | (rho > 1.0 + eps_high)
            out.update(_ratio_stats(log_rho, clipped, present, f"{prefix}/{mode}", ""))
            for lo, hi in zip(edges[:-1], edges[1:]):
                in_bucket = present & (lengths >= lo)
                if hi is not None:
                    in_bucket &= lengths < hi
                label = bucket_label(lo, hi)
                out.update(_ratio_stats(log_rho, clipped, in_bucket, f"{prefix}/{mode}", f"/{label}"))
                out[f"{prefix}/turn_count/{label}"] = float(in_bucket.sum())
    return out


def _ratio_stats(log_rho: Tensor, clipped: Tensor, sel: Tensor, key: str, suffix: str) -> dict[str, float]:
    n = int(sel.sum())
    clipfrac = float(clipped[sel].double().mean()) if n > 0 else math.nan
    var = float(torch.var(log_rho[sel].double(), unbiased=True)) if n > 1 else math.nan
    return {f"{key}/clipfrac{suffix}": clipfrac, f"{key}/log_rho_var{suffix}": var}
