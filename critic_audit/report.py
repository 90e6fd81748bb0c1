"""Render an audit output folder: every plot, ``report.md`` and a self-contained ``report.html``.

Used by ``critic-audit analyze`` (into its temporary folder before the swap) and by
``critic-audit plot`` (re-render a saved folder without running the critic again). The report's
sentences live here; its numbers are read from the typed summary (:class:`critic_audit.AuditSummary`;
a ``summary.json`` dict is accepted and read as one).
"""

from __future__ import annotations

import base64
import html
import re
from collections.abc import Collection
from pathlib import Path
from typing import Any

import polars as pl

from critic_audit.summary import (
    AuditSummary, Boundary, Breakdown, Coverage, CriticQuality, Fraction, Interval, QualityGate, Recommendation, Share,
    format_p, no_credit_reasons,
)

PLOTS = (
    ("value_traces", "Value along a successful and a failed trajectory, turns shaded (the MPO paper's Figure 2)"),
    ("value_grid", "Value traces of several successes and failures"),
    ("eta2_hist", "Distribution of per-trajectory eta2, median marked"),
    ("eta2_ecdf", "eta2 ECDF by success"),
    ("eta2_box", "eta2 per checkpoint / critic"),
    ("step_distributions", "Value steps at turn boundaries vs inside turns"),
    ("turn_position", "Mean value by turn position, successes vs failures"),
)

#: Plots drawn only for some audits (several checkpoints).
EXTRA_PLOTS = {"eta2_ev_by_checkpoint": "Median eta2 and explained variance by checkpoint, with 95% intervals"}


def _typed(summary: AuditSummary | dict[str, Any]) -> AuditSummary:
    """``summary`` as an :class:`AuditSummary` (a ``summary.json`` dict is read as one)."""
    return summary if isinstance(summary, AuditSummary) else AuditSummary.from_dict(summary)


def render_plots(folder: Path, tokens: pl.DataFrame | pl.LazyFrame, per_trajectory: pl.DataFrame, *,
                 box_by: str | None = None, summary: AuditSummary | dict[str, Any] | None = None,
                 turns: pl.DataFrame | None = None, steps: Any = None,
                 stems: Collection[str] | None = None) -> list[str]:
    """Write every plot (PNG and SVG) under ``folder/plots``, or only those named in ``stems``; returns
    the stems written, in :data:`PLOTS` order.

    With a ``summary`` holding several checkpoints, also ``eta2_ev_by_checkpoint``. A streamed audit
    passes its aggregates: ``tokens`` then holds only the traced trajectories' tokens, ``turns`` the
    turn means (:func:`critic_audit.analysis.monitor.turn_means`' columns) and ``steps`` the value-step
    histogram (:class:`critic_audit.analysis.stream.StepHistogram`)."""
    import matplotlib.pyplot as plt

    from critic_audit import plots as P

    if box_by is None:
        box_by = "critic" if "critic" in per_trajectory.columns else "checkpoint"
    out = folder / "plots"
    makers = {
        "value_traces": lambda: P.plot_value_traces(tokens, per_trajectory, out / "value_traces"),
        "value_grid": lambda: P.plot_value_grid(tokens, per_trajectory, out / "value_grid"),
        "eta2_hist": lambda: P.plot_eta2_hist(per_trajectory, out / "eta2_hist"),
        "eta2_ecdf": lambda: P.plot_eta2_ecdf(per_trajectory, "success", out / "eta2_ecdf"),
        "eta2_box": lambda: P.plot_eta2_box(per_trajectory, box_by, out / "eta2_box"),
        "step_distributions": lambda: P.plot_step_distributions(tokens, per_trajectory, out / "step_distributions",
                                                                steps=steps),
        "turn_position": lambda: P.plot_turn_position(tokens, per_trajectory, out / "turn_position", turns=turns),
    }
    by_ckpt = (_typed(summary).by_checkpoint or {}) if summary else {}
    if len(by_ckpt) > 1:
        makers["eta2_ev_by_checkpoint"] = lambda: P.plot_eta2_ev_by_checkpoint(by_ckpt, out / "eta2_ev_by_checkpoint")
    written = []
    for stem, make in makers.items():
        if stems is not None and stem not in stems:
            continue
        plt.close(make())
        written.append(stem)
    return written


