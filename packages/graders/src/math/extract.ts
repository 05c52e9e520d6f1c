/**
 * Final-answer extraction from model output: the last `\boxed{}`/`\fbox{}` (several adjacent boxes
 * form one list answer), the r1_zero `<answer>…</answer>` block, GSM8K's `#### n`, "the answer is
 * …", and otherwise a math span or number that ends the text. Only a final answer is returned:
 * a value followed by more reasoning is an intermediate value and never is.
 */

/** Where a final answer is looked for; `raw` takes the whole text as the answer. */
export type AnswerFormat = 'auto' | 'boxed' | 'r1_zero' | 'gsm8k' | 'raw';

/** Every accepted `--format` value, for CLI choices and validation. */
export const ANSWER_FORMATS: readonly AnswerFormat[] = ['auto', 'boxed', 'r1_zero', 'gsm8k', 'raw'];

/** Words allowed after a final value (units, "is the answer", "I hope it is correct" and the like). */
const MAX_TAIL_WORDS = 15;

/** A found answer and where it ends in the text (later answers win in `auto`). */
interface Found {
  answer: string;
  end: number;
}

/** For every `{` its matching `}` (or -1 when unclosed), in one pass, so many boxes cost linear time. */
function matchingBraces(text: string): Int32Array {
  const match = new Int32Array(text.length).fill(-1);
  const stack: number[] = [];
  for (let i = 0; i < text.length; i++) {
    const c = text[i];
    if (c === '\\') i++;
    else if (c === '{') stack.push(i);
    else if (c === '}' && stack.length > 0) match[stack.pop() as number] = i;
  }
  return match;
}

/** Every `\boxed{…}`/`\fbox{…}` (and `\boxed 5`) in order, with positions. */
function allBoxed(text: string): { content: string; start: number; end: number }[] {
  const re = /\\(?:boxed|fbox)\b\s*/g;
  const out: { content: string; start: number; end: number }[] = [];
  let match: Int32Array | null = null;
  for (let m = re.exec(text); m; m = re.exec(text)) {
    const at = m.index + m[0].length;
    if (text[at] === '{') {
      match ??= matchingBraces(text);
      const close = match[at];
      if (close >= 0) out.push({ content: text.slice(at + 1, close), start: m.index, end: close + 1 });
    } else {
      const t = /^[^\s$]+/.exec(text.slice(at));
      if (t) out.push({ content: t[0].replace(/[.,;]+$/, ''), start: m.index, end: at + t[0].length });
    }
  }
  return out;
}

/** Text between two boxes that only separates them (`, `, ` and `, `\quad`, math delimiters). */
function isConnector(between: string): boolean {
  const t = between
    .replace(/\\text\{([^{}]*)\}/g, ' $1 ')
    .replace(/\\(?:quad|qquad|[,;:!]|\(|\)|\[|\])|\$/g, ' ')
    .replace(/[a-zA-Z](?:_\{?\w+\}?)?\s*=/g, ' '); // the next answer's name: "and y_2 = \boxed{…}"
  if (/[\d=]/.test(t)) return false;
  // connector words, plus at most two others (units or labels: "\boxed{1} papers and \boxed{2} bins")
  return (t.match(/[A-Za-z]+/g) ?? []).filter((w) => !CONNECTOR_WORDS.has(w.toLowerCase())).length <= 2;
}

/** Words that may stand between the boxes of one list answer. */
const CONNECTOR_WORDS = new Set(['and', 'or', 'for', 'part', 'parts', 'a', 'b', 'c', 'd', 'i', 'ii', 'iii', 'respectively', 'the', 'answers', 'are', 'is']);

function boxedFound(text: string): Found | null {
  const boxes = allBoxed(text);
  if (boxes.length === 0) return null;
  let first = boxes.length - 1;
  while (first > 0 && isConnector(text.slice(boxes[first - 1].end, boxes[first].start))) first--;
  const answer = boxes.slice(first).map((b) => b.content).join(', ');
  return { answer, end: boxes[boxes.length - 1].end };
}

/** Content of the last `\boxed{…}` or `\fbox{…}` (nested braces allowed; `\boxed 5` too), or null. */
export function lastBoxed(text: string): string | null {
  return allBoxed(text).at(-1)?.content ?? null;
}

function r1ZeroFound(text: string): Found | null {
  const last = [...text.matchAll(/<answer>([\s\S]*?)<\/answer>/g)].at(-1);
  if (!last || last.index === undefined) return null;
  const inner = last[1].trim();
  return { answer: boxedFound(inner)?.answer ?? inner, end: last.index + last[0].length };
}

