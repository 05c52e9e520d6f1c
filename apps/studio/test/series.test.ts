/** The metrics page's arithmetic against hand-computed values. */
import { forLogScale, series, smooth, stepTimeStack } from '../src/web/series';

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

test('stepTimeStack: the *_ms phases but step_ms, bottom first, each drawn at the sum of those below it and itself', () => {
  const lines = [
    { step: 1, generation_ms: 30, scoring_ms: 5, rewards_ms: 1, training_ms: 50, host_ms: 4, step_ms: 90, loss: 1 },
    { step: 2, generation_ms: 20, scoring_ms: 6, rewards_ms: 2, training_ms: 40, host_ms: 2, step_ms: 70 },
    { step: 3, loss: 0.5 },
  ];
  const s = stepTimeStack(lines)!;
  expect(s.phases).toEqual(['generation_ms', 'scoring_ms', 'rewards_ms', 'training_ms', 'host_ms']);
  expect(s.steps).toEqual([1, 2]);
  expect(s.values).toEqual([[30, 20], [5, 6], [1, 2], [50, 40], [4, 2]]);
  // 30, 35, 36, 86, 90 and 20, 26, 28, 68, 70: the top of the stack is the logged step_ms
  expect(s.top).toEqual([[30, 20], [35, 26], [36, 28], [86, 68], [90, 70]]);
  // an SFT-style run: run_ms below host_ms; a gap stays a gap and does not lift the phases above it
  expect(stepTimeStack([{ step: 1, host_ms: 2, run_ms: 10 }, { step: 2, host_ms: 3 }])).toEqual({ phases: ['run_ms', 'host_ms'], steps: [1, 2], values: [[10, null], [2, 3]], top: [[10, null], [12, 3]] });
  expect(stepTimeStack([{ step: 1, loss: 1, step_ms: 5 }])).toBeNull();
});
