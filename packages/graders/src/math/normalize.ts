/**
 * Normalisation of one answer string to a canonical LaTeX-ish form with no whitespace, so that most
 * equivalent answers become equal strings without a computer-algebra system.
 */
import { lastBoxed } from './extract';
import { splitTopLevel } from './split';

/** Options of {@link normalizeAnswer}. */
export interface NormalizeOptions {
  /** Drop trailing units (`\text{ cm}`, `miles`, `cm^2`) and currency signs. */
  stripUnits: boolean;
  /** Keep a leading `x =` (by default the right-hand side alone is kept). */
  keepRelation?: boolean;
}

/** Replaces every `\cmd{…}` (nested braces allowed) by `wrap(content)`. */
export function replaceCommandGroups(s: string, cmd: string, wrap: (content: string) => string): string {
  let out = '';
  let i = 0;
  const token = `\\${cmd}`;
  while (i < s.length) {
    const at = s.indexOf(token, i);
    if (at < 0) break;
    let j = at + token.length;
    if (/[a-zA-Z]/.test(s[j] ?? '')) {
      // a longer command that merely starts with `cmd` (\textbf vs \text)
      out += s.slice(i, j);
      i = j;
      continue;
    }
    while (s[j] === ' ') j++;
    if (s[j] !== '{') {
      out += s.slice(i, j);
      i = j;
      continue;
    }
    let depth = 0;
    let k = j;
    for (; k < s.length; k++) {
      if (s[k] === '\\') { k++; continue; }
      if (s[k] === '{') depth++;
      else if (s[k] === '}' && --depth === 0) break;
    }
    if (k >= s.length) {
      out += s.slice(i);
      return out;
    }
    out += s.slice(i, at) + wrap(s.slice(j + 1, k));
    i = k + 1;
  }
  return out + s.slice(i);
}

const TEXT_COMMANDS = ['text', 'textbf', 'textit', 'textrm', 'textnormal', 'textup', 'mathrm', 'mathbf', 'mathit', 'mathsf', 'mathtt', 'mbox', 'hbox', 'operatorname', 'boldsymbol', 'bm'];

/** Common units and unit-like words dropped after a numeric answer when `stripUnits` is on. */
const UNIT_WORDS =
  'units?|square|cubic|sq|cm|mm|km|m|meters?|metres?|centimeters?|kilometers?|millimeters?|inch(?:es)?|in|feet|foot|ft|yards?|yd|miles?|mi|mph|kg|g|grams?|kilograms?|pounds?|lbs?|lb|ounces?|oz|tons?|seconds?|sec|s|minutes?|min|hours?|hrs?|h|days?|weeks?|months?|years?|liters?|litres?|l|ml|gallons?|dollars?|cents?|euros?|degrees?|deg|radians?|rad|people|persons?|students?|points?|ways?|times|percent|pct|items?|apples?|pages?|books?|marbles?|cookies?|boxes|box|balls?|cars?|trees?|hats?';
// a space must separate the quantity from its unit: 3s^2 is an expression, 3 s^2 a quantity
const UNIT_TAIL = new RegExp(`^(.*?[\\d}.)])\\s+(?:(?:${UNIT_WORDS})\\b\\.?\\s*)+(\\^\\{?[23]\\}?)?$`, 'i');

function stripDelimiters(s: string): string {
  let t = s.trim();
  for (let changed = true; changed; ) {
    changed = false;
    const pairs: [string, string][] = [['$$', '$$'], ['$', '$'], ['\\(', '\\)'], ['\\[', '\\]']];
    for (const [open, close] of pairs) {
      if (t.length >= open.length + close.length && t.startsWith(open) && t.endsWith(close)) {
        t = t.slice(open.length, t.length - close.length).trim();
        changed = true;
      }
    }
  }
  return t;
}

/** Takes `rhs` from `x = rhs` (or the last side of `x = a = b`) when the left side is a bare name. */
export function dropVariablePrefix(s: string): string {
  const sides = splitTopLevelEquals(s);
  if (sides.length < 2) return s;
  // several named answers (AB=4, CD=5) are left whole: the list parser names them one by one
  const items = splitTopLevel(s, ',');
  if (items.length > 1 && items.slice(1).some((x) => splitTopLevelEquals(x).length > 1)) return s;
  if (sides.length >= 3) return sides[sides.length - 1].trim();
  if (isBareName(sides[0].trim())) return sides[sides.length - 1].trim();
  return s;
}

