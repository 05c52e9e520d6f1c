/**
 * The two graphs of generation as a loop of runs over a KV cache that stays bound on the device
 * (the runtime layer's IoBinding), both built on ONNX Runtime's GroupQueryAttention:
 *
 * - **prefill**: B right-padded prompts → their keys/values, repeated for the group (row r of the
 *   cache holds prompt expand_index[r]) and extended to the cache length M (by a slice of a bound
 *   zero buffer: Pad has no bfloat16 CUDA kernel, and computing pad amounts from shapes would put
 *   nodes on the CPU), written straight into the bound cache buffers; and the first sampled token
 *   of every row.
 * - **decode step**: one token per row → the next one. Each layer's cache is bound as both its
 *   past input and its present output, so GroupQueryAttention appends the new key/value in place
 *   (no cache copies) and attends over each row's own length. The step's bookkeeping (the next
 *   position per row, the step counter that picks the noise column) is computed in the graph, so
 *   a step needs no host input: two bindings over swapped token/position buffers ("ping-pong")
 *   alternate, and each can be replayed as a CUDA graph.
 *
 * Row lengths live in `seqlens` (int32 [R], the GroupQueryAttention convention: the index of each
 * row's newest token). Each step's result is also written into a `history` of the last K steps
 * (column step mod K), carried through the ping-pong buffers like the token, so the host can read K
 * steps' results in one copy and queue the runs in between without waiting for them. Graph inputs
 * and outputs (beyond the weights, named by their HF names):
 *
 *   prefill  in:  input_ids int64 [B, P] (right-padded), seqlens int32 [B] (prompt length − 1),
 *                 last_index int64 [B] (= b·P + seqlens[b]: each prompt's last token in the
 *                 flattened batch, from the host so no shape arithmetic lands on the CPU),
 *                 prompt_width int32 [] (= P, host), cache_start int64 [1] (= P, host),
 *                 cache_tail [R, KV, M, hd] (zeros, device), expand_index int64 [R],
 *                 noise float32 [R, N] (when sampling)
 *            out: present.{i}.key / present.{i}.value [R, KV, M, hd], next_token int64 [R, 1],
 *                 next_seqlens int32 [R], next_step int64 [1], next_history float32 [R, K, 3]
 *                 (step 0's result in column 0, zeros elsewhere); in a 16-bit dtype with a
 *                 float32 residual stream also
 *                 float32.<norm weight> float32 [hidden] (see residualNormWeights)
 *   decode   in:  token int64 [R, 1], seqlens int32 [R], step int64 [1], noise float32 [R, N],
 *                 history float32 [R, K, 3], cache_length int32 [] (= M, host), cache.{i}.key /
 *                 value (bound in place); in a 16-bit dtype with a float32 residual stream the
 *                 prefill's float32.<norm weight>
 *   both, with concatProjections: concat.<group>.weight [hidden, ΣN] (and concat.<group>.bias [ΣN]
 *                 where the model has those biases), written by the pack graph (see concatGroups)
 *            out: the same outputs as prefill, present.{i}.key / value bound to the cache buffers,
 *                 next_history = history with column (step mod K) replaced by this step's result
 *
 *   pack     in:  the weights; out: concat.<group>.weight / bias (once per generate call)
 *
 * A step's result packs what the host reads into one row per sample, so a read costs one
 * device→host copy rather than one per result: the token id (exact in float32, as ids are below
 * 2²⁴), its log-prob under the sampling distribution and under the raw model. `next_token` carries
 * the same ids as int64 for the next step's input and stays on the device.
 */
import * as L from '@lathe/onnx';
import type { DType, Graph, Tensor } from '@lathe/onnx';
import { accumulationDtype, decoder, inferenceLayers, lmLogits, project, ropeCaches, type DecoderConfig, type KvPair, type LayerAttention, type ResidualDtype, type SwigluKernel, type Weights } from '@lathe/models';
import { sampleNext, type SampledTokens, type SamplingOptions } from './sampling';

