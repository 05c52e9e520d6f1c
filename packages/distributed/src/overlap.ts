/**
 * The gradient all-reduce inside the backward's run: one custom-op node (`GradAllReduce`) per
 * bucket, placed in the accumulate graph after the nodes that produce the bucket's gradients, whose
 * compute starts the bucket's in-place sum over the ranks while ONNX Runtime goes on with the rest
 * of the backward. On CUDA the compute enqueues the all-reduce on NCCL's stream behind an event of
 * the compute stream and returns at once (overlap-nccl.ts); on the CPU it sums synchronously
 * (overlap-threads.ts, ranks as worker threads). Pass `gradientAllReduceInGraph(...)` as
 * `Trainer.create`'s `inGraphGradients`.
 *
 * Why the nodes run early: ONNX Runtime's default execution order is a depth-first walk back from
 * the graph's leaves, the leaf of the highest node index first, placing each node once its
 * ancestors are placed. Each bucket's node is a leaf (its one-element output is a graph output
 * nobody reads); buckets are cut in the order the backward completes the gradients (last
 * parameters first) and created last bucket first, so bucket 0's node has the highest index and
 * bucket k's node runs right after its gradients, before the backward of the layers below.
 * test/overlap.test.ts checks the order in an ORT profile (and fails with the creation reversed).
 *
 * With the update in the same run (`Trainer`'s `inGraphUpdate`, `InGraphGradientHook.buildReduced`)
 * the bucket nodes sum in place as well, and a join node (`GradAllReduceJoin`) takes their
 * placeholders: its compute makes the compute stream wait for the collective stream, and its
 * output, a boolean scalar, is an input of every reader of the gradients (the update), which read
 * the bound buffers the sums were written into. The gradients' one other reader is the bucket node,
 * so no extra gradient-sized tensor exists in the run. ORT's walk back from the update meets the
 * join (the highest index among the update's producers) and places bucket 0's node, then bucket
 * 1's, …, each after its gradients: the same order as the leaves give.
 */
import { dtypeBytes, type DType, type Graph, type Tensor } from '@lathe/onnx';
import { CApi, type Device, type DeviceTensor } from '@lathe/runtime';
import { CudaDriver, CustomOpDomain } from '@lathe/kernels';
import { buckets, DEFAULT_BUCKET_BYTES } from './data-parallel';

/** One gradient buffer of a bucket, as the node's compute sees it. */
export interface InRunBuffer {
  /** Address of the first element (device memory on CUDA). */
  data: bigint;
  dtype: DType;
  /** Elements. */
  size: number;
}

/** A reduce-scatter's input and the address of this rank's chunk of the sum. */
export interface InRunShardPair {
  input: InRunBuffer;
  output: bigint;
}

/**
 * Sums buffers over the ranks from inside a session run. Every rank calls `reduceInRun` for the same
 * buckets in the same order (the ranks' graphs are the same).
 */
export interface InRunReducer {
  readonly rank: number;
  readonly worldSize: number;
  /** 'nccl' or 'threads'. */
  readonly backend: string;
  /**
   * Sums the bucket's buffers over the ranks in place. Called from a node's compute, inside the run:
   * on CUDA it enqueues the sum after the work already on `stream` (the compute stream) and returns
   * at once; on the CPU it returns with the sums done. An error it throws is kept by the node (ORT
   * cannot take an exception) and rethrown by the hook's `finish` after the run.
   */
  reduceInRun(bucket: readonly InRunBuffer[], stream: bigint | undefined): void;
  /**
   * Called from the join node's compute, inside the run, after every bucket's node: orders the work
   * `stream` (the compute stream) takes after this call behind every sum enqueued in the run so far
   * (on CUDA a wait on an event recorded on the collective stream; on the CPU the sums are done
   * already). After a kept error it does nothing: the run's results are dropped at `drain`.
   */
  joinInRun(stream: bigint | undefined): void;
  /**
   * As `reduceInRun`, a reduce-scatter of each pair: `input` (worldSize × shard elements) summed over
   * the ranks, this rank's chunk written to `output` (shard elements, same dtype).
   */
  reduceScatterInRun(pairs: readonly InRunShardPair[], stream: bigint | undefined): void;
  /**
   * After the run: resolves when every sum enqueued in it is complete (rejects with a kept error).
   * `computeStream`: the stream the run computed on (CUDA), for a reducer that times its buckets.
   */
  drain(computeStream?: bigint): Promise<void>;
  /** Sums a few host values over the ranks in place (the step's loss and metrics). */
  allReduceHost(values: Float64Array, op?: 'sum' | 'avg'): Promise<void>;
}

