/**
 * Generation as a loop of runs over a KV cache that stays bound on the device: one prefill run per
 * batch of prompts, then one decode-step run per token, each step a replay of the same bound
 * buffers (a CUDA graph when enabled). Only the sampled tokens and their log-probs (12 bytes per
 * row per step) come back to the host, for the stop check, and only once every `readEvery` steps:
 * the steps in between are queued without waiting, each writing its result into a device-side
 * history of the last `readEvery` steps. Weights, caches, positions and noise stay on the device.
 *
 * The engine is sized once — `rows` samples per run, caches of `maxLength` positions — and every
 * buffer is allocated at creation, so the decode step's addresses never change and a captured
 * CUDA graph stays valid across runs. A run with fewer prompts prefills only those; the spare
 * rows repeat the first prompt's cache and their output is dropped.
 *
 * Which prompt a row continues is a host input of the prefill (`expand_index`), not part of the
 * graphs: a call may give each prompt its own sample count (`sampleKeys`), and a run then holds as
 * many whole prompts as fit its rows, each prefilled once.
 *
 * A run that fails for lack of device memory is split in halves (a prompt's samples stay
 * together) and retried; samples depend only on (seed, prompt key), so the results equal an
 * unsplit run's. Splitting shrinks the prefill (prompts × prompt width); the decode step always
 * runs all `rows`, so an out-of-memory that persists down to one prompt propagates.
 */
import * as L from '@lathe/onnx';
import type { DType } from '@lathe/onnx';
import { CausalLM, paramSpecs, weightInputs, type DecoderConfig, type ResidualDtype, type Weights } from '@lathe/models';
import { Device, DeviceTensor, hostTensor, type Binding, type DeviceKind, type Session, type SessionOptions } from '@lathe/runtime';
import { addKvDecodeStep, addKvPack, addKvPrefill, cacheName, cacheScaleName, concatTensors, float32NormName, float32Norms, residualNormWeights, SAMPLED_COLUMNS, type KvDecodeAttention, type KvGreedyPick, type KvSwiglu } from './kv-cache-graphs';
import { uniformNoise } from './rng';
import { validateSampling, type SamplingOptions } from './sampling';
import { isOutOfMemory, sampleKeysOf, splitOnOutOfMemory, type Completion, type GenerateCallOptions } from './generator';

/**
 * Why the KV-cache generator cannot run `config` in compute dtype `dtype` on a `device` of this
 * kind, or undefined when it can: GroupQueryAttention's rotary needs head_dim a multiple of 16, and
 * its CUDA kernel runs in float16/bfloat16 only (the CPU kernel takes float32 too).
 */
export function kvCacheUnsupported(config: Pick<DecoderConfig, 'headDim'>, device: DeviceKind, dtype: DType): string | undefined {
  if (config.headDim % 16 !== 0) return `head_dim ${config.headDim} is not a multiple of 16 (GroupQueryAttention's rotary needs one)`;
  if (device !== 'cpu' && dtype !== 'bfloat16' && dtype !== 'float16') return `GroupQueryAttention on ${device} runs in bfloat16/float16 only, and the compute dtype is ${dtype}`;
  return undefined;
}

