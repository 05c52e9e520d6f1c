/**
 * The sessions an RL step runs besides the train step, each compiled on the trainer's device and
 * fed the policy's weights *by binding*: the trainer's current parameter buffers (and a LoRA run's
 * frozen base) are bound by name before each run, so a generation or scoring run reads the weights
 * the last update wrote, with no copy.
 *
 * Rollouts come from one of two generation backends with one signature (`RolloutGenerator`; both
 * draw sample j of prompt key k from the noise stream k·G + j, so they give the same samples):
 * - `KvGenerationRunner` (the default where it runs): `KvCacheGenerator` — one prefill run, then a
 *   loop of bound decode-step runs over ONNX Runtime's GroupQueryAttention with in-place KV caches.
 *   Much faster on GPU; needs head_dim a multiple of 16, and on CUDA a float16/bfloat16 compute
 *   dtype (`kvCacheUnsupported` says why not). Its engine is sized (rows, cache length) on first use
 *   and rebuilt only when a call needs more.
 * - `GenerationRunner` (the fallback): the in-graph generation loop (`addGeneration`: one prefill
 *   per prompt, the group expanded after it, the decode loop inside the run); any head_dim, any
 *   dtype.
 * - `ScoringRunner`: teacher-forced log-probs of given rows through the *same policy builder as the
 *   loss* (`decoderPolicy`), forward only — the "training engine" log-probs used for re-scored old
 *   log-probs, the reference's log-probs, and the parity check against generation. Its rows are the
 *   RL batch's (rollout-batch.ts): right-padded, each contiguous from column 0 — the layout a fused
 *   (GroupQueryAttention) scoring graph requires.
 * The generators take prompts as id lists and pad them for their own graphs (the in-graph loop
 * left-pads its prompt batch); nothing they return depends on the RL batch's layout.
 */
import * as L from '@lathe/onnx';
import type { DType, Graph, Tensor } from '@lathe/onnx';
import { checkSequenceLength, paramSpecs, TOTAL_LENGTH_INPUT, totalLengthTensor, weightInputs, type CausalLM, type DecoderConfig, type Weights } from '@lathe/models';
import { addGeneration, KvCacheGenerator, kvCacheUnsupported, shrinkOnOutOfMemory, uniformNoise, validateSampling, type SamplingOptions } from '@lathe/rollout';
import type { Binding, Device, DeviceTensor, HostTensor, Session, SessionOptions } from '@lathe/runtime';
import { castWeights, type TrainableParam } from '@lathe/train';
import { decoderPolicy, type DecoderPolicyOptions } from './policies';
import type { SampledCompletion } from './rollout-batch';

/** How graphs read a policy's weights: trainable tensors by name, plus any frozen inputs the weight function declares. */
export interface PolicyWeights {
  trainable: readonly TrainableParam[];
  /** The decoder's weights from the trainable tensors (a LoRA run declares its `base/<name>` inputs here). */
  weights: (g: Graph, trainable: Map<string, Tensor>) => Weights;
  /**
   * Whole weights for generation, where `weights` adds a side branch (LoRA): the adapters merged
   * into the base once per run instead of a branch computed for every token. Default: `weights`.
   */
  merged?: (g: Graph, trainable: Map<string, Tensor>) => Weights;
}

/** Device tensors to bind by input name. */
export type BoundWeights = Iterable<readonly [string, DeviceTensor]>;

function declareTrainable(g: Graph, pw: PolicyWeights): Map<string, Tensor> {
  return new Map(pw.trainable.map((p) => [p.name, g.input(p.name, 'float32', p.shape)] as const));
}

function bindAll(b: Binding, ...sets: BoundWeights[]): void {
  for (const set of sets) for (const [name, t] of set) b.input(name, t);
}

/** Options of a generation runner. */
export interface GenerationRunnerOptions {
  /** Samples per prompt (1 for greedy evaluation). */
  groupSize: number;
  /** Temperature 0 is greedy (no noise input). */
  sampling: SamplingOptions;
  padId: number;
  /** Rows of prompts per run (0: all prompts of a call in one run). */
  promptsPerRun?: number;
  session?: SessionOptions;
}

