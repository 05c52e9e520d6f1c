/**
 * Lathe's W4A16 CUDA source run on the CPU (test/emulation/emu.h and test/w4a16-emulation/w4-emu.h
 * stand in for the CUDA subset it uses: a std::thread per CUDA thread, mma.sync's fragment layouts,
 * prmt's byte selection, half-precision rounding) against `w4a16Reference` (MatMulNBits'
 * dequantization, float64 sums): the operand permutation, nibble order, block scales and zero points,
 * ragged N, K padded to whole blocks, every n8-tile count, M past 64 rows (several grid rows), and the
 * cross-warp split of K — with the launch `w4a16Plan` gives; and the tiled kernels for more rows (cp.async
 * stages in shared memory, the activations' swizzle, tiles ragged in M and N, K padded, the stage ring
 * wrapped several times, 2 and 3 outputs; every build — the 2 × 2-warp tiles and the 8-warp ones, K split over
 * warp groups summed in shared memory and over a cluster's CTAs summed over distributed shared memory (the
 * cluster's CTAs run at once, w4-emu.h), each dtype on several) with the launch `w4a16TilePlan` gives. Needs g++ (C++20); the device check
 * (tools/bench/quantization/quant-bench.ts, `--weights kernel`) tests the real build.
 */
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { W4A16_TILE_VARIANTS, W4A16_TYPES, W4A16_WG_BUILDS, roundToDtype, w4a16Plan, w4a16Reference, w4a16Source, w4a16TileKernelName, w4a16TilePlan, w4a16WgDims, w4a16WgKernelName, w4a16WgKernels, w4a16WgSmem, type W4A16Shape, type W4A16Tile, type W4A16WgBuild } from '@lathe/kernels';
import { fromBfloat16Bits, fromFloat16Bits, toBfloat16Bits, toFloat16Bits } from '@lathe/runtime';

const emulation = join(__dirname, 'emulation');
const own = join(__dirname, 'w4a16-emulation');
let dir = '';
let harness = '';

beforeAll(() => {
  dir = mkdtempSync(join(tmpdir(), 'lathe-w4a16-'));
  writeFileSync(join(dir, 'w4.cu'), w4a16Source);
  writeFileSync(join(dir, 'w4-wg.cu'), w4a16WgKernels);
  // every tiled and wgmma build by name, for the harness to pick from
  const names = (d: keyof typeof W4A16_TYPES) => [...W4A16_TILE_VARIANTS.map((v) => w4a16TileKernelName(d, v)), ...W4A16_WG_BUILDS.map((v) => w4a16WgKernelName(d, v))];
  const table = (d: keyof typeof W4A16_TYPES) =>
    `static const std::pair<const char*, W4TileKernel<${W4A16_TYPES[d].c}>> w4_tiles_${W4A16_TYPES[d].suffix}[] = {\n${names(d).map((n) => `  {"${n}", &${n}},`).join('\n')}\n};`;
  writeFileSync(
    join(dir, 'w4-tiles.h'),
    ['#include <utility>', 'template <typename T> using W4TileKernel = void (*)(const T*, const unsigned char*, const T*, const unsigned char*, T*, T*, T*, int, int, int, int, int, int, int);', table('bfloat16'), table('float16'), ''].join('\n'),
  );
  harness = join(dir, 'harness');
  execFileSync('g++', ['-std=c++20', '-O1', '-pthread', `-I${emulation}`, `-I${own}`, `-I${dir}`, '-o', harness, join(own, 'harness.cpp')], { stdio: 'pipe' });
}, 120_000);

