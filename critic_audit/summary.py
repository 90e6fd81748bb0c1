"""The product of ``analyze``, typed: :class:`AuditSummary`, what ``summary.json`` holds.

``summary.json`` stays a JSON object with the keys documented in ``docs/audit.md``; this module gives
every key one owner (a field of one frozen dataclass) and reads and writes the file:

* :class:`AuditSummary` (one critic): the headline (``eta2_median`` and the other medians), the
  fractions (:class:`Fraction`), :class:`Coverage`, :class:`Boundary`, :class:`CriticQuality` with its
  :class:`QualityGate`, the breakdowns (``by_success``, ``by_source``, ``by_checkpoint``,
  ``by_turn_bucket``, ``breakdowns``: :class:`Breakdown` rows), the :class:`Recommendation`, and
  :class:`RunInfo` (inputs, version, timing, what the readers did, how the critic ran);
* several critics on the same rollouts: ``comparison`` (:class:`CriticComparison`: ``critics``,
  ``by_critic``, ``per_critic``) and :class:`RunInfo`; the single-critic fields are None.

The parts are built where their figures are computed (:mod:`critic_audit.analysis.audit`,
:func:`critic_audit.analysis.quality.quality_gate`); the pipeline adds :class:`RunInfo` with
:func:`dataclasses.replace`. A part built in code writes its declared keys in order (:meth:`Part.written`
says which optional ones); :meth:`AuditSummary.to_json` / :meth:`AuditSummary.from_json` round-trip every
``summary.json`` the tool writes, byte for byte (key order as read; a key the types do not declare is
kept in ``extra``).
``summary_version`` is :data:`SUMMARY_VERSION`; a summary without it is the previous release's (the
same layout) and is read as is; a newer version is refused in one line.

Layering: ``summary -> errors`` (no polars, no torch): every layer may read a summary.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from critic_audit.errors import SchemaError

__all__ = ["format_p", "no_credit_reasons", "SUMMARY_VERSION", "RUN_KEYS", "AuditSummary", "Interval", "Tested", "Fraction", "Share", "Coverage", "Boundary",
           "Truncation", "QualityGate", "FitOverlap", "CriticQuality", "PooledVerdict", "Recommendation", "Breakdown",
           "InputReport", "SourceSample", "Sample", "RunInfo",
           "PerCritic", "CriticComparison", "read_summary", "is_summary"]

#: The layout version written as ``summary_version`` (absent: the previous release, the same layout).
SUMMARY_VERSION = 1


def format_p(p: float | None) -> str:
    """A p-value as text: ``"< 0.001"`` below 0.001, else 3 decimals (``"0.003"``); ``"n/a"`` for None.
    The gate's permutation p is at least ``1 / (n_perm + 1)`` (0.0005 at 2,000 permutations), so "0.000"
    would claim more than the test can show."""
    if p is None:
        return "n/a"
    return "< 0.001" if p < 0.001 else f"{p:.3f}"


#: the verdicts that give no credit recommendation because of the critic or the data (their reasons say why)
NO_CREDIT_VERDICTS = ("critic_too_weak", "not_enough_data", "quality_unmeasured", "no_data")


def no_credit_reasons(by_checkpoint: Mapping[str, Any] | None) -> list[tuple[str, str, tuple[str, ...]]]:
    """``(checkpoint, verdict, reasons)`` of each breakdown row of ``by_checkpoint`` (name ->
    :class:`Breakdown`) whose verdict is one of :data:`NO_CREDIT_VERDICTS`, in order: the failed gate
    conditions (``critic_quality.gate.reasons``) that the table by checkpoint has no room for."""
    out = []
    for k, b in (by_checkpoint or {}).items():
        rec = getattr(b, "recommendation", None)
        if rec is None or rec.verdict not in NO_CREDIT_VERDICTS or getattr(b, "low_n", False):
            continue
        gate = b.critic_quality.gate if b.critic_quality and b.critic_quality.gate else None
        reasons = tuple(rec.reasons or (gate.reasons if gate else ()))
        out.append((str(k), rec.verdict, reasons))
    return out


def _strip_optional(tp: Any) -> Any:
    """``X | None`` -> ``X`` (other unions are kept)."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return tp