/** One generation call: the limit, the stop ids, and the noise stream of each prompt (seed, key). */
export interface RolloutCall {
  maxNewTokens: number;
  stopIds: readonly number[];
  seed: number;
  /** One key per prompt: sample j of a prompt with key k reads noise stream k·G + j. */
  keys: readonly number[];
  /**
   * Identifies the contents of the bound weights (e.g. the optimizer step): a runner that keeps a
   * derived copy of them refreshes it only when this changes. Undefined: refresh on every call.
   */
  weightsVersion?: number;
}

/** What the trainer generates rollouts with: either backend. */
export interface RolloutGenerator {
  /** `groupSize` completions of each prompt, row p·G + j being sample j of prompt p, reading the bound weights. */
  generate(weights: BoundWeights[], prompts: readonly (readonly number[])[], call: RolloutCall): Promise<SampledCompletion[]>;
  /**
   * Frees the device memory the generator holds between calls (KV caches and the sessions that use
   * them), which the next `generate` rebuilds — memory for scoring and training, paid for with the
   * rebuild. The generator stays usable.
   */
  release(): void;
  dispose(): void;
}

/** The generation backends: `KvGenerationRunner` ('kv-cache') and `GenerationRunner` ('graph'); defined with their choice in @lathe/rollout. */
export type { GenerationEngine } from '@lathe/rollout';


/** Generation bound to the policy's weights: the in-graph generation loop (the 'graph' backend). */
export class GenerationRunner implements RolloutGenerator {
  private readonly binding: Binding;

  private constructor(
    private readonly session: Session,
    private readonly opts: GenerationRunnerOptions,
  ) {
    // allocated host outputs: the runtime binds them afresh each run, so their shapes follow the batch
    this.binding = session.binding();
    for (const o of ['tokens', 'logprobs', 'lengths', 'stopped']) this.binding.output(o, 'host');
  }

  /** Compiles the generation graph for `config` on `device`. */
  static create(device: Device, config: DecoderConfig, pw: PolicyWeights, opts: GenerationRunnerOptions): GenerationRunner {
    const g = new L.Graph((opts.sampling.temperature ?? 1) === 0 ? 'grpo_generate_greedy' : 'grpo_generate');
    addGeneration(g, config, (pw.merged ?? pw.weights)(g, declareTrainable(g, pw)), { ...opts.sampling, groupSize: opts.groupSize, padTokenId: opts.padId });
    return new GenerationRunner(device.compile(g, opts.session), opts);
  }

