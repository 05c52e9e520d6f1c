/**
 * Sampling from next-token logits in the graph: temperature, top-k, top-p, min-p (applied in that
 * order, each to the scores the previous one left, as transformers' logits processors do), then
 * inverse-CDF sampling with one host-made uniform per row (ONNX Runtime has no CUDA Multinomial).
 *
 * Why everything reduces over vocabulary *chunks*: ONNX Runtime's CUDA reductions over one long
 * axis parallelise over rows only, and its CUDA CumSum has every output element re-add its whole
 * prefix — O(V²) work per row over a 151,936-token vocabulary. So when a chunk width
 * k ∈ {256, 128, 64, 32} divides V, the scores are viewed as [B, V/k, k] and every max, sum and
 * prefix sum runs in two stages: within chunks (k wide), then across chunks (V/k wide). When no
 * width divides V, the same code runs with one chunk of V (the one-stage form).
 *
 * Which kernels: the within-chunk max runs as MaxPool rather than ReduceMax (the CUDA provider
 * hands Max/Min reductions to cuDNN), and a log-partition the pick does not otherwise need comes
 * from one LogSoftmax kernel rather than max, subtract, exp and sum passes — each the faster one
 * measured (docs/benchmarks.md; tools/bench/rollout/pick-bench.ts).
 */
import * as L from '@lathe/onnx';
import type { Tensor } from '@lathe/onnx';

