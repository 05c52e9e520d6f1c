/**
 * tools/bench/kernels/decode-check.ts's generate phase in its CPU mode (float32, a tiny model, the
 * decode-attention ops' host compute in place of the kernels): every engine of the device A/Bs —
 * GroupQueryAttention and the op over a native and an e4m3 cache, each with and without the
 * residual-norm fusion, with concatenated projections and with the residual stream in the compute
 * dtype — builds, generates every token and, where
 * the arithmetic is the same, agrees with GroupQueryAttention's tokens, so a device run fails only on
 * what the CPU cannot run (the kernels, CUDA graphs, bf16). Its check phase on the CPU: the op against
 * GroupQueryAttention and the float64 reference at G 2, 3, 5 and 7, both cache kinds; the sweep phase
 * (CUDA only) refused with --cpu.
 */
import { execFileSync } from 'node:child_process';
import { join } from 'node:path';

const root = join(__dirname, '../../..');
const decodeCheck = (args: string[]) => execFileSync(join(root, 'node_modules/.bin/tsx'), ['--conditions=lathe-source', join(root, 'tools/bench/kernels/decode-check.ts'), ...args], { cwd: root, encoding: 'utf8', stdio: 'pipe' });

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

test('decode-check --cpu --phases check: the op at G 2, 3, 5 and 7 against GroupQueryAttention and the reference, both cache kinds', () => {
  const lines = decodeCheck(['--cpu', '--phases', 'check'])
    .trim()
    .split('\n')
    .filter((l) => l.startsWith('{'))
    .map((l) => JSON.parse(l) as { phase: string; case?: string; cache?: string; ok: boolean });
  const checks = lines.filter((l) => l.phase === 'check');
  expect(checks.map((l) => `${l.case}/${l.cache}`)).toEqual(['cpu_tiny', 'cpu_g3', 'cpu_g5', 'cpu_g7'].flatMap((c) => [`${c}/native`, `${c}/float8e4m3`]));
  for (const l of checks) expect([l.case, l.cache, l.ok]).toEqual([l.case, l.cache, true]);
  expect(lines.at(-1)).toEqual({ phase: 'summary', ok: true });
}, 180_000);

test('decode-check --cpu --phases sweep is refused, naming why', () => {
  expect(() => decodeCheck(['--cpu', '--phases', 'sweep'])).toThrow(/--phases sweep builds and times CUDA variants of the split kernel: it has no CPU form/);
  expect(() => decodeCheck(['--cpu', '--phases', 'check,sweep'])).toThrow(/no CPU form/);
}, 60_000);
