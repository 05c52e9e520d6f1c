/**
 * Lathe's W4A16 matmul on its kernel layer: `W4A16` compiles the kernels of w4a16-source.ts and
 * launches them on the kernels' stream; `w4a16Ops` puts them in a graph as a custom op that reads
 * ONNX Runtime's MatMulNBits inputs (4 bits: B [N, kBlocks, blockSize / 2], scales [N, kBlocks] in
 * A's dtype, optional uint8 zero points), so a generation graph can run its INT4 projections through
 * it in place of MatMulNBits. On the CPU the op computes the same product on the host (float32),
 * for tests of the wiring.
 */
import * as L from '@lathe/onnx';
import { type DType, type OpDef, type Tensor } from '@lathe/onnx';
import { type DeviceKind, type SessionOptions } from '@lathe/runtime';
import { type ArgValue } from './args';
import { opFamily, readBytes, readF32, writeHost, type CustomOpInput, type CustomOps } from './custom-op';
import { type Handle } from './driver';
import { cudaIncludeDir } from './flash-attention';
import { type Kernel, type Kernels } from './kernels';
import {
  W4A16_TILE_VARIANTS,
  W4A16_TILES,
  W4A16_TYPES,
  W4A16_VARIANTS,
  w4a16KernelName,
  w4a16MaxWarps,
  w4a16Smem,
  w4a16Source,
  w4a16TileDims,
  w4a16TileKernelName,
  w4a16TileSmem,
  type W4A16TileVariant,
} from './w4a16-source';
import { W4A16_WG_BUILDS, w4a16WgDims, w4a16WgKernelName, w4a16WgLabel, w4a16WgSmem, w4a16WgSource, type W4A16WgBuild } from './w4a16-wgmma-source';

/** One W4A16 product: C [M, N] = A [M, K] · dequant(B)ᵀ, B in MatMulNBits' 4-bit layout. */
export interface W4A16Shape {
  M: number;
  N: number;
  K: number;
  /** ceil(K / blockSize). */
  kBlocks: number;
  /** 32, 64 or 128. */
  blockSize: number;
  dtype: DType;
  /**
   * Widths of the outputs the N columns are written to, in order (1 to 3, summing to N; default [N]):
   * projections that share their input, their weights concatenated along N, in one launch.
   */
  widths?: readonly number[];
}

/** Block sizes the kernels take. */
export const W4A16_BLOCK_SIZES = [32, 64, 128] as const;

/** Why the kernels cannot run `shape` (the caller keeps MatMulNBits), or undefined. */
export function w4a16Unsupported(shape: W4A16Shape): string | undefined {
  const { M, N, K, kBlocks, blockSize, dtype } = shape;
  if (!(dtype in W4A16_TYPES)) return `dtype ${dtype} (the kernels take bfloat16 or float16)`;
  if (!(W4A16_BLOCK_SIZES as readonly number[]).includes(blockSize)) return `block size ${blockSize} (32, 64 or 128)`;
  if (K % 8 !== 0) return `K = ${K} is not a multiple of 8 (the activations are read 16 bytes at a time)`;
  if (kBlocks !== Math.ceil(K / blockSize)) return `${kBlocks} blocks of ${blockSize} for K = ${K} (expected ${Math.ceil(K / blockSize)})`;
  if (M < 0 || N < 1) return `an empty product [${M}, ${N}]`;
  const widths = shape.widths ?? [N];
  if (widths.length < 1 || widths.length > 3 || widths.some((w) => !Number.isInteger(w) || w < 1) || widths.reduce((a, b) => a + b, 0) !== N) return `output widths [${widths.join(', ')}] (1 to 3 positive widths summing to N = ${N})`;
  if (Math.ceil(M / 32) > 65535) return `M = ${M} past the grid's 65,535 tiles of 32 rows (the tiled kernels' smallest)`;
  if (M * Math.max(K, N) >= 2 ** 31 || N * kBlocks * blockSize >= 2 ** 32) return `a product too large for 32-bit indices [${M}, ${N}, ${K}]`;
  return undefined;
}

/** The launch of a shape: n8 tiles per CTA, warps (K split), grid and shared memory. */
export interface W4A16Plan {
  /** A-row n8 tiles per CTA (the kernel `w4a16_<t>_m<8·mt>`). */
  mt: (typeof W4A16_TILES)[number];
  /** Column tiles of 16 per warp (2: the `_n32` kernel). */
  nt: 1 | 2;
  warps: number;
  grid: [number, number];
  sharedBytes: number;
}

/**
 * How `shape` is launched: the fewest n8 tiles that hold M (at most 8: larger M runs CTAs over
 * slices of 64 rows, each streaming the weights, which then come from L2), and the warps that split
 * K's chunks of 128 in the fewest rounds (the fewest such warps: no idle ones). `columnTiles` 2 (M ≤ 16
 * only; larger M keeps 1): each warp owns 32 columns, the activations read once for both tiles.
 * `rounds`: chunks a warp takes (at least; more where the build's warps cannot split K that finely) —
 * fewer warps a CTA, so more CTAs resident at once, each warp's next chunk in flight while it multiplies.
 */