/** How a KV-cache generator is built. */
export interface KvCacheGeneratorOptions extends SamplingOptions {
  /**
   * Samples per prompt (a GRPO group); row r·n + j is sample j of prompt r. Default 1. A call's
   * `sampleKeys` overrides it (each prompt its own count, at most `rows`).
   */
  groupSize?: number;
  /** Samples per run (a multiple of groupSize): the rows of the cache. */
  rows: number;
  /** Cache positions per row: the longest prompt plus the most new tokens a call may ask for. */
  maxLength: number;
  /** Compute dtype; weights and caches are held in it. Default bfloat16 on CUDA, float32 on CPU. */
  dtype?: DType;
  /** Replay the decode step as a CUDA graph (CUDA only). Default false. */
  cudaGraph?: boolean;
  /** Token used to pad prompts and for the spare rows. Default 0. */
  padTokenId?: number;
  /**
   * Decode steps per read of the results (tokens and log-probs) and per stop check. The runs in
   * between are queued without waiting for the device, and each writes its result into a history
   * of the last `readEvery` steps that one copy then brings back. A row that stops keeps running
   * until the next read (its extra tokens are dropped), so a run can take up to `readEvery` − 1
   * steps more than its longest row needs. Default 8 on CUDA; 1 on the CPU, whose runs are
   * synchronous anyway (queuing gains nothing there, and short completions would pay the extra
   * steps). 1 reads and waits after every step.
   */
  readEvery?: number;
  /**
   * Options of both sessions (e.g. `allowCpuFallback`, `profilePrefix`); `cudaGraph` above wins.
   * `memoryPattern` defaults to false here (see `create`).
   */
  session?: SessionOptions;
  /**
   * How the graphs read the weights (default: one input per HF name in the compute dtype). A
   * trainer passes its own — e.g. float32 master weights cast in the graph, or LoRA's base plus
   * adapters — and binds the matching tensors with {@link KvCacheGenerator.bindWeights}.
   */
  graphWeights?: (g: L.Graph) => Weights;
  /**
   * Called before every prefill and decode-step run with the number of prompts in the run (each
   * prefilled once, whatever its sample count). A hook that throws fails that run — tests use it to
   * inject out-of-memory errors on the CPU, and to count prefills.
   */
  beforeRun?: (phase: 'prefill' | 'decode', prompts: number) => void;
  /**
   * The decode step's attention through a decode-attention kernel (Lathe's: `decodeAttentionOps` of
   * @lathe/kernels, built for this device — on CUDA from kernels on the sessions' stream,
   * `Kernels.withDevice`) in place of GroupQueryAttention. Default: GroupQueryAttention.
   */
  decodeAttention?: KvDecodeAttention;
  /**
   * How the KV cache is held: `model` (the compute dtype, default) or `float8e4m3` (e4m3 bytes with a
   * float32 scale per head vector: half the bytes a step reads); `float8e4m3` needs a `decodeAttention`
   * built for it.
   */
  kvCacheDtype?: 'model' | 'float8e4m3';
  /**
   * Each residual add and the RMSNorm after it as one SkipSimplifiedLayerNormalization kernel: two
   * nodes fewer a layer in both graphs (in a 16-bit dtype the prefill also writes float32 copies of
   * those norms' weights for the decode steps). Default on; off builds the unfused graphs (A/B checks).
   */
  fuseResidualNorm?: boolean;
  /**
   * The residual stream's dtype in both graphs: 'float32' (default) or 'compute', which keeps it in
   * the compute dtype as transformers does in bf16/fp16 (see `ResidualDtype` of @lathe/models): no
   * Casts between the layers (four a layer fewer in bf16/fp16) and no float32 copies of the norm
   * weights. In float32 both give the same graphs.
   */
  residualDtype?: ResidualDtype;
  /**
   * The prefill's and the decode step's SwiGLU activations through a SwiGLU kernel (Lathe's:
   * `swigluOps` of @lathe/kernels, built for this device — on CUDA from kernels on the sessions'
   * stream) in place of QuickGelu and Mul: one node a layer fewer (and, with `concatProjections` and a
   * kernel that reads gate/up packed, no Split). Default: ONNX Runtime's kernels.
   */
  swiglu?: KvSwiglu;
  /**
   * Greedy generation's token pick (temperature 0) through a fused op (Lathe's: `greedyPickOps` of
   * @lathe/kernels, built for this device — on CUDA from kernels on the sessions' stream) reading the
   * LM head's logits once in their own dtype, in place of the float32 Cast, argmax, LogSoftmax and
   * gather: the same tokens, and one log-prob for both `logprobs` and `rawLogprobs`. An engine that
   * samples (temperature > 0) ignores it. Default: the composed graph.
   */
  greedyPick?: KvGreedyPick;
  /**
   * Each layer's q/k/v as one MatMul and its gate/up as one in both graphs, over weights
   * concatenated along N, their outputs split with CUDA-graph-safe ops (`replaySafeSplit`: gate/up
   * one Split, q/k/v one Split into KV·headDim parts plus one Concat of the query's): three MatMul
   * nodes a layer fewer and larger GEMMs. A small pack run
   * at the start of every `generate` call copies the weights into engine-owned buffers laid out for
   * x·W (so weight updates between calls, `loadWeights` or the model's own tensors, are picked up,
   * and a captured CUDA graph keeps its addresses). Memory: the engine holds those copies — the
   * q/k/v and gate/up weights (and biases) again in the compute dtype, about two thirds of the
   * decoder layers' weight bytes (Qwen3-0.6B: 0.59 GB in bfloat16, Qwen3-8B: 9.1 GB) — and the pack
   * session's workspace one layer's gate/up concatenation before its transpose. Dense weights only
   * (a quantized model's kernel path concatenates its own). Default off.
   */
  concatProjections?: boolean;
}

/** Time spent per phase of the last `generate` call, in milliseconds. */
export interface GenerationTimings {
  /** Prefill runs (and, with `concatProjections`, the call's pack run). */
  prefillMs: number;
  decodeMs: number;
  /** Host ↔ device copies of the per-step results and the per-run inputs. */
  transferMs: number;
  decodeSteps: number;
}

