/**
 * A KV-cache engine for continuous batching: a fixed set of cache rows ("slots"), each holding one
 * sequence that is decoding. `admit` prefills new prompts into free slots (one prompt into as many
 * slots as it has samples) while the other slots keep their caches; `step` decodes one token for
 * every busy slot, each with its own position and its own sampling parameters; `release` frees a
 * slot at once for the next admission. Graphs in slot-graphs.ts.
 *
 * Every buffer is allocated at creation (caches [slots, kvHeads, maxLength, headDim] per layer),
 * so the decode step's addresses never change (a CUDA graph can replay it). Graph variants — with
 * or without the per-row top-k/top-p sort, with or without top log-probs — are compiled on first
 * use; each step runs the cheapest one its busy slots need.
 *
 * Samples are reproducible: a row's token t is drawn with uniformAt(seed, key, t) (rng.ts), the same
 * noise the batch engines give sample key `key` — so a row's tokens do not depend on which slot it
 * lands in, on what else is running, or on when it was admitted.
 */
import * as L from '@lathe/onnx';
import type { DType } from '@lathe/onnx';
import { CausalLM, paramSpecs, weightInputs, type DecoderConfig } from '@lathe/models';
import { Device, DeviceTensor, hostTensor, type Binding, type HostTensor, type Session, type SessionOptions } from '@lathe/runtime';
import { addKvPack, cacheName, cacheScaleName, concatTensors } from '../kv-cache-graphs';
import { withDecodeKernelChoice, withPrefillKernelChoice, type KvCacheGeneratorOptions } from '../kv-cache-generator';
import { uniformAt } from '../rng';
import { rowTopKCap, validateSampling, type RowFilterMode, type SamplingOptions } from '../sampling';
import { addSlotDecodeStep, addSlotPrefill, STEP_ROWS, type SlotGraphOptions } from './slot-graphs';

/**
 * How a slot engine is built: the batch engine's options for the cache (`maxLength`), dtype, padding,
 * CUDA graph, sessions and weights, and its decode options (`decodeAttention`, `kvCacheDtype`,
 * `swiglu`, `residualDtype`, `concatProjections`: the same meaning and checks as there), with `slots`
 * for its rows. With `concatProjections` the engine packs the weights once, at creation (so not with
 * `graphWeights`, whose weights may change under it).
 */
export interface SlotEngineOptions
  extends Pick<KvCacheGeneratorOptions, 'maxLength' | 'dtype' | 'padTokenId' | 'cudaGraph' | 'session' | 'graphWeights' | 'decodeAttention' | 'kvCacheDtype' | 'swiglu' | 'residualDtype' | 'concatProjections'> {
  /** Cache rows: the most sequences decoding at once. */
  slots: number;
  /** The most alternatives a row may ask for with `topLogprobs`. Default 20 (OpenAI's limit). */
  maxTopLogprobs?: number;
  /**
   * Pads each prefill's prompt count, row count and width up to a few fixed sizes (powers of two;
   * widths past 128 to multiples of 128), so that prefills repeat a handful of shapes: on CUDA the
   * first run of a new shape costs many times a repeated one (ONNX Runtime plans each new shape
   * anew; docs/benchmarks.md), and arrivals of every size would each pay that. Default true.
   */
  padPrefill?: boolean;
  /**
   * Runs each decode step over the leading slots that hold every busy row, their count rounded up
   * to a power of two (at most `slots`), rather than over all of them: a lightly loaded engine then
   * decodes a few rows, not `slots` (the free list hands out the lowest slots first, so busy rows
   * gather at the front). Default true.
   */
  decodeBuckets?: boolean;
  /**
   * With `cudaGraph`: how many prefill shapes (prompt count × width × rows, per graph variant) are
   * captured as CUDA graphs, each at its second prefill and replayed after. A prefill run plainly
   * pays ONNX Runtime's per-kernel launch cost for every layer, which a replay does not
   * (docs/benchmarks.md); shapes past the cap run plainly. Default 16; 0: none.
   */
  prefillGraphs?: number;
  /**
   * Binds each prefill shape to device buffers that never move (what a captured prefill needs;
   * implied by `cudaGraph` with `prefillGraphs` > 0); on its own, a way to test that path on the CPU.
   */
  staticPrefill?: boolean;
  /**
   * Runs a decode step whose busy rows all sample at temperature 1 with no filter (none greedy) with
   * the batch engine's sampling graph, which leaves out the per-row graph's argmax pass over the
   * vocabulary: the same tokens and log-probs. Default true, unless the environment sets
   * `LATHE_SLOT_SAMPLED_GRAPH=0` (an A/B switch for benchmarks of `lathe serve`).
   */
  sampledGraph?: boolean;
  /** Called before every prefill (with its prompts) and decode step (with the busy slots). Tests count runs with it. */
  beforeRun?: (phase: 'prefill' | 'decode', count: number) => void;
  /** Rethrows an error a kernel op inside `graphWeights` raised (its compute cannot throw into ONNX Runtime); called after every run with the decode options' own checks. */
  checkWeights?: () => void;
}

/** One row's sampling parameters; `temperature` 0 is greedy. */
export type RowSampling = SamplingOptions;

/** A row to start: how it samples and which random stream it reads. */
export interface SlotRow {
  sampling: RowSampling;
  seed: number;
  /** The row's random-stream key (e.g. its sample index among a request's `n`). */
  key: number;
  /** Alternatives to return per token with their raw log-probs (0: none). */
  topLogprobs?: number;
}

/** The slot engine's defaults that `lathe serve`'s options read. */
export const SLOT_ENGINE_DEFAULTS = { prefillGraphs: 16 } as const;

