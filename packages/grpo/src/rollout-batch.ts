/**
 * The token batch of an RL step, on the host: each row is a prompt's ids followed by one sampled
 * completion's ids, exactly as generation produced them (never decoded and re-tokenised), laid out
 * as the training policy reads them — *right-padded*: row r holds prompt_r at columns
 * 0 … p_r − 1, completion_r at columns p_r … p_r + n_r − 1, then padding to the batch's width.
 *
 * Why right padding: every row's tokens are contiguous from column 0 (its attention mask is a run
 * of ones followed by zeros), which is the only layout ONNX Runtime's fused GroupQueryAttention
 * accepts without a cache (row b's keys are positions 0 … len_b − 1). Positions come from the mask
 * (cumsum(mask) − 1, `positionsFromPadding`), so they are 0 … len − 1 in either layout and the
 * log-probs are the same as with left-padded prompts. The generators take the prompts without
 * this batch (they pad them for their own graphs), so it does not constrain them.
 *
 * Loss tensors are in predicting-position coordinates (column t holds log π(ids[t+1] | ids ≤ t)),
 * so row r's k-th response token (column p_r + k) is predicted at column p_r − 1 + k, and that is
 * where its old log-prob, reference log-prob and advantage go. `selectRows` cuts a minibatch out of
 * the batch, dropping the trailing columns that are padding in every selected row.
 */
import type { HostTensor } from '@lathe/runtime';
import { TOTAL_LENGTH_INPUT, totalLengthTensor } from '@lathe/models';

/** One sampled completion, as the generator returned it. */
export interface SampledCompletion {
  /** Response token ids, the stop token included when the sample stopped. */
  tokens: number[];
  /** log-prob of each token under the sampling distribution (the generator's `logprobs`). */
  logprobs: number[];
  /**
   * True when the rollout carried no sampling log-probs (rollouts made elsewhere without them):
   * `logprobs` are then placeholders, and truncated importance sampling gives its tokens weight 1.
   */
  logprobsUnknown?: boolean;
  /** True when the sample ended with a stop id; false when it hit the token limit. */
  stopped: boolean;
  /**
   * Per token, 1 where the policy is trained on it and 0 where it is not: tokens it did not sample,
   * such as tool or environment output inside a multi-turn response. Absent: every token. Untrained
   * tokens still condition the later ones; they get no loss, no KL penalty and no place in the
   * loss's token count or the log-prob metrics.
   */
  mask?: readonly number[];
}

/**
 * Rows of prompt + response ids and their masks, [rows, width] row-major, right-padded: row r is
 * `promptLengths[r]` prompt tokens from column 0, then `lengths[r]` response tokens, then padding
 * (attention mask 0) up to `width` = the longest row.
 */
export interface TokenBatch {
  rows: number;
  /** The longest row's token count (prompt + response). */
  width: number;
  /** Prompt lengths p_r in tokens: row r's response starts at column p_r. */
  promptLengths: number[];
  inputIds: BigInt64Array;
  /** 1 on each row's first p_r + n_r columns, 0 after (never a gap, never leading padding). */
  attentionMask: BigInt64Array;
  /** Predicting-position mask: 1 at column p_r − 1 + k for each response token k of row r. */
  responseMask: BigInt64Array;
  /** `responseMask` less the positions of untrained tokens (`SampledCompletion.mask`): what the loss reads; `responseMask` itself without gaps. */
  trainMask: BigInt64Array;
  /** Response lengths n_r in tokens. */
  lengths: number[];
  /** Trained tokens of each row (n_r without gaps). */
  trainedLengths: number[];
  /** The generation's log-prob of each response token, placed at its predicting position. */
  rolloutLogp: Float32Array;
}

/**
 * Builds the batch: row r is `prompts[r]` followed by `completions[r]`'s tokens from column 0,
 * right-padded with `padId`. Every prompt and completion must have at least one token.
 */
export function tokenBatch(prompts: readonly (readonly number[])[], completions: readonly SampledCompletion[], padId: number): TokenBatch {
  if (prompts.length !== completions.length) throw new Error(`tokenBatch: ${prompts.length} prompts for ${completions.length} completions`);
  const rows = prompts.length;
  const width = Math.max(...prompts.map((p, r) => p.length + completions[r].tokens.length));
  const inputIds = new BigInt64Array(rows * width).fill(BigInt(padId));
  const attentionMask = new BigInt64Array(rows * width);
  const responseMask = new BigInt64Array(rows * width);
  const rolloutLogp = new Float32Array(rows * width);
  const gaps = completions.some((c) => c.mask);
  const trainMask = gaps ? new BigInt64Array(rows * width) : responseMask;
  const lengths: number[] = [];
  const trainedLengths: number[] = [];
  const promptLengths: number[] = [];
  for (let r = 0; r < rows; r++) {
    const p = prompts[r];
    const c = completions[r];
    if (p.length === 0) throw new Error(`tokenBatch: prompt of row ${r} is empty`);
    if (c.tokens.length === 0) throw new Error(`tokenBatch: completion of row ${r} has no tokens`);
    if (c.logprobs.length !== c.tokens.length) throw new Error(`tokenBatch: row ${r} has ${c.tokens.length} tokens but ${c.logprobs.length} log-probs`);
    if (c.mask && c.mask.length !== c.tokens.length) throw new Error(`tokenBatch: row ${r} has ${c.tokens.length} tokens but a mask of ${c.mask.length}`);
    const bad = c.mask?.findIndex((m) => m !== 0 && m !== 1) ?? -1;
    if (bad >= 0) throw new Error(`tokenBatch: row ${r}'s mask has ${c.mask![bad]} at token ${bad} (expected 0 or 1)`);
    const base = r * width;
    const P = p.length;
    p.forEach((id, i) => {
      inputIds[base + i] = BigInt(id);
      attentionMask[base + i] = 1n;
    });
    c.tokens.forEach((id, k) => {
      inputIds[base + P + k] = BigInt(id);
      attentionMask[base + P + k] = 1n;
      // token P + k is predicted from the position before it
      responseMask[base + P - 1 + k] = 1n;
      if (gaps && (c.mask?.[k] ?? 1) === 1) trainMask[base + P - 1 + k] = 1n;
      rolloutLogp[base + P - 1 + k] = c.logprobs[k];
    });
    promptLengths.push(P);
    lengths.push(c.tokens.length);
    trainedLengths.push(c.mask ? c.mask.reduce((a, b) => a + b, 0) : c.tokens.length);
  }
  return { rows, width, promptLengths, inputIds, attentionMask, responseMask, trainMask, lengths, trainedLengths, rolloutLogp };
}

