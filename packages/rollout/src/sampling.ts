/**
 * Sampling from next-token logits in the graph: temperature, top-k, top-p, min-p (applied in that
 * order, each to the scores the previous one left, as transformers' logits processors do), then
 * inverse-CDF sampling with one host-made uniform per row (ONNX Runtime has no CUDA Multinomial).
 */
import * as L from '@lathe/onnx';
import type { Tensor } from '@lathe/onnx';

/** How to pick the next token. */
export interface SamplingOptions {
  /** 0 = greedy (argmax); otherwise logits are divided by it. Default 1. */
  temperature?: number;
  /** Keep the k most likely tokens (0 or undefined: off). */
  topK?: number;
  /** Keep the smallest set of most likely tokens whose probability reaches p (1 or undefined: off). */
  topP?: number;
  /** Drop tokens with p < minP · p_max (0 or undefined: off). */
  minP?: number;
}

/** Rejects invalid sampling parameters before any graph is built. */
export function validateSampling(o: SamplingOptions, vocabSize: number): void {
  const t = o.temperature ?? 1;
  if (!(t >= 0) || !Number.isFinite(t)) throw new Error(`temperature must be a finite number ≥ 0, got ${o.temperature}`);
  if (o.topK !== undefined && (!Number.isInteger(o.topK) || o.topK < 0 || o.topK > vocabSize)) {
    throw new Error(`top_k must be an integer in [0, ${vocabSize}], got ${o.topK}`);
  }
  if (o.topP !== undefined && !(o.topP > 0 && o.topP <= 1)) throw new Error(`top_p must be in (0, 1], got ${o.topP}`);
  if (o.minP !== undefined && !(o.minP >= 0 && o.minP <= 1)) throw new Error(`min_p must be in [0, 1], got ${o.minP}`);
}

const NEG_INF = -Infinity;

/**
 * The scores sampling draws from (float32 [B, V]): logits / temperature with −∞ on every token the
 * filters remove. With temperature 0 the logits are returned unchanged (greedy).
 */
export function filteredScores(logits: Tensor, o: SamplingOptions): Tensor {
  const t = o.temperature ?? 1;
  let s = t === 0 || t === 1 ? logits : L.div(logits, t);
  if (t === 0) return s;
  const V = logits.shape[1] as number;
  const drop = (keep: Tensor) => L.where(keep, s, NEG_INF);
  if (o.topK && o.topK < V) {
    const [vals] = L.topK(s, o.topK, -1);
    const kth = L.slice(vals, [1], [o.topK - 1], [o.topK]);
    s = drop(L.greaterOrEqual(s, kth));
  }
  if (o.topP !== undefined && o.topP < 1) {
    const [sorted, idx] = L.topK(s, V, -1);
    const probs = L.softmax(sorted, -1);
    // Keep a sorted token if the mass before it is < p (so the first always stays).
    const before = L.cumsum(probs, 1, { exclusive: true });
    const keepSorted = L.cast(L.less(before, o.topP), 'float32');
    const keep = L.scatterElements(L.zerosLike(s), idx, keepSorted, 1);
    s = drop(L.greater(keep, 0.5));
  }
  if (o.minP) {
    const probs = L.softmax(s, -1);
    const pmax = L.reduceMax(probs, [1], true);
    s = drop(L.greaterOrEqual(probs, L.mul(pmax, o.minP)));
  }
  return s;
}

/**
 * Index of the first maximum along the last axis of float32 [B, V], as int64 [B, 1] — ArgMax's
 * result, from max, compare and min reductions over float indices (exact below 2²⁴), in two stages
 * over [B, V/k, k] when k ∈ {256, 128, 64, 32} divides V. ONNX Runtime's CUDA reductions over one
 * long axis parallelise over rows only: ArgMax over [64, 151936] took 9.4 ms (H100), most of a
 * decode step; reducing 128-wide chunks first gives every block work.
 */
export function firstArgMax(x: Tensor): Tensor {
  const [B, V] = x.shape as [number | string, number];
  const g = x.graph;
  const k = [256, 128, 64, 32].find((c) => V % c === 0 && V / c >= 2);
  if (!k) {
    const isMax = L.equal(x, L.reduceMax(x, [1], true));
    const index = g.constant(Float32Array.from({ length: V }, (_, i) => i), 'float32', [V]);
    return L.cast(L.reduceMin(L.where(isMax, index, g.constant(V, 'float32', [])), [1], true), 'int64');
  }
  const chunks = L.reshape(x, [B, V / k, k]);
  const max = L.reduceMax(L.reduceMax(chunks, [2], true), [1], true); // [B, 1, 1]
  const index = g.constant(Float32Array.from({ length: V }, (_, i) => i), 'float32', [V / k, k]);
  const candidates = L.where(L.equal(chunks, max), index, g.constant(V, 'float32', []));
  const first = L.reduceMin(L.reduceMin(candidates, [2]), [1], true); // [B, 1]
  return L.cast(first, 'int64');
}

/** What one sampling step returns, each [B]. */
export interface SampledTokens {
  tokens: Tensor;
  /** log-prob of the token under the sampling distribution (after temperature and filters). */
  logprobs: Tensor;
  /** log-prob of the token under the raw model (temperature 1, no filters). */
  rawLogprobs: Tensor;
}

/**
 * Picks one token per row from float32 logits [B, V]: argmax when the temperature is 0, otherwise
 * the token whose cumulative probability interval holds `uniform` (float32 [B], in (0, 1)).
 */
export function sampleNext(logits: Tensor, o: SamplingOptions, uniform?: Tensor): SampledTokens {
  const scores = filteredScores(logits, o);
  let tokens: Tensor;
  if ((o.temperature ?? 1) === 0) tokens = firstArgMax(scores);
  else {
    if (!uniform) throw new Error('sampling with temperature > 0 needs uniform noise');
    // token = #{i : cdf_i < u·total}: the first index whose cumulative mass reaches u·total.
    // Filtered tokens add nothing to the cdf, so they can never be that first index.
    const cdf = L.cumsum(L.softmax(scores, -1), 1);
    const total = L.slice(cdf, [1], [-1], [Number.MAX_SAFE_INTEGER]); // [B, 1]
    const threshold = L.mul(L.unsqueeze(uniform, [1]), total);
    tokens = L.reduceSum(L.cast(L.less(cdf, threshold), 'int64'), [1], true); // [B, 1]
  }
  const pick = (t: Tensor) => L.squeeze(L.gatherElements(t, tokens, 1), [1]);
  return {
    tokens: L.squeeze(tokens, [1]),
    logprobs: pick(L.logSoftmax(scores, -1)),
    rawLogprobs: pick(L.logSoftmax(logits, -1)),
  };
}