/** `p=5,q=2;p=7,q=2` (solutions as groups of named values) as the tuples `(5,2),(7,2)`. */
function namedGroupsAsTuples(s: string): string {
  const groups = splitTopLevel(s, ';');
  if (groups.length < 2) return s;
  const values = groups.map((g) =>
    splitTopLevel(g, ',').map((item) => {
      const sides = splitTopLevelEquals(item);
      return sides.length === 2 && isBareName(sides[0]) ? sides[1] : null;
    }),
  );
  if (values.some((v) => v.length < 2 || v.some((x) => x === null))) return s;
  return values.map((v) => `(${v.join(',')})`).join(',');
}

/**
 * True for the left side of an assignment whose right side is the answer: a name (`x`, `x_1`,
 * `\theta`, `AB`, `|AB|`, `A:B`), a call (`f(2)`), or a tuple of names (`(p, q)`); false for
 * anything with arithmetic (`2x + z`) or, names aside, digits.
 */
export function isBareName(lhs: string): boolean {
  if (lhs === '' || !/[a-zA-Z]/.test(lhs)) return false;
  if (/^[a-zA-Z]\([^()]*\)$/.test(lhs)) return true;
  const withoutSubscripts = lhs.replace(/_\{[^{}]*\}|_\w/g, '');
  return !/[\d+\-=<>^]|\\(?:le|ge|ne|lt|gt)\b|[≤≥≠]/.test(withoutSubscripts);
}

/** Splits on `=` signs that are not inside brackets and not part of `<=`, `>=`, `!=`, `==`. */
export function splitTopLevelEquals(s: string): string[] {
  const out: string[] = [];
  let depth = 0;
  let start = 0;
  for (let i = 0; i < s.length; i++) {
    const c = s[i];
    if (c === '{' || c === '(' || c === '[') depth++;
    else if (c === '}' || c === ')' || c === ']') depth--;
    else if (c === '=' && depth === 0 && !/[<>!=\\]/.test(s[i - 1] ?? '') && s[i + 1] !== '=') {
      out.push(s.slice(start, i));
      start = i + 1;
    }
  }
  out.push(s.slice(start));
  return out;
}

/**
 * Canonical form of one answer: delimiters, `\boxed`, `\left`/`\right`, spacing commands, text
 * wrappers, degree signs, `\dfrac`/`\tfrac`, thousands separators, trailing punctuation, a leading
 * `x =`, and (optionally) units are removed; percent signs become a trailing `%`. No whitespace is left.
 */
