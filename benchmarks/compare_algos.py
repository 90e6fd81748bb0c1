"""MPO against GRPO, Dr.GRPO, DAPO, GSPO, PPO, VC-PPO, VAPO and SAO, plus MPO's ablations, at equal
environment steps on the synthetic credit-assignment environment (``critic_audit.train.envs.credit``).

Every run uses the trainer's documented defaults (``critic-audit train --algo NAME``: tiny Llama, lr 1e-3, entropy bonus 0.01,
64 episodes per step = ``episodes_per_step // G`` prompts x G, 150 steps); only the task (``--task``),
the seed and the ``--set`` overrides given to every run change. Variants: the nine algorithms with their own defaults, ``mpo_token_ratio`` (MAE
advantages with PPO's token ratio, the paper's ablation), ``mpo_beta0`` (beta = 0: no intra-turn
refinement), ``mpo_geomean`` (geometric-mean turn ratio) and the diagnostics ``mpo_g4`` (G = 4: 4
prompts x 4 rollouts instead of 16 x 1), ``mpo_nowhiten``, ``mpo_ent0`` and ``ppo_ent0`` (no entropy bonus),
``mpo_ep32`` (32 episodes a step: measured against the earlier default of 16).

Tasks (``--task``):

- ``credit``: the default task (2 decisions, 2 cues, 2 choices; 2-token decision turns, a 12-token
  report turn, 12-token tool outputs).
- ``hard``: credit matters more: 4 decisions, 4 cues, 24-token tool outputs, a 32-token report turn.
- ``disparity``: 4-token decision turns beside 600-token tool outputs and a report turn of up to 128
  tokens (the policy ends its turns itself, so report turns are as long as it makes them); MPO's ``length_buckets`` are (1, 8, 32, 128, 512) so the turn-ratio clip fraction and the
  variance of log rho_k are reported per turn length for the product and the geometric-mean ratio.
- ``disparity_learn``: the same disparity of assistant turns (4-token decisions, reports of up to 64
  tokens) with 100-token tool outputs, so that a learning run (150 steps of 64 episodes) costs some 10
  CPU-minutes instead of hours (a 600-token tool output makes a step of 64 episodes some 100 s; tool
  tokens carry no ratio, so the turn-ratio statistics do not depend on them).

Each run is one job writing ``OUT/runs/TASK__VARIANT__sSEED.json`` (curves, the critic's audit by
checkpoint from the run's ``critic_audit.jsonl``, the turn-ratio statistics); finished jobs are skipped,
so an interrupted benchmark resumes. ``--report`` (or the end of a run) aggregates whatever has finished
into ``OUT/table.md``, ``OUT/summary.json``, ``OUT/curves_TASK.png`` and ``OUT/audit_TASK.png``:

- final success = mean success over the last ``--final-window`` steps (default 20), mean over seeds
  with a 95% t-interval;
- AUC = mean success over all steps (area under the success curve per environment step; every variant
  takes the same environment steps);
- final >= ``--target`` (0.8): the seeds whose final success reaches it, with a Wilson 95% interval;
- steps-to-threshold: the first step whose trailing 10-step mean success reaches ``--threshold`` (0.9),
  median over the seeds that reached it, and how many did;
- ratios against ``--reference`` (default mpo), measured in this run: AUC and final success of each
  variant over the reference's, paired by seed, with a 95% bootstrap interval over seeds.

    python benchmarks/compare_algos.py --task credit --seeds 10 --workers 2 --out compare_algos_out
    python benchmarks/compare_algos.py --report --out compare_algos_out
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from critic_audit.algorithms import ALGORITHM_NAMES
from critic_audit.analysis.quality import wilson_interval

VARIANTS: dict[str, list[str]] = {
    **{name: [f"algo.name={name}"] for name in ALGORITHM_NAMES},  # every algorithm at its defaults
    "mpo_token_ratio": ["algo.name=mpo", 'algo.policy_loss="ppo"'],
    "mpo_beta0": ["algo.name=mpo", "algo.advantage={beta=0.0}"],
    "mpo_geomean": ["algo.name=mpo", 'algo.loss={mode="geomean"}'],
    "mpo_g4": ["algo.name=mpo", "rollout.group_size=4"],
    "mpo_ent0": ["algo.name=mpo", "algo.entropy_coef=0.0"],
    "ppo_ent0": ["algo.name=ppo", "algo.entropy_coef=0.0"],
    "mpo_nowhiten": ["algo.name=mpo", "algo.advantage={whiten=false}"],
    "mpo_ep32": ["algo.name=mpo", "rollout.episodes_per_step=32"],  # measured against 16 a step (the earlier default)
}
DEFAULT_VARIANTS = ",".join([*ALGORITHM_NAMES, "mpo_token_ratio", "mpo_beta0"])

TASKS: dict[str, list[str]] = {
    "credit": [],  # the environment's defaults
    "hard": ["env.kwargs={num_decisions=4, num_cues=4, observation_tokens=24, report_tokens=32}",
             "env.max_new_tokens=32"],
    "disparity": ["env.kwargs={decision_tokens=4, observation_tokens=600, report_tokens=128}",
                  "env.max_new_tokens=128", "env.max_context=8192"],
    "disparity_learn": ["env.kwargs={decision_tokens=4, observation_tokens=100, report_tokens=64}",
                        "env.max_new_tokens=64", "env.max_context=4096"],
}
DISPARITY_BUCKETS = (1, 8, 32, 128, 512)


def job_path(out: Path, task: str, variant: str, seed: int) -> Path:
    return out / "runs" / f"{task}__{variant}__s{seed}.json"


def overrides(task: str, variant: str, seed: int, steps: int, extra: tuple[str, ...] = ()) -> list[str]:
    over = [*TASKS[task], f"seed={seed}", f"steps={steps}", "log.rollouts_every=0", f"log.save_every={steps}",
            "log.keep_checkpoints=1", "log.audit_every=20", *extra, *VARIANTS[variant]]
    if task.startswith("disparity"):
        # MPO's loss reports the bucketed statistics itself; the trainer's batch-level ones use the
        # loss config's buckets too when it has them
        mode = "geomean" if variant == "mpo_geomean" else "product"
        if variant.startswith("mpo") and variant != "mpo_token_ratio":
            over = [o for o in over if not o.startswith("algo.loss=")]
            over.append(f'algo.loss={{mode="{mode}", length_buckets={list(DISPARITY_BUCKETS)}}}')
    return over


def run_one(args: tuple) -> dict:
    """One training run with one torch thread; writes its job file and returns its record."""
    import torch

    torch.set_num_threads(1)
    from critic_audit.train import Trainer, load_config
    from critic_audit.train.audit import read_critic_audit

    task, variant, seed, steps, out, *rest = args
    extra = tuple(rest[0]) if rest else ()
    path = job_path(Path(out), task, variant, seed)
    cfg = load_config(None, overrides(task, variant, seed, steps, extra))
    t0, c0 = time.perf_counter(), time.process_time()
    work = Path(tempfile.mkdtemp(prefix=f"{task}-{variant}-{seed}-"))
    try:
        rows = Trainer(cfg, work / "run").train()
        audits = read_critic_audit(work / "run")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    keep = ("actor/turn_ratio/", "actor/pg_clipfrac", "actor/turn_clipfrac", "critic/explained_variance",
            "rollout/response_tokens_mean")
    rec = {
        "task": task, "variant": variant, "seed": seed, "steps": steps, "seconds": time.perf_counter() - t0,
        "cpu_seconds": time.process_time() - c0, "overrides": list(extra),
        "episodes_per_step": cfg.rollout.episodes_per_step,
        "success": [r["rollout/success_rate"] for r in rows], "reward": [r["rollout/reward_mean"] for r in rows],
        "env_steps": [r["env_steps"] for r in rows],
        "metrics": [{k: v for k, v in r.items() if k.startswith(keep)} for r in rows],
        "critic_audit": audits,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(rec))
    os.replace(tmp, path)
    return rec


# ----------------------------------------------------------------------------------------------
# statistics
# ----------------------------------------------------------------------------------------------

_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
         11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 19: 2.093, 24: 2.064, 29: 2.045}


def t975(df: int) -> float:
    """Student t 0.975 quantile (table; 1.96 beyond 29 degrees of freedom)."""
    if df in _T975:
        return _T975[df]
    below = [k for k in _T975 if k <= df]
    return _T975[max(below)] if df < 30 else 1.96


def mean_ci(xs: list[float]) -> tuple[float, float, float]:
    """Mean and 95% t-interval over seeds; the interval is NaN with one seed."""
    n = len(xs)
    m = sum(xs) / n
    if n < 2:
        return m, math.nan, math.nan
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1))
    h = t975(n - 1) * sd / math.sqrt(n)
    return m, m - h, m + h


def ratio_ci(num: list[float], den: list[float], n_boot: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """mean(num) / mean(den) over paired seeds, with a 95% percentile bootstrap over seeds."""
    n = len(num)
    est = sum(num) / max(sum(den), 1e-12)
    if n < 2:
        return est, math.nan, math.nan
    rng = random.Random(seed)
    boots = []
    for _ in range(n_boot):
        idx = [rng.randrange(n) for _ in range(n)]
        d = sum(den[i] for i in idx)
        if d > 1e-12:
            boots.append(sum(num[i] for i in idx) / d)
    boots.sort()
    if not boots:
        return est, math.nan, math.nan
    return est, boots[int(0.025 * len(boots))], boots[min(len(boots) - 1, int(0.975 * len(boots)))]


def trailing(xs: list[float], k: int) -> list[float]:
    return [sum(xs[max(0, i - k + 1): i + 1]) / len(xs[max(0, i - k + 1): i + 1]) for i in range(len(xs))]


def steps_to(xs: list[float], threshold: float, k: int = 10) -> int | None:
    for i, v in enumerate(trailing(xs, k)):
        if i + 1 >= k and v >= threshold:
            return i + 1
    return None


def _nanmean(xs: list) -> float | None:
    vals = [float(x) for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))]
    return sum(vals) / len(vals) if vals else None


def _audit_at(r: dict, key: str, which: str) -> float | None:
    rows = [a for a in r.get("critic_audit", []) if (a.get(key) if not isinstance(a.get(key), dict)
                                                   else a[key].get("estimate")) is not None]
    if not rows:
        return None
    a = rows[0] if which == "first" else rows[-1]
    v = a[key]
    return v["estimate"] if isinstance(v, dict) else v


def summarize(results: list[dict], window: int, threshold: float, reference: str, target: float = 0.8) -> dict:
    out: dict = {}
    for task in TASKS:
        rt = [r for r in results if r["task"] == task]
        if not rt:
            continue
        ref = {r["seed"]: r for r in rt if r["variant"] == reference}
        rows = []
        for v in VARIANTS:
            rs = sorted((r for r in rt if r["variant"] == v), key=lambda r: r["seed"])
            if not rs:
                continue
            final = [sum(r["success"][-window:]) / len(r["success"][-window:]) for r in rs]
            auc = [sum(r["success"]) / len(r["success"]) for r in rs]
            reached = [steps_to(r["success"], threshold) for r in rs]
            hit = sorted(x for x in reached if x is not None)
            # reached the threshold at some step, then ended below it over the final window
            lost = [r["seed"] for r, st, f in zip(rs, reached, final) if st is not None and f < threshold]
            row = {
                "variant": v, "seeds": [r["seed"] for r in rs], "n": len(rs),
                "final_success": mean_ci(final), "auc_success": mean_ci(auc),
                "final_reward": mean_ci([sum(r["reward"][-window:]) / len(r["reward"][-window:]) for r in rs]),
                "steps_to_threshold_median": hit[len(hit) // 2] if hit else None, "reached": len(hit),
                "reached_ci95": wilson_interval(len(hit), len(rs)), "lost_seeds": lost,
                "final_per_seed": [round(f, 3) for f in final],
                "env_steps": rs[0]["env_steps"][-1], "seconds_per_run": sum(r["seconds"] for r in rs) / len(rs),
                "cpu_seconds_per_run": (sum(r["cpu_seconds"] for r in rs) / len(rs)
                                        if all("cpu_seconds" in r for r in rs) else None),
                "frac_seeds_final_ge_threshold": sum(f >= threshold for f in final) / len(final),
                "final_ge_target": sum(f >= target for f in final),
                "final_ge_target_ci95": wilson_interval(sum(f >= target for f in final), len(final)),
            }
            paired = [r for r in rs if r["seed"] in ref]
            if v != reference and len(paired) >= 2:
                row["auc_ratio_vs_ref"] = ratio_ci([sum(r["success"]) for r in paired],
                                                   [sum(ref[r["seed"]]["success"]) for r in paired])
                row["final_ratio_vs_ref"] = ratio_ci([sum(r["success"][-window:]) for r in paired],
                                                     [sum(ref[r["seed"]]["success"][-window:]) for r in paired])
                both = [(steps_to(r["success"], threshold), steps_to(ref[r["seed"]]["success"], threshold))
                        for r in paired]
                both = [(x, y) for x, y in both if x is not None and y is not None]
                if len(both) >= 2:
                    row["steps_diff_vs_ref"] = (*mean_ci([float(x - y) for x, y in both]), len(both))
                row["final_diff_vs_ref"] = mean_ci([sum(r["success"][-window:]) / window
                                                    - sum(ref[r["seed"]]["success"][-window:]) / window
                                                    for r in paired])
            if any(r.get("critic_audit") for r in rs):
                row["audit"] = {
                    f"{key}_{which}": _nanmean([_audit_at(r, key, which) for r in rs])
                    for key in ("eta2_median", "frac_ss_between_gt_within", "explained_variance",
                                "corr_mean_value_reward") for which in ("first", "last")
                }
                row["audit"]["steps"] = [a["step"] for a in rs[0]["critic_audit"]]
            ratio = {}
            for mode in ("product", "geomean"):
                for stat in ("clipfrac", "log_rho_var"):
                    keys = sorted({k for r in rs for m in r["metrics"] for k in m
                                   if k.startswith(f"actor/turn_ratio/{mode}/{stat}/")})
                    for k in keys:
                        ratio[k.removeprefix("actor/turn_ratio/")] = _nanmean(
                            [m.get(k) for r in rs for m in r["metrics"]])
            counts = sorted({k for r in rs for m in r["metrics"] for k in m if k.startswith("actor/turn_ratio/turn_count/")})
            for k in counts:
                ratio[k.removeprefix("actor/turn_ratio/")] = _nanmean([m.get(k) for r in rs for m in r["metrics"]])
            row["turn_ratio"] = ratio
            rows.append(row)
        out[task] = rows
    return out


def _f(x: tuple | float | None, spec: str = ".3f") -> str:
    if x is None:
        return "n/a"
    if isinstance(x, (tuple, list)):
        m, lo, hi = x
        return f"{m:{spec}}" if math.isnan(lo) else f"{m:{spec}} [{lo:{spec}}, {hi:{spec}}]"
    return f"{x:{spec}}"


def tables(summary: dict, window: int, threshold: float, reference: str, target: float = 0.8) -> str:
    md = []
    for task, rows in summary.items():
        md += [f"### task `{task}`", "",
               f"| variant | seeds | final success (last {window}) | final >= {target}: seeds [Wilson 95%] | final reward "
               f"| AUC success | steps to {threshold} (reached) "
               f"| reached {threshold}: fraction of seeds [Wilson 95%] | then lost | final / {reference} "
               f"| AUC / {reference} | final - {reference} | steps to {threshold} - {reference} (seeds) | s/run |",
               "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            stt = f"{r['steps_to_threshold_median']} ({r['reached']}/{r['n']})" if r["reached"] else f"- (0/{r['n']})"
            lo_hi = r.get("reached_ci95")
            frac = f"{r['reached'] / r['n']:.2f}" + (f" [{lo_hi[0]:.2f}, {lo_hi[1]:.2f}]" if lo_hi else "")
            g, (glo, ghi) = r["final_ge_target"], r["final_ge_target_ci95"]
            md.append(f"| {r['variant']} | {r['n']} | {_f(r['final_success'])} | {g}/{r['n']} [{glo:.2f}, {ghi:.2f}] | "
                      f"{_f(r['final_reward'])} | "
                      f"{_f(r['auc_success'])} | {stt} | "
                      f"{frac} | {len(r.get('lost_seeds', []))} | "
                      f"{_f(r.get('final_ratio_vs_ref'), '.2f')} | {_f(r.get('auc_ratio_vs_ref'), '.2f')} | "
                      f"{_f(r.get('final_diff_vs_ref'))} | "
                      + (f"{_f(r['steps_diff_vs_ref'][:3], '.1f')} ({r['steps_diff_vs_ref'][3]})" if r.get("steps_diff_vs_ref")
                         else "n/a")
                      + f" | {r['seconds_per_run']:.0f}"
                      + (f" ({r['cpu_seconds_per_run']:.0f} CPU)" if r.get("cpu_seconds_per_run") is not None else "")
                      + " |")
        aud = [r for r in rows if r.get("audit")]
        if aud:
            md += ["", "Critic audit on the run's own rollouts (mean over seeds; first = the first audit whose critic is "
                   "not flat, usually step 10-20; last = the final step's):", "",
                   "| variant | median eta2 first -> last | frac SS_B > SS_W last | explained variance first -> last "
                   "| corr(mean V, R) last |", "|---|---|---|---|---|"]
            for r in aud:
                a = r["audit"]
                md.append(f"| {r['variant']} | {_f(a['eta2_median_first'])} -> {_f(a['eta2_median_last'])} | "
                          f"{_f(a['frac_ss_between_gt_within_last'])} | {_f(a['explained_variance_first'])} -> "
                          f"{_f(a['explained_variance_last'])} | {_f(a['corr_mean_value_reward_last'])} |")
        tr = [r for r in rows if r.get("turn_ratio")]
        buckets = sorted({k.split("/", 2)[2] for r in tr for k in r["turn_ratio"] if k.startswith("product/clipfrac/")},
                         key=lambda b: int(b[1:].split(",")[0]))
        if tr and buckets:
            md += ["", "Turn-ratio statistics by turn length (mean over steps and seeds; turns per step; clip "
                   "fraction of turns outside [1 - eps_low, 1 + eps_high]; variance of log rho_k):", "",
                   "| variant | bucket (tokens) | turns/step | product clip | geomean clip | product var log rho "
                   "| geomean var log rho |", "|---|---|---|---|---|---|---|"]
            for r in tr:
                t = r["turn_ratio"]
                for b in buckets:
                    if not t.get(f"turn_count/{b}"):
                        continue
                    md.append(f"| {r['variant']} | {b} | {_f(t.get(f'turn_count/{b}'), '.1f')} | "
                              f"{_f(t.get(f'product/clipfrac/{b}'))} | {_f(t.get(f'geomean/clipfrac/{b}'))} | "
                              f"{_f(t.get(f'product/log_rho_var/{b}'), '.2e')} | "
                              f"{_f(t.get(f'geomean/log_rho_var/{b}'), '.2e')} |")
        md.append("")
        md += ["", "Final success per seed (seeds in order):", ""]
        md += [f"- {r['variant']}: {', '.join(f'{x:.3f}' for x in r['final_per_seed'])}" for r in rows]
        md.append("")
    return "\n".join(md) + "\n"


def plot(results: list[dict], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for task in TASKS:
        rt = [r for r in results if r["task"] == task]
        if not rt:
            continue
        fig, ax = plt.subplots(figsize=(9, 5.5))
        for i, v in enumerate(VARIANTS):
            rs = [r for r in rt if r["variant"] == v]
            if not rs:
                continue
            n = min(len(r["success"]) for r in rs)
            xs = rs[0]["env_steps"][:n]
            sm = [trailing(r["success"][:n], 10) for r in rs]
            stats = [mean_ci([s[t] for s in sm]) for t in range(n)]
            style = "--" if v.startswith("mpo_") else "-"
            ax.plot(xs, [s[0] for s in stats], style, color=f"C{i % 10}", lw=2.2 if v == "mpo" else 1.2,
                    label=f"{v} (n={len(rs)})")
            if len(rs) > 1:
                ax.fill_between(xs, [s[1] for s in stats], [s[2] for s in stats], color=f"C{i % 10}", alpha=0.08)
        ax.set_xlabel("environment steps (assistant turns)")
        ax.set_ylabel("success rate (10-step trailing mean)")
        ax.set_ylim(-0.02, 1.02)
        ax.set_title(f"credit task '{task}': mean over seeds, 95% t-interval")
        ax.legend(fontsize=7, ncol=2)
        fig.tight_layout()
        p = out / f"curves_{task}.png"
        fig.savefig(p, dpi=110)
        plt.close(fig)
        written.append(p)
        crit = [v for v in VARIANTS if any(r["variant"] == v and r.get("critic_audit") for r in rt)]
        if crit:
            fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
            for i, v in enumerate(VARIANTS):
                if v not in crit:
                    continue
                rs = [r for r in rt if r["variant"] == v and r.get("critic_audit")]
                steps = sorted({a["step"] for r in rs for a in r["critic_audit"]})
                for ax, key in zip(axes, ("eta2_median", "explained_variance")):
                    ys = [_nanmean([next(((a[key]["estimate"] if isinstance(a[key], dict) else a[key])
                                          for a in r["critic_audit"] if a["step"] == s), None) for r in rs])
                          for s in steps]
                    ax.plot(steps, [math.nan if y is None else y for y in ys], "o-" if v == "mpo" else ".-",
                            color=f"C{i % 10}", ms=3, label=v)
            axes[0].set_title("median eta2 of the run's critic (mean over seeds)")
            axes[1].set_title("explained variance of the run's critic")
            for ax in axes:
                ax.set_xlabel("training step")
                ax.legend(fontsize=7)
            axes[1].set_ylim(-0.5, 1.02)
            fig.tight_layout()
            p = out / f"audit_{task}.png"
            fig.savefig(p, dpi=110)
            plt.close(fig)
            written.append(p)
    return written


def load_results(out: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((out / "runs").glob("*.json"))] if (out / "runs").exists() else []


def report(out: Path, window: int, threshold: float, reference: str, target: float = 0.8) -> str:
    results = load_results(out)
    if not results:
        raise SystemExit(f"no finished runs under {out}/runs")
    summary = summarize(results, window, threshold, reference, target)
    md = tables(summary, window, threshold, reference, target)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    (out / "table.md").write_text(md)
    plot(results, out)
    return md


def main() -> None:
    ap = argparse.ArgumentParser(
        description="MPO against its baselines and ablations at equal environment steps on the synthetic credit "
                    "task; one job file per (task, variant, seed), resumable; --report aggregates.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--task", default="credit", help=f"comma-separated: {', '.join(TASKS)}")
    ap.add_argument("--seeds", type=int, default=10, help="seeds 0..N-1 (with --seed-offset)")
    ap.add_argument("--seed-offset", type=int, default=0, help="first seed")
    ap.add_argument("--steps", type=int, default=None,
                    help="training steps per run (default: the trainer's, 150 steps of 64 episodes)")
    ap.add_argument("--workers", type=int, default=1, help="runs in parallel, one torch thread each")
    ap.add_argument("--final-window", type=int, default=20, help="final success = mean over the last N steps")
    ap.add_argument("--threshold", type=float, default=0.9, help="success level for steps-to-threshold")
    ap.add_argument("--target", type=float, default=0.8,
                    help="final success level counted per seed (the 'final >= target: seeds' column)")
    ap.add_argument("--reference", default="mpo", help="variant the paired ratios and differences are taken against")
    ap.add_argument("--variants", default=DEFAULT_VARIANTS, help=f"comma-separated, known: {', '.join(VARIANTS)}")
    ap.add_argument("--set", action="append", default=[], dest="extra",
                    help="a trainer override for every run of this --out (repeatable), e.g. rollout.episodes_per_step=16; "
                         "keep one setting per --out folder: finished jobs are skipped by name")
    ap.add_argument("--report", action="store_true", help="only aggregate the finished runs")
    ap.add_argument("--out", type=Path, default=Path("compare_algos_out"),
                    help="folder of job files (runs/) and the report (table.md, summary.json, *.png)")
    a = ap.parse_args()
    if a.steps is None:
        from critic_audit.train.config import TrainConfig

        a.steps = TrainConfig().steps
    if not a.report:
        tasks = [t for t in a.task.split(",") if t]
        variants = [v for v in a.variants.split(",") if v]
        bad = [v for v in variants if v not in VARIANTS] + [t for t in tasks if t not in TASKS]
        if bad:
            raise SystemExit(f"unknown variant(s)/task(s) {bad}; variants: {', '.join(VARIANTS)}; tasks: {', '.join(TASKS)}")
        jobs = [(t, v, s, a.steps, str(a.out), tuple(a.extra)) for t in tasks
                for s in range(a.seed_offset, a.seed_offset + a.seeds) for v in variants
                if not job_path(a.out, t, v, s).exists()]
        print(f"{len(jobs)} run(s) to do, {a.workers} worker(s)", flush=True)
        t0 = time.perf_counter()
        with ProcessPoolExecutor(max_workers=a.workers) as pool:
            for r in pool.map(run_one, jobs):
                f = sum(r["success"][-a.final_window:]) / len(r["success"][-a.final_window:])
                print(f"{r['task']:>9} {r['variant']:>16} seed {r['seed']}: final success {f:.3f} "
                      f"({r['seconds']:.0f} s)", flush=True)
        print(f"wall time {time.perf_counter() - t0:.0f} s", flush=True)
    print(report(a.out, a.final_window, a.threshold, a.reference, a.target))
    print(f"wrote {a.out}/table.md, summary.json, curves_*.png, audit_*.png")


if __name__ == "__main__":
    main()