/** One prompt to prefill into `rows.length` free slots. */
export interface SlotAdmission {
  prompt: readonly number[];
  rows: readonly SlotRow[];
}

/** One sampled token of one slot. */
export interface SlotToken {
  slot: number;
  token: number;
  /** Log-prob under the row's sampling distribution (temperature and filters applied). */
  logprob: number;
  /** Log-prob under the raw model (temperature 1, no filters). */
  rawLogprob: number;
  /** The most likely tokens under the raw model and their log-probs, when the row asked for them. */
  top?: { ids: number[]; logprobs: number[] };
}

interface SlotState {
  row: SlotRow;
  /** Tokens in the cache (the next fed token goes to this position). */
  position: number;
  /** The last sampled token (fed at the next step). */
  token: number;
  /** Tokens sampled so far (the next one's noise column). */
  sampled: number;
  /** top-k as the graph takes it (V when off), top-p (1 off), min-p (0 off). */
  k: number;
  p: number;
  minP: number;
}

interface Variant {
  session: Session;
  binding: Binding | undefined;
  /** A CUDA-graph prefill session's bindings by shape, each over input/output buffers that never move. */
  shapes?: Map<string, PrefillShape>;
}

/** A captured prefill shape: its binding and the device buffers its inputs are uploaded into. */
interface PrefillShape {
  binding: Binding;
  inputs: Map<string, DeviceTensor>;
  outputs: DeviceTensor[];
}

/** The decode step's buffers, bound by address: its packed host inputs (uploaded before each step) and outputs. */
interface StepInputs {
  /** float32 [S, 7], slot-major (a bucket of leading slots is its leading rows), columns as STEP_ROWS. */
  step: DeviceTensor;
  sampled: DeviceTensor;
  topLogprobs: DeviceTensor | undefined;
  topIds: DeviceTensor | undefined;
}

/**
 * Which sampling graph a run takes: the per-row one (`rows`), its plain form (temperature 1 or 0,
 * no filter), or the batch engine's at temperature 1 (`sampled`, decode steps only).
 */
type Sampler = 'rows' | 'plain' | 'sampled';

/** BigInts of small numbers, made once (the scatter index is built from them at every prefill). */
const BIG = Array.from({ length: 4096 }, (_, i) => BigInt(i));

/** The smallest power of two ≥ n. */
const nextPowerOfTwo = (n: number) => 2 ** Math.ceil(Math.log2(Math.max(1, n)));

/** A prefill's padded width: a power of two up to 128, then a multiple of 128. */
const prefillWidth = (n: number) => (n <= 128 ? nextPowerOfTwo(n) : Math.ceil(n / 128) * 128);

/** A compiled slot prefill and decode step over device-resident weights and caches. */
export class SlotEngine {
  private readonly state: (SlotState | undefined)[];
  private readonly freeList: number[];
  private readonly prefills = new Map<string, Variant>();
  private readonly steps = new Map<string, Variant>();
  /** Views of the caches (and e4m3 scales) and step buffers over the leading `rows` slots, by row count (the full count is the buffers themselves). */
  private readonly leadingViews = new Map<number, { caches: DeviceTensor[]; scales: DeviceTensor[]; step: DeviceTensor; sampled: DeviceTensor; topLogprobs: DeviceTensor | undefined; topIds: DeviceTensor | undefined }>();
  /** Weights bound by {@link bindWeights}, by graph input name (a later binding of a name replaces the earlier). */
  private readonly extraWeights = new Map<string, DeviceTensor>();
  /** The launched decode step awaiting `collect`: its binding, busy slots and their states then. */
  private inFlight: { binding: Binding; busy: number[]; states: SlotState[]; top: boolean } | undefined;
  /** Prefill shapes given a CUDA graph so far (ids 1…, across the prefill variants). */
  private prefillGraphCount = 0;
  /** Whether {@link SlotEngineOptions.sampledGraph} is on (read once, at creation). */
  private readonly sampledGraph: boolean;

  /** How many prefill shapes have been given a CUDA graph (at most `prefillGraphs`). */
  get prefillGraphsUsed(): number {
    return this.prefillGraphCount;
  }
  /** Decode steps and prefills run so far. */
  readonly counters = { steps: 0, prefills: 0, prefilledPrompts: 0 };
  /** Each prefill's prompts, width and milliseconds (host preparation, then the run with its read-back), newest last; the last 1,000 are kept. */
  readonly prefillLog: { prompts: number; rows: number; width: number; prepareMs: number; runMs: number }[] = [];

  private constructor(
    readonly config: DecoderConfig,
    readonly device: Device,
    private readonly opts: SlotEngineOptions & { dtype: DType; maxTopLogprobs: number; padTokenId: number },
    private readonly weights: ReadonlyMap<string, DeviceTensor> | undefined,
    private readonly caches: DeviceTensor[],
    /** Each layer's e4m3 key and value scales [S, KV, M], in the caches' order (none for a cache in the compute dtype). */
    private readonly scales: DeviceTensor[],
    /** The packed projections (`concatProjections`) by graph input name, written once by {@link pack}. */
    private readonly packed: ReadonlyMap<string, DeviceTensor>,
    private readonly inputs: StepInputs,
  ) {
    this.state = new Array<SlotState | undefined>(opts.slots).fill(undefined);
    this.sampledGraph = opts.sampledGraph ?? process.env.LATHE_SLOT_SAMPLED_GRAPH !== '0';
    // Lowest slot first, so a lightly loaded engine reuses the same few rows.
    this.freeList = Array.from({ length: opts.slots }, (_, i) => opts.slots - 1 - i);
  }

