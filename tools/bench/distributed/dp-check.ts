/**
 * Data-parallel SFT steps on a random Qwen3 (the 0.6B, 1.7B, 4B or 8B shape of @lathe/models' presets;
 * `tiny` for a CPU check), one process per rank under `lathe launch` (or alone): the loss trajectory
 * and tokens/s, for the two device checks in one script.
 *
 * - Parity: every world size trains on the same global batches (--batch rows of --seq tokens,
 *   seeded), so the losses of N ranks must equal one process's: with --reference ONE.json (rank 0's
 *   output of the 1-GPU run) rank 0 prints the largest relative loss difference and whether it is
 *   within --tol (default 1e-5 for float32, 2e-2 for bfloat16: "within bf16 rounding").
 * - Scaling: tokens/s of the global batch (median step after --warmup steps), to compare 1, 2 and 4
 *   GPUs and PyTorch DDP (tools/reference/distributed/ddp_bench.py, same model and batch).
 * - ZeRO-1 (--zero 1): the AdamW moments and master-weight shards split over the ranks; the same
 *   parity check against a 1-GPU reference, and each rank's optimizer bytes (`moment_bytes`, the
 *   trainer's `state_bytes`) and device memory. --zero 2 is the same path (each micro-batch's
 *   gradients are already reduce-scattered into shard sums).
 * - --grad-reduce-dtype bfloat16: gradients summed over the ranks in bfloat16 (half the bytes of
 *   the all-reduce or reduce-scatter), cast in one run each way around it.
 * - --overlap: the all-reduce inside the backward's run (float32, or bfloat16 copies with --grad-reduce-dtype;
 *   with --zero 1|2 the reduce-scatter inside each micro-batch's run) (`gradientAllReduceInGraph`: a node
 *   per --bucket-mb bucket enqueues NCCL behind the compute stream), on a device opened with Lathe's
 *   compute stream (`Kernels.withDevice`, so the fused AdamW is the default too); --compute-stream
 *   opens the device the same way without it, the A/B baseline. On the CPU --overlap runs alone
 *   only (a one-rank `ThreadGroup`: the in-run path without peers); over TCP it is refused. Alone on
 *   CUDA the bucket nodes run without collectives (`soloInRunReducer`): the nodes' own cost.
 * - --in-graph-update (with --overlap, --micro 1, no --zero; bfloat16 reductions need the fused AdamW, the
 *   default here on cuda): the update in the same run
 *   as the backward and the all-reduce (`TrainerOptions.inGraphUpdate`): one run a step, the bucket
 *   nodes summing in place and a join ordering the update after NCCL, instead of the accumulate
 *   run and the apply run. The A/B: `--overlap` against `--overlap --in-graph-update`, on 1 GPU
 *   (solo, or a one-rank NCCL group with --nccl-alone) and on 2. `in_graph_update` in the output.
 * - --nccl-alone (one process, cuda): a one-rank NCCL group, so one GPU runs the NCCL reducer's bucket
 *   nodes and join (their order against the update; its losses against a run without it), not its scaling.
 * - --attention-kernel: attention through Lathe's flash-attention kernels, forward and backward (what
 *   `lathe sft --attention kernels` trains with), on the device opened through the kernels (so it implies
 *   --compute-stream, and rows right-padded as --flash-attention); with it --logprob-kernel takes the
 *   LM head's log-partition through the fused cross-entropy kernels, --rope-kernel rotates queries
 *   and keys through Lathe's RoPE kernel and --swiglu-kernel takes each MLP's activation through Lathe's
 *   SwiGLU kernel (tools/bench/train/lathe-step.ts's flags; all four: lathe sft's default on cuda). CUDA needs
 *   --compute bfloat16; on the CPU the ops' float32 host computes run (a smoke test). `kernels` in the
 *   output lists those used.
 * - --lora RANK [--lora-alpha 2·RANK] [--lora-targets 'q_proj|k_proj|v_proj|o_proj']: LoRA adapters
 *   trained over a frozen base, as `lathe sft --lora_rank` builds the step (loraWeights; no dropout),
 *   the base bound in the compute dtype as lathe sft binds it (`loraBaseDtype`: bfloat16, the 8B base
 *   16.4 GB a GPU; an lm_head target stays float32). Only the adapters are the Trainer's parameters, so only they get
 *   float32 master copies, gradients, AdamW moments (`moment_bytes`) and the all-reduce or, with
 *   --zero, the sharding; the base's bytes are `frozen_bytes`. Parity and the rest as for full
 *   fine-tuning.
 * - --init tiled: each weight matrix copied from a window of one pool of seeded normals instead of
 *   sampled element by element (dp-model.ts), for the 4B and 8B shapes whose sampling takes minutes a
 *   rank; every rank builds the same weights either way, so parity holds within either.
 * - --nccl-priority high: NCCL's stream at the device's greatest priority, so the in-run all-reduce's
 *   blocks are scheduled before queued compute blocks (the A/B against `default`).
 * - Overlap diagnostics (with --overlap): `bucket_times` holds the last step's host ms of each bucket
 *   node's compute; --bucket-times adds the device's times of each bucket's all-reduce on CUDA (timing
 *   events: when its gradients were written, when NCCL started and finished it) and their summary, so
 *   one run tells whether the all-reduce ran beside the backward or after it. --profile PREFIX writes
 *   each session's ORT profile (PREFIX-rankN_<time>.json; on CUDA the node order, not device times).
 *
 * usage (each rank): node .bundle/dp-check.js [--shape 0.6b|1.7b|4b|8b|tiny] [--compute float32|bfloat16]
 *   [--lora RANK [--lora-alpha A] [--lora-targets REGEX]] [--init sampled|tiled]
 *   [--device cuda|cpu] [--steps 20] [--batch 8] [--seq 512] [--micro 1] [--lr 1e-5] [--warmup 2]
 *   [--flash-attention] [--attention-kernel [--logprob-kernel] [--rope-kernel] [--swiglu-kernel]] [--recompute] [--tf32] [--bucket-mb 100] [--zero 0|1|2] [--grad-reduce-dtype float32|bfloat16] [--overlap [--bucket-times] [--in-graph-update]] [--no-half-gradients] [--nccl-alone] [--nccl-priority default|high] [--compute-stream] [--profile PREFIX] [--reference ONE.json] [--tol X] [--out FILE]
 * run:  node .bundle/lathe.js launch --gpus 2 -- node .bundle/dp-check.js --compute float32 --out two.json
 * Prints one JSON line per rank (rank 0's first); --out writes rank 0's.
 */
