/**
 * `lathe serve` through the real CLI: `--model` repeated (NAME=DIR), the JSON line printed once it
 * listens, requests to both models, and SIGTERM: the running request finishes, exit status 143.
 * Bad flags are usage errors naming the flag, before any weights load.
 */
import { spawn, spawnSync } from 'node:child_process';
import { join } from 'node:path';
import { tinyServeModel } from '../../../packages/recipes/test/serve-helpers';

const bin = join(__dirname, '..', 'bin', 'lathe.cjs');
const dir = tinyServeModel('tiny-qwen3');

test('--model twice, a JSON line with the URL, both models answer, the load line names the decode options, SIGTERM exits 143', async () => {
  const p = spawn(process.execPath, [bin, 'serve', '--model', `a=${dir}`, '--model', `b=${dir}`, '--port', '0', '--max_rows', '2', '--max_model_len', '64', '--residual_dtype', 'compute'], { stdio: ['ignore', 'pipe', 'pipe'] });
  let stdout = '';
  let stderr = '';
  p.stdout.on('data', (d) => (stdout += d));
  p.stderr.on('data', (d) => (stderr += d));
  const exited = new Promise<number | null>((r) => p.on('exit', (code) => r(code)));
  try {
    while (!stdout.includes('\n')) {
      if (p.exitCode !== null) throw new Error(`lathe serve exited ${p.exitCode}: ${stderr}`);
      await new Promise((r) => setTimeout(r, 100));
    }
    const { url, models } = JSON.parse(stdout.split('\n')[0]) as { url: string; models: string[] };
    expect(models).toEqual(['a', 'b']);
    expect(url).toMatch(/^http:\/\/127\.0\.0\.1:\d+\/v1$/);
    for (const model of models) {
      const r = (await (await fetch(`${url}/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model, prompt: 'hi', max_tokens: 3, temperature: 0 }) })).json()) as { model: string; usage: { completion_tokens: number } };
      expect([r.model, r.usage.completion_tokens]).toEqual([model, 3]);
    }
    expect(stderr).toMatch(/serve: loading a from .* \(2 rows × 64 positions, float32 on cpu with the residual stream in the compute dtype\)/);
    expect(stderr).toMatch(/POST \/v1\/completions 200 \d+ms/);
  } finally {
    p.kill('SIGTERM');
  }
  expect(await exited).toBe(143);
});

test('bad flags: a usage error naming the flag, before anything loads', () => {
  const run = (...args: string[]) => spawnSync(process.execPath, [bin, 'serve', ...args], { encoding: 'utf8' });
  const none = run();
  expect(none.status).not.toBe(0);
  expect(none.stderr).toMatch(/--model is required/);
  const bad = run('--model', dir, '--max_rows', '0');
  expect(bad.status).toBe(2);
  expect(bad.stderr).toMatch(/option 'max_rows' must be ≥ 1/);
  const dtype = run('--model', dir, '--compute_dtype', 'bfloat16');
  expect(dtype.stderr).toMatch(/--compute_dtype bfloat16 needs --device cuda/);
});
