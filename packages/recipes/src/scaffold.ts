/**
 * What every recipe does around its own loop, written once: load the model and its tokenizer (or
 * the built-in demo pair), hold evaluation examples out of the data, start or resume the run
 * directory, write the config, metrics, evaluation files and checkpoints, and stop cleanly on
 * Ctrl-C. `runSft`, `runGrpo` and `runGenerate` are their own loops between these calls.
 */
import { existsSync, mkdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { parse as parseYaml, stringify as toYaml } from 'yaml';
import { CausalLM, permutation, readConfig, type DecoderConfig } from '@lathe/models';
import { HfTokenizer, type ChatMessage, type ConversationIds } from '@lathe/tokenizer';
import { diffConfigs, listEvals, MetricsLog, rewindRunDir, runPaths, startRunDir, writeAtomic, type MetricSink } from '@lathe/data';
import { metricSinks, reportTargets, type ReportOptions } from './reporting';
import { learningRate, listCheckpoints, loadCheckpoint, saveCheckpoint, type CheckpointContents, type TrainableParam, type TrainerState, type TrainStepResult } from '@lathe/train';
import { BUILTIN_MODEL, BUILTIN_TOKENIZER, additionTokenizer, builtinBaseModel } from './demo-task';
import { Device } from '@lathe/runtime';
import { Kernels, probeKernels } from '@lathe/kernels';

// ---------------------------------------------------------------------------------------------
// Model and tokenizer

/** What a recipe asks of a tokenizer: text in and out, its special ids, and how a prompt is encoded. */
export interface RunTokenizer {
  encode(text: string): number[];
  decode(ids: readonly number[]): string;
  readonly padId: number;
  readonly eosId: number;
  /** Prepended to every sequence when set. */
  readonly bosId?: number;
  /** A prompt's ids: its text's, or (`prompt_format: chat`) the chat template's user turn with the assistant's turn opened. */
  encodePrompt(text: string): number[];
  /** Whole conversations through the model's chat template; absent when the tokenizer has none. */
  chat?: {
    /** A conversation's ids (no generation prompt) and a mask that is 1 on the assistant's turns. */
    encodeConversation(messages: ChatMessage[]): ConversationIds;
    /** A conversation's ids with the assistant's next turn opened (a generation prompt). */
    encodePrompt(messages: ChatMessage[]): number[];
  };
}

/** A loaded model folder and its tokenizer. */
export interface RunModel {
  /** The folder holding config.json and the weights. */
  dir: string;
  config: DecoderConfig;
  /** The model, a view of the folder's files (`lm.float32Weights()` reads them). */
  lm: CausalLM;
  tokenizer: RunTokenizer;
  /** The folder checkpoints copy tokenizer files from (none for the built-in character tokenizer). */
  tokenizerFrom?: string;
}

/** The options of a recipe's config that say which model and tokenizer to load. */
export interface ModelOptions {
  /** A Hugging Face model folder, or {@link BUILTIN_MODEL} (made in `run_dir` from `seed`). */
  model: string;
  /**
   * 'model' (the model folder's tokenizer.json), a folder holding one, or {@link BUILTIN_TOKENIZER};
   * absent for a command without `--tokenizer` (the model's own, as 'model').
   */
  tokenizer?: string;
  prompt_format: 'raw' | 'chat';
  enable_thinking: boolean;
  run_dir: string;
  seed: number;
}

/** `dir` when it holds config.json; the error names `--model` otherwise. */
function modelFolder(dir: string): string {
  if (!existsSync(join(dir, 'config.json'))) throw new Error(`--model ${dir}: no config.json in that folder (expected a Hugging Face model folder)`);
  return dir;
}

/** `<dir>/config.json` parsed; the error names `--model` when the folder has none. */
export function modelConfig(dir: string): DecoderConfig {
  return readConfig(modelFolder(dir)).config;
}

/**
 * The model and tokenizer a config names. The built-in model is written to `<run_dir>/base-model`
 * first (before any tokenizer check), and reads the built-in tokenizer unless another is named.
 */
export async function loadRunModel(cfg: ModelOptions): Promise<RunModel> {
  const lm = CausalLM.fromPretrainedSync(cfg.model === BUILTIN_MODEL ? builtinBaseModel(cfg.run_dir, cfg.seed).dir : modelFolder(cfg.model));
  const { config } = lm;
  const dir = lm.dir!;
  const choice = cfg.tokenizer ?? 'model';
  const flag = cfg.tokenizer === undefined ? `--model ${cfg.model}` : `--tokenizer ${cfg.tokenizer}`;
  const checkVocab = (ids: number) => {
    if (ids > config.vocabSize) throw new Error(`${flag}: the tokenizer has ${ids} ids but the model's vocab_size is ${config.vocabSize}`);
  };
  if (choice === BUILTIN_TOKENIZER || (choice === 'model' && cfg.model === BUILTIN_MODEL)) {
    const tok = additionTokenizer();
    checkVocab(tok.vocabSize);
    if (cfg.prompt_format === 'chat') throw new Error(`--prompt_format chat: the ${BUILTIN_TOKENIZER} tokenizer has no chat template`);
    return { dir, config, lm, tokenizer: { encode: (t) => tok.encode(t), decode: (ids) => tok.decode(ids), padId: tok.padId, eosId: tok.eosId, bosId: tok.bosId, encodePrompt: (t) => tok.encode(t) } };
  }
  const from = choice === 'model' ? dir : choice;
  if (!existsSync(join(from, 'tokenizer.json'))) {
    const hint = cfg.tokenizer === undefined ? '' : ` (a model trained on the built-in task by \`lathe sft\` uses --tokenizer ${BUILTIN_TOKENIZER})`;
    throw new Error(`${flag}: no tokenizer.json in ${from}${hint}`);
  }
  const tok = await HfTokenizer.fromFolder(from);
  checkVocab(tok.vocabSize);
  // chat: the prompt becomes the user turn of the model's chat template, ending with the assistant's turn opened
  const render = (text: string) => tok.applyChatTemplate([{ role: 'user', content: text }], { addGenerationPrompt: true, enableThinking: cfg.enable_thinking });
  const encodePrompt = cfg.prompt_format === 'chat' ? (t: string) => tok.encode(render(t)) : (t: string) => tok.encode(t);
  // conversations (SFT's messages rows) always go through the template as it is (no enable_thinking)
  const chat = tok.hasChatTemplate ? { encodeConversation: (ms: ChatMessage[]) => tok.encodeConversation(ms), encodePrompt: (ms: ChatMessage[]) => tok.encodeChat(ms, { addGenerationPrompt: true }) } : undefined;
  return { dir, config, lm, tokenizer: { encode: (t) => tok.encode(t), decode: (ids) => tok.decode(ids), padId: tok.padId, eosId: tok.eosId, bosId: tok.bosId, encodePrompt, ...(chat ? { chat } : {}) }, tokenizerFrom: from };
}

// ---------------------------------------------------------------------------------------------
// Data: the held-out split and the training order

/**
 * The seeded held-out split every recipe makes (SFT, GRPO, the demo's two stages): the first
 * `evalCount` items of a permutation seeded by `seed`, and the rest for training — so GRPO after
 * SFT on the same data, seed and count never trains on the SFT run's held-out examples.
 */
export function heldOutSplit<T>(items: readonly T[], evalCount: number, seed: number): { train: T[]; evaluation: T[] } {
  const order = permutation(items.length, seed + 0x5eed);
  return { evaluation: order.slice(0, evalCount).map((i) => items[i]), train: order.slice(evalCount).map((i) => items[i]) };
}

/** {@link heldOutSplit} of a config's data; an error names `--eval_examples` when nothing is left to train on (`what`: the items' name). */
export function splitHeldOut<T>(items: readonly T[], cfg: { data: string; eval_examples: number; seed: number }, what: string): { train: T[]; evaluation: T[] } {
  if (cfg.eval_examples >= items.length) throw new Error(`--eval_examples ${cfg.eval_examples} leaves no training ${what} (${items.length} ${what} in ${cfg.data})`);
  return heldOutSplit(items, cfg.eval_examples, cfg.seed);
}

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

// ---------------------------------------------------------------------------------------------
// Options every training recipe shares

/**
 * The device a command runs on (GPU `id`: a data-parallel rank's LOCAL_RANK). The GPU is opened once per process, through Lathe's kernels where
 * NVRTC and the driver are there (its sessions then run on the kernels' stream, so a Trainer uses
 * the fused AdamW update); without them, with a note saying why, on ONNX Runtime's own stream.
 * `kernels: false` (a step replayed as a CUDA graph, which the fused update does not join yet)
 * keeps ONNX Runtime's own stream.
 */
export function openDevice(kind: 'cpu' | 'cuda', id = 0, opts: { kernels?: boolean } = {}): Device {
  if (kind === 'cpu' || Device.isOpen('cuda', id) || opts.kernels === false) return Device.open(kind, { id });
  const probe = probeKernels();
  if (!probe.ok) {
    process.stderr.write(`note: Lathe's CUDA kernels are off (${probe.reason}); the composed ONNX Runtime path runs instead\n`);
    return Device.open(kind, { id });
  }
  const opened = Kernels.withDevice({ deviceId: id });
  deviceKernels.set(id, opened.kernels);
  return opened.device;
}

/** The kernels each GPU was opened through by {@link openDevice} (its sessions run on their stream). */
const deviceKernels = new Map<number, Kernels>();

/** The kernels GPU `id` was opened through by {@link openDevice} in this process, if it was. */
export function kernelsOfDevice(id: number): Kernels | undefined {
  return deviceKernels.get(id);
}

/** Refuses bfloat16 compute off the GPU (ONNX Runtime has no bfloat16 CPU kernels for most ops). */
export function checkComputeDtype(cfg: { compute_dtype: string; device: string }): void {
  if (cfg.compute_dtype === 'bfloat16' && cfg.device !== 'cuda') throw new Error('--compute_dtype bfloat16 needs --device cuda (ONNX Runtime has no bfloat16 CPU kernels for most ops)');
}

/** The learning rate of optimizer step `step` under a config's schedule options. */
export function scheduledLr(cfg: { lr: number; schedule: 'constant' | 'linear' | 'cosine'; warmup_steps: number; steps: number; min_lr_ratio: number }, step: number): number {
  return learningRate({ lr: cfg.lr, kind: cfg.schedule, warmupSteps: cfg.warmup_steps, totalSteps: cfg.steps, minLrRatio: cfg.min_lr_ratio }, step);
}

/**
 * The options whose values differ between a saved config (YAML) and `cfg`, leaving out `resumable`
 * ones (those a resume may change) and options the saved config does not have (the run predates
 * them, so a release that adds an option still resumes it); each as its key and `key: old → new`.
 */
export function configChanges(savedFile: string, cfg: object, resumable: readonly string[]): { key: string; text: string }[] {
  const saved = parseYaml(readFileSync(savedFile, 'utf8')) as Record<string, unknown>;
  const relevant = (c: Record<string, unknown>) => Object.fromEntries(Object.entries(c).filter(([k]) => !resumable.includes(k) && k in saved));
  return diffConfigs(relevant(saved), relevant(cfg as Record<string, unknown>)).map((d) => ({ key: d.key, text: `${d.key}: ${JSON.stringify(d.a)} → ${JSON.stringify(d.b)}` }));
}

/**
 * Gives Ctrl-C/SIGTERM handlers a turn (a synchronous train step never yields to them) and says
 * whether `signal` asks the run to stop after the step just done.
 */
export async function stopRequested(signal?: AbortSignal): Promise<boolean> {
  await new Promise<void>((resolve) => setImmediate(resolve));
  return Boolean(signal?.aborted);
}

/**
 * A train step's timing and throughput fields in metrics.jsonl: `prepMs` the host time spent making
 * its batch, added to the step's own host time; throughput over the step's `tokens`.
 */
export function stepTiming(result: Pick<TrainStepResult, 'gradNorm' | 'hostMs' | 'runMs'>, o: { lr: number; tokens: number; prepMs: number }) {
  const hostMs = o.prepMs + result.hostMs;
  return { grad_norm: result.gradNorm, lr: o.lr, tokens: o.tokens, tokens_per_s: o.tokens / ((hostMs + result.runMs) / 1000), host_ms: hostMs, run_ms: result.runMs };
}

/** A training recipe's progress callbacks beyond `onStart` (whose info each recipe names). */
export interface TrainRunEvents<S, E> {
  onStep?(m: S): void;
  onEval?(r: E): void;
  onCheckpoint?(dir: string, step: number): void;
}

/** What a training recipe returns. */
export interface TrainRunResult<E> {
  steps: number;
  finalLoss: number;
  evals: E[];
  /** The last checkpoint's folder. */
  checkpoint: string;
  interrupted: boolean;
}

// ---------------------------------------------------------------------------------------------
// The run directory

/** The options of a recipe's config that say where its run lives and whether it continues one. */
export interface RunDirOptions {
  run_dir: string;
  resume: boolean;
  overwrite: boolean;
}

/** What a recipe saves in each checkpoint: everything but the run's config, which the run directory adds. */
export type CheckpointOf = Omit<CheckpointContents, 'runConfigYaml'>;

/**
 * A training run's directory (data's `runPaths` layout): config.yaml, metrics.jsonl, eval/step-N.jsonl
 * and checkpoints/. A new run refuses an earlier run's files unless `overwrite`; a resume continues
 * the newest checkpoint and cuts what was logged after it.
 */
export class RunDir {
  /** metrics.jsonl. */
  readonly metrics: MetricsLog;
  private configYaml: string | undefined;
  private saved: { step: number; dir: string } | undefined;

  private constructor(
    readonly dir: string,
    /** The checkpoint a resume continues (undefined for a new run). */
    readonly latest: { step: number; dir: string } | undefined,
    sinks: readonly MetricSink[],
  ) {
    this.metrics = new MetricsLog(runPaths(dir).metrics, sinks);
  }

  /**
   * Starts a new run in `run_dir`, or finds the checkpoint a resume continues; metrics also go where
   * `--report_to` says (see reporting.ts), until {@link close}.
   */
  static open(cfg: RunDirOptions & Partial<ReportOptions>): RunDir {
    const latest = cfg.resume ? listCheckpoints(cfg.run_dir).at(-1) : undefined;
    if (cfg.resume && !latest) throw new Error(`--resume: no checkpoint in ${runPaths(cfg.run_dir).checkpoints}`);
    reportTargets(cfg.report_to ?? 'none'); // a bad --report_to fails before a run directory is touched
    if (!cfg.resume) startRunDir(cfg.run_dir, { overwrite: cfg.overwrite });
    mkdirSync(cfg.run_dir, { recursive: true });
    return new RunDir(cfg.run_dir, latest, metricSinks(cfg.run_dir, cfg));
  }

  /** Sends what the metric sinks still buffer (a W&B run is finished); call once, when the run ends. */
  async close(): Promise<void> {
    await this.metrics.close();
  }

  /**
   * Reads the resumed checkpoint's tensors for `trainable`. Its kind is checked first: a LoRA
   * checkpoint read as full fine-tuning (or the reverse) would fail on a missing tensor instead.
   */
  resume(trainable: TrainableParam[], lora: { rank: number }): CheckpointContents {
    if (!this.latest) throw new Error(`${this.dir}: not resuming (no checkpoint to continue)`);
    const dir = this.latest.dir;
    const savedLora = existsSync(join(dir, 'adapter_model.safetensors'));
    if (savedLora !== lora.rank > 0) throw new Error(`--resume: ${dir} is a ${savedLora ? 'LoRA' : 'full fine-tuning'} checkpoint but --lora_rank is ${lora.rank}`);
    return loadCheckpoint(dir, trainable);
  }

  /**
   * Refuses to resume with options that differ from the resumed checkpoint's config.yaml in any key
   * outside `resumable`, unless `cfg.force`; returns the changed keys.
   */
  refuseChangedConfig(cfg: object & { force?: boolean }, resumable: readonly string[]): string[] {
    if (!this.latest) return [];
    const savedFile = join(this.latest.dir, 'config.yaml');
    const changed = configChanges(savedFile, cfg, resumable);
    if (changed.length && !cfg.force) {
      throw new Error(`--resume: the config differs from the checkpoint's (${savedFile}) in ${changed.map((d) => d.text).join(', ')}; pass --force to resume with the new values`);
    }
    return changed.map((d) => d.key);
  }

  /**
   * The resumed checkpoint's contents for `trainable`, once it is known to fit `cfg`: the same config
   * up to `resumable` keys (unless `--force`), the same kind (LoRA or not) and the same seed. What
   * was logged after the checkpoint is cut, since the resumed run logs it again.
   */
  continueRun(trainable: TrainableParam[], cfg: { seed: number; lora_rank: number; force?: boolean }, resumable: readonly string[]): CheckpointContents {
    this.refuseChangedConfig(cfg, resumable);
    const c = this.resume(trainable, { rank: cfg.lora_rank });
    if (c.state.seed !== cfg.seed) throw new Error(`--resume: the checkpoint was trained with --seed ${c.state.seed}, not ${cfg.seed}`);
    this.rewind(c.state.step);
    return c;
  }

  /**
   * Where a run starts: `fresh` initial values at step 0, or — resuming — the checkpoint's values,
   * AdamW moments and state (checked as {@link continueRun} checks them).
   */
  startFrom(trainable: TrainableParam[], cfg: { seed: number; lora_rank: number; force?: boolean }, resumable: readonly string[], fresh: Map<string, Float32Array>): { state: TrainerState; init: { params: Map<string, Float32Array>; m?: Map<string, Float32Array>; v?: Map<string, Float32Array> } } {
    if (!this.latest) return { state: { step: 0, dataPosition: 0, seed: cfg.seed }, init: { params: fresh } };
    const c = this.continueRun(trainable, cfg, resumable);
    return { state: c.state, init: { params: c.values, m: c.m, v: c.v } };
  }

  /** Cuts metrics, evaluations and rollouts logged after `step`: the resumed run logs them again. */
  rewind(step: number): void {
    rewindRunDir(this.dir, step);
  }

  /** Saves the run's config as config.yaml (every checkpoint keeps a copy) and makes eval/. */
  saveConfig(cfg: object): void {
    this.configYaml = toYaml(cfg);
    writeAtomic(runPaths(this.dir).config, this.configYaml);
    mkdirSync(runPaths(this.dir).eval, { recursive: true });
  }

  /** Writes a checkpoint of `c.state.step` (keeping the newest `keepLast`), tells `onCheckpoint` (a recipe's event); returns its folder. */
  checkpoint(c: CheckpointOf, options: { keepLast: number; tokenizerFrom?: string; onCheckpoint?: (dir: string, step: number) => void }): string {
    if (this.configYaml === undefined) throw new Error(`${this.dir}: saveConfig before the first checkpoint`);
    const dir = saveCheckpoint(this.dir, { ...c, runConfigYaml: this.configYaml }, { keepLast: options.keepLast, tokenizerFrom: options.tokenizerFrom });
    this.saved = { step: c.state.step, dir };
    options.onCheckpoint?.(dir, c.state.step);
    return dir;
  }

  /** The checkpoint this process saved at `step`, if it did. */
  savedAt(step: number): string | undefined {
    return this.saved?.step === step ? this.saved.dir : undefined;
  }

  /** Writes eval/step-N.jsonl: one JSON object per evaluated example. */
  writeEval(step: number, rows: readonly object[]): void {
    writeAtomic(join(runPaths(this.dir).eval, `step-${String(step).padStart(8, '0')}.jsonl`), rows.map((r) => JSON.stringify(r)).join('\n') + '\n');
  }

  /** The rows of each evaluation up to `step`, read back from eval/step-N.jsonl (a resumed run's earlier ones). */
  readEvals<Row>(step: number): { step: number; rows: Row[] }[] {
    return listEvals(this.dir)
      .filter((e) => e.step <= step)
      .map((e) => ({
        step: e.step,
        rows: readFileSync(e.file, 'utf8')
          .split('\n')
          .filter((l) => l.trim() !== '')
          .map((l, i) => {
            try {
              return JSON.parse(l) as Row;
            } catch {
              throw new Error(`${e.file}:${i + 1}: not valid JSON (an evaluation of the run being resumed)`);
            }
          }),
      }));
  }
}
