/**
 * Equivalence of two normalised answers: structure first (sets, tuples, intervals, matrices,
 * relations, lists), then each leaf by string, by number, and only then by the CAS.
 */
import { evaluateConstant, takesTwoValues } from './evaluate';
import { parseNumber, parsedNumbersEqual, withinShownDigits } from './numbers';
import type { MathOptions } from './options';
import { realSet, realSetsEqual, usesSetOperation } from './sets';
import { parseAnswer, type AnswerNode } from './structure';
import type { CasOutcome } from './cas-pool';
import type { CasRequest } from './cas';

/** The symbolic check the comparison may call; null when symbolic checks are off. */
export type SymbolicCheck = ((request: CasRequest) => Promise<CasOutcome>) | null;

/** Why a comparison ended as it did, for counting. */
export type EquivalenceReason = 'string' | 'numeric' | 'symbolic' | 'different' | 'unparseable-gold' | 'timeout';

/** A comparison's outcome. */
export interface Equivalence {
  equal: boolean;
  reason: EquivalenceReason;
}

const WORD = /^[a-zA-Z][a-zA-Z\s]*$/;

/** Letters naming variables in a normalised expression: outside command and environment names, e and i excepted (constants). */
function variableLetters(expr: string): string[] {
  return expr.replace(/\\(?:begin|end)\{[^{}]*\}|\\[a-zA-Z]+/g, '').match(/[a-df-hj-zA-Z]/g) ?? [];
}

/**
 * True when one side is a constant and the other certainly varies: some variable of it occurs
 * exactly once (x + 1, \sin x), so it cannot cancel out, or it takes two values at two points
 * (x^2 + x). Other expressions whose variables all repeat (x - x + 2, \sin^2 x + \cos^2 x) are
 * left to the CAS.
 */
function constantAgainstVariable(gold: string, pred: string): boolean {
  const onceOrTwoValues = (expr: string, letters: string[]) => letters.some((l, i) => letters.indexOf(l) === i && letters.lastIndexOf(l) === i) || takesTwoValues(expr);
  const g = variableLetters(gold);
  const p = variableLetters(pred);
  return (g.length === 0 && onceOrTwoValues(pred, p)) || (p.length === 0 && onceOrTwoValues(gold, g));
}

/** Intervals, unions and sets: the answers an inequality may describe. */
function isSetLike(n: AnswerNode): boolean {
  return n.kind === 'seq' || n.kind === 'union' || n.kind === 'set';
}

/** True for an interval or union read from an inequality (`a < x ≤ b`). */
function readFromRelation(n: AnswerNode): boolean {
  return (n.kind === 'seq' || n.kind === 'union') && n.fromRelation === true;
}

class Comparison {
  /** The most telling non-equal reason seen (an unparseable gold or a timeout outranks "different"). */
  failure: EquivalenceReason = 'different';
  used: EquivalenceReason = 'string';

  /** When symbolic checks stop being started for this comparison (performance.now() time). */
  private readonly deadline: number;

  constructor(
    private readonly options: MathOptions,
    private readonly symbolic: SymbolicCheck,
  ) {
    this.deadline = performance.now() + options.gradeTimeoutMs;
  }

  private fail(reason: EquivalenceReason): false {
    if (reason !== 'different') this.failure = reason;
    return false;
  }

  async atoms(gold: string, pred: string): Promise<boolean> {
    if (gold === pred) return true;
    if (WORD.test(gold) && WORD.test(pred)) return gold.toLowerCase() === pred.toLowerCase();
    const g = parseNumber(gold);
    const p = parseNumber(pred);
    if (g && p) {
      if (parsedNumbersEqual(g, p, this.options.percent, this.options)) {
        this.used = 'numeric';
        return true;
      }
      return false;
    }
    // a rounded decimal against a closed form (1.414 for \sqrt{2}): the digits it shows decide
    if (this.options.roundedTolerance === 'digits' && (g?.isDecimal || p?.isDecimal)) {
      const [rounded, exact] = g?.isDecimal ? [g, pred] : [p as NonNullable<typeof p>, gold];
      const value = rounded.percent ? null : evaluateConstant(exact);
      const verdict = value === null ? null : withinShownDigits(rounded, value);
      if (verdict !== null) {
        if (verdict) this.used = 'numeric';
        return verdict;
      }
    }
    if (!this.symbolic) return false;
    // a constant never equals an expression that varies with a variable: no CAS needed
    if (constantAgainstVariable(gold, pred)) return false;
    const casTol = Math.max(this.options.relTol, 10 ** -this.options.floatRounding / 2);
    // two constants whose values differ well beyond the CAS's tolerance: no CAS needed (equality is still the CAS's call)
    const gv = evaluateConstant(gold);
    const pv = gv === null ? null : evaluateConstant(pred);
    if (gv !== null && pv !== null && Math.abs(gv - pv) > 4 * casTol * Math.max(1, Math.abs(gv), Math.abs(pv))) return false;
    return this.cas({ kind: 'expr', gold, pred, relTol: casTol });
  }

