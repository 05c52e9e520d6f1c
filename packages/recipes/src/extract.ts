/**
 * `lathe extract`, the policy-extraction half of ICL-V:
 * - generate: Q-weighted samples from the reference policy and a critic, with every token's
 *   candidates and Q, to Parquet (and the token-value page);
 * - train: the policy distilled towards π_ref·exp(Q/τ) over labelled candidates (KL in either direction);
 * - rft: the policy fine-tuned on the successful trajectories only (SFT's loss), the baseline;
 * - eval: single-sample accuracy, the critic's best-of-n and majority vote at n = 1, 4, 16.
 */
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { CausalLM } from '@lathe/models';
import { batchOf, flattenLists, flattenNested, listData, nestedListData, readTrajectories, trajectoriesToBatch, writeAtomic, writeParquet, type Trajectory } from '@lathe/data';
import { Device, type HostTensor } from '@lathe/runtime';
import { DEFAULT_JUDGE_PROMPT, extractAnswer, LlmJudge, majorityVote, MathGrader, passAtK, voteKey } from '@lathe/graders';
import { sftLoss } from '@lathe/train';
import { contextPrefix, type CriticAttempt } from '@lathe/critic';
import { extractionLoss, qWeightedSample, QWeightedModels, validateTau, type KlDirection, type QSample } from '@lathe/policy-extraction';
import { splitThinking } from '@lathe/tokenizer';
import { criticBins } from './critic-label';
import { rowReward } from './critic-data';
import { readPromptFile } from './generate';
import { checkComputeDtype, loadRunModel, RunDir, type RunModel, type TrainRunEvents, type TrainRunResult } from './scaffold';
import { trainOnRows, type RowTraining, type StepTimingFields } from './row-train';
import type { StepMetrics } from './sft';
import { candidatePositions, extractionExamples, padExtractionBatch, readLabelledTrajectories, successfulExamples, type ExtractionExample } from './extract-data';
import { EXTRACT_TRAIN_RESUMABLE_KEYS, type ExtractEvalConfig, type ExtractGenerateConfig, type ExtractRftConfig, type ExtractTrainConfig } from './extract-config';
import { padBatch, lossTokenCount } from './sft-data';
import { writeTokenValuePage } from './extract-html';
import type { TrajectoryPrompt } from './trajectories';

// ---------------------------------------------------------------------------------------------
// Shared: models, prompts, grading

/** Progress of a sampling pass. */
export interface ExtractProgressEvents {
  onProgress?(done: number, total: number, tokens: number): void;
}

/** The tokenizer.json of a folder, or undefined when it has none (the built-in character tokenizer). */
/** A folder's tokenizer.json without the critic's grid tokens (ids from `gridFrom`: lathe critic train adds them), for comparison. */
function tokenizerJson(dir: string, gridFrom: number): string | undefined {
  const f = join(dir, 'tokenizer.json');
  if (!existsSync(f)) return undefined;
  const tok = JSON.parse(readFileSync(f, 'utf8')) as { added_tokens?: { id: number }[] };
  return JSON.stringify({ ...tok, added_tokens: tok.added_tokens?.filter((t) => t.id < gridFrom) });
}

