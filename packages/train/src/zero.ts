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
import type { DeviceTensor } from '@lathe/runtime';
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
