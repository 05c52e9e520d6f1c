/**
 * One set of GRPO defaults: `lathe grpo`'s resolved config, mapped to trainer options, resolves to
 * the same trainer options as the library given the same words — whatever the flags leave out is
 * the library's default (`GRPO_DEFAULTS`), including the KL estimator in reward mode.
 */
import { defaults, grpoSchema, grpoTrainerOptions, resolveConfig } from '@lathe/recipes';
import { combineRewards, GRPO_DEFAULTS, resolveGrpoOptions, type GrpoAlgorithmOptions, type ResolvedGrpoOptions } from '@lathe/grpo';
import { CausalLM } from '@lathe/models';

/** What a run supplies besides the algorithm: the same objects on both sides. */
const run = {
  model: CausalLM.random({ architectures: ['Qwen3ForCausalLM'], vocab_size: 8, hidden_size: 16, intermediate_size: 32, num_hidden_layers: 1, num_attention_heads: 2, num_key_value_heads: 1, head_dim: 8, rms_norm_eps: 1e-6, rope_theta: 10000, max_position_embeddings: 32 }),
  tokenizer: { decode: (ids: readonly number[]) => ids.join(' '), padId: 0 },
  stopIds: [3],
  rewards: combineRewards([{ name: 'none', fn: () => 0 }], { fallback: 0 }),
};

/** The command's own values, which the library leaves to its caller (it has no default for them). */
const command = { groupSize: 8, maxNewTokens: 256, kl: { coef: 0.04 } };

const fromCli = (flags: Record<string, unknown>): ResolvedGrpoOptions<unknown> => resolveGrpoOptions({ ...run, ...grpoTrainerOptions(resolveConfig(grpoSchema, [{ name: 'command line', values: flags }])) });
const fromLibrary = (words: GrpoAlgorithmOptions): ResolvedGrpoOptions<unknown> => resolveGrpoOptions({ ...run, ...command, ...words });

test.each<[string, Record<string, unknown>, Partial<GrpoAlgorithmOptions>]>([
  ['no flags', {}, {}],
  ['KL as a reward penalty', { kl_mode: 'reward', kl_coef: 0.1 }, { kl: { coef: 0.1, mode: 'reward' } }],
  ['adaptive KL', { kl_mode: 'reward', kl_target: 0.05 }, { kl: { coef: 0.04, mode: 'reward', target: 0.05 } }],
  ['an explicit estimator', { kl_mode: 'reward', kl_estimator: 'k2' }, { kl: { coef: 0.04, mode: 'reward', estimator: 'k2' } }],
  ['no KL', { kl_coef: 0 }, { kl: { coef: 0 } }],
  ['no truncated importance sampling', { rollout_is_threshold: 0 }, { loss: { rolloutIsThreshold: 0 } }],
  [
    'ReMax, Dr.GRPO aggregation, clip-higher, several updates, generation log-probs',
    { estimator: 'remax', aggregation: 'token-sum-norm', clip_high: 0.28, n_minibatches: 4, epochs: 2, micro_batches: 2, old_logprobs: 'generation', group_size: 4 },
    { estimator: 'remax', loss: { aggregation: 'token-sum-norm', clipHigh: 0.28 }, minibatches: 4, epochs: 2, microBatches: 2, oldLogprobs: 'generation', groupSize: 4 },
  ],
  ['sampling filters and dynamic sampling', { top_k: 20, temperature: 0.7, dynamic_sampling: true, max_sampling_rounds: 5 }, { sampling: { temperature: 0.7, topK: 20 }, dynamicSampling: { maxRounds: 5 } }],
])('%s: the CLI and the library resolve to the same trainer options', (_name, flags, words) => {
  expect(fromCli(flags)).toEqual(fromLibrary({ ...command, ...words }));
});

test("KL in reward mode uses k1 from the CLI and the library alike (verl's kl_penalty default), k3 in the loss", () => {
  expect(fromCli({ kl_mode: 'reward' }).kl.estimator).toBe('k1');
  expect(fromLibrary({ ...command, kl: { coef: 0.04, mode: 'reward' } }).kl.estimator).toBe('k1');
  expect(fromCli({}).kl.estimator).toBe('k3');
  expect(fromLibrary(command).kl.estimator).toBe('k3');
  expect(fromCli({ kl_mode: 'reward', kl_estimator: 'k3' }).kl.estimator).toBe('k3');
});

test("the schema's defaults are the library's", () => {
  const d = defaults(grpoSchema);
  expect([d.clip_low, d.clip_high, d.aggregation, d.policy_term, d.ratio, d.entropy_coef, d.rollout_is_threshold]).toEqual([GRPO_DEFAULTS.loss.clipLow, GRPO_DEFAULTS.loss.clipHigh, GRPO_DEFAULTS.loss.aggregation, GRPO_DEFAULTS.loss.policyTerm, GRPO_DEFAULTS.loss.ratio, GRPO_DEFAULTS.loss.entropyCoef, GRPO_DEFAULTS.loss.rolloutIsThreshold]);
  expect([d.kl_mode, d.kl_horizon, d.kl_estimator]).toEqual([GRPO_DEFAULTS.kl.mode, GRPO_DEFAULTS.kl.horizon, 'auto']);
  expect([d.epochs, d.n_minibatches, d.micro_batches, d.old_logprobs, d.seed, d.temperature]).toEqual([GRPO_DEFAULTS.epochs, GRPO_DEFAULTS.minibatches, GRPO_DEFAULTS.microBatches, GRPO_DEFAULTS.oldLogprobs, GRPO_DEFAULTS.seed, GRPO_DEFAULTS.temperature]);
});
