/** Bracket-aware scanning and splitting of normalised answers. */

const OPENERS = new Set(['{', '(', '[']);
const CLOSERS = new Set(['}', ')', ']']);

/**
 * The bracket at `s[i]`: how it changes the depth (+1, −1, or 0 for any other character) and how
 * many characters it spans (2 for `\{` and `\}`, which count as brackets too).
 */
function bracketAt(s: string, i: number): { delta: number; width: number } {
  const c = s[i];
  if (c === '\\' && (s[i + 1] === '{' || s[i + 1] === '}')) return { delta: s[i + 1] === '{' ? 1 : -1, width: 2 };
  return { delta: OPENERS.has(c) ? 1 : CLOSERS.has(c) ? -1 : 0, width: 1 };
}

/** Splits `s` on `sep` where it is outside every bracket (`\{`/`\}` count as brackets too). */
export function splitTopLevel(s: string, sep: string): string[] {
  const out: string[] = [];
  let depth = 0;
  let start = 0;
  for (let i = 0; i < s.length; i++) {
    const { delta, width } = bracketAt(s, i);
    if (delta !== 0) {
      depth += delta;
      i += width - 1;
    } else if (depth === 0 && s.startsWith(sep, i)) {
      // a command separator (\cup) must not be the prefix of a longer command
      if (sep.startsWith('\\') && /[a-zA-Z]/.test(s[i + sep.length] ?? '')) continue;
      out.push(s.slice(start, i));
      start = i + sep.length;
      i += sep.length - 1;
    }
  }
  out.push(s.slice(start));
  return out;
}

/** True when the bracket opened at index 0 closes at the last character. */
export function wrapsWhole(s: string): boolean {
  let depth = 0;
  for (let i = 0; i < s.length; i++) {
    const { delta, width } = bracketAt(s, i);
    depth += delta;
    i += width - 1;
    if (depth === 0 && i < s.length - 1) return false;
  }
  return depth === 0;
}
