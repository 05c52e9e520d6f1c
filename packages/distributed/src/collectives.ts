/**
 * Collectives: the operations data-parallel training needs between ranks, on the runtime's tensors.
 * Every rank calls the same operations in the same order (as with NCCL or torch.distributed); an
 * operation returns when this rank's part is done and its tensors hold the result.
 *
 * Backends: `LocalGroup` (N ranks in one process, for tests), `TcpCollectives` (CPU processes over
 * a TCP star hosted by rank 0: what `lathe launch` uses on the CPU) and `NcclCollectives` (GPUs).
 * The host-side operations (`allReduceHost`, `allGatherBytes`) carry small values — losses,
 * metrics, config digests, rewards — and every backend has them.
 */
import { fromBfloat16Bits, toBfloat16Bits, type DeviceTensor } from '@lathe/runtime';

/** How values from the ranks combine: their sum, or their mean. */
export type ReduceOp = 'sum' | 'avg';

/** A collective failed because a peer did (crashed, exited, or aborted): the message names it. */
export class DistributedError extends Error {
  constructor(
    message: string,
    /** The rank whose failure this reports, where known. */
    readonly peer?: number,
  ) {
    super(message);
    this.name = 'DistributedError';
  }
}

/** The operations between the ranks of one job. */
export interface Collectives {
  /** This rank. */
  readonly rank: number;
  /** Ranks in the job. */
  readonly worldSize: number;
  /** 'local', 'tcp' or 'nccl'. */
  readonly backend: string;
  /** What ended the group (a peer's death or abort), once something has; watched by long waits. */
  readonly failure?: Error;
  /**
   * Reduces each tensor over the ranks, in place (float32, or bfloat16 summed as NCCL sums it: each
   * addition of two values rounded to bfloat16). Tensors may be reduced as one bucket.
   */
  allReduce(tensors: readonly DeviceTensor[], op?: ReduceOp): Promise<void>;
  /** Reduces `input` (worldSize × output.size elements) over the ranks; rank r keeps chunk r in `output`. */
  reduceScatter(input: DeviceTensor, output: DeviceTensor, op?: ReduceOp): Promise<void>;
  /** Concatenates every rank's `input` in rank order into `output` (worldSize × input.size elements). */
  allGather(input: DeviceTensor, output: DeviceTensor): Promise<void>;
  /** `reduceScatter` of each (input, output) pair, in order; NCCL enqueues them as one group and waits once. */
  reduceScatterMany(pairs: readonly (readonly [DeviceTensor, DeviceTensor])[], op?: ReduceOp): Promise<void>;
  /** `allGather` of each (input, output) pair, in order; NCCL enqueues them as one group and waits once. */
  allGatherMany(pairs: readonly (readonly [DeviceTensor, DeviceTensor])[]): Promise<void>;
  /** Copies `root`'s tensors into every rank's. */
  broadcast(tensors: readonly DeviceTensor[], root?: number): Promise<void>;
  /** Reduces a few host values in place (losses, metrics, counts). */
  allReduceHost(values: Float64Array, op?: ReduceOp): Promise<void>;
  /** Every rank's bytes, in rank order (config digests, rewards, group statistics). */
  allGatherBytes(data: Uint8Array): Promise<Uint8Array[]>;
  /** Returns when every rank has reached it. */
  barrier(): Promise<void>;
  /** Fails this rank's pending and later operations, and tells the other ranks why (naming this rank). */
  abort(reason: string): void;
  /** Leaves the group in order (after the last operation). */
  close(): Promise<void>;
}

/** Per-rank results of a round: one buffer for every rank, or one each. */
export type RoundResult = Uint8Array | Uint8Array[];

/**
 * Collectives computed on the host: each operation is one round in which every rank's payload
 * reaches one place, `combine` makes the results, and each rank gets its own. Tensors cross the
 * host boundary (download, upload), so this suits the CPU device and tests, not GPU training.
 * Sums run in rank order on one place, so every rank gets bitwise the same result.
 */
export abstract class HostCollectives implements Collectives {
  abstract readonly rank: number;
  abstract readonly worldSize: number;
  abstract readonly backend: string;

  /** One round: `payload` from this rank; `combine` (run once, on every rank's payloads in rank order) gives the results. */
  protected abstract round(payload: Uint8Array, combine: (parts: Uint8Array[]) => RoundResult): Promise<Uint8Array>;
  abstract abort(reason: string): void;
  abstract close(): Promise<void>;