def _ci(d: Interval | Fraction | None, pct: bool = False) -> str:
    if d is None or d.estimate is None:
        return "n/a"
    f = (lambda x: f"{100 * x:.1f}%") if pct else (lambda x: f"{x:.3f}")
    lo, hi = d.ci95 or (None, None)
    kn = f" ({d.k} of {d.n})" if pct and isinstance(d, Fraction) else ""
    return (f"{f(d.estimate)}{kn} (95% CI {f(lo)} to {f(hi)})" if lo is not None else f(d.estimate) + kn)


def _plural(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def _n(x: Any, spec: str = ".3f") -> str:
    return "n/a" if x is None else format(x, spec)


_MD_SPECIAL = re.compile(r"([\\`*_\[\]<>#!|~])")


def md_escape(label: Any) -> str:
    """A label (checkpoint, source, group value, id, path) as literal Markdown text on one line:
    line breaks become spaces and every Markdown control character is backslash-escaped, so no
    label can form an image, a link, a heading or a table cell boundary."""
    text = " ".join(str(label).splitlines()) if label is not None else "unknown"
    return _MD_SPECIAL.sub(r"\\\1", text.replace("\t", " "))


def _fmt_cov(e: Share | None, what: str) -> str:
    if e is None or not e.read:
        return f"{e.audited if e else 0} {what}"
    return f"{e.audited} of {e.read} {what} ({100 * e.share:.1f}%)"


def _gate_lines(q: CriticQuality | None, title: str = "Quality gate") -> list[str]:
    q = q or CriticQuality()
    g = q.gate or QualityGate()
    c = g.corr_within_stratum or Interval()
    e = g.explained_variance_within_stratum
    status = g.status or "unmeasured"
    th = g.thresholds or {}
    lines = [f"{title}: **{status.replace('_', ' ')}** ({g.n_positive} higher-outcome and "
             f"{g.n_negative} lower-outcome trajectories judged, {g.n_strata or 0} "
             f"source/checkpoint strata).", ""]
    lines += ["| measure | value |", "|---|---|",
              f"| corr(mean V, reward), within source and checkpoint | {_ci(c)}"
              + (f", permutation p {'= ' if c.p_value >= 0.001 else ''}{format_p(c.p_value)}"
                 if c.p_value is not None else "") + " |",
              f"| explained variance of V against the return, within source and checkpoint | {_ci(e)} |",
              f"| pooled over every token and source, in-sample point estimates (not the gate's figures; "
              f"for reference) | EV {_n(q.explained_variance)}, corr {_n(q.corr_mean_value_reward)} |", ""]
    if th:
        lines.append(f"Passing needs at least {th.get('min_per_outcome')} trajectories of each outcome, a correlation "
                     f">= {th.get('min_corr')} with one-sided permutation p < {th.get('alpha')}, and an explained "
                     f"variance >= {th.get('min_explained_variance')} whose 95% interval lies above 0.")
    if g.resampled == "clusters":
        lines.append(f"The intervals resample whole clusters ({g.n_clusters} groups / tasks within source and "
                     "checkpoint) and the permutation test permutes within and among clusters: the trajectories of "
                     "one group are not independent evidence.")
    elif g.resampled:
        lines.append("The intervals resample trajectories within source and checkpoint (no group / task holds "
                     "more than one), and the permutation test permutes their rewards.")
    for r in g.reasons:
        lines.append(f"- {md_escape(r)}")
    fo = q.fit_overlap
    if fo:
        lines += ["", f"Fit data: {md_escape(fo.note)}."]
    by = q.by_source or {}
    if by:
        lines += ["", "| source | judged | gate | corr (p) | explained variance |", "|---|---|---|---|---|"]
        for src, gs in by.items():
            cs = gs.corr_within_stratum or Interval()
            lines.append(f"| {md_escape(src)} | {gs.n_trajectories} | {gs.status} | {_ci(cs)}"
                         + (f" (p {format_p(cs.p_value)})" if cs.p_value is not None else "")
                         + f" | {_ci(gs.explained_variance_within_stratum)} |")
    return lines


def _verdict_gate_lines(q: CriticQuality | None, rec: Recommendation, by_ckpt: dict[str, Breakdown],
                        min_n: int, sampled: bool = False) -> list[str]:
    """The quality gate of the data the verdict rests on: the pooled gate, or, when the verdict is the
    latest checkpoint's (several checkpoints: different critics), that checkpoint's gate first and the
    pooled one after it, each labelled."""
    key = rec.checkpoint
    if key is None or key not in by_ckpt:
        return _gate_lines(q)
    row = by_ckpt[key]
    cq = row.critic_quality
    latest = "the latest checkpoint sampled" if sampled else "the latest checkpoint"
    if cq:
        lines = _gate_lines(cq, f"Quality gate of {latest}, {md_escape(key)} (the verdict's data)")
    else:
        lines = [f"Quality gate of {latest}, {md_escape(key)} (the verdict's data): **not measured** "
                 f"({row.n_included} audited trajectories < {min_n}).", ""]
    return [*lines, "", *_gate_lines(q, "Quality gate pooled over all checkpoints (different critics; for "
                                        "reference, not the verdict's)")]


def _c(d: Interval | Fraction | None, pct: bool = False) -> str:
    """Compact ``estimate [lo, hi]`` (fractions: ``k/n [lo%, hi%]``) for wide tables."""
    if d is None or d.estimate is None:
        return "n/a"
    lo, hi = d.ci95 or (None, None)
    if pct:
        head = f"{d.k}/{d.n}" if isinstance(d, Fraction) else f"{100 * d.estimate:.0f}%"
        return head + (f" [{100 * lo:.0f}%, {100 * hi:.0f}%]" if lo is not None else "")
    return f"{d.estimate:.3f}" + (f" [{lo:.2f}, {hi:.2f}]" if lo is not None else "")


def _checkpoint_lines(d: dict[str, Breakdown], min_n: int) -> list[str]:
    lines = ["## By checkpoint (each checkpoint's critic on its own rollouts)", "",
             "Each row: that checkpoint's critic on the rollouts it scored, with its own quality gate; 95% "
             "intervals in brackets (eta2: bootstrap; fractions: Wilson; explained variance: bootstrap).", "",
             "| checkpoint | audited (higher / lower outcome judged) | median eta2 | (a) SS_B > SS_W | (b) | (c) F > 1 | "
             "explained variance | corr (permutation p) | verdict |",
             "|---|---|---|---|---|---|---|---|---|"]
    for k, g in d.items():
        gate = (g.critic_quality.gate if g.critic_quality else None) or QualityGate()
        r = g.recommendation
        verdict = (f"low n (< {min_n}): no verdict" if g.low_n else
                   (r.verdict + (f" (leans {r.leans})" if r.leans else "") if r and r.verdict is not None else "n/a"))
        c = gate.corr_within_stratum or Interval()
        lines.append(f"| {md_escape(k)} | {g.n_included} ({gate.n_positive} / {gate.n_negative}) | {_c(g.eta2_median)} | "
                     f"{_c(g.frac_ss_between_gt_within, True)} | {_c(g.frac_var_turn_means_gt_mean_within_var, True)} | "
                     f"{_c(g.frac_f_gt_1, True)} | {_c(gate.explained_variance_within_stratum)} | "
                     f"{_n(c.estimate)}" + (f" (p {format_p(c.p_value)})" if c.p_value is not None else "")
                     + f" | {verdict} |")
    why = no_credit_reasons(d)
    if why:
        lines += ["", "Why these checkpoints get no credit verdict (the failed quality-gate conditions):", ""]
        lines += [f"- {md_escape(k)}: {v}: {md_escape('; '.join(r) or 'no reason recorded')}" for k, v, r in why]
    return lines


def report_markdown(summary: AuditSummary | dict[str, Any], plots: list[str]) -> str:
    """The audit report as Markdown: verdict, coverage and critic quality first, then the headline
    with intervals, the breakdowns (one-row breakdowns folded into a sentence; rows under the minimum
    n flagged), the exclusions and the plots. Every label is escaped (:func:`md_escape`)."""
    s = _typed(summary)
    rec = s.recommendation or Recommendation()
    by_ckpt = s.by_checkpoint or {}
    several = len(by_ckpt) > 1
    min_n = s.min_group_n if s.min_group_n is not None else 10
    lines = _verdict_lines(s, rec)
    lines += ["", "## Critic quality", "",
              "The structure of a critic's values is evidence for a credit granularity only when the critic "
              "predicts the outcome; a random critic has structure too.", ""]
    sampled = bool(s.run.limit and s.run.limit.left_out)  # --limit left some out
    lines += _verdict_gate_lines(s.critic_quality, rec, by_ckpt, min_n, sampled)
    if several:
        lines += [""] + _checkpoint_lines(by_ckpt, min_n)
        if "eta2_ev_by_checkpoint" in plots:
            lines += ["", "![eta2_ev_by_checkpoint](plots/eta2_ev_by_checkpoint.png)"]
    lines += _headline_lines(s, rec, several)
    lines += _breakdown_lines(s, min_n)
    lines += _exclusion_lines(s)
    lines += _inference_lines(s.run.inference or {})
    lines += ["", "## Plots", ""]
    titles = {**dict(PLOTS), **EXTRA_PLOTS}
    for stem in plots:
        if several and stem == "eta2_ev_by_checkpoint":
            continue  # shown with the table by checkpoint
        lines += [f"### {titles.get(stem, stem)}", "", f"![{stem}](plots/{stem}.png)",
                  "", f"[SVG](plots/{stem}.svg)", ""]
    lines += ["Numbers: [summary.json](summary.json); per-trajectory statistics: trajectories.parquet. "
              "Definitions: docs/audit.md in the critic-audit repository."]
    return "\n".join(lines) + "\n"


def _skipped_input(s: AuditSummary) -> str:
    """The input the readers skipped (``--lenient`` bad records; stray or unreadable files in a
    folder), counted by reason, as a sentence for the coverage line ("" when nothing was skipped)."""
    inp = s.run.input
    if inp is None:
        return ""
    parts = []
    for total, by, one, many in ((inp.skipped_total, inp.skipped, "input record", "input records"),
                                 (inp.skipped_files_total, inp.skipped_files, "input file", "input files")):
        if total:
            why = ", ".join(f"{md_escape(k)}: {v}" for k, v in sorted((by or {}).items()))
            parts.append(f"{total} {one if total == 1 else many} skipped" + (f" ({why})" if why else ""))
    m = sum(v for k, v in (inp.notes or {}).items() if k.startswith("reward_from_success_field"))
    success = (f" Rewards: {m} record{'' if m == 1 else 's'} without a reward field took the reward from the success "
               "field (true -> 1.0, false -> 0.0; `input.notes`).") if m else ""
    d = (inp.notes or {}).get("duplicate_trajectories", 0)
    if d:
        success += (f" Copies: {d} rollout{'' if d == 1 else 's'} repeated another file's id and content (copies of "
                    "one export), dropped: each rollout audited once (`input.notes.duplicate_trajectories`).")
    if not parts:
        return success
    return success + (" Not read: " + "; ".join(parts) + ", not counted above (examples: summary.json, "
            "`input.skipped_examples` / `input.skipped_file_examples`).")


def _verdict_lines(s: AuditSummary, rec: Recommendation) -> list[str]:
    """The report's title, verdict, coverage and warnings."""
    from critic_audit.analysis.audit import coverage_labels  # (not at import: the plot process needs none of it)

    cov = s.coverage or Coverage()
    labels = coverage_labels(s.scope or "assistant")
    verdict = rec.verdict if rec.verdict is not None else "n/a"
    lines = [
        "# Critic audit: between-turn vs within-turn value variance",
        "",
        f"**Verdict: {verdict}** ({'a credit recommendation' if rec.confident else 'no credit recommendation'}). "
        f"{md_escape(rec.text)}",
        *(["", "Reasons:", *[f"- {md_escape(x)}" for x in rec.reasons]] if rec.reasons else []),
        "",
        "**Coverage.** " + (f"{md_escape(s.sample_text[0].upper() + s.sample_text[1:])}; of the sample: "
                            if s.sample_text else f"{md_escape(s.unsampled_text[0].upper() + s.unsampled_text[1:])}: "
                            if s.unsampled_text else "") + "; ".join([_fmt_cov(cov.trajectories, "trajectories"),
                                      _fmt_cov(cov.turns, labels["turns"]),
                                      _fmt_cov(cov.tokens, labels["tokens"])]
                                     + ([f"{s.n_turns_included} {labels['groups']}"]
                                        if s.scope not in (None, "assistant") and s.n_turns_included is not None
                                        else [])) + " audited." + _skipped_input(s),
    ]
    if cov.warning:
        lines += ["", f"**Warning: low coverage.** {md_escape(cov.warning)}."]
    for w in s.run.warnings or ():
        lines += ["", f"**Warning.** {md_escape(w)}"]
    return lines


def _headline_lines(s: AuditSummary, rec: Recommendation, several: bool) -> list[str]:
    """The headline table with its intervals, and the verdict's thresholds."""
    b = s.boundary or Boundary()
    ref = s.paper_reference or {}
    scope = ("policy tokens, one group per assistant turn" if s.scope == "assistant" else
             "every scored token; assistant turns and user/tool/template runs are groups")
    return [
        "",
        "## Headline" + (f" ({s.pooled_text})" if several else ""),
        "",
        "| measure | value |",
        "|---|---|",
        f"| scope | {s.scope} ({scope}) |",
        f"| median eta2 (share of value variance between turns) | {_ci(s.eta2_median)} |",
        f"| (a) trajectories with SS_B > SS_W | {_ci(s.frac_ss_between_gt_within, True)} |",
        f"| (b) var(turn means) > mean within-turn var | {_ci(s.frac_var_turn_means_gt_mean_within_var, True)} |",
        f"| (c) F > 1 | {_ci(s.frac_f_gt_1, True)} |",
        *_structure_rows(s, b),
        f"| MPO paper (arXiv:2610.35013) | median eta2 {ref.get('median_eta2')}, {100 * (ref.get('frac_ss_between_gt_within') or 0):.1f}% with SS_B > SS_W |",
        "",
        _interval_note(s) + " Thresholds of the verdict: "
        + ", ".join(f"{k} = {v}" for k, v in (rec.thresholds or {}).items()) + ".",
    ]


def _structure_rows(s: AuditSummary, b: Boundary) -> list[str]:
    """The headline's rows of omega2 / ICC(1) / F medians and the boundary ratios, each with its 95%
    bootstrap interval where the summary has one, else labelled a point estimate."""
    m = s.medians_ci or {}

    def med(key: str, est: float | None, spec: str = ".3f") -> str:
        iv = m.get(key)
        if iv is not None and iv.ci95 is not None and est is not None:
            return f"{est:{spec}} (95% CI {iv.ci95[0]:{spec}} to {iv.ci95[1]:{spec}})"
        return f"{_n(est, spec)} (point estimate, no interval)" if est is not None else "n/a"

    def ratio(est: float | None, ci: tuple[float, float] | None, spec: str) -> str:
        if est is None:
            return "n/a"
        return (f"{est:{spec}} (95% CI {ci[0]:{spec}} to {ci[1]:{spec}})" if ci is not None
                else f"{est:{spec}} (point estimate, no interval)")

    return [f"| median omega2 | {med('omega2', s.omega2_median)} |",
            f"| median ICC(1) | {med('icc1', s.icc1_median)} |",
            f"| median F | {med('f_stat', s.f_stat_median, '.2f')} |",
            f"| boundary share of total absolute value change | {ratio(b.share_of_abs_variation, b.share_ci95, '.3f')} |",
            f"| mean boundary step / mean within-turn step | "
            f"{ratio(b.mean_boundary_over_mean_within_step, b.step_ratio_ci95, '.2f')} |"]


def _interval_note(s: AuditSummary) -> str:
    """How the headline's intervals were made: over trajectories, or over whole clusters (groups /
    tasks) with the fractions' design effect."""
    k = s.eta2_median.n_clusters if s.eta2_median else None
    if k is None:
        return ("Intervals: eta2 median by a seeded percentile bootstrap over trajectories; fractions by the Wilson "
                "score interval.")
    fa = s.frac_ss_between_gt_within
    deff = fa.design_effect if fa else None
    wide = (f"; (a)'s interval is widened to the one all-agreeing data would give at {fa.widened_to_n_effective:.3g}"
            " effective trajectories (n^2 / sum of squared cluster sizes), as the design effect alone would be "
            "surer than that" if fa and fa.widened and fa.widened_to_n_effective is not None else "")
    return (f"Intervals: eta2 median by a seeded percentile bootstrap over {k} clusters (whole groups / tasks "
            "within source and checkpoint: their trajectories are not independent); fractions by the Wilson score "
            "interval at the effective sample size n / design effect"
            + (f" ({deff:.2f} for (a))" if deff is not None else "") + wide + ".")


def _breakdown_lines(s: AuditSummary, min_n: int) -> list[str]:
    """One table per breakdown of more than one row; one-row breakdowns folded into one sentence."""
    by_ckpt = s.by_checkpoint or {}
    sections: list[tuple[dict[str, Breakdown] | None, str]] = [
        (s.by_success, "success"), (s.by_source, "source"), (s.by_turn_bucket, "number of turns"),
        (s.comparison.by_critic if s.comparison else None, "critic")]
    if len(by_ckpt) == 1:
        sections.insert(2, (by_ckpt, "checkpoint"))
    sections += [(d, k) for k, d in (s.breakdowns or {}).items()]
    lines, folded = [], []
    for d, title in sections:
        if not d:
            continue
        if len(d) == 1:
            (k, g), = d.items()
            folded.append(f"{title} = {md_escape(k)} ({g.n_included} audited)")
            continue
        lines += ["", f"## By {title}", "", "| value | trajectories (audited) | median eta2 | SS_B > SS_W |", "|---|---|---|---|"]
        for k, g in d.items():
            flag = f" (low n, < {min_n})" if g.low_n else ""
            lines.append(f"| {md_escape(k)}{flag} | {g.n} ({g.n_included}) | {_ci(g.eta2_median)} | "
                         f"{_ci(g.frac_ss_between_gt_within, True)} |")
    if folded:
        lines += ["", "One-value breakdowns (folded): every trajectory has " + "; ".join(folded) + "."]
    return lines


def _exclusion_lines(s: AuditSummary) -> list[str]:
    """The exclusions, what the length limit truncated, and the over-long note."""
    from critic_audit.analysis.audit import length_limit, overlong_note

    lines = ["", "## Exclusions", ""]
    exc = s.excluded or {}
    lines += [f"- {md_escape(k)}: {v}" for k, v in sorted(exc.items())] or ["- none"]
    tr = s.truncated
    if tr and tr.trajectories:
        lines.append(f"- truncated to {length_limit(tr) or 'the length limit'} (kept, later turns dropped): "
                     f"{_plural(tr.trajectories, 'trajectory', 'trajectories')}, {_plural(tr.turns, 'turn', 'turns')}")
    note = overlong_note(tr, exc)
    if note:
        lines += ["", md_escape(note)]
    return lines


def _inference_lines(inf: dict[str, Any]) -> list[str]:
    """How the critic ran (``inference``), when it ran here."""
    if not inf.get("tokens_per_s"):
        return []
    return ["", "## Critic inference", "",
            f"{inf.get('real_tokens')} tokens in {inf.get('seconds', 0):.1f} s ({inf['tokens_per_s']:.0f} tokens/s), "
            f"{md_escape(inf.get('dtype'))} on {md_escape(inf.get('device'))}"
            + (f" ({inf['workers']} workers ({md_escape(inf['backend'])}): {md_escape(', '.join(inf['devices']))}; "
               f"{inf.get('startup_seconds', 0):.1f} s to start them)" if inf.get("devices") else "")
            + f", padding efficiency {_n(inf.get('padding_efficiency'))}; "
            f"critic {md_escape(inf.get('critic'))}."]


_IMAGE = re.compile(r"^!\[([a-z0-9_]+)\]\(plots/([a-z0-9_]+)\.png\)$")
_LINK = re.compile(r"\[([A-Za-z0-9 .]+)\]\(((?:plots/)?[a-z0-9_]+\.(?:svg|png|json|html|md)|critics/[^()\s]+/report\.html)\)")


def report_html(markdown_text: str, folder: Path) -> str:
    """A self-contained HTML page for the report: tables and headings rendered, plots embedded (base64).

    Only the tool's own plots are embedded: a line ``![stem](plots/stem.png)`` whose stem is one of
    :data:`PLOTS` (or ``eta2_ev_by_checkpoint``) and whose file lies in ``folder/plots``; nothing a label
    names is ever read (labels are escaped by :func:`md_escape` and cannot form such a line).
    """
    body: list[str] = []
    in_table = False
    known = {stem for stem, _ in PLOTS} | set(EXTRA_PLOTS)
    plots_dir = (folder / "plots").resolve()
    for line in markdown_text.splitlines():
        if line.startswith("|"):
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
            if all(set(c) <= {"-"} for c in cells):
                continue
            if not in_table:
                body.append("<table>")
                in_table = True
                body.append("<tr>" + "".join(f"<th>{_inline(c)}</th>" for c in cells) + "</tr>")
            else:
                body.append("<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in cells) + "</tr>")
            continue
        if in_table:
            body.append("</table>")
            in_table = False
        m = _IMAGE.match(line)
        if m and m.group(1) == m.group(2) and m.group(1) in known:
            png = plots_dir / f"{m.group(1)}.png"
            if png.is_file() and png.resolve().parent == plots_dir:
                data = base64.b64encode(png.read_bytes()).decode()
                body.append(f'<img alt="{m.group(1)}" src="data:image/png;base64,{data}">')
        elif line.startswith("### "):
            body.append(f"<h3>{_inline(line[4:])}</h3>")
        elif line.startswith("## "):
            body.append(f"<h2>{_inline(line[3:])}</h2>")
        elif line.startswith("# "):
            body.append(f"<h1>{_inline(line[2:])}</h1>")
        elif line.startswith("- "):
            body.append(f"<li>{_inline(line[2:])}</li>")
        elif line.strip():
            body.append(f"<p>{_inline(line)}</p>")
    if in_table:
        body.append("</table>")
    style = ("body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;line-height:1.45;padding:0 1em}"
             "table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:4px 8px;text-align:left}"
             "img{max-width:100%}h2{border-bottom:1px solid #ddd;padding-bottom:.2em}")
    return ("<!doctype html><html><head><meta charset='utf-8'><title>critic-audit report</title>"
            f"<style>{style}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")


def _inline(text: str) -> str:
    """Inline Markdown of the reports to HTML: backslash escapes (literal), ``**bold**``, ```code```
    and links to the output folder's own files (:data:`_LINK`); everything else is escaped text."""
    out: list[str] = []
    bold = code = False
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text):
            out.append(html.escape(text[i + 1]))
            i += 2
            continue
        if text.startswith("**", i) and not code:
            out.append("</b>" if bold else "<b>")
            bold = not bold
            i += 2
            continue
        if ch == "`":
            out.append("</code>" if code else "<code>")
            code = not code
            i += 1
            continue
        m = _LINK.match(text, i) if ch == "[" and not code else None
        if m:
            out.append(f'<a href="{html.escape(m.group(2))}">{html.escape(m.group(1))}</a>')
            i = m.end()
            continue
        out.append(html.escape(ch))
        i += 1
    if code:
        out.append("</code>")
    if bold:
        out.append("</b>")
    return "".join(out)


def render_folder(folder: Path, tokens: pl.DataFrame | pl.LazyFrame, per_trajectory: pl.DataFrame,
                  summary: AuditSummary | dict[str, Any], *, turns: pl.DataFrame | None = None,
                  steps: Any = None) -> None:
    """Write plots, report.md and report.html into ``folder`` (which already holds the tables);
    ``turns`` and ``steps``: a streamed audit's aggregates (:func:`render_plots`)."""
    summary = _typed(summary)
    stems = render_plots(folder, tokens, per_trajectory, summary=summary, turns=turns, steps=steps)
    write_reports(folder, summary, stems)


def write_reports(folder: Path, summary: AuditSummary | dict[str, Any], stems: list[str]) -> None:
    """Write ``report.md`` and ``report.html`` into ``folder``, whose ``plots/`` holds the plots ``stems``
    (as :func:`render_plots` returned them; the HTML embeds their PNGs)."""
    md = report_markdown(_typed(summary), stems)
    (folder / "report.md").write_text(md)
    (folder / "report.html").write_text(report_html(md, folder))


def rerender(folder: str | Path) -> Path:
    """Re-render plots and reports of a saved audit folder, atomically, without the critic. In a folder
    with a manifest (an ``analyze`` output) the plots the tool wrote are replaced, a file of the user's
    in ``plots/`` stays, and the manifest lists the new files (:func:`critic_audit.outputs.update`).

    Raises:
        InputError: the path is a file or missing; a comparison of several critics (the hint names
            ``critics/<name>``); the folder lacks ``summary.json``, ``trajectories.parquet`` or
            ``tokens.parquet``; a table cannot be read (corrupt Parquet: one line naming it).
    """
    import os
    import shutil
    import tempfile

    from critic_audit.errors import InputError

    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise InputError("is a file, not an output folder", path=folder,
                         fix="pass the output folder written by critic-audit analyze (the --out folder), not a file")
    if not folder.is_dir():
        raise InputError("no such folder", path=folder, fix="pass an output folder written by critic-audit analyze")
    critics = folder / "critics"
    if critics.is_dir() and not (folder / "tokens.parquet").exists():
        names = sorted(p.name for p in critics.iterdir() if (p / "summary.json").exists())
        if names:
            raise InputError(f"a comparison of {len(names)} critics ({', '.join(names)}): each critic's plots and "
                             "report live in its own folder", path=folder,
                             fix=f"pass {folder / 'critics' / names[0]} (one critic at a time)")
    from critic_audit.pipeline.stream import stats_folder

    streamed = stats_folder(folder)
    for name in ("summary.json", "trajectories.parquet", *(() if streamed else ("tokens.parquet",))):
        if not (folder / name).exists():
            raise InputError(f"no {name} in the folder", path=folder,
                             fix="pass an output folder written by critic-audit analyze")
    from critic_audit.summary import read_summary

    from critic_audit.io.tables import read_parquet_file

    summary = read_summary(folder / "summary.json")
    per = read_parquet_file(folder / "trajectories.parquet")
    extra: dict[str, Any] = {}
    if streamed:  # a streamed audit: the traced trajectories' tokens and the aggregates
        from critic_audit.pipeline.stream import read_aggregates

        tokens, extra["turns"], extra["steps"] = read_aggregates(folder)
    else:
        tokens = read_parquet_file(folder / "tokens.parquet")
    from critic_audit.outputs import lock_folder, read_manifest, staging, update

    if read_manifest(folder) is not None:  # an analyze output: only what the tool wrote is replaced
        with lock_folder(folder.resolve(), command="critic-audit plot", option="folder"), \
                staging(folder, inside=True) as staged:
            render_folder(staged, tokens, per, summary, **extra)
            update(staged, folder, dirs=["plots"], option="folder")
        return folder
    tmp = Path(tempfile.mkdtemp(prefix=".render-", dir=folder))
    try:
        render_folder(tmp, tokens, per, summary, **extra)
        old_plots = folder / "plots"
        if old_plots.exists():
            shutil.rmtree(old_plots)
        os.replace(tmp / "plots", old_plots)
        for name in ("report.md", "report.html"):
            os.replace(tmp / name, folder / name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def comparison_markdown(summary: AuditSummary | dict[str, Any]) -> str:
    """Report comparing several critics audited on the same rollouts (labels escaped)."""
    from urllib.parse import quote

    comp = _typed(summary).comparison
    lines = ["# Critic audit: several critics on the same rollouts", "",
             "| critic | audited | median eta2 | SS_B > SS_W | explained variance (within source) | corr (permutation p) | verdict | report |",
             "|---|---|---|---|---|---|---|---|"]
    for label in comp.critics if comp else ():
        p = comp.per_critic[label]
        g = (p.critic_quality.gate if p.critic_quality else None) or QualityGate()
        c = g.corr_within_stratum or Interval()
        pv = f" (p {format_p(c.p_value)})" if c.p_value is not None else ""
        lines.append(f"| {md_escape(label)} | {p.n_included} | {_ci(p.eta2_median)} | "
                     f"{_ci(p.frac_ss_between_gt_within, True)} | {_ci(g.explained_variance_within_stratum)} | "
                     f"{_n(c.estimate)}{pv} | {p.recommendation.verdict if p.recommendation else None} | "
                     f"[report](critics/{quote(str(label), safe='')}/report.html) |")
    lines += ["", "Each critic's full report: critics/CRITIC/report.html (linked above).", "", "## Plots", ""]
    for stem, title in (("eta2_box", "eta2 per critic"), ("eta2_ecdf", "eta2 ECDF per critic")):
        lines += [f"### {title}", "", f"![{stem}](plots/{stem}.png)", ""]
    return "\n".join(lines) + "\n"


def render_comparison(folder: Path, per_trajectory: pl.DataFrame, summary: AuditSummary | dict[str, Any]) -> None:
    """Plots (eta2 box plot and ECDF per critic) and reports of a several-critic audit."""
    import matplotlib.pyplot as plt

    from critic_audit import plots as P

    plt.close(P.plot_eta2_box(per_trajectory, "critic", folder / "plots" / "eta2_box"))
    plt.close(P.plot_eta2_ecdf(per_trajectory, "critic", folder / "plots" / "eta2_ecdf"))
    md = comparison_markdown(summary)
    (folder / "report.md").write_text(md)
    (folder / "report.html").write_text(report_html(md, folder))