def _parse(tp: Any, value: Any, where: str) -> Any:
    """``value`` (as JSON holds it) as the type ``tp``: a :class:`Part`, a ``dict[str, Part]``, a tuple."""
    tp = _strip_optional(tp)
    if value is None:
        return None
    if isinstance(tp, type) and issubclass(tp, Part):
        if not isinstance(value, Mapping):
            raise SchemaError(f"summary key {where} is {type(value).__name__}, expected an object",
                              fix="pass a summary.json written by critic-audit analyze")
        return tp.from_dict(value, where=where)
    origin = typing.get_origin(tp)
    if origin is dict and isinstance(value, Mapping):
        _, vt = typing.get_args(tp)
        return {k: _parse(vt, v, f"{where}.{k}") for k, v in value.items()}
    if origin is tuple and isinstance(value, list):
        args = typing.get_args(tp)
        inner = args[0] if args else Any
        return tuple(_parse(inner, v, f"{where}[]") for v in value)
    return value


def _emit(value: Any) -> Any:
    """The JSON form of a parsed value (the inverse of :func:`_parse`)."""
    if isinstance(value, Part):
        return value.to_dict()
    if isinstance(value, tuple):
        return [_emit(v) for v in value]
    if isinstance(value, dict):
        return {k: _emit(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_emit(v) for v in value]
    return value


@dataclasses.dataclass(frozen=True)
class Part:
    """A typed part of a summary: each declared field owns the JSON key of its name.

    :meth:`from_dict` keeps the keys in the order read and any key the type does not declare
    (``extra``), so that :meth:`to_dict` gives back the same object; a part built in code writes its
    declared fields in order, absent (None) optional ones left out."""

    #: Fields left out when None (optional keys of the layout).
    OPTIONAL: ClassVar[tuple[str, ...]] = ()

    def written(self, name: str) -> bool:
        """Whether the declared field ``name`` is a key of this part as built in code (not read): every
        field but an :attr:`OPTIONAL` one that is None. A part may say more (:meth:`RunInfo.written`)."""
        return name not in self.OPTIONAL or getattr(self, name) is not None

    @classmethod
    def _implied(cls, d: Mapping[str, Any]) -> dict[str, Any]:
        """Fields that are no key of their own, as a read object implies them (none by default)."""
        return {}

    @property
    def extra(self) -> Mapping[str, Any]:
        """Keys read that this type does not declare (kept, written back as read)."""
        return getattr(self, "_extra", {})

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, where: str = "summary") -> Any:
        hints = typing.get_type_hints(cls)
        names = {f.name for f in dataclasses.fields(cls) if f.metadata.get("json", True)}
        kwargs = {k: _parse(hints[k], v, f"{where}.{k}") for k, v in d.items() if k in names}
        obj = cls(**kwargs, **cls._implied(d))
        object.__setattr__(obj, "_order", tuple(d))
        object.__setattr__(obj, "_extra", {k: v for k, v in d.items() if k not in names})
        return obj

    def to_dict(self) -> dict[str, Any]:
        order = getattr(self, "_order", None)
        if order is None:
            order = tuple(f.name for f in dataclasses.fields(self) if f.metadata.get("json", True) and self.written(f.name))
        extra = self.extra
        return {k: (_emit(getattr(self, k)) if k not in extra else extra[k]) for k in order}


# --------------------------------------------------------------------------------------------- figures


@dataclasses.dataclass(frozen=True)
class Interval(Part):
    """An estimate with its 95 % bootstrap interval (``ci95``: ``(low, high)``, None when it cannot be
    computed); ``p_value`` where a test goes with it (the gate's within-source correlation);
    ``n_clusters`` when the bootstrap resampled whole clusters (groups / tasks) instead of trajectories
    (absent: trajectories)."""

    estimate: float | None = None
    ci95: tuple[float, float] | None = None
    p_value: float | None = None
    n_clusters: int | None = None
    OPTIONAL: ClassVar[tuple[str, ...]] = ("p_value", "n_clusters")


@dataclasses.dataclass(frozen=True)
class Tested(Interval):
    """An :class:`Interval` with the p-value of its test, a key even when None (the gate's within-source
    correlation: ``p_value`` null where the permutation test did not run)."""

    OPTIONAL: ClassVar[tuple[str, ...]] = ("n_clusters",)


