/**
 * Lathe's greedy-pick CUDA source run on the CPU (test/emulation/emu.h: a std::thread per CUDA
 * thread, the warp shuffles and the block's fixed merge order) against the first argmax and
 * −log Σ e^(x − max) computed in double from the same rounded logits: bf16, fp16 and fp32; V with a
 * ragged tail and rows starting off a 16-byte boundary (the scalar head); maxima tied at several places
 * (the first wins), an all-equal row, ±1e4 with −∞ entries, values near the type's largest (differences
 * overflowing to −∞), an all −∞ row, NaN and +∞; CTAs of
 * 128 threads (several warps, several vectors a thread) and of the kernel's own 512. Needs g++
 * (C++20); decode-check's pick phase tests the real build.
 */
import { execFileSync } from 'node:child_process';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { GREEDY_PICK_THREADS, greedyPickSource } from '@lathe/kernels';

const here = join(__dirname, 'emulation');
const harness: Record<number, string> = {};

beforeAll(() => {
  const dir = mkdtempSync(join(tmpdir(), 'lathe-greedy-pick-'));
  writeFileSync(join(dir, 'greedy-pick.cu'), greedyPickSource);
  for (const threads of [128, GREEDY_PICK_THREADS]) {
    harness[threads] = join(dir, `harness-${threads}`);
    execFileSync('g++', ['-std=c++20', '-O1', '-pthread', `-DGP_THREADS=${threads}`, `-I${here}`, `-I${dir}`, '-o', harness[threads], join(here, 'greedy-pick-harness.cpp')], { stdio: 'pipe' });
  }
}, 180_000);

interface Result {
  threads: number;
  tokens: number[];
  want: number[];
  tokens_ok: boolean;
  max_err: number;
  nan_ok: boolean;
  guard_ok: boolean;
}

function run(threads: number, dtype: 'bf16' | 'fp16' | 'fp32', V: number, offset: number): Result {
  return JSON.parse(execFileSync(harness[threads], [dtype, String(V), String(offset)], { encoding: 'utf8' })) as Result;
}

test.each([
  [128, 'bf16', 1000, 0],
  [128, 'bf16', 4099, 3],
  [128, 'fp16', 4099, 0],
  [128, 'fp32', 4099, 1],
  [128, 'fp32', 1000, 2],
  [128, 'bf16', 5, 1],
  [GREEDY_PICK_THREADS, 'bf16', 4099, 5],
  [GREEDY_PICK_THREADS, 'fp32', 1000, 0],
] as const)('%i threads, %s, V = %i, rows %i elements past a 16-byte boundary', (threads, dtype, V, offset) => {
  const r = run(threads, dtype, V, offset);
  expect(r.threads).toBe(threads);
  expect(r.tokens).toEqual(r.want);
  expect(r.tokens_ok).toBe(true);
  // the tied row picks its first maximum, the all-equal and all −∞ rows token 0
  if (V > 10) expect([r.want[0], r.want[1], r.want[3]]).toEqual([3, 0, 0]);
  expect(r.max_err).toBeLessThanOrEqual(1e-5);
  expect(r.nan_ok).toBe(true);
  expect(r.guard_ok).toBe(true);
}, 120_000);
