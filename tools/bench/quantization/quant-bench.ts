/**
 * Weight-only quantization on the device, in one process: for a model shape with random weights
 * (default Qwen3-0.6B's) or a model folder, and each format (the dense compute dtype, int8, int4,
 * nf4, nf4 with double quantization), the weight memory on the device, decode tokens/s of the
 * KV-cache generator at each batch size, and KL(dense ‖ quantized) of next-token distributions on
 * tokens the dense model generated greedily.
 * `--weights bound,initializers` times each quantized format's decode both ways in the same call:
 * `bound`, the kernel tensors as graph inputs bound to device buffers (ONNX Runtime dequantizes B
 * into scratch + cuBLAS at M > 1); `initializers`, held by the generation graphs so ORT prepacks
 * them, with its fused weight-only GEMM/GEMV ("fpA_intB", session config ep.cuda.fpa_intb_gemm = 1)
 * on for the INT4/INT8 projections that can take it (QuantizedModel.generation); and
 * `initializers-plain`, initializers with the fused path off (what holding them alone changes).
 * `kernel`: bound kernel tensors, the decode steps' INT4 projections through Lathe's own W4A16 op
 * (`w4a16Ops` of @lathe/kernels, QuantizedModel.generation's `quantizedWeights: 'kernel'`: q/k/v and
 * gate/up concatenated, one launch a group; prefill keeps MatMulNBits; INT4 only), with the device opened through `Kernels.withDevice` so the op's
 * launches share the sessions' stream. With `kernel` asked for, before the timings: a numerics
 * check of the op against a float64 host product of the same rounded operands (MatMulNBits' error
 * against it beside) for Qwen3's q/gate/down shapes at M = 1, 16, 40, 64 and 256 (max relative error
 * printed; past 1e-2 the run ends with an error, after its numbers), then every tiled build the device runs
 * launched directly on the q/gate/down shapes at M = 40 and 256 with zero points against the same kind of
 * reference (`kernel_tile_check`, the same limit),
 * and a microbenchmark of the kernel alone on one projection of each shape (and the fused q/k/v and
 * gate/up) at M = 1 and 16 (GB/s of
 * weight bytes, and the share of the HBM peak nvidia-smi's GPU name implies: H100 3.35 TB/s, H200
 * 4.8 TB/s). `kernel` sends projections of at most `--kernel-max-rows` rows (default 64, the
 * library's default) through the op and larger ones through MatMulNBits; `kernel-all` sends every
 * decode batch through it (the kernel's own number at 256). The op's launches of at most 16 rows take the
 * library's default split-K plans (`w4a16DefaultChoice`); `--kernel-column-tiles 1|2` fixes 16 or 32
 * columns a warp for all of them instead (32: half the activation reads, half the CTAs); the
 * microbenchmark times both. Past 16 rows the op runs the tiled kernels (a CTA per [BM × BN] output tile,
 * cp.async stages in shared memory; `--kernel-tile-from-rows` moves that bound, e.g. 100000 for the split-K
 * kernels at every M; `--kernel-tile LABEL` fixes the build — the 8-warp 64x256w8, 128x128w8, 64x128w8k2, 32x128w8k2,
 * 32x64w8k4, 64x64w8k4 (k: K split over warp groups), 64x256w8c2, 64x256w8c4, 64x128w8k2c2 (c: over a cluster's CTAs,
 * sm_90 on) or the original 64x64, 32x64, 32x32 — default the plan's), so
 * `kernel --kernel-max-rows 256` or `kernel-all` times them at 256; the microbenchmark then also times
 * them alone at M = `--kernel-micro-rows` (default 64,128,256) — the plan's tile, every tile, and the
 * split-K kernels — with TFLOP/s and weight GB/s, beside ONNX Runtime's bf16 MatMul (cuBLAS) on the
 * same [M, K] × [K, N] (a CUDA-graph session of back-to-back MatMuls over rotating weight copies; its
 * per-call time includes a share of one run's launch and sync).
 * `--kernel-sweep` (CUDA): after the microbenchmarks, `tuneW4A16` of @lathe/kernels on the projection shapes (and
 * the fused q/k/v and gate/up) at each M of `--kernel-sweep-rows` (default 1,4,8,16) over column tiles 1 and 2 and
 * rounds 1–8 (chunks of K a warp takes: fewer warps a CTA, more CTAs resident): each launch's µs and per shape and M
 * the fastest beside the default plan's; `--weights kernel-tuned` then decodes as `kernel` does with each split-K
 * launch taking the table's plan for its shape (the A/B of the tuned plans against the default ones in one process).
 * `--kernel-sweep-tiles` times every tiled build too (rows up to 256), so an entry may be a tiled build, and
 * `--weights kernel-tuned-all` sends every decode batch through the op with the table's plans (as kernel-all does with the defaults).
 * `--weights kernel-wgmma-all` sends every decode batch through the op with launches of at least `--kernel-wgmma-from-rows`
 * rows (default 17) on the wgmma kernels (sm_90a: Hopper's warpgroup MMA, the weights dequantized in registers as wgmma's
 * A operand); the tile check and the microbenchmark cover every wgmma build beside the tiled ones.
 * `--weights kernel-pipe<S>` (S = 0–4) decodes as `kernel` does, and sends the INT4 products of more rows (and every
 * prefill's) through the pipeline of @lathe/kernels (`w4a16GemmOps`: Lathe's dequantize into one of S scratch slots on a
 * side stream, the S − 1 products before it running meanwhile, then cuBLAS; S = 0 dequantizes in line) instead of
 * MatMulNBits (`kernel-pipeg<G>`, G = 2 or 4: in line, one dequantize launch for each G consecutive products); its
 * agreement with `bound` adds the chosen tokens' log-prob differences over the shared prefixes.
 * `--swiglu-kernel`: every format's decode steps take the SwiGLU through Lathe's kernel (KvCacheGenerator's `swiglu`)
 * instead of QuickGelu·Mul, one node a layer fewer; `--residual-dtype compute`: every format's generator keeps the
 * residual stream in the compute dtype (KvCacheGenerator's `residualDtype`: four Casts a layer fewer in bf16, no
 * float32 norm-weight copies; default float32); `--lm-head int4` quantizes the LM head too (its read bounds small batches).
 * `--decode-attention kernel` (CUDA): every format's decode steps attend through Lathe's decode attention kernel over
 * the native cache (KvCacheGenerator's `decodeAttention`; the dense model then reads q/k/v and gate/up packed,
 * `concatProjections`; a quantized model keeps its own projections — the `kernel` mode's one W4A16 launch writes
 * q, k and v to separate outputs, which the attention takes as they are — since packing is for dense weights);
 * `--greedy-pick` (CUDA): the fused greedy pick (`greedyPick`; the bench decodes greedily); `--fast-decode`: both,
 * `--swiglu-kernel` and `--residual-dtype compute` — not the e4m3 cache, which would add a second lossy change to
 * the KL. Each decode line says what a step must read — `weight_bytes_per_step` (every weight as the format
 * stores it; of an embedding that is not the head, the rows gathered), `kv_bytes_per_step` (the cache, mean over
 * the steps) — and the ms each takes at the HBM peak (`weights_ms_at_peak`, `kv_ms_at_peak`) beside the measured
 * `ms_per_step` (`weights_share_of_step`: how weight-bound the step is); the summary's `weight_bound` lists them.
 * `first_call_ms`: the generator's creation and first call (sessions compiled, CUDA graphs captured), per mode.
 * `--kernel-checks all|numerics|none` (default all): with a kernel weights mode, `numerics` keeps the float64 checks
 * and skips the microbenchmarks, `none` skips both (the Qwen3-8B shapes' checks take minutes of host time).
 * The host model: a preset's random weights are `CausalLM.random`'s values, sampled (with their 16-bit bits for the
 * upload) and quantized in chunks on `--threads` worker threads (default the cores less one, at most 32).
 * `--weights` default: bound,initializers.
 * NF4 (MatMulBnb4 has no prepacked path) runs `bound` only. Before the timings a probe says whether
 * this ORT build's fused path is live: one MatMulNBits node with the path on over bound inputs must
 * refuse (it needs prepacked weights) and over initializers must match the dequantized product.
 * Run with ORT_FPA_INTB_DEBUG=1 for ORT to print each fused call's kernel (GEMV or CUTLASS) where
 * the build has that switch (`--probe` runs the probe on the CPU too). `--fpa` (older) repeats the bound timings with the fused path asked for.
 *
 * usage: node quant-bench.js [--preset qwen3-0.6b|qwen3-1.7b|qwen3-4b|qwen3-8b|qwen3-14b|tiny-qwen3 | --model DIR] [--device cuda|cpu] [--threads N]
 *          [--dtype bfloat16] [--formats dense,int8,int4,nf4,nf4dq] [--batches 1,16,256] [--prompt-len 64]
 *          [--new 128] [--repeat 2] [--int4-block 64] [--mode kernel|dequantize] [--fpa] [--no-cuda-graph]
 *          [--kl-prompts 16 | --no-kl] [--kl-new 64] [--kl-batch 4] [--lm-head none|int8|int4|nf4] [--seed 0]
 *          [--weights bound,initializers,initializers-plain,kernel,kernel-all,kernel-tuned,kernel-tuned-all,kernel-wgmma-all,kernel-pipe0..4,kernel-pipeg2,kernel-pipeg4] [--kernel-wgmma-from-rows 17] [--kernel-max-rows 64] [--kernel-column-tiles 1|2]
 *          [--kernel-tile-from-rows 17] [--kernel-tile auto|LABEL] [--kernel-micro-rows 64,128,256] [--probe]
 *          [--kernel-sweep [--kernel-sweep-rows 1,4,8,16] [--kernel-sweep-tiles]] (with --weights …,kernel-tuned)
 *          [--swiglu-kernel] [--residual-dtype float32|compute] [--decode-attention gqa|kernel] [--greedy-pick] [--fast-decode]
 *          [--kernel-checks all|numerics|none]
 * Qwen3-8B within one device call (~6 min on an H100 or H200: ~1 min host build on 16 cores, ~2 min float64 checks):
 *   node .bundle/quant-bench.js --preset qwen3-8b --device cuda --formats dense,int4 --batches 1,16,256 --weights kernel
 *     --fast-decode --kernel-checks numerics --kl-prompts 8
 * --lm-head: the quantized formats also read the LM head (the tied embedding) through an extra
 * quantized copy (int4 with --int4-block); the dense model's head stays bf16.
 * Prints the probe's line, one JSON line per (format, weights, batch[, fpa]) decode measurement, one per format with its KL,
 * and a last summary line with every number and the ratios to the dense baseline.
 */
