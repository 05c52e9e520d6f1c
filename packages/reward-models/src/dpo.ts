/**
 * Direct preference optimisation: the policy is trained on preference pairs against a frozen
 * reference, with no reward model. With π and π_ref the log-probs of a response (summed over its
 * tokens, or averaged: `reduction`) under the policy and the reference, and
 *
 *   z = (π(y_c) − π(y_r)) − (π_ref(y_c) − π_ref(y_r)),
 *
 * the per-pair losses are (TRL's `DPOTrainer`):
 *   sigmoid  −(1 − ε)·log σ(β·z) − ε·log σ(−β·z)      (DPO; ε is cDPO's label smoothing, default 0)
 *   ipo      (z − 1/(2β))²                             (IPO, Azar et al. eq. 17; TRL averages log-probs over tokens)
 * summed and divided by N, the pairs in the whole optimizer batch (a batch input). The implicit
 * rewards are β·(π − π_ref) of each response; a pair is ranked right when the chosen one's is higher.
 * The reference's log-probs are an input: computed once per pair by a {@link ResponseLogprobScorer}
 * over the reference's weights with the same builder ({@link responseLogprobs}) and cached.
 */
import * as L from '@lathe/onnx';
import type { Tensor } from '@lathe/onnx';
import { causalLmLogprobs, shiftLeft, type CausalLmLogprobsOptions, type DecoderConfig, type Weights } from '@lathe/models';
import type { LossBuilder, LossOutputs } from '@lathe/train';
import { chosenAndRejected, pairLossModel, pairMetrics, pairTokenInputs, RANKING_SUMS, rankingSums, type PairLossModelOptions, type RankingMetrics } from './pair-loss';
import { PAIR_INPUTS } from './pairs';

/** The DPO-family losses. */
export type DpoLossKind = 'sigmoid' | 'ipo';

/** How a response's token log-probs become one number. */
export type LogprobReduction = 'sum' | 'mean';

/** The DPO hyperparameters. */
export interface DpoConfig {
  /** β: the strength of the KL regularisation to the reference (TRL's default 0.1). */
  beta: number;
  /** Which loss. */
  loss: DpoLossKind;
  /** ε of the sigmoid loss (cDPO's label smoothing), in [0, 0.5). */
  labelSmoothing: number;
  /** Sum or average each response's token log-probs; default per loss in {@link dpoReduction}. */
  reduction?: LogprobReduction;
}

/** Every DPO default, in one place. */
export const DPO_DEFAULTS: DpoConfig = { beta: 0.1, loss: 'sigmoid', labelSmoothing: 0 };

/** The reduction a DPO config implies: its own, else 'mean' for IPO (as TRL) and 'sum' for the sigmoid loss. */
export function dpoReduction(cfg: Pick<DpoConfig, 'loss' | 'reduction'>): LogprobReduction {
  return cfg.reduction ?? (cfg.loss === 'ipo' ? 'mean' : 'sum');
}

/**
 * Each row's response log-prob, [B] float32: Σ_t log p(ids[t+1] | ids ≤ t) over the positions whose
 * next token is a response token (`responseMask` [B, T], 1 on response tokens), or that sum divided
 * by the row's response tokens with `reduction` 'mean'. A response token at column 0 has no
 * prediction and is not counted.
 */
export function responseLogprobs(
  cfg: DecoderConfig,
  w: Weights,
  ids: Tensor,
  attentionMask: Tensor,
  responseMask: Tensor,
  opts: Omit<CausalLmLogprobsOptions, 'entropy'> & { reduction?: LogprobReduction } = {},
): Tensor {
  const { reduction, ...head } = opts;
  const { logp } = causalLmLogprobs(cfg, w, ids, attentionMask, head);
  const predicted = L.cast(predictsResponse(responseMask), logp.dtype);
  const sum = L.reduceSum(L.mul(logp, predicted), [1]);
  if ((reduction ?? 'sum') === 'sum') return sum;
  return L.div(sum, L.maximum(L.reduceSum(predicted, [1]), 1));
}

/**
 * int64 [B, T]: 1 at column t when token t+1 is a response token, 0 in the last column (log-probs'
 * predicting-position coordinates). Built on the int64 mask, never by slicing the log-probs, whose
 * gradient would then need run-time shape arithmetic; with a static T no Concat of unequal parts.
 */