/**
 * Runs `compile` with ONNX Runtime's decode kernel for GroupQueryAttention chosen for the model's
 * query heads per KV head: with 2 of them (Qwen3-0.6B and 1.7B), the path ORT 1.29 takes without
 * its default XQA kernel (a cuDNN flash-attention kernel) decodes faster (docs/benchmarks.md), so
 * ORT_ENABLE_XQA=0 is set around the compile ({@link withOrtSwitch}). The slot engine's decode steps take it too.
 */
export function withDecodeKernelChoice<T>(config: DecoderConfig, compile: () => T): T {
  return config.numHeads / config.numKvHeads === 2 ? withOrtSwitch('ORT_ENABLE_XQA', '0', compile) : compile();
}

/**
 * Runs `compile` (a prefill graph, whose [B, P] changes from run to run) with ONNX Runtime's cuDNN
 * attention off for GroupQueryAttention: on sm_90 ORT prefers cuDNN's SDPA, which sets up a cuDNN graph
 * for each new shape in each attention node, and the first run of every new prefill shape waited on
 * that setup (docs/benchmarks.md, the quantization row); ORT's flash kernel is taken instead.
 */
export function withPrefillKernelChoice<T>(compile: () => T): T {
  return withOrtSwitch('ORT_ENABLE_CUDNN_FLASH_ATTENTION', '0', compile);
}

/**
 * Runs `compile` with environment variable `key` set to `value`: ORT reads its kernel switches when a
 * session builds its kernels, so one is set around a compile only, and never over a value the user set.
 */
function withOrtSwitch<T>(key: string, value: string, compile: () => T): T {
  if (process.env[key] !== undefined) return compile();
  process.env[key] = value;
  try {
    return compile();
  } finally {
    delete process.env[key];
  }
}

/** Buffers one decode binding reads (`from`) and writes (`to`). */
interface StepBuffers {
  token: DeviceTensor;
  seqlens: DeviceTensor;
  step: DeviceTensor;
  /** The results of the last `readEvery` steps, float32 [rows, readEvery, 3] (see SAMPLED_COLUMNS). */
  history: DeviceTensor;
}

/** Every buffer an engine owns, allocated once at creation. */
interface EngineBuffers {
  /** Layer i's key cache at 2i, its value cache at 2i + 1: [rows, kvHeads, maxLength, headDim]. */
  caches: DeviceTensor[];
  /** An e4m3 cache's scales, float32 [rows, kvHeads, maxLength], laid out as `caches` (empty otherwise). */
  scales: DeviceTensor[];
  ping: StepBuffers;
  pong: StepBuffers;
  /** Zeros the prefill extends each prompt's cache with (one layer's cache in size). */
  tail: DeviceTensor;
  noise: DeviceTensor | undefined;
  /** Float32 copies of the fused norms' weights by name, which each prefill writes and the decode steps read (16-bit dtypes). */
  norms: Map<string, DeviceTensor>;
  /** The concatenated projections by name (`concatProjections`), which each call's pack run writes and both graphs read. */
  concat: Map<string, DeviceTensor>;
}

/**
 * Allocates an engine's buffers. On failure frees what it had allocated and, for lack of memory,
 * says what the sizes asked for (the original message kept, so it still reads as out-of-memory).
 */
function allocateBuffers(device: Device, config: DecoderConfig, opts: KvCacheGeneratorOptions & { dtype: DType; readEvery: number }): EngineBuffers {
  const { rows: R, maxLength: M, dtype } = opts;
  const cacheDtype = opts.decodeAttention ? opts.decodeAttention.cacheDtype(dtype) : dtype;
  const fp8 = opts.decodeAttention?.cache === 'float8e4m3';
  const made: DeviceTensor[] = [];
  const zeros = (d: DType, dims: number[]) => {
    const t = device.zeros(d, dims);
    made.push(t);
    return t;
  };
  const cacheDims = [R, config.numKvHeads, M, config.headDim];
  try {
    const caches: DeviceTensor[] = [];
    for (let i = 0; i < 2 * config.numLayers; i++) caches.push(zeros(cacheDtype, cacheDims));
    const scales: DeviceTensor[] = [];
    if (fp8) for (let i = 0; i < 2 * config.numLayers; i++) scales.push(zeros('float32', cacheDims.slice(0, 3)));
    const step = (): StepBuffers => ({ token: zeros('int64', [R, 1]), seqlens: zeros('int32', [R]), step: zeros('int64', [1]), history: zeros('float32', [R, opts.readEvery, SAMPLED_COLUMNS.length]) });
    return {
      caches,
      scales,
      ping: step(),
      pong: step(),
      tail: zeros(dtype, cacheDims),
      noise: (opts.temperature ?? 1) === 0 ? undefined : zeros('float32', [R, M]),
      norms: new Map(float32Norms(dtype, opts.fuseResidualNorm, opts.residualDtype) ? residualNormWeights(config).map((n) => [float32NormName(n), zeros('float32', [config.hiddenSize])]) : []),
      concat: new Map(opts.concatProjections ? concatTensors(config).map((t) => [t.name, zeros(dtype, t.shape)]) : []),
    };
  } catch (e) {
    for (const t of made) t.dispose();
    if (!isOutOfMemory(e)) throw e;
    const gib = (2 * config.numLayers * (L.dtypeBytes(cacheDtype) + (fp8 ? 4 / config.headDim : 0)) + L.dtypeBytes(dtype)) * ((R * config.numKvHeads * M * config.headDim) / 2 ** 30);
    throw new Error(`KvCacheGenerator: out of memory allocating caches for rows ${R} × maxLength ${M} (${gib.toFixed(2)} GiB in ${fp8 ? 'float8e4m3' : dtype}); lower rows or maxLength. ${e instanceof Error ? e.message : String(e)}`);
  }
}

