/**
 * Multiple-choice answers: when the gold is a choice letter (A–E), the prediction's letter is read
 * from an answer that starts with one and goes on (`(C) 12`, `B) because …`, `C. 12`), or else from
 * the last letter in parentheses in the response (`… so the answer is (C), since …`).
 */

/** A letter A–E ending where a word would end (`A since`, `(B) 7`, `C.`), at the start of `text`. */
const LEADING = /^\(?\s*([A-E])\s*\)?(?![A-Za-z0-9])/;
/** A letter in parentheses anywhere: `(C)`. */
const PARENTHESISED = /\(([A-E])\)/g;

/** `\text{(B) } 7` → `(B)  7`: wrappers and math delimiters that may surround a letter. */
function unwrap(text: string): string {
  return text.replace(/\\(?:text|textbf|mathrm|mathbf|textrm)\s*\{([^{}]*)\}/g, '$1').replace(/\$/g, ' ').trim();
}

/** The gold's choice letter (`C`, `(C)`, `\text{(C)}` normalised), or null when the gold is not one. */
export function goldChoice(normalisedGold: string): string | null {
  return /^[A-E]$/.test(normalisedGold) ? normalisedGold : null;
}

/** The choice letter a prediction gives: at the start of its extracted answer, else the last `(X)` of the response. */
export function predictedChoice(extracted: string | null, response: string): string | null {
  const lead = extracted === null ? null : LEADING.exec(unwrap(extracted));
  if (lead) return lead[1];
  let last: string | null = null;
  for (const m of unwrap(response).matchAll(PARENTHESISED)) last = m[1];
  return last;
}
