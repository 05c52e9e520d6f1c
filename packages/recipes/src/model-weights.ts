/**
 * How a model folder's weights run in the KV-cache engines (`lathe generate`, `lathe eval`, `lathe serve`):
 * `--quantized_weights` ({@link QuantizedWeightsRequest}) planned against the folder's quantization scheme
 * ({@link planModelWeights}), worded for a start line ({@link describeWeights}), and loaded onto the device
 * ({@link engineWeights}: dense, or a quantized folder's kernel tensors with Lathe's W4A16 op tuned at load).
 */
import type { DType } from '@lathe/onnx';
import { CausalLM } from '@lathe/models';
import type { Device, DeviceKind, DeviceTensor } from '@lathe/runtime';
import { cudaIncludeDir, KernelLibraryError, tuneW4A16, W4A16, W4A16Gemm, w4a16GemmOps, w4a16Ops, w4a16Unsupported, type Kernels, type W4A16GemmOps, type W4A16Ops } from '@lathe/kernels';
import { KERNEL_MAX_ROWS, loadQuantized, type QuantFormat, type QuantScheme } from '@lathe/quantization';
import { KvCacheGenerator, SlotEngine, type EngineChoice, type KvCacheGeneratorOptions, type SlotEngineOptions } from '@lathe/rollout';

/** `--quantized_weights`: a quantized folder through its kernels ('auto'), or dequantized to dense at load. */
export type QuantizedWeightsRequest = 'auto' | 'dequantize';

/** How a generator's weights run ({@link TrajectoryGenerator.weights}); {@link describeWeights} words it. */
export interface ModelWeights {
  /** The folder's format: 'dense' when its config.json has no `quantization_config`. */
  format: 'dense' | QuantFormat;
  /** A quantized folder's scheme. */
  scheme?: QuantScheme;
  /** The compute dtype (dense parameters, scales and activations). */
  dtype: DType;
  /**
   * How the projections run: 'dense' (a dense folder), 'dequantized' (a quantized folder dequantized at
   * load), 'w4a16' (Lathe's W4A16 kernel in decode steps of up to `KERNEL_MAX_ROWS` rows, MatMulNBits
   * in the prefill and larger batches), or ONNX Runtime's
   * 'MatMulNBits' (INT8, INT4) / 'MatMulBnb4' (NF4) over the quantized bytes.
   */
  runs: 'dense' | 'dequantized' | 'w4a16' | 'MatMulNBits' | 'MatMulBnb4';
  /** Why INT4 on cuda runs MatMulNBits rather than the W4A16 kernel (Lathe's kernels are not available). */
  note?: string;
  /** Once loaded (the KV-cache engine): seconds the W4A16 launch plans took to tune on the GPU. */
  tuneSeconds?: number;
  /** Once loaded (the KV-cache engine): bytes of weights on the device. */
  deviceBytes?: number;
  /** Once loaded (the KV-cache engine): the uint8 tensors of quantized codes the graphs read (0 for dense weights). */
  codeTensors?: number;
}

/** Row counts the W4A16 launch plans are tuned at: decode batches of the split-K kernels (a launch takes the entry of the fewest rows ≥ its own). */
export const W4A16_TUNE_ROWS: readonly number[] = [1, 4, 8, 16];

/**
 * How a model runs, from its folder's quantization scheme (undefined: dense) and the run: with
 * `request` 'auto' a quantized folder runs through its kernels in the KV-cache engine — INT4 on cuda
 * in bfloat16/float16 through Lathe's W4A16 kernel (unless `kernelsUnavailable` says why not), INT8
 * and INT4 otherwise through MatMulNBits, NF4 through MatMulBnb4 — and the graph engine, which reads
 * dense weights only, is an error naming `--generation_engine` and `--quantized_weights dequantize`.
 */
