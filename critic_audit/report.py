"""Render an audit output folder: every plot, ``report.md`` and a self-contained ``report.html``.

Used by ``critic-audit analyze`` (into its temporary folder before the swap) and by
``critic-audit plot`` (re-render a saved folder without running the critic again).
"""

from __future__ import annotations

import base64
import html
import json
from pathlib import Path
from typing import Any

import polars as pl

PLOTS = (
    ("value_traces", "Value along a successful and a failed trajectory, turns shaded (the MPO paper's Figure 2)"),
    ("value_grid", "Value traces of several successes and failures"),
    ("eta2_hist", "Distribution of per-trajectory eta2, median marked"),
    ("eta2_ecdf", "eta2 ECDF by success"),
    ("eta2_box", "eta2 per checkpoint / critic"),
    ("step_distributions", "Value steps at turn boundaries vs inside turns"),
    ("turn_position", "Mean value by turn position, successes vs failures"),
)


def render_plots(folder: Path, tokens: pl.DataFrame | pl.LazyFrame, per_trajectory: pl.DataFrame, *, box_by: str | None = None) -> list[str]:
    """Write every plot (PNG and SVG) under ``folder/plots``; returns the stems written."""
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
        "step_distributions": lambda: P.plot_step_distributions(tokens, per_trajectory, out / "step_distributions"),
        "turn_position": lambda: P.plot_turn_position(tokens, per_trajectory, out / "turn_position"),
    }
    written = []
    for stem, make in makers.items():
        plt.close(make())
        written.append(stem)
    return written


def _ci(d: dict | None, pct: bool = False) -> str:
    if not d or d.get("estimate") is None:
        return "n/a"
    f = (lambda x: f"{100 * x:.1f}%") if pct else (lambda x: f"{x:.3f}")
    lo, hi = (d.get("ci95") or [None, None])
    return f"{f(d['estimate'])} (95% CI {f(lo)} to {f(hi)})" if lo is not None else f(d["estimate"])


