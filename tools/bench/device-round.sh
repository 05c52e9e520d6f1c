#!/usr/bin/env bash
# The open issues' device measurements as three calls of at most 10 minutes on one 4-GPU host
# (nvidia-h100-x4 or nvidia-h200-x4), after the two boot calls of ../shared/device/README.md:
#   bash tools/bench/build-device-bundles.sh --pack lathe-step lathe-kv-generate grpo-step decode-check \
#     dp-check dp-launch eval-bench quant-bench
#   call 3: bash tools/bench/device-round.sh lanes   (suite groups gen/train/rl, decode checks, the recipe path)
#   call 4: bash tools/bench/device-round.sh quant   (INT4 vs bf16 at 0.6B/1.7B/4B/8B, fast decode options)
#   call 5: bash tools/bench/device-round.sh dp      (data parallelism on the kernels path, 1 and 4 GPUs)
# Each lane runs on its own GPU beside the others (device-lanes.sh): they share the host's CPUs, so say
# so beside any figure. Results under $OUT; the last lines printed are the ones to read.
set -uo pipefail
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/round}
mkdir -p "$OUT"
lanes() { OUT=$OUT/lanes LANE_TIMEOUT=${LANE_TIMEOUT:-570} bash tools/bench/device-lanes.sh "$@"; }
case "${1:?lanes | quant | dp}" in
  lanes)
    eval_bench="node .bundle/eval-bench.js --tokenizer .bundle/qwen3-tokenizer --data-dir fixtures/eval --benchmarks math500,gsm8k --n 32 --max-new 512 --batch 256 --temperature 0"
    lanes \
      "OUT=$OUT/gen SUITE_WORK=/tmp/s0 python3 tools/bench/suite.py --groups gen --update-baseline" \
      "OUT=$OUT/train SUITE_WORK=/tmp/s1 python3 tools/bench/suite.py --groups train --torch-compile --update-baseline" \
      "OUT=$OUT/rl SUITE_WORK=/tmp/s2 python3 tools/bench/suite.py --groups rl --update-baseline" \
      "timeout -k 5 150 node .bundle/decode-check.js --phases check,time,generate --engines kernel+fp8+all+pick,kernel+fp8+all+pick+fc
       for f in --no-swiglu-kernel '' --fast; do timeout -k 5 130 $eval_bench \$f; done"
    for g in gen train rl; do grep -h '"flags"' "$OUT/$g/suite.json" 2> /dev/null | cut -c1-400; done
    ;;
  quant)
    # 4B and 8B: shapes whose decode at 1-16 rows is bound by reading the weights (each line says how
    # much: weights_share_of_step); --fast-decode shrinks the other kernels both formats share
    q="node .bundle/quant-bench.js --device cuda --formats dense,int4 --batches 1,16,256 --weights kernel"
    lanes \
      "$q --preset qwen3-8b --fast-decode --kernel-checks numerics --kl-prompts 8" \
      "$q --preset qwen3-8b --swiglu-kernel --residual-dtype compute --kernel-checks none --kl-prompts 8" \
      "$q --preset qwen3-4b --fast-decode --kernel-checks none --kl-prompts 8; $q --preset qwen3-4b --swiglu-kernel --residual-dtype compute --kernel-checks none --kl-prompts 8" \
      "$q --preset qwen3-0.6b --fast-decode --kernel-checks none; $q --preset qwen3-1.7b --fast-decode --kernel-checks none"
    grep -E '"summary":true' "$OUT/lanes/lanes.log" | cut -c1-1200
    ;;
  dp)
    # where the 4-GPU kernels path's step loses time: the reduction's share, the forward to the first
    # bucket, the host inside NCCL's enqueues; then with 100 MiB buckets (four times fewer enqueues)
    BUCKET_TIMES=1 VARIANTS="overlap solo" STEPS=10 OUT=$OUT/dp timeout -k 5 330 bash tools/bench/distributed/device-run.sh kernels "1 4" 2>&1 | grep -E '^\{' | cut -c1-900
    BUCKET_TIMES=1 VARIANTS="overlap" STEPS=10 DP_ARGS="--bucket-mb 100" OUT=$OUT/dp100 timeout -k 5 200 bash tools/bench/distributed/device-run.sh kernels "4" 2>&1 | grep -E '^\{' | cut -c1-900
    ;;
  *) echo "device-round.sh: lanes | quant | dp" >&2; exit 2 ;;
esac
