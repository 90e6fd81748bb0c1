"""The checks of ``critic-audit check``: credit-assignment bugs visible in logged rollouts, no critic
needed. Each check returns a :class:`CheckOutcome` with a status (``pass`` / ``warn`` / ``fail``, or
``skipped`` with the reason when the rollouts lack what it needs), counts with their coverage, the
worst examples (trajectory id, turn, token position) and the fix. ``docs/check.md`` maps every check
to the public bug report it would have caught.

Glossary: B trajectories, T tokens, K turns (turn k = the k-th maximal run of ``response_mask == 1``),
G rollouts per group. Log-probabilities in nats; ``delta = trainer - sampler`` log-prob of a policy
token, its importance weight ``w = exp(delta)`` (sampler -> trainer).
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from critic_audit.check.data import CheckRollout, turn_ids
from critic_audit.check.markers import TurnMarkers, expected_turns, find, turn_markers
from critic_audit.errors import ConfigError, TemplateError

__all__ = ["CHECKS", "CheckConfig", "CheckContext", "CheckOutcome", "CheckReport", "Example", "REWARD_LAYOUTS",
           "STATUSES", "run_checks"]

PASS, WARN, FAIL, SKIP = "pass", "warn", "fail", "skipped"
#: Status of a check, worst last (``skipped`` ranks below ``pass``: it says nothing).
STATUSES = (SKIP, PASS, WARN, FAIL)
#: How many rewards a turn may carry: ``turn`` (at most one per turn), ``outcome`` (at most one per
#: trajectory), ``token`` (dense per-token rewards, e.g. KL-shaped: not checked).
REWARD_LAYOUTS = ("turn", "outcome", "token")


@dataclasses.dataclass(frozen=True)
class CheckConfig:
    """Thresholds of the checks (the defaults are ours, documented in ``docs/check.md``).

    Attributes:
        reward_layout: one of :data:`REWARD_LAYOUTS` (what "more than one reward" means).
        reward_atol: rewards and sums closer than ``reward_atol * (1 + |outcome|)`` are equal.
        max_turn_tokens: the sampler's per-turn generation limit (``max_tokens``, verl
            ``rollout.response_length`` per turn); None: the length-limit check is skipped.
        weight_floor: a product importance weight ``exp(sum delta)`` below ``weight_floor`` or above
            ``1 / weight_floor`` has collapsed (fail for a trajectory, warn for a turn); 0 disables.
        kl_warn: mean per-token k3 KL estimate above which the log-prob check warns.
        delta_warn: largest |delta| (nats) above which the log-prob check warns.
        length_ratio_warn: longest / shortest turn of one trajectory above which lengths warn.
        baseline_bias_warn: |per-turn - per-trajectory group baseline| as a share of the group's
            reward range above which the group check warns.
        logprob_atol: a log-prob above ``logprob_atol`` is impossible (log p <= 0): a placeholder.
        examples: worst examples kept per check.
    """

    reward_layout: str = "turn"
    reward_atol: float = 1e-6
    max_turn_tokens: int | None = None
    weight_floor: float = 0.1
    kl_warn: float = 1e-3
    delta_warn: float = 1.0
    length_ratio_warn: float = 100.0
    baseline_bias_warn: float = 0.1
    logprob_atol: float = 1e-6
    examples: int = 5

    def __post_init__(self) -> None:
        if self.reward_layout not in REWARD_LAYOUTS:
            raise ConfigError(f"unknown reward layout {self.reward_layout!r}", fix=f"use one of {list(REWARD_LAYOUTS)}")
        if self.max_turn_tokens is not None and self.max_turn_tokens < 1:
            raise ConfigError(f"--max-turn-tokens {self.max_turn_tokens} must be >= 1")
        if not 0.0 <= self.weight_floor < 1.0:
            raise ConfigError(f"--weight-floor {self.weight_floor} must be in [0, 1)", fix="use e.g. 0.1, or 0 to disable")
        for name in ("reward_atol", "kl_warn", "delta_warn", "baseline_bias_warn", "logprob_atol"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ConfigError(f"{name} = {v!r} must be a finite number >= 0")
        if self.length_ratio_warn < 1:
            raise ConfigError(f"length_ratio_warn = {self.length_ratio_warn} must be >= 1")
        if self.examples < 0:
            raise ConfigError(f"examples = {self.examples} must be >= 0")


@dataclasses.dataclass
class Example:
    """One offending place: trajectory, turn k (None: not about one turn), token position t (None:
    not about one token), and what is wrong there."""

    trajectory_id: str
    turn: int | None
    position: int | None
    detail: str
    weight: float = 0.0  # how bad (for ordering); not reported

    def as_dict(self) -> dict[str, Any]:
        return {"trajectory_id": self.trajectory_id, "turn": self.turn, "position": self.position,
                "detail": self.detail}


@dataclasses.dataclass
class CheckOutcome:
    """The result of one check.

    Attributes:
        id: stable check id (``reward_on_masked_token``, ...).
        group: rewards, masks, tokens, logprobs or groups.
        title: one line saying what is checked.
        status: one of :data:`STATUSES`.
        summary: one line with the headline count.
        counts: integer counts, always with the coverage (``trajectories_checked``).
        measured: figures (floats; None where undefined).
        examples: the worst :class:`Example` records, worst first.
        fix: what to change when it fires.
        references: public reports of this bug (``docs/check.md``).
        reason: why it was skipped (``skipped`` only).
    """

    id: str
    group: str
    title: str
    status: str
    summary: str = ""
    counts: dict[str, int] = dataclasses.field(default_factory=dict)
    measured: dict[str, float | None] = dataclasses.field(default_factory=dict)
    examples: list[Example] = dataclasses.field(default_factory=list)
    fix: str = ""
    references: tuple[str, ...] = ()
    reason: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "group": self.group, "title": self.title, "status": self.status,
                "summary": self.summary, "counts": dict(self.counts), "measured": dict(self.measured),
                "examples": [e.as_dict() for e in self.examples], "fix": self.fix,
                "references": list(self.references), "reason": self.reason}


@dataclasses.dataclass
class CheckReport:
    """Every check on one set of rollouts.

    Attributes:
        checks: the outcomes, in :data:`CHECKS` order.
        n_trajectories: B, the rollouts read.
        notes: caveats that apply to the whole run (e.g. the trainer log-probs were recomputed).
        config: the :class:`CheckConfig` used, as a dict.
    """

    checks: list[CheckOutcome]
    n_trajectories: int
    notes: list[str] = dataclasses.field(default_factory=list)
    config: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def status(self) -> str:
        """The worst status of any check (``skipped`` when every check was skipped)."""
        return max((c.status for c in self.checks), key=STATUSES.index, default=SKIP)

    def counts_by_status(self) -> dict[str, int]:
        return {s: sum(c.status == s for c in self.checks) for s in (FAIL, WARN, PASS, SKIP)}

    def as_dict(self) -> dict[str, Any]:
        return {"status": self.status, "n_trajectories": self.n_trajectories,
                "checks_by_status": self.counts_by_status(), "checks": [c.as_dict() for c in self.checks],
                "notes": list(self.notes), "config": dict(self.config)}

    def metrics(self, prefix: str = "critic_audit/check") -> dict[str, float]:
        """Flat float metrics for a training logger: ``{prefix}/{id}/status`` (0 pass, 1 warn, 2 fail;
        skipped checks are left out) and every count and figure as ``{prefix}/{id}/{name}``."""
        out: dict[str, float] = {}
        for c in self.checks:
            if c.status == SKIP:
                continue
            out[f"{prefix}/{c.id}/status"] = float(STATUSES.index(c.status) - 1)
            for k, v in {**c.counts, **c.measured}.items():
                if v is not None and math.isfinite(float(v)):
                    out[f"{prefix}/{c.id}/{k}"] = float(v)
        return out


@dataclasses.dataclass
class CheckContext:
    """What the checks share: config, and (with a tokenizer) the template's turn markers."""

    config: CheckConfig
    tokenizer: Any = None
    chat_template: str | None = None
    markers: TurnMarkers | None = None
    markers_reason: str = "needs --tokenizer (the chat template's turn tokens)"

    def decode(self, token_id: int) -> str:
        if self.tokenizer is None:
            return str(token_id)
        return repr(self.tokenizer.decode([int(token_id)]))


