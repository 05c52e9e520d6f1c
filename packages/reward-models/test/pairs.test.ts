/** Preference pairs into batches: selection counts, the row layout written out by hand, feeds. */
import { pairBatch, pairFeeds, selectPairs, type PreferencePair } from '@lathe/reward-models';

const rows = (t: { data: ArrayLike<number | bigint>; dims: readonly number[] }) => {
  const [R, T] = t.dims;
  return Array.from({ length: R }, (_, r) => Array.from({ length: T }, (_, c) => Number(t.data[r * T + c])));
};

const pairs: PreferencePair[] = [
  { prompt: [1, 2], chosen: [3], rejected: [4, 5], margin: 0.5 },
  { prompt: [6], chosen: [7, 8, 9], rejected: [7] },
];

test('pairs over max_length and pairs with identical responses are skipped and counted, never truncated', () => {
  const input: PreferencePair[] = [
    pairs[0], // rows of 3 and 4 tokens
    { prompt: [1, 2, 3], chosen: [4, 5], rejected: [4] }, // 5 tokens: too long for 4
    { prompt: [1], chosen: [2, 2], rejected: [2, 2] }, // identical
    pairs[1], // 4 and 2 tokens
  ];
  const s = selectPairs(input, { maxLength: 4 });
  expect(s.pairs).toEqual([pairs[0], pairs[1]]);
  expect(s.indices).toEqual([0, 3]);
  expect(s.skipped).toEqual({ overLength: 1, identical: 1 });
  expect(() => selectPairs(input.slice(1, 3), { maxLength: 4 })).toThrow('no usable preference pair among 2: 1 longer than max_length 4, 1 with identical chosen and rejected');
  expect(() => selectPairs([{ prompt: [], chosen: [], rejected: [1] }], { maxLength: 4 })).toThrow('preference pair 0: an empty sequence (prompt + chosen has no tokens)');
  expect(() => selectPairs([{ ...pairs[0], margin: NaN }], { maxLength: 4 })).toThrow('preference pair 0: margin NaN is not a finite number');
});

test('a batch is chosen rows then rejected rows, padded right or left, with the response tokens marked', () => {
  const right = pairBatch(pairs, { padId: 0 });
  expect(right.pairs).toBe(2);
  expect(right.width).toBe(4);
  expect(rows(right.inputIds)).toEqual([
    [1, 2, 3, 0],
    [6, 7, 8, 9],
    [1, 2, 4, 5],
    [6, 7, 0, 0],
  ]);
  expect(rows(right.attentionMask)).toEqual([
    [1, 1, 1, 0],
    [1, 1, 1, 1],
    [1, 1, 1, 1],
    [1, 1, 0, 0],
  ]);
  expect(rows(right.responseMask)).toEqual([
    [0, 0, 1, 0],
    [0, 1, 1, 1],
    [0, 0, 1, 1],
    [0, 1, 0, 0],
  ]);
  expect(Array.from(right.margin.data as Float32Array)).toEqual([0.5, 0]);
  expect(Array.from(right.pairCount.data as Float32Array)).toEqual([2]);

  const left = pairBatch(pairs, { padId: 0, padding: 'left', width: 5, pairCount: 8 });
  expect(rows(left.inputIds)).toEqual([
    [0, 0, 1, 2, 3],
    [0, 6, 7, 8, 9],
    [0, 1, 2, 4, 5],
    [0, 0, 0, 6, 7],
  ]);
  expect(rows(left.responseMask)).toEqual([
    [0, 0, 0, 0, 1],
    [0, 0, 1, 1, 1],
    [0, 0, 0, 1, 1],
    [0, 0, 0, 0, 1],
  ]);
  expect(Array.from(left.pairCount.data as Float32Array)).toEqual([8]);
  expect(() => pairBatch(pairs, { padId: 0, width: 3 })).toThrow('pairBatch: a row of 4 tokens does not fit width 3');
  expect(() => pairBatch(pairs, { padId: 0, pairCount: 1 })).toThrow('pairBatch: pairCount 1 is less than the batch');
});

test('feeds hold exactly the inputs a loss reads, extra ones included; a missing one is named', () => {
  const b = pairBatch(pairs, { padId: 0 });
  const ref = { data: Float32Array.of(1, 2, 3, 4), dims: [4] };
  const feeds = pairFeeds(b, ['input_ids', 'attention_mask', 'loss_mask', 'ref_logp', 'pair_count', 'total_sequence_length'], { ref_logp: ref });
  expect(Object.keys(feeds)).toEqual(['input_ids', 'attention_mask', 'loss_mask', 'ref_logp', 'pair_count', 'total_sequence_length']);
  expect(feeds.ref_logp).toBe(ref);
  expect(feeds.input_ids).toBe(b.inputIds);
  expect(Array.from(feeds.total_sequence_length.dims)).toEqual([]);
  expect(() => pairFeeds(b, ['input_ids', 'ref_logp'])).toThrow("pairFeeds: the loss reads 'ref_logp', which a pair batch does not hold; pass it in extra");
});
