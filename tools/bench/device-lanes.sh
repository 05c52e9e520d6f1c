#!/usr/bin/env bash
# Runs independent single-GPU measurements side by side on a multi-GPU machine, one lane a GPU, each
# lane's commands in order, and gathers every lane's output in ONE file ($OUT/lanes.log, lines
# prefixed by lane), since a device call brings back only so many files. Lanes share the host's CPUs
# and memory bandwidth: say so beside any figure measured this way.
# usage: bash tools/bench/device-lanes.sh 'cmd; cmd' 'cmd' ...   (lane i runs on GPU i)
#   On a host with fewer GPUs than lanes, lane i runs on GPU i mod n after the lanes before it there.
#   LANE_TIMEOUT (s, default 560) bounds each GPU's commands; LANE_GPUS overrides the GPU count (nvidia-smi -L);
#   NCCL_NVLS_ENABLE=0 is set for every process.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/lanes}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
[ $# -gt 0 ] || { echo "usage: device-lanes.sh 'commands for GPU 0' ['commands for GPU 1' ...]" >&2; exit 2; }
gpus=${LANE_GPUS:-$(nvidia-smi -L 2> /dev/null | grep -c '^GPU')}
[ "$gpus" -ge 1 ] 2> /dev/null || gpus=$#
lanes=("$@")
if [ $# -gt "$gpus" ]; then
  echo "device-lanes.sh: $# lanes on $gpus GPU(s): lane i runs on GPU i mod $gpus, after the lanes before it there" >&2
  folded=()
  for ((g = 0; g < gpus; g++)); do
    joined=""
    for ((l = g; l < $#; l += gpus)); do joined+="${lanes[l]}"$'\n'; done
    folded+=("$joined")
  done
  lanes=("${folded[@]}")
fi
i=0
for cmds in "${lanes[@]}"; do
  ( export CUDA_VISIBLE_DEVICES=$i
    timeout -k 5 "${LANE_TIMEOUT:-560}" bash -c "$cmds" > "$OUT/lane$i.tmp" 2>&1
    echo "lane $i exit $?" >> "$OUT/lane$i.tmp" ) &
  i=$((i + 1))
done
wait
for ((k = 0; k < i; k++)); do sed "s/^/[$k] /" "$OUT/lane$k.tmp"; rm -f "$OUT/lane$k.tmp"; done > "$OUT/lanes.log"
grep -E '^\[[0-9]+\] (lane [0-9]+ exit|\{"(summary|phase":"(summary|time|generate|kl)))' "$OUT/lanes.log" | cut -c1-600
