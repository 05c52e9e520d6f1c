/**
 * The OpenAI server with its HTTP layer on a worker thread (startThreadedOpenAiServer) over a tiny
 * random Qwen3 on the CPU, with a one-letter-per-id tokenizer the thread loads by path. Independent
 * truth: greedy text is the batch engine's tokens for the prompt alone; tokens come back in one
 * message per turn of the decode loop, not one per token; a stop string found on the HTTP thread
 * ends the sample and frees its row; an engine failure is a 500 and the server serves on.
 */
import { join } from 'node:path';
import { Worker } from 'node:worker_threads';
import { Device } from '@lathe/runtime';
import { CausalLM, type HfConfig } from '@lathe/models';
import { KvCacheGenerator, Scheduler, SlotEngine, startThreadedOpenAiServer, type ThreadedServer } from '@lathe/rollout';
import { tinyModel, tinyQwen3 } from './helpers';
import { LETTERS, loadLetterTokenizer } from './serve-thread-tokenizer';

const wideQwen3: HfConfig = { ...tinyQwen3, hidden_size: 64, head_dim: 16 };
const { dir } = tinyModel(wideQwen3, 7);
const device = Device.cpu();
const model = CausalLM.fromPretrainedSync(dir, { device });
let engine: SlotEngine;
let scheduler: Scheduler;
let server: ThreadedServer;
let url: string;

beforeAll(async () => {
  engine = SlotEngine.create(model, { slots: 4, maxLength: 48 });
  scheduler = new Scheduler(engine, { admitWaitMs: 0 });
  const tokenizer = await loadLetterTokenizer();
  server = await startThreadedOpenAiServer({
    models: [{ id: 'tiny', scheduler, tokenizer, tokenizerSource: { loader: 'loadLetterTokenizer', module: join(__dirname, 'serve-thread-tokenizer.ts'), args: [] }, stopIds: [], maxN: 4, fingerprint: () => 'fp-1' }],
    host: '127.0.0.1',
    port: 0,
  });
  url = `http://127.0.0.1:${server.port}/v1`;
}, 60_000);
afterAll(async () => {
  await server?.close();
  engine?.dispose();
  model.dispose();
});

const post = async (body: object) => {
  const r = await fetch(`${url}/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'tiny', temperature: 0, ...body }) });
  return { status: r.status, body: (await r.json()) as { choices: { text: string; finish_reason: string }[]; usage: { completion_tokens: number }; system_fingerprint: string; error?: { message: string; type: string } } };
};
const health = async () => ((await (await fetch(url.replace('/v1', '/health'))).json()) as { models: { busy: number; queued: number; reservedTokens: number }[] }).models[0];

/** The batch engine's greedy tokens for one prompt alone. */
async function alone(prompt: number[], maxNew: number): Promise<number[]> {
  const kv = KvCacheGenerator.create(model, { temperature: 0, rows: 1, maxLength: 48 });
  const [c] = await kv.generate([prompt], { maxNewTokens: maxNew, stopIds: [] });
  kv.dispose();
  return c.tokens;
}

test('concurrent greedy requests: each text is its prompt alone; every turn of the loop sends one batch, not one message per token', async () => {
  const batches: number[] = [];
  const send = Worker.prototype.postMessage;
  const spy = jest.spyOn(Worker.prototype, 'postMessage').mockImplementation(function (this: Worker, m: unknown, transfer?: Parameters<Worker['postMessage']>[1]) {
    const msg = m as { t: string; req?: Int32Array };
    if (msg.t === 'batch') batches.push(msg.req!.length);
    send.call(this, m, transfer);
  });
  const prompts = [[3, 9, 1], [20, 21], [5, 5, 5, 5], [40]];
  const steps = scheduler.counters.steps;
  let answers;
  try {
    answers = await Promise.all(prompts.map((prompt) => post({ prompt, max_tokens: 12, stream: false })));
  } finally {
    spy.mockRestore();
  }
  for (const [i, a] of answers.entries()) {
    const want = await alone(prompts[i], 12);
    expect([a.status, a.body.choices[0].text, a.body.choices[0].finish_reason, a.body.usage.completion_tokens]).toEqual([200, want.map((t) => LETTERS[t]).join(''), 'length', 12]);
    expect(a.body.system_fingerprint).toBe('fp-1');
  }
  const tokens = batches.reduce((s, n) => s + n, 0);
  expect(tokens).toBe(4 * 12);
  // at most one batch per turn of the decode loop (its steps, plus the turns that only admitted or finished)
  expect(batches.length).toBeLessThanOrEqual(scheduler.counters.steps - steps + 4);
  expect(batches.length).toBeLessThan(tokens / 2);
  expect(await health()).toMatchObject({ busy: 0, queued: 0, reservedTokens: 0 });
});

test('a stop string found on the HTTP thread ends the sample there and frees its row, streamed or not', async () => {
  const prompt = [3, 9, 1];
  const text = (await alone(prompt, 12)).map((t) => LETTERS[t]).join('');
  const stop = text.slice(4, 6);
  const at = text.indexOf(stop);
  const cut = await post({ prompt, max_tokens: 12, stop });
  expect([cut.body.choices[0].text, cut.body.choices[0].finish_reason]).toEqual([text.slice(0, at), 'stop']);
  // one letter per token: the sample ended with the stop string's last token
  expect(cut.body.usage.completion_tokens).toBe(at + stop.length);
  const raw = await (await fetch(`${url}/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'tiny', prompt, max_tokens: 12, temperature: 0, stop, stream: true }) })).text();
  const chunks = raw.split('\n\n').filter((e) => e.startsWith('data: {'));
  const streamed = chunks.map((e) => JSON.parse(e.slice(6)) as { choices: { text: string }[] }).flatMap((c) => c.choices.map((x) => x.text)).join('');
  expect(streamed).toBe(text.slice(0, at));
  expect(await health()).toMatchObject({ busy: 0, queued: 0, reservedTokens: 0 });
});

test('an engine failure is a 500 naming it, and the server serves the next request', async () => {
  // no step of an earlier test left in flight: the failure lands on this request's step
  await scheduler.idle();
  const collect = engine.collect.bind(engine);
  let failed = false;
  const spy = jest.spyOn(engine, 'collect').mockImplementation(() => {
    if (!failed && engine.counters.steps > 0) {
      failed = true;
      collect();
      throw new Error('device lost (a test)');
    }
    return collect();
  });
  try {
    const r = await post({ prompt: [1, 2, 3], max_tokens: 8 });
    expect([r.status, r.body.error?.type]).toEqual([500, 'server_error']);
    expect(r.body.error?.message).toMatch(/generation failed: device lost \(a test\)/);
  } finally {
    spy.mockRestore();
  }
  expect(await health()).toMatchObject({ busy: 0, queued: 0, reservedTokens: 0 });
  const next = await post({ prompt: [1, 2, 3], max_tokens: 8 });
  expect([next.status, next.body.choices[0].text]).toEqual([200, (await alone([1, 2, 3], 8)).map((t) => LETTERS[t]).join('')]);
});