/** The policy (with its tokenizer) and the critic on one device, refused when their tokenizers or vocabularies differ. */
async function openModels(cfg: Pick<ExtractGenerateConfig, 'model' | 'critic' | 'bins' | 'tokenizer' | 'prompt_format' | 'enable_thinking' | 'device' | 'compute_dtype' | 'min_p' | 'max_candidates' | 'seed'>) {
  if (!cfg.model) throw new Error('--model is required: the reference policy folder');
  checkComputeDtype(cfg);
  const bins = criticBins(cfg);
  // compared before either is parsed: a critic trained on another tokenizer is refused whatever its size
  const policyTokenizer = cfg.tokenizer === 'model' ? cfg.model : cfg.tokenizer;
  const [a, b] = [tokenizerJson(cfg.critic, bins.first_token_id), tokenizerJson(policyTokenizer, bins.first_token_id)];
  if (a !== undefined && b !== undefined && a !== b) throw new Error(`the critic --critic ${cfg.critic} and the policy --model ${cfg.model} have different tokenizers (${join(cfg.critic, 'tokenizer.json')} differs from ${join(policyTokenizer, 'tokenizer.json')}); a critic scores a policy's tokens only with its own tokenizer`);
  const policy = await loadRunModel({ model: cfg.model, tokenizer: cfg.tokenizer, prompt_format: cfg.prompt_format, enable_thinking: cfg.enable_thinking, run_dir: '', seed: cfg.seed });
  const critic = CausalLM.fromPretrainedSync(cfg.critic);
  const models = QWeightedModels.open({
    device: Device.open(cfg.device),
    reference: { name: `--model ${cfg.model}`, config: policy.config, weights: policy.lm.float32Weights() },
    critic: { name: `--critic ${cfg.critic}`, config: critic.config, weights: critic.float32Weights() },
    bins,
    minP: cfg.min_p,
    maxCandidates: cfg.max_candidates,
    compute: cfg.compute_dtype,
    padId: policy.tokenizer.padId,
  });
  return { policy, models };
}

/** A prompt's ids as the policy reads them: BOS (when the tokenizer has one and the rendering did not add it), then the rendered prompt. */
function promptIds(model: RunModel, text: string): number[] {
  const ids = model.tokenizer.encodePrompt(text);
  const bos = model.tokenizer.bosId;
  return bos === undefined || ids[0] === bos ? ids : [bos, ...ids];
}

/** Token ids that end a sample: the tokenizer's EOS and the model config's. */
function stopIdsOf(model: RunModel): number[] {
  const eos = model.config.eosTokenId;
  return [...new Set([model.tokenizer.eosId, ...(eos === undefined ? [] : Array.isArray(eos) ? eos : [eos])])];
}

/** The grading options every sampling command has. */
type GradingConfig = Pick<ExtractGenerateConfig, 'grader' | 'judge_url' | 'judge_model' | 'judge_prompt'>;

/** Grades responses and gives the answer each one votes for. */
class Grading {
  private math: MathGrader | undefined;
  private readonly judge: LlmJudge | undefined;
  private readonly kind: GradingConfig['grader'];

  constructor(cfg: GradingConfig) {
    this.kind = cfg.grader;
    if (cfg.grader === 'judge') {
      if (!cfg.judge_url || !cfg.judge_model) throw new Error('--grader judge needs --judge_url and --judge_model');
      let promptTemplate = DEFAULT_JUDGE_PROMPT;
      if (cfg.judge_prompt) {
        if (!existsSync(cfg.judge_prompt)) throw new Error(`--judge_prompt ${cfg.judge_prompt}: no such file`);
        promptTemplate = readFileSync(cfg.judge_prompt, 'utf8');
      }
      this.judge = new LlmJudge({ baseUrl: cfg.judge_url, model: cfg.judge_model, promptTemplate });
    }
  }

  /** The response's final part: the text after a closed `<think>` block, null when it never closed. */
  private final(response: string): string | null {
    return splitThinking(response).answer;
  }

  /** 1 or 0, or null when not graded (no answer, or grader none). */
  async grade(response: string, answer: string | undefined, question: string): Promise<number | null> {
    if (this.kind === 'none' || answer === undefined) return null;
    const final = this.final(response);
    if (final === null) return 0;
    if (this.kind === 'exact') return final.trim() === answer.trim() ? 1 : 0;
    if (this.judge) return ((await this.judge.judge({ question, response: final, reference: answer })).score ?? 0) >= 0.5 ? 1 : 0;
    this.math ??= new MathGrader();
    return (await this.math.grade(final, answer)).correct ? 1 : 0;
  }

