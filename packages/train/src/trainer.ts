/**
 * `Trainer`: runs compiled train steps with parameters and AdamW state resident on a device.
 *
 * Every parameter has two sets of buffers (value, first moment, second moment). A step reads set k
 * and writes set 1 − k, so the graph never reads and writes one buffer in the same run, and a
 * session that reads the weights (generation, scoring) never sees a half-written tensor. The
 * bindings for both directions are made once; a step binds only the batch and three scalars, runs,
 * and flips. Nothing else crosses the host boundary until `snapshot()` is called for a checkpoint.
 *
 * Gradient accumulation keeps two gradient buffers per parameter the same way: each micro-batch's
 * run adds its gradients into the other buffer; `apply` then runs AdamW on the sum.
 */
import * as L from '@lathe/onnx';
import type { DType, Graph } from '@lathe/onnx';
import { Device, type Binding, type DeviceTensor, type HostTensor, type Session, type SessionOptions } from '@lathe/runtime';
import { Kernels } from '@lathe/kernels';
import { TOTAL_LENGTH_INPUT } from '@lathe/models';
import { fusedAdamWNode, type FusedAdamWNode } from './fused-adamw';
import { biasCorrections } from './schedule';
import { compileApply, compileGradients, compileTrainStep, stateNames, type TrainableParam, type TrainStepGraphs, type TrainStepSpec } from './train-step';
import { addInGraphNodes, addInGraphShardNodes, bindInGraphOutputs, checkInGraphGradients, checkInGraphUpdate, inGraphOutput, inGraphPadded, inGraphUpdateNodes, type InGraphGradients, type InGraphParts, type InGraphShards } from './in-run-reduce';
import { allGatherAll, buildReduceCast, gradCastGraph, reduceScatterAll, shardLayout, paramShard, type GradReduceDtype, type ReduceCast, type ShardCollectives, type ShardSlot } from './zero';

/** A batch input: host data (copied at bind time) or a device tensor (bound by address). */
export type BatchTensor = HostTensor | DeviceTensor;

/** Options of `Trainer.create`. */
export interface TrainerOptions {
  /** Where state lives and steps run (default: the CPU). */
  device?: Device;
  /** Micro-batches per optimizer step (default 1: forward, backward and update in one run). */
  microBatches?: number;
  /** Inputs that stay fixed for the whole run (e.g. a LoRA base's `base/<name>` weights). */
  frozen?: Record<string, BatchTensor>;
  /** Options for the step sessions (optimization level, profiling, …). */
  session?: SessionOptions;
  /**
   * Capture the step as a CUDA graph and replay it (CUDA, one micro-batch, a loss compiled with a
   * fixed batch shape). Implies `staticInputs`. The two bindings get graph ids 0 and 1.
   */
  cudaGraph?: boolean;
  /**
   * Bind the batch, the three scalars and the scalar outputs to device buffers that never move:
   * each step copies the batch into them. What CUDA graph replay needs; on its own, a way to test
   * that path on the CPU.
   */
  staticInputs?: boolean;
  /**
   * Called after a step's accumulate runs and before its apply run, with the summed gradient
   * buffers (`grad/p` by parameter name) and the step's `[loss, ...metrics]` sums, which it may
   * change in place: where data-parallel training all-reduces gradients (see @lathe/distributed's
   * `gradientAllReduce`). It must leave the buffers holding the gradients the update should use.
   * With it, every step runs as accumulate + apply (one micro-batch included) and steps go through
   * `trainStepAsync`. ORT synchronises its stream at the end of each run, so the accumulate run's
   * gradients are complete when the hook starts; the hook must finish its own device work (a
   * collective's stream synchronised) before its promise resolves, since the apply run follows.
   */
  onGradients?: (grads: Map<string, DeviceTensor>, sums: Float64Array) => Promise<void>;
  /**
   * Run the AdamW update as one node of Lathe's fused kernels (one pass over every parameter,
   * clipping included; fused-adamw.ts) instead of the composed ops, in the same step and apply
   * graphs. On CUDA it needs a device opened by `Kernels.withDevice` (@lathe/kernels), whose
   * sessions run on the kernels' stream; on the CPU the node computes on the host (tests only: slow).
   * Default: on for a CUDA device opened with Lathe's compute stream and no CUDA graph
   * (LATHE_FUSED_ADAMW=0 turns that off), off elsewhere.
   */
  fusedAdamW?: boolean;
  /**
   * With `fusedAdamW`, one micro-batch a step: the update reads each gradient that is a bfloat16
   * value widened to its float32 master weight (bf16 compute) as that bfloat16 value, and the fused
   * kernels widen it themselves — the same update bit for bit, without the float32 copy of the
   * gradients (a write and two reads of 4 bytes a parameter become two reads of 2). Default true;
   * false keeps the float32 copies (the A/B). `inGraphUpdate` with bfloat16 sums takes the bfloat16
   * gradients as they are whatever this says (their sums are what the node reads).
   */
  halfGradients?: boolean;
  /**
   * ZeRO stage 1 over these ranks (zero.ts): each rank keeps 1/N of the AdamW moments and of an
   * fp32 master copy of the parameters; gradients are reduce-scattered (summed, as
   * `gradientAllReduce` sums them), each rank updates its shards, and the parameters are
   * all-gathered. The full parameters are kept once (not double-buffered). Steps go through
   * `trainStepAsync`, checkpoints through `snapshotAsync` (every rank calls it). Replaces `onGradients`.
   */
  zero?: ShardCollectives;
  /**
   * The dtype gradients are reduced in between ranks (with `onGradients` or `zero`; zero.ts's
   * `GradReduceDtype`): 'bfloat16' casts them to bfloat16 in one run before the hook or the
   * reduce-scatter and back to float32 after it, halving the bytes sent. Default 'float32'.
   */
  gradReduceDtype?: GradReduceDtype;
  /**
   * Data-parallel gradients reduced inside the backward's run (@lathe/distributed's
   * `gradientAllReduceInGraph`): its nodes are added to the accumulate graph after the gradients
   * they read, so a bucket's all-reduce starts while the rest of the backward runs; `finish` waits
   * for them after the run, before the apply run; with several micro-batches only the last one's
   * run has the nodes. float32, or bfloat16 copies with `gradReduceDtype` (widened after the run);
   * no ZeRO; instead of `onGradients`. Steps go through `trainStepAsync`; the trainer disposes the
   * hook with itself. With `inGraphUpdate` the update joins the same run.
   */
  inGraphGradients?: InGraphGradients;
  /**
   * With `inGraphGradients` and one micro-batch: the update in the same run as the backward and the
   * all-reduce, so a data-parallel step is one run as a one-GPU step is (forward, backward, clip and
   * AdamW: the `step` graph), not an accumulate run and an apply run, whose split costs a step more
   * than the all-reduce left exposed does. The bucket nodes sum the bound gradient buffers in place,
   * and a join node after them all — on CUDA, the compute stream's wait for the collective stream —
   * orders the update's reads of them after it (the hook's `buildReduced`; in-run-reduce.ts).
   * After the run the trainer only waits for the hook's `finish` (the loss and metrics summed over
   * the ranks) and adopts the new parameters when the summed loss is finite: the update wrote the
   * other buffer set, so a non-finite loss on any rank leaves every rank's parameters as they were.
   * float32 reductions, or bfloat16 with `fusedAdamW` (the bfloat16 gradients themselves are
   * summed where the backward made them, the rest cast in the run, and the fused node reads the
   * sums); off by default here (@lathe/recipes' data-parallel commands turn it on wherever it applies).
   */
  inGraphUpdate?: boolean;
  /**
   * With `zero`: the reduce-scatter inside the gradients run (@lathe/distributed's
   * `gradientReduceScatterInGraph`): its nodes follow the gradients (padded in the run where
   * needed) and write this rank's shards while the backward goes on; `finish` waits for them after
   * each micro-batch's run (with gradReduceDtype 'bfloat16' of bfloat16 copies cast in the run).
   */
  inGraphShards?: InGraphShards;
}

/** The trained tensors' values and their AdamW first and second moments, by parameter name: what a resume restores beside its step counts. */
export interface OptimizerState {
  params: Map<string, Float32Array>;
  m: Map<string, Float32Array>;
  v: Map<string, Float32Array>;
}

/** Initial state: parameter values, and optionally AdamW moments (a resume). */
export interface TrainerInit {
  params: Map<string, Float32Array | DeviceTensor>;
  m?: Map<string, Float32Array>;
  v?: Map<string, Float32Array>;
  /** Optimizer steps already taken (bias corrections continue from here). */
  step?: number;
}

