/** The evaluation metrics against hand-computed values. */
import { auc, expectedCalibrationError, meanAbsoluteError, reliabilityTable, treeRow } from '@lathe/critic';

describe('critic metrics', () => {
  test('AUC: pairs ordered right over all success/failure pairs, ties half', () => {
    expect(auc([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1])).toBeCloseTo(0.75, 12); // 3 of the 4 pairs right
    expect(auc([0.5, 0.5, 0.5], [0, 1, 1])).toBeCloseTo(0.5, 12);
    expect(auc([0.9, 0.1], [0, 1])).toBe(0);
    expect(auc([0.2, 0.3], [1, 1])).toBeNaN();
    expect(() => auc([0.2, NaN], [1, 0])).toThrow('auc: score 1 is NaN, not a finite number');
  });

  test('reliability table and ECE', () => {
    const q = [0.05, 0.15, 0.95, 0.9, 1];
    const y = [0, 1, 1, 0, 1];
    const t = reliabilityTable(q, y, 2);
    expect(t).toEqual([
      { lo: 0, hi: 0.5, count: 2, meanQ: 0.1, meanOutcome: 0.5 },
      { lo: 0.5, hi: 1, count: 3, meanQ: (0.95 + 0.9 + 1) / 3, meanOutcome: 2 / 3 },
    ]);
    // 2/5·|0.1 − 0.5| + 3/5·|0.95 − 2/3|
    expect(expectedCalibrationError(q, y, 2)).toBeCloseTo(0.4 * 0.4 + 0.6 * (0.95 - 2 / 3), 12);
  });

  test('MAE', () => {
    expect(meanAbsoluteError([1, 5, 2], [2, 3, 2])).toBeCloseTo(1, 12);
  });

  test('tree rows: candidates after the attempt at the positions they stand for', () => {
    const r = treeRow([7, 8], [1, 2, 3], [[4], [], [5, 6]]);
    expect(r).toEqual({
      ids: [7, 8, 1, 2, 3, 4, 5, 6],
      positions: [0, 1, 2, 3, 4, 2, 4, 4],
      isCandidate: [0, 0, 0, 0, 0, 1, 1, 1],
      attemptStart: 2,
      attemptLength: 3,
      candidateSlots: [{ start: 5, count: 1 }, { start: 6, count: 0 }, { start: 6, count: 2 }],
    });
    expect(() => treeRow([], [1], [])).toThrow('treeRow: 0 candidate lists for an attempt of 1 tokens');
  });
});
