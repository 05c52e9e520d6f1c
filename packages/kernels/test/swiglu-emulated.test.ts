/**
 * Lathe's SwiGLU CUDA source run on the CPU (test/emulation/emu.h: a std::thread per CUDA thread)
 * against y = silu(g)·u and its gradients computed in double from the same rounded inputs: bf16,
 * fp16 and fp32 (8 and 4 values a 16-byte vector), sizes with a ragged tail (n not a multiple of the
 * vector) and several blocks with a partial last one, σ saturated both ways, and nothing written
 * past any output; the packed forward (one gu [rows, 2·I]) equal to the forward bit for bit, by
 * vectors where I allows and by elements where it does not. Needs g++ (C++20).
 */
import { execFileSync } from 'node:child_process';
import { swigluSource } from '@lathe/kernels';
import { buildHarness } from './emulation/build';

let harness = '';

beforeAll(() => {
  harness = buildHarness('swiglu', { 'swiglu.cu': swigluSource }, 'swiglu-harness.cpp');
}, 120_000);

interface Err {
  max_err: number;
  max_ref: number;
  max_rel: number;
  finite: boolean;
}
interface Result {
  items: number;
  tail: number;
  y: Err;
  dg: Err;
  du: Err;
  guard_ok: boolean;
}

function run(dtype: 'bf16' | 'fp16' | 'fp32', n: number): Result {
  return JSON.parse(execFileSync(harness, [dtype, String(n)], { encoding: 'utf8' })) as Result;
}

// fp32 math rounded once to the output dtype: bf16 keeps 8 significant bits, fp16 11; each element
// within one rounding (and fp32's own error) of the size of its terms (see the harness's max_rel).
const tolerance = { bf16: 2 ** -8 * (1 + 2 ** -8), fp16: 2 ** -11 * (1 + 2 ** -8), fp32: 2e-6 };

test.each([
  ['bf16', 8 * 300],
  ['bf16', 8 * 37 + 5],
  ['fp16', 8 * 70 + 7],
  ['fp32', 4 * 300 + 3],
  ['fp32', 7],
] as const)('%s: %i elements', (dtype, n) => {
  const r = run(dtype, n);
  const vec = dtype === 'fp32' ? 4 : 8;
  expect([r.items, r.tail]).toEqual([Math.floor(n / vec) + (n % vec), n % vec]);
  for (const out of [r.y, r.dg, r.du]) {
    expect(out.finite).toBe(true);
    expect(out.max_ref).toBeGreaterThan(0.1);
    expect(out.max_rel).toBeLessThanOrEqual(tolerance[dtype]);
  }
  expect(r.guard_ok).toBe(true);
}, 60_000);

interface PackedResult {
  vec: boolean;
  threads: number;
  equal: boolean;
  max_ref: number;
  guard_ok: boolean;
}

// The packed forward (gu [rows, 2·I], gate then up) against the forward on the same values held apart.
test.each([
  ['bf16', 5, 64, true],
  ['bf16', 3, 8 * 37, true],
  ['bf16', 4, 8 * 9 + 3, false],
  ['fp16', 7, 40, true],
  ['fp16', 2, 13, false],
  ['fp32', 6, 4 * 33, true],
  ['fp32', 3, 4 * 25 + 2, false],
] as const)('packed %s, %i rows of I = %i: y equals the forward’s bit for bit (16-byte vectors: %s), nothing past y', (dtype, rows, I, vec) => {
  const r = JSON.parse(execFileSync(harness, ['packed', dtype, String(rows), String(I)], { encoding: 'utf8' })) as PackedResult;
  expect(r.vec).toBe(vec);
  expect(r.threads).toBe(rows * (vec ? I / (dtype === 'fp32' ? 4 : 8) : I));
  expect(r.max_ref).toBeGreaterThan(0.1);
  expect(r.equal).toBe(true);
  expect(r.guard_ok).toBe(true);
}, 60_000);