  async allReduce(tensors: readonly DeviceTensor[], op: ReduceOp = 'sum'): Promise<void> {
    if (tensors.length === 0) return;
    const dtype = reducible('allReduce', tensors, op);
    const bucket = new Float32Array(tensors.reduce((s, t) => s + t.size, 0));
    let at = 0;
    for (const t of tensors) {
      bucket.set(floats(t), at);
      at += t.size;
    }
    const out = f32(await this.round(bytes(bucket), (parts) => bytes(reduceF32(parts, op, this.worldSize, dtype))));
    at = 0;
    for (const t of tensors) {
      upload(t, out.subarray(at, at + t.size));
      at += t.size;
    }
  }

  async reduceScatter(input: DeviceTensor, output: DeviceTensor, op: ReduceOp = 'sum'): Promise<void> {
    const dtype = reducible('reduceScatter', [input, output], op);
    if (input.size !== output.size * this.worldSize) throw new Error(`reduceScatter: ${input.describe()} must hold worldSize (${this.worldSize}) × ${output.describe()}'s elements`);
    const n = output.size;
    const out = await this.round(bytes(floats(input)), (parts) => {
      const sum = reduceF32(parts, op, this.worldSize, dtype);
      return Array.from({ length: this.worldSize }, (_, r) => bytes(sum.slice(r * n, (r + 1) * n)));
    });
    upload(output, f32(out));
  }

  async allGather(input: DeviceTensor, output: DeviceTensor): Promise<void> {
    if (input.dtype !== output.dtype || output.size !== input.size * this.worldSize) throw new Error(`allGather: ${output.describe()} must hold worldSize (${this.worldSize}) × ${input.describe()}'s elements`);
    const host = input.download().data;
    const out = await this.round(bytes(host), (parts) => concat(parts));
    const Type = host.constructor as new (b: ArrayBuffer, o: number, n: number) => typeof host;
    output.upload(new Type(out.buffer as ArrayBuffer, out.byteOffset, output.size));
  }

  async reduceScatterMany(pairs: readonly (readonly [DeviceTensor, DeviceTensor])[], op: ReduceOp = 'sum'): Promise<void> {
    for (const [input, output] of pairs) await this.reduceScatter(input, output, op);
  }

  async allGatherMany(pairs: readonly (readonly [DeviceTensor, DeviceTensor])[]): Promise<void> {
    for (const [input, output] of pairs) await this.allGather(input, output);
  }

  async broadcast(tensors: readonly DeviceTensor[], root = 0): Promise<void> {
    checkRank('broadcast root', root, this.worldSize);
    const mine = this.rank === root ? concat(tensors.map((t) => bytes(t.download().data))) : new Uint8Array(0);
    const out = await this.round(mine, (parts) => parts[root]);
    if (this.rank === root) return;
    let at = 0;
    for (const t of tensors) {
      const host = t.download().data;
      const Type = host.constructor as new (b: ArrayBuffer, o: number, n: number) => typeof host;
      const n = host.byteLength;
      const copy = out.slice(at, at + n);
      t.upload(new Type(copy.buffer, 0, t.size));
      at += n;
    }
  }

  async allReduceHost(values: Float64Array, op: ReduceOp = 'sum'): Promise<void> {
    const out = await this.round(bytes(values), (parts) => {
      const sum = new Float64Array(values.length);
      for (const p of parts) {
        const v = f64(p);
        if (v.length !== sum.length) throw new DistributedError(`allReduceHost: ranks gave ${v.length} and ${sum.length} values`);
        for (let i = 0; i < v.length; i++) sum[i] += v[i];
      }
      if (op === 'avg') for (let i = 0; i < sum.length; i++) sum[i] /= parts.length;
      return bytes(sum);
    });
    values.set(f64(out));
  }

  async allGatherBytes(data: Uint8Array): Promise<Uint8Array[]> {
    const out = await this.round(data, (parts) => {
      const header = new Uint32Array(parts.map((p) => p.byteLength));
      return concat([bytes(header), ...parts]);
    });
    const lengths = new Uint32Array(out.slice(0, 4 * this.worldSize).buffer);
    const result: Uint8Array[] = [];
    let at = 4 * this.worldSize;
    for (const n of lengths) {
      result.push(out.slice(at, at + n));
      at += n;
    }
    return result;
  }

