"""How the ``critic-audit`` commands show their results on a terminal: rich tables of an audit
summary (``analyze``), of the monitor's summary and of a check report. The CLI layer: with
``cli.py`` the only modules that import rich (the library stays free of it); the commands in
``cli.py`` stay thin and print what these return.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.table import Table

from critic_audit.summary import format_p

if TYPE_CHECKING:
    from critic_audit.summary import AuditSummary

__all__ = ["GATE_MARK", "check_tables", "checkpoint_reasons", "checkpoints_table", "critics_table", "escape", "fmt", "fmt_ci",
           "monitor_tables", "summary_table"]


def escape(s: str) -> str:
    """``s`` with rich markup escaped (printed as is)."""
    from rich.markup import escape as rich_escape

    return rich_escape(s)


def fmt_ci(d: Any) -> str:
    """An :class:`~critic_audit.summary.Interval` or :class:`~critic_audit.summary.Fraction` as
    ``estimate  [lo, hi]``."""
    if d is None or d.estimate is None:
        return "n/a"
    lo, hi = d.ci95 or (None, None)
    return f"{d.estimate:.3f}  [{lo:.3f}, {hi:.3f}]" if lo is not None else f"{d.estimate:.3f}  (CI n/a)"


def fmt(x: Any, spec: str = ".3f") -> str:
    """``x`` formatted by ``spec``; ``n/a`` for None."""
    return "n/a" if x is None else format(x, spec)


def _est_ci(est: float | None, ci: Any, spec: str) -> str:
    """``estimate  [lo, hi]``, or ``estimate  (point estimate)`` without an interval; ``n/a`` for None."""
    if est is None:
        return "n/a"
    return f"{est:{spec}}  [{ci[0]:{spec}}, {ci[1]:{spec}}]" if ci else f"{est:{spec}}  (point estimate)"


def summary_table(s: AuditSummary) -> Table:
    """``analyze``'s headline table of one critic's summary."""
    from critic_audit.summary import Boundary, Coverage, CriticQuality, Interval

    pooled = s.pooled_text
    t = Table(title="critic-audit: value variance between vs within turns" + (f" ({pooled})" if pooled else ""),
              show_header=True)
    t.add_column("measure")
    t.add_column("value (95% CI)", justify="right")
    sample = s.sample_text
    if sample:  # the shares below are of the sample, not of every trajectory read
        t.add_row("sample", sample)
    elif s.unsampled_text:
        t.add_row("sample", s.unsampled_text)
    of = " (in the sample)" if sample else ""
    t.add_row(f"trajectories included / {'sampled' if sample else 'read'}", f"{s.n_included} / {s.n_trajectories}")
    from critic_audit.analysis.audit import coverage_labels

    cov = s.coverage or Coverage()
    labels = coverage_labels(s.scope or "assistant")
    for what, e in ((labels["turns"], cov.turns), (labels["tokens"], cov.tokens)):
        if e and e.read:
            t.add_row(f"{what} audited / read{of}", f"{e.audited} / {e.read} ({100 * e.share:.1f}%)")
    if s.scope not in (None, "assistant") and s.n_turns_included is not None:
        t.add_row(f"{labels['groups']} audited", str(s.n_turns_included))
    if cov.duplicates_dropped:
        t.add_row("copies dropped (same id and content in 2 files)", str(cov.duplicates_dropped))
    exc = s.excluded or {}
    if exc:
        t.add_row("excluded", ", ".join(f"{k}: {v}" for k, v in sorted(exc.items())))
    tr = s.truncated
    long_ = {"truncated": (tr.trajectories if tr else 0) or 0, "excluded": exc.get("overlong_no_complete_turn", 0),
             "dropped": exc.get("overlong_dropped", 0)}  # the same counts as the exclusions row
    if any(long_.values()):
        from critic_audit.analysis.audit import length_limit

        t.add_row(f"longer than {length_limit(tr) or 'the length limit'}",
                  f"{long_['truncated']} truncated ({(tr.turns if tr else 0) or 0} later turns dropped), "
                  f"{long_['excluded']} excluded (no complete turn fits), {long_['dropped']} dropped")
    t.add_row("median eta2 (share of variance between turns)" + (f", {pooled}" if pooled else ""), fmt_ci(s.eta2_median))
    k = s.eta2_median.n_clusters if s.eta2_median else None
    if k is not None:  # groups / tasks of several trajectories: their trajectories are not independent
        t.add_row("intervals resample", f"{k} clusters (whole groups / tasks), not trajectories")
    t.add_row("(a) fraction SS_B > SS_W", fmt_ci(s.frac_ss_between_gt_within))
    t.add_row("(b) fraction var(turn means) > mean within var", fmt_ci(s.frac_var_turn_means_gt_mean_within_var))
    t.add_row("(c) fraction F > 1", fmt_ci(s.frac_f_gt_1))
    m = s.medians_ci or {}
    for key, label, est, spec in (("omega2", "median omega2", s.omega2_median, ".3f"),
                                  ("icc1", "median ICC(1)", s.icc1_median, ".3f"),
                                  ("f_stat", "median F", s.f_stat_median, ".2f")):
        t.add_row(label, _est_ci(est, (m.get(key) or Interval()).ci95, spec))
    b = s.boundary or Boundary()
    t.add_row("boundary share of |dV|", _est_ci(b.share_of_abs_variation, b.share_ci95, ".3f"))
    t.add_row("boundary:within step ratio", _est_ci(b.mean_boundary_over_mean_within_step, b.step_ratio_ci95, ".2f"))
    q = s.critic_quality or CriticQuality()
    t.add_row("pooled EV / corr(mean V, R): in-sample, not the gate's",
              f"{fmt(q.explained_variance)} / {fmt(q.corr_mean_value_reward)}  (point estimates)")
    g = q.gate
    if g:
        c = g.corr_within_stratum or Interval()
        t.add_row(f"quality gate{' (pooled: different critics)' if pooled else ''}: within-source corr (p) / EV", f"{g.status}: {fmt(c.estimate)} "
                  f"(p {format_p(c.p_value)}) / {fmt_ci(g.explained_variance_within_stratum)}")
    for key, d in (s.by_success or {}).items():
        t.add_row(f"  success={key}: n, median eta2", f"{d.n_included}, {fmt_ci(d.eta2_median)}")
    inf = s.run.inference or {}
    if inf.get("tokens_per_s"):
        where = f"{inf['dtype']}, {inf['device']}" + (f", {inf['workers']} workers ({inf['backend']})" if inf.get("devices") else "")
        t.add_row("critic inference", f"{inf['real_tokens']} tokens, {inf['tokens_per_s']:.0f} tok/s ({where})")
    ref = s.paper_reference or {}
    t.add_row("MPO paper (2610.35013) for reference" + (" (one critic; the figures above pool several)" if pooled else ""), f"median eta2 {ref.get('median_eta2')}, fraction {ref.get('frac_ss_between_gt_within')}")
    return t


def checkpoints_table(s: AuditSummary) -> Table:
    """``analyze``'s table by checkpoint (each critic on its own rollouts)."""
    from critic_audit.summary import Interval, QualityGate

    t = Table(title="by checkpoint: each critic on its own rollouts")
    for col in ("checkpoint", "n", "median eta2 (95% CI)", "(a) SS_B > SS_W (95% CI)", "EV within source (95% CI)", "corr (p)",
                "verdict"):
        t.add_column(col)
    for k, r in (s.by_checkpoint or {}).items():
        g = (r.critic_quality.gate if r.critic_quality else None) or QualityGate()
        c = g.corr_within_stratum or Interval()
        rec = r.recommendation
        verdict = (rec.verdict or "") if rec else ""
        if rec and rec.leans:
            verdict += f" (leans {rec.leans})"
        t.add_row(escape(k), str(r.n_included), fmt_ci(r.eta2_median), fmt_ci(r.frac_ss_between_gt_within),
                  fmt_ci(g.explained_variance_within_stratum),
                  f"{fmt(c.estimate)} (p {format_p(c.p_value)})",
                  ("no data" if not r.n_included else "too few trajectories: no verdict") if r.low_n else verdict)
    return t


