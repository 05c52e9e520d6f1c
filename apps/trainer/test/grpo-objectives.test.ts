/**
 * `lathe grpo`'s verl-style options reach the trainer: --policy_term, --loss_scale_factor, and the
 * adaptive KL (--kl_target, --kl_horizon), whose β is checkpointed and continued by --resume.
 */
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { readMetrics } from '@lathe/data';
import { runGrpo, type GrpoConfig, type GrpoEvents } from '@lathe/recipes';
import { smallGrpo } from './small-grpo';

const root = mkdtempSync(join(tmpdir(), 'lathe-grpo-objectives-'));
const small = (run: string, over: Partial<GrpoConfig> = {}): GrpoConfig => smallGrpo(root, run, { eval_examples: 0, ...over });
const adaptive: Partial<GrpoConfig> = { kl_mode: 'reward', kl_coef: 0.05, kl_estimator: 'k1', kl_target: 1e-3, kl_horizon: 64 };

test('the adaptive KL coefficient moves by verl\'s rule each step, and a resumed run continues it exactly', async () => {
  await runGrpo(small('straight', adaptive));
  const straight = readMetrics(join(root, 'straight', 'metrics.jsonl')).map((m) => m.kl_coef as number);
  expect(straight[0]).toBe(0.05);
  // each step multiplies β by 1 + clip(kl/target − 1, ±0.2) · 16 / 64, so by 0.95 to 1.05
  for (let i = 1; i < straight.length; i++) expect(Math.abs(straight[i] / straight[i - 1] - 1)).toBeLessThanOrEqual(0.05 + 1e-12);
  expect(new Set(straight).size).toBeGreaterThan(1);
  const crash: GrpoEvents = {
    onStep: (m) => {
      if (m.step === 3) throw new Error('killed');
    },
  };
  await expect(runGrpo(small('resumed', adaptive), crash)).rejects.toThrow('killed');
  await runGrpo(small('resumed', { ...adaptive, resume: true }));
  expect(readMetrics(join(root, 'resumed', 'metrics.jsonl')).map((m) => m.kl_coef)).toEqual(straight);
}, 120_000);

test('--policy_term cispo and reinforce run; --loss_scale_factor with token-sum-norm scales the loss as verl\'s', async () => {
  for (const policy_term of ['cispo', 'reinforce'] as const) {
    const r = await runGrpo(small(`term-${policy_term}`, { policy_term, steps: 2 }));
    expect(r.steps).toBe(2);
  }
  // token-sum-norm divides by sequences × max_new_tokens (16 × 4); verl's by the factor alone (4): 16× the loss
  // the first step's rewards are all 0 (no advantage): the entropy bonus gives the loss a value to compare
  await runGrpo(small('norm', { steps: 1, n_minibatches: 1, aggregation: 'token-sum-norm', entropy_coef: 0.1 }));
  await runGrpo(small('verl', { steps: 1, n_minibatches: 1, aggregation: 'token-sum-norm', entropy_coef: 0.1, loss_scale_factor: 4 }));
  const first = (run: string) => readMetrics(join(root, run, 'metrics.jsonl'))[0].loss as number;
  expect(first('verl') / first('norm')).toBeCloseTo(16, 4);
}, 120_000);
