/**
 * `lathe studio` through the real CLI: the JSON line once it listens, the app's page, its script
 * and the run list answered over HTTP, SIGTERM exits 143; bad flags named before it listens.
 */
import { spawn, spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

const bin = join(__dirname, '..', 'bin', 'lathe.cjs');
const root = mkdtempSync(join(tmpdir(), 'lathe-studio-cli-'));
mkdirSync(join(root, 'sft'));
writeFileSync(join(root, 'sft', 'config.yaml'), 'steps: 2\n');
writeFileSync(join(root, 'sft', 'metrics.jsonl'), '{"step":1,"loss":2.5}\n{"step":2,"loss":2.25}\n');

test('a JSON line with the URL; the page, its script and the runs answer; SIGTERM exits 143', async () => {
  const p = spawn(process.execPath, [bin, 'studio', '--root', root, '--port', '0'], { stdio: ['ignore', 'pipe', 'pipe'] });
  let stdout = '';
  let stderr = '';
  p.stdout.on('data', (d) => (stdout += d));
  p.stderr.on('data', (d) => (stderr += d));
  const exited = new Promise<number | null>((r) => p.on('exit', (code) => r(code)));
  try {
    while (!stdout.includes('\n')) {
      if (p.exitCode !== null) throw new Error(`lathe studio exited ${p.exitCode}: ${stderr}`);
      await new Promise((r) => setTimeout(r, 100));
    }
    const { url, chat } = JSON.parse(stdout.split('\n')[0]) as { url: string; chat: string | null };
    expect(url).toMatch(/^http:\/\/127\.0\.0\.1:\d+\/$/);
    expect(chat).toBeNull();
    const page = await fetch(url);
    expect(page.headers.get('content-type')).toMatch(/text\/html/);
    expect(await page.text()).toContain('<title>Lathe Studio</title>');
    const script = await fetch(`${url}app.js`);
    expect([script.status, script.headers.get('content-type')]).toEqual([200, 'text/javascript; charset=utf-8']);
    const runs = (await (await fetch(`${url}api/runs`)).json()) as { name: string; metrics: { state: string; lastStep: number } }[];
    expect(runs.map((r) => [r.name, r.metrics.state, r.metrics.lastStep])).toEqual([['sft', 'ok', 2]]);
  } finally {
    p.kill('SIGTERM');
  }
  expect(await exited).toBe(143);
});

test('bad flags: named, before it listens', () => {
  const run = (...args: string[]) => spawnSync(process.execPath, [bin, 'studio', '--port', '0', ...args], { encoding: 'utf8' });
  expect(run('--root', join(root, 'nope')).stderr).toMatch(/--root .*nope: no such directory/);
  expect(run('--root', root, '--model', root, '--serve_url', 'http://127.0.0.1:1/v1').stderr).toMatch(/--model and --serve_url: give one/);
  expect(run('--root', root, '--serve_url', 'localhost:8000').stderr).toMatch(/--serve_url localhost:8000: expected an http:\/\/ or https:\/\/ URL/);
  const port = run('--root', root, '--port', '70000');
  expect(port.status).toBe(2);
  expect(port.stderr).toMatch(/port/);
});
