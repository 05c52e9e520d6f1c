/**
 * The compiled {@link StepModels}: the reference policy's next-token top-k at each sequence's last
 * token (only that position reaches the LM head), and the critic's tree pass scoring every candidate
 * of every row in one run (each candidate attends to its row's prefix and itself,
 * `criticTreeProbs`). Both run on one device with their weights uploaded once. The two calls read
 * each prefix whole; `open` steps a batch over KV caches instead (cached.ts), which the sampler
 * uses when it is there.
 */
import * as L from '@lathe/onnx';
import type { DType } from '@lathe/onnx';
import { decoderHidden, lmLogits, weightInputs, type DecoderConfig } from '@lathe/models';
import type { Device } from '@lathe/runtime';
import { gridShape, minPCandidates, ReferenceCriticSessions, type CriticBins, type ModelWeights, type TreeRow } from '@lathe/critic';
import type { CandidateEstimate, Candidates, StepModels } from './sampler';
import { allocateCaches, cacheLengths, compileCachedGraphs, openCachedSession, type CacheBuffers, type CachedGraphs } from './cached';

/** A model's config and float32 weights, with the name errors use for it (e.g. its folder). */
export interface NamedModel extends ModelWeights {
  name: string;
}

/**
 * Refuses a reference policy and critic whose vocabularies differ, naming both: the same size, or a
 * critic grown past the reference's vocabulary by exactly its grid's rows.
 */
export function checkVocabularies(reference: { name: string; vocabSize: number }, critic: { name: string; vocabSize: number }, bins: CriticBins): void {
  const cells = gridShape(bins).cells;
  const grown = reference.vocabSize === bins.first_token_id && critic.vocabSize === bins.first_token_id + cells;
  if (reference.vocabSize !== critic.vocabSize && !grown) {
    throw new Error(
      `the reference policy ${reference.name} has a vocabulary of ${reference.vocabSize} and the critic ${critic.name} one of ${critic.vocabSize} ` +
        `(its grid: ${cells} tokens from id ${bins.first_token_id}); a critic scores the reference's candidates only with the same tokenizer`,
    );
  }
  if (bins.first_token_id + cells > critic.vocabSize) throw new Error(`the critic ${critic.name}: its grid ends at id ${bins.first_token_id + cells}, past its vocabulary of ${critic.vocabSize}`);
}

/** Options of {@link QWeightedModels.open}. */
export interface QWeightedModelsOptions {
  device: Device;
  reference: NamedModel;
  critic: NamedModel;
  bins: CriticBins;
  /** Keep candidates with p ≥ minP · p_max. */
  minP: number;
  /** At most this many candidates per step (the graph's top-k). */
  maxCandidates: number;
  compute?: DType;
  padId: number;
  /**
   * Step batches over KV caches (`open`, see cached.ts): each step reads one token per row instead
   * of the whole prefix. Default true; false steps through the prefix recomputed every time. The
   * caches are allocated once per sampling call (or kept from the last call of the same sizes) and
   * held until {@link QWeightedModels.dispose}.
   */
  kvCache?: boolean;
}

/** A critic row scoring `candidates` as the next token after `prefix`. */
export function nextTokenTreeRow(prefix: readonly number[], candidates: readonly number[]): TreeRow {
  const P = prefix.length;
  return {
    ids: [...prefix, ...candidates],
    positions: [...prefix.map((_, i) => i), ...candidates.map(() => P)],
    isCandidate: [...prefix.map(() => 0), ...candidates.map(() => 1)],
    attemptStart: P,
    attemptLength: 0,
    candidateSlots: [{ start: P, count: candidates.length }],
  };
}

/** Right-padded int64 ids and mask, and a one-hot of each row's last token (float32). */
function lastTokenBatch(seqs: readonly (readonly number[])[], padId: number) {
  const B = seqs.length;
  const T = Math.max(...seqs.map((s) => s.length));
  const ids = new BigInt64Array(B * T).fill(BigInt(padId));
  const mask = new BigInt64Array(B * T);
  const last = new Float32Array(B * T);
  seqs.forEach((s, b) => {
    s.forEach((id, t) => ((ids[b * T + t] = BigInt(id)), (mask[b * T + t] = 1n)));
    last[b * T + s.length - 1] = 1;
  });
  return { input_ids: { data: ids, dims: [B, T] }, attention_mask: { data: mask, dims: [B, T] }, last_token: { data: last, dims: [B, T] } };
}

/** The reference and critic graphs compiled on one device, as the sampler's {@link StepModels}. */
export class QWeightedModels implements StepModels {
  /** A batch stepped over KV caches (absent with `kvCache: false`). */
  readonly open?: StepModels['open'];
  private cached: CachedGraphs | undefined;
  /** Each model's caches, kept between batches and calls of the same sizes. */
  private pool: { reference?: CacheBuffers; critic?: CacheBuffers } = {};
  /** Whether a session is using the pooled caches. */
  private poolBusy = false;