export function normalizeAnswer(answer: string, options: NormalizeOptions = { stripUnits: true }): string {
  let s = stripDelimiters(answer);
  const boxed = lastBoxed(s);
  if (boxed !== null) s = boxed;
  // doubly escaped commands (\\frac) from JSON written twice; not inside matrices, where \\ ends a row
  if (!s.includes('begin{')) s = s.replace(/\\\\(?=[a-zA-Z])/g, '\\');
  // stray math delimiters left inside an answer ("$28$ %", "1,000.99$")
  s = s.replace(/(?<!\\)\$/g, ' ');
  s = s.replace(/\n/g, ' ').replace(/\\\\$/, '');
  s = s.replace(/\\(?:d|t|c)frac/g, '\\frac').replace(/\\over\b/g, '/');
  s = s.replace(/\\(?:left|right|bigl|bigr|Bigl|Bigr|biggl|biggr|big|Big|bigg|Bigg)\s*(?=[()[\]|.]|\\[{}|]|\\[lr]?(?:vert|angle|brace)\b)/g, '');
  s = s.replace(/\\left\.|\\right\./g, '');
  s = s.replace(/\\(?:displaystyle|textstyle|scriptstyle|limits|nolimits)\b/g, '');
  // `\!` is a negative space: 32,\! 349 is one number
  s = s.replace(/\\!\s*/g, '').replace(/\{\s*,\s*\}/g, ',');
  s = s.replace(/(?<!\\)\\(?:[,;: ]|quad\b|qquad\b|enspace\b|thinspace\b|medspace\b)/g, ' ').replace(/~/g, ' ');
  s = s.replace(/\\(?:mathrm|text|mbox)\s*\{\s*(?:percent|pct)\s*\}/g, '%');
  // degrees
  s = s.replace(/\^\s*\{\s*\\circ\s*\}|\^\s*\\circ\b|\\circ\b|°|\\degree\b/g, '');
  // a unit written as text after a quantity, before the text wrappers are unwrapped
  if (options.stripUnits) {
    const beforeText = s;
    s = s.replace(/(\S)\s*\\(?:text|textnormal|textrm|mbox|mathrm)\s*\{\s*[a-zA-Z][a-zA-Z .]*\}\s*(\^\s*\{?\s*[23]\s*\}?)?\s*$/, '$1');
    if (s.trim() === '') s = beforeText;
    s = s.replace(/^\\\$\s*|^\$\s*|^[€£¥₹]\s*|\s*(?:\\\$|[€£¥₹])$/g, '');
  }
  for (const cmd of TEXT_COMMANDS) s = replaceCommandGroups(s, cmd, (c) => c);
  s = s.replace(/\\%|%|\s+(?:percent(?:age)?|pct)\b\.?/g, '%');
  // relation signs become single characters so that removing whitespace cannot glue them to a name
  s = s.replace(/\\(?:leqslant|leq|le)\b|<=|≤/g, '≤').replace(/\\(?:geqslant|geq|ge)\b|>=|≥/g, '≥');
  s = s.replace(/\\(?:neq|ne)\b|!=|≠/g, '≠').replace(/\\lt\b/g, '<').replace(/\\gt\b/g, '>');
  s = s.replace(/\\(?:varnothing|emptyset)\b|∅/g, '\\emptyset').replace(/\\infin\b|∞/g, '\\infty');
  // plain-text arithmetic as models write it: x**2, 3*s
  s = s.replace(/\*\*\s*(\([^()]*\)|[\w.]+)/g, (_, e: string) => `^{${e.startsWith('(') ? e.slice(1, -1) : e}}`).replace(/\*/g, '\\cdot ');
  s = s.replace(/\\(?:cdots|ldots|dots)\b/g, '\\dots').replace(/\\times\b|×/g, '\\times ').replace(/\\cdot\b|·/g, '\\cdot ');
  s = s.replace(/\\dfrac|\\tfrac/g, '\\frac').replace(/\\mathbb\{R\}|ℝ/g, '\\R');
  // approximations: keep the exact value before `\approx` (or after it, for `x \approx 11`)
  const approx = s.split(/\\approx|≈/);
  s = approx.length > 1 && isBareName(approx[0].trim()) ? approx[1] : approx[0];
  // connectives between listed answers
  s = s.replace(/\\text\{\s*(?:and|or)\s*\}|\s+(?:and|or)\s+|,\s*(?:and|or)\s+/g, ', ').replace(/\)\s*(?:and|or)\s*\(/g, '), (');
  s = s.replace(/(?<=[\d)}])(?:and|or)(?=[A-Za-z(\\-])/g, ', '); // glued: W(x)=1orW(x)=-1
  s = s.replace(/\\?"/g, ' '); // quotes around an answer
  s = s.trim().replace(/^(?:\\in|∈)\s*/, '');
  s = s.replace(/^([a-zA-Z](?:_\{?\w+\}?)?)\s*(?:\\in|∈)\s*/, '');
  if (!options.keepRelation) s = dropVariablePrefix(s);
  // thousands separators, while a space after a comma still tells a list (32, 349) from a number (32,349)
  if (/^[-+]?[1-9]\d{0,2}(?:\s*,\d{3})+(?:\.\d+)?%?$/.test(s.trim())) s = s.replace(/\s*,/g, '');
  // a decimal comma: 1000,99 and 0,111 (1,2 stays a list; 1,234 is read as thousands)
  else if (/^[-+]?(?:\d+,\d{2}|0,\d+)%?$/.test(s.trim())) s = s.replace(',', '.');
  if (options.stripUnits) {
    const m = UNIT_TAIL.exec(s.trim());
    if (m && /\d/.test(m[1])) s = m[1];
  }
  // whitespace goes, except one space that ends a command name before a letter or digit (\sin x)
  s = s.trim().replace(/(\\[a-zA-Z]+)\s+(?=[a-zA-Z0-9])/g, '$1\uE000').replace(/\s+/g, '').replace(/\uE000/g, ' ');
  s = s.replace(/(?:\\\.|[.,;:!?])+$/, '');
  s = namedGroupsAsTuples(s);
  s = s.replace(/\{,\}/g, ',').replace(/;/g, ',').replace(/,+/g, ',').replace(/^,|,$/g, '');
  // LaTeX shorthand: \frac12, \frac1{3}, \sqrt2
  s = s.replace(/\\frac ?(\d)(\d)/g, '\\frac{$1}{$2}').replace(/\\frac ?(\d)\{/g, '\\frac{$1}{').replace(/\\frac\{([^{}]*)\}(\d)/g, '\\frac{$1}{$2}');
  s = s.replace(/\\sqrt ?(\d+|[a-zA-Z])/g, '\\sqrt{$1}');
  s = s.replace(/^\+/, '').replace(/(^|[^\d])\.(\d)/g, '$10.$2');
  // a choice letter in parentheses: (B) → B
  s = s.replace(/^\(([A-Ea-e])\)$/, '$1');
  // redundant outer braces
  while (/^\{[^{}]*\}$/.test(s)) s = s.slice(1, -1);
  return s;
}
