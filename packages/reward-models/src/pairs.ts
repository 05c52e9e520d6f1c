/**
 * Preference pairs as the losses take them. A pair is token ids of a prompt and two responses,
 * the chosen one preferred. A batch of P pairs is 2P rows: prompt + chosen for pairs 0 … P−1, then
 * prompt + rejected in the same order, padded to one width, with a mask of the response tokens.
 * Pairs are never truncated: a pair whose longer row passes `maxLength` is skipped and counted, as
 * is a pair whose responses are identical (it carries no preference).
 */
import type { HostTensor } from '@lathe/runtime';
import type { BatchTensor } from '@lathe/train';
import { TOTAL_LENGTH_INPUT, totalLengthTensor } from '@lathe/models';

/** One preference: `chosen` is preferred to `rejected` as a response to `prompt`. */
export interface PreferencePair {
  prompt: readonly number[];
  chosen: readonly number[];
  rejected: readonly number[];
  /** How much more `chosen` is preferred (the Bradley-Terry loss's margin m; TRL's `margin` column). */
  margin?: number;
}

/** What {@link selectPairs} kept and skipped. */
export interface PairSelection {
  /** The usable pairs, in their input order. */
  pairs: PreferencePair[];
  /** Each kept pair's index in the input. */
  indices: number[];
  /** Pairs left out: a row longer than `maxLength`, or chosen identical to rejected. */
  skipped: { overLength: number; identical: number };
}

/**
 * The pairs a run can use: those whose rows (prompt + chosen, prompt + rejected) fit `maxLength`
 * and whose responses differ. A pair with an empty row is an error naming it; so is a selection
 * that keeps nothing (an empty run would report nothing useful).
 */
export function selectPairs(pairs: readonly PreferencePair[], opts: { maxLength: number }): PairSelection {
  if (!Number.isInteger(opts.maxLength) || opts.maxLength < 1) throw new Error(`selectPairs: maxLength must be a positive integer, got ${opts.maxLength}`);
  const kept: PreferencePair[] = [];
  const indices: number[] = [];
  const skipped = { overLength: 0, identical: 0 };
  pairs.forEach((p, i) => {
    const chosen = p.prompt.length + p.chosen.length;
    const rejected = p.prompt.length + p.rejected.length;
    if (chosen === 0 || rejected === 0) throw new Error(`preference pair ${i}: an empty sequence (prompt + ${chosen === 0 ? 'chosen' : 'rejected'} has no tokens)`);
    if (p.margin !== undefined && !Number.isFinite(p.margin)) throw new Error(`preference pair ${i}: margin ${p.margin} is not a finite number`);
    if (sameTokens(p.chosen, p.rejected)) skipped.identical++;
    else if (Math.max(chosen, rejected) > opts.maxLength) skipped.overLength++;
    else {
      kept.push(p);
      indices.push(i);
    }
  });
  if (kept.length === 0 && pairs.length > 0) {
    throw new Error(`no usable preference pair among ${pairs.length}: ${skipped.overLength} longer than max_length ${opts.maxLength}, ${skipped.identical} with identical chosen and rejected`);
  }
  return { pairs: kept, indices, skipped };
}

/** Options of {@link pairBatch}. */
export interface PairBatchOptions {
  /** The pad token id (its value never matters to the model: padding is masked). */
  padId: number;
  /** Where padding goes. Default 'right' (what flash attention and the GroupQueryAttention scorer need). */
  padding?: 'right' | 'left';
  /** A fixed width T (for a loss compiled with a static shape); default the longest row. */
  width?: number;
  /**
   * Pairs in the whole optimizer batch, the losses' normaliser (`pair_count`): give it when a step
   * is split into micro-batches, so their losses add up to the whole batch's. Default: this batch's pairs.
   */
  pairCount?: number;
}

