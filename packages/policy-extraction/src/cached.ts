/**
 * Q-weighted sampling over KV caches: each model keeps its keys and values on the device, so a step
 * runs one token per row through the reference policy and 1 + K tokens per row through the critic
 * (the token drawn last step, then the K candidates of this one) instead of the whole prefix again.
 *
 * Each model's cache is allocated once per sampling call at its final size, [rows, kvHeads, M,
 * headDim] per layer with M the call's longest prefix plus its new tokens (plus K for the critic),
 * and every run writes into it in place: its `cache.*` inputs and `present.*` outputs are bound to
 * the same buffers and the outputs are ScatterND over the inputs, as in the slot engine's prefill
 * (@lathe/rollout's slot-graphs.ts). So memory stays one cache per model however many steps run,
 * and no run allocates a cache-sized tensor that outlives it (ONNX Runtime's arena would otherwise
 * keep one more size class per step).
 *
 * Row b's token at position p sits in slot p, so the slots below the row's next position hold its
 * tokens and the rest are masked. A step writes its tokens' keys into the slots from that position
 * on, then attends over the cache (composed MatMul/Softmax, read once, never copied) under a mask
 * the host writes: the row's filled slots, then the step's tokens — for the critic, the drawn token
 * sees the cache and itself, and each candidate sees the cache, the drawn token and itself (tree
 * attention, as in `criticTreeProbs`). The candidates' slots are scratch: the next step's tokens
 * overwrite them, so only the drawn token stays in the critic's cache.
 *
 * The prefill reads each row's prefix but its last token, which becomes the first step's token, so
 * every step has the same shape. Rows keep their place for the whole batch: a row that stopped is
 * fed its padding token until the batch ends (its results are ignored), and a batch smaller than
 * the caches' rows is filled with one-token padding rows.
 */
import * as L from '@lathe/onnx';
import type { DType, Graph, Tensor } from '@lathe/onnx';
import { accumulationDtype, decoder, decoderLayer, lmLogits, paddedCausalMask, positionsFromPadding, project, restrictedLogits, rmsNormHf, rope, weightInputs, type DecoderConfig, type KvPair, type LayerAttention, type Rope, type Weights } from '@lathe/models';
import type { Device, DeviceTensor, HostTensor, Session } from '@lathe/runtime';
import { cacheName } from '@lathe/rollout';
import { gridShape, marginals, minPCandidates, type CriticBins } from '@lathe/critic';
import type { CandidateEstimate, Candidates, SessionLimits, StepSession } from './sampler';

const cacheInput = (i: number, which: 'key' | 'value') => cacheName(i, which, 'input');
const cacheOutput = (i: number, which: 'key' | 'value') => cacheName(i, which, 'output');

/** The cache buffers as graph inputs [B, KV, M, hd], one pair per layer. */
function cacheInputs(g: Graph, cfg: DecoderConfig, dtype: DType): KvPair[] {
  return Array.from({ length: cfg.numLayers }, (_, i) => ({
    key: g.input(cacheInput(i, 'key'), dtype, ['B', cfg.numKvHeads, 'M', cfg.headDim]),
    value: g.input(cacheInput(i, 'value'), dtype, ['B', cfg.numKvHeads, 'M', cfg.headDim]),
  }));
}

/** Writes `fresh` [B, KV, T, hd] into each layer's cache at `index` [B, KV, T, 3]: outputs bound to the input buffers, so in place. */
function writeCaches(g: Graph, caches: KvPair[], index: Tensor, fresh: (i: number, which: 'key' | 'value') => Tensor): void {
  caches.forEach((c, i) => {
    for (const which of ['key', 'value'] as const) g.output(L.scatterND(c[which], index, fresh(i, which)), cacheOutput(i, which));
  });
}

