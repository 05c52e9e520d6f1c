/**
 * `lathe grpo --preset luffy` and its baselines: the presets as config sources (under YAML and
 * flags), the same trainer options as the library's words, a run on the built-in task with each
 * problem's solution as its off-policy trace, and the bad inputs — prompts without a trace (counted,
 * the fallback said), traces over the length limit (cut or left out, counted), a malformed trace
 * field (an error naming the row).
 */
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { readMetrics, readTrainRollouts } from '@lathe/data';
import { combineRewards, resolveGrpoOptions } from '@lathe/grpo';
import { CausalLM } from '@lathe/models';
import { defaults, encodeTraces, GRPO_PRESETS, grpoPresetSource, grpoSchema, grpoTrainerOptions, loadPromptSplit, runGrpo, type GrpoConfig } from '@lathe/recipes';
import { grpoConfigFromArgv } from '../src/commands/grpo';
import { smallGrpo } from './small-grpo';

const root = mkdtempSync(join(tmpdir(), 'lathe-grpo-luffy-'));

test('--preset luffy: the recipe under the config file and flags; the library resolves it to the same trainer options', () => {
  const cfg = grpoConfigFromArgv({ preset: 'luffy', off_policy_field: 'solution' });
  expect([cfg.group_size, cfg.off_policy_traces, cfg.estimator, cfg.aggregation, cfg.policy_term, cfg.entropy_coef, cfg.kl_coef, cfg.off_policy_gamma, cfg.off_policy_adv_stats]).toEqual([8, 1, 'dr_grpo', 'token-sum-norm', 'unclipped', 0.001, 0, 0.1, 'group']);
  // a flag, or the YAML file, still changes a preset's value
  expect(grpoConfigFromArgv({ preset: 'luffy', off_policy_gamma: 0.5 }).off_policy_gamma).toBe(0.5);
  const yaml = join(root, 'luffy.yaml');
  writeFileSync(yaml, 'preset: rl-sft-loss\ngroup_size: 4\n');
  const fromYaml = grpoConfigFromArgv({ config: yaml });
  expect([fromYaml.group_size, fromYaml.off_policy_term, fromYaml.off_policy_adv_stats, fromYaml.off_policy_traces]).toEqual([4, 'sft', 'on-policy', 1]);
  expect(grpoConfigFromArgv({}).off_policy_traces).toBe(0);
  expect(grpoPresetSource('none')).toBeUndefined();

  const run = {
    model: CausalLM.random({ architectures: ['Qwen3ForCausalLM'], vocab_size: 8, hidden_size: 16, intermediate_size: 32, num_hidden_layers: 1, num_attention_heads: 2, num_key_value_heads: 1, head_dim: 8, rms_norm_eps: 1e-6, rope_theta: 10000, max_position_embeddings: 32 }),
    tokenizer: { decode: (ids: readonly number[]) => ids.join(' '), padId: 0 },
    stopIds: [3],
    rewards: combineRewards([{ name: 'none', fn: () => 0 }], { fallback: 0 }),
  };
  const library = resolveGrpoOptions({
    ...run,
    ...grpoTrainerOptions(defaults(grpoSchema)),
    groupSize: 8,
    estimator: 'dr_grpo',
    loss: { aggregation: 'token-sum-norm', policyTerm: 'unclipped', entropyCoef: 0.001 },
    kl: { coef: 0 },
    offPolicy: { traces: 1 },
  });
  expect(resolveGrpoOptions({ ...run, ...grpoTrainerOptions(cfg) })).toEqual(library);
});

test('encodeTraces: text is tokenised once with EOS; ids kept; too long is cut (flagged) or left out, and counted', () => {
  const tok = { encode: (t: string) => [...t].map((c) => c.charCodeAt(0) - 96), eosId: 30 };
  const stats = { truncated: 0, skipped: 0 };
  const o = { maxNewTokens: 4, stopIds: [30], overlong: 'truncate' as const, vocabSize: 32, where: 'data.jsonl prompt 3' };
  expect(encodeTraces(['abc', [5, 6], 'abcdef'], tok, o, stats)).toEqual([
    { tokens: [1, 2, 3, 30], stopped: true },
    { tokens: [5, 6], stopped: false },
    { tokens: [1, 2, 3, 4], stopped: false, truncated: true },
  ]);
  expect(encodeTraces(['abcdef', 'ab'], tok, { ...o, overlong: 'skip' }, stats)).toEqual([{ tokens: [1, 2, 30], stopped: true }]);
  expect(stats).toEqual({ truncated: 1, skipped: 1 });
  expect(() => encodeTraces([[1, 40]], tok, o, stats)).toThrow('data.jsonl prompt 3, trace 0: token id 40 is outside the model');
  // ids with their writer's log-probs keep them (cut with the ids)
  expect(encodeTraces([{ tokens: [1, 2, 3, 4, 5], logprobs: [-1, -2, -3, -4, -5] }], tok, o, stats)).toEqual([{ tokens: [1, 2, 3, 4], stopped: false, truncated: true, logprobs: [-1, -2, -3, -4] }]);
});