export function w4a16Plan(shape: Pick<W4A16Shape, 'M' | 'N' | 'kBlocks' | 'blockSize'>, columnTiles: 1 | 2 = 1, rounds?: number): W4A16Plan {
  const rows = Math.max(shape.M, 1);
  const mt = W4A16_TILES.find((t) => rows <= 8 * t) ?? 8;
  const nt = columnTiles === 2 && W4A16_VARIANTS.some((v) => v.mt === mt && v.nt === 2) ? 2 : 1;
  const chunks = Math.ceil((shape.kBlocks * shape.blockSize) / 128);
  const max = w4a16MaxWarps(mt, nt);
  if (rounds !== undefined && !(Number.isInteger(rounds) && rounds >= 1)) throw new Error(`w4a16Plan: rounds must be an integer ≥ 1, got ${rounds}`);
  const fewest = Math.ceil(chunks / Math.min(max, chunks));
  const warps = Math.ceil(chunks / Math.max(fewest, Math.min(rounds ?? 1, chunks)));
  return { mt, nt, warps, grid: [Math.ceil(shape.N / (16 * nt)), Math.ceil(rows / (8 * mt))], sharedBytes: w4a16Smem(warps, mt, nt) };
}

/**
 * Rows from which {@link W4A16.matmul} takes the tiled kernels by default: past 16 rows the split-K kernels
 * (16 columns a CTA) re-read the activations once per 16 columns, the tiled ones once per 32–128.
 */
export const W4A16_TILE_FROM_ROWS = 17;

/** SMs a tiled launch is sized for when the caller does not say (an H100 or H200 SXM). */
export const W4A16_DEFAULT_SMS = 132;

/**
 * A tiled kernel's build (see `W4A16_TILE_VARIANTS`): warps of 8·mt rows × 16·nt columns, wm × wn × wk of them
 * (default 2 × 2 × 1: the original tiles 64 × 64, 32 × 64 and 32 × 32).
 */
export interface W4A16Tile {
  mt: 2 | 4 | 8;
  nt: 1 | 2;
  wm?: 1 | 2;
  wn?: 2 | 4 | 8;
  wk?: 1 | 2 | 4;
  /** CTAs of a cluster splitting K (default 1). */
  ck?: 1 | 2 | 4;
}

/** The launch of a shape on a tiled kernel. */
export interface W4A16TilePlan {
  mt: W4A16Tile['mt'];
  nt: W4A16Tile['nt'];
  wm: NonNullable<W4A16Tile['wm']>;
  wn: NonNullable<W4A16Tile['wn']>;
  wk: NonNullable<W4A16Tile['wk']>;
  /** CTAs of a cluster over each tile, K split between them: the launch's grid z. */
  ck: NonNullable<W4A16Tile['ck']>;
  bm: number;
  bn: number;
  /** The build's label (`w4a16TileDims`), e.g. `64x128w8k2`. */
  label: string;
  grid: [number, number];
  threads: number;
  sharedBytes: number;
}

/** The build `tile` names (its warp layout defaulting to 2 × 2 × 1), or undefined. */
export function w4a16TileBuild(tile: W4A16Tile): W4A16TileVariant | undefined {
  return W4A16_TILE_VARIANTS.find((x) => x.mt === tile.mt && x.nt === tile.nt && x.wm === (tile.wm ?? 2) && x.wn === (tile.wn ?? 2) && x.wk === (tile.wk ?? 1) && x.ck === (tile.ck ?? 1));
}

/**
 * A build's measured cost on an H200 (132 SMs): `ctaUs` a CTA's fixed time (prologue, cross-warp and cluster sums,
 * stores), `stepUs` its time a step of K (wk·ck chunks of 128 split between its warp groups and cluster), and
 * `overlap` the share of that time each of several CTAs resident on one SM adds (1: one CTA an SM, by shared memory).
 */
interface TileCost {
  ctaUs: number;
  stepUs: number;
  overlap: number;
}

/** Each build's {@link TileCost} by label, fitted to quant-bench's kernel_tiles rows of Qwen3-0.6B's projections on an H200 (checked against Qwen3-1.7B's). */
const TILE_COSTS: Readonly<Record<string, TileCost>> = {
  '64x64': { ctaUs: 3.77, stepUs: 0.885, overlap: 0.69 },
  '32x64': { ctaUs: 0.93, stepUs: 0.843, overlap: 0.69 },
  '32x32': { ctaUs: 2.09, stepUs: 0.57, overlap: 0.42 },
  '64x256w8': { ctaUs: 4.35, stepUs: 1.889, overlap: 1 },
  '128x128w8': { ctaUs: 4.71, stepUs: 1.963, overlap: 1 },
  '64x128w8k2': { ctaUs: 4.04, stepUs: 2.39, overlap: 1 },
  '32x128w8k2': { ctaUs: 3.14, stepUs: 1.614, overlap: 0.75 },
  '32x64w8k4': { ctaUs: 2.18, stepUs: 2.212, overlap: 1 },
  '64x64w8k4': { ctaUs: 4.22, stepUs: 2.716, overlap: 1 },
  '64x256w8c2': { ctaUs: 5.99, stepUs: 2.099, overlap: 1 },
  '64x256w8c4': { ctaUs: 6.08, stepUs: 2.215, overlap: 1 },
  '64x128w8k2c2': { ctaUs: 5.23, stepUs: 2.389, overlap: 1 },
};