export function planModelWeights(scheme: QuantScheme | undefined, o: { request: QuantizedWeightsRequest; device: DeviceKind; dtype: DType; engine: EngineChoice; kernelsUnavailable?: string }): ModelWeights {
  if (o.request !== 'auto' && o.request !== 'dequantize') throw new Error(`--quantized_weights must be 'auto' or 'dequantize', got '${String(o.request)}'`);
  if (!scheme) return { format: 'dense', dtype: o.dtype, runs: 'dense' };
  const base = { format: scheme.format, scheme, dtype: o.dtype };
  if (o.request === 'dequantize') return { ...base, runs: 'dequantized' };
  if (o.engine.engine !== 'kv-cache') {
    const why = o.engine.why ? `the kv-cache engine cannot run: ${o.engine.why}` : '--generation_engine graph';
    throw new Error(`--quantized_weights auto: a quantized model (${scheme.format}) runs through its kernels in the kv-cache generation engine only, and this run generates with the graph engine (${why}); use --generation_engine kv-cache where it runs, or --quantized_weights dequantize (the weights dequantized to dense at load: the dense model's memory)`);
  }
  if (scheme.format === 'nf4') return { ...base, runs: 'MatMulBnb4' };
  if (scheme.format === 'int4' && o.device === 'cuda' && (o.dtype === 'bfloat16' || o.dtype === 'float16')) {
    return o.kernelsUnavailable === undefined ? { ...base, runs: 'w4a16' } : { ...base, runs: 'MatMulNBits', note: `Lathe's W4A16 kernel is not available: ${o.kernelsUnavailable}` };
  }
  return { ...base, runs: 'MatMulNBits' };
}

/** `w` in words for a start line, e.g. `int4 blocks of 64: Lathe's W4A16 kernel in decode steps of up to 64 rows (plans tuned in x.x s), its dequantize + cuBLAS otherwise; x.xx GiB of weights on the device`; '' for a dense folder. */
export function describeWeights(w: ModelWeights): string {
  if (w.format === 'dense' || !w.scheme) return '';
  const s = w.scheme;
  const scheme =
    s.format === 'int8' ? 'int8 per output channel' : s.format === 'int4' ? `int4 blocks of ${s.blockSize ?? 64}${s.zeroPoints ? ' with zero points' : ''}` : `nf4 blocks of ${s.blockSize ?? 64}${s.doubleQuant ? ', double quantization' : ''}`;
  const how =
    w.runs === 'dequantized'
      ? `dequantized to ${w.dtype} at load (--quantized_weights dequantize)`
      : w.runs === 'w4a16'
        ? `Lathe's W4A16 kernel in decode steps of up to ${KERNEL_MAX_ROWS} rows${w.tuneSeconds === undefined ? '' : ` (plans tuned in ${w.tuneSeconds.toFixed(1)} s)`}, its dequantize + cuBLAS otherwise`
        : `ONNX Runtime's ${w.runs}${w.note ? ` (${w.note})` : ''}`;
  const bytes = w.deviceBytes === undefined ? '' : `; ${(w.deviceBytes / 2 ** 30).toFixed(w.deviceBytes < 2 ** 30 ? 3 : 2)} GiB of weights on the device`;
  return `${scheme}: ${how}${bytes}`;
}

/** A model's weights on the device for the KV-cache engines: how to build a generator or a serving slot engine over them, what they hold, and their lifetime. */
export interface EngineWeights {
  /** A KV-cache generator over these weights with `opts` (graph weights and session options added for quantized ones). */
  create(opts: KvCacheGeneratorOptions): KvCacheGenerator;
  /** A serving slot engine over these weights with `opts` (the same additions). */
  createSlots(opts: SlotEngineOptions): SlotEngine;
  /** What the load measured (see {@link ModelWeights}). */
  loaded: Pick<ModelWeights, 'tuneSeconds' | 'deviceBytes' | 'codeTensors'>;
  /** Rethrows an error a kernel op raised in a run (their computes cannot throw into ONNX Runtime). */
  check(): void;
  /** After every generator over them. */
  dispose(): void;
}

/** The W4A16 kernels compiled once per set of device kernels (lathe eval builds an engine per model). */
const compiledW4A16 = new WeakMap<Kernels, W4A16>();
/** The pipeline's dequantize kernels, cuBLAS handle and scratch, once per set of device kernels. */
const compiledGemm = new WeakMap<Kernels, W4A16Gemm>();

const byteSum = (ts: Iterable<DeviceTensor>) => [...ts].reduce((n, t) => n + t.byteLength, 0);

/** A dense model's weights (already on its device) as {@link EngineWeights}; disposing them disposes `model`. */
export function denseEngineWeights(model: CausalLM): EngineWeights {
  return { create: (opts) => KvCacheGenerator.create(model, opts), createSlots: (opts) => SlotEngine.create(model, opts), loaded: { deviceBytes: byteSum(model.weights.values()), codeTensors: 0 }, check: () => {}, dispose: () => model.dispose() };
}

