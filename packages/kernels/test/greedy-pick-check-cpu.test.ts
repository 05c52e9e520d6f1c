/**
 * tools/bench/kernels/decode-check.ts's pick phase and +pick engines in its CPU mode (float32, a tiny
 * model, the greedy-pick op's host rule in place of the kernel): the phase compares the op with the
 * composed greedy path and the host rule and passes; every +pick engine builds, generates every token
 * and agrees with GroupQueryAttention's tokens — so a device run fails only on what the CPU cannot run.
 */
import { execFileSync } from 'node:child_process';
import { join } from 'node:path';

const root = join(__dirname, '../../..');

interface Line {
  phase: string;
  ok?: boolean;
  engine?: string;
  vs_gqa?: { rows_identical: number };
  vs_without_pick?: { rows_identical: number };
  op_vs_composed?: { rows_differing: number; logprob_max_abs_diff: number };
  kernel_vs_reference?: { rows_differing: number };
}

test('decode-check --cpu --phases pick,generate with +pick engines: the op matches the composed path, the engines match gqa', () => {
  const engines = ['gqa', 'gqa+pick', 'kernel+pick', 'kernel+fp8+concat+bf16res+pick'];
  const out = execFileSync(join(root, 'node_modules/.bin/tsx'), ['--conditions=lathe-source', join(root, 'tools/bench/kernels/decode-check.ts'), '--cpu', '--phases', 'pick,generate', '--engines', engines.join(',')], { cwd: root, encoding: 'utf8' });
  const lines = out
    .trim()
    .split('\n')
    .filter((l) => l.startsWith('{'))
    .map((l) => JSON.parse(l) as Line);
  expect(lines.map((l) => l.engine ?? l.phase)).toEqual(['pick', ...engines, 'summary']);
  const pick = lines[0];
  expect(pick.ok).toBe(true);
  expect(pick.op_vs_composed!.rows_differing).toBe(0);
  expect(pick.op_vs_composed!.logprob_max_abs_diff).toBeLessThan(1e-5);
  expect(pick.kernel_vs_reference!.rows_differing).toBe(0);
  expect(lines.at(-1)!.ok).toBe(true);
  for (const l of lines.filter((x) => x.engine && !x.engine.includes('fp8'))) expect([l.engine, l.vs_gqa?.rows_identical]).toEqual([l.engine, 1]);
  // gqa+pick against gqa, which ran before it; the other +pick engines had no unpicked twin in the list
  expect(lines.map((l) => l.vs_without_pick?.rows_identical)).toEqual([undefined, undefined, 1, undefined, undefined, undefined]);
}, 180_000);

test('decode-check refuses an unknown modifier, naming +pick among the accepted ones', () => {
  let message = '';
  try {
    execFileSync(join(root, 'node_modules/.bin/tsx'), ['--conditions=lathe-source', join(root, 'tools/bench/kernels/decode-check.ts'), '--cpu', '--phases', 'generate', '--engines', 'gqa+pik'], { cwd: root, encoding: 'utf8', stdio: 'pipe' });
  } catch (e) {
    message = String((e as { stderr?: string }).stderr);
  }
  expect(message).toMatch(/unknown engine 'gqa\+pik'.*\+pick/);
}, 60_000);
