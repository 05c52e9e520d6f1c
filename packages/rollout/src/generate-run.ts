/**
 * `lathe generate`: its options (one schema: defaults, flags, YAML keys, the config saved beside the
 * output) and `runGenerate(cfg)` — prompts from JSONL/Parquet, trajectory rows (trajectories.ts) to
 * one Parquet file, written in parts so that a crash loses at most one part and `resume` continues.
 */
import { existsSync, mkdirSync, readdirSync, readFileSync, rmSync, statSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { parse as parseYaml, stringify as toYaml } from 'yaml';
import { readConfig } from '@lathe/models';
import { diffConfigs, parquetInfo, readParquetBatches, readParquetSchema, readRecords, writeAtomic, writeParquet, writeTrajectories, type ConfigOf, type OptionSchema, type SourceRecord } from '@lathe/data';
import { validateSampling } from './sampling';
import { MAX_SAMPLES_PER_MODE, TrajectoryGenerator, type GeneratedTrajectory, type TrajectoryEngine, type TrajectoryProgress, type TrajectoryPrompt } from './trajectories';

/** Every option of `lathe generate`: defaults, flags, YAML keys and the config saved beside the output. */
export const generateSchema = {
  model: { type: 'string', default: '', describe: 'Hugging Face model folder: config.json, *.safetensors and (unless --tokenizer) tokenizer.json + tokenizer_config.json [required]' },
  tokenizer: { type: 'string', default: 'model', describe: "'model' (the model folder's tokenizer files), or a folder holding tokenizer.json and tokenizer_config.json" },
  data: { type: 'string', default: '', describe: 'Prompts: a JSONL(.gz) or Parquet file, one prompt per row; prompt_idx is the 0-based row index [required]' },
  prompt_field: { type: 'string', default: 'auto', describe: "Field holding the prompt text; auto: 'prompt', or 'problem' (MATH) when the first row has no 'prompt'" },
  answer_field: { type: 'string', default: 'answer', describe: "Field holding the reference answer; rows without one are not graded (MATH files without 'answer': 'solution', graded by its last \\boxed{})" },
  limit: { type: 'number', default: 0, integer: true, min: 0, describe: 'Only the first N prompts (0: all)' },
  prompt_format: {
    type: 'string',
    default: 'chat',
    choices: ['chat', 'raw', 'r1_zero'],
    describe: "chat: the prompt as the user turn of the model's chat template, rendered with thinking on and with thinking off (Qwen3's enable_thinking); raw: the text as it is; r1_zero: the R1-Zero template ('…User: {prompt}\\nAssistant: <think>')",
  },
  samples_thinking: { type: 'number', default: 4, integer: true, min: 0, max: MAX_SAMPLES_PER_MODE - 1, describe: 'Samples per prompt with thinking on (chat: enable_thinking=true); with raw and r1_zero, every sample' },
  samples_non_thinking: { type: 'number', default: 4, integer: true, min: 0, max: MAX_SAMPLES_PER_MODE - 1, describe: 'Samples per prompt with thinking off (chat: enable_thinking=false, an empty <think></think> block); must be 0 with raw and r1_zero' },
  max_new_tokens: { type: 'number', default: 1024, integer: true, min: 1, describe: "Generation limit per sample (finish_reason 'length' when reached)" },
  temperature: { type: 'number', default: 1, min: 0, describe: 'Sampling temperature (0: greedy)' },
  top_k: { type: 'number', default: 0, integer: true, min: 0, describe: 'Sample from the k most likely tokens (0: off)' },
  top_p: { type: 'number', default: 1, min: 0, max: 1, describe: 'Nucleus sampling mass, in (0, 1] (1: off). Without a top_k of at most 256 it sorts every score at every step (~2.5× slower a step on a 150k vocabulary); Qwen3 recommends top_k 20 with it' },
  min_p: { type: 'number', default: 0, min: 0, max: 1, describe: 'Drop tokens below min_p × the top probability (0: off)' },
  seed: { type: 'number', default: 0, integer: true, describe: 'Seed: sample j of prompt p in a thinking mode reads noise stream sampleKey(p, mode, j) of it, so samples do not depend on batch size, engine, parts or resume' },
  grader: { type: 'string', default: 'math', choices: ['math', 'none'], describe: "'correct' of rows whose prompt has an answer: the math grader (the answer after </think> extracted and compared symbolically; an unclosed <think> scores 0), or none" },
  output: { type: 'string', default: '', describe: 'Trajectory Parquet file, written atomically once every part is done; beside it <name>.config.yaml (this config) and, while running, <name>.parts/ [required]' },
  shard_prompts: { type: 'number', default: 64, integer: true, min: 1, describe: 'Prompts per part file in <name>.parts/: a crash or Ctrl-C loses at most the part in progress' },
  resume: { type: 'boolean', default: false, describe: 'Continue an interrupted run: keep its complete parts, generate the rest (the config must match the saved one except batch_size and generation_engine)' },
  overwrite: { type: 'boolean', default: false, describe: "Replace an existing output and an earlier run's parts" },
  device: { type: 'string', default: 'cpu', choices: ['cpu', 'cuda'], describe: 'Where to generate (cuda needs the CUDA provider: see `lathe doctor`)' },
  compute_dtype: { type: 'string', default: 'auto', choices: ['auto', 'float32', 'bfloat16', 'float16'], describe: 'Compute dtype (auto: float32 on cpu, bfloat16 on cuda; bfloat16/float16 need --device cuda)' },
  generation_engine: {
    type: 'string',
    default: 'auto',
    choices: ['auto', 'kv-cache', 'graph'],
    describe: 'kv-cache (prefill + bound decode steps over GroupQueryAttention; needs head_dim a multiple of 16 and, on cuda, bfloat16/float16), graph (the in-graph generation loop; any model and dtype), or auto (kv-cache where it runs) [may change on resume]',
  },
  batch_size: { type: 'number', default: 64, integer: true, min: 1, describe: 'Samples per generation run (the KV-cache rows): speed and memory, not the samples [may change on resume]' },
} as const satisfies OptionSchema;

/** A resolved `lathe generate` config. */
export type GenerateConfig = ConfigOf<typeof generateSchema>;

/** Options that may change between a run and its `--resume` (they change speed, not the samples). */
export const GENERATE_RESUMABLE_KEYS: readonly (keyof GenerateConfig)[] = ['resume', 'overwrite', 'batch_size', 'generation_engine'];

/** Callbacks for progress display. */
export interface GenerateEvents {
  onStart?(info: { prompts: number; samples: number; parts: number; partsDone: number; samplesDone: number; engine: TrajectoryEngine; why?: string }): void;
  /** After every generation run: samples done of the whole file (resumed parts included). */
  onProgress?(p: TrajectoryProgress): void;
  onPart?(info: { file: string; index: number; rows: number }): void;
  /** The KV-cache engine ran out of device memory and was rebuilt with fewer rows per run (the samples do not change). */
  onEngineShrink?(from: number, to: number): void;
}

/** What a run returns. */
export interface GenerateResult {
  output: string;
  /** Rows in the output (0 when interrupted before it was written). */
  rows: number;
  prompts: number;
  /** Parts generated by this call, and parts found complete from an earlier run. */
  partsGenerated: number;
  partsResumed: number;
  /** New tokens generated by this call. */
  tokens: number;
  /** Mean `correct` of the graded rows (null when none was graded). */
  correctMean: number | null;
  interrupted: boolean;
}

/** Where a run keeps its files: the output, the config beside it and the parts folder. */
export function generatePaths(output: string): { output: string; config: string; parts: string } {
  const stem = output.endsWith('.parquet') ? output.slice(0, -'.parquet'.length) : output;
  return { output, config: `${stem}.config.yaml`, parts: `${stem}.parts` };
}

const partFile = (parts: string, i: number) => join(parts, `part-${String(i).padStart(5, '0')}.parquet`);
const errCode = (e: unknown) => (e as NodeJS.ErrnoException).code ?? (e as Error).message;

/**
 * The prompts of `cfg.data` (the first `limit`), with errors naming the file, the row, its fields
 * and the flag. A row's answer is optional (an ungraded prompt) unless `answers` is 'required'
 * (`lathe grpo`'s reference answers).
 */
export async function readPromptFile(cfg: Pick<GenerateConfig, 'data' | 'prompt_field' | 'answer_field' | 'limit'>, options: { answers?: 'optional' | 'required' } = {}): Promise<TrajectoryPrompt[]> {
  let records: SourceRecord[];
  try {
    records = await readRecords(cfg.data);
  } catch (e) {
    throw new Error(`--data ${cfg.data}: ${(e as Error).message}`);
  }
  if (cfg.limit > 0) records = records.slice(0, cfg.limit);
  if (records.length === 0) throw new Error(`--data ${cfg.data}: no prompts in the file`);
  const fields = (r: SourceRecord) => Object.keys(r.value).map((k) => `'${k}'`).join(', ') || 'none';
  let field = cfg.prompt_field;
  if (field === 'auto') {
    const first = records[0];
    field = 'prompt' in first.value ? 'prompt' : 'problem' in first.value ? 'problem' : '';
    if (!field) throw new Error(`${first.where}: no 'prompt' or 'problem' field (the row has ${fields(first)}); name the prompt's field with --prompt_field`);
  }
  return records.map((r) => {
    const text = r.value[field];
    if (text === undefined || text === null) throw new Error(`${r.where}: no field '${field}' (the row has ${fields(r)}; see --prompt_field)`);
    if (typeof text !== 'string') throw new Error(`${r.where}: field '${field}' is ${JSON.stringify(text)}, expected the prompt text`);
    if (text.trim() === '') throw new Error(`${r.where}: field '${field}' is empty`);
    const p: TrajectoryPrompt = { prompt_idx: r.index, prompt: text, where: r.where };
    const answer = r.value[cfg.answer_field];
    if (typeof answer === 'string' || typeof answer === 'number') p.answer = String(answer);
    else if (answer !== undefined && answer !== null) throw new Error(`${r.where}: field '${cfg.answer_field}' is ${JSON.stringify(answer)}, expected the answer text (see --answer_field)`);
    else if (options.answers === 'required') throw new Error(`${r.where}: no field '${cfg.answer_field}' (the row has ${fields(r)}; the reference answer: see --answer_field)`);
    return p;
  });
}

/** Checks the config before any file is touched; errors name the flag. */
function checkGenerateConfig(cfg: GenerateConfig): void {
  for (const k of ['model', 'data', 'output'] as const) if (cfg[k] === '') throw new Error(`--${k} is required (see lathe generate --help)`);
  if (!existsSync(join(cfg.model, 'config.json'))) throw new Error(`--model ${cfg.model}: no config.json in that folder (expected a Hugging Face model folder)`);
  const tokDir = cfg.tokenizer === 'model' ? cfg.model : cfg.tokenizer;
  for (const f of ['tokenizer.json', 'tokenizer_config.json']) {
    if (!existsSync(join(tokDir, f))) throw new Error(cfg.tokenizer === 'model' ? `--model ${cfg.model}: no ${f} in that folder (name a tokenizer folder with --tokenizer)` : `--tokenizer ${cfg.tokenizer}: no ${f} in that folder`);
  }
  if (cfg.prompt_format !== 'chat' && cfg.samples_non_thinking > 0) {
    throw new Error(`--samples_non_thinking ${cfg.samples_non_thinking}: --prompt_format ${cfg.prompt_format} has no thinking switch (--samples_thinking counts its samples); set it to 0`);
  }
  if (cfg.samples_thinking + cfg.samples_non_thinking === 0) throw new Error('--samples_thinking and --samples_non_thinking are both 0: nothing to generate');
  if (cfg.device === 'cpu' && (cfg.compute_dtype === 'bfloat16' || cfg.compute_dtype === 'float16')) throw new Error(`--compute_dtype ${cfg.compute_dtype} needs --device cuda (ONNX Runtime's CPU kernels are float32)`);
  const { config } = readConfig(cfg.model);
  try {
    validateSampling({ temperature: cfg.temperature, topK: cfg.top_k, topP: cfg.top_p, minP: cfg.min_p }, config.vocabSize);
  } catch (e) {
    throw new Error(`--${(e as Error).message}`); // validateSampling names the option: "top_p must be in (0, 1], got 0"
  }
  if (existsSync(cfg.output) && statSync(cfg.output).isDirectory()) throw new Error(`--output ${cfg.output} is a folder; name the Parquet file to write`);
}

/**
 * Prepares the output's files: refuses to clobber an earlier run unless `overwrite`, checks a resume
 * against the saved config, and saves this config (which also proves the output's folder writable).
 * Returns whether the output is already complete (a resume of a finished run).
 */
function prepareOutput(cfg: GenerateConfig, paths: ReturnType<typeof generatePaths>): boolean {
  if (cfg.overwrite) {
    for (const p of [paths.output, paths.parts, paths.config]) rmSync(p, { recursive: true, force: true });
  } else if (cfg.resume) {
    if (!existsSync(paths.config)) throw new Error(`--resume: no earlier run of --output ${paths.output} (${paths.config} not found)`);
    const saved = parseYaml(readFileSync(paths.config, 'utf8')) as Record<string, unknown>;
    const relevant = (c: Record<string, unknown>) => Object.fromEntries(Object.entries(c).filter(([k]) => !(GENERATE_RESUMABLE_KEYS as readonly string[]).includes(k)));
    const changed = diffConfigs(relevant(saved), relevant(cfg as unknown as Record<string, unknown>));
    if (changed.length) {
      throw new Error(`--resume: the config differs from the earlier run's (${paths.config}) in ${changed.map((d) => `${d.key}: ${JSON.stringify(d.a)} → ${JSON.stringify(d.b)}`).join(', ')}; use the same values, or --overwrite to start over`);
    }
  } else {
    if (existsSync(paths.output)) throw new Error(`--output ${paths.output} exists: pass --overwrite to replace it (or --resume to finish an interrupted run)`);
    if (existsSync(paths.parts)) throw new Error(`${paths.parts} holds parts of an earlier run of --output ${paths.output}: pass --resume to continue it, or --overwrite to start over`);
  }
  try {
    mkdirSync(dirname(paths.output), { recursive: true });
  } catch (e) {
    throw new Error(`--output ${paths.output}: cannot create its folder ${dirname(paths.output)} (${errCode(e)})`);
  }
  try {
    writeAtomic(paths.config, toYaml(cfg));
  } catch (e) {
    throw new Error(`--output ${paths.output}: cannot write beside it (${paths.config}: ${errCode(e)})`);
  }
  return cfg.resume && existsSync(paths.output) && !existsSync(paths.parts);
}

/** The generation settings stored in the output's footer (what determines the samples, nothing else). */
function footerMetadata(cfg: GenerateConfig, engine: TrajectoryEngine): Record<string, string> {
  const keys = ['model', 'prompt_format', 'samples_thinking', 'samples_non_thinking', 'max_new_tokens', 'temperature', 'top_k', 'top_p', 'min_p', 'seed', 'grader', 'device', 'compute_dtype'] as const;
  return { 'lathe:generate': JSON.stringify({ ...Object.fromEntries(keys.map((k) => [k, cfg[k]])), sample_key: '(prompt_idx*2 + (thinking===false ? 1 : 0))*65536 + sample_idx', engine }) };
}

/**
 * `lathe generate`: reads the prompts, samples each `samples_thinking` + `samples_non_thinking`
 * times, and writes the rows to `cfg.output` — first as one Parquet part per `shard_prompts`
 * prompts in `<name>.parts/` (each written atomically, so a crash loses at most the part in
 * progress), then merged into the output (atomically) and the parts removed. `resume` keeps the
 * complete parts and generates the rest; since every sample's noise is keyed by (seed, prompt,
 * mode, index), the result equals an uninterrupted run's. `signal` stops before the next run; the
 * part in progress is dropped.
 */
export async function runGenerate(cfg: GenerateConfig, events: GenerateEvents = {}, signal?: AbortSignal): Promise<GenerateResult> {
  // 1. Everything checked before a file is touched: flags, the prompt file, every prompt's encoding.
  checkGenerateConfig(cfg);
  const prompts = await readPromptFile(cfg);
  const gen = await createForConfig(cfg, events);
  try {
    const plan = gen.plan(prompts);
    gen.reserve(plan.reduce((m, s) => Math.max(m, s.ids.length), 0)); // KV caches sized once, for the longest prompt

    // 2. The output's files: refuse to clobber, check a resume, save the config.
    const paths = generatePaths(cfg.output);
    const result: GenerateResult = { output: paths.output, rows: 0, prompts: prompts.length, partsGenerated: 0, partsResumed: 0, tokens: 0, correctMean: null, interrupted: false };
    if (prepareOutput(cfg, paths)) return { ...result, rows: (await parquetInfo(paths.output)).rows, correctMean: await correctMean(paths.output) };

    // 3. Parts: the complete ones of an earlier run are kept, the rest generated, each written atomically.
    const perPrompt = cfg.samples_thinking + cfg.samples_non_thinking;
    const shards = Array.from({ length: Math.ceil(prompts.length / cfg.shard_prompts) }, (_, i) => prompts.slice(i * cfg.shard_prompts, (i + 1) * cfg.shard_prompts));
    const done = await completeParts(paths.parts, shards.map((s) => s.length * perPrompt));
    result.partsResumed = done.size;
    let samples = [...done].reduce((n, i) => n + shards[i].length * perPrompt, 0);
    events.onStart?.({ prompts: prompts.length, samples: plan.length, parts: shards.length, partsDone: done.size, samplesDone: samples, engine: gen.engine.engine, why: gen.engine.why });
    // Columns every part writes, even where a part has no value, so that the parts share one schema.
    const columns = ['sample_idx', 'finish_reason', ...(cfg.prompt_format === 'raw' ? [] : ['thinking']), ...(cfg.grader !== 'none' && prompts.some((p) => p.answer !== undefined) ? ['correct'] : [])];
    for (let i = 0; i < shards.length; i++) {
      if (done.has(i)) continue;
      const rows: GeneratedTrajectory[] = [];
      let tokens = 0;
      const onProgress = (p: TrajectoryProgress) => {
        tokens = p.tokens;
        events.onProgress?.({ samples: samples + p.samples, total: plan.length, tokens: result.tokens + p.tokens });
      };
      for await (const row of gen.generate(shards[i], { signal, onProgress })) rows.push(row);
      result.tokens += tokens;
      if (rows.length < shards[i].length * perPrompt) return { ...result, interrupted: true }; // stopped mid-part: the part is dropped
      await writeTrajectories(partFile(paths.parts, i), rows, { columns });
      result.partsGenerated++;
      samples += rows.length;
      events.onPart?.({ file: partFile(paths.parts, i), index: i, rows: rows.length });
      if (signal?.aborted && i < shards.length - 1) return { ...result, interrupted: true };
    }

    // 4. The parts merged into the output (atomically), then removed.
    async function* batches() {
      for (let i = 0; i < shards.length; i++) yield* readParquetBatches(partFile(paths.parts, i));
    }
    result.rows = (await writeParquet(paths.output, batches(), { metadata: footerMetadata(cfg, gen.engine.engine) })).rows;
    result.correctMean = await correctMean(paths.output);
    rmSync(paths.parts, { recursive: true, force: true });
    return result;
  } finally {
    await gen.dispose();
  }
}

/** The generator a config describes; the library's errors are given the flag they concern. */
async function createForConfig(cfg: GenerateConfig, events: GenerateEvents): Promise<TrajectoryGenerator> {
  try {
    return await TrajectoryGenerator.create(cfg.model, {
      format: cfg.prompt_format,
      samplesThinking: cfg.samples_thinking,
      samplesNonThinking: cfg.samples_non_thinking,
      maxNewTokens: cfg.max_new_tokens,
      temperature: cfg.temperature,
      topK: cfg.top_k,
      topP: cfg.top_p,
      minP: cfg.min_p,
      seed: cfg.seed,
      device: cfg.device,
      dtype: cfg.compute_dtype === 'auto' ? undefined : cfg.compute_dtype,
      engine: cfg.generation_engine,
      batchSize: cfg.batch_size,
      onEngineShrink: (from, to) => events.onEngineShrink?.(from, to),
      tokenizer: cfg.tokenizer === 'model' ? undefined : cfg.tokenizer,
      grade: cfg.grader,
    });
  } catch (e) {
    const msg = (e as Error).message;
    const flag = msg.startsWith('the kv-cache engine') ? '--generation_engine kv-cache: ' : msg.startsWith('format chat: ') ? '--prompt_format chat: ' : '';
    throw new Error(flag + msg.replace(/^format chat: /, ''));
  }
}

/**
 * The indices of the complete parts in `parts` (created if missing), given each part's expected
 * row count; temporary files a crash left mid-write are removed. Parts are written atomically, so a
 * part file under its final name is complete — unless it holds the wrong number of rows (an error).
 */
async function completeParts(parts: string, expected: number[]): Promise<Set<number>> {
  mkdirSync(parts, { recursive: true });
  for (const f of readdirSync(parts)) if (f.includes('.tmp-')) rmSync(join(parts, f), { force: true });
  const done = new Set<number>();
  for (const [i, n] of expected.entries()) {
    const file = partFile(parts, i);
    if (!existsSync(file)) continue;
    const rows = (await parquetInfo(file)).rows;
    if (rows !== n) throw new Error(`${file}: ${rows} rows, expected ${n}; remove it, or start over with --overwrite`);
    done.add(i);
  }
  return done;
}

/** Mean of the non-null `correct` values of a trajectory file (null when there is none). */
async function correctMean(file: string): Promise<number | null> {
  if (!(await readParquetSchema(file)).fields.some((f) => f.name === 'correct')) return null;
  let sum = 0;
  let n = 0;
  for await (const b of readParquetBatches(file, { columns: ['correct'] })) {
    const col = b.getChild('correct')!;
    for (let i = 0; i < col.length; i++) {
      const v = col.get(i) as number | null;
      if (v !== null) {
        sum += v;
        n++;
      }
    }
  }
  return n ? sum / n : null;
}
