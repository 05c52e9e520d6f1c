/** The token batch of an RL step: right-padded rows in predicting-position coordinates, minibatch selection, splits. */
import { advantageMatrix, evenSplit, responseValues, selectedWidth, selectRows, tokenBatch, type SampledCompletion, type TokenBatch } from '@lathe/grpo';

const PAD = 0;
/** Per response token values placed at their predicting positions: the loss's advantage layout, which `responseValues` reads back. */
const tokenMatrix = (b: TokenBatch, values: number[][]) => advantageMatrix({ kind: 'token', advantages: values, returns: values, stats: { groups: 0, uniformGroups: 0, zeroAdvantages: 0 } }, b.responseMask, [b.rows, b.width]);
// row 0: the longest prompt; row 2: a short prompt with the longest completion, and the longest row
const batch = tokenBatch(
  [[7, 8, 9], [5], [4, 6]],
  [
    { tokens: [11, 12, 2], logprobs: [-0.1, -0.2, -0.3], stopped: true },
    { tokens: [13], logprobs: [-0.4], stopped: false },
    { tokens: [14, 15, 16, 17, 18], logprobs: [-0.5, -0.6, -0.7, -0.8, -0.9], stopped: false },
  ],
  PAD,
);
const f32 = (xs: number[]) => xs.map(Math.fround);

test('rows are prompt then completion from column 0, right-padded to the longest row', () => {
  // width is the longest row (2 + 5), not the longest prompt + the longest completion (3 + 5)
  expect([batch.rows, batch.width, batch.promptLengths, batch.lengths]).toEqual([3, 7, [3, 1, 2], [3, 1, 5]]);
  expect(Array.from(batch.inputIds, Number)).toEqual([7, 8, 9, 11, 12, 2, 0, /**/ 5, 13, 0, 0, 0, 0, 0, /**/ 4, 6, 14, 15, 16, 17, 18]);
  expect(Array.from(batch.attentionMask, Number)).toEqual([1, 1, 1, 1, 1, 1, 0, /**/ 1, 1, 0, 0, 0, 0, 0, /**/ 1, 1, 1, 1, 1, 1, 1]);
  // column t predicts ids[t+1]: row 0's response tokens at columns 3.. are predicted at columns 2..,
  // row 1's at column 0, row 2's at 1..5
  expect(Array.from(batch.responseMask, Number)).toEqual([0, 0, 1, 1, 1, 0, 0, /**/ 1, 0, 0, 0, 0, 0, 0, /**/ 0, 1, 1, 1, 1, 1, 0]);
  expect(Array.from(batch.rolloutLogp)).toEqual(f32([0, 0, -0.1, -0.2, -0.3, 0, 0, /**/ -0.4, 0, 0, 0, 0, 0, 0, /**/ 0, -0.5, -0.6, -0.7, -0.8, -0.9, 0]));
  expect(responseValues(batch, batch.rolloutLogp)).toEqual([f32([-0.1, -0.2, -0.3]), f32([-0.4]), f32([-0.5, -0.6, -0.7, -0.8, -0.9])]);
  expect(tokenMatrix(batch, [[1, 2, 3], [4], [5, 6, 7, 8, 9]])).toEqual(Float32Array.from([0, 0, 1, 2, 3, 0, 0, /**/ 4, 0, 0, 0, 0, 0, 0, /**/ 0, 5, 6, 7, 8, 9, 0]));
  expect(() => tokenMatrix(batch, [[1, 2, 3], [4], [5]])).toThrow(/row 2 has more masked positions than its 1 token advantages/);
});

