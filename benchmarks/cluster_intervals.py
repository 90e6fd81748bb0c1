"""Clustered rollouts: why the audit resamples whole groups / tasks (docs/audit.md, "Clustered rollouts").

Two simulations, printed as Markdown tables (docs/audit.md holds a copy with this command):

  (a) the gate's permutation test under H0 with clustered rewards: tasks of ``trials`` trials, each
      task its own success rate (Beta(0.3, 0.3): most tasks mostly succeed or mostly fail) and its own
      value offset, independently of each other (values know nothing of the outcome). The share of data
      sets whose one-sided test rejects at alpha = 0.05, permuting trajectories (the old test) and
      permuting within and among clusters (the gate's test when clusters exist); 400 permutations.
  (b) the coverage of the median's 95% bootstrap interval: per-trajectory values = 0.5 + a cluster
      effect N(0, 0.15^2) + N(0, 0.05^2); the population median is that of the mixture (from 200,000
      draws). Coverage and mean width of the trajectory bootstrap and of the cluster bootstrap, 1000
      resamples.

    python benchmarks/cluster_intervals.py [--sets 1000] [--coverage-sets 300]

Deterministic (data set s uses seed s). About 1 minute on 2 busy CPU cores.
"""

from __future__ import annotations

import argparse
import dataclasses

import numpy as np

from critic_audit.analysis.clusters import cluster_bootstrap_ci
from critic_audit.analysis.decompose import bootstrap_ci
from critic_audit.analysis.quality import GateConfig, TrajectorySums, outcome_split, quality_gate


def null_sums(seed: int, tasks: int, trials: int, tokens: int = 20) -> TrajectorySums:
    """(a)'s data set ``seed``: one stratum, clusters = tasks."""
    rng = np.random.default_rng(seed)
    cols: dict[str, list] = {k: [] for k in ("reward", "mean_value", "n_tokens", "err_mean", "err_m2", "cluster")}
    for c in range(tasks):
        p, off = rng.beta(0.3, 0.3), rng.normal()
        for _ in range(trials):
            r = float(rng.random() < p)
            v = 0.5 + 0.3 * off + 0.05 * rng.normal() + 0.1 * rng.normal(size=tokens)
            e = r - v
            for k, x in (("reward", r), ("mean_value", v.mean()), ("n_tokens", float(tokens)),
                         ("err_mean", e.mean()), ("err_m2", ((e - e.mean()) ** 2).sum()), ("cluster", c)):
                cols[k].append(x)
    d = {k: np.asarray(v) for k, v in cols.items()}
    return TrajectorySums(stratum=np.zeros(d["reward"].size, int), positive=outcome_split(d["reward"]), **d)


def rejection_rates(sets: int, tasks: int, trials: int) -> tuple[float, float, int]:
    """(trajectory test, cluster test) rejection rates at alpha = 0.05, and the data sets measured."""
    rej_t = rej_c = n = 0
    for seed in range(sets):
        t = null_sums(seed, tasks, trials)
        cfg = GateConfig(n_perm=400, n_boot=1, seed=seed, min_per_outcome=1)  # the test runs first: same draws
        p_c = quality_gate(t, cfg).corr_within_stratum.p_value
        p_t = quality_gate(dataclasses.replace(t, cluster=None), cfg).corr_within_stratum.p_value
        if p_c is None or p_t is None:  # one outcome only: nothing to test
            continue
        n += 1
        rej_t += p_t < 0.05
        rej_c += p_c < 0.05
    return rej_t / n, rej_c / n, n


def coverage(sets: int, clusters: int, size: int, truth: float) -> tuple[float, float, float, float]:
    """(coverage, mean width) of the trajectory and of the cluster bootstrap interval of the median."""
    cov_t = cov_c = w_t = w_c = 0.0
    for s in range(sets):
        rng = np.random.default_rng(s)
        x = 0.5 + np.repeat(rng.normal(0, 0.15, clusters), size) + rng.normal(0, 0.05, clusters * size)
        _, lo, hi = bootstrap_ci(x, n_boot=1000, seed=s)
        _, lo2, hi2, _ = cluster_bootstrap_ci(x, np.repeat(np.arange(clusters), size), n_boot=1000, seed=s)
        cov_t += lo <= truth <= hi
        cov_c += lo2 <= truth <= hi2
        w_t += hi - lo
        w_c += hi2 - lo2
    return cov_t / sets, w_t / sets, cov_c / sets, w_c / sets


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sets", type=int, default=1000)
    ap.add_argument("--coverage-sets", type=int, default=300)
    a = ap.parse_args()
    print("(a) permutation test under H0, clustered rewards (alpha = 0.05)\n")
    print("| tasks x trials | data sets | rejected, permuting trajectories | rejected, permuting clusters |")
    print("|---|---|---|---|")
    for tasks, trials in ((8, 8), (7, 4), (20, 4)):
        rt, rc, n = rejection_rates(a.sets, tasks, trials)
        print(f"| {tasks} x {trials} | {n} | {100 * rt:.1f}% | {100 * rc:.1f}% |")
    rng = np.random.default_rng(123)
    truth = float(np.median(0.5 + rng.normal(0, 0.15, 200_000) + rng.normal(0, 0.05, 200_000)))
    print("\n(b) 95% interval of the median: coverage (mean width)\n")
    print("| clusters x size | data sets | trajectory bootstrap | cluster bootstrap |")
    print("|---|---|---|---|")
    for clusters, size in ((10, 4), (8, 8), (20, 4)):
        ct, wt, cc, wc = coverage(a.coverage_sets, clusters, size, truth)
        print(f"| {clusters} x {size} | {a.coverage_sets} | {100 * ct:.1f}% ({wt:.3f}) | {100 * cc:.1f}% ({wc:.3f}) |")


if __name__ == "__main__":
    main()
