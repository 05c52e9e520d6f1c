/**
 * ZeRO stage 1 (Rajbhandari et al., 2020): the AdamW moments and an fp32 master copy of the
 * parameters are split over the ranks of a data-parallel job, so each rank keeps 1/N of them.
 * Each parameter is cut on its own into N equal shards of ⌈size/N⌉ elements (the last zero-padded):
 * each micro-batch's gradients are reduce-scattered so rank r holds the summed gradient of shard r
 * (one full-size gradient buffer, where unsharded accumulation keeps two), rank r runs AdamW on its
 * shards, and the updated shards are all-gathered back into every rank's full parameters, which
 * are kept once (unsharded training double-buffers them). A rank holds 2P + 7P/N bytes of
 * weights, gradient and shards (P: the float32 parameters; 2P + 9P/N with micro-batches) where
 * unsharded data parallelism holds 8P.
 * Zero padding stays zero through AdamW (zero gradient, zero moments, zero value), so the padded
 * elements never leak into the parameters.
 *
 * The clip coefficient needs the global gradient norm: each rank sums the squares of its gradient
 * shards and the ranks add those sums, which covers every element exactly once.
 */
import * as L from '@lathe/onnx';
import type { Binding, Device, DeviceTensor, Session, SessionOptions } from '@lathe/runtime';
import type { TrainableParam } from './train-step';

/**
 * The collectives ZeRO-1 calls (structurally @lathe/distributed's `Collectives`; @lathe/train
 * imports nothing from there). Every rank calls them in the same order.
 */
export interface ShardCollectives {
  readonly rank: number;
  readonly worldSize: number;
  /** Sums `input` (worldSize × output.size elements) over the ranks; rank r keeps chunk r in `output`. */
  reduceScatter(input: DeviceTensor, output: DeviceTensor, op?: 'sum' | 'avg'): Promise<void>;
  /** Concatenates every rank's `input` in rank order into `output`. */
  allGather(input: DeviceTensor, output: DeviceTensor): Promise<void>;
  /** Several reduce-scatters in order, as one group where the backend can (one wait instead of one per tensor). */
  reduceScatterMany?(pairs: readonly (readonly [DeviceTensor, DeviceTensor])[], op?: 'sum' | 'avg'): Promise<void>;
  /** Several all-gathers in order, as one group where the backend can. */
  allGatherMany?(pairs: readonly (readonly [DeviceTensor, DeviceTensor])[]): Promise<void>;
  /** Sums a few host values over the ranks, in place. */
  allReduceHost(values: Float64Array, op?: 'sum' | 'avg'): Promise<void>;
}

/** One parameter's place in the sharded layout. */
export interface ShardSlot {
  name: string;
  /** The parameter's shape and element count. */
  shape: number[];
  size: number;
  /** Elements per shard: ⌈size / worldSize⌉. */
  shard: number;
  /** Whether worldSize × shard exceeds size (the gradient and gathered values go through a padded buffer). */
  padded: boolean;
  decay: boolean;
}

/** The sharded layout of `params` over `worldSize` ranks. */
export function shardLayout(params: readonly TrainableParam[], worldSize: number): ShardSlot[] {
  if (!Number.isInteger(worldSize) || worldSize < 1) throw new Error(`ZeRO: worldSize must be a positive integer, got ${worldSize}`);
  return params.map((p) => {
    const size = p.shape.reduce((a, b) => a * b, 1);
    const shard = Math.ceil(size / worldSize);
    return { name: p.name, shape: [...p.shape], size, shard, padded: shard * worldSize !== size, decay: p.decay };
  });
}

/** Rank `rank`'s shard of a parameter's values (zero-padded past the end). */
export function paramShard(full: Float32Array, slot: ShardSlot, rank: number): Float32Array {
  if (full.length !== slot.size) throw new Error(`ZeRO: '${slot.name}' has ${full.length} values, its shape [${slot.shape.join(', ')}] needs ${slot.size}`);
  const out = new Float32Array(slot.shard);
  out.set(full.subarray(Math.min(rank * slot.shard, slot.size), Math.min((rank + 1) * slot.shard, slot.size)));
  return out;
}

/** Bytes of AdamW moments a rank keeps: its shards of m and v (one buffer set; the trainer keeps two). */
export function shardedMomentBytes(layout: readonly ShardSlot[]): number {
  return layout.reduce((s, x) => s + 2 * 4 * x.shard, 0);
}

