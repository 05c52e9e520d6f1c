/** Bracket-aware splitting of normalised answers. */

const OPENERS = new Set(['{', '(', '[']);
const CLOSERS = new Set(['}', ')', ']']);

/** Splits `s` on `sep` where it is outside every bracket (`\{`/`\}` count as brackets too). */
export function splitTopLevel(s: string, sep: string): string[] {
  const out: string[] = [];
  let depth = 0;
  let start = 0;
  for (let i = 0; i < s.length; i++) {
    const c = s[i];
    if (c === '\\' && (s[i + 1] === '{' || s[i + 1] === '}')) {
      depth += s[i + 1] === '{' ? 1 : -1;
      i++;
      continue;
    }
    if (OPENERS.has(c)) depth++;
    else if (CLOSERS.has(c)) depth--;
    else if (depth === 0 && s.startsWith(sep, i)) {
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

