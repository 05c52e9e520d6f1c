/**
 * `lathe serve` under load on loopback (CPU, tiny random Qwen3): 64 concurrent clients with mixed
 * prompt lengths, max_tokens and n all answered within a bound, each with the tokens the batch
 * engine gives its prompt alone (greedy), and no rows left held; a full queue answers 429 with
 * Retry-After; a client that disconnects mid-stream has its row freed within one decode step.
 */
import { request } from 'node:http';
import OpenAI from 'openai';
import { HfTokenizer } from '@lathe/tokenizer';
import { CausalLM } from '@lathe/models';
import { Device } from '@lathe/runtime';
import { KvCacheGenerator } from '@lathe/rollout';
import type { RunningServe } from '@lathe/recipes';
import { serve, tinyServeModel } from './serve-helpers';

/** The cases, against a server with its HTTP layer on its own thread (`httpThread`) or on the decode loop's. */
export function serveLoadCases(httpThread: boolean): void {
  const dir = tinyServeModel('tiny-qwen3');
  const MODEL = 'tiny-qwen3';
  let running: RunningServe;
  let client: OpenAI;
  let tok: HfTokenizer;

  beforeAll(async () => {
    running = await serve({ http_thread: httpThread, model: dir, max_rows: 16, max_model_len: 80, max_n: 4, max_queue: 64 });
    client = new OpenAI({ baseURL: running.url, apiKey: 'unused', maxRetries: 0, timeout: 60_000 });
    tok = await HfTokenizer.fromFolder(dir);
  });
  afterAll(() => running.close());

  const health = async (r: RunningServe) => ((await (await fetch(r.url.replace('/v1', '/health'))).json()) as { models: { busy: number; free: number; queued: number; reservedTokens: number }[] }).models[0];

  test('64 concurrent clients, mixed lengths and n: all answered, greedy text equal to each prompt alone, no rows left held', async () => {
    const words = 'the cat sat on a mat while rain fell over quiet hills and rivers ran to the sea'.split(' ');
    const requests = Array.from({ length: 64 }, (_, i) => ({
      ids: tok.encode(Array.from({ length: 1 + ((i * 7) % 15) }, (_, j) => words[(i + j * 3) % words.length]).join(' ')),
      max: 2 + ((i * 5) % 7),
      n: 1 + (i % 3),
    }));
    const started = performance.now();
    const answers = await Promise.all(requests.map((r) => client.completions.create({ model: MODEL, prompt: r.ids, max_tokens: r.max, n: r.n, temperature: 0 })));
    const seconds = (performance.now() - started) / 1000;
    expect(seconds).toBeLessThan(50);

    // Each prompt alone in the batch engine (greedy: a row's tokens depend on its prompt only).
    const device = Device.cpu();
    const model = CausalLM.fromPretrainedSync(dir, { device });
    const kv = KvCacheGenerator.create(model, { temperature: 0, rows: 1, maxLength: 80 });
    const eos = running.models[0].stopIds;
    for (const [i, r] of requests.entries()) {
      const [alone] = await kv.generate([r.ids], { maxNewTokens: r.max, stopIds: [...eos] });
      const stopped = alone.finishReason === 'stop';
      const text = tok.decode(stopped ? alone.tokens.slice(0, -1) : alone.tokens);
      const a = answers[i];
      expect(a.choices).toHaveLength(r.n);
      for (const c of a.choices) expect([c.text, c.finish_reason]).toEqual([text, alone.finishReason]);
      expect(a.usage).toEqual({ prompt_tokens: r.ids.length, completion_tokens: r.n * alone.tokens.length, total_tokens: r.ids.length + r.n * alone.tokens.length });
    }
    kv.dispose();
    model.dispose();
    expect(await health(running)).toMatchObject({ busy: 0, free: 16, queued: 0, reservedTokens: 0 });
    // The rows were shared: far fewer decode steps than the samples' tokens.
    const sched = running.models[0].scheduler;
    expect(sched.counters.admitted).toBe(64);
    const tokens = answers.reduce((s, a) => s + a.usage!.completion_tokens, 0);
    expect(sched.counters.steps).toBeLessThan(tokens / 4);
  });

  test('a client that disconnects mid-stream frees its row within one decode step', async () => {
    const sched = running.models[0].scheduler;
    // The decode step at which the server learns of the disconnect: with the HTTP thread the news
    // crosses one message hop to the decode loop, whose steps go on meanwhile, so "within one
    // step" counts from the cancel reaching the scheduler's ticket, in both modes.
    let stepsAtCancel: number | undefined;
    const submit = sched.submit.bind(sched);
    const spy = jest.spyOn(sched, 'submit').mockImplementation((req) => {
      const ticket = submit(req);
      const cancel = ticket.cancel.bind(ticket);
      ticket.cancel = () => {
        stepsAtCancel ??= sched.counters.steps;
        cancel();
      };
      return ticket;
    });
    // A second request keeps the decode loop stepping while the first one is dropped.
    const other = client.completions.create({ model: MODEL, prompt: 'keep going', max_tokens: 60, temperature: 0, stop_token_ids: [] } as OpenAI.CompletionCreateParamsNonStreaming);
    // node's own client: destroying its request closes the socket at once (fetch's abort takes a
    // few turns of the event loop of this same process, which would be counted against the server).
    const { port } = running;
    const stepsAtAbort = await new Promise<number>((resolve, reject) => {
      const req = request({ host: '127.0.0.1', port, path: '/v1/completions', method: 'POST', headers: { 'content-type': 'application/json' } }, (res) => {
        let chunks = 0;
        res.on('data', (d: Buffer) => {
          chunks += (d.toString().match(/^data: /gm) ?? []).length;
          if (chunks >= 3 && !req.destroyed) {
            expect(sched.engine.busy).toBe(2);
            const steps = sched.counters.steps;
            req.destroy();
            resolve(steps);
          }
        });
      });
      req.on('error', (e) => (req.destroyed ? undefined : reject(e)));
      req.end(JSON.stringify({ model: MODEL, prompt: 'a long story', max_tokens: 60, temperature: 0, stream: true }));
    });
    while (sched.engine.busy > 1) await new Promise((r) => setImmediate(r));
    spy.mockRestore();
    expect(stepsAtCancel).toBeGreaterThanOrEqual(stepsAtAbort);
    expect(sched.counters.steps - stepsAtCancel!).toBeLessThanOrEqual(1);
    expect(sched.engine.busy).toBe(1); // the other request still runs
    const done = await other;
    expect(done.usage!.completion_tokens).toBeGreaterThan(0);
    expect(await health(running)).toMatchObject({ busy: 0, queued: 0, reservedTokens: 0 });
  });

  test('a full queue answers 429 with Retry-After; the others are served', async () => {
    const small = await serve({ http_thread: httpThread, model: dir, max_rows: 1, max_model_len: 64, max_queue: 1 });
    try {
      const post = () => fetch(`${small.url}/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: MODEL, prompt: 'hello', max_tokens: 8, temperature: 0 }) });
      const answers = await Promise.all([post(), post(), post(), post()]);
      const statuses = answers.map((a) => a.status).sort();
      expect(statuses.filter((s) => s === 200).length).toBeGreaterThanOrEqual(2); // one running, one queued
      const refused = answers.filter((a) => a.status === 429);
      expect(refused.length).toBeGreaterThanOrEqual(1);
      for (const r of refused) {
        expect(Number(r.headers.get('retry-after'))).toBeGreaterThanOrEqual(1);
        expect(((await r.json()) as { error: { type: string } }).error.type).toBe('rate_limit_error');
      }
      expect(await health(small)).toMatchObject({ busy: 0, free: 1, queued: 0 });
    } finally {
      await small.close();
    }
  });
}
