/**
 * `lathe eval`'s run: every problem × sample of the chosen benchmarks through the generation engine
 * (all of them queued, `batch_size` in flight), each completion graded as soon as its run returns
 * (symbolic checks on worker threads while generation continues), the completions and verdicts
 * saved as Parquet in the run directory, and one table — a row per model, a column per benchmark
 * and their average — printed and written as JSON and Markdown. `--regrade` grades saved
 * completions again without a model.
 *
 * - `evaluateBenchmarks(problems, sampler, options)`: the loop over any sampler (e.g. a trainer's
 *   generator over its live weights, every N steps), returning rows and metrics.
 * - `runEval(cfg)`: the command: models from folders, files, summary.
 */
import { existsSync, mkdirSync, readFileSync, readdirSync, rmSync } from 'node:fs';
import { basename, join } from 'node:path';
import { parse as parseYaml, stringify as toYaml } from 'yaml';
import { batchOf, readParquet, scalarData, writeAtomic, writeParquet } from '@lathe/data';
import { MathGrader, type MathGraderOptions } from '@lathe/graders';
import { Device } from '@lathe/runtime';
import { validateSampling, type GenerationEngine } from '@lathe/rollout';
import { BENCHMARKS, loadBenchmark, parseBenchmarkList, type BenchmarkProblem } from './eval-benchmarks';
import { parsePassK, renderEvalTemplate, samplesFor, type EvalConfig } from './eval-config';
import { samplingEngineOptions } from './generate';
import { benchmarkMetrics, type BenchmarkMetrics, type GradedSample } from './eval-metrics';
import { rewardModelSource } from './reward-sources';
import { modelConfig } from './scaffold';
import type { ResolvedDecodeOptions } from './decode-options';
import { finalResponse, TrajectoryGenerator, type TrajectoryEngineRunner, type TrajectoryPrompt } from './trajectories';
import type { ModelWeights } from './model-weights';

// ---------------------------------------------------------------------------------------------
// The loop over any sampler

/** One problem's samples to draw: `text` is the problem under the prompt template (the user turn). */
export interface EvalSampleRequest {
  /** Unique among the requests of one call. */
  key: number;
  problem: BenchmarkProblem;
  text: string;
  samples: number;
}

/** One sampled completion, decoded. */
export interface EvalCompletion {
  key: number;
  sampleIdx: number;
  /** The decoded completion (special tokens dropped). */
  text: string;
  finishReason: 'stop' | 'length';
  outputTokens: number;
  /** The rendered prompt ended inside an open `<think>` (r1-zero): the completion starts in it. */
  opensThink: boolean;
}

/** What generates: every request's samples, yielded in any order as they finish. */
export type EvalSampler = (requests: readonly EvalSampleRequest[], call: { signal?: AbortSignal; onProgress?: (p: { samples: number; total: number; tokens: number }) => void }) => AsyncIterable<EvalCompletion>;

/** One completion with its verdict: a row of `<label>.completions.parquet`. */
export interface EvalRow {
  benchmark: string;
  problem_id: string;
  problem_index: number;
  sample_idx: number;
  problem: string;
  gold: string;
  completion: string;
  /** The extracted final answer; null is "no answer" (counted wrong). */
  extracted: string | null;
  correct: boolean;
  /** How the verdict was reached (`string`, `numeric`, `symbolic`, `different`, `no-answer`, …). */
  reason: string;
  finish_reason: 'stop' | 'length';
  output_tokens: number;
  opens_think: boolean;
  subject: string | null;
  level: number | null;
  rel_tol: number | null;
  /** A reward model's score, when one was given. */
  score: number | null;
}

/** Where one model's wall time went. */
export interface EvalTiming {
  /** From the first request to the last completion. */
  generationS: number;
  /** Waiting for grades after the last completion (grading overlaps generation otherwise). */
  gradingTailS: number;
  /** Scoring with the reward model, after generation. */
  scoringS: number;
  totalS: number;
  tokens: number;
}

