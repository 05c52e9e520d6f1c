/**
 * The distillation loss of policy extraction: at every output position, π_θ restricted to the
 * reference policy's candidates (a softmax over their logits only) is pulled towards
 * π* ∝ π_ref·exp(Q/τ) over the same candidates, by KL(π_θ‖π*) (reverse, mode-seeking: the original
 * method's) or KL(π*‖π_θ) (forward). Only the candidates' rows of the LM head are read, so no
 * full-vocabulary logits are formed.
 */
import * as L from '@lathe/onnx';
import type { Tensor } from '@lathe/onnx';
import { accumulationDtype, chunkedTargetLogprobs, decoderHidden, lmHeadName, type DecoderConfig, type Weights } from '@lathe/models';
import { castWeights, type DecoderLossOptions, type LossBuilder } from '@lathe/train';
import { validateTau } from './target';

/** Which KL the loss minimises. */
export type KlDirection = 'reverse' | 'forward';

/** The KL directions, for option choices. */
export const KL_DIRECTIONS: readonly KlDirection[] = ['reverse', 'forward'];

/** Options of {@link candidateKl} and {@link extractionLoss}. */
export interface CandidateKlOptions {
  /** Temperature of π_ref·exp(Q/τ) (> 0; Infinity: π* is π_ref renormalised over the candidates). */
  tau: number;
  /** 'reverse' (default): KL(π_θ‖π*); 'forward': KL(π*‖π_θ). */
  direction?: KlDirection;
}

/**
 * Per-position KL [B, T] between π_θ and π* over each position's candidates, from candidate logits
 * of π_θ, reference log-probs and Q values [B, T, K] and `mask` [B, T, K] (nonzero on real
 * candidates; a position without any gives 0). Works in the logits' dtype.
 */
export function candidateKl(logits: Tensor, refLogprobs: Tensor, q: Tensor, mask: Tensor, opts: CandidateKlOptions): Tensor {
  const tau = validateTau(opts.tau);
  const keep = L.greater(L.cast(mask, 'int64'), logits.graph.constant(0, 'int64', []));
  const masked = (x: Tensor) => L.logSoftmax(L.where(keep, x, L.scalarLike(-1e9, x)), -1);
  const logpTheta = masked(logits);
  const ref = L.cast(refLogprobs, logits.dtype);
  const logpStar = L.stopGradient(masked(Number.isFinite(tau) ? L.add(ref, L.div(L.cast(q, logits.dtype), tau)) : ref));
  const [weight, diff] = (opts.direction ?? 'reverse') === 'reverse' ? [L.exp(logpTheta), L.sub(logpTheta, logpStar)] : [L.exp(logpStar), L.sub(logpStar, logpTheta)];
  return L.maskedSum(L.mul(weight, diff), keep, -1);
}

/**
 * Logits of π_θ for the given token ids only: hidden [B, T, H] · the LM head's rows of `ids`
 * [B, T, K] → [B, T, K] in the accumulation dtype (float32; float64 for a float64 model).
 */
export function candidateLogits(cfg: DecoderConfig, w: Weights, hidden: Tensor, ids: Tensor): Tensor {
  const rows = L.gather(w(lmHeadName(cfg)), ids); // [B, T, K, H]
  const logits = L.matmul(L.unsqueeze(hidden, [2]), L.transpose(rows, [0, 1, 3, 2])); // [B, T, 1, K]
  return L.cast(L.squeeze(logits, [2]), accumulationDtype(hidden.dtype));
}

/** Options of {@link extractionLoss}: the decoder's (composed attention) and the KL's. */
export interface ExtractionLossOptions extends Omit<DecoderLossOptions, 'flashAttention'>, CandidateKlOptions {
  /**
   * Weight λ of −log π_θ(C), the full softmax's mass on each position's candidate set C (default 0).
   * The KL sees π_θ renormalised over C only, so it is blind to mass moving onto tokens outside C;
   * this term keeps it on C. It needs the full vocabulary's log-partition (SFT's chunked head).
   */
  candidateMass?: number;
  /** Vocabulary chunk of the log-partition with `candidateMass`. */
  chunk?: number;
}

