#!/usr/bin/env bash
# Where a decode step's time goes, on the GPU machine: KV-cache generation at the Qwen3-0.6B shape
# (random bf16 weights, batch B, prompts of up to P tokens, N new tokens, greedy unless a
# temperature is given) under ORT's profiler with CUDA_LAUNCH_BLOCKING=1, so each node's time is
# its kernel time, not its launch. CUDA graphs are off (a replayed graph has no per-node events),
# so read the shares, not the total. Prints the time per op type and per scope of decode run 20
# (profile_summary.py --run 20: past the first runs' arena growth, before the bench's batch-1
# runs after its weight swap). Needs .bundle/lathe-kv-generate.js and the device runtime sourced
# (/opt/device-rt/env.sh).
#
# usage: bash tools/bench/rollout/profile-decode.sh [batch=256] [prompt=256] [new=32] [temperature=0]
set -uo pipefail
cd "$(dirname "$0")/../../.."
B=${1:-256} P=${2:-256} N=${3:-32} T=${4:-0}
out="${OUT:-/tmp}"
D=/tmp/kv-profile
bash tools/bench/rollout/qwen3-inputs.sh "$D" "$B" "$P"
CUDA_LAUNCH_BLOCKING=1 node .bundle/lathe-kv-generate.js --model "$D/model" --prompts "$D/prompts.json" --max-new "$N" \
  --dtype bfloat16 --temperature "$T" --repeat 1 --device cuda --profile "$out/decode" > "$out/profile-run.json" 2> "$out/profile-run.log"
# The decode session's profile is the one with the most runs (the prefill session has one per batch).
profile=$(for f in "$out"/decode*.json; do echo "$(grep -o '"model_run"' "$f" | wc -l) $f"; done | sort -n | tail -1 | cut -d' ' -f2)
[ -n "$profile" ] || { echo "no profile written; see $out/profile-run.log"; tail -5 "$out/profile-run.log"; exit 1; }
python3 tools/bench/rollout/profile_summary.py "$profile" --top 30 --by-scope --run 20 | tee "$out/profile-summary.txt"