/** Options of {@link evaluateBenchmarks}. */
export interface EvaluateOptions {
  /** Samples per problem of a benchmark. */
  samples: (benchmark: string) => number;
  /** Prompt template: a preset name or text with `{problem}`. Default 'qwen-boxed'. */
  template?: string;
  /** The k of pass@k. Default [1]. */
  passK?: readonly number[];
  /** Grader options (tolerances, CAS workers). */
  grader?: Partial<MathGraderOptions>;
  /** Scores every row for best-of-n (a reward model or critic), after generation; same length out. */
  score?: (rows: readonly EvalRow[]) => Promise<ArrayLike<number>>;
  signal?: AbortSignal;
  onProgress?: (p: { samples: number; total: number; tokens: number; graded: number }) => void;
}

/** What {@link evaluateBenchmarks} returns: rows in request order, metrics per benchmark, timing. */
export interface EvaluateResult {
  rows: EvalRow[];
  metrics: Record<string, BenchmarkMetrics>;
  /** Mean avg@n over the benchmarks (the table's Avg column). */
  average: number;
  timing: EvalTiming;
  interrupted: boolean;
}

/**
 * The verdict on one completion: its final part (after `</think>`; none when a `<think>` never
 * closed) extracted and compared with the gold. A completion without an answer is wrong with
 * reason `no-answer`, and one the grader fails on is wrong with reason `grader-error: …`: never an error.
 */
export async function gradeCompletion(grader: MathGrader, c: { text: string; opensThink: boolean }, gold: string, relTol: number | null): Promise<{ extracted: string | null; correct: boolean; reason: string }> {
  const final = finalResponse(c.text, c.opensThink);
  if (final === null || final.trim() === '') return { extracted: null, correct: false, reason: 'no-answer' };
  try {
    const v = await grader.grade(final, gold, 'auto', relTol === null ? {} : { relTol });
    return { extracted: v.extracted, correct: v.correct, reason: v.reason };
  } catch (e) {
    // one completion the grader cannot read is wrong and named in its row, never the end of the run
    return { extracted: null, correct: false, reason: `grader-error: ${(e as Error).message}` };
  }
}

/** A row as the metrics read it. */
export function gradedSample(r: EvalRow): GradedSample {
  return { problemId: r.problem_id, correct: r.correct, extracted: r.extracted, finishReason: r.finish_reason, outputTokens: r.output_tokens, ...(r.subject === null ? {} : { subject: r.subject }), ...(r.level === null ? {} : { level: r.level }), score: r.score };
}

/** Metrics per benchmark (in `order`) and their mean avg@n. */
export function metricsOf(rows: readonly EvalRow[], order: readonly string[], passK: readonly number[]): { metrics: Record<string, BenchmarkMetrics>; average: number } {
  const metrics: Record<string, BenchmarkMetrics> = {};
  for (const b of order) {
    const of = rows.filter((r) => r.benchmark === b);
    if (of.length > 0) metrics[b] = benchmarkMetrics(of.map(gradedSample), passK);
  }
  const avgs = Object.values(metrics).map((m) => m.avgAtN);
  return { metrics, average: avgs.length ? avgs.reduce((s, x) => s + x, 0) / avgs.length : 0 };
}

/**
 * Evaluates `problems` with `sampler`: every problem's samples requested at once, each completion
 * graded as it arrives (grading overlaps generation), then scores (if any) and metrics. This is
 * what a trainer calls every N steps with a sampler over its live weights.
 */