/** Content of the last `<answer>…</answer>` block (the r1_zero format, a box inside preferred), or null. */
export function r1ZeroAnswer(text: string): string | null {
  return r1ZeroFound(text)?.answer ?? null;
}

function gsm8kFound(text: string): Found | null {
  const last = [...text.matchAll(/####\s*([^\n]*)/g)].at(-1);
  if (!last || last.index === undefined) return null;
  const answer = last[1].trim();
  return answer === '' ? null : { answer, end: last.index + last[0].length };
}

/** The answer after GSM8K's last `#### ` marker (to the end of that line), or null. */
export function gsm8kAnswer(text: string): string | null {
  return gsm8kFound(text)?.answer ?? null;
}

function answerIsFound(text: string): Found | null {
  // "the (final) answer is/:" anywhere; "Answer:" or "Answer is" at the start of any line
  const last = [...text.matchAll(/(?:final\s+answer|the\s+answer)\s*(?:is|:)\s*:?\s*|^[ \t]*answer\b\s*(?:is\b|:)?\s*:?\s*/gim)].at(-1);
  if (!last || last.index === undefined) return null;
  const start = last.index + last[0].length;
  const line = text.slice(start).split('\n')[0];
  // a math span ($…$, \(…\), \[…\]) is taken whole even if it contains periods
  const rest = text.slice(start);
  // several math spans in the answer's sentence ($12$ and $13$) are read together, not just the first
  const sentenceSpans = (rest.split('\n')[0].split(/\.(?:\s|$)/)[0].match(/\$/g) ?? []).length;
  const span = sentenceSpans > 2 ? null : /^\$\$([\s\S]+?)\$\$|^\$((?:\\\$|[^$\n])+?)\$|^\\\(([^\n]+?)\\\)|^\\\[([\s\S]+?)\\\]/.exec(rest);
  if (span) return { answer: (span[1] ?? span[2] ?? span[3] ?? span[4]).trim(), end: start + span[0].length };
  const boxed = boxedFound(line);
  if (boxed) return { answer: boxed.answer, end: start + boxed.end };
  const sentence = line.split(/\.(?:\s|$)/)[0].trim();
  return sentence === '' ? null : { answer: sentence, end: start + sentence.length };
}

/** The answer after the last "the (final) answer is" (to the end of its sentence or line), or null. */
export function answerIsAnswer(text: string): string | null {
  return answerIsFound(text)?.answer ?? null;
}

/** Display math ($$…$$, \[…\]) may span lines; inline math ($…$, \(…\)) may not, and may hold `\$`. */
const MATH_SPAN = /\$\$([\s\S]+?)\$\$|\$((?:\\\$|[^$\n])+?)\$|\\\(([^\n]+?)\\\)|\\\[([\s\S]+?)\\\]/g;

function tailWords(tail: string): number {
  return (tail.match(/[A-Za-z]+/g) ?? []).length;
}

/**
 * The last math span (`$…$`, `$$…$$`, `\(…\)`, `\[…\]`) when at most a short tail of words follows
 * it ("is the solution.", units): such a span is the text's conclusion, not a step.
 */
export function trailingMathSpan(text: string): string | null {
  let last: RegExpExecArray | null = null;
  for (const m of text.matchAll(MATH_SPAN)) last = m;
  if (!last || last.index === undefined) return null;
  const after = text.slice(last.index + last[0].length);
  if (tailWords(after) > MAX_TAIL_WORDS || /\d/.test(after)) return null;
  const inner = (last[1] ?? last[2] ?? last[3] ?? last[4]).trim();
  return inner + (/^\s*(?:%|percent|pct)/.test(after) ? '%' : '');
}

/** A number not glued to a preceding word (AZYUK2A holds none); thousands, decimal commas, fractions, percents. */
const NUMBER = /(?<![A-Za-z0-9.,])(?:[-+]?(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+,\d{2}(?![\d,])|\d+)(?:\.\d+)?(?:\/\d+)?%?|[-+]?\.\d+%?)/g;

/** The last plain number of a text (with a following `%` or "percent") when only a short tail follows it. */
export function trailingNumber(text: string): string | null {
  let last: RegExpExecArray | null = null;
  for (const m of text.matchAll(NUMBER)) last = m;
  if (!last || last.index === undefined) return null;
  const after = text.slice(last.index + last[0].length);
  if (tailWords(after) > MAX_TAIL_WORDS) return null;
  return last[0] + (/^\s*(?:percent|pct)\b/i.test(after) && !last[0].endsWith('%') ? '%' : '');
}

/** Words that do not make a text prose: connectors of listed answers and common units. */
const NON_PROSE = /^(?:and|or|cm|mm|km|m|ft|in|kg|units?|degrees?|dollars?|cents?|miles?|meters?|inches|feet|hours?|minutes?|seconds?|days?|percent|pct)$/i;

/** Words outside math spans, `\text{…}` blocks and LaTeX commands that make the text read as prose. */
function proseWords(text: string): string[] {
  const outside = text.replace(MATH_SPAN, ' ').replace(/\\(?:text|textbf|mbox|mathrm|textnormal)\{[^}]*\}|\\(?:begin|end)\{[^}]*\}|\\[a-zA-Z]+/g, ' ');
  return (outside.match(/[A-Za-z]{2,}/g) ?? []).filter((w) => !NON_PROSE.test(w) && (w.length > 2 || ENGLISH_TWO_LETTER.has(w.toLowerCase())));
}

