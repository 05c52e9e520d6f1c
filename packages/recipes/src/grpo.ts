/**
 * A GRPO-family run, top to bottom (what `lathe grpo` and the demo's RL stage call): load the
 * policy, tokenizer and prompts → build the reward functions → `GrpoTrainer` → loop over RL steps,
 * logging metrics and rollouts, evaluating on held-out prompts and checkpointing → a final
 * evaluation and checkpoint. Resumes exactly from a checkpoint (weights, AdamW state, optimizer and
 * RL steps, data position; sampling noise and minibatch order are functions of the seed and the
 * position) and refuses a resume whose config differs unless forced.
 *
 * Prompts come from a seeded endless stream: each epoch of the training prompts is a new
 * permutation, so a step's prompts are distinct whenever the set holds at least `prompts_per_step`
 * prompts — a smaller set is an error naming the flag.
 */
import { paramCount, readSafetensorsHeader, readTensorBytes, writeSafetensors } from '@lathe/models';
import { existsSync } from 'node:fs';
import { MathGrader, r1ZeroFormatReward } from '@lathe/graders';
import { sizeOf } from '@lathe/runtime';
import { basename, join, resolve } from 'node:path';
import { readRecords, RolloutStore, runPaths } from '@lathe/data';
import { loraFromOptions, type TrainerState } from '@lathe/train';
import { combineRewards, GrpoTrainer, overlongReward, type GrpoAttentionKernel, type GrpoResumeState, type GrpoStepMetrics, type OffPolicyTrace, type RlPrompt } from '@lathe/grpo';
import { additionExamples, BUILTIN_DATA } from './demo-task';
import { readPromptFile } from './generate';
import { grpoTrainerOptions, RESUMABLE_KEYS, type GrpoConfig } from './grpo-config';
import { judgeSource, policyPromptRenderer, withClassmates } from './classmate-config';
import { quantizedFrozenBase } from './quantize-lora';
import { serveTrainingPolicy, type TrainingServe } from './serve-training';
import { combineRewardSources, loadRewardFunctions, parseRewardWeights, rewardModelSource, RewardSourceError, withRewardWeights, type AnyRewardSource } from './reward-sources';
import { checkComputeDtype, EpochStream, loadRunModel, scheduledLr, splitHeldOut, stopRequested } from './scaffold';
import { anyRankStopped, gatherRlStep, joinDataParallel, openRankRunDir } from './launch-dp';
import { checkTrainAttention, openTrainDevice, type TrainAttention, type TrainAttentionConfig } from './train-attention';
import { grpoBenchmarkSampler, TrainBenchmarks, type TrainBenchmarkResult } from './train-eval';

/** A prompt with its reference answer. */
export interface PromptWithAnswer {
  prompt: string;
  answer: string;
  /** Index in the dataset. */
  index: number;
  /** Its off-policy traces as the data gives them (`--off_policy_field`): texts, token ids, or ids with their writer's log-probs. */
  traces?: TraceValue[];
}

/** One off-policy trace as a data row gives it: a text, token ids, or ids with the log-probs of the policy that wrote them. */
export type TraceValue = string | number[] | { tokens: number[]; logprobs: number[] };

/** How a run's off-policy traces were read: prompts without one, traces cut or left out for length. */
export interface OffPolicyDataStats {
  /** Training prompts with no trace (their groups fall back to on-policy samples). */
  promptsWithout: number;
  /** Training prompts in all. */
  prompts: number;
  /** Traces cut to --max_new_tokens (--off_policy_overlong truncate). */
  truncated: number;
  /** Traces left out for length (--off_policy_overlong skip). */
  skipped: number;
}

/** What a `lathe grpo` prompt carries for the reward functions. */
export interface PromptMeta {
  answer: string;
}

/** The metadata reward functions of a `lathe grpo` run read: the prompt's, and the completion's length and stop. */
export interface AnswerMeta extends PromptMeta {
  completionTokens: number;
  stopped: boolean;
}

/** Random-stream keys of sampled evaluation: 2⁴⁰ + the held-out prompt's index (training's keys count prompts drawn from 0). */
const EVAL_KEY_BASE = 2 ** 40;

/** A greedy evaluation on the held-out prompts. */
export interface GrpoEvalResult {
  step: number;
  /** Fraction of greedy completions the correctness reward accepts (NaN with `--reward none`: no answers to check). */
  accuracy: number;
  /** With `--reward none`: the mean trained reward (every source, weighted) of the greedy completions. */
  reward_mean?: number;
  /**
   * With `eval_sampled`: the fraction of G completions per prompt, sampled as rollouts are (the
   * sampling temperature), that the correctness reward accepts — mean@G, what RL optimises.
   */
  sampled_accuracy?: number;
  examples: number;
  response_length_mean: number;
  /**
   * Completions the grader failed on (threw or returned a non-finite value): each is logged with
   * its prompt, scored incorrect, and marked `grader_error` in the eval file.
   */
  grader_failures: number;
}