  /** Compiles over a model's device weights (`CausalLM.fromPretrained(dir, { device })`), in their dtype. */
  static create(model: CausalLM, opts: SlotEngineOptions): SlotEngine;
  /** Compiles for `config` over caller-owned `weights` (device tensors by HF name), or with `graphWeights`, none yet. */
  static create(device: Device, config: DecoderConfig, weights: ReadonlyMap<string, DeviceTensor> | undefined, opts: SlotEngineOptions): SlotEngine;
  static create(a: CausalLM | Device, b: DecoderConfig | SlotEngineOptions, weights?: ReadonlyMap<string, DeviceTensor>, c?: SlotEngineOptions): SlotEngine {
    if (a instanceof CausalLM) {
      const opts = b as SlotEngineOptions;
      if (!a.device) throw new Error(`SlotEngine: the model's weights are on the host; load it with { device } (CausalLM.fromPretrained)`);
      if (opts.dtype && opts.dtype !== a.dtype) throw new Error(`SlotEngine: dtype ${opts.dtype} was asked for, but the model's weights are ${a.dtype}`);
      return SlotEngine.build(a.device, a.config, a.weights, { ...opts, dtype: a.dtype });
    }
    return SlotEngine.build(a, b as DecoderConfig, weights, c!);
  }

  private static build(device: Device, config: DecoderConfig, weights: ReadonlyMap<string, DeviceTensor> | undefined, opts: SlotEngineOptions): SlotEngine {
    const dtype = opts.dtype ?? (device.kind === 'cuda' ? 'bfloat16' : 'float32');
    const S = opts.slots;
    if (!Number.isInteger(S) || S < 1) throw new Error(`slots must be a positive integer, got ${opts.slots}`);
    if (!Number.isInteger(opts.maxLength) || opts.maxLength < 2 || opts.maxLength > config.maxPositionEmbeddings) {
      throw new Error(`maxLength must be an integer in [2, ${config.maxPositionEmbeddings}] (the model's max_position_embeddings), got ${opts.maxLength}`);
    }
    const pad = opts.padTokenId ?? 0;
    if (!Number.isInteger(pad) || pad < 0 || pad >= config.vocabSize) throw new Error(`padTokenId must be a token id in [0, ${config.vocabSize}), got ${opts.padTokenId}`);
    const maxTop = opts.maxTopLogprobs ?? 20;
    if (!Number.isInteger(maxTop) || maxTop < 0 || maxTop > config.vocabSize) throw new Error(`maxTopLogprobs must be an integer in [0, ${config.vocabSize}], got ${opts.maxTopLogprobs}`);
    if (opts.cudaGraph && device.kind !== 'cuda') throw new Error('cudaGraph needs a CUDA device');
    if (!weights && !opts.graphWeights) throw new Error('weights: give device tensors, or graphWeights and bind them with bindWeights');
    const da = opts.decodeAttention;
    const kvCacheDtype = opts.kvCacheDtype ?? 'model';
    if (kvCacheDtype !== 'model' && kvCacheDtype !== 'float8e4m3') throw new Error(`kvCacheDtype must be 'model' or 'float8e4m3', got '${String(kvCacheDtype)}'`);
    if (kvCacheDtype === 'float8e4m3' && da?.cache !== 'float8e4m3') throw new Error("kvCacheDtype 'float8e4m3' needs decodeAttention built for an e4m3 cache (decodeAttentionOps(..., { cache: 'float8e4m3' }))");
    if (da?.cache === 'float8e4m3' && kvCacheDtype !== 'float8e4m3') throw new Error("decodeAttention holds an e4m3 cache: set kvCacheDtype 'float8e4m3'");
    if (opts.concatProjections && opts.graphWeights) throw new Error('concatProjections: the slot engine packs the weights once, at creation, and graphWeights binds weights that may change later; drop one of them');
    for (const spec of opts.graphWeights ? [] : paramSpecs(config)) {
      const t = weights!.get(spec.name);
      if (!t) throw new Error(`weights: missing '${spec.name}'`);
      if (t.dtype !== dtype || t.dims.join(',') !== spec.shape.join(',')) throw new Error(`weights: '${spec.name}' is ${t.dtype}[${t.dims}], expected ${dtype}[${spec.shape}]`);
    }
    const made: DeviceTensor[] = [];
    const zeros = (d: DType, dims: number[]) => {
      const t = device.zeros(d, dims);
      made.push(t);
      return t;
    };
    try {
      const caches: DeviceTensor[] = [];
      const scales: DeviceTensor[] = [];
      const cacheDtype = da ? da.cacheDtype(dtype) : dtype;
      for (let i = 0; i < 2 * config.numLayers; i++) caches.push(zeros(cacheDtype, [S, config.numKvHeads, opts.maxLength, config.headDim]));
      if (kvCacheDtype === 'float8e4m3') for (let i = 0; i < 2 * config.numLayers; i++) scales.push(zeros('float32', [S, config.numKvHeads, opts.maxLength]));
      const packed = new Map(opts.concatProjections ? concatTensors(config).map((t) => [t.name, zeros(dtype, t.shape)] as const) : []);
      const inputs: StepInputs = {
        step: zeros('float32', [S, STEP_ROWS.length]),
        sampled: zeros('float32', [S, 3]),
        topLogprobs: maxTop > 0 ? zeros('float32', [S, maxTop]) : undefined,
        topIds: maxTop > 0 ? zeros('int64', [S, maxTop]) : undefined,
      };
      const engine = new SlotEngine(config, device, { ...opts, dtype, maxTopLogprobs: maxTop, padTokenId: pad }, weights, caches, scales, packed, inputs);
      if (opts.concatProjections) engine.pack();
      return engine;
    } catch (e) {
      for (const t of made) t.dispose();
      throw e;
    }
  }

