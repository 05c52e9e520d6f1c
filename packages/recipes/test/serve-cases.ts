/**
 * `lathe serve` through the official `openai` client on CPU with a tiny random Qwen3 and the real
 * Qwen3 tokenizer: every request field, streaming, greedy output equal to `lathe generate`'s (the
 * batch engine), seeds, logprobs, stops, each bad input's 400 (after which the server serves on),
 * @lathe/openai-client against it, and several models in one process.
 */
import OpenAI from 'openai';
import { HfTokenizer } from '@lathe/tokenizer';
import { generate, parseServeModels, type RunningServe } from '@lathe/recipes';
import { OpenAiClient, type OpenAiError } from '@lathe/openai-client';
import { serve, tinyServeModel } from './serve-helpers';

/** The cases, against a server with its HTTP layer on its own thread (`httpThread`) or on the decode loop's. */
export function serveApiCases(httpThread: boolean): void {
  const dir = tinyServeModel('tiny-qwen3');
  let running: RunningServe;
  let client: OpenAI;
  let tok: HfTokenizer;
  const MODEL = 'tiny-qwen3';
  const user = (content: string) => [{ role: 'user' as const, content }];

  beforeAll(async () => {
    running = await serve({ http_thread: httpThread, model: dir, max_rows: 4, max_model_len: 96, max_n: 4, max_logprobs: 5 });
    client = new OpenAI({ baseURL: running.url, apiKey: 'unused', maxRetries: 0 });
    tok = await HfTokenizer.fromFolder(dir);
  });
  afterAll(() => running.close());

  /** What `lathe generate` samples for one chat prompt (greedy, one sample in the given thinking mode). */
  async function generated(prompt: string, thinking: boolean, maxNewTokens: number) {
    const [row] = await generate(dir, [prompt], { maxNewTokens, temperature: 0, samplesThinking: thinking ? 1 : 0, samplesNonThinking: thinking ? 0 : 1, grade: 'none' });
    return row;
  }

  test('GET /v1/models and /health list the model; the model id is the folder name', async () => {
    const models = await client.models.list();
    expect(models.data.map((m) => m.id)).toEqual([MODEL]);
    const health = await (await fetch(running.url.replace('/v1', '/health'))).json();
    expect(health).toMatchObject({ status: 'ok', models: [{ id: MODEL, busy: 0, free: 4, queued: 0, slots: 4 }] });
  });

  test("greedy chat equals lathe generate's output, with thinking on and off (chat_template_kwargs)", async () => {
    for (const thinking of [true, false]) {
      const want = await generated('What is 2+3?', thinking, 12);
      const r = await client.chat.completions.create({ model: MODEL, messages: user('What is 2+3?'), max_tokens: 12, temperature: 0, chat_template_kwargs: { enable_thinking: thinking } } as OpenAI.ChatCompletionCreateParamsNonStreaming);
      expect(r.object).toBe('chat.completion');
      expect(r.usage).toEqual({ prompt_tokens: want.prompt_token_ids.length, completion_tokens: want.output_token_ids.length, total_tokens: want.prompt_token_ids.length + want.output_token_ids.length });
      expect(r.choices[0].message.content).toBe(tok.decode(want.output_token_ids));
      expect(r.choices[0].finish_reason).toBe(want.finish_reason);
    }
  });

  test('streaming: the deltas add up to the non-streamed text, chunks in OpenAI format, usage, then [DONE]', async () => {
    const body = { model: MODEL, messages: user('Name a prime.'), max_tokens: 10, temperature: 0 };
    const whole = await client.chat.completions.create(body);
    const stream = await client.chat.completions.create({ ...body, stream: true });
    let text = '';
    const finishes: (string | null)[] = [];
    let usage: OpenAI.CompletionUsage | undefined;
    let first = true;
    const ids = new Set<string>();
    for await (const chunk of stream) {
      expect(chunk.object).toBe('chat.completion.chunk');
      ids.add(chunk.id);
      if (chunk.usage) usage = chunk.usage;
      for (const c of chunk.choices) {
        if (first) expect(c.delta.role).toBe('assistant');
        first = false;
        text += c.delta.content ?? '';
        if (c.finish_reason) finishes.push(c.finish_reason);
      }
    }
    expect(text).toBe(whole.choices[0].message.content);
    expect(ids.size).toBe(1); // every chunk carries the completion's id
    expect(finishes).toEqual([whole.choices[0].finish_reason]);
    expect(usage).toEqual(whole.usage);
    // The raw stream ends with the [DONE] sentinel.
    const raw = await (await fetch(`${running.url}/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: MODEL, prompt: 'Hello', max_tokens: 4, stream: true }) })).text();
    const events = raw.trim().split('\n\n');
    expect(events.at(-1)).toBe('data: [DONE]');
    expect(JSON.parse(events.at(-2)!.slice(6)).usage.completion_tokens).toBe(4);
  });

  test('sampling: the same seed gives the same sample, another seed another; n samples differ; top_k/top_p/min_p accepted', async () => {
    const ask = (seed: number, extra: object = {}) => client.chat.completions.create({ model: MODEL, messages: user('Tell me a story.'), max_tokens: 8, temperature: 1, seed, ...extra });
    const [a, b, c] = await Promise.all([ask(5), ask(5), ask(6)]);
    expect(a.choices[0].message.content).toBe(b.choices[0].message.content);
    expect(a.choices[0].message.content).not.toBe(c.choices[0].message.content);
    const many = await ask(5, { n: 3 });
    expect(many.choices.map((x) => x.index)).toEqual([0, 1, 2]);
    expect(many.choices[0].message.content).toBe(a.choices[0].message.content); // sample 0 reads the same stream
    expect(new Set(many.choices.map((x) => x.message.content)).size).toBe(3);
    expect(many.usage!.completion_tokens).toBe(3 * 8);
    // Filters: each a per-row input of the same step (two requests with different settings at once).
    const [filtered, again] = await Promise.all([ask(5, { top_p: 0.5, top_k: 3, min_p: 0.1, max_tokens: 4 }), ask(5, { top_p: 0.5, top_k: 3, min_p: 0.1, max_tokens: 4 })]);
    expect(filtered.choices[0].message.content).toBe(again.choices[0].message.content);
  });

  test('logprobs: chat top_logprobs and completions logprobs, raw log-probs of the emitted tokens', async () => {
    const r = await client.chat.completions.create({ model: MODEL, messages: user('Hi'), max_tokens: 5, temperature: 0, logprobs: true, top_logprobs: 3 });
    const content = r.choices[0].logprobs!.content!;
    expect(content).toHaveLength(r.usage!.completion_tokens - (r.choices[0].finish_reason === 'stop' ? 1 : 0));
    for (const e of content) {
      expect(e.top_logprobs).toHaveLength(3);
      expect(e.top_logprobs[0].token).toBe(e.token); // greedy: the emitted token is the most likely
      // two float32 sums of the same 151,936 exponentials in different orders (the sampler's chunk masses, a log-softmax): ~sqrt(V)·ε apart
      expect(e.logprob).toBeCloseTo(e.top_logprobs[0].logprob, 4);
      expect(e.top_logprobs[1].logprob).toBeLessThanOrEqual(e.top_logprobs[0].logprob);
      expect(Buffer.from(e.bytes!).toString('utf8')).toBe(e.token);
    }
    expect(content.map((e) => e.token).join('')).toBe(r.choices[0].message.content);
    const c = await client.completions.create({ model: MODEL, prompt: 'The capital of France is', max_tokens: 4, temperature: 0, logprobs: 2 });
    const lp = c.choices[0].logprobs!;
    expect(lp.tokens).toHaveLength(4);
    expect(lp.token_logprobs!.every((x) => x < 0)).toBe(true);
    expect(Object.keys(lp.top_logprobs![0])).toHaveLength(2);
    expect(lp.text_offset).toEqual(lp.tokens!.map((_, i) => lp.tokens!.slice(0, i).join('').length));
  });

  test('completions: text and token-id prompts give the same greedy text; several prompts, each n times', async () => {
    const ids = tok.encode('Once upon a time');
    const [a, b] = await Promise.all([
      client.completions.create({ model: MODEL, prompt: 'Once upon a time', max_tokens: 6, temperature: 0 }),
      client.completions.create({ model: MODEL, prompt: ids, max_tokens: 6, temperature: 0 }),
    ]);
    expect(a.choices[0].text).toBe(b.choices[0].text);
    expect(a.usage!.prompt_tokens).toBe(ids.length);
    const two = await client.completions.create({ model: MODEL, prompt: ['Once upon a time', 'Hello'], max_tokens: 6, temperature: 0, n: 2 });
    expect(two.choices.map((x) => x.index)).toEqual([0, 1, 2, 3]);
    expect(two.choices[0].text).toBe(a.choices[0].text);
    expect(two.choices[1].text).toBe(a.choices[0].text); // greedy: every sample the same
    expect(two.usage!.prompt_tokens).toBe(ids.length + tok.encode('Hello').length);
  });

  test('stop strings and stop token ids end a sample (finish_reason stop), streamed or not', async () => {
    const body = { model: MODEL, prompt: 'Once upon a time', max_tokens: 24, temperature: 0 };
    const free = await client.completions.create(body);
    const text = free.choices[0].text;
    expect(free.choices[0].finish_reason).toBe('length');
    const stopAt = text.slice(6, 9);
    const want = text.slice(0, text.indexOf(stopAt));
    const cut = await client.completions.create({ ...body, stop: [stopAt, 'NEVER-APPEARS'] });
    expect([cut.choices[0].text, cut.choices[0].finish_reason]).toEqual([want, 'stop']);
    let streamed = '';
    for await (const ch of await client.completions.create({ ...body, stop: stopAt, stream: true })) streamed += ch.choices[0]?.text ?? '';
    expect(streamed).toBe(want);
    // A stop token id: the third generated token ends the sample; it counts in usage but adds no text.
    const gen = await client.completions.create({ ...body, logprobs: 0 });
    const third = tok.encode(gen.choices[0].logprobs!.tokens!.slice(0, 3).join('')).at(-1)!;
    const byId = await client.completions.create({ ...body, stop_token_ids: [third] } as OpenAI.CompletionCreateParamsNonStreaming);
    expect(byId.choices[0].finish_reason).toBe('stop');
    expect(byId.usage!.completion_tokens).toBeLessThanOrEqual(3);
    expect(text.startsWith(byId.choices[0].text)).toBe(true);
  });

  test('bad input: a 400 in OpenAI error shape naming the field, and the server keeps serving', async () => {
    const post = async (body: string) => {
      const r = await fetch(`${running.url}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body });
      return { status: r.status, error: ((await r.json()) as { error: { param: string | null; message: string; type: string } }).error };
    };
    const ok = { model: MODEL, messages: user('Hi'), max_tokens: 2 };
    const cases: [string, string, RegExp][] = [
      ['{"model": "tiny-qwen3", "messages": [', 'body', /not valid JSON/],
      [JSON.stringify({ ...ok, model: 'gpt-9' }), 'model', /'gpt-9' is not served here/],
      [JSON.stringify({ ...ok, max_tokens: 500 }), 'max_tokens', /exceed the context of 96/],
      [JSON.stringify({ ...ok, temperature: -0.5 }), 'temperature', /must be ≥ 0/],
      [JSON.stringify({ ...ok, n: 5 }), 'n', /at most 4 samples/],
      [JSON.stringify({ ...ok, messages: user('word '.repeat(120)) }), 'messages', /the context is 96/],
      [JSON.stringify({ ...ok, top_p: 0 }), 'top_p', /must be > 0/],
      [JSON.stringify({ ...ok, messages: [{ role: 'robot', content: 'x' }] }), 'messages[0].role', /expected one of/],
      [JSON.stringify({ ...ok, top_logprobs: 2 }), 'top_logprobs', /needs logprobs: true/],
    ];
    for (const [body, param, message] of cases) {
      const r = await post(body);
      expect([r.status, r.error.param, r.error.type]).toEqual([400, param, 'invalid_request_error']);
      expect(r.error.message).toMatch(message);
    }
    // The openai client surfaces them as BadRequestError.
    await expect(client.chat.completions.create({ ...ok, temperature: -1 })).rejects.toMatchObject({ status: 400, param: 'temperature' });
    expect((await fetch(`${running.url}/nothing`)).status).toBe(404);
    const after = await client.chat.completions.create(ok);
    expect(after.usage!.completion_tokens).toBeGreaterThan(0);
  });

  test('@lathe/openai-client against the server: chat, a stream, and a 400 surfaced with its field', async () => {
    const c = new OpenAiClient({ baseUrl: running.url, timeoutMs: 30_000, maxRetries: 2 });
    expect(await c.models()).toEqual([MODEL]);
    const body = { model: MODEL, messages: user('Hi'), max_tokens: 5, temperature: 0 };
    const whole = await c.chat(body);
    let text = '';
    for await (const chunk of c.chatStream(body)) text += chunk.choices[0]?.delta.content ?? '';
    expect(text).toBe(whole.choices[0].message.content);
    const e = (await c.chat({ ...body, n: 99 }).catch((x: unknown) => x)) as OpenAiError;
    expect([e.status, e.param, e.retryable]).toEqual([400, 'n', false]);
    expect(c.stats.retries).toBe(0);
  });

  test('--model entries: ids from folder names or NAME=DIR, errors naming the entry; a taken port is named', async () => {
    expect(parseServeModels(`${dir}, judge=${dir}`)).toEqual([
      { id: MODEL, dir },
      { id: 'judge', dir },
    ]);
    expect(() => parseServeModels('')).toThrow(/--model is required/);
    expect(() => parseServeModels(`${dir},${dir}`)).toThrow(/two models have the id 'tiny-qwen3'; name them with NAME=DIR/);
    expect(() => parseServeModels('x=/no/such/dir')).toThrow(/--model x=\/no\/such\/dir: no config.json in \/no\/such\/dir/);
    expect(() => parseServeModels(`bad id=${dir}`)).toThrow(/the id 'bad id' may hold/);
    await expect(serve({ http_thread: httpThread, model: dir, port: running.port, max_rows: 1, max_model_len: 32 })).rejects.toThrow(new RegExp(`--port ${running.port}: cannot listen \\(EADDRINUSE\\); the port is taken`));
  });

  test('several models in one process: each answers under its own id', async () => {
    const two = await serve({ http_thread: httpThread, model: `policy=${dir},judge=${dir}`, max_rows: 2, max_model_len: 48 });
    try {
      const c = new OpenAI({ baseURL: two.url, apiKey: 'unused', maxRetries: 0 });
      expect((await c.models.list()).data.map((m) => m.id)).toEqual(['policy', 'judge']);
      const [p, j] = await Promise.all(['policy', 'judge'].map((model) => c.completions.create({ model, prompt: 'hello', max_tokens: 4, temperature: 0 })));
      expect([p.model, j.model]).toEqual(['policy', 'judge']);
      expect(p.choices[0].text).toBe(j.choices[0].text); // the same weights
      expect(two.models.map((m) => m.scheduler.counters.admitted)).toEqual([1, 1]);
    } finally {
      await two.close();
    }
  });
}