export async function evaluateBenchmarks(problems: readonly BenchmarkProblem[], sampler: EvalSampler, options: EvaluateOptions): Promise<EvaluateResult> {
  const started = performance.now();
  const template = options.template ?? 'qwen-boxed';
  const requests: EvalSampleRequest[] = problems.map((problem, key) => ({ key, problem, text: renderEvalTemplate(template, problem.problem), samples: options.samples(problem.benchmark) }));
  const total = requests.reduce((n, r) => n + r.samples, 0);
  const grader = new MathGrader({ casWorkers: 2, ...options.grader });
  // the CAS worker loads while the first run generates, not when the first symbolic check needs it
  grader.warmUp().catch(() => undefined);
  const slots: (EvalRow | undefined)[] = new Array(total);
  const offsets: number[] = [];
  requests.reduce((at, r) => (offsets.push(at), at + r.samples), 0);
  const grading: Promise<void>[] = [];
  let graded = 0;
  let progress = { samples: 0, total, tokens: 0 };
  let received = 0;
  let tokens = 0;
  try {
    for await (const c of sampler(requests, { signal: options.signal, onProgress: (p) => { progress = p; options.onProgress?.({ ...p, graded }); } })) {
      const req = requests[c.key];
      if (!req || c.sampleIdx < 0 || c.sampleIdx >= req.samples) throw new Error(`internal: completion ${c.key}/${c.sampleIdx} matches no request`);
      received++;
      tokens += c.outputTokens;
      const p = req.problem;
      grading.push(
        gradeCompletion(grader, c, p.answer, p.relTol ?? null).then((v) => {
          slots[offsets[c.key] + c.sampleIdx] = {
            benchmark: p.benchmark,
            problem_id: p.id,
            problem_index: p.index,
            sample_idx: c.sampleIdx,
            problem: p.problem,
            gold: p.answer,
            completion: c.text,
            ...v,
            finish_reason: c.finishReason,
            output_tokens: c.outputTokens,
            opens_think: c.opensThink,
            subject: p.subject ?? null,
            level: p.level ?? null,
            rel_tol: p.relTol ?? null,
            score: null,
          };
          graded++;
        }),
      );
    }
    const generated = performance.now();
    await Promise.all(grading);
    const gradedAt = performance.now();
    options.onProgress?.({ ...progress, graded });
    const timing: EvalTiming = { generationS: (generated - started) / 1000, gradingTailS: (gradedAt - generated) / 1000, scoringS: 0, totalS: 0, tokens };
    if (received < total) return { rows: [], metrics: {}, average: 0, timing: { ...timing, totalS: (performance.now() - started) / 1000 }, interrupted: true };
    const rows = slots as EvalRow[];
    if (options.score) {
      const scores = await options.score(rows);
      if (scores.length !== rows.length) throw new Error(`the scorer returned ${scores.length} scores for ${rows.length} completions`);
      rows.forEach((r, i) => (r.score = scores[i]));
      timing.scoringS = (performance.now() - gradedAt) / 1000;
    }
    const order = [...new Set(problems.map((p) => p.benchmark))];
    timing.totalS = (performance.now() - started) / 1000;
    return { rows, ...metricsOf(rows, order, options.passK ?? [1]), timing, interrupted: false };
  } finally {
    await grader.close();
  }
}

/**
 * A sampler over a {@link TrajectoryGenerator} made with one sample per prompt: each (problem,
 * sample) is its own prompt, keyed `key * 65536 + sample`, so sets with different n share one queue
 * and every sample's noise depends on its key alone (not on batching).
 */
export function trajectorySampler(gen: TrajectoryGenerator, thinking: boolean | null): EvalSampler {
  return async function* (requests, call) {
    const prompts: TrajectoryPrompt[] = requests.flatMap((r) => Array.from({ length: r.samples }, (_, j) => ({ prompt_idx: r.key * 65536 + j, prompt: r.text, where: `${r.problem.where} (${r.problem.benchmark} ${r.problem.id})` })));
    const opens = new Map<string, boolean>();
    const opensThink = (text: string) => {
      let v = opens.get(text);
      if (v === undefined) opens.set(text, (v = /<think>\s*$/.test(gen.render(text, thinking))));
      return v;
    };
    for await (const row of gen.generate(prompts, call)) {
      yield {
        key: Math.floor(row.prompt_idx / 65536),
        sampleIdx: row.prompt_idx % 65536,
        text: gen.tokenizer.decode(row.output_token_ids),
        finishReason: row.finish_reason,
        outputTokens: row.output_token_ids.length,
        opensThink: opensThink(row.prompt),
      };
    }
  };
}