  /** Slots in all. */
  get slots(): number {
    return this.opts.slots;
  }

  /** Cache positions per slot. */
  get maxLength(): number {
    return this.opts.maxLength;
  }

  /** The most top log-probs a row may ask for. */
  get maxTopLogprobs(): number {
    return this.opts.maxTopLogprobs;
  }

  /** The graph variants compiled so far, by session name (e.g. `slot-decode-capped-top`). */
  get compiled(): string[] {
    return [...this.prefills.values(), ...this.steps.values()].map((v) => v.session.name);
  }

  /** Slots free for admission now. */
  get free(): number {
    return this.freeList.length;
  }

  /** Slots holding a sequence. */
  get busy(): number {
    return this.opts.slots - this.freeList.length;
  }

  /** Tokens in slot `slot`'s cache, or undefined when it is free. */
  position(slot: number): number | undefined {
    return this.state[slot]?.position;
  }

  /** Rejects a row's bad parameters by name. */
  checkRow(row: SlotRow): void {
    validateSampling(row.sampling, this.config.vocabSize);
    if (!Number.isSafeInteger(row.seed)) throw new Error(`seed must be an integer, got ${row.seed}`);
    if (!Number.isSafeInteger(row.key)) throw new Error(`key must be an integer, got ${row.key}`);
    const top = row.topLogprobs ?? 0;
    if (!Number.isInteger(top) || top < 0 || top > this.opts.maxTopLogprobs) throw new Error(`top_logprobs must be an integer in [0, ${this.opts.maxTopLogprobs}], got ${row.topLogprobs}`);
  }

  private graphOptions(filters: RowFilterMode, top: boolean, sampler: Sampler, rows: number): SlotGraphOptions {
    const { decodeAttention, residualDtype, swiglu, concatProjections } = this.opts;
    return { slots: rows, filters, topLogprobs: top ? this.opts.maxTopLogprobs : 0, plain: sampler === 'plain', sampled: sampler === 'sampled', qkNormInKernel: this.device.kind === 'cuda', decodeAttention, residualDtype, swiglu, concatProjections };
  }

  /** The sessions' options: ORT's memory-pattern planning off unless asked for (as the batch engine), and the kernel ops' domains. */
  private sessionOptions(): SessionOptions {
    const domains = [this.opts.decodeAttention, this.opts.swiglu].flatMap((k) => (k ? [k.domain.handle] : []));
    return {
      ...this.opts.session,
      memoryPattern: this.opts.session?.memoryPattern ?? false,
      ...(domains.length ? { customOpDomains: [...(this.opts.session?.customOpDomains ?? []), ...domains] } : {}),
    };
  }

  /** Rethrows an error a kernel op raised during the last run. */
  private checkKernels(): void {
    this.opts.decodeAttention?.check();
    this.opts.swiglu?.check();
    this.opts.checkWeights?.();
  }

  /** Writes the packed projections (`concatProjections`) from the weights: once, at creation. */
  private pack(): void {
    const g = new L.Graph('lathe_slot_pack');
    addKvPack(g, this.config, weightInputs(g, this.config, this.opts.dtype, this.opts.dtype).weights);
    const session = this.device.compile(g, { ...this.sessionOptions(), name: 'slot-pack', cudaGraph: false });
    try {
      const b = session.binding();
      try {
        for (const [name, t] of this.weights ?? []) b.input(name, t);
        for (const [name, t] of this.packed) b.output(name, t);
        b.runSync();
      } finally {
        b.dispose();
      }
    } finally {
      session.dispose();
    }
  }

  private compile(kind: 'prefill' | 'decode', filters: RowFilterMode, top: boolean, sampler: Sampler, rows: number): Session {
    const g = new L.Graph(`lathe_slot_${kind}`);
    const w = this.opts.graphWeights ? this.opts.graphWeights(g) : weightInputs(g, this.config, this.opts.dtype, this.opts.dtype).weights;
    (kind === 'prefill' ? addSlotPrefill : addSlotDecodeStep)(g, this.config, w, this.opts.dtype, this.graphOptions(filters, top, sampler, rows));
    const session = this.sessionOptions();
    const name = `slot-${kind}${sampler === 'rows' ? '' : `-${sampler}`}${filters === 'none' ? '' : `-${filters}`}${top ? '-top' : ''}${rows < this.opts.slots ? `-${rows}` : ''}`;
    if (kind === 'prefill') return withPrefillKernelChoice(() => this.device.compile(g, { ...session, name, cudaGraph: this.prefillCaptured() }));
    // the decode step's attention kernel as the batch engine chooses it (ORT_ENABLE_XQA, read at compile)
    return withDecodeKernelChoice(this.config, () => this.device.compile(g, { ...session, name, cudaGraph: this.opts.cudaGraph }));
  }

  private prefillCaptured(): boolean {
    return Boolean(this.opts.cudaGraph) && (this.opts.prefillGraphs ?? SLOT_ENGINE_DEFAULTS.prefillGraphs) > 0;
  }

  private prefillGraphed(): boolean {
    return this.prefillCaptured() || Boolean(this.opts.staticPrefill);
  }

