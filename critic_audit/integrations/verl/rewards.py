"""Rewards that verl puts on masked tokens: refused by default, or moved and counted (no verl import).

verl places the outcome reward on the last response token. In a multi-turn response that ends in a tool
output (truncated at the turn limit) that token is masked (``response_mask`` 0), and every masked
reduction would drop the reward silently; :class:`critic_audit.rl.MaskedRewardError` is the library's
refusal of exactly that. The verl plugin's estimators call :func:`place_masked_rewards` with the
``critic_audit.masked_rewards`` option (:mod:`critic_audit.integrations.verl.options`):

- ``raise`` (default): :class:`~critic_audit.rl.MaskedRewardError` naming the row and position;
- ``move``: each such reward moves to the last policy token at or before it; one with no policy token
  before it (a row without an action to credit) is dropped. Both counts are logged and reported as the
  step metrics ``critic_audit/masked_rewards_moved`` and ``critic_audit/masked_rewards_dropped``
  (:func:`masked_reward_metrics`, added by the plugin's trainer).

Shapes: B rows, R response tokens; ``token_rewards`` (B, R) float, ``response_mask`` (B, R) bool or 0/1.
"""

from __future__ import annotations

import logging
import threading

import torch
from torch import Tensor

from critic_audit.errors import ConfigError
from critic_audit.rl import MaskedRewardError

__all__ = ["MASKED_REWARD_MODES", "masked_reward_metrics", "move_masked_rewards", "place_masked_rewards"]

log = logging.getLogger(__name__)

#: Values of the ``critic_audit.masked_rewards`` option.
MASKED_REWARD_MODES = ("raise", "move")
METRIC_MOVED = "critic_audit/masked_rewards_moved"
METRIC_DROPPED = "critic_audit/masked_rewards_dropped"

_lock = threading.Lock()
_counts = {METRIC_MOVED: 0, METRIC_DROPPED: 0}


def move_masked_rewards(token_rewards: Tensor, response_mask: Tensor) -> tuple[Tensor, int]:
    """Rewards on masked tokens moved onto the last policy token at or before them; a reward before a
    row's first policy token is dropped.

    Returns:
        The moved (B, R) rewards (a new tensor; the input itself when nothing is masked) and the number
        of rewards that were on masked tokens (moved or dropped).
    """
    out, moved, dropped = _move(token_rewards, response_mask)
    return out, moved + dropped


def _move(token_rewards: Tensor, response_mask: Tensor) -> tuple[Tensor, int, int]:
    mask = response_mask.bool()
    stray = (token_rewards != 0) & ~mask
    if not bool(stray.any()):
        return token_rewards, 0, 0
    B, R = mask.shape
    pos = torch.arange(R, device=mask.device).expand(B, R)
    # index of the last policy token at or before t (-1: none yet)
    last = torch.cummax(torch.where(mask, pos, torch.full_like(pos, -1)), dim=1).values
    out = torch.where(mask, token_rewards, torch.zeros_like(token_rewards))
    movable = stray & (last >= 0)
    moved = torch.where(movable, token_rewards, torch.zeros_like(token_rewards))
    out.scatter_add_(1, last.clamp(min=0), moved)
    n_moved = int(movable.sum())
    return out, n_moved, int(stray.sum()) - n_moved


def place_masked_rewards(token_rewards: Tensor, response_mask: Tensor, mode: str = "raise") -> Tensor:
    """Check (``raise``) or move (``move``) the rewards on masked tokens; see the module docstring.

    Returns:
        (B, R) rewards, every non-zero one on a policy token.

    Raises:
        MaskedRewardError: ``mode="raise"`` and a non-zero reward sits on a masked token.
        ConfigError: an unknown ``mode``.
    """
    if mode not in MASKED_REWARD_MODES:
        raise ConfigError(f"critic_audit.masked_rewards = {mode!r} is not a mode",
                          fix="use 'raise' (the default) or 'move'")
    stray = (token_rewards != 0) & ~response_mask.bool()
    if not bool(stray.any()):
        return token_rewards
    if mode == "raise":
        row, p = (int(i) for i in stray.nonzero()[0])
        raise MaskedRewardError(
            f"{int(stray.sum())} non-zero reward(s) on masked tokens (response_mask 0), e.g. "
            f"{float(token_rewards[row, p]):g} at row {row}, position {p}; verl would drop them silently",
            record=f"row {row}, position {p}",
            fix="put the rewards on policy tokens, or set +critic_audit.masked_rewards=move to move each onto the "
                f"last policy token before it (counted in the metric {METRIC_MOVED})")
    out, moved, dropped = _move(token_rewards, response_mask)
    with _lock:
        _counts[METRIC_MOVED] += moved
        _counts[METRIC_DROPPED] += dropped
    log.warning("critic-audit: %d reward(s) on masked tokens moved to the last policy token before them, "
                "%d dropped (no policy token before them)", moved, dropped)
    return out


def masked_reward_metrics(reset: bool = True) -> dict[str, float]:
    """The rewards moved and dropped since the last call (``reset``), as verl step metrics."""
    with _lock:
        out = {k: float(v) for k, v in _counts.items()}
        if reset:
            for k in _counts:
                _counts[k] = 0
    return out