/** A seeded uniform stream in [0, 1). */
function uniform(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = Math.imul(a ^ (a >>> 15), a | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

interface Case {
  dtype: 'bfloat16' | 'float16';
  M: number;
  N: number;
  K: number;
  blockSize: number;
  zeroPoints: boolean;
  /** Output widths (default [N]): column ranges written to separate outputs. */
  widths?: number[];
  /** Column tiles of 16 per warp (default 1). */
  columnTiles?: 1 | 2;
  /** Chunks of K a warp takes (w4a16Plan's `rounds`; default the fewest). */
  rounds?: number;
  /** The tiled kernels: this tile, or 'auto' for w4a16TilePlan's choice. */
  tile?: W4A16Tile | 'auto';
  /** A wgmma build (over the tile). */
  wg?: W4A16WgBuild;
}

function run(c: Case): { got: Float32Array; want: Float64Array; warps: number; mt: number; nt: number; gridY: number } {
  const rnd = uniform(c.M * 7919 + c.N * 31 + c.K);
  const kBlocks = Math.ceil(c.K / c.blockSize);
  const shape: W4A16Shape = { M: c.M, N: c.N, K: c.K, kBlocks, blockSize: c.blockSize, dtype: c.dtype };
  const a = Float32Array.from({ length: c.M * c.K }, () => roundToDtype(c.dtype, 2 * rnd() - 1));
  const b = Uint8Array.from({ length: (c.N * kBlocks * c.blockSize) / 2 }, () => Math.floor(256 * rnd()));
  // scales spread over two decades, so a block read with another block's scale shows
  const scales = Float32Array.from({ length: c.N * kBlocks }, () => roundToDtype(c.dtype, 0.01 * 10 ** (2 * rnd())));
  const zeroPoints = c.zeroPoints ? Uint8Array.from({ length: c.N * Math.ceil(kBlocks / 2) }, () => Math.floor(256 * rnd())) : undefined;
  const bits = (x: Float32Array) => (c.dtype === 'bfloat16' ? toBfloat16Bits(x) : toFloat16Bits(x));
  const bytes = (x: Uint16Array | Uint8Array) => Buffer.from(x.buffer, x.byteOffset, x.byteLength);
  const input = join(dir, 'in.bin');
  const output = join(dir, 'out.bin');
  writeFileSync(input, Buffer.concat([bytes(bits(a)), bytes(b), bytes(bits(scales)), ...(zeroPoints ? [bytes(zeroPoints)] : [])]));
  const tiled = c.tile ? w4a16TilePlan(shape, c.tile === 'auto' ? {} : { tile: c.tile }) : undefined;
  const plan = tiled ? { ...tiled, warps: tiled.threads / 32 } : w4a16Plan(shape, c.columnTiles, c.rounds);
  const widths = c.widths ?? [c.N];
  const n1 = widths[0];
  const n2 = n1 + (widths[1] ?? 0);
  const wg = c.wg ? w4a16WgDims(c.wg) : undefined;
  const kernel = c.wg && wg
    ? ['tile', w4a16WgKernelName(c.dtype, c.wg), wg.bm, wg.bn, wg.threads, w4a16WgSmem(c.wg), 1]
    : tiled
      ? ['tile', w4a16TileKernelName(c.dtype, tiled), tiled.bm, tiled.bn, tiled.threads, tiled.sharedBytes, tiled.ck]
      : [plan.mt, plan.nt, plan.warps];
  execFileSync(harness, [input, output, c.dtype === 'bfloat16' ? 'bf16' : 'fp16', c.M, c.N, n1, n2, c.K, kBlocks, Math.log2(c.blockSize), zeroPoints ? 1 : 0, ...kernel].map(String), { stdio: 'pipe' });
  const raw = readFileSync(output);
  const u16 = new Uint16Array(raw.buffer, raw.byteOffset, raw.byteLength / 2);
  const flat = c.dtype === 'bfloat16' ? fromBfloat16Bits(u16) : fromFloat16Bits(u16);
  // the outputs [M, width] one after another, back to [M, N]
  const got = new Float32Array(c.M * c.N);
  let at = 0;
  let col = 0;
  for (const w of widths) {
    for (let m = 0; m < c.M; m++) for (let n = 0; n < w; n++) got[m * c.N + col + n] = flat[at + m * w + n];
    at += c.M * w;
    col += w;
  }
  return { got, want: w4a16Reference(shape, { a, b, scales, zeroPoints }), warps: plan.warps, mt: plan.mt, nt: plan.nt, gridY: plan.grid[1] };
}

// fp32 accumulation, one rounding of C to the dtype: half an ulp of each value (2⁻⁹ bf16, 2⁻¹² fp16), and a little
// for the fp32 sums' order against float64's.
const relative = { bfloat16: 2 ** -8, float16: 2 ** -11 };

function expectClose(c: Case, r: ReturnType<typeof run>): void {
  const scale = Math.max(...Array.from(r.want, Math.abs));
  expect(scale).toBeGreaterThan(0.1);
  expect(r.got.length).toBe(c.M * c.N);
  let worst = 0;
  r.want.forEach((w, i) => {
    const excess = Math.abs(r.got[i] - w) - relative[c.dtype] * Math.abs(w) - 1e-5 * scale;
    worst = Math.max(worst, excess);
  });
  expect(worst).toBeLessThanOrEqual(0);
}

test.each<[string, Case, { mt: number; warps: number; gridY: number; nt?: number }]>([
  ['decode row, bf16, block 64: every code and warp of one CTA per 16 columns', { dtype: 'bfloat16', M: 1, N: 48, K: 512, blockSize: 64, zeroPoints: false }, { mt: 1, warps: 4, gridY: 1 }],
  ['5 rows, fp16, block 32 with zero points, N = 40 and K = 200 (padded to 224: a half-empty chunk)', { dtype: 'float16', M: 5, N: 40, K: 200, blockSize: 32, zeroPoints: true }, { mt: 1, warps: 2, gridY: 1 }],
  ['16 rows (two n8 tiles), bf16, block 128 with zero points, 3 chunks over 3 warps', { dtype: 'bfloat16', M: 16, N: 32, K: 384, blockSize: 128, zeroPoints: true }, { mt: 2, warps: 3, gridY: 1 }],
  ['37 rows (eight n8 tiles, the last ragged), bf16', { dtype: 'bfloat16', M: 37, N: 16, K: 256, blockSize: 64, zeroPoints: false }, { mt: 8, warps: 2, gridY: 1 }],
  ['70 rows: two grid rows of 64, fp16 with zero points', { dtype: 'float16', M: 70, N: 24, K: 128, blockSize: 32, zeroPoints: true }, { mt: 8, warps: 1, gridY: 2 }],
  ['K = 2560 (20 chunks): 20 warps of one chunk each, summed across warps', { dtype: 'bfloat16', M: 3, N: 16, K: 2560, blockSize: 128, zeroPoints: false }, { mt: 1, warps: 20, gridY: 1 }],
  ['q/k/v in one launch: three outputs of 32, 16 and 16 columns (N = 64), fp16 with zero points', { dtype: 'float16', M: 4, N: 64, K: 256, blockSize: 64, zeroPoints: true, widths: [32, 16, 16] }, { mt: 1, warps: 2, gridY: 1 }],
  ['gate/up in one launch: two outputs of 24 columns, each split inside a CTA\'s 16 columns, 12 rows', { dtype: 'bfloat16', M: 12, N: 48, K: 128, blockSize: 32, zeroPoints: false, widths: [24, 24] }, { mt: 2, warps: 1, gridY: 1 }],
  ['32 columns a warp (two column tiles), 1 row, bf16: N = 40 leaves the second CTA half empty', { dtype: 'bfloat16', M: 1, N: 40, K: 256, blockSize: 64, zeroPoints: false, columnTiles: 2 }, { mt: 1, nt: 2, warps: 2, gridY: 1 }],
  ['32 columns a warp, 13 rows, fp16 with zero points, q/k/v outputs of 24, 20 and 20, 20 chunks over 16 warps in 2 rounds', { dtype: 'float16', M: 13, N: 64, K: 2560, blockSize: 128, zeroPoints: true, widths: [24, 20, 20], columnTiles: 2 }, { mt: 2, nt: 2, warps: 10, gridY: 1 }],
  ['4 rounds asked for, 1 row, bf16 with zero points: K = 2048 (16 chunks) over 4 warps, each its next chunk in flight', { dtype: 'bfloat16', M: 1, N: 32, K: 2048, blockSize: 64, zeroPoints: true, rounds: 4 }, { mt: 1, warps: 4, gridY: 1 }],
  ['3 rounds asked for, 16 rows, two column tiles, fp16: 16 chunks over 6 warps (the last one 2 chunks short)', { dtype: 'float16', M: 16, N: 64, K: 2048, blockSize: 128, zeroPoints: false, columnTiles: 2, rounds: 3 }, { mt: 2, nt: 2, warps: 6, gridY: 1 }],
  ['7 rounds asked for, 1 row, fp16 with zero points: 21 chunks over 3 warps, a ring of 3 chunks a warp wrapped twice', { dtype: 'float16', M: 1, N: 32, K: 2688, blockSize: 64, zeroPoints: true, rounds: 7 }, { mt: 1, warps: 3, gridY: 1 }],
  ['5 rounds asked for, 11 rows, bf16: 18 chunks over 4 warps (a ring of 3, the last warp 2 chunks short)', { dtype: 'bfloat16', M: 11, N: 48, K: 2304, blockSize: 128, zeroPoints: false, rounds: 5 }, { mt: 2, warps: 4, gridY: 1 }],
  ['two column tiles asked for 40 rows: no such build, one column tile', { dtype: 'bfloat16', M: 40, N: 16, K: 128, blockSize: 32, zeroPoints: false, columnTiles: 2 }, { mt: 8, nt: 1, warps: 1, gridY: 1 }],
  ['40 rows and K = 2560: 7 warps (the most for eight tiles is 8) over 20 chunks in 3 rounds, the next chunk prefetched', { dtype: 'float16', M: 40, N: 20, K: 2560, blockSize: 64, zeroPoints: true }, { mt: 8, warps: 7, gridY: 1 }],
])('%s', (_name, c, plan) => {
  const r = run(c);
  expect({ mt: r.mt, warps: r.warps, gridY: r.gridY, nt: r.nt }).toEqual({ nt: 1, ...plan });
  expectClose(c, r);
}, 60_000);

test.each<[string, Case, { label: string; gridX: number; gridY: number }]>([
  ['tiled 64 × 64, bf16, block 64: M = 70 and N = 80 ragged (a tile of 6 rows, one of 16 columns), 3 chunks = the stages', { dtype: 'bfloat16', M: 70, N: 80, K: 384, blockSize: 64, zeroPoints: false, tile: { mt: 4, nt: 2 } }, { label: '64x64', gridX: 2, gridY: 2 }],
  ['tiled 32 × 64, fp16 with zero points, block 32: K = 200 padded to 224 (a half-empty chunk), 33 rows', { dtype: 'float16', M: 33, N: 72, K: 200, blockSize: 32, zeroPoints: true, tile: { mt: 2, nt: 2 } }, { label: '32x64', gridX: 2, gridY: 2 }],
  ['tiled 32 × 32, bf16 with zero points, block 128: K = 1280 (10 chunks: the 3-stage ring wraps), q/k/v outputs of 32, 16, 16', { dtype: 'bfloat16', M: 40, N: 64, K: 1280, blockSize: 128, zeroPoints: true, widths: [32, 16, 16], tile: { mt: 2, nt: 1 } }, { label: '32x32', gridX: 2, gridY: 2 }],
  ['tiled 64 × 64, fp16: 17 rows, gate/up outputs of 24 and 24 (split inside a warp’s 32 columns)', { dtype: 'float16', M: 17, N: 48, K: 256, blockSize: 64, zeroPoints: false, widths: [24, 24], tile: { mt: 4, nt: 2 } }, { label: '64x64', gridX: 1, gridY: 1 }],
  ['tiled 32 × 64, bf16 with zero points, block 64: 50 rows, N = 100 (the second tile’s last warp past N)', { dtype: 'bfloat16', M: 50, N: 100, K: 512, blockSize: 64, zeroPoints: true, tile: { mt: 2, nt: 2 } }, { label: '32x64', gridX: 2, gridY: 2 }],
  ['tiled 32 × 32, fp16, block 128: 20 rows, K = 640 (5 chunks), q/k/v outputs of 16, 8, 8', { dtype: 'float16', M: 20, N: 32, K: 640, blockSize: 128, zeroPoints: false, widths: [16, 8, 8], tile: { mt: 2, nt: 1 } }, { label: '32x32', gridX: 1, gridY: 1 }],
  ['8 warps, 64 × 256 (one warp row, 8 warps along N), bf16, block 64: M = 70, N = 300 ragged, K = 1280 (10 chunks: the 4-stage ring wraps), gate/up outputs of 100 and 200', { dtype: 'bfloat16', M: 70, N: 300, K: 1280, blockSize: 64, zeroPoints: false, widths: [100, 200], tile: { mt: 8, nt: 2, wm: 1, wn: 8, wk: 1 } }, { label: '64x256w8', gridX: 2, gridY: 2 }],
  ['8 warps, 128 × 128 (2 × 4 warps), fp16 with zero points, block 64: M = 130, N = 136, K = 576 (9 blocks: an odd zero-point nibble, a half chunk)', { dtype: 'float16', M: 130, N: 136, K: 576, blockSize: 64, zeroPoints: true, tile: { mt: 8, nt: 2, wm: 2, wn: 4, wk: 1 } }, { label: '128x128w8', gridX: 2, gridY: 2 }],
  ['8 warps, 64 × 128 with K over 2 warp groups, bf16 with zero points, block 64: K = 1664 (13 chunks: the last step half past K), q/k/v outputs of 128, 64, 64', { dtype: 'bfloat16', M: 64, N: 256, K: 1664, blockSize: 64, zeroPoints: true, widths: [128, 64, 64], tile: { mt: 8, nt: 2, wm: 1, wn: 4, wk: 2 } }, { label: '64x128w8k2', gridX: 2, gridY: 1 }],
  ['8 warps, 32 × 128 with K over 2 warp groups, fp16, block 32: M = 50, N = 140, K = 200 (padded to 224: one step, its second chunk half empty)', { dtype: 'float16', M: 50, N: 140, K: 200, blockSize: 32, zeroPoints: false, tile: { mt: 4, nt: 2, wm: 1, wn: 4, wk: 2 } }, { label: '32x128w8k2', gridX: 2, gridY: 2 }],
  ['8 warps, 32 × 64 with K over 4 warp groups, bf16 with zero points, block 128: M = 33, N = 72, K = 1408 (11 chunks in 3 steps, one chunk past K; the 3-stage ring wraps)', { dtype: 'bfloat16', M: 33, N: 72, K: 1408, blockSize: 128, zeroPoints: true, tile: { mt: 4, nt: 2, wm: 1, wn: 2, wk: 4 } }, { label: '32x64w8k4', gridX: 2, gridY: 2 }],
  ['8 warps, 64 × 128 with K over 2 warp groups, fp16 with zero points, block 64, 17 rows (one mostly empty tile row)', { dtype: 'float16', M: 17, N: 128, K: 512, blockSize: 64, zeroPoints: true, tile: { mt: 8, nt: 2, wm: 1, wn: 4, wk: 2 } }, { label: '64x128w8k2', gridX: 1, gridY: 1 }],
  ['8 warps, 64 × 64 with K over 4 warp groups (64-row warps, 2 stages), bf16 with zero points, block 64: M = 100, N = 72, K = 2944 (23 chunks in 6 steps, one chunk past K; the 2-stage ring wraps), gate/up outputs of 40 and 32', { dtype: 'bfloat16', M: 100, N: 72, K: 2944, blockSize: 64, zeroPoints: true, widths: [40, 32], tile: { mt: 8, nt: 2, wm: 1, wn: 2, wk: 4 } }, { label: '64x64w8k4', gridX: 2, gridY: 2 }],
  ['8 warps, 64 × 64 with K over 4 warp groups, fp16, block 128: M = 64, N = 64, K = 384 (3 chunks: one step, a k-group idle)', { dtype: 'float16', M: 64, N: 64, K: 384, blockSize: 128, zeroPoints: false, tile: { mt: 8, nt: 2, wm: 1, wn: 2, wk: 4 } }, { label: '64x64w8k4', gridX: 1, gridY: 1 }],
  ['a cluster of 2 CTAs over each 64 × 256 tile, K split between them (sums over distributed shared memory), bf16 with zero points, block 64: M = 70, N = 300, K = 1408 (11 chunks: 6 and 5), gate/up outputs of 100 and 200', { dtype: 'bfloat16', M: 70, N: 300, K: 1408, blockSize: 64, zeroPoints: true, widths: [100, 200], tile: { mt: 8, nt: 2, wm: 1, wn: 8, wk: 1, ck: 2 } }, { label: '64x256w8c2', gridX: 2, gridY: 2 }],
  ['a cluster of 4 CTAs over a 64 × 256 tile, bf16, block 128: M = 40, N = 256, K = 896 (7 chunks: 2, 2, 2 and 1)', { dtype: 'bfloat16', M: 40, N: 256, K: 896, blockSize: 128, zeroPoints: false, tile: { mt: 8, nt: 2, wm: 1, wn: 8, wk: 1, ck: 4 } }, { label: '64x256w8c4', gridX: 1, gridY: 1 }],
  ['a cluster of 4 CTAs over a 64 × 256 tile, fp16, block 128: M = 64, N = 256, K = 384 (3 chunks: rank 3 has none)', { dtype: 'float16', M: 64, N: 256, K: 384, blockSize: 128, zeroPoints: false, tile: { mt: 8, nt: 2, wm: 1, wn: 8, wk: 1, ck: 4 } }, { label: '64x256w8c4', gridX: 1, gridY: 1 }],
  ['a cluster of 2 CTAs, each K over 2 warp groups, over 64 × 128 tiles, fp16 with zero points, block 32: M = 65, N = 136, K = 1000 (padded to 1024: 8 chunks, 2 steps a rank), q/k/v outputs of 64, 40, 32', { dtype: 'float16', M: 65, N: 136, K: 1000, blockSize: 32, zeroPoints: true, widths: [64, 40, 32], tile: { mt: 8, nt: 2, wm: 1, wn: 4, wk: 2, ck: 2 } }, { label: '64x128w8k2c2', gridX: 2, gridY: 2 }],
  ['tiled, the plan’s choice for 256 rows, N = 96 and K = 256: 32 × 64 with K over 4 warp groups (16 CTAs, the second column tile half past N; 2 chunks, two k-groups idle)', { dtype: 'bfloat16', M: 256, N: 96, K: 256, blockSize: 32, zeroPoints: true, tile: 'auto' }, { label: '32x64w8k4', gridX: 2, gridY: 8 }],
])('%s', (_name, c, plan) => {
  const r = run(c);
  const p = w4a16TilePlan({ M: c.M, N: c.N, K: c.K }, c.tile === 'auto' ? {} : { tile: c.tile });
  expect({ label: p.label, gridX: p.grid[0], gridY: p.grid[1] }).toEqual(plan);
  expectClose(c, r);
}, 120_000);

test.each<[string, Case]>([
  ['wgmma 64 × 64 (one warpgroup), bf16, block 64: M = 70 and N = 80 ragged (two row tiles, the second of 6 rows; a column tile of 16), K = 384 (3 chunks)', { dtype: 'bfloat16', M: 70, N: 80, K: 384, blockSize: 64, zeroPoints: false, wg: { bm: 64, wg: 1 } }],
  ['wgmma 64 × 128 (two warpgroups), fp16 with zero points, block 32: K = 200 padded to 224 (a chunk past K, half past Kp), 33 rows, q/k/v outputs of 64, 40, 32', { dtype: 'float16', M: 33, N: 136, K: 200, blockSize: 32, zeroPoints: true, widths: [64, 40, 32], wg: { bm: 64, wg: 2 } }],
  ['wgmma 128 × 64, bf16 with zero points, block 128: K = 1280 (10 chunks: the 4-stage ring wraps), M = 130 (two row tiles)', { dtype: 'bfloat16', M: 130, N: 64, K: 1280, blockSize: 128, zeroPoints: true, wg: { bm: 128, wg: 1 } }],
  ['wgmma 128 × 128, fp16, block 64: M = 100, N = 200 (the second CTA past N from its second warpgroup), K = 576 (9 blocks: an odd zero-point nibble), gate/up outputs of 100 and 100', { dtype: 'float16', M: 100, N: 200, K: 576, blockSize: 64, zeroPoints: true, widths: [100, 100], wg: { bm: 128, wg: 2 } }],
  ['wgmma 128 × 128, bf16, block 64: one chunk (K = 128), 128 rows', { dtype: 'bfloat16', M: 128, N: 128, K: 128, blockSize: 64, zeroPoints: false, wg: { bm: 128, wg: 2 } }],
  ['wgmma 256 × 64 (three stages, one chunk in flight), bf16 with zero points, block 64: M = 260 (two row tiles, the second of 4 rows), K = 640 (5 chunks: the 3-stage ring wraps)', { dtype: 'bfloat16', M: 260, N: 64, K: 640, blockSize: 64, zeroPoints: true, wg: { bm: 256, wg: 1 } }],
  ['wgmma 256 × 128, fp16, block 32: M = 200, N = 120 (the second warpgroup past N for 8 of its rows), K = 448 (4 chunks, the last half past K)', { dtype: 'float16', M: 200, N: 120, K: 448, blockSize: 32, zeroPoints: false, wg: { bm: 256, wg: 2 } }],
])('%s', (_name, c) => {
  expectClose(c, run(c));
}, 240_000);
