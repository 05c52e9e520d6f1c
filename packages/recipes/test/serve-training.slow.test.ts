/**
 * `lathe grpo --serve_port`: the policy being trained answers OpenAI requests while it trains, from
 * the trainer's own weight buffers. Independent truth: each answer's `system_fingerprint` names a
 * step (`step-N`), and `lathe serve` on that step's saved checkpoint gives the same greedy text.
 */
import { createServer } from 'node:net';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { defaults, grpoSchema, runGrpo, type GrpoConfig } from '@lathe/recipes';
import { serve, tinyServeModel } from './serve-helpers';

/** A port nothing listens on now. */
async function freePort(): Promise<number> {
  const s = createServer();
  await new Promise<void>((r) => s.listen(0, '127.0.0.1', r));
  const port = (s.address() as { port: number }).port;
  await new Promise<void>((r) => s.close(() => r()));
  return port;
}

/** A greedy completion from a server: its text and the fingerprint it reports. */
async function complete(url: string, model: string): Promise<{ text: string; fingerprint: string }> {
  const res = await fetch(`${url}/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model, prompt: 'The sum of two and three is', max_tokens: 6, temperature: 0 }) });
  const body = (await res.json()) as { choices: { text: string }[]; system_fingerprint?: string };
  if (res.status !== 200) throw new Error(JSON.stringify(body));
  return { text: body.choices[0].text, fingerprint: body.system_fingerprint ?? '' };
}

test('requests during a GRPO run are answered by the weights of the step they name, as lathe serve answers from that checkpoint', async () => {
  const model = tinyServeModel('policy');
  const root = mkdtempSync(join(tmpdir(), 'lathe-serve-training-'));
  const data = join(root, 'prompts.jsonl');
  writeFileSync(data, Array.from({ length: 8 }, (_, i) => JSON.stringify({ prompt: `Count to ${i}:`, answer: String(i) })).join('\n'));
  // a reward that varies within every group, so each step moves the weights
  const rewardFile = join(root, 'reward.ts');
  writeFileSync(rewardFile, 'export default (_p: string, completion: string): number => (completion.length % 3) / 2;\n');
  const port = await freePort();
  const cfg: GrpoConfig = {
    ...defaults(grpoSchema),
    model,
    data,
    run_dir: join(root, 'run'),
    reward: 'none',
    reward_fn: rewardFile,
    steps: 3,
    prompts_per_step: 2,
    group_size: 4,
    max_new_tokens: 4,
    lr: 5e-2,
    eval_examples: 0,
    save_every: 1,
    keep_last: 10,
    serve_port: port,
  };
  const answers: { text: string; fingerprint: string }[] = [];
  let done = false;
  let url = '';
  const asking = new Promise<void>((resolve, reject) => {
    const loop = async () => {
      while (!done) {
        if (url) answers.push(await complete(url, 'run'));
        await new Promise((r) => setTimeout(r, 5));
      }
    };
    loop().then(resolve, reject);
  });
  // asking stops at the last step, while the server still runs (it closes as the run returns)
  const result = await runGrpo(cfg, { onServe: (u) => (url = u), onStep: (m) => void (m.step === 3 && (done = true)) }).finally(() => (done = true));
  await asking;
  expect(result.steps).toBe(3);
  expect(url).toBe(`http://127.0.0.1:${port}/v1`);
  const steps = [...new Set(answers.map((a) => a.fingerprint))];
  expect(answers.length).toBeGreaterThan(0);
  for (const f of steps) expect(f).toMatch(/^step-[0-3]$/);
  // the same fingerprint always gives the same text, and that text is the checkpoint's
  for (const f of steps) {
    const texts = new Set(answers.filter((a) => a.fingerprint === f).map((a) => a.text));
    expect([f, texts.size]).toEqual([f, 1]);
    const step = Number(f.slice('step-'.length));
    const dir = step === 0 ? model : join(root, 'run', 'checkpoints', `step-${String(step).padStart(8, '0')}`);
    const s = await serve({ model: `ckpt=${dir}` });
    try {
      expect([f, (await complete(s.url, 'ckpt')).text]).toEqual([f, [...texts][0]]);
    } finally {
      await s.close();
    }
  }
  // the port is free again once the run returns
  await expect(complete(`http://127.0.0.1:${port}/v1`, 'run')).rejects.toThrow();
}, 240_000);
