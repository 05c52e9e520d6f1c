/**
 * tools/bench/kernels/rope-check.ts in its CPU mode (float32, the op's host compute in place of the
 * kernel): the script's graphs, bindings and comparisons against ORT's RotaryEmbedding and the host
 * rule run end to end, so a device run fails only on the kernel itself.
 */
import { execFileSync } from 'node:child_process';
import { join } from 'node:path';

const root = join(__dirname, '../../..');

test('rope-check --cpu: the case passes, values and gradient within float32 rounding of the host rule', () => {
  const out = execFileSync(join(root, 'node_modules/.bin/tsx'), ['--conditions=lathe-source', join(root, 'tools/bench/kernels/rope-check.ts'), '--cpu'], { cwd: root, encoding: 'utf8' });
  const lines = out
    .trim()
    .split('\n')
    .map((l) => JSON.parse(l) as { phase: string; ok: boolean; case?: string; vs_host?: Record<string, { kernel: { rel: number }; ort: { rel: number } }> });
  expect(lines.map((l) => [l.phase, l.case ?? null, l.ok])).toEqual([
    ['check', 'cpu_fp32_hd8', true],
    ['summary', null, true],
  ]);
  for (const n of ['y', 'dx']) expect(lines[0].vs_host![n].kernel.rel).toBeLessThan(1e-6);
}, 120_000);
