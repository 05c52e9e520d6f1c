/** The metrics page's arithmetic, apart from the DOM so it is tested on its own. */

/** One line of metrics.jsonl. */
export type Line = { step: number } & Record<string, unknown>;

/** Exponential moving average with weight `s` on the past (0: none), skipping gaps. */
export function smooth(values: (number | null)[], s: number): (number | null)[] {
  let acc: number | null = null;
  return values.map((v) => {
    if (v === null) return null;
    acc = acc === null || s === 0 ? v : s * acc + (1 - s) * v;
    return acc;
  });
}

/** The points of `key` in a run's lines (the last value logged at a step wins), sorted by step. */
export function series(lines: readonly Line[], key: string): [number, number][] {
  const by = new Map<number, number>();
  for (const l of lines) if (typeof l[key] === 'number' && Number.isFinite(l[key])) by.set(l.step, l[key] as number);
  return [...by.entries()].sort((a, b) => a[0] - b[0]);
}

/** Values a log axis can show: zero and negatives become gaps. */
export function forLogScale(values: (number | null)[]): (number | null)[] {
  return values.map((v) => (v !== null && v <= 0 ? null : v));
}
