/**
 * Lathe's fused cross-entropy CUDA source run on the CPU (test/emulation/emu.h: a std::thread per CUDA
 * thread, the warp shuffles and the block's fixed merge order of the kernels) against the log-sum-exp,
 * target log-prob, entropy and d(logits) computed in double from the same rounded logits: the
 * vectorised row loop with its two loads in flight and element-wise tail, unaligned rows (odd V) read
 * element by element, temperature, ignored targets, −∞ logits. Needs g++ (C++20); the device check
 * (tools/bench/kernels/ce-check.ts) tests the real build.
 */
import { execFileSync } from 'node:child_process';
import { crossEntropySource } from '@lathe/kernels';
import { buildHarness } from './emulation/build';

let harness = '';

beforeAll(() => {
  harness = buildHarness('ce', { 'ce.cu': crossEntropySource }, 'cross-entropy-harness.cpp');
}, 120_000);

interface Err {
  max_err: number;
  max_ref: number;
}
type Result = Record<'lse' | 'logp' | 'entropy' | 'dx', Err> & { ignored_zero: boolean };

/** `targets`: one per row (outside [0, V): ignored), or 'x' for every row: no targets (the log-sum-exp kernels' use). */
function run(dtype: 'bf16' | 'fp16' | 'fp32', entropy: boolean, V: number, temperature: number, negInf: boolean, targets: (number | 'x')[], maskedRows = false): Result {
  const env = maskedRows ? { ...process.env, CE_MASKED_ROWS: '1' } : process.env;
  return JSON.parse(execFileSync(harness, [dtype, entropy ? 1 : 0, V, temperature, negInf ? 1 : 0, ...targets].map(String), { encoding: 'utf8', env })) as Result;
}

// The statistics are fp32 from the exact inputs (fp32 sums over V terms, __expf); d(logits) is rounded
// to the logits' dtype once: bf16 keeps 8 significant bits (2⁻⁹ relative), fp16 11 (2⁻¹²).
const dxTolerance = { bf16: 2 ** -8, fp16: 2 ** -11, fp32: 2e-6 };

function expectClose(r: Result, dtype: 'bf16' | 'fp16' | 'fp32', entropy: boolean, withTargets = true): void {
  expect(r.lse.max_err).toBeLessThanOrEqual(2e-6 * r.lse.max_ref);
  if (withTargets) {
    expect(r.logp.max_err).toBeLessThanOrEqual(2e-6 * r.lse.max_ref);
    expect(r.logp.max_ref).toBeGreaterThan(1);
  }
  if (entropy) {
    expect(r.entropy.max_ref).toBeGreaterThan(0.5);
    expect(r.entropy.max_err).toBeLessThanOrEqual(2e-6 * r.lse.max_ref);
  }
  expect(r.dx.max_ref).toBeGreaterThan(0.5);
  expect(r.dx.max_err).toBeLessThanOrEqual(dxTolerance[dtype] * r.dx.max_ref);
  expect(r.ignored_zero).toBe(true);
}

test('bf16 with entropy at V = 9,496 (a Qwen3 vocabulary chunk): 1,187 vectors a row, the two-load loop twice, then one load for some threads; an ignored target, the last id', () => {
  expectClose(run('bf16', true, 9496, 1, false, [3, 9495, -100, 17]), 'bf16', true);
}, 60_000);

test('fp16 without entropy at temperature 0.7: odd V (rows after the first unaligned, read element-wise), −∞ logits in row 0', () => {
  expectClose(run('fp16', false, 1001, 0.7, true, [1, -1, 1000]), 'fp16', false);
}, 60_000);

test('fp32 with entropy at temperature 1.3: 4-wide vectors with a ragged tail, a target past V ignored', () => {
  expectClose(run('fp32', true, 3001, 1.3, false, [5, 3000, 3001, 2]), 'fp32', true);
}, 60_000);

test('bf16, a row shorter than one vector per thread, with −∞ logits and entropy', () => {
  expectClose(run('bf16', true, 136, 1, true, [2, 135]), 'bf16', true);
}, 60_000);

test('no targets (the chunked heads\' log-sum-exp and entropy), bf16 at V = 9,496, every 4th row masked (zero upstream gradients: zeros written, logits unread)', () => {
  expectClose(run('bf16', true, 9496, 1, false, ['x', 'x', 'x', 'x', 'x', 'x', 'x', 'x'], true), 'bf16', true, false);
}, 60_000);

test('fp16 with targets and masked rows, odd V: the masked rows\' zeros through the element-wise path too', () => {
  expectClose(run('fp16', false, 1001, 1, false, [1, 2, -100, 999, 5, 6, 7, 8], true), 'fp16', false);
}, 60_000);