  /**
   * The binding a prefill of these inputs runs with. Plain: the variant's one binding, fed host
   * tensors. Graphed: one binding per shape over its own device buffers (a captured graph reads
   * fixed addresses), the inputs uploaded into them; a new shape gets the next graph id while the
   * cap allows, else -1 (ONNX Runtime then runs it plainly).
   */
  private prefillBinding(v: Variant, top: boolean, feeds: [string, HostTensor][]): Binding {
    if (!this.prefillGraphed()) {
      const b = v.binding!;
      for (const [name, t] of feeds) b.input(name, t);
      return b;
    }
    const key = feeds.map(([, t]) => t.dims.join('x')).join('/');
    v.shapes ??= new Map();
    let shape = v.shapes.get(key);
    if (!shape) {
      const b = v.session.binding();
      this.bindCommon(b);
      const inputs = new Map<string, DeviceTensor>();
      for (const [name, t] of feeds) {
        // the width is read on the host (GroupQueryAttention's total length): it stays a host input
        if (name === 'prompt_width') b.input(name, t);
        else {
          const d = this.device.upload(t, v.session.input(name).dtype);
          inputs.set(name, d);
          b.input(name, d);
        }
      }
      const E = feeds.find(([n]) => n === 'expand_index')![1].dims[0];
      const outputs = [this.device.empty('float32', [E, 3])];
      b.output('sampled', outputs[0]);
      if (top) {
        const T = this.opts.maxTopLogprobs;
        outputs.push(this.device.empty('float32', [E, T]), this.device.empty('int64', [E, T]));
        b.output('top_logprobs', outputs[1]).output('top_ids', outputs[2]);
      }
      if (this.prefillCaptured()) {
        const graphed = this.prefillGraphCount < (this.opts.prefillGraphs ?? SLOT_ENGINE_DEFAULTS.prefillGraphs);
        b.runConfig('gpu_graph_id', graphed ? String(++this.prefillGraphCount) : '-1');
      }
      shape = { binding: b, inputs, outputs };
      v.shapes.set(key, shape);
      return b;
    }
    for (const [name, t] of feeds) shape.inputs.get(name)?.upload(t);
    return shape.binding;
  }

  /** The caches and step buffers over the leading `rows` slots (views, made once per count). */
  private leading(rows: number) {
    const x = this.inputs;
    if (rows === this.opts.slots) return { caches: this.caches, scales: this.scales, step: x.step, sampled: x.sampled, topLogprobs: x.topLogprobs, topIds: x.topIds };
    let v = this.leadingViews.get(rows);
    if (!v) {
      v = { caches: this.caches.map((c) => c.leading(rows)), scales: this.scales.map((c) => c.leading(rows)), step: x.step.leading(rows), sampled: x.sampled.leading(rows), topLogprobs: x.topLogprobs?.leading(rows), topIds: x.topIds?.leading(rows) };
      this.leadingViews.set(rows, v);
    }
    return v;
  }

  private bindCommon(b: Binding, x: { caches: readonly DeviceTensor[]; scales: readonly DeviceTensor[] } = { caches: this.caches, scales: this.scales }): void {
    for (const [name, t] of this.weights ?? []) b.input(name, t);
    for (const [name, t] of this.extraWeights) b.input(name, t);
    for (const [name, t] of this.packed) b.input(name, t);
    for (let i = 0; i < this.config.numLayers; i++) {
      for (const [j, which] of (['key', 'value'] as const).entries()) {
        const cache = x.caches[2 * i + j];
        b.input(cacheName(i, which, 'input'), cache).output(cacheName(i, which, 'output'), cache);
        const scale = x.scales[2 * i + j];
        if (scale) b.input(cacheScaleName(i, which, 'input'), scale).output(cacheScaleName(i, which, 'output'), scale);
      }
    }
  }

  private variant(kind: 'prefill' | 'decode', filters: RowFilterMode, top: boolean, sampler: Sampler = 'rows', rows = this.opts.slots): Variant {
    if (kind === 'prefill' && sampler === 'sampled') throw new Error('slot engine: the sampled graph is for decode steps');
    const map = kind === 'prefill' ? this.prefills : this.steps;
    const id = `${filters}/${top}/${sampler}/${rows}`;
    let v = map.get(id);
    if (!v) {
      v = { session: this.compile(kind, filters, top, sampler, rows), binding: undefined };
      map.set(id, v);
    }
    if (!v.binding) {
      const b = v.session.binding();
      if (kind === 'decode') {
        const x = this.leading(rows);
        this.bindCommon(b, x);
        b.input('step', x.step).input('cache_length', hostTensor('int32', [], [this.opts.maxLength]));
        b.output('sampled', x.sampled);
        if (top) b.output('top_logprobs', x.topLogprobs!).output('top_ids', x.topIds!);
        // Each variant's session captures its own graph.
        if (this.opts.cudaGraph) b.runConfig('gpu_graph_id', '1');
      } else if (!this.prefillGraphed()) {
        this.bindCommon(b);
        b.output('sampled', 'device');
        if (top) b.output('top_logprobs', 'device').output('top_ids', 'device');
      }
      v.binding = b;
    }
    return v;
  }

  /**
   * Compiles the graph variants ahead of the first requests (else each compiles on first use):
   * `filters` adds the top-k/top-p ones, `top` the top-log-prob ones.
   */
  warm(opts: { filters?: boolean; top?: boolean } = {}): void {
    for (const filters of opts.filters ? (['none', 'capped', 'full'] as const) : (['none'] as const)) {
      for (const top of opts.top && this.opts.maxTopLogprobs > 0 ? [false, true] : [false]) {
        for (const sampler of filters === 'none' ? (['plain', 'rows'] as const) : (['rows'] as const)) {
          this.variant('prefill', filters, top, sampler);
          const decode: Sampler[] = sampler === 'plain' && this.sampledGraph ? ['plain', 'sampled'] : [sampler];
          // on a GPU every bucket, so that no step waits for a compile (and a CUDA-graph capture) mid-serving
          for (const d of decode) for (const rows of this.device.kind === 'cuda' ? this.buckets() : [this.opts.slots]) this.variant('decode', filters, top, d, rows);
        }
      }
    }
  }

