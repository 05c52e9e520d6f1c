/**
 * Q-weighted sampling over KV caches: each model keeps its keys and values on the device, so a step
 * runs one token per row through the reference policy and 1 + K tokens per row through the critic
 * (the token drawn last step, then the K candidates of this one) instead of the whole prefix again.
 *
 * Attention is composed (MatMul/Softmax over the cache and the step's own keys) under a mask the
 * host writes: a row's cache slots that hold real tokens, then the step's tokens — for the critic,
 * the drawn token sees the cache and itself, and each candidate sees the cache, the drawn token and
 * itself (tree attention, as in `criticTreeProbs`). The critic's step keeps only the drawn token's
 * keys in its cache; the candidates' are dropped.
 *
 * The prefill reads each row's prefix but its last token, which becomes the first step's token, so
 * every step has the same shape. Rows keep their place for the whole batch: a row that stopped is
 * fed its padding token until the batch ends (its results are ignored).
 */
import * as L from '@lathe/onnx';
import type { DType, Graph } from '@lathe/onnx';
import { decoder, lmLogits, paddedCausalMask, positionsFromPadding, restrictedLogits, weightInputs, type DecoderConfig, type KvPair } from '@lathe/models';
import type { Device, DeviceTensor, HostTensor, Session } from '@lathe/runtime';
import { gridShape, marginals, minPCandidates, type CriticBins } from '@lathe/critic';
import type { CandidateEstimate, Candidates, StepSession } from './sampler';

const cacheInput = (i: number, which: 'key' | 'value') => `past.${i}.${which}`;
const cacheOutput = (i: number, which: 'key' | 'value') => `present.${i}.${which}`;

function pastInputs(g: Graph, cfg: DecoderConfig, dtype: DType): KvPair[] {
  return Array.from({ length: cfg.numLayers }, (_, i) => ({
    key: g.input(cacheInput(i, 'key'), dtype, ['B', cfg.numKvHeads, 'S', cfg.headDim]),
    value: g.input(cacheInput(i, 'value'), dtype, ['B', cfg.numKvHeads, 'S', cfg.headDim]),
  }));
}

/** The prefill: right-padded prefixes → every layer's keys and values. */
function prefillGraph(name: string, cfg: DecoderConfig, compute: DType): Graph {
  const g = new L.Graph(name);
  const { weights } = weightInputs(g, cfg, 'float32', compute);
  const ids = g.input('input_ids', 'int64', ['B', 'P']);
  const mask = g.input('attention_mask', 'int64', ['B', 'P']);
  const out = decoder(cfg, weights, { inputIds: ids, positionIds: positionsFromPadding(mask), attentionMask: paddedCausalMask(mask) });
  out.present.forEach((p, i) => {
    g.output(p.key, cacheOutput(i, 'key'));
    g.output(p.value, cacheOutput(i, 'value'));
  });
  return g;
}

/** The reference's step: one token per row → the extended cache and the next token's top-k log-probs. */
function referenceStepGraph(cfg: DecoderConfig, compute: DType, k: number): Graph {
  const g = new L.Graph('extract_reference_step');
  const { weights } = weightInputs(g, cfg, 'float32', compute);
  const ids = g.input('input_ids', 'int64', ['B', 1]);
  const positions = g.input('position_ids', 'int64', ['B', 1]);
  const mask = g.input('attention_mask', 'bool', ['B', 1, 1, 'S1']);
  const out = decoder(cfg, weights, { inputIds: ids, positionIds: positions, attentionMask: mask, past: pastInputs(g, cfg, compute) });
  out.present.forEach((p, i) => {
    g.output(p.key, cacheOutput(i, 'key'));
    g.output(p.value, cacheOutput(i, 'value'));
  });
  const logits = L.cast(L.squeeze(lmLogits(cfg, weights, out.hidden), [1]), 'float32');
  const [values, indices] = L.topK(L.logSoftmax(logits, -1), Math.min(k, cfg.vocabSize), -1);
  g.output(values, 'top_logprobs');
  g.output(indices, 'top_ids');
  return g;
}

