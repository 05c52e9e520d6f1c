/**
 * `lathe critic label` and `lathe critic eval`: a trained critic over trajectory rows. Label: per
 * output token, Q and expected remaining length of the realised token and of every min-p candidate
 * of the reference policy (one reference pass and one critic tree pass per batch), to Parquet.
 * Eval: AUC and calibration of the first token's Q against the outcome, and the remaining-length
 * MAE, for 0…max_context in-context attempts.
 */
import { readFileSync } from 'node:fs';
import { CausalLM } from '@lathe/models';
import { Device } from '@lathe/runtime';
import { HfTokenizer } from '@lathe/tokenizer';
import { batchOf, flattenLists, flattenNested, listData, nestedListData, readTrajectories, trajectoriesToBatch, writeAtomic, writeParquet, type Trajectory } from '@lathe/data';
import {
  auc,
  binsDifference,
  contextPrefix,
  CriticLabeller,
  expectedCalibrationError,
  loadBins,
  meanAbsoluteError,
  reliabilityTable,
  validateBins,
  type CriticAttempt,
  type CriticBins,
  type LabelInput,
  type ReliabilityBin,
  type TokenLabels,
} from '@lathe/critic';
import { additionTokenizer, BUILTIN_TOKENIZER } from './demo-task';
import { rowReward } from './critic-data';
import type { CriticEvalConfig, CriticLabelConfig } from './critic-config';

/** The critic checkpoint's grid, refused when `--bins` names a different one. */
export function criticBins(cfg: { critic: string; bins: string }): CriticBins {
  if (!cfg.critic) throw new Error('--critic is required: a critic checkpoint folder (lathe critic train writes them)');
  const bins = loadBins(cfg.critic);
  if (cfg.bins) {
    const wanted = validateBins(JSON.parse(readFileSync(cfg.bins, 'utf8')) as CriticBins, `--bins ${cfg.bins}`);
    const diff = binsDifference(wanted, bins);
    if (diff) throw new Error(`--critic ${cfg.critic}: its grid differs from --bins ${cfg.bins} (${diff}); its Q labels would mean something else`);
  }
  return bins;
}

/** Encodes feedback text with the configured tokenizer, loaded on first use (never when no context is read). */
function feedbackEncoder(cfg: { tokenizer: string; critic: string }): () => Promise<(text: string) => number[]> {
  let encode: ((text: string) => number[]) | undefined;
  return async () => {
    if (encode) return encode;
    if (cfg.tokenizer === BUILTIN_TOKENIZER) {
      const tok = additionTokenizer();
      return (encode = (t) => tok.encode(t));
    }
    const tok = await HfTokenizer.fromFolder(cfg.tokenizer === 'model' ? cfg.critic : cfg.tokenizer);
    return (encode = (t) => tok.encode(t));
  };
}

/** Each row's in-context attempts: the first `n` other rows of its prompt, in file order (an error names a row whose prompt has too few). */
function contextsOf(rows: readonly Trajectory[], n: number, where: string): CriticAttempt[][] {
  if (n === 0) return rows.map(() => []);
  const byPrompt = new Map<number, number[]>();
  rows.forEach((r, i) => byPrompt.set(r.prompt_idx, [...(byPrompt.get(r.prompt_idx) ?? []), i]));
  return rows.map((r, i) => {
    const others = byPrompt.get(r.prompt_idx)!.filter((j) => j !== i).slice(0, n);
    if (others.length < n) throw new Error(`${where}: row ${i} (prompt_idx ${r.prompt_idx}) has ${others.length} other attempts at its prompt, fewer than ${n} in-context attempts`);
    return others.map((j) => ({ tokens: Array.from(rows[j].output_token_ids), reward: rowReward(rows[j], j, where) }));
  });
}

async function labelInputs(rows: readonly Trajectory[], contexts: readonly CriticAttempt[][], encoder: () => Promise<(text: string) => number[]>): Promise<LabelInput[]> {
  const encode = contexts.some((c) => c.length) ? await encoder() : () => [];
  return rows.map((r, i) => ({ prompt: Array.from(r.prompt_token_ids), criticPrefix: contextPrefix(Array.from(r.prompt_token_ids), contexts[i], encode), output: Array.from(r.output_token_ids) }));
}

function openLabeller(cfg: CriticLabelConfig | CriticEvalConfig, bins: CriticBins, reference: string | undefined, opts: { minP: number; maxCandidates: number }) {
  if (cfg.compute_dtype === 'bfloat16' && cfg.device !== 'cuda') throw new Error('--compute_dtype bfloat16 needs --device cuda');
  const critic = CausalLM.fromPretrainedSync(cfg.critic);
  const ref = reference ? CausalLM.fromPretrainedSync(reference) : critic;
  return CriticLabeller.open({
    device: Device.open(cfg.device),
    critic: { config: critic.config, weights: critic.float32Weights() },
    reference: { config: ref.config, weights: ref.float32Weights() },
    bins,
    minP: opts.minP,
    maxCandidates: opts.maxCandidates,
    compute: cfg.compute_dtype,
    padId: 0,
  });
}

/** Progress of a long labelling or evaluation pass. */
export interface CriticProgressEvents {
  onProgress?(done: number, total: number): void;
}