def _plural(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def _n(x: Any, spec: str = ".3f") -> str:
    return "n/a" if x is None else format(x, spec)


def report_markdown(summary: dict[str, Any], plots: list[str]) -> str:
    """The audit report as Markdown (headline with intervals, quality, breakdowns, recommendation)."""
    s = summary
    rec = s.get("recommendation") or {}
    q = s.get("critic_quality") or {}
    b = s.get("boundary") or {}
    ref = s.get("paper_reference") or {}
    lines = [
        "# Critic audit: between-turn vs within-turn value variance",
        "",
        f"**Recommendation ({rec.get('verdict', 'n/a')}).** {rec.get('text', '')}",
        "",
        "Thresholds used: " + ", ".join(f"{k} = {v}" for k, v in (rec.get("thresholds") or {}).items()) + ".",
        "",
        "## Headline",
        "",
        "| measure | value |",
        "|---|---|",
        f"| scope | {s.get('scope')} ({'policy tokens, one group per assistant turn' if s.get('scope') == 'assistant' else 'every scored token; assistant turns and user/tool/template runs are groups'}) |",
        f"| trajectories audited / read | {s.get('n_included')} / {s.get('n_trajectories')} |",
        f"| {'assistant turns' if s.get('scope') == 'assistant' else 'groups (turns and other segments)'} / tokens audited | {s.get('n_turns_included')} / {s.get('n_tokens_included')} |",
        f"| median eta2 (share of value variance between turns) | {_ci(s.get('eta2_median'))} |",
        f"| (a) trajectories with SS_B > SS_W | {_ci(s.get('frac_ss_between_gt_within'), True)} |",
        f"| (b) var(turn means) > mean within-turn var | {_ci(s.get('frac_var_turn_means_gt_mean_within_var'), True)} |",
        f"| (c) F > 1 | {_ci(s.get('frac_f_gt_1'), True)} |",
        f"| median omega2 / ICC(1) / F | {_n(s.get('omega2_median'))} / {_n(s.get('icc1_median'))} / {_n(s.get('f_stat_median'), '.2f')} |",
        f"| boundary share of total absolute value change | {_n(b.get('share_of_abs_variation'))} |",
        f"| mean boundary step / mean within-turn step | {_n(b.get('mean_boundary_over_mean_within_step'), '.2f')} |",
        f"| MPO paper (arXiv:2610.35013) | median eta2 {ref.get('median_eta2')}, {100 * (ref.get('frac_ss_between_gt_within') or 0):.1f}% with SS_B > SS_W |",
        "",
        "## Critic quality on the same rollouts",
        "",
        f"Explained variance of the values against each trajectory's return, over all policy tokens: "
        f"**{_n(q.get('explained_variance'))}**; correlation of each trajectory's mean value with its reward: "
        f"**{_n(q.get('corr_mean_value_reward'))}** ({q.get('n_trajectories', 0)} trajectories with rewards). "
        "A low eta2 from a critic that explains nothing says little about credit granularity.",
        "",
        "## Exclusions",
        "",
    ]
    exc = s.get("excluded") or {}
    lines += [f"- {k}: {v}" for k, v in sorted(exc.items())] or ["- none"]
    tr = s.get("truncated") or {}
    if tr.get("trajectories"):
        lines.append(f"- truncated to the critic's context (kept, later turns dropped): {_plural(tr['trajectories'], 'trajectory', 'trajectories')}, "
                     f"{_plural(tr['turns'], 'turn', 'turns')}")
    sections = [("by_success", "success"), ("by_source", "source"), ("by_checkpoint", "checkpoint"),
                ("by_turn_bucket", "number of turns"), ("by_critic", "critic")]
    sections += [((("breakdowns", k)), k) for k in (s.get("breakdowns") or {})]
    for key, title in sections:
        d = s.get(key[0], {}).get(key[1]) if isinstance(key, tuple) else s.get(key)
        if not d or len(d) < 1:
            continue
        lines += ["", f"## By {title}", "", "| value | trajectories (audited) | median eta2 | SS_B > SS_W |", "|---|---|---|---|"]
        for k, g in d.items():
            lines.append(f"| {k} | {g['n']} ({g['n_included']}) | {_ci(g['eta2_median'])} | "
                         f"{_ci(g['frac_ss_between_gt_within'], True)} |")
    inf = s.get("inference") or {}
    if inf.get("tokens_per_s"):
        lines += ["", "## Critic inference", "",
                  f"{inf.get('real_tokens')} tokens in {inf.get('seconds', 0):.1f} s ({inf['tokens_per_s']:.0f} tokens/s), "
                  f"{inf.get('dtype')} on {inf.get('device')}"
                  + (f" ({inf['workers']} workers ({inf['backend']}): {', '.join(inf['devices'])}; {inf.get('startup_seconds', 0):.1f} s "
                     "to start them)" if inf.get("devices") else "")
                  + f", padding efficiency {_n(inf.get('padding_efficiency'))}; "
                  f"critic `{inf.get('critic')}`."]
    lines += ["", "## Plots", ""]
    titles = dict(PLOTS)
    for stem in plots:
        lines += [f"### {titles.get(stem, stem)}", "", f"![{stem}](plots/{stem}.png)", ""]
    lines += ["Definitions: docs/audit.md of critic-audit; numbers from `summary.json`."]
    return "\n".join(lines) + "\n"


def report_html(markdown_text: str, folder: Path) -> str:
    """A self-contained HTML page for the report: tables and headings rendered, PNGs embedded (base64)."""
    body: list[str] = []
    in_table = False
    for line in markdown_text.splitlines():
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip("|").split("|")]
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
        if line.startswith("!["):
            stem = line[line.index("(") + 1: line.rindex(")")]
            png = folder / stem
            if png.exists():
                data = base64.b64encode(png.read_bytes()).decode()
                body.append(f'<img alt="{html.escape(stem)}" src="data:image/png;base64,{data}">')
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
    style = ("body{font-family:system-ui,sans-serif;max-width:960px;margin:2em auto;line-height:1.45}"
             "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:4px 8px;text-align:left}"
             "img{max-width:100%}")
    return ("<!doctype html><html><head><meta charset='utf-8'><title>critic-audit report</title>"
            f"<style>{style}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")