/** The critic's step: the drawn token and K candidate slots per row → the cache extended by the drawn token only, and the grid distribution of every token. */
function criticStepGraph(cfg: DecoderConfig, bins: CriticBins, compute: DType, k: number): Graph {
  const g = new L.Graph('extract_critic_step');
  const { weights } = weightInputs(g, cfg, 'float32', compute);
  const ids = g.input('input_ids', 'int64', ['B', 1 + k]);
  const positions = g.input('position_ids', 'int64', ['B', 1 + k]);
  const mask = g.input('attention_mask', 'bool', ['B', 1, 1 + k, 'SK']);
  const out = decoder(cfg, weights, { inputIds: ids, positionIds: positions, attentionMask: mask, past: pastInputs(g, cfg, compute) });
  out.present.forEach((p, i) => {
    g.output(L.slice(p.key, [2], [0], [-k]), cacheOutput(i, 'key'));
    g.output(L.slice(p.value, [2], [0], [-k]), cacheOutput(i, 'value'));
  });
  g.output(L.softmax(L.cast(restrictedLogits(cfg, weights, out.hidden, bins.first_token_id, gridShape(bins).cells), 'float32'), -1), 'cell_probs');
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

/** Runs a session with the caches' outputs kept on the device and the rest brought to the host. */
async function runSplit(session: Session, feeds: Record<string, DeviceTensor | HostTensor>, onDevice: readonly string[], onHost: readonly string[]): Promise<{ device: Record<string, DeviceTensor>; host: Record<string, HostTensor> }> {
  const b = session.binding();
  try {
    for (const [name, t] of Object.entries(feeds)) b.input(name, t);
    for (const n of onDevice) b.output(n, 'device');
    for (const n of onHost) b.output(n, 'host');
    await b.run();
    return { device: Object.fromEntries(onDevice.map((n) => [n, b.take(n)])), host: Object.fromEntries(onHost.map((n) => [n, b.fetch(n)])) };
  } finally {
    b.dispose();
  }
}

/** One model's state for a batch: its cache, which slots hold tokens, and the token waiting to enter. */
class ModelCache {
  tensors: Record<string, DeviceTensor> = {};
  /** Per row: 1 where a cache slot holds a real token. */
  readonly valid: number[][];
  /** Per row: the next token's position. */
  readonly position: number[];
  /** Per row: the token the next step reads first. */
  readonly pending: number[];

  constructor(
    private readonly cfg: DecoderConfig,
    private readonly weights: Record<string, DeviceTensor>,
    prefixes: readonly (readonly number[])[],
    private readonly padId: number,
  ) {
    this.valid = prefixes.map(() => []);
    this.position = prefixes.map((p) => p.length - 1);
    this.pending = prefixes.map((p) => p[p.length - 1]);
  }

  get names(): string[] {
    return Array.from({ length: this.cfg.numLayers }, (_, i) => [cacheOutput(i, 'key'), cacheOutput(i, 'value')]).flat();
  }

  /** Runs the prefill over each prefix but its last token. */
  async prefill(session: Session, prefixes: readonly (readonly number[])[]): Promise<void> {
    const heads = prefixes.map((p) => p.slice(0, -1));
    const B = heads.length;
    const P = Math.max(1, ...heads.map((h) => h.length));
    const ids = new BigInt64Array(B * P).fill(BigInt(this.padId));
    const mask = new BigInt64Array(B * P);
    heads.forEach((h, b) => {
      h.forEach((id, t) => ((ids[b * P + t] = BigInt(id)), (mask[b * P + t] = 1n)));
      this.valid[b] = Array.from({ length: P }, (_, t) => (t < h.length ? 1 : 0));
    });
    const { device } = await runSplit(session, { ...this.weights, input_ids: { data: ids, dims: [B, P] }, attention_mask: { data: mask, dims: [B, P] } }, this.names, []);
    this.replace(device);
  }

  /** The step's cache inputs. */
  past(): Record<string, DeviceTensor> {
    return Object.fromEntries(Array.from({ length: this.cfg.numLayers }, (_, i) => [[cacheInput(i, 'key'), this.tensors[cacheOutput(i, 'key')]], [cacheInput(i, 'value'), this.tensors[cacheOutput(i, 'value')]]]).flat());
  }

  /** Takes the step's caches in place of the old ones; the pending token is now in the cache. */
  consumed(next: Record<string, DeviceTensor>): void {
    this.replace(next);
    this.valid.forEach((v, b) => {
      v.push(1);
      this.position[b]++;
    });
  }

  private replace(next: Record<string, DeviceTensor>): void {
    for (const t of Object.values(this.tensors)) t.dispose();
    this.tensors = next;
  }

  dispose(): void {
    this.replace({});
  }
}

/** Options of {@link openCachedSession}. */
export interface CachedSessionOptions {
  graphs: CachedGraphs;
  referenceConfig: DecoderConfig;
  criticConfig: DecoderConfig;
  referenceWeights: Record<string, DeviceTensor>;
  criticWeights: Record<string, DeviceTensor>;
  bins: CriticBins;
  minP: number;
  maxCandidates: number;
  padId: number;
}

/** Prefills both caches (the critic's only when `score`) for a batch of rows; the sampler then steps it. */
export async function openCachedSession(o: CachedSessionOptions, rows: readonly { prompt: readonly number[]; criticPrefix: readonly number[] }[], score: boolean): Promise<StepSession> {
  const ref = new ModelCache(o.referenceConfig, o.referenceWeights, rows.map((r) => r.prompt), o.padId);
  const critic = score ? new ModelCache(o.criticConfig, o.criticWeights, rows.map((r) => r.criticPrefix), o.padId) : undefined;
  const B = rows.length;
  const K = o.maxCandidates;
  const boolMask = (width: number, fill: (b: number, q: number, s: number) => boolean, queries: number): HostTensor => {
    const data = new Uint8Array(B * queries * width);
    for (let b = 0; b < B; b++) for (let q = 0; q < queries; q++) for (let s = 0; s < width; s++) data[(b * queries + q) * width + s] = fill(b, q, s) ? 1 : 0;
    return { data, dims: [B, 1, queries, width] };
  };
  try {
    await ref.prefill(o.graphs.referencePrefill, rows.map((r) => r.prompt));
    await critic?.prefill(o.graphs.criticPrefill, rows.map((r) => r.criticPrefix));
  } catch (e) {
    ref.dispose();
    critic?.dispose();
    throw e;
  }
  /** Q and expected remaining length of every row's candidates: the critic's step on the drawn token and the candidate slots. */
  async function estimates(candidates: readonly (readonly number[])[]): Promise<CandidateEstimate[][]> {
    if (!critic) throw new Error('cached session: opened without the critic (score false)');
    const S = critic.valid[0].length;
    const ids = new BigInt64Array(B * (1 + K)).fill(BigInt(o.padId));
    const pos = new BigInt64Array(B * (1 + K));
    candidates.forEach((cs, b) => {
      if (cs.length > K) throw new Error(`cached session: ${cs.length} candidates in row ${b}, more than the ${K} slots`);
      ids[b * (1 + K)] = BigInt(critic.pending[b]);
      pos[b * (1 + K)] = BigInt(critic.position[b]);
      for (let j = 0; j < K; j++) {
        if (j < cs.length) ids[b * (1 + K) + 1 + j] = BigInt(cs[j]);
        pos[b * (1 + K) + 1 + j] = BigInt(critic.position[b] + 1);
      }
    });
    // query 0 (the drawn token): the cache and itself; query 1 + j (a candidate): the cache, the drawn token and itself
    const mask = boolMask(S + 1 + K, (b, q, s) => (s < S ? critic.valid[b][s] === 1 : s === S ? true : q >= 1 && s === S + q), 1 + K);
    const { device, host } = await runSplit(
      o.graphs.criticStep,
      { ...o.criticWeights, ...critic.past(), input_ids: { data: ids, dims: [B, 1 + K] }, position_ids: { data: pos, dims: [B, 1 + K] }, attention_mask: mask },
      critic.names,
      ['cell_probs'],
    );
    critic.consumed(device);
    const probs = host.cell_probs.data as Float32Array;
    const C = host.cell_probs.dims[2];
    return candidates.map((cs, b) => cs.map((_, j) => marginals(o.bins, probs, (b * (1 + K) + 1 + j) * C)));
  }

  const session: StepSession = {
    async candidates(): Promise<Candidates[]> {
      const S = ref.valid[0].length;
      const { device, host } = await runSplit(
        o.graphs.referenceStep,
        {
          ...o.referenceWeights,
          ...ref.past(),
          input_ids: { data: BigInt64Array.from(ref.pending.map(BigInt)), dims: [B, 1] },
          position_ids: { data: BigInt64Array.from(ref.position.map(BigInt)), dims: [B, 1] },
          attention_mask: boolMask(S + 1, (b, _q, s) => s === S || ref.valid[b][s] === 1, 1),
        },
        ref.names,
        ['top_logprobs', 'top_ids'],
      );
      ref.consumed(device);
      const k = host.top_ids.dims[1];
      const values = host.top_logprobs.data as Float32Array;
      const top = host.top_ids.data as BigInt64Array;
      return Array.from({ length: B }, (_, b) => {
        const c = minPCandidates(top.subarray(b * k, b * k + k), values.subarray(b * k, b * k + k), o.minP);
        const keep = c.ids.map((id, j) => (id < o.bins.first_token_id ? j : -1)).filter((j) => j >= 0);
        return keep.length === c.ids.length ? c : { ids: keep.map((j) => c.ids[j]), logprobs: keep.map((j) => c.logprobs[j]) };
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
      ref.dispose();
      critic?.dispose();
    },
  };
  return session;
}