function disposeBuffers({ caches, scales, ping, pong, tail, noise, norms, concat }: EngineBuffers): void {
  for (const t of [...caches, ...scales, tail, ...Object.values(ping), ...Object.values(pong), ...(noise ? [noise] : []), ...norms.values(), ...concat.values()]) t.dispose();
}

/** A compiled prefill + decode-step pair over device-resident weights and caches. */
export class KvCacheGenerator {
  /** Wall time split of the last `generate` call. */
  lastTimings: GenerationTimings = { prefillMs: 0, decodeMs: 0, transferMs: 0, decodeSteps: 0 };
  private readonly n: number;
  private readonly prefillBinding: Binding;
  /** Writes the concatenated projections (`concatProjections`), once per call. */
  private readonly packBinding: Binding | undefined;
  /** decode[0] reads ping and writes pong; decode[1] the reverse. */
  private readonly decode: [Binding, Binding];

  private constructor(
    readonly config: DecoderConfig,
    readonly device: Device,
    private readonly opts: KvCacheGeneratorOptions & { dtype: DType; readEvery: number },
    private readonly prefill: Session,
    private readonly step: Session,
    private readonly pack: Session | undefined,
    private readonly weights: ReadonlyMap<string, DeviceTensor> | undefined,
    private readonly buffers: EngineBuffers,
  ) {
    const { maxLength: M } = opts;
    const { caches, scales, ping, pong, tail, noise, norms, concat } = buffers;
    this.n = opts.groupSize ?? 1;

    const bindWeights = (b: Binding) => {
      for (const [name, t] of weights ?? []) b.input(name, t);
    };
    const bindOutputs = (b: Binding, to: StepBuffers) => {
      b.output('next_token', to.token).output('next_seqlens', to.seqlens).output('next_step', to.step).output('next_history', to.history);
      for (let i = 0; i < config.numLayers; i++) {
        b.output(cacheName(i, 'key', 'output'), caches[2 * i]).output(cacheName(i, 'value', 'output'), caches[2 * i + 1]);
        if (scales.length) b.output(cacheScaleName(i, 'key', 'output'), scales[2 * i]).output(cacheScaleName(i, 'value', 'output'), scales[2 * i + 1]);
      }
    };
    this.prefillBinding = prefill.binding();
    bindWeights(this.prefillBinding);
    bindOutputs(this.prefillBinding, ping);
    if (noise) this.prefillBinding.input('noise', noise);
    this.prefillBinding.input('cache_tail', tail);
    for (const [name, t] of norms) this.prefillBinding.output(name, t);
    for (const [name, t] of concat) this.prefillBinding.input(name, t);
    if (pack) {
      this.packBinding = pack.binding();
      bindWeights(this.packBinding);
      for (const [name, t] of concat) this.packBinding.output(name, t);
    }

    const decodeBinding = (from: StepBuffers, to: StepBuffers, graphId: number) => {
      const b = step.binding();
      bindWeights(b);
      for (const [name, t] of norms) b.input(name, t);
      for (const [name, t] of concat) b.input(name, t);
      b.input('token', from.token).input('seqlens', from.seqlens).input('step', from.step).input('history', from.history).input('cache_length', hostTensor('int32', [], [M]));
      if (noise) b.input('noise', noise);
      for (let i = 0; i < config.numLayers; i++) {
        b.input(cacheName(i, 'key', 'input'), caches[2 * i]).input(cacheName(i, 'value', 'input'), caches[2 * i + 1]);
        if (scales.length) b.input(cacheScaleName(i, 'key', 'input'), scales[2 * i]).input(cacheScaleName(i, 'value', 'input'), scales[2 * i + 1]);
      }
      bindOutputs(b, to);
      if (opts.cudaGraph) b.runConfig('gpu_graph_id', String(graphId));
      return b;
    };
    this.decode = [decodeBinding(ping, pong, 1), decodeBinding(pong, ping, 2)];
  }

