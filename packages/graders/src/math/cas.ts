/**
 * Symbolic equivalence through @cortex-js/compute-engine (LaTeX in). It runs inside the CAS worker
 * (see cas-pool.ts), never on the caller's thread, so a pathological input can be cut off.
 */
import { ComputeEngine } from '@cortex-js/compute-engine';
import type { RelationOp } from './structure';

/** What the CAS concluded about two answers. */
export type CasVerdict = 'equal' | 'different' | 'unparseable-gold' | 'unparseable-pred';

/** A request to the CAS: two expressions, or two relations given as sides and operator. */
export type CasRequest =
  | { kind: 'expr'; gold: string; pred: string; relTol: number }
  | { kind: 'relation'; op: RelationOp; gold: [string, string]; pred: [string, string]; relTol: number };

type Expr = NonNullable<ReturnType<ComputeEngine['parse']>>;

/** Values tried for each free variable, chosen to avoid 0, 1 and small integers where identities degenerate. */
const SAMPLE_POINTS = [0.5381, 1.2917, 2.0473, 0.3127, 1.7759, 2.6213];

/** Rewrites what the LaTeX parser does not take as written: percent signs. */
function prepareLatex(latex: string): string {
  return latex.replace(/([\d.}]+)%/g, '($1/100)').replace(/\\dots/g, '');
}

function hasError(e: Expr): boolean {
  return JSON.stringify(e.json).includes('"Error"');
}

/** Operators whose numeric value at sample points is not trustworthy (indexed symbols, bound variables). */
const NOT_SAMPLED = /"(?:Subscript|Sum|Product|Integrate|D|Limit|Derivative)"/;

/** A numeric value as nested arrays (a matrix evaluates to lists of lists), or null when not numeric. */
function numericTree(json: unknown): number | unknown[] | null {
  if (typeof json === 'number') return json;
  if (Array.isArray(json) && json[0] === 'List') {
    const items = json.slice(1).map(numericTree);
    return items.some((x) => x === null) ? null : items;
  }
  if (Array.isArray(json) && json[0] === 'Rational' && typeof json[1] === 'number' && typeof json[2] === 'number') return json[1] / json[2];
  if (typeof json === 'object' && json !== null && 'num' in json) return Number((json as { num: string }).num);
  return null;
}

function treesClose(a: number | unknown[], b: number | unknown[], relTol: number): boolean {
  if (typeof a === 'number' || typeof b === 'number') return typeof a === 'number' && typeof b === 'number' && close(a, b, relTol);
  return a.length === b.length && a.every((x, i) => treesClose(x as number | unknown[], b[i] as number | unknown[], relTol));
}

/** The expression's numeric value at an assignment of its free variables (NaN when not real). */
function valueAt(e: Expr, at: Record<string, number>): { re: number; im: number } {
  const v = Object.keys(at).length ? e.subs(at).N() : e.N();
  return { re: v.re, im: v.im ?? 0 };
}

function close(a: number, b: number, relTol: number): boolean {
  return Math.abs(a - b) <= relTol * Math.max(1, Math.abs(a), Math.abs(b));
}

/** One assignment per sample index for the union of both expressions' unknowns. */
function assignments(exprs: Expr[]): Record<string, number>[] {
  const names = [...new Set(exprs.flatMap((e) => [...e.unknowns]))].sort();
  if (names.length === 0) return [{}];
  return SAMPLE_POINTS.map((_, k) => Object.fromEntries(names.map((n, j) => [n, SAMPLE_POINTS[(k + j) % SAMPLE_POINTS.length] + 0.1 * j])));
}

/** The CAS engine with its state; one per worker. */
export class SymbolicChecker {
  private readonly ce = new ComputeEngine();

  private parse(latex: string): Expr | null {
    const e = this.ce.parse(prepareLatex(latex));
    return e === null || hasError(e) ? null : e;
  }

  /** Decides a request: parse both sides, then structural, then numeric equality at sample points. */
  check(req: CasRequest): CasVerdict {
    return req.kind === 'expr' ? this.checkExpr(req.gold, req.pred, req.relTol) : this.checkRelation(req.op, req.gold, req.pred, req.relTol);
  }

  private checkExpr(goldLatex: string, predLatex: string, relTol: number): CasVerdict {
    const gold = this.parse(goldLatex);
    if (!gold) return 'unparseable-gold';
    const pred = this.parse(predLatex);
    if (!pred) return 'unparseable-pred';
    if (gold.isSame(pred)) return 'equal';
    if (NOT_SAMPLED.test(JSON.stringify(gold.json)) || NOT_SAMPLED.test(JSON.stringify(pred.json))) return 'different';
    if (goldLatex.includes('\\begin{') || predLatex.includes('\\begin{')) {
      const g = numericTree(gold.N().json);
      const p = numericTree(pred.N().json);
      return g !== null && p !== null && treesClose(g, p, relTol) ? 'equal' : 'different';
    }
    let finite = 0;
    for (const at of assignments([gold, pred])) {
      const g = valueAt(gold, at);
      const p = valueAt(pred, at);
      if (!Number.isFinite(g.re) || !Number.isFinite(p.re)) continue;
      finite++;
      if (!close(g.re, p.re, relTol) || !close(g.im, p.im, relTol)) return 'different';
    }
    return finite > 0 ? 'equal' : 'different';
  }

  private checkRelation(op: RelationOp, goldSides: [string, string], predSides: [string, string], relTol: number): CasVerdict {
    const gl = this.parse(goldSides[0]);
    const gr = this.parse(goldSides[1]);
    if (!gl || !gr) return 'unparseable-gold';
    const pl = this.parse(predSides[0]);
    const pr = this.parse(predSides[1]);
    if (!pl || !pr) return 'unparseable-pred';
    if ([gl, gr, pl, pr].some((e) => NOT_SAMPLED.test(JSON.stringify(e.json)))) return 'different';
    // two relations are equivalent when (lhs − rhs) of one is a constant multiple of the other's;
    // for inequalities the multiple must be positive
    let ratio: number | null = null;
    for (const at of assignments([gl, gr, pl, pr])) {
      const g = valueAt(gl, at).re - valueAt(gr, at).re;
      const p = valueAt(pl, at).re - valueAt(pr, at).re;
      if (!Number.isFinite(g) || !Number.isFinite(p)) continue;
      if (Math.abs(p) < 1e-12 || Math.abs(g) < 1e-12) {
        if (Math.abs(p) < 1e-12 && Math.abs(g) < 1e-12) continue;
        return 'different';
      }
      const r = g / p;
      if (ratio === null) ratio = r;
      else if (!close(r, ratio, relTol)) return 'different';
    }
    if (ratio === null) return 'different';
    if ((op === '<' || op === '\\le') && ratio < 0) return 'different';
    return 'equal';
  }
}