/** Name of layer i's key or value cache: `cache.*` as a decode input, `present.*` as an output. */
export function cacheName(i: number, which: 'key' | 'value', as: 'input' | 'output'): string {
  return `${as === 'input' ? 'cache' : 'present'}.${i}.${which}`;
}

/** Name of layer i's e4m3 key or value scales [R, KV, M] (an fp8 cache): `cache.*_scale` as a decode input, `present.*_scale` as an output. */
export function cacheScaleName(i: number, which: 'key' | 'value', as: 'input' | 'output'): string {
  return `${cacheName(i, which, as)}_scale`;
}

/**
 * Name of the float32 copy of an RMSNorm weight (see {@link residualNormWeights}) that the prefill
 * writes and the decode step reads: `float32.<hfName>`.
 */
export function float32NormName(hfName: string): string {
  return `float32.${hfName}`;
}

/**
 * The RMSNorm weights a residual add fuses with (each norm after an add: all but the first layer's
 * input norm), which SkipSimplifiedLayerNormalization reads in the float32 residual stream's dtype.
 * In a 16-bit dtype the prefill casts them once per run into buffers the decode steps read, so no
 * step casts them.
 */
export function residualNormWeights(cfg: DecoderConfig): string[] {
  const names: string[] = [];
  for (let i = 0; i < cfg.numLayers; i++) names.push(...(i > 0 ? [`model.layers.${i}.input_layernorm.weight`] : []), `model.layers.${i}.post_attention_layernorm.weight`);
  return [...names, 'model.norm.weight'];
}

/**
 * Whether the graphs carry float32 copies of the norm weights: a 16-bit dtype with the residual norms
 * fused over a float32 residual stream (with `residualDtype` 'compute' the norms read their own weights).
 */
export function float32Norms(dtype: DType, fuseResidualNorm?: boolean, residualDtype?: ResidualDtype): boolean {
  return dtype !== 'float32' && fuseResidualNorm !== false && residualDtype !== 'compute';
}

/** `w` that also answers `float32` for the norm weights from `copies`. */
function withFloat32(w: Weights, copies: Map<string, Tensor>): Weights {
  return Object.assign((name: string) => w(name), w, { float32: (name: string) => copies.get(name) });
}

/**
 * Projections of one layer that read the same input, held concatenated along N under
 * `concatProjections`: `name` the group's module (`….self_attn.qkv_proj`, `….mlp.gate_up_proj`),
 * `members` its projections' modules in output order, `widths` their N, `bias` whether they have biases.
 */
export interface ConcatGroup {
  name: string;
  members: string[];
  widths: number[];
  bias: boolean;
}

/** The {@link ConcatGroup}s of every layer: q/k/v and gate/up. */
export function concatGroups(cfg: DecoderConfig): ConcatGroup[] {
  const groups: ConcatGroup[] = [];
  const { headDim: hd, numHeads: H, numKvHeads: KV, intermediateSize: I } = cfg;
  for (let i = 0; i < cfg.numLayers; i++) {
    const a = `model.layers.${i}.self_attn`;
    const m = `model.layers.${i}.mlp`;
    groups.push({ name: `${a}.qkv_proj`, members: ['q_proj', 'k_proj', 'v_proj'].map((p) => `${a}.${p}`), widths: [H * hd, KV * hd, KV * hd], bias: cfg.attentionBias });
    groups.push({ name: `${m}.gate_up_proj`, members: [`${m}.gate_proj`, `${m}.up_proj`], widths: [I, I], bias: cfg.mlpBias });
  }
  return groups;
}

/** Name of a concatenated group's weight [hidden, ΣN] (laid out for x·W, no transpose) or bias [ΣN]: `concat.<group>.weight` / `.bias`. */
export function concatName(group: ConcatGroup, which: 'weight' | 'bias'): string {
  return `concat.${group.name}.${which}`;
}