  /**
   * `groupSize` completions of each prompt (row p·G + j is sample j of prompt p), reading the bound
   * weights. Sampling noise is a function of (seed, key·G + j, position), so a sample does not
   * depend on which other prompts share its run.
   */
  async generate(weights: BoundWeights[], prompts: readonly (readonly number[])[], call: RolloutCall): Promise<SampledCompletion[]> {
    if (call.keys.length !== prompts.length) throw new Error(`generate: ${call.keys.length} keys for ${prompts.length} prompts`);
    bindAll(this.binding, ...weights);
    const G = this.opts.groupSize;
    const greedy = (this.opts.sampling.temperature ?? 1) === 0;
    const per = this.opts.promptsPerRun || prompts.length;
    const out: SampledCompletion[] = [];
    for (let start = 0; start < prompts.length; start += per) {
      const chunk = prompts.slice(start, start + per);
      const W = Math.max(...chunk.map((p) => p.length));
      const ids = new BigInt64Array(chunk.length * W).fill(BigInt(this.opts.padId));
      const mask = new BigInt64Array(chunk.length * W);
      chunk.forEach((p, r) => {
        if (p.length === 0) throw new Error(`generate: prompt ${start + r} is empty`);
        p.forEach((id, i) => {
          ids[r * W + W - p.length + i] = BigInt(id);
          mask[r * W + W - p.length + i] = 1n;
        });
      });
      this.binding
        .input('input_ids', { data: ids, dims: [chunk.length, W] })
        .input('attention_mask', { data: mask, dims: [chunk.length, W] })
        .input('max_new_tokens', { data: BigInt64Array.from([BigInt(call.maxNewTokens)]), dims: [] })
        .input('stop_ids', { data: BigInt64Array.from((call.stopIds.length ? call.stopIds : [-1]).map(BigInt)), dims: [Math.max(1, call.stopIds.length)] });
      if (!greedy) {
        const keys = call.keys.slice(start, start + per).flatMap((k) => Array.from({ length: G }, (_, j) => k * G + j));
        this.binding.input('noise', { data: uniformNoise(call.seed, keys, call.maxNewTokens), dims: [keys.length, call.maxNewTokens] });
      }
      await this.binding.run();
      const tokens = this.binding.fetch('tokens');
      const logprobs = this.binding.fetch('logprobs');
      const lengths = this.binding.fetch('lengths');
      const stopped = this.binding.fetch('stopped');
      const N = tokens.dims[1];
      for (let r = 0; r < chunk.length * G; r++) {
        const n = Number(lengths.data[r]);
        out.push({
          tokens: Array.from((tokens.data as BigInt64Array).subarray(r * N, r * N + n), Number),
          logprobs: Array.from((logprobs.data as Float32Array).subarray(r * N, r * N + n)),
          stopped: Boolean(stopped.data[r]),
        });
      }
    }
    return out;
  }

  /**
   * Nothing to free: the in-graph loop grows its caches inside one run and holds none between runs
   * (its session's working memory stays with the session, as every session's does).
   */
  release(): void {}

  dispose(): void {
    this.binding.dispose();
    this.session.dispose();
  }
}

/** Options of a KV-cache generation runner. */
export interface KvGenerationRunnerOptions extends GenerationRunnerOptions {
  /** The decoder's weights in the compute dtype (shared with the trainer's other KV runners). */
  weights: ComputeWeights;
  /**
   * Called before each engine run with its phase, the prompts it prefills and the engine's rows.
   * For tests: an out-of-memory error thrown here stands in for a real one.
   */
  beforeRun?: (phase: 'prefill' | 'decode', prompts: number, rows: number) => void;
}

/**
 * The decoder's weights in the compute dtype, *materialised* from the trainer's tensors: one run
 * casts the float32 parameters (with LoRA: base + scale·B·A, `PolicyWeights.merged`) into buffers
 * held for the object's lifetime, and only when the weight version changes. Casting inside the KV
 * decode step instead would read every float32 weight again for every token (2.4 GB per step at
 * 0.6B). The buffers never move, so a decode step reading them can replay as a CUDA graph. One
 * object serves every KV runner of a trainer (rollouts and greedy evaluation), so the copy (1.2 GB
 * at 0.6B in bf16) exists once.
 * Weights that never change (the frozen KL reference, {@link frozenReference}) are materialised
 * once with {@link ComputeWeights.materialiseOnce}, which then frees the session that wrote them.
 */
/**
 * What another reader of a {@link ComputeWeights}' buffers (a server answering requests while the
 * policy trains) does around each rewrite: `before` resolves once it has stopped reading, `after`
 * lets it read again, with the weight version (the optimizer step) the buffers now hold.
 */
export interface WeightsGuard {
  before(): Promise<void>;
  after(version: number | undefined): void;
}

export class ComputeWeights {
  private built: { session: Session; binding: Binding; buffers: Map<string, DeviceTensor> } | undefined;
  private version: number | undefined;
  /** Set by `materialiseOnce`: the buffers, whose session is gone; they are never written again. */
  private frozen: Map<string, DeviceTensor> | undefined;

  constructor(
    private readonly device: Device,
    private readonly config: DecoderConfig,
    private readonly pw: PolicyWeights,
    /** Compute dtype of the buffers (the trainer's). */
    readonly compute: DType,
    private readonly session?: SessionOptions,
  ) {}

