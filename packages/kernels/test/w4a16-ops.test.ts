/**
 * The graph side of the W4A16 kernels on the CPU: the custom op (host compute, float32) in a session
 * beside ONNX Runtime's own MatMulNBits on the same inputs, and both against `w4a16Reference` — with
 * and without zero points, leading dims kept, K padded to whole blocks. The kernels themselves are
 * tested in w4a16-emulated.slow.test.ts (CPU emulation) and on the GPU by quant-bench's numerics check.
 */
import * as L from '@lathe/onnx';
import { attr, defineOp } from '@lathe/onnx';
import { Device } from '@lathe/runtime';
import { W4A16_TILE_VARIANTS, W4A16_WG_BUILDS, w4a16WgBuild, w4a16WgChoice, w4a16WgDims, w4a16WgKernelName, w4a16WgLabel, w4a16WgSmem, w4a16WgSource, w4a16WgStages, w4a16DefaultChoice, w4a16MaxSharedBytes, w4a16Ops, w4a16Plan, w4a16Reference, w4a16TileDims, w4a16TileEstimate, w4a16TileKernelName, w4a16TilePlan, w4a16TileSmem, w4a16TileUnavailable, w4a16Unsupported } from '@lathe/kernels';

interface NBits {
  K: number;
  N: number;
  bits: number;
  blockSize: number;
}
// ONNX Runtime's contrib op, declared here as the independent product to compare with.
const matMulNBits = defineOp<NBits>({
  name: 'MatMulNBits',
  domain: 'com.microsoft',
  infer: ([a], { N }) => [{ dtype: a!.dtype, shape: [...a!.shape.slice(0, -1), N] }],
  onnxAttrs: ({ K, N, bits, blockSize }) => ({ K: attr.int(K), N: attr.int(N), bits: attr.int(bits), block_size: attr.int(blockSize) }),
  grad: 'none',
});

test.each([
  ['symmetric (zero point 8)', false],
  ['with zero points', true],
])('the custom op computes MatMulNBits’ product on the CPU: %s', async (_name, zp) => {
  const [B, S, K, N, blockSize] = [2, 3, 80, 20, 32]; // K padded to 96
  const kb = Math.ceil(K / blockSize);
  const x = Float32Array.from({ length: B * S * K }, (_, i) => Math.sin(0.7 * i + 0.3));
  const b = Uint8Array.from({ length: (N * kb * blockSize) / 2 }, (_, i) => (i * 37 + 11) % 256);
  const scales = Float32Array.from({ length: N * kb }, (_, i) => 0.01 + 0.003 * (i % 17));
  const zeroPoints = Uint8Array.from({ length: N * Math.ceil(kb / 2) }, (_, i) => (i * 53 + 5) % 256);
  const ops = w4a16Ops('cpu');
  const g = new L.Graph('w4a16_vs_nbits');
  const xt = g.input('x', 'float32', [B, S, K]);
  const bt = g.input('b', 'uint8', [N, kb, blockSize / 2]);
  const st = g.input('scales', 'float32', [N, kb]);
  const zt = zp ? g.input('zp', 'uint8', [N, Math.ceil(kb / 2)]) : undefined;
  const attrs = { K, N, bits: 4, blockSize };
  const ours = ops.matmul(xt, bt, st, zt, attrs);
  expect(ours.shape).toEqual([B, S, N]);
  g.output(ours, 'ours');
  g.output(L.applyOp(matMulNBits, zt ? [xt, bt, st, zt] : [xt, bt, st], attrs)[0], 'ort');
  const session = Device.cpu().compile(g, { ...ops.session });
  const out = await session.run({ x: { data: x, dims: [B, S, K] }, b: { data: b, dims: [N, kb, blockSize / 2] }, scales: { data: scales, dims: [N, kb] }, ...(zp ? { zp: { data: zeroPoints, dims: [N, Math.ceil(kb / 2)] } } : {}) });
  ops.check();
  const want = w4a16Reference({ M: B * S, N, K, kBlocks: kb, blockSize, dtype: 'float32' }, { a: x, b, scales, zeroPoints: zp ? zeroPoints : undefined });
  const got = out.ours.data as Float32Array;
  const ort = out.ort.data as Float32Array;
  const scale = Math.max(...Array.from(want, Math.abs));
  expect(scale).toBeGreaterThan(0.05);
  want.forEach((w, i) => {
    expect(Math.abs(got[i] - w)).toBeLessThanOrEqual(1e-6 * scale);
    expect(Math.abs(ort[i] - w)).toBeLessThanOrEqual(1e-4 * scale);
  });
  session.dispose();
  ops.dispose();
});

