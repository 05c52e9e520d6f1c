/**
 * `lathe grpo`'s classmate chain-of-thought rewards, LLM-judge reward and truncated importance
 * sampling options (keys mirror the method's verl fork: `classmate_reward_type`,
 * `use_classmate_condition`, `token_level_classmate_reward_mode`, `rollout_is_threshold`; its
 * `adv_estimator` is `--estimator`), and what a run builds from them: classmates resident on the
 * device, the policy itself (self-play), or OpenAI-compatible servers (`name=URL`).
 */
import { readFileSync } from 'node:fs';
import { CausalLM } from '@lathe/models';
import { CLASSMATE_CONDITIONS, CLASSMATE_DEFAULTS, CLASSMATE_REWARD_TYPES, CLASSMATE_TOKEN_MODES, classmateScorer, GRPO_DEFAULTS, GrpoTrainer, judgeRewardSource, residentClassmate, type ClassmateModel, type ClassmateTokenizer, type RewardScorer, type RewardSource } from '@lathe/grpo';
import { DEFAULT_JUDGE_PROMPT } from '@lathe/graders';
import { OpenAiClient } from '@lathe/openai-client';
import type { Device } from '@lathe/runtime';
import { HfTokenizer } from '@lathe/tokenizer';
import type { OptionSchema } from './options';

/** `--rollout_is_threshold` (a general option of the RL loss). */
export const rolloutIsOption = {
  rollout_is_threshold: {
    type: 'number',
    default: GRPO_DEFAULTS.loss.rolloutIsThreshold,
    min: 0,
    describe: `Truncated importance sampling between the sampling engine and the training policy: each token's policy term × min(π_old/π_sample, C) with C this value, ≥ 1 (the default is the classmate method's, as verl's TIS); π_sample is the distribution sampled from (after --top_k/--top_p/--min_p, so filtered rollouts get weights ≤ 1); a rollout with no sampling log-probs gets weight 1 (counted in rollout_is_unweighted_tokens); metrics rollout_is_clip_fraction and rollout_is_weight_mean; 0: off`,
  },
} as const satisfies OptionSchema;

/** The classmate and judge options of `lathe grpo`. */
export const classmateOptions = {
  classmates: {
    type: 'string',
    default: '',
    describe:
      "Classmate models that continue each completion's chain of thought, their success becoming part of the reward: comma-separated name=SOURCE, SOURCE being 'self' (the policy at the step's weights: self-play), a model folder with its tokenizer.json (resident on --device, its own tokenizer: text is exchanged, not ids), or an http(s) URL of an OpenAI-compatible server (its /completions endpoint); '': off",
  },
  classmate_weights: { type: 'string', default: '', describe: "Weights among the classmates, 'name=w,…' (a classmate not named: 1)" },
  classmate_reward_weight: { type: 'number', default: CLASSMATE_DEFAULTS.weight, min: 0, max: 1, describe: "λ: the step's reward is (1 − λ)·base + λ·classmate (source 'classmate')" },
  classmate_samples: { type: 'number', default: CLASSMATE_DEFAULTS.samples, integer: true, min: 1, describe: 'Continuations each classmate samples per completion (K); its reward is their mean grade' },
  classmate_reward_type: {
    type: 'string',
    default: CLASSMATE_DEFAULTS.rewardType,
    choices: CLASSMATE_REWARD_TYPES,
    describe: 'vanilla_reward (the classmate continues the whole CoT), random_truncate (the CoT cut at a uniformly random point first), remove_wo_cot (its success without the CoT subtracted: only reasoning that helps is rewarded)',
  },
  use_classmate_condition: { type: 'string', default: CLASSMATE_DEFAULTS.condition, choices: CLASSMATE_CONDITIONS, describe: "When the main answer is incorrect (source 'correct' 0): the classmate reward as it is (always), 0 and no classmate asked, or negated" },
  token_level_classmate_reward_mode: { type: 'string', default: CLASSMATE_DEFAULTS.tokenMode, choices: CLASSMATE_TOKEN_MODES, describe: "With --estimator grpo_main_classmate_separated: the classmate advantage on the CoT tokens the classmate read (classmate_partial) or on every token (all)" },
  classmate_max_new_tokens: { type: 'number', default: 0, integer: true, min: 0, describe: 'Longest classmate continuation in its tokens; 0: --max_new_tokens' },
  classmate_cot_marker: { type: 'string', default: '', describe: "The CoT is the text before this marker (e.g. 'Answer:'); '': the text inside <think>…</think> (a completion without one gets classmate reward 0, counted in reward/classmate_no_cot/mean)" },
  classmate_fallback: { type: 'string', default: 'fail', describe: "A classmate call that fails (a server down or slow, after its retries): 'fail' stops the step naming the classmate and URL; a number is the classmate reward of every sample of that step, counted in reward/classmate/failures" },
  classmate_server_model: { type: 'string', default: '', describe: "The model name sent to classmate servers; '': the classmate's name" },
  classmate_timeout_s: { type: 'number', default: 60, min: 0.001, describe: 'Per-request timeout of classmate servers and the judge, seconds' },
  classmate_retries: { type: 'number', default: 2, integer: true, min: 0, describe: 'Retries of a failed classmate-server or judge request (network errors, 408, 429, 5xx) before it counts as failed' },
  classmate_concurrency: { type: 'number', default: 8, integer: true, min: 1, describe: 'Requests in flight at once per classmate server and for the judge' },
  judge_url: { type: 'string', default: '', describe: "An LLM judge as one more reward source ('judge'): the OpenAI-compatible API root (e.g. http://127.0.0.1:8000/v1), asked about every completion with --judge_prompt (cached, --classmate_concurrency requests at once, --classmate_timeout_s, --classmate_retries); a reply without a verdict counts as a failure (--reward_fallback); '': none" },
  judge_model: { type: 'string', default: '', describe: 'The judge server’s model name' },
  judge_prompt: { type: 'string', default: '', describe: "A file holding the judge's prompt template ({question}, {response}, {reference}: the prompt, the completion, the answer); '': the graders' correctness prompt" },
  judge_weight: { type: 'number', default: 1, describe: "The judge source's weight (negative: a penalty, e.g. for a sycophancy judge that answers CORRECT when the completion is sycophantic)" },
} as const satisfies OptionSchema;

