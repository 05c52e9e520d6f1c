/**
 * What quantization changed in a model's predictions: per token, KL(original ‖ quantized) of the
 * next-token distributions and each model's log-prob of the token that followed, computed in one
 * graph over both models' weights (float32 statistics), and their summary over chosen tokens.
 */
import * as L from '@lathe/onnx';
import type { Graph, Tensor } from '@lathe/onnx';
import { decoder, lmLogits, paddedCausalMask, positionsFromPadding, type DecoderConfig, type Weights } from '@lathe/models';

/** Inputs and outputs of {@link addDistributionShift}'s graph. */
export const SHIFT_IO = {
  inputIds: 'input_ids',
  attentionMask: 'attention_mask',
  /** int64 [B, T]: the token after each position (any id where not scored). */
  targets: 'targets',
  kl: 'kl',
  logpOriginal: 'logp_original',
  logpQuantized: 'logp_quantized',
} as const;

/**
 * Adds to `g` the per-position KL(original ‖ quantized) [B, T] and both models' log-probs of
 * `targets` [B, T], for rows padded on either side (attention masked, positions from the mask).
 */
export function addDistributionShift(g: Graph, config: DecoderConfig, original: Weights, quantized: Weights): void {
  const ids = g.input(SHIFT_IO.inputIds, 'int64', ['B', 'T']);
  const mask = g.input(SHIFT_IO.attentionMask, 'int64', ['B', 'T']);
  const targets = g.input(SHIFT_IO.targets, 'int64', ['B', 'T']);
  const inputs = { inputIds: ids, positionIds: positionsFromPadding(mask), attentionMask: paddedCausalMask(mask) };
  const logp = (w: Weights): Tensor => L.logSoftmax(L.cast(lmLogits(config, w, decoder(config, w, inputs).hidden), 'float32'), -1);
  const lp = g.scope('original', () => logp(original));
  const lq = g.scope('quantized', () => logp(quantized));
  g.output(L.reduceSum(L.mul(L.exp(lp), L.sub(lp, lq)), [-1]), SHIFT_IO.kl);
  g.output(L.squeeze(L.gatherElements(lp, L.unsqueeze(targets, [2]), 2), [2]), SHIFT_IO.logpOriginal);
  g.output(L.squeeze(L.gatherElements(lq, L.unsqueeze(targets, [2]), 2), [2]), SHIFT_IO.logpQuantized);
}

/** The shift over the scored tokens. */
export interface ShiftSummary {
  tokens: number;
  klMean: number;
  klMax: number;
  /** exp(mean −log p) of the scored tokens under each model. */
  perplexityOriginal: number;
  perplexityQuantized: number;
  /** perplexityQuantized / perplexityOriginal − 1. */
  perplexityChange: number;
}

/** Running sums of {@link ShiftSummary}: add each batch's outputs with the mask of positions to score. */
export class ShiftAccumulator {
  private n = 0;
  private kl = 0;
  private klMax = 0;
  private nllO = 0;
  private nllQ = 0;

  /** Adds the positions where `scored` is 1. */
  add(kl: ArrayLike<number>, logpOriginal: ArrayLike<number>, logpQuantized: ArrayLike<number>, scored: ArrayLike<number>): void {
    for (let i = 0; i < scored.length; i++) {
      if (!scored[i]) continue;
      const d = Math.max(0, kl[i]); // float rounding can make a zero KL slightly negative
      this.n++;
      this.kl += d;
      this.klMax = Math.max(this.klMax, d);
      this.nllO -= logpOriginal[i];
      this.nllQ -= logpQuantized[i];
    }
  }

  summary(): ShiftSummary {
    if (this.n === 0) throw new Error('distribution shift: no tokens were scored');
    const po = Math.exp(this.nllO / this.n);
    const pq = Math.exp(this.nllQ / this.n);
    return { tokens: this.n, klMean: this.kl / this.n, klMax: this.klMax, perplexityOriginal: po, perplexityQuantized: pq, perplexityChange: pq / po - 1 };
  }
}

/** Pearson correlation of two equally long series. */
export function pearson(a: ArrayLike<number>, b: ArrayLike<number>): number {
  const n = a.length;
  if (n !== b.length || n < 2) throw new Error(`pearson: need two series of equal length ≥ 2, got ${a.length} and ${b.length}`);
  let ma = 0;
  let mb = 0;
  for (let i = 0; i < n; i++) {
    ma += a[i] / n;
    mb += b[i] / n;
  }
  let sab = 0;
  let saa = 0;
  let sbb = 0;
  for (let i = 0; i < n; i++) {
    sab += (a[i] - ma) * (b[i] - mb);
    saa += (a[i] - ma) ** 2;
    sbb += (b[i] - mb) ** 2;
  }
  return sab / Math.sqrt(saa * sbb);
}