import { spawnSync } from 'node:child_process';
import { resolve } from 'node:path';
import { isMainThread } from 'node:worker_threads';
import * as L from '@lathe/onnx';
import type { DType } from '@lathe/onnx';
import { CausalLM, MODEL_PRESETS, paramSpecs, parseConfig, type DecoderConfig, type HfConfig, type ResidualDtype, type Weights } from '@lathe/models';
import {
  addDistributionShift,
  fusedGemmSession,
  KERNEL_MAX_ROWS,
  kernelLayout,
  matMulNBits,
  QuantizedModel,
  quantizeInt4,
  SHIFT_IO,
  ShiftAccumulator,
  dequantize,
  type NBitsLayout,
  type QuantScheme,
  type QuantizedWeightsAs,
  type ShiftSummary,
} from '@lathe/quantization';
import { cudaIncludeDir, DecodeAttention, decodeAttentionOps, GreedyPickKernels, greedyPickOps, Kernels, SwigluKernels, swigluOps, W4A16, W4A16_TILE_FROM_ROWS, W4A16_TILE_VARIANTS, W4A16_WG_BUILDS, tuneW4A16, W4A16Gemm, w4a16GemmOps, w4a16WgChoice, w4a16WgLabel, w4a16Ops, w4a16TimingWeights, w4a16TileDims, type W4A16LaunchOptions, type W4A16Ops, type W4A16PlanTable, type W4A16Tile } from '@lathe/kernels';
import { KvCacheGenerator, type Completion, type KvCacheGeneratorOptions } from '@lathe/rollout';
import { Device, fromBfloat16Bits, fromFloat16Bits, toBfloat16Bits, toFloat16Bits, type DeviceTensor, type HostTensor, type SessionOptions } from '@lathe/runtime';
import { arg, flag } from '../argv';
import { gpuUsedMiB } from '../gpu-memory';
import { defaultThreads, quantizeOnThreads, randomHostWeights, type HostWeights } from './host-model';
import { msAtPeak, stepCacheBytes, stepWeightBytes } from './step-bytes';

const SCHEMES: Record<string, QuantScheme | undefined> = {
  dense: undefined,
  int8: { format: 'int8' },
  int4: { format: 'int4' },
  nf4: { format: 'nf4' },
  nf4dq: { format: 'nf4', doubleQuant: true },
};

/** A seeded stream of token ids in [0, V). */
function tokens(seed: number, V: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = Math.imul(a ^ (a >>> 15), a | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) % V;
  };
}

/** How a decode run reads the quantized kernel tensors (see the header). */
const WEIGHT_MODES: Record<string, { as: QuantizedWeightsAs; fused: boolean }> = {
  bound: { as: 'inputs', fused: false },
  initializers: { as: 'initializers', fused: true },
  'initializers-plain': { as: 'initializers', fused: false },
  kernel: { as: 'kernel', fused: false },
  'kernel-all': { as: 'kernel', fused: false },
  'kernel-tuned': { as: 'kernel', fused: false },
  'kernel-tuned-all': { as: 'kernel', fused: false },
  'kernel-wgmma-all': { as: 'kernel', fused: false },
  // kernel-pipe<S>: as kernel, and past --kernel-max-rows (and in prefill) the INT4 pipeline with S slots (w4a16GemmOps) instead of MatMulNBits
  'kernel-pipe0': { as: 'kernel', fused: false },
  'kernel-pipe1': { as: 'kernel', fused: false },
  'kernel-pipe2': { as: 'kernel', fused: false },
  'kernel-pipe3': { as: 'kernel', fused: false },
  'kernel-pipe4': { as: 'kernel', fused: false },
  // kernel-pipeg<G>: as kernel-pipe0, one dequantize launch for each run of G consecutive products (a layer's four: G = 4)
  'kernel-pipeg2': { as: 'kernel', fused: false },
  'kernel-pipeg4': { as: 'kernel', fused: false },
};

const bytesOf = (ts: Iterable<DeviceTensor>) => [...ts].reduce((n, t) => n + t.byteLength, 0);