/** The prefill: right-padded prefixes → every layer's keys and values, written into slots 0…P−1. */
function prefillGraph(name: string, cfg: DecoderConfig, compute: DType): Graph {
  const g = new L.Graph(name);
  const { weights } = weightInputs(g, cfg, 'float32', compute);
  const ids = g.input('input_ids', 'int64', ['B', 'P']);
  const mask = g.input('attention_mask', 'int64', ['B', 'P']);
  const index = g.input('scatter_index', 'int64', ['B', cfg.numKvHeads, 'P', 3]);
  const caches = cacheInputs(g, cfg, compute);
  const out = decoder(cfg, weights, { inputIds: ids, positionIds: positionsFromPadding(mask), attentionMask: paddedCausalMask(mask) });
  writeCaches(g, caches, index, (i, which) => out.present[i][which]);
  return g;
}

/**
 * One layer's attention for a step of T tokens per row: their keys and values are written into the
 * cache at `index` [B, KV, T, 3] (in place), then every query attends over the whole cache under
 * `mask` [B, 1, T, M] — so the cache is read once, never copied. Projections, Q/K norm, RoPE and
 * the float32 softmax are the decoder's composed attention (`attention` in @lathe/models).
 */
function cacheAttention(cfg: DecoderConfig, w: Weights, rotary: Rope, mask: Tensor, index: Tensor, write: (which: 'key' | 'value', t: Tensor) => void): LayerAttention {
  const { numHeads: H, numKvHeads: KV, headDim: hd } = cfg;
  const G = H / KV;
  return (x, prefix, past) => {
    if (!past) throw new Error('cacheAttention: no cache');
    const [B, T] = x.shape;
    const proj = (name: string) => project(w, `${prefix}.${name}`, x, cfg.attentionBias);
    let q = L.reshape(proj('q_proj'), [B, T, H, hd]);
    let k = L.reshape(proj('k_proj'), [B, T, KV, hd]);
    if (cfg.qkNorm) {
      q = rmsNormHf(q, w(`${prefix}.q_norm.weight`), cfg.rmsNormEps);
      k = rmsNormHf(k, w(`${prefix}.k_norm.weight`), cfg.rmsNormEps);
    }
    const v = L.transpose(L.reshape(proj('v_proj'), [B, T, KV, hd]), [0, 2, 1, 3]);
    const key = L.scatterND(past.key, index, rotary(L.transpose(k, [0, 2, 1, 3])));
    const value = L.scatterND(past.value, index, v);
    write('key', key);
    write('value', value);
    // the G query heads of a KV head and the T tokens are the rows of one batched matmul against
    // the cache, [B, KV, G·T, hd] · [B, KV, hd, M]: no broadcast over the cache
    const qg = L.reshape(rotary(L.transpose(q, [0, 2, 1, 3])), [B, KV, G * Number(T), hd]);
    const scores = L.mul(L.cast(L.matmul(qg, L.transpose(key, [0, 1, 3, 2])), accumulationDtype(x.dtype)), 1 / Math.sqrt(hd));
    const probs = L.maskedSoftmax(L.reshape(scores, [B, KV, G, T, key.shape[2]]), L.unsqueeze(mask, [1])); // [B, KV, G, T, M]
    const ctx = L.matmul(L.cast(L.reshape(probs, [B, KV, G * Number(T), key.shape[2]]), x.dtype), value); // [B, KV, G·T, hd]
    const merged = L.reshape(L.transpose(L.reshape(ctx, [B, H, T, hd]), [0, 2, 1, 3]), [B, T, H * hd]);
    return { out: project(w, `${prefix}.o_proj`, merged, cfg.outputBias), present: { key, value } };
  };
}

/**
 * A step's decoder over `T` tokens per row (static): each token's keys and values are written into
 * the cache at `scatter_index` [B, KV, T, 3] and every token attends over the cache under
 * `attention_mask` [B, 1, T, M]. Returns the weights and the final hidden states [B, T, D].
 */
