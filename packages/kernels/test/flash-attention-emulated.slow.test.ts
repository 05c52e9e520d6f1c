/**
 * Lathe's flash-attention CUDA source run on the CPU (test/emulation/emu.h stands in for the CUDA
 * subset it uses: a std::thread per CUDA thread, barriers, ldmatrix and mma.sync fragments exchanged
 * across a warp's lanes) against attention and its gradients computed in double: the kernels'
 * indexing, PTX fragment layouts, causal and length masks,
 * GQA head mapping, tiling across several tiles and ragged ends, and padding rows left at zero.
 * Needs g++ (C++20); the device check (tools/bench/kernels/flash-check.ts) tests the real build.
 */
import { execFileSync } from 'node:child_process';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { flashAttentionSource, flashBackwardSmem, flashForwardSmem } from '@lathe/kernels';

const here = join(__dirname, 'emulation');
let harness = '';

beforeAll(() => {
  const dir = mkdtempSync(join(tmpdir(), 'lathe-flash-'));
  writeFileSync(join(dir, 'fa.cu'), flashAttentionSource);
  const sizes = (f: (d: number) => number) => `d == 64 ? ${f(64)} : ${f(128)}`;
  writeFileSync(join(dir, 'fa_sizes.h'), `constexpr size_t fa_fwd_smem(int d) { return ${sizes(flashForwardSmem)}; }\nconstexpr size_t fa_bwd_smem(int d) { return ${sizes(flashBackwardSmem)}; }\n`);
  harness = join(dir, 'harness');
  execFileSync('g++', ['-std=c++20', '-O1', '-pthread', `-I${here}`, `-I${dir}`, '-o', harness, join(here, 'harness.cpp')], { stdio: 'pipe' });
}, 120_000);

interface Err {
  max_err: number;
  max_ref: number;
  pad_zero: boolean;
}
type Result = Record<'o' | 'lse' | 'dq' | 'dk' | 'dv', Err> & { lse_only_equal: boolean };

function run(B: number, S: number, H: number, KV: number, D: number, dtype: 'bf16' | 'fp16', lens: number[]): Result {
  return JSON.parse(execFileSync(harness, [B, S, H, KV, D, dtype, ...lens].map(String), { encoding: 'utf8' })) as Result;
}

// Half-precision inputs, P and dS rounded to half for their products, fp32 accumulation: bf16 keeps
// 8 significant bits (relative rounding 2⁻⁹), fp16 11 (2⁻¹²); a few roundings stack up.
const tolerance = { bf16: 2e-2, fp16: 3e-3 };

function expectClose(r: Result, dtype: 'bf16' | 'fp16'): void {
  for (const name of ['o', 'dq', 'dk', 'dv'] as const) {
    expect(r[name].max_err).toBeLessThanOrEqual(tolerance[dtype] * r[name].max_ref);
    expect(r[name].max_ref).toBeGreaterThan(0.1);
    expect(r[name].pad_zero).toBe(true);
  }
  // the log-sum-exp is computed in fp32 from fp32 scores
  expect(r.lse.max_err).toBeLessThanOrEqual(1e-5 * r.lse.max_ref);
  expect(r.lse.pad_zero).toBe(true);
  // flash_lse (pass 1 alone, for the backward after GroupQueryAttention's forward) writes the same bits
  expect(r.lse_only_equal).toBe(true);
}

test('bf16, head size 64, GQA 2: two query/key tiles with a ragged end, one full row beside a short one', () => {
  expectClose(run(2, 80, 4, 2, 64, 'bf16', [80, 17]), 'bf16');
}, 60_000);

test('fp16, head size 128, four query heads per KV head, a row shorter than one tile', () => {
  expectClose(run(1, 70, 4, 1, 128, 'fp16', [65]), 'fp16');
}, 60_000);

test('bf16, head size 128, no grouping, a row of length 1 (attends only itself)', () => {
  expectClose(run(2, 20, 2, 2, 128, 'bf16', [1, 20]), 'bf16');
}, 60_000);

test('bf16, head size 64, GQA 2: four key tiles (the double buffers swap three times, the online softmax rescales O), padding rows past a mid-tile end', () => {
  expectClose(run(1, 200, 2, 1, 64, 'bf16', [195]), 'bf16');
}, 60_000);
