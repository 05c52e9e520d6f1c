#!/usr/bin/env bash
# Inputs of the KV-cache generation benches (GPU machine): a random Qwen3-0.6B-shape model in bf16
# (written once to DIR/model) and BATCH ragged prompts of up to PLEN tokens (DIR/prompts.json), both
# from tools/reference/rollout/generate_bench.py so every bench and transformers see the same.
# usage: bash tools/bench/rollout/qwen3-inputs.sh DIR BATCH PLEN
set -euo pipefail
cd "$(dirname "$0")/../../.."
mkdir -p "$1"
python3 - "$1" "$2" "$3" <<'PY'
import json, os, sys
import torch
sys.path.insert(0, "tools/reference/rollout")
import generate_bench as g
out, batch, plen = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
if not os.path.exists(os.path.join(out, "model", "config.json")):
    g.save_random(g.qwen3_06b(), os.path.join(out, "model"), torch.bfloat16, 0.02)
json.dump(g.prompts(151936, batch, plen, 2), open(os.path.join(out, "prompts.json"), "w"))
PY
