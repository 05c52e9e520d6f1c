/**
 * Lathe's decode-attention CUDA source run on the CPU (test/emulation/emu.h: a std::thread per CUDA
 * thread, barriers, warp shuffles; test/emulation/decode-harness.cpp adds e4m3 by bit arithmetic)
 * against the step computed in double: the append (QK-norm, RoPE at each row's position, the new
 * key/value written or quantized in place, every other position untouched), the split over its
 * chunks (the plan's: 256 positions native and 512 e4m3 up to G 4, 128 and 256 past it) with rows ending mid-chunk, past and on a chunk boundary,
 * at length 1 and at the cache length, and the log-sum-exp merge; for e4m3 caches the prefill's
 * quantize kernel against the same per-vector rule. Every head size and power-of-two group for both cache kinds
 * (and G 3, 5, 6, 7 at head size 128, 3 and 6 at 64: groups that are not a power of two),
 * launched with the TypeScript plan's chunk, elements a thread, passes in flight and shared bytes; the append on q/k/v
 * packed in one projection (row strides) equal to the plain one bit for bit; the split with the combine
 * folded in (the last CTA of a row merges) equal to split + combine bit for bit, its counters back to 0
 * after each of two launches (the second in reverse block order, four CTAs at a time), one merging CTA
 * per (row, KV head). Needs g++ (C++20);
 * the device check (tools/bench/kernels/decode-check.ts) tests the real build.
 */
import { execFileSync } from 'node:child_process';
import { DECODE_GROUPS, DECODE_HEAD_DIMS, DECODE_TYPES, decodeAttentionCore, decodeAttentionSource, decodeAttentionSourceFor, decodeKernelName, decodeSplitChunk, decodeSplitChunks, decodeSplitPlan, decodeSplitSmem, type DecodeCacheKind } from '@lathe/kernels';
import { buildHarness } from './emulation/build';

let harness = '';

beforeAll(() => {
  harness = buildHarness('decode', { 'da.cu': decodeAttentionCore }, 'decode-harness.cpp');
}, 300_000);

interface Err {
  max_err: number;
  max_ref: number;
}
type Result = Record<'out' | 'q' | 'k_new' | 'v_new', Err> & { untouched: boolean; quantize_equal: boolean; packed_equal: boolean; fused_equal: boolean; counters_zero: boolean; counts_exact: boolean; chunks: number };
type Cache = 'native' | 'fp8';
const kindOf = (cache: Cache): DecodeCacheKind => (cache === 'fp8' ? 'float8e4m3' : 'native');

function run(R: number, KV: number, G: number, D: number, dtype: 'bf16' | 'fp16', cache: Cache, M: number, qkNorm: boolean, lens: number[]): Result {
  const kind = kindOf(cache);
  const plan = decodeSplitPlan(G, kind);
  const args = [R, KV, G, D, dtype, cache, M, qkNorm ? 1 : 0, plan.chunk, plan.elems, plan.unroll, decodeSplitSmem(D, G, kind), ...lens];
  return JSON.parse(execFileSync(harness, args.map(String), { encoding: 'utf8' })) as Result;
}

// The output is rounded to T once (bf16 2⁻⁹ relative, fp16 2⁻¹²) after fp32 accumulation.
const tolerance = { bf16: 4e-3, fp16: 1e-3 };

function expectClose(r: Result, dtype: 'bf16' | 'fp16', cache: Cache): void {
  expect(r.out.max_ref).toBeGreaterThan(0.1);
  expect(r.out.max_err).toBeLessThanOrEqual(tolerance[dtype] * r.out.max_ref);
  // q and a native cache's new key hold the reference's T values exactly (the same roundings in float and in double)
  expect(r.q.max_err).toBe(0);
  // e4m3 keeps 3 mantissa bits: half a step is 2⁻⁴ of the value, at most 2⁻⁴ of the vector's amax
  expect(r.k_new.max_err).toBeLessThanOrEqual(cache === 'fp8' ? r.k_new.max_ref / 16 : 0);
  expect(r.v_new.max_err).toBeLessThanOrEqual(cache === 'fp8' ? r.v_new.max_ref / 16 : 0);
  expect(r.untouched).toBe(true);
  // the prefill's quantize kernel writes the bytes and scales of the append's rule (true for native caches: nothing to check)
  expect(r.quantize_equal).toBe(true);
  // the append on q/k/v packed in one [R, (H + 2·KV)·D] buffer (DecodeAttentionPacked) writes the same cache, scales and queries, bit for bit
  expect(r.packed_equal).toBe(true);
  // the split with the combine folded in (run twice on the same counters, the second in reverse block order, 4 CTAs at a time) writes split + combine's output bit for bit and leaves every counter 0
  expect(r.fused_equal).toBe(true);
  expect(r.counters_zero).toBe(true);
  // each (row, KV head)'s counter returned 0 … chunks − 1 once each: exactly one CTA merged
  expect(r.counts_exact).toBe(true);
}

