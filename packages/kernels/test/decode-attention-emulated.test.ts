/**
 * Lathe's decode-attention CUDA source run on the CPU (test/emulation/emu.h: a std::thread per CUDA
 * thread, barriers, warp shuffles; test/emulation/decode-harness.cpp adds e4m3 by bit arithmetic)
 * against the step computed in double: the append (QK-norm, RoPE at each row's position, the new
 * key/value written or quantized in place, every other position untouched), the split over
 * DA_CHUNK-position chunks with rows ending mid-chunk, on a chunk boundary and at length 1, and the
 * log-sum-exp merge; for e4m3 caches the prefill's quantize kernel against the same per-vector rule.
 * Both split variants; v2 over every head size and group, launched with the TypeScript plan's chunk,
 * elements a thread and shared bytes. Needs g++ (C++20); the device check (tools/bench/kernels/decode-check.ts) tests the real build.
 */
import { execFileSync } from 'node:child_process';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { DECODE_CHUNK, decodeAttentionCore, decodeSplitPlan, decodeSplitSmem, type DecodeSplitVariant } from '@lathe/kernels';

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

function run(R: number, KV: number, G: number, D: number, dtype: 'bf16' | 'fp16', cache: 'native' | 'fp8', M: number, qkNorm: boolean, lens: number[], split: DecodeSplitVariant = 'v1'): Result {
  const kind = cache === 'fp8' ? 'float8e4m3' : 'native';
  const plan = decodeSplitPlan(D, G, kind, split);
  const args = [R, KV, G, D, dtype, cache, M, qkNorm ? 1 : 0, split, plan.chunk, plan.elems, decodeSplitSmem(D, G, kind, split), ...lens];
  return JSON.parse(execFileSync(harness, args.map(String), { encoding: 'utf8' })) as Result;
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

describe('split v2', () => {
  // e4m3: 256-position chunks; M 300 puts rows over 2 chunks, ending past a boundary (257, 300), on it (256), mid-chunk, at 1 and at M.
  for (const D of [64, 128]) {
    for (const G of [1, 2, 4, 8]) {
      test(`bf16, e4m3 cache, head size ${D}, G ${G}: rows at M, past and on the 256 boundary, mid-chunk, length 1`, () => {
        const KV = G <= 2 ? 2 : 1;
        const r = run(5, KV, G, D, 'bf16', 'fp8', 300, true, [300, 257, 256, 1, 77], 'v2');
        expect(r.chunks).toBe(2);
        expectClose(r, 'bf16', 'fp8');
      }, 60_000);
    }
  }

  test('bf16, native cache (128-position chunks), head sizes 128 and 64, G 2 and 8', () => {
    const r = run(5, 2, 2, 128, 'bf16', 'native', 300, true, [300, 129, 128, 1, 77], 'v2');
    expect(r.chunks).toBe(3);
    expectClose(r, 'bf16', 'native');
    expectClose(run(3, 1, 8, 64, 'bf16', 'native', 200, false, [200, 128, 1], 'v2'), 'bf16', 'native');
  }, 60_000);

  test('fp16, head size 64, G 4, native and e4m3; a cache shorter than one e4m3 chunk', () => {
    expectClose(run(2, 1, 4, 64, 'fp16', 'native', 200, false, [200, 60], 'v2'), 'fp16', 'native');
    const r = run(3, 1, 4, 64, 'fp16', 'fp8', 200, false, [200, 60, 1], 'v2');
    expect(r.chunks).toBe(1);
    expectClose(r, 'fp16', 'fp8');
  }, 60_000);

  test('the e4m3 plan: 16 elements a thread up to G 4, 8 past it; chunks of 256', () => {
    expect(decodeSplitPlan(128, 4, 'float8e4m3', 'v2')).toEqual({ chunk: 256, elems: 16, partialRows: 4 });
    expect(decodeSplitPlan(128, 8, 'float8e4m3', 'v2')).toEqual({ chunk: 256, elems: 8, partialRows: 4 });
    expect(decodeSplitPlan(128, 2, 'native', 'v2')).toEqual({ chunk: 128, elems: 8, partialRows: 4 });
    expect(decodeSplitPlan(128, 2, 'float8e4m3', 'v1')).toEqual({ chunk: DECODE_CHUNK, elems: 8, partialRows: 8 });
  });
});