// ---------------------------------------------------------------------------------------------
// The command

/** One model's results. */
export interface EvalModelResult {
  model: string;
  /** Its row name in the table and its files' stem. */
  label: string;
  /** The completions file in the run directory. */
  file: string;
  metrics: Record<string, BenchmarkMetrics>;
  average: number;
  timing: EvalTiming | null;
  engine?: GenerationEngine;
}

/** What `runEval` returns. */
export interface EvalRunResult {
  runDir: string;
  benchmarks: string[];
  models: EvalModelResult[];
  /** The table as text, as printed (Markdown). */
  table: string;
  interrupted: boolean;
}

/** Callbacks for progress display. */
export interface EvalRunEvents {
  onModelStart?(info: {
    model: string;
    label: string;
    problems: number;
    samples: number;
    engine: GenerationEngine;
    why?: string;
    /** The KV-cache engine's decode options as resolved. */
    decode: ResolvedDecodeOptions;
    /** How the model's weights run, loaded (`describeWeights` words it: '' for a dense folder). */
    weights: ModelWeights;
  }): void;
  onProgress?(p: { samples: number; total: number; tokens: number; graded: number }): void;
  onModelDone?(r: EvalModelResult): void;
}

/** Table headings of the benchmarks. */
const TITLES: Record<string, string> = { aime24: 'AIME24', aime25: 'AIME25', amc23: 'AMC23', math500: 'MATH-500', minerva: 'Minerva', olympiadbench: 'OlympiadBench', gsm8k: 'GSM8K' };

/** The model folders of `--model`, and each one's label (its folder name, numbered when two share one). */
export function modelLabels(models: readonly string[]): string[] {
  const names = models.map((m) => basename(m.replace(/\/+$/, '')) || 'model');
  return names.map((n, i) => (names.filter((x) => x === n).length > 1 ? `${n}-${i + 1}` : n));
}

const pct = (x: number) => (100 * x).toFixed(1);

/**
 * The paper table: a row per model, a column per benchmark (avg@n in percent, n in the heading) and
 * their mean, as Markdown (aligned, so it reads in a terminal too).
 */
export function evalTable(models: readonly Pick<EvalModelResult, 'label' | 'metrics' | 'average'>[], benchmarks: readonly string[]): string {
  const ns = benchmarks.map((b) => models.map((m) => m.metrics[b]?.n).find((n) => n !== undefined) ?? 0);
  const head = ['Model', ...benchmarks.map((b, i) => `${TITLES[b] ?? b} (avg@${ns[i]})`), 'Avg'];
  const rows = models.map((m) => [m.label, ...benchmarks.map((b) => (m.metrics[b] ? pct(m.metrics[b].avgAtN) : '-')), pct(m.average)]);
  const widths = head.map((h, c) => Math.max(h.length, ...rows.map((r) => r[c].length)));
  const line = (cells: string[]) => `| ${cells.map((x, c) => (c === 0 ? x.padEnd(widths[c]) : x.padStart(widths[c]))).join(' | ')} |`;
  return [line(head), `| ${widths.map((w, c) => (c === 0 ? '-'.repeat(w) : `${'-'.repeat(w - 1)}:`)).join(' | ')} |`, ...rows.map(line)].join('\n');
}