test('selectRows keeps the selected rows in order and drops only the trailing columns that are padding in all of them', () => {
  const extra = { old_logp: batch.rolloutLogp };
  const second = selectRows(batch, [1], extra);
  expect(second.input_ids).toEqual({ data: BigInt64Array.from([5n, 13n]), dims: [1, 2] });
  expect(second.attention_mask).toEqual({ data: BigInt64Array.from([1n, 1n]), dims: [1, 2] });
  expect(second.response_mask).toEqual({ data: BigInt64Array.from([1n, 0n]), dims: [1, 2] });
  expect(second.old_logp.data).toEqual(Float32Array.from([-0.4, 0]));
  // the width GroupQueryAttention reads (int32, in host memory), for graphs that declare it
  expect(second.total_sequence_length).toEqual({ data: Int32Array.of(2), dims: [] });
  const two = selectRows(batch, [1, 0], extra);
  expect(two.input_ids.dims).toEqual([2, 6]);
  expect(two.input_ids.data).toEqual(BigInt64Array.from([5, 13, 0, 0, 0, 0, /**/ 7, 8, 9, 11, 12, 2].map(BigInt)));
  expect(two.attention_mask.data).toEqual(BigInt64Array.from([1, 1, 0, 0, 0, 0, /**/ 1, 1, 1, 1, 1, 1].map(BigInt)));
  expect(selectRows(batch, [2, 1]).input_ids.dims).toEqual([2, 7]);
  expect(selectedWidth(batch, [0, 1])).toBe(6);
  expect(() => selectRows(batch, [3])).toThrow(/row 3 is outside 0..2/);
  expect(() => selectRows(batch, [])).toThrow(/no rows selected/);
  expect(() => tokenBatch([[1]], [{ tokens: [], logprobs: [], stopped: false }], PAD)).toThrow(/row 0 has no tokens/);
  expect(() => tokenBatch([[]], [{ tokens: [1], logprobs: [0], stopped: false }], PAD)).toThrow(/prompt of row 0 is empty/);
});

test('random batches: every row contiguous from column 0, values at their predicting positions, selections trimmed at the end only', () => {
  let seed = 12345;
  const rand = (n: number) => {
    seed = (Math.imul(seed, 1103515245) + 12345) >>> 0;
    return seed % n;
  };
  for (let trial = 0; trial < 20; trial++) {
    const rows = 1 + rand(9);
    const prompts = Array.from({ length: rows }, () => Array.from({ length: 1 + rand(6) }, () => 1 + rand(50)));
    const completions: SampledCompletion[] = Array.from({ length: rows }, () => {
      const n = 1 + rand(7);
      return { tokens: Array.from({ length: n }, () => 1 + rand(50)), logprobs: Array.from({ length: n }, () => -rand(1000) / 100), stopped: rand(2) === 0 };
    });
    const b = tokenBatch(prompts, completions, PAD);
    expect(b.width).toBe(Math.max(...prompts.map((p, r) => p.length + completions[r].tokens.length)));
    for (let r = 0; r < rows; r++) {
      const row = (m: BigInt64Array) => Array.from(m.subarray(r * b.width, (r + 1) * b.width), Number);
      const len = prompts[r].length + completions[r].tokens.length;
      const pad = b.width - len;
      expect(row(b.inputIds)).toEqual([...prompts[r], ...completions[r].tokens, ...new Array<number>(pad).fill(PAD)]);
      expect(row(b.attentionMask)).toEqual([...new Array<number>(len).fill(1), ...new Array<number>(pad).fill(0)]);
      // the masked predicting positions t predict exactly the completion's tokens, in order
      const ids = row(b.inputIds);
      expect(row(b.responseMask).flatMap((m, t) => (m ? [ids[t + 1]] : []))).toEqual(completions[r].tokens);
    }
    expect(responseValues(b, b.rolloutLogp)).toEqual(completions.map((c) => f32(c.logprobs)));
    const values = completions.map((c) => c.tokens.map((t) => t / 4));
    expect(responseValues(b, tokenMatrix(b, values))).toEqual(values);
    // a random selection: its width is its longest row, its last column holds a token in some row,
    // and each selected row is the batch's row cut at that width
    const sel = Array.from({ length: 1 + rand(rows) }, () => rand(rows));
    const t = selectRows(b, sel, { old_logp: b.rolloutLogp });
    const T = Math.max(...sel.map((r) => prompts[r].length + completions[r].tokens.length));
    expect(t.input_ids.dims).toEqual([sel.length, T]);
    expect(sel.some((_r, i) => t.attention_mask.data[i * T + T - 1] === 1n)).toBe(true);
    sel.forEach((r, i) => {
      expect(t.input_ids.data.subarray(i * T, (i + 1) * T)).toEqual(b.inputIds.subarray(r * b.width, r * b.width + T));
      const mask = Array.from(t.response_mask.data.subarray(i * T, (i + 1) * T), Number);
      const old = Array.from(t.old_logp.data.subarray(i * T, (i + 1) * T), Number);
      expect(old.filter((_x, k) => mask[k])).toEqual(f32(completions[r].logprobs));
    });
  }
});

test('evenSplit: contiguous parts whose sizes differ by at most one', () => {
  expect(evenSplit([1, 2, 3, 4, 5, 6, 7], 3)).toEqual([[1, 2], [3, 4], [5, 6, 7]]);
  expect(evenSplit([1, 2], 2)).toEqual([[1], [2]]);
});
