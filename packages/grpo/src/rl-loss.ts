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
 * - `ref_logp` float32: reference log-probs, only when `klCoef` > 0.
 * Metric outputs: those of `policyLoss` (sums that add up over micro-batches).
 */
import type { Tensor } from '@lathe/onnx';
import type { LossBuilder } from '@lathe/train';
import { policyLoss, type PolicyLossConfig } from './policy-loss';
import type { PolicyBuilder } from './policies';

/** Names of the RL batch inputs. */
export const RL_INPUTS = {
  oldLogp: 'old_logp',
  refLogp: 'ref_logp',
  advantages: 'advantages',
  mask: 'response_mask',
  normaliser: 'loss_normaliser',
} as const;

/** The policy loss of `config` over `policy`'s log-probs, ready for `compileTrainStep`. */
export function rlLoss(policy: PolicyBuilder, config: PolicyLossConfig = {}): LossBuilder {
  return (g, params) => {
    const { logp, entropy } = policy(g, params);
    if (logp.rank !== 2 || logp.dtype !== 'float32') throw new Error(`rlLoss: the policy's logp must be float32 [B, T], got ${logp}`);
    const shape = logp.shape;
    const oldLogp = g.input(RL_INPUTS.oldLogp, 'float32', shape);
    const advantages = g.input(RL_INPUTS.advantages, 'float32', shape);
    const mask = g.input(RL_INPUTS.mask, 'int64', shape);
    const normaliser = g.input(RL_INPUTS.normaliser, 'float32', []);
    const refLogp = (config.klCoef ?? 0) > 0 ? g.input(RL_INPUTS.refLogp, 'float32', shape) : undefined;
    const out = policyLoss({ logp, oldLogp, advantages, mask, normaliser, refLogp, entropy }, config);
    const metrics: Record<string, Tensor> = {};
    for (const [k, v] of Object.entries(out.metrics)) if (v) metrics[k] = v;
    return { loss: out.loss, metrics };
  };
}