async function main(): Promise<void> {
  const weightModes = arg('weights', 'bound,initializers').split(',');
  for (const w of weightModes) if (!(w in WEIGHT_MODES)) throw new Error(`--weights: unknown mode '${w}' (${Object.keys(WEIGHT_MODES).join(', ')})`);
  const kind = arg('device', 'cuda') as 'cuda' | 'cpu';
  if (kind !== 'cuda' && kind !== 'cpu') throw new Error(`--device: '${String(kind)}' is not cuda or cpu`);
  // Lathe's kernel launches on the stream the sessions run on: the device opened through Kernels.withDevice.
  const wantKernel = weightModes.some((w) => WEIGHT_MODES[w].as === 'kernel');
  // --fast-decode: the decode attention kernel, the greedy pick, the SwiGLU kernel and the bf16 residual stream (not the e4m3 cache: a second lossy change in the KL)
  const fastDecode = flag('fast-decode');
  const decodeAttentionArg = fastDecode ? 'kernel' : arg('decode-attention', 'gqa');
  if (decodeAttentionArg !== 'gqa' && decodeAttentionArg !== 'kernel') throw new Error(`--decode-attention: '${decodeAttentionArg}' is not gqa or kernel`);
  const decodeKernel = decodeAttentionArg === 'kernel';
  const greedyPickOn = fastDecode || flag('greedy-pick');
  if ((decodeKernel || greedyPickOn) && kind !== 'cuda') throw new Error(`${fastDecode ? '--fast-decode' : decodeKernel ? '--decode-attention kernel' : '--greedy-pick'} needs --device cuda (Lathe's CUDA kernels; this run asked for --device ${kind})`);
  const swigluKernel = fastDecode || flag('swiglu-kernel');
  const opened = kind === 'cuda' && (wantKernel || swigluKernel || decodeKernel || greedyPickOn) ? Kernels.withDevice() : { device: Device.open(kind), kernels: undefined };
  const device = opened.device;
  // the W4A16 op, its checks and microbenchmarks only where a weights mode runs it (the device may be open for the other kernels alone)
  const w4 = opened.kernels && wantKernel ? W4A16.compile(opened.kernels, { wgmma: true }) : undefined;
  const kernelChecks = arg('kernel-checks', 'all');
  if (kernelChecks !== 'all' && kernelChecks !== 'numerics' && kernelChecks !== 'none') throw new Error(`--kernel-checks: '${kernelChecks}' is not all, numerics or none`);
  const numerics = kernelChecks !== 'none';
  const micro = kernelChecks === 'all';
  // --swiglu-kernel: every format's decode steps take the SwiGLU through Lathe's kernel (the A/B of the glue it removes)
  const swiglu = !swigluKernel ? undefined : opened.kernels ? swigluOps('cuda', SwigluKernels.compile(opened.kernels, { includeDir: cudaIncludeDir() })) : swigluOps('cpu');
  if (fastDecode && arg('residual-dtype', 'compute') !== 'compute') throw new Error('--fast-decode keeps the residual stream in the compute dtype: leave --residual-dtype out');
  const residualDtype = (fastDecode ? 'compute' : arg('residual-dtype', 'float32')) as ResidualDtype;
  if (residualDtype !== 'float32' && residualDtype !== 'compute') throw new Error(`--residual-dtype: '${String(residualDtype)}' is not float32 or compute`);
  const greedyPick = greedyPickOn && opened.kernels ? greedyPickOps('cuda', GreedyPickKernels.compile(opened.kernels, { includeDir: cudaIncludeDir() })) : undefined;
  // absent: the library's default plans (w4a16DefaultChoice)
  const columnTiles = arg('kernel-column-tiles', '') === '' ? undefined : Number(arg('kernel-column-tiles', ''));
  if (columnTiles !== undefined && columnTiles !== 1 && columnTiles !== 2) throw new Error(`--kernel-column-tiles: ${columnTiles} is not 1 or 2`);
  const tileFromRows = Number(arg('kernel-tile-from-rows', String(W4A16_TILE_FROM_ROWS)));
  if (!(tileFromRows >= 1)) throw new Error(`--kernel-tile-from-rows: '${arg('kernel-tile-from-rows')}' is not a row count ≥ 1`);
  const tile = parseTile(arg('kernel-tile', 'auto'));
  const launch: W4A16LaunchOptions = { ...(columnTiles ? { columnTiles } : {}), tileFromRows, ...(tile ? { tile } : {}) };
  const kernelOps = wantKernel ? w4a16Ops(device.kind, w4, launch) : undefined;
  // kernel-tuned: the split-K launches take the sweep's table (tuneW4A16, filled below before any decode)
  let tuned: W4A16PlanTable | undefined;
  const wantsTuned = weightModes.some((w) => w.startsWith('kernel-tuned'));
  if (wantsTuned && !flag('kernel-sweep')) throw new Error('--weights kernel-tuned(-all) needs --kernel-sweep (its table)');
  const tunedOps = wantsTuned ? w4a16Ops(device.kind, w4, { ...launch, plan: (sh) => tuned?.plan(sh) }) : undefined;
  // kernel-wgmma-all: every decode batch through the op, from --kernel-wgmma-from-rows rows (default 17) on the wgmma kernels
  const wgmmaFromRows = Number(arg('kernel-wgmma-from-rows', '17'));
  if (!(wgmmaFromRows >= 1)) throw new Error(`--kernel-wgmma-from-rows: '${arg('kernel-wgmma-from-rows')}' is not a row count ≥ 1`);
  const wgmmaOps = weightModes.includes('kernel-wgmma-all') ? w4a16Ops(device.kind, w4, { ...launch, wgmmaFromRows }) : undefined;
  const pipeOptions = (weights: string) => (/^kernel-pipe\d$/.test(weights) ? { slots: Number(weights.slice(-1)), group: 1 } : /^kernel-pipeg\d$/.test(weights) ? { slots: 0, group: Number(weights.slice(-1)) } : undefined);
  const gemm = opened.kernels && weightModes.some((w) => pipeOptions(w) !== undefined) ? W4A16Gemm.create(opened.kernels, { includeDir: cudaIncludeDir() }) : undefined;
  const pipelines = new Map(weightModes.filter((w) => pipeOptions(w) !== undefined).map((w) => [w, w4a16GemmOps(device.kind, gemm, pipeOptions(w))] as const));
  const opsFor = (weights: string): W4A16Ops | undefined => (weights.startsWith('kernel-tuned') ? tunedOps : weights === 'kernel-wgmma-all' ? wgmmaOps : kernelOps);
  const kernelMaxRowsArg = Number(arg('kernel-max-rows', String(KERNEL_MAX_ROWS)));
  const maxRowsOf = (weights: string) => (weights.endsWith('-all') ? Number.MAX_SAFE_INTEGER : kernelMaxRowsArg);
  const dtype = arg('dtype', device.kind === 'cuda' ? 'bfloat16' : 'float32') as DType;
  const formats = arg('formats', 'dense,int8,int4,nf4').split(',');
  for (const f of formats) if (!(f in SCHEMES)) throw new Error(`--formats: unknown format '${f}' (${Object.keys(SCHEMES).join(', ')})`);
  const batches = arg('batches', '1,16,256').split(',').map(Number);
  const promptLen = Number(arg('prompt-len', '64'));
  const newTokens = Number(arg('new', '128'));
  const repeat = Number(arg('repeat', '2'));
  const int4Block = Number(arg('int4-block', '64'));
  const mode = arg('mode', 'kernel') as 'kernel' | 'dequantize';
  const cudaGraph = device.kind === 'cuda' && !flag('no-cuda-graph');
  const klPrompts = Number(arg('kl-prompts', '16'));
  const klNew = Number(arg('kl-new', '64'));
  const klBatch = Number(arg('kl-batch', '4'));
  const seed = Number(arg('seed', '0'));
  const lmHeadArg = arg('lm-head', 'none');
  if (!['none', 'int8', 'int4', 'nf4'].includes(lmHeadArg)) throw new Error(`--lm-head: '${lmHeadArg}' is not none, int8, int4 or nf4`);
  const lmHead: QuantScheme | undefined = lmHeadArg === 'none' ? undefined : { format: lmHeadArg as QuantScheme['format'], ...(lmHeadArg === 'int4' ? { blockSize: Number(arg('int4-block', '64')) } : {}) };

  const threads = Number(arg('threads', String(defaultThreads())));
  if (!Number.isInteger(threads) || threads < 1) throw new Error(`--threads: '${arg('threads')}' is not a thread count ≥ 1`);
  const t0 = performance.now();
  // A preset's random weights (CausalLM.random's values) and their 16-bit bits, sampled on worker threads
  const presetName = arg('preset', 'qwen3-0.6b');
  if (!arg('model', '') && !(presetName in MODEL_PRESETS)) throw new Error(`--preset: unknown preset '${presetName}' (${Object.keys(MODEL_PRESETS).join(', ')})`);
  const built: { config: DecoderConfig } & HostWeights = arg('model', '')
    ? (() => {
        const source = CausalLM.fromPretrainedSync(resolve(arg('model')));
        return { config: source.config, weights: source.float32Weights() };
      })()
    : await (async () => {
        const cfg = parseConfig(MODEL_PRESETS[presetName as keyof typeof MODEL_PRESETS].config as HfConfig);
        return { config: cfg, ...(await randomHostWeights(cfg, { seed, std: 0.02, bits: dtype === 'bfloat16' || dtype === 'float16' ? dtype : undefined, threads })) };
      })();
  const config = built.config;
  const host = built.weights;
  const hostBuildS = (performance.now() - t0) / 1000;
  const parameters = paramSpecs(config).reduce((n, sp) => n + sp.shape.reduce((a, b) => a * b, 1), 0);
  console.error(`quant-bench: ${(parameters / 1e9).toFixed(2)}B parameters on the host in ${hostBuildS.toFixed(1)} s (${threads} thread${threads > 1 ? 's' : ''})`);
  const shape = arg('model', '') || presetName;
  const decodeAttention = decodeKernel && opened.kernels ? decodeAttentionOps('cuda', DecodeAttention.compile(opened.kernels, { includeDir: cudaIncludeDir() }), { cache: 'native', qkNormEpsilon: config.rmsNormEps }) : undefined;
  const { gpu, peak_tb_s: peakTbS } = device.kind === 'cuda' ? peakBandwidth() : { gpu: undefined, peak_tb_s: undefined };
  const probe = device.kind === 'cuda' || flag('probe') ? await probeFusedPath(device, dtype) : { fused_path: 'not probed (CUDA only; --probe runs it here)' };
  console.log(JSON.stringify({ probe: true, ...probe }));
  // The kernel's numerics against a float64 reference and its bandwidth alone, before any timing of generation.
  const kernelCheck = kernelOps && numerics ? await checkKernel(device, dtype, kernelOps, config, Number(arg('int4-block', '64'))) : undefined;
  if (kernelCheck) console.log(JSON.stringify({ kernel_check: true, ...kernelCheck }));
  const tileCheck = w4 && opened.kernels && numerics ? checkTiles(opened.kernels, w4, device, dtype, config, Number(arg('int4-block', '64'))) : undefined;
  if (tileCheck) console.log(JSON.stringify({ kernel_tile_check: true, ...tileCheck }));
  const kernelBandwidth = w4 && opened.kernels && micro ? measureKernel(opened.kernels, w4, device, dtype, config, Number(arg('int4-block', '64'))) : undefined;
  if (kernelBandwidth) console.log(JSON.stringify({ kernel_bandwidth: true, ...kernelBandwidth }));
  const microRows = arg('kernel-micro-rows', '64,128,256').split(',').map(Number);
  if (microRows.some((m) => !Number.isInteger(m) || m < 1)) throw new Error(`--kernel-micro-rows: '${arg('kernel-micro-rows')}' is not a list of row counts`);
  const kernelTiles = w4 && opened.kernels && micro ? measureTiles(opened.kernels, w4, device, dtype, config, Number(arg('int4-block', '64')), microRows) : undefined;
  if (kernelTiles) console.log(JSON.stringify({ kernel_tiles: true, ...kernelTiles }));
  const cublas = w4 && opened.kernels && micro ? measureDenseMatMul(device, dtype, config, microRows) : undefined;
  if (cublas) console.log(JSON.stringify({ dense_matmul: true, ...cublas }));
  const tileVsDense = kernelTiles && 'rows' in kernelTiles && cublas ? compareTiles(kernelTiles.rows, cublas.rows) : undefined;
  if (tileVsDense) console.log(JSON.stringify({ tile_vs_dense: true, rows: tileVsDense }));
  const sweepRows = arg('kernel-sweep-rows', '1,4,8,16').split(',').map(Number);
  const sweepShapes = projectionShapes(config, true).map((p) => ({ ...p, blockSize: Number(arg('int4-block', '64')), dtype }));
  const sweep = flag('kernel-sweep') && w4 ? tuneW4A16(w4, device, sweepShapes, { rows: sweepRows, tiles: flag('kernel-sweep-tiles') }) : undefined;
  const round2 = (x: number) => +x.toFixed(2);
  const sweepReport = sweep && {
    rows: sweep.timings.map((t) => ({ shape: t.name, N: t.N, K: t.K, M: t.M, ...(t.tile ? { tile: t.tile } : { column_tiles: t.columnTiles, rounds: t.rounds }), warps: t.warps, ctas: t.ctas, us: round2(t.us) })),
    best: sweep.table.entries.map((e) => ({ shape: e.name, N: e.N, K: e.K, M: e.M, ...(e.tile ? { tile: w4a16TileDims(e.tile).label } : { column_tiles: e.columnTiles, rounds: e.rounds }), warps: e.warps, us: round2(e.us), default_us: round2(e.defaultUs), gain: +(e.defaultUs / e.us).toFixed(3) })),
  };
  if (sweep) {
    tuned = sweep.table;
    console.log(JSON.stringify({ kernel_sweep: true, ...sweepReport }));
  }
  console.error(`quant-bench: ${shape} weights ready in ${((performance.now() - t0) / 1000).toFixed(1)} s; ${device.kind} ${dtype}; formats ${formats.join(', ')}; batches ${batches.join(', ')}`);

  const next = tokens(seed + 1, config.vocabSize);
  const promptsFor = (n: number, len: number) => Array.from({ length: n }, () => Array.from({ length: len }, next));
  const decodePrompts = new Map(batches.map((b) => [b, promptsFor(b, promptLen)] as const));
  const klSet = promptsFor(klPrompts, promptLen);

  // The dense weights also serve as the KL's reference, under their own names: uploaded only for
  // the KL, so the decode runs' memory is the format's alone.
  const dense = QuantizedModel.fromParts(config, { format: 'int8' }, host, new Map());
  // The dense weights on the device by HF name after `prefix`: from the build's 16-bit bits where it made them (no second rounding pass over 8B parameters)
  const uploadDense = (prefix: string): Map<string, DeviceTensor> => (built.bits?.dtype === dtype ? uploadBits(device, config, built.bits.tensors, dtype, prefix) : dense.deviceTensors(device, dtype, prefix));
  const withReference = async <T>(fn: (reference: ReadonlyMap<string, DeviceTensor>) => Promise<T>): Promise<T> => {
    const reference = uploadDense('original/');
    try {
      return await fn(reference);
    } finally {
      for (const t of reference.values()) t.dispose();
    }
  };
  let referenceTokens: Completion[] | undefined;
  const results: Record<string, unknown>[] = [];
  for (const f of formats) {
    const scheme = SCHEMES[f];
    const q0 = performance.now();
    const model = scheme ? await quantizeOnThreads(config, host, { ...scheme, ...(scheme.format === 'int4' ? { blockSize: int4Block } : {}) }, { threads, lmHead }) : dense;
    const quantizeS = (performance.now() - q0) / 1000;
    const tensors = scheme ? model.deviceTensors(device, dtype) : uploadDense('');
    // What a decode step reads: every weight (as this format stores it) but the embedding rows it does not gather, and the KV cache
    const stepBytes = (B: number) => stepWeightBytes(tensors, { embedding: 'model.embed_tokens.weight', embeddingIsHead: config.tieWordEmbeddings && !model.lmHead, rows: B });
    const graphWeights = (g: L.Graph): Weights => model.graphWeights(g, { dtype, mode }).weights;
    // the kernel takes INT4 only; NF4 has no prepacked path
    const modes = scheme && scheme.format !== 'nf4' ? weightModes.filter((w) => WEIGHT_MODES[w].as !== 'kernel' || scheme.format === 'int4') : ['bound'];
    const projections = [...tensors].filter(([n]) => /_proj\.weight/.test(n)).map(([, t]) => t);
    const denseProjBytes = paramSpecs(config).filter((s) => /_proj\.weight$/.test(s.name)).reduce((n, s) => n + s.shape[0] * s.shape[1] * L.dtypeBytes(dtype), 0);
    const row: Record<string, unknown> = {
      format: f,
      quantize_s: +quantizeS.toFixed(1),
      weight_bytes: bytesOf(tensors.values()),
      projection_bytes: bytesOf(projections),
      projection_ratio_to_dense: +(bytesOf(projections) / denseProjBytes).toFixed(4),
      bits_per_parameter: scheme ? +model.report(L.dtypeBytes(dtype) * 8).bitsPerParameter.toFixed(3) : L.dtypeBytes(dtype) * 8,
      lm_head: scheme ? lmHeadArg : 'dense',
      decode: [] as unknown[],
    };
    // The bound run's greedy tokens per batch: the other modes' agreement with them checks their numerics.
    const boundTokens = new Map<number, Completion[]>();
    try {
      for (const weights of modes) {
        const wm = WEIGHT_MODES[weights];
        // The other modes hold the kernel tensors in their graphs and bind only the dense parameters,
        // the uploaded ones (so their gpu_used_mib also counts the unused bound kernel tensors: projection_bytes).
        const kernelMaxRows = maxRowsOf(weights);
        const ops = opsFor(weights);
        const pipeline = pipelines.get(weights);
        const generation = weights === 'bound' ? undefined : model.generationPlan(device.kind, dtype, { quantizedWeights: wm.as, fusedGemm: wm.fused, mode, kernel: ops, kernelMaxRows, pipeline });
        // the kernel modes read q/k/v and gate/up concatenated: their own upload for the mode (beside `tensors`, in gpu_used_mib)
        const own = generation?.quantizedWeights === 'kernel' ? model.deviceTensors(device, dtype, '', { quantizedWeights: 'kernel' }) : undefined;
        const plan = generation && {
          ...generation,
          tensors: own ?? new Map([...tensors].filter(([n]) => model.dense.has(n))),
          graphWeights: (g: L.Graph): Weights => model.graphWeights(g, { dtype, mode, quantizedWeights: generation.quantizedWeights, kernel: ops, kernelMaxRows, pipeline }).weights,
          session: generation.fusedGemm ? fusedGemmSession() : generation.quantizedWeights === 'kernel' ? { customOpDomains: [...(ops!.session.customOpDomains ?? []), ...(pipeline?.session.customOpDomains ?? [])] } : {},
        };
        try {
          for (const fpa of weights === 'bound' && scheme && scheme.format !== 'nf4' && flag('fpa') ? [false, true] : [false]) {
            const session: SessionOptions = plan ? plan.session : fpa ? fusedGemmSession() : {};
            for (const B of batches) {
              // The dense model under the decode attention kernel reads its q/k/v and gate/up packed (concatProjections over HF-named weights); a quantized one's kernel path concatenates them itself
              const packed = !scheme && decodeAttention !== undefined;
              const fast = { ...(decodeAttention ? { decodeAttention } : {}), ...(greedyPick ? { greedyPick } : {}), ...(packed ? { concatProjections: true } : {}) };
              const { completions, ...m } = await decodeRate(device, config, plan?.tensors ?? tensors, packed ? undefined : (plan?.graphWeights ?? graphWeights), decodePrompts.get(B)!, { dtype, newTokens, repeat, cudaGraph, session, residualDtype, ...(swiglu ? { swiglu } : {}), ...fast });
              decodeAttention?.check();
              greedyPick?.check();
              const weightBytes = stepBytes(B);
              const kvBytes = stepCacheBytes(config, { rows: B, promptLen, steps: m.decode_steps, bytesPerElement: L.dtypeBytes(dtype) });
              const reads = { weight_bytes_per_step: weightBytes, weights_ms_at_peak: round3(msAtPeak(weightBytes, peakTbS)), kv_bytes_per_step: Math.round(kvBytes), kv_ms_at_peak: round3(msAtPeak(kvBytes, peakTbS)), weights_share_of_step: round3(ratioOf(msAtPeak(weightBytes, peakTbS), m.ms_per_step)) };
              if (wm.as === 'kernel') ops!.check();
              pipeline?.check();
              if (weights === 'bound' && !fpa) boundTokens.set(B, completions);
              const bound = boundTokens.get(B);
              const agreement = weights !== 'bound' && bound ? agreementWith(bound, completions) : undefined;
              const line = { format: f, weights, batch: B, fpa: fpa || Boolean(plan?.fusedGemm), fused_layers: plan?.fusedLayers ?? 0, ...(plan?.kernelLayers !== undefined ? { kernel_layers: plan.kernelLayers, kernel_at_this_batch: B <= kernelMaxRows } : {}), ...m, ...reads, ...(agreement ? { agreement_with_bound: agreement } : {}) };
              console.log(JSON.stringify(line));
              (row.decode as unknown[]).push(line);
            }
          }
        } catch (e) {
          // One mode failing (e.g. the fused path refusing on this build) leaves the others' numbers.
          const line = { format: f, weights, error: (e as Error).message.slice(-800) };
          console.log(JSON.stringify(line));
          (row.decode as unknown[]).push(line);
        } finally {
          for (const t of own?.values() ?? []) t.dispose();
        }
      }
      row.gpu_used_mib = gpuUsedMiB();
      if (!referenceTokens && !flag('no-kl')) referenceTokens = await withReference((reference) => greedy(device, config, reference, (g) => dense.graphWeights(g, { dtype, prefix: 'original/' }).weights, klSet, { dtype, newTokens: klNew, cudaGraph }));
      if (scheme && referenceTokens) {
        const tokens = referenceTokens;
        const kl = await withReference((reference) => shift(device, config, dense, model, reference, tensors, klSet, tokens, { dtype, mode, batch: klBatch }));
        row.kl = kl;
        console.log(JSON.stringify({ format: f, kl }));
        // The same KL with the quantized side read as generation reads it (initializers, fused path
        // on where it applies): a scoring graph at M = batch × length, so the fused GEMM's numerics.
        // (the kernel mode's projections are decode steps': a scoring graph keeps MatMulNBits, so no KL of its own)
        const fusedMode = modes.find((w) => w.startsWith('initializers'));
        if (fusedMode) {
          const wm = WEIGHT_MODES[fusedMode];
          const plan = model.generationPlan(device.kind, dtype, { quantizedWeights: wm.as, fusedGemm: wm.fused, mode });
          try {
            const klInit = await withReference((reference) => shift(device, config, dense, model, reference, tensors, klSet, tokens, { dtype, mode, batch: klBatch, quantizedWeights: plan.quantizedWeights, fusedGemm: plan.fusedGemm }));
            row.kl_initializers = { weights: fusedMode, ...klInit };
          } catch (e) {
            row.kl_initializers = { weights: fusedMode, error: (e as Error).message.slice(-800) };
          }
          console.log(JSON.stringify({ format: f, kl_initializers: row.kl_initializers }));
        }
      }
    } catch (e) {
      row.error = (e as Error).message.slice(0, 500);
      console.log(JSON.stringify({ format: f, error: row.error }));
    } finally {
      for (const t of tensors.values()) t.dispose();
    }
    results.push(row);
  }
  const base = results.find((r) => r.format === 'dense');
  type DecodeLine = { batch: number; weights: string; fpa: boolean; decode_tok_s: number };
  const rate = (r: Record<string, unknown>, B: number, weights: string, fpa: boolean) => (r.decode as DecodeLine[] | undefined)?.find((d) => d.batch === B && d.weights === weights && d.fpa === fpa)?.decode_tok_s;
  const speedup = Object.fromEntries(
    results
      .filter((r) => r !== base && base)
      .map((r) => {
        const lines = (r.decode as DecodeLine[]).filter((d) => d.decode_tok_s !== undefined);
        const keys = [...new Set(lines.map((d) => `${d.weights}${d.weights === 'bound' && d.fpa ? '+fpa' : ''}`))];
        const byKey = Object.fromEntries(
          keys.map((k) => {
            const [weights, fpaTag] = k.split('+');
            const fpa = fpaTag === 'fpa' || (weights !== 'bound' && WEIGHT_MODES[weights].fused);
            return [k, Object.fromEntries(batches.map((B) => [B, ratio(rate(r, B, weights, fpa), rate(base!, B, 'bound', false))]))];
          }),
        );
        return [r.format, byKey];
      }),
  );
  // Per format, weights mode and batch: the measured step beside the time its weight and cache reads take at the HBM peak
  type BoundLine = DecodeLine & { format: string; ms_per_step: number; weights_ms_at_peak?: number; kv_ms_at_peak?: number; weights_share_of_step?: number };
  const weightBound = results.flatMap((r) => ((r.decode as BoundLine[] | undefined) ?? []).filter((d) => d.ms_per_step !== undefined).map((d) => ({ format: d.format, weights: d.weights, batch: d.batch, ms_per_step: d.ms_per_step, weights_ms_at_peak: d.weights_ms_at_peak ?? null, kv_ms_at_peak: d.kv_ms_at_peak ?? null, weights_share_of_step: d.weights_share_of_step ?? null })));
  console.log(JSON.stringify({ summary: true, shape, parameters, host_build_s: +hostBuildS.toFixed(1), threads, device: device.kind, gpu: gpu ?? null, peak_tb_s: peakTbS ?? null, dtype, mode, cuda_graph: cudaGraph, decode_attention: decodeAttentionArg, greedy_pick: greedyPick !== undefined, fast_decode: fastDecode, ...(wantKernel ? { kernel_checks: kernelChecks, kernel_max_rows: kernelMaxRowsArg, kernel_column_tiles: columnTiles ?? 'default', kernel_tile_from_rows: tileFromRows, kernel_tile: arg('kernel-tile', 'auto') } : {}), prompt_len: promptLen, new_tokens: newTokens, int4_block: int4Block, weights: weightModes, fpa_env: process.env.ORT_FPA_INTB_GEMM ?? null, probe, ...(kernelCheck ? { kernel_check: kernelCheck, kernel_tile_check: tileCheck, kernel_bandwidth: kernelBandwidth, kernel_tiles: kernelTiles, dense_matmul: cublas, tile_vs_dense: tileVsDense } : {}), ...(sweepReport ? { kernel_sweep_best: sweepReport.best } : {}), lm_head: lmHeadArg, swiglu_kernel: swiglu !== undefined, residual_dtype: residualDtype, results, speedup_vs_dense: speedup, weight_bound: weightBound }));
  if (kernelCheck && !kernelCheck.ok) throw new Error(`kernel check failed: the W4A16 op's max relative error against the float64 reference is ${kernelCheck.max_rel_err} (limit ${kernelCheck.limit})`);
  if (tileCheck && 'ok' in tileCheck && !tileCheck.ok) throw new Error(`kernel tile check failed: a tiled W4A16 build's max relative error against the float64 reference is ${tileCheck.max_rel_err} (limit ${tileCheck.limit})`);
}

