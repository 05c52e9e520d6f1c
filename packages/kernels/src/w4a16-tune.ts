/**
 * Launch plans of the split-K W4A16 kernels measured on the device: `tuneW4A16` times each
 * projection shape at a few decode row counts over column tiles and rounds (chunks of K a warp
 * takes) and keeps the fastest per shape and row count; `W4A16PlanTable.plan` then answers
 * {@link W4A16LaunchOptions.plan} for launches of those shapes (any other shape keeps the default
 * plan). Which plan wins depends on N, K, the rows and the GPU (how many CTAs of a plan's size are
 * resident at once), so the table is measured where it runs, once, before the sessions capture
 * their graphs.
 */
import type { DType } from '@lathe/onnx';
import { toBfloat16Bits, toFloat16Bits, type Device, type DeviceTensor } from '@lathe/runtime';
import { W4A16, w4a16Plan, w4a16TileBuild, w4a16Unsupported, type W4A16LaunchOptions, type W4A16Shape, type W4A16SplitChoice, type W4A16Tile } from './w4a16';
import { W4A16_TILE_VARIANTS, w4a16TileDims } from './w4a16-source';

/** One weight shape to tune: B [N, K] in blocks of `blockSize`, activations in `dtype`. */
export interface W4A16TuneShape {
  /** A label for reports (e.g. 'gate_up_proj'). */
  name?: string;
  N: number;
  K: number;
  blockSize: number;
  dtype: DType;
}

/** What {@link tuneW4A16} tries. */
export interface W4A16TuneOptions {
  /**
   * Row counts to time (1–16 for the split-K kernels alone; up to 256 with `tiles`); a launch of M rows takes
   * the entry of the fewest rows ≥ M. Default 1, 4, 8, 16.
   */
  rows?: readonly number[];
  /** Time every tiled build the device runs too (at every row count), so a shape's entry may be a tiled build. Default false. */
  tiles?: boolean;
  /** Chunks of K a warp takes (see `w4a16Plan`; plans with the same warp count are timed once). Default 1, 2, 3, 4, 6, 8. */
  rounds?: readonly number[];
  /** Column tiles a warp. Default 1 and 2. */
  columnTiles?: readonly (1 | 2)[];
  /** Launches timed per plan (one CUDA graph of them, after a warm-up). Default 200. */
  iters?: number;
}

/** The fastest plan found for one shape and row count, beside the default plan's time. */
export interface W4A16TuneEntry extends W4A16TuneShape {
  M: number;
  /** A split-K plan's column tiles and rounds (a tiled entry: its build's column tiles, rounds 1). */
  columnTiles: 1 | 2;
  rounds: number;
  /** Warps a CTA. */
  warps: number;
  /** The tiled build that won, where one did (the entry's launch is then that build's). */
  tile?: W4A16Tile;
  /** Device µs a launch with this plan. */
  us: number;
  /** Device µs a launch with the default plan. */
  defaultUs: number;
}

/** Every plan timed (for reports). */
export interface W4A16TuneTiming extends W4A16TuneShape {
  M: number;
  columnTiles: 1 | 2;
  rounds: number;
  warps: number;
  /** A tiled build's label (`w4a16TileDims`), for a tiled timing. */
  tile?: string;
  ctas: number;
  us: number;
}

const DEFAULT_ROWS = [1, 4, 8, 16] as const;
const DEFAULT_ROUNDS = [1, 2, 3, 4, 6, 8] as const;

/** Measured plans by shape and row count; `plan` is what {@link W4A16LaunchOptions.plan} takes. */
export class W4A16PlanTable {
  constructor(readonly entries: readonly W4A16TuneEntry[]) {}

  /** The entry for `shape` — same N, K, block size and dtype, the fewest rows ≥ M — as a launch choice, or undefined (the default plan). */
  plan(shape: W4A16Shape): W4A16SplitChoice | undefined {
    let best: W4A16TuneEntry | undefined;
    for (const e of this.entries) {
      if (e.N !== shape.N || e.K !== shape.K || e.blockSize !== shape.blockSize || e.dtype !== shape.dtype || e.M < shape.M) continue;
      if (!best || e.M < best.M) best = e;
    }
    if (!best) return undefined;
    return best.tile ? { tile: best.tile } : { columnTiles: best.columnTiles, rounds: best.rounds };
  }

  /** Launch options whose `plan` reads this table, over `base`. */
  launchOptions(base: W4A16LaunchOptions = {}): W4A16LaunchOptions {
    return { ...base, plan: (shape) => this.plan(shape) };
  }