test('matmulSplit writes consecutive column ranges of one product to separate outputs (q/k/v in one node)', async () => {
  const [M, K, blockSize] = [2, 64, 32];
  const widths = [8, 4, 4];
  const N = 16;
  const kb = K / blockSize;
  const x = Float32Array.from({ length: M * K }, (_, i) => Math.cos(0.3 * i));
  const b = Uint8Array.from({ length: (N * kb * blockSize) / 2 }, (_, i) => (i * 29 + 3) % 256);
  const scales = Float32Array.from({ length: N * kb }, (_, i) => 0.02 + 0.001 * i);
  const ops = w4a16Ops('cpu');
  const g = new L.Graph('w4a16_split');
  const outs = ops.matmulSplit(g.input('x', 'float32', [M, 1, K]), g.input('b', 'uint8', [N, kb, blockSize / 2]), g.input('scales', 'float32', [N, kb]), undefined, { K, N, bits: 4, blockSize }, widths);
  expect(outs.map((t) => t.shape)).toEqual(widths.map((w) => [M, 1, w]));
  outs.forEach((t, i) => g.output(t, `y${i}`));
  const other = new L.Graph('bad_widths');
  expect(() => ops.matmulSplit(other.input('x', 'float32', [M, K]), other.input('b', 'uint8', [N, kb, blockSize / 2]), other.input('s', 'float32', [N, kb]), undefined, { K, N, bits: 4, blockSize }, [8, 4])).toThrow(/widths \[8, 4\] must be 2 or 3 positive widths summing to N = 16/);
  const session = Device.cpu().compile(g, { ...ops.session });
  const out = await session.run({ x: { data: x, dims: [M, 1, K] }, b: { data: b, dims: [N, kb, blockSize / 2] }, scales: { data: scales, dims: [N, kb] } });
  ops.check();
  const want = w4a16Reference({ M, N, K, kBlocks: kb, blockSize, dtype: 'float32' }, { a: x, b, scales });
  let start = 0;
  widths.forEach((w, i) => {
    const y = out[`y${i}`].data as Float32Array;
    for (let m = 0; m < M; m++) for (let n = 0; n < w; n++) expect(Math.abs(y[m * w + n] - want[m * N + start + n])).toBeLessThanOrEqual(1e-6 * Math.abs(want[m * N + start + n]) + 1e-7);
    start += w;
  });
  session.dispose();
  ops.dispose();
});

test('the reference dequantizes as MatMulNBits defines it: (q − zp) · scale, low nibble first', () => {
  // one row, K = 4 in one block of 32 (padding codes past K ignored): codes 1, 15, 0, 8 with zero point 3, scale 0.5
  const b = new Uint8Array(16);
  b[0] = 1 | (15 << 4);
  b[1] = 0 | (8 << 4);
  b.fill(0xff, 2);
  const shape = { M: 2, N: 1, K: 4, kBlocks: 1, blockSize: 32, dtype: 'float32' as const };
  const c = w4a16Reference(shape, { a: [1, 1, 1, 1, 1, 0, 0, 0], b, scales: [0.5], zeroPoints: Uint8Array.of(3) });
  // weights (1 − 3, 15 − 3, 0 − 3, 8 − 3) · 0.5 = −1, 6, −1.5, 2.5
  expect(Array.from(c)).toEqual([-1 + 6 - 1.5 + 2.5, -1]);
  expect(Array.from(w4a16Reference(shape, { a: [0, 0, 1, 0, 0, 0, 0, 0], b, scales: [0.5] }))).toEqual([-4, 0]); // (0 − 8) · 0.5
});