function stepDecoder(g: Graph, cfg: DecoderConfig, compute: DType, T: number) {
  const { weights } = weightInputs(g, cfg, 'float32', compute);
  const ids = g.input('input_ids', 'int64', ['B', T]);
  const positions = g.input('position_ids', 'int64', ['B', T]);
  const mask = g.input('attention_mask', 'bool', ['B', 1, T, 'M']);
  const index = g.input('scatter_index', 'int64', ['B', cfg.numKvHeads, T, 3]);
  const caches = cacheInputs(g, cfg, compute);
  const rotary = rope(cfg, positions, compute);
  let h = L.cast(L.gather(weights('model.embed_tokens.weight'), ids, 0), accumulationDtype(compute));
  for (let i = 0; i < cfg.numLayers; i++) {
    const attend = cacheAttention(cfg, weights, rotary, mask, index, (which, t) => g.output(t, cacheOutput(i, which)));
    const input = h;
    h = g.scope(`layer${i}`, () => decoderLayer(cfg, weights, i, input, attend, caches[i]).hidden);
  }
  return { weights, hidden: rmsNormHf(h, weights('model.norm.weight'), cfg.rmsNormEps) };
}

/** The reference's step: one token per row → the cache extended in place and the next token's top-k log-probs. */
function referenceStepGraph(cfg: DecoderConfig, compute: DType, k: number): Graph {
  const g = new L.Graph('extract_reference_step');
  const { weights, hidden } = stepDecoder(g, cfg, compute, 1);
  const logits = L.cast(L.squeeze(lmLogits(cfg, weights, hidden), [1]), 'float32');
  const [values, indices] = L.topK(L.logSoftmax(logits, -1), Math.min(k, cfg.vocabSize), -1);
  g.output(values, 'top_logprobs');
  g.output(indices, 'top_ids');
  g.output(L.entropy(logits), 'entropies');
  return g;
}

/** The critic's step: the drawn token and K candidate slots per row → the cache extended in place by the drawn token only, and the grid distribution of every token. */
function criticStepGraph(cfg: DecoderConfig, bins: CriticBins, compute: DType, k: number): Graph {
  const g = new L.Graph('extract_critic_step');
  const { weights, hidden } = stepDecoder(g, cfg, compute, 1 + k);
  g.output(L.softmax(L.cast(restrictedLogits(cfg, weights, hidden, bins.first_token_id, gridShape(bins).cells), 'float32'), -1), 'cell_probs');
  return g;
}

/** The compiled graphs of both models (weights uploaded by the caller, {@link QWeightedModels}). */
export interface CachedGraphs {
  referencePrefill: Session;
  referenceStep: Session;
  criticPrefill: Session;
  criticStep: Session;
}

/** Compiles the four cached graphs; `k` is the candidate slots per step (`maxCandidates`). */
export function compileCachedGraphs(device: Device, reference: DecoderConfig, critic: DecoderConfig, bins: CriticBins, compute: DType, k: number): CachedGraphs {
  return {
    referencePrefill: device.compile(prefillGraph('extract_reference_prefill', reference, compute)),
    referenceStep: device.compile(referenceStepGraph(reference, compute, k)),
    criticPrefill: device.compile(prefillGraph('extract_critic_prefill', critic, compute)),
    criticStep: device.compile(criticStepGraph(critic, bins, compute, k)),
  };
}

/** One model's cache buffers: layer i's keys at 2i, its values at 2i + 1, each [rows, KV, M, hd]. */
export interface CacheBuffers {
  rows: number;
  /** Positions per row. */
  length: number;
  tensors: DeviceTensor[];
}