/** Qwen3's q, gate and down projection shapes of `config` (N, K); with `fused`, also q/k/v and gate/up stacked along N (as the kernel mode runs them). */
function projectionShapes(config: DecoderConfig, fused = false): { name: string; N: number; K: number }[] {
  const q = paramSpecs(config).find((s) => /layers\.0\.self_attn\.q_proj\.weight$/.test(s.name));
  const gate = paramSpecs(config).find((s) => /layers\.0\.mlp\.gate_proj\.weight$/.test(s.name));
  const down = paramSpecs(config).find((s) => /layers\.0\.mlp\.down_proj\.weight$/.test(s.name));
  const kv = paramSpecs(config).find((s) => /layers\.0\.self_attn\.k_proj\.weight$/.test(s.name));
  const shapes = [
    ['q_proj', q],
    ['gate_proj', gate],
    ['down_proj', down],
  ].flatMap(([name, s]) => (s && typeof s !== 'string' ? [{ name: name as string, N: s.shape[0], K: s.shape[1] }] : []));
  if (fused && q && kv && gate) shapes.push({ name: 'qkv_proj', N: q.shape[0] + 2 * kv.shape[0], K: q.shape[1] }, { name: 'gate_up_proj', N: 2 * gate.shape[0], K: gate.shape[1] });
  return shapes;
}

