/**
 * The Bradley-Terry loss of a reward model over preference pairs (TRL's `RewardTrainer`):
 *
 *   loss = Σ_pairs −log σ(r_c − r_r − m) / N  +  c · Σ_pairs (r_c + r_r)² / N
 *
 * with r_c, r_r the rewards of the chosen and rejected rows, m an optional per-pair margin, c the
 * centring coefficient (TRL's `center_rewards_coefficient`, which keeps rewards near zero) and N the
 * pairs in the whole optimizer batch (a batch input), so micro-batch losses add up to the batch's.
 * Metrics are sums over the micro-batch, which the Trainer adds over micro-batches;
 * {@link preferenceMetrics} turns them into accuracy, mean margin and reward means and stds.
 */
import * as L from '@lathe/onnx';
import type { Tensor } from '@lathe/onnx';
import { accumulationDtype, type DecoderConfig } from '@lathe/models';
import type { LossBuilder, LossOutputs } from '@lathe/train';
import { chosenAndRejected, pairLossModel, pairMetrics, pairTokenInputs, RANKING_SUMS, rankingSums, type PairLossModelOptions, type RankingMetrics } from './pair-loss';
import { PAIR_INPUTS } from './pairs';
import { sequenceRewards } from './reward-graph';

/** The names of the metric sums {@link bradleyTerryObjective} outputs: the ranking sums, then the rewards' sums and sums of squares. */
export const PREFERENCE_SUMS = [...RANKING_SUMS, 'chosen_sum', 'chosen_sq_sum', 'rejected_sum', 'rejected_sq_sum'] as const;

/** The metric sums {@link bradleyTerryLoss} outputs (summed over micro-batches by the Trainer). */
export type PreferenceSums = Record<(typeof PREFERENCE_SUMS)[number], number>;

/** The Bradley-Terry objective's inputs, all in one float dtype. */
export interface BradleyTerryTerms {
  /** Rewards of the 2P rows, [2P]: chosen rows first, then rejected rows in the same pair order. */
  rewards: Tensor;
  /** Pairs N in the whole optimizer batch, a scalar. */
  pairCount: Tensor;
  /** Per-pair margin m, [P]. */
  margin?: Tensor;
  /** Centring coefficient c (0 or omitted: no term). */
  centerCoefficient?: number;
}

/**
 * The loss (module comment; in the rewards' dtype, float32 unless the model is float64) and float32
 * metric sums from the rows' rewards.
 */
export function bradleyTerryObjective(t: BradleyTerryTerms): LossOutputs {
  const { chosen, rejected } = chosenAndRejected(t.rewards);
  const diff = L.sub(chosen, rejected);
  const logits = t.margin ? L.sub(diff, L.cast(t.margin, diff.dtype)) : diff;
  let total = L.neg(L.reduceSum(L.logSigmoid(logits)));
  if (t.centerCoefficient) total = L.add(total, L.mul(L.reduceSum(L.square(L.add(chosen, rejected))), t.centerCoefficient));
  const sum = (x: Tensor) => L.cast(L.reduceSum(x), 'float32');
  return {
    loss: L.div(total, L.cast(t.pairCount, total.dtype)),
    metrics: {
      ...rankingSums(chosen, rejected, diff),
      chosen_sum: sum(chosen),
      chosen_sq_sum: sum(L.square(chosen)),
      rejected_sum: sum(rejected),
      rejected_sq_sum: sum(L.square(rejected)),
    },
  };
}

/** Options of {@link bradleyTerryLoss}. */
export interface BradleyTerryOptions extends PairLossModelOptions {
  /** Read a per-pair margin from the `margin` input [P]. Default false. */
  margin?: boolean;
  /** Centring coefficient c. Default 0. */
  centerCoefficient?: number;
}

/**
 * The Bradley-Terry loss as a train-step loss (for `compileTrainStep` / `Trainer`) over a reward
 * model `cfg`. Batch inputs: `input_ids` and `attention_mask` int64 [2P, T] (a {@link pairBatch}),
 * `pair_count` float32 scalar, with `margin` also `margin` float32 [P], and with flash attention
 * over symbolic shapes `total_sequence_length`. Metrics (sums): `pairs`, `correct`, `margin_sum`,
 * `chosen_sum`, `chosen_sq_sum`, `rejected_sum`, `rejected_sq_sum`.
 */
export function bradleyTerryLoss(cfg: DecoderConfig, opts: BradleyTerryOptions = {}): LossBuilder {
  return (g, params) => {
    const { ids, mask } = pairTokenInputs(g, opts.shape);
    const margin = opts.margin ? g.input(PAIR_INPUTS.margin, 'float32', [opts.shape ? opts.shape[0] / 2 : 'P']) : undefined;
    const pairCount = g.input(PAIR_INPUTS.pairCount, 'float32', []);
    const { w, trunk } = pairLossModel(g, params, ids, opts);
    const rewards = sequenceRewards(cfg, w, ids, mask, trunk);
    const dtype = accumulationDtype(rewards.dtype);
    return bradleyTerryObjective({ rewards, pairCount: L.cast(pairCount, dtype), margin, centerCoefficient: opts.centerCoefficient });
  };
}

/** The same sums from rewards scored on the host (an evaluation set): chosen[i] and rejected[i] are pair i's. */
export function preferenceSums(chosen: ArrayLike<number>, rejected: ArrayLike<number>): PreferenceSums {
  if (chosen.length !== rejected.length) throw new Error(`preferenceSums: ${chosen.length} chosen rewards but ${rejected.length} rejected`);
  const s: PreferenceSums = { pairs: chosen.length, correct: 0, margin_sum: 0, chosen_sum: 0, chosen_sq_sum: 0, rejected_sum: 0, rejected_sq_sum: 0 };
  for (let i = 0; i < chosen.length; i++) {
    const c = chosen[i];
    const r = rejected[i];
    s.correct += c > r ? 1 : 0;
    s.margin_sum += c - r;
    s.chosen_sum += c;
    s.chosen_sq_sum += c * c;
    s.rejected_sum += r;
    s.rejected_sq_sum += r * r;
  }
  return s;
}

/** Reward means and population stds beside the ranking metrics, over a batch or a whole evaluation set. */
export interface PreferenceMetrics extends RankingMetrics {
  chosenMean: number;
  /** Population standard deviation of r_c. */
  chosenStd: number;
  rejectedMean: number;
  rejectedStd: number;
}

/**
 * Accuracy, mean margin and reward means and population stds from metric sums: {@link preferenceSums}'
 * or a train step's `metrics` (a missing sum is an error naming it).
 */
export function preferenceMetrics(sums: Readonly<Record<string, number>>): PreferenceMetrics {
  return pairMetrics(sums, PREFERENCE_SUMS, 'preferenceMetrics', (s, n) => {
    const std = (sum: number, sq: number) => Math.sqrt(Math.max(0, sq / n - (sum / n) ** 2));
    return { chosenMean: s.chosen_sum / n, chosenStd: std(s.chosen_sum, s.chosen_sq_sum), rejectedMean: s.rejected_sum / n, rejectedStd: std(s.rejected_sum, s.rejected_sq_sum) };
  });
}