/** The tensors the pack graph writes and the other graphs read under `concatProjections`: name and shape. */
export function concatTensors(cfg: DecoderConfig): { name: string; shape: number[] }[] {
  return concatGroups(cfg).flatMap((gr) => {
    const N = gr.widths.reduce((a, b) => a + b, 0);
    return [{ name: concatName(gr, 'weight'), shape: [cfg.hiddenSize, N] }, ...(gr.bias ? [{ name: concatName(gr, 'bias'), shape: [N] }] : [])];
  });
}

/** concatProjections is for dense weights: weights that compute their own projections (`matmul`, a quantized model) already concatenate theirs. */
function refuseOwnProjections(w: Weights): void {
  if (w.matmul) throw new Error('concatProjections: the weights compute their own projections (weights.matmul, e.g. a quantized model, whose kernel path concatenates them itself); it is for dense weights');
}

/**
 * The pack graph: each {@link ConcatGroup}'s weights concatenated along N and transposed to
 * [hidden, ΣN] (and its biases concatenated), as outputs the engine binds to its own buffers.
 * Dense weights only: weights that compute their own projections (`matmul`, a quantized model)
 * already concatenate theirs.
 */
export function addKvPack(g: Graph, cfg: DecoderConfig, weights: Weights): void {
  refuseOwnProjections(weights);
  for (const gr of concatGroups(cfg)) {
    g.output(L.transpose(L.concat(gr.members.map((m) => weights(`${m}.weight`)), 0), [1, 0]), concatName(gr, 'weight'));
    if (gr.bias) g.output(L.concat(gr.members.map((m) => weights(`${m}.bias`)), 0), concatName(gr, 'bias'));
  }
}

/**
 * `x` split along its last axis into parts of `widths` (static) with ops whose CUDA kernels take
 * their tables in the launch's arguments, so a captured CUDA graph replays them safely (see
 * `hostTableNodes` in @lathe/onnx): ONNX Runtime's Split and Concat pass up to 32 equal parts'
 * addresses by value but copy tables from the host for unequal parts, and its Slice passes starts
 * and strides by value. Equal widths are one Split; widths that are multiples of a common unit
 * (q/k/v: H·hd, KV·hd, KV·hd with unit KV·hd) are one Split into equal units plus one Concat per
 * part of several units (two kernels where three Slices would take three); others are one Slice
 * each.
 */
export function replaySafeSplit(x: Tensor, widths: number[]): Tensor[] {
  if (widths.length < 2) return [x];
  const gcd = (a: number, b: number): number => (b === 0 ? a : gcd(b, a % b));
  const unit = widths.reduce(gcd);
  const units = widths.map((w) => w / unit);
  const count = units.reduce((a, b) => a + b, 0);
  if (count <= 32) {
    const parts = L.split(x, count === widths.length ? widths : new Array<number>(count).fill(unit), -1);
    if (count === widths.length) return parts;
    let at = 0;
    return units.map((n) => L.concat(parts.slice(at, (at += n)), -1));
  }
  let at = 0;
  return widths.map((w) => L.slice(x, [-1], [at], [(at += w)]));
}

/**
 * `w` whose `matmul` runs each {@link ConcatGroup} as one MatMul over its concatenated weight (plus
 * its concatenated bias) and one {@link replaySafeSplit}, read from inputs `concat.*` in `dtype`:
 * the members asked with the same input reuse the outputs. Its `packed` returns a group's MatMul
 * output itself, for kernels that read the parts in place: the split is built only when a member is
 * asked through `matmul`, so a graph whose consumers all take the packed output has no Split or
 * Concat. Other projections go to `w`'s own `matmul`, if any.
 */