@dataclasses.dataclass(frozen=True)
class Fraction(Part):
    """A share of trajectories: ``k`` of ``n``, with its Wilson 95 % interval. With clusters (groups /
    tasks holding several trajectories) the interval is Wilson's at the effective sample size
    ``n_effective = n / design_effect`` (both keys then present; absent: independent trajectories).
    ``widened`` (with clusters): the interval was widened to the one all-agreeing data would give at
    ``widened_to_n_effective = n^2 / sum_c n_c^2`` trajectories (present only then), so it is not Wilson's at
    ``n_effective``."""

    estimate: float | None = None
    ci95: tuple[float, float] | None = None
    k: int = 0
    n: int = 0
    design_effect: float | None = None
    n_effective: float | None = None
    widened: bool | None = None
    widened_to_n_effective: float | None = None
    OPTIONAL: ClassVar[tuple[str, ...]] = ("design_effect", "n_effective", "widened", "widened_to_n_effective")


@dataclasses.dataclass(frozen=True)
class Share(Part):
    """``audited`` of ``read`` (``share``: their ratio, None when nothing was read)."""

    audited: int = 0
    read: int = 0
    share: float | None = None


@dataclasses.dataclass(frozen=True)
class Coverage(Part):
    """What share of the rollouts the headline rests on (``analysis.audit.coverage``)."""

    trajectories: Share | None = None
    turns: Share | None = None
    tokens: Share | None = None
    low: bool = False
    warning: str | None = None
    #: ``--lenient``: copies of rollouts (same id and content in another file) dropped before the audit,
    #: each rollout read once (``input.notes.duplicate_trajectories``); absent when none
    duplicates_dropped: int | None = None
    OPTIONAL: ClassVar[tuple[str, ...]] = ("duplicates_dropped",)


@dataclasses.dataclass(frozen=True)
class Boundary(Part):
    """Value changes at turn boundaries against those within turns."""

    share_of_abs_variation: float | None = None
    mean_boundary_over_mean_within_step: float | None = None
    n_boundary_steps: int = 0
    n_within_steps: int = 0
    #: 95% bootstrap intervals of the two ratios (ratios of sums over the included trajectories),
    #: resampling ``resampled`` (``"trajectories"`` or ``"clusters"``: the headline's unit); absent in older
    #: summaries and where the ratio is undefined or fewer than 2 units are audited
    share_ci95: tuple[float, float] | None = None
    step_ratio_ci95: tuple[float, float] | None = None
    resampled: str | None = None
    OPTIONAL: ClassVar[tuple[str, ...]] = ("share_ci95", "step_ratio_ci95", "resampled")


@dataclasses.dataclass(frozen=True)
class Truncation(Part):
    """What the length limit cut: trajectories, later turns and policy tokens; the limit and what set it."""

    trajectories: int = 0
    turns: int = 0
    policy_tokens: int = 0
    max_length: int | None = None
    cut_by: str | None = None
    critic_context: int | None = None
    OPTIONAL: ClassVar[tuple[str, ...]] = ("max_length", "cut_by", "critic_context")


@dataclasses.dataclass(frozen=True)
class QualityGate(Part):
    """The critic-quality gate (``analysis.quality.quality_gate``): ``status`` (passed, failed,
    unmeasured, not_enough_data) with its ``reasons``, within-source correlation and explained variance;
    ``resampled`` the unit its bootstrap intervals and permutation test resampled (``"trajectories"``,
    or ``"clusters"``: whole groups / tasks, ``n_clusters`` of them; absent when they did not run)."""

    passed: bool = False
    n_trajectories: int = 0
    n_positive: int = 0
    n_negative: int = 0
    thresholds: dict[str, float] | None = None
    n_strata: int | None = None
    corr_within_stratum: Tested | None = None
    explained_variance_within_stratum: Interval | None = None
    resampled: str | None = None
    n_clusters: int | None = None
    status: str | None = None
    reasons: tuple[str, ...] = ()
    OPTIONAL: ClassVar[tuple[str, ...]] = ("resampled", "n_clusters")


@dataclasses.dataclass(frozen=True)
class FitOverlap(Part):
    """The audited trajectories that are the critic's own fit data (``fit-critic`` records them): how
    many, how many are held out (the gate judges the critic on those only), and a sentence saying so."""

    n_in_fit_data: int = 0
    n_held_out: int = 0
    note: str = ""