  async barrier(): Promise<void> {
    await this.round(new Uint8Array(0), () => new Uint8Array(0));
  }
}

/** Throws unless `r` is a rank of a world of `n`. */
export function checkRank(what: string, r: number, n: number): void {
  if (!Number.isInteger(r) || r < 0 || r >= n) throw new Error(`${what} ${r} is not a rank of a world of ${n}`);
}

function bytes(a: ArrayBufferView): Uint8Array {
  return new Uint8Array(a.buffer, a.byteOffset, a.byteLength);
}

/** A float32 view of bytes (copied when they are not 4-byte aligned). */
function f32(b: Uint8Array): Float32Array {
  const c = b.byteOffset % 4 === 0 ? b : b.slice();
  return new Float32Array(c.buffer, c.byteOffset, c.byteLength / 4);
}

function f64(b: Uint8Array): Float64Array {
  const c = b.byteOffset % 8 === 0 ? b : b.slice();
  return new Float64Array(c.buffer, c.byteOffset, c.byteLength / 8);
}

function concat(parts: Uint8Array[]): Uint8Array {
  const out = new Uint8Array(parts.reduce((s, p) => s + p.byteLength, 0));
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.byteLength;
  }
  return out;
}

/**
 * The dtype of tensors the host backends reduce: all float32, or all bfloat16 with 'sum' (NCCL's
 * bfloat16 'avg' pre-scales each value, which these backends do not model).
 */
function reducible(what: string, tensors: readonly DeviceTensor[], op: ReduceOp): 'float32' | 'bfloat16' {
  const dtype = tensors[0].dtype;
  for (const t of tensors) {
    if (t.dtype !== dtype || (dtype !== 'float32' && dtype !== 'bfloat16')) throw new Error(`${what}: ${tensors.map((x) => x.describe()).join(', ')}: the host backends reduce float32 tensors, or bfloat16 ones, not a mix`);
  }
  if (dtype === 'bfloat16' && op !== 'sum') throw new Error(`${what}: the host backends reduce bfloat16 tensors with 'sum' only`);
  return dtype as 'float32' | 'bfloat16';
}

/** A float32 or bfloat16 tensor's values as float32 (bfloat16 widened exactly). */
function floats(t: DeviceTensor): Float32Array {
  const data = t.download().data;
  return t.dtype === 'bfloat16' ? fromBfloat16Bits(data as Uint16Array) : (data as Float32Array);
}

/** Writes float32 values into a float32 or bfloat16 tensor (the values of a bfloat16 sum are already bfloat16). */
function upload(t: DeviceTensor, values: Float32Array): void {
  if (t.dtype === 'bfloat16') t.upload(toBfloat16Bits(values));
  else t.upload(values);
}

/** `x` rounded to the nearest bfloat16 (ties to even), as a float32. */
const bf16Round = (x: Float32Array<ArrayBuffer>): void => void fromBfloat16Bits(toBfloat16Bits(x), x);

/**
 * Float32 sums of the ranks' arrays in rank order (then divided by the world size for 'avg'). For
 * bfloat16 every partial sum is rounded to bfloat16, as NCCL's reduction kernels add two bfloat16
 * values and store a bfloat16 at each step (NVIDIA/nccl#1026: there is no float32 accumulator in
 * transit); with two ranks that is bf16(a + b) whatever the algorithm, with more the ring's order
 * of additions may differ from rank order.
 */
function reduceF32(parts: Uint8Array[], op: ReduceOp, world: number, dtype: 'float32' | 'bfloat16' = 'float32'): Float32Array {
  const first = f32(parts[0]);
  const sum = Float32Array.from(first);
  for (let r = 1; r < parts.length; r++) {
    const v = f32(parts[r]);
    if (v.length !== sum.length) throw new DistributedError(`allReduce: rank ${r} gave ${v.length} elements, rank 0 gave ${sum.length} (the ranks' tensors differ)`, r);
    for (let i = 0; i < v.length; i++) sum[i] += v[i];
    if (dtype === 'bfloat16') bf16Round(sum);
  }
  if (op === 'avg') for (let i = 0; i < sum.length; i++) sum[i] /= world;
  return sum;
}