/** 2P rows for P pairs: chosen rows first, then rejected rows in the same pair order. */
export interface PairBatch {
  /** Pairs P (the batch has 2P rows). */
  pairs: number;
  /** Width T. */
  width: number;
  /** int64 [2P, T]. */
  inputIds: HostTensor;
  /** int64 [2P, T]: 1 on tokens. */
  attentionMask: HostTensor;
  /** int64 [2P, T]: 1 on response tokens (the DPO loss sums their log-probs). */
  responseMask: HostTensor;
  /** float32 [P]: each pair's margin (0 where none is given). */
  margin: HostTensor;
  /** float32 scalar: pairs in the whole optimizer batch (see {@link PairBatchOptions.pairCount}). */
  pairCount: HostTensor;
}

/** The padded tensors of `pairs` (already selected: a row longer than `width` is an error). */
export function pairBatch(pairs: readonly PreferencePair[], opts: PairBatchOptions): PairBatch {
  const P = pairs.length;
  if (P === 0) throw new Error('pairBatch: no pairs');
  const rows = [...pairs.map((p) => ({ prompt: p.prompt, response: p.chosen })), ...pairs.map((p) => ({ prompt: p.prompt, response: p.rejected }))];
  const longest = Math.max(...rows.map((r) => r.prompt.length + r.response.length));
  const T = opts.width ?? longest;
  if (longest > T) throw new Error(`pairBatch: a row of ${longest} tokens does not fit width ${T} (select pairs with maxLength first: pairs are never truncated)`);
  const ids = new BigInt64Array(2 * P * T).fill(BigInt(opts.padId));
  const attention = new BigInt64Array(2 * P * T);
  const response = new BigInt64Array(2 * P * T);
  rows.forEach((r, i) => {
    const n = r.prompt.length + r.response.length;
    const start = i * T + (opts.padding === 'left' ? T - n : 0);
    [...r.prompt, ...r.response].forEach((id, k) => {
      ids[start + k] = BigInt(id);
      attention[start + k] = 1n;
      if (k >= r.prompt.length) response[start + k] = 1n;
    });
  });
  const pairCount = opts.pairCount ?? P;
  if (!(pairCount >= P)) throw new Error(`pairBatch: pairCount ${pairCount} is less than the batch's ${P} pairs`);
  return {
    pairs: P,
    width: T,
    inputIds: { data: ids, dims: [2 * P, T] },
    attentionMask: { data: attention, dims: [2 * P, T] },
    responseMask: { data: response, dims: [2 * P, T] },
    margin: { data: Float32Array.from(pairs, (p) => p.margin ?? 0), dims: [P] },
    pairCount: { data: Float32Array.of(pairCount), dims: [] },
  };
}

/** Input names of the pair losses and scorers. */
export const PAIR_INPUTS = {
  inputIds: 'input_ids',
  attentionMask: 'attention_mask',
  responseMask: 'loss_mask',
  margin: 'margin',
  pairCount: 'pair_count',
  refLogp: 'ref_logp',
} as const;

/**
 * The feeds of a train step reading `inputs` (the Trainer's `batchInputs`) from a pair batch, plus
 * `extra` (the reference log-probs as `ref_logp`, a LoRA dropout key, …). Inputs that neither
 * supplies are an error naming them.
 */
export function pairFeeds(batch: PairBatch, inputs: readonly string[], extra: Record<string, BatchTensor> = {}): Record<string, BatchTensor> {
  const fromBatch: Record<string, BatchTensor> = {
    [PAIR_INPUTS.inputIds]: batch.inputIds,
    [PAIR_INPUTS.attentionMask]: batch.attentionMask,
    [PAIR_INPUTS.responseMask]: batch.responseMask,
    [PAIR_INPUTS.margin]: batch.margin,
    [PAIR_INPUTS.pairCount]: batch.pairCount,
    [TOTAL_LENGTH_INPUT]: totalLengthTensor(batch.width),
  };
  const feeds: Record<string, BatchTensor> = {};
  for (const name of inputs) {
    const t = extra[name] ?? fromBatch[name];
    if (!t) throw new Error(`pairFeeds: the loss reads '${name}', which a pair batch does not hold; pass it in extra`);
    feeds[name] = t;
  }
  return feeds;
}

function sameTokens(a: readonly number[], b: readonly number[]): boolean {
  return a.length === b.length && a.every((x, i) => x === b[i]);
}
