import { scoringAttention } from '../src';

const mask = (rows: number[][]) => ({ data: BigInt64Array.from(rows.flat().map(BigInt)), dims: [rows.length, rows[0].length] });

test('flash attention scores right-padded rows on CUDA in half precision; anything else takes the composed form', () => {
  const right = mask([
    [1, 1, 1, 0],
    [1, 1, 1, 1],
    [1, 0, 0, 0],
  ]);
  const left = mask([
    [1, 1, 1, 1],
    [0, 0, 1, 1],
  ]);
  const gap = mask([[1, 0, 1, 0]]);
  expect(scoringAttention('cuda', 'bfloat16', right)).toBe('gqa');
  expect(scoringAttention('cuda', 'float16', right)).toBe('gqa');
  expect(scoringAttention('cuda', 'bfloat16', left)).toBe('composed');
  expect(scoringAttention('cuda', 'bfloat16', gap)).toBe('composed');
  expect(scoringAttention('cuda', 'float32', right)).toBe('composed');
  expect(scoringAttention('cpu', 'bfloat16', right)).toBe('composed');
  expect(scoringAttention(undefined, 'bfloat16', right)).toBe('composed');
});
