/**
 * Data parallelism over `Collectives`: every rank holds the whole model, takes its slice of each
 * global batch, and the ranks' summed gradients are all-reduced before the optimizer update, so the
 * update equals one process's on the whole batch. Losses in Lathe are normalised by a count over
 * the whole optimizer batch (an input), which each rank computes from the global batch: the ranks'
 * gradients then add up to exactly the one-process gradient (a sum, not a mean).
 */
import type { DeviceTensor } from '@lathe/runtime';
import type { Collectives } from './collectives';

/**
 * Throws unless the global batch splits evenly into the ranks' micro-batches: `batchSize` rows
 * over `worldSize` ranks of `microBatches` micro-batches each. The message names the flags.
 */
export function checkDataParallelBatch(batchSize: number, microBatches: number, worldSize: number, flags = { batch: '--batch_size', micro: '--micro_batches' }): void {
  if (batchSize % worldSize !== 0) throw new Error(`${flags.batch} ${batchSize} is not divisible by the world size ${worldSize} (WORLD_SIZE, lathe launch --gpus): each rank takes an equal share of the global batch`);
  const per = batchSize / worldSize;
  if (per % microBatches !== 0) throw new Error(`${flags.batch} ${batchSize} over ${worldSize} ranks is ${per} rows per rank, not divisible by ${flags.micro} ${microBatches}`);
}

/** Rank `rank`'s contiguous share of a global batch (its length must divide evenly; `flag` names the option that sets it). */
export function shardOf<T>(rows: readonly T[], rank: number, worldSize: number, flag = '--batch_size'): T[] {
  if (rows.length % worldSize !== 0) throw new Error(`${flag} ${rows.length} is not divisible by the world size ${worldSize} (WORLD_SIZE, lathe launch --gpus)`);
  const per = rows.length / worldSize;
  return rows.slice(rank * per, (rank + 1) * per);
}

/** What `Trainer`'s `onGradients` option receives (structurally: @lathe/train imports nothing from here). */
export type GradientHook = (grads: Map<string, DeviceTensor>, sums: Float64Array) => Promise<void>;

/**
 * Bytes of gradients per bucket, both reductions' default (`--grad_bucket_mb` of the training
 * commands): four times PyTorch DDP's 25 MiB, because each bucket is one NCCL launch the host
 * enqueues and waits behind, and on four GPUs 25 MiB buckets left the in-run reduction queued past
 * the backward (docs/guides/launch.md).
 */
export const DEFAULT_BUCKET_BYTES = 100 * 2 ** 20;

/** Options of `gradientAllReduce`. */
export interface GradientAllReduceOptions {
  /** Bytes of gradients per all-reduce (default {@link DEFAULT_BUCKET_BYTES}). */
  bucketBytes?: number;
}

/** Groups tensors, in order, into buckets of at most `bucketBytes` (a larger tensor is a bucket of its own). */
export function buckets<T extends { byteLength: number }>(tensors: readonly T[], bucketBytes: number): T[][] {
  const out: T[][] = [];
  let cur: T[] = [];
  let bytes = 0;
  for (const t of tensors) {
    if (cur.length && bytes + t.byteLength > bucketBytes) {
      out.push(cur);
      cur = [];
      bytes = 0;
    }
    cur.push(t);
    bytes += t.byteLength;
  }
  if (cur.length) out.push(cur);
  return out;
}

/**
 * The gradient hook of data-parallel training: sums every gradient buffer over the ranks, bucket by
 * bucket, and the step's loss and metrics (`sums`) with them. Pass it as `Trainer.create`'s
 * `onGradients`. Gradients are summed, not averaged: each rank's loss is already normalised by the
 * global batch's count.
 */
export function gradientAllReduce(collectives: Collectives, opts: GradientAllReduceOptions = {}): GradientHook {
  const bucketBytes = opts.bucketBytes ?? DEFAULT_BUCKET_BYTES;
  return async (grads, sums) => {
    if (collectives.worldSize === 1) return;
    for (const bucket of buckets([...grads.values()], bucketBytes)) await collectives.allReduce(bucket, 'sum');
    await collectives.allReduceHost(sums, 'sum');
  };
}

/** Canonical JSON: object keys sorted, so equal configs give equal text. */
function canonical(v: unknown): string {
  if (Array.isArray(v)) return `[${v.map(canonical).join(',')}]`;
  if (v && typeof v === 'object') return `{${Object.keys(v).sort().map((k) => `${JSON.stringify(k)}:${canonical((v as Record<string, unknown>)[k])}`).join(',')}}`;
  return JSON.stringify(v) ?? 'null';
}

/**
 * Checks at start that every rank runs the same config (`ignore` lists keys that may differ). On a
 * mismatch every rank throws the same error, naming the ranks and the keys that differ from rank 0.
 */
export async function checkSameConfig(collectives: Collectives, config: Record<string, unknown>, ignore: readonly string[] = []): Promise<void> {
  if (collectives.worldSize === 1) return;
  const mine = Object.fromEntries(Object.entries(config).filter(([k]) => !ignore.includes(k)));
  const all = (await collectives.allGatherBytes(new TextEncoder().encode(canonical(mine)))).map((b) => JSON.parse(new TextDecoder().decode(b)) as Record<string, unknown>);
  const problems: string[] = [];
  for (let r = 1; r < all.length; r++) {
    const keys = [...new Set([...Object.keys(all[0]), ...Object.keys(all[r])])].sort();
    const diff = keys.filter((k) => canonical(all[0][k]) !== canonical(all[r][k]));
    if (diff.length) problems.push(`rank ${r} differs from rank 0 in ${diff.map((k) => `${k} (${canonical(all[r][k])} vs ${canonical(all[0][k])})`).join(', ')}`);
  }
  if (problems.length) throw new Error(`the ranks were started with different configs: ${problems.join('; ')}`);
}

/**
 * Every rank's rows of a per-row quantity (rewards, lengths), concatenated in rank order, and where
 * this rank's rows start: what an RL step needs to compute batch-level statistics (group-normalised
 * advantages with whole groups per rank, or any estimator over the batch) exactly as one process
 * would, and then keep its own rows.
 */
export async function gatherRows(collectives: Collectives, rows: Float64Array): Promise<{ all: Float64Array; offset: number }> {
  if (collectives.worldSize === 1) return { all: Float64Array.from(rows), offset: 0 };
  const parts = await collectives.allGatherBytes(new Uint8Array(rows.buffer, rows.byteOffset, rows.byteLength));
  const arrays = parts.map((p) => new Float64Array(p.slice().buffer));
  const all = new Float64Array(arrays.reduce((s, a) => s + a.length, 0));
  let at = 0;
  let offset = 0;
  arrays.forEach((a, r) => {
    if (r === collectives.rank) offset = at;
    all.set(a, at);
    at += a.length;
  });
  return { all, offset };
}
