/**
 * The real value of a normalised answer that is constant, or whose one-letter variables are given
 * values (`\frac{3\sqrt{3}}{4}`, `-\frac{\pi}{6}`, `2^{10}`),
 * computed on the caller's thread. Only a small, unambiguous grammar is read: numbers, `+ - \cdot
 * \times /`, `^{…}` or `^d`, `\frac{}{}`, `\sqrt{}` and `\sqrt[n]{}`, `\pi`, brackets, and a
 * multiplication written by juxtaposition, and one-letter variables when given. Anything else (a letter, `i`, `e`, a function, a number
 * followed by `\frac` as in the mixed number `3\frac{1}{2}`) gives null and is left to the CAS.
 */

/** Tokens: numbers, one-character operators and brackets, and `\commands`. */
function tokenize(s: string): string[] | null {
  const tokens: string[] = [];
  for (let i = 0; i < s.length; ) {
    const c = s[i];
    if (c === ' ') {
      i++;
      continue;
    }
    const num = /^(?:\d+\.?\d*|\.\d+)/.exec(s.slice(i, i + 40));
    if (num) {
      tokens.push(num[0]);
      i += num[0].length;
    } else if (c === '\\') {
      const cmd = /^\\[a-zA-Z]+/.exec(s.slice(i, i + 20));
      if (!cmd) return null;
      tokens.push(cmd[0]);
      i += cmd[0].length;
    } else if (/[a-zA-Z]/.test(c)) {
      tokens.push(c);
      i++;
    } else if ('+-/^{}()[]'.includes(c)) {
      tokens.push(c);
      i++;
    } else return null;
  }
  return tokens;
}

/** Recursive-descent evaluation; throws on anything outside the grammar. */
class Evaluator {
  private at = 0;
  constructor(
    private readonly tokens: string[],
    private readonly values: Readonly<Record<string, number>>,
  ) {}

  private peek(): string | undefined {
    return this.tokens[this.at];
  }

  private take(expected?: string): string {
    const t = this.tokens[this.at++];
    if (t === undefined || (expected !== undefined && t !== expected)) throw new Error('outside the grammar');
    return t;
  }

  run(): number {
    const v = this.sum();
    if (this.at !== this.tokens.length) throw new Error('trailing tokens');
    return v;
  }

  private sum(): number {
    let v = this.product();
    for (let t = this.peek(); t === '+' || t === '-'; t = this.peek()) {
      this.take();
      v = t === '+' ? v + this.product() : v - this.product();
    }
    return v;
  }

  private product(): number {
    let v = this.unary();
    let divided = false;
    for (;;) {
      const t = this.peek();
      if (t === '\\cdot' || t === '\\times' || t === '/') {
        this.take();
        divided ||= t === '/';
        v = t === '/' ? v / this.unary() : v * this.unary();
      } else if (t !== undefined && (t === '(' || t === '{' || t.startsWith('\\') || /^[a-zA-Z]$/.test(t))) {
        // juxtaposition: 3\sqrt{3}, 2\pi, 2(1+\sqrt{2}); but 3\frac{1}{2} may be a mixed number,
        // and 1/2\pi may mean 1/(2π): neither is read
        if (divided) throw new Error('juxtaposition after a division');
        if (t === '\\frac' && /^\d/.test(this.tokens[this.at - 1] ?? '')) throw new Error('mixed number');
        v *= this.power();
      } else return v;
    }
  }

  private unary(): number {
    const t = this.peek();
    if (t === '-' || t === '+') {
      this.take();
      return t === '-' ? -this.unary() : this.unary();
    }
    return this.power();
  }

  private power(): number {
    const base = this.atom();
    if (this.peek() !== '^') return base;
    this.take('^');
    const next = this.peek();
    // a braced exponent, or one digit (2^10 is 2^1 followed by 0 in LaTeX: not read)
    let exponent: number;
    if (next === '{') exponent = this.group();
    else if (next !== undefined && /^\d$/.test(next)) exponent = Number(this.take());
    else throw new Error('exponent');
    return base ** exponent;
  }

  private group(): number {
    this.take('{');
    const v = this.sum();
    this.take('}');
    return v;
  }

  private atom(): number {
    const t = this.take();
    if (/^(?:\d|\.\d)/.test(t)) return Number(t);
    if (t === '(') {
      const v = this.sum();
      this.take(')');
      return v;
    }
    if (t === '{') {
      this.at--;
      return this.group();
    }
    if (t === '\\pi') return Math.PI;
    // a variable with a given value; e and i are never variables here (they are left to the CAS)
    if (/^[a-zA-Z]$/.test(t) && t !== 'e' && t !== 'i' && Object.hasOwn(this.values, t)) return this.values[t];
    if (t === '\\frac') return this.group() / this.group();
    if (t === '\\sqrt') {
      let index = 2;
      if (this.peek() === '[') {
        this.take('[');
        index = this.sum();
        this.take(']');
      }
      const radicand = this.group();
      if (radicand < 0) throw new Error('not real');
      return radicand ** (1 / index);
    }
    throw new Error('outside the grammar');
  }
}

/** The value of `normalised` under the grammar above with `values` for its variables, or null when it has none (or no finite real one). */
export function evaluateAt(normalised: string, values: Readonly<Record<string, number>>): number | null {
  if (normalised.length > 200) return null;
  const tokens = tokenize(normalised);
  if (!tokens || tokens.length === 0) return null;
  try {
    const v = new Evaluator(tokens, values).run();
    return Number.isFinite(v) ? v : null;
  } catch {
    return null;
  }
}

/** The value of a constant answer under the grammar above, or null when it is not one (or not a finite real). */
export function evaluateConstant(normalised: string): number | null {
  return evaluateAt(normalised, {});
}

/**
 * True when the answer provably depends on its variables: it takes two different values at two
 * assignments (x^2 + x + 1 at two points). False when it cannot be read, or seems constant.
 */
export function takesTwoValues(normalised: string): boolean {
  const names = [...new Set(normalised.replace(/\\[a-zA-Z]+/g, '').match(/[a-zA-Z]/g) ?? [])];
  if (names.length === 0) return false;
  const at = (base: number) => Object.fromEntries(names.map((n, k) => [n, base + 0.1173 * k]));
  const a = evaluateAt(normalised, at(0.5381));
  const b = evaluateAt(normalised, at(1.2917));
  return a !== null && b !== null && Math.abs(a - b) > 1e-6 * Math.max(1, Math.abs(a), Math.abs(b));
}
