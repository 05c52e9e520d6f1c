/**
 * What the pair losses (Bradley-Terry, DPO) share: the token inputs of a pair batch, how the
 * model's forward pass is built over them, the split of 2P rows into chosen and rejected, and the
 * ranking metrics — how often a loss's per-pair score (a reward, or DPO's implicit reward) puts the
 * chosen response first, and by what mean margin.
 */
import * as L from '@lathe/onnx';
import type { Graph, Tensor } from '@lathe/onnx';
import { totalLength, type TrunkOptions, type Weights } from '@lathe/models';
import { castWeights, type DecoderLossOptions } from '@lathe/train';
import { PAIR_INPUTS } from './pairs';

/** How a pair loss builds the model's forward pass (a fixed `shape` counts 2P rows: chosen, then rejected). */
export type PairLossModelOptions = DecoderLossOptions;

/** The [rows, width] dims of a pair loss's token inputs: the fixed shape (2P rows), or [2*P, T]. */
export function pairDims(shape: [number, number] | undefined): [number | string, number | string] {
  if (!shape) return ['2*P', 'T'];
  if (!Number.isInteger(shape[0] / 2) || shape[0] < 2) throw new Error(`pair loss: shape [${shape.join(', ')}] needs an even, positive row count (2 rows per pair)`);
  return shape;
}

/** A pair batch's `input_ids` and `attention_mask` as graph inputs, int64 [2P, T] (see {@link pairDims}). */
export function pairTokenInputs(g: Graph, shape: [number, number] | undefined): { dims: [number | string, number | string]; ids: Tensor; mask: Tensor } {
  const dims = pairDims(shape);
  return { dims, ids: g.input(PAIR_INPUTS.inputIds, 'int64', dims), mask: g.input(PAIR_INPUTS.attentionMask, 'int64', dims) };
}

/**
 * The forward pass's weights from the trainable parameters, and the trunk's options: recomputed
 * layers, and flash attention over the width of `ids`.
 */
export function pairLossModel(g: Graph, params: Map<string, Tensor>, ids: Tensor, opts: PairLossModelOptions): { w: Weights; trunk: TrunkOptions } {
  const w = opts.weights ? opts.weights(g, params) : castWeights(params, opts.compute ?? 'float32');
  return { w, trunk: { recompute: opts.recompute, ...(opts.flashAttention ? { attention: 'flash' as const, totalSequenceLength: totalLength(g, ids), attentionKernel: opts.attentionKernel } : {}) } };
}

/** Rows [2P] as chosen [P] and rejected [P]. */
export function chosenAndRejected(rows: Tensor): { chosen: Tensor; rejected: Tensor } {
  const [chosen, rejected] = L.split(L.reshape(rows, [2, -1]), [1, 1], 0).map((t) => L.squeeze(t, [0]));
  return { chosen, rejected };
}

/** The metric sums behind {@link RankingMetrics}, the first of every pair loss's sums. */
export const RANKING_SUMS = ['pairs', 'correct', 'margin_sum'] as const;

/**
 * The ranking sums over a micro-batch, float32 scalars, from per-pair scores `chosen` and
 * `rejected` [P] and their difference `margin` (chosen − rejected, as the loss computed it).
 */
export function rankingSums(chosen: Tensor, rejected: Tensor, margin: Tensor): Record<(typeof RANKING_SUMS)[number], Tensor> {
  const sum = (x: Tensor) => L.cast(L.reduceSum(x), 'float32');
  return {
    pairs: sum(L.onesLike(margin)),
    correct: sum(L.cast(L.greater(chosen, rejected), margin.dtype)),
    margin_sum: sum(margin),
  };
}

/** How a pair loss's scores rank the pairs, over a batch or a whole evaluation set. */
export interface RankingMetrics {
  /** Pairs counted. */
  pairs: number;
  /** Share of pairs whose chosen response scores higher (ties count as wrong, as in TRL). */
  accuracy: number;
  /** Mean score margin, chosen − rejected. */
  margin: number;
}

/**
 * A pair loss's metrics from its metric sums (a train step's `metrics`, or sums made on the host):
 * the sums `names` read (a missing one is an error naming it), the {@link RankingMetrics}, and the
 * loss's own means from `means` (given the sums and the pair count, never 0: no pairs is an error).
 * `where` names the caller in errors.
 */
export function pairMetrics<K extends string, T>(
  sums: Readonly<Record<string, number>>,
  names: readonly ((typeof RANKING_SUMS)[number] | K)[],
  where: string,
  means: (s: Record<K, number>, n: number) => T,
): RankingMetrics & T {
  const s = pickSums(sums, names, where);
  const n = s.pairs;
  if (!(n > 0)) throw new Error(`${where}: no pairs`);
  return { pairs: n, accuracy: s.correct / n, margin: s.margin_sum / n, ...means(s, n) };
}

/** The named sums of `sums`, each required. */
export function pickSums<K extends string>(sums: Readonly<Record<string, number>>, names: readonly K[], where: string): Record<K, number> {
  const out = {} as Record<K, number>;
  for (const k of names) {
    if (typeof sums[k] !== 'number') throw new Error(`${where}: no metric sum '${k}' (expected ${names.join(', ')})`);
    out[k] = sums[k];
  }
  return out;
}
