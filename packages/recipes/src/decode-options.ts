/**
 * The KV-cache engine's decode options of `lathe generate` and `lathe eval` (`decodeOptions` of
 * common-options.ts): resolved against the run's device, engine and kernels by the pure
 * {@link resolveDecodeOptions}, then built into the `KvCacheGenerator` options they name by
 * {@link decodeEngineOptions} — the same options tools/bench/rollout/lathe-kv-generate.ts's `--fast` passes.
 */
import type { DType } from '@lathe/onnx';
import type { DecoderConfig } from '@lathe/models';
import { Device, type DeviceKind } from '@lathe/runtime';
import type { GenerationEngine, KvCacheGeneratorOptions } from '@lathe/rollout';
import { cudaIncludeDir, DecodeAttention, decodeAttentionOps, decodeAttentionUnsupported, probeKernels, SwigluKernels, swigluOps, type DecodeAttentionOps, type Kernels, type SwigluOps } from '@lathe/kernels';
import { decodeOptions } from './common-options';
import { kernelsOfDevice } from './scaffold';
import type { ConfigOf } from './options';

/** `--kv_cache_dtype`, `--decode_attention`, `--swiglu_kernel` and `--residual_dtype` as a command's config holds them. */
export type DecodeOptionsConfig = ConfigOf<typeof decodeOptions>;

/** What the decode options are resolved against: facts known once the run's device and engine are. */
export interface DecodeFacts {
  device: DeviceKind;
  /** The engine the generator runs (only the kv-cache engine takes these options). */
  engine: GenerationEngine;
  /** Why `auto` passed the kv-cache engine over (`EngineChoice.why`); absent when the graph engine was asked for. */
  engineWhy?: string;
  /** Why Lathe's CUDA kernels cannot run (no NVRTC or driver, or the GPU opened without them); absent when they can. Read on cuda only. */
  kernelsUnavailable?: string;
  /** Why Lathe's decode attention kernel cannot take the model's heads in the compute dtype (`decodeAttentionUnsupported`); absent when it can. Read on cuda only. */
  attentionUnsupported?: string;
}

/**
 * The cuda facts {@link resolveDecodeOptions} reads for a model in `dtype`: whether Lathe's kernels can run
 * in this process (NVRTC and the driver, and cuda:0 not already opened without them) and whether the decode
 * attention kernel takes the model's heads with the cache `kv_cache_dtype` asks for.
 */
export function cudaDecodeFacts(config: DecoderConfig, dtype: DType, kvCacheDtype: DecodeOptionsConfig['kv_cache_dtype'] | undefined): Pick<DecodeFacts, 'kernelsUnavailable' | 'attentionUnsupported'> {
  const probe = Device.isOpen('cuda', 0) ? (kernelsOfDevice(0) ? { ok: true as const } : { ok: false as const, reason: 'cuda:0 was opened in this process without them' }) : probeKernels();
  const attentionUnsupported = decodeAttentionUnsupported({ numHeads: config.numHeads, numKvHeads: config.numKvHeads, headDim: config.headDim, dtype, cache: kvCacheDtype === 'float8e4m3' ? 'float8e4m3' : 'native' });
  return { ...(probe.ok ? {} : { kernelsUnavailable: probe.reason }), ...(attentionUnsupported ? { attentionUnsupported } : {}) };
}

/** The decode options a run uses: what {@link decodeEngineOptions} builds. */
export interface ResolvedDecodeOptions {
  /** The decode step's attention: ONNX Runtime's GroupQueryAttention, or Lathe's decode attention kernel. */
  decodeAttention: 'gqa' | 'kernel';
  /** `model`: the cache in the compute dtype. */
  kvCacheDtype: 'model' | 'float8e4m3';
  /** Each MLP's activation through Lathe's SwiGLU kernel. */
  swiglu: boolean;
  residualDtype: 'float32' | 'compute';
  /** Packed q/k/v and gate/up projections: on exactly with the decode kernel, which reads them packed. */
  concatProjections: boolean;
  /** One line for stderr when an `auto` value fell back for want of the kernels. */
  note?: string;
}

