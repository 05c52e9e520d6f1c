/**
 * The trainer's side of a data-parallel gradient reduction inside the backward's run
 * (`TrainerOptions.inGraphGradients`, and ZeRO's `inGraphShards`): the hooks' interfaces, the nodes
 * added to the accumulate (or ZeRO gradients) graph after the gradients they read, the outputs that
 * keep them, and the options they refuse. The hooks themselves are @lathe/distributed's
 * `gradientAllReduceInGraph` / `gradientReduceScatterInGraph`; this package imports nothing from it.
 */
import * as L from '@lathe/onnx';
import type { Graph, Tensor } from '@lathe/onnx';
import type { Binding, Device, DeviceTensor } from '@lathe/runtime';
import { stateNames, widenedBfloat16, type BeforeUpdate } from './train-step';
import type { ShardSlot } from './zero';

/** The ZeRO form of `InGraphGradients`: nodes that reduce-scatter the gradients into this rank's shards (`TrainerOptions.inGraphShards`). */
export interface InGraphShards {
  /** Custom-op domains the nodes use. */
  readonly customOpDomains: bigint[];
  /** As `InGraphGradients.build`; each gradient holds worldSize × shard elements (padded in the run where needed). */
  build(g: Graph, grads: readonly { name: string; grad: Tensor }[]): Tensor[];
  /** The bound buffers the run writes the gradients into, and the shard buffers of each target (0: the first micro-batch's, 1: later ones'). */
  attach(inputs: ReadonlyMap<string, DeviceTensor>, targets: readonly ReadonlyMap<string, DeviceTensor>[]): void;
  /** Which target the next run's reduce-scatters write. */
  target(t: number): void;
  /** After a run: waits for its reduce-scatters. */
  finish(): Promise<void>;
  /** Frees what the nodes need (after the sessions that use them). */
  dispose?(): void;
}

/**
 * Nodes added to the accumulate graph after given gradients, and what runs after the run: how a
 * data-parallel gradient reduction runs inside the backward (`TrainerOptions.inGraphGradients`).
 */
export interface InGraphGradients {
  /** Custom-op domains the nodes use (added to the accumulate session's options). */
  readonly customOpDomains: bigint[];
  /**
   * Adds the nodes to `g` after `grads` — the gradients the run writes into the bound buffers, in
   * the order the backward completes them (last parameters first) — and returns tensors to make
   * graph outputs (so the nodes are kept; the trainer binds them to small device buffers).
   */
  build(g: Graph, grads: readonly { name: string; grad: Tensor }[]): Tensor[];
  /**
   * `build`'s form for `TrainerOptions.inGraphUpdate` (the update in the same run): the nodes sum
   * `grads` in place, a join after them all outputs `joined`, a boolean scalar every reader of the
   * gradients must take as an input (on CUDA the sums are in flight on another stream until the
   * join), and `reduced` is what the update reads (the gradients' tensors, in `grads` order). Optional: a hook without it cannot serve
   * inGraphUpdate. A hook builds once, by this or by `build`.
   */
  buildReduced?(g: Graph, grads: readonly { name: string; grad: Tensor }[]): { reduced: Tensor[]; joined: Tensor };
  /** The buffers (by parameter name) the run writes the gradients into: told once, before any run. */
  attach(buffers: ReadonlyMap<string, DeviceTensor>): void;
  /** After the run, before the update: completes the reduction and sums `[loss, ...metrics]` over the ranks in place. */
  finish(sums: Float64Array): Promise<void>;
  /** Frees what the nodes need (after the sessions that use them). */
  dispose?(): void;
}

/** The in-run all-reduce as a trainer holds it: the hook, the device buffers its nodes' outputs are bound to, and whether it reduces bfloat16 copies. */
export interface InGraphParts {
  hook: InGraphGradients;
  outputs: DeviceTensor[];
  low: boolean;
}

/** The name of the in-graph hook's output `i` in the accumulate (or ZeRO gradients) graph. */
export const inGraphOutput = (i: number) => `in_graph_gradients/${i}`;
/** The accumulate graph's bfloat16 copy of parameter `p`'s gradient (gradReduceDtype 'bfloat16'). */
const inGraphLow = (p: string) => `in_graph_low/${p}`;
/** The gradients graph's padded copy of parameter `p`'s gradient (inGraphShards). */
export const inGraphPadded = (p: string) => `in_graph_padded/${p}`;