  /**
   * Compiles the two graphs over a model's device weights (`CausalLM.fromPretrained(dir, { device })`),
   * in their dtype. The weights stay the model's: dispose it after the generator.
   */
  static create(model: CausalLM, opts: KvCacheGeneratorOptions): KvCacheGenerator;
  /**
   * Compiles the two graphs for `config` over caller-owned `weights` (device tensors in the compute
   * dtype by HF name, e.g. a trainer's parameters cast to it), or, with `graphWeights`, none yet.
   */
  static create(device: Device, config: DecoderConfig, weights: ReadonlyMap<string, DeviceTensor> | undefined, opts: KvCacheGeneratorOptions): KvCacheGenerator;
  static create(
    modelOrDevice: CausalLM | Device,
    configOrOpts: DecoderConfig | KvCacheGeneratorOptions,
    weightsArg?: ReadonlyMap<string, DeviceTensor>,
    optsArg?: KvCacheGeneratorOptions,
  ): KvCacheGenerator {
    if (modelOrDevice instanceof CausalLM) {
      const model = modelOrDevice;
      const opts = configOrOpts as KvCacheGeneratorOptions;
      if (!model.device) throw new Error(`KvCacheGenerator: the model's weights are on the host; load it with { device } (CausalLM.fromPretrained) or call model.to(device)`);
      if (opts.dtype && opts.dtype !== model.dtype) throw new Error(`KvCacheGenerator: dtype ${opts.dtype} was asked for, but the model's weights are ${model.dtype} (load it with { dtype: '${opts.dtype}' })`);
      return KvCacheGenerator.compile(model.device, model.config, model.weights, { ...opts, dtype: model.dtype });
    }
    return KvCacheGenerator.compile(modelOrDevice, configOrOpts as DecoderConfig, weightsArg, optsArg!);
  }