export function withConcatProjections(g: Graph, cfg: DecoderConfig, w: Weights, dtype: DType): Weights {
  refuseOwnProjections(w);
  const shapes = new Map(concatTensors(cfg).map((t) => [t.name, t.shape]));
  const read = (name: string) => g.input(name, dtype, shapes.get(name)!);
  const tensors = new Map<ConcatGroup, { weight: Tensor; bias?: Tensor }>();
  const byName = new Map<string, ConcatGroup>();
  const member = new Map<string, { group: ConcatGroup; index: number }>();
  for (const gr of concatGroups(cfg)) {
    tensors.set(gr, { weight: read(concatName(gr, 'weight')), ...(gr.bias ? { bias: read(concatName(gr, 'bias')) } : {}) });
    byName.set(gr.name, gr);
    gr.members.forEach((m, index) => member.set(`${m}.weight`, { group: gr, index }));
  }
  // Each group's last MatMul (+ bias) and, once a member asked for it, its split.
  type Projected = { x: Tensor; y: Tensor; outs?: Tensor[] };
  const done = new Map<ConcatGroup, Projected>();
  const projectGroup = (gr: ConcatGroup, x: Tensor): Projected => {
    const hit = done.get(gr);
    if (hit && hit.x === x) return hit;
    const { weight, bias } = tensors.get(gr)!;
    const y = L.matmul(x, weight);
    const entry: Projected = { x, y: bias ? L.add(y, bias) : y };
    done.set(gr, entry);
    return entry;
  };
  const matmul = (name: string, x: Tensor): Tensor | undefined => {
    const m = member.get(name);
    if (!m) return undefined;
    const entry = projectGroup(m.group, x);
    entry.outs ??= replaySafeSplit(entry.y, m.group.widths);
    return entry.outs[m.index];
  };
  // A side branch (LoRA) adds a term to each member's output, which the packed output would miss.
  const packed = (group: 'qkv' | 'gate_up', prefix: string, x: Tensor): Tensor | undefined => {
    const gr = w.branch ? undefined : byName.get(`${prefix}.${group === 'qkv' ? 'qkv_proj' : 'gate_up_proj'}`);
    return gr && projectGroup(gr, x).y;
  };
  return Object.assign((name: string) => w(name), w, { matmul, packed, biasInMatmul: (name: string) => member.get(name)?.group.bias === true });
}

/** A decode-attention node's inputs besides the projections: the layer's cache (and e4m3 scales), lengths, RoPE tables and Q/K norm. */
export interface KvAttendInputs {
  cacheKey: Tensor;
  cacheValue: Tensor;
  keyScale?: Tensor;
  valueScale?: Tensor;
  seqlens: Tensor;
  rotary: { cos: Tensor; sin: Tensor };
  qkNorm?: { q: Tensor; k: Tensor };
}

/** A decode-attention node's outputs: the attention and the layer's cache (and e4m3 scales) as presents. */
export interface KvAttendOutputs {
  output: Tensor;
  presentKey: Tensor;
  presentValue: Tensor;
  presentKeyScale?: Tensor;
  presentValueScale?: Tensor;
}

/**
 * A decode-attention kernel for the decode step in place of GroupQueryAttention (Lathe's, from
 * `decodeAttentionOps` in @lathe/kernels, which this layer does not import): one node per layer takes
 * the projected q/k/v before QK-norm and RoPE, appends the new key/value into the layer's cache in
 * place and attends over each row's length. With an e4m3 cache (`cache: 'float8e4m3'`) the caches
 * are uint8 with float32 scales [R, KV, M] per layer, and the prefill writes them through `quantize`.
 */
export interface KvDecodeAttention {
  /** How the cache is held. */
  cache: 'native' | 'float8e4m3';
  /** The cache tensors' element type for a compute dtype (uint8 for e4m3). */
  cacheDtype(dtype: DType): DType;
  /** The RMSNorm epsilon the node applies with `qkNorm` (must be the model's). */
  qkNormEpsilon: number;
  /** The custom-op domain its nodes belong to (added to both sessions). */
  domain: { handle: bigint };
  attend(x: KvAttendInputs & { query: Tensor; key: Tensor; value: Tensor }, heads: { numHeads: number; kvNumHeads: number }): KvAttendOutputs;
  /**
   * {@link attend} on one packed qkv [R, 1, (H + 2·KV)·headDim] (q, k, v in that order: the layer's
   * q/k/v as one MatMul under `concatProjections`), read in place; the decode step uses it where the
   * weights have the packed projection.
   */
  attendPacked?(x: KvAttendInputs & { qkv: Tensor }, heads: { numHeads: number; kvNumHeads: number }): KvAttendOutputs;
  /** e4m3 bytes and scales of a cache in the compute dtype (the prefill's presents). */
  quantize(x: Tensor): { data: Tensor; scale: Tensor };
  /** Rethrows an error one of its nodes raised during the last run. */
  check(): void;
}