/** Allocates one model's caches (zeros, in the compute dtype). */
export function allocateCaches(device: Device, cfg: DecoderConfig, compute: DType, rows: number, length: number): CacheBuffers {
  const tensors: DeviceTensor[] = [];
  try {
    for (let i = 0; i < 2 * cfg.numLayers; i++) tensors.push(device.zeros(compute, [rows, cfg.numKvHeads, length, cfg.headDim]));
  } catch (e) {
    for (const t of tensors) t.dispose();
    const gib = (2 * cfg.numLayers * rows * cfg.numKvHeads * length * cfg.headDim * L.dtypeBytes(compute)) / 2 ** 30;
    throw new Error(`Q-weighted sampling: allocating KV caches of ${rows} rows × ${length} positions (${gib.toFixed(2)} GiB in ${compute}) failed; lower the batch size or max tokens. ${e instanceof Error ? e.message : String(e)}`);
  }
  return { rows, length, tensors };
}

/** Runs a session with the caches bound in place (inputs and outputs one buffer) and the other outputs brought to the host. */
async function runInPlace(session: Session, feeds: Record<string, DeviceTensor | HostTensor>, cfg: DecoderConfig, caches: CacheBuffers, onHost: readonly string[]): Promise<Record<string, HostTensor>> {
  const b = session.binding();
  try {
    for (const [name, t] of Object.entries(feeds)) b.input(name, t);
    for (let i = 0; i < cfg.numLayers; i++) {
      for (const [j, which] of (['key', 'value'] as const).entries()) {
        const t = caches.tensors[2 * i + j];
        b.input(cacheInput(i, which), t).output(cacheOutput(i, which), t);
      }
    }
    for (const n of onHost) b.output(n, 'host');
    await b.run();
    return Object.fromEntries(onHost.map((n) => [n, b.fetch(n)]));
  } finally {
    b.dispose();
  }
}

/** The host's scatter index [B, KV, T, 3]: row b, head h, token t goes to slot `slot(b, t)`. */
function scatterIndex(B: number, kvHeads: number, T: number, slot: (b: number, t: number) => number): HostTensor {
  const data = new BigInt64Array(B * kvHeads * T * 3);
  for (let b = 0; b < B; b++) {
    for (let h = 0; h < kvHeads; h++) {
      for (let t = 0; t < T; t++) {
        const at = ((b * kvHeads + h) * T + t) * 3;
        data[at] = BigInt(b);
        data[at + 1] = BigInt(h);
        data[at + 2] = BigInt(slot(b, t));
      }
    }
  }
  return { data, dims: [B, kvHeads, T, 3] };
}

/** One model's state for a batch: its cache, each row's next position (= its filled slots) and the token waiting to enter. */
class ModelCache {
  /** Per row: the next token's position, which is also its cache slot; the slots below it hold the row's tokens. */
  readonly position: number[];
  /** Per row: the token the next step reads first. */
  readonly pending: number[];

  constructor(
    readonly cfg: DecoderConfig,
    readonly weights: Record<string, DeviceTensor>,
    readonly caches: CacheBuffers,
    prefixes: readonly (readonly number[])[],
    private readonly padId: number,
    what: string,
  ) {
    prefixes.forEach((p, b) => {
      if (p.length > caches.length) throw new Error(`Q-weighted sampling: the ${what} of row ${b} has ${p.length} tokens, more than the ${caches.length} cache positions`);
    });
    this.position = prefixes.map((p) => p.length - 1);
    this.pending = prefixes.map((p) => p[p.length - 1]);
  }

  /** Runs the prefill over each prefix but its last token, into slots 0…P−1 of every row. */
  async prefill(session: Session, prefixes: readonly (readonly number[])[]): Promise<void> {
    const heads = prefixes.map((p) => p.slice(0, -1));
    const B = heads.length;
    const P = Math.max(1, ...heads.map((h) => h.length));
    const ids = new BigInt64Array(B * P).fill(BigInt(this.padId));
    const mask = new BigInt64Array(B * P);
    heads.forEach((h, b) => h.forEach((id, t) => ((ids[b * P + t] = BigInt(id)), (mask[b * P + t] = 1n))));
    const feeds = { ...this.weights, input_ids: { data: ids, dims: [B, P] }, attention_mask: { data: mask, dims: [B, P] }, scatter_index: scatterIndex(B, this.cfg.numKvHeads, P, (_b, t) => t) };
    await runInPlace(session, feeds, this.cfg, this.caches, []);
  }

