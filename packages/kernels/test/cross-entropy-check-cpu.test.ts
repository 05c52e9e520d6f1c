/**
 * tools/bench/kernels/ce-check.ts in its CPU mode (float32, the custom ops' host compute in place of
 * the kernels): the script's graphs, bindings and comparisons run end to end — the op against the
 * composed path and the float64 host rule, the chunked heads with and without the kernel, and SFT
 * steps through the trainer with the attention and cross-entropy ops — so a device run fails only on
 * the kernels themselves.
 */
import { execFileSync } from 'node:child_process';
import { join } from 'node:path';

const root = join(__dirname, '../../..');

interface Line {
  phase: string;
  ok: boolean;
  case?: string;
  head?: string;
  max_rel_loss_diff?: number;
  ignored_rows_nonzero?: number;
  vs_host_f64?: Record<string, { fused: { rel: number }; composed: { rel: number } }>;
  kernel_vs_composed?: Record<string, { rel: number; max_ref: number }>;
  fused_nodes?: number;
  ce_fallbacks?: Record<string, number>;
}

test('ce-check --cpu: every case, both heads and the SFT steps pass', () => {
  const out = execFileSync(join(root, 'node_modules/.bin/tsx'), ['--conditions=lathe-source', join(root, 'tools/bench/kernels/ce-check.ts'), '--cpu'], { cwd: root, encoding: 'utf8' });
  const lines = out
    .trim()
    .split('\n')
    .map((l) => JSON.parse(l) as Line);
  expect(lines.map((l) => [l.phase, l.case ?? l.head ?? null, l.ok])).toEqual([
    ['check', 'cpu_v301_t0.8_entropy', true],
    ['check', 'cpu_v64', true],
    ['head', 'chunkedTargetLogprobs', true],
    ['head', 'chunkedLogprobsAndEntropy', true],
    ['sft', null, true],
    ['summary', null, true],
  ]);
  for (const l of lines.filter((x) => x.phase === 'check')) {
    expect(l.ignored_rows_nonzero).toBe(0);
    // the composed path (ORT's LogSoftmax, gather and their rules) agrees with the host rule in float32
    for (const [name, s] of Object.entries(l.vs_host_f64!)) {
      expect([name, s.composed.rel < 1e-6]).toEqual([name, true]);
      expect([name, s.fused.rel < 1e-6]).toEqual([name, true]);
    }
  }
  for (const l of lines.filter((x) => x.phase === 'head')) {
    // 512 ids in chunks of 128: four chunks, each through the op
    expect(l.fused_nodes).toBe(4);
    for (const [name, d] of Object.entries(l.kernel_vs_composed!)) {
      expect([name, d.max_ref > 0, d.rel < 1e-5]).toEqual([name, true, true]);
    }
  }
  // SFT steps of a tiny Qwen3 through the trainer: the cross-entropy ops give the composed head's losses (float32)
  const sft = lines.find((l) => l.phase === 'sft')!;
  expect(sft.max_rel_loss_diff).toBeLessThan(1e-6);
  expect(sft.ce_fallbacks).toEqual({});
}, 120_000);