/** What one optimizer step reports. */
export interface TrainStepResult {
  /** The loss (summed over micro-batches; losses normalised by a whole-batch count add up exactly). */
  loss: number;
  /** Global gradient norm before clipping. */
  gradNorm: number;
  /** The loss builder's extra outputs, summed over micro-batches. */
  metrics: Record<string, number>;
  /** Milliseconds spent binding inputs (host → device copies of the batch and scalars). */
  hostMs: number;
  /** Milliseconds spent in runs (including reading the scalar outputs back). */
  runMs: number;
  /**
   * Of `runMs`, the milliseconds the host waited after the gradients' runs for the data-parallel
   * reduction to complete (the `onGradients` hook, or the in-run collectives' finish): where a
   * data-parallel step's time beyond one GPU's goes. Absent without a reduction.
   */
  reduceMs?: number;
}

interface Buffers {
  p: DeviceTensor;
  m: DeviceTensor;
  v: DeviceTensor;
}

const f32 = (v: number): HostTensor => ({ data: Float32Array.from([v]), dims: [] });

/** What `Trainer.create` builds and the trainer holds. */
interface TrainerParts {
  graphs: TrainStepGraphs;
  device: Device;
  names: string[];
  /** sets[k].get(name): the value and moments of set k. */
  sets: [Map<string, Buffers>, Map<string, Buffers>];
  /** step[k]: reads set k, writes set 1 − k (single-run steps). */
  stepBindings?: Binding[];
  /** accumulate[k][j]: params of set k, gradients from buffer j into 1 − j. */
  accumulateBindings?: Binding[][];
  /** apply[k][j]: set k and gradients j → set 1 − k. */
  applyBindings?: Binding[][];
  /** The gradient buffers: two for several micro-batches, one map in both slots for one. */
  grads?: [Map<string, DeviceTensor>, Map<string, DeviceTensor>];
  microBatches: number;
  /** Optimizer steps already taken. */
  step: number;
  /** The loss builder's inputs that each batch supplies (the frozen ones are bound once). */
  batchInputs: string[];
  /** Fixed buffers for the batch, the scalars and the scalar outputs (staticInputs only). */
  fixed?: StaticBuffers;
  /** Writes zeros to gradient buffer 0 in one run (several micro-batches only). */
  zeroGradients?: Binding;
  /** TrainerOptions.onGradients. */
  onGradients?: (grads: Map<string, DeviceTensor>, sums: Float64Array) => Promise<void>;
  /** TrainerOptions.gradReduceDtype 'bfloat16' with onGradients: the hook reduces bfloat16 copies of the gradients. */
  reduceCast?: ReduceCast;
  /** The fused update's node (TrainerOptions.fusedAdamW): its domain outlives the sessions. */
  fused?: FusedAdamWNode;
  /** ZeRO-1's shards, collectives and runs (TrainerOptions.zero). */
  zero?: ZeroParts;
  /** TrainerOptions.inGraphGradients, and the device buffers its nodes' outputs are bound to. */
  inGraph?: InGraphParts;
  /** With inGraphGradients and several micro-batches: the last micro-batch's runs (lastAccumulate[k][j]), the only ones that reduce. */
  lastAccumulate?: Binding[][];
}

/** What a ZeRO-1 trainer keeps beside the full parameters. */
interface ZeroParts {
  collectives: ShardCollectives;
  layout: ShardSlot[];
  /** shards[s]: this rank's master-weight and moment shards, double-buffered as the full state is. */
  shards: [Map<string, Buffers>, Map<string, Buffers>];
  /** The shard set the next update reads. */
  current: number;
  /** One micro-batch's full gradients (one buffer: each micro-batch's are reduce-scattered before the next runs). */
  grads: Map<string, DeviceTensor>;
  /** The forward and backward of a micro-batch into `grads`. */
  gradients: Binding;
  /** gradShards[a]: this rank's summed gradient shards, double-buffered for the sum over micro-batches. */
  gradShards: [Map<string, DeviceTensor>, Map<string, DeviceTensor>];
  /** A later micro-batch's reduce-scattered shards, and add[a]: gradShards[a] + received → gradShards[1 − a] (micro-batches > 1). */
  received?: Map<string, DeviceTensor>;
  add?: Binding[];
  /** Padded parameters: [worldSize × shard] buffers for the gradient sent and the values gathered. */
  padded: Map<string, DeviceTensor>;
  /** Copies the padded parameters' gradients into `padded` (none when nothing is padded). */
  pad?: Binding;
  /** Copies the gathered values of the padded parameters into the parameters. */
  unpad?: Binding;
  /** norm[a]: sum of squares of gradShards[a] → host. */
  norm: Binding[];
  /** update[s][a]: AdamW on shard set s with gradShards[a] → shard set 1 − s, gradients scaled by the host clip coefficient. */
  update: Binding[][];
  maxGradNorm: number;
  /** A scalar placeholder for the full state's unused moment slots. */
  placeholder: DeviceTensor;
  /**
   * gradReduceDtype 'bfloat16': `down` casts a micro-batch's gradients into `send` (bfloat16,
   * padded to worldSize × shard), which are reduce-scattered into `recv`; up[0] widens those into
   * gradShards[0] (the first micro-batch), up[1] into `received` (later ones).
   */
  low?: { send: Map<string, DeviceTensor>; recv: Map<string, DeviceTensor>; down: Binding; up: Binding[] };
  /** TrainerOptions.inGraphShards: the gradients run reduce-scatters; its nodes' outputs' buffers. */
  inGraph?: { hook: InGraphShards; outputs: DeviceTensor[] };
}

/** Device-resident training state and the compiled step that updates it. */
export class Trainer {
  readonly graphs: TrainStepGraphs;
  readonly device: Device;
  readonly microBatches: number;
  /** The loss builder's inputs that each batch supplies (the frozen ones are bound once). */
  readonly batchInputs: string[];
  /** The state buffers and bindings `create` built. */
  private readonly parts: TrainerParts;
  private current = 0;
  private optimizerStep: number;
  private readonly sessions: Session[] = [];
  private disposed = false;

  private constructor(parts: TrainerParts) {
    this.graphs = parts.graphs;
    this.device = parts.device;
    this.microBatches = parts.microBatches;
    this.batchInputs = parts.batchInputs;
    this.parts = parts;
    this.optimizerStep = parts.step;
  }

  /** Compiles the step for `spec`, uploads the initial state and prepares the bindings. */
  static create(spec: TrainStepSpec, init: TrainerInit, opts: TrainerOptions = {}): Trainer {
    const device = opts.device ?? Device.cpu();
    const microBatches = opts.microBatches ?? 1;
    if (!Number.isInteger(microBatches) || microBatches < 1) throw new Error(`microBatches must be a positive integer, got ${microBatches}`);
    const fusedAdamW = opts.fusedAdamW ?? fusedAdamWByDefault(device, opts);
    if (fusedAdamW) checkFusedAdamW(device);
    // with ZeRO-1 the update runs on this rank's shards: the fused node is built for those
    const layout = opts.zero ? shardLayout(spec.params, opts.zero.worldSize) : undefined;
    const fused = fusedAdamW ? fusedUpdateNode(device, layout ? { ...spec, params: shardParams(layout), optimizer: { ...spec.optimizer, maxGradNorm: 0 } } : spec) : undefined;
    try {
      return Trainer.build(fused && !layout ? { ...spec, update: fused.update } : spec, init, opts, device, microBatches, fused);
    } catch (e) {
      fused?.dispose();
      throw e;
    }
  }

