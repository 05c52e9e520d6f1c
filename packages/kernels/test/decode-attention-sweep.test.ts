/**
 * The split kernel's tuning sweep as source (tools/bench/kernels/decode-check.ts --phases sweep builds
 * and times it on the device): one entry per variant of the space, names unique, the default variant
 * (today's plan) the same `da_split` instantiation and bound a step's build launches, a
 * float32 combine per chunk; variants that cannot be built are named. Needs g++ for the syntax check.
 */
import { execFileSync } from 'node:child_process';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import {
  DECODE_SWEEP_SPACE,
  decodeAttentionSourceFor,
  decodeKernelName,
  decodeSplitDefaultVariant,
  decodeSplitSmem,
  decodeSplitSweepSource,
  decodeSplitSweepVariants,
  decodeSplitVariantInvalid,
  decodeSweepCombineName,
  decodeSweepKernelName,
} from '@lathe/kernels';

const entries = (source: string) => [...source.matchAll(/extern "C" __global__ void __launch_bounds__\(([^)]*)\) (\w+)\(([^{]*)\) \{ (.*) \}/g)].map((m) => ({ bounds: m[1], name: m[2], params: m[3], body: m[4] }));

test('the space: e4m3 3 chunks × 2 widths × 3 unrolls × 3 bounds, bf16 3 × 1 × 3 × 3; the default first, each variant once', () => {
  const fp8 = decodeSplitSweepVariants('float8e4m3', 2, 128);
  const bf16 = decodeSplitSweepVariants('native', 4, 128);
  expect(fp8.length).toBe(3 * 2 * 3 * 3);
  expect(bf16.length).toBe(3 * 1 * 3 * 3);
  expect(fp8[0]).toEqual({ cache: 'float8e4m3', dtype: 'bfloat16', headDim: 128, group: 2, chunk: 512, elems: 8, unroll: 8, minBlocks: 8 });
  expect(bf16[0]).toEqual(decodeSplitDefaultVariant('native', 4, 128));
  expect(new Set(fp8.map(decodeSweepKernelName)).size).toBe(fp8.length);
  expect(new Set(bf16.map(decodeSweepKernelName)).size).toBe(bf16.length);
  expect(DECODE_SWEEP_SPACE.unroll).toEqual([2, 4, 8]);
  // past G 4 the e4m3 default takes 8 elements a thread
  expect(decodeSplitDefaultVariant('float8e4m3', 5, 128).elems).toBe(8);
});

test('the sweep source: an entry per variant with its template arguments and bound, a float32 combine per chunk', () => {
  const variants = [...decodeSplitSweepVariants('float8e4m3', 2, 128), ...decodeSplitSweepVariants('native', 2, 128), ...decodeSplitSweepVariants('float8e4m3', 4, 128), ...decodeSplitSweepVariants('native', 4, 128)];
  const source = decodeSplitSweepSource(variants);
  const es = entries(source);
  const splits = es.filter((e) => e.name.startsWith('da_sweep_') && !e.name.startsWith('da_sweep_combine'));
  expect(splits.map((e) => e.name)).toEqual(variants.map(decodeSweepKernelName));
  expect(new Set(es.map((e) => e.name)).size).toBe(es.length);
  expect(es.filter((e) => e.name.startsWith('da_sweep_combine')).map((e) => e.name).sort()).toEqual([64, 128, 256, 512].map((c) => decodeSweepCombineName(128, c)).sort());
  const one = splits.find((e) => e.name === 'da_sweep_fp8_d128_g4_c512_e8_u2_b8')!;
  expect(one.bounds).toBe('DA_THREADS, 8');
  expect(one.body).toMatch(/^da_split<unsigned char, 128, 4, 512, 8, float, false, 2>\(/);
  const bf = splits.find((e) => e.name === 'da_sweep_bf16_d128_g2_c64_e8_u8_b0')!;
  expect(bf.bounds).toBe('DA_THREADS');
  expect(bf.body).toMatch(/^da_split<__nv_bfloat16, 128, 2, 64, 8, float, false, 8>\(/);
  // the default variant: the step's build of today's plan — the same parameters, template arguments and bound
  const main = entries(decodeAttentionSourceFor({ groups: [2] }));
  for (const cache of ['native', 'float8e4m3'] as const) {
    const def = splits.find((e) => e.name === decodeSweepKernelName(decodeSplitDefaultVariant(cache, 2, 128)))!;
    const step = main.find((e) => e.name === decodeKernelName.split('bfloat16', cache, 128, 2))!;
    expect(def.bounds).toBe(step.bounds);
    expect(def.params).toBe(step.params);
    expect(def.body).toBe(step.body);
  }
  expect(source).toContain('template <> __device__ __forceinline__ float da_t<float>(float x) { return x; }');
  // its shared memory follows the variant's chunk
  expect(decodeSplitSmem(128, 4, 'float8e4m3', 512)).toBe(4 * (4 * 512 + 8 + 4 * 4 * 128 + 2 * 512));
});

test('variants that cannot be built are named', () => {
  const def = decodeSplitDefaultVariant('native', 2, 128);
  expect(decodeSplitVariantInvalid(def)).toBeUndefined();
  expect(decodeSplitVariantInvalid({ ...def, elems: 16 })).toMatch(/32 bytes/);
  expect(decodeSplitVariantInvalid({ ...def, cache: 'float8e4m3', elems: 4 })).toMatch(/4 bytes/);
  expect(decodeSplitVariantInvalid({ ...def, group: 9 })).toMatch(/group 9/);
  expect(() => decodeSplitSweepSource([{ ...def, elems: 16 }])).toThrow(/da_sweep_bf16_d128_g2_c256_e16_u4_b8: 16 elements a thread are 32 bytes/);
});

test('the sweep source compiles as C++ (g++ over the emulation headers, every variant instantiated)', () => {
  const dir = mkdtempSync(join(tmpdir(), 'lathe-sweep-'));
  const variants = [...decodeSplitSweepVariants('float8e4m3', 4, 128).filter((v) => v.minBlocks === 0), ...decodeSplitSweepVariants('native', 2, 128).filter((v) => v.minBlocks === 0)];
  // emu.h has no __launch_bounds__ or e4m3 converters: stand-ins, so this checks the templates and entries, not CUDA codegen
  const prelude = ['#include "emu.h"', '#define DA_EMULATION 1', '#define DA_SHARED(name) unsigned char* name = emu::t_smem', 'struct alignas(8) uint2 { unsigned x, y; };', 'struct float2 { float x, y; };', 'inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }', 'inline unsigned char fp8_from(float) { return 0; }', 'inline float2 fp8x2_to(unsigned short) { return {0.0f, 0.0f}; }'].join('\n');
  writeFileSync(join(dir, 'sweep.cpp'), `${prelude}\n${decodeSplitSweepSource(variants).replace(/__launch_bounds__\([^)]*\) /g, '')}\nint main() { return 0; }\n`);
  const here = join(__dirname, 'emulation');
  execFileSync('g++', ['-std=c++20', '-fsyntax-only', `-I${here}`, join(dir, 'sweep.cpp')], { stdio: 'pipe' });
}, 120_000);
