/**
 * tools/bench/kernels/decode-check.ts's generate phase in its CPU mode (float32, a tiny model, the
 * decode-attention ops' host compute in place of the kernels): every engine of the device A/Bs —
 * GroupQueryAttention and the op over a native and an e4m3 cache, each with and without the
 * residual-norm fusion, with concatenated projections and with the residual stream in the compute
 * dtype — builds, generates every token and, where
 * the arithmetic is the same, agrees with GroupQueryAttention's tokens, so a device run fails only on
 * what the CPU cannot run (the kernels, CUDA graphs, bf16).
 */
import { execFileSync } from 'node:child_process';
import { join } from 'node:path';

const root = join(__dirname, '../../..');

test('decode-check --cpu --phases generate: every A/B engine generates, the native-cache engines token for token as GroupQueryAttention', () => {
  const engines = ['gqa', 'gqa-unfused', 'gqa+concat', 'gqa+bf16res', 'kernel', 'kernel+fp8', 'kernel+fp8-unfused', 'kernel+fp8+concat', 'kernel+fp8+bf16res', 'kernel+fc', 'kernel+fp8+concat+pick+fc'];
  const out = execFileSync(join(root, 'node_modules/.bin/tsx'), ['--conditions=lathe-source', join(root, 'tools/bench/kernels/decode-check.ts'), '--cpu', '--phases', 'generate', '--engines', engines.join(',')], { cwd: root, encoding: 'utf8' });
  const lines = out
    .trim()
    .split('\n')
    .filter((l) => l.startsWith('{'))
    .map((l) => JSON.parse(l) as { phase: string; ok?: boolean; engine?: string; new_tokens?: number; vs_gqa?: { rows_identical: number } });
  expect(lines.map((l) => l.engine ?? l.phase)).toEqual([...engines, 'summary']);
  expect(lines.at(-1)!.ok).toBe(true);
  // the e4m3 cache rounds keys and values, so its tokens may part from GroupQueryAttention's
  for (const l of lines.filter((x) => x.engine && !x.engine.includes('fp8'))) expect([l.engine, l.vs_gqa?.rows_identical]).toEqual([l.engine, 1]);
}, 180_000);
