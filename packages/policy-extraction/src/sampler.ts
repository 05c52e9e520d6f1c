/**
 * Q-weighted sampling: at every step the reference policy proposes its min-p candidates for the
 * next token, the critic scores each of them (all candidates of all rows in one pass), and the token
 * is drawn from π*(a) ∝ π_ref(a)·exp(Q(s, a)/τ) over the candidates. The models sit behind
 * {@link StepModels}, so the loop is the same for the compiled graphs ({@link QWeightedModels}) and
 * for a hand-made policy and critic in tests.
 *
 * Reproducibility: request r's step t draws its uniform from (seed, key_r, t) (`uniformAt`), so a
 * sample depends on the seed, its key and the models, not on the batch it runs in. The uniform
 * picks a candidate by inverse CDF over the candidates in ascending id order, as the rollout
 * engine's sampler walks the vocabulary: with τ = ∞ a sample is token for token the engine's min-p
 * sample of the same seed and key.
 */
import type { TokenLabels } from '@lathe/critic';
import { uniformAt } from '@lathe/rollout';
import { drawIndex, targetProbs, validateTau } from './target';

/** What the critic says of one candidate: its Q and the expected number of tokens after it. */
export interface CandidateEstimate {
  q: number;
  remaining: number;
}

/** The reference policy's candidates for one next token: ids and log-probs, most likely first. */
export interface Candidates {
  ids: number[];
  logprobs: number[];
  /** The entropy (nats) of the reference policy's whole next-token distribution they come from, where the models give it. */
  entropy?: number;
}

/** What the sampler asks of the models at each step. */
export interface StepModels {
  /** The reference policy's min-p candidates for the next token after each sequence (prompt + output so far). */
  candidates(sequences: readonly (readonly number[])[]): Promise<Candidates[]>;
  /** Q of each candidate as the next token after each critic prefix (the critic's input + output so far). */
  scores(prefixes: readonly (readonly number[])[], candidates: readonly (readonly number[])[]): Promise<number[][]>;
  /** Q and expected remaining length of each candidate, used instead of `scores` when present. */
  estimates?(prefixes: readonly (readonly number[])[], candidates: readonly (readonly number[])[]): Promise<CandidateEstimate[][]>;
  /**
   * A stateful session over a batch of rows (e.g. KV caches), used instead of the calls above
   * when present: the same candidates and Q, without reading each prefix again. `limits` are the
   * whole sampling call's, the same for each of its batches, so state sized by them once serves all.
   */
  open?(rows: readonly { prompt: readonly number[]; criticPrefix: readonly number[] }[], score: boolean, limits: SessionLimits): Promise<StepSession>;
}

/** The sizes of a sampling call that bound every batch's session. */
export interface SessionLimits {
  /** Rows of the largest batch. */
  rows: number;
  /** Tokens drawn per row at most. */
  maxTokens: number;
  /** The longest prompt. */
  promptLength: number;
  /** The longest critic prefix. */
  criticPrefixLength: number;
}

/**
 * A batch's rows stepped together, each step `candidates()`, then (when scoring) `scores()`, then
 * `advance()` with every row's drawn token — a row that stopped gets any token, its results ignored.
 */
export interface StepSession {
  candidates(): Promise<Candidates[]>;
  scores(candidates: readonly (readonly number[])[]): Promise<number[][]>;
  /** Q and expected remaining length of each candidate, used instead of `scores` when present. */
  estimates?(candidates: readonly (readonly number[])[]): Promise<CandidateEstimate[][]>;
  advance(tokens: readonly number[]): Promise<void>;
  dispose(): void;
}

/** One sample to draw. */
export interface QSampleRequest {
  /** The reference policy's input (the rendered prompt). */
  prompt: readonly number[];
  /** What the critic reads before the output (the prompt and any in-context attempts); default the prompt. */
  criticPrefix?: readonly number[];
  /** The sample's noise stream (distinct per sample). */
  key: number;
}

/** Options of {@link qWeightedSample}. */
export interface QSamplingOptions {
  /** Temperature of π_ref·exp(Q/τ): > 0; Infinity samples π_ref over its min-p candidates. */
  tau: number;
  /** Generation limit per sample. */
  maxTokens: number;
  seed: number;
  /** Tokens that end a sample (kept as its last token). */
  stopIds: readonly number[];
  /** Samples stepped together (one reference pass and one critic pass per step). Default all. */
  batchSize?: number;
  /**
   * Score the candidates with the critic (default true). false needs τ = ∞ (π_ref does not need Q):
   * no critic pass runs, and the Q columns stay empty (NaN for the drawn token).
   */
  score?: boolean;
  /** Called after every step of a batch with the tokens drawn so far and in total. */
  onStep?(tokens: number, done: number, total: number): void;
}

/**
 * One sample with what each of its tokens was drawn from: a labelled trajectory's columns, per drawn
 * token (the Q and remaining length of the drawn token, its step's candidates with theirs, the
 * reference's next-token entropy; a remaining length or entropy NaN where the models give none).
 */
