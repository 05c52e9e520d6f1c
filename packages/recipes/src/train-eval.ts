/**
 * Benchmark evaluation during training (`lathe sft` and `lathe grpo` with `--eval_benchmarks`):
 * at each evaluation (before the first step, every `--eval_every` steps, after the last) the chosen
 * benchmarks are sampled from the live weights and graded as `lathe eval` grades them, and their
 * avg@n is logged as `eval/<benchmark>/avg@n` in metrics.jsonl.
 *
 * Evaluation never changes what is trained: its samples read noise streams of their own — keys
 * from {@link BENCHMARK_KEY_BASE}, far above any training prompt's — fixed for the run, so every
 * evaluation draws the same noise (differences between evaluations are the weights'), and nothing
 * it does moves the data stream, the training's noise or the optimizer.
 */
import { paramSpecs, type DecoderConfig } from '@lathe/models';
import { ComputeWeights, GenerationRunner, KvGenerationRunner, type BoundWeights, type GrpoTrainer, type PolicyWeights, type RolloutGenerator } from '@lathe/grpo';
import { chooseGenerationEngine } from '@lathe/rollout';
import type { Device } from '@lathe/runtime';
import { castWeights } from '@lathe/train';
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { evaluateBenchmarks, writeEvalRows, type EvalCompletion, type EvalSampler } from './eval';
import { loadBenchmark, parseBenchmarkList, type BenchmarkProblem } from './eval-benchmarks';
import { renderEvalTemplate } from './eval-config';
import type { BenchmarkMetrics } from './eval-metrics';
import type { TrainEvalConfig } from './train-eval-config';
import type { RunTokenizer } from './scaffold';

/** Noise keys of benchmark samples start here (held-out sampled evaluation uses 2⁴⁰ + index; training counts prompts from 0). */
export const BENCHMARK_KEY_BASE = 2 ** 41;

/** One benchmark evaluation during training. */
export interface TrainBenchmarkResult {
  step: number;
  /** Per benchmark, as `lathe eval` computes them. */
  metrics: Record<string, BenchmarkMetrics>;
  /** Mean avg@n over the benchmarks. */
  average: number;
  /** Samples drawn, and the evaluation's wall time in seconds. */
  samples: number;
  seconds: number;
  /** What metrics.jsonl gets: `eval/<benchmark>/avg@n` per benchmark (n the samples per problem). */
  entries: Record<string, number>;
  /** The completions and verdicts, as `lathe eval` saves them (re-gradable with readEvalRows), when a folder was given. */
  file?: string;
}

/** The metrics.jsonl entries of an evaluation: avg@n per benchmark, and their mean when there are several. */
export function benchmarkEntries(metrics: Readonly<Record<string, BenchmarkMetrics>>, n: number, average: number): Record<string, number> {
  const out: Record<string, number> = {};
  for (const [b, m] of Object.entries(metrics)) out[`eval/${b}/avg@${n}`] = m.avgAtN;
  if (Object.keys(metrics).length > 1) out[`eval/average/avg@${n}`] = average;
  return out;
}

/**
 * The benchmarks of a training run, loaded once (so a bad name or file fails before training
 * starts); `undefined` when `--eval_benchmarks` is empty. Errors name the flag.
 */
export class TrainBenchmarks {
  private constructor(
    readonly problems: readonly BenchmarkProblem[],
    private readonly cfg: TrainEvalConfig,
  ) {}