/**
 * CTAs of clusters of `ck` resident at once over `sms` SMs: the GPCs' uneven sizes leave SMs no cluster of 4 can
 * use (30 clusters of 4 on 132 SMs, not 33).
 */
function clusterSlots(ck: number, sms: number): number {
  if (ck <= 1) return sms;
  return ck === 2 ? 2 * Math.floor(sms / 2) : ck * Math.floor((10 * sms) / (11 * ck));
}

/**
 * A tiled build's estimated time on `shape` (µs on an H200; for comparing builds): each SM's CTAs (waves of the
 * CTAs over `sms` SMs, or over the cluster slots `clusterSlots`) times a CTA's fixed time plus its steps
 * of K, co-resident CTAs adding `overlap` of a CTA's time each.
 */
export function w4a16TileEstimate(shape: Pick<W4A16Shape, 'M' | 'N' | 'K'>, v: W4A16Tile, sms = W4A16_DEFAULT_SMS): number {
  const rows = Math.max(shape.M, 1);
  const { bm, bn, label } = w4a16TileDims(v);
  const cost = TILE_COSTS[label];
  if (!cost) throw new Error(`W4A16 has no cost for tiled build ${label}`);
  const ck = v.ck ?? 1, wk = v.wk ?? 1;
  const ctas = Math.ceil(shape.N / bn) * Math.ceil(rows / bm) * ck;
  const waves = Math.ceil(ctas / clusterSlots(ck, sms));
  const load = cost.overlap < 1 ? Math.max(1, cost.overlap * waves) : waves;
  return load * (cost.ctaUs + Math.ceil(shape.K / 128 / wk / ck) * cost.stepUs);
}

/**
 * Dynamic shared memory a CTA may opt into on a device of compute capability `arch` (90 for 9.0): 227 KB on
 * sm_90 and sm_100, 163 KB on sm_80 and sm_87, 99 KB elsewhere (sm_86, sm_89, sm_120).
 */
export function w4a16MaxSharedBytes(arch: number): number {
  if (arch === 90 || arch === 100 || arch === 103) return 227 * 1024;
  if (arch === 80 || arch === 87) return 163 * 1024;
  return 99 * 1024;
}

/** Why a device of compute capability `arch` cannot run tiled build `v` (its shared memory, or clusters before sm_90), or undefined. */
export function w4a16TileUnavailable(v: W4A16Tile, arch: number): string | undefined {
  const { label } = w4a16TileDims(v);
  if (w4a16TileSmem(v) > w4a16MaxSharedBytes(arch)) return `tiled build ${label} needs ${w4a16TileSmem(v)} bytes of shared memory, past the ${w4a16MaxSharedBytes(arch)} of sm_${arch}`;
  if ((v.ck ?? 1) > 1 && arch < 90) return `tiled build ${label} runs as thread-block clusters (sm_90 on), not on sm_${arch}`;
  return undefined;
}

/**
 * The tiled launch of `shape` on a device of compute capability `arch` (default 90: an H100 or H200): `tile` if
 * given, else the build marked `auto` of least {@link w4a16TileEstimate} among those the device runs (none: the
 * least of any build it runs).
 */
export function w4a16TilePlan(shape: Pick<W4A16Shape, 'M' | 'N' | 'K'>, opts: { tile?: W4A16Tile; sms?: number; arch?: number } = {}): W4A16TilePlan {
  const arch = opts.arch ?? 90;
  const rows = Math.max(shape.M, 1);
  const grid = (v: W4A16TileVariant): [number, number] => [Math.ceil(shape.N / w4a16TileDims(v).bn), Math.ceil(rows / w4a16TileDims(v).bm)];
  let v: W4A16TileVariant | undefined;
  if (opts.tile) {
    v = w4a16TileBuild(opts.tile);
    if (!v) {
      const { label } = w4a16TileDims(opts.tile);
      throw new Error(`W4A16 has no tiled build ${label} (builds: ${W4A16_TILE_VARIANTS.map((x) => w4a16TileDims(x).label).join(', ')})`);
    }
    const why = w4a16TileUnavailable(v, arch);
    if (why) throw new Error(`W4A16: ${why}`);
  } else {
    const sms = opts.sms ?? W4A16_DEFAULT_SMS;
    const fits = W4A16_TILE_VARIANTS.filter((c) => !w4a16TileUnavailable(c, arch));
    const auto = fits.filter((c) => c.auto);
    let best = Infinity;
    for (const x of auto.length > 0 ? auto : fits) {
      const t = w4a16TileEstimate(shape, x, sms);
      if (t < best) [v, best] = [x, t];
    }
    if (!v) throw new Error(`W4A16 has no tiled build for sm_${arch}`);
  }
  const { bm, bn, threads, label } = w4a16TileDims(v);
  return { mt: v.mt, nt: v.nt, wm: v.wm, wn: v.wn, wk: v.wk, ck: v.ck, bm, bn, label, grid: grid(v), threads, sharedBytes: w4a16TileSmem(v) };
}

/**
 * Up to 8 rows, {@link w4a16DefaultChoice} trades warps a CTA for rounds only where the fewest-rounds plan asks more than
 * `over` warps a SM, and then keeps at least `keep` a SM.
 */
