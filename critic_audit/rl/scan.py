"""A reverse linear recurrence solved in log2(T) vectorized steps instead of T sequential ones.

Every estimator in :mod:`critic_audit.rl.advantages` reduces to one recurrence run backwards in time,

    y_t = x_t + c_t * y_{t+1},      y_T = 0,

with a per-token coefficient ``c_t >= 0``: GAE (``c = gamma * lam``), GAE that skips masked tokens
(``c = 1`` at a masked token passes the next policy token's value through), and sums that restart at a
turn boundary (``c = 0`` cuts the chain).

We solve it by recursive doubling (Hillis & Steele, 1986; the scan of Blelloch, 1990, over the
associative operator (c, y) . (c', y') = (c c', y + c y')): after the step with offset d,

    y_t = sum_{j=t}^{t+2d-1} (prod_{m=t}^{j-1} c_m) x_j,     C_t = prod_{m=t}^{t+2d-1} c_m,

so ceil(log2 T) steps of two multiply-adds over the whole (B, T) tensor finish the job. No logarithms
or divisions: zeros and tiny coefficients are exact.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["reverse_linear_scan"]


def reverse_linear_scan(x: Tensor, c: Tensor) -> Tensor:
    """Solve ``y_t = x_t + c_t * y_{t+1}`` backwards over the last axis, with ``y_T = 0``.

    Args:
        x: (B, T) float, the inputs (e.g. TD errors delta_t).
        c: (B, T) float, the coefficients (e.g. gamma * lam; 0 cuts the chain after t; the last column
            multiplies y_T = 0 and so never matters). Broadcastable to x. Negative values are allowed
            mathematically but no estimator here uses them.

    Returns:
        (B, T) float, y, in x's dtype. Differentiable when x or c requires grad (then without
        in-place writes, a little slower); estimators run under ``torch.no_grad()``.
    """
    coef = torch.broadcast_to(c, x.shape).to(x.dtype)
    T = x.shape[-1]
    if torch.is_grad_enabled() and (x.requires_grad or coef.requires_grad):
        return _reverse_linear_scan_differentiable(x, coef)
    y = x.clone()
    coef = coef.clone()
    d = 1
    while d < T:
        # y_t <- y_t + C_t * y_{t+d}: adds the next block of 2^k terms, already summed
        y[..., :-d] += coef[..., :-d] * y[..., d:]
        # C_t <- C_t * C_{t+d}; beyond the end the chain is cut (y_T = 0)
        next_coef = torch.zeros_like(coef)
        next_coef[..., :-d] = coef[..., :-d] * coef[..., d:]
        coef = next_coef
        d *= 2
    return y


def _reverse_linear_scan_differentiable(x: Tensor, coef: Tensor) -> Tensor:
    """The same doubling steps without in-place writes, so autograd can run through them."""
    pad = torch.nn.functional.pad
    y, T, d = x, x.shape[-1], 1
    while d < T:
        # y_t <- y_t + C_t * y_{t+d};  C_t <- C_t * C_{t+d}  (0 beyond the end)
        y = y + pad(coef[..., :-d] * y[..., d:], (0, d))
        coef = pad(coef[..., :-d] * coef[..., d:], (0, d))
        d *= 2
    return y