/**
 * A model folder's weights on `device` as `runs` says ({@link planModelWeights}): dense ones (a dense
 * folder, or a quantized one dequantized) as a `CausalLM`; quantized ones as `loadQuantized(dir)`'s
 * `generation(…)` — bound kernel tensors, with `w4a16` the decode steps' INT4 projections through
 * Lathe's W4A16 op (q/k/v and gate/up one launch each) and those of more rows (decode batches past 64,
 * prefill) through its dequantize + cuBLAS (`w4a16GemmOps`), its launch plans tuned on the GPU first
 * (`tuneW4A16` over the model's distinct projection shapes: the fastest split per shape and decode
 * rows; `kernels` are those the device was opened through). On the CPU `w4a16` runs the op's host
 * reference untuned (tests of the wiring; the planner never picks it there).
 */
export function engineWeights(dir: string, device: Device, dtype: DType, runs: ModelWeights['runs'], kernels: Kernels | undefined): EngineWeights {
  if (runs === 'dense' || runs === 'dequantized') {
    return denseEngineWeights(CausalLM.fromPretrainedSync(dir, { device, dtype }));
  }
  const q = loadQuantized(dir);
  let ops: W4A16Ops | undefined;
  // INT4 products past the kernel's rows (decode batches over 64, prefill): Lathe's dequantize + cuBLAS, one GEMM a fused group
  let pipeline: W4A16GemmOps | undefined;
  let tuneSeconds: number | undefined;
  if (runs === 'w4a16') {
    if (device.kind === 'cuda') {
      if (!kernels) throw new Error("the W4A16 kernel needs Lathe's CUDA kernels, but cuda:0 was opened in this process without them; run the command in a fresh process, or --quantized_weights dequantize");
      let w4 = compiledW4A16.get(kernels);
      if (!w4) compiledW4A16.set(kernels, (w4 = W4A16.compile(kernels, { includeDir: cudaIncludeDir() })));
      // the shapes the kernel takes (the others keep MatMulNBits), tuned before any session captures a graph
      const shapes = q.kernelShapes().filter((s) => !w4a16Unsupported({ M: 1, N: s.N, K: s.K, kBlocks: Math.ceil(s.K / s.blockSize), blockSize: s.blockSize, dtype }));
      const t0 = performance.now();
      const { table } = tuneW4A16(w4, device, shapes.map((s) => ({ ...s, dtype })), { rows: W4A16_TUNE_ROWS });
      tuneSeconds = (performance.now() - t0) / 1000;
      ops = w4a16Ops('cuda', w4, table.launchOptions());
      let gemm = compiledGemm.get(kernels);
      try {
        if (!gemm) compiledGemm.set(kernels, (gemm = W4A16Gemm.create(kernels, { includeDir: cudaIncludeDir() })));
      } catch (e) {
        // ONNX Runtime's CUDA provider runs on cuBLAS, so this is a library under an unexpected name: MatMulNBits takes those products
        if (!(e instanceof KernelLibraryError)) throw e;
        process.emitWarning(`INT4 products past ${KERNEL_MAX_ROWS} rows and prefill stay on MatMulNBits: ${e.message}`);
      }
      pipeline = gemm && w4a16GemmOps('cuda', gemm);
    } else {
      ops = w4a16Ops(device.kind);
      pipeline = w4a16GemmOps(device.kind);
    }
  }
  let plan;
  try {
    plan = q.generation(device, dtype, ops ? { quantizedWeights: 'kernel', kernel: ops, pipeline } : {});
  } catch (e) {
    ops?.dispose();
    pipeline?.dispose();
    throw e;
  }
  const { tensors, graphWeights, session } = plan;
  // the quantized graphs' session options (the W4A16 op's domain) beside the caller's
  const withSession = <O extends { session?: KvCacheGeneratorOptions['session'] }>(opts: O): O => ({ ...opts, graphWeights, session: { ...opts.session, ...session, customOpDomains: [...(opts.session?.customOpDomains ?? []), ...(session.customOpDomains ?? [])] } });
  return {
    create: (opts) => KvCacheGenerator.create(device, q.config, tensors, withSession(opts)),
    createSlots: (opts) => SlotEngine.create(device, q.config, tensors, { ...withSession(opts), ...(ops ? { checkWeights: () => (ops.check(), pipeline?.check()) } : {}) }),
    loaded: { deviceBytes: byteSum(tensors.values()), codeTensors: [...tensors.values()].filter((t) => t.dtype === 'uint8').length, ...(tuneSeconds === undefined ? {} : { tuneSeconds }) },
    check: () => {
      ops?.check();
      pipeline?.check();
    },
    dispose: () => {
      for (const t of tensors.values()) t.dispose();
      ops?.dispose();
      pipeline?.dispose();
    },
  };
}