export const W4A16_ROUNDS_WARPS_PER_SM = { over: 48, keep: 16 } as const;

/**
 * The split-K plan of a launch whose options name none (no `plan`, `columnTiles` or `rounds`): past 8
 * rows, products of at least 4,096 columns take two column tiles (each activation read once per 32
 * columns, not 16) and from 8,192 columns four chunks a warp as well (more, smaller CTAs resident) —
 * the fastest plans `tuneW4A16` found for fused q/k/v and gate/up at 16 rows (docs/benchmarks.md).
 * Up to 8 rows, one column tile; where the fewest-rounds plan would ask more warps of each of `sms` SMs than
 * {@link W4A16_ROUNDS_WARPS_PER_SM}'s `over` (CTAs queued for later waves: Qwen3-8B's projections), about eight chunks a
 * warp instead (at least 4 warps a CTA, and `keep` warps a SM), so a warp's next chunk is in flight while it
 * multiplies; elsewhere the fewest rounds (docs/benchmarks.md).
 */
export function w4a16DefaultChoice(shape: Pick<W4A16Shape, 'M' | 'N' | 'kBlocks' | 'blockSize'>, sms = W4A16_DEFAULT_SMS): W4A16SplitChoice {
  if (shape.M <= 8) {
    const chunks = Math.ceil((shape.kBlocks * shape.blockSize) / 128);
    const ctas = Math.ceil(shape.N / 16);
    const fewest = Math.min(chunks, w4a16MaxWarps(W4A16_TILES.find((t) => Math.max(shape.M, 1) <= 8 * t)!));
    if (ctas * fewest <= W4A16_ROUNDS_WARPS_PER_SM.over * sms) return { columnTiles: 1 };
    const warps = Math.min(fewest, Math.max(4, Math.ceil(chunks / 8), Math.ceil((W4A16_ROUNDS_WARPS_PER_SM.keep * sms) / ctas)));
    return { columnTiles: 1, rounds: Math.ceil(chunks / warps) };
  }
  if (shape.N < 4096) return { columnTiles: 1 };
  return shape.N >= 8192 ? { columnTiles: 2, rounds: 4 } : { columnTiles: 2 };
}

/** A launch's choice for one shape: a split-K plan (see {@link w4a16Plan}), or with `tile` a tiled build instead. */
export interface W4A16SplitChoice {
  columnTiles?: 1 | 2;
  rounds?: number;
  /** Run the tiled build `tile` (at any M), not the split-K kernels. */
  tile?: W4A16Tile;
}

/** How {@link W4A16.matmul} picks its kernel. */
export interface W4A16LaunchOptions {
  /** Column tiles of the split-K kernels (see {@link w4a16Plan}; with `rounds` absent too, {@link w4a16DefaultChoice} decides). */
  columnTiles?: 1 | 2;
  /** Chunks of K a warp of the split-K kernels takes (see {@link w4a16Plan}; default the fewest, or {@link w4a16DefaultChoice}'s). */
  rounds?: number;
  /**
   * A choice per shape (e.g. a table measured on the device) over the other options: a split-K plan — taken at
   * any M, `tileFromRows` aside — or a tiled build; undefined keeps the options.
   */
  plan?: (shape: W4A16Shape) => W4A16SplitChoice | undefined;
  /** Rows from which the tiled kernels run (default {@link W4A16_TILE_FROM_ROWS}; Infinity: never). */
  tileFromRows?: number;
  /** The tiled kernels' tile (default: {@link w4a16TilePlan}'s choice). */
  tile?: W4A16Tile;
  /** SMs the tiled plan is estimated for and the split-K default plan sized for (default: the device's). */
  sms?: number;
  /** Rows from which the wgmma kernels run (sm_90 only; default Infinity: never, until a device A/B makes them a default). */
  wgmmaFromRows?: number;
  /** The wgmma build (default {@link w4a16WgChoice}'s); with `wgmmaFromRows` absent, it runs at every M. */
  wgmma?: W4A16WgBuild;
}

/** The share of the SMs a wgmma grid must give a CTA for its tile to be chosen over a smaller one. */
export const W4A16_WG_FILL = 0.7;

/**
 * The wgmma build for `shape` over `sms` SMs: the largest tile (256 rows from 512 rows, then 128 rows before 64, two
 * warpgroups before one: fewer reads of the activations and weights from L2, and each dequantized weight fragment
 * feeding more MMAs) whose grid gives at least {@link W4A16_WG_FILL} of the SMs a CTA — one wave at that share
 * still beats twice the CTAs of half the tile — else the one with the most CTAs (64 rows × 64 columns); never 128
 * rows a CTA for 64 rows or fewer. 256 rows × 64 columns is never chosen (as slow as 64 × 128 where it fills the SMs).
 */
