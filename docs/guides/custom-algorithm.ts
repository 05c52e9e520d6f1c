/**
 * A custom GRPO variant against @lathe/grpo's public API (docs/guides/custom-algorithm.md): a new
 * advantage estimator and a new loss term, each a plain function, handed to GrpoTrainer.
 */
import * as L from '@lathe/onnx';
import { aggregateLoss, grpoAdvantages, policyLoss, type AdvantageFunction, type CustomObjective } from '@lathe/grpo';

/**
 * GRPO on rewards shaped for brevity: in each group, a rewarded completion (reward > 0) gets
 * + weight·(0.5 − (len − min)/(max − min)), min and max over the group's rewarded completions;
 * unrewarded ones are left alone, so being short never pays unless the answer is right.
 */
export function conciseGrpo(weight: number): AdvantageFunction {
  return (batch) => {
    const { rewards, lengths, groupSize: G } = batch;
    const shaped = rewards.map((r, i) => {
      const start = i - (i % G);
      const rewarded = lengths.slice(start, start + G).filter((_n, k) => rewards[start + k] > 0);
      const [min, max] = [Math.min(...rewarded), Math.max(...rewarded)];
      return r > 0 && max > min ? r + weight * (0.5 - (lengths[i] - min) / (max - min)) : r;
    });
    return grpoAdvantages({ rewards: shaped, groupSize: G });
  };
}

/**
 * PPO's clipped surrogate plus β·½(log π_θ − log π_old)² per token (a proximal penalty that keeps
 * every update near the sampling policy), aggregated like the surrogate.
 */
export function proximalObjective(beta: number): CustomObjective {
  return {
    aggregation: 'token-mean',
    objective: (t) => {
      const surrogate = policyLoss(t, { aggregation: 'token-mean', clipHigh: 0.28 });
      const d = L.sub(t.logp, t.oldLogp);
      const penalty = aggregateLoss(L.mul(L.mul(d, d), 0.5), L.cast(t.mask, 'float32'), 'token-mean', t.normaliser);
      return { loss: L.add(surrogate.loss, L.mul(penalty, beta)), metrics: { ...surrogate.metrics, proximal_penalty: penalty } };
    },
  };
}
