/**
 * One RL step of GrpoTrainer with classmate sampling against the same step without it, at one shape
 * in one process: a random policy and a random classmate of the same shape resident on the same
 * device (its own weights and generation engine), K classmate continuations per completion. Each
 * configuration gets a fresh trainer; the first `warmup` steps (compilation, engine builds) are
 * run and dropped, the step after them is measured and split by phase — generation, scoring,
 * training, rewards (which holds the classmates' sampling, timed on its own as `classmate_s`) and
 * host.
 *
 * Every completion's first half stands for its chain of thought: the policy's tokenizer writes
 * "</think>" after it, so the classmate reads the prompt and that half (text of space-separated
 * ids, which the classmate's tokenizer reads back) and writes the rest.
 */
import { CausalLM, type HfConfig } from '@lathe/models';
import { Device, type DeviceKind } from '@lathe/runtime';
import { classmateScorer, combineRewards, GrpoTrainer, residentClassmate, type ClassmateModel, type GrpoStepMetrics, type RlPrompt } from '@lathe/grpo';

/** What {@link measureClassmateStep} runs. */
export interface ClassmateBenchOptions {
  config: HfConfig;
  device: DeviceKind;
  compute: 'float32' | 'bfloat16';
  prompts: number;
  group: number;
  promptLen: number;
  newTokens: number;
  /** Classmate continuations per completion (K). */
  samples: number;
  /** The classmate's longest continuation. Default `newTokens`. */
  classmateNewTokens?: number;
  /** Steps run and dropped before the measured one. Default 1. */
  warmup?: number;
  engine?: 'kv-cache' | 'graph';
  microBatches?: number;
}

/** One configuration's measured step. */
export interface StepSplit {
  step_s: number;
  generation_s: number;
  scoring_s: number;
  training_s: number;
  rewards_s: number;
  host_s: number;
  /** The classmates' sampling inside rewards_s (0 without classmates). */
  classmate_s: number;
  /** Classmate rows generated (completions with a CoT × K). */
  classmate_rows: number;
  response_length_mean: number;
}

/** Both configurations and the step's cost of classmate sampling. */
export interface ClassmateBenchResult {
  device: string;
  without: StepSplit;
  with: StepSplit;
  /** with.step_s / without.step_s. */
  step_ratio: number;
}

type Meta = Record<string, never>;

/** The measured step of each configuration (see the module comment). */
export async function measureClassmateStep(o: ClassmateBenchOptions): Promise<ClassmateBenchResult> {
  const device = Device.open(o.device);
  const warmup = o.warmup ?? 1;
  const policy = CausalLM.random(o.config, { seed: 1, std: 0.02 });
  const V = policy.config.vocabSize;
  // the first half of a completion is its chain of thought
  const decode = (ids: readonly number[]) => {
    const h = Math.ceil(ids.length / 2);
    return `${ids.slice(0, h).join(' ')} </think> ${ids.slice(h).join(' ')}`.trim();
  };
  const encode = (text: string) => text.split(' ').filter((x) => x !== '' && x !== '</think>').map(Number);
  const even = combineRewards<Meta>([{ name: 'even', fn: (_p, c) => { const ids = encode(c); return ids.length ? ids.filter((x) => x % 2 === 0).length / ids.length : 0; } }], { fallback: 0 });
  let seed = 7;
  const rand = () => ((seed = (Math.imul(seed, 1664525) + 1013904223) >>> 0) / 2 ** 32);
  const promptsOf = (s: number): RlPrompt<Meta>[] =>
    Array.from({ length: o.prompts }, (_, i) => {
      const ids = Array.from({ length: o.promptLen }, () => 1 + Math.floor(rand() * (V - 2)));
      return { ids, text: `${ids.join(' ')} `, meta: {}, key: s * o.prompts + i };
    });

  const run = async (classmate: (ClassmateModel & { dispose(): void }) | undefined): Promise<StepSplit> => {
    let classmateMs = 0;
    let classmateRows = 0;
    const timed: ClassmateModel | undefined = classmate && {
      ...classmate,
      continueTexts: async (texts, k, s) => {
        const t = performance.now();
        const out = await classmate.continueTexts(texts, k, s);
        classmateMs += performance.now() - t;
        classmateRows += texts.length * k;
        return out;
      },
    };
    const rewards = timed ? classmateScorer(even, { classmates: [timed], samples: o.samples, weight: 0.5, tokenMode: 'all' }) : even;
    const trainer = GrpoTrainer.create<Meta>({
      model: policy,
      tokenizer: { decode, padId: 0 },
      stopIds: [V - 1],
      rewards,
      groupSize: o.group,
      maxNewTokens: o.newTokens,
      loss: { aggregation: 'token-mean', clipHigh: 0.28 },
      device,
      compute: o.compute,
      microBatches: o.microBatches ?? 1,
      ...(o.engine ? { generationEngine: o.engine } : {}),
    });
    let m: GrpoStepMetrics | undefined;
    for (let s = 0; s <= warmup; s++) {
      classmateMs = 0;
      classmateRows = 0;
      m = (await trainer.step(promptsOf(s), 1e-5)).metrics;
    }
    trainer.dispose();
    const x = m!;
    return {
      step_s: x.step_ms / 1000,
      generation_s: x.generation_ms / 1000,
      scoring_s: x.scoring_ms / 1000,
      training_s: x.training_ms / 1000,
      rewards_s: x.rewards_ms / 1000,
      host_s: x.host_ms / 1000,
      classmate_s: classmateMs / 1000,
      classmate_rows: classmateRows,
      response_length_mean: x.response_length_mean,
    };
  };

  const without = await run(undefined);
  const classmate = residentClassmate({
    name: 'classmate',
    device,
    model: CausalLM.random(o.config, { seed: 3, std: 0.02 }),
    tokenizer: { encode, decode: (ids) => ids.join(' '), padId: 0 },
    maxNewTokens: o.classmateNewTokens ?? o.newTokens,
    stopIds: [V - 1],
    compute: o.compute,
    engine: o.engine ?? (o.device === 'cuda' ? 'kv-cache' : 'graph'),
  });
  const withClassmate = await run(classmate);
  classmate.dispose();
  return { device: device.name, without, with: withClassmate, step_ratio: withClassmate.step_s / without.step_s };
}
