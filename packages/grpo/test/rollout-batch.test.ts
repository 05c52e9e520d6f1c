/** The token batch of an RL step: layout in predicting-position coordinates, minibatch selection, splits. */
import { evenSplit, responseMatrix, responseValues, selectRows, tokenBatch } from '@lathe/grpo';

const PAD = 0;
const batch = tokenBatch(
  [[7, 8, 9], [5]],
  [
    { tokens: [11, 12, 2], logprobs: [-0.1, -0.2, -0.3], stopped: true },
    { tokens: [13], logprobs: [-0.4], stopped: false },
  ],
  PAD,
);

test('rows are left-padded prompts followed by the sampled ids, exactly as generated', () => {
  expect([batch.rows, batch.width, batch.promptWidth, batch.lengths]).toEqual([2, 6, 3, [3, 1]]);
  expect(Array.from(batch.inputIds, Number)).toEqual([7, 8, 9, 11, 12, 2, /**/ 0, 0, 5, 13, 0, 0]);
  expect(Array.from(batch.attentionMask, Number)).toEqual([1, 1, 1, 1, 1, 1, /**/ 0, 0, 1, 1, 0, 0]);
  // column t predicts ids[t+1]: the response tokens at columns 3.. are predicted at columns 2..
  expect(Array.from(batch.responseMask, Number)).toEqual([0, 0, 1, 1, 1, 0, /**/ 0, 0, 1, 0, 0, 0]);
  expect(Array.from(batch.rolloutLogp)).toEqual([0, 0, -0.1, -0.2, -0.3, 0, /**/ 0, 0, -0.4, 0, 0, 0].map(Math.fround));
  expect(responseValues(batch, batch.rolloutLogp)).toEqual([[-0.1, -0.2, -0.3].map(Math.fround), [Math.fround(-0.4)]]);
  expect(responseMatrix(batch, [[1, 2, 3], [4]])).toEqual(Float32Array.from([0, 0, 1, 2, 3, 0, 0, 0, 4, 0, 0, 0]));
});

test('selectRows keeps the selected rows in order and drops columns that are padding in all of them', () => {
  const extra = { old_logp: batch.rolloutLogp };
  const second = selectRows(batch, [1], extra);
  expect(second.input_ids).toEqual({ data: BigInt64Array.from([5n, 13n]), dims: [1, 2] });
  expect(second.response_mask).toEqual({ data: BigInt64Array.from([1n, 0n]), dims: [1, 2] });
  expect(second.old_logp.data).toEqual(Float32Array.from([-0.4, 0]));
  const both = selectRows(batch, [1, 0], extra);
  expect(both.input_ids.dims).toEqual([2, 6]);
  expect(both.input_ids.data).toEqual(BigInt64Array.from([0, 0, 5, 13, 0, 0, 7, 8, 9, 11, 12, 2].map(BigInt)));
  expect(() => selectRows(batch, [2])).toThrow(/row 2 is outside 0..1/);
  expect(() => tokenBatch([[1]], [{ tokens: [], logprobs: [], stopped: false }], PAD)).toThrow(/row 0 has no tokens/);
});

test('evenSplit: contiguous parts whose sizes differ by at most one', () => {
  expect(evenSplit([1, 2, 3, 4, 5, 6, 7], 3)).toEqual([[1, 2], [3, 4], [5, 6, 7]]);
  expect(evenSplit([1, 2], 2)).toEqual([[1], [2]]);
});