  /** Asks the CAS unless this comparison's time is up; an equal verdict is marked symbolic, an unparseable gold or a timeout kept as the failure. */
  private async cas(request: CasRequest): Promise<boolean> {
    if (!this.symbolic) return false;
    if (performance.now() > this.deadline) return this.fail('timeout');
    const outcome = await this.symbolic(request);
    if (outcome === 'equal') {
      this.used = 'symbolic';
      return true;
    }
    if (outcome === 'unparseable-gold' || outcome === 'timeout') return this.fail(outcome);
    return false;
  }

  /** Set equality: every gold item equals some predicted item and every predicted item some gold item (repeats collapse, as in a set). */
  async unordered(gold: AnswerNode[], pred: AnswerNode[]): Promise<boolean> {
    const matched = new Array<boolean>(pred.length).fill(false);
    for (const g of gold) {
      let hit = false;
      for (let i = 0; i < pred.length; i++) {
        if (await this.nodes(g, pred[i])) {
          matched[i] = hit = true;
          // keep looking only among unmatched items, so that each predicted item gets checked once
          for (let j = i + 1; j < pred.length; j++) if (!matched[j] && (await this.nodes(g, pred[j]))) matched[j] = true;
          break;
        }
      }
      if (!hit) return false;
    }
    for (let i = 0; i < pred.length; i++) {
      if (matched[i]) continue;
      let hit = false;
      for (const g of gold) {
        if (await this.nodes(g, pred[i])) {
          hit = true;
          break;
        }
      }
      if (!hit) return false;
    }
    return true;
  }

  async ordered(gold: AnswerNode[], pred: AnswerNode[]): Promise<boolean> {
    if (gold.length !== pred.length) return false;
    for (let i = 0; i < gold.length; i++) if (!(await this.nodes(gold[i], pred[i]))) return false;
    return true;
  }

  async nodes(gold: AnswerNode, pred: AnswerNode): Promise<boolean> {
    // an inequality does not answer a question whose gold is an interval or set, unless allowed
    if (!this.options.setRelation && isSetLike(gold) && !readFromRelation(gold) && readFromRelation(pred)) return false;
    if (gold.kind === 'atom' && pred.kind === 'atom') return this.atoms(gold.text, pred.text);
    // a union of finite sets is the set of all their items: \{1\} \cup \{2, 3\}
    const flatSet = (n: AnswerNode): AnswerNode => (n.kind === 'union' && n.parts.every((x) => x.kind === 'set') ? { kind: 'set', items: n.parts.flatMap((x) => (x as { items: AnswerNode[] }).items) } : n);
    if (flatSet(gold) !== gold || flatSet(pred) !== pred) return this.nodes(flatSet(gold), flatSet(pred));
    const listLike = (n: AnswerNode) => n.kind === 'list' || n.kind === 'set';
    if (listLike(gold) && listLike(pred)) {
      const g = (gold as { items: AnswerNode[] }).items;
      const p = (pred as { items: AnswerNode[] }).items;
      const ordered = gold.kind === 'list' && pred.kind === 'list' && this.options.listOrder === 'strict';
      return ordered ? this.ordered(g, p) : this.unordered(g, p);
    }
    // one answer against a list of answers that all mean it (15\frac{39}{40}, or \frac{639}{40})
    if (gold.kind === 'atom' && listLike(pred)) return this.unordered([gold], (pred as { items: AnswerNode[] }).items);
    if (pred.kind === 'atom' && listLike(gold)) return this.unordered((gold as { items: AnswerNode[] }).items, [pred]);
    if (gold.kind === 'seq' && pred.kind === 'seq') {
      if (gold.open !== pred.open || gold.close !== pred.close) return false;
      return this.ordered(gold.items, pred.items);
    }
    // a tuple written without parentheses: (1, 2) vs 1, 2
    if (gold.kind === 'seq' && pred.kind === 'list' && gold.open === '(' && gold.close === ')') return this.ordered(gold.items, pred.items);
    if (pred.kind === 'seq' && gold.kind === 'list' && pred.open === '(' && pred.close === ')') return this.ordered(gold.items, pred.items);
    if (gold.kind === 'union' && pred.kind === 'union') return this.unordered(gold.parts, pred.parts);
    // a matrix against an expression of matrices (a sum, a product): the CAS evaluates it
    if (gold.kind === 'matrix' && pred.kind === 'atom' && pred.text.includes('\\begin{')) return this.atoms(gold.text, pred.text);
    if (pred.kind === 'matrix' && gold.kind === 'atom' && gold.text.includes('\\begin{')) return this.atoms(gold.text, pred.text);
    if (gold.kind === 'matrix' && pred.kind === 'matrix') {
      if (gold.rows.length !== pred.rows.length) return false;
      for (let r = 0; r < gold.rows.length; r++) if (!(await this.ordered(gold.rows[r], pred.rows[r]))) return false;
      return true;
    }
    // a predicted chain `5+5+1 = 7 = 11` against a bare gold value: its last side is the answer
    if (pred.kind === 'relation' && pred.op === '=' && gold.kind === 'atom') return this.nodes(gold, parseAnswer(pred.rhs));
    if (gold.kind === 'relation' && pred.kind === 'relation') {
      if (gold.op !== pred.op) return false;
      if ((await this.atoms(gold.lhs, pred.lhs)) && (await this.atoms(gold.rhs, pred.rhs))) return true;
      if (gold.op === '=' || gold.op === '\\ne') {
        if ((await this.atoms(gold.lhs, pred.rhs)) && (await this.atoms(gold.rhs, pred.lhs))) return true;
      }
      return this.cas({ kind: 'relation', op: gold.op, gold: [gold.lhs, gold.rhs], pred: [pred.lhs, pred.rhs], relTol: 1e-6 });
    }
    return false;
  }
}

