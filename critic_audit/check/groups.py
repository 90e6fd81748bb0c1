"""Group and length checks: turns per trajectory within a group (the per-turn baseline bias) and turn
length inequality (see ``docs/check.md``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from critic_audit.check.core import (
    PASS, SKIP, WARN, CheckContext, CheckOutcome, Example, _fmt, _median, _groups, group_name, _outcome, _with,
)
from critic_audit.check.data import CheckRollout

# --------------------------------------------------------------------------------------------- groups and lengths


def check_turns_per_group(rollouts: Sequence[CheckRollout], ctx: CheckContext) -> CheckOutcome:
    make = _outcome("turns_per_group", "groups", "turns per trajectory within a group (per-turn baseline bias)",
                    "count each trajectory once in the group baseline (mean / std over trajectories, not over "
                    "per-turn samples), or use turn-level credit that does not replicate the outcome per turn",
                    ("agent-lightning #444",))
    _, multi = _groups(rollouts, lambda r: r.reward is not None and bool(r.num_turns))
    if not multi:
        return make(SKIP, reason="no group holds two or more rollouts with a reward and turns")
    unequal = flagged = 0
    ratios, biases = [], []
    ex: list[Example] = []
    for g, rs in multi.items():
        kk = np.asarray([r.num_turns for r in rs], dtype=np.float64)
        rr = np.asarray([r.reward for r in rs], dtype=np.float64)
        ratios.append(float(kk.max() / kk.min()))
        unequal += bool(kk.max() > kk.min())
        # a per-turn sample baseline weighs trajectory i by its K_i turns; a per-trajectory one by 1
        per_turn, per_traj = float((kk * rr).sum() / kk.sum()), float(rr.mean())
        spread = float(rr.max() - rr.min())
        rel = abs(per_turn - per_traj) / spread if spread > 0 else 0.0
        biases.append(rel)
        if rel > ctx.config.baseline_bias_warn:
            flagged += 1
            ex.append(Example(rs[int(np.argmax(kk))].trajectory_id, None, None,
                              f"group {group_name(g)}: {int(kk.min())}-{int(kk.max())} turns; per-turn baseline "
                              f"{_fmt(per_turn)} vs "
                              f"per-trajectory {_fmt(per_traj)} ({100 * rel:.0f}% of the reward range)", rel))
    counts = {"groups_checked": len(multi), "groups_with_unequal_turns": unequal, "groups_biased": flagged,
              "trajectories_checked": sum(len(rs) for rs in multi.values())}
    measured = {"max_turns_ratio": max(ratios), "median_turns_ratio": _median(ratios), "max_baseline_bias": max(biases)}
    if flagged:
        return make(WARN, summary=f"{flagged} of {len(multi)} groups: a baseline over per-turn samples would move by "
                    f"more than {100 * ctx.config.baseline_bias_warn:.0f}% of the reward range from the "
                    "per-trajectory one", counts=counts, measured=measured,
                    examples=ex, n=ctx.config.examples)
    return make(PASS, summary=f"{unequal} of {len(multi)} groups have unequal turn counts; no baseline moves by more "
                f"than {100 * ctx.config.baseline_bias_warn:.0f}% of the reward range", counts=counts, measured=measured)


def _gini(x: np.ndarray) -> float:
    """Gini coefficient sum_ij |x_i - x_j| / (2 n^2 mean); 0 = equal lengths."""
    x = np.sort(np.asarray(x, dtype=np.float64))
    n = len(x)
    return float((2 * np.arange(1, n + 1) - n - 1) @ x / (n * x.sum())) if n and x.sum() > 0 else 0.0


def check_turn_length_inequality(rollouts: Sequence[CheckRollout], ctx: CheckContext) -> CheckOutcome:
    warn_at = ctx.config.length_ratio_warn
    make = _outcome("turn_length_inequality", "groups", "how unequal the turn lengths of one trajectory are",
                    "a product turn ratio over a long turn varies far more than over a short one: use the "
                    "geometric-mean turn ratio (MPO ratio_mode=geomean) or length-aware clipping, and an "
                    "aggregation that does not let long turns dominate (seq-mean-token-mean)", ())
    have = [r for r in _with(rollouts, "response_mask") if (r.num_turns or 0) >= 2]
    if not have:
        return make(SKIP, reason="needs multi-turn token data (or --tokenizer for conversations)")
    ratios, ginis = [], []
    flagged = 0
    ex: list[Example] = []
    for r in have:
        n = r.turn_lengths
        ratio = float(n.max() / n.min())
        ratios.append(ratio)
        ginis.append(_gini(n))
        if ratio >= warn_at:
            flagged += 1
            ex.append(Example(r.trajectory_id, int(np.argmax(n)), None, f"turn {int(np.argmax(n))} has {int(n.max())} "
                              f"tokens, turn {int(np.argmin(n))} has {int(n.min())} (ratio {ratio:.0f})", ratio))
    counts = {"trajectories_checked": len(have), "trajectories": flagged}
    measured = {"max_length_ratio": max(ratios), "median_length_ratio": _median(ratios), "median_gini": _median(ginis)}
    if flagged:
        return make(WARN, summary=f"{flagged} of {len(have)} trajectories have a turn {warn_at:g}x longer than "
                    "another", counts=counts, measured=measured, examples=ex, n=ctx.config.examples)
    return make(PASS, summary=f"longest / shortest turn at most {max(ratios):.1f}x ({len(have)} trajectories)",
                counts=counts, measured=measured)
