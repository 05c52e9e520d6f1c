/**
 * The critic's graphs: the training loss (cross-entropy of each target token's grid cell under a
 * softmax restricted to the grid's tokens) and the labelling forward pass, which scores a whole
 * attempt and every candidate of every position in one run by tree attention.
 */
import * as L from '@lathe/onnx';
import type { Graph, Tensor } from '@lathe/onnx';
import { decoder, packedCausalMask, paddedCausalMask, positionsFromPadding, restrictedLogits, type DecoderConfig, type Weights } from '@lathe/models';
import { castWeights, type DecoderLossOptions, type LossBuilder } from '@lathe/train';
import { gridShape, type CriticBins } from './bins';

/** Options of {@link criticLoss}: the decoder's (composed attention only) and packing. */
export interface CriticLossOptions extends Omit<DecoderLossOptions, 'flashAttention'> {
  /**
   * Packed rows (as `lathe sft --packing`): `segment_ids` and `position_ids` [B, T] take the place
   * of `attention_mask`, and attention is block-diagonal causal, so each packed sequence is trained
   * as it would be alone.
   */
  packing?: boolean;
}

/**
 * −Σ log p(cell | tokens ≤ t) over target tokens / `loss_tokens`, with p the softmax of the LM
 * head's rows for the grid's tokens only. The hidden state at token t (having read it) predicts the
 * cell of (final reward, tokens after t), so no shift. Batch inputs: `input_ids` [B, T], `labels`
 * [B, T] int64 (grid cell, −1 where nothing is predicted), `loss_tokens` float32 scalar, and
 * `attention_mask` or, packed, `segment_ids` and `position_ids`. Metrics: `cell_nll_sum`,
 * `cell_correct` (targets whose most likely cell is the label).
 */
export function criticLoss(cfg: DecoderConfig, bins: CriticBins, opts: CriticLossOptions = {}): LossBuilder {
  const cells = gridShape(bins).cells;
  return (g, params) => {
    const dims = opts.shape ?? ['B', 'T'];
    const ids = g.input('input_ids', 'int64', dims);
    const labels = g.input('labels', 'int64', dims);
    const normaliser = g.input('loss_tokens', 'float32', []);
    let positionIds: Tensor;
    let attentionMask: Tensor;
    if (opts.packing) {
      const segments = g.input('segment_ids', 'int64', dims);
      positionIds = g.input('position_ids', 'int64', dims);
      attentionMask = packedCausalMask(segments);
    } else {
      const mask = g.input('attention_mask', 'int64', dims);
      positionIds = positionsFromPadding(mask);
      attentionMask = paddedCausalMask(mask);
    }
    const w = opts.weights ? opts.weights(g, params) : castWeights(params, opts.compute ?? 'float32');
    const { hidden } = decoder(cfg, w, { inputIds: ids, positionIds, attentionMask, recompute: opts.recompute });
    const logits = L.cast(restrictedLogits(cfg, w, hidden, bins.first_token_id, cells), 'float32');
    const target = L.greaterOrEqual(labels, g.constant(0, 'int64', []));
    const logp = L.tokenLogprobs(logits, L.maximum(labels, g.constant(0, 'int64', [])));
    const nllSum = L.neg(L.maskedSum(logp, target));
    const best = L.topK(logits, 1, -1)[1];
    const correct = L.maskedSum(L.cast(L.equal(L.squeeze(best, [2]), labels), 'float32'), target);
    return { loss: L.div(nllSum, normaliser), metrics: { cell_nll_sum: nllSum, cell_correct: L.stopGradient(correct) } };
  };
}

/**
 * Tree attention for labelling: a row holds an attempt's tokens (with whatever precedes them) in
 * order, then candidate tokens, each standing in for the main token at its position. A token
 * attends itself and the main tokens at earlier positions, so each candidate sees exactly the
 * prefix it would extend and nothing of the other candidates. bool [B, 1, N, N] from `position_ids` and `is_candidate` [B, N] (1 for
 * candidates and padding, which then attends only itself).
 */
export function treeMask(positionIds: Tensor, isCandidate: Tensor): Tensor {
  const g = positionIds.graph;
  const main = L.equal(isCandidate, g.constant(0, isCandidate.dtype, []));
  const order = L.cumsum(L.cast(L.add(L.mul(positionIds, 0), 1), 'float32'), 1); // 1…N per row
  const self = L.equal(L.unsqueeze(order, [1, 3]), L.unsqueeze(order, [1, 2]));
  const earlier = L.less(L.unsqueeze(positionIds, [1, 2]), L.unsqueeze(positionIds, [1, 3])); // key position < query position
  return L.or(self, L.and(earlier, L.unsqueeze(main, [1, 2])));
}

/**
 * The labelling graph's outputs from its inputs `input_ids`, `position_ids`, `is_candidate`
 * [B, N] int64: `cell_probs` float32 [B, N, cells], the critic's distribution over the grid at
 * every token (for a candidate: having read the prefix and the candidate in its place).
 */
export function criticTreeProbs(g: Graph, cfg: DecoderConfig, bins: CriticBins, w: Weights): Tensor {
  const ids = g.input('input_ids', 'int64', ['B', 'N']);
  const positionIds = g.input('position_ids', 'int64', ['B', 'N']);
  const isCandidate = g.input('is_candidate', 'int64', ['B', 'N']);
  const { hidden } = decoder(cfg, w, { inputIds: ids, positionIds, attentionMask: treeMask(positionIds, isCandidate) });
  const logits = L.cast(restrictedLogits(cfg, w, hidden, bins.first_token_id, gridShape(bins).cells), 'float32');
  return L.softmax(logits, -1);
}
