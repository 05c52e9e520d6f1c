/**
 * SFT data: prompt/response pairs → token ids with a loss mask on the response, a deterministic
 * epoch order (so a run resumes at exactly the example it stopped at), and padded batches.
 */
import { existsSync, readFileSync } from 'node:fs';
import { loadSftPairs } from '@lathe/data';
import type { HostTensor } from '@lathe/runtime';

/** What SFT needs of a tokenizer. */
export interface SftTokenizer {
  encode(text: string): number[];
  decode(ids: readonly number[]): string;
  readonly padId: number;
  readonly eosId: number;
  /** Prepended to every sequence when set. */
  readonly bosId?: number;
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

/** Deterministic uniform numbers in [0, 1) (mulberry32). */
export function seededRandom(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** A seeded Fisher-Yates permutation of 0..n-1. */
export function permutation(n: number, seed: number): number[] {
  const r = seededRandom(seed);
  const p = [...Array(n).keys()];
  for (let i = n - 1; i > 0; i--) {
    const j = Math.floor(r() * (i + 1));
    [p[i], p[j]] = [p[j], p[i]];
  }
  return p;
}

/**
 * The seeded held-out split every run uses (SFT, GRPO, the demo's two stages): the first
 * `evalCount` items of a permutation seeded by `seed`, and the rest for training.
 */
export function heldOutSplit<T>(items: readonly T[], evalCount: number, seed: number): { train: T[]; evaluation: T[] } {
  const order = permutation(items.length, seed + 0x5eed);
  return { evaluation: order.slice(0, evalCount).map((i) => items[i]), train: order.slice(evalCount).map((i) => items[i]) };
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

/** The built-in task: every "a+b=" with 0 ≤ a, b < 100, answer "c". */
export function additionExamples(): SftExample[] {
  const out: SftExample[] = [];
  for (let a = 0; a < 100; a++) for (let b = 0; b < 100; b++) out.push({ prompt: `${a}+${b}=`, response: `${a + b}` });
  return out;
}

/** The built-in task's alphabet. */
export const ADDITION_ALPHABET = '0123456789+=';

/**
 * An endless, deterministic stream of examples: epoch e visits every example once in the order
 * `permutation(n, seed + e)`. The position (examples consumed) is all a resume needs.
 */
export class EpochStream<T> {
  private orderEpoch = -1;
  private order: number[] = [];

  constructor(
    private readonly items: readonly T[],
    private readonly seed: number,
    /** Examples consumed so far. */
    public position = 0,
  ) {
    if (items.length === 0) throw new Error('no training examples');
  }

  /** The next `count` items. */
  take(count: number): T[] {
    const out: T[] = [];
    for (let k = 0; k < count; k++) {
      const epoch = Math.floor(this.position / this.items.length);
      if (epoch !== this.orderEpoch) {
        this.order = permutation(this.items.length, this.seed + epoch);
        this.orderEpoch = epoch;
      }
      out.push(this.items[this.order[this.position % this.items.length]]);
      this.position++;
    }
    return out;
  }
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