@dataclasses.dataclass(frozen=True)
class CriticQuality(Part):
    """How well the critic's values predict the outcome: explained variance over tokens, correlation
    of the mean value with the reward, the gate (per source too, when there are several), and the
    overlap with the critic's own fit data."""

    explained_variance: float | None = None
    corr_mean_value_reward: float | None = None
    n_trajectories: int = 0
    n_tokens: int = 0
    fit_overlap: FitOverlap | None = None
    gate: QualityGate | None = None
    by_source: dict[str, QualityGate] | None = None
    OPTIONAL: ClassVar[tuple[str, ...]] = ("fit_overlap", "by_source")


@dataclasses.dataclass(frozen=True)
class PooledVerdict(Part):
    """With several checkpoints, the verdict of the pooled numbers, kept beside the latest checkpoint's:
    never confident (``mixes_critics``), ``confident_if_one_critic`` what it would have been."""

    verdict: str | None = None
    confident: bool = False
    mixes_critics: bool = True
    confident_if_one_critic: bool = False


@dataclasses.dataclass(frozen=True)
class Recommendation(Part):
    """The verdict (``CONFIDENT_VERDICTS`` recommend a credit granularity; any other says why none is
    given), its sentence, its reasons (for a credit verdict, the deciding figures with their 95%
    intervals against the thresholds) and the thresholds it applied; ``inconclusive`` (an interval
    contains its threshold) adds ``leans``, the point estimates' verdict; with several checkpoints the
    latest's, the pooled verdict beside it."""

    verdict: str | None = None
    confident: bool = False
    text: str = ""
    reasons: tuple[str, ...] = ()
    thresholds: dict[str, float] | None = None
    leans: str | None = None
    checkpoint: str | None = None
    pooled: PooledVerdict | None = None
    OPTIONAL: ClassVar[tuple[str, ...]] = ("leans", "checkpoint", "pooled")


@dataclasses.dataclass(frozen=True)
class Breakdown(Part):
    """One row of a breakdown (by success, source, checkpoint, turn bucket, ``--group-by`` column,
    critic): counts, median eta2 and the SS_B > SS_W fraction; a checkpoint row adds its critic's
    quality and verdict (None below ``min_group_n``)."""

    n: int = 0
    n_included: int = 0
    low_n: bool = False
    eta2_median: Interval | None = None
    frac_ss_between_gt_within: Fraction | None = None
    critic_quality: CriticQuality | None = None
    frac_var_turn_means_gt_mean_within_var: Fraction | None = None
    frac_f_gt_1: Fraction | None = None
    recommendation: Recommendation | None = None
    #: A checkpoint row judged on its own (several checkpoints): ``recommendation`` is a key, None (null)
    #: below ``min_group_n``; no key of its own (read: whether the row has ``recommendation``).
    judged: bool = dataclasses.field(default=False, metadata={"json": False})
    OPTIONAL: ClassVar[tuple[str, ...]] = ("critic_quality", "frac_var_turn_means_gt_mean_within_var", "frac_f_gt_1",
                                           "recommendation")

    def written(self, name: str) -> bool:
        return (name == "recommendation" and self.judged) or super().written(name)

    @classmethod
    def _implied(cls, d: Mapping[str, Any]) -> dict[str, Any]:
        return {"judged": "recommendation" in d}


@dataclasses.dataclass(frozen=True)
class InputReport(Part):
    """What the readers did (``io.records.ReadReport.as_dict``): the format per input, records and
    files skipped per reason with examples, and notes."""

    formats: dict[str, str] | None = None
    skipped: dict[str, int] | None = None
    skipped_total: int = 0
    skipped_examples: dict[str, Any] | None = None
    skipped_files: dict[str, int] | None = None
    skipped_files_total: int = 0
    skipped_file_examples: dict[str, Any] | None = None
    skipped_file_list: tuple[dict[str, Any], ...] | None = None
    records: dict[str, Any] | None = None
    notes: dict[str, int] | None = None
    OPTIONAL: ClassVar[tuple[str, ...]] = ("skipped_file_list", "records")


@dataclasses.dataclass(frozen=True)
class SourceSample(Part):
    """One source's trajectories in a ``--limit`` sample: read and kept."""

    read: int = 0
    kept: int = 0


