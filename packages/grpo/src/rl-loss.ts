/**
 * The RL loss as a `LossBuilder` for `compileTrainStep`: a policy (its own inputs: token ids,
 * masks) plus the batch inputs below, differentiated through the policy's parameters.
 *
 * Batch inputs (all [B, T] in the policy's predicting-position coordinates):
 * - `old_logp` float32: log-probs of the policy that sampled the batch (from generation or
 *   re-scoring before the PPO epochs);
 * - `advantages` float32 (see `advantageMatrix`);
 * - `response_mask` int64: 1 where the predicted token is a response token;
 * - `loss_normaliser` float32 scalar: the aggregation's normaliser over the whole optimizer batch
 *   (see `lossNormaliser`), the same for every micro-batch of a step;
 * - `ref_logp` float32: reference log-probs, only when the objective reads them (`klCoef` > 0, or
 *   `reference: true` for a custom objective);
 * - `off_policy` float32: 1 on the tokens of off-policy traces (LUFFY), only with `offPolicy: true`;
 * - `rollout_logp` float32: the sampling engine's log-probs, only with truncated importance sampling
 *   (a config's `rolloutIsThreshold`, or `rolloutLogp: true` for a custom objective);
 * - `old_values`, `returns` float32 and `value_normaliser` (the batch's response tokens), only with
 *   `value` (a critic sharing the policy's trunk: the loss adds coef × `valueLoss`).
 * Metric outputs: those of the objective (for `policyLoss`: sums that add up over micro-batches),
 * plus `logp_parity_sum` = Σ over response tokens of exp(|log π_θ − log π_old|): divided by
 * `tokens` it is the log-prob parity metric (1 when the training forward reproduces the old
 * log-probs; meaningful before the first update of a batch).
 */
import * as L from '@lathe/onnx';
import type { Tensor } from '@lathe/onnx';
import type { LossBuilder } from '@lathe/train';
import { policyLoss, type PolicyLossConfig, type PolicyLossTensors } from './policy-loss';
import type { PolicyBuilder } from './policies';
import { VALUE_INPUTS, valueLoss } from './value-model';

/** Names of the RL batch inputs. */
export const RL_INPUTS = {
  oldLogp: 'old_logp',
  refLogp: 'ref_logp',
  advantages: 'advantages',
  mask: 'response_mask',
  normaliser: 'loss_normaliser',
  offPolicy: 'off_policy',
  rolloutLogp: 'rollout_logp',
} as const;

/**
 * A custom RL objective: the scalar loss (and named scalar metrics) from the batch's tensors. The
 * default objective is `policyLoss` with a config; a new loss term is a function that calls
 * `policyLoss` and adds to its loss (see docs/guides/custom-algorithm.md).
 */
export type RlObjective = (t: PolicyLossTensors) => { loss: Tensor; metrics?: Record<string, Tensor | undefined> };

/** Options of {@link rlLoss}. */
export interface RlLossOptions {
  /**
   * Declare the `ref_logp` input and pass it to the objective. Default: `klCoef > 0` for a config;
   * false for a custom objective (set it when yours reads `refLogp`).
   */
  reference?: boolean;
  /** Declare the `off_policy` input (off-policy traces in the batch) and pass it to the objective. Default false. */
  offPolicy?: boolean;
  /** Declare the `rollout_logp` input (the sampling engine's log-probs) and pass it to the objective. Default: whether a config sets `rolloutIsThreshold`. */
  rolloutLogp?: boolean;
  /** A value head on the policy's trunk (the policy's `values`): add coef × the clipped value loss (ε `clip`). */
  value?: { coef: number; clip: number };
}

const PARITY_LOG_LIMIT = 20;

/** The loss of `objective` (a `policyLoss` config, or a custom function) over `policy`'s log-probs, ready for `compileTrainStep`. */
export function rlLoss(policy: PolicyBuilder, objective: PolicyLossConfig | RlObjective = {}, opts: RlLossOptions = {}): LossBuilder {
  const reference = opts.reference ?? (typeof objective === 'function' ? false : (objective.klCoef ?? 0) > 0);
  const readsRollout = opts.rolloutLogp ?? (typeof objective === 'function' ? false : objective.rolloutIsThreshold !== undefined);
  return (g, params) => {
    const { logp, entropy, values } = policy(g, params);
    if (logp.rank !== 2 || logp.dtype !== 'float32') throw new Error(`rlLoss: the policy's logp must be float32 [B, T], got ${logp}`);
    const shape = logp.shape;
    const oldLogp = g.input(RL_INPUTS.oldLogp, 'float32', shape);
    const advantages = g.input(RL_INPUTS.advantages, 'float32', shape);
    const mask = g.input(RL_INPUTS.mask, 'int64', shape);
    const normaliser = g.input(RL_INPUTS.normaliser, 'float32', []);
    const refLogp = reference ? g.input(RL_INPUTS.refLogp, 'float32', shape) : undefined;
    const offPolicy = opts.offPolicy ? g.input(RL_INPUTS.offPolicy, 'float32', shape) : undefined;
    const rolloutLogp = readsRollout ? g.input(RL_INPUTS.rolloutLogp, 'float32', shape) : undefined;
    const tensors: PolicyLossTensors = { logp, oldLogp, advantages, mask, normaliser, refLogp, entropy, offPolicy, rolloutLogp };
    const out = typeof objective === 'function' ? objective(tensors) : policyLoss(tensors, objective);
    const metrics: Record<string, Tensor> = {};
    for (const [k, v] of Object.entries(out.metrics ?? {})) if (v) metrics[k] = v;
    let loss = out.loss;
    if (opts.value) {
      if (!values) throw new Error('rlLoss: a value term needs a policy with a value head (decoderPolicy\'s valueHead)');
      const v = valueLoss({ values, oldValues: g.input(VALUE_INPUTS.oldValues, 'float32', shape), returns: g.input(VALUE_INPUTS.returns, 'float32', shape), mask, normaliser: g.input(VALUE_INPUTS.normaliser, 'float32', []) }, opts.value.clip);
      loss = L.add(loss, L.mul(v.loss, opts.value.coef));
      Object.assign(metrics, v.metrics);
    }
    const deviation = L.exp(L.clip(L.abs(L.sub(logp, oldLogp)), 0, PARITY_LOG_LIMIT));
    // generation and training agree on the sampled tokens only, not on a trace's behaviour log-probs
    const sampled = offPolicy ? L.mul(L.cast(mask, 'float32'), L.sub(1, offPolicy)) : L.cast(mask, 'float32');
    metrics.logp_parity_sum = L.reduceSum(L.mul(deviation, sampled));
    return { loss, metrics };
  };
}