/**
 * The in-run reducer of a world of one, on any device: nothing to sum, so the bucket nodes run (their
 * host cost and place in the run) without collectives, the A/B that tells the nodes' own cost from
 * the collectives' in a device run. Reduce-scatters (ZeRO) need ranks and are refused.
 */
export function soloInRunReducer(): InRunReducer {
  return {
    rank: 0,
    worldSize: 1,
    backend: 'none',
    reduceInRun: () => undefined,
    joinInRun: () => undefined,
    reduceScatterInRun: () => {
      throw new Error('soloInRunReducer: a reduce-scatter (ZeRO) needs ranks to scatter to');
    },
    drain: () => Promise.resolve(),
    allReduceHost: () => Promise.resolve(),
  };
}

/** Device times of one bucket's collectives in a run, in ms from the first bucket's `ready`. */
export interface InRunBucketTiming {
  /** The compute stream reached the bucket's node: its gradients are written. */
  ready: number;
  /** The collective stream started the bucket's sums (after its ready and the earlier buckets'). */
  start: number;
  /** The collective stream finished them. */
  done: number;
}

/** A run's bucket times, in the order the nodes ran. */
export interface InRunTimings {
  buckets: InRunBucketTiming[];
  /** When the run had returned to the host (an event on the compute stream at `drain`): the backward ended before. */
  runReturned?: number;
  /** When the step began on the device (`NcclInRunReducer.markStepStart`; negative: before the first bucket), if marked. */
  stepStarted?: number;
  /** Host milliseconds the run's bucket nodes spent enqueuing (events, waits and NCCL calls): time the host did not spend launching the backward. */
  enqueueHostMs?: number;
}

/** What a run's bucket times say about the overlap (ms). */
export interface OverlapSummary {
  /** From the first bucket's ready to the last's: the backward the sums can hide under. */
  backwardMs: number;
  /** The collective stream busy with the sums (Σ done − start). */
  collectiveMs: number;
  /** Of `collectiveMs`, the part before the last bucket's ready (hidden under the backward when the GPU runs both). */
  hiddenMs: number;
  /** From the last bucket's ready to the last sum's done: what the step waits for after the backward. */
  tailMs: number;
  /** Mean delay from a bucket's ready to its start: queueing behind earlier buckets' sums. */
  meanQueueMs: number;
}

/**
 * Reads a run's bucket times: sums that start at their bucket's ready and end before the last
 * bucket's are hidden; sums that start only after the backward (serialized) show as a `tailMs`
 * near `collectiveMs` and a `hiddenMs` near 0.
 */
export function overlapSummary(t: InRunTimings): OverlapSummary {
  const b = t.buckets;
  if (b.length === 0) return { backwardMs: 0, collectiveMs: 0, hiddenMs: 0, tailMs: 0, meanQueueMs: 0 };
  const lastReady = Math.max(...b.map((x) => x.ready));
  const round = (x: number) => +x.toFixed(3);
  return {
    backwardMs: round(lastReady - Math.min(...b.map((x) => x.ready))),
    collectiveMs: round(b.reduce((s, x) => s + (x.done - x.start), 0)),
    hiddenMs: round(b.reduce((s, x) => s + Math.max(0, Math.min(x.done, lastReady) - x.start), 0)),
    tailMs: round(Math.max(0, Math.max(...b.map((x) => x.done)) - lastReady)),
    meanQueueMs: round(b.reduce((s, x) => s + Math.max(0, x.start - x.ready), 0) / b.length),
  };
}

