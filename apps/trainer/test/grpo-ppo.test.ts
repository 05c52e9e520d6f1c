/**
 * `lathe grpo --estimator gae` (PPO with a learned value model): the value_* and gae_* options reach
 * the trainer as the library's words; a run writes the value model's metrics, freezes the policy
 * for --value_warmup_steps, and refuses what it cannot do yet (LoRA on the critic, --resume).
 */
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { readMetrics } from '@lathe/data';
import { grpoTrainerOptions, runGrpo } from '@lathe/recipes';
import { grpoConfigFromArgv } from '../src/commands/grpo';
import { smallGrpo } from './small-grpo';

const root = mkdtempSync(join(tmpdir(), 'lathe-grpo-ppo-'));

test('--estimator gae: GAE and value-model options map to the trainer’s valueModel; other estimators have none', () => {
  const cfg = grpoConfigFromArgv({ estimator: 'gae', gae_lambda: 1, value_lr: 3e-6, lr: 1e-6, value_warmup_steps: 5, value_clip: 0.5 });
  expect(grpoTrainerOptions(cfg).valueModel).toEqual({ trunk: 'separate', coef: 0.5, gamma: 1, lambda: 1, clip: 0.5, lrScale: 3, warmupSteps: 5 });
  expect(grpoTrainerOptions(grpoConfigFromArgv({ estimator: 'gae', value_trunk: 'shared', value_coef: 0.1 })).valueModel).toEqual({ trunk: 'shared', coef: 0.1, gamma: 1, lambda: 0.95, clip: 0.2, lrScale: 1, warmupSteps: 0 });
  expect(grpoTrainerOptions(grpoConfigFromArgv({})).valueModel).toBeUndefined();
});

test('a PPO run: value metrics each step, the policy frozen during the critic’s warm-up; LoRA and --resume refused', async () => {
  const cfg = smallGrpo(root, 'ppo', { estimator: 'gae', value_warmup_steps: 2, eval_every: 0, save_every: 2 });
  const result = await runGrpo(cfg);
  expect(result.steps).toBe(4);
  const lines = readMetrics(join(root, 'ppo', 'metrics.jsonl')).filter((m) => 'rl_step' in m);
  expect(lines.map((m) => m['value/policy_frozen'])).toEqual([1, 1, 0, 0]);
  expect(lines.map((m) => m.updates)).toEqual([0, 0, 2, 2]);
  // (the explained variance is NaN, so left out, while every reward is 0: the returns do not vary)
  for (const m of lines) for (const k of ['value/loss', 'value/mean', 'value/returns_mean', 'value/grad_norm', 'value/clip_fraction']) expect([k, typeof m[k]]).toEqual([k, 'number']);
  await expect(runGrpo({ ...cfg, steps: 6, resume: true, force: true })).rejects.toThrow('--resume with --estimator gae: checkpoints hold the policy, not yet the value model');
  await expect(runGrpo(smallGrpo(root, 'ppo-lora', { estimator: 'gae', lora_rank: 4 }))).rejects.toThrow('--estimator gae with --lora_rank 4');
  // a shared trunk: values from the policy's scoring pass, no value model of its own
  const shared = await runGrpo(smallGrpo(root, 'ppo-shared', { estimator: 'gae', value_trunk: 'shared', steps: 2, eval_every: 0, save_every: 0 }));
  expect(shared.last!['value/loss']).toEqual(expect.any(Number));
  expect(shared.last!['value/grad_norm']).toBeUndefined();
  await expect(runGrpo(smallGrpo(root, 'ppo-shared-warm', { estimator: 'gae', value_trunk: 'shared', value_warmup_steps: 1 }))).rejects.toThrow('valueModel.warmupSteps 1 with a shared trunk');
});