import { parseConfig, totalLengthTensor, TOTAL_LENGTH_INPUT } from '@lathe/models';
import { Device, type HostTensor, type Ptr } from '@lathe/runtime';
import { sftLoss, Trainer, type LoraConfig, type SftLossOptions } from '@lathe/train';
import { bucketNodeOrderOfProfile, checkDataParallelBatch, checkSameConfig, DEFAULT_BUCKET_BYTES, gradientAllReduce, gradientAllReduceInGraph, gradientReduceScatterInGraph, NcclCollectives, NcclInRunReducer, overlapSummary, shardOf, soloInRunReducer, TcpCollectives, ThreadGroup, worldFromEnv, type Collectives, type InRunTimings } from '@lathe/distributed';
import { CrossEntropyKernels, crossEntropyOps, cudaIncludeDir, FlashAttention, flashAttentionOps, Kernels, RopeKernels, ropeOps, SwigluKernels, swigluOps } from '@lathe/kernels';
import { lossParity, reportResult } from './report';
import { dpModel, DP_SHAPES, type InitKind } from './dp-model';
import { arg, flag } from '../argv';

/** The global batch of a step: --batch rows of --seq seeded tokens, the first quarter of each a prompt (no loss). */
function globalBatch(step: number, rows: number, seq: number, vocab: number): { ids: number[][]; lossMask: number[][] } {
  let s = (0x9e3779b9 * (step + 1)) >>> 0;
  const next = () => (s = (Math.imul(s, 1664525) + 1013904223) >>> 0);
  const ids = Array.from({ length: rows }, () => Array.from({ length: seq }, () => 1 + (next() % (vocab - 1))));
  const lossMask = ids.map((r) => r.map((_, t) => Number(t >= seq / 4)));
  return { ids, lossMask };
}