  /** The answer a response votes for (null: none). */
  answer(response: string): string | null {
    const final = this.final(response);
    if (final === null) return null;
    return this.kind === 'exact' ? final.trim() || null : extractAnswer(final);
  }

  async close(): Promise<void> {
    await this.math?.close();
  }
}

/**
 * What the critic reads before each planned sample: its prompt, then with `context_attempts` n the
 * first n rows of `--context` at its prompt_idx (file order), each with its feedback, as
 * `contextPrefix` lays them out in the critic's training sequences. A prompt with fewer rows, a row
 * whose prompt tokens are not the prompt's, or one without a reward is refused by name.
 */
export async function criticPrefixes(
  cfg: Pick<ExtractGenerateConfig, 'context' | 'context_attempts'>,
  planned: readonly { promptIdx: number; ids: readonly number[] }[],
  encode: (text: string) => number[],
): Promise<number[][]> {
  const n = cfg.context_attempts;
  if (n > 0 && !cfg.context) throw new Error(`--context_attempts ${n} needs --context: a trajectory Parquet of earlier attempts at the same prompts`);
  if (n === 0 && cfg.context) throw new Error(`--context ${cfg.context} is read only with --context_attempts > 0 (how many of a prompt's attempts the critic reads)`);
  if (n === 0) return planned.map((s) => [...s.ids]);
  if (!existsSync(cfg.context)) throw new Error(`--context ${cfg.context}: no such file`);
  const rows = await readTrajectories(cfg.context);
  const where = `--context ${cfg.context}`;
  const ids = new Map(planned.map((s) => [s.promptIdx, s.ids]));
  const byPrompt = new Map<number, CriticAttempt[]>();
  rows.forEach((r, i) => {
    const prompt = ids.get(r.prompt_idx);
    const attempts = byPrompt.get(r.prompt_idx) ?? [];
    if (!prompt || attempts.length >= n) return;
    const own = Array.from(r.prompt_token_ids);
    if (own.length !== prompt.length || own.some((t, k) => t !== prompt[k])) throw new Error(`${where}: row ${i} (prompt_idx ${r.prompt_idx}) has other prompt tokens than --data's prompt ${r.prompt_idx} as the policy renders it (a context file of other prompts, or another tokenizer or --prompt_format)`);
    byPrompt.set(r.prompt_idx, [...attempts, { tokens: Array.from(r.output_token_ids), reward: rowReward(r, i, where) }]);
  });
  for (const p of ids.keys()) {
    const k = byPrompt.get(p)?.length ?? 0;
    if (k < n) throw new Error(`${where}: prompt_idx ${p} has ${k} attempts, fewer than --context_attempts ${n}`);
  }
  return planned.map((s) => contextPrefix(s.ids, byPrompt.get(s.promptIdx)!, encode));
}

/** One sample to draw per (prompt, sample index), its noise stream p·samples + j. */
function plan(model: RunModel, prompts: readonly TrajectoryPrompt[], samples: number) {
  return prompts.flatMap((p, i) => {
    const ids = promptIds(model, p.prompt);
    if (ids.length === 0) throw new Error(`${p.where ?? `prompt ${i}`}: the prompt encodes to no tokens`);
    const idx = p.prompt_idx ?? i;
    return Array.from({ length: samples }, (_, j) => ({ prompt: p, promptIdx: idx, sampleIdx: j, ids, key: idx * samples + j }));
  });
}

// ---------------------------------------------------------------------------------------------
// generate

/** What `lathe extract generate` returns. */
export interface ExtractGenerateResult {
  output: string;
  html: string | null;
  rows: number;
  prompts: number;
  tokens: number;
  /** Mean `correct` of the graded rows (null when none was graded). */
  correctMean: number | null;
}