def _inline(text: str) -> str:
    out = html.escape(text)
    parts = out.split("**")
    out = "".join(f"<b>{p}</b>" if i % 2 else p for i, p in enumerate(parts))
    parts = out.split("`")
    return "".join(f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(parts))


def render_folder(folder: Path, tokens: pl.DataFrame | pl.LazyFrame, per_trajectory: pl.DataFrame, summary: dict[str, Any]) -> None:
    """Write plots, report.md and report.html into ``folder`` (which already holds the tables)."""
    stems = render_plots(folder, tokens, per_trajectory)
    md = report_markdown(summary, stems)
    (folder / "report.md").write_text(md)
    (folder / "report.html").write_text(report_html(md, folder))


def rerender(folder: str | Path) -> Path:
    """Re-render plots and reports of a saved audit folder, atomically, without the critic.

    Raises:
        InputError: the folder lacks ``summary.json``, ``trajectories.parquet`` or ``tokens.parquet``.
    """
    import os
    import shutil
    import tempfile

    from critic_audit.errors import InputError

    folder = Path(folder)
    if not folder.is_dir():
        raise InputError("no such folder", path=folder, fix="pass an output folder written by critic-audit analyze")
    for name in ("summary.json", "trajectories.parquet", "tokens.parquet"):
        if not (folder / name).exists():
            raise InputError(f"no {name} in the folder", path=folder,
                             fix="pass an output folder written by critic-audit analyze")
    summary = json.loads((folder / "summary.json").read_text())
    per = pl.read_parquet(folder / "trajectories.parquet")
    tokens = pl.read_parquet(folder / "tokens.parquet")
    tmp = Path(tempfile.mkdtemp(prefix=".render-", dir=folder))
    try:
        render_folder(tmp, tokens, per, summary)
        old_plots = folder / "plots"
        if old_plots.exists():
            shutil.rmtree(old_plots)
        os.replace(tmp / "plots", old_plots)
        for name in ("report.md", "report.html"):
            os.replace(tmp / name, folder / name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def comparison_markdown(summary: dict[str, Any]) -> str:
    """Report comparing several critics audited on the same rollouts."""
    lines = ["# Critic audit: several critics on the same rollouts", "",
             "| critic | audited | median eta2 | SS_B > SS_W | explained variance | corr(mean V, reward) | recommendation |",
             "|---|---|---|---|---|---|---|"]
    for label in summary["critics"]:
        p = summary["per_critic"][label]
        q = p.get("critic_quality") or {}
        lines.append(f"| {label} | {p.get('n_included')} | {_ci(p.get('eta2_median'))} | "
                     f"{_ci(p.get('frac_ss_between_gt_within'), True)} | {_n(q.get('explained_variance'))} | "
                     f"{_n(q.get('corr_mean_value_reward'))} | {(p.get('recommendation') or {}).get('verdict')} |")
    lines += ["", "Each critic's full report: `critics/<critic>/report.md`.", "", "## Plots", ""]
    for stem, title in (("eta2_box", "eta2 per critic"), ("eta2_ecdf", "eta2 ECDF per critic")):
        lines += [f"### {title}", "", f"![{stem}](plots/{stem}.png)", ""]
    return "\n".join(lines) + "\n"


def render_comparison(folder: Path, per_trajectory: pl.DataFrame, summary: dict[str, Any]) -> None:
    """Plots (eta2 box plot and ECDF per critic) and reports of a several-critic audit."""
    import matplotlib.pyplot as plt

    from critic_audit import plots as P

    plt.close(P.plot_eta2_box(per_trajectory, "critic", folder / "plots" / "eta2_box"))
    plt.close(P.plot_eta2_ecdf(per_trajectory, "critic", folder / "plots" / "eta2_ecdf"))
    md = comparison_markdown(summary)
    (folder / "report.md").write_text(md)
    (folder / "report.html").write_text(report_html(md, folder))
