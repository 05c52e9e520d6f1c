#!/usr/bin/env bash
# Training-step speed on the GPU machine, every variant the training issue asks about, in one call:
# PyTorch eager + transformers against Lathe (composed attention, flash attention, recomputation,
# LoRA r=16) on the Qwen3-0.6B shape at 8 × 1024, and Lathe on the 1.7B shape. Each line of
# $OUT/train-speed.jsonl is one step_speed.py report (ratio = PyTorch step / Lathe step, measured
# in the same process tree). Needs .bundle/lathe-step.js (bash tools/bench/build-device-bundles.sh
# lathe-step) and the device runtime sourced (/opt/device-rt/env.sh).
#
# usage: bash tools/bench/train/speed-suite.sh [group ...]
#   groups: full lora 1.7b (default: these three), and on request:
#   graph    8 × 1024, full and LoRA, PyTorch against Lathe with and without CUDA-graph replay
#   largest  each side's largest micro-batch: PyTorch at 14, Lathe at 16 and 20, with and without CUDA graph
#   largest-lora  the same for LoRA r=16: PyTorch at 16 and 20, Lathe at 16 and 20 (and CUDA graph at 16)
#   compile  PyTorch with torch.compile at 8 × 1024 (PyTorch only)
set -uo pipefail
cd "$(dirname "$0")/../../.."
out="${OUT:-/tmp}/train-speed.jsonl"
log="${OUT:-/tmp}/train-speed.log"
groups=("${@:-full lora 1.7b}")
groups=(${groups[*]})
speed() { # one step_speed.py run; a failure is logged and the suite goes on
  echo "== step_speed.py $*" | tee -a "$log"
  timeout "${SPEED_TIMEOUT:-300}" python3 tools/reference/train/step_speed.py --steps 3 --out /tmp/lathe-speed "$@" 2>>"$log" | tee -a "$out" || echo "{\"failed\": \"$*\"}" | tee -a "$out"
}
has() { [[ " ${groups[*]} " == *" $1 "* ]]; }
if has full; then
  # PyTorch at 8 × 1024 in one micro-batch; Lathe in 2 micro-batches of 4 (what fitted before), composed attention
  speed --batch 8 --seq 1024 --micro 2 --lathe-args="--shared-arena"
  speed --batch 8 --seq 1024 --micro 2 --skip-torch --lathe-args="--shared-arena --flash-attention"
  speed --batch 8 --seq 1024 --micro 1 --skip-torch --lathe-args="--shared-arena --flash-attention"
  speed --batch 8 --seq 1024 --micro 1 --skip-torch --lathe-args="--shared-arena --flash-attention --recompute"
fi
if has lora; then
  speed --batch 8 --seq 1024 --micro 1 --lora 16 --lathe-args="--shared-arena --flash-attention"
fi
flash="--shared-arena --flash-attention"
if has graph; then
  speed --steps 5 --batch 8 --seq 1024 --lathe-args="$flash"
  speed --steps 5 --batch 8 --seq 1024 --skip-torch --lathe-args="$flash --cuda-graph"
  speed --steps 5 --batch 8 --seq 1024 --lora 16 --lathe-args="$flash"
  speed --steps 5 --batch 8 --seq 1024 --lora 16 --skip-torch --lathe-args="$flash --cuda-graph"
fi
if has largest; then
  speed --steps 4 --batch 14 --seq 1024 --skip-lathe
  for b in 16 20; do
    speed --steps 4 --batch $b --seq 1024 --skip-torch --lathe-args="$flash"
    speed --steps 4 --batch $b --seq 1024 --skip-torch --lathe-args="$flash --cuda-graph"
  done
fi
if has largest-lora; then
  for b in 16 20; do
    speed --steps 4 --batch $b --seq 1024 --lora 16 --skip-lathe
    speed --steps 4 --batch $b --seq 1024 --lora 16 --skip-torch --lathe-args="$flash"
  done
  speed --steps 4 --batch 16 --seq 1024 --lora 16 --skip-torch --lathe-args="$flash --cuda-graph"
fi
if has compile; then
  SPEED_TIMEOUT=420 speed --steps 5 --batch 8 --seq 1024 --skip-lathe --torch-compile
fi
if has 1.7b; then
  speed --shape 1.7b --batch 8 --seq 1024 --micro 4 --skip-torch --lathe-args="--shared-arena --flash-attention --recompute"
fi