/**
 * Two-letter words that read as English; any other pair of letters is a product of variables or
 * constants (`Ae^{t}`, `Ce^{-2t}`, `xy`) and does not make a text prose.
 */
const ENGLISH_TWO_LETTER = new Set(['am', 'an', 'as', 'at', 'be', 'by', 'do', 'go', 'he', 'if', 'is', 'it', 'me', 'my', 'no', 'of', 'on', 'or', 'so', 'to', 'up', 'us', 'we']);

/** Chat-template special tokens some model outputs carry. */
const CHAT_TOKEN = /<\|(?:im_start|im_end|endoftext|eot_id|start_header_id|end_header_id)\|>/;

/**
 * The part of a response that may hold its final answer: special tokens that open it
 * (`<|im_start|>assistant`) are dropped, residue after the turn (`<|im_end|>`, `<|im_start|>user …`)
 * is cut, and when the response closes a reasoning block, only what follows the last `</think>`
 * counts: an answer written while thinking is not the final answer.
 */
export function finalPart(text: string): string {
  let t = text.replace(/^\s*(?:<\|(?:im_start|start_header_id)\|>(?:assistant\b)?(?:<\|end_header_id\|>)?\s*)+/, '');
  const cut = t.search(CHAT_TOKEN);
  if (cut >= 0) t = t.slice(0, cut);
  const think = t.lastIndexOf('</think>');
  return think >= 0 ? t.slice(think + '</think>'.length) : t;
}

/**
 * The answer within a marked or whole text: the text itself when it reads as an answer, else the
 * value that concludes it (a trailing math span or number), else null.
 */
function conclusion(text: string): string | null {
  const t = text.trim();
  if (t === '') return null;
  const words = proseWords(t);
  if (words.length === 0) return t;
  // a short word answer ("Evelyn", "(B)") or one unspaced token (W(x)=1orW(x)=-1) is the answer itself
  if (words.length <= 2 && (!/\d/.test(t) || !/\s/.test(t)) && !t.includes('$')) return t;
  return trailingMathSpan(t) ?? trailingNumber(t);
}

/**
 * The final answer in `text` under `format`, or null when it has none. Outside `raw`, only the
 * response's final part is read (after the last `</think>`, before chat-template residue).
 * `auto` takes the latest of `\boxed`, `<answer>`, `####` and "the answer is"; without any, the
 * text when it reads as an answer, or the math span or number that concludes it.
 */
export function extractAnswer(text: string, format: AnswerFormat = 'auto'): string | null {
  switch (format) {
    case 'raw':
      return text.trim() === '' ? null : text.trim();
    case 'boxed':
      return boxedFound(finalPart(text))?.answer ?? null;
    case 'r1_zero':
      return r1ZeroAnswer(finalPart(text));
    case 'gsm8k':
      return gsm8kAnswer(finalPart(text));
    case 'auto': {
      const t = finalPart(text);
      const found = [boxedFound(t), r1ZeroFound(t), gsm8kFound(t), answerIsFound(t)].filter((f): f is Found => f !== null);
      if (found.length > 0) {
        const latest = found.reduce((a, b) => (b.end > a.end ? b : a));
        return conclusion(latest.answer) ?? latest.answer;
      }
      return conclusion(t);
    }
  }
}