/** Samples `cfg.data`'s prompts from π_ref·exp(Q/τ) into `cfg.output`. */
export async function runExtractGenerate(cfg: ExtractGenerateConfig, events: ExtractProgressEvents = {}): Promise<ExtractGenerateResult> {
  for (const flag of ['model', 'critic', 'data', 'output'] as const) if (!cfg[flag]) throw new Error(`--${flag} is required`);
  validateTau(cfg.tau, '--tau');
  const prompts = await readPromptFile(cfg);
  const grading = new Grading(cfg);
  const { policy, models } = await openModels(cfg);
  try {
    const planned = plan(policy, prompts, cfg.samples);
    const prefixes = await criticPrefixes(cfg, planned, (t) => policy.tokenizer.encode(t));
    const samples = await qWeightedSample(
      planned.map((s, i) => ({ prompt: s.ids, criticPrefix: prefixes[i], key: s.key })),
      models,
      { tau: cfg.tau, maxTokens: cfg.max_new_tokens, seed: cfg.seed, stopIds: stopIdsOf(policy), batchSize: cfg.batch_size, onStep: (tokens, done, total) => events.onProgress?.(done, total, tokens) },
    );
    const rows: GeneratedRow[] = [];
    for (const [i, s] of planned.entries()) {
      const q = samples[i];
      const response = policy.tokenizer.decode(q.output.filter((t) => t !== policy.tokenizer.eosId));
      rows.push({
        prompt_idx: s.promptIdx,
        prompt: s.prompt.prompt,
        prompt_token_ids: s.ids,
        output_token_ids: q.output,
        correct: await grading.grade(response, s.prompt.answer, s.prompt.prompt),
        sample_idx: s.sampleIdx,
        thinking: cfg.prompt_format === 'chat' ? cfg.enable_thinking : null,
        finish_reason: q.finish_reason,
        candidate_ids: q.candidate_ids,
        candidate_q_values: q.candidate_q_values,
        candidate_ref_logprobs: q.candidate_ref_logprobs,
        token_q_values: q.token_q_values,
        token_remaining: q.token_remaining,
        token_entropies: q.token_entropies,
        candidate_remaining: q.candidate_remaining,
      });
    }
    await writeGenerated(cfg.output, rows);
    const html = cfg.html === 'none' ? null : cfg.html || cfg.output.replace(/\.parquet$/, '') + '.html';
    if (html) writeTokenValuePage(html, { title: `lathe extract generate: ${cfg.data}`, tau: cfg.tau, rows, decode: (id) => policy.tokenizer.decode([id]) });
    const graded = rows.filter((r) => r.correct !== null);
    return { output: cfg.output, html, rows: rows.length, prompts: prompts.length, tokens: rows.reduce((s, r) => s + r.output_token_ids.length, 0), correctMean: graded.length ? graded.reduce((s, r) => s + r.correct!, 0) / graded.length : null };
  } finally {
    models.dispose();
    await grading.close();
  }
}

/** A generated row: the trajectory columns and the critic's estimates beside them. */
type GeneratedRow = Trajectory & { token_q_values: number[]; token_remaining: number[]; token_entropies: number[]; candidate_remaining: number[][] };

/** The trajectory columns plus `token_q_values`, `token_remaining` and `candidate_remaining` (the columns of `lathe critic label`), written atomically. */
async function writeGenerated(file: string, rows: readonly GeneratedRow[]): Promise<void> {
  const base = trajectoriesToBatch(rows, file);
  const columns = base.schema.fields.map((f, k) => ({ name: f.name, data: base.getChildAt(k)!.data[0], nullable: f.nullable }));
  const floats = (n: number) => new Float32Array(n);
  const { outer, inner } = flattenNested(rows.map((r) => r.candidate_remaining), floats);
  columns.push(
    { name: 'token_q_values', data: listData(flattenLists(rows.map((r) => r.token_q_values), floats)), nullable: false },
    { name: 'token_remaining', data: listData(flattenLists(rows.map((r) => r.token_remaining), floats)), nullable: false },
    // the reference policy's next-token entropy at each drawn token (Studio's token view colours by it)
    { name: 'token_entropies', data: listData(flattenLists(rows.map((r) => r.token_entropies), floats)), nullable: false },
    { name: 'candidate_remaining', data: nestedListData(outer, inner), nullable: false },
  );
  await writeParquet(file, [batchOf(columns)]);
}