  /**
   * Runs each prefill shape that prompts of these lengths can take — their padded width, every
   * padded prompt count up to `maxPrefillTokens` of prompt (as the scheduler admits them) and the
   * slots — twice, for the sampling graphs of plain rows and of the rest, into free slots released
   * after: on CUDA a shape's first run plans it (hundreds of ms) and with `cudaGraph` its second
   * captures it, costs that would otherwise land on the first requests. Needs every slot free.
   */
  warmPrefills(lengths: readonly number[], maxPrefillTokens: number): void {
    if (this.busy > 0 || this.inFlight) throw new Error('warmPrefills: needs an idle engine (every slot free)');
    for (const n of lengths) {
      if (!Number.isInteger(n) || n < 1 || n >= this.opts.maxLength) throw new Error(`warmPrefills: a prompt length of ${n} does not fit a context of ${this.opts.maxLength} (1..${this.opts.maxLength - 1})`);
      const most = Math.min(this.opts.slots, nextPowerOfTwo(Math.max(1, Math.floor(maxPrefillTokens / n))));
      for (let prompts = 1; prompts <= most; prompts *= 2) {
        for (const temperature of [1, 0.7]) {
          for (let run = 0; run < 2; run++) {
            const admissions = Array.from({ length: prompts }, () => ({ prompt: Array<number>(n).fill(this.opts.padTokenId), rows: [{ sampling: { temperature }, seed: 0, key: 0 }] }));
            for (const a of this.admit(admissions)) for (const slot of a.slots) this.release(slot);
          }
        }
      }
    }
  }

  private normalised(row: SlotRow): Pick<SlotState, 'k' | 'p' | 'minP'> {
    const V = this.config.vocabSize;
    const k = row.sampling.topK && row.sampling.topK < V ? row.sampling.topK : V;
    return { k, p: row.sampling.topP ?? 1, minP: row.sampling.minP ?? 0 };
  }

  /** The decode steps' row counts: powers of two below `slots`, then `slots` (only `slots` without decodeBuckets). */
  private buckets(): number[] {
    const S = this.opts.slots;
    if (this.opts.decodeBuckets === false) return [S];
    const out: number[] = [];
    for (let n = 1; n < S; n *= 2) out.push(n);
    return [...out, S];
  }

  /** Whether every row samples at temperature 1 or 0 with no filter (the sampler's cheaper graph). */
  private plainRows(rows: readonly Pick<SlotState, 'k' | 'p' | 'minP' | 'row'>[]): boolean {
    const V = this.config.vocabSize;
    return rows.every((r) => r.k >= V && r.p >= 1 && r.minP === 0 && [0, 1].includes(r.row.sampling.temperature ?? 1));
  }

  /** The cheapest sampling graph these rows allow (`sampled` for decode steps only). */
  private sampler(rows: readonly Pick<SlotState, 'k' | 'p' | 'minP' | 'row'>[], kind: 'prefill' | 'decode'): Sampler {
    if (!this.plainRows(rows)) return 'rows';
    return kind === 'decode' && this.sampledGraph && rows.every((r) => (r.row.sampling.temperature ?? 1) === 1) ? 'sampled' : 'plain';
  }

  /** The cheapest top-k/top-p graph these rows allow (see RowFilterMode). */
  private filterMode(rows: readonly Pick<SlotState, 'k' | 'p'>[]): RowFilterMode {
    const V = this.config.vocabSize;
    const filtering = rows.filter((r) => r.k < V || r.p < 1);
    if (filtering.length === 0) return 'none';
    const cap = rowTopKCap(V);
    return filtering.every((r) => r.k <= cap) ? 'capped' : 'full';
  }