/** Lathe's training kernels as graph ops: what the loss attends (and takes log-probs, rotates) through, and the sessions' domains. */
interface TrainKernels {
  /** Which kernels run: `attention`, then `logprob` and `rope` where asked. */
  used: string[];
  /** sftLoss's options that attend (and take log-probs, rotate) through the kernels. */
  loss: Pick<SftLossOptions, 'attentionKernel' | 'logprobKernel' | 'ropeKernel' | 'swigluKernel'>;
  /** The ops' custom-op domains, for the Trainer's sessions. */
  customOpDomains: Ptr[];
  /** Why the log-prob kernel's heads kept their composed ops, with how many graph builds did (none expected). */
  fallbacks(): Record<string, number>;
  /** Rethrows an error a kernel's compute raised in the last run. */
  check(): void;
  dispose(): void;
}

/** The kernels compiled on the device's own `kernels` (cuda), or their float32 host computes (cpu: no kernels). */
function trainKernels(kernels: Kernels | undefined, opts: { logprob: boolean; rope: boolean; swiglu: boolean }): TrainKernels {
  const attention = kernels ? flashAttentionOps('cuda', FlashAttention.compile(kernels, { includeDir: cudaIncludeDir() })) : flashAttentionOps('cpu');
  const ce = !opts.logprob ? undefined : kernels ? crossEntropyOps('cuda', CrossEntropyKernels.compile(kernels, { includeDir: cudaIncludeDir() })) : crossEntropyOps('cpu');
  const rope = !opts.rope ? undefined : kernels ? ropeOps('cuda', RopeKernels.compile(kernels, { includeDir: cudaIncludeDir() })) : ropeOps('cpu');
  const swiglu = !opts.swiglu ? undefined : kernels ? swigluOps('cuda', SwigluKernels.compile(kernels, { includeDir: cudaIncludeDir() })) : swigluOps('cpu');
  return {
    used: ['attention', ...(ce ? ['logprob'] : []), ...(rope ? ['rope'] : []), ...(swiglu ? ['swiglu'] : [])],
    loss: { attentionKernel: (x, heads) => attention.attend(x, heads, 'kernels'), ...(ce ? { logprobKernel: ce } : {}), ...(rope ? { ropeKernel: rope.rotate } : {}), ...(swiglu ? { swigluKernel: swiglu.apply } : {}) },
    customOpDomains: [attention.domain.handle, ...(ce ? [ce.domain.handle] : []), ...(rope ? [rope.domain.handle] : []), ...(swiglu ? [swiglu.domain.handle] : [])],
    fallbacks: () => Object.fromEntries(ce?.fallbacks ?? []),
    check: () => {
      attention.check();
      ce?.check();
      rope?.check();
      swiglu?.check();
    },
    dispose: () => {
      attention.dispose();
      ce?.dispose();
      rope?.dispose();
      swiglu?.dispose();
    },
  };
}

/**
 * The last step's bucket times: when each bucket node's compute ran on the host (ms from the step's
 * start; the step took `step_ms`) and, with --bucket-times on CUDA, the device's times of each
 * bucket (ready on the compute stream, NCCL's start and done, ms from the first ready; the step's start, negative) with what
 * they say (`summary`: a serialized all-reduce shows `tailMs` near `collectiveMs`).
 */
function bucketTimes(hostMs: readonly number[], stepMs: number, device: InRunTimings | undefined): Record<string, unknown> {
  const r = (x: number) => +x.toFixed(2);
  return {
    host_ms: hostMs.map(r),
    step_ms: r(stepMs),
    ...(device ? { device: { ready_start_done: device.buckets.map((b) => [r(b.ready), r(b.start), r(b.done)]), run_returned: device.runReturned === undefined ? null : r(device.runReturned), step_started: device.stepStarted === undefined ? null : r(device.stepStarted), enqueue_host_ms: device.enqueueHostMs === undefined ? null : r(device.enqueueHostMs) }, summary: overlapSummary(device) } : {}),
  };
}