const DEFAULTS: DecodeOptionsConfig = {
  kv_cache_dtype: decodeOptions.kv_cache_dtype.default,
  decode_attention: decodeOptions.decode_attention.default,
  swiglu_kernel: decodeOptions.swiglu_kernel.default,
  residual_dtype: decodeOptions.residual_dtype.default,
};

/** `needs` or `need`, and `it` or `them`, for a list of flags. */
const grammar = (flags: string[]) => (flags.length > 1 ? { needs: 'need', it: 'them' } : { needs: 'needs', it: 'it' });

/**
 * The decode options of a run (missing keys take decodeOptions' defaults). Explicit kernel asks —
 * `--kv_cache_dtype float8e4m3`, `--decode_attention kernel`, `--swiglu_kernel true` — are errors
 * naming the flag where they cannot run (the cpu, the graph engine, no NVRTC, heads the kernel does
 * not take); `auto` values resolve to ONNX Runtime's path there instead (with a note when NVRTC is
 * what is missing). `--residual_dtype compute` needs the kv-cache engine but no kernel.
 */
export function resolveDecodeOptions(given: Partial<DecodeOptionsConfig>, facts: DecodeFacts): ResolvedDecodeOptions {
  const c: DecodeOptionsConfig = { ...DEFAULTS, ...Object.fromEntries(Object.entries(given).filter(([, v]) => v !== undefined)) };
  const fp8 = c.kv_cache_dtype === 'float8e4m3';
  if (fp8 && c.decode_attention === 'gqa') {
    throw new Error('--kv_cache_dtype float8e4m3 with --decode_attention gqa: GroupQueryAttention reads a cache in the compute dtype only; use --decode_attention kernel (or auto, which takes it with the e4m3 cache), or drop --kv_cache_dtype');
  }
  const asks = [...(fp8 ? ['--kv_cache_dtype float8e4m3'] : []), ...(c.decode_attention === 'kernel' ? ['--decode_attention kernel'] : []), ...(c.swiglu_kernel === true ? ['--swiglu_kernel true'] : [])];
  const off: ResolvedDecodeOptions = { decodeAttention: 'gqa', kvCacheDtype: 'model', swiglu: false, residualDtype: c.residual_dtype, concatProjections: false };
  if (facts.device !== 'cuda' && asks.length) {
    throw new Error(`${asks.join(', ')} ${grammar(asks).needs} --device cuda (Lathe's CUDA kernels); on the ${facts.device} drop ${grammar(asks).it}`);
  }
  if (facts.engine !== 'kv-cache') {
    const wants = [...asks, ...(c.residual_dtype === 'compute' ? ['--residual_dtype compute'] : [])];
    if (wants.length) {
      const why = facts.engineWhy ? `the kv-cache engine cannot run: ${facts.engineWhy}` : '--generation_engine graph';
      throw new Error(`${wants.join(', ')} ${grammar(wants).needs} the kv-cache generation engine, and this run generates with the graph engine (${why}); use --generation_engine kv-cache where it runs, or drop ${grammar(wants).it}`);
    }
    return off;
  }
  if (facts.device !== 'cuda') return off;
  if (facts.kernelsUnavailable !== undefined) {
    if (asks.length) throw new Error(`${asks.join(', ')} ${grammar(asks).needs} Lathe's CUDA kernels (NVRTC and the CUDA driver), which are not available: ${facts.kernelsUnavailable}; install NVRTC (lathe doctor says what is missing), or drop ${grammar(asks).it}`);
    return c.swiglu_kernel === 'auto' ? { ...off, note: `note: --swiglu_kernel auto stays off: Lathe's CUDA kernels are not available (${facts.kernelsUnavailable}); ONNX Runtime's QuickGelu and Mul run instead` } : off;
  }
  const kernel = c.decode_attention === 'kernel' || (c.decode_attention === 'auto' && fp8);
  if (kernel && facts.attentionUnsupported !== undefined) {
    const flag = c.decode_attention === 'kernel' ? '--decode_attention kernel' : '--kv_cache_dtype float8e4m3';
    throw new Error(`${flag}: the model's attention is not one Lathe's decode attention kernel takes: ${facts.attentionUnsupported}; drop ${flag}${fp8 && c.decode_attention === 'kernel' ? ' and --kv_cache_dtype float8e4m3' : ''}`);
  }
  return { decodeAttention: kernel ? 'kernel' : 'gqa', kvCacheDtype: fp8 ? 'float8e4m3' : 'model', swiglu: c.swiglu_kernel !== false, residualDtype: c.residual_dtype, concatProjections: kernel };
}