  /**
   * Prefills each admission's prompt into `rows.length` free slots (all in one run) and samples
   * each new row's first token. Returns, per admission, its slots (one per row, in row order) and
   * their first tokens. Throws, with nothing admitted, when there are too few free slots or an
   * input is invalid (errors name the admission).
   */
  admit(admissions: readonly SlotAdmission[]): { slots: number[]; tokens: SlotToken[] }[] {
    if (admissions.length === 0) return [];
    if (this.inFlight) throw new Error('admit: a decode step is in flight (collect it first)');
    const V = this.config.vocabSize;
    const M = this.opts.maxLength;
    const rows = admissions.reduce((n, a) => n + a.rows.length, 0);
    if (rows > this.freeList.length) throw new Error(`admit: ${rows} rows asked for, ${this.freeList.length} slots free`);
    admissions.forEach((a, i) => {
      if (a.rows.length === 0) throw new Error(`admission ${i}: no rows`);
      if (a.prompt.length === 0) throw new Error(`admission ${i}: the prompt is empty`);
      if (a.prompt.length >= M) throw new Error(`admission ${i}: a prompt of ${a.prompt.length} tokens leaves no room in a cache of ${M} positions`);
      const bad = a.prompt.find((t) => !Number.isInteger(t) || t < 0 || t >= V);
      if (bad !== undefined) throw new Error(`admission ${i}: token id ${bad} is outside the vocabulary (0..${V - 1})`);
      a.rows.forEach((r) => this.checkRow(r));
    });
    const started = performance.now();
    const pad = this.opts.padPrefill ?? true;
    // Padding prompts are one pad token each and are never expanded into a slot; padding rows
    // repeat the last row (the same slot and values: identical writes). A width past the longest
    // prompt writes pad keys/values at positions the row's own length never reaches in attention,
    // which decoding then overwrites.
    const B = admissions.length;
    const Bp = pad ? nextPowerOfTwo(B) : B;
    const P = pad ? Math.min(prefillWidth(Math.max(...admissions.map((a) => a.prompt.length))), M) : Math.max(...admissions.map((a) => a.prompt.length));
    const KV = this.config.numKvHeads;
    const ids = new BigInt64Array(Bp * P).fill(BigInt(this.opts.padTokenId));
    admissions.forEach((a, b) => a.prompt.forEach((t, j) => (ids[b * P + j] = BigInt(t))));
    const lengths = Array.from({ length: Bp }, (_, b) => admissions[b]?.prompt.length ?? 1);
    const slots = admissions.map((a) => a.rows.map(() => this.freeList.pop()!));
    const flat = admissions.flatMap((a, b) => a.rows.map((row, j) => ({ b, row, slot: slots[b][j], ...this.normalised(row) })));
    const E = flat.length;
    const padded = pad ? [...flat, ...Array.from({ length: nextPowerOfTwo(E) - E }, () => flat[E - 1])] : flat;
    const Ep = padded.length;
    const big = (n: number) => BIG[n] ?? BigInt(n);
    const scatter = new BigInt64Array(Ep * KV * P * 3);
    padded.forEach((r, e) => {
      const slot = big(r.slot);
      for (let h = 0; h < KV; h++) {
        const head = big(h);
        for (let p = 0; p < P; p++) {
          const at = ((e * KV + h) * P + p) * 3;
          scatter[at] = slot;
          scatter[at + 1] = head;
          scatter[at + 2] = big(p);
        }
      }
    });
    const filters = this.filterMode(flat);
    const top = flat.some((r) => (r.row.topLogprobs ?? 0) > 0);
    let out: SlotToken[];
    try {
      const b = this.prefillBinding(this.variant('prefill', filters, top, this.sampler(flat, 'prefill')), top, [
        ['input_ids', { data: ids, dims: [Bp, P] }],
        ['seqlens', hostTensor('int32', [Bp], lengths.map((n) => n - 1))],
        ['last_index', hostTensor('int64', [Bp], lengths.map((n, i) => i * P + n - 1))],
        ['prompt_width', hostTensor('int32', [], [P])],
        ['expand_index', hostTensor('int64', [Ep], padded.map((r) => r.b))],
        ['scatter_index', { data: scatter, dims: [Ep, KV, P, 3] }],
        ['temperature', hostTensor('float32', [Ep], padded.map((r) => r.row.sampling.temperature ?? 1))],
        ['top_k', hostTensor('int64', [Ep], padded.map((r) => r.k))],
        ['top_p', hostTensor('float32', [Ep], padded.map((r) => r.p))],
        ['min_p', hostTensor('float32', [Ep], padded.map((r) => r.minP))],
        ['uniform', hostTensor('float32', [Ep], padded.map((r) => uniformAt(r.row.seed, r.row.key, 0)))],
      ]);
      this.opts.beforeRun?.('prefill', B);
      const run = performance.now();
      b.runSync();
      this.checkKernels();
      this.counters.prefills++;
      this.counters.prefilledPrompts += B;
      out = this.read(b, flat.map((r) => r.slot), flat.map((r) => r.row.topLogprobs ?? 0), top ? this.opts.maxTopLogprobs : 0, (i) => i);
      if (this.prefillLog.length >= 1000) this.prefillLog.shift();
      this.prefillLog.push({ prompts: B, rows: E, width: P, prepareMs: run - started, runMs: performance.now() - run });
    } catch (e) {
      for (const s of slots.flat().reverse()) this.freeList.push(s);
      throw e;
    }
    flat.forEach((r, e) => {
      this.state[r.slot] = { row: r.row, position: admissions[r.b].prompt.length, token: out[e].token, sampled: 1, k: r.k, p: r.p, minP: r.minP };
    });
    let at = 0;
    return slots.map((s) => ({ slots: s, tokens: out.slice(at, (at += s.length)) }));
  }

  /** The results of a run for `slots` (row `rowOf(i)` of its outputs holds slot i's). */
  private read(b: Binding, slots: number[], tops: number[], T: number, rowOf: (i: number) => number): SlotToken[] {
    const sampled = b.get('sampled').download().data as Float32Array;
    const topValues = T ? (b.get('top_logprobs').download().data as Float32Array) : undefined;
    const topIds = T ? (b.get('top_ids').download().data as BigInt64Array) : undefined;
    return slots.map((slot, i) => {
      const r = rowOf(i);
      const t: SlotToken = { slot, token: sampled[r * 3], logprob: sampled[r * 3 + 1], rawLogprob: sampled[r * 3 + 2] };
      if (tops[i] > 0) {
        t.top = { ids: Array.from(topIds!.subarray(r * T, r * T + tops[i]), Number), logprobs: Array.from(topValues!.subarray(r * T, r * T + tops[i])) };
      }
      return t;
    });
  }

  /**
   * One decode step over every slot: each busy slot's next token (free slots run too, their results
   * dropped). Throws when a busy slot's cache is full (release it first). Returns [] with no busy
   * slot. The same as {@link launch} then {@link collect}.
   */
  step(): SlotToken[] {
    return this.launch() ? this.collect() : [];
  }

