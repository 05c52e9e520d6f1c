/**
 * PPO with GAE (`estimator: gae`, a separate critic) learns the demo task from a short SFT
 * checkpoint, and its critic predicts the returns better than a constant (issue 27). A slow suite
 * (`npm run test:slow`): ~1.5 min on 2 idle cores (SFT ~20 s, PPO ~70 s), 5.5 min sharing them with
 * another run.
 *
 * The SFT stage is cut to 300 of the demo's 1000 steps so that the policy leaves room to improve;
 * PPO then runs 150 steps of 64 prompts × 4 samples at lr 3e-4, the critic at 1e-3 after 10
 * warm-up steps with the policy frozen. The thresholds below sit under what seed 0 measures (the
 * comments beside them); docs/guides/ppo.md has the run's figures, a control with lr 0 (which fails
 * the reward, sampled-accuracy and explained-variance assertions), seed 1 and the settings tried.
 */
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { readMetrics } from '@lathe/data';
import { runDemo } from './run-demo';

/** The median of a non-empty list. */
const median = (xs: number[]): number => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};

/** SFT steps before PPO: few enough that the policy leaves room (see above). */
const SFT_STEPS = 300;

test('PPO with GAE from a short SFT checkpoint of the demo: reward and held-out accuracy rise, the critic explains the returns', async () => {
  const root = mkdtempSync(join(tmpdir(), 'lathe-demo-ppo-'));
  const grpoYaml = join(root, 'ppo.yaml');
  writeFileSync(
    grpoYaml,
    ['estimator: gae', 'value_trunk: separate', 'lr: 3.0e-4', 'value_lr: 1.0e-3', 'value_warmup_steps: 10', 'prompts_per_step: 64', 'group_size: 4', 'steps: 150', 'eval_every: 0', 'save_every: 0', ''].join('\n'),
  );
  const { summary: s } = await runDemo({ run_dir: join(root, 'demo'), steps: SFT_STEPS, eval_every: 0, save_every: 0, grpo_config: grpoYaml });
  console.log(JSON.stringify(s));
  expect(s).toMatchObject({ steps: SFT_STEPS, grpo_steps: 150, interrupted: false });
  // the SFT checkpoint leaves room: measured 0.234 greedy, 0.137 sampled
  expect(s.acc_after_sft as number).toBeLessThan(0.6);
  expect(s.sampled_acc_after_sft as number).toBeLessThan(0.4);
  // reward: measured +0.090; 0.06 is ~5 standard errors of the difference of the two means (0.008 and 0.009)
  expect(s.reward_last_10_steps as number).toBeGreaterThan((s.reward_first_10_steps as number) + 0.06);
  // held-out accuracy: sampled +0.082 measured (256 samples a side, the difference's standard error
  // below ~0.04 as the prompts are the same: a thin margin over 0.05, held by the run's determinism on
  // one CPU); greedy must not fall (+0.094 measured: 64 problems a side move it by ±0.06)
  expect(s.sampled_acc_after_grpo as number).toBeGreaterThan((s.sampled_acc_after_sft as number) + 0.05);
  expect(s.acc_after_grpo as number).toBeGreaterThanOrEqual(s.acc_after_sft as number);

  const steps = readMetrics(join(s.grpo_run_dir as string, 'metrics.jsonl')).filter((m) => 'reward_mean' in m);
  expect(steps.map((m) => m['value/policy_frozen'])).toEqual([...Array<number>(10).fill(1), ...Array<number>(140).fill(0)]);
  const ev = steps.filter((m) => m['value/policy_frozen'] === 0).map((m) => m['value/explained_variance']);
  expect(ev.every((x) => typeof x === 'number' && Number.isFinite(x))).toBe(true); // the returns vary every step
  const evs = ev as number[];
  // a critic no better than a constant scatters around 0 (or below): measured median 0.050, 123 of 140 above 0
  expect(median(evs)).toBeGreaterThan(0);
  expect(evs.filter((x) => x > 0).length).toBeGreaterThan(0.75 * evs.length);
}, 600_000);