# --------------------------------------------------------------------------------------------- helpers


def _outcome(id_: str, group: str, title: str, fix: str, refs: tuple[str, ...]) -> Callable[..., CheckOutcome]:
    def make(status: str, *, summary: str = "", counts: dict | None = None, measured: dict | None = None,
             examples: Sequence[Example] = (), reason: str = "", n: int = 5) -> CheckOutcome:
        worst = sorted(examples, key=lambda e: -e.weight)[:n]
        return CheckOutcome(id_, group, title, status, summary or reason, dict(counts or {}), dict(measured or {}),
                            worst, fix, refs, reason)

    return make


def _share(a: float, b: float) -> float | None:
    return (a / b) if b else None


def _prev_turn(k: np.ndarray, pos: int) -> int | None:
    """The turn of the last policy token at or before ``pos`` (None: before the first)."""
    before = k[: pos + 1]
    before = before[before >= 0]
    return int(before[-1]) if before.size else None


def _with(rollouts: Sequence[CheckRollout], *fields: str) -> list[CheckRollout]:
    return [r for r in rollouts if all(getattr(r, f) is not None for f in fields)]


def _groups(rollouts: Sequence[CheckRollout], keep: Callable[[CheckRollout], bool]):
    """``(all groups, groups of >= 2)``: group id -> its rollouts that ``keep`` accepts."""
    groups: dict[str, list[CheckRollout]] = defaultdict(list)
    for r in rollouts:
        if r.group_id is not None and keep(r):
            groups[r.group_id].append(r)
    return groups, {g: rs for g, rs in groups.items() if len(rs) >= 2}


