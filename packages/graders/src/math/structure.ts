/**
 * The shape of a normalised answer: a matrix, a union of intervals, a set, a tuple or interval, a
 * relation, a bare comma list, a `±` pair, or a single expression.
 */
import { dropVariablePrefix } from './normalize';
import { parseNumber } from './numbers';
import { splitTopLevel, wrapsWhole } from './split';

/** One answer's structure; leaves are normalised strings. */
export type AnswerNode =
  | { kind: 'atom'; text: string }
  | { kind: 'list'; items: AnswerNode[] }
  | { kind: 'set'; items: AnswerNode[] }
  | { kind: 'seq'; open: '(' | '['; close: ')' | ']'; items: AnswerNode[]; fromRelation?: true }
  | { kind: 'union'; parts: AnswerNode[]; fromRelation?: true }
  | { kind: 'matrix'; rows: AnswerNode[][]; text: string }
  | { kind: 'relation'; op: RelationOp; lhs: string; rhs: string };

/** Relation operators after normalisation; `>` and `\ge` are flipped into `<` and `\le`. */
export type RelationOp = '=' | '<' | '\\le' | '\\ne';

const MATRIX = /^\\begin\{([pbvBV]?matrix|array)\}(?:\{[^{}]*\})?((?:(?!\\end\{).)*)\\end\{\1\}$/;

function parseMatrix(s: string, depth: number): AnswerNode | null {
  let inner = s;
  if (/^[[(].*[\])]$/.test(inner) && wrapsWhole(inner) && inner.slice(1, -1).startsWith('\\begin{')) inner = inner.slice(1, -1);
  const m = MATRIX.exec(inner);
  if (!m) return null;
  const rows = m[2].split('\\\\').filter((r) => r !== '' && !/^\\hline$/.test(r));
  return { kind: 'matrix', rows: rows.map((r) => r.split('&').map((cell) => parseAnswer(cell, depth + 1))), text: s };
}

const RELATIONS: [string, RelationOp, boolean][] = [
  ['≤', '\\le', false],
  ['≥', '\\le', true],
  ['≠', '\\ne', false],
  ['<', '<', false],
  ['>', '<', true],
  ['=', '=', false],
];

/** The negation of a bound as text: `-3`, `\\frac{3}{2}` → `-\\frac{3}{2}`, `a+b` → `-(a+b)`. */
function negated(bound: string): string {
  if (bound.startsWith('-') && parseNumber(bound.slice(1))) return bound.slice(1);
  return parseNumber(bound) ? `-${bound}` : `-(${bound})`;
}

/**
 * `a < x ≤ b` (a name between two bounds) as the interval `(a, b]`, and `a ≤ |x| ≤ b` with
 * `a ≥ 0` as the union `[-b, -a] ∪ [a, b]` (one interval `[-b, b]` when `a = 0` is included).
 * Both are marked as read from a relation.
 */
function parseChainedInequality(s: string, depth: number): AnswerNode | null {
  const parts = s.split(/(≤|<)/);
  if (parts.length !== 5 || parts.some((p) => p === '')) return null;
  const [lo, op1, middle, op2, hi] = parts;
  if (/\d/.test(middle.replace(/_\{[^{}]*\}|_\w/g, '')) || !/[a-zA-Z]/.test(middle)) return null;
  const openOf = (op: string) => (op === '<' ? '(' : '[');
  const closeOf = (op: string) => (op === '<' ? ')' : ']');
  const interval = (open: '(' | '[', a: string, b: string, close: ')' | ']'): AnswerNode => ({
    kind: 'seq',
    open,
    close,
    items: [parseAnswer(a, depth + 1), parseAnswer(b, depth + 1)],
    fromRelation: true,
  });
  if (/^\|[^|]+\|$/.test(middle)) {
    const low = parseNumber(lo);
    if (!low || low.value < 0) return null;
    if (low.value === 0 && op1 === '≤') return interval(openOf(op2), negated(hi), hi, closeOf(op2));
    return { kind: 'union', parts: [interval(openOf(op2), negated(hi), negated(lo), closeOf(op1)), interval(openOf(op1), lo, hi, closeOf(op2))], fromRelation: true };
  }
  return interval(openOf(op1), lo, hi, closeOf(op2));
}

function parseRelation(s: string): AnswerNode | null {
  for (const [token, op, flip] of RELATIONS) {
    const sides = splitTopLevel(s, token);
    if (sides.length !== 2 || sides[0] === '' || sides[1] === '') continue;
    const [lhs, rhs] = flip ? [sides[1], sides[0]] : [sides[0], sides[1]];
    return { kind: 'relation', op, lhs, rhs };
  }
  return null;
}

/** Nesting deeper than this is not an answer anyone writes: the rest is kept as one leaf. */
const MAX_DEPTH = 32;

/** Parses a normalised answer into its structure. */
export function parseAnswer(s: string, depth = 0): AnswerNode {
  if (depth > MAX_DEPTH) return { kind: 'atom', text: s };
  const child = (x: string) => parseAnswer(x, depth + 1);
  const matrix = parseMatrix(s, depth);
  if (matrix) return matrix;
  const union = splitTopLevel(s, '\\cup');
  if (union.length > 1) return { kind: 'union', parts: union.map(child) };
  if (s.startsWith('\\{') && s.endsWith('\\}') && wrapsWhole(s)) {
    const inner = s.slice(2, -2);
    return { kind: 'set', items: inner === '' ? [] : splitTopLevel(inner, ',').map(child) };
  }
  if (/^[([].*[)\]]$/.test(s) && wrapsWhole(s)) {
    const items = splitTopLevel(s.slice(1, -1), ',');
    // one item in brackets is grouping, not a tuple or an interval (an interval needs two ends): (5), [45]
    if (items.length === 1) return child(s.slice(1, -1));
    if (items.length > 1) return { kind: 'seq', open: s[0] as '(' | '[', close: s.at(-1) as ')' | ']', items: items.map(child) };
  }
  const listItems = splitTopLevel(s, ',').filter((x) => x !== '');
  // each listed answer may carry its own name: AB=4, CD=5
  if (listItems.length > 1) return { kind: 'list', items: listItems.map((x) => child(dropVariablePrefix(x))) };
  const pm = splitTopLevel(s, '\\pm');
  if (pm.length === 2 && pm[1] !== '') {
    const base = pm[0] === '' ? '' : pm[0];
    return { kind: 'list', items: [{ kind: 'atom', text: `${base}+${pm[1]}` }, { kind: 'atom', text: `${base}-${pm[1]}` }] };
  }
  const chained = parseChainedInequality(s, depth);
  if (chained) return chained;
  const relation = parseRelation(s);
  if (relation) return relation;
  return { kind: 'atom', text: s };
}