/**
 * Σ (KL + λ·(−log π_θ(C))) over positions with candidates / `loss_tokens`. Batch inputs:
 * `input_ids` and `attention_mask` [B, T] int64 (prompt + output, right-padded); `candidate_ids`
 * and `candidate_mask` [B, T, K] int64 and `candidate_ref_logprobs`, `candidate_q_values`
 * [B, T, K] float32, where position t holds the candidates of the token at t + 1 (the position that
 * predicts it); `loss_tokens` float32 scalar (positions with candidates in the whole optimizer
 * batch). Metrics: `kl_sum`, `positions`, and with `candidateMass` `mass_nll_sum`.
 */
export function extractionLoss(cfg: DecoderConfig, opts: ExtractionLossOptions): LossBuilder {
  validateTau(opts.tau);
  if (opts.candidateMass !== undefined && !(opts.candidateMass >= 0)) throw new Error(`candidate mass weight must be ≥ 0, got ${opts.candidateMass}`);
  return (g, params) => {
    const dims = opts.shape ?? ['B', 'T'];
    const kDims = [...dims, 'K'];
    const ids = g.input('input_ids', 'int64', dims);
    const mask = g.input('attention_mask', 'int64', dims);
    const candIds = g.input('candidate_ids', 'int64', kDims);
    const candMask = g.input('candidate_mask', 'int64', kDims);
    const ref = g.input('candidate_ref_logprobs', 'float32', kDims);
    const q = g.input('candidate_q_values', 'float32', kDims);
    const normaliser = g.input('loss_tokens', 'float32', []);
    const w = opts.weights ? opts.weights(g, params) : castWeights(params, opts.compute ?? 'float32');
    const hidden = decoderHidden(cfg, w, ids, mask, { recompute: opts.recompute });
    const logits = candidateLogits(cfg, w, hidden, candIds);
    const klSum = L.reduceSum(candidateKl(logits, ref, q, candMask, opts));
    const has = L.greater(L.reduceMax(candMask, [-1]), g.constant(0, 'int64', []));
    const positions = L.reduceSum(L.cast(has, 'float32'));
    const metrics: Record<string, Tensor> = { kl_sum: L.stopGradient(klSum), positions: L.stopGradient(positions) };
    let total = klSum;
    if (opts.candidateMass) {
      // log π_θ(C) = LSE_C(z) − LSE_V(z), with LSE_V(z) = z_c0 − log π_θ(c0) from the chunked head
      const keep = L.greater(candMask, g.constant(0, 'int64', []));
      // the first candidate's ids by a Gather (no gradient), not a Slice: Slice's gradient pads by shapes
      // computed at run time, which ONNX Runtime runs on the CPU (refused in a CUDA session without fallback)
      const firstIds = L.gather(candIds, g.constant(0, 'int64', []), 2);
      // its logit from its own LM-head row, not a Gather of the candidate logits along K: that Gather's
      // gradient reads Shape(Transpose(logits)), which ORT rewrites into a CPU-placed Gather of a shape
      const z0 = L.squeeze(candidateLogits(cfg, w, hidden, L.unsqueeze(firstIds, [2])), [2]);
      const logp0 = L.cast(chunkedTargetLogprobs(cfg, w, hidden, firstIds, { chunk: opts.chunk, recompute: opts.recompute, like: z0 }), logits.dtype);
      const logMass = L.add(L.sub(L.logSumExp(L.where(keep, logits, L.scalarLike(-1e9, logits)), -1), z0), logp0);
      const massSum = L.neg(L.maskedSum(logMass, has));
      metrics.mass_nll_sum = L.stopGradient(massSum);
      total = L.add(total, L.mul(massSum, opts.candidateMass));
    }
    return { loss: L.div(total, L.cast(normaliser, total.dtype)), metrics };
  };
}