  private static compile(device: Device, config: DecoderConfig, weights: ReadonlyMap<string, DeviceTensor> | undefined, opts: KvCacheGeneratorOptions): KvCacheGenerator {
    validateSampling(opts, config.vocabSize);
    const dtype = opts.dtype ?? (device.kind === 'cuda' ? 'bfloat16' : 'float32');
    const n = opts.groupSize ?? 1;
    if (!Number.isInteger(n) || n < 1) throw new Error(`groupSize must be a positive integer, got ${opts.groupSize}`);
    if (!Number.isInteger(opts.rows) || opts.rows < n || opts.rows % n !== 0) throw new Error(`rows must be a positive multiple of groupSize (${n}), got ${opts.rows}`);
    if (!Number.isInteger(opts.maxLength) || opts.maxLength < 2 || opts.maxLength > config.maxPositionEmbeddings) {
      throw new Error(`maxLength must be an integer in [2, ${config.maxPositionEmbeddings}] (the model's max_position_embeddings), got ${opts.maxLength}`);
    }
    if (opts.cudaGraph && device.kind !== 'cuda') throw new Error('cudaGraph needs a CUDA device');
    const readEvery = opts.readEvery ?? (device.kind === 'cuda' ? 8 : 1);
    if (!Number.isInteger(readEvery) || readEvery < 1) throw new Error(`readEvery must be a positive integer, got ${opts.readEvery}`);
    const pad = opts.padTokenId ?? 0;
    if (!Number.isInteger(pad) || pad < 0 || pad >= config.vocabSize) throw new Error(`padTokenId must be a token id in [0, ${config.vocabSize}), got ${opts.padTokenId}`);
    if (!weights && !opts.graphWeights) throw new Error('weights: give device tensors, or graphWeights and bind them with bindWeights');
    const da = opts.decodeAttention;
    const kvCacheDtype = opts.kvCacheDtype ?? 'model';
    if (kvCacheDtype !== 'model' && kvCacheDtype !== 'float8e4m3') throw new Error(`kvCacheDtype must be 'model' or 'float8e4m3', got '${String(kvCacheDtype)}'`);
    if (kvCacheDtype === 'float8e4m3' && da?.cache !== 'float8e4m3') throw new Error("kvCacheDtype 'float8e4m3' needs decodeAttention built for an e4m3 cache (decodeAttentionOps(..., { cache: 'float8e4m3' }))");
    if (da?.cache === 'float8e4m3' && kvCacheDtype !== 'float8e4m3') throw new Error("decodeAttention holds an e4m3 cache: set kvCacheDtype 'float8e4m3'");
    for (const spec of opts.graphWeights ? [] : paramSpecs(config)) {
      const t = weights!.get(spec.name);
      if (!t) throw new Error(`weights: missing '${spec.name}'`);
      if (t.dtype !== dtype || t.dims.join(',') !== spec.shape.join(',')) {
        throw new Error(`weights: '${spec.name}' is ${t.dtype}[${t.dims}], expected ${dtype}[${spec.shape}]`);
      }
    }
    const build = (name: string, add: (g: L.Graph, w: ReturnType<typeof weightInputs>['weights']) => void) => {
      const g = new L.Graph(name);
      add(g, opts.graphWeights ? opts.graphWeights(g) : weightInputs(g, config, dtype, dtype).weights);
      return g;
    };
    // ONNX Runtime's CPU kernel has no in-kernel Q/K norm; on CUDA it saves two norm launches a layer.
    const graphOpts = { K: readEvery, qkNormInKernel: device.kind === 'cuda', rows: opts.rows, decodeAttention: da, fuseResidualNorm: opts.fuseResidualNorm, residualDtype: opts.residualDtype, swiglu: opts.swiglu, concatProjections: opts.concatProjections, greedyPick: opts.greedyPick };
    // ORT's memory-pattern planning off unless asked for: the plan it applies from a shape's second
    // run on made that run's prefill slower, not faster (docs/benchmarks.md).
    const domains = [...(da ? [da.domain.handle] : []), ...(opts.swiglu ? [opts.swiglu.domain.handle] : []), ...(opts.greedyPick ? [opts.greedyPick.domain.handle] : [])];
    const session: SessionOptions = {
      ...opts.session,
      memoryPattern: opts.session?.memoryPattern ?? false,
      ...(domains.length ? { customOpDomains: [...(opts.session?.customOpDomains ?? []), ...domains] } : {}),
    };
    const prefill = withPrefillKernelChoice(() => device.compile(build('lathe_kv_prefill', (g, w) => addKvPrefill(g, config, w, dtype, opts, graphOpts)), { ...session, name: 'kv-prefill', cudaGraph: false }));
    let step: Session | undefined;
    let pack: Session | undefined;
    let buffers: EngineBuffers | undefined;
    try {
      const decodeGraph = build('lathe_kv_decode', (g, w) => addKvDecodeStep(g, config, w, dtype, opts, graphOpts));
      step = withDecodeKernelChoice(config, () => device.compile(decodeGraph, { ...session, name: 'kv-decode', cudaGraph: opts.cudaGraph }));
      if (opts.concatProjections) pack = device.compile(build('lathe_kv_pack', (g, w) => addKvPack(g, config, w)), { ...session, name: 'kv-pack', cudaGraph: false });
      buffers = allocateBuffers(device, config, { ...opts, dtype, readEvery });
      return new KvCacheGenerator(config, device, { ...opts, dtype, readEvery }, prefill, step, pack, weights, buffers);
    } catch (e) {
      if (buffers) disposeBuffers(buffers);
      pack?.dispose();
      step?.dispose();
      prefill.dispose();
      throw e;
    }
  }

  /**
   * A new weight version: copies `src` (same names, dtypes and shapes, e.g. a trainer's updated
   * parameters in the compute dtype) into the bound weight tensors, device to device. The bound
   * addresses stay the same, so a captured CUDA graph stays valid.
   */
  loadWeights(src: ReadonlyMap<string, DeviceTensor>): void {
    if (!this.weights) throw new Error('loadWeights: this generator binds caller-owned weights (bindWeights)');
    for (const [name, dst] of this.weights) {
      const t = src.get(name);
      if (!t) throw new Error(`loadWeights: missing '${name}'`);
      dst.copyFrom(t);
    }
  }

  /**
   * Binds weight tensors by graph input name (with `graphWeights`: the inputs it declared), e.g. a
   * trainer's current parameter buffers — generation then reads them with no copy. Rebinding moves
   * the addresses a captured CUDA graph read, so it is refused when `cudaGraph` is on.
   */
  bindWeights(...sets: Iterable<readonly [string, DeviceTensor]>[]): void {
    if (this.opts.cudaGraph) throw new Error('bindWeights: a CUDA-graph generator keeps its weight addresses; use loadWeights');
    for (const b of [this.prefillBinding, ...this.decode, ...(this.packBinding ? [this.packBinding] : [])]) for (const set of sets) for (const [name, t] of set) b.input(name, t);
  }

