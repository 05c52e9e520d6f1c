/**
 * SFT data: prompt/response pairs from JSONL or Parquet → token ids with a loss mask on the
 * response, and padded batches for the SFT loss.
 */
import { existsSync, readFileSync } from 'node:fs';
import { loadSftPairs } from '@lathe/data';
import type { HostTensor } from '@lathe/runtime';
import type { RunTokenizer } from './scaffold';

/** What SFT needs of a tokenizer: a run's tokenizer, whose `encodePrompt` may be absent here (a prompt is then its text). */
export interface SftTokenizer extends Omit<RunTokenizer, 'encodePrompt'> {
  /** How a prompt becomes ids when it is more than its text (e.g. wrapped in a chat template). */
  encodePrompt?(text: string): number[];
}

/** A prompt and the response to learn. */
export interface SftExample {
  prompt: string;
  response: string;
  /** Optional grouping for evaluation reports (e.g. MATH's subject). */
  subject?: string;
}

/** A tokenized example: the loss mask is 1 on the response's tokens and the closing EOS. */
export interface TokenizedExample {
  ids: number[];
  lossMask: number[];
  promptLength: number;
}

/** The prompt's ids (with BOS) and the response's ids (with EOS). */
export function encodePair(tok: SftTokenizer, ex: SftExample): { prompt: number[]; response: number[] } {
  const prompt = tok.encodePrompt ? tok.encodePrompt(ex.prompt) : tok.encode(ex.prompt);
  return { prompt: [...(tok.bosId === undefined ? [] : [tok.bosId]), ...prompt], response: [...tok.encode(ex.response), tok.eosId] };
}

/** Tokenizes an example as one sequence (ids are concatenated, never re-tokenized). */
export function tokenizeExample(tok: SftTokenizer, ex: SftExample): TokenizedExample {
  const { prompt, response } = encodePair(tok, ex);
  return { ids: [...prompt, ...response], lossMask: [...prompt.map(() => 0), ...response.map(() => 1)], promptLength: prompt.length };
}

/** Reads {"prompt", "response"[, "subject"]} rows from a JSONL file; errors name the file and line. */
export function readSftJsonl(path: string): SftExample[] {
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch (e) {
    throw new Error(`${path}: cannot read the SFT data file (${(e as NodeJS.ErrnoException).code ?? (e as Error).message})`);
  }
  const rows: SftExample[] = [];
  text.split('\n').forEach((line, i) => {
    if (line.trim() === '') return;
    let row: unknown;
    try {
      row = JSON.parse(line);
    } catch {
      throw new Error(`${path}:${i + 1}: not valid JSON`);
    }
    const r = row as Record<string, unknown>;
    for (const k of ['prompt', 'response']) {
      if (typeof r[k] !== 'string') throw new Error(`${path}:${i + 1}: field '${k}' must be a string`);
    }
    if (r.subject !== undefined && typeof r.subject !== 'string') throw new Error(`${path}:${i + 1}: field 'subject' must be a string when present`);
    rows.push({ prompt: r.prompt as string, response: r.response as string, ...(typeof r.subject === 'string' ? { subject: r.subject } : {}) });
  });
  if (rows.length === 0) throw new Error(`${path}: no examples`);
  return rows;
}

/**
 * SFT rows from a Parquet file (columns `prompt`, `response`, optionally `subject`) or, for any
 * other name, a JSONL file ({@link readSftJsonl}); errors name the file and row.
 */
export async function readSftData(path: string): Promise<SftExample[]> {
  if (!path.endsWith('.parquet')) return readSftJsonl(path);
  if (!existsSync(path)) throw new Error(`${path}: cannot read the SFT data file (ENOENT)`);
  const { examples } = await loadSftPairs(path);
  if (examples.length === 0) throw new Error(`${path}: no examples`);
  return examples.map((e) => ({ prompt: e.prompt, response: e.response, ...(e.meta?.subject !== undefined ? { subject: e.meta.subject } : {}) }));
}

/**
 * Right-padded batch tensors for the SFT loss (input_ids, attention_mask, loss_mask), `width`
 * tokens wide: by default the longest example's length; a fixed width (e.g. `--max_length` for a
 * loss compiled with a static shape) must be at least that.
 */
export function padBatch(examples: readonly TokenizedExample[], padId: number, width?: number): Record<string, HostTensor> {
  const longest = Math.max(...examples.map((e) => e.ids.length));
  if (width !== undefined && (!Number.isInteger(width) || width < longest)) throw new Error(`padBatch: width ${width} must be an integer no less than the longest example (${longest} tokens)`);
  const T = width ?? longest;
  const B = examples.length;
  const ids = new BigInt64Array(B * T).fill(BigInt(padId));
  const attention = new BigInt64Array(B * T);
  const loss = new BigInt64Array(B * T);
  examples.forEach((e, r) => {
    e.ids.forEach((id, t) => {
      ids[r * T + t] = BigInt(id);
      attention[r * T + t] = 1n;
      loss[r * T + t] = BigInt(e.lossMask[t]);
    });
  });
  return { input_ids: { data: ids, dims: [B, T] }, attention_mask: { data: attention, dims: [B, T] }, loss_mask: { data: loss, dims: [B, T] } };
}

/** Tokens the loss predicts in a batch: loss-mask positions that have a preceding token. */
export function lossTokenCount(examples: readonly TokenizedExample[]): number {
  return examples.reduce((s, e) => s + e.lossMask.slice(1).reduce((a, b) => a + b, 0), 0);
}