def checkpoint_reasons(s: AuditSummary) -> list[str]:
    """One line per checkpoint of ``analyze``'s table by checkpoint that gets no credit verdict because of
    its critic or its data (``critic_too_weak``, ``not_enough_data``, ...): the failed gate conditions."""
    from critic_audit.summary import no_credit_reasons

    return [f"  {escape(k)}: {v}: {escape('; '.join(r) or 'no reason recorded')}"
            for k, v, r in no_credit_reasons(s.by_checkpoint)]


def critics_table(s: AuditSummary) -> Table:
    """``analyze``'s table of several critics on the same rollouts."""
    t = Table(title="critic-audit: several critics on the same rollouts")
    for col in ("critic", "audited", "median eta2 (95% CI)", "SS_B > SS_W", "expl. var.", "recommendation"):
        t.add_column(col)
    comp = s.comparison
    for label in comp.critics if comp else ():
        p = comp.per_critic[label]
        t.add_row(label, str(p.n_included), fmt_ci(p.eta2_median), fmt_ci(p.frac_ss_between_gt_within),
                  fmt(p.critic_quality.explained_variance if p.critic_quality else None),
                  p.recommendation.verdict if p.recommendation and p.recommendation.verdict is not None else "")
    return t


#: monitor's mark beside an AUROC of a critic that did not pass the quality gate, by the gate's status
GATE_MARK = {"failed": "critic failed the quality gate", "not_enough_data": "critic unchecked: too little data",
             "unmeasured": "critic quality unmeasured"}