  /**
   * Starts a decode step over every slot without waiting for it (on CUDA the run is queued; on the
   * CPU it runs now), so the host can do other work — e.g. stream the previous step's tokens —
   * until {@link collect}. Until then `admit` is refused; `release` is allowed (the released slot's
   * result of this step is dropped). Returns false, starting nothing, with no busy slot.
   */
  launch(): boolean {
    if (this.inFlight) throw new Error('launch: a step is already in flight (collect it first)');
    const V = this.config.vocabSize;
    const busy: number[] = [];
    this.state.forEach((s, i) => {
      if (!s) return;
      if (s.position >= this.opts.maxLength) throw new Error(`slot ${i}: its cache of ${this.opts.maxLength} positions is full`);
      busy.push(i);
    });
    if (busy.length === 0) return false;
    const rows = this.buckets().find((n) => n > busy[busy.length - 1])!;
    const C = STEP_ROWS.length;
    const [TOKEN, POSITION, TEMPERATURE, TOP_K, TOP_P, MIN_P, UNIFORM] = STEP_ROWS.map((_, c) => c);
    const packed = new Float32Array(rows * C);
    // A free slot decodes the pad token at position 0, greedily (its result is dropped).
    for (let i = 0; i < rows; i++) {
      packed[i * C + TOKEN] = this.opts.padTokenId;
      packed[i * C + TOP_K] = V;
      packed[i * C + TOP_P] = 1;
      packed[i * C + UNIFORM] = 0.5;
    }
    let top = false;
    for (const i of busy) {
      const s = this.state[i]!;
      const at = i * C;
      packed[at + TOKEN] = s.token;
      packed[at + POSITION] = s.position;
      packed[at + TEMPERATURE] = s.row.sampling.temperature ?? 1;
      packed[at + TOP_K] = s.k;
      packed[at + TOP_P] = s.p;
      packed[at + MIN_P] = s.minP;
      packed[at + UNIFORM] = uniformAt(s.row.seed, s.row.key, s.sampled);
      top ||= (s.row.topLogprobs ?? 0) > 0;
    }
    this.leading(rows).step.upload(packed);
    const states = busy.map((i) => this.state[i]!);
    const b = this.variant('decode', this.filterMode(states), top, this.sampler(states, 'decode'), rows).binding!;
    this.opts.beforeRun?.('decode', busy.length);
    b.runSync({ synchronize: false });
    this.inFlight = { binding: b, busy, states, top };
    return true;
  }

  /** Whether a launched step awaits {@link collect}. */
  get stepInFlight(): boolean {
    return this.inFlight !== undefined;
  }

  /** Waits for the launched step and returns the tokens of the slots still busy with the same sequence. */
  collect(): SlotToken[] {
    const f = this.inFlight;
    if (!f) throw new Error('collect: no step in flight (launch one first)');
    this.inFlight = undefined;
    f.binding.synchronize();
    this.checkKernels();
    this.counters.steps++;
    const out = this.read(f.binding, f.busy, f.states.map((s) => s.row.topLogprobs ?? 0), f.top ? this.opts.maxTopLogprobs : 0, (i) => f.busy[i]);
    // A slot released since the launch (and perhaps given to another sequence) keeps its new state.
    const kept = out.filter((t, i) => this.state[t.slot] === f.states[i]);
    for (const t of kept) {
      const s = this.state[t.slot]!;
      s.position++;
      s.token = t.token;
      s.sampled++;
    }
    return kept;
  }

  /** Frees a slot (its cache is overwritten by the next admission). Freeing a free slot is an error. */
  release(slot: number): void {
    if (!this.state[slot]) throw new Error(`release: slot ${slot} is not busy`);
    this.state[slot] = undefined;
    this.freeList.push(slot);
  }

  /**
   * Binds weight tensors by graph input name (with `graphWeights`: the inputs it declared), e.g. a
   * trainer's current parameter buffers — generation then reads them with no copy. Applies to the
   * variants compiled so far and to later ones. Refused with `cudaGraph` (rebinding moves the
   * addresses a captured graph reads).
   */
  bindWeights(...sets: Iterable<readonly [string, DeviceTensor]>[]): void {
    if (this.opts.cudaGraph) throw new Error('bindWeights: a CUDA-graph engine keeps its weight addresses');
    if (this.opts.concatProjections) throw new Error('bindWeights: a concatProjections engine reads the weights it packed at creation');
    const copies = sets.map((s) => [...s]);
    for (const set of copies) for (const [name, t] of set) this.extraWeights.set(name, t);
    for (const v of [...this.prefills.values(), ...this.steps.values()]) for (const set of copies) for (const [name, t] of set) v.binding?.input(name, t);
  }

  /** Releases the sessions and buffers (the weights belong to the model or the caller). */
  dispose(): void {
    this.inFlight?.binding.synchronize();
    this.inFlight = undefined;
    for (const v of [...this.prefills.values(), ...this.steps.values()]) {
      v.binding?.dispose();
      for (const sh of v.shapes?.values() ?? []) {
        sh.binding.dispose();
        for (const t of [...sh.inputs.values(), ...sh.outputs]) t.dispose();
      }
      v.session.dispose();
    }
    this.prefills.clear();
    this.steps.clear();
    for (const v of this.leadingViews.values()) for (const t of [...v.caches, ...v.scales, v.step, v.sampled, v.topLogprobs, v.topIds]) t?.dispose();
    this.leadingViews.clear();
    for (const t of [...this.caches, ...this.scales, ...this.packed.values(), ...Object.values(this.inputs)]) t?.dispose();
  }
}