export function w4a16WgChoice(shape: Pick<W4A16Shape, 'M' | 'N'>, sms = W4A16_DEFAULT_SMS): W4A16WgBuild {
  const order: W4A16WgBuild[] = [{ bm: 256, wg: 2 }, { bm: 128, wg: 2 }, { bm: 128, wg: 1 }, { bm: 64, wg: 2 }, { bm: 64, wg: 1 }];
  const ctas = (v: W4A16WgBuild) => Math.ceil(shape.N / (64 * v.wg)) * Math.ceil(shape.M / v.bm);
  const fits = order.filter((v) => (v.bm === 256 ? shape.M >= 512 : shape.M > 64 || v.bm === 64));
  return fits.find((v) => ctas(v) >= W4A16_WG_FILL * sms) ?? fits[fits.length - 1];
}

type Ptr = ArgValue<'ptr'>;
type Sig = readonly ['ptr', 'ptr', 'ptr', 'ptr', 'ptr', 'ptr', 'ptr', 'i32', 'i32', 'i32', 'i32', 'i32', 'i32', 'i32'];
const SIG: Sig = ['ptr', 'ptr', 'ptr', 'ptr', 'ptr', 'ptr', 'ptr', 'i32', 'i32', 'i32', 'i32', 'i32', 'i32', 'i32'];

/** Addresses (or device tensors) of one call. */
export interface W4A16Args {
  /** [M, K] in the shape's dtype. */
  a: Ptr;
  /** uint8 [N, kBlocks, blockSize / 2]. */
  b: Ptr;
  /** [N, kBlocks] in the shape's dtype. */
  scales: Ptr;
  /** uint8 [N, ceil(kBlocks / 2)], or 0n for the default zero point 8. */
  zeroPoints: Ptr;
  /** [M, N], written; or one output [M, widths[i]] per width of the shape. */
  c: Ptr | readonly Ptr[];
}

/** The compiled W4A16 kernels of one device. */
export class W4A16 {
  private constructor(
    readonly kernels: Kernels,
    private readonly variants: Map<string, Kernel<Sig>>,
    private readonly tiles: Map<string, Kernel<Sig>>,
    private readonly wgmma: Map<string, Kernel<Sig>>,
    /** Why there are no wgmma kernels (not asked for, not sm_90, or NVRTC could not build sm_90a), or undefined. */
    readonly wgmmaUnavailable: string | undefined,
  ) {}

  /**
   * Compiles (or loads from the cache) every variant — bf16/fp16 × M ≤ 8/16/32/64 (and 32 columns a warp for M ≤ 16), and
   * every tiled build the device's shared memory holds — with the CUDA headers of `includeDir`; with `wgmma` the wgmma
   * builds too (sm_90 only: a module of their own, so a caller that never launches them does not compile them).
   */
  static compile(kernels: Kernels, opts: { includeDir?: string; wgmma?: boolean } = {}): W4A16 {
    const include = opts.includeDir ?? cudaIncludeDir();
    const mod = kernels.compile(w4a16Source, { name: 'lathe_w4a16', options: [`-I${include}`, '--std=c++17'] });
    const variants = new Map<string, Kernel<Sig>>();
    for (const dtype of Object.keys(W4A16_TYPES) as (keyof typeof W4A16_TYPES)[]) {
      for (const v of W4A16_VARIANTS) variants.set(`${dtype}/${v.mt}/${v.nt}`, mod.kernel(w4a16KernelName(dtype, v.mt, v.nt), SIG));
    }
    const tiles = new Map<string, Kernel<Sig>>();
    for (const dtype of Object.keys(W4A16_TYPES) as (keyof typeof W4A16_TYPES)[]) {
      for (const v of W4A16_TILE_VARIANTS.filter((x) => !w4a16TileUnavailable(x, kernels.arch))) {
        const k = mod.kernel(w4a16TileKernelName(dtype, v), SIG);
        // past 48 KB of dynamic shared memory a kernel must opt in
        kernels.driver.setMaxDynamicSharedBytes(k.handle, w4a16TileSmem(v));
        tiles.set(`${dtype}/${w4a16TileDims(v).label}`, k);
      }
    }
    // the wgmma builds need sm_90a (architecture-specific instructions): a module of their own, for H100/H200 only
    const wgmma = new Map<string, Kernel<Sig>>();
    let wgmmaUnavailable: string | undefined;
    if (!opts.wgmma) wgmmaUnavailable = "the wgmma kernels were not compiled (W4A16.compile's `wgmma` option)";
    else if (kernels.arch !== 90) wgmmaUnavailable = `wgmma is sm_90's (this device is sm_${kernels.arch})`;
    else {
      try {
        const wm = kernels.compile(w4a16WgSource, { name: 'lathe_w4a16_wgmma', options: [`-I${include}`, '--std=c++17'], target: 'sm_90a' });
        for (const dtype of Object.keys(W4A16_TYPES) as (keyof typeof W4A16_TYPES)[]) {
          for (const v of W4A16_WG_BUILDS) {
            const k = wm.kernel(w4a16WgKernelName(dtype, v), SIG);
            kernels.driver.setMaxDynamicSharedBytes(k.handle, w4a16WgSmem(v));
            wgmma.set(`${dtype}/${w4a16WgLabel(v)}`, k);
          }
        }
      } catch (e) {
        wgmmaUnavailable = `the wgmma kernels did not build for sm_90a: ${(e as Error).message}`;
      }
    }
    return new W4A16(kernels, variants, tiles, wgmma, wgmmaUnavailable);
  }

