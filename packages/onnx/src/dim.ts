/**
 * Dimensions. A dim is a number, or a symbolic product such as `'B'`, `'B*T'` or `'8*B'` (a
 * monomial: an integer coefficient times named factors). Monomials make reshapes like
 * [B, T, D] → [B*T, D] → [B, T, D] checkable at build time. Names starting with `?` are anonymous
 * dims that an op could not express (e.g. a slice ending at a symbolic position); they match any
 * dim when broadcasting, since nothing can be checked about them.
 */

/** A tensor dimension: a fixed size or a symbolic monomial. */
export type Dim = number | string;
/** A tensor shape. */
export type Shape = readonly Dim[];

interface Monomial {
  coef: number;
  factors: string[];
}

function parse(d: Dim): Monomial {
  if (typeof d === 'number') return { coef: d, factors: [] };
  let coef = 1;
  const factors: string[] = [];
  for (const part of d.split('*')) {
    const p = part.trim();
    if (/^\d+$/.test(p)) coef *= Number(p);
    else if (p.length > 0) factors.push(p);
    else throw new Error(`invalid dim '${d}'`);
  }
  factors.sort();
  return { coef, factors };
}

function format(m: Monomial): Dim {
  if (m.factors.length === 0) return m.coef;
  return (m.coef === 1 ? '' : `${m.coef}*`) + m.factors.join('*');
}

/** Canonical form of a dim (`'T*B'` → `'B*T'`, `'1*B'` → `'B'`). */
export function canonicalDim(d: Dim): Dim {
  return format(parse(d));
}

/** Whether two dims are the same size for every binding of the symbols. */
export function dimEquals(a: Dim, b: Dim): boolean {
  return canonicalDim(a) === canonicalDim(b);
}

/** Whether the dim is a fixed number. */
export function isStaticDim(d: Dim): d is number {
  return typeof d === 'number';
}

/** Whether the dim contains an anonymous factor. */
export function isAnonymousDim(d: Dim): boolean {
  return typeof d === 'string' && d.includes('?');
}

/** Product of two dims. */
export function dimMul(a: Dim, b: Dim): Dim {
  const ma = parse(a);
  const mb = parse(b);
  return format({ coef: ma.coef * mb.coef, factors: [...ma.factors, ...mb.factors].sort() });
}

/** Product of all dims of a shape (1 for a scalar). */
export function shapeSize(shape: Shape): Dim {
  return shape.reduce<Dim>((acc, d) => dimMul(acc, d), 1);
}

/** a / b when b divides a as monomials, else undefined. */
export function dimDiv(a: Dim, b: Dim): Dim | undefined {
  const ma = parse(a);
  const mb = parse(b);
  if (mb.coef === 0 || ma.coef % mb.coef !== 0) return undefined;
  const rest = [...ma.factors];
  for (const f of mb.factors) {
    const i = rest.indexOf(f);
    if (i < 0) return undefined;
    rest.splice(i, 1);
  }
  return format({ coef: ma.coef / mb.coef, factors: rest });
}

/** The distinct symbolic factors of a dim. */
export function dimSymbols(d: Dim): string[] {
  return [...new Set(parse(d).factors)];
}

/** The numeric coefficient of a dim. */
export function dimCoefficient(d: Dim): number {
  return parse(d).coef;
}

/** Broadcast two dims by NumPy rules; undefined when they cannot broadcast. */
export function broadcastDim(a: Dim, b: Dim): Dim | undefined {
  if (dimEquals(a, b)) return canonicalDim(a);
  if (a === 1) return b;
  if (b === 1) return a;
  if (isAnonymousDim(a)) return b;
  if (isAnonymousDim(b)) return a;
  return undefined;
}

/** Broadcast shapes by NumPy rules; undefined when they cannot broadcast. */
export function broadcastShapes(...shapes: Shape[]): Dim[] | undefined {
  const rank = Math.max(0, ...shapes.map((s) => s.length));
  const out: Dim[] = [];
  for (let i = 0; i < rank; i++) {
    let d: Dim = 1;
    for (const s of shapes) {
      const j = i - (rank - s.length);
      if (j < 0) continue;
      const r = broadcastDim(d, s[j]);
      if (r === undefined) return undefined;
      d = r;
    }
    out.push(d);
  }
  return out;
}

/** Human-readable shape, e.g. `[B, T, 64]`. */
export function formatShape(shape: Shape): string {
  return `[${shape.join(', ')}]`;
}

let anonymousCounter = 0;
/** A fresh anonymous dim (`'?7'`): a size only known at run time. */
export function anonymousDim(): string {
  return `?${anonymousCounter++}`;
}

/** Sum of dims: exact when static or when all are the same monomial, else anonymous. */
export function dimAdd(dims: Dim[]): Dim {
  if (dims.every((d) => typeof d === 'number')) return (dims as number[]).reduce((a, b) => a + b, 0);
  const first = dims[0];
  if (dims.every((d) => dimEquals(d, first))) return dimMul(first, dims.length);
  return anonymousDim();
}