  static async load(cfg: TrainEvalConfig): Promise<TrainBenchmarks | undefined> {
    if (cfg.eval_benchmarks.trim() === '') return undefined;
    const flag = (e: unknown) => new Error(`--eval_benchmarks ${cfg.eval_benchmarks}: ${(e as Error).message}`);
    let names: string[];
    try {
      names = parseBenchmarkList(cfg.eval_benchmarks);
    } catch (e) {
      throw flag(e);
    }
    try {
      renderEvalTemplate(cfg.eval_template, 'x');
    } catch (e) {
      throw new Error((e as Error).message.replace('--prompt_template', '--eval_template'));
    }
    const problems: BenchmarkProblem[] = [];
    for (const b of names) {
      try {
        problems.push(...(await loadBenchmark(b, { dir: cfg.eval_data_dir, limit: cfg.eval_limit })));
      } catch (e) {
        throw flag(new Error((e as Error).message.replace('--data_dir', '--eval_data_dir')));
      }
    }
    return new TrainBenchmarks(problems, cfg);
  }

  /**
   * Samples and grades every problem at the current weights (through `sampler`); with `dir`, the
   * completions go to `<dir>/benchmarks-step-<step>.parquet` (the run's eval/ folder).
   */
  async run(step: number, sampler: EvalSampler, dir?: string): Promise<TrainBenchmarkResult> {
    const n = this.cfg.eval_samples;
    const r = await evaluateBenchmarks(this.problems, sampler, { samples: () => n, template: this.cfg.eval_template, passK: [1], grader: { casWorkers: 1 } });
    const file = dir === undefined ? undefined : join(dir, `benchmarks-step-${String(step).padStart(8, '0')}.parquet`);
    if (file) {
      mkdirSync(dir!, { recursive: true });
      await writeEvalRows(file, r.rows, `step ${step}`);
    }
    return { step, metrics: r.metrics, average: r.average, samples: r.rows.length, seconds: r.timing.totalS, entries: benchmarkEntries(r.metrics, n, r.average), ...(file ? { file } : {}) };
  }
}

/** A prompt's ids as a training run encodes its prompts: BOS (if any), then the prompt format's encoding. */
function promptIds(tokenizer: RunTokenizer, text: string): number[] {
  return [...(tokenizer.bosId === undefined ? [] : [tokenizer.bosId]), ...tokenizer.encodePrompt(text)];
}

/** Whether a prompt's ids end inside an open `<think>` (its completions start in the thinking block). */
function opensThink(tokenizer: RunTokenizer, ids: readonly number[]): boolean {
  return /<think>\s*$/.test(tokenizer.decode(ids.slice(-8)));
}

/** A completion row of a generator as the grading loop reads it. */
function completionOf(tokenizer: RunTokenizer, key: number, sampleIdx: number, c: { tokens: readonly number[]; stopped: boolean }, think: boolean): EvalCompletion {
  return { key, sampleIdx, text: tokenizer.decode(c.stopped ? c.tokens.slice(0, -1) : c.tokens), finishReason: c.stopped ? 'stop' : 'length', outputTokens: c.tokens.length, opensThink: think };
}

/**
 * A GRPO run's sampler: the trainer's own rollout sampling (`generateSamples`: same temperature,
 * filters and `--max_new_tokens`) at its live weights. Sample j of problem k is sample j mod G of
 * the group keyed BENCHMARK_KEY_BASE + k·1024 + ⌊j / G⌋.
 */
export function grpoBenchmarkSampler(trainer: Pick<GrpoTrainer<unknown>, 'generateSamples'>, tokenizer: RunTokenizer): EvalSampler {
  return async function* (requests) {
    const ids = requests.map((r) => promptIds(tokenizer, r.text));
    const think = ids.map((x) => opensThink(tokenizer, x));
    const draw = (round: number, of: readonly number[]) => trainer.generateSamples(of.map((i) => ({ ids: ids[i], key: BENCHMARK_KEY_BASE + requests[i].key * 1024 + round })));
    // the first round tells the group size; further rounds only for problems that need more samples
    let of = requests.map((_, i) => i);
    for (let round = 0, G = 0; of.length > 0; round++) {
      const groups = await draw(round, of);
      G ||= groups[0]?.length ?? 0;
      if (G === 0) throw new Error('internal: the trainer sampled no completions for benchmark problems');
      for (const [k, i] of of.entries()) {
        for (const [j, c] of groups[k].entries()) {
          const idx = round * G + j;
          if (idx < requests[i].samples) yield completionOf(tokenizer, requests[i].key, idx, c, think[i]);
        }
      }
      of = of.filter((i) => requests[i].samples > (round + 1) * G);
    }
  };
}

