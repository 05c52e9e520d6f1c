/** Sequence assembly for training and generation: ids are concatenated, never re-tokenized. */
import type { Tokenizer } from './types';

/** A prompt and response as one sequence, with the loss on the response (and its EOS) only. */
export interface PromptResponseIds {
  ids: number[];
  /** 1 on response tokens, 0 on the prompt. */
  responseMask: number[];
  promptLength: number;
}

/**
 * Encodes prompt and response separately and concatenates the ids (so the response's ids are
 * exactly those a generation produced or a dataset holds, whatever the tokenizer would merge across
 * the boundary), appending EOS to the response unless `appendEos` is false.
 */
export function encodePromptResponse(tok: Tokenizer, prompt: string | number[], response: string | number[], opts: { appendEos?: boolean; prependBos?: boolean } = {}): PromptResponseIds {
  const p = typeof prompt === 'string' ? tok.encode(prompt) : [...prompt];
  const r = typeof response === 'string' ? tok.encode(response) : [...response];
  if (opts.prependBos && tok.bosId !== undefined) p.unshift(tok.bosId);
  if (opts.appendEos ?? true) r.push(tok.eosId);
  return { ids: [...p, ...r], responseMask: [...p.map(() => 0), ...r.map(() => 1)], promptLength: p.length };
}

/** A padded batch: ids, attention mask (1 = token) and optional extra per-token rows, all [B][T]. */
export interface PaddedBatch {
  inputIds: number[][];
  attentionMask: number[][];
  /** Extra per-token rows padded with 0 (e.g. response masks), in the order given. */
  extras: number[][][];
}

/** Pads sequences to the longest: on the left for generation, on the right for training. */
export function padSequences(seqs: readonly number[][], padId: number, side: 'left' | 'right', extras: readonly (readonly number[][])[] = []): PaddedBatch {
  if (seqs.length === 0) throw new Error('padSequences: no sequences');
  extras.forEach((rows, k) => {
    rows.forEach((row, i) => {
      if (row.length !== seqs[i].length) throw new Error(`padSequences: extra ${k}, row ${i} has ${row.length} values for ${seqs[i].length} tokens`);
    });
  });
  const T = Math.max(...seqs.map((s) => s.length));
  const pad = <V>(row: readonly V[], fill: V) => {
    const filler = new Array<V>(T - row.length).fill(fill);
    return side === 'left' ? [...filler, ...row] : [...row, ...filler];
  };
  return {
    inputIds: seqs.map((s) => pad(s, padId)),
    attentionMask: seqs.map((s) => pad(s.map(() => 1), 0)),
    extras: extras.map((rows) => rows.map((r) => pad(r, 0))),
  };
}

/**
 * Splits a response into its `<think>…</think>` reasoning and the answer after it. A response
 * without a closing `</think>` has no answer (thinking was cut off).
 */
export function splitThinking(text: string): { thinking: string | null; answer: string | null } {
  const open = text.indexOf('<think>');
  const close = text.indexOf('</think>');
  if (close < 0) return open < 0 ? { thinking: null, answer: text.trim() } : { thinking: text.slice(open + 7).trim(), answer: null };
  const start = open >= 0 && open < close ? open + 7 : 0;
  return { thinking: text.slice(start, close).trim(), answer: text.slice(close + 8).trim() };
}

/** The text with any `<think>…</think>` block removed (an unclosed block removes the rest). */
export function stripThinking(text: string): string {
  return splitThinking(text).answer ?? '';
}