// ---------------------------------------------------------------------------------------------
// train and rft: one loop, two losses

/** Metrics of one optimizer step (one line of metrics.jsonl): `lathe sft`'s without its packing fields; loss_tokens are candidate positions (train) or response tokens (rft). */
export type ExtractStepMetrics = Omit<StepMetrics, 'examples' | 'pad_tokens' | 'padding_saved'>;

/** An extract step's own metrics (beside the timing fields every step has). */
type ExtractStepFields = Omit<ExtractStepMetrics, keyof StepTimingFields>;

/** Callbacks for progress display. */
export interface ExtractTrainEvents extends TrainRunEvents<ExtractStepMetrics, never> {
  onStart?(info: { startStep: number; totalSteps: number; trajectories: number; skipped: number; dropped: number; parameters: number }): void;
}

type TrainConfig = ExtractTrainConfig | ExtractRftConfig;

/** What differs between train and rft: the loss, and how a batch becomes its inputs. */
interface PolicyObjective<E extends { ids: number[] }> {
  examples: E[];
  skipped: number;
  dropped: number;
  loss: RowTraining<E, ExtractStepFields>['loss'];
  feeds: (batch: readonly E[], padId: number) => Record<string, HostTensor>;
  lossTokens: (batch: readonly E[]) => number;
}

/** Trains in `run` (opened before the model loads: a new run clears its directory, where the built-in model is written). */
async function trainPolicy<E extends { ids: number[] }>(cfg: TrainConfig, run: RunDir, model: RunModel, objective: PolicyObjective<E>, events: ExtractTrainEvents, signal?: AbortSignal): Promise<TrainRunResult<never>> {
  if (objective.examples.length === 0) {
    await run.close();
    throw new Error(`--data ${cfg.data}: no trajectory to train on (${objective.skipped} longer than --max_length ${cfg.max_length}, ${objective.dropped} dropped)`);
  }
  return trainOnRows<E, ExtractStepFields>(cfg, run, {
    config: model.config,
    base: model.lm.float32Weights(),
    padId: model.tokenizer.padId,
    tokenizerFrom: model.tokenizerFrom,
    rows: objective.examples,
    resumableKeys: EXTRACT_TRAIN_RESUMABLE_KEYS,
    loss: objective.loss,
    feeds: objective.feeds,
    lossTokens: objective.lossTokens,
    stepFields: ({ step, result, lossTokens }) => ({ step, loss: result.loss, loss_tokens: lossTokens }),
    describeRows: (first, last) => `trajectories ${first}..${last} of the epoch order`,
    onStart: (info) => events.onStart?.({ ...info, trajectories: objective.examples.length, skipped: objective.skipped, dropped: objective.dropped }),
    onStep: events.onStep,
    onCheckpoint: events.onCheckpoint,
  }, signal);
}

function checkTrainConfig(cfg: TrainConfig): void {
  checkComputeDtype(cfg);
  if (!cfg.data) throw new Error('--data is required');
  if (cfg.batch_size % cfg.micro_batches !== 0) throw new Error(`--batch_size ${cfg.batch_size} is not divisible by --micro_batches ${cfg.micro_batches}`);
  if (cfg.attention === 'flash') throw new Error("--attention flash: the distillation loss attends through composed attention; use --attention composed or auto");
}