  private static build(spec: TrainStepSpec, init: TrainerInit, opts: TrainerOptions, device: Device, microBatches: number, fused: FusedAdamWNode | undefined): Trainer {
    // the in-run reduction's options are checked before its hook builds nodes into the graphs
    if (opts.inGraphGradients) checkInGraphGradients(opts, Boolean(opts.staticInputs || opts.cudaGraph));
    checkInGraphUpdate(opts, microBatches, Boolean(fused));
    if (opts.halfGradients !== undefined && typeof opts.halfGradients !== 'boolean') throw new Error(`Trainer: halfGradients must be true or false, got ${String(opts.halfGradients)}`);
    // One micro-batch a step: the accumulate run writes the gradients rather than adding them to a
    // zeroed buffer. The update's grad_scale would always be 1 here: it reads the gradients as they are.
    // inGraphUpdate: the step graph's gradients go through the hook's bucket nodes and join before the update.
    const graphs = compileTrainStep(spec, {
      sumGradients: microBatches > 1,
      gradScale: false,
      // only where the step graph's update is the fused node (with ZeRO it updates shards in a graph of its own)
      halfGradients: fused !== undefined && spec.update === fused.update && (opts.halfGradients ?? true),
      ...(opts.inGraphUpdate ? { beforeUpdate: inGraphUpdateNodes(opts.inGraphGradients!, opts.gradReduceDtype === 'bfloat16') } : {}),
    });
    const names = spec.params.map((p) => p.name);
    for (const p of spec.params) {
      const v = init.params.get(p.name);
      if (!v) throw new Error(`Trainer: no initial value for parameter '${p.name}'`);
      const n = p.shape.reduce((a, b) => a * b, 1);
      const size = v instanceof Float32Array ? v.length : v.size;
      if (size !== n) throw new Error(`Trainer: parameter '${p.name}' has ${size} elements, its shape [${p.shape.join(', ')}] needs ${n}`);
    }
    // Everything that can be refused is checked before any device memory is taken.
    const sessionOpts = { ...opts.session };
    const frozen = opts.frozen ?? {};
    for (const k of Object.keys(frozen)) if (!graphs.batchInputs.includes(k)) throw new Error(`Trainer: frozen input '${k}' is not an input of the loss (it reads: ${graphs.batchInputs.join(', ')})`);
    const batchInputs = graphs.batchInputs.filter((n) => !(n in frozen));
    const staticInputs = Boolean(opts.staticInputs || opts.cudaGraph);
    if (staticInputs && microBatches !== 1) throw new Error('Trainer: cudaGraph / staticInputs need microBatches = 1');
    // GroupQueryAttention reads its total length on the host: a fixed device buffer would not do
    if (staticInputs && batchInputs.includes(TOTAL_LENGTH_INPUT)) {
      throw new Error(`Trainer: cudaGraph / staticInputs need a loss compiled for a fixed batch shape (its '${TOTAL_LENGTH_INPUT}' input says the shape is symbolic): give the loss \`shape\``);
    }
    if (staticInputs && opts.onGradients) throw new Error('Trainer: cudaGraph / staticInputs run the step as one run, which leaves no place for onGradients');
    if (opts.zero && staticInputs) throw new Error('Trainer: zero (ZeRO-1) runs collectives between the backward and the update: it does not combine with cudaGraph / staticInputs');
    if (opts.zero && opts.onGradients) throw new Error('Trainer: zero (ZeRO-1) reduce-scatters the gradients itself: give it instead of onGradients, not both');
    if (opts.inGraphShards && !opts.zero) throw new Error('Trainer: inGraphShards (the reduce-scatter inside the gradients run) is the ZeRO form: give zero with it, or inGraphGradients without ZeRO');
    const lowReduce = (opts.gradReduceDtype ?? 'float32') === 'bfloat16';
    if (opts.gradReduceDtype !== undefined && opts.gradReduceDtype !== 'float32' && opts.gradReduceDtype !== 'bfloat16') throw new Error(`Trainer: gradReduceDtype must be 'float32' or 'bfloat16', got '${String(opts.gradReduceDtype)}'`);
    if (lowReduce && !opts.zero && !opts.onGradients && !opts.inGraphGradients) throw new Error("Trainer: gradReduceDtype 'bfloat16' is the dtype of a data-parallel gradient reduction: give onGradients or zero with it");
    if (opts.cudaGraph && device.kind !== 'cuda') throw new Error(`Trainer: cudaGraph: CUDA graphs need a CUDA device, got ${device.kind}`);
    if (opts.cudaGraph) sessionOpts.cudaGraph = true;
    if (fused) sessionOpts.customOpDomains = [...(sessionOpts.customOpDomains ?? []), fused.domain.handle];
    // What build compiles and allocates is listed as it is made, so a failure part-way (a session ORT
    // refuses, a binding that throws, memory running out) frees it all instead of leaving it to the
    // garbage collector; on success the trainer owns the sessions and its parts hold the tensors.
    const sessions: Session[] = [];
    const tensors: DeviceTensor[] = [];
    const keepSession = (x: Session): Session => (sessions.push(x), x);
    const compile = (g: Graph, o: SessionOptions): Session => keepSession(device.compile(g, o));
    const keep = (t: DeviceTensor): DeviceTensor => (tensors.push(t), t);
    try {
      const alloc = (): Map<string, Buffers> =>
        new Map(spec.params.map((p) => [p.name, { p: keep(device.empty('float32', p.shape)), m: keep(device.empty('float32', p.shape)), v: keep(device.empty('float32', p.shape)) }]));
      // ZeRO-1 keeps the full parameters once and no full moments (the placeholder fills their slots)
      const placeholder = opts.zero ? keep(device.zeros('float32', [1])) : undefined;
      const zeroSet = (): Map<string, Buffers> => new Map(spec.params.map((p) => [p.name, { p: keep(device.empty('float32', p.shape)), m: placeholder!, v: placeholder! }]));
      const sets: [Map<string, Buffers>, Map<string, Buffers>] = placeholder ? ((s) => [s, s])(zeroSet()) : [alloc(), alloc()];
      for (const p of spec.params) {
        const b = sets[0].get(p.name)!;
        const v = init.params.get(p.name)!;
        if (v instanceof Float32Array) b.p.upload(v);
        else b.p.copyFrom(v);
        if (placeholder) continue;
        const m = init.m?.get(p.name);
        const vv = init.v?.get(p.name);
        if (m) b.m.upload(m);
        else b.m.fill(0);
        if (vv) b.v.upload(vv);
        else b.v.fill(0);
      }
      const trainer = (() => {
        if (opts.zero) {
          const z = buildZero(opts.zero, spec, init, device, sets[0], frozen, microBatches, graphs.metrics, placeholder!, { ...opts.session, ...(fused ? { customOpDomains: sessionOpts.customOpDomains } : {}) }, fused, lowReduce, opts.inGraphShards);
          z.sessions.forEach(keepSession);
          return new Trainer({ graphs, device, names, sets, microBatches, step: init.step ?? 0, batchInputs, fused, zero: z.parts });
        }
        if (opts.inGraphUpdate) {
          // one run a step: the step graph with the bucket nodes and their join before the update
          const hook = opts.inGraphGradients!;
          const session = compile(graphs.step, { ...sessionOpts, customOpDomains: [...(sessionOpts.customOpDomains ?? []), ...hook.customOpDomains] });
          // the gradients the bucket nodes read: bound, so ORT never reuses them while the collective stream may read them
          // (bfloat16 ones where the gradients are summed in bfloat16)
          const dtypes = new Map(graphs.step.outputs.map((t) => [t.name, t.dtype]));
          const grads = new Map(spec.params.map((p) => [p.name, keep(device.empty(dtypes.get(stateNames.next(stateNames.grad(p.name)))!, p.shape))]));
          const stepBindings = [0, 1].map((k) => {
            const b = session.binding();
            bindState(b, sets[k], sets[1 - k], names);
            bindFrozen(b, frozen);
            bindScalarOutputs(b, graphs);
            for (const n of names) b.output(stateNames.next(stateNames.grad(n)), grads.get(n)!);
            return b;
          });
          hook.attach(grads);
          return new Trainer({ graphs, device, names, sets, stepBindings, grads: [grads, grads], microBatches: 1, step: init.step ?? 0, batchInputs, fused, inGraph: { hook, outputs: [], low: false } });
        }
        if (microBatches === 1 && !opts.onGradients && !opts.inGraphGradients) {
          const session = compile(graphs.step, sessionOpts);
          const fixed: StaticBuffers | undefined = staticInputs
            ? {
                scalars: { lr: keep(device.empty('float32', [])), bc1: keep(device.empty('float32', [])), bc2: keep(device.empty('float32', [])) },
                outputs: Object.fromEntries(['loss', 'grad_norm', ...graphs.metrics].map((n) => [n, keep(device.empty('float32', []))])),
                batch: new Map(),
                dtypes: new Map(session.inputs.map((i) => [i.name, i.dtype])),
                sessionOptions: { ...opts.session, cudaGraph: false, optimization: 'disabled', name: 'train-stage-batch' },
                graphs: Boolean(opts.cudaGraph),
              }
            : undefined;
          const stepBindings = [0, 1].map((k) => {
            const b = session.binding();
            bindState(b, sets[k], sets[1 - k], names);
            bindFrozen(b, frozen);
            if (fixed) {
              for (const [n, t] of Object.entries(fixed.scalars)) b.input(n, t);
              for (const [n, t] of Object.entries(fixed.outputs)) b.output(n, t);
              if (opts.cudaGraph) b.runConfig('gpu_graph_id', String(k));
            } else bindScalarOutputs(b, graphs);
            return b;
          });
          return new Trainer({ graphs, device, names, sets, stepBindings, microBatches: 1, step: init.step ?? 0, batchInputs, fixed, fused });
        }
        // Several micro-batches sum into two buffers in turn (buffer 0 zeroed after each update); one
        // micro-batch writes its gradients into one buffer, both slots of `grads`, read by the update.
        const summed = microBatches > 1;
        const gradSet = () => new Map(spec.params.map((p) => [p.name, keep(summed ? device.zeros('float32', p.shape) : device.empty('float32', p.shape))]));
        const grads: [Map<string, DeviceTensor>, Map<string, DeviceTensor>] = summed ? [gradSet(), gradSet()] : ((g) => [g, g] as [typeof g, typeof g])(gradSet());
        // with several micro-batches only the last one's run reduces: the earlier ones run the graph without the nodes
        const plain = opts.inGraphGradients && microBatches > 1 ? compile(graphs.accumulate, sessionOpts) : undefined;
        const inGraph = opts.inGraphGradients ? addInGraphNodes(opts.inGraphGradients, graphs.accumulate, spec.params, device, lowReduce) : undefined;
        tensors.push(...(inGraph?.outputs ?? []));
        const accumulate = compile(graphs.accumulate, inGraph ? { ...sessionOpts, customOpDomains: [...(sessionOpts.customOpDomains ?? []), ...inGraph.hook.customOpDomains] } : sessionOpts);
        const apply = compile(graphs.apply, sessionOpts);
        // Every step's first micro-batch adds into gradient buffer 0, so it is zeroed after each
        // apply by one run writing zeros to all of them, since a fill per tensor is a session run
        // each on CUDA.
        const zeroBinding = summed ? keepSession(zeroGradientsSession(device, spec.params, opts.session)).binding() : undefined;
        if (zeroBinding) for (const p of spec.params) zeroBinding.output(`zero/${p.name}`, grads[0].get(p.name)!);
        const reduceCast = lowReduce ? buildReduceCast(device, spec.params, grads, opts.session ?? {}) : undefined;
        if (reduceCast) {
          reduceCast.sessions.forEach(keepSession);
          tensors.push(...reduceCast.low.values());
        }
        const accumulateBindingsOf = (session: Session, nodes: boolean) => [0, 1].map((k) =>
          [0, 1].map((j) => {
            const b = session.binding();
            for (const n of names) {
              b.input(n, sets[k].get(n)!.p);
              if (summed) b.input(stateNames.grad(n), grads[j].get(n)!);
              b.output(stateNames.next(stateNames.grad(n)), grads[1 - j].get(n)!);
            }
            bindFrozen(b, frozen);
            b.output('loss', 'host');
            for (const m of graphs.metrics) b.output(m, 'host');
            // bfloat16: the run also writes the bfloat16 copies the nodes reduce
            if (nodes && inGraph) bindInGraphOutputs(b, inGraph, names, reduceCast?.low);
            return b;
          }),
        );
        const accumulateBindings = accumulateBindingsOf(plain ?? accumulate, !plain);
        const lastAccumulate = plain ? accumulateBindingsOf(accumulate, true) : undefined;
        // micro-batch i reads buffer i mod 2 and writes the other: the last one writes buffer 1 − (k − 1) mod 2
        inGraph?.hook.attach(inGraph.low ? reduceCast!.low : grads[1 - ((microBatches - 1) % 2)]);
        const applyBindings = [0, 1].map((k) =>
          [0, 1].map((j) => {
            const b = apply.binding();
            bindState(b, sets[k], sets[1 - k], names);
            for (const n of names) b.input(stateNames.grad(n), grads[j].get(n)!);
            b.output('grad_norm', 'host');
            return b;
          }),
        );
        return new Trainer({ graphs, device, names, sets, accumulateBindings, applyBindings, grads, microBatches, step: init.step ?? 0, batchInputs, zeroGradients: zeroBinding, onGradients: opts.onGradients, reduceCast, fused, inGraph, lastAccumulate });
      })();
      sessions.forEach((x) => trainer.own(x));
      return trainer;
    } catch (e) {
      for (const x of sessions) x.dispose();
      for (const t of tensors) t.dispose();
      throw e;
    }
  }

