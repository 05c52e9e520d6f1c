/**
 * `ThreadGroup`: ranks as worker threads of one process, summing through shared memory
 * (SharedArrayBuffer + Atomics.wait) synchronously — the CPU stand-in for NCCL under the in-run
 * all-reduce (overlap.ts), whose node must finish its bucket inside ONNX Runtime's compute call,
 * where no promise can settle. Sums run in rank order on every rank (bitwise equal results, as
 * `HostCollectives` sums). For tests: every rank copies its bucket through the host.
 */
import { CApi, fromBfloat16Bits, toBfloat16Bits } from '@lathe/runtime';
import type { DeviceTensor } from '@lathe/runtime';
import type { InRunBuffer, InRunReducer, InRunShardPair } from './overlap';

/** What every rank's thread gets (structured-clonable: pass it in `workerData`). */
export interface ThreadGroupShared {
  readonly memory: SharedArrayBuffer;
  readonly worldSize: number;
  /** float32 elements each rank stages per round. */
  readonly capacity: number;
}

/** Control words: arrivals at the barrier, its generation, and 1 + the rank that aborted (0: none). */
const ARRIVED = 0;
const GENERATION = 1;
const ABORTED = 2;
const CONTROL_BYTES = 64;
/** Host values per `allReduceHost` round. */
const HOST_VALUES = 64;

/** Ranks as threads of one process, summing through shared memory. */
export const ThreadGroup = {
  /** The shared memory of a group of `worldSize` ranks, each staging up to `capacity` float32 per round. */
  create(worldSize: number, capacity = 1 << 16): ThreadGroupShared {
    if (!Number.isInteger(worldSize) || worldSize < 1) throw new Error(`ThreadGroup: worldSize must be a positive integer, got ${worldSize}`);
    if (!Number.isInteger(capacity) || capacity < 1) throw new Error(`ThreadGroup: capacity must be a positive integer, got ${capacity}`);
    return { memory: new SharedArrayBuffer(CONTROL_BYTES + worldSize * (HOST_VALUES * 8 + capacity * 4)), worldSize, capacity };
  },

  /** Rank `rank`'s reducer, in its own thread; a wait longer than `timeoutMs` for the others fails naming the round. */
  join(shared: ThreadGroupShared, rank: number, opts: { timeoutMs?: number } = {}): ThreadReducer {
    return new ThreadReducer(shared, rank, opts.timeoutMs ?? 60_000);
  },
};

/** One rank of a `ThreadGroup`: an `InRunReducer` whose sums are done when `reduceInRun` returns. */
export class ThreadReducer implements InRunReducer {
  readonly backend = 'threads';
  readonly worldSize: number;
  private readonly control: Int32Array;
  private readonly host: Float64Array[];
  private readonly slots: Float32Array[];
  private rounds = 0;

  constructor(
    private readonly shared: ThreadGroupShared,
    readonly rank: number,
    private readonly timeoutMs: number,
  ) {
    this.worldSize = shared.worldSize;
    if (!Number.isInteger(rank) || rank < 0 || rank >= this.worldSize) throw new Error(`ThreadGroup: rank ${rank} is not a rank of a world of ${this.worldSize}`);
    const { memory, capacity } = shared;
    this.control = new Int32Array(memory, 0, CONTROL_BYTES / 4);
    const hostAt = CONTROL_BYTES;
    this.host = Array.from({ length: this.worldSize }, (_, r) => new Float64Array(memory, hostAt + r * HOST_VALUES * 8, HOST_VALUES));
    const slotAt = hostAt + this.worldSize * HOST_VALUES * 8;
    this.slots = Array.from({ length: this.worldSize }, (_, r) => new Float32Array(memory, slotAt + r * capacity * 4, capacity));
  }

  /** Returns when every rank has arrived (a sense-reversing barrier on the generation word). */
  private barrier(what: string): void {
    const c = this.control;
    this.rounds++;
    const generation = Atomics.load(c, GENERATION);
    if (Atomics.add(c, ARRIVED, 1) === this.worldSize - 1) {
      Atomics.store(c, ARRIVED, 0);
      Atomics.add(c, GENERATION, 1);
      Atomics.notify(c, GENERATION);
      return;
    }
    const deadline = Date.now() + this.timeoutMs;
    while (Atomics.load(c, GENERATION) === generation) {
      const aborted = Atomics.load(c, ABORTED);
      if (aborted) throw new Error(`ThreadGroup: rank ${aborted - 1} aborted (rank ${this.rank} waiting in ${what})`);
      const left = deadline - Date.now();
      if (left <= 0) {
        this.abort();
        throw new Error(`ThreadGroup: rank ${this.rank} waited ${this.timeoutMs} ms in ${what} (round ${this.rounds}) for the other ranks`);
      }
      Atomics.wait(c, GENERATION, generation, Math.min(left, 100));
    }
  }

  /** Fails the other ranks' waits, naming this rank. */
  abort(): void {
    Atomics.compareExchange(this.control, ABORTED, 0, this.rank + 1);
    Atomics.notify(this.control, GENERATION);
  }