describe.each(['native', 'fp8'] as const)('bf16, %s cache, QK-norm, cache length one chunk and 172', (cache) => {
  // the harness's builds: powers of two at both head sizes, the others at 128 and either side of the plans' switch at 64
  const groupsAt: Record<number, number[]> = { 128: [...DECODE_GROUPS], 64: [1, 2, 3, 4, 6, 8] };
  for (const D of DECODE_HEAD_DIMS) {
    for (const G of groupsAt[D]) {
      const chunk = decodeSplitChunk(kindOf(cache), G);
      const M = chunk + 172;
      test(`head size ${D}, G ${G}: rows at the cache length ${M}, one past and on the ${chunk} boundary, at 1, mid-chunk`, () => {
        const KV = G <= 2 || G === 5 ? 2 : 1;
        const r = run(5, KV, G, D, 'bf16', cache, M, true, [M, chunk + 1, chunk, 1, 77]);
        expect(r.chunks).toBe(Math.ceil(M / chunk));
        expectClose(r, 'bf16', cache);
      }, 60_000);
    }
  }
});

test('fp16, head size 64, four query heads per KV head, no QK-norm, native and e4m3; a cache shorter than one e4m3 chunk', () => {
  expectClose(run(2, 1, 4, 64, 'fp16', 'native', 200, false, [200, 60]), 'fp16', 'native');
  const r = run(3, 1, 4, 64, 'fp16', 'fp8', 200, false, [200, 60, 1]);
  expect(r.chunks).toBe(1);
  expectClose(r, 'fp16', 'fp8');
}, 60_000);

test('fp16, head size 128, G 2, QK-norm, native and e4m3', () => {
  expectClose(run(3, 2, 2, 128, 'fp16', 'native', 260, true, [260, 129, 1]), 'fp16', 'native');
  expectClose(run(3, 2, 2, 128, 'fp16', 'fp8', 260, true, [260, 257, 1]), 'fp16', 'fp8');
}, 60_000);

test('the fused combine: a row of length 0 gets zeros, rows of one chunk, several and the maximum, both cache kinds', () => {
  for (const cache of ['native', 'fp8'] as const) {
    const chunk = decodeSplitChunk(kindOf(cache), 2);
    const r = run(4, 2, 2, 128, 'bf16', cache, 2 * chunk + 10, false, [0, chunk, 2 * chunk + 10, chunk + 5]);
    expect(r.chunks).toBe(3);
    expect(r.fused_equal).toBe(true);
    expect(r.counters_zero).toBe(true);
    expect(r.counts_exact).toBe(true);
  }
}, 60_000);