/**
 * A SwiGLU kernel for the decode step's MLPs in place of QuickGelu and Mul (Lathe's: `swigluOps` of
 * @lathe/kernels, which this layer does not import): one node a layer where ONNX Runtime runs two.
 */
export interface KvSwiglu {
  /** silu(gate)·up for gate and up of one shape and dtype. */
  apply: SwigluKernel;
  /** The custom-op domain its nodes belong to (added to both sessions). */
  domain: { handle: bigint };
  /** Rethrows an error one of its nodes raised during the last run. */
  check(): void;
}

/**
 * A fused greedy pick for both graphs' token choice at temperature 0 (Lathe's: `greedyPickOps` of
 * @lathe/kernels, which this layer does not import): the LM head's logits in their own dtype in, each
 * row's first-argmax token and its log-probability out, in place of the float32 Cast, `firstArgMax`,
 * LogSoftmax and gather of `sampleNext`'s greedy path. Graphs that sample (temperature > 0) ignore it.
 */
export interface KvGreedyPick {
  /** Logits [R, V] → tokens int64 [R] (the first maximum of each row) and their log-probabilities float32 [R]. */
  apply(logits: Tensor): { tokens: Tensor; logprobs: Tensor };
  /** The custom-op domain its nodes belong to (added to both sessions). */
  domain: { handle: bigint };
  /** Rethrows an error one of its nodes raised during the last run. */
  check(): void;
}

/** Columns of a step's result in the history, per row. */
export const SAMPLED_COLUMNS = ['token', 'logprob', 'raw_logprob'] as const;

/**
 * Samples the next token and writes `next_token` and `next_history`: `history` [R, K, 3] (zeros
 * when absent) with column (step mod K) replaced by this step's [token, logprob, raw_logprob].
 */
function emitStep(g: Graph, cfg: DecoderConfig, weights: Weights, lastHidden: Tensor, noiseColumn: Tensor | undefined, opts: SamplingOptions, at: { step: Tensor; history?: Tensor; K: number }, expand?: Tensor, pick?: KvGreedyPick): void {
  if (cfg.vocabSize >= 2 ** 24) throw new Error(`KV-cache generation: vocab_size ${cfg.vocabSize} ≥ 2²⁴: token ids would not be exact in the float32 history`);
  const fused = pick && !sampling(opts) ? pick : undefined;
  let logits = L.squeeze(lmLogits(cfg, weights, lastHidden), [1]); // [rows, V]
  if (!fused) logits = L.cast(logits, 'float32'); // the fused pick reads the LM head's own dtype
  if (expand) logits = L.gather(logits, expand, 0);
  const s = fused ? pickedGreedily(fused, logits) : sampleNext(logits, opts, noiseColumn);
  g.output(L.unsqueeze(s.tokens, [1]), 'next_token');
  const column = (t: Tensor) => L.unsqueeze(t, [1]);
  const result = L.unsqueeze(L.concat([column(L.cast(s.tokens, 'float32')), column(s.logprobs), column(s.rawLogprobs)], 1), [1]); // [R, 1, 3]
  const slot = L.mod(at.step, g.constant(at.K, 'int64', [])); // [1]
  const here = L.unsqueeze(L.equal(g.constant(Array.from({ length: at.K }, (_, i) => i), 'int64', [at.K]), slot), [0, 2]); // [1, K, 1]
  g.output(L.where(here, result, at.history ?? g.constant(0, 'float32', [])), 'next_history');
}

const sampling = (o: SamplingOptions) => (o.temperature ?? 1) !== 0;

/**
 * `sampleNext`'s greedy result from a fused pick: at temperature 0 no filter changes the scores, so
 * the sampled and the raw log-prob are one value.
 */