  /** Whether this device runs tiled build `v` (its shared memory holds it; clusters from sm_90): builds it cannot are not loaded. */
  runsTile(v: W4A16Tile): boolean {
    return !w4a16TileUnavailable(v, this.kernels.arch);
  }

  /** {@link w4a16TileEstimate} of build `v` on `shape` over this device's SMs (µs as on an H200; for comparing builds). */
  tileEstimate(shape: Pick<W4A16Shape, 'M' | 'N' | 'K'>, v: W4A16Tile): number {
    return w4a16TileEstimate(shape, v, this.kernels.smCount);
  }

  /** The tiled launch {@link matmul} makes of `shape` with `opts`: {@link w4a16TilePlan} for this device's arch and SMs. */
  tilePlan(shape: Pick<W4A16Shape, 'M' | 'N' | 'K'>, opts: Pick<W4A16LaunchOptions, 'tile' | 'sms'> = {}): W4A16TilePlan {
    return w4a16TilePlan(shape, { tile: opts.tile, sms: opts.sms ?? this.kernels.smCount, arch: this.kernels.arch });
  }

  /**
   * Queues C = A · dequant(B)ᵀ on `stream` (default: the kernels' stream); nothing for M = 0. M below
   * `tileFromRows` runs the split-K kernels ({@link w4a16Plan}, with `columnTiles`), larger M the tiled ones
   * ({@link w4a16TilePlan}); from `wgmmaFromRows` rows, or with `wgmma`, the wgmma kernels (sm_90; throws with
   * {@link wgmmaUnavailable} elsewhere). `opts` as a number is the column tiles (the older signature).
   */
  matmul(shape: W4A16Shape, a: W4A16Args, stream?: Handle, opts: W4A16LaunchOptions | 1 | 2 = {}): void {
    const o: W4A16LaunchOptions = typeof opts === 'number' ? { columnTiles: opts } : opts;
    const why = w4a16Unsupported(shape);
    if (why) throw new Error(`W4A16 kernels do not support ${why}`);
    if (shape.M === 0) return;
    const widths = shape.widths ?? [shape.N];
    const c = Array.isArray(a.c) ? (a.c as readonly Ptr[]) : [a.c as Ptr];
    if (c.length !== widths.length) throw new Error(`W4A16.matmul: ${c.length} outputs for ${widths.length} widths`);
    const n1 = widths[0];
    const n2 = n1 + (widths[1] ?? 0);
    const args = [a.a, a.b, a.scales, a.zeroPoints, c[0], c[1] ?? 0n, c[2] ?? 0n, shape.M, shape.N, n1, n2, shape.K, shape.kBlocks, Math.log2(shape.blockSize)] as const;
    if (o.wgmma || shape.M >= (o.wgmmaFromRows ?? Infinity)) {
      if (this.wgmmaUnavailable) throw new Error(`W4A16.matmul: ${this.wgmmaUnavailable}`);
      const v = o.wgmma ?? w4a16WgChoice(shape, o.sms ?? this.kernels.smCount);
      const { bm, bn, threads } = w4a16WgDims(v);
      this.wgmma.get(`${shape.dtype}/${w4a16WgLabel(v)}`)!.launch({ grid: [Math.ceil(shape.N / bn), Math.ceil(shape.M / bm), 1], block: threads, sharedBytes: w4a16WgSmem(v), stream }, ...args);
      return;
    }
    const planned = o.plan?.(shape);
    if (planned?.tile || (!planned && shape.M >= (o.tileFromRows ?? W4A16_TILE_FROM_ROWS))) {
      const plan = this.tilePlan(shape, { ...o, tile: planned?.tile ?? o.tile });
      this.tiles.get(`${shape.dtype}/${plan.label}`)!.launch({ grid: [plan.grid[0], plan.grid[1], plan.ck], block: plan.threads, sharedBytes: plan.sharedBytes, stream }, ...args);
      return;
    }
    const choice = planned ?? (o.columnTiles === undefined && o.rounds === undefined ? w4a16DefaultChoice(shape, o.sms ?? this.kernels.smCount) : undefined);
    const plan = w4a16Plan(shape, choice?.columnTiles ?? o.columnTiles ?? 1, choice?.rounds ?? o.rounds);
    this.variants.get(`${shape.dtype}/${plan.mt}/${plan.nt}`)!.launch({ grid: plan.grid, block: 32 * plan.warps, sharedBytes: plan.sharedBytes, stream }, ...args);
  }
}

/** A value rounded to `dtype` (bfloat16: to nearest even, as the kernels' conversions; float16 through Math.f16round where present). */
export function roundToDtype(dtype: DType, x: number): number {
  if (dtype === 'float32') return Math.fround(x);
  if (dtype === 'bfloat16') {
    const f = new Float32Array([x]);
    const u = new Uint32Array(f.buffer);
    if ((u[0] & 0x7f800000) !== 0x7f800000) u[0] = ((u[0] + 0x7fff + ((u[0] >>> 16) & 1)) >>> 16) << 16;
    return f[0];
  }
  if (dtype === 'float16') return f16round(x);
  throw new Error(`roundToDtype: ${dtype} is not a float type`);
}

