/**
 * Trajectories from prompts, in the trajectory schema (DESIGN.md): each prompt is rendered (the
 * model's chat template with thinking on and with thinking off, as the ICL-V data generator samples
 * it; the text as it is; or the R1-Zero template), tokenised once, sampled with the KV-cache
 * generator where it runs (else the in-graph generator), and graded when it has a reference answer.
 * Token ids are kept exactly as rendered and generated, never re-tokenised.
 *
 * - `generate(model, prompts, options)`: the rows of a list of prompts, for TypeScript users.
 * - `TrajectoryGenerator`: the same, holding the compiled engine across calls.
 * (`lathe generate`, the run over a prompt file, is in generate.ts.)
 *
 * Groups: the samples of one (prompt, thinking mode) are one group of the engine — the prompt is
 * prefilled once and its rows are copies of that prefill's cache — rather than one row per sample
 * with the prompt prefilled for each (see `groupsOf`).
 *
 * Reproducibility: sample j of prompt p in thinking mode m draws its sampling noise from stream
 * `sampleKey(p, m, j)` of `seed` (see rng.ts), whatever row or group it is generated in, so a
 * sample depends on the seed, the model, its prompt and its key alone — not on the batch size, the
 * engine, which samples share its run or its group, part boundaries, a resume, or how many samples
 * are asked for.
 */
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import type { DType } from '@lathe/onnx';
import { CausalLM, checkSequenceLength, readConfig, type DecoderConfig } from '@lathe/models';
import type { DeviceKind } from '@lathe/runtime';
import { cudaIncludeDir, GreedyPickKernels, greedyPickOps } from '@lathe/kernels';
import { isQuantizedConfig, schemeFromConfig, type QuantScheme } from '@lathe/quantization';
import { engineWeights, planModelWeights, type EngineWeights, type ModelWeights, type QuantizedWeightsRequest } from './model-weights';
import { kernelsOfDevice, openDevice } from './scaffold';
import { cudaDecodeFacts, decodeEngineOptions, resolveDecodeOptions, type DecodeOptionsConfig, type ResolvedDecodeOptions } from './decode-options';
import { HfTokenizer, splitThinking } from '@lathe/tokenizer';
import { MathGrader } from '@lathe/graders';
import type { Trajectory } from '@lathe/data';
import { chooseGenerationEngine, Generator, KvCacheGenerator, shrinkOnOutOfMemory, validateSampling, type Completion, type EngineChoice, type GenerateCallOptions, type GenerationEngineRequest, type GenerationTimings, type SamplingOptions } from '@lathe/rollout';

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
  /** 'auto' (default): the KV-cache generator where it runs (`chooseGenerationEngine`), else the graph. */
  engine?: GenerationEngineRequest;
  /** Samples per generation run (the KV-cache engine's rows). Changes speed and memory, not samples. Default 64. */
  batchSize?: number;
  /** Folder with tokenizer.json and tokenizer_config.json. Default: the model folder. */
  tokenizer?: string;
  /**
   * Token ids that end a sample. Default: the tokenizer's EOS and the model config's
   * eos_token_id(s). `[]` runs every sample to `maxNewTokens` (benchmarks: the same work whatever
   * a random model draws).
   */
  stopIds?: readonly number[];
  /**
   * Replay the KV-cache engine's decode step as a CUDA graph (as GRPO's KV engine does). Default
   * true on CUDA; false turns it off (plain runs). CUDA only; the in-graph engine ignores it.
   */
  cudaGraph?: boolean;
  /**
   * The KV-cache engine's decode options, as the `lathe generate` flags of the same names (missing
   * keys take their defaults: an e4m3 cache, Lathe's decode attention kernel and the residual
   * stream in the compute dtype are opt-in; the SwiGLU kernel is on where it runs). Resolved by
   * {@link resolveDecodeOptions} at `create`, whose errors name the flags.
   */
  decode?: Partial<DecodeOptionsConfig>;
  /**
   * How a quantized model folder (config.json has `quantization_config`) runs, as `--quantized_weights`:
   * 'auto' (default) through its quantized kernels in the KV-cache engine (see {@link planModelWeights}),
   * 'dequantize' dequantized to dense at load. Dense folders ignore it.
   */
  quantizedWeights?: QuantizedWeightsRequest;
  /** How rows are graded: 'math' (default: the math grader, for prompts with an answer), 'none', or a function. */
  grade?: 'math' | 'none' | TrajectoryGrader;
  /**
   * Called before each run of the KV-cache engine with its phase, the prompts it prefills and the
   * engine's rows. For tests: an out-of-memory error thrown here stands in for a real one.
   */
  beforeEngineRun?: (phase: 'prefill' | 'decode', prompts: number, rows: number) => void;
  /** Called when the KV-cache engine ran out of device memory and was rebuilt with fewer rows (also counted in `counters`). */
  onEngineShrink?: (from: number, to: number) => void;
  /**
   * Replaces the engine: no weights are read or compiled, and each run's groups go to this object
   * instead (its completions sorted by (prompt, sample), as the engines return them). For tests and
   * for benchmarks of the generator's own host work (tools/bench/rollout/trajectory-host-stages.ts).
   * `engine` still names the engine that would have run; each call counts as one run.
   */
  standInEngine?: TrajectoryEngineRunner;
}