/**
 * The W4A16 op on the device against an independent truth: one graph per projection shape and M (1, 16,
 * 40, 64, 256: the split-K kernels, then the tiled ones from 17 rows by default), with and without zero
 * points, the op and MatMulNBits over the same seeded inputs, both compared with the float64 host
 * product of the operands as they see them (activations, scales and each dequantized weight rounded
 * to the dtype), on the first and last 8 rows. The verdict is the op's max relative error
 * (max |op − ref| / max |ref|): limit 1e-2 in 16 bits (C rounded once, 2⁻⁹ relative, plus fp32 sums
 * in another order), 1e-5 in float32. MatMulNBits' own error against the reference, and the op
 * against MatMulNBits on every row, are printed beside it: MatMulNBits is no reference itself.
 */
async function checkKernel(device: Device, dtype: DType, ops: W4A16Ops, config: DecoderConfig, blockSize: number): Promise<{ ok: boolean; max_rel_err: number; limit: number; cases: Record<string, unknown>[] }> {
  const limit = dtype === 'float32' ? 1e-5 : 1e-2;
  const toHost = (a: Float32Array) => (dtype === 'bfloat16' ? toBfloat16Bits(a) : dtype === 'float16' ? toFloat16Bits(a) : a);
  // the values both ops see: activations and scales rounded to the dtype, each weight (q − zp)·scale rounded to it
  const rounded = (a: Float32Array) => (dtype === 'bfloat16' ? fromBfloat16Bits(toBfloat16Bits(a)) : dtype === 'float16' ? fromFloat16Bits(toFloat16Bits(a)) : a);
  const cases: Record<string, unknown>[] = [];
  let worst = 0;
  const next = tokens(12345, 1 << 30);
  const uniform = () => next() / (1 << 30);
  for (const { name, N, K } of projectionShapes(config)) {
    for (const zp of [false, true]) {
      // one weight a shape and zero-point choice, every M over it (at Qwen3-8B's shapes its making and rounding dominate the host work)
      const w = randomWeights(N * K, uniform);
      const q = quantizeInt4(w, N, K, { blockSize, zeroPoints: zp });
      const l = kernelLayout(q) as NBitsLayout;
      const kb = l.bShape[1];
      const wr = rounded(dequantize({ ...q, scales: rounded(q.scales) }));
      for (const M of device.kind === 'cuda' ? [1, 16, 40, 64, 256] : [1, 3, 20]) {
        const g = new L.Graph(`w4a16_check_${name}_${M}_${zp}`);
        const x = g.input('x', dtype, [M, K]);
        const b = g.input('b', 'uint8', [...l.bShape]);
        const s = g.input('scales', dtype, [N, kb]);
        const z = l.zeroPoints ? g.input('zp', 'uint8', [N, l.zeroPoints.length / N]) : undefined;
        g.output(L.cast(ops.matmul(x, b, s, z, l.attrs), 'float32'), 'ours');
        g.output(L.cast(matMulNBits(x, b, s, z, l.attrs), 'float32'), 'ort');
        const session = device.compile(g, { name: g.name, ...ops.session });
        try {
          const xs = Float32Array.from({ length: M * K }, () => 2 * uniform() - 1);
          const feeds: Record<string, HostTensor> = {
            x: { data: toHost(xs), dims: [M, K] },
            b: { data: l.b, dims: [...l.bShape] },
            scales: { data: toHost(l.scales), dims: [N, kb] },
            ...(l.zeroPoints ? { zp: { data: l.zeroPoints, dims: [N, l.zeroPoints.length / N] } } : {}),
          };
          const out = await session.run(feeds);
          ops.check();
          const ours = out.ours.data as Float32Array;
          const ort = out.ort.data as Float32Array;
          // The independent truth: the same rounded operands multiplied in float64 on the host, for the
          // first and last 8 rows (every row kernel and tile position is among them; all rows is minutes at 1.7B).
          const xr = rounded(xs);
          const rows = [...new Set([...Array(Math.min(8, M)).keys(), ...Array.from({ length: Math.min(8, M) }, (_, i) => M - 1 - i)])];
          const err = { ours: 0, ort: 0 };
          let scale = 0;
          for (const m of rows) {
            for (let n = 0; n < N; n++) {
              let ref = 0;
              for (let k = 0; k < K; k++) ref += xr[m * K + k] * wr[n * K + k];
              scale = Math.max(scale, Math.abs(ref));
              err.ours = Math.max(err.ours, Math.abs(ours[m * N + n] - ref));
              err.ort = Math.max(err.ort, Math.abs(ort[m * N + n] - ref));
            }
          }
          let vsOrt = 0;
          let ortScale = 0;
          for (let i = 0; i < ort.length; i++) {
            vsOrt = Math.max(vsOrt, Math.abs(ours[i] - ort[i]));
            ortScale = Math.max(ortScale, Math.abs(ort[i]));
          }
          const rel = err.ours / Math.max(scale, 1e-30);
          worst = Math.max(worst, Number.isNaN(rel) ? Infinity : rel);
          cases.push({ shape: name, N, K, M, zero_points: zp, max_rel_err: +rel.toExponential(3), ort_max_rel_err: +(err.ort / Math.max(scale, 1e-30)).toExponential(3), vs_ort_max_rel: +(vsOrt / Math.max(ortScale, 1e-30)).toExponential(3) });
        } finally {
          session.dispose();
        }
      }
    }
  }
  const ok = worst <= limit;
  if (!ok) console.error(`quant-bench: KERNEL CHECK FAILED — the W4A16 op differs from the float64 reference by ${worst.toExponential(3)} relative (limit ${limit})`);
  return { ok, max_rel_err: +worst.toExponential(3), limit, cases };
}

/**
 * Every tiled build the device runs, launched directly (not only the plan's choices, which `checkKernel` covers
 * through the op) on the q, gate and down shapes at M = 40 and 256 with zero points, against the float64 host
 * product of the operands as the kernels see them on the first and last 8 rows; limit 1e-2 relative, as
 * `checkKernel`'s. One reference per shape and M, every build compared with it.
 */
