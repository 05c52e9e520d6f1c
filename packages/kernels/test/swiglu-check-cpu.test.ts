/**
 * tools/bench/kernels/swiglu-check.ts in its CPU mode (float32, the op's host compute in place of the
 * kernels): the script's graphs, bindings and comparisons against the composed QuickGelu·Mul and the
 * host rule run end to end, so a device run fails only on the kernels themselves.
 */
import { execFileSync } from 'node:child_process';
import { join } from 'node:path';

const root = join(__dirname, '../../..');

test('swiglu-check --cpu: the case passes, values and gradients within float32 rounding of the host rule', () => {
  const out = execFileSync(join(root, 'node_modules/.bin/tsx'), ['--conditions=lathe-source', join(root, 'tools/bench/kernels/swiglu-check.ts'), '--cpu'], { cwd: root, encoding: 'utf8' });
  const lines = out
    .trim()
    .split('\n')
    .map((l) => JSON.parse(l) as { phase: string; ok: boolean; case?: string; vs_host?: Record<string, { kernel: { rel: number }; composed: { rel: number } }> });
  expect(lines.map((l) => [l.phase, l.case ?? null, l.ok])).toEqual([
    ['check', 'cpu_fp32_ragged', true],
    ['summary', null, true],
  ]);
  for (const n of ['y', 'dgate', 'dup']) expect(lines[0].vs_host![n].kernel.rel).toBeLessThan(1e-6);
}, 120_000);