def monitor_tables(s: dict[str, Any], top_rows: Any, threshold: float, reference: Any) -> list[Any]:
    """What ``monitor`` prints: the summary table (``s``: :attr:`MonitorResult.summary`), its notes, and
    the ``top_rows`` flagged turns (a polars frame with ``success``) or a line saying none was flagged."""

    gate = s.get("critic_gate") or {}
    cks = gate.get("checkpoints")
    mark = (f"{len(cks['not_passed'])} of {cks['n']} checkpoint critics did not pass the quality gate" if cks
            else GATE_MARK.get(gate.get("status"), "critic not checked"))

    def auc(d: dict) -> str:
        if d["estimate"] is None:
            return f"withheld: {d['withheld']}" if d.get("withheld") else "n/a"
        return (f"{d['estimate']:.3f}" + (f"  [{d['ci95'][0]:.3f}, {d['ci95'][1]:.3f}]" if d["ci95"] else "")
                + (f" ({mark})" if d.get("caveat") else ""))

    parts: list[Any] = []
    c, r, a, f = s["counts"], s["robust"], s["auroc"], s["any_flag"]
    t = Table(title=f"critic-audit monitor: turn-value change as a failure signal (reference: {reference})")
    t.add_column("measure")
    t.add_column("value (95% CI)", justify="right")
    t.add_row("trajectories scored / read", f"{c['trajectories_scored']} / {c['trajectories_read']}")
    if c["skipped"]:
        t.add_row("skipped", ", ".join(f"{k}: {v}" for k, v in c["skipped"].items()))
    t.add_row("turns scored (k >= 1)", str(c["turns_scored"]))
    t.add_row(f"flagged turns (|z| > {threshold:g}) / trajectories", f"{c['flagged_turns']} / {c['flagged_trajectories']}")
    if "by_checkpoint" in r:  # each checkpoint's critic on its own scale
        t.add_row("robust centre / scale of the change",
                  f"per checkpoint ({len(r['by_checkpoint'])}; --json robust.by_checkpoint)")
    else:
        t.add_row("robust centre / scale of the change", f"{r['center']:.4g} / {r['scale']:.4g} ({r['scale_method']})")
    t.add_row("labelled trajectories / failures", f"{c['labelled']} / {c['failures']}")
    t.add_row("AUROC for failure: max |z|", auc(a["max_abs_z"]))
    t.add_row("AUROC for failure: largest drop (-min z)", auc(a["largest_drop"]))
    t.add_row("AUROC for failure: number of turns (baseline)", auc(a["num_turns"]))
    def wil(x: Any, ci: Any) -> str:
        return fmt(x) + (f"  [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "")

    t.add_row("any flag: precision / recall for failure (Wilson, over trajectories)",
              f"{wil(f['precision'], f.get('precision_ci95'))} / {wil(f['recall'], f.get('recall_ci95'))} "
              f"(failure rate {fmt(f['failure_rate'])})")
    parts.append(t)
    for note in s["notes"]:
        parts.append(f"note: {escape(note)}")
    if top_rows.height:
        ft = Table(title=f"top {top_rows.height} of {c['flagged_turns']} flagged turns")
        for col in ("trajectory", "turn", "z", "success"):
            ft.add_column(col, justify="left" if col == "trajectory" else "right")
        for row in top_rows.iter_rows(named=True):
            ft.add_row(escape(row["trajectory_id"]), str(row["turn"]), f"{row['z']:+.2f}",
                       "n/a" if row["success"] is None else str(row["success"]))
        parts.append(ft)
    elif c["flagged_turns"] == 0:
        parts.append(f"no turn flagged at |z| > {threshold:g}")
    return parts


def check_tables(report: Any) -> list[Any]:
    """What ``check`` prints without ``--json``: the table of every check (its status coloured), the fix of
    each check that fired and the notes (``report``: :class:`critic_audit.check.CheckReport`)."""
    colors = {"fail": "red", "warn": "yellow", "pass": "green", "skipped": "dim"}
    t = Table(title=f"critic-audit check: {report.n_trajectories} trajectories, overall {report.overall()}")
    for col in ("check", "status", "finding", "worst example (trajectory, turn, position)"):
        t.add_column(col)
    for c in report.checks:
        ex = c.examples[0] if c.examples else None
        dash = (lambda v: "-" if v is None else str(v))
        where = "" if ex is None else f"{ex.trajectory_id}, {dash(ex.turn)}, {dash(ex.position)}: {ex.detail}"
        t.add_row(c.id, f"[{colors[c.status]}]{c.status}[/]", escape(c.summary), escape(where))
    parts: list[Any] = [t]
    for c in report.checks:
        if c.status in ("fail", "warn"):
            parts.append(f"[bold]{c.id}[/bold] fix: {escape(c.fix)}")
    for note in report.all_notes():
        parts.append(f"note: {escape(note)}")
    return parts