@dataclasses.dataclass(frozen=True)
class Sample(Part):
    """The ``--limit`` sample (``pipeline.analyze.limit_sample``): the limit, its seed, trajectories
    read and kept (in all and ``by_source``), what it was stratified by, and the sources that got at
    least one trajectory and those that got none."""

    limit: int | None = None
    seed: int | None = None
    trajectories_read: int = 0
    trajectories_kept: int = 0
    stratified_by: str | None = None
    by_source: dict[str, SourceSample] | None = None
    sources_sampled: tuple[str, ...] = ()
    sources_not_sampled: tuple[str, ...] = ()

    @property
    def left_out(self) -> bool:
        """The sample left trajectories out (a ``--limit`` below the trajectories read)."""
        return (self.trajectories_kept or 0) < (self.trajectories_read or 0)


@dataclasses.dataclass(frozen=True)
class RunInfo(Part):
    """The run behind a summary: inputs, tool version, seconds, what the readers did, how the critic ran
    (``inference``: None when the values came with the input), warnings, the ``--limit`` sample (None:
    every trajectory), and for a streamed audit (docs/audit.md) ``streamed`` True and ``tokens_source``
    ``"tokens.parquet"`` when ``--keep-tokens`` wrote the tokens beside it (None: no tokens written)."""

    inference: dict[str, Any] | None = None
    warnings: tuple[str, ...] | None = None
    inputs: tuple[str, ...] = ()
    critic_audit_version: str | None = None
    tokens_source: str | None = None
    streamed: bool | None = None
    seconds: float | None = None
    input: InputReport | None = None
    limit: Sample | None = None
    summary_version: int | None = None
    OPTIONAL: ClassVar[tuple[str, ...]] = ("warnings", "tokens_source", "streamed", "seconds", "input",
                                           "summary_version")

    def written(self, name: str) -> bool:
        """As built: ``inference``, ``inputs``, ``critic_audit_version`` and ``limit`` always (null: none),
        ``tokens_source`` in a streamed audit's (null: no tokens written), the others when set."""
        return (name == "tokens_source" and bool(self.streamed)) or super().written(name)


@dataclasses.dataclass(frozen=True)
class PerCritic(Part):
    """One critic's headline in a comparison (its full summary is ``critics/<label>/summary.json``)."""

    n_included: int = 0
    eta2_median: Interval | None = None
    frac_ss_between_gt_within: Fraction | None = None
    frac_f_gt_1: Fraction | None = None
    omega2_median: float | None = None
    critic_quality: CriticQuality | None = None
    recommendation: Recommendation | None = None
    inference: dict[str, Any] | None = None
    excluded: dict[str, int] | None = None
    coverage: Coverage | None = None


@dataclasses.dataclass(frozen=True)
class CriticComparison(Part):
    """Several critics on the same rollouts: their labels, the rollouts, ``by_critic`` (median eta2 and
    fraction per critic, with intervals) and ``per_critic`` (each critic's headline)."""

    critics: tuple[str, ...] = ()
    n_trajectories: int = 0
    by_critic: dict[str, Breakdown] | None = None
    per_critic: dict[str, PerCritic] | None = None


# --------------------------------------------------------------------------------------------- summary

#: The top-level keys :class:`RunInfo` owns, in the order they are written.
RUN_KEYS = tuple(f.name for f in dataclasses.fields(RunInfo))
_COMPARISON_KEYS = tuple(f.name for f in dataclasses.fields(CriticComparison))
#: Keys every ``summary.json`` that ``analyze`` writes carries, this release and the previous one (no
#: ``summary_version``): one critic's (:func:`critic_audit.analysis.audit.audit`'s summary) and a
#: comparison of several critics'. :meth:`AuditSummary.from_json` refuses an object without them.
_SINGLE_REQUIRED = ("n_trajectories", "n_included", "eta2_median", "recommendation")
_COMPARISON_REQUIRED = ("critics", "n_trajectories", "per_critic")


def _required_keys(doc: Mapping[str, Any]) -> tuple[str, ...]:
    """The keys every summary of ``doc``'s kind carries (a comparison's when it has ``critics``)."""
    return _COMPARISON_REQUIRED if "critics" in doc else _SINGLE_REQUIRED


def is_summary(doc: Any) -> bool:
    """``doc`` (a parsed JSON value) is a ``summary.json`` that ``analyze`` wrote: an object with
    ``summary_version``, or with every key :meth:`AuditSummary.from_json` requires (one critic's or a
    comparison's). What the readers use to name such a file given as rollouts; no key is validated."""
    if not isinstance(doc, Mapping):
        return False
    return "summary_version" in doc or all(k in doc for k in _required_keys(doc))