/** The classmate and judge options' resolved values. */
export interface ClassmateConfig {
  classmates: string;
  classmate_weights: string;
  classmate_reward_weight: number;
  classmate_samples: number;
  classmate_reward_type: (typeof CLASSMATE_REWARD_TYPES)[number];
  use_classmate_condition: (typeof CLASSMATE_CONDITIONS)[number];
  token_level_classmate_reward_mode: (typeof CLASSMATE_TOKEN_MODES)[number];
  classmate_max_new_tokens: number;
  classmate_cot_marker: string;
  classmate_fallback: string;
  classmate_server_model: string;
  classmate_timeout_s: number;
  classmate_retries: number;
  classmate_concurrency: number;
  judge_url: string;
  judge_model: string;
  judge_prompt: string;
  judge_weight: number;
}

/** One `--classmates` entry. */
export interface ClassmateSpec {
  name: string;
  kind: 'self' | 'folder' | 'url';
  source: string;
  weight: number;
}

/** Parses `--classmates` and `--classmate_weights` (errors name the flag and the entry). */
export function parseClassmates(list: string, weights = ''): ClassmateSpec[] {
  const w = new Map<string, number>();
  for (const entry of weights.split(',').map((s) => s.trim()).filter(Boolean)) {
    const [k, v, extra] = entry.split('=');
    const x = Number(v);
    if (!k || v === undefined || extra !== undefined || !Number.isFinite(x) || x < 0) throw new Error(`--classmate_weights: '${entry}' is not name=weight with a weight ≥ 0`);
    w.set(k.trim(), x);
  }
  const specs = list
    .split(',')
    .map((s) => s.trim())
    .filter(Boolean)
    .map((entry): ClassmateSpec => {
      const at = entry.indexOf('=');
      if (at <= 0 || at === entry.length - 1) throw new Error(`--classmates: '${entry}' is not name=SOURCE (SOURCE: self, a model folder or an http(s) URL)`);
      const name = entry.slice(0, at).trim();
      const source = entry.slice(at + 1).trim();
      const kind = source === 'self' ? 'self' : /^https?:\/\//.test(source) ? 'url' : 'folder';
      return { name, kind, source, weight: w.get(name) ?? 1 };
    });
  const names = new Set<string>();
  for (const s of specs) {
    if (names.has(s.name)) throw new Error(`--classmates: two classmates are named '${s.name}'`);
    names.add(s.name);
  }
  for (const k of w.keys()) if (!names.has(k)) throw new Error(`--classmate_weights: '${k}' is not a classmate (--classmates names ${[...names].join(', ') || 'none'})`);
  return specs;
}

