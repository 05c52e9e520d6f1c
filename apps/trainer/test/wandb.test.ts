/**
 * `--report_to wandb` end to end: `lathe sft` in its own process (the W&B SDK loads its parts with
 * dynamic imports, which jest's module system cannot run) against a stand-in for the W&B API at
 * WANDB_BASE_URL that answers the SDK's two GraphQL calls and keeps what each run streams.
 */
import { spawn } from 'node:child_process';
import { createServer } from 'node:http';
import { mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { readMetrics } from '@lathe/data';

const bin = join(__dirname, '..', 'bin', 'lathe.cjs');

function lathe(args: string[], env: Record<string, string>): Promise<{ status: number | null; stdout: string; stderr: string }> {
  return new Promise((ok) => {
    const child = spawn(process.execPath, [bin, ...args], { env: { ...process.env, ...env } });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (c: Buffer) => (stdout += c.toString()));
    child.stderr.on('data', (c: Buffer) => (stderr += c.toString()));
    child.on('close', (status) => ok({ status, stdout, stderr }));
  });
}

test('lathe sft --report_to wandb logs every metrics.jsonl line at its step to one W&B run, which a resume continues and each process finishes', async () => {
  const history = new Map<string, Record<string, number>[]>();
  const configs: Record<string, unknown>[] = [];
  const completed: string[] = [];
  const server = createServer((req, res) => {
    let body = '';
    req.on('data', (c: Buffer) => (body += c.toString()));
    req.on('end', () => {
      res.setHeader('content-type', 'application/json');
      const json = JSON.parse(body || '{}') as { query?: string; variables?: Record<string, string>; files?: Record<string, { content: string[] }>; complete?: boolean };
      if (req.url === '/graphql' && /query Viewer/.test(json.query ?? '')) return res.end(JSON.stringify({ data: { viewer: { id: 'v', entity: 'me', flags: '{}', teams: { edges: [] } } } }));
      if (req.url === '/graphql') {
        const v = json.variables ?? {};
        if (v.config) configs.push(JSON.parse(v.config) as Record<string, unknown>);
        return res.end(JSON.stringify({ data: { upsertBucket: { bucket: { id: 'b', name: v.name, displayName: v.displayName, description: '', config: '{}', sweepName: null, project: { id: 'p', name: v.project, entity: { id: 'e', name: 'me' } } }, inserted: true } } }));
      }
      const run = req.url!.split('/')[4];
      for (const line of json.files?.['wandb-history.jsonl']?.content ?? []) history.set(run, [...(history.get(run) ?? []), JSON.parse(line) as Record<string, number>]);
      if (json.complete) completed.push(run);
      res.end('{}');
    });
  });
  await new Promise<void>((ok) => server.listen(0, '127.0.0.1', ok));
  try {
    const env = { WANDB_BASE_URL: `http://127.0.0.1:${(server.address() as { port: number }).port}`, WANDB_API_KEY: 'k'.repeat(40), WANDB_MODE: 'online' };
    const runDir = join(mkdtempSync(join(tmpdir(), 'lathe-wandb-')), 'run');
    const args = ['sft', '--run_dir', runDir, '--batch_size', '8', '--eval_examples', '4', '--eval_every', '3', '--log_every', '2', '--save_every', '4', '--report_to', 'wandb', '--wandb_project', 'lathe-test'];
    const first = await lathe([...args, '--steps', '4'], env);
    expect([first.status, first.stderr]).toEqual([0, expect.any(String)]);
    const second = await lathe([...args, '--steps', '6', '--resume', '--force'], env);
    expect([second.status, second.stderr.includes('--report_to wandb:')]).toEqual([0, false]);

    const metrics = readMetrics(join(runDir, 'metrics.jsonl'));
    const runs = [...history.keys()];
    expect(runs).toHaveLength(1);
    expect(readFileSync(join(runDir, 'wandb-run-id'), 'utf8').trim()).toBe(runs[0]);
    expect(completed).toEqual([runs[0], runs[0]]);
    const logged = history.get(runs[0])!;
    expect(logged.map((h) => h._step)).toEqual(metrics.map((m) => m.step));
    logged.forEach((h, i) => {
      const numbers = Object.fromEntries(Object.entries(metrics[i]).filter(([k, v]) => k !== 'step' && typeof v === 'number' && Number.isFinite(v)));
      expect(Object.fromEntries(Object.entries(h).filter(([k]) => !k.startsWith('_')))).toEqual(numbers);
    });
    expect(configs[0]).toMatchObject({ steps: 4, wandb_project: 'lathe-test' });
  } finally {
    server.close();
  }
}, 120_000);