export function predictsResponse(responseMask: Tensor): Tensor {
  const m = L.cast(responseMask, 'int64');
  const shifted = shiftLeft(m); // the last column holds column 0, wrapped around
  const T = m.shape[1];
  if (typeof T === 'number') return L.mul(shifted, m.graph.constant(Array.from({ length: T }, (_, t) => (t < T - 1 ? 1 : 0)), 'int64', [1, T]));
  return L.concat([L.slice(shifted, [1], [0], [-1]), L.mul(L.slice(m, [1], [0], [1]), 0)], 1);
}

/** The names of the metric sums {@link dpoObjective} outputs: the ranking sums of the implicit rewards, then the rewards' and the policy log-probs' sums. */
export const DPO_SUMS = [...RANKING_SUMS, 'chosen_reward_sum', 'rejected_reward_sum', 'chosen_logp_sum', 'rejected_logp_sum'] as const;

/** The metric sums {@link dpoLoss} outputs (summed over micro-batches by the Trainer). */
export type DpoSums = Record<(typeof DPO_SUMS)[number], number>;

/** The DPO objective's inputs. */
export interface DpoTerms {
  /** Policy log-probs of the 2P rows' responses, [2P] (chosen rows first). */
  policy: Tensor;
  /** The reference's, [2P], the same order and reduction. */
  reference: Tensor;
  /** Pairs N in the whole optimizer batch, a scalar. */
  pairCount: Tensor;
}

/**
 * The loss (module comment; in the log-probs' dtype) and float32 metric sums over the micro-batch: `pairs`, `correct` (implicit
 * reward of chosen > rejected), `margin_sum` (Σ β·z), `chosen_reward_sum`, `rejected_reward_sum`,
 * `chosen_logp_sum`, `rejected_logp_sum`.
 */
export function dpoObjective(t: DpoTerms, cfg: DpoConfig): LossOutputs {
  checkDpoConfig(cfg);
  const dtype = t.policy.dtype;
  const pi = chosenAndRejected(t.policy);
  const ref = chosenAndRejected(L.cast(t.reference, dtype));
  const chosenReward = L.mul(L.sub(pi.chosen, ref.chosen), cfg.beta);
  const rejectedReward = L.mul(L.sub(pi.rejected, ref.rejected), cfg.beta);
  const z = L.sub(L.sub(pi.chosen, pi.rejected), L.sub(ref.chosen, ref.rejected));
  const perPair =
    cfg.loss === 'ipo'
      ? L.square(L.sub(z, 1 / (2 * cfg.beta)))
      : smoothed(L.neg(L.logSigmoid(L.mul(z, cfg.beta))), L.neg(L.logSigmoid(L.mul(z, -cfg.beta))), cfg.labelSmoothing);
  const sum = (x: Tensor) => L.cast(L.reduceSum(x), 'float32');
  return {
    loss: L.div(L.reduceSum(perPair), L.cast(t.pairCount, dtype)),
    metrics: {
      ...rankingSums(chosenReward, rejectedReward, L.sub(chosenReward, rejectedReward)),
      chosen_reward_sum: sum(chosenReward),
      rejected_reward_sum: sum(rejectedReward),
      chosen_logp_sum: sum(pi.chosen),
      rejected_logp_sum: sum(pi.rejected),
    },
  };
}

/** (1 − ε)·a + ε·b, with ε = 0 leaving a alone. */
function smoothed(a: Tensor, b: Tensor, eps: number): Tensor {
  return eps === 0 ? a : L.add(L.mul(a, 1 - eps), L.mul(b, eps));
}

function checkDpoConfig(cfg: DpoConfig): void {
  if (!(cfg.beta > 0)) throw new Error(`dpo: beta must be positive, got ${cfg.beta}`);
  if (cfg.loss !== 'sigmoid' && cfg.loss !== 'ipo') throw new Error(`dpo: loss must be 'sigmoid' or 'ipo', got '${String(cfg.loss)}'`);
  if (!(cfg.labelSmoothing >= 0 && cfg.labelSmoothing < 0.5)) throw new Error(`dpo: labelSmoothing must be in [0, 0.5), got ${cfg.labelSmoothing}`);
  if (cfg.loss === 'ipo' && cfg.labelSmoothing !== 0) throw new Error(`dpo: labelSmoothing applies to the sigmoid loss, not 'ipo'`);
}