/** Callbacks for progress display. */
export interface GrpoEvents {
  onStart?(info: { startStep: number; totalSteps: number; trainPrompts: number; evalPrompts: number; parameters: number; trainable: number }): void;
  onStep?(m: GrpoStepMetrics & { step: number }): void;
  onEval?(r: GrpoEvalResult): void;
  onCheckpoint?(dir: string, step: number): void;
  /** A benchmark evaluation (`--eval_benchmarks`) finished. */
  onBenchmarks?(r: TrainBenchmarkResult): void;
  /** `--serve_port`: the policy is served at this base URL. */
  onServe?(url: string): void;
}

/** What a run returns. */
export interface GrpoRunResult {
  steps: number;
  evals: GrpoEvalResult[];
  /** The last step's metrics (undefined when no step ran). */
  last?: GrpoStepMetrics;
  /** Mean reward of each step this invocation ran. */
  stepRewards: number[];
  checkpoint: string;
  interrupted: boolean;
  /** With off-policy traces: how they were read. */
  offPolicy?: OffPolicyDataStats;
  /** With `--eval_benchmarks`: this invocation's benchmark evaluations. */
  benchmarks?: TrainBenchmarkResult[];
}

/** The trainer state a GRPO checkpoint saves: `step` counts RL steps. */
interface GrpoState extends TrainerState {
  /** AdamW steps taken (several per RL step). */
  optimizerStep: number;
  /** The adaptive KL controller's β (with --kl_target). */
  klCoef?: number;
}

/**
 * Training and held-out prompts: the same seeded split `lathe sft` makes (`eval_examples` held
 * out of a permutation seeded by `seed`), so GRPO after SFT on the same data never trains on the
 * SFT run's held-out prompts.
 */
export async function loadPromptSplit(cfg: Pick<GrpoConfig, 'data' | 'seed' | 'eval_examples' | 'prompt_field' | 'answer_field'> & Partial<Pick<GrpoConfig, 'off_policy_field' | 'reward'>>): Promise<{ train: PromptWithAnswer[]; evaluation: PromptWithAnswer[] }> {
  let all: PromptWithAnswer[];
  const field = cfg.off_policy_field ?? '';
  if (cfg.data === BUILTIN_DATA) {
    if (field !== '' && field !== 'answer') throw new Error(`--off_policy_field ${field}: the built-in data has one off-policy field, 'answer' (each problem's solution)`);
    all = additionExamples().map((e, index) => ({ prompt: e.prompt, answer: e.response, index, ...(field ? { traces: [e.response] } : {}) }));
  } else {
    // lathe generate's reader: a missing field is an error naming the row, its fields and the flag
    const prompts = await readPromptFile({ data: cfg.data, prompt_field: cfg.prompt_field, answer_field: cfg.answer_field, limit: 0 }, { answers: cfg.reward === 'none' ? 'optional' : 'required' });
    const traces = field ? (await readRecords(cfg.data)).map((r) => traceValues(r.value[field], `${r.where}: field '${field}' (--off_policy_field)`)) : undefined;
    all = prompts.map((p, index) => ({ prompt: p.prompt, answer: p.answer ?? '', index, ...(traces ? { traces: traces[index] } : {}) }));
  }
  return splitHeldOut(all, cfg, 'prompts');
}

/**
 * A row's off-policy traces: absent or empty is none; a text, a list of token ids, an object
 * {"tokens": ids, "logprobs": the writer's log-probs, one per token}, or a list of those. Anything
 * else is an error naming the row and field.
 */
function traceValues(v: unknown, where: string): TraceValue[] {
  if (v === undefined || v === null || v === '') return [];
  const ids = (x: unknown): x is number[] => Array.isArray(x) && x.length > 0 && x.every((t) => Number.isInteger(t) && (t as number) >= 0);
  const scored = (x: unknown): x is { tokens: number[]; logprobs: number[] } => {
    if (typeof x !== 'object' || x === null || Array.isArray(x)) return false;
    const o = x as Record<string, unknown>;
    return ids(o.tokens) && Array.isArray(o.logprobs) && o.logprobs.length === o.tokens.length && o.logprobs.every((l) => typeof l === 'number' && Number.isFinite(l) && l <= 0);
  };
  const one = (x: unknown): TraceValue | undefined => (typeof x === 'string' ? x : ids(x) ? x.slice() : scored(x) ? { tokens: x.tokens.slice(), logprobs: x.logprobs.slice() } : undefined);
  const single = one(v);
  if (single !== undefined) return [single];
  if (Array.isArray(v) && v.every((x) => one(x) !== undefined)) return v.filter((x) => x !== '').map((x) => one(x)!);
  throw new Error(`${where} is ${JSON.stringify(v).slice(0, 80)}; expected a completion's text, a list of token ids, {"tokens": ids, "logprobs": one finite log-prob ≤ 0 per token}, or a list of those`);
}

/**
 * Tokenises a prompt's traces once: text as the policy's tokenizer encodes a response, EOS
 * appended (an SFT example's response); ids as given, ending in a stop id or not. Traces longer
 * than `maxNewTokens` are cut (flagged) or left out, per `overlong`, and counted in `stats`.
 */
