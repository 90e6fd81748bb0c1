"""Writing a check: the public toolkit every check module imports (and nothing private of
:mod:`critic_audit.check.core`).

A check is a function ``(rollouts, ctx) -> CheckOutcome`` listed in
:data:`critic_audit.check.checks.CHECKS`. ``rollouts`` is a sequence of B :class:`CheckRollout` (None on
a field its format does not carry); ``ctx`` is the run's :class:`CheckContext` (``ctx.config`` the
thresholds, ``ctx.columns`` the rollouts as flat columns with ``rows_with(*fields)``, a (B,) bool mask).
The toolkit:

- :class:`CheckSpec` — what the check is (id, group, title, fix, references); calling it with a status
  (:data:`PASS`, :data:`WARN`, :data:`FAIL`) builds the :class:`CheckOutcome`, keeping the ``n`` worst
  :class:`Example` records (largest ``weight`` first); :meth:`CheckSpec.skip` is a ``skipped`` outcome
  with the reason (what the rollouts lack, and how to provide it).
- :func:`rollouts_with` — the rollouts that carry every named field (``ctx.columns.rows_with`` is the
  column-wise twin).
- :func:`groups_of` / :func:`group_name` — rollouts by ``(collection, group_id)``.
- :func:`order_quantile` / :func:`order_median` — ``np.quantile`` / ``np.median`` of a whole (N,)
  column, the same numbers without sorting it all.
- :func:`top` — indices of the worst rows (for the examples); :func:`turn_before` — the turn of a
  position; :func:`share`, :func:`median`, :func:`fmt` — a ratio, a median and a number as the
  reports print them (None where undefined).

Example (a check that warns on rollouts without a reward)::

    def check_has_reward(rollouts, ctx):
        spec = CheckSpec("has_reward", "rewards", "every rollout carries a reward", "log the reward")
        if not rollouts:
            return spec.skip("no rollouts")
        bad = [r for r in rollouts if r.reward is None]
        ex = [Example(r.trajectory_id, None, None, "no reward", 1.0) for r in bad]
        counts = {"trajectories_checked": len(rollouts), "trajectories": len(bad)}
        if bad:
            return spec(WARN, summary=f"{len(bad)} of {len(rollouts)} lack a reward", counts=counts,
                        examples=ex, n=ctx.config.examples)
        return spec(PASS, summary="every rollout has a reward", counts=counts)
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from collections.abc import Callable, Sequence

import numpy as np

from critic_audit.check.core import FAIL, PASS, SKIP, WARN, CheckConfig, CheckContext, CheckOutcome, Example
from critic_audit.check.data import CheckRollout

__all__ = ["PASS", "WARN", "FAIL", "SKIP", "CheckConfig", "CheckContext", "CheckOutcome", "CheckRollout", "CheckSpec",
           "Example", "fmt", "group_name", "groups_of", "median", "order_median", "order_quantile", "rollouts_with",
           "share", "top", "turn_before", "turns_by_ids"]


@dataclasses.dataclass(frozen=True)
class CheckSpec:
    """What one check is; calling it builds the check's :class:`CheckOutcome`.

    Attributes:
        id: stable check id (``reward_on_masked_token``, ...): the report's key, never renamed.
        group: rewards, masks, tokens, logprobs, credit or groups.
        title: one line saying what is checked.
        fix: what to change when it fires.
        references: public reports of this bug (listed in ``docs/check.md``).
    """

    id: str
    group: str
    title: str
    fix: str
    references: tuple[str, ...] = ()

    def __call__(self, status: str, *, summary: str = "", counts: dict | None = None, measured: dict | None = None,
                 examples: Sequence[Example] = (), reason: str = "", n: int = 5) -> CheckOutcome:
        """The outcome with ``status``; ``summary`` defaults to ``reason``; ``counts`` (ints, with the
        coverage ``trajectories_checked``) and ``measured`` (floats, None where undefined) are copied;
        the ``n`` examples of largest ``weight`` are kept, worst first (ties: in the given order)."""
        worst = sorted(examples, key=lambda e: -e.weight)[:n]
        return CheckOutcome(self.id, self.group, self.title, status, summary or reason, dict(counts or {}),
                            dict(measured or {}), worst, self.fix, self.references, reason)

    def skip(self, reason: str) -> CheckOutcome:
        """A ``skipped`` outcome saying why (what the rollouts lack, and how to provide it)."""
        return self(SKIP, reason=reason)


def share(a: float, b: float) -> float | None:
    """``a / b``; None when ``b`` is 0."""
    return (a / b) if b else None


def turn_before(k: np.ndarray, pos: int) -> int | None:
    """The turn of the last policy token at or before ``pos`` in the (T,) int turn ids ``k`` (-1 off
    the policy's tokens, :attr:`CheckRollout.turn_ids`); None: before the first policy token."""
    before = k[: pos + 1]
    before = before[before >= 0]
    return int(before[-1]) if before.size else None


def _runs(mask: np.ndarray) -> list[tuple[int, int]]:
    edge = np.diff(np.asarray(mask, dtype=bool).astype(np.int8), prepend=np.int8(0), append=np.int8(0))
    return list(zip(np.flatnonzero(edge == 1).tolist(), np.flatnonzero(edge == -1).tolist()))


def turns_by_ids(ids: np.ndarray, mask: np.ndarray, rendered: np.ndarray, rendered_mask: np.ndarray) -> np.ndarray:
    """(T,) int64 turn of each stored id (-1 off the turns), the turns located by their ids: turn k is
    where the stored ``ids`` hold the template rendering's k-th ``rendered_mask`` run, with the (up to
    3) rendered ids before it (the assistant header), searched in order. A mask-only defect (a turn
    whose mask is 0) then moves no turn boundary. When some rendered turn is not found (its content
    drifted), the turns are the runs of the stored ``mask``, as before.

    Args:
        ids, mask: (T,) stored token ids and bool response_mask; rendered, rendered_mask: (R,) the same
            conversation rendered by the chat template.
    """
    out = np.full(len(ids), -1, dtype=np.int64)
    p = prev = 0
    for k, (a, b) in enumerate(_runs(rendered_mask)):
        h = min(3, a - prev)
        seq = np.asarray(rendered[a - h:b], dtype=np.int64)
        cand = np.flatnonzero(ids[p:max(p, len(ids) - len(seq) + 1)] == seq[0]) + p
        hit = next((int(c) for c in cand if np.array_equal(ids[c:c + len(seq)], seq)), None)
        if hit is None:
            out[:] = -1
            for j, (c, d) in enumerate(_runs(mask)):
                out[c:d] = j
            return out
        out[hit + h:hit + len(seq)] = k
        p, prev = hit + len(seq), b
    return out


def top(weights: np.ndarray, n: int) -> np.ndarray:
    """(min(n, len),) int64 indices of the ``n`` largest ``weights``, largest first (ties: earliest first)."""
    if n <= 0 or weights.size == 0:
        return np.zeros(0, dtype=np.int64)
    order = np.argsort(-np.asarray(weights, dtype=np.float64), kind="stable")
    return order[:n]


def rollouts_with(rollouts: Sequence[CheckRollout], *fields: str) -> list[CheckRollout]:
    """The rollouts whose every named field (``token_ids``, ``response_mask``, ...) is not None, in order."""
    return [r for r in rollouts if all(getattr(r, f) is not None for f in fields)]


def group_name(key: tuple[str | None, str]) -> str:
    """How a group key ``(collection, group_id)`` is shown: ``collection/group_id``, or the id alone (also
    when the reader qualified it with the collection already: ``sokoban/0``, not ``sokoban/sokoban/0``)."""
    collection, gid = key
    return gid if collection is None or str(gid).startswith(f"{collection}/") else f"{collection}/{gid}"


def groups_of(rollouts: Sequence[CheckRollout], keep: Callable[[CheckRollout], bool]):
    """``(all groups, groups of >= 2)``: ``(collection, group id)`` -> its rollouts that ``keep`` accepts
    (two collections that both number their groups 0, 1, ... are not pooled; no group id: in none)."""
    groups: dict[tuple[str | None, str], list[CheckRollout]] = defaultdict(list)
    for r in rollouts:
        if r.group_id is not None and keep(r):
            groups[(r.collection, r.group_id)].append(r)
    return groups, {g: rs for g, rs in groups.items() if len(rs) >= 2}


def fmt(x: float) -> str:
    """A figure as the reports print it: 4 significant digits (``%.4g``)."""
    return f"{x:.4g}"


def median(xs: list[float]) -> float | None:
    """The median of ``xs``; None when empty."""
    return float(np.median(xs)) if xs else None


#: sample size of :func:`_order_stats`'s bracket
_SAMPLE = 16384


def _order_stats(x: np.ndarray, ks: tuple[int, int]) -> tuple[float, float] | None:
    """The ``ks`` (0-based, ascending) order statistics of the 1-D ``x`` without partitioning all of
    it: a strided sample brackets the ranks, only the entries inside the bracket are partitioned. None
    (the caller partitions everything) for a short array, a NaN in it, or a bracket that misses."""
    n = len(x)
    if n < 8 * _SAMPLE:
        return None
    sample = np.sort(x[:: n // _SAMPLE])
    m = len(sample)
    p = ks[0] / n  # the bracket: 6 standard errors of a sample quantile either side of the ranks
    margin = 6.0 * math.sqrt(max(p * (1.0 - p), 1.0 / m) / m) + 2.0 / m
    lo = sample[max(int((p - margin) * m), 0)]
    hi = sample[min(int((ks[1] / n + margin) * m) + 1, m - 1)]
    below = int(np.count_nonzero(x < lo))
    above = int(np.count_nonzero(x > hi))
    if not (below <= ks[0] and ks[1] < n - above):
        return None
    inside = x[(x >= lo) & (x <= hi)]
    if below + len(inside) + above != n:  # NaN compares False every way: np.quantile's own rules apply
        return None
    part = np.partition(inside, (ks[0] - below, ks[1] - below))
    return part[ks[0] - below], part[ks[1] - below]


def order_quantile(x: np.ndarray, q: float) -> float:
    """``float(np.quantile(x, q))`` (method ``linear``) of the 1-D float array ``x`` (left as it is),
    the same number: the two order statistics around ``(N - 1) q`` are found in a bracket a strided
    sample sets (a few passes over ``x`` and a partition of the entries inside, not of all N), and
    interpolated by ``np.quantile`` itself. Raises as ``np.quantile`` on an empty ``x``."""
    n = len(x)
    h = (n - 1) * q
    k = int(np.floor(h)) if n else 0
    got = _order_stats(x, (k, min(k + 1, n - 1))) if 0 <= q < 1 and n else None
    if got is None:
        return float(np.quantile(x, q))
    return float(np.quantile(np.asarray(got, dtype=x.dtype), h - k))


def order_median(x: np.ndarray) -> float:
    """``float(np.median(x))`` of the 1-D float array ``x`` (left as it is), the same number, found as
    :func:`order_quantile` finds its order statistics."""
    n = len(x)
    got = _order_stats(x, (n // 2 - 1, n // 2) if n % 2 == 0 else (n // 2, n // 2)) if n else None
    if got is None:
        return float(np.median(x))
    return float(np.mean(np.asarray(got if n % 2 == 0 else got[:1], dtype=x.dtype)))