/** The Markdown summary: the table, then each model's per-benchmark details and the MATH breakdowns. */
function summaryMarkdown(result: Omit<EvalRunResult, 'table' | 'interrupted'>, cfg: EvalConfig): string {
  const out = [`# lathe eval`, '', `Prompt template ${cfg.prompt_template}${cfg.thinking ? ', thinking on' : ', thinking off'}; temperature ${cfg.temperature}, top-p ${cfg.top_p}, max ${cfg.max_new_tokens} new tokens; avg@n accuracy in percent.`, '', evalTable(result.models, result.benchmarks), ''];
  for (const m of result.models) {
    const ks = [...new Set(Object.values(m.metrics).flatMap((x) => Object.keys(x.passAtK)))].sort((a, b) => Number(a) - Number(b));
    const best = Object.values(m.metrics).some((x) => x.bestOfN !== null);
    out.push(`## ${m.label}`, '', `Model: \`${m.model}\``, '');
    out.push(`| benchmark | problems | n | avg@n | ${ks.map((k) => `pass@${k}`).join(' | ')}${ks.length ? ' | ' : ''}maj@n |${best ? ' best-of-n |' : ''} mean tokens | p90 tokens | truncated | no answer |`);
    out.push(`| --- | ---: | ---: | ---: | ${ks.map(() => '---: | ').join('')}---: |${best ? ' ---: |' : ''} ---: | ---: | ---: | ---: |`);
    for (const b of result.benchmarks) {
      const x = m.metrics[b];
      if (!x) continue;
      const passes = ks.map((k) => (x.passAtK[k] === undefined ? '-' : pct(x.passAtK[k])));
      out.push(`| ${TITLES[b] ?? b} | ${x.problems} | ${x.n} | ${pct(x.avgAtN)} | ${passes.join(' | ')}${ks.length ? ' | ' : ''}${pct(x.majAtN)} |${best ? ` ${x.bestOfN === null ? '-' : pct(x.bestOfN)} |` : ''} ${x.length.mean.toFixed(0)} | ${x.length.p90} | ${pct(x.truncationRate)}% | ${pct(x.noAnswerRate)}% |`);
    }
    const math = m.metrics.math500;
    if (math) {
      out.push('', 'MATH-500 by subject and level (sample accuracy, %):', '', '| subject | samples | accuracy |', '| --- | ---: | ---: |');
      for (const [s, c] of Object.entries(math.bySubject).sort()) out.push(`| ${s} | ${c.total} | ${pct(c.accuracy)} |`);
      out.push('', '| level | samples | accuracy |', '| --- | ---: | ---: |');
      for (const [l, c] of Object.entries(math.byLevel).sort()) out.push(`| ${l} | ${c.total} | ${pct(c.accuracy)} |`);
    }
    if (m.timing) out.push('', `Wall time ${m.timing.totalS.toFixed(1)} s: generation ${m.timing.generationS.toFixed(1)} s (${m.timing.tokens} tokens, ${(m.timing.tokens / Math.max(1e-9, m.timing.generationS)).toFixed(0)} tok/s, grading alongside), grading after it ${m.timing.gradingTailS.toFixed(2)} s${m.timing.scoringS ? `, reward-model scoring ${m.timing.scoringS.toFixed(1)} s` : ''}.`);
    out.push('');
  }
  return out.join('\n');
}

/** The JSON summary: the config, and per model its metrics and timing. */
function summaryJson(result: Omit<EvalRunResult, 'table' | 'interrupted'>, cfg: EvalConfig, regraded: boolean): string {
  return JSON.stringify({ benchmarks: result.benchmarks, regraded, config: cfg, models: result.models.map((m) => ({ model: m.model, label: m.label, file: basename(m.file), average: m.average, metrics: m.metrics, timing: m.timing, engine: m.engine })) }, null, 2) + '\n';
}

/** The completions file of a model in a run directory. */
export function completionsFile(runDir: string, label: string): string {
  return join(runDir, `${label}.completions.parquet`);
}