  /**
   * The step's inputs for T tokens per row, written to the slots from the row's next position on
   * (past the pending token, scratch slots the next steps overwrite), and a mask of the row's
   * filled slots, then the step's tokens (`own(q, s)`: query q may attend step token s).
   */
  stepFeeds(ids: BigInt64Array, positions: BigInt64Array, T: number, own: (q: number, s: number) => boolean): Record<string, DeviceTensor | HostTensor> {
    const B = this.position.length;
    const M = this.caches.length;
    const mask = new Uint8Array(B * T * M);
    for (let b = 0; b < B; b++) {
      const at = this.position[b];
      if (at + T > M) throw new Error(`Q-weighted sampling: row ${b} ran past its ${M} cache positions`);
      for (let q = 0; q < T; q++) {
        const row = (b * T + q) * M;
        mask.fill(1, row, row + at);
        for (let s = 0; s < T; s++) if (own(q, s)) mask[row + at + s] = 1;
      }
    }
    return {
      ...this.weights,
      input_ids: { data: ids, dims: [B, T] },
      position_ids: { data: positions, dims: [B, T] },
      attention_mask: { data: mask, dims: [B, 1, T, M] },
      scatter_index: scatterIndex(B, this.cfg.numKvHeads, T, (b, t) => this.position[b] + t),
    };
  }

  /** The pending token is now in the cache. */
  consumed(): void {
    this.position.forEach((_, b) => this.position[b]++);
  }
}

/** Options of {@link openCachedSession}. */
export interface CachedSessionOptions {
  graphs: CachedGraphs;
  referenceConfig: DecoderConfig;
  criticConfig: DecoderConfig;
  referenceWeights: Record<string, DeviceTensor>;
  criticWeights: Record<string, DeviceTensor>;
  /** The reference's caches: at least as many rows as the batch, and positions for its longest prompt plus the new tokens. */
  referenceCaches: CacheBuffers;
  /** The critic's (when scoring): the same rows, and positions for its longest prefix, the new tokens and the K candidates. */
  criticCaches?: CacheBuffers;
  bins: CriticBins;
  minP: number;
  maxCandidates: number;
  padId: number;
}

/**
 * The cache positions each model needs for a sampling call with K candidate slots: a row's last
 * step writes its token at position (prefix length − 1) + (max tokens − 1), and the critic's its K
 * candidates after it, so the longest prefix plus max tokens (plus K for the critic) suffices.
 */
export function cacheLengths(limits: SessionLimits, k: number): { reference: number; critic: number } {
  return { reference: limits.promptLength + limits.maxTokens, critic: limits.criticPrefixLength + limits.maxTokens + k };
}

/**
 * Prefills both caches (the critic's only when `score`) for a batch of rows; the sampler then steps
 * it. The caches are the caller's, reused across batches; a batch with fewer rows than they have is
 * filled with one-token padding rows.
 */