  /**
   * Samples `groupSize` completions for every prompt (or, with `call.sampleKeys`, that many for
   * each prompt), token ids without padding, sorted by (prompt, sample). Every argument is checked
   * before any device work. Runs hold whole prompts with all their samples: each prompt is
   * prefilled once. A run that fails for lack of device memory is split in halves and retried
   * (module comment); later runs of the call start at the smaller size.
   */
  async generate(prompts: number[][], call: GenerateCallOptions): Promise<Completion[]> {
    const samples = this.checkCall(prompts, call);
    const timings: GenerationTimings = { prefillMs: 0, decodeMs: 0, transferMs: 0, decodeSteps: 0 };
    const stop = new Set(call.stopIds ?? []);
    // Longest prompts first, so each run's padding is small.
    const order = prompts.map((p, i) => ({ i, len: p.length })).sort((a, b) => b.len - a.len).map((o) => o.i);
    if (this.packBinding) {
      // the weights as they are now, concatenated for both graphs
      const p0 = performance.now();
      this.packBinding.runSync();
      timings.prefillMs += performance.now() - p0;
    }
    let perRun = Infinity; // prompts per run, lowered by an out-of-memory
    const results: Completion[] = [];
    let done = 0;
    const execute = async (run: number[]) => {
      try {
        results.push(...this.generateRun(run, prompts, samples, call, stop, timings));
      } catch (e) {
        if (isOutOfMemory(e)) perRun = Math.min(perRun, Math.ceil(run.length / 2));
        throw e;
      }
      done += run.length;
      call.onProgress?.(done, order.length);
      await new Promise((r) => setImmediate(r)); // let progress bars and signals run between runs
    };
    for (let start = 0; start < order.length; ) {
      // As many whole prompts as the rows hold (with groupSize n: rows / n of them).
      const run: number[] = [];
      for (let rows = 0; start < order.length && run.length < perRun && rows + samples[order[start]].length <= this.opts.rows; start++) {
        rows += samples[order[start]].length;
        run.push(order[start]);
      }
      await splitOnOutOfMemory(run, execute);
    }
    this.lastTimings = timings;
    return results.sort((a, b) => a.promptIndex - b.promptIndex || a.sampleIndex - b.sampleIndex);
  }

  /** Rejects a call's bad arguments by name, before any device work; returns each prompt's sample keys. */
  private checkCall(prompts: number[][], call: GenerateCallOptions): number[][] {
    const M = this.opts.maxLength;
    const V = this.config.vocabSize;
    if (!Number.isInteger(call.maxNewTokens) || call.maxNewTokens < 1) throw new Error(`maxNewTokens must be a positive integer, got ${call.maxNewTokens}`);
    if (call.seed !== undefined && !Number.isSafeInteger(call.seed)) throw new Error(`seed must be an integer, got ${call.seed}`);
    const samples = sampleKeysOf(prompts.length, call, this.n);
    const tooMany = samples.findIndex((k) => k.length > this.opts.rows);
    if (tooMany >= 0) throw new Error(`sampleKeys[${tooMany}]: ${samples[tooMany].length} samples of one prompt exceed the generator's ${this.opts.rows} rows (a prompt's samples share one run)`);
    const badStop = (call.stopIds ?? []).find((t) => !Number.isInteger(t));
    if (badStop !== undefined) throw new Error(`stopIds must be integer token ids, got ${badStop}`);
    prompts.forEach((p, i) => {
      if (p.length === 0) throw new Error(`prompt ${i} is empty`);
      if (p.length + call.maxNewTokens > M) throw new Error(`prompt ${i}: ${p.length} tokens + ${call.maxNewTokens} new exceed the generator's maxLength of ${M}`);
      const bad = p.find((t) => !Number.isInteger(t) || t < 0 || t >= V);
      if (bad !== undefined) throw new Error(`prompt ${i}: token id ${bad} is outside the vocabulary (0..${V - 1})`);
    });
    return samples;
  }