export interface QSample extends TokenLabels {
  output: number[];
  finish_reason: 'stop' | 'length';
}

/** Draws one sample per request; the result is in request order. */
export async function qWeightedSample(requests: readonly QSampleRequest[], models: StepModels, opts: QSamplingOptions): Promise<QSample[]> {
  validateTau(opts.tau, 'Q-weighted sampling: tau');
  if (!Number.isInteger(opts.maxTokens) || opts.maxTokens < 1) throw new Error(`Q-weighted sampling: max tokens must be a positive integer, got ${opts.maxTokens}`);
  const score = opts.score ?? true;
  if (!score && Number.isFinite(opts.tau)) throw new Error(`Q-weighted sampling: tau ${opts.tau} needs the critic's scores (score: false samples π_ref, tau Infinity)`);
  const stop = new Set(opts.stopIds);
  const size = opts.batchSize ?? Math.max(1, requests.length);
  const out: QSample[] = requests.map(() => ({ output: [], token_q_values: [], token_remaining: [], candidate_ids: [], candidate_q_values: [], candidate_remaining: [], candidate_ref_logprobs: [], token_entropies: [], finish_reason: 'length' }));
  let tokens = 0;
  let done = 0;
  const limits: SessionLimits = {
    rows: Math.min(size, requests.length),
    maxTokens: opts.maxTokens,
    promptLength: requests.reduce((m, r) => Math.max(m, r.prompt.length), 0),
    criticPrefixLength: requests.reduce((m, r) => Math.max(m, (r.criticPrefix ?? r.prompt).length), 0),
  };
  for (let start = 0; start < requests.length; start += size) {
    const rows = requests.slice(start, start + size).map((_, i) => start + i);
    const session = await models.open?.(
      rows.map((r) => ({ prompt: requests[r].prompt, criticPrefix: requests[r].criticPrefix ?? requests[r].prompt })),
      score,
      limits,
    );
    try {
      let active = rows;
      for (let step = 0; step < opts.maxTokens && active.length; step++) {
        // a session steps every row of its batch (row r at r − start); the stateless calls only the active ones
        const cands = session ? await session.candidates() : await models.candidates(active.map((r) => [...requests[r].prompt, ...out[r].output]));
        const ids = cands.map((c) => c.ids);
        const prefixes = () => active.map((r) => [...(requests[r].criticPrefix ?? requests[r].prompt), ...out[r].output]);
        const qOnly = (q: number[][]) => q.map((row) => row.map((v) => ({ q: v, remaining: NaN })));
        const est: CandidateEstimate[][] = !score
          ? ids.map((row) => row.map(() => ({ q: NaN, remaining: NaN })))
          : session
            ? session.estimates
              ? await session.estimates(ids)
              : qOnly(await session.scores(ids))
            : models.estimates
              ? await models.estimates(prefixes(), ids)
              : qOnly(await models.scores(prefixes(), ids));
        const qs = est.map((row) => row.map((e) => e.q));
        const next: number[] = [];
        const drawn = new Map<number, number>();
        active.forEach((r, k) => {
          const i = session ? r - start : k;
          const c = cands[i];
          if (!c.ids.length) throw new Error(`Q-weighted sampling: the reference policy gave no candidate at step ${step} of sample ${r}`);
          if (qs[i].length !== c.ids.length) throw new Error(`Q-weighted sampling: the critic scored ${qs[i].length} of ${c.ids.length} candidates at step ${step} of sample ${r}`);
          const j = drawInIdOrder(c.ids, targetProbs(c.logprobs, qs[i], opts.tau), uniformAt(opts.seed, requests[r].key, step));
          const s = out[r];
          drawn.set(r, c.ids[j]);
          s.output.push(c.ids[j]);
          s.token_q_values.push(qs[i][j]);
          s.token_remaining.push(est[i][j].remaining);
          s.candidate_ids.push(c.ids);
          s.candidate_q_values.push(score ? qs[i] : []);
          s.candidate_remaining.push(score ? est[i].map((e) => e.remaining) : []);
          s.candidate_ref_logprobs.push(c.logprobs);
          s.token_entropies.push(c.entropy ?? NaN);
          tokens++;
          if (stop.has(c.ids[j])) s.finish_reason = 'stop';
          else next.push(r);
        });
        done += active.length - next.length;
        active = next;
        opts.onStep?.(tokens, done, requests.length);
        if (session && active.length) await session.advance(rows.map((r) => drawn.get(r) ?? out[r].output[out[r].output.length - 1] ?? requests[r].prompt[requests[r].prompt.length - 1]));
      }
      done += active.length;
    } finally {
      session?.dispose();
    }
  }
  return out;
}

/** Index (into `ids`) drawn by `u` from `probs`, the cumulative sum taken in ascending id order. */
export function drawInIdOrder(ids: readonly number[], probs: readonly number[], u: number): number {
  const order = ids.map((_, i) => i).sort((a, b) => ids[a] - ids[b]);
  return order[drawIndex(order.map((i) => probs[i]), u)];
}