test('launch plans: decode rows take one n8 tile; K splits over warps in the fewest rounds (or the rounds asked for); M past 64 adds grid rows', () => {
  // Qwen3-0.6B's projections at batch 1 and 16, block 64
  expect(w4a16Plan({ M: 1, N: 2048, kBlocks: 16, blockSize: 64 })).toEqual({ mt: 1, nt: 1, warps: 8, grid: [128, 1], sharedBytes: 8 * 512 });
  expect(w4a16Plan({ M: 16, N: 1024, kBlocks: 48, blockSize: 64 })).toEqual({ mt: 2, nt: 1, warps: 24, grid: [64, 1], sharedBytes: 24 * 2 * 512 });
  expect(w4a16Plan({ M: 256, N: 3072, kBlocks: 16, blockSize: 64 })).toEqual({ mt: 8, nt: 1, warps: 8, grid: [192, 4], sharedBytes: 8 * 8 * 512 });
  // 48 chunks over at most 32 warps: 2 rounds of 24
  expect(w4a16Plan({ M: 1, N: 2048, kBlocks: 96, blockSize: 64 }).warps).toBe(24);
  // two column tiles at 16 rows: half the CTAs, at most 16 warps (the registers of 2 × 2 tiles)
  expect(w4a16Plan({ M: 16, N: 1024, kBlocks: 48, blockSize: 64 }, 2)).toEqual({ mt: 2, nt: 2, warps: 12, grid: [32, 1], sharedBytes: 12 * 2 * 2 * 512 });
  // rounds asked for: 16 chunks in 4 rounds of 4 warps; past what K allows, one warp; below what the build's warps allow, the fewest
  expect(w4a16Plan({ M: 1, N: 6144, kBlocks: 32, blockSize: 64 }, 1, 4)).toEqual({ mt: 1, nt: 1, warps: 4, grid: [384, 1], sharedBytes: 4 * 512 });
  expect(w4a16Plan({ M: 1, N: 6144, kBlocks: 32, blockSize: 64 }, 1, 64).warps).toBe(1);
  expect(w4a16Plan({ M: 1, N: 2048, kBlocks: 96, blockSize: 64 }, 1, 1).warps).toBe(24);
  expect(() => w4a16Plan({ M: 1, N: 2048, kBlocks: 32, blockSize: 64 }, 1, 0)).toThrow(/rounds must be an integer ≥ 1, got 0/);
});

test("default split-K plans: past 8 rows, two column tiles from 4,096 columns and four chunks a warp from 8,192 (one column tile in the fewest rounds for narrower products); up to 8 rows, one column tile in the fewest rounds unless those would queue CTAs, then about 8 chunks a warp", () => {
  const k = (K: number) => ({ kBlocks: K / 64, blockSize: 64 });
  expect(w4a16DefaultChoice({ M: 16, N: 12288, ...k(2048) })).toEqual({ columnTiles: 2, rounds: 4 });
  expect(w4a16DefaultChoice({ M: 9, N: 8192, ...k(2048) })).toEqual({ columnTiles: 2, rounds: 4 });
  expect(w4a16DefaultChoice({ M: 16, N: 4096, ...k(2048) })).toEqual({ columnTiles: 2 });
  expect(w4a16DefaultChoice({ M: 16, N: 2048, ...k(2048) })).toEqual({ columnTiles: 1 });
  // up to 8 rows, where the fewest rounds would queue CTAs (more than 48 warps a SM on 132 SMs): Qwen3-8B's gate/up (32
  // chunks, 1,536 CTAs of 32 warps) in 8 rounds of 4 warps, its down projection (96 chunks, 256 CTAs) 8 rounds of 12
  // warps, its o projection (32 chunks, 256 CTAs) 4 rounds of 8 warps (9 asked: 16 warps a SM)
  const plan = (M: number, N: number, K: number, sms?: number) => {
    const c = w4a16DefaultChoice({ M, N, ...k(K) }, sms);
    return { ...c, warps: w4a16Plan({ M, N, ...k(K) }, c.columnTiles, c.rounds).warps };
  };
  expect(plan(1, 24576, 4096)).toEqual({ columnTiles: 1, rounds: 8, warps: 4 });
  expect(plan(8, 24576, 4096)).toEqual({ columnTiles: 1, rounds: 8, warps: 4 });
  expect(plan(1, 4096, 12288)).toEqual({ columnTiles: 1, rounds: 8, warps: 12 });
  expect(plan(1, 4096, 4096)).toEqual({ columnTiles: 1, rounds: 4, warps: 8 });
  // Qwen3-1.7B's and 0.6B's (at most 31 warps a SM): the fewest rounds
  expect(plan(1, 4096, 2048)).toEqual({ columnTiles: 1, warps: 16 });
  expect(plan(1, 2048, 6144)).toEqual({ columnTiles: 1, warps: 24 });
  expect(plan(1, 6144, 1024)).toEqual({ columnTiles: 1, warps: 8 });
  // on 16 SMs, 1.7B's q/k/v queues too: 4 warps of 4 rounds
  expect(plan(1, 4096, 2048, 16)).toEqual({ columnTiles: 1, rounds: 4, warps: 4 });
  const c = w4a16DefaultChoice({ M: 16, N: 12288, ...k(2048) });
  expect(w4a16Plan({ M: 16, N: 12288, kBlocks: 32, blockSize: 64 }, c.columnTiles, c.rounds)).toMatchObject({ mt: 2, nt: 2, warps: 4, grid: [384, 1] });
});

