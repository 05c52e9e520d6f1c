/**
 * The data of `lathe extract train` and `rft`: labelled trajectories (each output token with the
 * reference policy's candidates, their Q and reference log-probs) checked and turned into the
 * distillation loss's batches, and the successful trajectories RFT trains on.
 */
import { existsSync } from 'node:fs';
import { readParquetSchema, readTrajectories, type Trajectory } from '@lathe/data';
import type { HostTensor } from '@lathe/runtime';
import { rowReward } from './critic-data';

/** The columns a labelled Parquet file must have beside the trajectory's. */
export const CANDIDATE_COLUMNS = ['candidate_ids', 'candidate_q_values', 'candidate_ref_logprobs'] as const;

/** One trajectory for the distillation loss: its ids and, per output token, the candidates the token was one of. */
export interface ExtractionExample {
  ids: number[];
  promptLength: number;
  /** Per output token t: the candidates' ids, Q values and reference log-probs (equal lengths). */
  candidates: { ids: number[]; q: number[]; ref: number[] }[];
}

/** Reads a labelled Parquet file, naming a missing candidate column and a row whose lists do not line up. */
export async function readLabelledTrajectories(file: string, flag = '--data'): Promise<Trajectory[]> {
  if (!file) throw new Error(`${flag} is required: a labelled trajectory Parquet file (lathe critic label or lathe extract generate writes one)`);
  if (!existsSync(file)) throw new Error(`${flag} ${file}: no such file`);
  const names = (await readParquetSchema(file)).fields.map((f) => f.name);
  const missing = CANDIDATE_COLUMNS.filter((c) => !names.includes(c));
  if (missing.length) throw new Error(`${flag} ${file}: no column ${missing.map((c) => `'${c}'`).join(', ')} — label the trajectories first (lathe critic label), or sample them with lathe extract generate`);
  const rows = await readTrajectories(file);
  rows.forEach((r, i) => {
    const T = r.output_token_ids.length;
    for (const c of CANDIDATE_COLUMNS) {
      const lists = r[c];
      if (!lists) throw new Error(`${flag} ${file}: row ${i}, column '${c}': null`);
      if (lists.length !== T) throw new Error(`${flag} ${file}: row ${i}, column '${c}': ${lists.length} candidate lists for ${T} output tokens`);
    }
    for (let t = 0; t < T; t++) {
      const n = r.candidate_ids![t].length;
      for (const c of ['candidate_q_values', 'candidate_ref_logprobs'] as const) {
        if (r[c]![t].length !== n) throw new Error(`${flag} ${file}: row ${i}, output token ${t}: ${n} candidate_ids but ${r[c]![t].length} ${c}`);
      }
      const q = r.candidate_q_values![t];
      for (let k = 0; k < n; k++) if (!Number.isFinite(q[k]) || !Number.isFinite(r.candidate_ref_logprobs![t][k])) throw new Error(`${flag} ${file}: row ${i}, output token ${t}, candidate ${k}: a non-finite Q or reference log-prob`);
    }
    if (T > 0 && r.prompt_token_ids.length === 0) throw new Error(`${flag} ${file}: row ${i} has no prompt_token_ids (the first output token is predicted from the prompt)`);
  });
  return rows;
}

/** The distillation examples of labelled rows: those over `maxLength` tokens are skipped and counted; ids at or past `vocabSize` are refused naming the row. */
export function extractionExamples(rows: readonly Trajectory[], opts: { maxLength: number; vocabSize: number; where: string }): { examples: ExtractionExample[]; skipped: number } {
  const examples: ExtractionExample[] = [];
  let skipped = 0;
  rows.forEach((r, i) => {
    const ids = [...Array.from(r.prompt_token_ids), ...Array.from(r.output_token_ids)];
    if (ids.length > opts.maxLength) {
      skipped++;
      return;
    }
    const candidates = Array.from({ length: r.output_token_ids.length }, (_, t) => ({ ids: Array.from(r.candidate_ids![t]), q: Array.from(r.candidate_q_values![t]), ref: Array.from(r.candidate_ref_logprobs![t]) }));
    const bad = [...ids, ...candidates.flatMap((c) => c.ids)].find((id) => !(id >= 0 && id < opts.vocabSize));
    if (bad !== undefined) throw new Error(`${opts.where}: row ${i} holds token id ${bad}, outside the policy's vocabulary of ${opts.vocabSize} (were these trajectories sampled with another tokenizer?)`);
    examples.push({ ids, promptLength: r.prompt_token_ids.length, candidates });
  });
  return { examples, skipped };
}

/** Positions with at least one candidate: the loss's normaliser. */
export function candidatePositions(examples: readonly ExtractionExample[]): number {
  return examples.reduce((s, e) => s + e.candidates.filter((c) => c.ids.length > 0).length, 0);
}

/**
 * The loss's inputs for a batch (right-padded): position promptLength + t − 1 holds the candidates
 * of output token t, the position that predicts it. K is the batch's largest candidate set.
 */
export function padExtractionBatch(examples: readonly ExtractionExample[], padId: number): Record<string, HostTensor> {
  const B = examples.length;
  const T = Math.max(...examples.map((e) => e.ids.length));
  const K = Math.max(1, ...examples.flatMap((e) => e.candidates.map((c) => c.ids.length)));
  const ids = new BigInt64Array(B * T).fill(BigInt(padId));
  const mask = new BigInt64Array(B * T);
  const candIds = new BigInt64Array(B * T * K);
  const candMask = new BigInt64Array(B * T * K);
  const ref = new Float32Array(B * T * K);
  const q = new Float32Array(B * T * K);
  examples.forEach((e, b) => {
    e.ids.forEach((id, t) => ((ids[b * T + t] = BigInt(id)), (mask[b * T + t] = 1n)));
    e.candidates.forEach((c, t) => {
      const at = (b * T + e.promptLength + t - 1) * K;
      c.ids.forEach((id, k) => {
        candIds[at + k] = BigInt(id);
        candMask[at + k] = 1n;
        ref[at + k] = c.ref[k];
        q[at + k] = c.q[k];
      });
    });
  });
  return {
    input_ids: { data: ids, dims: [B, T] },
    attention_mask: { data: mask, dims: [B, T] },
    candidate_ids: { data: candIds, dims: [B, T, K] },
    candidate_mask: { data: candMask, dims: [B, T, K] },
    candidate_ref_logprobs: { data: ref, dims: [B, T, K] },
    candidate_q_values: { data: q, dims: [B, T, K] },
  };
}

/** RFT's examples: prompt + output of each row whose reward reaches `threshold`, the loss on the output. */
export function successfulExamples(rows: readonly Trajectory[], opts: { threshold: number; maxLength: number; where: string }): { examples: { ids: number[]; lossMask: number[]; promptLength: number }[]; failed: number; skipped: number } {
  const examples: { ids: number[]; lossMask: number[]; promptLength: number }[] = [];
  let failed = 0;
  let skipped = 0;
  rows.forEach((r, i) => {
    if (rowReward(r, i, opts.where) < opts.threshold) {
      failed++;
      return;
    }
    const P = r.prompt_token_ids.length;
    const ids = [...Array.from(r.prompt_token_ids), ...Array.from(r.output_token_ids)];
    if (ids.length > opts.maxLength) {
      skipped++;
      return;
    }
    examples.push({ ids, lossMask: ids.map((_, t) => (t >= P ? 1 : 0)), promptLength: P });
  });
  return { examples, failed, skipped };
}