/** Columns of the completions file, in order, with their Arrow kinds. */
const COLUMNS = [
  ['benchmark', 'string'],
  ['problem_id', 'string'],
  ['problem_index', 'int32'],
  ['sample_idx', 'int32'],
  ['problem', 'string'],
  ['gold', 'string'],
  ['completion', 'string'],
  ['extracted', 'string'],
  ['correct', 'bool'],
  ['reason', 'string'],
  ['finish_reason', 'string'],
  ['output_tokens', 'int32'],
  ['opens_think', 'bool'],
  ['subject', 'string'],
  ['level', 'int32'],
  ['rel_tol', 'float32'],
  ['score', 'float32'],
] as const satisfies readonly (readonly [keyof EvalRow, 'string' | 'int32' | 'bool' | 'float32'])[];

/** Writes rows as Parquet (atomically), with the model in the footer. */
export async function writeEvalRows(file: string, rows: readonly EvalRow[], model: string): Promise<void> {
  const batch = batchOf(COLUMNS.map(([name, kind]) => ({ name, data: scalarData(kind, rows.map((r) => r[name])), nullable: true })));
  await writeParquet(file, [batch], { metadata: { 'lathe:eval': JSON.stringify({ model }) } });
}

/** Reads a completions file back; a file that lacks a column is an error naming it. */
export async function readEvalRows(file: string): Promise<EvalRow[]> {
  const t = await readParquet(file);
  const cols = COLUMNS.map(([name]) => {
    const c = t.getChild(name);
    if (!c) throw new Error(`${file}: no column '${name}' (not a lathe eval completions file)`);
    return c;
  });
  return Array.from({ length: t.numRows }, (_, i) => {
    const r = Object.fromEntries(COLUMNS.map(([name], k) => [name, cols[k].get(i) as unknown])) as Record<string, unknown>;
    return r as unknown as EvalRow;
  });
}

/** Checks flags and model folders before anything runs; errors name the flag, the folder or the file. */
function checkEvalConfig(cfg: EvalConfig): { models: string[]; benchmarks: string[]; passK: number[] } {
  const benchmarks = parseBenchmarkList(cfg.benchmarks);
  const passK = parsePassK(cfg.pass_k);
  renderEvalTemplate(cfg.prompt_template, 'x');
  if (cfg.regrade !== '') return { models: [], benchmarks, passK };
  const models = cfg.model.split(',').map((m) => m.trim()).filter((m) => m !== '');
  if (models.length === 0) throw new Error('--model is required (a model folder, or several comma-separated; or --regrade RUN_DIR)');
  if (cfg.device === 'cpu' && (cfg.compute_dtype === 'bfloat16' || cfg.compute_dtype === 'float16')) throw new Error(`--compute_dtype ${cfg.compute_dtype} needs --device cuda (ONNX Runtime's CPU kernels are float32)`);
  for (const m of models) {
    const config = modelConfig(m);
    const tokDir = cfg.tokenizer === 'model' ? m : cfg.tokenizer;
    for (const f of ['tokenizer.json', 'tokenizer_config.json']) {
      if (!existsSync(join(tokDir, f))) throw new Error(cfg.tokenizer === 'model' ? `--model ${m}: no tokenizer (${f} is not in that folder; name a tokenizer folder with --tokenizer)` : `--tokenizer ${cfg.tokenizer}: no ${f} in that folder`);
    }
    try {
      validateSampling({ temperature: cfg.temperature, topK: cfg.top_k, topP: cfg.top_p, minP: cfg.min_p }, config.vocabSize);
    } catch (e) {
      throw new Error(`--${(e as Error).message}`);
    }
  }
  return { models, benchmarks, passK };
}

/** The run directory: a new one, or `--overwrite` of an earlier eval's files. */
function prepareRunDir(cfg: EvalConfig): string {
  const dir = cfg.run_dir || join('runs', `eval-${new Date().toISOString().replace(/[:.]/g, '-').slice(0, 19)}`);
  const earlier = existsSync(dir) && readdirSync(dir).some((f) => f === 'summary.json' || f.endsWith('.completions.parquet'));
  if (earlier && !cfg.overwrite) throw new Error(`--run_dir ${dir} holds an earlier eval: pass --overwrite to replace it, or --regrade ${dir} to grade it again`);
  if (earlier) for (const f of readdirSync(dir)) if (f === 'summary.json' || f === 'summary.md' || f.endsWith('.completions.parquet')) rmSync(join(dir, f));
  mkdirSync(dir, { recursive: true });
  writeAtomic(join(dir, 'config.yaml'), toYaml(cfg));
  return dir;
}

