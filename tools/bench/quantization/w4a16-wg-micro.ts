/**
 * The W4A16 op's wgmma builds beside its tiled plan, on one GPU without a model: Qwen3-8B's (or 0.6B's)
 * projection shapes at each of `--rows`. First each build's output against the tiled plan's on random codes,
 * scales and activations (max difference over the tiled output's largest magnitude; fails past 1e-2: the tiled
 * kernels pass quant-bench's float64 check), then µs per call (a CUDA graph of back-to-back launches over
 * weight copies that exceed L2, as quant-bench's microbenchmark) and TFLOP/s, and the default build's (`w4a16WgChoice`)
 * time against the fastest build's. One JSON line a shape and row count.
 *
 * usage: node .bundle/w4a16-wg-micro.js [--shapes 8b|0.6b] [--rows 64,128,256] [--block 64]
 */
import { cudaIncludeDir, Kernels, W4A16, W4A16_WG_BUILDS, w4a16TimingWeights, w4a16WgChoice, w4a16WgLabel, type W4A16LaunchOptions, type W4A16Shape } from '@lathe/kernels';
import { fromBfloat16Bits, toBfloat16Bits, type DeviceTensor } from '@lathe/runtime';
import { arg } from '../argv';

const SHAPES: Record<string, { name: string; N: number; K: number }[]> = {
  '8b': [
    { name: 'q_proj', N: 4096, K: 4096 },
    { name: 'gate_up_proj', N: 24576, K: 4096 },
    { name: 'down_proj', N: 4096, K: 12288 },
  ],
  '0.6b': [
    { name: 'qkv_proj', N: 4096, K: 1024 },
    { name: 'gate_up_proj', N: 6144, K: 1024 },
    { name: 'down_proj', N: 1024, K: 3072 },
  ],
};

function main(): void {
  const shapes = SHAPES[arg('shapes', '8b')];
  if (!shapes) throw new Error(`--shapes: '${arg('shapes', '8b')}' is not ${Object.keys(SHAPES).join(' or ')}`);
  const rows = arg('rows', '64,128,256').split(',').map(Number);
  if (rows.some((m) => !Number.isInteger(m) || m < 1)) throw new Error(`--rows: '${arg('rows', '')}' is not a list of row counts`);
  const blockSize = Number(arg('block', '64'));
  const { kernels, device } = Kernels.withDevice();
  const t0 = performance.now();
  const w4 = W4A16.compile(kernels, { includeDir: cudaIncludeDir(), wgmma: true });
  console.log(JSON.stringify({ compile_s: +((performance.now() - t0) / 1000).toFixed(1), wgmma_unavailable: w4.wgmmaUnavailable ?? null }));
  if (w4.wgmmaUnavailable) process.exit(1);
  let seed = 12345;
  const rnd = () => ((seed = (seed * 1103515245 + 12345) >>> 0) / 2 ** 32);
  let worst = 0;
  for (const { name, N, K } of shapes) {
    const kBlocks = Math.ceil(K / blockSize);
    const owned: DeviceTensor[] = [];
    const timing = w4a16TimingWeights(device, { N, K, blockSize, dtype: 'bfloat16' });
    try {
      const b = device.upload({ data: Uint8Array.from({ length: (N * kBlocks * blockSize) / 2 }, () => Math.floor(256 * rnd())), dims: [N, kBlocks, blockSize / 2] }, 'uint8');
      owned.push(b);
      const scales = device.upload({ data: toBfloat16Bits(Float32Array.from({ length: N * kBlocks }, () => 0.002 + 0.02 * rnd())), dims: [N, kBlocks] }, 'bfloat16');
      owned.push(scales);
      for (const M of rows) {
        const a = device.upload({ data: toBfloat16Bits(Float32Array.from({ length: M * K }, () => 2 * rnd() - 1)), dims: [M, K] }, 'bfloat16');
        const c = device.upload({ data: new Uint16Array(M * N), dims: [M, N] }, 'bfloat16');
        owned.push(a, c);
        const shape: W4A16Shape = { M, N, K, kBlocks, blockSize, dtype: 'bfloat16' };
        const product = (opts: W4A16LaunchOptions): Float32Array => {
          c.upload(new Uint16Array(M * N).fill(0x7fc0));
          w4.matmul(shape, { a, b, scales, zeroPoints: 0n, c }, undefined, opts);
          kernels.synchronize();
          return fromBfloat16Bits(c.download().data as Uint16Array);
        };
        const time = (opts: W4A16LaunchOptions) => kernels.timeLaunches((i) => w4.matmul(shape, { a, b: timing.codes[i % timing.copies], scales: timing.scales[i % timing.copies], zeroPoints: 0n, c }, undefined, opts));
        const tiled = product({ tileFromRows: 1 });
        const scale = tiled.reduce((p, v) => Math.max(p, Math.abs(v)), 0);
        const plan = w4.tilePlan(shape);
        const runs: Record<string, unknown>[] = [];
        const flops = 2 * M * N * K;
        const tileMs = time({ tileFromRows: 1 });
        runs.push({ kernel: `tile plan (${plan.label})`, us: +(tileMs * 1000).toFixed(2), tflop_s: +(flops / (tileMs / 1000) / 1e12).toFixed(1) });
        for (const v of W4A16_WG_BUILDS) {
          const got = product({ wgmma: v });
          let diff = 0;
          for (let i = 0; i < got.length; i++) diff = Math.max(diff, Math.abs(got[i] - tiled[i]));
          const rel = Number.isNaN(diff) ? Infinity : diff / Math.max(scale, 1e-30);
          worst = Math.max(worst, rel);
          const ms = time({ wgmma: v });
          runs.push({ kernel: w4a16WgLabel(v), us: +(ms * 1000).toFixed(2), tflop_s: +(flops / (ms / 1000) / 1e12).toFixed(1), vs_tiled_max_rel: +rel.toExponential(2) });
        }
        // the default build (w4a16WgChoice) beside the best one timed
        const choice = w4a16WgLabel(w4a16WgChoice(shape, kernels.smCount));
        const best = runs.slice(1).reduce((a, b) => ((b.us as number) < (a.us as number) ? b : a));
        console.log(JSON.stringify({ shape: name, N, K, M, choice, choice_vs_best: +((best.us as number) / (runs.find((r) => r.kernel === choice)!.us as number)).toFixed(3), runs }));
      }
    } finally {
      for (const t of owned) t.dispose();
      owned.length = 0;
      timing.dispose();
    }
  }
  console.log(JSON.stringify({ summary: true, max_rel_vs_tiled: +worst.toExponential(2), ok: worst <= 1e-2 }));
  if (!(worst <= 1e-2)) process.exit(1);
}

main();
