/**
 * Lathe's RoPE CUDA source run on the CPU (test/emulation/emu.h: a std::thread per CUDA thread)
 * against the rotation computed in double from the same rounded inputs: bf16, fp16 and fp32 (8 and 4
 * values a 16-byte vector), headDim 64 and 128, odd row and head counts, several blocks with a
 * partial last one, the inverse rotation (sign −1, the gradient), position ids clamped at both ends,
 * and nothing written past the output. Needs g++ (C++20).
 */
import { execFileSync } from 'node:child_process';
import { ropeSource } from '@lathe/kernels';
import { buildHarness } from './emulation/build';

let harness = '';

beforeAll(() => {
  harness = buildHarness('rope', { 'rope.cu': ropeSource }, 'rope-harness.cpp');
}, 120_000);

interface Result {
  max_err: number;
  max_ref: number;
  items: number;
  guard_ok: boolean;
}

function run(dtype: 'bf16' | 'fp16' | 'fp32', rows: number, heads: number, headDim: number, sign: 1 | -1, maxPositions = 40): Result {
  return JSON.parse(execFileSync(harness, [dtype, rows, heads, headDim, maxPositions, sign].map(String), { encoding: 'utf8' })) as Result;
}

// fp32 math rounded once to the output dtype: bf16 keeps 8 significant bits, fp16 11.
const tolerance = { bf16: 2 ** -8, fp16: 2 ** -11, fp32: 1e-6 };

test.each([
  ['bf16', 7, 3, 128, 1],
  ['bf16', 37, 5, 64, -1],
  ['fp16', 9, 2, 128, -1],
  ['fp32', 37, 4, 64, 1],
  ['fp32', 5, 3, 128, -1],
] as const)('%s: %i rows × %i heads of headDim %i, sign %i', (dtype, rows, heads, headDim, sign) => {
  const r = run(dtype, rows, heads, headDim, sign);
  expect(r.items).toBe(rows * heads * (headDim / 2 / (dtype === 'fp32' ? 4 : 8)));
  expect(r.max_ref).toBeGreaterThan(1);
  expect(r.max_err).toBeLessThanOrEqual(tolerance[dtype] * r.max_ref);
  expect(r.guard_ok).toBe(true);
}, 60_000);