/** `lathe extract train`: KL distillation of the policy towards π_ref·exp(Q/τ) over each position's candidates. */
export async function runExtractTrain(cfg: ExtractTrainConfig, events: ExtractTrainEvents = {}, signal?: AbortSignal): Promise<TrainRunResult<never>> {
  checkTrainConfig(cfg);
  validateTau(cfg.tau, '--tau');
  const rows = await readLabelledTrajectories(cfg.data);
  const run = RunDir.open(cfg);
  const model = await loadRunModel({ ...cfg, prompt_format: 'raw', enable_thinking: false });
  const { examples, skipped } = extractionExamples(rows, { maxLength: cfg.max_length, vocabSize: model.config.vocabSize, where: `--data ${cfg.data}` });
  return trainPolicy<ExtractionExample>(
    cfg,
    run,
    model,
    {
      examples,
      skipped,
      dropped: 0,
      loss: (config, o) => extractionLoss(config, { tau: cfg.tau, direction: cfg.kl as KlDirection, candidateMass: cfg.candidate_mass, ...o }),
      feeds: (batch, padId) => padExtractionBatch(batch, padId),
      lossTokens: candidatePositions,
    },
    events,
    signal,
  );
}

/** `lathe extract rft`: SFT's loss on the successful trajectories' outputs. */
export async function runExtractRft(cfg: ExtractRftConfig, events: ExtractTrainEvents = {}, signal?: AbortSignal): Promise<TrainRunResult<never>> {
  checkTrainConfig(cfg);
  if (!existsSync(cfg.data)) throw new Error(`--data ${cfg.data}: no such file`);
  const rows = await readTrajectories(cfg.data);
  const { examples, failed, skipped } = successfulExamples(rows, { threshold: cfg.success_threshold, maxLength: cfg.max_length, where: `--data ${cfg.data}` });
  const run = RunDir.open(cfg);
  const model = await loadRunModel({ ...cfg, prompt_format: 'raw', enable_thinking: false });
  return trainPolicy(
    cfg,
    run,
    model,
    {
      examples,
      skipped,
      dropped: failed,
      loss: (config, o) => sftLoss(config, o),
      feeds: (batch, padId) => padBatch(batch, padId),
      lossTokens: lossTokenCount,
    },
    events,
    signal,
  );
}

// ---------------------------------------------------------------------------------------------
// eval

/** One row of the evaluation table. */
export interface ExtractEvalRow {
  n: number;
  /** Mean accuracy of the first n samples of each prompt, each taken alone. */
  single: number;
  /** The sample with the highest critic Q (after its last token) among the first n. */
  critic_best_of_n: number;
  /** The most frequent answer among the first n. */
  majority_vote: number;
  /** Some sample among the first n is correct. */
  pass_at_n: number;
}

/** What `lathe extract eval` returns. */
export interface ExtractEvalResult {
  prompts: number;
  samples: number;
  table: ExtractEvalRow[];
}

/** The evaluation table from each prompt's samples (correctness, critic score, voted answer), at each n. */
export function evaluationTable(perPrompt: readonly { correct: boolean; score: number; answer: string | null }[][], ns: readonly number[]): ExtractEvalRow[] {
  const mean = (f: (s: readonly { correct: boolean; score: number; answer: string | null }[]) => number) => perPrompt.reduce((a, s) => a + f(s), 0) / Math.max(1, perPrompt.length);
  return ns.map((n) => ({
    n,
    single: mean((s) => s.slice(0, n).filter((x) => x.correct).length / n),
    critic_best_of_n: mean((s) => {
      const best = s.slice(0, n).reduce((b, x) => (x.score > b.score ? x : b));
      return best.correct ? 1 : 0;
    }),
    majority_vote: mean((s) => {
      const vote = majorityVote(s.slice(0, n).map((x) => x.answer));
      if (!vote) return 0;
      const key = voteKey(vote.answer);
      return s.slice(0, n).some((x) => x.answer !== null && voteKey(x.answer) === key && x.correct) ? 1 : 0;
    }),
    pass_at_n: mean((s) => passAtK(s.length, s.filter((x) => x.correct).length, Math.min(n, s.length))),
  }));
}