/** The grader options of a config. */
function graderOptions(cfg: EvalConfig): Partial<MathGraderOptions> {
  return { casWorkers: cfg.grade_workers, roundedTolerance: cfg.rounded_tolerance };
}

/** A reward model's scores of every row (prompt: the problem text), in batches on the eval's device. */
async function rewardScorer(cfg: EvalConfig, run_dir: string): Promise<(rows: readonly EvalRow[]) => Promise<Float32Array>> {
  const saved = join(cfg.reward_model, 'config.yaml');
  const trained = existsSync(saved) ? ((parseYaml(readFileSync(saved, 'utf8')) ?? {}) as { prompt_format?: 'raw' | 'chat'; enable_thinking?: boolean }) : {};
  return async (rows) => {
    const device = Device.open(cfg.device);
    const source = await rewardModelSource<null>(cfg.reward_model, {
      device,
      dtype: cfg.device === 'cuda' ? 'bfloat16' : 'float32',
      policy: {},
      run_dir,
      seed: cfg.seed,
      prompt_format: trained.prompt_format ?? 'raw',
      enable_thinking: trained.enable_thinking ?? false,
    });
    try {
      const out = new Float32Array(rows.length);
      const BATCH = 16;
      for (let i = 0; i < rows.length; i += BATCH) {
        const part = rows.slice(i, i + BATCH);
        out.set(Array.from(await source.scoreBatch(part.map((r) => ({ prompt: r.problem, completion: r.completion, meta: null })))), i);
      }
      return out;
    } finally {
      source.dispose();
    }
  };
}

/**
 * `lathe eval`: each model of `--model` over every chosen benchmark, then one table. Each model's
 * completions are written (atomically) as soon as its grades are in; the summary when all are done.
 * `signal` stops generation before its next run; no file of an unfinished model is written.
 * `options.standInEngine` replaces the engine (tests: no weights read or compiled).
 */
export async function runEval(cfg: EvalConfig, events: EvalRunEvents = {}, signal?: AbortSignal, options: { standInEngine?: TrajectoryEngineRunner } = {}): Promise<EvalRunResult> {
  const { models, benchmarks, passK } = checkEvalConfig(cfg);
  if (cfg.regrade !== '') return regrade(cfg);
  const problems: BenchmarkProblem[] = [];
  for (const b of benchmarks) problems.push(...(await loadBenchmark(b, { dir: cfg.data_dir, limit: cfg.limit })));
  const runDir = prepareRunDir(cfg);
  const labels = modelLabels(models);
  const results: EvalModelResult[] = [];
  const preset = cfg.raw_template ? 'raw' : cfg.prompt_template === 'r1-zero' ? 'r1_zero' : 'chat';
  const thinking = preset === 'chat' ? cfg.thinking : preset === 'r1_zero' ? true : null;
  const samples = problems.reduce((n, p) => n + samplesFor(p.benchmark, cfg), 0);
  for (const [i, model] of models.entries()) {
    let gen: TrajectoryGenerator;
    try {
      gen = await TrajectoryGenerator.create(model, {
        format: preset,
        samplesThinking: thinking === false ? 0 : 1,
        samplesNonThinking: thinking === false ? 1 : 0,
        ...samplingEngineOptions(cfg),
        // a decode step computes all of the engine's rows: never more than there are samples
        batchSize: Math.min(cfg.batch_size, samples),
        tokenizer: cfg.tokenizer === 'model' ? undefined : cfg.tokenizer,
        grade: 'none',
        ...(options.standInEngine ? { standInEngine: options.standInEngine } : {}),
      });
    } catch (e) {
      const msg = (e as Error).message.replace(/^format chat: /, '');
      throw new Error(`--model ${model}: ${msg}${/chat_template/.test(msg) ? ' (use --raw_template with a template of your own, or --prompt_template r1-zero)' : ''}`);
    }
    try {
      // the weights on the device before the start line, which reports how they run
      const weights = await gen.load();
      events.onModelStart?.({ model, label: labels[i], problems: problems.length, samples, engine: gen.engine.engine, why: gen.engine.why, decode: gen.decode, weights });
      const r = await evaluateBenchmarks(problems, trajectorySampler(gen, thinking), {
        samples: (b) => samplesFor(b, cfg),
        template: cfg.prompt_template,
        passK,
        grader: graderOptions(cfg),
        ...(cfg.reward_model ? { score: await rewardScorer(cfg, runDir) } : {}),
        signal,
        onProgress: (p) => events.onProgress?.(p),
      });
      if (r.interrupted) return { runDir, benchmarks, models: results, table: evalTable(results, benchmarks), interrupted: true };
      const file = completionsFile(runDir, labels[i]);
      await writeEvalRows(file, r.rows, model);
      const done: EvalModelResult = { model, label: labels[i], file, metrics: r.metrics, average: r.average, timing: r.timing, engine: gen.engine.engine };
      results.push(done);
      events.onModelDone?.(done);
    } finally {
      await gen.dispose();
    }
  }
  const result = { runDir, benchmarks, models: results };
  writeAtomic(join(runDir, 'summary.json'), summaryJson(result, cfg, false));
  writeAtomic(join(runDir, 'summary.md'), summaryMarkdown(result, cfg));
  return { ...result, table: evalTable(results, benchmarks), interrupted: false };
}

