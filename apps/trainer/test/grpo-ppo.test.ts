/**
 * `lathe grpo --estimator gae` (PPO with a learned value model): the value_* and gae_* options reach
 * the trainer as the library's words; a run writes the value model's metrics, freezes the policy
 * for --value_warmup_steps, checkpoints the critic beside the policy so an interrupted run resumes
 * exactly (separate or shared trunk), and refuses LoRA on the critic.
 */
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { readMetrics } from '@lathe/data';
import { CRITIC_FILE, grpoTrainerOptions, runGrpo, type GrpoConfig, type GrpoEvents } from '@lathe/recipes';
import { grpoConfigFromArgv } from '../src/commands/grpo';
import { smallGrpo } from './small-grpo';

const root = mkdtempSync(join(tmpdir(), 'lathe-grpo-ppo-'));

test('--estimator gae: GAE and value-model options map to the trainer’s valueModel; other estimators have none', () => {
  const cfg = grpoConfigFromArgv({ estimator: 'gae', gae_lambda: 1, value_lr: 3e-6, lr: 1e-6, value_warmup_steps: 5, value_clip: 0.5 });
  expect(grpoTrainerOptions(cfg).valueModel).toEqual({ trunk: 'separate', coef: 0.5, gamma: 1, lambda: 1, clip: 0.5, lrScale: 3, warmupSteps: 5 });
  expect(grpoTrainerOptions(grpoConfigFromArgv({ estimator: 'gae', value_trunk: 'shared', value_coef: 0.1 })).valueModel).toEqual({ trunk: 'shared', coef: 0.1, gamma: 1, lambda: 0.95, clip: 0.2, lrScale: 1, warmupSteps: 0 });
  expect(grpoTrainerOptions(grpoConfigFromArgv({})).valueModel).toBeUndefined();
});

test('refused: LoRA on the critic; a warm-up with a shared trunk; a critic rate over a policy rate of 0', async () => {
  await expect(runGrpo(smallGrpo(root, 'ppo-lora', { estimator: 'gae', lora_rank: 4 }))).rejects.toThrow('--estimator gae with --lora_rank 4');
  await expect(runGrpo(smallGrpo(root, 'ppo-shared-warm', { estimator: 'gae', value_trunk: 'shared', value_warmup_steps: 1 }))).rejects.toThrow('valueModel.warmupSteps 1 with a shared trunk');
  await expect(runGrpo(smallGrpo(root, 'ppo-critic-alone', { estimator: 'gae', lr: 0, value_lr: 1e-3 }))).rejects.toThrow("--value_lr 0.001 with --lr 0: the value model's rate is a ratio of --lr");
});

test.each([['separate'], ['shared']] as const)('PPO with a %s critic: killed after the step-2 checkpoint and resumed, the run equals an uninterrupted one', async (trunk) => {
  const over: Partial<GrpoConfig> = { estimator: 'gae', value_trunk: trunk, eval_every: 0, save_every: 2, ...(trunk === 'separate' ? { value_warmup_steps: 1, value_lr: 3e-3 } : {}) };
  await runGrpo(smallGrpo(root, `straight-${trunk}`, over));
  const straight = readMetrics(join(root, `straight-${trunk}`, 'metrics.jsonl')).filter((m) => 'rl_step' in m);
  // value metrics each step; the separate critic warms up for a step with the policy frozen
  // (the explained variance is NaN, so left out, while every reward is 0: the returns do not vary)
  for (const m of straight) for (const k of ['value/loss', 'value/mean', 'value/returns_mean', 'value/clip_fraction']) expect([k, typeof m[k]]).toEqual([k, 'number']);
  expect(straight.map((m) => [m['value/policy_frozen'], m.updates, typeof m['value/grad_norm']])).toEqual(
    trunk === 'separate' ? [[1, 0, 'number'], [0, 2, 'number'], [0, 2, 'number'], [0, 2, 'number']] : straight.map(() => [0, 2, 'undefined']),
  );
  const crash: GrpoEvents = {
    onStep: (m) => {
      if (m.step === 3) throw new Error('killed');
    },
  };
  await expect(runGrpo(smallGrpo(root, `resumed-${trunk}`, over), crash)).rejects.toThrow('killed');
  expect(existsSync(join(root, `resumed-${trunk}`, 'checkpoints', 'step-00000002', CRITIC_FILE))).toBe(true);
  await runGrpo(smallGrpo(root, `resumed-${trunk}`, { ...over, resume: true }));
  const lines = (run: string) => readMetrics(join(root, run, 'metrics.jsonl')).map(({ step_ms: _s, generation_ms: _g, scoring_ms: _c, training_ms: _t, rewards_ms: _r, host_ms: _h, ...m }) => m);
  expect(lines(`resumed-${trunk}`)).toEqual(lines(`straight-${trunk}`));
  // a PPO checkpoint without its critic cannot continue exactly
  rmSync(join(root, `resumed-${trunk}`, 'checkpoints', 'step-00000004', CRITIC_FILE));
  await expect(runGrpo(smallGrpo(root, `resumed-${trunk}`, { ...over, resume: true, steps: 6, force: true }))).rejects.toThrow(`has no ${CRITIC_FILE} (the value model's state)`);
});