  /**
   * The buffers by HF name, holding the weights computed from `weights` (compiled and allocated on
   * first use; recomputed unless `version` is defined and equals the last one's). After
   * {@link materialiseOnce}: those buffers, unchanged.
   */
  async update(weights: BoundWeights[], version: number | undefined): Promise<Map<string, DeviceTensor>> {
    if (this.frozen) return this.frozen;
    if (this.branched) return this.updateBranched(weights, version);
    if (!this.built) this.built = this.build();
    else if (version !== undefined && version === this.version) return this.built.buffers;
    await this.guard?.before();
    try {
      bindAll(this.built.binding, ...weights);
      await this.built.binding.run();
      this.version = version;
    } finally {
      this.guard?.after(this.version);
    }
    return this.built.buffers;
  }

  /** Called around every rewrite of the buffers (see {@link WeightsGuard}); set by whoever else reads them. */
  guard: WeightsGuard | undefined;

  /**
   * Materialises `weights` once (a synchronous run, so a constructor can call it), then frees the
   * session and binding that did it: only the compute-dtype buffers stay on the device — the
   * float32 sources may be disposed as soon as this returns. For weights that never change.
   */
  materialiseOnce(weights: BoundWeights[]): Map<string, DeviceTensor> {
    if (this.frozen) return this.frozen;
    const built = this.built ?? this.build();
    this.built = undefined;
    try {
      bindAll(built.binding, ...weights);
      built.binding.runSync();
    } catch (e) {
      built.buffers.forEach((t) => t.dispose());
      throw e;
    } finally {
      built.binding.dispose();
      built.session.dispose();
    }
    this.frozen = built.buffers;
    return this.frozen;
  }

  /**
   * Whether the policy keeps a side branch that cannot be merged into dense weights (QLoRA: adapters
   * over a quantized base, no `merged`): the engine then reads the policy's own graph weights
   * ({@link graphWeights}) — the frozen base as it is, the trainable tensors from stable copies.
   */
  get branched(): boolean {
    return this.pw.merged === undefined && this.pw.trainable.length > 0 && this.probeBranch();
  }

  private branchProbe: boolean | undefined;
  private probeBranch(): boolean {
    if (this.branchProbe === undefined) {
      const g = new L.Graph('probe');
      this.branchProbe = this.pw.weights(g, declareTrainable(g, this.pw)).branch !== undefined;
    }
    return this.branchProbe;
  }

  /** With {@link branched}: how the engine's graphs read the weights (the tensors {@link update} returns, by input name). */
  get graphWeights(): ((g: Graph) => Weights) | undefined {
    return this.branched ? (g) => this.pw.weights(g, declareTrainable(g, this.pw)) : undefined;
  }

  private copies: Map<string, DeviceTensor> | undefined;
  /** {@link update} for a branched policy: the trainable tensors copied into buffers that never move (the trainer swaps its own sets), the rest passed through. */
  private async updateBranched(weights: BoundWeights[], version: number | undefined): Promise<Map<string, DeviceTensor>> {
    const all = new Map<string, DeviceTensor>();
    for (const set of weights) for (const [name, t] of set) all.set(name, t);
    const fresh = !this.copies;
    this.copies ??= new Map(this.pw.trainable.map((p) => [p.name, this.device.zeros('float32', p.shape)] as const));
    if (fresh || version === undefined || version !== this.version) {
      await this.guard?.before();
      try {
        for (const [name, t] of this.copies) {
          const src = all.get(name);
          if (!src) throw new Error(`ComputeWeights: no tensor bound for '${name}'`);
          t.copyFrom(src);
        }
        this.version = version;
      } finally {
        this.guard?.after(this.version);
      }
    }
    for (const [name, t] of this.copies) all.set(name, t);
    return all;
  }