  private constructor(
    private readonly opts: QWeightedModelsOptions,
    private readonly sessions: ReferenceCriticSessions,
  ) {
    if (opts.kvCache ?? true) {
      this.open = async (rows, score, limits) => {
        const compute = opts.compute ?? 'float32';
        this.cached ??= compileCachedGraphs(opts.device, opts.reference.config, opts.critic.config, opts.bins, compute, opts.maxCandidates);
        const R = Math.max(limits.rows, rows.length);
        const lengths = cacheLengths(limits, opts.maxCandidates);
        // a second session open at once (not the sampler's way) gets caches of its own, freed with it
        const shared = !this.poolBusy;
        const own: CacheBuffers[] = [];
        const caches = (which: 'reference' | 'critic', cfg: DecoderConfig): CacheBuffers => {
          const fits = (c: CacheBuffers | undefined) => c && c.rows === R && c.length === lengths[which];
          if (shared && fits(this.pool[which])) return this.pool[which]!;
          if (shared) this.releasePool(which);
          const made = allocateCaches(opts.device, cfg, compute, R, lengths[which]);
          if (shared) this.pool[which] = made;
          else own.push(made);
          return made;
        };
        const free = () => {
          if (shared) this.poolBusy = false;
          for (const c of own) for (const t of c.tensors) t.dispose();
        };
        if (shared) this.poolBusy = true;
        try {
          const session = await openCachedSession(
            {
              graphs: this.cached,
              referenceConfig: opts.reference.config,
              criticConfig: opts.critic.config,
              referenceWeights: sessions.referenceWeights,
              criticWeights: sessions.criticWeights,
              referenceCaches: caches('reference', opts.reference.config),
              criticCaches: score ? caches('critic', opts.critic.config) : undefined,
              bins: opts.bins,
              minP: opts.minP,
              maxCandidates: opts.maxCandidates,
              padId: opts.padId,
            },
            rows,
            score,
          );
          return { ...session, dispose: free };
        } catch (e) {
          free();
          throw e;
        }
      };
    }
  }

  /** Checks the pair's vocabularies, compiles both graphs and uploads both models' weights once. */
  static open(opts: QWeightedModelsOptions): QWeightedModels {
    checkVocabularies({ name: opts.reference.name, vocabSize: opts.reference.config.vocabSize }, { name: opts.critic.name, vocabSize: opts.critic.config.vocabSize }, opts.bins);
    if (!(opts.minP >= 0 && opts.minP <= 1)) throw new Error(`min_p must be in [0, 1], got ${opts.minP}`);
    const compute = opts.compute ?? 'float32';
    const ref = new L.Graph('extract_reference_next');
    {
      const cfg = opts.reference.config;
      const { weights } = weightInputs(ref, cfg, 'float32', compute);
      const ids = ref.input('input_ids', 'int64', ['B', 'T']);
      const mask = ref.input('attention_mask', 'int64', ['B', 'T']);
      const lastToken = ref.input('last_token', 'float32', ['B', 'T']);
      const hidden = decoderHidden(cfg, weights, ids, mask);
      // the last token's hidden state by a one-hot sum (exact: one term is nonzero), so only B rows reach the LM head
      const last = L.reduceSum(L.mul(hidden, L.unsqueeze(L.cast(lastToken, hidden.dtype), [2])), [1]);
      const logits = L.cast(lmLogits(cfg, weights, last), 'float32');
      const [values, indices] = L.topK(L.logSoftmax(logits, -1), Math.min(opts.maxCandidates, cfg.vocabSize), -1);
      ref.output(values, 'top_logprobs');
      ref.output(indices, 'top_ids');
      ref.output(L.entropy(logits), 'entropies');
    }
    return new QWeightedModels(opts, ReferenceCriticSessions.open({ device: opts.device, reference: opts.reference, critic: opts.critic, referenceGraph: ref, criticName: 'extract_critic_tree', bins: opts.bins, compute, padId: opts.padId }));
  }

  /** The reference policy's min-p candidates after each sequence; ids of the critic's grid (spare embedding rows, never text) are dropped. */
  async candidates(sequences: readonly (readonly number[])[]): Promise<Candidates[]> {
    for (const [i, s] of sequences.entries()) if (!s.length) throw new Error(`Q-weighted sampling: sequence ${i} is empty (the first token is predicted from the prompt)`);
    const out = await this.sessions.reference(lastTokenBatch(sequences, this.opts.padId));
    const K = out.top_ids.dims[1];
    const values = out.top_logprobs.data as Float32Array;
    const top = out.top_ids.data as BigInt64Array;
    const entropies = out.entropies.data as Float32Array;
    const gridStart = this.opts.bins.first_token_id;
    return sequences.map((_, b) => {
      const c = minPCandidates(top.subarray(b * K, b * K + K), values.subarray(b * K, b * K + K), this.opts.minP);
      const keep = c.ids.map((id, k) => (id < gridStart ? k : -1)).filter((k) => k >= 0);
      return { ...(keep.length === c.ids.length ? c : { ids: keep.map((k) => c.ids[k]), logprobs: keep.map((k) => c.logprobs[k]) }), entropy: entropies[b] };
    });
  }

  /** Q of each candidate after each prefix: one critic pass over all rows. */
  async scores(prefixes: readonly (readonly number[])[], candidates: readonly (readonly number[])[]): Promise<number[][]> {
    return (await this.estimates(prefixes, candidates)).map((row) => row.map((e) => e.q));
  }

  /** Q and expected remaining length of each candidate after each prefix: one critic pass over all rows. */
  async estimates(prefixes: readonly (readonly number[])[], candidates: readonly (readonly number[])[]): Promise<CandidateEstimate[][]> {
    return (await this.sessions.estimates(prefixes.map((p, b) => nextTokenTreeRow(p, candidates[b])))).map((e) => e.candidates[0]);
  }

  /** The device memory the pooled KV caches hold (bytes). */
  cacheBytes(): number {
    return [this.pool.reference, this.pool.critic].reduce((s, c) => s + (c ? c.tensors.reduce((a, t) => a + t.byteLength, 0) : 0), 0);
  }

  private releasePool(which: 'reference' | 'critic'): void {
    for (const t of this.pool[which]?.tensors ?? []) t.dispose();
    this.pool[which] = undefined;
  }

  /** Releases the sessions, the uploaded weights and the KV caches. */
  dispose(): void {
    this.releasePool('reference');
    this.releasePool('critic');
    if (this.cached) for (const session of Object.values(this.cached)) session.dispose();
    this.sessions.dispose();
  }
}