def _nz(x: np.ndarray) -> np.ndarray:
    return np.nan_to_num(np.asarray(x, dtype=np.float64))


def _fmt(x: float) -> str:
    return f"{x:.4g}"


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
    equal = sorted({names[i] for (i, _), k in zip(rows, keep) if not k})
    n_rows = int((~keep).sum())
    counts = {"groups_checked": len(multi), "groups_all_equal": len(equal), "trajectories_dropped": n_rows,
              "trajectories_checked": len(rows), "singleton_groups": len(groups) - len(multi)}
    measured = {"share_of_groups": _share(len(equal), len(multi)), "share_of_trajectories": _share(n_rows, len(rows))}
    ex = [Example(multi[g][0].trajectory_id, None, None, f"group {g}: {len(multi[g])} rollouts, every reward "
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


# --------------------------------------------------------------------------------------------- masks


def _data_masked(rollouts: Sequence[CheckRollout]) -> list[CheckRollout]:
    return [r for r in _with(rollouts, "token_ids", "response_mask") if not r.mask_from_template]


def check_mask_boundaries(rollouts: Sequence[CheckRollout], ctx: CheckContext) -> CheckOutcome:
    make = _outcome("mask_boundaries", "masks", "response_mask runs start after the assistant header and end at "
                    "the end-of-turn token", "build response_mask from the token ids the sampler returned: 1 from "
                    "the first generated token through the end-of-turn token, 0 on the header, tool and user "
                    "tokens (verl: the agent loop's response_mask)", ("Flash-RL #19",))
    if ctx.markers is None:
        return make(SKIP, reason=ctx.markers_reason)
    have = _data_masked(rollouts)
    if not have:
        return make(SKIP, reason="no rollout carries token ids with its own response_mask")
    mk = ctx.markers
    n_hole = n_spill = n_end = n_traj = unmatched = 0
    turns_hole: int = 0
    ex: list[Example] = []
    for r in have:
        ids, m = r.token_ids, r.response_mask
        spans = expected_turns(ids, mk)
        if not spans:
            unmatched += bool(m.any())
            continue
        exp = np.zeros(len(ids), dtype=bool)
        for j, (a, b, closed) in enumerate(spans):
            exp[a:b] = True
            hole = np.flatnonzero(~m[a:b]) + a
            if hole.size:
                turns_hole += 1
                n_hole += int(hole.size)
                ex.append(Example(r.trajectory_id, j, int(hole[0]), f"mask 0 on {hole.size} token(s) inside assistant "
                                  f"turn {j} (first: {ctx.decode(ids[hole[0]])})", float(hole.size)))
            if closed and mk.end and not m[b - len(mk.end):b].all():
                n_end += 1
        spill = np.flatnonzero(m & ~exp)
        n_spill += int(spill.size)
        if spill.size:
            k = turn_ids(m)
            ex.append(Example(r.trajectory_id, int(k[spill[0]]), int(spill[0]), f"mask 1 on {spill.size} token(s) "
                              f"outside every assistant turn (first: {ctx.decode(ids[spill[0]])})", float(spill.size)))
        n_traj += bool(spill.size) or bool(((~m) & exp).any())
    checked = len(have) - unmatched
    counts = {"trajectories_checked": checked, "trajectories_without_markers": unmatched, "trajectories": n_traj,
              "hole_tokens": n_hole, "turns_with_hole": turns_hole, "end_tokens_masked": n_end, "spill_tokens": n_spill}
    if checked == 0:
        return make(SKIP, reason=f"the template's turn tokens appear in none of the {len(have)} rollouts: the "
                                 "tokenizer does not match these token ids", counts=counts)
    if n_hole or n_spill:
        return make(FAIL, summary=f"{n_traj} of {checked} trajectories: {n_hole} masked token(s) inside turns "
                    f"({n_end} end-of-turn), {n_spill} policy token(s) outside them", counts=counts, examples=ex,
                    n=ctx.config.examples)
    return make(PASS, summary=f"every mask run matches the template's turns ({checked} trajectories)", counts=counts)


def check_turn_separators(rollouts: Sequence[CheckRollout], ctx: CheckContext) -> CheckOutcome:
    make = _outcome("turn_separators", "tokens", "the template's separator follows every end-of-turn token",
                    "append the separator the chat template puts after the end-of-turn token (e.g. '\\n' after "
                    "<|im_end|>) when building the next turn's prompt from token ids", ("verl #6501",))
    if ctx.markers is None:
        return make(SKIP, reason=ctx.markers_reason)
    mk = ctx.markers
    if not mk.end or not mk.glue:
        return make(SKIP, reason="the chat template puts nothing between an end-of-turn token and the next message")
    have = _with(rollouts, "token_ids")
    if not have:
        return make(SKIP, reason="the rollouts carry no token ids")
    n_checked = n_missing = n_traj = 0
    ex: list[Example] = []
    glue = np.asarray(mk.glue)
    for r in have:
        ids = r.token_ids
        k = turn_ids(r.response_mask) if r.response_mask is not None else None
        bad = []
        for e in find(ids, mk.end):
            after = int(e) + len(mk.end)
            if after >= len(ids):
                continue
            n_checked += 1
            if not np.array_equal(ids[after:after + len(glue)], glue):
                bad.append(after)
        n_missing += len(bad)
        n_traj += bool(bad)
        for pos in bad:
            ex.append(Example(r.trajectory_id, None if k is None else _prev_turn(k, pos), pos,
                              f"{ctx.decode(ids[pos])} follows the end-of-turn token; the template puts "
                              f"{ctx.tokenizer.decode(list(mk.glue))!r} there", 1.0))
    counts = {"trajectories_checked": len(have), "boundaries_checked": n_checked, "separators_missing": n_missing,
              "trajectories": n_traj}
    if n_missing:
        return make(FAIL, summary=f"{n_missing} of {n_checked} turn boundaries lack the separator "
                    f"({n_traj} trajectories)", counts=counts, examples=ex, n=ctx.config.examples)
    return make(PASS, summary=f"every turn boundary has the separator ({n_checked} boundaries)", counts=counts)


def _run_text_empty(ids: np.ndarray, ctx: CheckContext) -> bool:
    mk = ctx.markers
    keep = np.ones(len(ids), dtype=bool)
    if mk is not None and mk.end:
        for e in find(ids, mk.end):
            keep[e:e + len(mk.end)] = False
    return not ctx.tokenizer.decode(ids[keep].tolist(), skip_special_tokens=True).strip()


def check_empty_turns(rollouts: Sequence[CheckRollout], ctx: CheckContext) -> CheckOutcome:
    make = _outcome("empty_turns", "masks", "no empty assistant turn (no text, no tool call)",
                    "find why the policy stopped at once (a stop string that fires on the first token, a template "
                    "that opens the turn twice); drop or penalise empty generations", ())
    n_turns = n_empty = n_traj = checked = 0
    ex: list[Example] = []
    for r in rollouts:
        if r.empty_turns is not None:
            empty = [(t, None) for t in r.empty_turns]
            n_turns += r.num_turns or 0
        elif r.token_ids is not None and r.response_mask is not None and ctx.tokenizer is not None:
            k = r.turn_ids
            empty = [(int(t), int(np.flatnonzero(k == t)[0])) for t in np.unique(k[k >= 0])
                     if _run_text_empty(r.token_ids[k == t], ctx)]
            n_turns += r.num_turns or 0
        else:
            continue
        checked += 1
        n_empty += len(empty)
        n_traj += bool(empty)
        ex += [Example(r.trajectory_id, t, p, f"turn {t} has no text and no tool call", 1.0) for t, p in empty]
    if not checked:
        return make(SKIP, reason="needs messages, or token ids and --tokenizer")
    counts = {"trajectories_checked": checked, "turns_checked": n_turns, "empty_turns": n_empty, "trajectories": n_traj}
    if n_empty:
        return make(WARN, summary=f"{n_empty} of {n_turns} turns are empty ({n_traj} trajectories)", counts=counts,
                    examples=ex, n=ctx.config.examples)
    return make(PASS, summary=f"no empty turn ({n_turns} turns)", counts=counts)


def check_turn_length_limit(rollouts: Sequence[CheckRollout], ctx: CheckContext) -> CheckOutcome:
    limit = ctx.config.max_turn_tokens
    make = _outcome("turn_length_limit", "masks", f"no turn longer than the generation limit ({limit} tokens)",
                    "a turn longer than one generation can produce is two turns (or a turn and tool text) merged "
                    "into one mask run: set response_mask to 0 on the tokens the policy did not generate", ())
    if limit is None:
        return make(SKIP, reason="pass --max-turn-tokens N (the sampler's per-turn max_tokens) to check")
    have = _with(rollouts, "response_mask")
    if not have:
        return make(SKIP, reason="needs token data (or --tokenizer for conversations)")
    n_over = n_at = n_turns = n_traj = 0
    ex: list[Example] = []
    for r in have:
        lengths, k = r.turn_lengths, r.turn_ids
        n_turns += len(lengths)
        over = np.flatnonzero(lengths > limit)
        n_over += int(over.size)
        n_at += int((lengths == limit).sum())
        n_traj += bool(over.size)
        why = " (the mask comes from the chat template: the message itself is that long)" if r.mask_from_template else ""
        ex += [Example(r.trajectory_id, int(t), int(np.flatnonzero(k == t)[0]), f"turn {int(t)} has "
                       f"{int(lengths[t])} policy tokens, over the limit of {limit}{why}", float(lengths[t]))
               for t in over]
    counts = {"trajectories_checked": len(have), "turns_checked": n_turns, "turns_over_limit": n_over,
              "turns_at_limit": n_at, "trajectories": n_traj}
    if n_over:
        return make(FAIL, summary=f"{n_over} of {n_turns} turns are longer than {limit} tokens", counts=counts,
                    examples=ex, n=ctx.config.examples)
    return make(PASS, summary=f"no turn over {limit} tokens ({n_turns} turns; {n_at} exactly at the limit)",
                counts=counts)


def _cut_turns(r: CheckRollout, ctx: CheckContext) -> list[tuple[int, int]]:
    """(turn, last position) of turns that do not end with the end-of-turn token (markers needed)."""
    mk = ctx.markers
    k, ids, out = r.turn_ids, r.token_ids, []
    for t in np.unique(k[k >= 0]):
        last = int(np.flatnonzero(k == t)[-1])
        lo, hi = max(0, last + 1 - len(mk.end)), min(len(ids), last + 1 + len(mk.end))
        if not find(ids[lo:hi], mk.end).size:
            out.append((int(t), last))
    return out


def check_truncation(rollouts: Sequence[CheckRollout], ctx: CheckContext) -> CheckOutcome:
    limit = ctx.config.max_turn_tokens
    make = _outcome("truncation", "masks", "truncated trajectories (cut at a length limit)",
                    "leave truncated episodes out of the loss or shape their reward (DAPO overlong filtering / "
                    "soft punishment: critic_audit.rl.overlong_penalty), and do not credit an unfinished turn "
                    "with the outcome", ("miles #1827", "arXiv:2503.14476 (DAPO)"))
    use_markers = ctx.markers is not None and bool(ctx.markers.end)
    n_checked = n_trunc = n_rewarded = 0
    ex: list[Example] = []
    for r in rollouts:
        cut: list[tuple[int | None, int | None, str]] = []
        known = r.truncated is not None
        if r.truncated:
            cut.append((None, None, "the record marks it truncated"))
        if r.response_mask is not None and limit is not None:
            known = True
            k, lengths = r.turn_ids, r.turn_lengths
            cut += [(int(t), int(np.flatnonzero(k == t)[-1]), f"turn {int(t)} stops at exactly {limit} tokens")
                    for t in np.flatnonzero(lengths == limit)]
        if use_markers and r.token_ids is not None and r.response_mask is not None and not r.mask_from_template:
            known = True
            cut += [(t, p, f"turn {t} ends without the end-of-turn token") for t, p in _cut_turns(r, ctx)]
        if not known:
            continue
        n_checked += 1
        if cut:
            n_trunc += 1
            n_rewarded += bool(r.reward)
            t, p, why = cut[0]
            ex.append(Example(r.trajectory_id, t, p, why + (f"; reward {_fmt(r.reward)}" if r.reward else ""),
                              1.0 + bool(r.reward)))
    if not n_checked:
        return make(SKIP, reason="the rollouts say nothing about truncation (no truncated / finish_reason field); "
                                 "pass --max-turn-tokens N or --tokenizer to infer it")
    counts = {"trajectories_checked": n_checked, "trajectories": n_trunc, "truncated_with_reward": n_rewarded}
    measured = {"share": _share(n_trunc, n_checked)}
    if n_trunc:
        return make(WARN, summary=f"{n_trunc} of {n_checked} trajectories are truncated ({n_rewarded} with a non-zero "
                    "reward)", counts=counts, measured=measured, examples=ex, n=ctx.config.examples)
    return make(PASS, summary=f"no truncated trajectory ({n_checked} checked)", counts=counts, measured=measured)


# --------------------------------------------------------------------------------------------- tokens vs text


def _segments(ids: np.ndarray, k: np.ndarray) -> tuple[list[np.ndarray], list[np.ndarray], list[int]]:
    """Per turn: its generated ids, the context ids before it (since the previous turn), and the
    position where that context starts."""
    gen, ctx_, starts = [], [], []
    prev_end = 0
    for t in range(int(k.max()) + 1 if (k >= 0).any() else 0):
        pos = np.flatnonzero(k == t)
        gen.append(ids[pos])
        ctx_.append(ids[prev_end:pos[0]])
        starts.append(prev_end)
        prev_end = int(pos[-1]) + 1
    return gen, ctx_, starts


def _first_diff(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    d = np.flatnonzero(a[:n] != b[:n])
    return int(d[0]) if d.size else n


def check_retokenization(rollouts: Sequence[CheckRollout], ctx: CheckContext) -> CheckOutcome:
    make = _outcome("retokenization", "tokens", "the messages re-render to the token ids (per turn)",
                    "train on the token ids the sampler returned (token-in-token-out) and build each next prompt by "
                    "appending ids, never by re-rendering the messages; context drift means the model was "
                    "conditioned on a prompt its chat template never produces", ("verl #6501",))
    if ctx.tokenizer is None:
        return make(SKIP, reason="needs --tokenizer (the chat template to re-render the messages)")
    have = [r for r in _data_masked(rollouts) if r.messages]
    if not have:
        return make(SKIP, reason="no rollout carries both token ids and messages")
    from critic_audit.schema import Conversation
    from critic_audit.turns import TokenizeConfig, tokenize_conversations

    convs = [Conversation(r.trajectory_id, r.messages, record=r.source) for r in have]
    try:
        res = tokenize_conversations(convs, ctx.tokenizer, TokenizeConfig(chat_template=ctx.chat_template))
    except TemplateError as e:
        return make(SKIP, reason=f"the chat template cannot re-render the messages ({e})")
    rendered = {tc.trajectory_id: tc for tc in res.conversations}
    n_turns = n_gen = n_ctx = n_count = n_traj = 0
    ex: list[Example] = []
    for r in have:
        tc = rendered.get(r.trajectory_id)
        if tc is None:
            continue
        g1, c1, s1 = _segments(r.token_ids, r.turn_ids)
        g2, c2, _ = _segments(tc.input_ids.astype(np.int64), tc.turn.astype(np.int64))
        bad = False
        if len(g1) != len(g2):
            n_count += 1
            bad = True
            ex.append(Example(r.trajectory_id, None, None, f"the mask has {len(g1)} turns, the messages render "
                              f"{len(g2)}", 1e9))
        for t in range(min(len(g1), len(g2))):
            n_turns += 1
            if not np.array_equal(c1[t], c2[t]):
                n_ctx += 1
                bad = True
                d = _first_diff(c1[t], c2[t])
                a = ctx.decode(c1[t][d]) if d < len(c1[t]) else "nothing"
                b = ctx.decode(c2[t][d]) if d < len(c2[t]) else "nothing"
                ex.append(Example(r.trajectory_id, t, s1[t] + d, f"the context before turn {t} has {len(c1[t])} ids, "
                                  f"the template renders {len(c2[t])}; first difference: {a} vs {b}", 1e6))
            if not np.array_equal(g1[t], g2[t]):
                n_gen += 1
                bad = True
                d = _first_diff(g1[t], g2[t])
                pos = int(np.flatnonzero(r.turn_ids == t)[min(d, len(g1[t]) - 1)])
                ex.append(Example(r.trajectory_id, t, pos, f"turn {t}: {len(g1[t])} sampled ids vs {len(g2[t])} "
                                  "re-tokenized", 1.0))
        n_traj += bad
    counts = {"trajectories_checked": len(rendered), "not_renderable": len(have) - len(rendered),
              "turns_checked": n_turns, "turns_with_context_drift": n_ctx, "turns_with_content_drift": n_gen,
              "turn_count_differs": n_count, "trajectories": n_traj}
    measured = {"share_of_turns_drifting": _share(n_gen + n_ctx, n_turns)}
    if not rendered:
        return make(SKIP, reason="none of the messages could be rendered with the chat template", counts=counts)
    summary = f"{n_traj} of {len(rendered)} trajectories drift: {n_ctx} turn context(s), {n_gen} turn content(s), " \
              f"{n_count} turn count(s)"
    if n_ctx or n_count:
        return make(FAIL, summary=summary, counts=counts, measured=measured, examples=ex, n=ctx.config.examples)
    if n_gen:
        return make(WARN, summary=summary + " (sampled ids that are not the canonical tokenization of their text: "
                    "harmless only while nothing re-tokenizes the messages)", counts=counts, measured=measured,
                    examples=ex, n=ctx.config.examples)
    return make(PASS, summary=f"the messages re-render to the same ids ({n_turns} turns)", counts=counts,
                measured=measured)


# --------------------------------------------------------------------------------------------- log-probs


def _median(xs: list[float]) -> float | None:
    return float(np.median(xs)) if xs else None


def check_logprob_mismatch(rollouts: Sequence[CheckRollout], ctx: CheckContext) -> CheckOutcome:
    cfg = ctx.config
    make = _outcome("logprob_mismatch", "logprobs", "sampler vs trainer log-probs (k3 KL, |delta|, importance weights)",
                    "use a length-normalised weight (the geometric mean, exp(mean delta)) or token-level truncated "
                    "IS instead of the product exp(sum delta) over long sequences; align the inference and "
                    "training numerics (dtype, kernels, weight sync); never fill log-probs of positions the "
                    "sampler did not score with placeholders", ("NeMo-RL #2269", "sglang #2427", "Flash-RL #19"))
    have = _with(rollouts, "sampler_log_probs", "trainer_log_probs", "response_mask")
    if not have:
        return make(SKIP, reason="needs the sampler's and the trainer's log-probs of the same tokens (verl "
                                 "rollout_log_probs and old_log_probs), or rollout_log_probs and --policy CHECKPOINT")
    import torch

    from critic_audit.rl.diagnostics import turn_log_ratios

    floor = cfg.weight_floor
    lo, hi = (math.log(floor), -math.log(floor)) if floor > 0 else (-math.inf, math.inf)
    n_tok = n_missing = n_impossible = n_turns = n_turn_collapse = n_seq_collapse = n_ph_masked = 0
    k3_sum = 0.0
    max_delta, max_at = 0.0, None
    seq_prod, seq_geo, turn_k3 = [], [], []
    ex: list[Example] = []
    for r in have:
        s, t, m = np.asarray(r.sampler_log_probs, float), np.asarray(r.trainer_log_probs, float), r.response_mask
        k = r.turn_ids
        ok = m & np.isfinite(s) & np.isfinite(t)
        n_missing += int((m & ~ok).sum())
        imp = np.flatnonzero(ok & ((s > cfg.logprob_atol) | (t > cfg.logprob_atol)))
        n_impossible += int(imp.size)
        with np.errstate(invalid="ignore"):
            n_ph_masked += int((~m & ((s > cfg.logprob_atol) | (t > cfg.logprob_atol))).sum())
        for p in imp[:3]:
            side = "sampler" if s[p] > cfg.logprob_atol else "trainer"
            ex.append(Example(r.trajectory_id, int(k[p]), int(p), f"{side} log-prob {_fmt(max(s[p], t[p]))} > 0 on a "
                              "policy token (a placeholder? it enters the ratio as a real value)", 1e12))
        if not ok.any():
            continue
        delta = np.where(ok, t - s, 0.0)
        # k3 = r - 1 - log r with r = exp(delta) = pi_trainer / pi_sampler (Schulman, 2020): >= 0, unbiased
        # for KL(sampler || trainer) on tokens the sampler drew
        k3 = np.where(ok, np.expm1(delta) - delta, 0.0)
        n_tok += int(ok.sum())
        k3_sum += float(k3.sum())
        j = int(np.argmax(np.abs(delta)))
        if abs(delta[j]) > max_delta:
            max_delta, max_at = float(abs(delta[j])), (r.trajectory_id, int(k[j]), j, float(delta[j]))
        kk = torch.as_tensor(np.where(ok, k, -1))[None]
        log_prod, lengths = turn_log_ratios(torch.as_tensor(t)[None].nan_to_num(), torch.as_tensor(s)[None].nan_to_num(),
                                            kk, "product")
        log_prod, lengths = log_prod[0].numpy(), lengths[0].numpy()
        present = lengths > 0
        n_turns += int(present.sum())
        for q in np.flatnonzero(present & ((log_prod < lo) | (log_prod > hi))):
            n_turn_collapse += 1
            ex.append(Example(r.trajectory_id, int(q), None, f"turn {int(q)} product weight exp({_fmt(log_prod[q])}) = "
                              f"{_fmt(math.exp(log_prod[q]))} over {int(lengths[q])} tokens", abs(float(log_prod[q]))))
        turn_k3 += [float(k3[k == q].sum() / lengths[q]) for q in np.flatnonzero(present)]
        total, mean = float(delta.sum()), float(delta[ok].mean())
        seq_prod.append(total)
        seq_geo.append(mean)
        if total < lo or total > hi:
            n_seq_collapse += 1
            ex.append(Example(r.trajectory_id, None, None, f"sequence product weight exp({_fmt(total)}) = "
                              f"{_fmt(math.exp(total))} over {int(ok.sum())} tokens (geomean {_fmt(math.exp(mean))})",
                              1e6 + abs(total)))
    measured = {
        "k3_token_mean": k3_sum / n_tok if n_tok else None, "max_abs_delta": max_delta if n_tok else None,
        "turn_k3_max": max(turn_k3) if turn_k3 else None,
        "seq_product_weight_min": math.exp(min(seq_prod)) if seq_prod else None,
        "seq_product_weight_median": math.exp(_median(seq_prod)) if seq_prod else None,
        "seq_geomean_weight_min": math.exp(min(seq_geo)) if seq_geo else None,
        "seq_geomean_weight_median": math.exp(_median(seq_geo)) if seq_geo else None,
    }
    counts = {"trajectories_checked": len(have), "tokens_checked": n_tok, "tokens_missing": n_missing,
              "impossible_log_probs": n_impossible, "placeholders_on_masked_tokens": n_ph_masked, "turns_checked": n_turns, "turns_collapsed": n_turn_collapse,
              "trajectories_collapsed": n_seq_collapse}
    if max_at is not None and max_delta > cfg.delta_warn:
        tid, q, p, d = max_at
        ex.append(Example(tid, q, p, f"largest |delta|: trainer - sampler = {_fmt(d)} nats", max_delta))
    k3m = measured["k3_token_mean"]
    summary = (f"mean k3 {_fmt(k3m) if k3m is not None else 'n/a'}, max |delta| {_fmt(max_delta)}; product weight "
               f"collapsed in {n_seq_collapse} of {len(have)} trajectories, {n_turn_collapse} of {n_turns} turns")
    if n_impossible:
        summary = f"{n_impossible} impossible log-prob(s) > 0 on policy tokens; " + summary
    if n_seq_collapse or n_impossible:
        status = FAIL
    elif n_turn_collapse or n_missing or (k3m is not None and k3m > cfg.kl_warn) or max_delta > cfg.delta_warn:
        status = WARN
    else:
        status = PASS
    return make(status, summary=summary, counts=counts, measured=measured, examples=ex, n=cfg.examples)


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
                              f"group {g}: {int(kk.min())}-{int(kk.max())} turns; per-turn baseline {_fmt(per_turn)} vs "
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


#: Every check, in report order.
CHECKS: tuple[Callable[[Sequence[CheckRollout], CheckContext], CheckOutcome], ...] = (
    check_reward_on_masked_token, check_rewards_per_turn, check_turn_rewards_sum, check_groups_all_equal,
    check_returns_reset, check_mask_boundaries, check_empty_turns, check_turn_length_limit, check_truncation,
    check_retokenization, check_turn_separators, check_logprob_mismatch, check_turns_per_group,
    check_turn_length_inequality,
)


def run_checks(rollouts: Sequence[CheckRollout], config: CheckConfig | None = None, *, tokenizer: Any = None,
               chat_template: str | None = None, notes: Sequence[str] = ()) -> CheckReport:
    """Run every check of :data:`CHECKS` on ``rollouts``.

    Args:
        rollouts: from :func:`critic_audit.check.load_rollouts` or
            :func:`critic_audit.check.rollouts_from_verl_batch`.
        config: thresholds (:class:`CheckConfig`).
        tokenizer: a Hugging Face tokenizer whose chat template the rollouts used (enables the checks
            on turn tokens, separators, empty turns and re-tokenization).
        chat_template: a Jinja template replacing the tokenizer's.
        notes: caveats carried into the report.

    A tokenizer whose template cannot render the probe exchange or the rollouts' messages skips the
    checks that need it (with the reason); it raises nothing.
    """
    cfg = config or CheckConfig()
    ctx = CheckContext(cfg, tokenizer, chat_template)
    if tokenizer is not None:
        try:
            ctx.markers, ctx.markers_reason = turn_markers(tokenizer, chat_template)
        except TemplateError as e:  # a template that cannot render the probe: the other checks still run
            ctx.markers, ctx.markers_reason = None, f"the chat template cannot render a probe exchange ({e.problem})"
    return CheckReport([fn(rollouts, ctx) for fn in CHECKS], len(rollouts), list(notes), dataclasses.asdict(cfg))
