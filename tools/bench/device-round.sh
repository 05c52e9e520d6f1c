#!/usr/bin/env bash
# The open issues' device measurements as calls of at most 10 minutes on one 4-GPU host
# (nvidia-h100-x4 or nvidia-h200-x4; on a 2-GPU host device-lanes.sh runs lane i after lane i − 2 on the same
# GPU, so give LANE_TIMEOUT room), after the two boot calls of ../shared/device/README.md; what each
# part decides is below, their results are in docs/benchmarks.md (a session's ~30 minutes fit about three):
#   bash tools/bench/build-device-bundles.sh --pack lathe-step lathe-kv-generate grpo-step decode-check \
#     dp-check dp-launch eval-bench quant-bench sft-dp serve-bench
#   a    : suite gen group (Lathe's --fast engine against transformers in the same call: issue 37's 10×),
#          quant-bench at the Qwen3-8B shape (issue 30 where decoding is weight-bound), decode checks
#          (the fused combine), lathe eval's path with the decode options
#   dp   : data parallelism on the kernels path, 1 and 4 GPUs, with the reduction's timings (issue 35)
#   b    : quant-bench at 4B, 0.6B and 1.7B with the fast decode options; the suite's train and rl groups
#   lora : Qwen3-8B LoRA under data parallelism on 4 GPUs (issue 35's "8B with LoRA")
#   scale: issue 35's scaling table on lathe sft's path with the 100 MiB buckets: 0.6B and 1.7B shapes on 1, 2
#          and 4 GPUs against PyTorch DDP in the same call (device-run.sh eight scaling "1 2 4")
#   q14  : quant-bench at the Qwen3-14B shape (dense vs INT4, both option sets; ~100 GB of host memory a
#          lane: two lanes at most on a 4-GPU host), the W4A16 kernel's per-shape bandwidth and tuned split-K plans
#          at the Qwen3-8B shapes (M 1-16, with the A/B of the tuned plans) after lathe sft --lora_rank in bf16 on
#          the recipe's path (sft-dp.js), beside the suite's gen group (issue 37)
#   sweep: the decode split kernel's variants (decode-check --phases sweep, e4m3 and bf16 at G 2 on lane 0, G 4 on
#          lane 1) and G 5's split bandwidth (Qwen3-14B's 40/8 heads), for the next tuning round of issue 37
#   serve: lathe serve's decode options against offline at 256 clients (the old default, the new SwiGLU
#          default, the bf16 residual, the e4m3 cache), one lane each
#   qgen : issue 30 through lathe generate's own path (lathe-trajectories.js --quantize): a quantized folder of the
#          0.6B shape at batch 1 and 16, dense / INT4 (W4A16, plans tuned at load) / INT8 / NF4 / INT4 dequantized, one
#          batch size a lane; lathe serve over the INT4 folder against offline over it; then the Qwen3-14B shape
#          with the tuned plans (quant-bench --weights kernel,kernel-tuned)
#   q06  : issue 30's own shapes (Qwen3-0.6B, 1.7B) with the split-K plans tuned at load beside the default ones
#          (--weights kernel,kernel-tuned), batches 1, 16, 256 with the fast decode options, one shape a lane
#   gen  : the suite's gen group alone on one GPU (issue 37's 10x, for an H100 host when one is lent)
#   qgen16: lathe generate's path at batch 16 with each call's prefill / decode split (two calls), beside q06
#   prefill: the first run of each new prefill shape with Lathe's prefill attention choice against ORT's cuDNN one
#   q64  : decode batches of 16-128 rows: the tiled kernels and a table tuned over split-K plans and tiled builds against
#          MatMulNBits (8B and 0.6B), to set KERNEL_MAX_ROWS and whether load-time tuning should time the tiles
#   split: the split-K kernels' default plan against a sweep of column tiles and rounds (8B, 1.7B, 0.6B projections), and
#          clock64 stamps of a wgmma CTA's phases a chunk (w4a16-wg-trace.js)
#   q16  : issue 30's 16 rows at the Qwen3-8B shape: the split-K kernel re-reads the activations from L2 for every 16–32
#          columns, the tiled one once per 64–256; decode at 16 rows with the tiled kernels from 9 rows against the
#          default (split-K up to 16), and both kernels alone at 16 and 32 rows (--kernel-micro-rows), one lane each
#   scale2: the 2-GPU scaling of lathe sft's kernels path again with the bfloat16 reduce beside float32
#          (0.88 / 0.85 of linear at 0.6B / 1.7B with float32 on 2026-11-28: where does the 2-GPU step lose its time)
#   qgroup: the INT4 pipeline at batch 256 with one dequantize launch a product or a layer (group 4, opt-in): decode,
#          prefill and each mode's first_call_ms in one process, both orders (is group 4's slow start-up real?)
#   scale4 SHAPE: issue 35's table for one shape (0.6b or 1.7b) on 1, 2 and 4 GPUs with the update in the run, against
#          PyTorch DDP in the same call, then 2 and 4 GPUs with bfloat16 sums (a 4-GPU host; one call a shape)
#   grpo4: one GRPO step (64 prompts x 8, 512 new tokens, 0.6B shape) on 1, 2 and 4 GPUs with today's defaults
#   adamwh: kernel-check's fused AdamW phase at the Qwen3-0.6B shape, with its bfloat16-gradient case (bit for bit the
#          float32 widening's update: halfGradients' device check)
#   stepk: ncu's kernel times of one Qwen3-1.7B training step on the kernels path (the tied embedding's gradient, the
#          longest gap between buckets in docs/benchmarks.md's data-parallel row), beside the same step's wall time
# Each lane runs on its own GPU beside the others (device-lanes.sh): they share the host's CPUs, so say
# so beside any figure. Results under $OUT; the last lines printed are the ones to read.
set -uo pipefail
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/round}
mkdir -p "$OUT"
lanes() { OUT=$OUT/lanes LANE_TIMEOUT=${LANE_TIMEOUT:-570} bash tools/bench/device-lanes.sh "$@"; }
# quant-bench: INT4 against bf16 at batch 1, 16 and 256; --fast-decode shrinks the kernels both formats
# share (Lathe's decode attention, greedy pick, SwiGLU kernel, bf16 residual); each decode line says how
# weight-bound its step is (weights_share_of_step)
q="node .bundle/quant-bench.js --device cuda --formats dense,int4 --batches 1,16,256 --weights kernel --threads 16"
summaries() { grep -E '"summary":true' "$OUT/lanes/lanes.log" | cut -c1-1500; }
case "${1:?a | dp | b | lora | scale | q14 | sweep | serve | qgen | qgen16 | gen | prefill | q06 | q64 | wgmicro | split | wg | q16 | scale2 | qgroup | scale4 | grpo4 | stepk | adamwh}" in
  a)
    eval_bench="node .bundle/eval-bench.js --tokenizer .bundle/qwen3-tokenizer --data-dir fixtures/eval --benchmarks math500,gsm8k --n 32 --max-new 512 --batch 256 --temperature 0"
    lanes \
      "OUT=$OUT/gen SUITE_WORK=/tmp/s0 python3 tools/bench/suite.py --groups gen --update-baseline" \
      "$q --preset qwen3-8b --fast-decode --kernel-checks numerics --kl-prompts 8" \
      "$q --preset qwen3-8b --swiglu-kernel --residual-dtype compute --kernel-checks none --kl-prompts 8" \
      "timeout -k 5 150 node .bundle/decode-check.js --phases check,time,generate --engines kernel+fp8+all+pick,kernel+fp8+all+pick+fc
       for f in --no-swiglu-kernel '' --fast; do timeout -k 5 130 $eval_bench \$f; done"
    summaries
    grep -h '"flags"' "$OUT/gen/suite.json" 2> /dev/null | cut -c1-400
    ;;
  dp)
    # where the 4-GPU kernels path's step loses time: the reduction's share, the forward to the first
    # bucket, the host inside NCCL's enqueues; then with 100 MiB buckets (four times fewer enqueues)
    BUCKET_TIMES=1 VARIANTS="overlap solo" STEPS=10 OUT=$OUT/dp timeout -k 5 330 bash tools/bench/distributed/device-run.sh kernels "1 4" 2>&1 | grep -E '^\{' | cut -c1-900
    BUCKET_TIMES=1 VARIANTS="overlap" STEPS=10 DP_ARGS="--bucket-mb 100" OUT=$OUT/dp100 timeout -k 5 200 bash tools/bench/distributed/device-run.sh kernels "4" 2>&1 | grep -E '^\{' | cut -c1-900
    ;;
  b)
    lanes \
      "$q --preset qwen3-4b --fast-decode --kernel-checks none --kl-prompts 8; $q --preset qwen3-4b --swiglu-kernel --residual-dtype compute --kernel-checks none --kl-prompts 8" \
      "$q --preset qwen3-0.6b --fast-decode --kernel-checks none; $q --preset qwen3-1.7b --fast-decode --kernel-checks none" \
      "OUT=$OUT/train SUITE_WORK=/tmp/s1 python3 tools/bench/suite.py --groups train --torch-compile --update-baseline" \
      "OUT=$OUT/rl SUITE_WORK=/tmp/s2 python3 tools/bench/suite.py --groups rl --update-baseline"
    summaries
    for g in train rl; do grep -h '"flags"' "$OUT/$g/suite.json" 2> /dev/null | cut -c1-400; done
    ;;
  lora)
    OUT=$OUT/lora timeout -k 5 570 bash tools/bench/distributed/device-run.sh lora 4 2>&1 | grep -E '^\{' | cut -c1-900
    ;;
  scale)
    SHAPES="0.6b 1.7b" RUN_LIMIT=120 OUT=$OUT/scale timeout -k 5 575 bash tools/bench/distributed/device-run.sh eight scaling "1 2 4" 2>&1 | grep -E '^\{' | cut -c1-600
    ;;
  q14)
    lanes \
      "$q --preset qwen3-14b --fast-decode --kernel-checks none --kl-prompts 8" \
      "$q --preset qwen3-14b --swiglu-kernel --residual-dtype compute --kernel-checks none --kl-prompts 8" \
      "timeout -k 5 120 node .bundle/sft-dp.js --model tiny64 --compute bfloat16 --lora-rank 8 --steps 5 --run-dir /tmp/sft-lora-bf16
       node .bundle/quant-bench.js --device cuda --preset qwen3-8b --formats dense,int4 --batches 1,16 --weights kernel,kernel-tuned --threads 16 --fast-decode --kernel-checks all --kernel-sweep" \
      "OUT=$OUT/gen SUITE_WORK=/tmp/s0 python3 tools/bench/suite.py --groups gen --update-baseline"
    summaries
    grep -h '"flags"' "$OUT/gen/suite.json" 2> /dev/null | cut -c1-400
    ;;
  sweep)
    lanes \
      "node .bundle/decode-check.js --phases sweep --sweep-groups 2" \
      "node .bundle/decode-check.js --phases sweep --sweep-groups 4" \
      "node .bundle/decode-check.js --phases compile,time --heads 40,8; node .bundle/decode-check.js --phases time --heads 28,4"
    grep -hE '"sweep_best"|"phase":"time"|"phase":"compile"' "$OUT/lanes/lanes.log" | cut -c1-600
    ;;
  serve)
    s="node .bundle/serve-bench.js --shape qwen3-0.6b --device cuda --cuda-graph --rows 256 --client-threads 4 --http-thread true --warmup --clients 256 --direct"
    lanes "$s --swiglu-kernel false" "$s" "$s --residual-dtype compute" "$s --kv-cache-dtype float8e4m3 --residual-dtype compute"
    grep -hE '"summary"|"clients":256' "$OUT/lanes/lanes.log" | cut -c1-900
    ;;
  qgen)
    t="node .bundle/lathe-trajectories.js --tokenizer .bundle/qwen3-tokenizer --shape qwen3-0.6b --device cuda --prompts 16 --samples-thinking 1 --max-new 256 --temperature 0"
    each() { for q in none int4 int8 nf4; do timeout -k 5 150 $t --batch "$1" --quantize $q 2>&1 | grep -E '^\{"bench"'; done; timeout -k 5 150 $t --batch "$1" --quantize int4 --quantized-weights dequantize 2>&1 | grep -E '^\{"bench"'; }
    export -f each; export t
    lanes "each 1
      timeout -k 5 200 node .bundle/serve-bench.js --shape qwen3-0.6b --device cuda --cuda-graph --rows 256 --client-threads 4 --http-thread true --warmup --clients 16,256 --quantize int4" "each 16
      node .bundle/quant-bench.js --device cuda --preset qwen3-14b --formats dense,int4 --batches 1,16 --weights kernel,kernel-tuned --kernel-sweep --threads 16 --fast-decode --kernel-checks none"
    grep -hE '"bench":"(lathe-trajectories|offline)"|"clients":(16|256),' "$OUT/lanes/lanes.log" | cut -c1-900
    summaries
    ;;
  qgen16)
    # lathe generate's path at batch 16 with each call's prefill / decode split (two calls: the first pays each new
    # prefill shape); q06 on lane 1
    t="node .bundle/lathe-trajectories.js --tokenizer .bundle/qwen3-tokenizer --shape qwen3-0.6b --device cuda --prompts 16 --samples-thinking 1 --max-new 256 --temperature 0 --batch 16 --repeat 2"
    m="node .bundle/quant-bench.js --device cuda --formats dense,int4 --batches 1,16,256 --weights kernel,kernel-tuned --kernel-sweep --threads 16 --fast-decode --kernel-checks none"
    lanes "$t --quantize none
      $t --quantize int4
      $t --quantize int8" "$m --preset qwen3-0.6b
      $m --preset qwen3-1.7b"
    grep -hE '"bench":"lathe-trajectories"' "$OUT/lanes/lanes.log" | cut -c1-1500
    summaries
    ;;
  gen)
    # issue 37's 10x on the card it names: the suite's gen group alone (one GPU; run it on nvidia-h100-x1 when lent)
    OUT=$OUT/gen SUITE_WORK=/tmp/s0 timeout -k 5 580 python3 tools/bench/suite.py --groups gen --update-baseline 2>&1 | tail -n 30
    grep -h '"flags"' "$OUT/gen/suite.json" 2> /dev/null | cut -c1-400
    ;;
  prefill)
    # each new prefill shape's first run: Lathe's prefills compile with ORT_ENABLE_CUDNN_FLASH_ATTENTION=0 (ORT's cuDNN
    # attention sets up a graph per new shape and node): lane 0 as Lathe runs, lane 1 with ORT's cuDNN choice (=1),
    # then lathe generate's path at batch 16 (two calls each: the first pays the new shapes; the decode split shows
    # whether the switch moved decode too)
    p="node .bundle/prefill-shapes.js --rows 64 --graph on --formats none,int4 --calls 1x243,16x243,16x243,16x128,16x128,8x200,64x256,64x256"
    t="node .bundle/lathe-trajectories.js --tokenizer .bundle/qwen3-tokenizer --shape qwen3-0.6b --device cuda --prompts 16 --samples-thinking 1 --max-new 256 --temperature 0 --batch 16 --repeat 2"
    lanes "$p
      $t --quantize none
      $t --quantize int4" "ORT_ENABLE_CUDNN_FLASH_ATTENTION=1 $p
      ORT_ENABLE_CUDNN_FLASH_ATTENTION=1 $t --quantize none
      ORT_ENABLE_CUDNN_FLASH_ATTENTION=1 $t --quantize int4"
    grep -hE '"bench":"(prefill-shapes|lathe-trajectories)"' "$OUT/lanes/lanes.log" | cut -c1-1500
    ;;
  q06)
    m="node .bundle/quant-bench.js --device cuda --formats dense,int4 --batches 1,16,256 --weights kernel,kernel-tuned --kernel-sweep --threads 16 --fast-decode --kernel-checks none"
    lanes "$m --preset qwen3-0.6b" "$m --preset qwen3-1.7b"
    summaries
    ;;
  q64)
    # where the tiled kernels beat MatMulNBits' dequantize + GEMM (KERNEL_MAX_ROWS is 16 until measured): decode batches
    # of 16-128 rows (kernel: MatMulNBits past 16 rows; kernel-all: the tiled kernels), 8B on lane 0, 0.6B on lane 1
    # (kernel-tuned-all: the table tuned at load over split-K plans and tiled builds, every row through the op)
    m="node .bundle/quant-bench.js --device cuda --formats dense,int4 --batches 16,64,128 --weights kernel,kernel-all,kernel-tuned-all --kernel-sweep --kernel-sweep-rows 16,64,128 --kernel-sweep-tiles --threads 16 --fast-decode --kernel-checks none"
    lanes "$m --preset qwen3-8b" "$m --preset qwen3-0.6b"
    summaries
    ;;
  wgmicro)
    # the wgmma builds alone against the tiled plan (outputs compared, then µs a call) on 8B's and 0.6B's shapes, and the
    # split-K kernels' bandwidth taken apart (column tiles and rounds swept)
    timeout -k 5 200 node .bundle/w4a16-wg-micro.js --shapes 8b 2>&1 | cut -c1-1500
    timeout -k 5 100 node .bundle/w4a16-wg-micro.js --shapes 0.6b 2>&1 | cut -c1-1500
    # where the split-K kernels' bandwidth goes at 1 and 16 rows: the access pattern, the cross-warp sum, the rest
    timeout -k 5 150 node .bundle/w4a16-stream-probe.js --n 24576 --k 4096 2>&1 | cut -c1-400
    timeout -k 5 120 node .bundle/w4a16-stream-probe.js --n 4096 --k 12288 2>&1 | cut -c1-400
    ;;
  split)
    # the split-K kernels' default plan (w4a16DefaultChoice) against 1-2 column tiles x 1-8 rounds at 1 and 16 rows, on
    # the fused projections of Qwen3-8B, 1.7B and 0.6B; then where a wgmma CTA's chunk of K goes (clock64 stamps)
    for s in 24576x4096 6144x4096 4096x4096 4096x12288 12288x2048 4096x2048 2048x2048 2048x6144 6144x1024 4096x1024 1024x2048 1024x3072; do
      timeout -k 5 60 node .bundle/w4a16-stream-probe.js --n "${s%x*}" --k "${s#*x}" 2>&1 | grep '"w4a16"' | cut -c1-400
    done
    timeout -k 5 90 node .bundle/w4a16-wg-trace.js --n 4096 --k 4096 --m 64 2>&1 | cut -c1-600
    timeout -k 5 60 node .bundle/w4a16-wg-trace.js --n 24576 --k 4096 --m 256 2>&1 | cut -c1-600
    ;;
  wg)
    # the wgmma kernels (sm_90a) against cuBLAS' dense bf16 and the tiled kernels: the tile check over every build at 40
    # and 256 rows, the microbenchmark at 128 and 256 rows (8B), then decode at 16-256 rows with every launch past 16
    # rows on the tiled kernels (kernel-all) or on wgmma (kernel-wgmma-all), against MatMulNBits past 16 (kernel)
    m="node .bundle/quant-bench.js --device cuda --formats dense,int4 --batches 16,64,128,256 --weights kernel,kernel-all,kernel-wgmma-all --threads 16 --fast-decode"
    lanes "$m --preset qwen3-0.6b --kernel-checks numerics" "$m --preset qwen3-8b --kernel-checks all --kernel-micro-rows 128,256"
    summaries
    grep -hoE '"(kernel_tile_check|wgmma_unavailable)":[^]]{0,2000}' "$OUT/lanes/lanes.log" | cut -c1-2500
    ;;
  q16)
    m="node .bundle/quant-bench.js --device cuda --preset qwen3-8b --formats dense,int4 --batches 8,16 --weights kernel --threads 16 --fast-decode --kernel-checks none --kernel-micro-rows 16,32"
    lanes "$m" "$m --kernel-tile-from-rows 9"
    summaries
    ;;
  scale2)
    # the step's own timings beside each (BUCKET_TIMES: each bucket's all-reduce on the device); DDP once
    for v in "" "--grad-reduce-dtype bfloat16"; do
      DP_ARGS="$v --bucket-times" NO_DDP=${v:+1} PARITY_SHAPES=none SHAPES="0.6b 1.7b" RUN_LIMIT=120 OUT=$OUT/scale2${v:+-bf16} timeout -k 5 280 bash tools/bench/distributed/device-run.sh eight scaling "1 2" 2>&1 | grep -E '^\{"(run|scaling)"' | cut -c1-900
    done
    ;;
  qgroup)
    # the INT4 pipeline at batch 256 with one dequantize launch a product (kernel-pipe0) or a layer (kernel-pipeg4):
    # decode rate, prefill and each mode's first_call_ms (creation + first call) in one process, twice in each order
    m="node .bundle/quant-bench.js --device cuda --formats dense,int4 --batches 256 --threads 16 --fast-decode --kernel-checks none --repeat 3 --no-kl"
    for w in bound,kernel-pipe0,kernel-pipeg4 bound,kernel-pipeg4,kernel-pipe0; do
      for p in qwen3-0.6b qwen3-1.7b; do
        timeout -k 5 200 $m --preset $p --weights $w > "$OUT/qgroup-$p-$w.log" 2>&1
        echo "$p $w"; grep -hoE '"(format|weights)":"[a-z0-9-]*","(weights|batch)"[^}]*"first_call_ms":[0-9.]+' "$OUT/qgroup-$p-$w.log" | cut -c1-400
      done
    done
    ;;
  scale4)
    shape=${2:?scale4 0.6b|1.7b}
    SHAPES=$shape PARITY_SHAPES=0.6b RUN_LIMIT=120 OUT=$OUT/scale4 timeout -k 5 400 bash tools/bench/distributed/device-run.sh eight scaling "1 2 4" 2>&1 | grep -E '^\{"(run|scaling|against)' | cut -c1-700
    # the same counts with bfloat16 sums in the run (docs/benchmarks.md's data-parallel row)
    DP_ARGS="--grad-reduce-dtype bfloat16" NO_DDP=1 PARITY_SHAPES=none SHAPES=$shape RUN_LIMIT=100 OUT=$OUT/scale4-bf16 timeout -k 5 160 bash tools/bench/distributed/device-run.sh eight scaling "2 4" 2>&1 | grep -E '^\{"run' | cut -c1-400
    ;;
  grpo4)
    OUT=$OUT/grpo4 timeout -k 5 570 bash tools/bench/distributed/device-run.sh grpo "1 2 4" 2>&1 | grep -E '^\{' | cut -c1-700
    ;;
  stepk)
    flags="--compute bfloat16 --attention-kernel --logprob-kernel --rope-kernel --swiglu-kernel --shape 1.7b --init tiled --seq 512 --batch 8"
    node .bundle/dp-check.js $flags --steps 8 --warmup 3 --out "$OUT/stepk-wall.json" > /dev/null 2>&1
    node -e "const r=require('$OUT/stepk-wall.json'); console.log(JSON.stringify({wall_step_ms:r.step_ms.slice(3)}))"
    OUT=$OUT timeout -k 5 400 bash tools/bench/kernel-times.sh stepk 0 100000 "$(command -v node)" .bundle/dp-check.js $flags --steps 3 --warmup 0 --out "$OUT/stepk.json" > /dev/null
    python3 tools/bench/kernel_summary.py "$OUT/stepk.csv" --last-period --top 40
    ;;
  adamwh)
    # the fused AdamW on bfloat16 gradients against their float32 widening: `bfloat16-gradients` must show wrong 0 for p, m and v
    timeout -k 5 200 node .bundle/kernel-check.js --phases adamw --shape qwen3-0.6b 2>&1 | grep -E '"phase"' | cut -c1-900
    ;;
  *) echo "device-round.sh: a | dp | b | lora | scale | q14 | sweep | serve | qgen | qgen16 | gen | prefill | q06 | q64 | wgmicro | split | wg | q16 | scale2 | qgroup | scale4 | grpo4 | stepk | adamwh" >&2; exit 2 ;;
esac