async function main(): Promise<void> {
  const shape = arg('shape', '0.6b');
  const hf = DP_SHAPES[shape];
  if (!hf) throw new Error(`--shape ${shape}: one of ${Object.keys(DP_SHAPES).join(', ')}`);
  const compute = arg('compute', 'float32') as 'float32' | 'bfloat16';
  const deviceKind = arg('device', 'cuda') as 'cuda' | 'cpu';
  const steps = Number(arg('steps', '20'));
  const rowsPerStep = Number(arg('batch', '8'));
  const seq = Number(arg('seq', '512'));
  const micro = Number(arg('micro', '1'));
  const lr = Number(arg('lr', '1e-5'));
  const warmup = Number(arg('warmup', '2'));
  const attentionKernel = flag('attention-kernel');
  const logprobKernel = flag('logprob-kernel');
  const ropeKernel = flag('rope-kernel');
  const swigluKernel = flag('swiglu-kernel');
  if ((logprobKernel || ropeKernel || swigluKernel) && !attentionKernel) throw new Error('--logprob-kernel, --rope-kernel and --swiglu-kernel go with --attention-kernel (they share its device and sessions)');
  if (attentionKernel && deviceKind === 'cuda' && compute !== 'bfloat16') throw new Error(`--attention-kernel on --device cuda needs --compute bfloat16 (the kernels are bfloat16/float16 on the GPU; float32 only on the cpu), got --compute ${compute}`);
  // the kernels attend over right-padded rows, fed like GroupQueryAttention's (total_sequence_length)
  const flash = flag('flash-attention') || attentionKernel;
  const loraRank = Number(arg('lora', '0'));
  if (!Number.isInteger(loraRank) || loraRank < 0) throw new Error(`--lora ${arg('lora', '0')}: the adapters' rank, a positive integer (0: every weight trains)`);
  const lora: LoraConfig | undefined = loraRank > 0 ? { rank: loraRank, alpha: Number(arg('lora-alpha', String(2 * loraRank))), targets: arg('lora-targets', 'q_proj|k_proj|v_proj|o_proj') } : undefined;
  const init = arg('init', 'sampled') as InitKind;
  const zero = Number(arg('zero', '0'));
  if (zero !== 0 && zero !== 1 && zero !== 2) throw new Error(`--zero ${zero}: 0, 1 or 2`);
  const gradReduceDtype = arg('grad-reduce-dtype', 'float32') as 'float32' | 'bfloat16';
  if (gradReduceDtype !== 'float32' && gradReduceDtype !== 'bfloat16') throw new Error(`--grad-reduce-dtype ${String(gradReduceDtype)}: float32 or bfloat16`);
  const overlap = flag('overlap');
  const inGraphUpdate = flag('in-graph-update');
  if (inGraphUpdate && !overlap) throw new Error('--in-graph-update puts the update in the run of the in-run all-reduce: give it with --overlap');
  if (inGraphUpdate && (zero !== 0 || micro !== 1)) throw new Error(`--in-graph-update needs --micro 1 and --zero 0 (got --micro ${micro} --zero ${zero})`);
  // --no-half-gradients: the fused update reads float32 copies of the bfloat16 gradients (the A/B of TrainerOptions.halfGradients;
  // no effect with --in-graph-update --grad-reduce-dtype bfloat16, whose sums are bfloat16 either way)
  const halfGradients = !flag('no-half-gradients');
  const ncclPriority = arg('nccl-priority', 'default') as 'default' | 'high';
  if (ncclPriority !== 'default' && ncclPriority !== 'high') throw new Error(`--nccl-priority ${String(ncclPriority)}: default or high`);
  // the kernels launch on the stream the device's sessions run on: Lathe's own
  const computeStream = overlap || flag('compute-stream') || attentionKernel;
  const world = worldFromEnv();
  if (overlap && deviceKind !== 'cuda' && world.worldSize > 1) throw new Error('--overlap: on the CPU the in-run all-reduce needs ranks as threads of one process (ThreadGroup, the tests); processes over TCP cannot sum inside a run: use --device cuda, or run one rank');
  checkDataParallelBatch(rowsPerStep, micro, world.worldSize, { batch: '--batch', micro: '--micro' });

  // the group: TCP between processes, NCCL over it on CUDA (alone: no group at all)
  let group: Collectives | undefined;
  // --nccl-alone: a one-rank NCCL group, so one GPU runs the NCCL reducer's nodes and join (their ordering, not their scaling)
  const ncclAlone = flag('nccl-alone');
  if (ncclAlone && (world.worldSize > 1 || deviceKind !== 'cuda')) throw new Error('--nccl-alone is a one-process check on cuda: run it without dp-launch, with --device cuda');
  if (ncclAlone) group = await NcclCollectives.create(await TcpCollectives.connect({ rank: 0, worldSize: 1, addr: world.masterAddr, port: world.masterPort }), { deviceId: world.localRank, streamPriority: ncclPriority });
  if (world.worldSize > 1) {
    const tcp = await TcpCollectives.connect({ rank: world.rank, worldSize: world.worldSize, addr: world.masterAddr, port: world.masterPort });
    await checkSameConfig(tcp, { shape, compute, steps, rowsPerStep, seq, micro, lr, flash, attentionKernel, logprobKernel, ropeKernel, swigluKernel, recompute: flag('recompute'), tf32: flag('tf32'), zero, gradReduceDtype, overlap, inGraphUpdate, halfGradients, computeStream, ncclPriority, lora: lora ?? null, init });
    group = deviceKind === 'cuda' ? await NcclCollectives.create(tcp, { deviceId: world.localRank, streamPriority: ncclPriority }) : tcp;
  }
  // the in-run all-reduce orders NCCL behind the stream the sessions run on: Lathe's own
  const opened = computeStream && deviceKind === 'cuda' ? Kernels.withDevice({ deviceId: world.localRank, device: { tf32: flag('tf32') } }) : undefined;
  const device = opened?.device ?? Device.open(deviceKind, { id: world.localRank, tf32: flag('tf32') });
  const kernels = attentionKernel ? trainKernels(opened?.kernels, { logprob: logprobKernel, rope: ropeKernel, swiglu: swigluKernel }) : undefined;
  const bucketBytes = Number(arg('bucket-mb', String(DEFAULT_BUCKET_BYTES / 2 ** 20))) * 2 ** 20;
  const profile = arg('profile', '');
  // the order the buckets' nodes computed in (each step: 0, 1, …, the backward's order)
  const bucketOrder: number[] = [];
  // alone on CUDA the nodes run without collectives: their own cost, against N ranks' overlap
  const inRun = !overlap ? undefined : group instanceof NcclCollectives ? NcclInRunReducer.create(group, { timing: flag('bucket-times') }) : group ? undefined : deviceKind === 'cpu' ? ThreadGroup.join(ThreadGroup.create(1), 0) : soloInRunReducer();
  // host ms of each bucket node's compute in the current step, from the step's start
  let stepStart = 0;
  let bucketHostMs: number[] = [];
  const onCompute = (k: number) => {
    if (bucketOrder.length < 100_000) bucketOrder.push(k);
    bucketHostMs.push(performance.now() - stepStart);
  };
  const reduction = (() => {
    if (inRun && zero >= 1 && group) return { zero: group, gradReduceDtype, inGraphShards: gradientReduceScatterInGraph(inRun, device, { bucketBytes, onCompute }) };
    if (inRun) return { gradReduceDtype, inGraphGradients: gradientAllReduceInGraph(inRun, device, { bucketBytes, onCompute }), inGraphUpdate };
    if (!group) return {};
    return { gradReduceDtype, ...(zero >= 1 ? { zero: group } : { onGradients: gradientAllReduce(group, { bucketBytes }) }) };
  })();
  const config = parseConfig(hf, `--shape ${shape}`);
  const model = dpModel(config, device, { compute, init, ...(lora ? { lora } : {}) });
  const trainer = Trainer.create(
    { params: model.params, loss: sftLoss(config, { compute, flashAttention: flash, recompute: flag('recompute'), ...kernels?.loss, ...(model.weights ? { weights: model.weights } : {}) }), optimizer: { weightDecay: 0.01, maxGradNorm: 1 } },
    { params: model.init },
    { device, microBatches: micro, ...reduction, halfGradients, frozen: model.frozen, session: { ...(kernels ? { customOpDomains: kernels.customOpDomains } : {}), ...(profile ? { profilePrefix: `${profile}-rank${world.rank}` } : {}) } },
  );
  model.init.clear();
  const i64 = (rows: number[][]): HostTensor => ({ data: BigInt64Array.from(rows.flat().map(BigInt)), dims: [rows.length, rows[0].length] });
  const losses: number[] = [];
  const stepMs: number[] = [];
  const phases: { run: number; reduce: number; host: number }[] = [];
  const gradNorms: number[] = [];
  for (let step = 0; step < steps; step++) {
    const g = globalBatch(step, rowsPerStep, seq, Number(hf.vocab_size));
    // the whole batch's loss tokens: position t predicts t + 1, so column 0 of the mask never counts
    const lossTokens = g.lossMask.reduce((s, r) => s + r.slice(1).reduce((a, b) => a + b, 0), 0);
    const ids = shardOf(g.ids, world.rank, world.worldSize, '--batch');
    const mask = shardOf(g.lossMask, world.rank, world.worldSize, '--batch');
    const per = ids.length / micro;
    const batches = Array.from({ length: micro }, (_, k) => ({
      input_ids: i64(ids.slice(k * per, (k + 1) * per)),
      attention_mask: i64(ids.slice(k * per, (k + 1) * per).map((r) => r.map(() => 1))),
      loss_mask: i64(mask.slice(k * per, (k + 1) * per)),
      loss_tokens: { data: Float32Array.from([lossTokens]), dims: [] },
      ...(flash ? { [TOTAL_LENGTH_INPUT]: totalLengthTensor(seq) } : {}),
    }));
    const t0 = performance.now();
    stepStart = t0;
    bucketHostMs = [];
    if (inRun instanceof NcclInRunReducer && device.computeStream !== undefined) inRun.markStepStart(device.computeStream);
    const r = await trainer.trainStepAsync(batches, lr);
    stepMs.push(performance.now() - t0);
    phases.push({ run: r.runMs - (r.reduceMs ?? 0), reduce: r.reduceMs ?? 0, host: r.hostMs });
    kernels?.check();
    losses.push(r.loss);
    gradNorms.push(r.gradNorm);
  }
  const timed = stepMs.slice(Math.min(warmup, steps - 1)).sort((a, b) => a - b);
  const median = timed[Math.floor(timed.length / 2)];
  const result: Record<string, unknown> = {
    rank: world.rank,
    world: world.worldSize,
    backend: group?.backend ?? 'none',
    shape,
    compute,
    batch: [rowsPerStep, seq],
    micro,
    zero,
    lora: lora ? { ...lora, adapters: model.adapters } : null,
    init,
    trainable_params: model.trainableParams,
    frozen_bytes: model.frozenBytes,
    grad_reduce_dtype: gradReduceDtype,
    ...(ncclPriority !== 'default' ? { nccl_priority: ncclPriority } : {}),
    overlap: Boolean(inRun),
    in_graph_update: inGraphUpdate,
    half_gradients: halfGradients,
    ...(inRun ? { buckets: Math.max(...bucketOrder) + 1, bucket_order_ok: bucketOrder.every((k, i) => k === i % (Math.max(...bucketOrder) + 1)) } : {}),
    ...(inRun ? { bucket_times: bucketTimes(bucketHostMs, stepMs.at(-1)!, inRun instanceof NcclInRunReducer ? inRun.lastTimings : undefined) } : {}),
    compute_stream: computeStream,
    kernels: kernels?.used ?? [],
    ...(kernels && Object.keys(kernels.fallbacks()).length ? { kernel_fallbacks: kernels.fallbacks() } : {}),
    moment_bytes: trainer.momentBytes,
    state_bytes: trainer.stateBytes,
    losses,
    grad_norms: gradNorms,
    step_ms: stepMs.map((x) => +x.toFixed(1)),
    // each step's time in the session runs, waiting on the reduction after them, and binding inputs (the rest: the script's own host work)
    phase_ms: { run: phases.map((p) => +p.run.toFixed(1)), reduce: phases.map((p) => +p.reduce.toFixed(1)), host: phases.map((p) => +p.host.toFixed(1)) },
    tokens_per_s: Math.round((rowsPerStep * seq) / (median / 1000)),
    memory: device.memory(),
  };
  const parity = lossParity(losses, world.rank, compute);
  if (parity) result.parity = parity;
  trainer.dispose();
  for (const t of Object.values(model.frozen)) t.dispose();
  // each session writes its profile when disposed
  const order = profile ? bucketNodeOrderOfProfile(`${profile}-rank${world.rank}`) : undefined;
  if (order) result.profile_order = { file: order.file, nodes: order.nodes, backward: order.backward, backward_after: order.backwardAfter };
  kernels?.dispose();
  if (inRun instanceof NcclInRunReducer) inRun.dispose();
  await group?.close();
  reportResult(result, world.rank);
}

main().catch((e: Error) => {
  process.stderr.write(`dp-check rank ${process.env.RANK ?? 0}: ${e.stack ?? e.message}\n`);
  process.exit(1);
});
