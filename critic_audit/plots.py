"""Plots of the audit (matplotlib, Agg backend; PNG and SVG).

- :func:`plot_value_traces`: the critic value along a successful and a failed trajectory with the
  assistant turns shaded (the MPO paper's Figure 2, arXiv:2610.35013).
- :func:`plot_eta2_hist`: the distribution of per-trajectory eta-squared with its median marked.

Each function returns the matplotlib Figure (tests check it through its artists) and, when ``out`` is
given, writes ``<out>.png`` and ``<out>.svg``.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import polars as pl  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

TURN_COLORS = ("#dbe9f6", "#fde2c8")


def _save(fig: Figure, out: str | Path | None) -> None:
    if out is None:
        return
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out.with_suffix(".png"), dpi=120, bbox_inches="tight")
    fig.savefig(out.with_suffix(".svg"), bbox_inches="tight")


def pick_examples(per_trajectory: pl.DataFrame) -> dict[str, str | None]:
    """Choose one included successful and one included failed trajectory to draw.

    The choice is deterministic: in each class, the trajectory whose number of turns is closest to the
    class median (ties: the smaller id).
    """
    out: dict[str, str | None] = {}
    inc = per_trajectory.filter(pl.col("excluded").is_null())
    for label, flag in (("success", True), ("failure", False)):
        part = inc.filter(pl.col("success") == flag)
        if part.height == 0:
            out[label] = None
            continue
        med = float(part["n_turns"].median())
        part = part.with_columns(_d=(pl.col("n_turns") - med).abs()).sort(["_d", "trajectory_id"])
        out[label] = part["trajectory_id"][0]
    return out


def plot_value_traces(tokens: pl.DataFrame, per_trajectory: pl.DataFrame, out: str | Path | None = None,
                      examples: dict[str, str | None] | None = None) -> Figure:
    """Value along one successful and one failed trajectory, assistant turns shaded.

    Args:
        tokens: tokens table with values (policy tokens are drawn; x = token position).
        per_trajectory: the audit's per-trajectory table (for the choice and the titles).
        out: path stem to write PNG and SVG to, or None.
        examples: ``{"success": id, "failure": id}``; default :func:`pick_examples`.
    """
    examples = examples or pick_examples(per_trajectory)
    fig, axes = plt.subplots(2, 1, figsize=(10, 6), sharey=False)
    for ax, label in zip(axes, ("success", "failure")):
        tid = examples.get(label)
        if tid is None:
            ax.set_title(f"no included {label} trajectory")
            ax.set_axis_off()
            continue
        t = tokens.filter((pl.col("trajectory_id") == tid) & pl.col("response_mask")).sort("position")
        pos = t["position"].to_numpy()
        val = t["value"].cast(pl.Float64).to_numpy()
        turn = t["turn"].to_numpy()
        for k in np.unique(turn):
            p = pos[turn == k]
            ax.axvspan(p.min() - 0.5, p.max() + 0.5, color=TURN_COLORS[int(k) % 2], alpha=0.9, lw=0)
            ax.plot(p, val[turn == k], color="#1f4e79" if label == "success" else "#a83232", lw=1.0)
        row = per_trajectory.filter(pl.col("trajectory_id") == tid).row(0, named=True)
        ax.set_title(f"{label}: {tid}  (K={row['n_turns']}, eta2={row['eta2']:.3f}, reward={row['reward']})",
                     fontsize=9)
        ax.set_ylabel("critic value V_t")
    axes[-1].set_xlabel("token position (assistant turns shaded; gaps are user/tool tokens)")
    fig.suptitle("Critic value along a successful and a failed trajectory")
    fig.tight_layout()
    _save(fig, out)
    return fig


def plot_eta2_hist(per_trajectory: pl.DataFrame, out: str | Path | None = None, bins: int = 20) -> Figure:
    """Histogram of per-trajectory eta2 (share of value variance between turns), median marked."""
    eta = per_trajectory.filter(pl.col("excluded").is_null())["eta2"].drop_nulls().to_numpy()
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.hist(eta, bins=np.linspace(0, 1, bins + 1), color="#4a7ab5", edgecolor="white")
    if eta.size:
        med = float(np.median(eta))
        ax.axvline(med, color="black", ls="--", label=f"median {med:.3f}")
    ax.axvline(0.895, color="#c0392b", ls=":", label="MPO paper median 0.895")
    ax.set_xlim(0, 1)
    ax.set_xlabel("eta2 = SS_between / SS_total (per trajectory)")
    ax.set_ylabel("trajectories")
    ax.set_title(f"Share of critic-value variance between turns (n={eta.size})")
    ax.legend(fontsize=8)
    fig.tight_layout()
    _save(fig, out)
    return fig
