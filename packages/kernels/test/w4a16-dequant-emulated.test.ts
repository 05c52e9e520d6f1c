/**
 * Lathe's W4A16 dequantize kernels (the INT4 pipeline's, `w4a16DequantSource`) run on the CPU
 * (test/emulation/emu.h) against a per-element decode of MatMulNBits' layout: every weight equal bit
 * for bit, for bf16 and fp16, block sizes 32/64/128, zero points or the default 8, K padded to whole
 * blocks, rows that end mid-step (K/8 not a multiple of a warp's 128 words) or take several steps, a grid
 * smaller than the work (the grid-stride loop), and nothing written past W. Needs g++ (C++20).
 */
import { execFileSync } from 'node:child_process';
import { w4a16DequantSource } from '@lathe/kernels';
import { buildHarness } from './emulation/build';

let harness = '';

beforeAll(() => {
  harness = buildHarness('w4d', { 'w4a16-dequant.cu': w4a16DequantSource }, 'w4a16-dequant-harness.cpp');
}, 120_000);

test.each([
  ['bf16', 24, 192, 32, 0, 2],
  ['bf16', 17, 200, 128, 1, 3],
  ['fp16', 9, 256, 64, 1, 1],
  ['bf16', 5, 40, 32, 1, 4],
  ['fp16', 130, 64, 32, 0, 2],
  ['bf16', 6, 2112, 64, 1, 3],
  ['fp16', 3, 1024, 128, 0, 1],
] as const)('%s: N %i, K %i, block %i, zero points %i, grid %i', (dtype, N, K, bs, zp, grid) => {
  const r = JSON.parse(execFileSync(harness, [dtype, String(N), String(K), String(bs), String(zp), String(grid)], { encoding: 'utf8' })) as { weights: number; bad: number; largest: number; guard_ok: boolean };
  expect(r.weights).toBe(N * K);
  expect(r.largest).toBeGreaterThan(0.01);
  expect(r.bad).toBe(0);
  expect(r.guard_ok).toBe(true);
});

test.each([
  ['bf16', 3, [[24, 64, 32, 1], [8, 64, 32, 1], [40, 64, 64, 0], [16, 1088, 64, 1]]],
  ['fp16', 2, [[6, 200, 128, 1], [9, 40, 32, 0]]],
  ['bf16', 1, [[5, 96, 32, 0]]],
] as const)('one launch for several weights (w4a16_dequant4, %s, grid %i): each written at its own place in one buffer, bit for bit', (dtype, grid, specs) => {
  const r = JSON.parse(execFileSync(harness, ['group', dtype, String(grid), ...specs.flat().map(String)], { encoding: 'utf8' })) as { weights: number; bad: number; largest: number; guard_ok: boolean };
  expect(r.weights).toBe(specs.reduce((n, [N, K]) => n + N * K, 0));
  expect(r.largest).toBeGreaterThan(0.01);
  expect(r.bad).toBe(0);
  expect(r.guard_ok).toBe(true);
});