  private own(s: Session): this {
    this.sessions.push(s);
    return this;
  }

  /** Optimizer steps taken. */
  get step(): number {
    return this.optimizerStep;
  }

  /** The parameter's current value (valid until the next step; never write to it). */
  param(name: string): DeviceTensor {
    const b = this.parts.sets[this.current].get(name);
    if (!b) throw new Error(`Trainer: no parameter '${name}'`);
    return b.p;
  }

  /** Every parameter's current value by name. */
  params(): Map<string, DeviceTensor> {
    return new Map(this.parts.names.map((n) => [n, this.parts.sets[this.current].get(n)!.p]));
  }

  /** The graph whose inputs a batch must supply (the step graph, or the accumulate graph). */
  get batchGraph(): Graph {
    return this.parts.stepBindings ? this.graphs.step : this.graphs.accumulate;
  }

  /**
   * One optimizer step at learning rate `lr` over `batches` (one per micro-batch; exactly
   * `microBatches` of them). Each batch holds the loss builder's inputs.
   */
  trainStep(batches: Record<string, BatchTensor>[], lr: number): TrainStepResult {
    if (this.disposed) throw new Error('Trainer: disposed');
    if (batches.length !== this.microBatches) throw new Error(`trainStep: ${batches.length} micro-batches given, the trainer was built for ${this.microBatches}`);
    if (this.parts.onGradients) throw new Error('trainStep: this trainer has an onGradients hook, which is asynchronous: call trainStepAsync');
    if (this.parts.inGraph) throw new Error('trainStep: this trainer reduces gradients in the run (inGraphGradients), which completes asynchronously: call trainStepAsync');
    if (this.parts.zero) throw new Error('trainStep: a ZeRO-1 trainer runs collectives, which are asynchronous: call trainStepAsync');
    const { bc1, bc2 } = biasCorrections(this.optimizerStep + 1);
    const k = this.current;
    let hostMs = 0;
    let runMs = 0;
    const metrics: Record<string, number> = Object.fromEntries(this.graphs.metrics.map((m) => [m, 0]));
    let loss = 0;
    let gradNorm: number;
    if (this.parts.stepBindings && this.parts.fixed) {
      const t0 = performance.now();
      this.stageBatch(batches[0], { lr, bc1, bc2 });
      const t1 = performance.now();
      try {
        this.parts.stepBindings[k].runSync();
      } catch (e) {
        throw this.parts.fixed.graphs ? captureError(e as Error, batches[0]) : e;
      }
      const read = this.readOutputs();
      loss = read.scalar('read/loss');
      gradNorm = read.scalar('read/grad_norm');
      for (const m of this.graphs.metrics) metrics[m] = read.scalar(`read/${m}`);
      runMs += performance.now() - t1;
      hostMs += t1 - t0;
    } else if (this.parts.stepBindings) {
      const b = this.parts.stepBindings[k];
      const t0 = performance.now();
      bindBatch(b, batches[0], this.batchInputs);
      b.input('lr', f32(lr)).input('bc1', f32(bc1)).input('bc2', f32(bc2));
      const t1 = performance.now();
      b.runSync();
      loss = b.scalar('loss');
      gradNorm = b.scalar('grad_norm');
      for (const m of this.graphs.metrics) metrics[m] = b.scalar(m);
      runMs += performance.now() - t1;
      hostMs += t1 - t0;
    } else {
      const acc = this.accumulateRuns(batches, k);
      const applied = this.applyRun(k, acc.j, lr);
      return this.adopt(k, { loss: acc.sums[0], gradNorm: applied.gradNorm, metrics: this.metricsOf(acc.sums), hostMs: acc.hostMs + applied.hostMs, runMs: acc.runMs + applied.runMs });
    }
    return this.adopt(k, { loss, gradNorm, metrics, hostMs, runMs });
  }

