/**
 * Lathe's decode-attention CUDA source run on the CPU (test/emulation/emu.h: a std::thread per CUDA
 * thread, barriers, warp shuffles; test/emulation/decode-harness.cpp adds e4m3 by bit arithmetic)
 * against the step computed in double: the append (QK-norm, RoPE at each row's position, the new
 * key/value written or quantized in place, every other position untouched), the split over
 * DA_CHUNK-position chunks with rows ending mid-chunk, on a chunk boundary and at length 1, and the
 * log-sum-exp merge; for e4m3 caches the prefill's quantize kernel against the same per-vector rule. Needs g++ (C++20); the device check (tools/bench/kernels/decode-check.ts) tests the real build.
 */
import { execFileSync } from 'node:child_process';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { DECODE_CHUNK, decodeAttentionCore } from '@lathe/kernels';

const here = join(__dirname, 'emulation');
let harness = '';

beforeAll(() => {
  const dir = mkdtempSync(join(tmpdir(), 'lathe-decode-'));
  writeFileSync(join(dir, 'da.cu'), decodeAttentionCore);
  harness = join(dir, 'decode-harness');
  execFileSync('g++', ['-std=c++20', '-O1', '-pthread', `-I${here}`, `-I${dir}`, '-o', harness, join(here, 'decode-harness.cpp')], { stdio: 'pipe' });
}, 120_000);

interface Err {
  max_err: number;
  max_ref: number;
}
type Result = Record<'out' | 'q' | 'k_new' | 'v_new', Err> & { untouched: boolean; quantize_equal: boolean; chunks: number };

function run(R: number, KV: number, G: number, D: number, dtype: 'bf16' | 'fp16', cache: 'native' | 'fp8', M: number, qkNorm: boolean, lens: number[]): Result {
  return JSON.parse(execFileSync(harness, [R, KV, G, D, dtype, cache, M, qkNorm ? 1 : 0, ...lens].map(String), { encoding: 'utf8' })) as Result;
}

// The output is rounded to T once (bf16 2⁻⁹ relative, fp16 2⁻¹²) after fp32 accumulation.
const tolerance = { bf16: 4e-3, fp16: 1e-3 };

function expectClose(r: Result, dtype: 'bf16' | 'fp16', cache: 'native' | 'fp8'): void {
  expect(r.out.max_ref).toBeGreaterThan(0.1);
  expect(r.out.max_err).toBeLessThanOrEqual(tolerance[dtype] * r.out.max_ref);
  // q and a native cache's new key hold the reference's T values exactly (the same roundings in float and in double)
  expect(r.q.max_err).toBe(0);
  // e4m3 keeps 3 mantissa bits: half a step is 2⁻⁴ of the value, at most 2⁻⁴ of the vector's amax
  const entry = cache === 'fp8' ? r.k_new.max_ref / 16 : 0;
  expect(r.k_new.max_err).toBeLessThanOrEqual(entry);
  expect(r.v_new.max_err).toBeLessThanOrEqual(cache === 'fp8' ? r.v_new.max_ref / 16 : 0);
  expect(r.untouched).toBe(true);
  // the prefill's quantize kernel writes the bytes and scales of the append's rule (true for native caches: nothing to check)
  expect(r.quantize_equal).toBe(true);
}

test(`bf16, head size 128, GQA 2, QK-norm: rows over 3 chunks of ${DECODE_CHUNK}, ending on a chunk boundary, one past it, at length 1`, () => {
  const r = run(5, 2, 2, 128, 'bf16', 'native', 300, true, [300, 129, 128, 1, 77]);
  expect(r.chunks).toBe(3);
  expectClose(r, 'bf16', 'native');
}, 60_000);

test('bf16 with an e4m3 cache: per-vector scales, the new entry quantized by the append', () => {
  expectClose(run(3, 2, 2, 128, 'bf16', 'fp8', 300, true, [300, 130, 5]), 'bf16', 'fp8');
}, 60_000);

test('fp16, head size 64, four query heads per KV head, no QK-norm, native and e4m3', () => {
  expectClose(run(2, 1, 4, 64, 'fp16', 'native', 200, false, [200, 60]), 'fp16', 'native');
  expectClose(run(2, 1, 4, 64, 'fp16', 'fp8', 200, false, [200, 60]), 'fp16', 'fp8');
}, 60_000);

test('no grouping (G 1)', () => {
  expectClose(run(2, 2, 1, 128, 'bf16', 'native', 140, false, [140, 3]), 'bf16', 'native');
}, 60_000);
