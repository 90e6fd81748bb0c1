#!/usr/bin/env bash
# README command one: set up, obtain the real SmolLM2-based critic, audit the sample rollouts.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
# Backbone SmolLM2-135M-Instruct (converted once from GGUF into a cached HF folder) + the value head
# fitted by `critic-audit fit-critic` on held-out tau-bench and FireAct rollouts (sample_data/critic/).
critic-audit build-critic --backbone smollm2-135m --head sample_data/critic/smollm2_value_head.safetensors \
  --out .cache/critic-smollm2 --overwrite
critic-audit analyze sample_data/tau_bench_airline sample_data/fireact_hotpotqa \
  --critic .cache/critic-smollm2 --dtype bfloat16 --out audit_out "$@"
