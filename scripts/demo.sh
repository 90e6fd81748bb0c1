#!/usr/bin/env bash
# README command one: set up, then let the audit tell a weak critic from a structured one.
#   1. the shipped SmolLM2-135M critic, fitted by `fit-critic --method layers --train-layers 2 --epochs 0
#      --weighting token` (a ridge head on the frozen model) on 128 tau-bench and 425 FireAct rollouts of
#      other tasks (on their held-out tasks it passes the gate by trajectories, not by tasks), on real
#      tau-bench and FireAct rollouts ->
#      audit_out/ (the quality gate says whether it explains the outcome here, and why not; docs/audit.md
#      "The demo's critic")
#   2. the critics of a small PPO run of our own trainer, one per checkpoint, re-audited from the values
#      shipped in sample_data/credit_ppo_run (no critic needed) -> audit_trained/
#      (expected: critic_too_weak while the critic learns; once it explains the outcome, step_199 leans
#      turn_level but is inconclusive: 16 rollouts leave fraction (a) 0.812 [0.570, 0.934] across 0.7)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
# Backbone SmolLM2-135M-Instruct (converted once from GGUF into a cached HF folder) + the value head fitted by
# `critic-audit fit-critic --method layers --epochs 0 --weighting token` on tau-bench and FireAct rollouts
# task-disjoint from the audited sample (sample_data/critic_fit/; scripts/fit_demo_critic.sh refits it).
critic-audit build-critic --backbone smollm2-135m --head sample_data/critic/smollm2_fitted_head.safetensors \
  --out .cache/critic-smollm2 --overwrite
echo "== 1/2: the fitted SmolLM2 critic on real rollouts =="
critic-audit analyze sample_data/tau_bench_airline sample_data/fireact_hotpotqa \
  --critic .cache/critic-smollm2 --out audit_out "$@"   # float32: bf16 shifts eta2 (docs/critics.md)
echo "== 2/2: our PPO run's critics, by checkpoint (values shipped in sample_data/credit_ppo_run) =="
critic-audit analyze sample_data/credit_ppo_run/rollouts --out audit_trained
echo "Reports: audit_out/report.html (weak critic) and audit_trained/report.html (trained critics by checkpoint)."