/** What `Trainer`'s `inGraphGradients` option receives (structurally: @lathe/train imports nothing from here). */
export interface InGraphGradientHook {
  /** The custom-op domains the nodes use (added to the accumulate session's options). */
  readonly customOpDomains: bigint[];
  /**
   * Adds the nodes to graph `g` after `grads` — the gradients the run writes into the bound buffers
   * (`next/grad/<p>`), in the order the backward completes them (last parameters first) — and
   * returns the tensors to make graph outputs (so the nodes are kept).
   */
  build(g: Graph, grads: readonly { name: string; grad: Tensor }[]): Tensor[];
  /**
   * `build`'s form for the update in the same run (`Trainer`'s `inGraphUpdate`): the bucket nodes
   * sum `grads` in place (bound outputs, as for `build`), and a join node after them all outputs
   * `joined`, a boolean scalar (its value means nothing) that every reader of the gradients must
   * take as an input, since on CUDA the sums are still in flight on the collective stream until the
   * join. `reduced` is `grads`' tensors, in order: what the update reads. Call either this or
   * `build`, once.
   */
  buildReduced(g: Graph, grads: readonly { name: string; grad: Tensor }[]): { reduced: Tensor[]; joined: Tensor };
  /** Tells the hook the buffers the run writes the gradients into (bound outputs), once, before any run. */
  attach(buffers: ReadonlyMap<string, DeviceTensor>): void;
  /** After the run, before the update: waits for the sums started in it and sums `sums` ([loss, ...metrics]) over the ranks. */
  finish(sums: Float64Array): Promise<void>;
  /** Frees the domain (after the sessions that use it). */
  dispose(): void;
}

/** Options of `gradientAllReduceInGraph`. */
export interface InGraphAllReduceOptions {
  /** Bytes of gradients per node (default {@link DEFAULT_BUCKET_BYTES}). */
  bucketBytes?: number;
  /** Called with each bucket's index when its node's compute runs (tests record the order). */
  onCompute?: (bucket: number) => void;
}

let domainCount = 0;

/** What the bucket nodes' computes call: the hook's collective for each bucket, and its join where the update runs in the same run. */
interface BucketCollective {
  /** Enqueues bucket `k`'s collective over its gradients (the bound buffers), on the compute stream's order. */
  enqueue(k: number, ins: InRunBuffer[]): void;
  /** Orders the compute stream after every collective enqueued (the join node's compute); absent: the hook has no `buildReduced`. */
  join?(): void;
}

/**
 * Writes `true` to the bool scalar at `token` inside a run: on CUDA a one-byte memset on `stream`
 * (after the join's wait), on the CPU through the host.
 */
function writeToken(token: bigint, stream: bigint | undefined): void {
  if (stream !== undefined) CudaDriver.get().memsetD8(token, 1, 1, stream);
  else CApi.get().copyIn(token, Uint8Array.of(1));
}

/**
 * The bucket nodes both hooks build: one op per bucket, its compute checking its inputs are the
 * bound buffers, its output a one-element placeholder; for the update in the run (`buildReduced`)
 * a join node (`collective.join` its compute) follows them all.
 */