function pickedGreedily(pick: KvGreedyPick, logits: Tensor): SampledTokens {
  const { tokens, logprobs } = pick.apply(logits);
  return { tokens, logprobs, rawLogprobs: logprobs };
}

/**
 * Whether GroupQueryAttention takes the concatenated q/k/v packed (`packedQkv` of the decoder inputs):
 * on unless LATHE_GQA_PACKED_QKV=0, the way back to split q, k and v should a build of ONNX Runtime
 * refuse the packed form with the in-kernel Q/K norm.
 */
const gqaPackedQkv = (): boolean => process.env.LATHE_GQA_PACKED_QKV !== '0';

/** How the two graphs are built beyond the model and sampling. */
export interface KvGraphOptions {
  /** The history's width: steps per host read. */
  K: number;
  /** Qwen3's Q/K norm inside GroupQueryAttention's kernel (CUDA only; see `GqaDecoderInputs`). */
  qkNormInKernel?: boolean;
  /**
   * The engine's row count, when fixed: the graphs' R is then a static dim, which lets top-p without
   * a two-stage top-k sort all rows at once (`nucleusOneSort` in sampling.ts). Default: symbolic.
   */
  rows?: number;
  /** The decode step's attention through this kernel rather than GroupQueryAttention (see {@link KvDecodeAttention}). */
  decodeAttention?: KvDecodeAttention;
  /** Residual adds fused into the next RMSNorm (`fuseResidualNorm` of `GqaDecoderInputs`; default on). */
  fuseResidualNorm?: boolean;
  /** The residual stream's dtype (`residualDtype` of `GqaDecoderInputs`; default 'float32'). */
  residualDtype?: ResidualDtype;
  /** The prefill's and the decode step's SwiGLU activations through this kernel rather than QuickGelu and Mul (see {@link KvSwiglu}). */
  swiglu?: KvSwiglu;
  /** q/k/v and gate/up as one MatMul each over the pack graph's concatenated weights (inputs `concat.*`; see {@link concatGroups}). */
  concatProjections?: boolean;
  /** Greedy graphs' token pick through this op rather than `sampleNext` (see {@link KvGreedyPick}); sampling graphs ignore it. */
  greedyPick?: KvGreedyPick;
}

/** The prefill graph (see the module comment). */
export function addKvPrefill(g: Graph, cfg: DecoderConfig, weights: Weights, dtype: DType, opts: SamplingOptions, { K, qkNormInKernel, rows, decodeAttention, fuseResidualNorm, residualDtype, swiglu, concatProjections, greedyPick }: KvGraphOptions): void {
  const R = rows ?? 'R';
  const ids = g.input('input_ids', 'int64', ['B', 'P']);
  const seqlens = g.input('seqlens', 'int32', ['B']);
  const lastIndex = g.input('last_index', 'int64', ['B']);
  const width = g.input('prompt_width', 'int32', []);
  const cacheStart = g.input('cache_start', 'int64', [1]);
  const zeros = g.input('cache_tail', dtype, [R, cfg.numKvHeads, 'M', cfg.headDim]);
  const expand = g.input('expand_index', 'int64', [R]);
  const noise = sampling(opts) ? g.input('noise', 'float32', [R, 'N']) : undefined;
  if (float32Norms(dtype, fuseResidualNorm, residualDtype)) {
    const copies = new Map(residualNormWeights(cfg).map((n) => [n, L.cast(weights(n), 'float32')]));
    for (const [n, t] of copies) g.output(t, float32NormName(n));
    weights = withFloat32(weights, copies);
  }
  if (concatProjections) weights = withConcatProjections(g, cfg, weights, dtype);

  const out = decoder(cfg, weights, { inputIds: ids, seqlensK: seqlens, totalSequenceLength: width, qkNormInKernel, packedQkv: gqaPackedQkv(), fuseResidualNorm, residualDtype, swigluKernel: swiglu?.apply });
  const axis = g.constant([2], 'int64', [1]);
  const spec = { axes: [2], starts: ['P'], ends: [Number.MAX_SAFE_INTEGER], steps: [1] };
  const tail = L.applyOp(L.sliceOp, [zeros, cacheStart, g.constant([Number.MAX_SAFE_INTEGER], 'int64', [1]), axis, g.constant([1], 'int64', [1])], spec)[0];
  const fp8 = decodeAttention?.cache === 'float8e4m3';
  out.present.forEach((p, i) => {
    for (const which of ['key', 'value'] as const) {
      const full = L.concat([L.gather(p[which], expand, 0), tail], 2);
      if (!fp8) {
        g.output(full, cacheName(i, which, 'output'));
        continue;
      }
      const q = decodeAttention.quantize(full);
      g.output(q.data, cacheName(i, which, 'output'));
      g.output(q.scale, cacheScaleName(i, which, 'output'));
    }
  });
  const last = L.unsqueeze(L.gather(L.reshape(out.hidden, [-1, cfg.hiddenSize]), lastIndex, 0), [1]); // [B, 1, D]
  emitStep(g, cfg, weights, last, noise && L.squeeze(L.slice(noise, [1], [0], [1]), [1]), opts, { step: g.constant([0], 'int64', [1]), K }, expand, greedyPick);
  g.output(L.add(L.gather(seqlens, expand, 0), g.constant(1, 'int32', [])), 'next_seqlens');
  g.output(g.constant([1], 'int64', [1]), 'next_step');
}