/** Options of {@link dpoLoss}: the DPO config (defaults {@link DPO_DEFAULTS}) and how the policy's forward pass is built. */
export interface DpoLossOptions extends Partial<DpoConfig>, PairLossModelOptions {
  /** Vocabulary rows per chunk of the log-partition. Default 16,384. */
  chunk?: number;
}

/**
 * The DPO (or IPO) loss as a train-step loss over a causal LM policy `cfg`. Batch inputs:
 * `input_ids`, `attention_mask`, `loss_mask` int64 [2P, T] (a {@link pairBatch}; `loss_mask` marks
 * response tokens), `ref_logp` float32 [2P] (the reference's response log-probs in the same
 * reduction), `pair_count` float32 scalar, and with flash attention over symbolic shapes
 * `total_sequence_length`. Metrics: see {@link dpoObjective}.
 */
export function dpoLoss(cfg: DecoderConfig, opts: DpoLossOptions = {}): LossBuilder {
  const dpo: DpoConfig = { beta: opts.beta ?? DPO_DEFAULTS.beta, loss: opts.loss ?? DPO_DEFAULTS.loss, labelSmoothing: opts.labelSmoothing ?? DPO_DEFAULTS.labelSmoothing, reduction: opts.reduction };
  checkDpoConfig(dpo);
  return (g, params) => {
    const { dims, ids, mask } = pairTokenInputs(g, opts.shape);
    const responseMask = g.input(PAIR_INPUTS.responseMask, 'int64', dims);
    const reference = g.input(PAIR_INPUTS.refLogp, 'float32', [dims[0]]);
    const pairCount = g.input(PAIR_INPUTS.pairCount, 'float32', []);
    const { w, trunk } = pairLossModel(g, params, ids, opts);
    const policy = responseLogprobs(cfg, w, ids, mask, responseMask, { ...trunk, chunk: opts.chunk, reduction: dpoReduction(dpo), ...(opts.logprobKernel ? { logprobKernel: opts.logprobKernel } : {}) });
    return dpoObjective({ policy, reference, pairCount }, dpo);
  };
}

/**
 * The same sums from log-probs scored on the host: `policy` and `reference` hold 2P rows' response
 * log-probs (a pair batch's order: chosen rows, then rejected rows).
 */
export function dpoSums(policy: ArrayLike<number>, reference: ArrayLike<number>, beta: number): DpoSums {
  if (policy.length !== reference.length || policy.length % 2 !== 0) throw new Error(`dpoSums: ${policy.length} policy and ${reference.length} reference log-probs (2P rows each expected)`);
  const P = policy.length / 2;
  const s: DpoSums = { pairs: P, correct: 0, margin_sum: 0, chosen_reward_sum: 0, rejected_reward_sum: 0, chosen_logp_sum: 0, rejected_logp_sum: 0 };
  for (let i = 0; i < P; i++) {
    const c = beta * (policy[i] - reference[i]);
    const r = beta * (policy[P + i] - reference[P + i]);
    s.correct += c > r ? 1 : 0;
    s.margin_sum += c - r;
    s.chosen_reward_sum += c;
    s.rejected_reward_sum += r;
    s.chosen_logp_sum += policy[i];
    s.rejected_logp_sum += policy[P + i];
  }
  return s;
}

/** Implicit-reward and log-prob means beside the ranking metrics (of the implicit rewards β·(π − π_ref)), over a batch or an evaluation set. */
export interface DpoMetrics extends RankingMetrics {
  chosenReward: number;
  rejectedReward: number;
  /** Mean policy log-prob of the chosen (rejected) responses. */
  chosenLogp: number;
  rejectedLogp: number;
}

/** Means from DPO metric sums: {@link dpoSums}' or a train step's `metrics` (a missing sum is an error naming it). */
export function dpoMetrics(sums: Readonly<Record<string, number>>): DpoMetrics {
  return pairMetrics(sums, DPO_SUMS, 'dpoMetrics', (s, n) => ({
    chosenReward: s.chosen_reward_sum / n,
    rejectedReward: s.rejected_reward_sum / n,
    chosenLogp: s.chosen_logp_sum / n,
    rejectedLogp: s.rejected_logp_sum / n,
  }));
}
