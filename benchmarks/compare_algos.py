"""MPO against GRPO, GSPO, PPO, VAPO and SAO, plus two MPO ablations, on the synthetic credit-assignment
environment (``critic_audit.train.envs.credit``), with an equal budget of environment steps.

Every run: the same tiny Llama (2 layers, hidden 64, trained from scratch), the same environment
settings, the same number of training steps and episodes per step (``--episodes``; group methods and
MPO sample ``--episodes / G`` prompts G times, PPO/VAPO/SAO ``--episodes`` prompts once), so every run
takes the same number of environment steps (assistant turns). Ablations: ``mpo_token_ratio`` (MAE
advantages with PPO's token ratio instead of the turn ratio) and ``mpo_beta0`` (beta = 0: one advantage
per turn).

Writes ``OUT/results.json`` (per run: the success-rate and reward curves), ``OUT/table.md`` (final success
rate = mean of the last ``--final-window`` steps, mean +- standard error over seeds; area under the
success-rate learning curve = mean success over all steps; final reward; seconds per run) and
``OUT/curves.png``. One thread per run; ``--workers`` runs in parallel.

    python benchmarks/compare_algos.py --seeds 5 --steps 60 --workers 2 --out compare_algos_out
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

VARIANTS: dict[str, list[str]] = {
    "mpo": ["algo.name=mpo"],
    "grpo": ["algo.name=grpo"],
    "gspo": ["algo.name=gspo"],
    "ppo": ["algo.name=ppo"],
    "vapo": ["algo.name=vapo"],
    "sao": ["algo.name=sao"],
    "mpo_token_ratio": ["algo.name=mpo", 'algo.policy_loss="ppo"'],
    "mpo_beta0": ["algo.name=mpo", "algo.advantage={beta=0.0}"],
}
GROUP = {"mpo": 4, "grpo": 4, "gspo": 4, "mpo_token_ratio": 4, "mpo_beta0": 4, "ppo": 1, "vapo": 1, "sao": 1}

ENV = ("env.kwargs={num_decisions=2, num_choices=2, num_cues=2, decision_tokens=2, report_tokens=12, "
       "observation_tokens=12, reward=\"fraction\", format_bonus=0.1}")


def run_one(args: tuple[str, int, int, int, float]) -> dict:
    import torch

    torch.set_num_threads(1)
    from critic_audit.train import Trainer, load_config

    variant, seed, steps, episodes, lr = args
    g = GROUP[variant]
    over = [ENV, f"seed={seed}", f"steps={steps}", f"rollout.group_size={g}",
            f"rollout.prompts_per_step={episodes // g}", f"optim.lr={lr}", f"optim.critic_lr={lr}",
            "log.rollouts_every=0", f"log.save_every={steps}", "log.keep_checkpoints=1", "env.max_new_tokens=12",
            *VARIANTS[variant]]
    cfg = load_config(None, over)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as d:
        rows = Trainer(cfg, Path(d) / "run").train()
    return {
        "variant": variant, "seed": seed, "seconds": time.perf_counter() - t0,
        "success": [r["rollout/success_rate"] for r in rows], "reward": [r["rollout/reward_mean"] for r in rows],
        "env_steps": [r["env_steps"] for r in rows],
        "explained_variance": [r.get("critic/explained_variance") for r in rows],
        "turn_clipfrac": [r.get("actor/turn_ratio/product/clipfrac") for r in rows],
    }


def mean_se(xs: list[float]) -> tuple[float, float]:
    n = len(xs)
    m = sum(xs) / n
    if n < 2:
        return m, math.nan
    var = sum((x - m) ** 2 for x in xs) / (n - 1)
    return m, math.sqrt(var / n)


def summarize(results: list[dict], window: int) -> list[dict]:
    out = []
    for v in VARIANTS:
        rs = [r for r in results if r["variant"] == v]
        if not rs:
            continue
        final = [sum(r["success"][-window:]) / len(r["success"][-window:]) for r in rs]
        auc = [sum(r["success"]) / len(r["success"]) for r in rs]
        frew = [sum(r["reward"][-window:]) / len(r["reward"][-window:]) for r in rs]
        secs = [r["seconds"] for r in rs]
        out.append({"variant": v, "seeds": len(rs), "final_success": mean_se(final), "auc_success": mean_se(auc),
                    "final_reward": mean_se(frew), "seconds_per_run": sum(secs) / len(secs),
                    "env_steps": rs[0]["env_steps"][-1]})
    return out


def table(summary: list[dict], window: int) -> str:
    lines = [f"| variant | seeds | final success (last {window} steps) | AUC success | final reward | env steps | s/run |",
             "|---|---|---|---|---|---|---|"]
    for s in summary:
        f, a, r = s["final_success"], s["auc_success"], s["final_reward"]
        lines.append(f"| {s['variant']} | {s['seeds']} | {f[0]:.3f} +- {f[1]:.3f} | {a[0]:.3f} +- {a[1]:.3f} | "
                     f"{r[0]:.3f} +- {r[1]:.3f} | {s['env_steps']} | {s['seconds_per_run']:.0f} |")
    return "\n".join(lines) + "\n"


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for v in VARIANTS:
        rs = [r for r in results if r["variant"] == v]
        if not rs:
            continue
        n = min(len(r["success"]) for r in rs)
        xs = rs[0]["env_steps"][:n]
        ms, ses = zip(*(mean_se([r["success"][i] for r in rs]) for i in range(n)))
        k = 5  # moving average over steps, for readability
        sm = [sum(ms[max(0, i - k + 1): i + 1]) / len(ms[max(0, i - k + 1): i + 1]) for i in range(n)]
        se = [sum(ses[max(0, i - k + 1): i + 1]) / len(ses[max(0, i - k + 1): i + 1]) for i in range(n)]
        style = "--" if v.startswith("mpo_") else "-"
        ax.plot(xs, sm, style, label=v, lw=2 if v == "mpo" else 1.2)
        if not any(math.isnan(x) for x in se):
            ax.fill_between(xs, [a - b for a, b in zip(sm, se)], [a + b for a, b in zip(sm, se)], alpha=0.12)
    ax.set_xlabel("environment steps (assistant turns)")
    ax.set_ylabel("success rate (5-step moving average)")
    ax.set_title("credit-assignment env: mean over seeds +- s.e.")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--episodes", type=int, default=16, help="episodes per training step (all variants)")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--final-window", type=int, default=10)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--out", type=Path, default=Path("compare_algos_out"))
    a = ap.parse_args()
    variants = [v for v in a.variants.split(",") if v]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise SystemExit(f"unknown variant(s) {unknown}; known: {', '.join(VARIANTS)}")
    jobs = [(v, s, a.steps, a.episodes, a.lr) for s in range(a.seeds) for v in variants]
    a.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    results = []
    with ProcessPoolExecutor(max_workers=a.workers) as pool:
        for r in pool.map(run_one, jobs):
            results.append(r)
            print(f"{r['variant']:>16} seed {r['seed']}: final success {sum(r['success'][-a.final_window:]) / a.final_window:.3f}"
                  f" ({r['seconds']:.0f} s)", flush=True)
            (a.out / "results.json").write_text(json.dumps(results))
    summary = summarize(results, a.final_window)
    md = table(summary, a.final_window)
    (a.out / "table.md").write_text(md + f"\ntotal wall time {time.perf_counter() - t0:.0f} s, workers {a.workers}\n")
    plot(results, a.out / "curves.png")
    print(md)
    print(f"wrote {a.out}/table.md, results.json, curves.png")


if __name__ == "__main__":
    main()
