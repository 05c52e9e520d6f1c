/** The metrics page's arithmetic against hand-computed values. */
import { forLogScale, series, smooth } from '../src/web/series';

test('smooth: EMA with weight s on the past, gaps kept and skipped', () => {
  // s = 0.5: 1; gap; 0.5·1 + 0.5·3 = 2; 0.5·2 + 0.5·5 = 3.5
  expect(smooth([1, null, 3, 5], 0.5)).toEqual([1, null, 2, 3.5]);
  // s = 0.9: 10; 0.9·10 + 0.1·0 = 9; 0.9·9 + 0.1·20 = 10.1
  const s = smooth([10, 0, 20], 0.9);
  expect(s[0]).toBe(10);
  expect(s[1]).toBeCloseTo(9, 12);
  expect(s[2]).toBeCloseTo(10.1, 12);
  expect(smooth([3, 1, 2], 0)).toEqual([3, 1, 2]);
});

test('series: the numeric values of a key by step, the last at a step winning, sorted', () => {
  const lines = [{ step: 2, loss: 1.5 }, { step: 1, loss: 2 }, { step: 2, loss: 1.25, lr: 3 }, { step: 3, loss: 'n/a' }, { step: 4, loss: Number.NaN }, { step: 5, other: 1 }];
  expect(series(lines, 'loss')).toEqual([[1, 2], [2, 1.25]]);
  expect(series(lines, 'lr')).toEqual([[2, 3]]);
});

test('forLogScale: zero and negatives become gaps', () => {
  expect(forLogScale([1, 0, -2, null, 0.5])).toEqual([1, null, null, null, 0.5]);
});