export async function openCachedSession(o: CachedSessionOptions, batch: readonly { prompt: readonly number[]; criticPrefix: readonly number[] }[], score: boolean): Promise<StepSession> {
  const B = batch.length;
  const R = o.referenceCaches.rows;
  if (B > R || (score && (!o.criticCaches || o.criticCaches.rows !== R))) throw new Error(`cached session: ${B} rows for caches of ${R} (reference) and ${o.criticCaches?.rows ?? 'no'} (critic) rows`);
  const rows = [...batch, ...Array.from({ length: R - B }, () => ({ prompt: [o.padId], criticPrefix: [o.padId] }))];
  const ref = new ModelCache(o.referenceConfig, o.referenceWeights, o.referenceCaches, rows.map((r) => r.prompt), o.padId, 'prompt');
  const critic = score ? new ModelCache(o.criticConfig, o.criticWeights, o.criticCaches!, rows.map((r) => r.criticPrefix), o.padId, 'critic prefix') : undefined;
  const K = o.maxCandidates;
  await ref.prefill(o.graphs.referencePrefill, rows.map((r) => r.prompt));
  await critic?.prefill(o.graphs.criticPrefill, rows.map((r) => r.criticPrefix));

  /** Q and expected remaining length of every row's candidates: the critic's step on the drawn token and the candidate slots. */
  async function estimates(candidates: readonly (readonly number[])[]): Promise<CandidateEstimate[][]> {
    if (!critic) throw new Error('cached session: opened without the critic (score false)');
    const ids = new BigInt64Array(R * (1 + K)).fill(BigInt(o.padId));
    const pos = new BigInt64Array(R * (1 + K));
    for (let b = 0; b < R; b++) {
      const cs = candidates[b] ?? [];
      if (cs.length > K) throw new Error(`cached session: ${cs.length} candidates in row ${b}, more than the ${K} slots`);
      ids[b * (1 + K)] = BigInt(critic.pending[b]);
      pos[b * (1 + K)] = BigInt(critic.position[b]);
      for (let j = 0; j < K; j++) {
        if (j < cs.length) ids[b * (1 + K) + 1 + j] = BigInt(cs[j]);
        pos[b * (1 + K) + 1 + j] = BigInt(critic.position[b] + 1);
      }
    }
    // query 0 (the drawn token): the cache and itself; query 1 + j (a candidate): the cache, the drawn token and itself
    const feeds = critic.stepFeeds(ids, pos, 1 + K, (q, s) => s === 0 || s === q);
    const host = await runInPlace(o.graphs.criticStep, feeds, critic.cfg, critic.caches, ['cell_probs']);
    critic.consumed();
    const probs = host.cell_probs.data as Float32Array;
    const C = host.cell_probs.dims[2];
    return candidates.map((cs, b) => cs.map((_, j) => marginals(o.bins, probs, (b * (1 + K) + 1 + j) * C)));
  }

  const session: StepSession = {
    async candidates(): Promise<Candidates[]> {
      const feeds = ref.stepFeeds(BigInt64Array.from(ref.pending.map(BigInt)), BigInt64Array.from(ref.position.map(BigInt)), 1, () => true);
      const host = await runInPlace(o.graphs.referenceStep, feeds, ref.cfg, ref.caches, ['top_logprobs', 'top_ids', 'entropies']);
      ref.consumed();
      const k = host.top_ids.dims[1];
      const values = host.top_logprobs.data as Float32Array;
      const top = host.top_ids.data as BigInt64Array;
      const entropies = host.entropies.data as Float32Array;
      return Array.from({ length: B }, (_, b) => {
        const c = minPCandidates(top.subarray(b * k, b * k + k), values.subarray(b * k, b * k + k), o.minP);
        const keep = c.ids.map((id, j) => (id < o.bins.first_token_id ? j : -1)).filter((j) => j >= 0);
        return { ...(keep.length === c.ids.length ? c : { ids: keep.map((j) => c.ids[j]), logprobs: keep.map((j) => c.logprobs[j]) }), entropy: entropies[b] };
      });
    },

    async scores(candidates: readonly (readonly number[])[]): Promise<number[][]> {
      return (await estimates(candidates)).map((row) => row.map((e) => e.q));
    },

    estimates: (candidates) => estimates(candidates),

    async advance(tokens: readonly number[]): Promise<void> {
      tokens.forEach((t, b) => {
        ref.pending[b] = t;
        if (critic) critic.pending[b] = t;
      });
    },

    dispose(): void {
      // the caches belong to the caller, reused by its next batch
    },
  };
  return session;
}