function checkTiles(kernels: Kernels, w4: W4A16, device: Device, dtype: DType, config: DecoderConfig, blockSize: number): { ok: boolean; max_rel_err: number; limit: number; cases: Record<string, unknown>[] } | { skipped: string } {
  if (dtype !== 'bfloat16' && dtype !== 'float16') return { skipped: `the kernels take bfloat16 or float16, not ${dtype}` };
  const limit = 1e-2;
  const bits = (a: Float32Array) => (dtype === 'bfloat16' ? toBfloat16Bits(a) : toFloat16Bits(a));
  const value = (a: Uint16Array) => (dtype === 'bfloat16' ? fromBfloat16Bits(a) : fromFloat16Bits(a));
  const rounded = (a: Float32Array) => value(bits(a));
  const next = tokens(54321, 1 << 30);
  const uniform = () => next() / (1 << 30);
  const cases: Record<string, unknown>[] = [];
  let worst = 0;
  for (const { name, N, K } of projectionShapes(config)) {
    const w = randomWeights(N * K, uniform);
    const q = quantizeInt4(w, N, K, { blockSize, zeroPoints: true });
    const l = kernelLayout(q) as NBitsLayout;
    const kb = l.bShape[1];
    const wr = rounded(dequantize({ ...q, scales: rounded(q.scales) }));
    const owned: DeviceTensor[] = [];
    try {
      const b = device.upload({ data: l.b, dims: [...l.bShape] }, 'uint8');
      owned.push(b);
      const sc = device.upload({ data: bits(l.scales), dims: [N, kb] }, dtype);
      owned.push(sc);
      const zp = device.upload({ data: l.zeroPoints!, dims: [N, l.zeroPoints!.length / N] }, 'uint8');
      owned.push(zp);
      for (const M of [40, 256]) {
        const xs = rounded(Float32Array.from({ length: M * K }, () => 2 * uniform() - 1));
        const a = device.upload({ data: bits(xs), dims: [M, K] }, dtype);
        owned.push(a);
        const c = device.upload({ data: new Uint16Array(M * N), dims: [M, N] }, dtype);
        owned.push(c);
        const rows = [...new Set([...Array(Math.min(8, M)).keys(), ...Array.from({ length: Math.min(8, M) }, (_, i) => M - 1 - i)])];
        const ref = new Float64Array(rows.length * N);
        let scale = 0;
        rows.forEach((m, i) => {
          for (let n = 0; n < N; n++) {
            let sum = 0;
            for (let k = 0; k < K; k++) sum += xs[m * K + k] * wr[n * K + k];
            ref[i * N + n] = sum;
            scale = Math.max(scale, Math.abs(sum));
          }
        });
        const shape = { M, N, K, kBlocks: kb, blockSize, dtype };
        // every tiled build, then the wgmma builds (sm_90): the same product, the same limit
        const builds: { label: string; opts: W4A16LaunchOptions }[] = [
          ...W4A16_TILE_VARIANTS.filter((x) => w4.runsTile(x)).map((v) => ({ label: w4a16TileDims(v).label, opts: { tileFromRows: 1, tile: v } })),
          ...(w4.wgmmaUnavailable ? [] : W4A16_WG_BUILDS).map((v) => ({ label: w4a16WgLabel(v), opts: { wgmma: v } })),
        ];
        for (const { label, opts } of builds) {
          c.upload(new Uint16Array(M * N).fill(0x7fc0));
          w4.matmul(shape, { a, b, scales: sc, zeroPoints: zp, c }, undefined, opts);
          kernels.synchronize();
          const got = value(c.download().data as Uint16Array);
          let err = 0;
          rows.forEach((m, i) => {
            for (let n = 0; n < N; n++) err = Math.max(err, Math.abs(got[m * N + n] - ref[i * N + n]));
          });
          const rel = err / Math.max(scale, 1e-30);
          worst = Math.max(worst, Number.isNaN(rel) ? Infinity : rel);
          cases.push({ shape: name, N, K, M, tile: label, max_rel_err: Number.isNaN(rel) ? 'NaN' : +rel.toExponential(3) });
        }
      }
    } finally {
      for (const t of owned) t.dispose();
    }
  }
  const ok = worst <= limit;
  if (!ok) console.error(`quant-bench: KERNEL TILE CHECK FAILED — a tiled W4A16 build differs from the float64 reference by ${worst.toExponential(3)} relative (limit ${limit})`);
  return { ok, max_rel_err: +worst.toExponential(3), limit, ...(w4.wgmmaUnavailable ? { wgmma_unavailable: w4.wgmmaUnavailable } : {}), cases };
}

/** HBM bandwidth (bytes/s) of the GPU nvidia-smi names: H200 4.8 TB/s, H100 3.35 TB/s, else undefined. */
function peakBandwidth(): { gpu?: string; peak_tb_s?: number } {
  const r = spawnSync('nvidia-smi', ['--query-gpu=name', '--format=csv,noheader'], { encoding: 'utf8' });
  const gpu = r.status === 0 ? r.stdout.trim().split('\n')[0] : undefined;
  return { gpu, peak_tb_s: gpu?.includes('H200') ? 4.8 : gpu?.includes('H100') ? 3.35 : undefined };
}

/**
 * The kernel alone on one projection of each shape at M = 1 and 16 (in `dtype`, bf16 or fp16): device time
 * per call (events around a CUDA graph of 200 back-to-back launches, after a warm-up) and the weight bytes (codes and
 * scales) it streams per second. The calls rotate over copies of the weights that together exceed twice
 * the L2 cache, so each call reads HBM, as a decode step (other layers' weights between) does.
 */
function measureKernel(kernels: Kernels, w4: W4A16, device: Device, dtype: DType, config: DecoderConfig, blockSize: number): Record<string, unknown> {
  if (dtype !== 'bfloat16' && dtype !== 'float16') return { skipped: `the kernels take bfloat16 or float16, not ${dtype}` };
  const half = (x: Float32Array) => (dtype === 'bfloat16' ? toBfloat16Bits(x) : toFloat16Bits(x));
  const peak = peakBandwidth();
  const rows: Record<string, unknown>[] = [];
  for (const { name, N, K } of projectionShapes(config, true)) {
    // enough copies of the weights to exceed L2 twice over, so each call reads HBM
    const weights = w4a16TimingWeights(device, { N, K, blockSize, dtype });
    const { kBlocks: kb, weightBytes, copies, codes: bs, scales: ss } = weights;
    try {
      for (const [M, nt] of [[1, 1], [1, 2], [16, 1], [16, 2]] as const) {
        const a = device.upload({ data: half(new Float32Array(M * K).fill(0.5)), dims: [M, K] }, dtype);
        const c = device.upload({ data: new Uint16Array(M * N), dims: [M, N] }, dtype);
        try {
          const shape = { M, N, K, kBlocks: kb, blockSize, dtype };
          const ms = kernels.timeLaunches((i) => w4.matmul(shape, { a, b: bs[i % copies], scales: ss[i % copies], zeroPoints: 0n, c }, undefined, nt));
          const gbs = weightBytes / (ms / 1000) / 1e9;
          rows.push({ shape: name, N, K, M, column_tiles: nt, us_per_call: +(ms * 1000).toFixed(2), weight_bytes: weightBytes, weight_gb_s: +gbs.toFixed(1), ...(peak.peak_tb_s ? { share_of_peak: +(gbs / (peak.peak_tb_s * 1000)).toFixed(3) } : {}) });
        } finally {
          a.dispose();
          c.dispose();
        }
      }
    } finally {
      weights.dispose();
    }
  }
  return { ...peak, block_size: blockSize, rows };
}

/** `--kernel-tile`: 'auto' (undefined: the plan's choice) or the label of a tiled build (`w4a16TileDims`: 64x64, 64x128w8k2, …). */
function parseTile(text: string): W4A16Tile | undefined {
  if (text === 'auto') return undefined;
  const v = W4A16_TILE_VARIANTS.find((x) => w4a16TileDims(x).label === text);
  if (!v) throw new Error(`--kernel-tile: '${text}' is not auto or one of ${W4A16_TILE_VARIANTS.map((x) => w4a16TileDims(x).label).join(', ')}`);
  return v;
}

/**
 * The tiled kernels alone on each projection shape (and the fused q/k/v and gate/up) at each M of `rows`:
 * the plan's tile, every tile the device runs (with the plan's estimate of it in µs, `estimate_us`), and the split-K
 * kernels (`tileFromRows` past M) — device µs per call, TFLOP/s (2·M·N·K) and the weight bytes (codes and scales) per
 * second, over weight copies that exceed L2 twice.
 */
function measureTiles(kernels: Kernels, w4: W4A16, device: Device, dtype: DType, config: DecoderConfig, blockSize: number, rows: readonly number[]): { block_size: number; rows: Record<string, unknown>[] } | { skipped: string } {
  if (dtype !== 'bfloat16' && dtype !== 'float16') return { skipped: `the kernels take bfloat16 or float16, not ${dtype}` };
  const half = (x: Float32Array) => (dtype === 'bfloat16' ? toBfloat16Bits(x) : toFloat16Bits(x));
  const out: Record<string, unknown>[] = [];
  for (const { name, N, K } of projectionShapes(config, true)) {
    const weights = w4a16TimingWeights(device, { N, K, blockSize, dtype });
    const { kBlocks: kb, weightBytes, copies, codes: bs, scales: ss } = weights;
    try {
      for (const M of rows) {
        const a = device.upload({ data: half(new Float32Array(M * K).fill(0.5)), dims: [M, K] }, dtype);
        const c = device.upload({ data: new Uint16Array(M * N), dims: [M, N] }, dtype);
        try {
          const shape = { M, N, K, kBlocks: kb, blockSize, dtype };
          const chosen = w4.tilePlan(shape);
          const runs: { kernel: string; opts: W4A16LaunchOptions; estimate?: number }[] = [
            { kernel: `tile plan (${chosen.label})`, opts: { tileFromRows: 1 } },
            // every build this device runs, with the plan's estimate of it (clocks) to calibrate the estimate against
            ...W4A16_TILE_VARIANTS.filter((v) => w4.runsTile(v)).map((v) => ({ kernel: `tile ${w4a16TileDims(v).label}`, opts: { tileFromRows: 1, tile: v }, estimate: w4.tileEstimate(shape, v) })),
            { kernel: 'split-K', opts: { tileFromRows: Infinity } },
            // the wgmma builds (sm_90): the default choice, then each
            ...(w4.wgmmaUnavailable ? [] : [{ kernel: `wgmma choice (${w4a16WgLabel(w4a16WgChoice(shape, kernels.smCount))})`, opts: { wgmmaFromRows: 1 } }, ...W4A16_WG_BUILDS.map((v) => ({ kernel: `wgmma ${w4a16WgLabel(v)}`, opts: { wgmma: v } }))]),
          ];
          for (const r of runs) {
            const ms = kernels.timeLaunches((i) => w4.matmul(shape, { a, b: bs[i % copies], scales: ss[i % copies], zeroPoints: 0n, c }, undefined, r.opts));
            out.push({ shape: name, N, K, M, kernel: r.kernel, us_per_call: +(ms * 1000).toFixed(2), tflop_s: +((2 * M * N * K) / (ms / 1000) / 1e12).toFixed(1), weight_gb_s: +(weightBytes / (ms / 1000) / 1e9).toFixed(1), ...(r.estimate !== undefined ? { estimate_us: +r.estimate.toFixed(2) } : {}) });
          }
        } finally {
          a.dispose();
          c.dispose();
        }
      }
    } finally {
      weights.dispose();
    }
  }
  return { block_size: blockSize, rows: out };
}

