/**
 * How well a critic's estimates match outcomes: AUC of Q against the final reward, the reliability
 * table and expected calibration error, and the mean absolute error of the remaining length.
 */

/**
 * Area under the ROC curve of scores against binary outcomes: the chance that a random success
 * scores above a random failure, ties counting half (the Mann-Whitney U statistic / (n₊·n₋)).
 * NaN when either class is empty.
 */
export function auc(scores: readonly number[], outcomes: readonly number[]): number {
  scores.forEach((s, i) => {
    if (!Number.isFinite(s)) throw new Error(`auc: score ${i} is ${s}, not a finite number`);
  });
  const order = scores.map((s, i) => ({ s, y: outcomes[i] >= 0.5 ? 1 : 0 })).sort((a, b) => a.s - b.s);
  let pos = 0;
  let neg = 0;
  let rankSum = 0;
  for (let i = 0; i < order.length; ) {
    let j = i;
    while (j < order.length && order[j].s === order[i].s) j++;
    const midRank = (i + 1 + j) / 2; // average 1-based rank of the tie group
    for (let k = i; k < j; k++) if (order[k].y) rankSum += midRank;
    i = j;
  }
  for (const o of order) {
    if (o.y) pos++;
    else neg++;
  }
  if (!pos || !neg) return NaN;
  return (rankSum - (pos * (pos + 1)) / 2) / (pos * neg);
}

/** One bin of a reliability table. */
export interface ReliabilityBin {
  /** The bin's range of predicted Q: [lo, hi) (the last closed). */
  lo: number;
  hi: number;
  count: number;
  meanQ: number;
  /** Mean outcome of the bin's predictions. */
  meanOutcome: number;
}

/** Predictions in `bins` equal-width bins of Q over [0, 1], each with its mean Q and mean outcome (empty bins kept, count 0). */
export function reliabilityTable(q: readonly number[], outcomes: readonly number[], bins = 10): ReliabilityBin[] {
  const table = Array.from({ length: bins }, (_, k) => ({ lo: k / bins, hi: (k + 1) / bins, count: 0, meanQ: 0, meanOutcome: 0 }));
  q.forEach((p, i) => {
    const b = table[Math.min(bins - 1, Math.max(0, Math.floor(p * bins)))];
    b.count++;
    b.meanQ += p;
    b.meanOutcome += outcomes[i];
  });
  for (const b of table) {
    if (!b.count) continue;
    b.meanQ /= b.count;
    b.meanOutcome /= b.count;
  }
  return table;
}

/** Expected calibration error: Σ over reliability bins of (count / n) · |mean Q − mean outcome|. */
export function expectedCalibrationError(q: readonly number[], outcomes: readonly number[], bins = 10): number {
  return reliabilityTable(q, outcomes, bins).reduce((s, b) => s + (b.count / q.length) * Math.abs(b.meanQ - b.meanOutcome), 0);
}

/** Mean absolute error of predictions against truth. */
export function meanAbsoluteError(predicted: readonly number[], truth: readonly number[]): number {
  return predicted.reduce((s, p, i) => s + Math.abs(p - truth[i]), 0) / predicted.length;
}