@dataclasses.dataclass(frozen=True)
class AuditSummary(Part):
    """``summary.json`` of ``analyze`` (module docstring). Single-critic fields are None in a comparison
    of several critics (``comparison``); ``run`` owns the keys about the run."""

    truncated: Truncation | None = None
    scope: str | None = None
    n_trajectories: int | None = None
    n_included: int | None = None
    excluded: dict[str, int] | None = None
    n_turns_included: int | None = None
    n_tokens_included: int | None = None
    coverage: Coverage | None = None
    eta2_median: Interval | None = None
    frac_ss_between_gt_within: Fraction | None = None
    frac_var_turn_means_gt_mean_within_var: Fraction | None = None
    frac_f_gt_1: Fraction | None = None
    omega2_median: float | None = None
    icc1_median: float | None = None
    f_stat_median: float | None = None
    #: the medians of omega2, ICC(1) and F with their 95% bootstrap intervals (keys ``omega2``, ``icc1``,
    #: ``f_stat``), over the headline's unit (trajectories or clusters); absent in older summaries
    medians_ci: dict[str, Interval] | None = None
    boundary: Boundary | None = None
    critic_quality: CriticQuality | None = None
    by_success: dict[str, Breakdown] | None = None
    by_source: dict[str, Breakdown] | None = None
    by_checkpoint: dict[str, Breakdown] | None = None
    by_turn_bucket: dict[str, Breakdown] | None = None
    breakdowns: dict[str, dict[str, Breakdown]] | None = None
    min_group_n: int | None = None
    paper_reference: dict[str, float] | None = None
    recommendation: Recommendation | None = None
    template_system: dict[str, Any] | None = None
    run: RunInfo = dataclasses.field(default_factory=RunInfo)
    comparison: CriticComparison | None = None
    OPTIONAL: ClassVar[tuple[str, ...]] = ("truncated", "breakdowns", "medians_ci")

    @property
    def sample_text(self) -> str | None:
        """The ``--limit`` sample (``run.limit``) as words, e.g. ``a sample of 20 of 160 trajectories read
        (--limit, stratified by source, seed 0)``, then the sources that got no trajectory (the first 5 named;
        ``; no trajectory from 9 of 17 sources: a, b, c, d, e and 4 more``); None when every trajectory read was audited (no limit)."""
        lim = self.run.limit
        if not lim or not lim.left_out:
            return None  # the limit left nothing out: no sample (see unsampled_text)
        none = list(lim.sources_not_sampled or ())
        missed = (f"; no trajectory from {len(none)} of {len(lim.by_source or none)} sources: "
                  + ", ".join(none[:5]) + (f" and {len(none) - 5} more" if len(none) > 5 else "")) if none else ""
        return (f"a sample of {lim.trajectories_kept} of {lim.trajectories_read} trajectories read "
                f"(--limit, stratified by {lim.stratified_by or 'source'}, seed {lim.seed}){missed}")

    @property
    def unsampled_text(self) -> str | None:
        """A ``--limit`` that left nothing out as words, e.g. ``no sampling needed: --limit 100 covers all
        24 trajectories read``; None without a limit or when it drew a sample (:attr:`sample_text`)."""
        lim = self.run.limit
        if not lim or self.sample_text is not None:
            return None
        return (f"no sampling needed: --limit {lim.limit} covers all {lim.trajectories_read} "
                "trajectories read")

    @property
    def pooled_text(self) -> str | None:
        """``pooled over all checkpoints: different critics`` when the headline pools several checkpoints
        (``by_checkpoint`` has more than one: each checkpoint's critic is a different critic); None otherwise."""
        return "pooled over all checkpoints: different critics" if len(self.by_checkpoint or {}) > 1 else None

    @property
    def is_comparison(self) -> bool:
        """Several critics compared (``critics/<label>/`` hold each one's summary)."""
        return self.comparison is not None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, where: str = "summary") -> AuditSummary:
        """The summary of a ``summary.json`` object (as :func:`json.load` returns it).

        Raises:
            SchemaError: a key holds the wrong kind of value, or a newer ``summary_version``.
        """
        version = d.get("summary_version")
        if version is not None and (not isinstance(version, int) or version > SUMMARY_VERSION):
            raise SchemaError(f"summary_version {version!r} is newer than this critic-audit reads ({SUMMARY_VERSION})",
                              fix="read it with the critic-audit version that wrote it, or re-run analyze")
        comparing = "critics" in d
        own = {k: v for k, v in d.items() if k not in RUN_KEYS and not (comparing and k in _COMPARISON_KEYS)}
        names = {f.name for f in dataclasses.fields(cls)} - {"run", "comparison"}
        hints = typing.get_type_hints(cls)
        kwargs = {k: _parse(hints[k], v, f"{where}.{k}") for k, v in own.items() if k in names}
        run = RunInfo.from_dict({k: v for k, v in d.items() if k in RUN_KEYS}, where=where)
        comparison = CriticComparison.from_dict({k: v for k, v in d.items() if k in _COMPARISON_KEYS}, where=where) \
            if comparing else None
        obj = cls(**kwargs, run=run, comparison=comparison)
        object.__setattr__(obj, "_order", tuple(d))
        object.__setattr__(obj, "_extra", {k: v for k, v in own.items() if k not in names})
        return obj

    def to_dict(self) -> dict[str, Any]:
        parts = {**self.run.to_dict(), **(self.comparison.to_dict() if self.comparison else {})}
        order = getattr(self, "_order", None)
        if order is None:  # built in code: a comparison's keys (its run has no inference: each critic's is in
            if self.comparison:  # per_critic), or one critic's declared keys (see Part.written)
                run = {k: v for k, v in self.run.to_dict().items() if not (k == "inference" and v is None)}
                return {**self.comparison.to_dict(), **run}
            mine = super().to_dict()
            mine.pop("run", None)
            mine.pop("comparison", None)
            return {**mine, **parts}
        extra = self.extra
        out = {}
        for k in order:
            if k in parts:
                out[k] = parts[k]
            elif k in extra:
                out[k] = extra[k]
            else:
                out[k] = _emit(getattr(self, k))
        return out

    def to_json(self) -> str:
        """``summary.json``'s text, as the tool writes it (2-space indent, a final newline)."""
        return json.dumps(self.to_dict(), indent=2, default=str, allow_nan=False) + "\n"

    @classmethod
    def from_json(cls, text: str, *, path: str | Path | None = None) -> AuditSummary:
        """Parse ``summary.json``'s text.

        Raises:
            SchemaError: not a JSON object, an object without the keys every summary carries
                (``n_trajectories``, ``n_included``, ``eta2_median``, ``recommendation``; a comparison:
                ``critics``, ``n_trajectories``, ``per_critic``), a key of the wrong kind, or a newer
                ``summary_version``.
        """
        try:
            d = json.loads(text)
        except ValueError as e:
            raise SchemaError(f"not JSON ({e})", path=path, fix="pass a summary.json written by critic-audit analyze") from None
        if not isinstance(d, dict):
            raise SchemaError(f"a summary is a JSON object, not {type(d).__name__}", path=path,
                              fix="pass a summary.json written by critic-audit analyze")
        required = _required_keys(d)
        missing = [k for k in required if k not in d]
        if missing:
            raise SchemaError(f"not a critic-audit summary: no {', '.join(missing)} key"
                              f"{'s' if len(missing) > 1 else ''} (every summary.json analyze writes has "
                              f"{', '.join(required)})", path=path,
                              fix="pass the summary.json of a critic-audit analyze --out folder")
        try:
            return cls.from_dict(d)
        except SchemaError as e:
            if path is None or e.path is not None:
                raise
            raise SchemaError(e.problem, path=path, fix=e.fix) from None

    def with_version(self) -> AuditSummary:
        """This summary with ``summary_version`` set (what the tool writes)."""
        run = RunInfo.from_dict({**self.run.to_dict(), "summary_version": SUMMARY_VERSION})
        obj = dataclasses.replace(self, run=run)
        order = getattr(self, "_order", None)
        if order is not None:
            object.__setattr__(obj, "_order", order if "summary_version" in order else (*order, "summary_version"))
            object.__setattr__(obj, "_extra", self.extra)
        return obj


def read_summary(path: str | Path) -> AuditSummary:
    """:meth:`AuditSummary.from_json` of a file.

    Raises:
        InputError: the file cannot be read. SchemaError: it is not a summary.
    """
    from critic_audit.errors import InputError

    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise InputError(f"cannot read the summary ({e.strerror or e})", path=p,
                         fix="pass the --out folder of critic-audit analyze") from None
    return AuditSummary.from_json(text, path=p)