function f16round(x: number): number {
  const native = (Math as unknown as { f16round?: (v: number) => number }).f16round;
  if (native) return native(x);
  if (!Number.isFinite(x) || x === 0) return x;
  const a = Math.abs(x);
  if (a >= 65520) return Math.sign(x) * Infinity;
  const e = Math.max(Math.floor(Math.log2(a)), -14);
  const ulp = 2 ** (e - 10);
  const q = a / ulp;
  let r = Math.round(q);
  if (Math.abs(q - Math.trunc(q) - 0.5) < 1e-12 && r % 2 === 1) r -= 1; // ties to even
  return Math.sign(x) * r * ulp;
}

/**
 * The kernels' product on the host: weights dequantized as MatMulNBits does — (q − zp) · scale
 * rounded to `shape.dtype` (q the 4-bit code, zp the block's zero point or 8) — and the sum over K
 * in float64. `a` and `scales` hold values already in the dtype; padding past K is skipped.
 */
export function w4a16Reference(shape: W4A16Shape, x: { a: ArrayLike<number>; b: Uint8Array; scales: ArrayLike<number>; zeroPoints?: Uint8Array }): Float64Array {
  const { M, N, K, kBlocks, blockSize, dtype } = shape;
  const zcols = Math.ceil(kBlocks / 2);
  const rowBytes = (kBlocks * blockSize) / 2;
  const w = new Float64Array(K);
  const c = new Float64Array(M * N);
  for (let n = 0; n < N; n++) {
    for (let k = 0; k < K; k++) {
      const byte = x.b[n * rowBytes + (k >> 1)];
      const q = k & 1 ? byte >> 4 : byte & 15;
      const blk = Math.floor(k / blockSize);
      const zp = x.zeroPoints ? (x.zeroPoints[n * zcols + (blk >> 1)] >> ((blk & 1) * 4)) & 15 : 8;
      w[k] = roundToDtype(dtype, (q - zp) * x.scales[n * kBlocks + blk]);
    }
    for (let m = 0; m < M; m++) {
      let acc = 0;
      for (let k = 0; k < K; k++) acc += x.a[m * K + k] * w[k];
      c[m * N + n] = acc;
    }
  }
  return c;
}

/**
 * The ops' CPU compute: {@link w4a16Reference} of host tensors (float32 activations and scales), each width's
 * columns written to its output; nothing for M = 0.
 */
export function w4a16HostProduct(shape: W4A16Shape, x: { a: CustomOpInput; b: CustomOpInput; scales: CustomOpInput; zeroPoints?: CustomOpInput }, c: readonly bigint[]): void {
  if (shape.M === 0) return;
  const size = (dims: readonly number[]) => dims.reduce((p, d) => p * d, 1);
  const r = w4a16Reference(shape, {
    a: readF32(x.a.data, size(x.a.dims)),
    b: readBytes(x.b.data, size(x.b.dims)),
    scales: readF32(x.scales.data, size(x.scales.dims)),
    zeroPoints: x.zeroPoints ? readBytes(x.zeroPoints.data, size(x.zeroPoints.dims)) : undefined,
  });
  let start = 0;
  (shape.widths ?? [shape.N]).forEach((w, i) => {
    const part = new Float32Array(shape.M * w);
    for (let m = 0; m < shape.M; m++) for (let n = 0; n < w; n++) part[m * w + n] = r[m * shape.N + start + n];
    writeHost(c[i], part);
    start += w;
  });
}

/** MatMulNBits' attributes as the graph side reads them. */
export interface W4A16Attrs {
  K: number;
  N: number;
  bits: number;
  blockSize: number;
}

/** The graph side of the kernels: W4A16 nodes, and the domain to pass to the session. */
export interface W4A16Ops extends CustomOps {
  /** Session options that register the domain (to spread into the session's). */
  session: Pick<SessionOptions, 'customOpDomains'>;
  /**
   * x [..., K] · dequant(B)ᵀ → [..., N] through the kernels, from MatMulNBits' inputs (scales in x's
   * dtype). Throws for what the kernels cannot take: check {@link unsupported} first.
   */
  matmul(x: Tensor, b: Tensor, scales: Tensor, zeroPoints: Tensor | undefined, attrs: W4A16Attrs): Tensor;
  /**
   * The same product written as 2 or 3 outputs [..., widths[i]] (consecutive column ranges of N): one
   * launch for projections that share x (q/k/v, gate/up) with their weights concatenated along N.
   */
  matmulSplit(x: Tensor, b: Tensor, scales: Tensor, zeroPoints: Tensor | undefined, attrs: W4A16Attrs, widths: readonly number[]): Tensor[];
  /** Why a projection cannot take the kernels with activations in `dtype` (bits, dtype, block size, K), or undefined. */
  unsupported(attrs: W4A16Attrs, dtype: DType): string | undefined;
}

/**
 * The W4A16 product as custom ops of a new domain, for graphs run on `provider`: on CUDA their
 * computes launch `kernels` (compiled on the kernels whose stream the device's sessions run on:
 * `Kernels.withDevice`), on the CPU they compute {@link w4a16Reference} on the host (float32).
 * Nodes `W4A16MatMul_<dtype>` (A, B, scales) and `W4A16MatMulZp_<dtype>` (A, B, scales, zero points) → C.
 * `opts` pick the kernels of each launch (see {@link W4A16.matmul}): `columnTiles` 2, launches of at most 16
 * rows use the kernels with 32 columns a warp (see {@link w4a16Plan}); from `tileFromRows` rows (default 17)
 * the tiled kernels ({@link w4a16TilePlan}).
 */