/**
 * ONNX Runtime's dense MatMul (cuBLAS) in `dtype` on the same shapes: one session of R MatMuls x [M, K] ·
 * W_i [K, N] over R weight copies that exceed L2 twice, run as a CUDA graph with every tensor bound; µs per
 * MatMul is a run's wall time (best of 5 × 20 runs, each synchronized) over R, so it carries 1/R of a run's
 * launch and sync. A session that fails to build or run is reported, not fatal.
 */
function measureDenseMatMul(device: Device, dtype: DType, config: DecoderConfig, rows: readonly number[]): { rows: Record<string, unknown>[] } {
  const half = (x: Float32Array) => (dtype === 'bfloat16' ? toBfloat16Bits(x) : dtype === 'float16' ? toFloat16Bits(x) : x);
  const out: Record<string, unknown>[] = [];
  for (const { name, N, K } of projectionShapes(config, true)) {
    const weightBytes = N * K * L.dtypeBytes(dtype);
    const R = Math.max(4, Math.ceil((2 * 60e6) / weightBytes));
    const hostW = half(new Float32Array(K * N).fill(0.001));
    const ws = Array.from({ length: R }, () => device.upload({ data: hostW, dims: [K, N] }, dtype));
    try {
      for (const M of rows) {
        const g = new L.Graph(`dense_matmul_${name}_${M}`);
        const x = g.input('x', dtype, [M, K]);
        for (let i = 0; i < R; i++) g.output(L.matmul(x, g.input(`w${i}`, dtype, [K, N])), `y${i}`);
        const xs = device.upload({ data: half(new Float32Array(M * K).fill(0.5)), dims: [M, K] }, dtype);
        const ys = Array.from({ length: R }, () => device.upload({ data: new Uint16Array(M * N), dims: [M, N] }, dtype));
        let session: ReturnType<Device['compile']> | undefined;
        try {
          session = device.compile(g, { name: g.name, cudaGraph: true });
          const b = session.binding();
          b.input('x', xs);
          ws.forEach((w, i) => b.input(`w${i}`, w));
          ys.forEach((y, i) => b.output(`y${i}`, y));
          for (let i = 0; i < 3; i++) b.runSync();
          let best = Infinity;
          for (let rep = 0; rep < 5; rep++) {
            const t0 = performance.now();
            for (let i = 0; i < 20; i++) b.runSync();
            best = Math.min(best, (performance.now() - t0) / 20);
          }
          b.dispose();
          const ms = best / R;
          out.push({ shape: name, N, K, M, kernel: `ort MatMul ${dtype}`, matmuls_per_run: R, us_per_call: +(ms * 1000).toFixed(2), tflop_s: +((2 * M * N * K) / (ms / 1000) / 1e12).toFixed(1), weight_gb_s: +(weightBytes / (ms / 1000) / 1e9).toFixed(1) });
        } catch (e) {
          out.push({ shape: name, N, K, M, kernel: `ort MatMul ${dtype}`, error: (e as Error).message.slice(0, 300) });
        } finally {
          session?.dispose();
          xs.dispose();
          for (const y of ys) y.dispose();
        }
      }
    } finally {
      for (const w of ws) w.dispose();
    }
  }
  return { rows: out };
}

/** Per shape and M: the plan's tile, the best tile, split-K, the wgmma choice (sm_90) and the dense MatMul's µs, and dense µs / kernel µs (≥ 1: the kernel is at least as fast). */
function compareTiles(tiles: Record<string, unknown>[], dense: Record<string, unknown>[]): Record<string, unknown>[] {
  const key = (r: Record<string, unknown>) => `${String(r.shape)}/${String(r.M)}`;
  return dense.map((d) => {
    const mine = tiles.filter((t) => key(t) === key(d));
    const plan = mine.find((t) => String(t.kernel).startsWith('tile plan'));
    const best = mine.filter((t) => String(t.kernel).startsWith('tile ') && !String(t.kernel).startsWith('tile plan')).sort((p, q) => Number(p.us_per_call) - Number(q.us_per_call))[0];
    const split = mine.find((t) => t.kernel === 'split-K');
    const wgmma = mine.find((t) => String(t.kernel).startsWith('wgmma choice'));
    const denseUs = typeof d.us_per_call === 'number' ? d.us_per_call : undefined;
    return {
      shape: d.shape,
      M: d.M,
      dense_us: denseUs ?? null,
      plan_kernel: plan?.kernel ?? null,
      plan_us: plan?.us_per_call ?? null,
      best_tile: best?.kernel ?? null,
      best_tile_us: best?.us_per_call ?? null,
      split_k_us: split?.us_per_call ?? null,
      dense_over_plan: ratio(denseUs, plan?.us_per_call as number | undefined),
      dense_over_best_tile: ratio(denseUs, best?.us_per_call as number | undefined),
      ...(wgmma ? { wgmma_kernel: wgmma.kernel, wgmma_us: wgmma.us_per_call, dense_over_wgmma: ratio(denseUs, wgmma.us_per_call as number | undefined) } : {}),
    };
  });
}

function ratio(a: number | undefined, b: number | undefined): number | null {
  return a && b ? +(a / b).toFixed(3) : null;
}

/** `n` weights uniform in ±0.04 from `uniform` (a plain loop: Float32Array.from's callback is slow at 50M elements). */
function randomWeights(n: number, uniform: () => number): Float32Array {
  const w = new Float32Array(n);
  for (let i = 0; i < n; i++) w[i] = 0.04 * (2 * uniform() - 1);
  return w;
}

/** a / b, or undefined where either is missing. */
function ratioOf(a: number | undefined, b: number | undefined): number | undefined {
  return a !== undefined && b ? a / b : undefined;
}

/** `x` to three decimals (undefined stays undefined). */
function round3(x: number | undefined): number | undefined {
  return x === undefined ? undefined : +x.toFixed(3);
}

/** The dense weights on the device from their 16-bit bits (HF names after `prefix`), freed again if an upload fails. */
function uploadBits(device: Device, config: DecoderConfig, bits: ReadonlyMap<string, Uint16Array>, dtype: DType, prefix: string): Map<string, DeviceTensor> {
  const out = new Map<string, DeviceTensor>();
  try {
    for (const spec of paramSpecs(config)) out.set(prefix + spec.name, device.upload({ data: bits.get(spec.name)!, dims: spec.shape }, dtype));
  } catch (e) {
    for (const t of out.values()) t.dispose();
    throw e;
  }
  return out;
}

/**
 * Whether this ORT build's fused weight-only GEMM is live: one MatMulNBits node (INT4, N = K = 512,
 * block 64, M = 16) with the path asked for, over bound inputs (the fused path refuses: nothing was
 * prepacked) and over initializers (it must run and match x · dequant(W)ᵀ computed on the host).
 */
async function probeFusedPath(device: Device, dtype: DType): Promise<Record<string, unknown>> {
  const N = 512;
  const K = 512;
  const M = 16;
  const w = new Float32Array(N * K).map((_, i) => Math.sin(i * 0.37) * 0.05);
  const x = new Float32Array(M * K).map((_, i) => Math.cos(i * 0.11));
  const q = quantizeInt4(w, N, K, { blockSize: 64 });
  const l = kernelLayout(q) as NBitsLayout;
  const toHost = (a: Float32Array) => (dtype === 'bfloat16' ? toBfloat16Bits(a) : dtype === 'float16' ? toFloat16Bits(a) : a);
  const fromHost = (a: Uint16Array | Float32Array) => (a instanceof Float32Array ? a : dtype === 'bfloat16' ? fromBfloat16Bits(a) : fromFloat16Bits(a));
  // the host reference over the activations as the device sees them (rounded to dtype)
  const xr = fromHost(toHost(x));
  const wd = dequantize(q);
  const want = new Float32Array(M * N);
  for (let m = 0; m < M; m++) for (let n = 0; n < N; n++) {
    let acc = 0;
    for (let k = 0; k < K; k++) acc += xr[m * K + k] * wd[n * K + k];
    want[m * N + n] = acc;
  }
  const run = async (as: QuantizedWeightsAs) => {
    const g = new L.Graph(`fpa_probe_${as}`);
    const a = g.input('x', dtype, [M, K]);
    const bytes = (d: Uint8Array | Uint16Array | Float32Array) => new Uint8Array(d.buffer, d.byteOffset, d.byteLength);
    const decl = (name: string, dt: DType, shape: number[], data: Uint8Array | Uint16Array | Float32Array) => (as === 'initializers' ? g.initializer(name, dt, shape, { kind: 'inline', bytes: bytes(data) }) : g.input(name, dt, shape));
    const b = decl('b', 'uint8', [...l.bShape], l.b);
    const s = decl('scales', dtype, [N, l.bShape[1]], toHost(l.scales));
    g.output(L.cast(matMulNBits(a, b, s, undefined, l.attrs), 'float32'), 'y');
    const session = device.compile(g, { name: g.name, ...fusedGemmSession() });
    try {
      const feeds: Record<string, HostTensor> = { x: { data: toHost(x), dims: [M, K] } };
      if (as === 'inputs') Object.assign(feeds, { b: { data: l.b, dims: [...l.bShape] }, scales: { data: toHost(l.scales), dims: [N, l.bShape[1]] } });
      const out = await session.run(feeds);
      return out.y.data as Float32Array;
    } finally {
      session.dispose();
    }
  };
  const result: Record<string, unknown> = {};
  try {
    await run('inputs');
    result.bound_inputs = 'ran (the fused path was not taken: this build or node does not use it, or it does not need prepacking)';
  } catch (e) {
    result.bound_inputs = `refused: ${(e as Error).message.slice(-300)}`;
  }
  try {
    const y = await run('initializers');
    let err = 0;
    let scale = 0;
    for (let i = 0; i < y.length; i++) {
      err = Math.max(err, Math.abs(y[i] - want[i]));
      scale = Math.max(scale, Math.abs(want[i]));
    }
    result.initializers = { ran: true, max_abs_err: +err.toExponential(3), max_abs_value: +scale.toFixed(4) };
  } catch (e) {
    result.initializers = { ran: false, error: (e as Error).message.slice(-500) };
  }
  // Live: bound inputs refused for want of prepacking, and the initializer node ran to the right values.
  const init = result.initializers as { ran: boolean; max_abs_err?: number; max_abs_value?: number };
  result.fused_path = String(result.bound_inputs).startsWith('refused') && init.ran && init.max_abs_err! < 0.02 * init.max_abs_value! ? 'live' : 'not observed';
  return result;
}