function bucketNodes(what: string, device: Device, opts: InGraphAllReduceOptions, collective: BucketCollective) {
  if (device.kind === 'cuda' && device.computeStream === undefined) {
    throw new Error(`${what}: ${device.name} runs its sessions on a stream of ONNX Runtime's own, which the in-run collective cannot order NCCL behind: open it with Kernels.withDevice() from @lathe/kernels`);
  }
  if (device.kind !== 'cuda' && device.kind !== 'cpu') throw new Error(`${what}: ${device.kind} devices are not supported (cuda or cpu)`);
  const bucketBytes = opts.bucketBytes ?? DEFAULT_BUCKET_BYTES;
  const domain = new CustomOpDomain(`lathe.overlap${domainCount++}`);
  const state = {
    /** plan[k]: the names of bucket k's gradients, in input order. */
    plan: undefined as string[][] | undefined,
    /** expected[k]: the bound buffers' addresses of bucket k (attach). */
    expected: undefined as bigint[][] | undefined,
    /** Bucket nodes computed since the last `finish`. */
    computes: 0,
    /** Whether the graph has a join node (`buildReduced`), and the join computes since the last `finish`. */
    joined: false,
    joins: 0,
  };
  // one op per bucket, so each compute knows its bucket whatever order ORT runs them in
  const addOp = (k: number, dtypes: DType[]): string => {
    const name = `GradAllReduce_${k}`;
    domain.add({
      name,
      inputs: dtypes,
      outputs: ['float32'],
      provider: device.kind,
      infer: () => [{ dtype: 'float32', shape: [1] }],
      compute: (ctx) => {
        const ins = ctx.inputs;
        ctx.output(0, [1]);
        state.computes++;
        opts.onCompute?.(k);
        const want = state.expected?.[k];
        if (!want) throw new Error(`${what}: a node ran before the trainer attached its gradient buffers`);
        for (let i = 0; i < ins.length; i++) {
          // an ORT temporary copied into the bound buffer after the run would be read by NCCL while ORT reuses it
          if (ins[i].data !== want[i]) throw new Error(`GradAllReduce: bucket ${k}'s gradient '${state.plan![k][i]}' is not the bound output buffer (ONNX Runtime computed it elsewhere), so it cannot be reduced in place`);
        }
        collective.enqueue(k, ins.map((x) => ({ data: x.data, dtype: x.dtype, size: x.dims.reduce((a, b) => a * b, 1) })));
      },
    });
    return name;
  };
  const addJoin = (dtypes: DType[]): string => {
    const name = 'GradAllReduceJoin';
    domain.add({
      name,
      inputs: dtypes,
      outputs: ['bool'],
      provider: device.kind,
      infer: () => [{ dtype: 'bool', shape: [] }],
      compute: (ctx) => {
        const token = ctx.output(0, []);
        state.joins++;
        collective.join!();
        writeToken(token, device.computeStream);
      },
    });
    return name;
  };
  /** The buckets of `grads` (in order, at most bucketBytes each), checked and planned once. */
  const plan = (grads: readonly { name: string; grad: Tensor }[]) => {
    if (state.plan) throw new Error(`${what}: a hook serves one trainer (its nodes are built once)`);
    for (const x of grads) if (x.grad.dtype !== 'float32' && x.grad.dtype !== 'bfloat16') throw new Error(`${what}: gradient '${x.name}' is ${x.grad.dtype}; the in-run collectives take float32 or bfloat16 gradients`);
    const sized = grads.map((x) => ({ ...x, byteLength: x.grad.shape.reduce<number>((a, b) => a * Number(b), 1) * dtypeBytes(x.grad.dtype) }));
    const groups = buckets(sized, bucketBytes);
    state.plan = groups.map((b) => b.map((x) => x.name));
    return groups;
  };
  return {
    domain,
    state,
    build(g: Graph, grads: readonly { name: string; grad: Tensor }[]): Tensor[] {
      const groups = plan(grads);
      // ORT's walk starts from the leaf of the highest node index: bucket 0's node is created last
      const outs: Tensor[] = [];
      for (let k = groups.length - 1; k >= 0; k--) outs[k] = g.scope(`grad_all_reduce_${k}`, () => domain.node(addOp(k, groups[k].map((x) => x.grad.dtype)), groups[k].map((x) => x.grad))[0]);
      return outs;
    },
    /** The bucket nodes (in place) and their join: the gradients (in `grads` order) and the join's output. */
    buildReduced(g: Graph, grads: readonly { name: string; grad: Tensor }[]): { reduced: Tensor[]; joined: Tensor } {
      if (!collective.join) throw new Error(`${what}: this hook has no join (the update in the run)`);
      const groups = plan(grads);
      // the join reaches the buckets' nodes from the highest index down: bucket 0's node is created last, as for `build`
      const placeholders: Tensor[] = [];
      for (let k = groups.length - 1; k >= 0; k--) placeholders[k] = g.scope(`grad_all_reduce_${k}`, () => domain.node(addOp(k, groups[k].map((x) => x.grad.dtype)), groups[k].map((x) => x.grad))[0]);
      state.joined = true;
      const joined = g.scope('grad_all_reduce_join', () => domain.node(addJoin(placeholders.map((t) => t.dtype)), placeholders)[0]);
      return { reduced: grads.map((x) => x.grad), joined };
    },
    /** The addresses of each bucket's input buffers, by name. */
    attach(inputs: ReadonlyMap<string, DeviceTensor>): void {
      if (!state.plan) throw new Error(`${what}: attach before build`);
      state.expected = state.plan.map((names) =>
        names.map((n) => {
          const t = inputs.get(n);
          if (!t) throw new Error(`${what}: no gradient buffer for '${n}'`);
          return t.devicePointer();
        }),
      );
    },
    /** Rethrows a node's error, checks every bucket (and the join) computed, and waits for the collectives enqueued. */
    async complete(reducer: InRunReducer): Promise<void> {
      const started = state.computes;
      const joins = state.joins;
      state.computes = 0;
      state.joins = 0;
      try {
        domain.check();
      } catch (e) {
        // a rank that fails here would leave the others waiting in their next collective
        await reducer.drain().catch(() => undefined);
        throw e;
      }
      if (state.plan && started !== state.plan.length) throw new Error(`${what}: the run computed ${started} of ${state.plan.length} buckets' nodes`);
      if (state.joined && joins !== 1) throw new Error(`${what}: the run computed the join node ${joins} times, expected once`);
      await reducer.drain(device.computeStream);
    },
  };
}