  toJSON(): { entries: readonly W4A16TuneEntry[] } {
    return { entries: this.entries };
  }

  /** A table saved with `JSON.stringify(table)`; throws naming the first malformed entry. */
  static fromJSON(json: unknown): W4A16PlanTable {
    const entries = (json as { entries?: unknown })?.entries;
    if (!Array.isArray(entries)) throw new Error('W4A16PlanTable.fromJSON: expected { entries: [...] }');
    entries.forEach((e, i) => {
      const x = e as Partial<W4A16TuneEntry>;
      const ints = [x.N, x.K, x.blockSize, x.M, x.rounds, x.warps];
      if (!ints.every((v) => Number.isInteger(v) && (v as number) >= 1) || (x.columnTiles !== 1 && x.columnTiles !== 2) || typeof x.dtype !== 'string' || (x.tile !== undefined && (typeof x.tile !== 'object' || x.tile === null || !w4a16TileBuild(x.tile)))) {
        throw new Error(`W4A16PlanTable.fromJSON: entry ${i} is not a plan (N, K, blockSize, M, rounds, warps ≥ 1; columnTiles 1 or 2; dtype; tile, where present, a tiled build): ${JSON.stringify(e)}`);
      }
    });
    return new W4A16PlanTable(entries as W4A16TuneEntry[]);
  }
}

/** Constant 4-bit weights of one shape in copies on the device, for timing launches the way a decode step reads weights. */
export interface W4A16TimingWeights {
  kBlocks: number;
  /** Bytes of one copy (codes and scales). */
  weightBytes: number;
  copies: number;
  /** uint8 [N, kBlocks, blockSize / 2] each: launch i reads copy i % copies. */
  codes: DeviceTensor[];
  /** [N, kBlocks] in the shape's dtype each. */
  scales: DeviceTensor[];
  dispose(): void;
}

/**
 * Copies of constant weights of `s` that together exceed 120 MB (twice an H100's or H200's L2), so launches
 * rotating over them read HBM, as a decode step does with the other layers' weights between.
 */
export function w4a16TimingWeights(device: Device, s: W4A16TuneShape): W4A16TimingWeights {
  const kBlocks = Math.ceil(s.K / s.blockSize);
  const codeBytes = (s.N * kBlocks * s.blockSize) / 2;
  const weightBytes = codeBytes + s.N * kBlocks * 2;
  const copies = Math.max(2, Math.ceil(120e6 / weightBytes));
  const codes: DeviceTensor[] = [];
  const scales: DeviceTensor[] = [];
  const dispose = () => {
    for (const t of [...codes, ...scales]) t.dispose();
  };
  try {
    for (let i = 0; i < copies; i++) {
      codes.push(device.upload({ data: new Uint8Array(codeBytes).fill(0x5a), dims: [s.N, kBlocks, s.blockSize / 2] }, 'uint8'));
      scales.push(device.upload({ data: halfBits(s.dtype, new Float32Array(s.N * kBlocks).fill(0.01)), dims: [s.N, kBlocks] }, s.dtype));
    }
  } catch (e) {
    dispose();
    throw e;
  }
  return { kBlocks, weightBytes, copies, codes, scales, dispose };
}

/** The 16-bit bits of `x` in `dtype` (bfloat16 or float16). */
function halfBits(dtype: DType, x: Float32Array): Uint16Array {
  return dtype === 'bfloat16' ? toBfloat16Bits(x) : toFloat16Bits(x);
}

/** Checks `opts` before any device work; returns the lists to try. */
export function w4a16TuneCandidates(opts: W4A16TuneOptions = {}): { rows: readonly number[]; rounds: readonly number[]; columnTiles: readonly (1 | 2)[]; iters: number; tiles: boolean } {
  const rows = opts.rows ?? DEFAULT_ROWS;
  const tiles = opts.tiles ?? false;
  const most = tiles ? 256 : 16;
  if (rows.length === 0 || rows.some((m) => !Number.isInteger(m) || m < 1 || m > most)) {
    throw new Error(`tuneW4A16: rows [${rows.join(', ')}] must be row counts 1–${most} (${tiles ? 'decode batches' : "the split-K kernels' decode range; up to 256 with tiles: true"})`);
  }
  const rounds = opts.rounds ?? DEFAULT_ROUNDS;
  if (rounds.length === 0 || rounds.some((r) => !Number.isInteger(r) || r < 1)) throw new Error(`tuneW4A16: rounds [${rounds.join(', ')}] must be integers ≥ 1`);
  const columnTiles = opts.columnTiles ?? [1, 2];
  if (columnTiles.length === 0 || columnTiles.some((c) => c !== 1 && c !== 2)) throw new Error(`tuneW4A16: columnTiles [${columnTiles.join(', ')}] must be 1 or 2`);
  const iters = opts.iters ?? 200;
  if (!Number.isInteger(iters) || iters < 1) throw new Error(`tuneW4A16: iters ${iters} must be an integer ≥ 1`);
  return { rows, rounds, columnTiles, iters, tiles };
}