test('a LUFFY run on the built-in task, its solutions as traces: groups of 3 samples + 1 trace, the split metrics, traces marked in the rollouts', async () => {
  const cfg: GrpoConfig = { ...smallGrpo(root, 'luffy', { steps: 2, eval_every: 0, save_every: 0 }), ...GRPO_PRESETS.luffy, preset: 'luffy', off_policy_field: 'answer', group_size: 4 };
  const result = await runGrpo(cfg);
  expect(result.offPolicy).toEqual({ prompts: expect.any(Number), promptsWithout: 0, truncated: 0, skipped: 0 });
  const lines = readMetrics(join(root, 'luffy', 'metrics.jsonl')).filter((m) => 'rl_step' in m);
  expect(lines).toHaveLength(2);
  for (const m of lines) {
    expect(m['off_policy/share']).toBe(0.25);
    expect(m['off_policy/reward_mean']).toBe(1); // the solutions are correct
    expect(m['off_policy/missing_groups']).toBe(0);
    expect(m['on_policy/reward_mean']).toBeGreaterThanOrEqual(0);
  }
  const rollouts = readTrainRollouts(join(root, 'luffy', 'rollouts.sqlite'));
  const traces = rollouts.filter((r) => (r.extra as { off_policy?: boolean }).off_policy);
  expect(traces).toHaveLength(2 * 4);
  expect(traces.every((r) => r.rollout_index === 3 && r.reward === 1)).toBe(true);
});

test('bad traces: missing ones are counted and fall back to samples; too long ones are cut or left out; a malformed field names the row', async () => {
  const data = join(root, 'traces.jsonl');
  const rows = [
    { prompt: '1+1=', answer: '2', solution: '2' },
    { prompt: '2+2=', answer: '4' },
    { prompt: '3+3=', answer: '6', solution: ['6', '66666666'] },
    { prompt: '4+4=', answer: '8', solution: '' },
    { prompt: '5+5=', answer: '10', solution: { tokens: [2, 1, 12], logprobs: [-0.5, -0.25, -0.1] } },
  ];
  writeFileSync(data, rows.map((r) => JSON.stringify(r)).join('\n') + '\n');
  const base = (run: string, over: Partial<GrpoConfig> = {}) => smallGrpo(root, run, { data, eval_examples: 1, prompts_per_step: 2, steps: 1, eval_every: 0, save_every: 0, off_policy_field: 'solution', off_policy_traces: 1, ...over });
  const cut = await runGrpo(base('cut'));
  // 4 training prompts; which one is held out depends on the seed
  expect(cut.offPolicy!.prompts).toBe(4);
  expect(cut.offPolicy!.promptsWithout).toBeGreaterThanOrEqual(1);
  expect(cut.offPolicy!.truncated + cut.offPolicy!.skipped).toBeLessThanOrEqual(1);
  const skip = await runGrpo(base('skip', { off_policy_overlong: 'skip' }));
  expect(skip.offPolicy!.truncated).toBe(0);
  expect(skip.offPolicy!.skipped).toBe(cut.offPolicy!.truncated);

  await expect(runGrpo(base('no-field', { off_policy_field: '' }))).rejects.toThrow('--off_policy_traces 1: name the data\'s field of off-policy traces with --off_policy_field');
  await expect(runGrpo(base('too-many', { off_policy_traces: 4 }))).rejects.toThrow('--off_policy_traces 4 must be below --group_size 4');
  writeFileSync(data, JSON.stringify({ prompt: '1+1=', answer: '2', solution: { text: '2' } }) + '\n' + rows.slice(1).map((r) => JSON.stringify(r)).join('\n') + '\n');
  await expect(loadPromptSplit({ ...base('bad'), off_policy_field: 'solution' })).rejects.toThrow(`${data}:1: field 'solution' (--off_policy_field) is {"text":"2"}; expected a completion's text, a list of token ids, {"tokens": ids, "logprobs": one finite log-prob ≤ 0 per token}, or a list of those`);
  await expect(loadPromptSplit({ ...defaults(grpoSchema), off_policy_field: 'solution' })).rejects.toThrow("--off_policy_field solution: the built-in data has one off-policy field, 'answer'");
});