/** Refuses what the in-graph reduction does not cover, by option name. */
export function checkInGraphGradients(opts: { onGradients?: unknown; zero?: unknown }, staticInputs: boolean): void {
  const why = (what: string) => new Error(`Trainer: inGraphGradients (the all-reduce inside the backward's run) ${what}`);
  if (opts.onGradients) throw why('replaces onGradients: give one of them');
  if (opts.zero) throw why('is the all-reduce form: with zero give inGraphShards (the reduce-scatter inside the run) instead');
  if (staticInputs) throw why('does not combine with cudaGraph / staticInputs (collectives cannot be captured in the step\'s graph)');
}

/** Refuses `inGraphUpdate` where it does not apply, by option name (`fusedUpdate`: the update is the fused AdamW node). */
export function checkInGraphUpdate(opts: { inGraphGradients?: InGraphGradients; inGraphUpdate?: unknown; gradReduceDtype?: unknown; zero?: unknown }, microBatches: number, fusedUpdate: boolean): void {
  if (opts.inGraphUpdate !== undefined && typeof opts.inGraphUpdate !== 'boolean') throw new Error(`Trainer: inGraphUpdate must be true or false, got ${String(opts.inGraphUpdate)}`);
  if (!opts.inGraphUpdate) return;
  const why = (what: string) => new Error(`Trainer: inGraphUpdate (the update in the run that all-reduces the gradients) ${what}`);
  if (opts.zero) throw why('does not combine with zero (ZeRO-1 updates its shards between a reduce-scatter and an all-gather)');
  if (!opts.inGraphGradients) throw why("needs inGraphGradients (the all-reduce inside the backward's run) to follow");
  if (microBatches !== 1) throw why(`needs microBatches = 1 (one run a step), got ${microBatches}: with several, only the last micro-batch's run reduces and the update stays a run of its own`);
  if (!opts.inGraphGradients.buildReduced) throw why("needs a hook with buildReduced (its bucket nodes, then a join the update reads after): @lathe/distributed's gradientAllReduceInGraph has it");
  // the composed update would widen the bfloat16 sums, and nothing exact orders that Cast after the join on every device
  // (ORT's CPU Where has no bfloat16 kernel); the fused node reads them as they are, after the join
  const dtype = opts.gradReduceDtype ?? 'float32';
  if (dtype !== 'float32' && !(dtype === 'bfloat16' && fusedUpdate)) {
    throw why(`reduces float32 gradients, or bfloat16 ones with fusedAdamW (whose node reads them as they are), got gradReduceDtype '${String(opts.gradReduceDtype)}'${fusedUpdate ? '' : ' without fusedAdamW'}`);
  }
}

/**
 * The nodes `TrainerOptions.inGraphUpdate` puts between the step graph's backward and its update:
 * each gradient made a bound output (`next/grad/<p>`, the name the accumulate graph gives it: the
 * buffers the bucket nodes read, which ORT never reuses within the run, while the collective stream
 * may still write them), the hook's bucket nodes summing them in place (reverse parameter order,
 * as `addInGraphNodes`) and its join, whose output the update takes as `after`. `low`: the
 * gradients are summed in bfloat16 — a bfloat16 gradient a Cast would widen as it is (no copy),
 * any other cast in the run — and the update (the fused node) reads the bfloat16 sums.
 */
export function inGraphUpdateNodes(hook: InGraphGradients, low = false): BeforeUpdate {
  return (g, grads) => {
    // readers among the nodes the gradients and outputs need (autodiff leaves dead nodes, pruned at export)
    const readers = new Map<Tensor, number>();
    for (const n of L.liveNodes(g, [...g.outputs, ...grads.map((x) => x.grad)])) for (const t of n.inputs) if (t) readers.set(t, (readers.get(t) ?? 0) + 1);
    const taken = new Map<Tensor, string>();
    // A tensor summed in place must be read by nothing else: the backward may read it after its bucket
    // node, while the collective stream writes it. An Add hands its output's gradient to both inputs as
    // it is, and a copy made here could be folded away by ONNX Runtime (Identity and Cast-chain
    // elimination), so such a gradient is refused by name rather than raced on.
    const own = (name: string, t: Tensor, readBy: number): Tensor => {
      const other = taken.get(t);
      if (other !== undefined || (readers.get(t) ?? 0) > readBy) {
        throw new Error(
          `Trainer: inGraphUpdate: the gradient of '${name}' is ${other !== undefined ? `also the gradient of '${other}'` : 'a tensor the backward reads again'}, and the run sums it in place while the backward goes on: ` +
            'reduce after the backward instead (onGradients; --grad_overlap false in the commands)',
        );
      }
      taken.set(t, name);
      return t;
    };
    const bound = grads.map(({ name, grad }) => {
      const half = low ? widenedBfloat16(grad) : undefined;
      // bfloat16 sums: the widened bfloat16 value itself (read by the widening Cast only), or a cast of a float32 gradient (a tensor of its own)
      const sent = half ? own(name, half, 1) : low ? L.cast(grad, 'bfloat16') : own(name, grad, 0);
      return { name, grad: g.output(sent, stateNames.next(stateNames.grad(name))) };
    });
    const { reduced, joined } = hook.buildReduced!(g, [...bound].reverse());
    if (reduced.length !== grads.length) throw new Error(`Trainer: inGraphUpdate: the hook's buildReduced returned ${reduced.length} sums for ${grads.length} gradients`);
    return { grads: [...reduced].reverse(), after: joined };
  };
}