  /**
   * `trainStep` for a trainer with an `onGradients` hook: the accumulate runs, the hook (a
   * data-parallel all-reduce), then the apply run. Without a hook it is `trainStep`.
   */
  async trainStepAsync(batches: Record<string, BatchTensor>[], lr: number): Promise<TrainStepResult> {
    if (this.parts.zero) return this.zeroStep(batches, lr);
    if (this.parts.inGraph) return this.inGraphStep(batches, lr);
    const hook = this.parts.onGradients;
    if (!hook) return this.trainStep(batches, lr);
    if (this.disposed) throw new Error('Trainer: disposed');
    if (batches.length !== this.microBatches) throw new Error(`trainStep: ${batches.length} micro-batches given, the trainer was built for ${this.microBatches}`);
    const k = this.current;
    const acc = this.accumulateRuns(batches, k);
    const t0 = performance.now();
    const cast = this.parts.reduceCast;
    if (cast) {
      // bfloat16 copies go over the wire; the sum comes back into the float32 buffer the update reads
      cast.down[acc.j].runSync();
      await hook(cast.low, acc.sums);
      cast.up[acc.j].runSync();
    } else await hook(this.parts.grads![acc.j], acc.sums);
    const hookMs = performance.now() - t0;
    const applied = this.applyRun(k, acc.j, lr);
    return this.adopt(k, { loss: acc.sums[0], gradNorm: applied.gradNorm, metrics: this.metricsOf(acc.sums), hostMs: acc.hostMs + applied.hostMs, runMs: acc.runMs + applied.runMs + hookMs, reduceMs: hookMs });
  }

  /**
   * A step whose gradients are reduced inside the accumulate run: the run, the hook's `finish`, the
   * apply run; with `inGraphUpdate`, the one run that also updates, then `finish`.
   */
  private async inGraphStep(batches: Record<string, BatchTensor>[], lr: number): Promise<TrainStepResult> {
    if (this.disposed) throw new Error('Trainer: disposed');
    if (batches.length !== this.microBatches) throw new Error(`trainStep: ${batches.length} micro-batches given, the trainer was built for ${this.microBatches}`);
    if (this.parts.stepBindings) return this.reducedStep(batches[0], lr);
    const k = this.current;
    const acc = this.accumulateRuns(batches, k);
    const t0 = performance.now();
    await this.parts.inGraph!.hook.finish(acc.sums);
    // bfloat16: the reduced copies widened into the float32 buffer the update reads
    if (this.parts.inGraph!.low) this.parts.reduceCast!.up[acc.j].runSync();
    const hookMs = performance.now() - t0;
    const applied = this.applyRun(k, acc.j, lr);
    return this.adopt(k, { loss: acc.sums[0], gradNorm: applied.gradNorm, metrics: this.metricsOf(acc.sums), hostMs: acc.hostMs + applied.hostMs, runMs: acc.runMs + applied.runMs + hookMs, reduceMs: hookMs });
  }

  /**
   * `inGraphUpdate`'s step: one run (forward, backward, the all-reduce's nodes, their join, the
   * update into the other buffer set), then the hook's `finish` (the collectives complete, the loss
   * and metrics summed over the ranks), then `adopt`, which keeps the old set if the summed loss is
   * not finite. An error the hook rethrows leaves the parameters as they were, the same way.
   */
  private async reducedStep(batch: Record<string, BatchTensor>, lr: number): Promise<TrainStepResult> {
    const { bc1, bc2 } = biasCorrections(this.optimizerStep + 1);
    const k = this.current;
    const b = this.parts.stepBindings![k];
    const t0 = performance.now();
    bindBatch(b, batch, this.batchInputs);
    b.input('lr', f32(lr)).input('bc1', f32(bc1)).input('bc2', f32(bc2));
    const t1 = performance.now();
    b.runSync();
    const sums = Float64Array.from([b.scalar('loss'), ...this.graphs.metrics.map((m) => b.scalar(m))]);
    const gradNorm = b.scalar('grad_norm');
    const t2 = performance.now();
    await this.parts.inGraph!.hook.finish(sums);
    const t3 = performance.now();
    return this.adopt(k, { loss: sums[0], gradNorm, metrics: this.metricsOf(sums), hostMs: t1 - t0, runMs: t3 - t1, reduceMs: t3 - t2 });
  }

  /**
   * A ZeRO-1 step: accumulate, reduce-scatter the gradients into this rank's shards, sum the loss,
   * metrics and squared gradient norm over the ranks, update the shards (skipped, as `adopt` skips,
   * when the summed loss is not finite) and all-gather them into the parameters.
   */
  private async zeroStep(batches: Record<string, BatchTensor>[], lr: number): Promise<TrainStepResult> {
    if (this.disposed) throw new Error('Trainer: disposed');
    if (batches.length !== this.microBatches) throw new Error(`trainStep: ${batches.length} micro-batches given, the trainer was built for ${this.microBatches}`);
    const z = this.parts.zero!;
    const sums = new Float64Array(1 + this.graphs.metrics.length + 1);
    let hostMs = 0;
    let runMs = 0;
    let a = 0;
    for (const [i, batch] of batches.entries()) {
      const t0 = performance.now();
      bindBatch(z.gradients, batch, this.batchInputs);
      const t1 = performance.now();
      z.inGraph?.hook.target(i === 0 ? 0 : 1);
      z.gradients.runSync();
      sums[0] += z.gradients.scalar('loss');
      this.graphs.metrics.forEach((m, k) => (sums[k + 1] += z.gradients.scalar(m)));
      // the first micro-batch's shards land in the sum's buffer; later ones are added to it
      const into = i === 0 ? z.gradShards[0] : z.received!;
      if (z.inGraph) {
        await z.inGraph.hook.finish();
        z.low?.up[i === 0 ? 0 : 1].runSync();
      } else if (z.low) {
        z.low.down.runSync();
        await reduceScatterAll(z.collectives, z.layout.map((s) => [z.low!.send.get(s.name)!, z.low!.recv.get(s.name)!] as const));
        z.low.up[i === 0 ? 0 : 1].runSync();
      } else {
        z.pad?.runSync();
        await reduceScatterAll(z.collectives, z.layout.map((s) => [s.padded ? z.padded.get(s.name)! : z.grads.get(s.name)!, into.get(s.name)!] as const));
      }
      if (i > 0) {
        z.add![a].runSync();
        a = 1 - a;
      }
      hostMs += t1 - t0;
      runMs += performance.now() - t1;
    }
    const t2 = performance.now();
    z.norm[a].runSync();
    sums[sums.length - 1] = z.norm[a].scalar('sumsq');
    await z.collectives.allReduceHost(sums, 'sum');
    const gradNorm = Math.sqrt(sums[sums.length - 1]);
    const result = { loss: sums[0], gradNorm, metrics: this.metricsOf(sums), hostMs, runMs };
    // a non-finite loss (the same on every rank: it is summed) leaves the weights as they were, as `adopt` does
    if (!Number.isFinite(result.loss)) return result;
    // torch's clip_grad_norm_: coefficient max_norm / (norm + 1e-6), applied only when below 1
    const coef = z.maxGradNorm > 0 ? Math.min(z.maxGradNorm / (gradNorm + 1e-6), 1) : 1;
    const { bc1, bc2 } = biasCorrections(this.optimizerStep + 1);
    const u = z.update[z.current][a];
    u.input('lr', f32(lr)).input('bc1', f32(bc1)).input('bc2', f32(bc2)).input('grad_scale', f32(coef));
    u.runSync();
    this.parts.fused?.check();
    z.current = 1 - z.current;
    const params = this.parts.sets[0];
    await allGatherAll(z.collectives, z.layout.map((s) => [z.shards[z.current].get(s.name)!.p, s.padded ? z.padded.get(s.name)! : params.get(s.name)!.p] as const));
    z.unpad?.runSync();
    result.runMs += performance.now() - t2;
    this.optimizerStep++;
    return result;
  }

  /** The step's metrics from the `[loss, ...metrics]` sums. */
  private metricsOf(sums: Float64Array): Record<string, number> {
    return Object.fromEntries(this.graphs.metrics.map((m, i) => [m, sums[i + 1]]));
  }