/** Options of {@link remoteClassmate}. */
export interface RemoteClassmateOptions {
  name: string;
  /** The API root, e.g. http://127.0.0.1:8000/v1. */
  url: string;
  /** The model name sent. Default `name`. */
  model?: string;
  weight?: number;
  maxTokens: number;
  temperature?: number;
  timeoutMs?: number;
  retries?: number;
  /** Requests in flight at once. Default 8. */
  concurrency?: number;
}

/**
 * A classmate behind an OpenAI-compatible server: one /completions request per text with `n` = K
 * (at most `concurrency` in flight), retried on network errors, timeouts, 408, 429 and 5xx; once
 * retries are spent the error names the URL.
 */
export function remoteClassmate(o: RemoteClassmateOptions): ClassmateModel & { client: OpenAiClient } {
  const client = new OpenAiClient({ baseUrl: o.url, timeoutMs: o.timeoutMs ?? 60_000, maxRetries: o.retries ?? 2 });
  const limit = o.concurrency ?? 8;
  return {
    name: o.name,
    weight: o.weight,
    where: o.url,
    client,
    continueTexts: (texts, k, seed) =>
      mapPool(texts, limit, async (text, i) => {
        const r = await client.completions({ model: o.model ?? o.name, prompt: text, n: k, max_tokens: o.maxTokens, temperature: o.temperature ?? 1, seed: (seed + i) >>> 0 });
        const choices = [...r.choices].sort((a, b) => a.index - b.index);
        if (choices.length !== k) throw new Error(`${o.url}/completions answered ${choices.length} choices for n = ${k}`);
        return choices.map((c) => c.text);
      }),
  };
}

/** `fn` over `items` with at most `limit` calls in flight, results in order. */
export async function mapPool<T, R>(items: readonly T[], limit: number, fn: (item: T, index: number) => Promise<R>): Promise<R[]> {
  const out = new Array<R>(items.length);
  let next = 0;
  const worker = async () => {
    while (next < items.length) {
      const i = next++;
      out[i] = await fn(items[i], i);
    }
  };
  await Promise.all(Array.from({ length: Math.min(limit, items.length) }, worker));
  return out;
}

/** What a run needs to build its classmates. */
export interface ClassmateContext {
  device: Device;
  /** The policy's tokenizer (the self-play classmate reads with it). */
  tokenizer: ClassmateTokenizer;
  /** The policy's stop ids (a self-play classmate's); a resident classmate stops at its tokenizer's EOS. */
  maxNewTokens: number;
  /**
   * Renders a prompt as the policy reads it (its chat template, with `--prompt_format chat`): what the
   * self-play and server classmates continue (a server's /completions endpoint takes text as given).
   */
  renderPrompt?: (prompt: string) => string;
  /**
   * With `--prompt_format chat`: a resident classmate renders the prompt with its own tokenizer's chat
   * template, thinking switched as the policy's (`--enable_thinking`), then the CoT prefix follows.
   */
  chat?: { enableThinking: boolean };
  seed: number;
}

/** Renders a prompt as the user turn of `tok`'s chat template with the assistant's turn opened (the policy's `--prompt_format chat`). */
export function chatPromptRenderer(tok: Pick<HfTokenizer, 'applyChatTemplate'>, enableThinking: boolean): (prompt: string) => string {
  return (prompt) => tok.applyChatTemplate([{ role: 'user', content: prompt }], { addGenerationPrompt: true, enableThinking });
}

/** The policy's prompt rendering for classmates: its tokenizer folder's chat template with `--prompt_format chat`, else none (the raw prompt). */
export async function policyPromptRenderer(cfg: { prompt_format: string; enable_thinking: boolean }, tokenizerFrom: string | undefined): Promise<((prompt: string) => string) | undefined> {
  if (cfg.prompt_format !== 'chat' || !tokenizerFrom) return undefined;
  return chatPromptRenderer(await HfTokenizer.fromFolder(tokenizerFrom), cfg.enable_thinking);
}

/** The judge source from `--judge_url` (undefined when it is ''). */
export function judgeSource<M extends { answer?: string }>(cfg: ClassmateConfig): RewardSource<M> | undefined {
  if (!cfg.judge_url) return undefined;
  if (!cfg.judge_model) throw new Error('--judge_url needs --judge_model (the model name the judge server serves)');
  const promptTemplate = cfg.judge_prompt ? readFileSync(cfg.judge_prompt, 'utf8') : DEFAULT_JUDGE_PROMPT;
  return judgeRewardSource<M>(
    { baseUrl: cfg.judge_url, model: cfg.judge_model, promptTemplate, concurrency: cfg.classmate_concurrency, timeoutMs: cfg.classmate_timeout_s * 1000, maxRetries: cfg.classmate_retries },
    { name: 'judge', weight: cfg.judge_weight, reference: (m) => m.answer },
  );
}