  /** Sums `values` over the ranks in place, through the staging slots in rounds (rank order; bfloat16: each addition rounded). */
  private sumRounds(values: Float32Array, bf16: boolean): void {
    const cap = this.shared.capacity;
    for (let at = 0; at < values.length; at += cap) {
      const part = values.subarray(at, Math.min(at + cap, values.length));
      this.slots[this.rank].set(part);
      this.barrier('a sum (staged)');
      // rank order, rounding each addition to float32, on every rank
      const sum = Float32Array.from(this.slots[0].subarray(0, part.length));
      for (let r = 1; r < this.worldSize; r++) {
        const v = this.slots[r];
        for (let i = 0; i < part.length; i++) sum[i] += v[i];
        if (bf16) fromBfloat16Bits(toBfloat16Bits(sum), sum);
      }
      part.set(sum);
      this.barrier('a sum (summed)');
    }
  }

  /** A float32 or bfloat16 buffer's values as float32 (and its bits, for bfloat16). */
  private read(b: InRunBuffer): { values: Float32Array<ArrayBuffer>; bits?: Uint16Array<ArrayBuffer> } {
    if (b.dtype !== 'float32' && b.dtype !== 'bfloat16') throw new Error(`ThreadGroup: sums float32 or bfloat16 buffers, got ${b.dtype}`);
    const api = CApi.get();
    const values = new Float32Array(b.size);
    if (b.dtype === 'float32') {
      api.copyOut(values, b.data);
      return { values };
    }
    const bits = new Uint16Array(b.size);
    api.copyOut(bits, b.data);
    fromBfloat16Bits(bits, values);
    return { values, bits };
  }

  /**
   * Sums float32 buffers, or bfloat16 ones as NCCL sums them (each addition rounded to bfloat16, as
   * `HostCollectives` models it), staging the values as float32.
   */
  reduceInRun(bucket: readonly InRunBuffer[]): void {
    for (const b of bucket) {
      const { values, bits } = this.read(b);
      this.sumRounds(values, bits !== undefined);
      CApi.get().copyIn(b.data, bits ? toBfloat16Bits(values, bits) : values);
    }
  }

  /** The sums are done when `reduceInRun` returns: nothing to wait for. */
  joinInRun(): void {}

  reduceScatterInRun(pairs: readonly InRunShardPair[]): void {
    for (const { input, output } of pairs) {
      if (input.size % this.worldSize !== 0) throw new Error(`ThreadGroup: a reduce-scatter of ${input.size} elements over ${this.worldSize} ranks`);
      const { values, bits } = this.read(input);
      this.sumRounds(values, bits !== undefined);
      const n = input.size / this.worldSize;
      const mine = values.subarray(this.rank * n, (this.rank + 1) * n);
      CApi.get().copyIn(output, bits ? toBfloat16Bits(mine) : mine);
    }
  }

  /** `reduceInRun`'s sum of a float32 tensor, this rank's chunk into `output` (ZeRO's `ShardCollectives`). */
  async reduceScatter(input: DeviceTensor, output: DeviceTensor, op: 'sum' | 'avg' = 'sum'): Promise<void> {
    if (input.dtype !== 'float32' || output.dtype !== 'float32' || input.size !== output.size * this.worldSize) throw new Error(`ThreadGroup: reduceScatter of ${input.describe()} into ${output.describe()}: float32, worldSize × the output's elements`);
    const values = Float32Array.from(input.download().data as Float32Array);
    this.sumRounds(values, false);
    const mine = values.slice(this.rank * output.size, (this.rank + 1) * output.size);
    if (op === 'avg') for (let i = 0; i < mine.length; i++) mine[i] /= this.worldSize;
    output.upload(mine);
  }

  /** Every rank's float32 `input` in rank order into `output` (ZeRO's parameter gather). */
  async allGather(input: DeviceTensor, output: DeviceTensor): Promise<void> {
    if (input.dtype !== 'float32' || output.dtype !== 'float32' || output.size !== input.size * this.worldSize) throw new Error(`ThreadGroup: allGather of ${input.describe()} into ${output.describe()}: float32, worldSize × the input's elements`);
    const mine = input.download().data as Float32Array;
    const n = mine.length;
    const out = new Float32Array(n * this.worldSize);
    const cap = this.shared.capacity;
    for (let at = 0; at < n; at += cap) {
      const len = Math.min(cap, n - at);
      this.slots[this.rank].set(mine.subarray(at, at + len));
      this.barrier('allGather (staged)');
      for (let r = 0; r < this.worldSize; r++) out.set(this.slots[r].subarray(0, len), r * n + at);
      this.barrier('allGather (copied)');
    }
    output.upload(out);
  }

  async drain(): Promise<void> {}

  async allReduceHost(values: Float64Array, op: 'sum' | 'avg' = 'sum'): Promise<void> {
    if (values.length > HOST_VALUES) throw new Error(`ThreadGroup: allReduceHost takes at most ${HOST_VALUES} values, got ${values.length}`);
    this.host[this.rank].set(values);
    this.barrier('allReduceHost (staged)');
    const sum = new Float64Array(values.length);
    for (let r = 0; r < this.worldSize; r++) for (let i = 0; i < sum.length; i++) sum[i] += this.host[r][i];
    if (op === 'avg') for (let i = 0; i < sum.length; i++) sum[i] /= this.worldSize;
    this.barrier('allReduceHost (summed)');
    values.set(sum);
  }
}