/** The critic's Q after each sample's last token (the estimate of its outcome having read it all). */
export async function finalQ(models: QWeightedModels, prefixes: readonly number[][], samples: readonly QSample[], batchSize: number): Promise<number[]> {
  const out: number[] = [];
  for (let i = 0; i < samples.length; i += batchSize) {
    const chunk = samples.slice(i, i + batchSize).map((s, k) => ({ prefix: [...prefixes[i + k], ...s.output.slice(0, -1)], last: s.output.slice(-1) }));
    const q = await models.scores(chunk.map((c) => c.prefix), chunk.map((c) => c.last));
    out.push(...q.map((row) => row[0] ?? NaN));
  }
  return out;
}

/** Samples each prompt `cfg.samples` times (the policy alone, or Q-weighted) and tabulates accuracy at n = 1, 4, 16. */
export async function runExtractEval(cfg: ExtractEvalConfig, events: ExtractProgressEvents = {}): Promise<ExtractEvalResult> {
  for (const flag of ['model', 'critic', 'data'] as const) if (!cfg[flag]) throw new Error(`--${flag} is required`);
  if (cfg.grader === 'none') throw new Error('--grader none: the evaluation needs correctness (math or exact)');
  if (cfg.sampler === 'q_weighted') validateTau(cfg.tau, '--tau');
  const prompts = await readPromptFile(cfg, { answers: 'required' });
  const grading = new Grading(cfg);
  const { policy, models } = await openModels(cfg);
  try {
    const planned = plan(policy, prompts, cfg.samples);
    const prefixes = await criticPrefixes(cfg, planned, (t) => policy.tokenizer.encode(t));
    const q = cfg.sampler === 'q_weighted';
    const samples = await qWeightedSample(
      planned.map((s, i) => ({ prompt: s.ids, criticPrefix: prefixes[i], key: s.key })),
      models,
      { tau: q ? cfg.tau : Infinity, score: q, maxTokens: cfg.max_new_tokens, seed: cfg.seed, stopIds: stopIdsOf(policy), batchSize: cfg.batch_size, onStep: (tokens, done, total) => events.onProgress?.(done, total, tokens) },
    );
    const scores = await finalQ(models, prefixes, samples, cfg.batch_size);
    const perPrompt: { correct: boolean; score: number; answer: string | null }[][] = prompts.map(() => []);
    for (const [i, s] of planned.entries()) {
      const response = policy.tokenizer.decode(samples[i].output.filter((t) => t !== policy.tokenizer.eosId));
      perPrompt[prompts.indexOf(s.prompt)].push({ correct: (await grading.grade(response, s.prompt.answer, s.prompt.prompt)) === 1, score: scores[i], answer: grading.answer(response) });
    }
    const result = { prompts: prompts.length, samples: cfg.samples, table: evaluationTable(perPrompt, [1, 4, 16].filter((n) => n <= cfg.samples)) };
    if (cfg.output) writeAtomic(cfg.output, JSON.stringify({ model: cfg.model, critic: cfg.critic, sampler: cfg.sampler, tau: cfg.tau, ...result }, null, 2) + '\n');
    return result;
  } finally {
    models.dispose();
    await grading.close();
  }
}

/** The table as Markdown. */
export function evaluationMarkdown(rows: readonly ExtractEvalRow[]): string {
  const pct = (v: number) => `${(100 * v).toFixed(1)}%`;
  return ['| n | single sample | critic best-of-n | majority vote | pass@n |', '| --- | --- | --- | --- | --- |', ...rows.map((r) => `| ${r.n} | ${pct(r.single)} | ${pct(r.critic_best_of_n)} | ${pct(r.majority_vote)} | ${pct(r.pass_at_n)} |`)].join('\n');
}