/** What `d` changes from ONNX Runtime's path, in words for a progress line ('' when nothing), e.g. `decode attention kernel, e4m3 KV cache`. */
export function describeDecode(d: ResolvedDecodeOptions): string {
  const parts = [
    ...(d.decodeAttention === 'kernel' ? ["Lathe's decode attention over packed projections"] : []),
    ...(d.kvCacheDtype === 'float8e4m3' ? ['an e4m3 KV cache'] : []),
    ...(d.swiglu ? ['the SwiGLU kernel'] : []),
    ...(d.residualDtype === 'compute' ? ['the residual stream in the compute dtype'] : []),
  ];
  return parts.join(', ');
}

/** The `KvCacheGenerator` options of resolved decode options, and the kernel ops' lifetime. */
export interface DecodeEngineOptions {
  options: Pick<KvCacheGeneratorOptions, 'decodeAttention' | 'kvCacheDtype' | 'swiglu' | 'residualDtype' | 'concatProjections'>;
  /** Frees the kernel ops' custom-op domains: after every engine that runs them. */
  dispose(): void;
}

/** The kernels compiled once per set of device kernels (each eval model builds its engine anew); the decode kernel for each query-heads-per-KV-head group a model needs. */
const compiledDecode = new WeakMap<Kernels, Map<number, DecodeAttention>>();
const compiledSwiglu = new WeakMap<Kernels, SwigluKernels>();

/**
 * Builds the ops `decode` asks for, once per engine (`kernels`: those the GPU was opened through,
 * whose stream the engine's sessions run on; needed exactly when `decode` uses a kernel). The decode
 * kernel merges its chunks in a separate launch (`combine` separate), as `--fast` does.
 */
export function decodeEngineOptions(decode: ResolvedDecodeOptions, kernels: Kernels | undefined, config: Pick<DecoderConfig, 'rmsNormEps' | 'numHeads' | 'numKvHeads'>): DecodeEngineOptions {
  const needs = decode.decodeAttention === 'kernel' || decode.swiglu;
  if (needs && !kernels) throw new Error("the decode options ask for Lathe's CUDA kernels, but cuda:0 was opened in this process without them (its sessions run on ONNX Runtime's own stream); run the command in a fresh process");
  const include = { includeDir: cudaIncludeDir() };
  let attention: DecodeAttentionOps | undefined;
  let swiglu: SwigluOps | undefined;
  if (kernels && decode.decodeAttention === 'kernel') {
    // only the model's group is compiled: every group is twice the split kernels to compile on a cold cache
    const group = config.numHeads / config.numKvHeads;
    let byGroup = compiledDecode.get(kernels);
    if (!byGroup) compiledDecode.set(kernels, (byGroup = new Map()));
    let k = byGroup.get(group);
    if (!k) byGroup.set(group, (k = DecodeAttention.compile(kernels, { ...include, groups: [group] })));
    attention = decodeAttentionOps('cuda', k, { cache: decode.kvCacheDtype === 'float8e4m3' ? 'float8e4m3' : 'native', qkNormEpsilon: config.rmsNormEps, combine: 'separate' });
  }
  if (kernels && decode.swiglu) {
    let k = compiledSwiglu.get(kernels);
    if (!k) compiledSwiglu.set(kernels, (k = SwigluKernels.compile(kernels, include)));
    swiglu = swigluOps('cuda', k);
  }
  return {
    options: {
      ...(attention ? { decodeAttention: attention } : {}),
      ...(decode.kvCacheDtype === 'float8e4m3' ? { kvCacheDtype: 'float8e4m3' as const } : {}),
      ...(swiglu ? { swiglu } : {}),
      ...(decode.residualDtype === 'compute' ? { residualDtype: 'compute' as const } : {}),
      ...(decode.concatProjections ? { concatProjections: true } : {}),
    },
    dispose: () => {
      attention?.dispose();
      swiglu?.dispose();
    },
  };
}