/** Per response token values of each row (e.g. log-probs), read from a [rows, width] matrix at the predicting positions. */
export function responseValues(batch: TokenBatch, matrix: ArrayLike<number>): number[][] {
  if (matrix.length !== batch.rows * batch.width) throw new Error(`responseValues: the matrix has ${matrix.length} entries, the batch is ${batch.rows}×${batch.width}`);
  const out: number[][] = [];
  for (let r = 0; r < batch.rows; r++) {
    const start = r * batch.width + batch.promptLengths[r] - 1;
    out.push(Array.from({ length: batch.lengths[r] }, (_, k) => matrix[start + k]));
  }
  return out;
}

/**
 * Columns `selectRows` keeps for `rows`: 0 … (the longest selected row's prompt + response) − 1.
 * Rows start at column 0, so only trailing columns can be all padding.
 */
export function selectedWidth(batch: TokenBatch, rows: readonly number[]): number {
  let T = 0;
  for (const r of rows) {
    if (!(Number.isInteger(r) && r >= 0 && r < batch.rows)) throw new Error(`selectRows: row ${r} is outside 0..${batch.rows - 1}`);
    T = Math.max(T, batch.promptLengths[r] + batch.lengths[r]);
  }
  return T;
}

/**
 * The tensors of rows `rows` (in that order): `input_ids`, `attention_mask`, `response_mask` (the
 * batch's `trainMask`: the loss's tokens) and
 * each of `extra` (float32 matrices of the batch's shape), [rows.length, T] with T =
 * {@link selectedWidth}: the trailing columns that are padding in every selected row are removed,
 * and column t of a selected row is column t of the batch (rows stay right-padded). Also
 * `total_sequence_length` (`TOTAL_LENGTH_INPUT`, the int32 scalar T) for graphs that attend through
 * GroupQueryAttention (`decoderPolicy`'s `flashAttention`); a caller feeds a graph only the inputs
 * it declares.
 */
export function selectRows(batch: TokenBatch, rows: readonly number[], extra: Record<string, Float32Array> = {}): Record<string, HostTensor> {
  if (rows.length === 0) throw new Error('selectRows: no rows selected');
  const T = selectedWidth(batch, rows);
  const B = rows.length;
  const take = <A extends { subarray(begin: number, end: number): A; set(src: A, offset: number): void }>(src: A, out: A): A => {
    rows.forEach((r, i) => out.set(src.subarray(r * batch.width, r * batch.width + T), i * T));
    return out;
  };
  const out: Record<string, HostTensor> = {
    input_ids: { data: take(batch.inputIds, new BigInt64Array(B * T)), dims: [B, T] },
    attention_mask: { data: take(batch.attentionMask, new BigInt64Array(B * T)), dims: [B, T] },
    response_mask: { data: take(batch.trainMask, new BigInt64Array(B * T)), dims: [B, T] },
    [TOTAL_LENGTH_INPUT]: totalLengthTensor(T),
  };
  for (const [name, m] of Object.entries(extra)) {
    if (m.length !== batch.rows * batch.width) throw new Error(`selectRows: '${name}' has ${m.length} entries, the batch is ${batch.rows}×${batch.width}`);
    out[name] = { data: take(m, new Float32Array(B * T)), dims: [B, T] };
  }
  return out;
}

/** Splits `n` items into `parts` contiguous, nearly equal slices (sizes differ by at most 1). */
export function evenSplit<T>(items: readonly T[], parts: number): T[][] {
  const out: T[][] = [];
  for (let k = 0; k < parts; k++) out.push(items.slice(Math.floor((k * items.length) / parts), Math.floor(((k + 1) * items.length) / parts)));
  return out;
}

/** Per-token rows (one per batch row, n_r values each) less the untrained tokens' values: what the KL and entropy metrics average. */
export function trainedValues(batch: TokenBatch, rows: readonly (readonly number[])[]): number[][] {
  const masks = tokenMasks(batch);
  return masks ? rows.map((row, r) => row.filter((_, k) => masks[r][k] === 1)) : rows.map((r) => [...r]);
}

/** Each row's per-token 0/1 training mask (n_r values), or undefined when no row has a gap. */
export function tokenMasks(batch: TokenBatch): number[][] | undefined {
  if (batch.trainMask === batch.responseMask) return undefined;
  return batch.lengths.map((n, r) => {
    const start = r * batch.width + batch.promptLengths[r] - 1;
    return Array.from({ length: n }, (_, k) => Number(batch.trainMask[start + k]));
  });
}