/** The decode-step graph (see the module comment). */
export function addKvDecodeStep(g: Graph, cfg: DecoderConfig, weights: Weights, dtype: DType, opts: SamplingOptions, { K, qkNormInKernel, rows, decodeAttention, fuseResidualNorm, residualDtype, swiglu, concatProjections, greedyPick }: KvGraphOptions): void {
  const R = rows ?? 'R';
  const token = g.input('token', 'int64', [R, 1]);
  const seqlens = g.input('seqlens', 'int32', [R]);
  const step = g.input('step', 'int64', [1]);
  const history = g.input('history', 'float32', [R, K, SAMPLED_COLUMNS.length]);
  const noise = sampling(opts) ? g.input('noise', 'float32', [R, 'N']) : undefined;
  const cacheLength = g.input('cache_length', 'int32', []);
  const past: KvPair[] = [];
  const cacheDtype = decodeAttention ? decodeAttention.cacheDtype(dtype) : dtype;
  if (float32Norms(dtype, fuseResidualNorm, residualDtype)) weights = withFloat32(weights, new Map(residualNormWeights(cfg).map((n) => [n, g.input(float32NormName(n), 'float32', [cfg.hiddenSize])])));
  if (concatProjections) weights = withConcatProjections(g, cfg, weights, dtype);
  for (let i = 0; i < cfg.numLayers; i++) {
    const shape = [R, cfg.numKvHeads, 'M', cfg.headDim];
    past.push({ key: g.input(cacheName(i, 'key', 'input'), cacheDtype, shape), value: g.input(cacheName(i, 'value', 'input'), cacheDtype, shape) });
  }
  const out: { present: KvPair[]; hidden: Tensor; scales?: KvPair[] } = decodeAttention
    ? kvKernelDecoder(g, cfg, weights, dtype, { token, seqlens, past, R, fuseResidualNorm, residualDtype, swigluKernel: swiglu?.apply }, decodeAttention)
    : decoder(cfg, weights, { inputIds: token, seqlensK: seqlens, totalSequenceLength: cacheLength, past, qkNormInKernel, packedQkv: gqaPackedQkv(), fuseResidualNorm, residualDtype, swigluKernel: swiglu?.apply });
  out.present.forEach((p, i) => {
    g.output(p.key, cacheName(i, 'key', 'output'));
    g.output(p.value, cacheName(i, 'value', 'output'));
    const sc = out.scales?.[i];
    if (sc) {
      g.output(sc.key, cacheScaleName(i, 'key', 'output'));
      g.output(sc.value, cacheScaleName(i, 'value', 'output'));
    }
  });
  emitStep(g, cfg, weights, out.hidden, noise && L.squeeze(L.gather(noise, step, 1), [1]), opts, { step, history, K }, undefined, greedyPick);
  g.output(L.add(seqlens, g.constant(1, 'int32', [])), 'next_seqlens');
  g.output(L.add(step, g.constant(1, 'int64', [])), 'next_step');
}