/**
 * Data-parallel gradients summed over the ranks inside the accumulate run, bucket by bucket as the
 * backward completes them; the step's loss and metrics are summed after the run. On CUDA the
 * device must run its sessions on Lathe's compute stream (`Kernels.withDevice`), the stream the
 * nodes' computes order NCCL's stream behind. Gradients are summed, not averaged, as
 * `gradientAllReduce` sums them. `buildReduced` is the form whose sums the same run's update reads
 * (`Trainer`'s `inGraphUpdate`).
 */
export function gradientAllReduceInGraph(reducer: InRunReducer, device: Device, opts: InGraphAllReduceOptions = {}): InGraphGradientHook {
  const stream = device.computeStream;
  const nodes = bucketNodes('gradientAllReduceInGraph', device, opts, {
    enqueue: (_k, bucket) => reducer.reduceInRun(bucket, stream),
    join: () => reducer.joinInRun(stream),
  });
  return {
    customOpDomains: [nodes.domain.handle],
    build: (g, grads) => nodes.build(g, grads),
    buildReduced: (g, grads) => nodes.buildReduced(g, grads),
    attach: (buffers) => nodes.attach(buffers),
    async finish(sums) {
      await nodes.complete(reducer);
      if (reducer.worldSize > 1) await reducer.allReduceHost(sums, 'sum');
    },
    dispose: () => nodes.domain.dispose(),
  };
}

/** What `Trainer`'s ZeRO path takes as `inGraphShards` (structurally: @lathe/train imports nothing from here). */
export interface InGraphShardHook {
  /** The custom-op domains the nodes use. */
  readonly customOpDomains: bigint[];
  /** As `InGraphGradientHook.build`; each gradient holds worldSize × shard elements (padded where needed). */
  build(g: Graph, grads: readonly { name: string; grad: Tensor }[]): Tensor[];
  /** The bound buffers the run writes the gradients into, and the shard buffers each target receives into (by name). */
  attach(inputs: ReadonlyMap<string, DeviceTensor>, targets: readonly ReadonlyMap<string, DeviceTensor>[]): void;
  /** Which of the targets the next run's reduce-scatters write. */
  target(t: number): void;
  /** After the run: waits for its reduce-scatters. */
  finish(): Promise<void>;
  /** Frees the domain (after the sessions that use it). */
  dispose(): void;
}

/**
 * ZeRO's reduce-scatter inside the gradients run: each bucket's gradients, summed over the ranks,
 * land as this rank's shards in the current target's buffers, while the backward goes on.
 */
export function gradientReduceScatterInGraph(reducer: InRunReducer, device: Device, opts: InGraphAllReduceOptions = {}): InGraphShardHook {
  let targets: bigint[][][] | undefined;
  let current = 0;
  const nodes = bucketNodes('gradientReduceScatterInGraph', device, opts, {
    enqueue(k, bucket) {
      const out = targets![current][k];
      reducer.reduceScatterInRun(bucket.map((input, i) => ({ input, output: out[i] })), device.computeStream);
    },
  });
  return {
    customOpDomains: [nodes.domain.handle],
    build: (g, grads) => nodes.build(g, grads),
    attach(inputs, sets) {
      nodes.attach(inputs);
      targets = sets.map((set) =>
        nodes.state.plan!.map((names) =>
          names.map((n) => {
            const t = set.get(n);
            if (!t) throw new Error(`gradientReduceScatterInGraph: no shard buffer for '${n}'`);
            if (t.size * reducer.worldSize !== inputs.get(n)!.size) throw new Error(`gradientReduceScatterInGraph: '${n}': the shard ${t.describe()} is not 1/${reducer.worldSize} of ${inputs.get(n)!.describe()}`);
            return t.devicePointer();
          }),
        ),
      );
    },
    target(t) {
      if (!targets || t < 0 || t >= targets.length) throw new Error(`gradientReduceScatterInGraph: no target ${t}`);
      current = t;
    },
    finish: () => nodes.complete(reducer),
    dispose: () => nodes.domain.dispose(),
  };
}
