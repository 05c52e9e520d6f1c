#!/usr/bin/env bash
# GPU time per kernel of a command, from Nsight Compute (ncu, in the GPU machine's CUDA toolkit):
# each kernel's gpu__time_duration with caches and clocks left alone (--cache-control none
# --clock-control none), so the times are what the kernels take in a normal run, not under ncu's
# defaults (flushed caches, base clocks). ncu serialises kernels, so launch gaps do not show: the
# sum of kernel times against a run's wall time says how much of it is GPU work. Kernels
# [skip, skip + count) of the command are measured (skip the session's set-up and warm-up runs).
# Writes $OUT/<name>.csv (one row per kernel: index, name, microseconds) and prints
# kernel_summary.py's table of it.
#
# usage: bash tools/bench/kernel-times.sh NAME SKIP COUNT command [args ...]
set -uo pipefail
name=$1 skip=$2 count=$3
shift 3
out="${OUT:-/tmp}"
ncu=/usr/local/cuda/bin/ncu
rep=/tmp/kernel-times-$name
$ncu --cache-control none --clock-control none --metrics gpu__time_duration.sum --launch-skip "$skip" --launch-count "$count" \
  -o "$rep" -f "$@" > "$out/$name.run.log" 2>&1
echo "command exit: $?"
$ncu --import "$rep.ncu-rep" --csv --page raw --metrics gpu__time_duration.sum 2>/dev/null | python3 -c '
import csv, sys
rows = list(csv.reader(sys.stdin))
head = rows[0]
i, n = head.index("gpu__time_duration.sum"), head.index("Kernel Name")
scale = {"ns": 1e-3, "us": 1.0, "usecond": 1.0, "nsecond": 1e-3, "ms": 1e3, "msecond": 1e3}[rows[1][i]]
w = csv.writer(sys.stdout)
w.writerow(["index", "kernel", "us"])
for k, r in enumerate(rows[2:]):
    w.writerow([k, r[n], float(r[i].replace(",", "")) * scale])
' > "$out/$name.csv"
python3 "$(dirname "$0")/kernel_summary.py" "$out/$name.csv" | tee "$out/$name.summary.txt"