export function encodeTraces(traces: readonly TraceValue[], tok: { encode(text: string): number[]; eosId: number }, o: { maxNewTokens: number; stopIds: readonly number[]; overlong: 'truncate' | 'skip'; vocabSize: number; where: string }, stats: Pick<OffPolicyDataStats, 'truncated' | 'skipped'>): OffPolicyTrace[] {
  const out: OffPolicyTrace[] = [];
  traces.forEach((t, j) => {
    const tokens = typeof t === 'string' ? [...tok.encode(t), tok.eosId] : Array.isArray(t) ? t : t.tokens;
    // the writer's log-probs, when the data carries them: the shaped term then reads π_θ/π_b
    const logprobs = typeof t === 'object' && !Array.isArray(t) ? t.logprobs : undefined;
    const bad = tokens.findIndex((id) => id >= o.vocabSize);
    if (bad >= 0) throw new Error(`${o.where}, trace ${j}: token id ${tokens[bad]} is outside the model's vocabulary of ${o.vocabSize}`);
    if (tokens.length <= o.maxNewTokens) out.push({ tokens, stopped: o.stopIds.includes(tokens[tokens.length - 1]), ...(logprobs ? { logprobs } : {}) });
    else if (o.overlong === 'skip') stats.skipped++;
    else {
      stats.truncated++;
      out.push({ tokens: tokens.slice(0, o.maxNewTokens), stopped: false, truncated: true, ...(logprobs ? { logprobs: logprobs.slice(0, o.maxNewTokens) } : {}) });
    }
  });
  return out;
}

/** The file beside a PPO checkpoint holding its critic: the value model's weights and AdamW moments (or, with a shared trunk, the value head's). */
export const CRITIC_FILE = 'value_model.safetensors';

/** A shared trunk's critic state: the trained tensors the policy's checkpoint leaves out (the value head). */
function sharedHeadState(snap: { values: Map<string, Float32Array>; m: Map<string, Float32Array>; v: Map<string, Float32Array>; optimizerStep: number }, policy: readonly { name: string }[]): NonNullable<GrpoResumeState['valueModel']> {
  const names = new Set(policy.map((p) => p.name));
  const pick = (m: Map<string, Float32Array>) => new Map([...m].filter(([k]) => !names.has(k)));
  return { params: pick(snap.values), m: pick(snap.m), v: pick(snap.v), step: snap.optimizerStep };
}

/** Writes `CRITIC_FILE` atomically: `param/`, `m/` and `v/` tensors by name, the optimizer step in the metadata. */
function saveCriticState(dir: string, s: NonNullable<GrpoResumeState['valueModel']>): void {
  const tensors = (['params', 'm', 'v'] as const).flatMap((k) =>
    [...s[k]].map(([name, x]) => ({ name: `${k === 'params' ? 'param' : k}/${name}`, dtype: 'float32' as const, shape: [x.length], data: new Uint8Array(x.buffer, x.byteOffset, x.byteLength) })),
  );
  writeSafetensors(join(dir, CRITIC_FILE), tensors, { optimizer_step: String(s.step) });
}

/** Reads `CRITIC_FILE` back; a PPO checkpoint without one is an error naming it. */
function loadCriticState(dir: string): NonNullable<GrpoResumeState['valueModel']> {
  const file = join(dir, CRITIC_FILE);
  if (!existsSync(file)) throw new Error(`--resume with --estimator gae: ${dir} has no ${CRITIC_FILE} (the value model's state), so PPO cannot continue exactly; start a new --run_dir from it (--model ${dir})`);
  const { tensors, metadata } = readSafetensorsHeader(file);
  const out = { params: new Map<string, Float32Array>(), m: new Map<string, Float32Array>(), v: new Map<string, Float32Array>(), step: Number(metadata.optimizer_step) };
  for (const t of tensors) {
    const [kind, ...rest] = t.name.split('/');
    const bytes = readTensorBytes(t);
    const x = new Float32Array(bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength));
    (kind === 'param' ? out.params : kind === 'm' ? out.m : out.v).set(rest.join('/'), x);
  }
  return out;
}

/** What `--attention` of a GRPO run depends on (TrainAttentionConfig: GRPO has no packing or CUDA-graph step). */
function grpoAttentionConfig(cfg: GrpoConfig): TrainAttentionConfig {
  return { device: cfg.device as 'cpu' | 'cuda', compute_dtype: cfg.compute_dtype, attention: cfg.attention, quantize_base: cfg.quantize_base, logprob_kernel: cfg.logprob_kernel, rope_kernel: cfg.rope_kernel, swiglu_kernel: cfg.swiglu_kernel };
}

/** The GrpoTrainer's attention options once the device is open: with the kernels, flash attention through them (and the LM head through the log-prob kernel with --logprob_kernel, q/k through the RoPE kernel with --rope_kernel, each MLP's activation through the SwiGLU kernel with --swiglu_kernel). */
function grpoAttention(attention: TrainAttention): { attention?: 'flash'; attentionKernel?: GrpoAttentionKernel } {
  const { attentionKernel: attend, logprobKernel, ropeKernel, swigluKernel } = attention.loss;
  if (attention.choice !== 'kernels' || !attend) return {};
  return { attention: 'flash', attentionKernel: { attend, customOpDomains: attention.trainer.session?.customOpDomains ?? [], ...(logprobKernel ? { logprobKernel } : {}), ...(ropeKernel ? { ropeKernel } : {}), ...(swigluKernel ? { swigluKernel } : {}) } };
}

