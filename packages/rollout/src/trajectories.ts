/**
 * Trajectories from prompts, in the trajectory schema (DESIGN.md): each prompt is rendered (the
 * model's chat template with thinking on and with thinking off, as the ICL-V data generator samples
 * it; the text as it is; or the R1-Zero template), tokenised once, sampled with the KV-cache
 * generator where it runs (else the in-graph generator), and graded when it has a reference answer.
 * Token ids are kept exactly as rendered and generated, never re-tokenised.
 *
 * - `generate(model, prompts, options)`: the rows of a list of prompts, for TypeScript users.
 * - `TrajectoryGenerator`: the same, holding the compiled engine across calls.
 * - `runGenerate(cfg)`: `lathe generate` — prompts from JSONL/Parquet, rows to one Parquet file,
 *   written in parts so that a crash loses at most one part and `resume` continues.
 *
 * Reproducibility: sample j of prompt p in thinking mode m draws its sampling noise from stream
 * `sampleKey(p, m, j)` of `seed` (see rng.ts), so a sample depends on the seed, the model, its
 * prompt and its key alone — not on the batch size, the engine, part boundaries, a resume, or how
 * many samples are asked for.
 */
import { existsSync, mkdirSync, readdirSync, readFileSync, rmSync, statSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { parse as parseYaml, stringify as toYaml } from 'yaml';
import type { DType } from '@lathe/onnx';
import { readConfig, type DecoderConfig } from '@lathe/models';
import { Device, type DeviceKind, type DeviceTensor } from '@lathe/runtime';
import { HfTokenizer, splitThinking } from '@lathe/tokenizer';
import { MathGrader } from '@lathe/graders';
import { diffConfigs, parquetInfo, readParquetBatches, readParquetSchema, readRecords, writeAtomic, writeParquet, writeTrajectories, type ConfigOf, type OptionSchema, type SourceRecord, type Trajectory } from '@lathe/data';
import { Generator, type Completion, type GenerateCallOptions } from './generator';
import { KvCacheGenerator, kvCacheUnsupported, uploadWeights } from './kv-cache-generator';
import { validateSampling, type SamplingOptions } from './sampling';

// ---------------------------------------------------------------------------------------------
// Prompts, rows and options

/** How a prompt becomes the model's input text. */
export type PromptFormat = 'chat' | 'raw' | 'r1_zero';

/** The R1-Zero prompt (DeepSeek-R1-Zero, as used for MATH): the response continues inside `<think>`. */
export const R1_ZERO_TEMPLATE =
  'A conversation between User and Assistant. The User asks a question, and the Assistant solves it. The Assistant first thinks about the reasoning process in the mind and then provides the User with the answer. ' +
  'The reasoning process is enclosed within <think> </think> and answer is enclosed within <answer> </answer> tags, respectively, i.e., <think> reasoning process here </think> <answer> answer here </answer>.\nUser: {question}\nAssistant: <think>';

/** One prompt to sample. */
export interface TrajectoryPrompt {
  /** Index of the prompt in its dataset (default: its position in the list); part of every sample's key. */
  prompt_idx?: number;
  /** The prompt text, before any template. */
  prompt: string;
  /** Reference answer: when present, each sample is graded into `correct`. */
  answer?: string;
  /** Where the prompt came from, for error messages (e.g. `math.jsonl:7`). */
  where?: string;
}

/** One generated row: the DESIGN.md trajectory columns plus the generation columns. */
export interface GeneratedTrajectory extends Trajectory {
  prompt_idx: number;
  /** The prompt text as given (the rendered template is in `prompt_token_ids`). */
  prompt: string;
  /** The rendered prompt's ids, exactly as the model read them. */
  prompt_token_ids: number[];
  /** The sampled ids, exactly as generated (the stop token included when one ended the sample). */
  output_token_ids: number[];
  /** 1 or 0 from the grader; null when the prompt has no answer (or grading is off). */
  correct: number | null;
  /** Thinking on or off (chat); true for r1_zero (its prompt opens `<think>`); null for raw. */
  thinking: boolean | null;
  /** Index among the prompt's samples of the same thinking mode. */
  sample_idx: number;
  finish_reason: 'stop' | 'length';
}

/** A grader: the decoded response (special tokens dropped) → a score in 0–1, or null for "not graded". */
export type TrajectoryGrader = (response: string, prompt: TrajectoryPrompt, sample: { thinking: boolean | null }) => number | null | Promise<number | null>;

/** The generation backends: the KV-cache generator, or the in-graph generation loop. */
export type TrajectoryEngine = 'kv-cache' | 'graph';

/** Options of {@link generate} and {@link TrajectoryGenerator}. */
export interface TrajectoryOptions extends SamplingOptions {
  /** Generation limit per sample. */
  maxNewTokens: number;
  /** Default 'chat'. */
  format?: PromptFormat;
  /** Samples per prompt with thinking on (chat), or every sample (raw, r1_zero). Default 1. */
  samplesThinking?: number;
  /** Samples per prompt with thinking off (chat only). Default 1 with chat, else 0. */
  samplesNonThinking?: number;
  /** Default 0. */
  seed?: number;
  /** Default 'cpu'. */
  device?: DeviceKind;
  /** Compute dtype. Default float32 on CPU, bfloat16 on CUDA. */
  dtype?: 'float32' | 'bfloat16' | 'float16';
  /** 'auto' (default): the KV-cache generator where {@link kvCacheUnsupported} allows, else the graph. */
  engine?: 'auto' | TrajectoryEngine;
  /** Samples per generation run (the KV-cache engine's rows). Changes speed and memory, not samples. Default 64. */
  batchSize?: number;
  /** Folder with tokenizer.json and tokenizer_config.json. Default: the model folder. */
  tokenizer?: string;
  /** How rows are graded: 'math' (default: the math grader, for prompts with an answer), 'none', or a function. */
  grade?: 'math' | 'none' | TrajectoryGrader;
}

/** Progress of a generation call, after each run. */
export interface TrajectoryProgress {
  samples: number;
  total: number;
  /** New tokens generated so far. */
  tokens: number;
}

// ---------------------------------------------------------------------------------------------
// Keys and engine choice

/** Samples per prompt and mode are below this, so keys of different (prompt, mode) never meet. */
export const MAX_SAMPLES_PER_MODE = 65536;

/**
 * The random-stream key of sample `sampleIdx` of prompt `promptIdx` in a thinking mode: distinct
 * for every (prompt, mode, sample), and independent of how many samples are asked for.
 */
export function sampleKey(promptIdx: number, thinking: boolean | null, sampleIdx: number): number {
  return (promptIdx * 2 + (thinking === false ? 1 : 0)) * MAX_SAMPLES_PER_MODE + sampleIdx;
}


/**
 * The part of a response the math grader reads: the text after its reasoning (`</think>`), or null
 * when a `<think>` block never closed (the sample was cut off while thinking: no final answer).
 * `promptOpensThink`: the prompt ended inside `<think>` (r1_zero), so the response starts in it.
 */
export function finalResponse(response: string, promptOpensThink: boolean): string | null {
  return splitThinking(promptOpensThink ? `<think>${response}` : response).answer;
}

/** The engine for a request: `requested`, or with 'auto' the KV-cache generator unless it cannot run (then why). */
export function chooseEngine(config: Pick<DecoderConfig, 'headDim'>, device: DeviceKind, dtype: DType, requested: 'auto' | TrajectoryEngine): { engine: TrajectoryEngine; why?: string } {
  const why = kvCacheUnsupported(config, device, dtype);
  if (requested === 'kv-cache' && why) throw new Error(`the kv-cache engine cannot run here: ${why}`);
  if (requested === 'graph') return { engine: 'graph' };
  return why ? { engine: 'graph', why } : { engine: 'kv-cache' };
}

/** What both engines offer (the KV-cache one sized on demand). */
interface Engine {
  generate(prompts: number[][], call: GenerateCallOptions): Promise<Completion[]>;
  dispose(): Promise<void>;
}

/** Cache lengths are rounded up to this many positions, so a slightly longer prompt rarely rebuilds the engine. */
const LENGTH_QUANTUM = 64;

/** The KV-cache generator over weights uploaded once, rebuilt (larger) only when a prompt needs a longer cache. */
function kvEngine(dir: string, config: DecoderConfig, o: { kind: DeviceKind; dtype: DType; rows: number; sampling: SamplingOptions; padId: number; maxLength: number }): Engine {
  const device = Device.open(o.kind);
  const weights: Map<string, DeviceTensor> = uploadWeights(device, dir, config, o.dtype);
  let built: { gen: KvCacheGenerator; maxLength: number } | undefined;
  const lengthFor = (n: number) => Math.min(config.maxPositionEmbeddings, Math.ceil(n / LENGTH_QUANTUM) * LENGTH_QUANTUM);
  return {
    generate: async (prompts, call) => {
      const need = lengthFor(prompts.reduce((m, p) => Math.max(m, p.length + call.maxNewTokens), o.maxLength));
      if (!built || built.maxLength < need) {
        built?.gen.dispose();
        built = { gen: KvCacheGenerator.create(device, config, weights, { ...o.sampling, groupSize: 1, rows: o.rows, maxLength: need, dtype: o.dtype, padTokenId: o.padId }), maxLength: need };
      }
      return built.gen.generate(prompts, call);
    },
    dispose: async () => {
      built?.gen.dispose();
      for (const t of weights.values()) t.dispose();
    },
  };
}

// ---------------------------------------------------------------------------------------------
// The generator

/** One sample to draw: its prompt, mode, index, ids and key. */
export interface PlannedSample {
  prompt: TrajectoryPrompt & { prompt_idx: number };
  thinking: boolean | null;
  sampleIdx: number;
  ids: number[];
  key: number;
  /** The rendered prompt ends inside an open `<think>` block (r1_zero, some chat templates). */
  opensThink: boolean;
}

/**
 * Renders, samples and grades trajectories for one model and one set of options. The tokenizer
 * and model config load at `create`; the engine compiles on the first `generate` (so `plan` can
 * check every prompt before any heavy work). Call `dispose()` when done.
 */
export class TrajectoryGenerator {
  /** The engine in use and, when 'auto' fell back to the graph, why. */
  readonly engine: { engine: TrajectoryEngine; why?: string };
  private running: Engine | undefined;
  private grader: MathGrader | undefined;
  private readonly stopIds: number[];
  private readonly modes: { thinking: boolean | null; samples: number }[];
  /** The longest prompt (tokens) the KV caches are sized for. */
  private promptTokens = 0;

  private constructor(
    readonly dir: string,
    readonly config: DecoderConfig,
    /** The tokenizer, e.g. to decode `output_token_ids`. */
    readonly tokenizer: HfTokenizer,
    private readonly o: Required<Omit<TrajectoryOptions, 'tokenizer' | keyof SamplingOptions>> & { sampling: SamplingOptions },
  ) {
    this.engine = chooseEngine(config, o.device, o.dtype, o.engine);
    const eos = config.eosTokenId;
    this.stopIds = [...new Set([tokenizer.eosId, ...(eos === undefined ? [] : Array.isArray(eos) ? eos : [eos])])];
    this.modes =
      o.format === 'chat'
        ? [
            { thinking: true, samples: o.samplesThinking },
            { thinking: false, samples: o.samplesNonThinking },
          ]
        : [{ thinking: o.format === 'r1_zero' ? true : null, samples: o.samplesThinking }];
  }

  /** Loads the model's config and tokenizer and checks the options (errors name the option). */
  static async create(model: string, options: TrajectoryOptions): Promise<TrajectoryGenerator> {
    if (!existsSync(join(model, 'config.json'))) throw new Error(`model folder ${model}: no config.json (expected a Hugging Face model folder)`);
    const { config } = readConfig(model);
    const format = options.format ?? 'chat';
    const device = options.device ?? 'cpu';
    const o = {
      format,
      samplesThinking: options.samplesThinking ?? 1,
      samplesNonThinking: options.samplesNonThinking ?? (format === 'chat' ? 1 : 0),
      maxNewTokens: options.maxNewTokens,
      seed: options.seed ?? 0,
      device,
      dtype: options.dtype ?? (device === 'cuda' ? 'bfloat16' : 'float32'),
      engine: options.engine ?? 'auto',
      batchSize: options.batchSize ?? 64,
      grade: options.grade ?? 'math',
      sampling: { temperature: options.temperature, topK: options.topK, topP: options.topP, minP: options.minP },
    } as const;
    const count = (name: string, v: number) => {
      if (!Number.isInteger(v) || v < 0 || v >= MAX_SAMPLES_PER_MODE) throw new Error(`${name} must be an integer in [0, ${MAX_SAMPLES_PER_MODE}), got ${v}`);
    };
    count('samplesThinking', o.samplesThinking);
    count('samplesNonThinking', o.samplesNonThinking);
    if (format !== 'chat' && o.samplesNonThinking > 0) throw new Error(`samplesNonThinking must be 0 with format ${format}: it has no thinking switch (samplesThinking counts its samples)`);
    if (o.samplesThinking + o.samplesNonThinking === 0) throw new Error('samplesThinking + samplesNonThinking is 0: nothing to sample');
    if (!Number.isInteger(o.maxNewTokens) || o.maxNewTokens < 1) throw new Error(`maxNewTokens must be a positive integer, got ${o.maxNewTokens}`);
    if (!Number.isInteger(o.batchSize) || o.batchSize < 1) throw new Error(`batchSize must be a positive integer, got ${o.batchSize}`);
    if (!Number.isSafeInteger(o.seed)) throw new Error(`seed must be an integer, got ${o.seed}`);
    if (device === 'cpu' && o.dtype !== 'float32') throw new Error(`dtype ${o.dtype} needs device cuda (ONNX Runtime's CPU kernels are float32)`);
    validateSampling(o.sampling, config.vocabSize);
    const tokDir = options.tokenizer ?? model;
    const tokenizer = await HfTokenizer.fromFolder(tokDir);
    if (tokenizer.vocabSize > config.vocabSize) throw new Error(`tokenizer ${tokDir}: ${tokenizer.vocabSize} ids, but the model's vocab_size is ${config.vocabSize}`);
    if (format === 'chat') {
      if (!tokenizer.hasChatTemplate) throw new Error(`format chat: ${join(tokenizer.dir, 'tokenizer_config.json')} has no chat_template`);
      const probe = (enableThinking: boolean) => tokenizer.applyChatTemplate([{ role: 'user', content: 'x' }], { addGenerationPrompt: true, enableThinking });
      if (o.samplesThinking > 0 && o.samplesNonThinking > 0 && probe(true) === probe(false)) {
        throw new Error(`format chat: ${tokenizer.dir}'s chat template ignores enable_thinking, so thinking and non-thinking samples would be the same prompt; sample one mode only (samplesNonThinking 0)`);
      }
    }
    return new TrajectoryGenerator(model, config, tokenizer, o);
  }

  /**
   * Sizes the KV caches for prompts of up to `promptTokens` tokens (call before the first
   * `generate`, e.g. with the longest of {@link plan}); a longer prompt later rebuilds the engine.
   */
  reserve(promptTokens: number): void {
    this.promptTokens = Math.max(this.promptTokens, promptTokens);
  }

  /** The model's input text for a prompt in a thinking mode. */
  render(prompt: string, thinking: boolean | null): string {
    if (this.o.format === 'raw') return prompt;
    if (this.o.format === 'r1_zero') return R1_ZERO_TEMPLATE.split('{question}').join(prompt);
    return this.tokenizer.applyChatTemplate([{ role: 'user', content: prompt }], { addGenerationPrompt: true, enableThinking: thinking ?? undefined });
  }

  /** The prompt's ids in a thinking mode: the rendered text's, after BOS when the tokenizer has one and the template did not add it. */
  encode(prompt: string, thinking: boolean | null): number[] {
    return this.idsOf(this.render(prompt, thinking));
  }

  private idsOf(rendered: string): number[] {
    const ids = this.tokenizer.encode(rendered);
    const bos = this.tokenizer.bosId;
    return bos === undefined || ids[0] === bos ? ids : [bos, ...ids];
  }

  /**
   * Every sample of `prompts`, in output order (prompt, then thinking samples, then non-thinking),
   * each prompt checked and encoded: errors name the prompt (its `where` or `prompt_idx`).
   */
  plan(prompts: readonly (string | TrajectoryPrompt)[]): PlannedSample[] {
    const seen = new Set<number>();
    const out: PlannedSample[] = [];
    prompts.forEach((given, i) => {
      const p = typeof given === 'string' ? { prompt: given } : given;
      const idx = p.prompt_idx ?? i;
      const where = p.where ?? `prompt_idx ${idx}`;
      if (!Number.isSafeInteger(idx) || idx < 0 || idx >= 2 ** 36) throw new Error(`${where}: prompt_idx must be an integer in [0, 2^36), got ${idx}`);
      if (seen.has(idx)) throw new Error(`${where}: prompt_idx ${idx} appears twice (each prompt's samples are keyed by it)`);
      seen.add(idx);
      if (typeof p.prompt !== 'string' || p.prompt.trim() === '') throw new Error(`${where}: the prompt is empty`);
      const prompt = { ...p, prompt_idx: idx };
      for (const mode of this.modes) {
        if (mode.samples === 0) continue;
        const rendered = this.render(p.prompt, mode.thinking);
        const ids = this.idsOf(rendered);
        const limit = this.config.maxPositionEmbeddings;
        if (ids.length + this.o.maxNewTokens > limit) {
          throw new Error(`${where}: the prompt has ${ids.length} tokens${mode.thinking === null ? '' : ` (thinking ${mode.thinking ? 'on' : 'off'})`}; with max_new_tokens ${this.o.maxNewTokens} that exceeds the model's ${limit} positions`);
        }
        const opensThink = /<think>\s*$/.test(rendered);
        for (let j = 0; j < mode.samples; j++) out.push({ prompt, thinking: mode.thinking, sampleIdx: j, ids, key: sampleKey(idx, mode.thinking, j), opensThink });
      }
    });
    return out;
  }

  /**
   * Samples and grades every sample of `prompts`, yielding rows in output order as each run of
   * `batchSize` samples finishes. With `signal` aborted it stops before the next run.
   */
  async *generate(prompts: readonly (string | TrajectoryPrompt)[], call: { onProgress?: (p: TrajectoryProgress) => void; signal?: AbortSignal } = {}): AsyncGenerator<GeneratedTrajectory> {
    const samples = this.plan(prompts);
    const engine = await this.engineFor(samples);
    let tokens = 0;
    for (let start = 0; start < samples.length; start += this.o.batchSize) {
      if (call.signal?.aborted) return;
      const chunk = samples.slice(start, start + this.o.batchSize);
      const completions = await engine.generate(
        chunk.map((s) => s.ids),
        { maxNewTokens: this.o.maxNewTokens, seed: this.o.seed, stopIds: this.stopIds, promptKeys: chunk.map((s) => s.key) },
      );
      // both engines return completions sorted by prompt index: completions[i] is chunk[i]'s
      const rows = await Promise.all(chunk.map((s, i) => this.row(s, completions[i])));
      tokens += rows.reduce((n, r) => n + r.output_token_ids.length, 0);
      call.onProgress?.({ samples: start + chunk.length, total: samples.length, tokens });
      yield* rows;
    }
  }

  /** Releases the engine and the grader's workers. */
  async dispose(): Promise<void> {
    await this.running?.dispose();
    this.running = undefined;
    await this.grader?.close();
    this.grader = undefined;
  }

  private async row(s: PlannedSample, c: Completion): Promise<GeneratedTrajectory> {
    return {
      prompt_idx: s.prompt.prompt_idx,
      prompt: s.prompt.prompt,
      prompt_token_ids: [...s.ids],
      output_token_ids: c.tokens,
      correct: await this.gradeOne(s, c.tokens),
      thinking: s.thinking,
      sample_idx: s.sampleIdx,
      finish_reason: c.finishReason,
    };
  }

  private async gradeOne(s: PlannedSample, tokens: number[]): Promise<number | null> {
    const grade = this.o.grade;
    if (grade === 'none') return null;
    const response = this.tokenizer.decode(tokens);
    if (typeof grade === 'function') return grade(response, s.prompt, { thinking: s.thinking });
    if (s.prompt.answer === undefined) return null;
    const answer = finalResponse(response, s.opensThink);
    if (answer === null) return 0;
    this.grader ??= new MathGrader();
    return (await this.grader.grade(answer, s.prompt.answer)).correct ? 1 : 0;
  }

  private async engineFor(samples: PlannedSample[]): Promise<Engine> {
    this.reserve(samples.reduce((m, s) => Math.max(m, s.ids.length), 0));
    if (this.running) return this.running;
    const longest = this.promptTokens;
    const o = this.o;
    const padId = this.tokenizer.padId;
    if (this.engine.engine === 'kv-cache') {
      this.running = kvEngine(this.dir, this.config, { kind: o.device, dtype: o.dtype, rows: o.batchSize, sampling: o.sampling, padId, maxLength: longest + o.maxNewTokens });
    } else {
      const gen = await Generator.fromPretrained(this.dir, { ...o.sampling, device: o.device, dtype: o.dtype, groupSize: 1, padTokenId: padId, maxPromptsPerRun: o.batchSize });
      this.running = { generate: (p, call) => gen.generate(p, call), dispose: () => gen.dispose() };
    }
    return this.running;
  }
}

/**
 * Samples every prompt and returns the rows: `samplesThinking` samples with thinking on and
 * `samplesNonThinking` with thinking off per prompt (chat format), graded when a prompt has an
 * answer. Prompts may be plain strings (their `prompt_idx` is their position).
 *
 * ```ts
 * const rows = await generate('models/Qwen3-0.6B', [{ prompt: 'What is 2+3?', answer: '5' }], { maxNewTokens: 512, samplesThinking: 4, samplesNonThinking: 4, temperature: 0.6, topP: 0.95, device: 'cuda' });
 * ```
 */
export async function generate(model: string, prompts: readonly (string | TrajectoryPrompt)[], options: TrajectoryOptions & { onProgress?: (p: TrajectoryProgress) => void }): Promise<GeneratedTrajectory[]> {
  const out: GeneratedTrajectory[] = [];
  for await (const row of generateTrajectories({ ...options, model, prompts })) out.push(row);
  return out;
}

/** {@link generate} as a stream: rows are yielded as each run finishes. */
export async function* generateTrajectories(options: TrajectoryOptions & { model: string; prompts: readonly (string | TrajectoryPrompt)[]; onProgress?: (p: TrajectoryProgress) => void; signal?: AbortSignal }): AsyncGenerator<GeneratedTrajectory> {
  const gen = await TrajectoryGenerator.create(options.model, options);
  try {
    yield* gen.generate(options.prompts, { onProgress: options.onProgress, signal: options.signal });
  } finally {
    await gen.dispose();
  }
}

// ---------------------------------------------------------------------------------------------
// `lathe generate`: its options, and a run over a prompt file

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
  top_p: { type: 'number', default: 1, min: 0, max: 1, describe: 'Nucleus sampling mass, in (0, 1] (1: off)' },
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

/** The prompts of `cfg.data` (the first `limit`), with errors naming the file, the row and the field. */
export async function readPromptFile(cfg: Pick<GenerateConfig, 'data' | 'prompt_field' | 'answer_field' | 'limit'>): Promise<TrajectoryPrompt[]> {
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
  const gen = await createForConfig(cfg);
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
async function createForConfig(cfg: GenerateConfig): Promise<TrajectoryGenerator> {
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