/** What the generator asks of an engine (both built-in ones, or {@link TrajectoryOptions.standInEngine}). */
export interface TrajectoryEngineRunner {
  generate(prompts: number[][], call: GenerateCallOptions): Promise<Completion[]>;
  dispose?(): Promise<void>;
}

/** Progress of a generation call, after each run. */
export interface TrajectoryProgress {
  samples: number;
  total: number;
  /** New tokens generated so far. */
  tokens: number;
}

/** Work a {@link TrajectoryGenerator} has done, over all its calls. */
export interface TrajectoryCounters {
  /** Generation runs started (each one prefill; an out-of-memory retry counts again). */
  runs: number;
  /**
   * Prompts those runs prefilled: each (prompt, thinking mode) once per run that holds any of its
   * samples — once in all when `batchSize` is a multiple of the samples per prompt.
   */
  prefilledPrompts: number;
  /** Samples generated. */
  samples: number;
  /**
   * Times the KV-cache engine ran out of device memory past what splitting a run's prompts fixes
   * (its decode step always computes all of its rows) and was rebuilt with half the rows.
   */
  engineShrinks: number;
  /** The KV-cache engine's rows now (`batchSize`, halved at each shrink); 0 before it is built. */
  engineRows: number;
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

/** What both engines offer (the KV-cache one sized on demand), and what loading the weights measured. */
type Engine = Required<TrajectoryEngineRunner> & { loaded?: EngineWeights['loaded'] };

/** Called before each generation run with the prompts it prefills. */
type OnRun = (prompts: number) => void;

/** Cache lengths are rounded up to this many positions, so a slightly longer prompt rarely rebuilds the engine. */
const LENGTH_QUANTUM = 64;

/** What the KV-cache engine reports back to its generator. */
interface KvEngineEvents {
  onRun: OnRun;
  /** The engine was rebuilt with fewer rows after running out of memory. */
  onShrink: (from: number, to: number) => void;
  beforeRun?: TrajectoryOptions['beforeEngineRun'];
  /** Each run's phase times (the engine's `lastTimings`). */
  onTimings?: (t: GenerationTimings) => void;
}

/**
 * The KV-cache generator over weights uploaded once, rebuilt (larger) only when a prompt needs a
 * longer cache — or smaller when it runs out of device memory. The generator itself splits a run
 * that fails for memory into halves of its prompts, which shrinks the prefill; its decode step
 * always computes all of its rows, so an out-of-memory that survives that (caches, or the decode
 * step's working set) rebuilds the engine here with half the rows — never fewer than a call's
 * largest group, whose samples share one run — and retries the call. Samples depend on their keys
 * alone, so the rows come out the same.
 */
function kvEngine(dir: string, config: DecoderConfig, o: { kind: DeviceKind; dtype: DType; rows: number; sampling: SamplingOptions; padId: number; maxLength: number; cudaGraph: boolean; decode: ResolvedDecodeOptions; weights: ModelWeights['runs'] }, events: KvEngineEvents): Engine {
  // on cuda through Lathe's kernels where NVRTC is present, so a greedy engine picks its tokens with
  // the fused greedy-pick kernel on the sessions' stream (the same tokens; docs/guides/kernels.md),
  // and the decode options' kernels join the same stream
  const device = openDevice(o.kind);
  const kernels = o.kind === 'cuda' ? kernelsOfDevice(0) : undefined;
  const greedyPick = kernels && (o.sampling.temperature ?? 1) === 0 ? greedyPickOps('cuda', GreedyPickKernels.compile(kernels, { includeDir: cudaIncludeDir() })) : undefined;
  const decode = decodeEngineOptions(o.decode, kernels, config);
  let weights: EngineWeights;
  try {
    weights = engineWeights(dir, device, o.dtype, o.weights, kernels);
  } catch (e) {
    greedyPick?.dispose();
    decode.dispose();
    throw e;
  }
  let built: { gen: KvCacheGenerator; maxLength: number; rows: number } | undefined;
  let rows = o.rows;
  const lengthFor = (n: number) => Math.min(config.maxPositionEmbeddings, Math.ceil(n / LENGTH_QUANTUM) * LENGTH_QUANTUM);
  const build = (maxLength: number) => {
    built?.gen.dispose();
    built = undefined;
    const size = rows;
    const beforeRun = (phase: 'prefill' | 'decode', prompts: number) => {
      events.beforeRun?.(phase, prompts, size);
      if (phase === 'prefill') events.onRun(prompts);
    };
    // No groupSize: every call passes sampleKeys, one list per (prompt, mode) group of its run.
    built = { gen: weights.create({ ...o.sampling, rows: size, maxLength, dtype: o.dtype, padTokenId: o.padId, cudaGraph: o.cudaGraph, beforeRun, ...decode.options, ...(greedyPick ? { greedyPick } : {}) }), maxLength, rows: size };
    return built.gen;
  };
  return {
    generate: async (prompts, call) => {
      const need = lengthFor(prompts.reduce((m, p) => Math.max(m, p.length + call.maxNewTokens), o.maxLength));
      // a prompt's samples share one run: never fewer rows than the call's largest group
      const minRows = Math.max(1, ...(call.sampleKeys ?? []).map((k) => k.length));
      const onShrink = (from: number, to: number) => {
        built?.gen.dispose();
        built = undefined;
        rows = to;
        events.onShrink(from, to);
      };
      return shrinkOnOutOfMemory(rows, { minRows, onShrink }, async (size) => {
        const gen = built && built.maxLength >= need && built.rows === size ? built.gen : build(Math.max(need, built?.maxLength ?? 0));
        const out = await gen.generate(prompts, call);
        weights.check();
        events.onTimings?.(gen.lastTimings);
        return out;
      });
    },
    loaded: weights.loaded,
    dispose: async () => {
      built?.gen.dispose();
      greedyPick?.dispose();
      decode.dispose();
      weights.dispose();
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
 * The engine groups of one run's samples (consecutive in output order): each maximal stretch of
 * samples of the same prompt and thinking mode is one group — one prompt for the engine, prefilled
 * once, with one sample key per row.
 *
 * Why this layout: both engines take a per-prompt sample count (`sampleKeys`: the KV prefill's row
 * expansion is a host input, and so is the in-graph generator's), so samples_thinking ≠
 * samples_non_thinking needs neither one engine per group size (a second set of caches as large as
 * the first) nor groups padded to a common size (rows computed and thrown away). Runs are cut
 * every `batchSize` samples in output order, as before: every run but the last is full (a decode
 * step computes all its rows, live or not), progress and the rows per run do not change, and a
 * group that crosses a run boundary is prefilled once in each of its runs — at most one extra
 * prompt per run, none when batchSize is a multiple of the samples per prompt, against whole-group
 * runs that would leave rows idle in every decode step to save that one prompt's prefill.
 */
export function groupsOf(run: readonly PlannedSample[]): PlannedSample[][] {
  const groups: PlannedSample[][] = [];
  for (const s of run) {
    const last = groups.at(-1)?.[0];
    if (last && last.prompt === s.prompt && last.thinking === s.thinking) groups.at(-1)!.push(s);
    else groups.push([s]);
  }
  return groups;
}

/** The decode options' notes written to stderr in this process: each once (lathe eval makes a generator per model). */
const notesWritten = new Set<string>();

/**
 * Renders, samples and grades trajectories for one model and one set of options. The tokenizer
 * and model config load at `create`; the engine compiles on the first `generate` (so `plan` can
 * check every prompt before any heavy work). Call `dispose()` when done.
 */
export class TrajectoryGenerator {
  /** The engine in use and, when 'auto' fell back to the graph, why. */
  readonly engine: EngineChoice;
  /** The KV-cache engine's decode options as resolved for this device and engine ({@link TrajectoryOptions.decode}). */
  readonly decode: ResolvedDecodeOptions;
  private readonly weightsPlan: ModelWeights;
  private running: Engine | undefined;
  private grader: MathGrader | undefined;
  private readonly stopIds: number[];
  private readonly modes: { thinking: boolean | null; samples: number }[];
  /** The longest prompt (tokens) the KV caches are sized for. */
  private promptTokens = 0;
  private readonly work: TrajectoryCounters = { runs: 0, prefilledPrompts: 0, samples: 0, engineShrinks: 0, engineRows: 0 };
  private readonly phases: GenerationTimings = { prefillMs: 0, decodeMs: 0, transferMs: 0, decodeSteps: 0 };
  /**
   * Each given prompt object's encoding per thinking mode, for as long as the caller holds the
   * object (and while its text is unchanged), so that `plan()` then `generate()` renders and
   * tokenises a prompt once (docs/benchmarks/2026-11-22-to-24-h100.md, "CPU breakdown of the
   * generator's own work"). The planned samples share these ids: not to be mutated.
   */
  private readonly encoded = new WeakMap<TrajectoryPrompt, { text: string; modes: Map<boolean | null, { ids: number[]; opensThink: boolean }> }>();

  private constructor(
    readonly dir: string,
    readonly config: DecoderConfig,
    /** The tokenizer, e.g. to decode `output_token_ids`. */
    readonly tokenizer: HfTokenizer,
    private readonly o: Required<Omit<TrajectoryOptions, 'tokenizer' | 'stopIds' | 'beforeEngineRun' | 'onEngineShrink' | 'standInEngine' | 'decode' | keyof SamplingOptions>> & Pick<TrajectoryOptions, 'stopIds' | 'beforeEngineRun' | 'onEngineShrink' | 'standInEngine' | 'decode'> & { sampling: SamplingOptions },
    /** The folder's quantization scheme (undefined: dense). */
    scheme: QuantScheme | undefined,
  ) {
    this.engine = chooseGenerationEngine(o.engine, config, o.device, o.dtype);
    const facts = o.device === 'cuda' && this.engine.engine === 'kv-cache' ? cudaDecodeFacts(config, o.dtype, o.decode?.kv_cache_dtype) : {};
    this.weightsPlan = planModelWeights(scheme, { request: o.quantizedWeights, device: o.device, dtype: o.dtype, engine: this.engine, kernelsUnavailable: facts.kernelsUnavailable });
    const decode = resolveDecodeOptions(o.decode ?? {}, { device: o.device, engine: this.engine.engine, engineWhy: this.engine.why, ...facts });
    // packing q/k/v and gate/up is for dense weights: a quantized model's kernel path concatenates its own, and the decode kernel takes them apart
    const quantized = this.weightsPlan.runs !== 'dense' && this.weightsPlan.runs !== 'dequantized';
    this.decode = quantized ? { ...decode, concatProjections: false } : decode;
    if (this.decode.note && !notesWritten.has(this.decode.note)) {
      notesWritten.add(this.decode.note);
      process.stderr.write(`${this.decode.note}\n`);
    }
    const eos = config.eosTokenId;
    this.stopIds = o.stopIds ? [...o.stopIds] : [...new Set([tokenizer.eosId, ...(eos === undefined ? [] : Array.isArray(eos) ? eos : [eos])])];
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
    const { config, raw } = readConfig(model);
    const scheme = isQuantizedConfig(raw) ? schemeFromConfig(raw, join(model, 'config.json')) : undefined;
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
      stopIds: options.stopIds,
      cudaGraph: options.cudaGraph ?? device === 'cuda',
      sampling: { temperature: options.temperature, topK: options.topK, topP: options.topP, minP: options.minP },
      beforeEngineRun: options.beforeEngineRun,
      onEngineShrink: options.onEngineShrink,
      standInEngine: options.standInEngine,
      decode: options.decode,
      quantizedWeights: options.quantizedWeights ?? 'auto',
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
    if (o.cudaGraph && device !== 'cuda') throw new Error(`cudaGraph needs device cuda, got ${device}`);
    const badStop = o.stopIds?.find((t) => !Number.isInteger(t) || t < 0 || t >= config.vocabSize);
    if (badStop !== undefined) throw new Error(`stopIds: ${badStop} is not a token id of the model (0..${config.vocabSize - 1})`);
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
    return new TrajectoryGenerator(model, config, tokenizer, o, scheme);
  }

  /**
   * How the model's weights run ({@link planModelWeights}); after {@link load} (or the first
   * `generate`) with what the KV-cache engine's load measured: bytes on the device, code tensors,
   * the W4A16 plans' tuning time. {@link describeWeights} words it.
   */
  get weights(): ModelWeights {
    return { ...this.weightsPlan, ...this.running?.loaded };
  }

  /**
   * Reads the weights onto the device now (the first `generate` does otherwise) — with INT4 on cuda
   * after tuning the W4A16 kernel's launch plans — so that a start line can report {@link weights}.
   */
  async load(): Promise<ModelWeights> {
    await this.engineFor([]);
    return this.weights;
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
      const memo = typeof given === 'string' ? undefined : this.encodingsOf(given);
      for (const mode of this.modes) {
        if (mode.samples === 0) continue;
        let encoding = memo?.get(mode.thinking);
        if (!encoding) {
          const rendered = this.render(p.prompt, mode.thinking);
          encoding = { ids: this.idsOf(rendered), opensThink: /<think>\s*$/.test(rendered) };
          memo?.set(mode.thinking, encoding);
        }
        const { ids, opensThink } = encoding;
        checkSequenceLength(this.config, ids.length + this.o.maxNewTokens, `${where}: the prompt's ${ids.length} tokens${mode.thinking === null ? '' : ` (thinking ${mode.thinking ? 'on' : 'off'})`} + max_new_tokens ${this.o.maxNewTokens}`);
        for (let j = 0; j < mode.samples; j++) out.push({ prompt, thinking: mode.thinking, sampleIdx: j, ids, key: sampleKey(idx, mode.thinking, j), opensThink });
      }
    });
    return out;
  }

  /** The encodings memo of a prompt object (reset when its text changed). */
  private encodingsOf(given: TrajectoryPrompt): Map<boolean | null, { ids: number[]; opensThink: boolean }> {
    let entry = this.encoded.get(given);
    if (!entry || entry.text !== given.prompt) {
      entry = { text: given.prompt, modes: new Map() };
      this.encoded.set(given, entry);
    }
    return entry.modes;
  }

  /** Runs, prefills and samples so far (see {@link TrajectoryCounters}), e.g. to check prefill sharing. */
  get counters(): Readonly<TrajectoryCounters> {
    return { ...this.work };
  }

  /** The KV-cache engine's time in each phase over all calls so far (ms; zeros with the other engines), e.g. to tell a slow prefill from a slow decode. */
  get engineTimings(): Readonly<GenerationTimings> {
    return { ...this.phases };
  }

  /**
   * Samples and grades every sample of `prompts`, yielding rows in output order as each run of
   * `batchSize` samples finishes; the samples of one prompt and thinking mode in a run share one
   * prefill ({@link groupsOf}). With `signal` aborted it stops before the next run.
   */
  async *generate(prompts: readonly (string | TrajectoryPrompt)[], call: { onProgress?: (p: TrajectoryProgress) => void; signal?: AbortSignal } = {}): AsyncGenerator<GeneratedTrajectory> {
    const samples = this.plan(prompts);
    const engine = await this.engineFor(samples);
    let tokens = 0;
    for (let start = 0; start < samples.length; start += this.o.batchSize) {
      if (call.signal?.aborted) return;
      const chunk = samples.slice(start, start + this.o.batchSize);
      const groups = groupsOf(chunk);
      const completions = await engine.generate(
        groups.map((g) => g[0].ids),
        { maxNewTokens: this.o.maxNewTokens, seed: this.o.seed, stopIds: this.stopIds, sampleKeys: groups.map((g) => g.map((s) => s.key)) },
      );
      const rows = await Promise.all(completions.map((c) => this.row(groups[c.promptIndex][c.sampleIndex], c)));
      // both engines sort completions by (prompt, sample), i.e. in the chunk's order
      rows.forEach((r, i) => {
        if (r.prompt_idx !== chunk[i].prompt.prompt_idx || r.sample_idx !== chunk[i].sampleIdx) throw new Error(`internal: completion ${i} of a run is out of order`);
      });
      this.work.samples += rows.length;
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
    if (typeof grade === 'function') return grade(this.tokenizer.decode(tokens), s.prompt, { thinking: s.thinking });
    // The math grader reads nothing of a prompt without an answer: no decode (docs/benchmarks/2026-11-22-to-24-h100.md).
    if (s.prompt.answer === undefined) return null;
    const answer = finalResponse(this.tokenizer.decode(tokens), s.opensThink);
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
    const onRun: OnRun = (prompts) => {
      this.work.runs++;
      this.work.prefilledPrompts += prompts;
    };
    if (o.standInEngine) {
      const stand = o.standInEngine;
      this.running = {
        generate: (p, call) => {
          onRun(p.length);
          return stand.generate(p, call);
        },
        dispose: async () => stand.dispose?.(),
      };
    } else if (this.engine.engine === 'kv-cache') {
      this.work.engineRows = o.batchSize;
      const onShrink = (from: number, to: number) => {
        this.work.engineShrinks++;
        this.work.engineRows = to;
        o.onEngineShrink?.(from, to);
      };
      this.running = kvEngine(this.dir, this.config, { kind: o.device, dtype: o.dtype, rows: o.batchSize, sampling: o.sampling, padId, maxLength: longest + o.maxNewTokens, cudaGraph: o.cudaGraph, decode: this.decode, weights: this.weightsPlan.runs }, {
        onRun,
        onShrink,
        beforeRun: o.beforeEngineRun,
        onTimings: (t) => {
          for (const k of Object.keys(this.phases) as (keyof GenerationTimings)[]) this.phases[k] += t[k];
        },
      });
    } else {
      // A call's groups hold at most batchSize samples in all, so maxPromptsPerRun = batchSize never
      // cuts a run; the KV budget still may (samples unchanged: they depend on their keys alone).
      const gen = await Generator.create(await CausalLM.fromPretrained(this.dir), { ...o.sampling, device: o.device, dtype: o.dtype, padTokenId: padId, maxPromptsPerRun: o.batchSize, beforeRun: onRun });
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