/**
 * The dtype gradients cross between ranks in: float32, or bfloat16 (half the bytes; each rank's
 * gradient rounded to bfloat16 and the sum kept in bfloat16, as NCCL adds bfloat16 values, then
 * widened back to float32 for the update) — the trade of PyTorch DDP's `bf16_compress_hook`.
 */
export type GradReduceDtype = 'float32' | 'bfloat16';

/** A gradient the casts read or write: its name, shape, and (ZeRO) the padded length it is sent as. */
export interface CastSlot {
  name: string;
  shape: readonly number[];
  /** Flatten and zero-pad to this many elements before the cast (ZeRO's worldSize × shard). */
  padTo?: number;
}

/**
 * One graph casting every slot's tensor (`in/<name>`) between float32 and bfloat16 (`out/<name>`),
 * so the whole gradient is cast in one session run, one pass over its bytes. Narrowing rounds to
 * nearest even (ONNX Cast); padding (float32 zeros, before the cast) flattens to `padTo` elements.
 */
export function gradCastGraph(name: string, slots: readonly CastSlot[], to: GradReduceDtype): L.Graph {
  const from = to === 'bfloat16' ? 'float32' : 'bfloat16';
  const g = new L.Graph(name);
  for (const s of slots) {
    let x = g.input(`in/${s.name}`, from, [...s.shape]);
    const size = s.shape.reduce((a, b) => a * b, 1);
    if (s.padTo !== undefined) {
      x = L.reshape(x, [size]);
      if (s.padTo > size) x = L.concat([x, L.expand(g.constant(0, from, []), [s.padTo - size])], 0);
    }
    g.output(L.cast(x, to), `out/${s.name}`);
  }
  return g;
}

/** The bfloat16 copies of the gradients an all-reduce sends, and the casts into (`down[j]`) and out of (`up[j]`) them, for each gradient buffer j. */
export interface ReduceCast {
  low: Map<string, DeviceTensor>;
  down: Binding[];
  up: Binding[];
  sessions: Session[];
}

/**
 * The casts around a bfloat16 all-reduce of the gradient buffers `grads` (the trainer's one or two
 * sets, float32, by parameter name): bfloat16 buffers of the same shapes and, for each set, one run
 * that narrows the set into them and one that widens them back into the set.
 */
export function buildReduceCast(device: Device, slots: readonly CastSlot[], grads: readonly Map<string, DeviceTensor>[], session: SessionOptions): ReduceCast {
  const low = new Map<string, DeviceTensor>();
  const sessions: Session[] = [];
  try {
    for (const s of slots) low.set(s.name, device.empty('bfloat16', [...s.shape]));
    const opts = { ...session, cudaGraph: false };
    const down = device.compile(gradCastGraph('grad_to_bf16', slots, 'bfloat16'), { ...opts, name: 'grad-to-bf16' });
    sessions.push(down);
    const up = device.compile(gradCastGraph('grad_from_bf16', slots, 'float32'), { ...opts, name: 'grad-from-bf16' });
    sessions.push(up);
    return {
      low,
      down: grads.map((set) => {
        const b = down.binding();
        for (const s of slots) b.input(`in/${s.name}`, set.get(s.name)!).output(`out/${s.name}`, low.get(s.name)!);
        return b;
      }),
      up: grads.map((set) => {
        const b = up.binding();
        for (const s of slots) b.input(`in/${s.name}`, low.get(s.name)!).output(`out/${s.name}`, set.get(s.name)!);
        return b;
      }),
      sessions,
    };
  } catch (e) {
    for (const x of sessions) x.dispose();
    for (const t of low.values()) t.dispose();
    throw e;
  }
}

/** Reduce-scatters each pair, as one group where the collectives offer it. */
export async function reduceScatterAll(c: ShardCollectives, pairs: readonly (readonly [DeviceTensor, DeviceTensor])[]): Promise<void> {
  if (c.reduceScatterMany) return c.reduceScatterMany(pairs, 'sum');
  for (const [input, output] of pairs) await c.reduceScatter(input, output, 'sum');
}

/** All-gathers each pair, as one group where the collectives offer it. */
export async function allGatherAll(c: ShardCollectives, pairs: readonly (readonly [DeviceTensor, DeviceTensor])[]): Promise<void> {
  if (c.allGatherMany) return c.allGatherMany(pairs);
  for (const [input, output] of pairs) await c.allGather(input, output);
}