/**
 * `base` with classmate rewards when `--classmates` names any (else `base` itself), the resources
 * to free with the run, and `bind`, to call with the trainer once it exists (self-play reads it).
 */
export async function withClassmates<M, P = M>(cfg: ClassmateConfig, base: RewardScorer<M>, ctx: ClassmateContext): Promise<{ rewards: RewardScorer<M>; classmates: ClassmateModel[]; bind: (t: GrpoTrainer<P>) => void; dispose: () => void }> {
  const specs = parseClassmates(cfg.classmates, cfg.classmate_weights);
  if (specs.length === 0) return { rewards: base, classmates: [], bind: () => undefined, dispose: () => undefined };
  const render = ctx.renderPrompt;
  const policyFormat = render ? (prompt: string, prefix: string) => render(prompt) + prefix : undefined;
  const fallback = cfg.classmate_fallback === 'fail' ? undefined : Number(cfg.classmate_fallback);
  if (fallback !== undefined && !Number.isFinite(fallback)) throw new Error(`--classmate_fallback: '${cfg.classmate_fallback}' is neither 'fail' nor a number`);
  const maxNew = cfg.classmate_max_new_tokens || ctx.maxNewTokens;
  let trainer: GrpoTrainer<P> | undefined;
  const owned: { dispose(): void }[] = [];
  const classmates: ClassmateModel[] = [];
  for (const s of specs) {
    if (s.kind === 'self') {
      classmates.push(
        GrpoTrainer.selfPlayClassmate(
          () => {
            if (!trainer) throw new Error('the self-play classmate was called before the trainer was bound');
            return trainer;
          },
          { name: s.name, tokenizer: ctx.tokenizer, maxNewTokens: maxNew, weight: s.weight },
        ),
      );
    } else if (s.kind === 'url') {
      classmates.push(remoteClassmate({ name: s.name, url: s.source, model: cfg.classmate_server_model || s.name, weight: s.weight, maxTokens: maxNew, timeoutMs: cfg.classmate_timeout_s * 1000, retries: cfg.classmate_retries, concurrency: cfg.classmate_concurrency }));
    } else {
      const where = `--classmates ${s.name}=${s.source}`;
      let lm: CausalLM;
      let tok: HfTokenizer;
      try {
        lm = CausalLM.fromPretrainedSync(s.source);
        tok = await HfTokenizer.fromFolder(s.source);
      } catch (e) {
        throw new Error(`${where}: ${e instanceof Error ? e.message : String(e)}`);
      }
      if (ctx.chat && !tok.hasChatTemplate) throw new Error(`${where}: --prompt_format chat, and this classmate's tokenizer has no chat template to render the prompt with`);
      const own = ctx.chat && chatPromptRenderer(tok, ctx.chat.enableThinking);
      const c = residentClassmate({
        name: s.name,
        device: ctx.device,
        model: lm,
        tokenizer: { encode: (t) => tok.encode(t), decode: (ids) => tok.decode([...ids]), padId: tok.padId },
        maxNewTokens: maxNew,
        stopIds: [tok.eosId],
        engine: ctx.device.kind === 'cuda' ? 'kv-cache' : 'graph',
        weight: s.weight,
        ...(own ? { formatText: (prompt: string, prefix: string) => own(prompt) + prefix } : {}),
      });
      classmates.push(c);
      owned.push(c);
    }
  }
  const rewards = classmateScorer<M>(base, {
    classmates,
    samples: cfg.classmate_samples,
    weight: cfg.classmate_reward_weight,
    rewardType: cfg.classmate_reward_type,
    condition: cfg.use_classmate_condition,
    tokenMode: cfg.token_level_classmate_reward_mode,
    cot: cfg.classmate_cot_marker ? { marker: cfg.classmate_cot_marker } : undefined,
    fallbackReward: fallback,
    seed: ctx.seed,
    // the self-play and server classmates read the prompt as the policy does; resident ones bring their own template
    ...(policyFormat ? { formatText: policyFormat } : {}),
  });
  return {
    rewards,
    classmates,
    bind: (t) => {
      trainer = t;
    },
    dispose: () => owned.forEach((x) => x.dispose()),
  };
}
