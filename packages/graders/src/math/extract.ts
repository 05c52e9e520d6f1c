/**
 * Final-answer extraction from model output: the last `\boxed{}`/`\fbox{}`, the r1_zero
 * `<answer>…</answer>` block, GSM8K's `#### n`, "the answer is …", and a trailing math span.
 * Only a marked final answer is returned: intermediate values in the text never are.
 */

/** Where a final answer is looked for; `raw` takes the whole text as the answer. */
export type AnswerFormat = 'auto' | 'boxed' | 'r1_zero' | 'gsm8k' | 'raw';

/** Every accepted `--format` value, for CLI choices and validation. */
export const ANSWER_FORMATS: readonly AnswerFormat[] = ['auto', 'boxed', 'r1_zero', 'gsm8k', 'raw'];

/** Reads a brace group starting at `open` (which must be `{`); returns its content and the index after `}`. */
function braceGroup(text: string, open: number): { content: string; end: number } | null {
  let depth = 0;
  for (let i = open; i < text.length; i++) {
    const c = text[i];
    if (c === '\\') {
      i++; // an escaped brace (\{ or \}) does not open or close a group
      continue;
    }
    if (c === '{') depth++;
    else if (c === '}') {
      depth--;
      if (depth === 0) return { content: text.slice(open + 1, i), end: i + 1 };
    }
  }
  return null;
}

/** Content of the last `\boxed{…}` or `\fbox{…}` (nested braces allowed; `\boxed 5` too), or null. */
export function lastBoxed(text: string): string | null {
  const re = /\\(?:boxed|fbox)\b\s*/g;
  let found: string | null = null;
  for (let m = re.exec(text); m; m = re.exec(text)) {
    const at = m.index + m[0].length;
    if (text[at] === '{') {
      const g = braceGroup(text, at);
      if (g) found = g.content;
    } else {
      // `\boxed 5` or `\boxed -3.` : one token up to whitespace, `$` or end
      const t = /^[^\s$]+/.exec(text.slice(at));
      if (t) found = t[0].replace(/[.,;]+$/, '');
    }
  }
  return found;
}

/** Content of the last `<answer>…</answer>` block (the r1_zero format), or null. */
export function r1ZeroAnswer(text: string): string | null {
  const all = [...text.matchAll(/<answer>([\s\S]*?)<\/answer>/g)];
  const last = all.at(-1);
  if (!last) return null;
  const inner = last[1].trim();
  return lastBoxed(inner) ?? inner;
}

/** The answer after GSM8K's last `#### ` marker (to the end of that line), or null. */
export function gsm8kAnswer(text: string): string | null {
  const all = [...text.matchAll(/####\s*([^\n]*)/g)];
  const last = all.at(-1);
  if (!last) return null;
  const answer = last[1].trim();
  return answer === '' ? null : answer;
}

/** The answer after the last "the (final) answer is" (to the end of its sentence or line), or null. */
export function answerIsAnswer(text: string): string | null {
  const all = [...text.matchAll(/(?:final\s+answer|the\s+answer)\s*(?:is|:)\s*:?\s*/gi)];
  const last = all.at(-1);
  if (!last || last.index === undefined) return null;
  let rest = text.slice(last.index + last[0].length);
  rest = rest.split('\n')[0];
  // a math span ($…$, \(…\), \[…\]) is taken whole even if it contains periods
  const span = /^(\$\$?)([\s\S]+?)\1|^\\\(([\s\S]+?)\\\)|^\\\[([\s\S]+?)\\\]/.exec(rest);
  if (span) return (span[2] ?? span[3] ?? span[4]).trim();
  const boxed = lastBoxed(rest);
  if (boxed !== null) return boxed;
  const sentence = rest.split(/\.(?:\s|$)/)[0].trim();
  return sentence === '' ? null : sentence;
}

/**
 * The trailing math span of a text (`$…$`, `$$…$$`, `\(…\)`, `\[…\]`) when it is the last thing
 * in the text but for punctuation and units: such a span is the text's conclusion, not a step.
 */
export function trailingMathSpan(text: string): string | null {
  const re = /\$\$([\s\S]+?)\$\$|\$([^$]+?)\$|\\\(([\s\S]+?)\\\)|\\\[([\s\S]+?)\\\]/g;
  let last: RegExpExecArray | null = null;
  for (let m = re.exec(text); m; m = re.exec(text)) last = m;
  if (!last) return null;
  const after = text.slice(last.index + last[0].length);
  if (!/^[\s.,;:!]*(?:[a-zA-Z%]+[\s.,;:!]*)?$/.test(after)) return null;
  const inner = (last[1] ?? last[2] ?? last[3] ?? last[4]).trim();
  return inner + (/%|percent/.test(after) ? '%' : '');
}

/** True when a text reads as prose (several words) rather than as a bare answer. */
function looksLikeProse(text: string): boolean {
  const outsideMath = text.replace(/\$[^$]*\$|\\\([\s\S]*?\\\)|\\\[[\s\S]*?\\\]|\\text\{[^}]*\}|\\(?:begin|end)\{[^}]*\}|\\[a-zA-Z]+/g, ' ');
  return (outsideMath.match(/[A-Za-z]{2,}/g) ?? []).length >= 4;
}

/**
 * The final answer in `text` under `format`, or null when it has none.
 * `auto` tries, in order, `\boxed`, `<answer>`, `####`, "the answer is", a trailing math span, and
 * finally the text itself when it does not read as prose.
 */
export function extractAnswer(text: string, format: AnswerFormat = 'auto'): string | null {
  switch (format) {
    case 'raw':
      return text.trim() === '' ? null : text.trim();
    case 'boxed':
      return lastBoxed(text);
    case 'r1_zero':
      return r1ZeroAnswer(text);
    case 'gsm8k':
      return gsm8kAnswer(text);
    case 'auto': {
      const marked = lastBoxed(text) ?? r1ZeroAnswer(text) ?? gsm8kAnswer(text) ?? answerIsAnswer(text);
      if (marked !== null) return marked;
      const trimmed = text.trim();
      if (trimmed === '') return null;
      if (!looksLikeProse(trimmed)) return trimmed;
      return trailingMathSpan(trimmed);
    }
  }
}
