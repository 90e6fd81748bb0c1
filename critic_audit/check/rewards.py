"""Reward checks: a reward on a masked token, several rewards per turn, per-turn series against the
outcome, groups without signal, returns reset at tool spans (see ``docs/check.md``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from critic_audit.check.core import (
    FAIL, PASS, SKIP, WARN, CheckContext, CheckOutcome, Example, _fmt, _groups, _nz, group_name, _outcome, _prev_turn,
    _share, _with,
)
from critic_audit.check.data import CheckRollout

# --------------------------------------------------------------------------------------------- rewards


def check_reward_on_masked_token(rollouts: Sequence[CheckRollout], ctx: CheckContext) -> CheckOutcome:
    make = _outcome("reward_on_masked_token", "rewards", "no reward on a masked token (prompt, tool output, padding)",
                    "put each reward on the last policy token of its turn (the action that earned it); for verl "
                    "batches critic_audit.integrations.verl.plugin.move_masked_rewards does that", ("miles #1827",))
    have = _with(rollouts, "token_rewards", "response_mask")
    if not have:
        return make(SKIP, reason="the rollouts carry no per-token rewards (token_level_rewards, a per-token reward "
                                 "list, or a verl dump's side file)")
    n_tok = n_traj = n_pad = 0
    mass = lost = 0.0
    ex: list[Example] = []
    for r in have:
        tr, m, k = _nz(r.token_rewards), r.response_mask, r.turn_ids
        mass += float(np.abs(tr).sum())
        bad = np.flatnonzero((tr != 0) & ~m)
        n_pad += r.rewards_on_padding
        if bad.size or r.rewards_on_padding:
            n_traj += 1
        n_tok += int(bad.size)
        lost += float(np.abs(tr[bad]).sum())
        for pos in bad:
            kp = _prev_turn(k, int(pos))
            where = "before the first policy token" if kp is None else \
                f"{int(pos) - int(np.flatnonzero(k == kp)[-1])} token(s) after turn {kp} ends"
            ex.append(Example(r.trajectory_id, kp, int(pos), f"reward {_fmt(tr[pos])} on a masked token, {where}",
                              abs(float(tr[pos]))))
        if r.rewards_on_padding:
            ex.append(Example(r.trajectory_id, None, None,
                              f"{r.rewards_on_padding} non-zero reward(s) on padding (attention_mask 0), dropped", 1e9))
    counts = {"trajectories_checked": len(have), "trajectories": n_traj, "tokens": n_tok, "on_padding": n_pad}
    measured = {"share_of_reward_mass": _share(lost, mass)}
    if n_tok or n_pad:
        return make(FAIL, summary=f"{n_tok + n_pad} reward(s) on masked tokens in {n_traj} of {len(have)} trajectories",
                    counts=counts, measured=measured, examples=ex, n=ctx.config.examples)
    return make(PASS, summary=f"every reward sits on a policy token ({len(have)} trajectories)", counts=counts,
                measured=measured)


def check_rewards_per_turn(rollouts: Sequence[CheckRollout], ctx: CheckContext) -> CheckOutcome:
    layout = ctx.config.reward_layout
    make = _outcome("rewards_per_turn", "rewards", f"at most one reward per {'trajectory' if layout == 'outcome' else 'turn'}"
                    f" (--reward-layout {layout})",
                    "sum a turn's rewards onto its last token (one reward per action), or pass --reward-layout "
                    "token when the rewards are dense by design (KL-shaped, per-token process rewards)", ("SkyRL #226",))
    if layout == "token":
        return make(SKIP, reason="--reward-layout token: dense per-token rewards are expected")
    have = _with(rollouts, "token_rewards", "response_mask")
    if not have:
        return make(SKIP, reason="the rollouts carry no per-token rewards")
    n_bad = n_traj = n_units = 0
    ex: list[Example] = []
    for r in have:
        tr, k = _nz(r.token_rewards), r.turn_ids
        nz = np.flatnonzero(tr != 0)
        units = {None: nz} if layout == "outcome" else {int(t): nz[k[nz] == t] for t in np.unique(k[nz][k[nz] >= 0])}
        n_units += 1 if layout == "outcome" else int(len(r.turn_lengths))
        bad = {t: p for t, p in units.items() if len(p) > 1}
        n_bad += len(bad)
        n_traj += bool(bad)
        for t, p in bad.items():
            ex.append(Example(r.trajectory_id, t, int(p[1]),
                              f"{len(p)} rewards in {'the trajectory' if t is None else f'turn {t}'} at positions "
                              f"{', '.join(map(str, p[:6].tolist()))}", float(len(p))))
    what = "trajectories" if layout == "outcome" else "turns"
    counts = {"trajectories_checked": len(have), f"{what}_checked": n_units, f"{what}_with_several": n_bad,
              "trajectories": n_traj}
    if n_bad:
        return make(FAIL, summary=f"{n_bad} of {n_units} {what} carry more than one reward", counts=counts,
                    examples=ex, n=ctx.config.examples)
    return make(PASS, summary=f"no {what[:-1]} carries more than one reward ({n_units} {what})", counts=counts)


def check_turn_rewards_sum(rollouts: Sequence[CheckRollout], ctx: CheckContext) -> CheckOutcome:
    make = _outcome("turn_rewards_sum", "rewards", "a per-turn reward series sums to the outcome, one entry per turn",
                    "keep every turn's reward (each step's reward on that turn's last token), not only the last "
                    "one; if the outcome is by design not the undiscounted sum, compare against that instead",
                    ("SkyRL #226",))
    have = _with(rollouts, "turn_rewards", "reward")
    if not have:
        return make(SKIP, reason="no rollout carries a per-turn reward series beside its outcome (a turn_rewards / "
                                 "step_rewards field, or token_level_rewards beside a scalar reward)")
    tol = ctx.config.reward_atol
    n_sum = n_len = 0
    ex: list[Example] = []
    for r in have:
        s, out = float(np.nansum(r.turn_rewards)), float(r.reward)
        k = r.num_turns if r.response_mask is not None or r.messages is not None else None
        series = ", ".join(_fmt(x) for x in r.turn_rewards[:8]) + (", ..." if len(r.turn_rewards) > 8 else "")
        if k is not None and len(r.turn_rewards) != k:
            n_len += 1
            ex.append(Example(r.trajectory_id, None, None, f"the series has {len(r.turn_rewards)} entries for "
                              f"{k} turns ([{series}])", 1e9 + abs(k - len(r.turn_rewards))))
        if abs(s - out) > tol * (1.0 + abs(out)):
            n_sum += 1
            ex.append(Example(r.trajectory_id, None, None, f"turn rewards [{series}] sum to {_fmt(s)}, the outcome is "
                              f"{_fmt(out)}", abs(s - out)))
    counts = {"trajectories_checked": len(have), "sum_differs": n_sum, "length_differs": n_len}
    if n_sum or n_len:
        return make(FAIL, summary=f"{n_sum} series differ from the outcome, {n_len} have the wrong length "
                    f"(of {len(have)})", counts=counts, examples=ex, n=ctx.config.examples)
    return make(PASS, summary=f"every series sums to its outcome ({len(have)} trajectories)", counts=counts)


def check_groups_all_equal(rollouts: Sequence[CheckRollout], ctx: CheckContext) -> CheckOutcome:
    make = _outcome("groups_all_equal", "rewards", "groups carry a learning signal (not every reward equal)",
                    "sample more rollouts per prompt or filter such groups (DAPO dynamic sampling, "
                    "critic_audit.rl.dynamic_sampling_filter); when every group is equal, check the reward "
                    "function (constant output, a parse failure scored 0)", ("arXiv:2503.14476 (DAPO)",))
    groups, multi = _groups(rollouts, lambda r: r.reward is not None)
    if not multi:
        return make(SKIP, reason="no group (group_id / uid) holds two or more rollouts with a reward")
    import torch

    from critic_audit.rl import dynamic_sampling_filter

    names = list(multi)
    rows = [(i, r) for i, g in enumerate(names) for r in multi[g]]
    res = dynamic_sampling_filter(torch.tensor([r.reward for _, r in rows], dtype=torch.float64),
                                  torch.tensor([i for i, _ in rows]), atol=ctx.config.reward_atol)
    keep = res.keep.numpy()
    equal = sorted({names[i] for (i, _), k in zip(rows, keep) if not k}, key=group_name)
    n_rows = int((~keep).sum())
    counts = {"groups_checked": len(multi), "groups_all_equal": len(equal), "trajectories_dropped": n_rows,
              "trajectories_checked": len(rows), "singleton_groups": len(groups) - len(multi)}
    measured = {"share_of_groups": _share(len(equal), len(multi)), "share_of_trajectories": _share(n_rows, len(rows))}
    ex = [Example(multi[g][0].trajectory_id, None, None,
                  f"group {group_name(g)}: {len(multi[g])} rollouts, every reward "
                  f"{_fmt(multi[g][0].reward)}", float(len(multi[g]))) for g in equal]
    summary = f"{len(equal)} of {len(multi)} groups have all-equal rewards; DAPO's filter would drop {n_rows} of " \
              f"{len(rows)} trajectories"
    status = FAIL if len(equal) == len(multi) else WARN if equal else PASS
    return make(status, summary=summary if equal else f"every group has a reward spread ({len(multi)} groups)",
                counts=counts, measured=measured, examples=ex, n=ctx.config.examples)


def check_returns_reset(rollouts: Sequence[CheckRollout], ctx: CheckContext) -> CheckOutcome:
    make = _outcome("returns_reset", "rewards", "returns carry across tool spans (no turn left with return 0)",
                    "carry the running return through masked (tool / observation) tokens instead of resetting it "
                    "at response_mask == 0; reset only at the end of the episode", ("verl #7278",))
    have = [r for r in _with(rollouts, "returns", "response_mask") if r.num_turns and r.num_turns >= 2]
    if not have:
        return make(SKIP, reason="no multi-turn rollout carries per-token returns (verl `returns`)")
    n_turns = n_traj = 0
    ex: list[Example] = []
    for r in have:
        ret, k = _nz(r.returns), r.turn_ids
        last = int(k.max())
        if not np.any(ret[k == last] != 0):
            continue
        zero = [t for t in range(last) if not np.any(ret[k == t] != 0)]
        n_turns += len(zero)
        n_traj += bool(zero)
        for t in zero:
            pos = int(np.flatnonzero(k == t)[0])
            ex.append(Example(r.trajectory_id, t, pos, f"the return is 0 on all {int((k == t).sum())} tokens of turn "
                              f"{t} while the last turn's is {_fmt(float(ret[k == last][-1]))}", float(last - t)))
    counts = {"trajectories_checked": len(have), "turns_with_zero_return": n_turns, "trajectories": n_traj}
    if n_turns:
        return make(FAIL, summary=f"{n_turns} earlier turn(s) in {n_traj} of {len(have)} trajectories get return 0",
                    counts=counts, examples=ex, n=ctx.config.examples)
    return make(PASS, summary=f"returns reach every turn ({len(have)} trajectories)", counts=counts)
