#!/usr/bin/env bash
# KV-cache generation on the Qwen3-0.6B shape (random bf16 weights), greedy vs sampled (temperature 1),
# CUDA graphs on: the cost of sampling over a 151,936-token vocabulary per decode step.
# Runs on the GPU machine after the device boot (see ../shared/device/README.md), with .bundle built
# by tools/bench/build-device-bundles.sh lathe-kv-generate. Prints one JSON line per run.
# usage: bash tools/bench/rollout/kv-sampling-bench.sh [batch=256] [prompt=256] [new=512]
set -euo pipefail
cd "$(dirname "$0")/../../.."
B=${1:-256} P=${2:-256} N=${3:-512}
D=/tmp/kv-sampling
bash tools/bench/rollout/qwen3-inputs.sh "$D" "$B" "$P"
for T in 0 1; do
  node .bundle/lathe-kv-generate.js --model "$D/model" --prompts "$D/prompts.json" --max-new "$N" --dtype bfloat16 \
    --temperature "$T" --repeat 2 --cuda-graph --device cuda | tail -1
done
