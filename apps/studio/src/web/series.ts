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

/** A run's step time split by phase, stacked: `top[k]` is the sum of the first k+1 phases at each step. */
export interface StepTimeStack {
  /** The phase keys (`*_ms` but the total `step_ms`), in the order they are stacked from the bottom. */
  phases: string[];
  steps: number[];
  /** Per phase, its own milliseconds at each step (null where that step did not log it). */
  values: (number | null)[][];
  /** Per phase, the running sum up to it (null where the phase is null). */
  top: (number | null)[][];
}

/** The order phases are stacked in, bottom first; other `*_ms` keys follow in name order. */
const PHASE_ORDER = ['generation_ms', 'scoring_ms', 'rewards_ms', 'training_ms', 'run_ms', 'host_ms'];

/**
 * The step-time split of a run's lines: every `*_ms` key but `step_ms` (the step's total, which the
 * phases sum to) is a phase. Null when the run logs no phase.
 */
export function stepTimeStack(lines: readonly Line[]): StepTimeStack | null {
  const keys = new Set<string>();
  for (const l of lines) for (const [k, v] of Object.entries(l)) if (k.endsWith('_ms') && k !== 'step_ms' && typeof v === 'number') keys.add(k);
  if (keys.size === 0) return null;
  const rank = (k: string) => (PHASE_ORDER.includes(k) ? PHASE_ORDER.indexOf(k) : PHASE_ORDER.length);
  const phases = [...keys].sort((a, b) => rank(a) - rank(b) || a.localeCompare(b));
  const per = phases.map((k) => new Map(series(lines, k)));
  const steps = [...new Set(per.flatMap((m) => [...m.keys()]))].sort((a, b) => a - b);
  const values = per.map((m) => steps.map((s) => m.get(s) ?? null));
  const top = values.map(() => [] as (number | null)[]);
  steps.forEach((_, i) => {
    let acc = 0;
    values.forEach((v, k) => {
      acc += v[i] ?? 0;
      top[k].push(v[i] === null ? null : acc);
    });
  });
  return { phases, steps, values, top };
}