test('tiled launch plans: the auto build of least estimated time, on sm_90 with 132 SMs the fastest timed for Qwen3 projections; a tile asked for is kept', () => {
  // [N, K, M, build]: the fastest auto build (or within 5 % of it) of quant-bench's kernel_tiles rows for Qwen3-0.6B and -1.7B's projections on an H200
  const fastest: [number, number, number, string][] = [
    [2048, 1024, 64, '32x64w8k4'],
    [2048, 1024, 128, '32x64w8k4'],
    [2048, 1024, 256, '32x128w8k2'],
    [3072, 1024, 64, '32x64w8k4'],
    [3072, 1024, 128, '32x128w8k2'],
    [3072, 1024, 256, '64x128w8k2'],
    [1024, 3072, 64, '32x64w8k4'],
    [1024, 3072, 128, '32x64w8k4'],
    [1024, 3072, 256, '32x64w8k4'],
    [4096, 1024, 64, '32x64w8k4'],
    [4096, 1024, 128, '32x128w8k2'],
    [4096, 1024, 256, '64x128w8k2'],
    [6144, 1024, 64, '32x128w8k2'],
    [6144, 1024, 128, '64x128w8k2'],
    [6144, 1024, 256, '64x256w8'],
    [2048, 2048, 64, '32x64w8k4'],
    [2048, 2048, 128, '32x64w8k4'],
    [2048, 2048, 256, '64x128w8k2c2'],
    [6144, 2048, 64, '64x128w8k2c2'],
    [6144, 2048, 128, '64x256w8c2'],
    [6144, 2048, 256, '64x256w8'],
    [2048, 6144, 64, '32x64w8k4'],
    [2048, 6144, 128, '32x64w8k4'],
    [2048, 6144, 256, '64x128w8k2c2'],
    [4096, 2048, 64, '32x64w8k4'],
    [4096, 2048, 128, '64x128w8k2c2'],
    [4096, 2048, 256, '64x256w8c2'],
    [12288, 2048, 64, '64x256w8c2'],
    [12288, 2048, 128, '64x256w8'],
    [12288, 2048, 256, '64x256w8c2'],
  ];
  expect(fastest.map(([N, K, M]) => [N, K, M, w4a16TilePlan({ M, N, K }, { sms: 132, arch: 90 }).label])).toEqual(fastest);
  expect(w4a16TilePlan({ M: 256, N: 6144, K: 1024 })).toEqual({ mt: 8, nt: 2, wm: 1, wn: 8, wk: 1, ck: 1, bm: 64, bn: 256, label: '64x256w8', grid: [24, 4], threads: 256, sharedBytes: 4 * (64 * 256 + 256 * 64) });
  expect(w4a16TilePlan({ M: 256, N: 2048, K: 2048 })).toMatchObject({ label: '64x128w8k2c2', grid: [16, 4], ck: 2 });
  expect(w4a16TilePlan({ M: 64, N: 1024, K: 3072 })).toMatchObject({ label: '32x64w8k4', grid: [16, 2], threads: 256, sharedBytes: 3 * 4 * (32 * 256 + 64 * 64) });
  // the estimate: waves of CTAs times a CTA's time; clusters of 4 fill 120 of 132 SMs, so 128 CTAs of them take two waves
  const c4 = { mt: 8, nt: 2, wm: 1, wn: 8, ck: 4 } as const;
  expect(w4a16TileEstimate({ M: 256, N: 2048, K: 1024 }, c4)).toBeCloseTo(2 * w4a16TileEstimate({ M: 128, N: 2048, K: 1024 }, c4));
  for (const v of W4A16_TILE_VARIANTS) expect(w4a16TileEstimate({ M: 64, N: 2048, K: 2048 }, v)).toBeGreaterThan(0);
  // the original 2 × 2-warp tiles when asked for
  expect(w4a16TilePlan({ M: 100, N: 2048, K: 2048 }, { tile: { mt: 4, nt: 2 } })).toEqual({ mt: 4, nt: 2, wm: 2, wn: 2, wk: 1, ck: 1, bm: 64, bn: 64, label: '64x64', grid: [32, 2], threads: 128, sharedBytes: 3 * (64 * 256 + 64 * 64) });
  expect(w4a16TilePlan({ M: 100, N: 2048, K: 2048 }, { tile: { mt: 8, nt: 2, wm: 1, wn: 2, wk: 4 } })).toMatchObject({ label: '64x64w8k4', grid: [32, 2], sharedBytes: 2 * 4 * (64 * 256 + 64 * 64) });
  expect(() => w4a16TilePlan({ M: 100, N: 2048, K: 2048 }, { tile: { mt: 2, nt: 4 } as never })).toThrow(/no tiled build 32x128 \(builds: 64x64, 32x64, 32x32, 64x256w8,/);
});

test('a device plans among the builds it runs: sm_80 without clusters, sm_86/89 (99 KB a CTA) 32 × 128 k2 and the original tiles', () => {
  expect([80, 86, 89, 90, 120].map(w4a16MaxSharedBytes)).toEqual([163 * 1024, 99 * 1024, 99 * 1024, 227 * 1024, 99 * 1024]);
  expect(w4a16TilePlan({ M: 256, N: 6144, K: 2048 }, { arch: 86 })).toMatchObject({ label: '32x128w8k2', sharedBytes: 98304 });
  expect(w4a16TilePlan({ M: 256, N: 6144, K: 2048 }, { arch: 80 })).toMatchObject({ label: '64x256w8', ck: 1 });
  expect(w4a16TileUnavailable({ mt: 8, nt: 2, wm: 1, wn: 8, wk: 1, ck: 4 }, 90)).toBeUndefined();
  expect(() => w4a16TilePlan({ M: 256, N: 2048, K: 2048 }, { tile: { mt: 8, nt: 2, wm: 1, wn: 8 }, arch: 86 })).toThrow(/64x256w8 needs 131072 bytes of shared memory, past the 101376 of sm_86/);
  expect(() => w4a16TilePlan({ M: 256, N: 2048, K: 2048 }, { tile: { mt: 8, nt: 2, wm: 1, wn: 8, ck: 4 }, arch: 80 })).toThrow(/64x256w8c4 runs as thread-block clusters \(sm_90 on\), not on sm_80/);
});

test('every tiled build fits an H100’s 227 KB of shared memory a CTA (228 KB an SM, 1 KB of it reserved a CTA, for the CTAs its launch bound asks to be resident), and its labels and kernel names are distinct', () => {
  for (const v of W4A16_TILE_VARIANTS) {
    expect(w4a16TileSmem(v)).toBeLessThanOrEqual(227 * 1024);
    expect(v.perSm * (w4a16TileSmem(v) + 1024)).toBeLessThanOrEqual(228 * 1024);
  }
  expect(new Set(W4A16_TILE_VARIANTS.map((v) => w4a16TileDims(v).label)).size).toBe(W4A16_TILE_VARIANTS.length);
  expect(new Set(W4A16_TILE_VARIANTS.map((v) => w4a16TileKernelName('bfloat16', v))).size).toBe(W4A16_TILE_VARIANTS.length);
  expect(w4a16TileKernelName('float16', { mt: 8, nt: 2, wm: 1, wn: 4, wk: 2 })).toBe('w4a16_fp16_tile_m64_n128_w8_k2');
  expect(w4a16TileKernelName('bfloat16', { mt: 4, nt: 2 })).toBe('w4a16_bf16_tile_m64_n64');
});

test('shapes outside the kernels are named (the caller keeps MatMulNBits)', () => {
  const shape = { M: 16, N: 1024, K: 1024, kBlocks: 16, blockSize: 64, dtype: 'bfloat16' as const };
  expect(w4a16Unsupported(shape)).toBeUndefined();
  expect(w4a16Unsupported({ ...shape, dtype: 'float32' })).toMatch(/dtype float32/);
  expect(w4a16Unsupported({ ...shape, blockSize: 16, kBlocks: 64 })).toMatch(/block size 16/);
  expect(w4a16Unsupported({ ...shape, K: 1020 })).toMatch(/K = 1020 is not a multiple of 8/);
  expect(w4a16Unsupported({ ...shape, K: 8, kBlocks: 1, M: 32 * 65535 })).toBeUndefined();
  expect(w4a16Unsupported({ ...shape, K: 8, kBlocks: 1, M: 32 * 65535 + 1 })).toMatch(/65,535 tiles of 32 rows/);
  const ops = w4a16Ops('cpu');
  expect(ops.unsupported({ K: 1024, N: 64, bits: 8, blockSize: 64 }, 'float32')).toMatch(/8 bits/);
  expect(ops.unsupported({ K: 1024, N: 64, bits: 4, blockSize: 64 }, 'float16')).toMatch(/dtype float16 on cpu/);
  expect(() => w4a16Ops('cuda')).toThrow(/CUDA needs the compiled W4A16 kernels/);
  ops.dispose();
});

test('the wgmma builds: the largest tile whose grid gives 0.7 of the SMs a CTA, else the most CTAs; names, labels and shared memory', () => {
  // Qwen3-8B's q_proj (N = 4096): 64 column tiles of 64, 32 of 128; 0.7 of 132 SMs is 92.4 CTAs
  expect(w4a16WgChoice({ M: 64, N: 4096 })).toEqual({ bm: 64, wg: 1 }); // 64 CTAs at most: the most
  expect(w4a16WgChoice({ M: 256, N: 4096 })).toEqual({ bm: 128, wg: 1 }); // 128 × 128 gives 64 CTAs, 128 × 64 gives 128
  expect(w4a16WgChoice({ M: 256, N: 4096 }, 64)).toEqual({ bm: 128, wg: 2 }); // 64 CTAs fill 64 SMs
  expect(w4a16WgChoice({ M: 512, N: 4096 })).toEqual({ bm: 128, wg: 2 }); // 256 rows gives 32 CTAs; 128 × 128 gives 128
  expect(w4a16WgChoice({ M: 640, N: 4096 })).toEqual({ bm: 256, wg: 2 }); // 3 × 32 = 96 CTAs of 256 × 128
  // the fused gate/up (N = 24,576): 192 CTAs of 128 × 128 at 65-128 rows; 256 rows a CTA only from 512 rows
  expect(w4a16WgChoice({ M: 65, N: 24576 })).toEqual({ bm: 128, wg: 2 });
  expect(w4a16WgChoice({ M: 65, N: 24576 }, 300)).toEqual({ bm: 128, wg: 1 });
  expect(w4a16WgChoice({ M: 256, N: 24576 })).toEqual({ bm: 128, wg: 2 });
  expect(w4a16WgChoice({ M: 512, N: 24576 })).toEqual({ bm: 256, wg: 2 });
  expect(w4a16WgChoice({ M: 48, N: 24576 })).toEqual({ bm: 64, wg: 2 });
  // Qwen3-0.6B's gate/up (N = 6,144): 96 CTAs of 128 × 128 at 256 rows, 96 of 256 × 128 at 512
  expect(w4a16WgChoice({ M: 256, N: 6144 })).toEqual({ bm: 128, wg: 2 });
  expect(w4a16WgChoice({ M: 512, N: 6144 })).toEqual({ bm: 256, wg: 2 });
  for (const v of W4A16_WG_BUILDS) {
    expect(w4a16WgBuild(w4a16WgLabel(v))).toEqual(v);
    expect(w4a16WgDims(v)).toEqual({ bm: v.bm, bn: 64 * v.wg, threads: 128 * v.wg });
    // four stages (three at 256 rows) of activations [bm][128] and weights [64·wg][64 bytes], 1 KB to align: under sm_90's 227 KB
    expect(w4a16WgStages(v)).toBe(v.bm === 256 ? 3 : 4);
    expect(w4a16WgSmem(v)).toBe(w4a16WgStages(v) * (v.bm * 256 + v.wg * 4096) + 1024);
    expect(w4a16WgSmem(v)).toBeLessThanOrEqual(w4a16MaxSharedBytes(90));
    for (const d of ['bfloat16', 'float16'] as const) expect(w4a16WgSource).toContain(`, ${w4a16WgKernelName(d, v)})`);
  }
  expect(w4a16WgLabel({ bm: 128, wg: 2 })).toBe('wg128x128');
  expect(w4a16WgLabel({ bm: 256, wg: 1 })).toBe('wg256x64');
  expect(w4a16WgBuild('wg512x64')).toBeUndefined();
  // each wgmma shape the builds use, in both types, and the kernels only where sm_90a's features are on
  for (const n of [64, 128, 256]) for (const t of ['bf16', 'f16']) expect(w4a16WgSource).toContain(`wgmma.mma_async.sync.aligned.m64n${n}k16.f32.${t}.${t}`);
  expect(w4a16WgSource).toContain('__CUDA_ARCH_FEAT_SM90_ALL');
});
