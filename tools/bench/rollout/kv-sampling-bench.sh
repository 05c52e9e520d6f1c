#!/usr/bin/env bash
# KV-cache generation on the Qwen3-0.6B shape (random bf16 weights), greedy vs sampled (temperature 1),
# CUDA graphs on: the cost of sampling over a 151,936-token vocabulary per decode step.
# Runs on the GPU machine after the device boot (see ../shared/device/README.md), with .bundle built
# by tools/bench/build-device-bundles.sh lathe-kv-generate. Prints one JSON line per run.
# usage: bash tools/bench/rollout/kv-sampling-bench.sh [batch=256] [prompt=256] [new=512]
set -euo pipefail
cd "$(dirname "$0")/../../.."
B=${1:-256} P=${2:-256} N=${3:-512}
D=${OUT:-/tmp}/kv-sampling
mkdir -p "$D"
python3 - "$D" "$B" "$P" <<'PY'
import json, os, sys
import torch
sys.path.insert(0, "tools/reference/rollout")
import generate_bench as g
out, batch, plen = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
if not os.path.exists(os.path.join(out, "model", "config.json")):
    g.save_random(g.qwen3_06b(), os.path.join(out, "model"), torch.bfloat16, 0.02)
json.dump(g.prompts(151936, batch, plen, 2), open(os.path.join(out, "prompts.json"), "w"))
PY
for T in 0 1; do
  node .bundle/lathe-kv-generate.js --model "$D/model" --prompts "$D/prompts.json" --max-new "$N" --dtype bfloat16 \
    --temperature "$T" --repeat 2 --cuda-graph --device cuda | tail -1
done