/** Labels `cfg.data` into `cfg.output`; returns the rows and labelled positions written. */
export async function runCriticLabel(cfg: CriticLabelConfig, events: CriticProgressEvents = {}): Promise<{ rows: number; positions: number; candidates: number; output: string }> {
  for (const flag of ['model', 'data', 'output'] as const) if (!cfg[flag]) throw new Error(`--${flag} is required`);
  const bins = criticBins(cfg);
  const rows = await readTrajectories(cfg.data);
  const inputs = await labelInputs(rows, contextsOf(rows, cfg.context_attempts, cfg.data), feedbackEncoder(cfg));
  inputs.forEach((x, i) => {
    if (x.prompt.length === 0) throw new Error(`${cfg.data}: row ${i} has no prompt_token_ids (the first output token is predicted from the prompt)`);
  });
  const labeller = openLabeller(cfg, bins, cfg.model, { minP: cfg.min_p, maxCandidates: cfg.max_candidates });
  const labels: TokenLabels[] = [];
  try {
    for (let i = 0; i < inputs.length; i += cfg.batch_size) {
      labels.push(...(await labeller.label(inputs.slice(i, i + cfg.batch_size))));
      events.onProgress?.(labels.length, inputs.length);
    }
  } finally {
    labeller.dispose();
  }
  const labelled = rows.map((r, i) => ({ ...r, candidate_ids: labels[i].candidate_ids, candidate_q_values: labels[i].candidate_q_values, candidate_ref_logprobs: labels[i].candidate_ref_logprobs }));
  const base = trajectoriesToBatch(labelled, cfg.data);
  const columns = base.schema.fields.map((f, k) => ({ name: f.name, data: base.getChildAt(k)!.data[0], nullable: f.nullable }));
  columns.push(
    { name: 'token_q_values', data: listData(flattenLists(labels.map((l) => l.token_q_values), (n) => new Float32Array(n))), nullable: false },
    { name: 'token_remaining', data: listData(flattenLists(labels.map((l) => l.token_remaining), (n) => new Float32Array(n))), nullable: false },
    // the reference policy's next-token entropy at each output token (Studio's token view colours by it)
    { name: 'token_entropies', data: listData(flattenLists(labels.map((l) => l.token_entropies), (n) => new Float32Array(n))), nullable: false },
    ...[{ name: 'candidate_remaining', data: nestedOf(labels.map((l) => l.candidate_remaining)), nullable: false }],
  );
  await writeParquet(cfg.output, [batchOf(columns)]);
  return { rows: rows.length, positions: labels.reduce((s, l) => s + l.token_q_values.length, 0), candidates: labels.reduce((s, l) => s + l.candidate_ids.reduce((a, c) => a + c.length, 0), 0), output: cfg.output };
}

function nestedOf(values: number[][][]) {
  const { outer, inner } = flattenNested(values, (n) => new Float32Array(n));
  return nestedListData(outer, inner);
}

/** The evaluation at one number of in-context attempts. */
export interface CriticEvalPoint {
  context_attempts: number;
  attempts: number;
  /** AUC of the first output token's Q against the outcome (reward ≥ 0.5 counts as success). */
  auc: number;
  ece: number;
  reliability: ReliabilityBin[];
  /** Mean |E[remaining] − true remaining| over every output token, and the same for predicting the data's mean remaining length. */
  length_mae: number;
  naive_length_mae: number;
}

/** Evaluates the critic on `cfg.data` for 0…max_context in-context attempts. */
export async function runCriticEval(cfg: CriticEvalConfig, events: CriticProgressEvents = {}): Promise<CriticEvalPoint[]> {
  if (!cfg.data) throw new Error('--data is required');
  const bins = criticBins(cfg);
  const rows = await readTrajectories(cfg.data);
  const outcomes = rows.map((r, i) => rowReward(r, i, cfg.data));
  contextsOf(rows, cfg.max_context, cfg.data); // every row has enough attempts for the largest context, checked before any pass
  const encoder = feedbackEncoder(cfg);
  const labeller = openLabeller(cfg, bins, undefined, { minP: 1, maxCandidates: 1 });
  const points: CriticEvalPoint[] = [];
  const truth = rows.flatMap((r) => Array.from({ length: r.output_token_ids.length }, (_, t) => r.output_token_ids.length - 1 - t));
  const meanRemaining = truth.reduce((s, v) => s + v, 0) / Math.max(1, truth.length);
  try {
    for (let c = 0; c <= cfg.max_context; c++) {
      const inputs = await labelInputs(rows, contextsOf(rows, c, cfg.data), encoder);
      const firstQ: number[] = [];
      const predicted: number[] = [];
      for (let i = 0; i < inputs.length; i += cfg.batch_size) {
        const batch = inputs.slice(i, i + cfg.batch_size);
        const est = await labeller.score(
          batch,
          batch.map((x) => x.output.map(() => [])),
        );
        for (const e of est) {
          firstQ.push(e.realised[0]?.q ?? NaN);
          predicted.push(...e.realised.map((r) => r.remaining));
        }
        events.onProgress?.(c * inputs.length + Math.min(i + cfg.batch_size, inputs.length), (cfg.max_context + 1) * inputs.length);
      }
      const scored = firstQ.map((q, i) => ({ q, y: outcomes[i] })).filter((p) => Number.isFinite(p.q));
      points.push({
        context_attempts: c,
        attempts: scored.length,
        auc: auc(scored.map((p) => p.q), scored.map((p) => p.y)),
        ece: expectedCalibrationError(scored.map((p) => p.q), scored.map((p) => p.y), cfg.reliability_bins),
        reliability: reliabilityTable(scored.map((p) => p.q), scored.map((p) => p.y), cfg.reliability_bins),
        length_mae: meanAbsoluteError(predicted, truth),
        naive_length_mae: meanAbsoluteError(truth.map(() => meanRemaining), truth),
      });
    }
  } finally {
    labeller.dispose();
  }
  if (cfg.output) writeAtomic(cfg.output, JSON.stringify({ critic: cfg.critic, data: cfg.data, points }, null, 2) + '\n');
  return points;
}
