/**
 * Where a wgmma W4A16 CTA spends a chunk of K (CUDA, no model): the wgmma module compiled with `W4_TRACE`, whose
 * thread 0 of CTA (0, 0) stamps clock64 at each phase of its first 16 chunks, launched alone (after a warm-up) on
 * one shape; prints, per build, the median SM cycles of each phase over chunks 3–15 and the launch's µs in a graph
 * of back-to-back launches (the untraced module's, as w4a16-wg-micro times it). Phases: wait (cp.async of the chunk's
 * stage), barrier (and the refill: the cp.async issue of the chunk two ahead), scales (the next chunk's loads issued,
 * this chunk's made ready), then for each half of the chunk's k-steps: loads (its codes from shared memory), dequantize,
 * mma (issue, and the wait that retires the group before); next (the loop back).
 *
 * usage: node .bundle/w4a16-wg-trace.js [--n 4096] [--k 4096] [--m 64] [--block 64]
 */
import { cudaIncludeDir, Kernels, W4A16, W4A16_WG_BUILDS, w4a16TimingWeights, w4a16WgDims, w4a16WgKernelName, w4a16WgLabel, w4a16WgSmem, w4a16WgSource, type W4A16Shape } from '@lathe/kernels';
import { toBfloat16Bits } from '@lathe/runtime';
import { arg } from '../argv';

const PHASES = ['wait', 'barrier', 'scales', 'loads', 'dequantize', 'mma', 'loads2', 'dequantize2', 'mma2', 'next'] as const;
const SLOTS = 12;

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)] ?? NaN;
}

function main(): void {
  const N = Number(arg('n', '4096')), K = Number(arg('k', '4096')), M = Number(arg('m', '64')), blockSize = Number(arg('block', '64'));
  const { kernels, device } = Kernels.withDevice();
  const include = `-I${cudaIncludeDir()}`;
  const traced = kernels.compile(w4a16WgSource, { name: 'lathe_w4a16_wgmma_trace', options: [include, '--std=c++17', '-DW4_TRACE'], target: 'sm_90a' });
  const w4 = W4A16.compile(kernels, { includeDir: cudaIncludeDir(), wgmma: true });
  if (w4.wgmmaUnavailable) throw new Error(w4.wgmmaUnavailable);
  const weights = w4a16TimingWeights(device, { N, K, blockSize, dtype: 'bfloat16' });
  const a = device.upload({ data: toBfloat16Bits(new Float32Array(M * K).fill(0.25)), dims: [M, K] }, 'bfloat16');
  const c = device.upload({ data: new Uint16Array(Math.max(M * N, 4 * 16 * SLOTS)), dims: [Math.max(M * N, 4 * 16 * SLOTS)] }, 'bfloat16');
  const kb = weights.kBlocks;
  const shape: W4A16Shape = { M, N, K, kBlocks: kb, blockSize, dtype: 'bfloat16' };
  try {
    for (const v of W4A16_WG_BUILDS) {
      const k = traced.kernel(w4a16WgKernelName('bfloat16', v), ['ptr', 'ptr', 'ptr', 'ptr', 'ptr', 'ptr', 'ptr', 'i32', 'i32', 'i32', 'i32', 'i32', 'i32', 'i32'] as const);
      kernels.driver.setMaxDynamicSharedBytes(k.handle, w4a16WgSmem(v));
      const { bm, bn, threads } = w4a16WgDims(v);
      const launch = () => k.launch({ grid: [Math.ceil(N / bn), Math.ceil(M / bm), 1], block: threads, sharedBytes: w4a16WgSmem(v) }, a, weights.codes[0]!, weights.scales[0]!, 0n, c, c, c, M, N, N, N, K, kb, Math.log2(blockSize));
      launch();
      launch();
      kernels.synchronize();
      const bits = (c.download().data as Uint16Array).slice(0, 4 * 16 * SLOTS);
      const stamps = new BigInt64Array(bits.buffer);
      const chunks = Math.min(16, Math.ceil((kb * blockSize) / 128));
      const phases: Record<string, number> = {};
      for (let p = 0; p < PHASES.length; p++) {
        const ds: number[] = [];
        for (let ch = 3; ch < chunks - (p === PHASES.length - 1 ? 1 : 0); ch++) {
          const from = stamps[ch * SLOTS + p]!, to = p === PHASES.length - 1 ? stamps[(ch + 1) * SLOTS]! : stamps[ch * SLOTS + p + 1]!;
          ds.push(Number(to - from));
        }
        phases[PHASES[p]!] = median(ds);
      }
      const perChunk = median(Array.from({ length: Math.max(chunks - 4, 1) }, (_, i) => Number(stamps[(i + 4) * SLOTS]! - stamps[(i + 3) * SLOTS]!)));
      const ms = kernels.timeLaunches((i) => w4.matmul(shape, { a, b: weights.codes[i % weights.copies]!, scales: weights.scales[i % weights.copies]!, zeroPoints: 0n, c }, undefined, { wgmma: v }));
      console.log(JSON.stringify({ build: w4a16WgLabel(v), N, K, M, us: +(ms * 1000).toFixed(2), cycles_per_chunk: perChunk, phases }));
    }
  } finally {
    a.dispose();
    c.dispose();
    weights.dispose();
  }
}

main();
