/**
 * Format rewards: the r1_zero layout, `<think>` well-formedness, and an overlong-response penalty.
 * Each is a plain function of the response text (or length) returning a number.
 */

/** Options of the think/answer format checks. */
export interface ThinkFormatOptions {
  /** The prompt already ends with `<think>` (the r1_zero template), so the response starts inside it. */
  promptEndsWithThink: boolean;
}

const THINK_DEFAULTS: ThinkFormatOptions = { promptEndsWithThink: true };

function count(text: string, tag: string): number {
  return text.split(tag).length - 1;
}

/**
 * 1 when the reasoning block is well formed, else 0: exactly one `</think>` (and one `<think>`
 * before it unless the prompt opened it), non-empty reasoning, and no tag inside the reasoning.
 */
export function thinkFormatReward(response: string, options: Partial<ThinkFormatOptions> = {}): number {
  const { promptEndsWithThink } = { ...THINK_DEFAULTS, ...options };
  const text = promptEndsWithThink && !response.trimStart().startsWith('<think>') ? `<think>${response}` : response.trimStart();
  if (count(text, '<think>') !== 1 || count(text, '</think>') !== 1) return 0;
  if (!text.startsWith('<think>')) return 0;
  const reasoning = text.slice('<think>'.length, text.indexOf('</think>'));
  return reasoning.trim() === '' ? 0 : 1;
}

/**
 * 1 when the response follows the r1_zero layout `…reasoning…</think> <answer>…</answer>` and
 * nothing follows `</answer>` but whitespace (and an end-of-turn token), else 0.
 */
export function r1ZeroFormatReward(response: string, options: Partial<ThinkFormatOptions> = {}): number {
  if (thinkFormatReward(response, options) === 0) return 0;
  const afterThink = response.slice(response.indexOf('</think>') + '</think>'.length);
  const m = /^\s*<answer>([\s\S]*?)<\/answer>\s*(?:<\|im_end\|>|<\|endoftext\|>)?\s*$/.exec(afterThink);
  if (!m || m[1].trim() === '' || m[1].includes('<answer>')) return 0;
  return 1;
}

/** Options of {@link overlongPenalty}. */
export interface OverlongOptions {
  /** The generation limit in tokens. */
  maxLength: number;
  /** The band below the limit over which the penalty grows linearly from 0 to `-maxPenalty`. */
  buffer: number;
  /** The penalty at and beyond the limit (a positive number; the reward returned is its negative). */
  maxPenalty: number;
}

/**
 * A soft length penalty (DAPO's overlong shaping): 0 up to `maxLength − buffer`, then falling
 * linearly to `−maxPenalty` at `maxLength`, and `−maxPenalty` beyond it.
 */
export function overlongPenalty(length: number, options: OverlongOptions): number {
  const { maxLength, buffer, maxPenalty } = options;
  if (!(maxLength > 0) || !(buffer >= 0) || buffer > maxLength) throw new Error(`overlongPenalty: need 0 ≤ buffer ≤ maxLength and maxLength > 0, got buffer ${buffer}, maxLength ${maxLength}`);
  const start = maxLength - buffer;
  if (length <= start) return 0;
  if (length >= maxLength) return -maxPenalty;
  return (-maxPenalty * (length - start)) / buffer;
}