  /** The graph that writes `compute/<name>` = the weight in the compute dtype, its session and the buffers it writes into. */
  private build(): { session: Session; binding: Binding; buffers: Map<string, DeviceTensor> } {
    const g = new L.Graph('grpo_materialise_weights');
    const w = (this.pw.merged ?? this.pw.weights)(g, declareTrainable(g, this.pw));
    if (w.branch) throw new Error('ComputeWeights: the policy adds a side branch to its weights; materialising needs whole ones (PolicyWeights.merged)');
    const specs = paramSpecs(this.config);
    for (const spec of specs) g.output(L.cast(w(spec.name), this.compute), `compute/${spec.name}`);
    const session = this.device.compile(g, { ...this.session, name: 'grpo-materialise-weights', cudaGraph: false });
    const binding = session.binding();
    const buffers = new Map(specs.map((spec) => [spec.name, this.device.zeros(this.compute, spec.shape)] as const));
    for (const [name, t] of buffers) binding.output(`compute/${name}`, t);
    return { session, binding, buffers };
  }

  /**
   * Frees the buffers and the session that writes them, unless they were materialised once (those
   * cannot be rebuilt): the next `update` compiles, allocates and runs again whatever the version.
   * Nothing may still read the old buffers (a KV engine bound to them must be released first).
   */
  release(): void {
    this.copies?.forEach((t) => t.dispose());
    this.copies = undefined;
    if (!this.built) return;
    this.built.binding.dispose();
    this.built.session.dispose();
    this.built.buffers.forEach((t) => t.dispose());
    this.built = undefined;
    this.version = undefined;
  }

  dispose(): void {
    this.release();
    this.frozen?.forEach((t) => t.dispose());
    this.frozen = undefined;
  }
}

/**
 * How a graph reads weights that are already in the compute dtype (a {@link ComputeWeights}'
 * buffers, or float32 weights for float32 compute): one input per weight, by HF name, in `compute`,
 * used as they are — no Cast in the graph.
 */
export function computeDtypeWeights(config: DecoderConfig, compute: DType): PolicyWeights {
  return { trainable: [], weights: (g) => weightInputs(g, config, compute, compute).weights };
}

/** The frozen reference policy of the KL: its weights on the device, and how a scoring graph reads them. */
export interface ReferencePolicy {
  /** The weights by HF name, in the compute dtype, to bind to the reference scorer. */
  weights: Map<string, DeviceTensor>;
  /** How the reference scorer's graph declares them ({@link computeDtypeWeights}). */
  policy: PolicyWeights;
  /** Frees the weights. */
  dispose(): void;
}

/**
 * The frozen reference from the starting `model`, stored once in the compute dtype: it is never
 * trained, so nothing needs its float32 values. With float32 compute that is a device copy of the
 * model's weights (as it always was); with bfloat16/float16, {@link ComputeWeights} materialises
 * the copy in one run and frees that run's session — half the memory of a float32 copy (1.2 GB
 * less at the 0.6B shape), and the reference scorer casts nothing per step. `onDevice`, when given, holds the same values already on
 * the device as float32 (the trainer's parameters before any update): they are copied (float32) or
 * read by the materialising run (else) on the device, with no host upload.
 */
export function frozenReference(device: Device, model: CausalLM, compute: DType, opts: { onDevice?: BoundWeights; session?: SessionOptions } = {}): ReferencePolicy {
  const { config } = model;
  const specs = paramSpecs(config);
  // the model's weights are read (a model of files reads them) only for what `onDevice` lacks
  let host: Map<string, Float32Array> | undefined;
  const upload = (s: (typeof specs)[number]) => device.upload({ data: (host ??= model.float32Weights()).get(s.name)!, dims: s.shape });
  const policy = computeDtypeWeights(config, compute);
  if (compute === 'float32') {
    // a device-to-device copy of `onDevice` when given (no host round trip), else an upload
    const onDevice = opts.onDevice && new Map(opts.onDevice);
    const copy = (s: (typeof specs)[number]) => {
      const src = onDevice?.get(s.name);
      if (!src) return upload(s);
      const t = device.empty('float32', s.shape);
      t.copyFrom(src);
      return t;
    };
    const copies = new Map(specs.map((s) => [s.name, copy(s)] as const));
    return { weights: copies, policy, dispose: () => copies.forEach((t) => t.dispose()) };
  }
  const source: PolicyWeights = { trainable: specs.map((s) => ({ name: s.name, shape: s.shape, decay: false })), weights: (_g, t) => castWeights(t, compute) };
  const materialised = new ComputeWeights(device, config, source, compute, opts.session);
  const uploads = opts.onDevice ? undefined : specs.map((s) => [s.name, upload(s)] as const);
  try {
    return { weights: materialised.materialiseOnce([opts.onDevice ?? uploads!]), policy, dispose: () => materialised.dispose() };
  } finally {
    uploads?.forEach(([, t]) => t.dispose());
  }
}

