/**
 * The scoring graph: teacher-forced per-token log-probs of given sequences, next-token entropies,
 * and optionally each position's min-p candidate set (the ids and log-probs of every token with
 * p ≥ min_p · p_max, at most K) — the data ICL-V labeling needs.
 *
 * Inputs:  input_ids int64 [B, T], attention_mask int64 [B, T] (left or right padding; right only
 *          with `groupQueryAttention`), weights; with `groupQueryAttention` also
 *          total_sequence_length int32 [] = T, in host memory (the kernel reads it on the CPU; computed
 *          from the shape in the graph it would put nodes on the CPU, which CUDA sessions refuse).
 * Outputs: logprobs float32 [B, T]: position t holds log p(input_ids[t+1] | ids ≤ t) (the last
 *          column, and positions whose next token is padding, are 0);
 *          entropies float32 [B, T]: entropy of the next-token distribution at t (0 on padding);
 *          with candidates: candidate_ids int64 [B, T, K] (−1 past the set) and
 *          candidate_logprobs float32 [B, T, K] (0 past the set).
 * Log-probs and entropies are computed over vocabulary chunks, so full-vocabulary logits are never
 * materialised; candidates need the full logits of the batch ([B, T, V] float32).
 */
import * as L from '@lathe/onnx';
import type { Graph, Tensor } from '@lathe/onnx';
import { causalLmLogprobs, lmLogits, type DecoderConfig, type LogprobKernel, type Weights } from '@lathe/models';

/** Compile-time options of a scoring graph. */
export interface ScoringGraphOptions {
  /** Vocabulary rows per chunk of the log-partition. Default 16,384. */
  chunk?: number;
  /** Also return each position's min-p candidate set, at most `k` tokens. */
  candidates?: { minP: number; k: number };
  /** Use ONNX Runtime's fused RMSNorm and RoPE kernels (default true). */
  fusedKernels?: boolean;
  /** Each chunk's log-partition and entropy through this fused kernel (CausalLmLogprobsOptions.logprobKernel, @lathe/models); the session then needs its custom-op domain. */
  logprobKernel?: LogprobKernel;
  /**
   * Attention through ONNX Runtime's GroupQueryAttention (flash attention on CUDA, which runs it in
   * float16/bfloat16 only). Rows must then be right-padded: each row's tokens first.
   */
  groupQueryAttention?: boolean;
}

/** bool [B, T]: true where position t and t+1 are both tokens (t+1 < T). */
function nextIsToken(mask: Tensor): Tensor {
  const m = L.cast(mask, 'bool');
  const next = L.concat([L.slice(m, [1], [1]), L.and(L.slice(m, [1], [0], [1]), L.not(L.slice(m, [1], [0], [1])))], 1);
  return L.and(m, next);
}

/** Adds the scoring computation to `g` (declares the inputs and outputs listed above). */
export function addScoring(g: Graph, cfg: DecoderConfig, weights: Weights, opts: ScoringGraphOptions = {}): void {
  const chunk = opts.chunk ?? 16384;
  const ids = g.input('input_ids', 'int64', ['B', 'T']);
  const mask = g.input('attention_mask', 'int64', ['B', 'T']);
  const { logp, entropy, hidden } = causalLmLogprobs(cfg, weights, ids, mask, {
    chunk,
    entropy: true,
    ...(opts.logprobKernel ? { logprobKernel: opts.logprobKernel } : {}),
    ...(opts.groupQueryAttention ? { attention: 'gqa' as const } : { fused: opts.fusedKernels ?? true }),
  });
  g.output(L.where(nextIsToken(mask), logp, 0), 'logprobs');
  g.output(L.where(L.cast(mask, 'bool'), entropy, 0), 'entropies');
  if (opts.candidates) {
    const { minP, k } = opts.candidates;
    if (!(minP > 0 && minP <= 1)) throw new Error(`candidates.minP must be in (0, 1], got ${minP}`);
    if (!Number.isInteger(k) || k < 1 || k > cfg.vocabSize) throw new Error(`candidates.k must be an integer in [1, ${cfg.vocabSize}], got ${k}`);
    const lsm = L.logSoftmax(L.cast(lmLogits(cfg, weights, hidden), 'float32'), -1);
    const [top, idx] = L.topK(lsm, k, -1); // [B, T, k], best first
    const best = L.slice(top, [2], [0], [1]);
    const keep = L.greaterOrEqual(top, L.add(best, Math.log(minP)));
    g.output(L.where(keep, idx, g.constant(-1, 'int64', [])), 'candidate_ids');
    g.output(L.where(keep, top, 0), 'candidate_logprobs');
  }
}
