/**
 * `lathe demo` end to end, shortened (the full demo is `npm start`; its numbers are in the README):
 * the SFT stage, then the GRPO stage from its final checkpoint on the same held-out problems, and
 * one JSON summary line with acc_after_grpo.
 */
import { mkdtempSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parse as parseYaml } from 'yaml';
import { readTrainRollouts } from '@lathe/data';
import { demoCommand } from '../src/commands/demo';

/** Calls the demo's handler with parsed flags (yargs 18 does not load under jest), returning the JSON summary. */
async function demo(argv: Record<string, unknown>): Promise<Record<string, unknown>> {
  let out = '';
  const spy = jest.spyOn(console, 'log').mockImplementation((s: string) => void (out += `${s}\n`));
  try {
    await demoCommand.handler({ _: ['demo'], $0: 'lathe', ...argv } as never);
  } finally {
    spy.mockRestore();
  }
  return JSON.parse(out.trim().split('\n').at(-1)!) as Record<string, unknown>;
}

test('SFT, then GRPO from its checkpoint on the same held-out split; the summary gains acc_after_grpo', async () => {
  const root = mkdtempSync(join(tmpdir(), 'lathe-demo-'));
  const grpoYaml = join(root, 'grpo.yaml');
  writeFileSync(grpoYaml, 'prompts_per_step: 8\ngroup_size: 4\neval_every: 0\n');
  const s = await demo({ run_dir: join(root, 'demo'), steps: 40, batch_size: 16, eval_examples: 16, eval_every: 0, save_every: 0, grpo_steps: 3, grpo_config: grpoYaml });
  expect(s).toMatchObject({ steps: 40, grpo_steps: 3, grpo_run_dir: join(root, 'demo-grpo'), interrupted: false });
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