/** Cache lengths are rounded up to this many positions, so a slightly longer prompt rarely rebuilds the engine. */
const LENGTH_QUANTUM = 64;

/**
 * Generation bound to the policy's weights through `KvCacheGenerator` (the 'kv-cache' backend):
 * prefill, then a loop of decode-step runs over in-place KV caches. The engine's rows and cache
 * length are fixed when it is built, so it is built on first use — rows for `promptsPerRun` prompts
 * (all of the call's with 0) × G, cache length the longest prompt + `maxNewTokens` rounded up to 64
 * positions — and rebuilt, larger, only when a call needs more. It reads the weights from
 * {@link ComputeWeights} (refreshed when `call.weightsVersion` changes), whose buffers never move,
 * so on CUDA its decode step replays as a CUDA graph.
 */
export class KvGenerationRunner implements RolloutGenerator {
  private engine: { generator: KvCacheGenerator; rows: number; maxLength: number } | undefined;
  /** The most rows an engine may have: lowered (to a multiple of the group size) by an out-of-memory. */
  private rowLimit = Infinity;
  /** Times an out-of-memory rebuilt the engine with half the rows. */
  shrinks = 0;

  private constructor(
    private readonly device: Device,
    private readonly config: DecoderConfig,
    private readonly opts: KvGenerationRunnerOptions,
  ) {}

  /** Checks that the engine can run here; the graphs are compiled on the first `generate`. */
  static create(device: Device, config: DecoderConfig, opts: KvGenerationRunnerOptions): KvGenerationRunner {
    const why = kvCacheUnsupported(config, device.kind, opts.weights.compute);
    if (why) throw new Error(`KvGenerationRunner: ${why}`);
    validateSampling(opts.sampling, config.vocabSize);
    return new KvGenerationRunner(device, config, opts);
  }

  /** Same contract as {@link GenerationRunner.generate}. */
  async generate(weights: BoundWeights[], prompts: readonly (readonly number[])[], call: RolloutCall): Promise<SampledCompletion[]> {
    if (call.keys.length !== prompts.length) throw new Error(`generate: ${call.keys.length} keys for ${prompts.length} prompts`);
    if (prompts.length === 0) return [];
    const longest = Math.max(...prompts.map((p) => p.length));
    const positions = this.config.maxPositionEmbeddings;
    checkSequenceLength(this.config, longest + call.maxNewTokens, `generate: the longest prompt (${longest} tokens) + ${call.maxNewTokens} new`);
    const buffers = await this.opts.weights.update(weights, call.weightsVersion);
    const G = this.opts.groupSize;
    const maxLength = Math.min(positions, Math.ceil((longest + call.maxNewTokens) / LENGTH_QUANTUM) * LENGTH_QUANTUM);
    // The generator splits a run's prompts on out-of-memory, which shrinks only the prefill; past
    // that the engine is rebuilt with half the prompts per run (samples depend on (seed, key) alone).
    const onShrink = (_from: number, to: number) => {
      this.release();
      this.rowLimit = to;
      this.shrinks++;
    };
    const rows = Math.min((this.opts.promptsPerRun || prompts.length) * G, this.rowLimit);
    const out = await shrinkOnOutOfMemory(rows, { minRows: G, step: G, onShrink }, (size) =>
      this.engineFor(size, maxLength, buffers).generate(prompts.map((p) => [...p]), { maxNewTokens: call.maxNewTokens, seed: call.seed, stopIds: [...call.stopIds], promptKeys: [...call.keys] }),
    );
    // sorted by (prompt, sample): row p·G + j
    return out.map((c) => ({ tokens: c.tokens, logprobs: c.logprobs, stopped: c.finishReason === 'stop' }));
  }