  /** Runs each micro-batch's accumulate run; `j` is the gradient buffer holding the sums. */
  private accumulateRuns(batches: Record<string, BatchTensor>[], k: number): { j: number; sums: Float64Array; hostMs: number; runMs: number } {
    const sums = new Float64Array(1 + this.graphs.metrics.length);
    let hostMs = 0;
    let runMs = 0;
    let j = 0;
    for (const [n, batch] of batches.entries()) {
      const last = this.parts.lastAccumulate && n === batches.length - 1;
      const b = (last ? this.parts.lastAccumulate! : this.parts.accumulateBindings!)[k][j];
      const t0 = performance.now();
      bindBatch(b, batch, this.batchInputs);
      const t1 = performance.now();
      b.runSync();
      sums[0] += b.scalar('loss');
      this.graphs.metrics.forEach((m, i) => (sums[i + 1] += b.scalar(m)));
      runMs += performance.now() - t1;
      hostMs += t1 - t0;
      j = 1 - j;
    }
    return { j, sums, hostMs, runMs };
  }

  /** The AdamW run on the gradients in buffer `j`, then zeros into buffer 0 for the next step. */
  private applyRun(k: number, j: number, lr: number): { gradNorm: number; hostMs: number; runMs: number } {
    const { bc1, bc2 } = biasCorrections(this.optimizerStep + 1);
    const a = this.parts.applyBindings![k][j];
    const t0 = performance.now();
    a.input('lr', f32(lr)).input('bc1', f32(bc1)).input('bc2', f32(bc2));
    const t1 = performance.now();
    a.runSync();
    const gradNorm = a.scalar('grad_norm');
    // every step's first micro-batch reads buffer 0: it must hold zeros again (several micro-batches)
    this.parts.zeroGradients?.runSync();
    return { gradNorm, hostMs: t1 - t0, runMs: performance.now() - t1 };
  }

  /** Adopts the new state unless the loss is not finite (then the trainer stays at the last good parameters). */
  private adopt(k: number, result: TrainStepResult): TrainStepResult {
    this.parts.fused?.check();
    if (!Number.isFinite(result.loss)) return result;
    this.current = 1 - k;
    this.optimizerStep++;
    return result;
  }

  /**
   * Copies a batch and the step's scalars into the fixed buffers, in one run of a copy session
   * (buffers and session made on first use), since each separate device copy or fill is a session
   * run of its own with its fixed host cost.
   */
  private stageBatch(batch: Record<string, BatchTensor>, scalars: { lr: number; bc1: number; bc2: number }): void {
    const f = this.parts.fixed!;
    checkBatch(batch, this.batchInputs);
    for (const name of this.batchInputs) {
      const t = batch[name];
      const buf = f.batch.get(name);
      if (buf && (buf.dims.length !== t.dims.length || buf.dims.some((d, i) => d !== t.dims[i]))) {
        throw new Error(`trainStep: '${name}' is [${t.dims.join(', ')}], but a trainer with fixed input buffers (cudaGraph) was first given [${buf.dims.join(', ')}]`);
      }
    }
    if (!f.stage) {
      const g = new L.Graph('train_stage_batch');
      const names = [...this.batchInputs, 'lr', 'bc1', 'bc2'];
      for (const name of names) {
        const dtype = f.dtypes.get(name) ?? 'float32';
        const dims = name in f.scalars ? [] : batch[name].dims;
        g.output(L.applyOp(L.identityOp, [g.input(name, dtype, dims)], {})[0], `staged/${name}`);
      }
      const session = this.device.compile(g, f.sessionOptions);
      this.own(session);
      const binding = session.binding();
      for (const name of this.batchInputs) {
        const buf = this.device.empty(f.dtypes.get(name)!, batch[name].dims);
        f.batch.set(name, buf);
        for (const b of this.parts.stepBindings!) b.input(name, buf);
        binding.output(`staged/${name}`, buf);
      }
      for (const [n, t] of Object.entries(f.scalars)) binding.output(`staged/${n}`, t);
      f.stage = binding;
    }
    for (const name of this.batchInputs) f.stage.input(name, batch[name]);
    f.stage.input('lr', f32(scalars.lr)).input('bc1', f32(scalars.bc1)).input('bc2', f32(scalars.bc2));
    f.stage.runSync();
  }

  /** Copies the fixed scalar outputs to the host in one run (separate downloads are a run each). */
  private readOutputs(): Binding {
    const f = this.parts.fixed!;
    if (!f.read) {
      const g = new L.Graph('train_read_outputs');
      for (const name of Object.keys(f.outputs)) g.output(L.applyOp(L.identityOp, [g.input(name, 'float32', [])], {})[0], `read/${name}`);
      const session = this.device.compile(g, { ...f.sessionOptions, name: 'train-read-outputs' });
      this.own(session);
      const binding = session.binding();
      for (const [name, t] of Object.entries(f.outputs)) binding.input(name, t).output(`read/${name}`, 'host');
      f.read = binding;
    }
    f.read.runSync();
    return f.read;
  }

  /** Downloads parameters and moments (for checkpoints). A ZeRO-1 trainer's moments are sharded: use `snapshotAsync`. */
  snapshot(): OptimizerState & { step: number } {
    if (this.parts.zero) throw new Error('Trainer: a ZeRO-1 trainer keeps 1/N of the moments: call snapshotAsync on every rank');
    return { params: this.download((b) => b.p), m: this.download((b) => b.m), v: this.download((b) => b.v), step: this.optimizerStep };
  }

  /**
   * `snapshot()` on any trainer; with ZeRO-1 the moments are all-gathered from the ranks (every
   * rank must call it at the same point), so every rank gets the whole state, as one process's.
   */
  async snapshotAsync(): Promise<OptimizerState & { step: number }> {
    const z = this.parts.zero;
    if (!z) return this.snapshot();
    const m = new Map<string, Float32Array>();
    const v = new Map<string, Float32Array>();
    const shards = z.shards[z.current];
    for (const s of z.layout) {
      const out = this.device.empty('float32', [s.shard * z.collectives.worldSize]);
      try {
        for (const [key, into] of [['m', m], ['v', v]] as const) {
          await z.collectives.allGather(shards.get(s.name)![key], out);
          into.set(s.name, (out.download().data as Float32Array).slice(0, s.size));
        }
      } finally {
        out.dispose();
      }
    }
    return { params: this.downloadParams(), m, v, step: this.optimizerStep };
  }

  /** Bytes of AdamW moments this trainer keeps (both buffer sets; with ZeRO-1 its shards only). */
  get momentBytes(): number {
    const z = this.parts.zero;
    if (z) return [...z.shards[0].values(), ...z.shards[1].values()].reduce((n, b) => n + b.m.byteLength + b.v.byteLength, 0);
    let n = 0;
    for (const set of this.parts.sets) for (const b of set.values()) n += b.m.byteLength + b.v.byteLength;
    return n;
  }

  /** Downloads the current parameter values only (what an export or a merge needs; no moments). */
  downloadParams(): Map<string, Float32Array> {
    return this.download((b) => b.p);
  }

  private download(pick: (b: Buffers) => DeviceTensor): Map<string, Float32Array> {
    const set = this.parts.sets[this.current];
    return new Map(this.parts.names.map((n) => [n, pick(set.get(n)!).download().data as Float32Array]));
  }

  /** Bytes of device memory the trainer's state holds (both buffer sets and gradient sums). */
  get stateBytes(): number {
    let n = 0;
    const z = this.parts.zero;
    if (z) {
      for (const b of this.parts.sets[0].values()) n += b.p.byteLength;
      for (const set of z.shards) for (const b of set.values()) n += b.p.byteLength + b.m.byteLength + b.v.byteLength;
      for (const t of [...z.grads.values(), ...z.gradShards[0].values(), ...z.gradShards[1].values(), ...(z.received?.values() ?? []), ...z.padded.values(), ...(z.low?.send.values() ?? []), ...(z.low?.recv.values() ?? [])]) n += t.byteLength;
    } else for (const set of this.parts.sets) for (const b of set.values()) n += b.p.byteLength + b.m.byteLength + b.v.byteLength;
    for (const g of new Set(this.parts.grads)) for (const t of g.values()) n += t.byteLength;
    for (const t of this.parts.reduceCast?.low.values() ?? []) n += t.byteLength;
    return n;
  }