interface DecodeOptions {
  dtype: DType;
  newTokens: number;
  repeat: number;
  cudaGraph: boolean;
  session: SessionOptions;
  /** The decode steps' SwiGLU through this kernel (--swiglu-kernel). */
  swiglu?: KvCacheGeneratorOptions['swiglu'];
  /** The residual stream's dtype in the decode graphs (--residual-dtype). */
  residualDtype: ResidualDtype;
  /** The decode step's attention through Lathe's kernel (--decode-attention kernel). */
  decodeAttention?: KvCacheGeneratorOptions['decodeAttention'];
  /** The greedy token pick through Lathe's fused op (--greedy-pick). */
  greedyPick?: KvCacheGeneratorOptions['greedyPick'];
  /** q/k/v and gate/up as one packed matmul each (dense weights only). */
  concatProjections?: boolean;
}

/** Decode tokens/s of the KV-cache generator over `tensors` (bound by name) at the batch of `prompts`: the best of `repeat` timed calls after a warm-up. */
async function decodeRate(device: Device, config: DecoderConfig, tensors: ReadonlyMap<string, DeviceTensor>, graphWeights: ((g: L.Graph) => Weights) | undefined, prompts: number[][], o: DecodeOptions) {
  const B = prompts.length;
  const t0 = performance.now();
  const fast = { ...(o.decodeAttention ? { decodeAttention: o.decodeAttention } : {}), ...(o.greedyPick ? { greedyPick: o.greedyPick } : {}), ...(o.concatProjections ? { concatProjections: true } : {}) };
  const gen = KvCacheGenerator.create(device, config, tensors, { temperature: 0, rows: B, maxLength: prompts[0].length + o.newTokens, dtype: o.dtype, cudaGraph: o.cudaGraph, ...(graphWeights ? { graphWeights } : {}), session: o.session, residualDtype: o.residualDtype, ...(o.swiglu ? { swiglu: o.swiglu } : {}), ...fast });
  try {
    const call = { maxNewTokens: o.newTokens, seed: 1 };
    let last = await gen.generate(prompts, call);
    // the generator's creation and first call: its sessions compiled, its CUDA graphs captured
    const firstMs = performance.now() - t0;
    let best = { decodeMs: Infinity, decodeSteps: 0, prefillMs: 0, totalMs: 0 };
    for (let i = 0; i < o.repeat; i++) {
      const s = performance.now();
      last = await gen.generate(prompts, call);
      const t = gen.lastTimings;
      if (t.decodeMs < best.decodeMs) best = { decodeMs: t.decodeMs, decodeSteps: t.decodeSteps, prefillMs: t.prefillMs, totalMs: performance.now() - s };
    }
    return {
      // In use while the generator (its sessions, KV cache and the weights) is alive: the run's peak, near enough.
      gpu_used_mib: gpuUsedMiB(),
      decode_tok_s: +((B * best.decodeSteps) / (best.decodeMs / 1000)).toFixed(1),
      ms_per_step: +(best.decodeMs / best.decodeSteps).toFixed(3),
      decode_steps: best.decodeSteps,
      prefill_ms: +best.prefillMs.toFixed(1),
      total_ms: +best.totalMs.toFixed(1),
      first_call_ms: +firstMs.toFixed(1),
      completions: last,
    };
  } finally {
    gen.dispose();
  }
}

/** How far `got`'s greedy tokens follow `want`'s: the share of rows whose first token agrees, and the mean agreeing prefix as a share of the tokens. */
function agreementWith(want: Completion[], got: Completion[]): { first_token: number; prefix: number; logprob_mean_abs_diff: number; logprob_max_abs_diff: number } {
  let first = 0;
  let prefix = 0;
  let total = 0;
  // the chosen tokens' log-probs over each shared prefix: how far the two numerics drift before the paths part
  let diffSum = 0;
  let diffMax = 0;
  want.forEach((w, i) => {
    const g = got[i]?.tokens ?? [];
    let n = 0;
    while (n < w.tokens.length && n < g.length && g[n] === w.tokens[n]) {
      const d = Math.abs(w.rawLogprobs[n] - got[i].rawLogprobs[n]);
      diffSum += d;
      diffMax = Math.max(diffMax, d);
      n++;
    }
    if (n > 0) first++;
    prefix += n;
    total += w.tokens.length;
  });
  return { first_token: +(first / want.length).toFixed(3), prefix: +(prefix / Math.max(total, 1)).toFixed(3), logprob_mean_abs_diff: +(diffSum / Math.max(prefix, 1)).toExponential(2), logprob_max_abs_diff: +diffMax.toExponential(2) };
}

/** The dense model's greedy continuations of `prompts` (the tokens the KL is measured on). */
async function greedy(device: Device, config: DecoderConfig, tensors: ReadonlyMap<string, DeviceTensor>, graphWeights: (g: L.Graph) => Weights, prompts: number[][], o: { dtype: DType; newTokens: number; cudaGraph: boolean }): Promise<Completion[]> {
  const gen = KvCacheGenerator.create(device, config, tensors, { temperature: 0, rows: prompts.length, maxLength: prompts[0].length + o.newTokens, dtype: o.dtype, cudaGraph: o.cudaGraph, graphWeights });
  try {
    return await gen.generate(prompts, { maxNewTokens: o.newTokens, seed: 1 });
  } finally {
    gen.dispose();
  }
}

/** KL(dense ‖ quantized) and perplexities on the dense model's generated tokens. */
async function shift(
  device: Device,
  config: DecoderConfig,
  dense: QuantizedModel,
  quantized: QuantizedModel,
  reference: ReadonlyMap<string, DeviceTensor>,
  tensors: ReadonlyMap<string, DeviceTensor>,
  prompts: number[][],
  completions: Completion[],
  o: { dtype: DType; mode: 'kernel' | 'dequantize'; batch: number; quantizedWeights?: QuantizedWeightsAs; fusedGemm?: boolean },
): Promise<ShiftSummary> {
  const g = new L.Graph('quant_bench_shift');
  addDistributionShift(g, config, dense.graphWeights(g, { dtype: o.dtype, prefix: 'original/' }).weights, quantized.graphWeights(g, { dtype: o.dtype, prefix: 'quantized/', mode: o.mode, quantizedWeights: o.quantizedWeights }).weights);
  const session = device.compile(g, { name: g.name, ...(o.fusedGemm ? fusedGemmSession() : {}) });
  const weights: Record<string, DeviceTensor> = {};
  const inputs = new Set(session.inputs.map((i) => i.name));
  for (const [n, t] of reference) weights[n] = t;
  // With initializers the graph holds the kernel tensors: bind only what it reads as inputs.
  for (const [n, t] of tensors) if (inputs.has(`quantized/${n}`)) weights[`quantized/${n}`] = t;
  const acc = new ShiftAccumulator();
  try {
    for (let s = 0; s < completions.length; s += o.batch) {
      const rows = completions.slice(s, s + o.batch).map((c) => ({ prompt: prompts[c.promptIndex], gen: c.tokens }));
      const T = Math.max(...rows.map((r) => r.prompt.length + r.gen.length));
      const B = rows.length;
      const ids = new BigInt64Array(B * T);
      const mask = new BigInt64Array(B * T);
      const targets = new BigInt64Array(B * T);
      const scored = new Uint8Array(B * T);
      rows.forEach((r, b) => {
        const seq = [...r.prompt, ...r.gen];
        seq.forEach((t, i) => {
          ids[b * T + i] = BigInt(t);
          mask[b * T + i] = 1n;
          if (i + 1 < seq.length) targets[b * T + i] = BigInt(seq[i + 1]);
          if (i + 1 >= r.prompt.length && i + 1 < seq.length) scored[b * T + i] = 1;
        });
      });
      const dims = [B, T];
      const out = await session.run({ ...weights, [SHIFT_IO.inputIds]: { data: ids, dims }, [SHIFT_IO.attentionMask]: { data: mask, dims }, [SHIFT_IO.targets]: { data: targets, dims } }, { outputs: [SHIFT_IO.kl, SHIFT_IO.logpOriginal, SHIFT_IO.logpQuantized] });
      acc.add(out[SHIFT_IO.kl].data as Float32Array, out[SHIFT_IO.logpOriginal].data as Float32Array, out[SHIFT_IO.logpQuantized].data as Float32Array, scored);
    }
  } finally {
    session.dispose();
  }
  return acc.summary();
}

// the host build's worker threads load this file too (host-model.ts): only the main thread runs the bench
if (isMainThread) {
  main().catch((e) => {
    console.error(e);
    process.exit(1);
  });
}