/** How to pick the next token. */
export interface SamplingOptions {
  /** 0 = greedy (argmax); otherwise logits are divided by it. Default 1. */
  temperature?: number;
  /** Keep the k most likely tokens (0 or undefined: off). */
  topK?: number;
  /**
   * Keep the smallest set of most likely tokens whose probability reaches p (1 or undefined: off).
   * After a top-k of at most 256, tokens tied with the last kept value are kept with it.
   */
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
 * Width of the vocabulary chunks that two-stage reductions use: the widest of 256, 128, 64, 32
 * that splits V into at least two chunks, or V itself (one chunk: the one-stage form) when none
 * does (`windowWidth` in @lathe/onnx). 151,936 (Qwen) gives 128.
 */
export function vocabChunkWidth(V: number): number {
  return L.windowWidth(V);
}

/** float32 [B, V] viewed as chunks [B, V/k, k] (k = {@link vocabChunkWidth}). */
function chunks(x: Tensor): Tensor {
  const [B, V] = x.shape;
  if (typeof V !== 'number') throw new Error(`sampling: the vocabulary axis must be static, got [${x.shape}]`);
  const k = vocabChunkWidth(V);
  return L.reshape(x, [B, V / k, k]);
}

/** The row maximum of float32 [B, V], as [B, 1, 1]: within chunks (MaxPool), then across them. */
function rowMax(x: Tensor): Tensor {
  return L.unsqueeze(L.lastAxisMax(x), [2]);
}

/**
 * Running sum along the last axis of [B, V] (exclusive: of the elements before), in two stages
 * when V splits into chunks: prefix sums within each chunk plus the exclusive prefix sum of the
 * chunk totals. ONNX Runtime's CUDA CumSum re-adds each element's whole prefix (O(V²) per row);
 * this is O(V·k + (V/k)²).
 */
function prefixSum(x: Tensor, exclusive: boolean): Tensor {
  const [B, V] = x.shape as [number | string, number];
  const c = chunks(x);
  if (c.shape[1] === 1) return L.cumsum(x, 1, { exclusive });
  const offsets = L.cumsum(L.reduceSum(c, [2]), 1, { exclusive: true }); // [B, C]
  return L.reshape(L.add(L.cumsum(c, 2, { exclusive }), L.unsqueeze(offsets, [2])), [B, V]);
}

/**
 * The k largest values of each row of float32 [B, V], sorted (largest first), [B, k], without a
 * TopK over V: the k largest chunk maxima are k distinct elements, so the k-th largest value v* is
 * at least the k-th largest chunk maximum m_k. If v* > m_k, every element ≥ v* lies in a chunk whose
 * maximum exceeds m_k, and those chunks are all among the k picked by a TopK over the V/w chunk
 * maxima; if v* = m_k, the picked chunks' own maxima supply it. Either way a TopK(k) over the k·w
 * elements of the picked chunks gives the row's k largest values. Needs k ≤ V/w.
 */
function largestValues(s: Tensor, k: number): Tensor {
  const c = chunks(s); // [B, C, w]
  const [B, C, w] = c.shape as [number | string, number, number];
  const [, picked] = L.topK(L.windowMax(L.reshape(s, [B, 1, C * w]), w), k, -1); // [B, 1, k]: chunk numbers
  const spread = L.add(L.unsqueeze(L.squeeze(picked, [1]), [2]), s.graph.constant(new Array<number>(w).fill(0), 'int64', [1, 1, w])); // [B, k, w]
  const candidates = L.reshape(L.gatherElements(c, spread, 1), [B, k * w]);
  return L.topK(candidates, k, -1)[0];
}

/** Largest k for which {@link largestValues} runs instead of a TopK over the vocabulary. */
const TWO_STAGE_TOP_K = 256;

/**
 * Which tokens of float32 [B, V] the nucleus keeps when its threshold is not read off a two-stage
 * top-k: rows sorted (TopK(V)), then a sorted token is kept while the mass before it is < p, so
 * the most likely token always stays. Ties rank by index, as TopK orders them.
 */
function nucleusPerRow(s: Tensor, p: number): Tensor {
  const [sorted, idx] = L.topK(s, s.shape[1], -1);
  const before = prefixSum(L.softmax(sorted, -1), true);
  const keep = L.scatterElements(L.zerosLike(s), idx, L.cast(L.less(before, p), 'float32'), 1);
  return L.greater(keep, 0.5);
}

/**
 * {@link nucleusPerRow}'s result from one sort of the whole batch, for a static row count.
 *
 * Why: ONNX Runtime's CUDA TopK sorts a K this large with cub's radix sort, launched once per row
 * in a loop over the rows, which dominated a decode step (docs/benchmarks.md). Here each row is
 * given a disjoint key range: float64 r·512 + (s − row max), clamped at
 * −256 (far below where exp underflows, so the clamped tokens weigh 0 and are ranked last either
 * way). One descending TopK over the flattened [1, B·V] then lists row B−1's tokens first, then row
 * B−2's, and so on, each row's in its own descending order. Ties rank by index, as in the per-row
 * sort. Keys stay below B·512 in magnitude, so each is within B·2⁻⁴⁴ of its exact value (2⁻³⁶ at
 * B = 256): two scores closer than that may swap places, and distinct float32 scores are that close
 * only within ~2.4·10⁻⁴ of zero. Used while B·V < 2³¹ (cub's radix sort has counted its items in
 * an int; past that, and for a symbolic row count, the per-row sort).
 */
function nucleusOneSort(s: Tensor, B: number, p: number): Tensor {
  const V = s.shape[1] as number;
  const g = s.graph;
  const relative = L.sub(L.cast(s, 'float64'), L.cast(L.squeeze(rowMax(s), [2]), 'float64')); // ≤ 0, −∞ where dropped
  const offsets = g.constant(Array.from({ length: B }, (_, r) => r * 512), 'float64', [B, 1]);
  const keys = L.reshape(L.add(L.maximum(relative, g.constant([-256], 'float64', [])), offsets), [1, B * V]);
  const [, order] = L.topK(keys, B * V, -1); // [1, B·V]: flat indices, V per row, rows from the last
  const sorted = L.reshape(L.gather(L.reshape(s, [B * V]), L.reshape(order, [B * V]), 0), [B, V]);
  const before = prefixSum(L.softmax(sorted, -1), true);
  const keepSorted = L.reshape(L.cast(L.less(before, p), 'float32'), [1, B * V]);
  const keep = L.scatterElements(L.zerosLike(keepSorted), order, keepSorted, 1);
  return L.greater(L.reshape(keep, [B, V]), 0.5);
}

/**
 * The scores sampling draws from (float32 [B, V]): logits / temperature with −∞ on every token the
 * filters remove. With temperature 0 the logits are returned unchanged (greedy).
 *
 * Cost on a large vocabulary: temperature and min-p are elementwise plus a two-stage max. top-k
 * with k ≤ 256 (and k ≤ V/w chunks) finds its threshold in two stages ({@link largestValues}); top-p
 * after such a top-k ranks only those k values. A larger top-k is a TopK(k) over the vocabulary per
 * row, and top-p alone a sort of every score (one sort of the batch when the row count is static,
 * {@link nucleusOneSort}) plus a softmax over V — one-stage work that a decode step pays for every
 * token; leave those off where speed matters.
 */
export function filteredScores(logits: Tensor, o: SamplingOptions): Tensor {
  const t = o.temperature ?? 1;
  let s = t === 0 || t === 1 ? logits : L.div(logits, t);
  if (t === 0) return s;
  const V = logits.shape[1] as number;
  const drop = (keep: Tensor) => L.where(keep, s, NEG_INF);
  const k = o.topK && o.topK < V ? o.topK : 0;
  const twoStage = k > 0 && k <= TWO_STAGE_TOP_K && k <= V / vocabChunkWidth(V);
  const nucleus = o.topP !== undefined && o.topP < 1;
  if (twoStage) {
    const top = largestValues(s, k); // [B, k], largest first
    const kth = L.slice(top, [1], [k - 1], [k]);
    const survives = L.greaterOrEqual(s, kth);
    s = drop(survives);
    if (nucleus) {
      // Top-p over the top-k survivors, ranked by the k sorted values, a token kept while the mass
      // before it is < p; tokens tied with the last kept value are kept with it. The mass is over
      // every survivor, read off the sorted values: the k of them, plus any further ties at the
      // k-th value (each weighing what the k-th does), so no pass over the vocabulary is needed
      // beyond counting the survivors.
      const max = L.slice(top, [1], [0], [1]); // [B, 1]
      const weights = L.exp(L.sub(top, max)); // [B, k]
      const extraTies = L.sub(L.reduceSum(L.cast(survives, 'float32'), [1], true), k); // [B, 1]
      const Z = L.add(L.reduceSum(weights, [1], true), L.mul(extraTies, L.exp(L.sub(kth, max))));
      const keepSorted = L.less(prefixSum(L.div(weights, Z), true), o.topP!);
      const lowest = L.reduceMin(L.where(keepSorted, top, Infinity), [1], true); // [B, 1]
      s = drop(L.greaterOrEqual(s, lowest));
    }
  } else if (k) {
    const [vals] = L.topK(s, k, -1);
    const kth = L.slice(vals, [1], [k - 1], [k]);
    s = drop(L.greaterOrEqual(s, kth));
  }
  if (nucleus && !twoStage) {
    const B = s.shape[0];
    const oneSort = typeof B === 'number' && B > 1 && B * V < 2 ** 31;
    s = drop(oneSort ? nucleusOneSort(s, B, o.topP!) : nucleusPerRow(s, o.topP!));
  }
  if (o.minP) {
    // p ≥ min_p · p_max ⇔ s − max(s) ≥ log(min_p): no softmax over the vocabulary needed.
    const max = L.squeeze(rowMax(s), [2]); // [B, 1]
    s = drop(L.greaterOrEqual(L.sub(s, max), Math.log(o.minP)));
  }
  return s;
}

/**
 * Index of the first maximum along the last axis of float32 [B, V], as int64 [B, 1] — ArgMax's
 * result, in two stages over k-wide chunks (see {@link vocabChunkWidth}): MaxPool gives each
 * chunk's maximum and where its first maximum is; across the V/k chunks, the first chunk holding
 * the row maximum (a compare and a min over float chunk numbers) picks which index to keep.
 * ONNX Runtime's CUDA ArgMax over one long axis parallelises over rows only, which made it most of
 * a decode step (docs/benchmarks.md).
 */
export function firstArgMax(x: Tensor): Tensor {
  const [B, V] = x.shape as [number | string, number];
  const k = vocabChunkWidth(V);
  const C = V / k;
  const [chunkMax, where] = L.windowMaxWithIndex(L.reshape(x, [B, 1, V]), k); // [B, 1, C] each
  const rowMaxima = L.reduceMax(chunkMax, [2], true); // [B, 1, 1]
  const chunkNumber = x.graph.constant(Float32Array.from({ length: C }, (_, i) => i), 'float32', [C]);
  const firstChunk = L.reduceMin(L.where(L.equal(chunkMax, rowMaxima), chunkNumber, C), [2], true); // [B, 1, 1]
  const flat = L.gatherElements(where, L.cast(firstChunk, 'int64'), 2); // [B, 1, 1]: row·V + token
  return L.mod(L.reshape(flat, [B, 1]), x.graph.constant(V, 'int64', []));
}

/**
 * Where an inverse CDF lands along the last axis of [B, N], as a float32 index [B, 1]: the first
 * position of positive `mass` whose cumulative mass `through` reaches `threshold` [B, 1]. When
 * float rounding leaves the threshold above every cumulative value, the last position of positive
 * mass; a position of zero mass (a filtered token, an empty chunk) is never returned, whatever the
 * rounding. (Requiring positive mass also makes the pick independent of how CumSum rounds.)
 */
function firstReaching(through: Tensor, mass: Tensor, threshold: Tensor): Tensor {
  const N = through.shape[1] as number;
  const index = through.graph.constant(Float32Array.from({ length: N }, (_, i) => i), 'float32', [N]);
  const positive = L.greater(mass, 0);
  const first = L.reduceMin(L.where(L.and(positive, L.greaterOrEqual(through, threshold)), index, N), [1], true);
  const lastPositive = L.reduceMax(L.where(positive, index, 0), [1], true);
  return L.minimum(first, lastPositive);
}

/**
 * Inverse-CDF sampling over chunks: `e` [B, C, k] holds unnormalised probabilities (0 on filtered
 * tokens), `mass` [B, C] their chunk sums, `uniform` [B] one number in (0, 1) per row. Picks the
 * chunk whose cumulative mass first reaches u·total (a CumSum over C = V/k chunks), then, within
 * that chunk's k probabilities, the token whose cumulative mass first reaches the remainder (a
 * CumSum over k). Returns int64 [B, 1].
 */
function inverseCdf(e: Tensor, mass: Tensor, uniform: Tensor): Tensor {
  const k = e.shape[2] as number;
  const before = L.cumsum(mass, 1, { exclusive: true }); // [B, C]: mass of the chunks before
  const through = L.add(before, mass); // [B, C]: … and including each chunk
  const total = L.slice(through, [1], [-1], [Number.MAX_SAFE_INTEGER]); // [B, 1]
  const threshold = L.mul(L.unsqueeze(uniform, [1]), total);
  const chunk = L.cast(firstReaching(through, mass, threshold), 'int64'); // [B, 1]
  const spread = L.add(L.unsqueeze(chunk, [2]), e.graph.constant(new Array<number>(k).fill(0), 'int64', [1, 1, k]));
  const p = L.squeeze(L.gatherElements(e, spread, 1), [1]); // [B, k]: the chunk's probabilities
  const rest = L.sub(threshold, L.gatherElements(before, chunk, 1)); // [B, 1]
  const offset = L.cast(firstReaching(L.cumsum(p, 1), p, rest), 'int64');
  return L.add(L.mul(chunk, k), offset);
}

/** What one sampling step returns, each [B]. */
export interface SampledTokens {
  tokens: Tensor;
  /** log-prob of the token under the sampling distribution (after temperature and filters). */
  logprobs: Tensor;
  /** log-prob of the token under the raw model (temperature 1, no filters). */
  rawLogprobs: Tensor;
}

/** log p(token) per row, [B], from log-probabilities [B, V] and tokens int64 [B, 1]. */
function pickLogprob(logp: Tensor, tokens: Tensor): Tensor {
  return L.squeeze(L.gatherElements(logp, tokens, 1), [1]);
}

/**
 * Picks one token per row from float32 logits [B, V]: argmax when the temperature is 0, otherwise
 * the token whose cumulative probability interval holds `uniform` (float32 [B], in (0, 1)). Every
 * max and prefix sum over the vocabulary runs in two stages over chunks (module comment). Sampling
 * takes its log-prob from the chunk masses it already has (picked score − max − log Σ mass);
 * greedy picking and the raw model's log-prob take theirs from one LogSoftmax.
 */
export function sampleNext(logits: Tensor, o: SamplingOptions, uniform?: Tensor): SampledTokens {
  const greedy = (o.temperature ?? 1) === 0;
  if (!greedy && !uniform) throw new Error('sampling with temperature > 0 needs uniform noise');
  const scores = filteredScores(logits, o);
  let tokens: Tensor;
  let logprobs: Tensor;
  if (greedy) {
    tokens = firstArgMax(scores);
    logprobs = pickLogprob(L.logSoftmax(scores, 1), tokens);
  } else {
    const max = rowMax(scores); // [B, 1, 1]
    const e = L.exp(L.sub(chunks(scores), max)); // [B, C, k]: unnormalised probabilities, 0 on filtered tokens
    const mass = L.reduceSum(e, [2]); // [B, C]
    tokens = inverseCdf(e, mass, uniform!);
    const logZ = L.add(L.squeeze(max, [2]), L.log(L.reduceSum(mass, [1], true))); // [B, 1]
    logprobs = L.squeeze(L.sub(L.gatherElements(scores, tokens, 1), logZ), [1]);
  }
  const rawLogprobs = scores === logits ? logprobs : pickLogprob(L.logSoftmax(logits, 1), tokens);
  return { tokens: L.squeeze(tokens, [1]), logprobs, rawLogprobs };
}

/**
 * Sampling parameters given per row as graph inputs (one value per row, float32 [B] or int64 [B]),
 * so rows with different settings share one step. The host normalises "off": top_k V (or more),
 * top_p 1, min_p 0; temperature 0 is greedy for that row.
 */
export interface RowSamplingInputs {
  temperature: Tensor;
  topK: Tensor;
  topP: Tensor;
  minP: Tensor;
}

/**
 * How a per-row sampling graph applies top-k and top-p: 'none' leaves them out (every row has them
 * off); 'capped' finds each row's threshold among its {@link rowTopKCap} largest values, found in two
 * stages as {@link filteredScores} does (every row with top-p on has a top-k of at most the cap);
 * 'full' sorts the whole vocabulary per row (any settings).
 */
export type RowFilterMode = 'none' | 'capped' | 'full';

/** The largest per-row top-k the 'capped' mode serves for a vocabulary of V: 256, or V/w when fewer chunks. */
export function rowTopKCap(V: number): number {
  return Math.min(TWO_STAGE_TOP_K, V / vocabChunkWidth(V));
}

/**
 * {@link sampleNext} with per-row parameters: temperature, top-k, top-p and min-p in that order,
 * each row by its own values, then inverse-CDF sampling with `uniform` [B]; rows whose temperature
 * is 0 take the argmax of the raw logits. `filters` says how top-k and top-p are applied
 * ({@link RowFilterMode}; the host picks the cheapest one its rows allow). Top-k keeps tokens tied
 * with the k-th value, and top-p ranks the top-k survivors and keeps tokens tied with the last
 * kept one, as {@link filteredScores} does after a two-stage top-k. `plain`: every row has
 * temperature 1 or 0 and no top-k, top-p or min-p, so the graph leaves those passes out (the same
 * tokens and log-probs; the host picks it when its rows allow).
 */
export function sampleNextPerRow(logits: Tensor, o: RowSamplingInputs, uniform: Tensor, filters: RowFilterMode, plain = false): SampledTokens {
  const g = logits.graph;
  const V = logits.shape[1] as number;
  const column = (t: Tensor) => L.unsqueeze(t, [1]); // [B] → [B, 1]
  const greedy = L.equal(o.temperature, g.constant(0, 'float32', [])); // [B]
  if (plain) {
    // Every row samples the model's own distribution (temperature 1, no filter) or is greedy: the
    // scores are the logits, so there is no division, no min-p pass and no second log-softmax —
    // the sampled log-prob is the raw one. Passes over [B, V] are most of this graph's time.
    if (filters !== 'none') throw new Error(`sampleNextPerRow: plain rows take no top-k/top-p, got filters '${filters}'`);
    const max = rowMax(logits); // [B, 1, 1]
    const e = L.exp(L.sub(chunks(logits), max));
    const mass = L.reduceSum(e, [2]);
    const tokens = L.where(column(greedy), firstArgMax(logits), inverseCdf(e, mass, uniform)); // [B, 1]
    const logZ = L.add(L.squeeze(max, [2]), L.log(L.reduceSum(mass, [1], true)));
    const logprobs = L.squeeze(L.sub(L.gatherElements(logits, tokens, 1), logZ), [1]);
    return { tokens: L.squeeze(tokens, [1]), logprobs, rawLogprobs: logprobs };
  }
  const t = L.where(greedy, g.constant(1, 'float32', []), o.temperature);
  let s = L.div(logits, column(t));
  const nucleusOff = column(L.greaterOrEqual(o.topP, g.constant(1, 'float32', []))); // [B, 1]
  if (filters === 'full') {
    const [sorted] = L.topK(s, V, -1); // [B, V], largest first
    const kth = L.gatherElements(sorted, L.sub(column(o.topK), g.constant(1, 'int64', [])), 1); // [B, 1]
    const sortedK = L.where(L.greaterOrEqual(sorted, kth), sorted, NEG_INF);
    const before = prefixSum(L.softmax(sortedK, -1), true);
    const keepSorted = L.less(before, column(o.topP));
    const lowest = L.reduceMin(L.where(keepSorted, sortedK, Infinity), [1], true); // [B, 1]
    const keep = L.and(L.greaterOrEqual(s, kth), L.or(nucleusOff, L.greaterOrEqual(s, lowest)));
    s = L.where(keep, s, NEG_INF);
  } else if (filters === 'capped') {
    const cap = rowTopKCap(V);
    const top = largestValues(s, cap); // [B, cap], largest first
    const kOff = column(L.greaterOrEqual(o.topK, g.constant(V, 'int64', []))); // [B, 1]
    const kIndex = L.sub(L.minimum(column(o.topK), g.constant(cap, 'int64', [])), g.constant(1, 'int64', [])); // [B, 1]
    const kth = L.gatherElements(top, kIndex, 1); // [B, 1]
    const survives = L.or(kOff, L.greaterOrEqual(s, kth)); // [B, V]
    // Top-p over the top-k survivors, ranked by the sorted values: the j-th kept while the mass
    // before it is < p; the mass counts every survivor (ties at the k-th value beyond the k included).
    const rank = g.constant(Array.from({ length: cap }, (_, j) => j), 'int64', [1, cap]);
    const inK = L.less(rank, column(o.topK)); // [B, cap]
    const max = L.slice(top, [1], [0], [1]); // [B, 1]
    const weights = L.where(inK, L.exp(L.sub(top, max)), 0); // [B, cap]
    const extraTies = L.sub(L.reduceSum(L.cast(survives, 'float32'), [1], true), L.cast(column(o.topK), 'float32')); // [B, 1]
    const Z = L.add(L.reduceSum(weights, [1], true), L.mul(L.maximum(extraTies, g.constant(0, 'float32', [])), L.exp(L.sub(kth, max))));
    const keepSorted = L.and(inK, L.less(prefixSum(L.div(weights, Z), true), column(o.topP)));
    const lowest = L.reduceMin(L.where(keepSorted, top, Infinity), [1], true); // [B, 1]
    s = L.where(L.and(survives, L.or(nucleusOff, L.greaterOrEqual(s, lowest))), s, NEG_INF);
  }
  // min-p: p ≥ min_p · p_max ⇔ s − max(s) ≥ log(min_p); log 0 = −∞ keeps every token.
  const max = L.squeeze(rowMax(s), [2]); // [B, 1]
  s = L.where(L.greaterOrEqual(L.sub(s, max), column(L.log(o.minP))), s, NEG_INF);

  const e = L.exp(L.sub(chunks(s), L.unsqueeze(max, [2]))); // [B, C, k]
  const mass = L.reduceSum(e, [2]); // [B, C]
  const drawn = inverseCdf(e, mass, uniform); // [B, 1]
  const logZ = L.add(max, L.log(L.reduceSum(mass, [1], true))); // [B, 1]
  const rawLogp = L.logSoftmax(logits, 1);
  const argmax = firstArgMax(logits);
  const tokens = L.where(column(greedy), argmax, drawn); // [B, 1]
  const sampledLogprob = L.squeeze(L.sub(L.gatherElements(s, tokens, 1), logZ), [1]);
  const rawLogprobs = pickLogprob(rawLogp, tokens);
  return { tokens: L.squeeze(tokens, [1]), logprobs: L.where(greedy, rawLogprobs, sampledLogprob), rawLogprobs };
}