  /** Frees the sessions and every buffer. */
  dispose(): void {
    if (this.disposed) return;
    this.disposed = true;
    for (const s of this.sessions) s.dispose();
    for (const set of this.parts.sets) for (const b of set.values()) for (const t of [b.p, b.m, b.v]) t.dispose();
    for (const g of new Set(this.parts.grads)) for (const t of g.values()) t.dispose();
    for (const t of this.parts.reduceCast?.low.values() ?? []) t.dispose();
    if (this.parts.fixed) for (const t of [...Object.values(this.parts.fixed.scalars), ...Object.values(this.parts.fixed.outputs), ...this.parts.fixed.batch.values()]) t.dispose();
    if (this.parts.zero) disposeZero(this.parts.zero);
    this.parts.zero?.inGraph?.hook.dispose?.();
    this.parts.fused?.dispose();
    for (const t of this.parts.inGraph?.outputs ?? []) t.dispose();
    this.parts.inGraph?.hook.dispose?.();
  }
}

/**
 * Whether `Trainer.create` runs the fused update when `fusedAdamW` is not given. It is the default
 * where it runs — a CUDA device opened with Lathe's compute stream (`openDevice` in @lathe/recipes,
 * or `Kernels.withDevice`), without CUDA-graph capture — since it beat the composed update in a
 * same-call A/B (docs/benchmarks.md); LATHE_FUSED_ADAMW=0 turns the default off.
 */
export function fusedAdamWByDefault(device: Device, opts: Pick<TrainerOptions, 'staticInputs' | 'cudaGraph'> = {}): boolean {
  return device.kind === 'cuda' && device.computeStream !== undefined && !opts.staticInputs && !opts.cudaGraph && process.env.LATHE_FUSED_ADAMW !== '0';
}

/**
 * Refuses `fusedAdamW` where its node cannot run, saying what to do. Under CUDA graphs it runs: the
 * step's buffers never move, so its slot tables are uploaded in the runs before capture (ONNX
 * Runtime runs each graph id plainly first) and capture finds them cached (FusedAdamW.tableFor).
 */
function checkFusedAdamW(device: Device): void {
  if (device.kind === 'cuda' && device.computeStream === undefined) {
    throw new Error(`Trainer: fusedAdamW needs ${device.name} opened with Lathe's compute stream, so the kernels run in order with ONNX Runtime's: open it with Kernels.withDevice() from @lathe/kernels before anything else`);
  }
}

/** The fused update's node for these parameters, with the kernels of the device's stream on CUDA. */
function fusedUpdateNode(device: Device, spec: TrainStepSpec): FusedAdamWNode {
  const params = spec.params.map((p) => ({ name: p.name, size: p.shape.reduce((a, b) => a * b, 1), decay: p.decay }));
  const kernels = device.kind === 'cuda' ? Kernels.open({ deviceId: device.id, stream: device.computeStream }) : undefined;
  const node = fusedAdamWNode(device, params, spec.optimizer, kernels);
  return {
    ...node,
    dispose: () => {
      node.dispose();
      kernels?.dispose();
    },
  };
}

/** Device buffers that stay at one address for every step (what CUDA graph replay needs). */
interface StaticBuffers {
  scalars: { lr: DeviceTensor; bc1: DeviceTensor; bc2: DeviceTensor };
  outputs: Record<string, DeviceTensor>;
  batch: Map<string, DeviceTensor>;
  dtypes: Map<string, DType>;
  /** Whether the step bindings are captured as CUDA graphs (not just fixed buffers). */
  graphs: boolean;
  /** The copy session's options (the step's, without CUDA graphs or graph optimizations). */
  sessionOptions: SessionOptions;
  /** Copies a batch and the scalars into the buffers above in one run (made on the first step). */
  stage?: Binding;
  /** Copies the scalar outputs to the host in one run (made on the first step). */
  read?: Binding;
}

/** A long message's head and tail (ONNX Runtime's CUDA errors name the failing call and error last, after a long source path). */
function clip(m: string): string {
  return m.length <= 700 ? m : `${m.slice(0, 200)} … ${m.slice(-500)}`;
}

/**
 * A failed CUDA-graph capture, said plainly. ONNX Runtime reports it as CUDA error 901 ("operation
 * failed due to a previous error during capture") from cudaStreamEndCapture, naming no cause; the
 * message passes on the rule the failures fit, state + 2 × activations > GPU memory
 * (docs/benchmarks/2026-11-22-to-24-h100.md, "CUDA-graph replay, …").
 * @internal exported for tests
 */
export function captureError(e: Error, batch: Record<string, BatchTensor>): Error {
  if (!/during capture|cudaStreamEndCapture|cudaGraph/i.test(e.message)) return e;
  const shapes = Object.entries(batch)
    .filter(([, t]) => t.dims.length > 0)
    .map(([n, t]) => `${n} [${t.dims.join(', ')}]`)
    .join(', ');
  return new Error(
    `CUDA graph capture of the train step failed (${shapes}). Capture seems to need room for a second copy of the step's activations; ` +
      `run with a smaller batch, or without cudaGraph (lathe sft: without --cuda_graph). ONNX Runtime said: ${clip(e.message)}`,
  );
}

/** Binds parameters and moments of `from` as inputs and of `to` as the `next/…` outputs. */
function bindState(b: Binding, from: Map<string, Buffers>, to: Map<string, Buffers>, names: string[]): void {
  for (const n of names) {
    const s = from.get(n)!;
    const d = to.get(n)!;
    b.input(n, s.p).input(stateNames.m(n), s.m).input(stateNames.v(n), s.v);
    b.output(stateNames.next(n), d.p).output(stateNames.next(stateNames.m(n)), d.m).output(stateNames.next(stateNames.v(n)), d.v);
  }
}

function bindFrozen(b: Binding, frozen: Record<string, BatchTensor>): void {
  for (const [k, t] of Object.entries(frozen)) b.input(k, t);
}

function bindScalarOutputs(b: Binding, graphs: TrainStepGraphs): void {
  b.output('loss', 'host').output('grad_norm', 'host');
  for (const m of graphs.metrics) b.output(m, 'host');
}

/** Throws unless the batch holds exactly the loss's batch inputs, naming what is missing or extra. */
function checkBatch(batch: Record<string, BatchTensor>, expected: string[]): void {
  for (const name of expected) if (!batch[name]) throw new Error(`trainStep: the batch has no '${name}' (the loss reads: ${expected.join(', ')})`);
  for (const k of Object.keys(batch)) if (!expected.includes(k)) throw new Error(`trainStep: the batch has '${k}', which the loss does not read (it reads: ${expected.join(', ')})`);
}

function bindBatch(b: Binding, batch: Record<string, BatchTensor>, expected: string[]): void {
  checkBatch(batch, expected);
  for (const name of expected) b.input(name, batch[name]);
}

/** The shards' parameters as the update graph sees them: one flat [shard] tensor per parameter. */
function shardParams(layout: readonly ShardSlot[]): TrainStepSpec['params'] {
  return layout.map((s) => ({ name: s.name, shape: [s.shard], decay: s.decay }));
}

/**
 * ZeRO-1's buffers and runs: this rank's shards of the master weights and moments (from `init`,
 * the whole state as one process holds it), one micro-batch's full gradients and the forward and
 * backward that writes them, the gradient shards and their sum over micro-batches, the padding
 * copies, the norm and the update of the shards.
 */
