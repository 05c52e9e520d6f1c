/**
 * `lathe demo` end to end, shortened (the full demo is `npm start`; its numbers are in the README):
 * the SFT stage, then the GRPO stage from its final checkpoint on the same held-out problems, and
 * one JSON summary line with acc_after_grpo, re-derived here from the runs' own files.
 *
 * GRPO's learning effect is asserted on the full demo in demo.slow.test.ts (`npm run test:slow`;
 * ~125 s on 2 cores, the README's main command itself): the demo is deterministic given its seed on the CPU (two runs give
 * bit-identical final weights and the same summary), but a GRPO stage short enough for the default
 * run shows no effect to assert — measured from a 500-step SFT checkpoint, 30–40 RL steps of 32
 * prompts move the reward by less than its step-to-step noise and *lower* held-out accuracy
 * (0.906 → 0.53–0.875 for lr 1e-4–1e-3). The full run's greedy accuracy moves by ±1–2 of 64
 * examples between rounding-level changes; its reward and sampled accuracy (mean@8) are what rise.
 */
import { mkdtempSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parse as parseYaml } from 'yaml';
import { readMetrics, readTrainRollouts } from '@lathe/data';
import { runDemo } from './run-demo';

/** Runs the demo's handler with parsed flags; `progress` holds its stderr lines. */
async function demo(argv: Record<string, unknown>): Promise<Record<string, unknown>> {
  const r = await runDemo(argv);
  progress = r.progress;
  return r.summary;
}

let progress = '';

test('SFT, then GRPO from its checkpoint on the same held-out split; the summary gains acc_after_grpo', async () => {
  const root = mkdtempSync(join(tmpdir(), 'lathe-demo-'));
  const grpoYaml = join(root, 'grpo.yaml');
  writeFileSync(grpoYaml, 'prompts_per_step: 8\ngroup_size: 4\neval_every: 0\n');
  const s = await demo({ run_dir: join(root, 'demo'), steps: 120, batch_size: 16, eval_examples: 16, eval_every: 0, save_every: 0, grpo_steps: 3, grpo_config: grpoYaml });
  expect(s).toMatchObject({ steps: 120, grpo_steps: 3, grpo_run_dir: join(root, 'demo-grpo'), interrupted: false });
  // off a terminal, progress is plain lines on stderr
  expect(progress).toMatch(/^step 120\/120 loss [\d.]+ grad_norm/m);
  for (const k of ['acc_before_sft', 'acc_after_sft', 'acc_after_grpo', 'reward_first_10_steps', 'reward_last_10_steps', 'seconds']) expect([k, typeof s[k]]).toEqual([k, 'number']);
  // the GRPO stage started from the SFT checkpoint, with the demo settings under the YAML file's
  const cfg = parseYaml(readFileSync(join(root, 'demo-grpo', 'config.yaml'), 'utf8')) as Record<string, unknown>;
  expect(cfg).toMatchObject({ model: s.checkpoint, tokenizer: 'builtin:addition', prompts_per_step: 8, group_size: 4, steps: 3, max_new_tokens: 6, eval_examples: 16 });
  // both stages evaluate the same held-out problems, and GRPO never trains on them
  const prompts = (dir: string) => new Set(readFileSync(join(dir, 'eval', readdirSync(join(dir, 'eval')).sort()[0]), 'utf8').trim().split('\n').map((l) => (JSON.parse(l) as { prompt: string }).prompt));
  const heldOut = prompts(join(root, 'demo'));
  expect(prompts(join(root, 'demo-grpo'))).toEqual(heldOut);
  expect(heldOut.size).toBe(16);
  expect(readTrainRollouts(join(root, 'demo-grpo', 'rollouts.sqlite')).some((r) => heldOut.has(r.prompt))).toBe(false);

  // GRPO started from the SFT stage's final weights: its greedy completions before any RL step are
  // the SFT stage's last ones (SFT evaluates with more new tokens, so GRPO's 6 are a prefix)
  const evalRows = (dir: string, file: string) => new Map(readFileSync(join(dir, 'eval', file), 'utf8').trim().split('\n').map((l) => JSON.parse(l) as { prompt: string; generated: string; correct: boolean }).map((r) => [r.prompt, r]));
  const sftLast = evalRows(join(root, 'demo'), 'step-00000120.jsonl');
  const grpoFirst = evalRows(join(root, 'demo-grpo'), 'step-00000000.jsonl');
  expect(new Set([...sftLast.values()].map((r) => r.generated)).size).toBeGreaterThan(1); // the completions depend on the prompt
  for (const [prompt, r] of grpoFirst) expect([prompt, sftLast.get(prompt)!.generated.startsWith(r.generated), r.correct]).toEqual([prompt, true, sftLast.get(prompt)!.correct]);
  // the summary's numbers are the runs' own: accuracy from the last evaluation file, rewards from metrics.jsonl
  const grpoLast = [...evalRows(join(root, 'demo-grpo'), 'step-00000003.jsonl').values()];
  expect(s.acc_after_grpo).toBe(grpoLast.filter((r) => r.correct).length / grpoLast.length);
  expect(s.acc_after_sft).toBe([...sftLast.values()].filter((r) => r.correct).length / sftLast.size);
  const steps = readMetrics(join(root, 'demo-grpo', 'metrics.jsonl')).filter((m) => 'reward_mean' in m);
  expect(steps.map((m) => m.step)).toEqual([1, 2, 3]);
  const meanReward = steps.reduce((a, m) => a + (m.reward_mean as number), 0) / 3;
  expect(s.reward_first_10_steps).toBeCloseTo(meanReward, 4);
  expect(s.reward_last_10_steps).toBeCloseTo(meanReward, 4);
  // and it trained: the policy left the SFT weights (KL to them > 0 after the first update; step
  // 1's is rounding, < 5e-7; step 3's was above 1e-5 on one build and 7.8e-6 on the next, a
  // float32 rounding apart)
  expect(steps[0].kl_ref as number).toBeCloseTo(0, 6);
  expect(steps[2].kl_ref as number).toBeGreaterThan(2e-6);

  // a second demo run starts the GRPO stage over (it follows a fresh SFT stage)
  const again = await demo({ run_dir: join(root, 'demo'), steps: 40, batch_size: 16, eval_examples: 16, eval_every: 0, save_every: 0, grpo_steps: 1, grpo_config: grpoYaml });
  expect(again.grpo_steps).toBe(1);
  expect(readTrainRollouts(join(root, 'demo-grpo', 'rollouts.sqlite')).every((r) => r.step === 1)).toBe(true);
}, 60_000);

test('--grpo_steps 0 skips the GRPO stage', async () => {
  const root = mkdtempSync(join(tmpdir(), 'lathe-demo-'));
  const s = await demo({ run_dir: join(root, 'demo'), steps: 5, batch_size: 8, eval_examples: 8, eval_every: 0, save_every: 0, grpo_steps: 0 });
  expect(s.steps).toBe(5);
  expect(s.acc_after_grpo).toBeUndefined();
}, 60_000);