/**
 * An SFT run's sampler over the float32 weights it is given (the trainer's live buffers, or LoRA
 * merged into the base), sampled at `--eval_temperature` / `--eval_top_p` up to `--max_new_tokens`:
 * the KV-cache engine in the training's compute dtype where it runs (the weights cast into its own
 * buffers at each evaluation, which it frees afterwards), else the in-graph generation loop. Sample
 * j of problem k reads noise stream BENCHMARK_KEY_BASE + k·65536 + j of the run's seed, so the
 * samples do not depend on the engine or on which problems share a run.
 */
export class SftBenchmarkSampler {
  private constructor(
    private readonly runner: RolloutGenerator,
    private readonly owned: { dispose(): void; release?(): void }[],
    private readonly tokenizer: RunTokenizer,
    private readonly o: { seed: number; maxNewTokens: number; stopIds: readonly number[] },
    /** Which engine samples. */
    readonly engine: 'kv-cache' | 'graph',
  ) {}

  static create(device: Device, config: DecoderConfig, tokenizer: RunTokenizer, o: { temperature: number; topP: number; seed: number; maxNewTokens: number; compute: 'float32' | 'bfloat16'; engine?: 'auto' | 'kv-cache' | 'graph' }): SftBenchmarkSampler {
    const policy: PolicyWeights = { trainable: paramSpecs(config).map((p) => ({ name: p.name, shape: p.shape, decay: false })), weights: (_g, t) => castWeights(t, o.compute) };
    const opts = { groupSize: 1, sampling: { temperature: o.temperature, ...(o.temperature > 0 && o.topP < 1 ? { topP: o.topP } : {}) }, padId: tokenizer.padId, promptsPerRun: 64 };
    const call = { seed: o.seed, maxNewTokens: o.maxNewTokens, stopIds: [tokenizer.eosId] };
    if (chooseGenerationEngine(o.engine ?? 'auto', config, device.kind, o.compute).engine === 'kv-cache') {
      const weights = new ComputeWeights(device, config, policy, o.compute);
      const runner = KvGenerationRunner.create(device, config, { ...opts, weights });
      return new SftBenchmarkSampler(runner, [runner, weights], tokenizer, call, 'kv-cache');
    }
    const runner = GenerationRunner.create(device, config, { ...policy, weights: (_g, t) => castWeights(t, 'float32') }, opts);
    return new SftBenchmarkSampler(runner, [runner], tokenizer, call, 'graph');
  }

  /** The sampler over `weights` (float32, by HF name). */
  sampler(weights: BoundWeights): EvalSampler {
    const { runner, owned, tokenizer, o } = this;
    return async function* (requests) {
      const jobs = requests.flatMap((r) => {
        const ids = promptIds(tokenizer, r.text);
        const think = opensThink(tokenizer, ids);
        return Array.from({ length: r.samples }, (_, j) => ({ key: r.key, j, ids, think }));
      });
      let out;
      try {
        out = await runner.generate([weights], jobs.map((x) => x.ids), { maxNewTokens: o.maxNewTokens, stopIds: o.stopIds, seed: o.seed, keys: jobs.map((x) => BENCHMARK_KEY_BASE + x.key * 65536 + x.j) });
      } finally {
        release();
      }
      for (const [i, x] of jobs.entries()) yield completionOf(tokenizer, x.key, x.j, out[i], x.think);
    };
    // the engine's caches and weight copy go back to training between evaluations
    function release(): void {
      for (const x of owned) x.release?.();
    }
  }

  dispose(): void {
    for (const x of this.owned) x.dispose();
  }
}