  /**
   * One prefill and its decode loop for the prompts `run` (indices into `prompts`), whose samples
   * (`samples[i]`: prompt i's sample keys) fill at most `rows` rows.
   */
  private generateRun(run: number[], prompts: number[][], samples: number[][], call: GenerateCallOptions, stop: Set<number>, t: GenerationTimings): Completion[] {
    const { rows: R, maxLength: M } = this.opts;
    const B = run.length;
    const pad = this.opts.padTokenId ?? 0;
    // Live row k is sample rowSample[k] of the run's prompt rowPrompt[k]: a prompt's samples are
    // adjacent, in sample order (with groupSize n, row r·n + j is sample j of prompt r).
    const rowPrompt = run.flatMap((i, b) => samples[i].map(() => b));
    const rowSample = run.flatMap((i) => samples[i].map((_, j) => j));
    const live = rowPrompt.length;
    const lens = run.map((i) => prompts[i].length);
    const P = Math.max(...lens);
    const ids = new BigInt64Array(B * P).fill(BigInt(pad));
    run.forEach((i, b) => prompts[i].forEach((tok, j) => (ids[b * P + j] = BigInt(tok))));

    let clock = performance.now();
    const lap = (phase: 'prefillMs' | 'decodeMs' | 'transferMs') => {
      const now = performance.now();
      t[phase] += now - clock;
      clock = now;
    };
    const pb = this.prefillBinding;
    pb.input('input_ids', { data: ids, dims: [B, P] });
    pb.input('seqlens', hostTensor('int32', [B], lens.map((l) => l - 1)));
    pb.input('last_index', hostTensor('int64', [B], lens.map((l, b) => b * P + l - 1)));
    pb.input('prompt_width', hostTensor('int32', [], [P]));
    pb.input('cache_start', hostTensor('int64', [1], [P]));
    // Spare rows (r ≥ live) repeat prompt 0; their output is dropped.
    pb.input('expand_index', hostTensor('int64', [R], Array.from({ length: R }, (_, r) => BigInt(r < live ? rowPrompt[r] : 0))));
    const { noise, ping, pong } = this.buffers;
    if (noise) {
      // A row's noise is its sample's stream, whatever row the sample landed on. Steps ≥
      // maxNewTokens never run: their columns are left 0 (not drawn).
      const sampleKeys = Array.from({ length: R }, (_, r) => (r < live ? samples[run[rowPrompt[r]]][rowSample[r]] : 0));
      noise.upload(uniformNoise(call.seed ?? 0, sampleKeys, call.maxNewTokens, M));
    }
    lap('transferMs');
    this.opts.beforeRun?.('prefill', B);
    pb.runSync();
    this.opts.decodeAttention?.check();
    this.opts.swiglu?.check();
    this.opts.greedyPick?.check();
    lap('prefillMs');

    const tokens: number[][] = Array.from({ length: live }, () => []);
    const logprobs: number[][] = Array.from({ length: live }, () => []);
    const raw: number[][] = Array.from({ length: live }, () => []);
    const done = new Array<boolean>(live).fill(false);
    let remaining = live;
    const width = SAMPLED_COLUMNS.length;
    const K = this.opts.readEvery;
    // Step s's results sit in column s mod K of the history it wrote: the prefill (step 0) and
    // even steps write ping's, odd steps pong's (decode[0] reads ping and writes pong).
    let read = -1; // the last step whose results the host has
    const readThrough = (s: number) => {
      this.decode[0].synchronize();
      lap('decodeMs');
      const out = (s % 2 === 1 ? pong : ping).history.download().data as Float32Array;
      for (let j = read + 1; j <= s; j++) {
        const col = j % K;
        for (let r = 0; r < live; r++) {
          if (done[r]) continue;
          const at = (r * K + col) * width;
          const id = out[at];
          tokens[r].push(id);
          logprobs[r].push(out[at + 1]);
          raw[r].push(out[at + 2]);
          if (stop.has(id)) {
            done[r] = true;
            remaining--;
          }
        }
      }
      read = s;
      lap('transferMs');
    };
    const last = call.maxNewTokens - 1;
    // Read once every K steps (steps K−1, 2K−1, …) and after the last.
    const readDue = (s: number) => (s + 1) % K === 0 || s === last;
    if (readDue(0)) readThrough(0);
    for (let s = 1; s <= last && remaining > 0; s++) {
      this.opts.beforeRun?.('decode', B);
      this.decode[s % 2 === 1 ? 0 : 1].runSync({ synchronize: false });
      this.opts.decodeAttention?.check();
      this.opts.swiglu?.check();
      this.opts.greedyPick?.check();
      t.decodeSteps++;
      lap('decodeMs');
      if (readDue(s)) readThrough(s);
    }
    const out: Completion[] = [];
    for (let r = 0; r < live; r++) {
      out.push({
        promptIndex: run[rowPrompt[r]],
        sampleIndex: rowSample[r],
        tokens: tokens[r],
        logprobs: logprobs[r],
        rawLogprobs: raw[r],
        finishReason: done[r] ? 'stop' : 'length',
      });
    }
    return out;
  }

  /** Ends ORT profiling (with `session.profilePrefix`) and returns the prefill and decode profile paths. */
  endProfiling(): string[] {
    return [this.prefill.endProfiling(), this.step.endProfiling()];
  }

  /** Releases the sessions and the engine's buffers (the weights belong to the model or the caller). */
  dispose(): void {
    for (const b of [this.prefillBinding, ...this.decode, ...(this.packBinding ? [this.packBinding] : [])]) b.dispose();
    this.prefill.dispose();
    this.step.dispose();
    this.pack?.dispose();
    disposeBuffers(this.buffers);
  }
}
