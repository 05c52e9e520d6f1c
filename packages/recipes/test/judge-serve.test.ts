/**
 * The graders' LLM judge against a real `lathe serve` (a tiny random Qwen3 on the CPU), through
 * @lathe/openai-client. Independent truth: the judge's reply is the server's greedy chat answer to
 * the filled template, asked directly over HTTP, and its verdict is the parser's reading of it.
 */
import { DEFAULT_JUDGE_PROMPT, LlmJudge } from '@lathe/graders';
import { serve, tinyServeModel } from './serve-helpers';

let running: Awaited<ReturnType<typeof serve>>;
beforeAll(async () => {
  running = await serve({ model: `judge=${tinyServeModel('policy')}`, max_rows: 4, max_model_len: 256 });
}, 120_000);
afterAll(() => running?.close());

/** The server's greedy chat answer to one user message, asked without the judge. */
async function direct(content: string, maxTokens: number): Promise<string> {
  const res = await fetch(`${running.url}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'judge', messages: [{ role: 'user', content }], max_tokens: maxTokens, temperature: 0 }) });
  expect(res.status).toBe(200);
  return ((await res.json()) as { choices: { message: { content: string } }[] }).choices[0].message.content;
}

test('the judge asks lathe serve with its template and returns the verdict its parser reads from the reply', async () => {
  const item = { question: 'What is 2 + 3?', response: '5', reference: '5' };
  // a random model writes no "VERDICT: …": this parser's verdict is the reply's length in characters
  const judge = new LlmJudge({ baseUrl: running.url, model: 'judge', maxTokens: 8, parse: (reply) => reply.length, timeoutMs: 30_000 });
  const v = await judge.judge(item);
  const expected = await direct(DEFAULT_JUDGE_PROMPT.replace('{question}', item.question).replace('{response}', item.response).replace('{reference}', item.reference), 8);
  expect(expected.length).toBeGreaterThan(0);
  expect(v).toEqual({ score: expected.length, reply: expected, cached: false });
  expect(judge.stats).toEqual({ requests: 1, retries: 0, cacheHits: 0 });
}, 60_000);

test("lathe serve's 400 (an unknown model) reaches the judge's caller unretried, naming the field", async () => {
  const judge = new LlmJudge({ baseUrl: running.url, model: 'no-such-model', maxTokens: 4, initialBackoffMs: 1 });
  await expect(judge.judge({ question: 'q', response: 'r' })).rejects.toMatchObject({ status: 400, param: 'model' });
  expect(judge.stats.retries).toBe(0);
}, 60_000);
