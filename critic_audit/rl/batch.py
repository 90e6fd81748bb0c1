"""The one input type of every advantage estimator: :class:`RolloutBatch`, and turn segmentation.

Glossary (used in every docstring of :mod:`critic_audit.rl`): B rows (one trajectory per row), T tokens,
K turns, G rollouts per prompt (group). Log-probabilities are in nats.

``response_mask[b, t] = 1`` marks a token the policy generated (assistant); ``0`` marks prompt, tool
output, user/environment text and padding. Turn k of a row is the k-th maximal run of 1s in its mask
(verl's multi-turn convention). ``turn_ids[b, t]`` is k at a policy token and ``-1`` at a masked one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from critic_audit.errors import CriticAuditError, SchemaError

__all__ = [
    "MaskedRewardError",
    "RolloutBatch",
    "TurnLayout",
    "turn_ids_from_mask",
    "turn_layout",
]


class MaskedRewardError(CriticAuditError):
    """A non-zero reward sits on a masked token (prompt, tool output, padding).

    verl and others silently drop such a reward because every reduction multiplies by the mask; we
    refuse it, naming the row and the token position.
    """


def turn_ids_from_mask(response_mask: Tensor) -> Tensor:
    """Number the turns of every row: turn k is the k-th maximal run of 1s in ``response_mask``.

    Vectorized: a turn starts where the mask is 1 and the previous token's is 0, and the turn index is
    the running count of starts (one ``cumsum``, no loop over tokens).

    Args:
        response_mask: (B, T) bool or 0/1; 1 = policy token, 0 = masked (prompt, tool output, padding).

    Returns:
        (B, T) int64: the turn index k = 0..K-1 at policy tokens, -1 at masked tokens.

    Example: mask ``[0, 1, 1, 0, 0, 1, 0]`` gives ``[-1, 0, 0, -1, -1, 1, -1]``.
    """
    m = response_mask.bool()
    if m.shape[1] == 0:
        return torch.zeros(m.shape, dtype=torch.long, device=m.device)
    prev = torch.nn.functional.pad(m[:, :-1], (1, 0), value=False)
    # a turn starts at a policy token whose predecessor is masked (or absent)
    starts = m & ~prev
    turn_index = torch.cumsum(starts.long(), dim=1) - 1
    return torch.where(m, turn_index, torch.full_like(turn_index, -1))


class TurnLayout(NamedTuple):
    """Where the turns of a batch lie. All (B, T) tensors are False / 0 at masked tokens.

    Fields:
        turn_ids: (B, T) int64, k at policy tokens, -1 at masked.
        index: (B, T) int64, ``turn_ids`` with masked tokens sent to a dump slot K (for scatter).
        num_turns: int K, the largest turn count of any row (at least 1).
        turn_lengths: (B, K) int64, n_k, the number of policy tokens of turn k (0 for absent turns).
        is_first: (B, T) bool, the first policy token of its turn.
        is_last: (B, T) bool, the last policy token of its turn.
        next_index: (B, T) int64, position of the next policy token after t (T if none).
    """

    turn_ids: Tensor
    index: Tensor
    num_turns: int
    turn_lengths: Tensor
    is_first: Tensor
    is_last: Tensor
    next_index: Tensor


def next_policy_index(response_mask: Tensor) -> Tensor:
    """Position of the next policy token strictly after each token (T where there is none).

    Vectorized with a reversed running minimum. (B, T) bool in, (B, T) int64 out.
    """
    m = response_mask.bool()
    T = m.shape[1]
    positions = torch.arange(T, device=m.device).expand_as(m)
    pos_or_T = torch.where(m, positions, torch.full_like(positions, T))
    # nearest policy position at or after t: reversed cummin
    at_or_after = torch.flip(torch.cummin(torch.flip(pos_or_T, [1]), dim=1).values, [1])
    return torch.nn.functional.pad(at_or_after[:, 1:], (0, 1), value=T)


def gather_next(x: Tensor, next_index: Tensor, fill: float = 0.0) -> Tensor:
    """``x`` read at ``next_index`` (B, T), with ``fill`` where the index is T (no next token)."""
    padded = torch.nn.functional.pad(x, (0, 1), value=fill)
    return torch.gather(padded, 1, next_index)


def turn_layout(turn_ids: Tensor) -> TurnLayout:
    """Derive the first/last tokens, lengths and scatter index of every turn from ``turn_ids``.

    Args:
        turn_ids: (B, T) int64, k >= 0 at policy tokens, -1 at masked tokens, non-decreasing along each
            row's policy tokens (as :class:`RolloutBatch` checks). Turns need not be
            contiguous runs (user-provided ids may merge runs); "next token of the turn" always means
            the next policy token.

    Returns:
        A :class:`TurnLayout`.
    """
    m = turn_ids >= 0
    K = max(int(turn_ids.max().item()) + 1, 1) if turn_ids.numel() else 1
    index = torch.where(m, turn_ids, torch.full_like(turn_ids, K))
    B, T = turn_ids.shape
    lengths = torch.zeros(B, K + 1, dtype=torch.long, device=turn_ids.device)
    lengths.scatter_add_(1, index, torch.ones_like(index))
    nxt = next_policy_index(m)
    next_tid = gather_next(turn_ids, nxt, fill=-1)
    # turn ids never decrease along a row, so the previous policy token's id is the running max up to t-1
    prev_tid = torch.nn.functional.pad(torch.cummax(turn_ids, dim=1).values[:, :-1], (1, 0), value=-1)
    is_first = m & (prev_tid != turn_ids)
    is_last = m & (next_tid != turn_ids)
    return TurnLayout(turn_ids, index, K, lengths[:, :K], is_first, is_last, nxt)


def _check_shape(name: str, x: Tensor | None, shape: tuple[int, ...]) -> None:
    if x is None:
        return
    if not isinstance(x, Tensor):
        raise SchemaError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if tuple(x.shape) != shape:
        raise SchemaError(
            f"{name} has shape {tuple(x.shape)}, expected {shape}",
            fix="every (B, T) field must share token_rewards' shape; group_ids is (B,)",
        )


@dataclass(frozen=True)
class RolloutBatch:
    """A batch of trajectories as tensors: the single input of every advantage estimator.

    Fields (B rows, T tokens; float fields any float dtype, all on one device):
        token_rewards: (B, T) float, r_t, the reward placed on token t. The outcome reward sits on the
            last policy token of the episode. Must be 0 at masked tokens (else
            :class:`MaskedRewardError`).
        values: (B, T) float, V_t, the critic's value of the state *before* token t is emitted (read at
            position t-1; verl/TRL/OpenRLHF convention). Values at masked tokens are never read, and may
            hold anything (even NaN). Critic-free estimators ignore this field (pass zeros).
        response_mask: (B, T) bool or 0/1; 1 = policy token, 0 = prompt / tool output / padding.
            Stored as bool.
        old_log_probs: optional (B, T) float, log pi_old(token) in nats (behaviour policy).
        log_probs: optional (B, T) float, log pi_theta(token) in nats (current policy).
        group_ids: optional (B,) int64, the prompt each row was sampled for (group-relative
            estimators: grpo, dr_grpo, rloo).
        turn_ids: optional (B, T) int64, k at policy tokens, -1 at masked. Computed from
            ``response_mask`` (k-th maximal run of 1s) when not given.

    Raises:
        SchemaError: a field has the wrong type or shape, or turn_ids disagrees with the mask.
        MaskedRewardError: a non-zero reward on a masked token (names row and position).
    """

    token_rewards: Tensor
    values: Tensor
    response_mask: Tensor
    old_log_probs: Tensor | None = None
    log_probs: Tensor | None = None
    group_ids: Tensor | None = None
    turn_ids: Tensor | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.token_rewards, Tensor) or self.token_rewards.dim() != 2:
            raise SchemaError("token_rewards must be a (B, T) torch.Tensor")
        if not self.token_rewards.is_floating_point():
            raise SchemaError(f"token_rewards must be float, got {self.token_rewards.dtype}")
        B, T = self.token_rewards.shape
        for name in ("values", "response_mask", "old_log_probs", "log_probs", "turn_ids"):
            _check_shape(name, getattr(self, name), (B, T))
        _check_shape("group_ids", self.group_ids, (B,))
        if not self.values.is_floating_point():
            raise SchemaError(f"values must be float, got {self.values.dtype}")
        mask = self.response_mask
        if mask.dtype != torch.bool:
            if ((mask != 0) & (mask != 1)).any():
                raise SchemaError("response_mask must hold only 0 and 1", fix="pass a bool mask")
            mask = mask.bool()
        object.__setattr__(self, "response_mask", mask)

        bad = (self.token_rewards != 0) & ~mask
        if bool(bad.any()):
            row, pos = (int(i) for i in bad.nonzero()[0])
            raise MaskedRewardError(
                f"non-zero reward {float(self.token_rewards[row, pos]):g} on masked token "
                f"(row {row}, position {pos}); {int(bad.sum())} such token(s) in the batch",
                record=f"row {row}, position {pos}",
                fix="put the reward on the last policy token of the turn or episode",
            )

        if self.turn_ids is None:
            object.__setattr__(self, "turn_ids", turn_ids_from_mask(mask))
        else:
            tid = self.turn_ids.long()
            if bool(((tid >= 0) != mask).any()):
                raise SchemaError("turn_ids must be >= 0 exactly at policy tokens and -1 elsewhere")
            # policy-token turn ids must start at 0 and step by 0 or 1
            prev_ids = torch.cummax(torch.where(mask, tid, torch.full_like(tid, -1)), dim=1).values
            prev_ids = torch.nn.functional.pad(prev_ids[:, :-1], (1, 0), value=-1)
            step = tid - prev_ids
            if bool((mask & ((step < 0) | (step > 1))).any()):
                raise SchemaError("turn_ids must count 0, 1, 2, ... in order along each row")
            object.__setattr__(self, "turn_ids", tid)

    @property
    def batch_size(self) -> int:
        """B, the number of rows."""
        return self.token_rewards.shape[0]

    @property
    def num_tokens(self) -> int:
        """T, the number of token positions per row (padding included)."""
        return self.token_rewards.shape[1]

    def response_lengths(self) -> Tensor:
        """(B,) int64, the number of policy tokens of each row."""
        return self.response_mask.sum(dim=1)

    def sequence_rewards(self) -> Tensor:
        """(B,) float, R_i, the sum of each row's token rewards (all on policy tokens)."""
        return self.token_rewards.sum(dim=1)

    def select(self, rows: Tensor | slice) -> RolloutBatch:
        """The sub-batch of the given rows (a slice, index tensor or (B,) bool mask)."""

        def pick(x: Tensor | None) -> Tensor | None:
            return None if x is None else x[rows]

        return RolloutBatch(
            token_rewards=self.token_rewards[rows],
            values=self.values[rows],
            response_mask=self.response_mask[rows],
            old_log_probs=pick(self.old_log_probs),
            log_probs=pick(self.log_probs),
            group_ids=pick(self.group_ids),
            turn_ids=pick(self.turn_ids),
        )