  /** The engine, rebuilt (the old one disposed) when a call needs more rows or a longer cache. */
  private engineFor(rows: number, maxLength: number, weights: Map<string, DeviceTensor>): KvCacheGenerator {
    const e = this.engine;
    if (e && e.rows >= rows && e.maxLength >= maxLength) return e.generator;
    e?.generator.dispose();
    this.engine = undefined;
    const size = { rows: Math.max(rows, e?.rows ?? 0), maxLength: Math.max(maxLength, e?.maxLength ?? 0) };
    const graphWeights = this.opts.weights.graphWeights;
    const generator = KvCacheGenerator.create(this.device, this.config, weights, {
      ...(graphWeights ? { graphWeights } : {}),
      ...this.opts.sampling,
      groupSize: this.opts.groupSize,
      ...size,
      dtype: this.opts.weights.compute,
      padTokenId: this.opts.padId,
      // on CUDA unless the session options turn graphs off (`cudaGraph: false`)
      cudaGraph: this.device.kind === 'cuda' && this.opts.session?.cudaGraph !== false,
      session: this.opts.session,
      ...(this.opts.beforeRun ? { beforeRun: (phase: 'prefill' | 'decode', prompts: number) => this.opts.beforeRun!(phase, prompts, size.rows) } : {}),
    });
    this.engine = { generator, ...size };
    return generator;
  }

  /**
   * Frees the engine — its KV caches (with the tail and noise buffers: (2·layers + 1) × rows ×
   * kvHeads × cache length × headDim in the compute dtype) and its prefill and decode sessions —
   * but not the shared {@link ComputeWeights}. The next `generate` builds it again at its size
   * (compiling both sessions and, on CUDA, capturing the decode step's graph again).
   */
  release(): void {
    this.engine?.generator.dispose();
    this.engine = undefined;
  }

  /** Frees the engine (not the shared {@link ComputeWeights}). */
  dispose(): void {
    this.release();
  }
}

/** Options of a scoring runner. */
export interface ScoringRunnerOptions {
  /** Temperature of the log-probs (the sampling temperature). */
  temperature: number;
  compute: DType;
  /** Vocabulary chunk of the log-partition. */
  chunk?: number;
  /** Also output each position's entropy (one more pass over the LM head). Default false. */
  entropy?: boolean;
  /** Attend through GroupQueryAttention (`decoderPolicy`'s `flashAttention`): the graph then reads `total_sequence_length`. */
  flashAttention?: boolean;
  /** With `flashAttention`: attend through this kernel (Lathe's flash-attention forward) instead of GroupQueryAttention; `session` must register its custom-op domain. */
  attentionKernel?: DecoderPolicyOptions['attentionKernel'];
  /** The LM head's log-partition and entropy through this fused kernel (`decoderPolicy`'s `logprobKernel`); `session` must register its custom-op domain. */
  logprobKernel?: DecoderPolicyOptions['logprobKernel'];
  /** With `flashAttention`: rotate queries and keys through this kernel (`decoderPolicy`'s `ropeKernel`); `session` must register its custom-op domain. */
  ropeKernel?: DecoderPolicyOptions['ropeKernel'];
  /** With `flashAttention`: each MLP's activation through this kernel (`decoderPolicy`'s `swigluKernel`); `session` must register its custom-op domain. */
  swigluKernel?: DecoderPolicyOptions['swigluKernel'];
  /** Also output `values` from a value head on the same trunk: the [1, hidden] input of this name (PPO's shared critic). */
  valueHead?: string;
  session?: SessionOptions;
}