/**
 * Adds the hook's nodes to the accumulate graph after the summed gradients (`next/grad/<p>`, in
 * reverse parameter order: the backward completes the last layers first) and makes their tensors
 * outputs, with a device buffer for each.
 */
export function addInGraphNodes(hook: InGraphGradients, g: Graph, params: readonly { name: string }[], device: Device, low: boolean): InGraphParts {
  const byName = new Map(g.outputs.map((t) => [t.name, t]));
  const grads = [...params].reverse().map((p) => {
    const grad = byName.get(stateNames.next(stateNames.grad(p.name)));
    if (!grad) throw new Error(`Trainer: inGraphGradients: the accumulate graph has no output for the gradient of '${p.name}'`);
    // bfloat16: the nodes reduce a bfloat16 copy, itself a bound output (what gradCastGraph's cast computes)
    return { name: p.name, grad: low ? g.output(L.cast(grad, 'bfloat16'), inGraphLow(p.name)) : grad };
  });
  const outs = hook.build(g, grads);
  const outputs: DeviceTensor[] = [];
  try {
    outs.forEach((t, i) => {
      g.output(t, inGraphOutput(i));
      outputs.push(device.empty(t.dtype, t.shape.map(Number)));
    });
  } catch (e) {
    // the caller frees the outputs only once it has them
    for (const t of outputs) t.dispose();
    throw e;
  }
  return { hook, outputs, low };
}

/**
 * Binds what an accumulate run with the nodes writes besides the gradients: the nodes' outputs and,
 * with bfloat16, the copies they reduce (`low`, by parameter name).
 */
export function bindInGraphOutputs(b: Binding, inGraph: InGraphParts, names: readonly string[], low: ReadonlyMap<string, DeviceTensor> | undefined): void {
  inGraph.outputs.forEach((t, i) => b.output(inGraphOutput(i), t));
  if (inGraph.low) for (const n of names) b.output(inGraphLow(n), low!.get(n)!);
}

/**
 * Adds the ZeRO hook's nodes to the gradients graph after `grad/<p>` (reverse parameter order), with
 * each padded gradient padded in the run (a bound output, `in_graph_padded/<p>`), and returns the
 * nodes' tensors after making them outputs.
 */
export function addInGraphShardNodes(hook: InGraphShards, g: Graph, layout: readonly ShardSlot[], worldSize: number, low: boolean): { outputs: Tensor[] } {
  const byName = new Map(g.outputs.map((t) => [t.name, t]));
  const grads = [...layout].reverse().map((s) => {
    const grad = byName.get(stateNames.grad(s.name));
    if (!grad) throw new Error(`Trainer: inGraphShards: the gradients graph has no output for '${s.name}'`);
    if (!s.padded && !low) return { name: s.name, grad };
    // padded and (bfloat16) cast in the run, as gradCastGraph does after it
    let x = L.reshape(grad, [s.size]);
    if (s.padded) x = L.concat([x, L.expand(g.constant(0, 'float32', []), [s.shard * worldSize - s.size])], 0);
    return { name: s.name, grad: g.output(low ? L.cast(x, 'bfloat16') : x, inGraphPadded(s.name)) };
  });
  const outputs = hook.build(g, grads);
  outputs.forEach((t, i) => g.output(t, inGraphOutput(i)));
  return { outputs };
}
