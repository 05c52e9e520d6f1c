/**
 * OpenAiClient against a scripted local HTTP server: retries on 429 (honouring Retry-After), 5xx and
 * dropped connections; no retry on 400, whose OpenAI error fields come through; a timeout per
 * attempt; streams read to [DONE]; the caller's abort wins.
 */
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { OpenAiClient, OpenAiError } from '@lathe/openai-client';

type Handler = (req: IncomingMessage, res: ServerResponse, body: string) => void;
let script: Handler[] = [];
const seen: { path: string; body: string; auth?: string }[] = [];
const server = createServer((req, res) => {
  let body = '';
  req.on('data', (d) => (body += d));
  req.on('end', () => {
    seen.push({ path: req.url!, body, auth: req.headers.authorization });
    const h = script.shift();
    if (!h) throw new Error('no scripted answer');
    h(req, res, body);
  });
});
let base = '';
beforeAll(() => new Promise<void>((r) => server.listen(0, '127.0.0.1', () => ((base = `http://127.0.0.1:${(server.address() as AddressInfo).port}/v1`), r()))));
afterAll(() => {
  server.closeAllConnections();
  return new Promise<void>((r) => server.close(() => r()));
});
beforeEach(() => {
  script = [];
  seen.length = 0;
});

const json = (status: number, body: unknown, headers: Record<string, string> = {}): Handler => (_q, res) => {
  res.writeHead(status, { 'content-type': 'application/json', ...headers });
  res.end(JSON.stringify(body));
};
const reply = { id: 'c1', object: 'chat.completion', created: 0, model: 'm', choices: [{ index: 0, message: { role: 'assistant', content: 'ok' }, finish_reason: 'stop' }], usage: { prompt_tokens: 1, completion_tokens: 1, total_tokens: 2 } };
const ask = { model: 'm', messages: [{ role: 'user' as const, content: 'hi' }] };

test('retries 429 after the Retry-After it names, then 503 with backoff, then succeeds', async () => {
  script = [json(429, { error: { message: 'busy', type: 'rate_limit_error' } }, { 'retry-after-ms': '120' }), json(503, { error: { message: 'down' } }), json(200, reply)];
  const client = new OpenAiClient({ baseUrl: base, apiKey: 'k', initialBackoffMs: 10 });
  const started = performance.now();
  const r = await client.chat(ask);
  expect(r.choices[0].message.content).toBe('ok');
  expect(performance.now() - started).toBeGreaterThanOrEqual(120);
  expect(client.stats).toEqual({ requests: 3, retries: 2 });
  expect(seen.map((s) => [s.path, JSON.parse(s.body).stream, s.auth])).toEqual(Array(3).fill(['/v1/chat/completions', false, 'Bearer k']));
});

test('a 400 is not retried; its OpenAI error fields come through', async () => {
  script = [json(400, { error: { message: 'temperature: must be ≥ 0, got -1', type: 'invalid_request_error', param: 'temperature', code: null } })];
  const client = new OpenAiClient({ baseUrl: base, initialBackoffMs: 1 });
  const e = (await client.chat({ ...ask, temperature: -1 }).catch((x: unknown) => x)) as OpenAiError;
  expect(e).toBeInstanceOf(OpenAiError);
  expect([e.status, e.param, e.type, e.retryable]).toEqual([400, 'temperature', 'invalid_request_error', false]);
  expect(e.message).toMatch(/POST .*\/v1\/chat\/completions: 400 temperature: must be ≥ 0/);
  expect(client.stats.requests).toBe(1);
});

test('a dropped connection and a timeout are retried; retries run out with the attempts named', async () => {
  const drop: Handler = (req) => req.socket.destroy();
  const hang: Handler = () => undefined;
  script = [drop, hang, json(200, reply)];
  // long enough that the scripted answer after the hang never times out on a loaded machine; the
  // hang costs the test this long once
  const client = new OpenAiClient({ baseUrl: base, timeoutMs: 1500, initialBackoffMs: 1 });
  expect((await client.chat(ask)).id).toBe('c1');
  expect(client.stats.retries).toBe(2);
  script = [json(500, { error: { message: 'boom' } }), json(500, { error: { message: 'boom' } })];
  const few = new OpenAiClient({ baseUrl: base, maxRetries: 1, initialBackoffMs: 1 });
  await expect(few.completions({ model: 'm', prompt: 'x' })).rejects.toThrow(/500 boom \(after 2 attempts\)/);
});

test('streams: chunks in order up to [DONE]; an error event is thrown; the caller can abort', async () => {
  const sse = (events: string[]): Handler => (_q, res) => {
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    for (const e of events) res.write(`data: ${e}\n\n`);
    res.end();
  };
  const chunk = (content: string, finish: string | null = null) => JSON.stringify({ id: 'c', object: 'chat.completion.chunk', model: 'm', choices: [{ index: 0, delta: { content }, finish_reason: finish }] });
  script = [sse([chunk('a'), chunk('b'), chunk('', 'stop'), JSON.stringify({ id: 'c', choices: [], usage: { prompt_tokens: 1, completion_tokens: 2, total_tokens: 3 } }), '[DONE]'])];
  const client = new OpenAiClient({ baseUrl: base });
  let text = '';
  let usage;
  for await (const c of client.chatStream(ask)) {
    text += c.choices[0]?.delta.content ?? '';
    usage = c.usage ?? usage;
  }
  expect(text).toBe('ab');
  expect(usage).toEqual({ prompt_tokens: 1, completion_tokens: 2, total_tokens: 3 });
  expect(JSON.parse(seen[0].body).stream).toBe(true);
  script = [sse([chunk('a'), JSON.stringify({ error: { message: 'generation failed: x', type: 'server_error' } })])];
  await expect(async () => {
    for await (const c of client.chatStream(ask)) void c;
  }).rejects.toThrow(/generation failed: x/);
  script = [() => undefined];
  const abort = new AbortController();
  setTimeout(() => abort.abort(new Error('caller gave up')), 50);
  await expect(client.chat(ask, { signal: abort.signal })).rejects.toThrow(/caller gave up/);
  expect(client.stats.retries).toBe(0);
});
