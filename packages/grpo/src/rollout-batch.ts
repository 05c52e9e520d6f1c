/**
 * The token batch of an RL step, on the host: each row is a prompt's ids followed by one sampled
 * completion's ids, exactly as generation produced them (never decoded and re-tokenised), laid out
 * as the training policy reads them — prompts left-padded to a common width W, responses from
 * column W on, right-padded.
 *
 * Loss tensors are in predicting-position coordinates (column t holds log π(ids[t+1] | ids ≤ t)), so
 * row b's k-th response token (column W + k) is predicted at column W − 1 + k, and that is where
 * its old log-prob, reference log-prob and advantage go. `selectRows` cuts a minibatch out of the
 * batch, dropping columns that are padding in every selected row.
 */
import type { HostTensor } from '@lathe/runtime';

/** One sampled completion, as the generator returned it. */
export interface SampledCompletion {
  /** Response token ids, the stop token included when the sample stopped. */
  tokens: number[];
  /** log-prob of each token under the sampling distribution (the generator's `logprobs`). */
  logprobs: number[];
  /** True when the sample ended with a stop id; false when it hit the token limit. */
  stopped: boolean;
}

/** Rows of prompt + response ids and their masks, [rows, width] row-major. */
export interface TokenBatch {
  rows: number;
  width: number;
  /** Prompt width W: every response starts at column W. */
  promptWidth: number;
  inputIds: BigInt64Array;
  attentionMask: BigInt64Array;
  /** Predicting-position mask: 1 at column W − 1 + k for each response token k. */
  responseMask: BigInt64Array;
  /** Response lengths in tokens. */
  lengths: number[];
  /** The generation's log-prob of each response token, placed at its predicting position. */
  rolloutLogp: Float32Array;
}

/**
 * Builds the batch: row r is `prompts[r]` (left-padded with `padId`) followed by `completions[r]`'s
 * tokens (right-padded). Every completion must have at least one token.
 */
export function tokenBatch(prompts: readonly (readonly number[])[], completions: readonly SampledCompletion[], padId: number): TokenBatch {
  if (prompts.length !== completions.length) throw new Error(`tokenBatch: ${prompts.length} prompts for ${completions.length} completions`);
  const rows = prompts.length;
  const W = Math.max(...prompts.map((p) => p.length));
  const N = Math.max(...completions.map((c) => c.tokens.length));
  const width = W + N;
  const inputIds = new BigInt64Array(rows * width).fill(BigInt(padId));
  const attentionMask = new BigInt64Array(rows * width);
  const responseMask = new BigInt64Array(rows * width);
  const rolloutLogp = new Float32Array(rows * width);
  const lengths: number[] = [];
  for (let r = 0; r < rows; r++) {
    const p = prompts[r];
    const c = completions[r];
    if (p.length === 0) throw new Error(`tokenBatch: prompt of row ${r} is empty`);
    if (c.tokens.length === 0) throw new Error(`tokenBatch: completion of row ${r} has no tokens`);
    if (c.logprobs.length !== c.tokens.length) throw new Error(`tokenBatch: row ${r} has ${c.tokens.length} tokens but ${c.logprobs.length} log-probs`);
    const base = r * width;
    p.forEach((id, i) => {
      inputIds[base + W - p.length + i] = BigInt(id);
      attentionMask[base + W - p.length + i] = 1n;
    });
    c.tokens.forEach((id, k) => {
      inputIds[base + W + k] = BigInt(id);
      attentionMask[base + W + k] = 1n;
      responseMask[base + W - 1 + k] = 1n;
      rolloutLogp[base + W - 1 + k] = c.logprobs[k];
    });
    lengths.push(c.tokens.length);
  }
  return { rows, width, promptWidth: W, inputIds, attentionMask, responseMask, lengths, rolloutLogp };
}

/** Per response token values of each row (e.g. log-probs), read from a [rows, width] matrix at the predicting positions. */
export function responseValues(batch: TokenBatch, matrix: ArrayLike<number>): number[][] {
  const out: number[][] = [];
  for (let r = 0; r < batch.rows; r++) {
    const start = r * batch.width + batch.promptWidth - 1;
    out.push(Array.from({ length: batch.lengths[r] }, (_, k) => matrix[start + k]));
  }
  return out;
}

/** The inverse of {@link responseValues}: a [rows, width] matrix with each row's values at its predicting positions, 0 elsewhere. */
export function responseMatrix(batch: TokenBatch, values: readonly (readonly number[])[]): Float32Array {
  const out = new Float32Array(batch.rows * batch.width);
  values.forEach((row, r) => {
    if (row.length !== batch.lengths[r]) throw new Error(`responseMatrix: row ${r} has ${row.length} values for ${batch.lengths[r]} response tokens`);
    const start = r * batch.width + batch.promptWidth - 1;
    row.forEach((v, k) => (out[start + k] = v));
  });
  return out;
}

/**
 * The tensors of rows `rows` (in that order): `input_ids`, `attention_mask`, `response_mask` and
 * each of `extra` (float32 matrices of the batch's shape), with leading and trailing columns that
 * are padding in every selected row removed.
 */
export function selectRows(batch: TokenBatch, rows: readonly number[], extra: Record<string, Float32Array> = {}): Record<string, HostTensor> {
  if (rows.length === 0) throw new Error('selectRows: no rows selected');
  const W = batch.promptWidth;
  let first = W - 1;
  let last = W;
  for (const r of rows) {
    if (!(r >= 0 && r < batch.rows)) throw new Error(`selectRows: row ${r} is outside 0..${batch.rows - 1}`);
    let c = 0;
    while (c < W && batch.attentionMask[r * batch.width + c] === 0n) c++;
    first = Math.min(first, c);
    last = Math.max(last, W + batch.lengths[r]);
  }
  const T = last - first;
  const B = rows.length;
  const ints = (src: BigInt64Array) => {
    const out = new BigInt64Array(B * T);
    rows.forEach((r, i) => out.set(src.subarray(r * batch.width + first, r * batch.width + last), i * T));
    return out;
  };
  const floats = (src: Float32Array) => {
    const out = new Float32Array(B * T);
    rows.forEach((r, i) => out.set(src.subarray(r * batch.width + first, r * batch.width + last), i * T));
    return out;
  };
  const out: Record<string, HostTensor> = {
    input_ids: { data: ints(batch.inputIds), dims: [B, T] },
    attention_mask: { data: ints(batch.attentionMask), dims: [B, T] },
    response_mask: { data: ints(batch.responseMask), dims: [B, T] },
  };
  for (const [name, m] of Object.entries(extra)) {
    if (m.length !== batch.rows * batch.width) throw new Error(`selectRows: '${name}' has ${m.length} entries, the batch is ${batch.rows}×${batch.width}`);
    out[name] = { data: floats(m), dims: [B, T] };
  }
  return out;
}

/** Splits `n` items into `parts` contiguous, nearly equal slices (sizes differ by at most 1). */
export function evenSplit<T>(items: readonly T[], parts: number): T[][] {
  const out: T[][] = [];
  for (let k = 0; k < parts; k++) out.push(items.slice(Math.floor((k * items.length) / parts), Math.floor(((k + 1) * items.length) / parts)));
  return out;
}