function buildZero(
  collectives: ShardCollectives,
  spec: TrainStepSpec,
  init: TrainerInit,
  device: Device,
  params: Map<string, Buffers>,
  frozen: Record<string, BatchTensor>,
  microBatches: number,
  metrics: readonly string[],
  placeholder: DeviceTensor,
  session: SessionOptions,
  fused: FusedAdamWNode | undefined,
  lowReduce = false,
  inGraph?: InGraphShards,
): { parts: ZeroParts; sessions: Session[] } {
  const { rank, worldSize } = collectives;
  const layout = shardLayout(spec.params, worldSize);
  const names = layout.map((s) => s.name);
  const sessions: Session[] = [];
  const tensors: DeviceTensor[] = [];
  const keep = <T extends DeviceTensor>(t: T): T => (tensors.push(t), t);
  try {
    const host = (x: Float32Array | DeviceTensor | undefined) => (x === undefined || x instanceof Float32Array ? x : (x.download().data as Float32Array));
    const shards = [0, 1].map((a) =>
      new Map(
        layout.map((s) => {
          const b = { p: keep(device.empty('float32', [s.shard])), m: keep(device.empty('float32', [s.shard])), v: keep(device.empty('float32', [s.shard])) };
          if (a === 0) {
            b.p.upload(paramShard(host(init.params.get(s.name))!, s, rank));
            for (const key of ['m', 'v'] as const) {
              const full = init[key]?.get(s.name);
              if (full) b[key].upload(paramShard(full, s, rank));
              else b[key].fill(0);
            }
          }
          return [s.name, b] as const;
        }),
      ),
    ) as [Map<string, Buffers>, Map<string, Buffers>];
    const shardBuffers = () => new Map(layout.map((s) => [s.name, keep(device.zeros('float32', [s.shard]))]));
    const gradShards: [Map<string, DeviceTensor>, Map<string, DeviceTensor>] = [shardBuffers(), microBatches > 1 ? shardBuffers() : new Map()];
    const received = microBatches > 1 ? shardBuffers() : undefined;
    const grads = new Map(layout.map((s) => [s.name, keep(device.empty('float32', s.shape))]));
    const padded = new Map(layout.filter((s) => s.padded).map((s) => [s.name, keep(device.zeros('float32', [s.shard * worldSize]))]));
    const plain = { ...session, cudaGraph: false, optimization: 'disabled' as const };
    const compile = (g: L.Graph, name: string, opts: SessionOptions = plain) => {
      const x = device.compile(g, { ...opts, name });
      sessions.push(x);
      return x;
    };
    const gradientsGraph = compileGradients(spec);
    const nodes = inGraph ? addInGraphShardNodes(inGraph, gradientsGraph, layout, worldSize, lowReduce) : undefined;
    const inGraphOutputs = (nodes?.outputs ?? []).map((t) => keep(device.empty(t.dtype, t.shape.map(Number))));
    const gradients = compile(gradientsGraph, 'zero-gradients', { ...session, cudaGraph: false, ...(inGraph ? { customOpDomains: [...(session.customOpDomains ?? []), ...inGraph.customOpDomains] } : {}) }).binding();
    for (const n of names) gradients.input(n, params.get(n)!.p).output(stateNames.grad(n), grads.get(n)!);
    bindFrozen(gradients, frozen);
    gradients.output('loss', 'host');
    for (const m of metrics) gradients.output(m, 'host');
    if (nodes) inGraphOutputs.forEach((t, i) => gradients.output(inGraphOutput(i), t));
    let pad: Binding | undefined;
    let unpad: Binding | undefined;
    const paddedSlots = layout.filter((s) => s.padded);
    if (paddedSlots.length) {
      // gradient → [worldSize × shard] with zeros past its end; gathered values → the parameter
      const g = new L.Graph('zero_pad');
      const u = new L.Graph('zero_unpad');
      for (const s of paddedSlots) {
        const flat = L.reshape(g.input(s.name, 'float32', s.shape), [s.size]);
        g.output(L.concat([flat, L.expand(g.constant(0, 'float32', []), [s.shard * worldSize - s.size])], 0), `padded/${s.name}`);
        const gathered = u.input(s.name, 'float32', [s.shard * worldSize]);
        u.output(L.reshape(L.slice(gathered, [0], [0], [s.size]), s.shape), `unpadded/${s.name}`);
      }
      pad = compile(g, 'zero-pad').binding();
      for (const s of paddedSlots) pad.input(s.name, grads.get(s.name)!).output(`padded/${s.name}`, padded.get(s.name)!);
      unpad = compile(u, 'zero-unpad').binding();
      for (const s of paddedSlots) unpad.input(s.name, padded.get(s.name)!).output(`unpadded/${s.name}`, params.get(s.name)!.p);
    }
    let add: Binding[] | undefined;
    if (received) {
      const g = new L.Graph('zero_add_shards');
      for (const s of layout) g.output(L.add(g.input(`acc/${s.name}`, 'float32', [s.shard]), g.input(`new/${s.name}`, 'float32', [s.shard])), `sum/${s.name}`);
      const x = compile(g, 'zero-add-shards');
      add = [0, 1].map((a) => {
        const b = x.binding();
        for (const n of names) b.input(`acc/${n}`, gradShards[a].get(n)!).input(`new/${n}`, received.get(n)!).output(`sum/${n}`, gradShards[1 - a].get(n)!);
        return b;
      });
    }
    const ng = new L.Graph('zero_grad_sumsq');
    const squares = layout.map((s) => L.reduceSumSquare(ng.input(s.name, 'float32', [s.shard])));
    ng.output(squares.reduce((a, b) => L.add(a, b)), 'sumsq');
    const normSession = compile(ng, 'zero-grad-sumsq');
    const sets = received ? [0, 1] : [0];
    const norm = sets.map((a) => {
      const b = normSession.binding();
      for (const n of names) b.input(n, gradShards[a].get(n)!);
      return b.output('sumsq', 'host');
    });
    // clipping is the host's coefficient fed as grad_scale (the shards' own norm is not the global one)
    const apply = compile(compileApply(shardParams(layout), { ...spec.optimizer, maxGradNorm: 0 }, fused?.update), 'zero-apply', session);
    const update = [0, 1].map((s) =>
      sets.map((a) => {
        const b = apply.binding();
        bindState(b, shards[s], shards[1 - s], names);
        for (const n of names) b.input(stateNames.grad(n), gradShards[a].get(n)!);
        return b.output('grad_norm', 'host');
      }),
    );
    let low: ZeroParts['low'];
    if (lowReduce) {
      // pad and cast in one run (the padded float32 copy is then never made), widen in another
      const send = new Map(layout.map((s) => [s.name, keep(device.zeros('bfloat16', [s.shard * worldSize]))]));
      const recv = new Map(layout.map((s) => [s.name, keep(device.zeros('bfloat16', [s.shard]))]));
      const down = compile(gradCastGraph('zero_grad_to_bf16', layout.map((s) => ({ name: s.name, shape: s.shape, padTo: s.shard * worldSize })), 'bfloat16'), 'zero-grad-to-bf16').binding();
      for (const n of names) down.input(`in/${n}`, grads.get(n)!).output(`out/${n}`, send.get(n)!);
      const widen = compile(gradCastGraph('zero_shard_from_bf16', layout.map((s) => ({ name: s.name, shape: [s.shard] })), 'float32'), 'zero-shard-from-bf16');
      const up = [gradShards[0], ...(received ? [received] : [])].map((into) => {
        const b = widen.binding();
        for (const n of names) b.input(`in/${n}`, recv.get(n)!).output(`out/${n}`, into.get(n)!);
        return b;
      });
      low = { send, recv, down, up };
    }
    if (inGraph && low) {
      // bfloat16: the run pads and casts into the buffers sent; the sums land in recv, widened after the run
      for (const s of layout) gradients.output(inGraphPadded(s.name), low.send.get(s.name)!);
      inGraph.attach(low.send, [low.recv, low.recv]);
    } else if (inGraph) {
      // the reduce-scatters read the bound gradients (padded ones in their padded buffer) and write the first micro-batch's shards, or a later one's
      for (const s of layout) if (s.padded) gradients.output(inGraphPadded(s.name), padded.get(s.name)!);
      inGraph.attach(new Map(layout.map((s) => [s.name, s.padded ? padded.get(s.name)! : grads.get(s.name)!])), [gradShards[0], received ?? gradShards[0]]);
    }
    return { parts: { collectives, layout, shards, current: 0, grads, gradients, gradShards, received, add, padded, pad, unpad, norm, update, maxGradNorm: spec.optimizer?.maxGradNorm ?? 0, placeholder, low, inGraph: inGraph ? { hook: inGraph, outputs: inGraphOutputs } : undefined }, sessions };
  } catch (e) {
    for (const x of sessions) x.dispose();
    for (const t of tensors) t.dispose();
    throw e;
  }
}

function disposeZero(z: ZeroParts): void {
  for (const set of z.shards) for (const b of set.values()) for (const t of [b.p, b.m, b.v]) t.dispose();
  for (const t of [...z.grads.values(), ...z.gradShards[0].values(), ...z.gradShards[1].values(), ...(z.received?.values() ?? []), ...z.padded.values(), ...(z.low?.send.values() ?? []), ...(z.low?.recv.values() ?? []), ...(z.inGraph?.outputs ?? []), z.placeholder]) t.dispose();
}

/** The session that writes zeros to every gradient buffer (bound to `zero/<p>`) in one run, unoptimized, or ORT would fold the zeros into weight-sized initializers. */
function zeroGradientsSession(device: Device, params: readonly TrainableParam[], session: SessionOptions | undefined): Session {
  const g = new L.Graph('train_zero_gradients');
  for (const p of params) g.output(L.expand(g.constant(0, 'float32', []), p.shape), `zero/${p.name}`);
  return device.compile(g, { ...session, cudaGraph: false, optimization: 'disabled', name: 'train-zero-gradients' });
}