/**
 * The decoder of a decode step (one token per row) with `da`'s attention: embeddings, then the
 * layers and final norm of `inferenceLayers` (fused norms and MLP, as the GroupQueryAttention graph has them). Each
 * layer's node reads the projections before QK-norm and RoPE (the packed q/k/v through `attendPacked`
 * where the weights have it), the layer's cache (and, for e4m3, its scale inputs `cache.{i}.*_scale`),
 * and returns the cache (and scales) as its presents.
 */
export function kvKernelDecoder(
  g: Graph,
  cfg: DecoderConfig,
  w: Weights,
  dtype: DType,
  x: { token: Tensor; seqlens: Tensor; past: KvPair[]; R: number | string; fuseResidualNorm?: boolean; residualDtype?: ResidualDtype; swigluKernel?: SwigluKernel },
  da: KvDecodeAttention,
): { hidden: Tensor; present: KvPair[]; scales?: KvPair[] } {
  if (cfg.qkNorm && Math.abs(da.qkNormEpsilon - cfg.rmsNormEps) > 1e-12 * Math.max(1, cfg.rmsNormEps)) {
    throw new Error(`decodeAttention: its Q/K norm epsilon ${da.qkNormEpsilon} is not the model's rms_norm_eps ${cfg.rmsNormEps}`);
  }
  const fp8 = da.cache === 'float8e4m3';
  const rotary = ropeCaches(cfg, g, dtype);
  const scaleShape = [x.R, cfg.numKvHeads, 'M'];
  const scales: KvPair[] = [];
  const heads = { numHeads: cfg.numHeads, kvNumHeads: cfg.numKvHeads };
  let layer = 0;
  const attend: LayerAttention = (h, prefix, past) => {
    const i = layer++;
    const scale = fp8 ? { key: g.input(cacheScaleName(i, 'key', 'input'), 'float32', scaleShape), value: g.input(cacheScaleName(i, 'value', 'input'), 'float32', scaleShape) } : undefined;
    const rest: KvAttendInputs = {
      cacheKey: past!.key,
      cacheValue: past!.value,
      keyScale: scale?.key,
      valueScale: scale?.value,
      seqlens: x.seqlens,
      rotary,
      qkNorm: cfg.qkNorm ? { q: w(`${prefix}.q_norm.weight`), k: w(`${prefix}.k_norm.weight`) } : undefined,
    };
    // The packed q/k/v (concatProjections) goes to the kernel as it is, with no Split.
    const qkv = da.attendPacked ? w.packed?.('qkv', prefix, h) : undefined;
    const r =
      qkv && da.attendPacked
        ? da.attendPacked({ ...rest, qkv }, heads)
        : da.attend({ ...rest, query: project(w, `${prefix}.q_proj`, h, cfg.attentionBias), key: project(w, `${prefix}.k_proj`, h, cfg.attentionBias), value: project(w, `${prefix}.v_proj`, h, cfg.attentionBias) }, heads);
    if (fp8) scales.push({ key: r.presentKeyScale!, value: r.presentValueScale! });
    return { out: project(w, `${prefix}.o_proj`, r.output, cfg.outputBias), present: { key: r.presentKey, value: r.presentValue } };
  };
  const embedded = L.gather(w('model.embed_tokens.weight'), x.token, 0);
  const h = x.residualDtype === 'compute' ? embedded : L.cast(embedded, accumulationDtype(embedded.dtype));
  const out = inferenceLayers(cfg, w, h, attend, x.past, x.fuseResidualNorm ?? true, x.swigluKernel);
  return { ...out, ...(fp8 ? { scales } : {}) };
}
