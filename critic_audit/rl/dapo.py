"""DAPO's batch-shaping pieces (arXiv:2503.14476): dynamic sampling and overlong reward shaping.

Shapes: B rows, G rows per group (prompt). Lengths are counts of policy tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from critic_audit.errors import ConfigError

__all__ = [
    "DynamicSamplingResult",
    "OverlongShapingConfig",
    "add_to_last_policy_token",
    "dynamic_sampling_filter",
    "overlong_penalty",
]


@dataclass(frozen=True)
class DynamicSamplingResult:
    """What :func:`dynamic_sampling_filter` keeps and drops."""

    keep: Tensor
    """(B,) bool, True for rows of groups whose rewards are not all equal."""
    num_groups: int
    """Groups in the batch."""
    num_groups_kept: int
    """Groups with at least two different rewards."""
    num_groups_all_equal: int
    """Groups dropped because every reward is equal (zero GRPO advantage, no gradient)."""
    num_rows_kept: int
    """Rows kept."""

    def metrics(self, prefix: str = "dapo") -> dict[str, float]:
        """The counts as namespaced metrics."""
        return {
            f"{prefix}/num_groups": float(self.num_groups),
            f"{prefix}/num_groups_kept": float(self.num_groups_kept),
            f"{prefix}/num_groups_all_equal": float(self.num_groups_all_equal),
            f"{prefix}/num_rows_kept": float(self.num_rows_kept),
        }


def dynamic_sampling_filter(rewards: Tensor, group_ids: Tensor, atol: float = 0.0) -> DynamicSamplingResult:
    """DAPO's dynamic sampling (arXiv:2503.14476, eq. 11): drop groups whose rewards are all equal.

    Such a group (all correct or all wrong) has zero group-relative advantage, so it only dilutes the
    batch. The caller keeps sampling until enough groups survive.

    Args:
        rewards: (B,) float, one outcome reward per row (e.g. ``batch.sequence_rewards()``).
        group_ids: (B,) int64, the prompt of each row.
        atol: rewards closer than this count as equal (0: exact equality).

    Returns:
        A :class:`DynamicSamplingResult` (keep mask and counts).
    """
    _, inverse = torch.unique(group_ids, return_inverse=True)
    n_groups = int(inverse.max()) + 1 if inverse.numel() else 0
    r = rewards.double()
    g_max = torch.full((n_groups,), -torch.inf, dtype=r.dtype, device=r.device).scatter_reduce(
        0, inverse, r, reduce="amax"
    )
    g_min = torch.full((n_groups,), torch.inf, dtype=r.dtype, device=r.device).scatter_reduce(
        0, inverse, r, reduce="amin"
    )
    # a group is informative iff max_G R - min_G R > atol
    informative = (g_max - g_min) > atol
    keep = informative[inverse]
    return DynamicSamplingResult(
        keep=keep,
        num_groups=n_groups,
        num_groups_kept=int(informative.sum()),
        num_groups_all_equal=n_groups - int(informative.sum()),
        num_rows_kept=int(keep.sum()),
    )


@dataclass(frozen=True)
class OverlongShapingConfig:
    """DAPO's soft overlong punishment (arXiv:2503.14476, eq. 13)."""

    max_response_length: int = 20480
    """L_max, the generation limit in tokens. Paper: 20,480."""
    cache_length: int = 4096
    """L_cache, the soft punishment zone before L_max. Paper: 4,096 (expected length 16,384)."""
    penalty_factor: float = 1.0
    """Scale of the penalty; the paper's penalty reaches -1 at L_max."""

    def __post_init__(self) -> None:
        if not 0 < self.cache_length <= self.max_response_length:
            raise ConfigError(
                f"cache_length = {self.cache_length} with max_response_length = {self.max_response_length}",
                fix="need 0 < cache_length <= max_response_length",
            )
        if self.penalty_factor < 0:
            raise ConfigError(f"penalty_factor = {self.penalty_factor} must be >= 0")


def overlong_penalty(lengths: Tensor, config: OverlongShapingConfig | None = None) -> Tensor:
    """DAPO's length penalty (arXiv:2503.14476, eq. 13), to add to the outcome reward.

        R_length(y) = 0                                   if |y| <= L_max - L_cache
                    = ((L_max - L_cache) - |y|) / L_cache  if L_max - L_cache < |y| <= L_max
                    = -1                                  if |y| > L_max

    times ``penalty_factor``.

    Args:
        lengths: (B,) int or float, response lengths |y| in tokens (policy tokens).
        config: :class:`OverlongShapingConfig` (None = the paper's 20,480 / 4,096).

    Returns:
        (B,) float32 penalties in [-penalty_factor, 0].
    """
    config = config or OverlongShapingConfig()
    y = lengths.to(torch.float32)
    expected = float(config.max_response_length - config.cache_length)
    # ((L_max - L_cache) - |y|) / L_cache, clipped to [-1, 0]
    linear = ((expected - y) / config.cache_length).clamp(-1.0, 0.0)
    return config.penalty_factor * linear


def add_to_last_policy_token(token_rewards: Tensor, response_mask: Tensor, per_row: Tensor) -> Tensor:
    """Add a (B,) per-row reward (e.g. :func:`overlong_penalty`) to each row's last policy token.

    Args:
        token_rewards: (B, T) float.
        response_mask: (B, T), 1 = policy token.
        per_row: (B,) float. Rows without a policy token must get 0.

    Returns:
        (B, T) float, a new tensor.

    Raises:
        ValueError: a non-zero amount for a row with no policy token.
    """
    m = response_mask.bool()
    has = m.any(dim=1)
    if bool(((per_row != 0) & ~has).any()):
        raise ValueError("a non-zero per-row reward for a row with no policy token")
    T = m.shape[1]
    positions = torch.arange(T, device=m.device).expand_as(m)
    last = torch.where(m, positions, torch.full_like(positions, -1)).max(dim=1).values.clamp(min=0)
    out = token_rewards.clone()
    out[torch.arange(m.shape[0], device=m.device), last] += torch.where(has, per_row, torch.zeros_like(per_row)).to(
        out.dtype
    )
    return out