/**
 * Times the split-K kernels on `device` (opened through `Kernels.withDevice`, the kernels `w4` was
 * compiled on) for each shape at each row count over column tiles × rounds — and with `tiles` every
 * tiled build the device runs — and returns the fastest per shape and rows with every timing, over
 * {@link w4a16TimingWeights}. Must run outside any graph capture; a few seconds for a model's projections.
 */
export function tuneW4A16(w4: W4A16, device: Device, shapes: readonly W4A16TuneShape[], opts: W4A16TuneOptions = {}): { table: W4A16PlanTable; timings: W4A16TuneTiming[] } {
  const { rows, rounds, columnTiles, iters, tiles } = w4a16TuneCandidates(opts);
  if (device.kind !== 'cuda') throw new Error(`tuneW4A16: the W4A16 kernels run on cuda, not ${device.kind}`);
  const kernels = w4.kernels;
  const entries: W4A16TuneEntry[] = [];
  const timings: W4A16TuneTiming[] = [];
  for (const s of shapes) {
    const kBlocks = Math.ceil(s.K / s.blockSize);
    const why = w4a16Unsupported({ M: 1, N: s.N, K: s.K, kBlocks, blockSize: s.blockSize, dtype: s.dtype });
    if (why) throw new Error(`tuneW4A16: shape ${s.name ?? `${s.N}×${s.K}`}: the kernels do not support ${why}`);
    const weights = w4a16TimingWeights(device, s);
    const { copies, codes: bs, scales: ss } = weights;
    const owned: DeviceTensor[] = [];
    try {
      for (const M of rows) {
        const a = device.upload({ data: halfBits(s.dtype, new Float32Array(M * s.K).fill(0.5)), dims: [M, s.K] }, s.dtype);
        owned.push(a);
        const c = device.upload({ data: new Uint16Array(M * s.N), dims: [M, s.N] }, s.dtype);
        owned.push(c);
        const shape: W4A16Shape = { M, N: s.N, K: s.K, kBlocks, blockSize: s.blockSize, dtype: s.dtype };
        const time = (o: W4A16LaunchOptions) => kernels.timeLaunches((i) => w4.matmul(shape, { a, b: bs[i % copies], scales: ss[i % copies], zeroPoints: 0n, c }, undefined, o), iters) * 1000;
        const defaultUs = time({});
        let top: W4A16TuneEntry | undefined;
        for (const nt of columnTiles) {
          const seen = new Set<number>();
          for (const r of rounds) {
            const plan = w4a16Plan(shape, nt, r);
            if (plan.nt !== nt || seen.has(plan.warps)) continue;
            seen.add(plan.warps);
            const us = time({ columnTiles: nt, rounds: r, tileFromRows: Infinity }); // the split-K kernels at any M
            timings.push({ ...s, M, columnTiles: nt, rounds: r, warps: plan.warps, ctas: plan.grid[0] * plan.grid[1], us });
            if (!top || us < top.us) top = { ...s, M, columnTiles: nt, rounds: r, warps: plan.warps, us, defaultUs };
          }
        }
        if (tiles) {
          for (const v of W4A16_TILE_VARIANTS) {
            const tile: W4A16Tile = { mt: v.mt, nt: v.nt, wm: v.wm, wn: v.wn, wk: v.wk, ck: v.ck };
            if (!w4.runsTile(tile)) continue;
            const { label, threads } = w4a16TileDims(tile);
            const plan = w4.tilePlan(shape, { tile });
            const us = time({ tile, tileFromRows: 1 });
            timings.push({ ...s, M, columnTiles: v.nt, rounds: 1, warps: threads / 32, ctas: plan.grid[0] * plan.grid[1] * plan.ck, us, tile: label });
            if (!top || us < top.us) top = { ...s, M, columnTiles: v.nt, rounds: 1, warps: threads / 32, tile, us, defaultUs };
          }
        }
        if (top) entries.push(top);
      }
    } finally {
      for (const t of owned) t.dispose();
      weights.dispose();
    }
  }
  return { table: new W4A16PlanTable(entries), timings };
}
