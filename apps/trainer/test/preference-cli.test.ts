/**
 * `lathe rm train`, `lathe rm eval` and `lathe dpo` on the command line: help text with every
 * option of the schema, a missing subcommand and bad flags reported as usage errors. (Their runs
 * are tested through the recipes in packages/recipes/test and as written in docs/guides/rm.md and
 * dpo.md by guide-examples.slow.test.ts.)
 */
import { spawnSync } from 'node:child_process';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { dpoSchema, rmEvalSchema, rmTrainSchema, type OptionSchema } from '@lathe/recipes';

const bin = join(__dirname, '..', 'bin', 'lathe.cjs');
const lathe = (...args: string[]) => spawnSync(process.execPath, [bin, ...args], { encoding: 'utf8', cwd: mkdtempSync(join(tmpdir(), 'lathe-preference-cli-')) });

test.each([
  ['rm train', rmTrainSchema],
  ['rm eval', rmEvalSchema],
  ['dpo', dpoSchema],
] as [string, OptionSchema][])('lathe %s --help lists every option of the schema with its help text and default', (command, schema) => {
  const r = lathe(...command.split(' '), '--help');
  expect(r.status).toBe(0);
  const squash = (s: string) => s.replace(/\s+/g, ''); // yargs wraps (and breaks) long lines
  const text = squash(r.stdout);
  for (const [name, spec] of Object.entries(schema)) {
    expect(text).toContain(`--${name}`);
    expect(text).toContain(squash(spec.describe.slice(0, 30)));
    expect(text).toContain(squash(`[default: ${JSON.stringify(spec.default)}]`));
  }
}, 30_000);

test('lathe rm without a subcommand, and bad flags, are usage errors (exit 2) naming what was expected', () => {
  let r = lathe('rm');
  expect([r.status, r.stderr.split('\n')[0]]).toEqual([2, 'lathe rm: name an rm subcommand: train, eval']);
  r = lathe('dpo', '--loss_type', 'kto');
  expect(r.status).toBe(2);
  expect(r.stderr).toMatch(/--loss_type must be one of sigmoid, ipo, got 'kto'/);
  r = lathe('rm', 'train', '--center_rewards_coefficient', '-1');
  expect(r.status).toBe(2);
  expect(r.stderr).toMatch(/option 'center_rewards_coefficient' must be ≥ 0, got -1/);
}, 30_000);
