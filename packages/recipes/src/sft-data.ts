/**
 * SFT data: prompt/response pairs or conversations (TRL's `messages` rows) from JSONL or Parquet →
 * token ids with a loss mask (the response, or the assistant's turns), and batches for the SFT
 * loss: padded, one example per row, or packed, several per row.
 */
import { existsSync, readFileSync } from 'node:fs';
import { loadConversations, loadSftPairs, readParquetSchema } from '@lathe/data';
import type { HostTensor } from '@lathe/runtime';
import type { ChatMessage } from '@lathe/tokenizer';
import type { RunTokenizer } from './scaffold';

/** What SFT needs of a tokenizer: a run's tokenizer, whose `encodePrompt` may be absent here (a prompt is then its text). */
export interface SftTokenizer extends Omit<RunTokenizer, 'encodePrompt'> {
  /** How a prompt becomes ids when it is more than its text (e.g. wrapped in a chat template). */
  encodePrompt?(text: string): number[];
}

/** A prompt and the response to learn, or a conversation. */
export interface SftExample {
  /** The prompt; of a conversation, its last user message (shown in evaluation files). */
  prompt: string;
  /** The response; of a conversation, its last assistant message (what evaluation expects). */
  response: string;
  /** Optional grouping for evaluation reports (e.g. MATH's subject). */
  subject?: string;
  /**
   * A conversation (TRL's conversational format), trained through the model's chat template; the
   * evaluation generates its last assistant message from the messages before it.
   */
  messages?: ChatMessage[];
  /** Where a conversation's row is (`file:line`, `file row i`), for errors found while rendering it. */
  where?: string;
}

/** What a row of SFT data is (`--data_format`); 'auto' reads the first row. */
export type SftDataFormat = 'auto' | 'prompt_response' | 'messages';

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

/**
 * Tokenizes an example as one sequence (ids are concatenated, never re-tokenized). A conversation
 * is rendered by the chat template with its assistant turns marked: the loss mask is that mask
 * (`assistantOnly`, the default) or 1 on every token, and `promptLength` the tokens before the
 * first assistant turn.
 */
export function tokenizeExample(tok: SftTokenizer, ex: SftExample, opts: { assistantOnly?: boolean } = {}): TokenizedExample {
  if (ex.messages) {
    if (!tok.chat) throw new Error(`${ex.where ?? 'a conversation'}: conversational rows need a tokenizer with a chat template`);
    let encoded;
    try {
      encoded = tok.chat.encodeConversation(ex.messages);
    } catch (e) {
      throw new Error(`${ex.where ?? 'a conversation'}: ${(e as Error).message}`);
    }
    const { ids, assistantMask } = encoded;
    const first = assistantMask.indexOf(1);
    return { ids, lossMask: opts.assistantOnly ?? true ? assistantMask : ids.map(() => 1), promptLength: first < 0 ? ids.length : first };
  }
  const { prompt, response } = encodePair(tok, ex);
  return { ids: [...prompt, ...response], lossMask: [...prompt.map(() => 0), ...response.map(() => 1)], promptLength: prompt.length };
}

/**
 * The ids evaluation generates from: the prompt's (see {@link encodePair}), or of a conversation
 * the messages before its last assistant message with the assistant's turn opened.
 */
