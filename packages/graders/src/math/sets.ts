/**
 * Sets of real numbers written with set operations — unions of intervals and finite sets, `\R`,
 * `A \setminus B`, `A \cap B` — read into one canonical form (disjoint, sorted intervals; a point
 * is a closed interval of length 0), so that `[1,2] \cup [2,3]` equals `[1,3]` and
 * `\R \setminus \{0\}` equals `(-\infty,0) \cup (0,\infty)`. Only sets whose ends are numbers
 * (or ±∞) are read; anything else is left to the structural comparison.
 */
import { evaluateConstant } from './evaluate';
import { splitTopLevel, wrapsWhole } from './split';

/** One interval; `lo === hi` with both ends closed is a point. */
export interface RealInterval {
  lo: number;
  hi: number;
  loClosed: boolean;
  hiClosed: boolean;
}

/** A canonical real set: disjoint intervals sorted by their lower end, none empty, no two touching. */
export type RealSet = RealInterval[];

const EPS = 1e-9;
const same = (a: number, b: number) => a === b || (Number.isFinite(a) && Number.isFinite(b) && Math.abs(a - b) <= EPS * Math.max(1, Math.abs(a), Math.abs(b)));

/** A bound: ±∞ or a constant's value. */
function bound(s: string): number | null {
  if (/^\+?\\infty$/.test(s)) return Infinity;
  if (s === '-\\infty') return -Infinity;
  return evaluateConstant(s);
}

/** Sorted, merged, empty pieces dropped. */
export function canonical(pieces: readonly RealInterval[]): RealSet {
  const live = pieces.filter((p) => p.lo < p.hi || (same(p.lo, p.hi) && p.loClosed && p.hiClosed));
  live.sort((a, b) => (same(a.lo, b.lo) ? Number(b.loClosed) - Number(a.loClosed) : a.lo - b.lo));
  const out: RealSet = [];
  for (const p of live) {
    const last = out.at(-1);
    // overlapping, or touching with at least one end closed: one interval
    if (last && (p.lo < last.hi || (same(p.lo, last.hi) && (p.loClosed || last.hiClosed)))) {
      if (p.hi > last.hi || (same(p.hi, last.hi) && p.hiClosed)) {
        last.hiClosed = same(p.hi, last.hi) ? last.hiClosed || p.hiClosed : p.hiClosed;
        last.hi = Math.max(last.hi, p.hi);
      }
    } else out.push({ ...p });
  }
  return out;
}

/** The intersection of two canonical sets. */
function intersect(a: RealSet, b: RealSet): RealSet {
  const out: RealInterval[] = [];
  for (const x of a) {
    for (const y of b) {
      const lo = Math.max(x.lo, y.lo);
      const hi = Math.min(x.hi, y.hi);
      const loClosed = same(x.lo, y.lo) ? x.loClosed && y.loClosed : x.lo > y.lo ? x.loClosed : y.loClosed;
      const hiClosed = same(x.hi, y.hi) ? x.hiClosed && y.hiClosed : x.hi < y.hi ? x.hiClosed : y.hiClosed;
      out.push({ lo, hi, loClosed, hiClosed });
    }
  }
  return canonical(out);
}

/** The complement of a canonical set in ℝ. */
function complement(a: RealSet): RealSet {
  const out: RealInterval[] = [];
  let lo = -Infinity;
  let loClosed = false;
  for (const x of a) {
    out.push({ lo, hi: x.lo, loClosed, hiClosed: !x.loClosed && Number.isFinite(x.lo) });
    lo = x.hi;
    loClosed = !x.hiClosed && Number.isFinite(x.hi);
  }
  out.push({ lo, hi: Infinity, loClosed, hiClosed: false });
  return canonical(out.filter((p) => !(p.lo === -Infinity && p.hi === -Infinity) && !(p.lo === Infinity)));
}

/** One operand: `\R`, `\emptyset`, an interval, a finite set of numbers, or a bracketed expression. */
function operand(s: string, depth: number): RealSet | null {
  if (s === '\\R' || s === '(-\\infty,\\infty)' || s === '(-\\infty,+\\infty)') return [{ lo: -Infinity, hi: Infinity, loClosed: false, hiClosed: false }];
  if (s === '\\emptyset' || s === '\\{\\}') return [];
  if (s.startsWith('\\{') && s.endsWith('\\}') && wrapsWhole(s)) {
    const values = splitTopLevel(s.slice(2, -2), ',').map(bound);
    if (values.some((v) => v === null || !Number.isFinite(v))) return null;
    return canonical((values as number[]).map((v) => ({ lo: v, hi: v, loClosed: true, hiClosed: true })));
  }
  if (/^[([].*[)\]]$/.test(s) && wrapsWhole(s)) {
    const ends = splitTopLevel(s.slice(1, -1), ',');
    if (ends.length === 1) return expression(s.slice(1, -1), depth + 1);
    if (ends.length !== 2) return null;
    const lo = bound(ends[0]);
    const hi = bound(ends[1]);
    if (lo === null || hi === null || !(lo <= hi)) return null;
    return canonical([{ lo, hi, loClosed: s[0] === '[' && Number.isFinite(lo), hiClosed: s.at(-1) === ']' && Number.isFinite(hi) }]);
  }
  return null;
}

/** `A \cup B \cup …`, each part `X \setminus Y` or `X \cap Y` of operands (left to right). */
function expression(s: string, depth: number): RealSet | null {
  if (depth > 8) return null;
  const parts = splitTopLevel(s, '\\cup');
  const sets: RealSet[] = [];
  for (const part of parts) {
    const tokens = part.split(/(\\setminus|\\cap)(?![a-zA-Z])/);
    let acc = operand(tokens[0], depth);
    for (let i = 1; acc !== null && i < tokens.length; i += 2) {
      const next = operand(tokens[i + 1] ?? '', depth);
      if (next === null) return null;
      acc = tokens[i] === '\\cap' ? intersect(acc, next) : intersect(acc, complement(next));
    }
    if (acc === null) return null;
    sets.push(acc);
  }
  return canonical(sets.flat());
}

/** A normalised answer as a canonical real set, or null when it is not one this reads. */
export function realSet(normalised: string): RealSet | null {
  if (!/\\cup|\\setminus|\\cap|\\R|\\emptyset|^[([\\]/.test(normalised)) return null;
  return expression(normalised, 0);
}

/** True when the answer uses a set operation or ℝ (so that reading it as a real set may be needed). */
export function usesSetOperation(normalised: string): boolean {
  return /\\cup|\\setminus|\\cap|\\R(?![a-zA-Z])/.test(normalised);
}

/** Equality of two canonical sets (ends within a relative 1e-9). */
export function realSetsEqual(a: RealSet, b: RealSet): boolean {
  return a.length === b.length && a.every((x, i) => same(x.lo, b[i].lo) && same(x.hi, b[i].hi) && x.loClosed === b[i].loClosed && x.hiClosed === b[i].hiClosed);
}
