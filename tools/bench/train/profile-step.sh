#!/usr/bin/env bash
# Where a training step's time goes, on the GPU machine: one Lathe step at the Qwen3-0.6B shape
# (8 × 1024, bf16, flash attention; extra lathe-step flags are added) for 3 runs under ORT's profiler
# with CUDA_LAUNCH_BLOCKING=1, so each node's time is its kernel time rather than its launch, then
# the time per op type and per scope (layer*/attn, grad/layer*/mlp, optimizer, …) from
# tools/bench/rollout/profile_summary.py. Blocking launches make the step slower than in
# train-speed runs; read the shares, not the total. Needs .bundle/lathe-step.js and the device
# runtime sourced (/opt/device-rt/env.sh).
#
# usage: bash tools/bench/train/profile-step.sh [extra lathe-step flags]
set -uo pipefail
cd "$(dirname "$0")/../../.."
out="${OUT:-/tmp}"
flags="--shared-arena --flash-attention $*"
CUDA_LAUNCH_BLOCKING=1 python3 tools/reference/train/step_speed.py --skip-torch --steps 3 --batch 8 --seq 1024 --micro 1 \
  --out /tmp/lathe-profile --lathe-args="$flags --profile $out/train-step" > "$out/profile-run.json" 2> "$out/profile-run.log"
profile=$(ls -t "$out"/train-step*.json 2>/dev/null | head -1)
[ -n "$profile" ] || { echo "no profile written; see $out/profile-run.log"; tail -5 "$out/profile-run.log"; exit 1; }
python3 tools/bench/rollout/profile_summary.py "$profile" --top 40 --by-scope --last-run | tee "$out/profile-summary.txt"
