import { createServer, type IncomingMessage, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { LlmJudge, parseVerdict } from '@lathe/graders';
import { OpenAiClient, OpenAiError } from '@lathe/openai-client';

/** A local OpenAI-compatible chat server whose behaviour each test scripts. */
class FakeChatServer {
  server!: Server;
  url = '';
  requests: Record<string, unknown>[] = [];
  authorization: (string | undefined)[] = [];
  inFlight = 0;
  maxInFlight = 0;
  /** Status codes to answer with before succeeding (consumed one per request). */
  failures: number[] = [];
  retryAfter: string | null = null;
  delayMs = 0;
  reply: (prompt: string) => string = () => 'VERDICT: CORRECT';
  /** When set, the whole 200 body instead of a chat completion around `reply`. */
  rawReply: string | null = null;

  async start(): Promise<void> {
    this.server = createServer((req, res) => void this.handle(req, res));
    await new Promise<void>((r) => this.server.listen(0, '127.0.0.1', () => r()));
    this.url = `http://127.0.0.1:${(this.server.address() as AddressInfo).port}/v1`;
  }

  private async handle(req: IncomingMessage, res: import('node:http').ServerResponse): Promise<void> {
    let body = '';
    for await (const chunk of req) body += chunk;
    const json = JSON.parse(body) as { messages: { content: string }[] };
    this.requests.push(json);
    this.authorization.push(req.headers.authorization);
    this.inFlight++;
    this.maxInFlight = Math.max(this.maxInFlight, this.inFlight);
    await new Promise((r) => setTimeout(r, this.delayMs));
    this.inFlight--;
    const fail = this.failures.shift();
    if (fail !== undefined) {
      if (this.retryAfter) res.setHeader('retry-after', this.retryAfter);
      res.statusCode = fail;
      res.end('{"error": "scripted failure"}');
      return;
    }
    if (this.rawReply !== null) {
      res.end(this.rawReply);
      return;
    }
    const prompt = json.messages.at(-1)!.content;
    res.setHeader('content-type', 'application/json');
    res.end(JSON.stringify({ choices: [{ message: { role: 'assistant', content: this.reply(prompt) } }] }));
  }

  close(): Promise<void> {
    return new Promise((r) => this.server.close(() => r()));
  }
}

describe('parseVerdict', () => {
  test.each([
    ['Reasoning...\nVERDICT: CORRECT', 1],
    ['VERDICT: INCORRECT', 0],
    ['verdict = **correct**', 1],
    ['first VERDICT: CORRECT, on reflection VERDICT: INCORRECT', 0],
    ['The answer matches.\nYes.', 1],
    ['No', 0],
    ['score: 7.5', 7.5],
    ['I cannot tell.', null],
  ])('%j → %s', (reply, expected) => expect(parseVerdict(reply)).toBe(expected));
});

describe('LlmJudge against a local server', () => {
  let server: FakeChatServer;
  beforeEach(async () => {
    server = new FakeChatServer();
    await server.start();
  });
  afterEach(() => server.close());

  test('fills the template, sends model, key and system prompt, parses the verdict', async () => {
    server.reply = (prompt) => (prompt.includes('Answer to grade:\n42') ? 'VERDICT: CORRECT' : 'VERDICT: INCORRECT');
    const judge = new LlmJudge({ baseUrl: server.url, model: 'judge-1', apiKey: 'k', systemPrompt: 'be strict' });
    const [a, b] = await judge.judgeAll([
      { question: 'q', response: '42', reference: '42' },
      { question: 'q', response: '41', reference: '42' },
    ]);
    expect(a).toMatchObject({ score: 1, cached: false });
    expect(b.score).toBe(0);
    expect(server.requests[0]).toMatchObject({ model: 'judge-1', temperature: 0, messages: [{ role: 'system', content: 'be strict' }, { role: 'user' }] });
    expect(server.authorization[0]).toBe('Bearer k');
  });

  test('identical requests are served from the cache', async () => {
    const judge = new LlmJudge({ baseUrl: server.url, model: 'm' });
    const item = { question: 'q', response: 'r', reference: 'x' };
    await judge.judge(item);
    const again = await judge.judge(item);
    expect(again.cached).toBe(true);
    expect(server.requests).toHaveLength(1);
    expect(judge.stats.cacheHits).toBe(1);
  });

  test('retries 500 and 429 (honouring Retry-After) with backoff, then succeeds', async () => {
    server.failures = [500, 429];
    server.retryAfter = '0.05';
    const judge = new LlmJudge({ baseUrl: server.url, model: 'm', initialBackoffMs: 10 });
    const t0 = Date.now();
    const v = await judge.judge({ question: 'q', response: 'r' });
    expect(v.score).toBe(1);
    expect(server.requests).toHaveLength(3);
    expect(judge.stats.retries).toBe(2);
    expect(Date.now() - t0).toBeGreaterThanOrEqual(50);
  });

  test('gives up after maxRetries with an error naming the endpoint and status', async () => {
    server.failures = [503, 503, 503];
    const judge = new LlmJudge({ baseUrl: server.url, model: 'm', maxRetries: 2, initialBackoffMs: 1 });
    const e = await judge.judge({ question: 'q', response: 'r' }).catch((x: unknown) => x);
    expect(e).toBeInstanceOf(OpenAiError);
    expect((e as OpenAiError).status).toBe(503);
    expect((e as Error).message).toBe(`POST ${server.url}/chat/completions: 503 scripted failure (after 3 attempts)`);
    expect(server.requests).toHaveLength(3);
  });

  test('a 400 is not retried', async () => {
    server.failures = [400];
    const judge = new LlmJudge({ baseUrl: server.url, model: 'm', initialBackoffMs: 1 });
    await expect(judge.judge({ question: 'q', response: 'r' })).rejects.toThrow(/chat\/completions: 400 scripted failure$/);
    expect(server.requests).toHaveLength(1);
  });

  test('an attempt past timeoutMs is abandoned and retried; the error says so', async () => {
    server.delayMs = 2500;
    const judge = new LlmJudge({ baseUrl: server.url, model: 'm', timeoutMs: 50, maxRetries: 1, initialBackoffMs: 1 });
    const t0 = Date.now();
    await expect(judge.judge({ question: 'q', response: 'r' })).rejects.toThrow(`POST ${server.url}/chat/completions: no answer within 50 ms (after 2 attempts)`);
    // two attempts of 50 ms each, not the server's 2.5 s (with room for a loaded machine's event loop)
    expect(Date.now() - t0).toBeLessThan(1500);
    expect(judge.stats).toMatchObject({ requests: 2, retries: 1 });
  });

  test('a reply without message content is an error naming the endpoint, not a verdict', async () => {
    server.rawReply = JSON.stringify({ choices: [] });
    const judge = new LlmJudge({ baseUrl: server.url, model: 'm' });
    await expect(judge.judge({ question: 'q', response: 'r' })).rejects.toThrow(`POST ${server.url}/chat/completions: the reply has no choices[0].message.content`);
  });

  test('a 2xx reply that is not JSON fails at once, naming the endpoint', async () => {
    server.rawReply = '<html>proxy page</html>';
    const judge = new LlmJudge({ baseUrl: server.url, model: 'm', initialBackoffMs: 1 });
    await expect(judge.judge({ question: 'q', response: 'r' })).rejects.toThrow(new RegExp(`^POST ${server.url.replace(/[.]/g, '\\.')}/chat/completions: the reply is not JSON`));
    expect(server.requests).toHaveLength(1);
  });

  test('judges through a client it is given, shared with other callers', async () => {
    const client = new OpenAiClient({ baseUrl: server.url, maxRetries: 0 });
    const judge = new LlmJudge({ baseUrl: server.url, model: 'm', client });
    expect((await judge.judge({ question: 'q', response: 'r' })).score).toBe(1);
    expect(judge.client).toBe(client);
    expect(client.stats.requests).toBe(1);
  });

  test('keeps at most `concurrency` requests in flight', async () => {
    server.delayMs = 30;
    const judge = new LlmJudge({ baseUrl: server.url, model: 'm', concurrency: 3 });
    const items = Array.from({ length: 12 }, (_, i) => ({ question: `q${i}`, response: 'r' }));
    const verdicts = await judge.judgeAll(items);
    expect(verdicts).toHaveLength(12);
    expect(server.maxInFlight).toBe(3);
  });

  test('a server that is down fails after its retries, named by its URL', async () => {
    // a port that was just free: nothing listens there
    const down = server.url;
    await server.close();
    const judge = new LlmJudge({ baseUrl: down, model: 'm', maxRetries: 1, initialBackoffMs: 1 });
    await expect(judge.judge({ question: 'q', response: 'r' })).rejects.toThrow(`POST ${down}/chat/completions: ECONNREFUSED (after 2 attempts)`);
    server = new FakeChatServer();
    await server.start();
    expect(judge.stats).toMatchObject({ requests: 2, retries: 1 });
  });
});