export function evalPromptIds(tok: SftTokenizer, ex: SftExample): number[] {
  if (!ex.messages) return encodePair(tok, ex).prompt;
  const last = ex.messages.map((m) => m.role).lastIndexOf('assistant');
  return tok.chat!.encodePrompt(ex.messages.slice(0, last));
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
 * Whether a data file holds conversations: a Parquet file with a `messages` column, or a JSONL
 * file whose first row has a `messages` field (a first line that is not JSON reads as
 * prompt/response rows, whose reader then reports it).
 */
export async function detectSftFormat(path: string): Promise<'prompt_response' | 'messages'> {
  if (!existsSync(path)) throw new Error(`${path}: cannot read the SFT data file (ENOENT)`);
  if (path.endsWith('.parquet')) return (await readParquetSchema(path)).fields.some((f) => f.name === 'messages') ? 'messages' : 'prompt_response';
  const first = readFileSync(path, 'utf8').split('\n').find((l) => l.trim() !== '');
  try {
    const row = JSON.parse(first ?? '') as unknown;
    return row !== null && typeof row === 'object' && 'messages' in row ? 'messages' : 'prompt_response';
  } catch {
    return 'prompt_response';
  }
}

/**
 * Conversations (JSONL or Parquet, see `loadConversations` in @lathe/data) as SFT examples: the
 * messages, with the last user and assistant messages as prompt and response for evaluation.
 */
export async function readSftConversations(path: string): Promise<SftExample[]> {
  if (!existsSync(path)) throw new Error(`${path}: cannot read the SFT data file (ENOENT)`);
  const { examples } = await loadConversations(path);
  if (examples.length === 0) throw new Error(`${path}: no examples`);
  return examples.map((c) => {
    const last = c.messages.map((m) => m.role).lastIndexOf('assistant');
    const user = c.messages.slice(0, last).findLast((m) => m.role === 'user');
    const subject = c.meta?.subject;
    return { prompt: user?.content ?? '', response: c.messages[last].content, messages: c.messages, where: c.where, ...(subject !== undefined ? { subject } : {}) };
  });
}

/**
 * SFT rows: conversations ({@link readSftConversations}) when `format` says so, or (auto) when
 * the file holds them ({@link detectSftFormat}); otherwise prompt/response rows from a Parquet
 * file (columns `prompt`, `response`, optionally `subject`) or, for any other name, a JSONL file
 * ({@link readSftJsonl}). Errors name the file and row.
 */
export async function readSftData(path: string, format: SftDataFormat = 'auto'): Promise<SftExample[]> {
  if ((format === 'auto' ? await detectSftFormat(path) : format) === 'messages') return readSftConversations(path);
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
  return padRows(examples, padId, width, 'padBatch: width', 'longest example', { attention_mask: () => 1, loss_mask: (e, t) => e.lossMask[t] });
}

/**
 * Right-padded [rows, width] int64 tensors: input_ids (padded with `padId`) and one per `fields`
 * entry (its value at each token, padded with 0), in that order; `width` as in {@link padBatch}.
 */
function padRows<R extends { ids: readonly number[] }>(rows: readonly R[], padId: number, width: number | undefined, what: string, longestIs: string, fields: Record<string, (r: R, t: number) => number>): Record<string, HostTensor> {
  const longest = Math.max(...rows.map((r) => r.ids.length));
  if (width !== undefined && (!Number.isInteger(width) || width < longest)) throw new Error(`${what} ${width} must be an integer no less than the ${longestIs} (${longest} tokens)`);
  const T = width ?? longest;
  const B = rows.length;
  const ids = new BigInt64Array(B * T).fill(BigInt(padId));
  const fns = Object.values(fields);
  const values = fns.map(() => new BigInt64Array(B * T));
  rows.forEach((r, b) => {
    r.ids.forEach((id, t) => {
      ids[b * T + t] = BigInt(id);
      fns.forEach((f, k) => (values[k][b * T + t] = BigInt(f(r, t))));
    });
  });
  const dims = [B, T];
  return { input_ids: { data: ids, dims }, ...Object.fromEntries(Object.keys(fields).map((name, k) => [name, { data: values[k], dims }])) };
}

/**
 * Tokens the loss predicts in a batch: loss-mask positions that have a preceding token of the same
 * example (in a packed row, an example's first token is never predicted).
 */
export function lossTokenCount(rows: readonly { lossMask: readonly number[]; segmentIds?: readonly number[] }[]): number {
  let n = 0;
  for (const { lossMask, segmentIds } of rows) for (let t = 1; t < lossMask.length; t++) if (lossMask[t] && (!segmentIds || segmentIds[t] === segmentIds[t - 1])) n++;
  return n;
}

// ---- packing ------------------------------------------------------------------------------------

/** Examples packed into one row (see {@link packExamples}). */
export interface PackedRow {
  ids: number[];
  lossMask: number[];
  /** 1, 2, … for the row's first, second, … example. */
  segmentIds: number[];
  /** Each token's position within its own example (0 at each example's first token). */
  positions: number[];
  /** Examples in the row. */
  examples: number;
  /** The row's longest example in tokens (for the padding an unpacked batch would have). */
  longest: number;
}

/**
 * Packs examples into rows of at most `maxLength` tokens by best-fit decreasing (TRL's default
 * packing strategy): longest first, each into the row with the least room left that still holds
 * it, or a new row; no example is split. Deterministic for the same examples; rows in the order
 * they were opened, examples in each in the order they were placed.
 */
export function packExamples(examples: readonly TokenizedExample[], maxLength: number): PackedRow[] {
  const order = examples.map((_, i) => i).sort((a, b) => examples[b].ids.length - examples[a].ids.length || a - b);
  const members: number[][] = [];
  // rows by the room they have left (room → row indices)
  const byRoom: number[][] = Array.from({ length: maxLength + 1 }, () => []);
  const room: number[] = [];
  for (const i of order) {
    const n = examples[i].ids.length;
    if (n > maxLength) throw new Error(`packExamples: example ${i} has ${n} tokens, more than the row length ${maxLength}`);
    let row = -1;
    for (let left = n; left <= maxLength && row < 0; left++) if (byRoom[left].length) row = byRoom[left].pop()!;
    if (row < 0) {
      row = members.length;
      members.push([]);
      room.push(maxLength);
    }
    members[row].push(i);
    room[row] -= n;
    byRoom[room[row]].push(row);
  }
  return members.map((ks) => {
    const r: PackedRow = { ids: [], lossMask: [], segmentIds: [], positions: [], examples: ks.length, longest: 0 };
    ks.forEach((k, s) => {
      const e = examples[k];
      r.ids.push(...e.ids);
      r.lossMask.push(...e.lossMask);
      r.segmentIds.push(...e.ids.map(() => s + 1));
      r.positions.push(...e.ids.map((_, t) => t));
      r.longest = Math.max(r.longest, e.ids.length);
    });
    return r;
  });
}

/**
 * Right-padded batch tensors of packed rows for the packed SFT loss (input_ids, segment_ids,
 * position_ids, loss_mask; padding has segment 0), `width` tokens wide as in {@link padBatch}.
 */
export function padPackedBatch(rows: readonly PackedRow[], padId: number, width?: number): Record<string, HostTensor> {
  return padRows(rows, padId, width, 'padPackedBatch: width', 'longest row', { segment_ids: (r, t) => r.segmentIds[t], position_ids: (r, t) => r.positions[t], loss_mask: (r, t) => r.lossMask[t] });
}
