/**
 * tools/bench/kernels/flash-check.ts in its CPU mode (float32, the custom ops' host compute in place
 * of the kernels): the script's graphs, bindings, padding masks and comparisons run end to end and
 * agree with its float64 host reference, and its SFT phase (a loss with the decoder's kernel path,
 * through the trainer) matches sftLoss — so a device run fails only on the kernels themselves.
 */
import { execFileSync } from 'node:child_process';
import { join } from 'node:path';

const root = join(__dirname, '../../..');

test('flash-check --cpu: every case, the op phase and the SFT steps pass, padding exactly zero', () => {
  const out = execFileSync(join(root, 'node_modules/.bin/tsx'), ['--conditions=lathe-source', join(root, 'tools/bench/kernels/flash-check.ts'), '--cpu'], { cwd: root, encoding: 'utf8' });
  const lines = out
    .trim()
    .split('\n')
    .map((l) => JSON.parse(l) as { phase: string; ok: boolean; mode?: string; max_rel_loss_diff?: number; case?: string; padding_nonzero?: Record<string, number>; vs_host_f64?: Record<string, { composed: { rel: number } }> });
  expect(lines.filter((l) => l.phase === 'op').map((l) => l.mode)).toEqual(['kernels', 'backward']);
  expect(lines.map((l) => [l.phase, l.case ?? null, l.ok])).toEqual([
    ['check', 'cpu_b2_t40_ragged', true],
    ['check', 'cpu_b3_t20_len1', true],
    ['op', 'cpu_b2_t40_ragged', true],
    ['op', 'cpu_b2_t40_ragged', true],
    ['sft', null, true],
    ['summary', null, true],
  ]);
  // SFT steps of a tiny Qwen3 through the trainer: the kernel path's losses are sftLoss's (float32)
  const sft = lines.find((l) => l.phase === 'sft')!;
  expect(sft.mode).toBe('backward');
  expect(sft.max_rel_loss_diff).toBeLessThan(1e-5);
  for (const l of lines.filter((x) => x.phase === 'check')) {
    expect(l.padding_nonzero).toEqual({ o: 0, dq: 0, dk: 0, dv: 0 });
    // the composed path (ORT's GroupQueryAttention and its rule) agrees with the host reference in float32
    for (const n of ['o', 'dq', 'dk', 'dv']) expect(l.vs_host_f64![n].composed.rel).toBeLessThan(1e-5);
  }
}, 120_000);