export function w4a16Ops(provider: DeviceKind, kernels?: W4A16, opts: W4A16LaunchOptions = {}): W4A16Ops {
  if (provider === 'cuda' && !kernels) throw new Error('w4a16Ops: CUDA needs the compiled W4A16 kernels (W4A16.compile on the kernels of the device)');
  const family = opFamily({ name: 'w4a16Ops', domainPrefix: 'lathe.w4a16_', provider, cudaDtypes: ['bfloat16', 'float16'] });
  const size = (dims: readonly number[]) => dims.reduce((p, d) => p * d, 1);
  // One op per dtype, zero points or not, and output widths (registered when first asked for: before the session is made).
  const opFor = (dt: DType, zp: boolean, widths: readonly number[] | undefined): OpDef<object> => {
    const name = `W4A16MatMul${zp ? 'Zp' : ''}_${dt}${widths ? `_w${widths.join('_')}` : ''}`;
    return family.op(name, () =>
      family.domain.add({
        name,
        inputs: zp ? [dt, 'uint8', dt, 'uint8'] : [dt, 'uint8', dt],
        outputs: (widths ?? [0]).map(() => dt),
        provider,
        infer: ([a, b]) => (widths ?? [b.shape[0]]).map((w) => ({ dtype: dt, shape: [...a.shape.slice(0, -1), w] })),
        compute: (ctx) => {
          const [a, b, s, z] = ctx.inputs;
          const [N, kBlocks, half] = b.dims;
          const K = a.dims[a.dims.length - 1];
          const lead = a.dims.slice(0, -1);
          const ws = widths ?? [N];
          const shape: W4A16Shape = { M: size(lead), N, K, kBlocks, blockSize: 2 * half, dtype: dt, widths: ws };
          const c = ws.map((w, i) => ctx.output(i, [...lead, w]));
          if (kernels) {
            kernels.matmul(shape, { a: a.data, b: b.data, scales: s.data, zeroPoints: z ? z.data : 0n, c }, undefined, opts);
            return;
          }
          w4a16HostProduct(shape, { a, b, scales: s, zeroPoints: z }, c);
        },
      }),
    );
  };
  const unsupported = (attrs: W4A16Attrs, dtype: DType): string | undefined => {
    if (attrs.bits !== 4) return `${attrs.bits} bits (the kernels take 4)`;
    if (!family.dtypes.includes(dtype)) return `dtype ${dtype} on ${provider} (takes ${family.dtypes.join(', ')})`;
    const shape: W4A16Shape = { M: 1, N: attrs.N, K: attrs.K, kBlocks: Math.ceil(attrs.K / attrs.blockSize), blockSize: attrs.blockSize, dtype: provider === 'cuda' ? dtype : 'bfloat16' };
    return w4a16Unsupported(shape);
  };
  const apply = (x: Tensor, b: Tensor, scales: Tensor, zeroPoints: Tensor | undefined, attrs: W4A16Attrs, widths: readonly number[] | undefined): Tensor[] => {
    const why = unsupported(attrs, x.dtype);
    if (why) throw new Error(`w4a16Ops.matmul: the kernels do not take ${why}`);
    if (scales.dtype !== x.dtype) throw new Error(`w4a16Ops.matmul: scales must be ${x.dtype} (the activations' dtype), got ${scales.dtype}`);
    const kb = Math.ceil(attrs.K / attrs.blockSize);
    if (b.dtype !== 'uint8' || b.shape.join(',') !== [attrs.N, kb, attrs.blockSize / 2].join(',')) throw new Error(`w4a16Ops.matmul: B must be uint8[${attrs.N}, ${kb}, ${attrs.blockSize / 2}], got ${b.dtype}[${b.shape.join(', ')}]`);
    if (x.shape[x.shape.length - 1] !== attrs.K) throw new Error(`w4a16Ops.matmul: x's last dim must be K = ${attrs.K}, got [${x.shape.join(', ')}]`);
    if (widths && (widths.length < 2 || widths.length > 3 || widths.some((w) => !Number.isInteger(w) || w < 1) || widths.reduce((p, w) => p + w, 0) !== attrs.N)) throw new Error(`w4a16Ops.matmulSplit: widths [${widths.join(', ')}] must be 2 or 3 positive widths summing to N = ${attrs.N}`);
    const s = scales.shape.length === 2 ? scales : L.reshape(scales, [attrs.N, kb]);
    return L.applyOp(opFor(x.dtype, !!zeroPoints, widths), zeroPoints ? [x, b, s, zeroPoints] : [x, b, s], {});
  };
  return {
    domain: family.domain,
    session: { customOpDomains: [family.domain.handle] },
    matmul: (x, b, scales, zeroPoints, attrs) => apply(x, b, scales, zeroPoints, attrs, undefined)[0],
    matmulSplit: (x, b, scales, zeroPoints, attrs, widths) => apply(x, b, scales, zeroPoints, attrs, widths),
    unsupported,
    check: family.check,
    dispose: family.dispose,
  };
}