/**
 * `--regrade DIR`: the saved completions of an earlier eval graded again (this grader, this call's
 * `--rounded_tolerance` and `--grade_workers`), the summary rewritten. Everything else — models,
 * benchmarks, prompts, `--pass_k` — is the saved run's, so the same grader reproduces its table.
 */
async function regrade(cfg: EvalConfig): Promise<EvalRunResult> {
  const dir = cfg.regrade;
  const savedFile = join(dir, 'config.yaml');
  if (!existsSync(savedFile)) throw new Error(`--regrade ${dir}: no config.yaml (not a lathe eval run directory)`);
  const saved = parseYaml(readFileSync(savedFile, 'utf8')) as EvalConfig;
  const models = saved.model.split(',').map((m) => m.trim()).filter((m) => m !== '');
  const labels = modelLabels(models);
  const benchmarks = parseBenchmarkList(saved.benchmarks);
  const passK = parsePassK(saved.pass_k);
  const grader = new MathGrader({ casWorkers: 2, ...graderOptions(cfg) });
  const results: EvalModelResult[] = [];
  try {
    for (const [i, model] of models.entries()) {
      const file = completionsFile(dir, labels[i]);
      if (!existsSync(file)) throw new Error(`--regrade ${dir}: no ${basename(file)} for model ${model} (the run did not finish it)`);
      const rows = await readEvalRows(file);
      await Promise.all(
        rows.map(async (r) => {
          Object.assign(r, await gradeCompletion(grader, { text: r.completion, opensThink: r.opens_think }, r.gold, r.rel_tol));
        }),
      );
      await writeEvalRows(file, rows, model);
      results.push({ model, label: labels[i], file, ...metricsOf(rows, benchmarks.filter((b) => BENCHMARKS.includes(b)), passK), timing: null });
    }
  } finally {
    await grader.close();
  }
  const result = { runDir: dir, benchmarks, models: results };
  const cfgOut = { ...saved, rounded_tolerance: cfg.rounded_tolerance };
  writeAtomic(join(dir, 'summary.json'), summaryJson(result, cfgOut, true));
  writeAtomic(join(dir, 'summary.md'), summaryMarkdown(result, cfgOut));
  return { ...result, table: evalTable(results, benchmarks), interrupted: false };
}