/**
 * The graph a {@link ScoringRunner} compiles: `decoderPolicy` over the weights `pw` declares, with
 * outputs `logp` (and `entropy` with the option). Separate so its inputs can be inspected without
 * a device (e.g. that a reference in bfloat16 is read without a cast).
 */
export function scoringGraph(config: DecoderConfig, pw: PolicyWeights, opts: Omit<ScoringRunnerOptions, 'session'>): Graph {
  const g = new L.Graph('grpo_score');
  const policy = decoderPolicy(config, { compute: opts.compute, chunk: opts.chunk, temperature: opts.temperature, entropy: opts.entropy, weights: pw.weights, flashAttention: opts.flashAttention, attentionKernel: opts.attentionKernel, ...(opts.logprobKernel ? { logprobKernel: opts.logprobKernel } : {}), ...(opts.ropeKernel ? { ropeKernel: opts.ropeKernel } : {}), ...(opts.swigluKernel ? { swigluKernel: opts.swigluKernel } : {}), valueHead: opts.valueHead });
  const params = declareTrainable(g, pw);
  if (opts.valueHead) params.set(opts.valueHead, g.input(opts.valueHead, 'float32', [1, config.hiddenSize]));
  const out = policy(g, params);
  g.output(out.logp, 'logp');
  if (out.entropy) g.output(out.entropy, 'entropy');
  if (out.values) g.output(out.values, 'values');
  return g;
}

/** Teacher-forced log-probs through `decoderPolicy`, bound to a set of weights. */
export class ScoringRunner {
  private readonly binding: Binding;
  /** The graph attends through GroupQueryAttention with a symbolic width: each run is told T. */
  private readonly readsWidth: boolean;

  private constructor(
    private readonly session: Session,
    private readonly entropy: boolean,
    private readonly values = false,
  ) {
    this.binding = session.binding().output('logp', 'host');
    if (entropy) this.binding.output('entropy', 'host');
    if (values) this.binding.output('values', 'host');
    this.readsWidth = session.inputs.some((i) => i.name === TOTAL_LENGTH_INPUT);
  }

  /** Compiles the scoring graph ({@link scoringGraph}) for `config` on `device`. */
  static create(device: Device, config: DecoderConfig, pw: PolicyWeights, opts: ScoringRunnerOptions): ScoringRunner {
    const g = scoringGraph(config, pw, opts);
    return new ScoringRunner(device.compile(g, opts.session), g.outputs.some((o) => o.name === 'entropy'), Boolean(opts.valueHead));
  }

  /**
   * log π(ids[t+1] | ids ≤ t), [B, T] row-major (meaningful where the response mask is 1), and with
   * the `entropy` option the entropy of π(· | ids ≤ t) at each position. Rows must be right-padded
   * (tokens contiguous from column 0, as `selectRows` cuts them): the composed attention would take
   * any padding, but a fused-attention graph takes only this layout.
   */
  async score(weights: BoundWeights[], batch: { input_ids: HostTensor; attention_mask: HostTensor }): Promise<{ logp: Float32Array; entropy?: Float32Array; values?: Float32Array }> {
    bindAll(this.binding, ...weights);
    this.binding.input('input_ids', batch.input_ids).input('attention_mask', batch.attention_mask);
    if (this.readsWidth) this.binding.input(TOTAL_LENGTH_INPUT, totalLengthTensor(batch.input_ids.dims[1]));
    await this.binding.run();
    const logp = this.binding.fetch('logp').data as Float32Array;
    return {
      logp,
      ...(this.entropy ? { entropy: this.binding.fetch('entropy').data as Float32Array } : {}),
      ...(this.values ? { values: this.binding.fetch('values').data as Float32Array } : {}),
    };
  }

  dispose(): void {
    this.binding.dispose();
    this.session.dispose();
  }
}