/** Runs GRPO as configured. `signal` interrupts the run after the current step, with a checkpoint. */
export async function runGrpo(cfg: GrpoConfig, events: GrpoEvents = {}, signal?: AbortSignal): Promise<GrpoRunResult> {
  checkComputeDtype(cfg);
  checkTrainAttention(grpoAttentionConfig(cfg));
  if (!(cfg.temperature > 0)) throw new Error(`--temperature ${cfg.temperature}: RL rollouts need a temperature > 0`);
  if (cfg.group_size < 2 && !['remax', 'reinforce_pp', 'gae'].includes(cfg.estimator)) throw new Error(`--group_size ${cfg.group_size}: --estimator ${cfg.estimator} needs groups of at least 2 (remax, reinforce_pp and gae work with 1)`);
  if (cfg.estimator === 'gae' && cfg.value_lr > 0 && !(cfg.lr > 0)) throw new Error(`--value_lr ${cfg.value_lr} with --lr ${cfg.lr}: the value model's rate is a ratio of --lr, which must be > 0 (a critic trained alone is not supported yet)`);
  if (cfg.estimator === 'gae' && cfg.lora_rank > 0) throw new Error(`--estimator gae with --lora_rank ${cfg.lora_rank}: the value model trains every weight of its own trunk; LoRA on the critic is not supported yet`);
  if (cfg.estimator === 'dr_grpo' && cfg.aggregation !== 'token-sum-norm') {
    // allowed (an ablation), but rarely meant: Dr.GRPO is both changes
    process.stderr.write(`warning: --estimator dr_grpo with --aggregation ${cfg.aggregation}: Dr.GRPO also drops the length normalisation (--aggregation token-sum-norm)\n`);
  }
  if (cfg.off_policy_traces > 0 && cfg.off_policy_field === '') throw new Error(`--off_policy_traces ${cfg.off_policy_traces}: name the data's field of off-policy traces with --off_policy_field${cfg.preset !== 'none' ? ` (--preset ${cfg.preset} mixes them in)` : ''}`);
  if (cfg.reward === 'none' && cfg.eval_sampled) throw new Error('--eval_sampled measures accuracy against the answers, and --reward none reads none (the greedy evaluation reports the reward instead)');
  if (cfg.quantize_base !== 'none') {
    if (cfg.lora_rank === 0) throw new Error(`--quantize_base ${cfg.quantize_base} trains LoRA adapters over a frozen quantized base: set --lora_rank > 0`);
    if (cfg.serve_port > 0) throw new Error(`--serve_port with --quantize_base ${cfg.quantize_base} is not supported: the server reads dense compute-dtype weights, and the policy's are the quantized base plus the adapters; serve with plain LoRA, or serve the checkpoints (lathe serve)`);
  }
  if (cfg.off_policy_traces >= cfg.group_size) throw new Error(`--off_policy_traces ${cfg.off_policy_traces} must be below --group_size ${cfg.group_size} (a group needs on-policy samples)`);
  const rows = cfg.prompts_per_step * cfg.group_size;
  if (rows < cfg.n_minibatches * cfg.micro_batches) throw new Error(`--prompts_per_step ${cfg.prompts_per_step} × --group_size ${cfg.group_size} = ${rows} completions cannot fill --n_minibatches ${cfg.n_minibatches} × --micro_batches ${cfg.micro_batches}`);
  // data parallelism (lathe launch): each rank samples, scores and trains on an equal share of each step's prompts
  const dp = await joinDataParallel({ device: cfg.device as 'cpu' | 'cuda', config: cfg, batch: { rows: cfg.prompts_per_step, microBatches: 1, flags: { batch: '--prompts_per_step', micro: '--micro_batches' } }, gradReduceDtype: cfg.grad_reduce_dtype, gradBucketMb: cfg.grad_bucket_mb });
  if (dp && cfg.serve_port > 0) throw new Error(`--serve_port ${cfg.serve_port} under lathe launch: serving the policy from a data-parallel run is not supported yet`);
  const split = await loadPromptSplit(cfg);
  const train = split.train;
  // held-out evaluations and benchmarks on rank 0 only
  const evaluation = dp && !dp.main ? [] : split.evaluation;
  if (train.length < cfg.prompts_per_step) {
    throw new Error(`--prompts_per_step ${cfg.prompts_per_step} needs at least that many training prompts; ${cfg.data} has ${train.length} after holding out --eval_examples ${cfg.eval_examples} (lower --prompts_per_step, or --eval_examples)`);
  }
  // loaded before anything is compiled: a bad --eval_benchmarks fails at once
  const benchmarks = dp && !dp.main ? undefined : await TrainBenchmarks.load(cfg);
  const run = await openRankRunDir(cfg, dp);
  const model = await loadRunModel({ ...cfg, run_dir: run.dir });
  const encoded = new Map<number, number[]>();
  const idsOf = (p: PromptWithAnswer) => {
    let ids = encoded.get(p.index);
    if (!ids) {
      ids = [...(model.tokenizer.bosId === undefined ? [] : [model.tokenizer.bosId]), ...model.tokenizer.encodePrompt(p.prompt)];
      if (ids.length + cfg.max_new_tokens > model.config.maxPositionEmbeddings) throw new Error(`${cfg.data}: prompt ${p.index} has ${ids.length} tokens; with --max_new_tokens ${cfg.max_new_tokens} it exceeds the model's ${model.config.maxPositionEmbeddings} positions`);
      encoded.set(p.index, ids);
    }
    return ids;
  };
  const eos = model.config.eosTokenId;
  const stopIds = [...new Set([model.tokenizer.eosId, ...(eos === undefined ? [] : Array.isArray(eos) ? eos : [eos])])];
  // Off-policy traces: tokenised once per prompt, counted (prompts without, cut, left out) and said at the start.
  const offPolicy: OffPolicyDataStats | undefined = cfg.off_policy_traces > 0 ? { prompts: train.length, promptsWithout: 0, truncated: 0, skipped: 0 } : undefined;
  const traces = new Map<number, OffPolicyTrace[]>();
  if (offPolicy) {
    for (const p of train) {
      const t = encodeTraces(p.traces ?? [], model.tokenizer, { maxNewTokens: cfg.max_new_tokens, stopIds, overlong: cfg.off_policy_overlong, vocabSize: model.config.vocabSize, where: `${cfg.data} prompt ${p.index}` }, offPolicy);
      if (t.length < cfg.off_policy_traces) offPolicy.promptsWithout++;
      traces.set(p.index, t);
    }
    if (offPolicy.promptsWithout === train.length) throw new Error(`--off_policy_field ${cfg.off_policy_field}: none of the ${train.length} training prompts has ${cfg.off_policy_traces} trace(s) to mix in${offPolicy.skipped ? ` (${offPolicy.skipped} left out as longer than --max_new_tokens ${cfg.max_new_tokens})` : ''}`);
    const notes = [
      offPolicy.promptsWithout ? `${offPolicy.promptsWithout} of ${train.length} training prompts have fewer than ${cfg.off_policy_traces} trace(s): their groups fall back to ${cfg.group_size - cfg.off_policy_traces} on-policy samples (off_policy/missing_groups per step)` : '',
      offPolicy.truncated ? `${offPolicy.truncated} trace(s) cut to --max_new_tokens ${cfg.max_new_tokens} (off_policy/truncated_traces per step)` : '',
      offPolicy.skipped ? `${offPolicy.skipped} trace(s) longer than --max_new_tokens ${cfg.max_new_tokens} left out` : '',
    ].filter(Boolean);
    if (notes.length) process.stderr.write(`off-policy traces (${cfg.off_policy_field}): ${notes.join('; ')}\n`);
  }

  // Rewards: correctness, optional format and overlong shaping, your functions and a reward model,
  // weighted; per-sample failures are counted and logged, a reward model's refuses the step.
  // with --attention kernels (or auto where it picks them) the GPU opens through Lathe's kernels, which the train step and scoring attend through; otherwise generation keeps ONNX Runtime's own stream
  const { device, attention } = openTrainDevice(grpoAttentionConfig(cfg), model.config, { id: dp?.deviceId ?? 0, dataParallel: dp !== undefined, kernelsOnlyForAttention: true });
  const grader = cfg.reward === 'math' ? new MathGrader() : undefined;
  const correct = grader ? async (_p: string, c: string, m: AnswerMeta) => ((await grader.grade(c, m.answer)).correct ? 1 : 0) : (_p: string, c: string, m: AnswerMeta) => (c.trim() === m.answer.trim() ? 1 : 0);
  const sources: AnyRewardSource<AnswerMeta>[] = cfg.reward === 'none' ? [] : [{ name: 'correct', fn: correct }];
  if (cfg.format_reward !== 0) sources.push({ name: 'format', fn: (_p, c) => r1ZeroFormatReward(c), weight: cfg.format_reward });
  if (cfg.overlong_buffer > 0) sources.push({ name: 'overlong', fn: overlongReward({ maxLength: cfg.max_new_tokens, buffer: Math.min(cfg.overlong_buffer, cfg.max_new_tokens), maxPenalty: 1 }) });
  sources.push(...(await loadRewardFunctions<AnswerMeta>(cfg.reward_fn, [...sources.map((s) => s.name), 'rm'])));
  const weights = parseRewardWeights(cfg.reward_weights);
  const rewardModel = cfg.reward_model ? await rewardModelSource<AnswerMeta>(cfg.reward_model, { ...cfg, device, dtype: cfg.compute_dtype, policy: model }) : undefined;
  if (rewardModel) sources.push(rewardModel);
  const judge = judgeSource<AnswerMeta>(cfg);
  if (judge) sources.push(judge);
  if (sources.length === 0) throw new Error('--reward none: give the reward another way (--reward_model, --reward_fn or --format_reward)');
  const rewards = combineRewardSources<AnswerMeta>(withRewardWeights(sources, weights), { fallback: cfg.reward_fallback });
  // classmates continuing each completion's chain of thought (classmate-config.ts); the step trains on base + classmate
  const classmates = await withClassmates<AnswerMeta, PromptMeta>(cfg, rewards, {
    device,
    tokenizer: model.tokenizer,
    maxNewTokens: cfg.max_new_tokens,
    seed: cfg.seed,
    renderPrompt: cfg.classmates ? await policyPromptRenderer(cfg, model.tokenizerFrom) : undefined,
    ...(cfg.prompt_format === 'chat' ? { chat: { enableThinking: cfg.enable_thinking } } : {}),
  });
  // Held-out verdicts through the same failure handling (logged with the prompt, counted): a grader
  // that fails scores the completion incorrect, never crashes the run.
  const verdictOf = combineRewards<AnswerMeta>([{ name: 'correct', fn: correct }], { fallback: 0 });

  // State: fresh, or the latest checkpoint (its config must match unless --force).
  let state: GrpoState = { step: 0, dataPosition: 0, seed: cfg.seed, optimizerStep: 0 };
  let resume: GrpoResumeState | undefined;
  const lora = loraFromOptions(cfg);
  if (run.latest) {
    run.refuseChangedConfig(cfg, RESUMABLE_KEYS);
    const c = run.resume(GrpoTrainer.trainableParams(model.config, lora), { rank: cfg.lora_rank });
    const s = c.state as Partial<GrpoState>;
    if (typeof s.optimizerStep !== 'number') throw new Error(`${join(run.latest.dir, 'trainer_state.json')}: no 'optimizerStep' (not a GRPO checkpoint?)`);
    state = { step: c.state.step, dataPosition: c.state.dataPosition, seed: c.state.seed, optimizerStep: s.optimizerStep, ...(typeof s.klCoef === 'number' ? { klCoef: s.klCoef } : {}) };
    resume = { params: c.values, m: c.m, v: c.v, optimizerStep: state.optimizerStep, rlStep: state.step, klCoef: state.klCoef };
    if (cfg.estimator === 'gae') {
      // PPO's critic: its own state (separate weights), or the value head's, merged into the policy's (shared trunk)
      const critic = loadCriticState(run.latest.dir);
      if (cfg.value_trunk === 'separate') resume.valueModel = critic;
      else for (const k of ['params', 'm', 'v'] as const) critic[k].forEach((x, name) => resume![k].set(name, x));
    }
    // what was logged after the checkpoint (metrics, rollouts, evaluations) is logged again by this run
    run.rewind(state.step);
  }

  const trainer = GrpoTrainer.create<PromptMeta>({
    model: model.lm,
    tokenizer: model.tokenizer,
    stopIds,
    rewards: classmates.rewards,
    ...grpoTrainerOptions(cfg),
    ...grpoAttention(attention),
    lora,
    // QLoRA: the adapters over the base quantized in memory (quantize-lora.ts)
    ...(cfg.quantize_base !== 'none' ? { frozenBase: quantizedFrozenBase(model.config, model.lm.float32Weights(), cfg.quantize_base, cfg.device) } : {}),
    device,
    resume,
    ...(dp ? { dataParallel: { rank: dp.world.rank, worldSize: dp.world.worldSize, allGatherBytes: (b: Uint8Array) => dp.collectives.allGatherBytes(b), trainerOptions: dp.trainerOptions } } : {}),
  });
  classmates.bind(trainer);
  let serving: TrainingServe | undefined;
  if (cfg.serve_port > 0) {
    try {
      serving = await serveTrainingPolicy(trainer, {
        host: cfg.serve_host,
        port: cfg.serve_port,
        id: basename(resolve(cfg.run_dir)),
        tokenizerFrom: model.tokenizerFrom,
        device,
        config: model.config,
        dtype: cfg.compute_dtype,
        stopIds,
        rows: cfg.serve_max_rows,
        maxModelLen: Math.min(model.config.maxPositionEmbeddings, 4096),
      });
    } catch (e) {
      trainer.dispose();
      attention.dispose();
      classmates.dispose();
      throw e;
    }
    events.onServe?.(serving.url);
  }

  run.saveConfig(cfg);
  const store = await RolloutStore.open(runPaths(run.dir).rollouts);

  /** A held-out completion of prompt i as the correctness reward reads it. */
  const heldOutSample = (i: number, c: { text: string; tokens: number[]; stopped: boolean }) => ({ prompt: evaluation[i].prompt, completion: c.text, meta: { answer: evaluation[i].answer, completionTokens: c.tokens.length, stopped: c.stopped } });
  const evaluate = async (): Promise<GrpoEvalResult> => {
    const out = await trainer.generateGreedy(evaluation.map((p) => ({ ids: idsOf(p) })));
    // without answers (--reward none) the held-out completions are scored by the trained reward instead
    const scored = await (cfg.reward === 'none' ? rewards : verdictOf)(out.map((c, i) => heldOutSample(i, c)));
    const verdicts = scored.rewards;
    const errors: (string | undefined)[] = [];
    for (const f of scored.failures) errors[f.index] = `${f.kind}: ${f.detail}`;
    const rowsOut = evaluation.map((p, i) => ({ prompt: p.prompt, expected: p.answer, generated: out[i].text, correct: cfg.reward !== 'none' && verdicts[i] === 1, ...(cfg.reward === 'none' ? { reward: verdicts[i] } : {}), tokens: out[i].tokens.length, ...(errors[i] !== undefined ? { grader_error: errors[i] } : {}) }));
    rowsOut.forEach((r, i) => store.addEval({ step: state.step, dataset: 'heldout', prompt_index: evaluation[i].index, rollout_index: 0, prompt: r.prompt, completion: r.generated, reward: verdicts[i], correct: r.correct, extra: { expected: r.expected, tokens: out[i].tokens, stopped: out[i].stopped }, logprobs: out[i].logprobs ?? null }));
    run.writeEval(state.step, rowsOut);
    const mean = (xs: ArrayLike<number>) => Array.from(xs).reduce((a, b) => a + b, 0) / Math.max(1, xs.length);
    const result: GrpoEvalResult = {
      step: state.step,
      ...(cfg.reward === 'none' ? { accuracy: NaN, reward_mean: mean(verdicts) } : { accuracy: rowsOut.filter((r) => r.correct).length / Math.max(1, rowsOut.length) }), examples: rowsOut.length, response_length_mean: rowsOut.reduce((s, r) => s + r.tokens, 0) / Math.max(1, rowsOut.length), grader_failures: scored.failures.length };
    if (cfg.eval_sampled) {
      // Keys far above any training prompt's (a running count of prompts drawn), one per held-out prompt.
      const groups = await trainer.generateSamples(evaluation.map((p) => ({ ids: idsOf(p), key: EVAL_KEY_BASE + p.index })));
      const flat = groups.flatMap((gr, i) => gr.map((c) => heldOutSample(i, c)));
      const sampled = await verdictOf(flat);
      const G = groups[0]?.length ?? 0;
      groups.forEach((gr, i) => gr.forEach((c, j) => store.addEval({ step: state.step, dataset: 'heldout-sampled', prompt_index: evaluation[i].index, rollout_index: j, prompt: evaluation[i].prompt, completion: c.text, reward: sampled.rewards[i * G + j], correct: sampled.rewards[i * G + j] === 1, extra: { expected: evaluation[i].answer, tokens: c.tokens, stopped: c.stopped }, logprobs: c.logprobs ?? null })));
      result.sampled_accuracy = sampled.rewards.filter((r) => r === 1).length / Math.max(1, flat.length);
      result.grader_failures += sampled.failures.length;
    }
    events.onEval?.(result);
    return result;
  };
  /** An evaluation's entries in metrics.jsonl. */
  const evalMetrics = (r: GrpoEvalResult) => ({ ...(r.reward_mean !== undefined ? { eval_reward_mean: r.reward_mean } : { eval_accuracy: r.accuracy }), ...(r.sampled_accuracy !== undefined ? { eval_sampled_accuracy: r.sampled_accuracy } : {}) });
  const checkpoint = async () => {
    // rank 0 saves the (identical) state of every rank
    if (dp && !dp.main) return run.dir;
    const snap = trainer.snapshot();
    await store.flush(); // rollouts up to the checkpoint are durable with it
    const dir = run.checkpoint({ config: model.config, model: snap.model, trainable: trainer.trainable, values: snap.values, m: snap.m, v: snap.v, state, lora: Boolean(lora) }, { keepLast: cfg.keep_last, tokenizerFrom: model.tokenizerFrom, onCheckpoint: (d, step) => events.onCheckpoint?.(d, step) });
    if (cfg.estimator === 'gae') {
      const critic = snap.valueModel ?? sharedHeadState(snap, trainer.trainable);
      saveCriticState(dir, critic);
    }
    return dir;
  };

  events.onStart?.({
    startStep: state.step,
    totalSteps: cfg.steps,
    trainPrompts: train.length,
    evalPrompts: evaluation.length,
    parameters: paramCount(model.config),
    trainable: trainer.trainable.reduce((s, p) => s + sizeOf(p.shape), 0),
  });
  const stream = new EpochStream<PromptWithAnswer>(train, cfg.seed, state.dataPosition);
  const nextPrompts = (): RlPrompt<PromptMeta>[] => {
    const start = stream.position;
    // every rank reads the same prompts (their keys are stream positions, so a prompt's samples are the same on any rank) and takes its share
    const all = stream.take(cfg.prompts_per_step).map((p, k) => ({ ids: idsOf(p), text: p.prompt, meta: { answer: p.answer }, key: start + k, index: p.index, ...(offPolicy ? { offPolicy: traces.get(p.index) } : {}) }));
    return dp ? dp.shard(all, '--prompts_per_step') : all;
  };
  const evals: GrpoEvalResult[] = [];
  // --eval_benchmarks: sampled as rollouts are, from the live weights, on noise keys of their own
  const benchResults: TrainBenchmarkResult[] = [];
  const benchmarkEval = async (): Promise<TrainBenchmarkResult | undefined> => {
    if (!benchmarks) return undefined;
    const r = await benchmarks.run(state.step, grpoBenchmarkSampler(trainer, model.tokenizer), runPaths(cfg.run_dir).eval);
    benchResults.push(r);
    events.onBenchmarks?.(r);
    return r;
  };
  let last: GrpoStepMetrics | undefined;
  const stepRewards: number[] = [];
  let checkpointDir = '';
  let interrupted = false;
  try {
    if (evaluation.length > 0 && state.step === 0) {
      const r = await evaluate();
      evals.push(r);
      run.metrics.log({ step: 0, ...evalMetrics(r) });
    }
    if (benchmarks && state.step === 0) run.metrics.log({ step: 0, ...(await benchmarkEval())!.entries });
    while (state.step < cfg.steps) {
      const lr = scheduledLr(cfg, state.step);
      const stepped = await trainer.step(() => nextPrompts(), lr).catch(async (e: unknown) => {
        // a reward model's NaN (or another batch source's failure) refuses the step before any update
        if (!(e instanceof RewardSourceError)) throw e;
        throw new Error(`step ${state.step + 1}: ${e.message}; the weights before this step are saved in ${await checkpoint()}`);
      });
      // an error the attention kernels raised inside the step's runs
      attention.check();
      // with data parallelism rank 0 logs every rank's rollouts and the ranks' mean metrics
      const { metrics, rollouts } = dp ? await gatherRlStep(dp, stepped) : stepped;
      // the served policy moves to the weights this step wrote
      await serving?.refresh();
      const klCoef = trainer.adaptiveKlCoef;
      state = { ...state, step: state.step + 1, dataPosition: stream.position, optimizerStep: trainer.trainer.step, ...(klCoef !== undefined ? { klCoef } : {}) };
      last = metrics;
      stepRewards.push(metrics.reward_mean);
      rollouts.forEach((r) =>
        store.addTrain({
          step: state.step,
          epoch: Math.floor((stream.position - 1) / train.length),
          prompt_index: r.promptIndex ?? -1,
          rollout_index: r.sample,
          prompt: r.promptText,
          completion: r.completion,
          reward: r.reward,
          advantage: r.advantage,
          extra: { rewards: r.bySource, tokens: r.tokens, stopped: r.stopped, ...(r.offPolicy ? { off_policy: true } : {}) },
          // per token, for Studio's token view: log π_old and, where re-scoring computed it, its entropy
          ...(r.logprobs ? { logprobs: r.logprobs } : {}),
          ...(r.entropies ? { entropies: r.entropies } : {}),
        }),
      );
      if (metrics.nonfinite_updates > 0) {
        throw new Error(`step ${state.step}: ${metrics.nonfinite_updates} of ${metrics.updates} updates had a non-finite loss and were skipped (the weights kept the last good values); lower --lr or check the rewards`);
      }
      let evalResult: GrpoEvalResult | undefined;
      if (evaluation.length > 0 && ((cfg.eval_every > 0 && state.step % cfg.eval_every === 0) || state.step === cfg.steps)) evals.push((evalResult = await evaluate()));
      const benchResult = (cfg.eval_every > 0 && state.step % cfg.eval_every === 0) || state.step === cfg.steps ? await benchmarkEval() : undefined;
      events.onStep?.({ ...metrics, step: state.step });
      // on the schedule only (not at an interruption), so a resumed run's metrics.jsonl equals an uninterrupted run's
      if (state.step % cfg.log_every === 0 || state.step === cfg.steps || evalResult || benchResult) {
        // NaN (e.g. kl_ref without a reference) is left out rather than written as null
        const finite = Object.fromEntries(Object.entries(metrics).filter(([, v]) => Number.isFinite(v)));
        run.metrics.log({ step: state.step, ...finite, ...(evalResult ? evalMetrics(evalResult) : {}), ...(benchResult?.entries ?? {}) });
      }
      if (cfg.save_every > 0 && state.step % cfg.save_every === 0 && state.step < cfg.steps) await checkpoint();
      if (await anyRankStopped(dp, await stopRequested(signal))) {
        interrupted = true;
        break;
      }
    }
    checkpointDir = run.savedAt(state.step) ?? (await checkpoint());
  } catch (e) {
    // the other ranks would wait for this one at their next collective: tell them why it will not come
    dp?.abort((e as Error).message);
    throw e;
  } finally {
    await serving?.close();
    await store.close();
    trainer.dispose();
    attention.dispose();
    classmates.dispose();
    rewardModel?.dispose();
    await grader?.close();
    await run.close();
    await dp?.close();
  }
  return { steps: state.step, evals, last, stepRewards, checkpoint: checkpointDir, interrupted, ...(offPolicy ? { offPolicy } : {}), ...(benchmarks ? { benchmarks: benchResults } : {}) };
}
