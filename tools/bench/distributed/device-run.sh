#!/usr/bin/env bash
# The issue-35 device runs, from the bundles (bash tools/bench/build-device-bundles.sh dp-check dp-launch nccl-order).
#   parity N   : 20 SFT steps on the Qwen3-0.6B shape, fp32 (TF32 off) and bf16 (COMPUTES picks), on 1 GPU and on N GPUs
#                (each rank run by the launcher), the same global batch; prints each parity verdict.
#   scaling "1 2 4" : bf16 tokens/s with flash attention, PER_GPU rows (default 8) of 512 per GPU (weak scaling),
#                Lathe then PyTorch DDP (torchrun) on each count; prints one line per run.
#   comm "1 2" : what the gradient communication costs, on each GPU count (scaling's setup: bf16, flash attention, PER_GPU rows
#                of 512 per GPU, STEPS default 8, 3 warm-up): on 1 GPU the plain step; on N, Lathe with float32 gradients
#                all-reduced (fp32), --grad-reduce-dtype bfloat16 (bf16; bf16-1group: every gradient in one NCCL group
#                instead of 25 MiB buckets each waited for), ZeRO --zero 2 (zero2) and ZeRO with bfloat16
#                reduce-scatters (zero2-bf16), each with its losses' parity against 1 GPU on the same global batch; then
#                PyTorch DDP on the count, and on N also with its bf16_compress_hook (NO_DDP=1 skips DDP, NO_DDP_BF16=1 the hook's run). One JSON line
#                each. VARIANTS="fp32 bf16" runs only those Lathe variants.
#   kernels "1 4" : Lathe's training kernels under data parallelism, for the A/B against comm's flash attention: comm's setup
#                (bf16, PER_GPU rows of 512 per GPU, STEPS default 8, 3 warm-up) with dp-check's --attention-kernel --logprob-kernel
#                --rope-kernel --swiglu-kernel (lathe sft's default; KERNELS replaces those flags) instead of --flash-attention, the device opened through the kernels.
#                For each count the 1-GPU run of the global batch (on 1 GPU printed as `single`), then on N the in-run float32
#                all-reduce (overlap) and its bfloat16 form (bf16-overlap), each with its losses' parity against that 1-GPU run;
#                on 1 GPU also `solo`: --overlap's bucket nodes without peers (no NCCL), their own cost beside `single`.
#                overlap-hp / bf16-overlap-hp (not by default): the same with NCCL's stream at high priority (--nccl-priority high);
#                on N also `pair`: N `solo` runs at once, one per GPU (pair0, pair1, ...): the processes' cost to each other without NCCL.
#                comm's JSON line with kernels: true. VARIANTS="fp32 bf16" runs the post-backward all-reduces instead (the CPU
#                smoke test over TCP, where --overlap is refused). The flash side, same call and same device path:
#                DP_ARGS="--compute-stream" VARIANTS="overlap bf16-overlap" NO_DDP=1 device-run.sh comm "1 4".
#   zero N     : ZeRO-1 on N GPUs against 1 GPU (fp32, composed attention, TF32 off; STEPS, default 5): the parity
#                verdict (≤ 1e-5 relative), then each rank's AdamW moment bytes, trainer state bytes and device memory,
#                with the unsharded numbers beside them, 1 GPU and N GPUs (SHAPE: 0.6b by default, 1.7b to show what
#                sharding saves; SEQ 256 by default). The issue's Qwen3-4B run (bf16, no fp32 parity; ZeRO-1 only, since
#                unsharded does not fit): node $B/dp-launch.js --gpus 4 -- node $B/dp-check.js --shape 4b --compute bfloat16
#                --flash-attention --recompute --zero 1 --steps 6 --warmup 2 --batch 4 --seq 512 --micro 1
#   grpo "1 2" : one GRPO step (64 prompts × 8, 512 new tokens, bf16, Qwen3-0.6B shape; STEPS 2, the second timed)
#                on each GPU count: its time split (the slowest rank's phases), loss, mean reward, and how many
#                prompts' completions equal the 1-GPU run's (GRPO_ARGS adds grpo-dp options).
#   recipe N   : lathe sft's own data-parallel path (the recipe under the launcher: built-in demo task and model, float32,
#                STEPS default 20; bundle sft-dp): 1 GPU, then N GPUs with the default in-run all-reduce (overlap), with
#                --grad_overlap false (post), and ZeRO's in-run reduce-scatter (zero2-overlap); each prints the reduction
#                the ranks' device allows and its losses' parity against 1 GPU. SFT_ARGS adds sft-dp options (the kernels under
#                launch, on a model whose head size they take: SFT_ARGS="--model tiny64 --attention kernels --compute bfloat16").
#   order N    : NCCL's stream vs ORT's: an all-reduce read by the next ORT run, with the wait (0 wrong
#                reads expected) and without it (wrong reads expected: what the wait prevents).
# DDP_ARGS adds ddp_bench.py options (--shape 1.7b beside DP_ARGS="--shape 1.7b"). Every process gets NCCL_NVLS_ENABLE=0. Results go to $OUT (default /tmp/dp) as JSON lines. DP_ARGS adds dp-check
# options (a CPU smoke test: DP_ARGS="--shape tiny --device cpu --seq 32" STEPS=3 bash tools/bench/distributed/device-run.sh parity 2;
# of kernels: DP_ARGS="--shape tiny --device cpu --compute float32 --seq 32" VARIANTS="fp32 bf16" STEPS=4 PER_GPU=2 ... kernels "1 2").
set -euo pipefail
cd "$(dirname "$0")/../../.."
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/dp}
mkdir -p "$OUT"
B=${BUNDLE:-.bundle}
# comm's and kernels' line per run: the median step after the warm-up (and of its time in the runs and in waiting on the reduction after them), the parity verdict against the 1-GPU run of the same global batch
line() { node -e "const r=require('$1'); const med=(a)=>{const s=a.slice(3).sort((x,y)=>x-y); return s[Math.floor(s.length/2)];}; const t=r.step_ms.slice(3).sort((a,b)=>a-b); console.log(JSON.stringify({impl:'lathe', variant:'$2', ...(r.kernels?.length ? {kernels:true} : {}), world:r.world, zero:r.zero, grad_reduce_dtype:r.grad_reduce_dtype, ...(r.nccl_priority ? {nccl_priority:r.nccl_priority} : {}), tokens_per_s:r.tokens_per_s, step_ms:t[Math.floor(t.length/2)], ...(r.phase_ms ? {run_ms:med(r.phase_ms.run), reduce_ms:med(r.phase_ms.reduce)} : {}), parity:r.parity, state_bytes:r.state_bytes, memory:r.memory, ...(r.kernel_fallbacks ? {kernel_fallbacks:r.kernel_fallbacks} : {}), ...(r.bucket_times?.summary ? {overlap:r.bucket_times.summary} : {}), ...(r.bucket_times?.device?.step_started != null ? {to_first_bucket_ms:-r.bucket_times.device.step_started} : {}), ...(r.bucket_times?.device?.enqueue_host_ms != null ? {enqueue_host_ms:r.bucket_times.device.enqueue_host_ms} : {}), ...(r.profile_order ? {backward_after_bucket0:r.profile_order.backward_after[0], backward:r.profile_order.backward} : {})}))"; }
# BUCKET_TIMES=1: the overlap variants record each bucket's all-reduce on the device's clock (dp-check --bucket-times; the line's
# `overlap`: tailMs near collectiveMs and hiddenMs near 0 = the all-reduce ran after the backward; `to_first_bucket_ms`: the
# step's start to bucket 0's gradients on the device, the forward and the backward's top layers; `enqueue_host_ms`: the
# host's time inside the bucket nodes' enqueues, which the backward's launches wait behind). PROFILE=1: each run writes
# its ORT profiles under $OUT/prof-* (dp-check --profile; the line's backward nodes after bucket 0's node); not for timings.
diag() { echo "${BUCKET_TIMES:+--bucket-times} ${PROFILE:+--profile $OUT/prof-$1}"; }
mode=${1:?parity N | scaling "1 2 4" | comm "1 2" | kernels "1 4" | zero N | grpo "1 2" | recipe N | order N}
case "$mode" in
  parity)
    N=${2:?parity N}
    STEPS=${STEPS:-20}
    for c in ${COMPUTES:-float32 bfloat16}; do
      extra=""
      [ "$c" = bfloat16 ] && extra="--flash-attention"
      # fp32: composed attention and TF32 off, so the only difference between world sizes is the order of sums
      node $B/dp-check.js ${DP_ARGS:-} --compute $c $extra --steps $STEPS --batch 8 --micro 2 --seq 512 --out "$OUT/one-$c.json" > /dev/null
      node $B/dp-launch.js --gpus "$N" --master_port $((29500 + N)) -- node $B/dp-check.js ${DP_ARGS:-} --compute $c $extra --steps $STEPS --batch 8 --micro $((8 / N / 4 > 0 ? 8 / N / 4 : 1)) --seq 512 \
        --reference "$OUT/one-$c.json" --out "$OUT/world$N-$c.json" > /dev/null
      node -e "const r=require('$OUT/world$N-$c.json'); const o=require('$OUT/one-$c.json'); console.log(JSON.stringify({compute:'$c', world:r.world, parity:r.parity, losses_1:o.losses.slice(0,3), losses_n:r.losses.slice(0,3), tok_s_1:o.tokens_per_s, tok_s_n:r.tokens_per_s}))"
    done
    ;;
  scaling)
    PER=${PER_GPU:-8}
    for n in ${2:-1 2 4}; do
      node $B/dp-launch.js --gpus "$n" --master_port $((29600 + n)) -- node $B/dp-check.js ${DP_ARGS:-} --compute bfloat16 --flash-attention --steps ${STEPS:-8} --warmup 3 \
        --batch $((PER * n)) --seq 512 --out "$OUT/lathe-$n.json" > /dev/null
      node -e "const r=require('$OUT/lathe-$n.json'); console.log(JSON.stringify({impl:'lathe', world:r.world, tokens_per_s:r.tokens_per_s, step_ms:r.step_ms}))"
      torchrun --standalone --nproc_per_node "$n" tools/reference/distributed/ddp_bench.py ${DDP_ARGS:-} --batch-per-gpu "$PER" --seq 512 --steps ${STEPS:-8} --warmup 3 | tee "$OUT/ddp-$n.json"
    done
    ;;
  comm)
    PER=${PER_GPU:-8}
    # FLASH="" and NO_DDP=1 for a CPU smoke test: DP_ARGS="--shape tiny --device cpu --compute float32 --seq 32" FLASH="" NO_DDP=1 STEPS=4
    common="${DP_ARGS:-} --compute bfloat16 ${FLASH---flash-attention} --steps ${STEPS:-8} --warmup 3 --seq 512"
    for n in ${2:-1 2}; do
      rows=$((PER * n))
      node $B/dp-check.js $common --batch $rows --out "$OUT/comm-1x$rows.json" > /dev/null
      if [ "$n" = 1 ]; then line "$OUT/comm-1x$rows.json" single; fi
      if [ "$n" != 1 ]; then
        port=$((30000 + 10 * n))
        for v in fp32:"--zero 0 --grad-reduce-dtype float32" bf16:"--zero 0 --grad-reduce-dtype bfloat16" bf16-1group:"--zero 0 --grad-reduce-dtype bfloat16 --bucket-mb 1000000" zero2:"--zero 2 --grad-reduce-dtype float32" zero2-bf16:"--zero 2 --grad-reduce-dtype bfloat16" fp32-ks:"--zero 0 --grad-reduce-dtype float32 --compute-stream" overlap:"--zero 0 --grad-reduce-dtype float32 --overlap" bf16-ks:"--zero 0 --grad-reduce-dtype bfloat16 --compute-stream" bf16-overlap:"--zero 0 --grad-reduce-dtype bfloat16 --overlap" zero2-ks:"--zero 2 --grad-reduce-dtype float32 --compute-stream" zero2-overlap:"--zero 2 --grad-reduce-dtype float32 --overlap"; do
          name=${v%%:*}; opts=${v#*:}; port=$((port + 1))
          # VARIANTS picks some (default all), to keep one call under the device's 10 minutes
          case " ${VARIANTS:-fp32 bf16 bf16-1group zero2 zero2-bf16} " in *" $name "*) ;; *) continue ;; esac
          node $B/dp-launch.js --gpus "$n" --master_port $port -- node $B/dp-check.js $common --batch $rows $opts $(diag "comm-$n-$name") --reference "$OUT/comm-1x$rows.json" --out "$OUT/comm-$n-$name.json" > /dev/null
          line "$OUT/comm-$n-$name.json" "$name"
        done
      fi
      [ -n "${NO_DDP:-}" ] || torchrun --standalone --nproc_per_node "$n" tools/reference/distributed/ddp_bench.py ${DDP_ARGS:-} --batch-per-gpu "$PER" --seq 512 --steps ${STEPS:-8} --warmup 3 | tee "$OUT/comm-ddp-$n.json"
      # DDP's bf16_compress_hook, the trade --grad-reduce-dtype bfloat16 makes
      [ -n "${NO_DDP:-}" ] || [ "$n" = 1 ] || [ -n "${NO_DDP_BF16:-}" ] || torchrun --standalone --nproc_per_node "$n" tools/reference/distributed/ddp_bench.py ${DDP_ARGS:-} --batch-per-gpu "$PER" --seq 512 --steps ${STEPS:-8} --warmup 3 --bf16-compress | tee "$OUT/comm-ddp-bf16-$n.json"
    done
    ;;
  kernels)
    PER=${PER_GPU:-8}
    common="${DP_ARGS:-} --compute bfloat16 ${KERNELS:---attention-kernel --logprob-kernel --rope-kernel --swiglu-kernel} --steps ${STEPS:-8} --warmup 3 --seq 512"
    for n in ${2:-1 4}; do
      rows=$((PER * n))
      node $B/dp-check.js $common --batch $rows --out "$OUT/kernels-1x$rows.json" > /dev/null
      if [ "$n" = 1 ]; then
        line "$OUT/kernels-1x$rows.json" single
        # solo: the same GPU with --overlap's bucket nodes but no peers (no NCCL): what the nodes alone cost the step
        case " ${VARIANTS:-overlap bf16-overlap solo pair} " in *" solo "*)
          node $B/dp-check.js $common --batch $rows --overlap $(diag kernels-1-solo) --out "$OUT/kernels-1-solo.json" > /dev/null
          line "$OUT/kernels-1-solo.json" solo ;; esac
        continue
      fi
      port=$((32000 + 10 * n))
      # pair: n solo runs at once, one per GPU (no NCCL): what n processes side by side cost each other, apart from the all-reduce
      case " ${VARIANTS:-overlap bf16-overlap solo pair} " in *" pair "*)
        for i in $(seq 0 $((n - 1))); do CUDA_VISIBLE_DEVICES=$i node $B/dp-check.js $common --batch $PER --overlap --out "$OUT/kernels-$n-pair$i.json" > /dev/null & done
        wait
        for i in $(seq 0 $((n - 1))); do line "$OUT/kernels-$n-pair$i.json" "pair$i"; done ;; esac
      for v in overlap:"--grad-reduce-dtype float32 --overlap" bf16-overlap:"--grad-reduce-dtype bfloat16 --overlap" overlap-hp:"--grad-reduce-dtype float32 --overlap --nccl-priority high" bf16-overlap-hp:"--grad-reduce-dtype bfloat16 --overlap --nccl-priority high" fp32:"--grad-reduce-dtype float32" bf16:"--grad-reduce-dtype bfloat16"; do
        name=${v%%:*}; opts=${v#*:}; port=$((port + 1))
        case " ${VARIANTS:-overlap bf16-overlap solo pair} " in *" $name "*) ;; *) continue ;; esac
        node $B/dp-launch.js --gpus "$n" --master_port $port -- node $B/dp-check.js $common --batch $rows $opts $(diag "kernels-$n-$name") --reference "$OUT/kernels-1x$rows.json" --out "$OUT/kernels-$n-$name.json" > /dev/null
        line "$OUT/kernels-$n-$name.json" "$name"
      done
    done
    ;;
  zero)
    N=${2:?zero N}
    args="${DP_ARGS:-} --shape ${SHAPE:-0.6b} --compute float32 --steps ${STEPS:-5} --batch 8 --seq ${SEQ:-256} --warmup 1"
    node $B/dp-check.js $args --out "$OUT/zero-one.json" > /dev/null
    node $B/dp-launch.js --gpus "$N" --master_port $((29800 + N)) -- node $B/dp-check.js $args --zero 1 --reference "$OUT/zero-one.json" --out "$OUT/zero-$N.json" > "$OUT/zero-$N-ranks.txt"
    # unsharded data parallelism on the same N GPUs, for its memory per rank
    node $B/dp-launch.js --gpus "$N" --master_port $((29810 + N)) -- node $B/dp-check.js $args --zero 0 --out "$OUT/zero0-$N.json" > /dev/null
    node -e "
      const fs=require('fs'); const one=require('$OUT/zero-one.json'); const r=require('$OUT/zero-$N.json');
      console.log(JSON.stringify({zero:1, world:r.world, parity:r.parity, losses_1:one.losses, losses_n:r.losses, tok_s_1:one.tokens_per_s, tok_s_n:r.tokens_per_s}));
      const ranks=fs.readFileSync('$OUT/zero-$N-ranks.txt','utf8').trim().split(String.fromCharCode(10)).filter(l=>l.includes('{')).map(l=>JSON.parse(l.slice(l.indexOf('{'))));
      const dp=require('$OUT/zero0-$N.json');
      console.log(JSON.stringify({world:1, moment_bytes:one.moment_bytes, state_bytes:one.state_bytes, memory:one.memory}));
      console.log(JSON.stringify({world:dp.world, zero:0, rank:0, moment_bytes:dp.moment_bytes, state_bytes:dp.state_bytes, memory:dp.memory, tok_s:dp.tokens_per_s}));
      for (const x of ranks) console.log(JSON.stringify({world:x.world, rank:x.rank, moment_bytes:x.moment_bytes, moment_ratio:+(x.moment_bytes/one.moment_bytes).toFixed(4), state_bytes:x.state_bytes, memory:x.memory}));
    "
    ;;
  grpo)
    for n in ${2:-1 2}; do
      node $B/dp-launch.js --gpus "$n" --master_port $((29900 + n)) -- node $B/grpo-dp.js ${GRPO_ARGS:-} --steps ${STEPS:-2} --out "$OUT/grpo-$n.json" > /dev/null
      node -e "
        const r=require('$OUT/grpo-$n.json'); const s=r.steps.at(-1); const fs=require('fs');
        const one=fs.existsSync('$OUT/grpo-1.json') ? require('$OUT/grpo-1.json').steps.at(-1) : undefined;
        const same=one ? s.digests.filter((d,i)=>d===one.digests[i]).length : undefined;
        console.log(JSON.stringify({world:r.world, compute:r.compute, prompts:r.prompts, group:r.group, new_tokens:r.new_tokens, step_s:s.step_s, generation_s:s.generation_s, rewards_s:s.rewards_s, scoring_s:s.scoring_s, training_s:s.training_s, loss:s.loss, reward_mean:s.reward_mean, response_length_mean:s.response_length_mean, prompts_same_as_1gpu:same, memory:r.memory}));
      "
    done
    ;;
  recipe)
    N=${2:?recipe N}
    args="${SFT_ARGS:-} --steps ${STEPS:-20}"
    node $B/sft-dp.js $args --out "$OUT/sft-one.json" > /dev/null
    port=$((31000 + 10 * N))
    for v in overlap:"--grad-overlap true" post:"--grad-overlap false" zero2-overlap:"--grad-overlap true --zero-stage 2"; do
      name=${v%%:*}; opts=${v#*:}; port=$((port + 1))
      node $B/dp-launch.js --gpus "$N" --master_port $port -- node $B/sft-dp.js $args $opts --reference "$OUT/sft-one.json" --out "$OUT/sft-$N-$name.json" > /dev/null
      node -e "const r=require('$OUT/sft-$N-$name.json'); console.log(JSON.stringify({variant:'$name', world:r.world, attention:r.attention, reduction:r.reduction, parity:r.parity, seconds:r.seconds}))"
    done
    ;;
  order)
    node $B/dp-launch.js --gpus "${2:-2}" --master_port 29700 -- node $B/nccl-order.js --mb ${MB:-512} --trials ${TRIALS:-10}
    ;;
  *) echo "usage: $0 parity N | scaling \"1 2 4\" | comm \"1 2\" | kernels \"1 4\" | zero N | grpo \"1 2\" | recipe N | order N" >&2; exit 2 ;;
esac
