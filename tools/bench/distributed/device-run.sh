#!/usr/bin/env bash
# The issue-35 device runs, from the bundles (bash tools/bench/build-device-bundles.sh dp-check dp-launch nccl-order).
#   parity N   : 20 SFT steps on the Qwen3-0.6B shape, fp32 (TF32 off) and bf16 (COMPUTES picks), on 1 GPU and on N GPUs
#                (each rank run by the launcher), the same global batch; prints each parity verdict.
#   scaling "1 2 4" : bf16 tokens/s with flash attention, PER_GPU rows (default 8) of 512 per GPU (weak scaling),
#                Lathe then PyTorch DDP (torchrun) on each count; prints one line per run.
#   comm "1 2" : what the gradient communication costs, on each GPU count (scaling's setup: bf16, flash attention, PER_GPU rows
#                of 512 per GPU, STEPS default 8, 3 warm-up): on 1 GPU the plain step; on N, Lathe with float32 gradients
#                all-reduced (fp32), --grad-reduce-dtype bfloat16 (bf16; bf16-1group: every gradient in one NCCL group
#                instead of the 100 MiB buckets each waited for), ZeRO --zero 2 (zero2) and ZeRO with bfloat16
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
#   lora N     : LoRA on the Qwen3-8B shape (SHAPE, default 8b; LORA rank, default 16, alpha 2·rank, q/k/v/o) over a
#                frozen bf16 base, on lathe sft's kernels path (bf16; attention, log-prob, RoPE and SwiGLU kernels, fused AdamW):
#                1 GPU on the global batch (PER_GPU rows of 512 a GPU, default 4, times N, as N micro-batches), then N GPUs with
#                ZeRO-1 (ZEROS, default "1"; "0 1" adds unsharded) and the post-backward reduction (LORA_REDUCE="--overlap" for the
#                in-run one): tokens/s, scaling against the 1-GPU run, losses' parity against it (bf16 tolerance), Lathe's bytes
#                (trainable, AdamW moments, frozen base) and nvidia-smi's peak a GPU. If the kernels path fails, it is retried with
#                flash attention. ~2 min a run on H100s (mostly building the 8B graph and session). The issue-35 run on 4 GPUs:
#                `device-run.sh lora 4`. SHAPE=tiny DEVICE_ARGS="--device cpu --compute float32" PER_GPU=2 SEQ=32 for a CPU smoke.
#                `zero N` also takes LORA=16 (with SHAPE=8b: fp32 parity of the sharded adapters, base in float32, --init tiled).
#   eight PART [COUNTS]: issue 36 on one 8-GPU host, in three calls of < 10 minutes after the boot calls; COUNTS default "1 2 4 8".
#                Every Lathe run uses --init tiled (the weights' values do not change the step time, and nothing is sampled per element).
#                Estimates below are from the 4 × H200 rows of docs/benchmarks.md (steps ~0.1 s at 0.6B, ~0.25 s at 1.7B,
#                0.28 s at 4B) plus a guess of ~30-40 s to start a 0.6B/1.7B process (graph, session, kernels, NCCL) and
#                ~2 min for 4B/8B; each run has a time limit, and every line carries its `secs` to correct them.
#     scaling  : SFT tokens/s on each count at SHAPES (default "0.6b 1.7b"), lathe sft's path under lathe launch on cuda
#                (bf16, the kernels, 8 × 512 a GPU; on N > 1 the in-run float32 all-reduce with the update in its run,
#                OVERLAP="--overlap" for the two runs a step), then PyTorch DDP (torchrun,
#                sdpa) on the same count; then the largest count's 0.6B losses against 1 GPU on the same global batch
#                (micro-batches). ~4.5 min a shape (8 runs) + 1 min parity: SHAPES="0.6b" in one call, SHAPES="1.7b" in the next.
#     grpo     : one GRPO step (64 prompts × 8, 512 new tokens, 0.6B shape) on 1 and the largest count: ~2.5 min (fits beside
#                `scaling` at 0.6B in one call: see the calls below).
#     big      : Qwen3-8B-shape LoRA r=16 (`lora`'s runs: the largest count with ZeRO-1, and 1 GPU), then Qwen3-4B-shape full
#                fine-tuning with ZeRO-1 on the largest count (bf16, flash attention, recompute, 1 × 512 a GPU: the 4-GPU row's
#                setup): fits, tokens/s, memory per GPU. ~2 + 2 + 3.5 min (time limits 170 + 170 + 230 s: LORA_LIMIT, BIG_LIMIT).
#                The calls after the first boot call (../shared/device/README.md), bundles from
#                `bash tools/bench/build-device-bundles.sh --pack dp-check dp-launch grpo-dp`:
#                (2) boot part2, unpack, then SHAPES=1.7b device-run.sh eight scaling           (~5 min + the boot)
#                (3) SHAPES=0.6b device-run.sh eight scaling; device-run.sh eight grpo          (~8 min)
#                (4) device-run.sh eight big                                                    (~8 min)
#                Limits a run: RUN_LIMIT (scaling, default 150 s), GRPO_LIMIT (240 s).
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
# ---- the runs of `lora` and `eight`: each under a time limit, a failure printed as a line without ending the part ----
# lathe sft's training path under lathe launch on cuda, as dp-check flags (DEVICE_ARGS replaces it for a CPU smoke test)
SFT_KERNELS=${DEVICE_ARGS:---compute bfloat16 --attention-kernel --logprob-kernel --rope-kernel --swiglu-kernel}
# attempt NAME LIMIT_S CMD...: every rank's output in $OUT/NAME.txt, the seconds in $OUT/NAME.secs; nvidia-smi's memory samples in $OUT/NAME.smi;
# the exit status in ATTEMPT_RC (124 or 137: the time limit)
attempt() {
  local name=$1 limit=$2 t0=$SECONDS smi="" rc=0
  shift 2
  # a result of an earlier call must not stand in for this one's
  rm -f "$OUT/$name.json"
  if [ -z "${NO_SMI:-}" ] && command -v nvidia-smi > /dev/null; then
    nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits -lms 500 > "$OUT/$name.smi" 2> /dev/null &
    smi=$!
  fi
  timeout -k 10 "$limit" "$@" > "$OUT/$name.txt" 2> "$OUT/$name.err" || rc=$?
  [ -z "$smi" ] || { kill "$smi" 2> /dev/null; wait "$smi" 2> /dev/null || true; }
  echo $((SECONDS - t0)) > "$OUT/$name.secs"
  ATTEMPT_RC=$rc
  [ "$rc" = 0 ] && return 0
  node -e "console.log(JSON.stringify({run:'$name', failed:true, exit:$rc, timed_out:$rc===124||$rc===137, secs:$((SECONDS - t0)), stderr:require('fs').readFileSync('$OUT/$name.err','utf8').slice(-800)}))"
  return 1
}
# summary NAME: a dp-check run's line: tokens/s, every rank's Lathe bytes and nvidia-smi's peak a GPU (GiB), the seconds the run took
summary() {
  node -e "
    const fs=require('fs'); const o='$OUT/$1'; const r=require(o+'.json');
    const ranks=fs.readFileSync(o+'.txt','utf8').split(String.fromCharCode(10)).filter(l=>l.includes('{')).map(l=>JSON.parse(l.slice(l.indexOf('{'))));
    const peak={}; if (fs.existsSync(o+'.smi')) for (const l of fs.readFileSync(o+'.smi','utf8').split(String.fromCharCode(10))) { const [g,m]=l.split(',').map(Number); if (!isNaN(m)) peak[g]=Math.max(peak[g]??0,m); }
    const gib=(b)=>+(b/2**30).toFixed(2);
    console.log(JSON.stringify({run:'$1', shape:r.shape, world:r.world, zero:r.zero, lora:r.lora?.rank ?? 0, kernels:r.kernels.length>0, overlap:r.overlap, batch:r.batch, micro:r.micro,
      tokens_per_s:r.tokens_per_s, step_ms:+(r.batch[0]*r.batch[1]/r.tokens_per_s*1000).toFixed(1), loss_first:+r.losses[0].toFixed(5), loss_last:+r.losses.at(-1).toFixed(5),
      trainable_params:r.trainable_params, moment_gib:gib(r.moment_bytes), state_gib:gib(r.state_bytes), frozen_gib:gib(r.frozen_bytes),
      lathe_peak_gib:ranks.map(x=>gib(x.memory.peakBytes)), smi_peak_gib:Object.values(peak).map(m=>+(m/1024).toFixed(1)), secs:+fs.readFileSync(o+'.secs','utf8')}));
  "
}
# against NAME ONE: NAME's losses against ONE's (the same global batch on 1 GPU), and NAME's tokens/s as a share of linear scaling from ONE's
against() {
  node -e "
    const r=require('$OUT/$1.json'); const one=require('$OUT/$2.json');
    const n=Math.min(r.losses.length, one.losses.length); const rel=Math.max(...r.losses.slice(0, n).map((l,i)=>Math.abs(l-one.losses[i])/Math.abs(one.losses[i]))); const tol=r.compute==='float32'?1e-5:2e-2;
    console.log(JSON.stringify({run:'$1', against:'$2', world:r.world, steps:n, max_rel_loss_diff:rel, tol, parity:rel<=tol, tok_s:r.tokens_per_s, tok_s_1:one.tokens_per_s, of_linear:+(r.tokens_per_s/(r.world*one.tokens_per_s)).toFixed(3)}));
  "
}
# lora_runs N: `lora`'s runs (and `eight big`'s first two)
lora_runs() {
  local n=$1 per=${PER_GPU:-4} shape=${SHAPE:-8b} rank=${LORA:-16}
  local common="--shape $shape --lora $rank --init tiled --steps ${STEPS:-5} --warmup 2 --seq ${SEQ:-512} --batch $((per * n))"
  # the kernels path, else flash attention (bf16) when it fails
  local paths=("$SFT_KERNELS" "${DEVICE_ARGS:---compute bfloat16 --flash-attention}")
  for z in ${ZEROS:-1}; do
    for p in "${paths[@]}"; do
      if attempt "lora-$shape-$n-zero$z" "${LORA_LIMIT:-170}" node $B/dp-launch.js --gpus "$n" --master_port $((33500 + n + 10 * z)) -- node $B/dp-check.js $common $p --zero "$z" ${LORA_REDUCE:-} --out "$OUT/lora-$shape-$n-zero$z.json"; then
        summary "lora-$shape-$n-zero$z"; break
      fi
      # a run that ran out of time would not be faster with flash attention
      case $ATTEMPT_RC in 124 | 137) break ;; esac
    done
  done
  [ "${LORA_ONE:-1}" = 1 ] || return 0
  for p in "${paths[@]}"; do
    if attempt "lora-$shape-1x$n" "${LORA_LIMIT:-170}" node $B/dp-check.js $common $p --micro "$n" --out "$OUT/lora-$shape-1x$n.json"; then
      summary "lora-$shape-1x$n"
      for z in ${ZEROS:-1}; do if [ -f "$OUT/lora-$shape-$n-zero$z.json" ]; then against "lora-$shape-$n-zero$z" "lora-$shape-1x$n"; fi; done
      break
    fi
    case $ATTEMPT_RC in 124 | 137) break ;; esac
  done
}
# grpo_counts "1 2": grpo's runs on each count, and how many prompts' completions equal the 1-GPU run's
grpo_counts() {
  for n in $1; do
    attempt "grpo-$n" "${GRPO_LIMIT:-240}" node $B/dp-launch.js --gpus "$n" --master_port $((29900 + n)) -- node $B/grpo-dp.js ${GRPO_ARGS:-} --steps ${STEPS:-2} --out "$OUT/grpo-$n.json" || continue
    node -e "
      const r=require('$OUT/grpo-$n.json'); const s=r.steps.at(-1); const fs=require('fs');
      const one=fs.existsSync('$OUT/grpo-1.json') ? require('$OUT/grpo-1.json').steps.at(-1) : undefined;
      const same=one ? s.digests.filter((d,i)=>d===one.digests[i]).length : undefined;
      console.log(JSON.stringify({world:r.world, compute:r.compute, prompts:r.prompts, group:r.group, new_tokens:r.new_tokens, step_s:s.step_s, generation_s:s.generation_s, rewards_s:s.rewards_s, scoring_s:s.scoring_s, training_s:s.training_s, loss:s.loss, reward_mean:s.reward_mean, response_length_mean:s.response_length_mean, prompts_same_as_1gpu:same, memory:r.memory, secs:+fs.readFileSync('$OUT/grpo-$n.secs','utf8')}));
    "
  done
}
mode=${1:?parity N | scaling "1 2 4" | comm "1 2" | kernels "1 4" | zero N | grpo "1 2" | recipe N | order N | lora N | eight scaling|grpo|big [COUNTS]}
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
    args="${DP_ARGS:-} --shape ${SHAPE:-0.6b} --compute float32 --steps ${STEPS:-5} --batch 8 --seq ${SEQ:-256} --warmup 1 ${LORA:+--lora $LORA --init tiled}"
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
    grpo_counts "${2:-1 2}"
    ;;
  lora)
    lora_runs "${2:?lora N}"
    ;;
  eight)
    part=${2:?eight scaling|grpo|big [COUNTS]}
    counts=${3:-1 2 4 8}
    top=$(echo $counts | tr ' ' '\n' | sort -n | tail -1)
    case "$part" in
      scaling)
        per=${PER_GPU:-8}
        for shape in ${SHAPES:-0.6b 1.7b}; do
          for n in $counts; do
            # 14 steps: on 2 GPUs the step was still settling through step 7 (benchmarks.md, data parallel)
            flags="${DP_ARGS:-} $SFT_KERNELS --shape $shape --init tiled --steps ${STEPS:-14} --warmup 3 --seq ${SEQ:-512} --batch $((per * n))"
            [ "$n" = 1 ] || flags="$flags ${OVERLAP---overlap --in-graph-update}"
            if attempt "eight-$shape-$n" "${RUN_LIMIT:-150}" node $B/dp-launch.js --gpus "$n" --master_port $((33000 + n)) -- node $B/dp-check.js $flags --out "$OUT/eight-$shape-$n.json"; then summary "eight-$shape-$n"; fi
            [ -z "${NO_DDP:-}" ] || continue
            if attempt "eight-ddp-$shape-$n" "${RUN_LIMIT:-150}" torchrun --standalone --nproc_per_node "$n" tools/reference/distributed/ddp_bench.py ${DDP_ARGS:-} --shape "$shape" --batch-per-gpu "$per" --seq ${SEQ:-512} --steps ${STEPS:-8} --warmup 3; then
              node -e "const l=require('fs').readFileSync('$OUT/eight-ddp-$shape-$n.txt','utf8').split(String.fromCharCode(10)).filter(x=>x.startsWith('{')).pop(); console.log(JSON.stringify({run:'eight-ddp-$shape-$n', ...JSON.parse(l), secs:$(cat "$OUT/eight-ddp-$shape-$n.secs")}))"
            fi
          done
          # each count's tokens/s as a share of linear from 1 GPU's, Lathe's and DDP's, and Lathe over DDP
          node -e "
            const fs=require('fs'); const tok=(f)=>{ try { const t=fs.readFileSync('$OUT/'+f+'.txt','utf8'); if (f.includes('ddp')) return JSON.parse(t.split(String.fromCharCode(10)).filter(x=>x.startsWith('{')).pop()).tokens_per_s; return require('$OUT/'+f+'.json').tokens_per_s; } catch { return null; } };
            const l1=tok('eight-$shape-1'), d1=tok('eight-ddp-$shape-1');
            for (const n of '$counts'.split(' ').map(Number)) { const l=tok('eight-$shape-'+n), d=tok('eight-ddp-$shape-'+n);
              console.log(JSON.stringify({scaling:'$shape', gpus:n, lathe_tok_s:l, ddp_tok_s:d, lathe_of_linear:l&&l1?+(l/(n*l1)).toFixed(3):null, ddp_of_linear:d&&d1?+(d/(n*d1)).toFixed(3):null, lathe_over_ddp:l&&d?+(l/d).toFixed(3):null})); }
          "
          # the largest count's losses against 1 GPU on its global batch (as many micro-batches as GPUs): at 0.6B only (PARITY_SHAPES)
          case " ${PARITY_SHAPES:-0.6b} " in *" $shape "*)
            if [ "$top" != 1 ] && [ -f "$OUT/eight-$shape-$top.json" ]; then
              if attempt "eight-$shape-1x$top" "${RUN_LIMIT:-150}" node $B/dp-check.js ${DP_ARGS:-} $SFT_KERNELS --shape $shape --init tiled --steps ${STEPS:-14} --warmup 3 --seq ${SEQ:-512} --batch $((per * top)) --micro "$top" --out "$OUT/eight-$shape-1x$top.json"; then
                summary "eight-$shape-1x$top"; against "eight-$shape-$top" "eight-$shape-1x$top"
              fi
            fi ;;
          esac
        done
        ;;
      grpo)
        grpo_counts "1 $top"
        ;;
      big)
        # 8B LoRA on the largest count (ZeRO-1) and on 1 GPU, then 4B full fine-tuning with ZeRO-1 on the largest count
        lora_runs "$top"
        # (FULL_SHAPE and FULL_ARGS replace 4b and its flags for a CPU smoke test)
        full=${FULL_SHAPE:-4b}
        if attempt "eight-$full-$top" "${BIG_LIMIT:-230}" node $B/dp-launch.js --gpus "$top" --master_port 33900 -- node $B/dp-check.js --shape "$full" ${FULL_ARGS:---compute bfloat16 --flash-attention --recompute} --zero 1 --init tiled \
          --steps ${STEPS_4B:-4} --warmup 1 --batch "$top" --seq ${SEQ:-512} --micro 1 --out "$OUT/eight-$full-$top.json"; then summary "eight-$full-$top"; fi
        ;;
      *) echo "eight scaling|grpo|big [COUNTS]" >&2; exit 2 ;;
    esac
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
  *) echo "usage: $0 parity N | scaling \"1 2 4\" | comm \"1 2\" | kernels \"1 4\" | zero N | grpo \"1 2\" | recipe N | order N | lora N | eight scaling|grpo|big [COUNTS]" >&2; exit 2 ;;
esac
