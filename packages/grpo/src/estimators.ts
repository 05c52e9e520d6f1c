/**
 * Advantage estimators as the RL loop calls them: one signature, `(batch) => advantages`, for the
 * built-in estimators (by name) and for a user's own. The batch carries everything an estimator
 * may read — outcome rewards, group size, response lengths, per-token shaping rewards (the KL
 * penalty when the KL is a reward), greedy-baseline rewards (ReMax), and the per-token old and
 * reference log-probs.
 */
import { drGrpoAdvantages, grpoAdvantages, reinforcePlusPlusAdvantages, remaxAdvantages, rlooAdvantages, type GroupedRewards, type SequenceAdvantages, type TokenAdvantages, type TokenRewards } from './advantages';

/** What an estimator gets for one RL step. Rows are prompt by prompt, `groupSize` per prompt. */
export interface AdvantageBatch extends TokenRewards {
  /** The reward of each prompt's greedy completion, when the loop was asked for it (ReMax). */
  greedyRewards?: readonly number[];
  /** Per response token log-probs of the policy that sampled (old log-probs), one row per completion. */
  logp: readonly (readonly number[])[];
  /** Per response token reference log-probs, when the reference was scored. */
  refLogp?: readonly (readonly number[])[];
  /** Which completions are off-policy traces (LUFFY), when the batch has any. */
  offPolicy?: readonly boolean[];
}

/** An advantage estimator: the extension point for new algorithms. */
export type AdvantageFunction = (batch: AdvantageBatch) => SequenceAdvantages | TokenAdvantages;

/** Names of the built-in estimators. */
export type EstimatorName = 'grpo' | 'dr_grpo' | 'rloo' | 'remax' | 'reinforce_pp' | 'reinforce_pp_baseline';

/** Every built-in estimator name (for option validation). */
export const ESTIMATOR_NAMES: readonly EstimatorName[] = ['grpo', 'dr_grpo', 'rloo', 'remax', 'reinforce_pp', 'reinforce_pp_baseline'];

/**
 * Outcome reward plus the sum of the per-token shaping rewards: how sequence-level estimators see a
 * KL reward penalty (token-level ones get the per-token values).
 */
export function sequenceRewards(batch: AdvantageBatch): number[] {
  const shaping = batch.tokenRewards;
  return shaping ? batch.rewards.map((r, i) => r + shaping[i].reduce((a, b) => a + b, 0)) : [...batch.rewards];
}

/**
 * What a sequence-level estimator reads: the {@link sequenceRewards} as `rewards`, and the outcome
 * rewards as `outcomeRewards`, so groups whose outcomes are all equal stay uniform (zeroed where the
 * estimator zeroes them, and counted) whatever the KL penalty adds per completion.
 */
export function sequenceRewardBatch(batch: AdvantageBatch): GroupedRewards {
  return { rewards: sequenceRewards(batch), groupSize: batch.groupSize, groupIds: batch.groupIds, outcomeRewards: batch.rewards, statsFrom: batch.statsFrom };
}

/** A built-in estimator (with its defaults; see advantages.ts for each formula and constant) and whether it needs greedy-completion rewards. */
export function builtinEstimator(name: EstimatorName): { estimate: AdvantageFunction; greedyBaseline: boolean } {
  switch (name) {
    case 'grpo':
      return { estimate: (b) => grpoAdvantages(sequenceRewardBatch(b)), greedyBaseline: false };
    case 'dr_grpo':
      return { estimate: (b) => drGrpoAdvantages(sequenceRewardBatch(b)), greedyBaseline: false };
    case 'rloo':
      return { estimate: (b) => rlooAdvantages(sequenceRewardBatch(b)), greedyBaseline: false };
    case 'remax':
      return {
        estimate: (b) => {
          if (!b.greedyRewards) throw new Error("estimator 'remax': the batch has no greedyRewards (the loop must generate greedy baselines)");
          return remaxAdvantages({ ...sequenceRewardBatch(b), greedyRewards: b.greedyRewards });
        },
        greedyBaseline: true,
      };
    case 'reinforce_pp':
      return { estimate: (b) => reinforcePlusPlusAdvantages(b), greedyBaseline: false };
    case 'reinforce_pp_baseline':
      return { estimate: (b) => reinforcePlusPlusAdvantages(b, { baseline: 'group' }), greedyBaseline: false };
    default:
      throw new Error(`unknown advantage estimator '${name as string}' (built in: ${ESTIMATOR_NAMES.join(', ')})`);
  }
}