/** Compares two normalised answers (gold first). */
export async function answersEquivalent(gold: string, pred: string, options: MathOptions, symbolic: SymbolicCheck): Promise<Equivalence> {
  if (gold === pred) return { equal: true, reason: 'string' };
  const cmp = new Comparison(options, symbolic);
  const goldNode = parseAnswer(gold);
  const predNode = parseAnswer(pred);
  const equal = await cmp.nodes(goldNode, predNode);
  if (!equal && (usesSetOperation(gold) || usesSetOperation(pred))) {
    // a set written with set operations: \R \setminus \{0\}, [1,2] \cup [2,3], against any other way of writing it
    const asSet = (s: string, n: AnswerNode) => realSet(n.kind === 'list' ? `\\{${s}\\}` : s);
    const g = asSet(gold, goldNode);
    const p = g && asSet(pred, predNode);
    if (g && p) return realSetsEqual(g, p) ? { equal: true, reason: 'numeric' } : { equal: false, reason: 'different' };
  }
  if (!equal) {
    // y = Ce^{-2t} against y = ce^{-2t}: the same answer up to the names of its arbitrary constants
    const renamed = withGoldConstants(gold, pred);
    if (renamed !== null && (await cmp.nodes(goldNode, parseAnswer(renamed)))) return { equal: true, reason: cmp.used };
  }
  return equal ? { equal, reason: cmp.used } : { equal, reason: cmp.failure };
}

/** Names that conventionally stand for arbitrary constants (of integration, of a family): A–D, K, c, k, with any subscript. */
const CONSTANT_NAME = /^[ABCDKck](?:_\{?[A-Za-z0-9]+\}?)?$/;
/** A one-letter name with an optional subscript (e and i excepted: constants); matched outside command names only. */
const NAME = /([A-DF-HJ-Za-df-hj-z])(_\{[A-Za-z0-9]+\}|_[A-Za-z0-9])?/g;

/** `expr` split into the parts outside command names (even indices) and the command names (odd). */
const outsideCommands = (expr: string) => expr.split(/(\\[a-zA-Z]+)/);

/** A name as a key: `C_{1}` and `C_1` are both `C_1`. */
const nameKey = (letter: string, sub: string | undefined) => letter + (sub ?? '').replace(/[{}]/g, '');

function namesOf(expr: string): Set<string> {
  return new Set(outsideCommands(expr).flatMap((part, i) => (i % 2 ? [] : [...part.matchAll(NAME)].map((m) => nameKey(m[1], m[2])))));
}

/**
 * `pred` with its arbitrary constants renamed to the gold's, when the two differ only there: the
 * names in one and not the other are constants (A–D, K, c, k, subscripts allowed), equally many on
 * each side (at most three), paired in sorted order, and the two share a variable. Null when there is nothing to rename.
 */
export function withGoldConstants(gold: string, pred: string): string | null {
  const g = namesOf(gold);
  const p = namesOf(pred);
  const onlyGold = [...g].filter((n) => !p.has(n)).sort();
  const onlyPred = [...p].filter((n) => !g.has(n)).sort();
  // a variable both share (t in Ce^{-2t}): never rename a bare answer (k against c)
  if (onlyPred.length === 0 || onlyPred.length !== onlyGold.length || onlyPred.length > 3 || ![...g].some((n) => p.has(n))) return null;
  if (![...onlyGold, ...onlyPred].every((n) => CONSTANT_NAME.test(n))) return null;
  const to = new Map(onlyPred.map((n, i) => [n, onlyGold[i].length > 1 ? `${onlyGold[i][0]}_{${onlyGold[i].slice(2)}}` : onlyGold[i]]));
  const out = outsideCommands(pred)
    .map((part, i) => (i % 2 ? part : part.replace(NAME, (whole, letter: string, sub: string | undefined) => to.get(nameKey(letter, sub)) ?? whole)))
    .join('');
  return out;
}
