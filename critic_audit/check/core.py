"""Types shared by the checks of ``critic-audit check``: the thresholds (:class:`CheckConfig`), one
check's result (:class:`CheckOutcome` with :class:`Example` records), the whole report
(:class:`CheckReport`) and what the checks share (:class:`CheckContext`). A check module imports
these, and the helpers for writing a check, from :mod:`critic_audit.check.kit`.

Glossary: B trajectories, T tokens, K turns (turn k = the k-th maximal run of ``response_mask == 1``),
G rollouts per group. Log-probabilities in nats; ``delta = trainer - sampler`` log-prob of a policy
token, its importance weight ``w = exp(delta)`` (sampler -> trainer).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from critic_audit.check.markers import TurnMarkers
from critic_audit.errors import UsageError

__all__ = ["CheckConfig", "CheckContext", "CheckOutcome", "CheckReport", "Example", "REWARD_LAYOUTS", "REPORT_TOOL",
           "STATUSES",
           "PASS", "WARN", "FAIL", "SKIP"]

PASS, WARN, FAIL, SKIP = "pass", "warn", "fail", "skipped"
#: The ``tool`` field of a JSON check report: ``check --out`` replaces only a file that carries it.
REPORT_TOOL = "critic-audit check"
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
        max_response_tokens: the cap on a row's response (tokens from its first policy token to its
            end: verl ``data.max_response_length`` of a merged multi-turn row); None: inferred as the
            longest response when at least two rows reach it exactly.
        weight_floor: a product importance weight ``exp(sum delta)`` below ``weight_floor`` or above
            ``1 / weight_floor`` has collapsed (fail for a trajectory, warn for a turn); 0 disables.
        kl_warn: mean per-token k3 KL estimate above which the log-prob check warns.
        delta_warn: largest |delta| (nats) above which the log-prob check warns.
        length_ratio_warn: longest / shortest turn of one trajectory above which lengths warn.
        baseline_bias_warn: |per-turn - per-trajectory group baseline| as a share of the group's
            reward range above which the group check warns.
        logprob_atol: a log-prob above ``logprob_atol`` is impossible (log p <= 0): a placeholder.
        gamma, lam: the discount and GAE lambda the trainer used (None: inferred from the data by the
            GAE recompute, which says so).
        gae_rtol: stored advantages "match" a recomputed GAE when the root-mean-square residual of the
            best affine fit (whitening is affine) is below ``gae_rtol`` times their spread.
        gae_rows: rows the GAE recompute compares first (spread over the batch, rows with masked
            tokens inside their response first); every row is compared when these show the bug. 0: all.
        masked_value_factor: a critic value under mask 0 (after the first policy token) larger in
            magnitude than ``masked_value_factor`` times the 99th percentile of |V| on policy tokens
            is "large" (it would move GAE if a trainer read it).
        ratio_shift_warn, ratio_shift_fail: a mean importance ratio (trainer / sampler) shifted below 1
            by at least this much, uniformly (nearly every trajectory below 1, spread across
            trajectories smaller than the shift), warns / fails as truncated-sampling bias.
        turn_delta_warn: a turn (>= 4 policy tokens) whose mean |trainer - sampler| exceeds this many
            nats warns in the per-turn mismatch check.
        examples: worst examples kept per check.
    """

    reward_layout: str = "turn"
    reward_atol: float = 1e-6
    max_turn_tokens: int | None = None
    max_response_tokens: int | None = None
    weight_floor: float = 0.1
    kl_warn: float = 1e-3
    delta_warn: float = 1.0
    length_ratio_warn: float = 100.0
    baseline_bias_warn: float = 0.1
    logprob_atol: float = 1e-6
    gamma: float | None = None
    lam: float | None = None
    gae_rtol: float = 1e-3
    gae_rows: int = 64
    masked_value_factor: float = 10.0
    ratio_shift_warn: float = 0.02
    ratio_shift_fail: float = 0.05
    turn_delta_warn: float = 0.1
    examples: int = 5

    def __post_init__(self) -> None:
        if self.reward_layout not in REWARD_LAYOUTS:
            raise UsageError(f"unknown reward layout {self.reward_layout!r}", fix=f"use one of {list(REWARD_LAYOUTS)}")
        if self.max_turn_tokens is not None and self.max_turn_tokens < 1:
            raise UsageError(f"--max-turn-tokens {self.max_turn_tokens} must be >= 1",
                             fix="pass the sampler's per-turn max_tokens, e.g. --max-turn-tokens 2048, or leave it out")
        if self.max_response_tokens is not None and self.max_response_tokens < 1:
            raise UsageError(f"--max-response-tokens {self.max_response_tokens} must be >= 1",
                             fix="pass verl's data.max_response_length, e.g. --max-response-tokens 4096, or leave it "
                                 "out to infer it")
        if not 0.0 <= self.weight_floor < 1.0:
            raise UsageError(f"--weight-floor {self.weight_floor} must be in [0, 1)", fix="use e.g. 0.1, or 0 to disable")
        for name in ("gamma", "lam"):
            v = getattr(self, name)
            if v is not None and not (isinstance(v, (int, float)) and 0.0 <= v <= 1.0):
                raise UsageError(f"{name} = {v!r} must be in [0, 1]", fix="pass the trainer's value, or leave it "
                                  "unset to infer it")
        if not 0.0 < self.ratio_shift_warn <= self.ratio_shift_fail < 1.0:
            raise UsageError(f"ratio_shift_warn = {self.ratio_shift_warn}, ratio_shift_fail = {self.ratio_shift_fail} "
                              "must satisfy 0 < warn <= fail < 1")
        for name in ("reward_atol", "kl_warn", "delta_warn", "baseline_bias_warn", "logprob_atol", "gae_rtol",
                     "masked_value_factor", "turn_delta_warn"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise UsageError(f"{name} = {v!r} must be a finite number >= 0")
        if self.length_ratio_warn < 1:
            raise UsageError(f"length_ratio_warn = {self.length_ratio_warn} must be >= 1")
        if self.gae_rows < 0:
            raise UsageError(f"gae_rows = {self.gae_rows} must be >= 0 (0: every row)")
        if self.examples < 0:
            raise UsageError(f"--examples {self.examples} must be >= 0", fix="use e.g. --examples 5")  # the option's style, as --max-turn-tokens


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
        input: what the readers did (:meth:`critic_audit.io.records.ReadReport.as_dict`: formats,
            records and files skipped, with examples); empty for rollouts not read from files.
    """

    checks: list[CheckOutcome]
    n_trajectories: int
    notes: list[str] = dataclasses.field(default_factory=list)
    config: dict[str, Any] = dataclasses.field(default_factory=dict)
    input: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def status(self) -> str:
        """The worst status of any check (``skipped`` when every check was skipped)."""
        return max((c.status for c in self.checks), key=STATUSES.index, default=SKIP)

    def counts_by_status(self) -> dict[str, int]:
        return {s: sum(c.status == s for c in self.checks) for s in (FAIL, WARN, PASS, SKIP)}

    @property
    def n_ran(self) -> int:
        """How many checks ran (every status but ``skipped``)."""
        return sum(c.status != SKIP for c in self.checks)

    def overall(self) -> str:
        """The overall status with how many checks it rests on, e.g. ``pass (1 of 20 checks ran; 19
        skipped: see reasons)``: a pass over skipped checks is not a pass of them."""
        n, ran = len(self.checks), self.n_ran
        if ran == n:
            return f"{self.status} (all {n} checks ran)"
        return f"{self.status} ({ran} of {n} checks ran; {n - ran} skipped: see reasons)"

    def all_notes(self) -> list[str]:
        """:attr:`notes`, and, when some checks were skipped, the caveat that a skipped check is not a pass."""
        skipped = len(self.checks) - self.n_ran
        if not skipped:
            return list(self.notes)
        return [*self.notes, f"{skipped} of {len(self.checks)} checks were skipped (each row gives why): a skipped "
                             "check is not a pass; the overall status rests on the "
                             f"{self.n_ran} that ran"]

    def as_dict(self) -> dict[str, Any]:
        """The JSON report; ``tool`` (:data:`REPORT_TOOL`) marks a file as one ``check`` wrote."""
        from critic_audit.version import __version__

        return {"tool": REPORT_TOOL, "version": __version__, "status": self.status,
                "overall": self.overall(), "n_trajectories": self.n_trajectories,
                "checks_ran": self.n_ran, "checks_total": len(self.checks),
                "checks_by_status": self.counts_by_status(), "checks": [c.as_dict() for c in self.checks],
                "notes": self.all_notes(), "config": dict(self.config), "input": dict(self.input)}

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
    """What the checks share: config, and (with a tokenizer) the template's turn markers (None, with
    ``markers_reason``, when there are none or the tokenizer does not match the data: ``mismatch``)."""

    config: CheckConfig
    tokenizer: Any = None
    chat_template: str | None = None
    markers: TurnMarkers | None = None
    markers_reason: str = "needs --tokenizer (the chat template's turn tokens)"
    #: why the tokenizer was judged not to be the one of these token ids (None: no such judgement);
    #: every check that reads the template or decodes the data's ids then skips with this reason
    mismatch: str | None = None
    #: the rollouts as flat columns (:class:`critic_audit.check.columns.Columns`), built once per run
    columns: Any = None

    def decode(self, token_id: int) -> str:
        if self.tokenizer is None:
            return str(token_id)
        return repr(self.tokenizer.decode([int(token_id)]))
