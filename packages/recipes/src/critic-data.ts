/**
 * The critic's training data: trajectory rows (as `lathe generate` / `lathe critic data` write them)
 * grouped by prompt into in-context sequences (@lathe/critic's format), packed into rows of the
 * training length by SFT's packing (best-fit decreasing, block-diagonal attention).
 */
import type { Trajectory } from '@lathe/data';
import type { HostTensor } from '@lathe/runtime';
import { criticExamples, type CriticAblation, type CriticAttempt, type CriticBins, type CriticExample } from '@lathe/critic';
import { packExamples } from './sft-data';

/** Options of {@link criticTrainingExamples}. */
export interface CriticDataOptions {
  bins: CriticBins;
  encode: (text: string) => number[];
  superviseFrom: number;
  ablation: CriticAblation;
  maxLength: number;
  /** The file the rows came from, for errors. */
  where: string;
}

/** A row's final reward: `correct`, else `value`; an error names the row when it has neither. */
export function rowReward(row: Trajectory, i: number, where: string): number {
  const r = row.correct ?? row.value;
  if (r === undefined || r === null) throw new Error(`${where}: row ${i} has neither 'correct' nor 'value' (the critic learns the final reward of each attempt)`);
  if (!(r >= 0 && r <= 1)) throw new Error(`${where}: row ${i}, column '${row.correct !== undefined && row.correct !== null ? 'correct' : 'value'}': ${r} is outside [0, 1]`);
  return r;
}

/**
 * The in-context sequences of trajectory rows: each prompt's rows (in file order) are its attempts.
 * Returns the sequences, the attempts skipped for being longer than the training length, and the
 * number of prompts.
 */
export function criticTrainingExamples(rows: readonly Trajectory[], opts: CriticDataOptions): { examples: CriticExample[]; skipped: number; prompts: number } {
  const groups = new Map<number, { prompt: number[]; attempts: CriticAttempt[]; first: number }>();
  rows.forEach((row, i) => {
    const reward = rowReward(row, i, opts.where);
    let g = groups.get(row.prompt_idx);
    if (!g) groups.set(row.prompt_idx, (g = { prompt: Array.from(row.prompt_token_ids), attempts: [], first: i }));
    g.attempts.push({ tokens: Array.from(row.output_token_ids), reward });
  });
  const examples: CriticExample[] = [];
  let skipped = 0;
  for (const [idx, g] of groups) {
    const r = criticExamples(g.prompt, g.attempts, { ...opts, where: `${opts.where}: prompt_idx ${idx} (first row ${g.first})` });
    examples.push(...r.examples);
    skipped += r.skipped;
  }
  return { examples, skipped, prompts: groups.size };
}

/** Critic sequences packed into one row: ids, labels (−1: none), segments (1, 2, …) and per-sequence positions. */
export interface CriticRow {
  ids: number[];
  labels: number[];
  segmentIds: number[];
  positions: number[];
  examples: number;
}

/**
 * Packs sequences into rows of at most `maxLength` tokens with SFT's `packExamples`. Its rows carry
 * a loss mask per token; here that mask carries each token's sequence number + 1, so every token's
 * label is found again after packing.
 */
export function packCriticExamples(examples: readonly CriticExample[], maxLength: number): CriticRow[] {
  const tagged = examples.map((e, k) => ({ ids: e.ids, lossMask: e.ids.map(() => k + 1), promptLength: 0 }));
  return packExamples(tagged, maxLength).map((row) => {
    const labels: number[] = [];
    let k = -1;
    let t = 0;
    row.lossMask.forEach((tag, i) => {
      if (i === 0 || row.segmentIds[i] !== row.segmentIds[i - 1]) {
        k = tag - 1;
        t = 0;
      }
      labels.push(examples[k].labels[t++]);
    });
    return { ids: row.ids, labels, segmentIds: row.segmentIds, positions: row.positions, examples: row.examples };
  });
}

/** Labelled tokens of packed rows (the loss's normaliser). */
export function criticLabelCount(rows: readonly { labels: readonly number[] }[]): number {
  let n = 0;
  for (const r of rows) for (const l of r.labels) if (l >= 0) n++;
  return n;
}

/** Right-padded batch tensors of packed critic rows for `criticLoss` with packing: padding has segment 0 and label −1. */
export function padCriticBatch(rows: readonly CriticRow[], padId: number, width?: number): Record<string, HostTensor> {
  const T = width ?? Math.max(...rows.map((r) => r.ids.length));
  const B = rows.length;
  const make = () => new BigInt64Array(B * T);
  const ids = make().fill(BigInt(padId));
  const seg = make();
  const pos = make();
  const labels = make().fill(-1n);
  rows.forEach((r, b) => {
    if (r.ids.length > T) throw new Error(`padCriticBatch: a row has ${r.ids.length} tokens, more than the width ${T}`);
    r.ids.forEach((id, t) => {
      ids[b * T + t] = BigInt(id);
      seg[b * T + t] = BigInt(r.segmentIds[t]);
      pos[b * T + t] = BigInt(r.positions[t]);
      labels[b * T + t] = BigInt(r.labels[t]);
    });
  });
  const dims = [B, T];
  return { input_ids: { data: ids, dims }, segment_ids: { data: seg, dims }, position_ids: { data: pos, dims }, labels: { data: labels, dims } };
}