test('the plan: up to G 4 the sweep winners (e4m3 512 positions, 8 passes; native 256, 4 passes, 8 CTAs an SM), past it 256 / 128 positions', () => {
  for (const G of [1, 2]) expect(decodeSplitPlan(G, 'float8e4m3')).toEqual({ chunk: 512, elems: 8, unroll: 8, minBlocks: 8 });
  for (const G of [3, 4]) expect(decodeSplitPlan(G, 'float8e4m3')).toEqual({ chunk: 512, elems: 8, unroll: 8, minBlocks: 0 });
  for (const G of [5, 6, 7, 8]) expect(decodeSplitPlan(G, 'float8e4m3')).toEqual({ chunk: 256, elems: 8, unroll: 4, minBlocks: 0 });
  for (const G of [1, 2, 3, 4]) expect(decodeSplitPlan(G, 'native')).toEqual({ chunk: 256, elems: 8, unroll: 4, minBlocks: 8 });
  expect(decodeSplitPlan(7, 'native')).toEqual({ chunk: 128, elems: 8, unroll: 4, minBlocks: 0 });
  expect(decodeSplitChunks()).toEqual([128, 256, 512]);
  // G 5 at 128: nothing rounds up to a power of two
  expect(decodeSplitSmem(128, 5, 'float8e4m3')).toBe(4 * (5 * 256 + 10 + 4 * 5 * 128 + 2 * 256));
  // scores [G][chunk], max/sum [G][2], 4 warps' partials [4][G][D], e4m3 scales [2][chunk]
  expect(decodeSplitSmem(128, 2, 'float8e4m3')).toBe(4 * (2 * 512 + 4 + 4 * 2 * 128 + 2 * 512));
  expect(decodeSplitSmem(64, 8, 'native')).toBe(4 * (8 * 128 + 16 + 4 * 8 * 64));
  // every build fits the 48 KB a kernel takes without opting in
  for (const G of DECODE_GROUPS) for (const D of DECODE_HEAD_DIMS) for (const c of ['native', 'float8e4m3'] as const) expect(decodeSplitSmem(D, G, c)).toBeLessThanOrEqual(48 * 1024);
});

test('the source has an entry point for exactly the kernels a step, quantize and copy launch', () => {
  const want = new Set<string>([decodeKernelName.copy()]);
  for (const t of Object.keys(DECODE_TYPES) as (keyof typeof DECODE_TYPES)[]) {
    for (const D of DECODE_HEAD_DIMS) {
      want.add(decodeKernelName.quantize(t, D));
      for (const cache of ['native', 'float8e4m3'] as const) {
        want.add(decodeKernelName.append(t, cache, D));
        for (const chunk of decodeSplitChunks()) want.add(decodeKernelName.combine(t, D, chunk));
        for (const G of DECODE_GROUPS) {
          want.add(decodeKernelName.split(t, cache, D, G));
          want.add(decodeKernelName.splitFused(t, cache, D, G));
        }
      }
    }
  }
  const have = entries(decodeAttentionSource);
  expect(have.length).toBe(new Set(have).size);
  expect(new Set(have)).toEqual(want);
  // G 5 (Qwen3-14B's 40/8) among them, for both cache kinds
  for (const name of ['da_split_bf16_d128_g5', 'da_split_fp8_d128_g5', 'da_splitc_bf16_d128_g5', 'da_splitc_fp8_bf16_d128_g5', 'da_splitc_fp16_d64_g5']) expect(have).toContain(name);
  expect(DECODE_GROUPS).toEqual([1, 2, 3, 4, 5, 6, 7, 8]);
});

const entries = (source: string) => [...source.matchAll(/extern "C" __global__ void __launch_bounds__\([^)]*\) (\w+)\(/g)].map((m) => m[1]);

test('a module of some groups has their splits and every other kernel; groups outside 1..8 are refused', () => {
  const all = entries(decodeAttentionSource);
  const g5 = entries(decodeAttentionSourceFor({ groups: [5] }));
  const isSplit = (n: string) => /^da_splitc?_/.test(n);
  expect(g5.filter((n) => !isSplit(n))).toEqual(all.filter((n) => !isSplit(n)));
  expect(g5.filter(isSplit).every((n) => n.endsWith('_g5'))).toBe(true);
  // per type and head size: native split, native fused, e4m3 fused; e4m3 split per head size
  expect(g5.filter(isSplit).length).toBe(2 * 2 * 3 + 2);
  expect(decodeAttentionSourceFor({ groups: [5, 2, 5] })).toBe(decodeAttentionSourceFor({ groups: [2, 5] }));
  expect(decodeAttentionSourceFor()).toBe(decodeAttentionSource);
  expect(() => decodeAttentionSourceFor({ groups: [9] })).toThrow(/no build for 9 query heads per KV head \(the kernels take 1, 2, 3, 4, 5, 6, 7, 8\)/);
  expect(() => decodeAttentionSourceFor({ groups: [] })).toThrow(/groups is empty/);
});
