/**
 * Remote classmates and the LLM-judge reward against a local stub OpenAI-compatible server:
 * continuations requested with n = K, retries on 5xx, a server that stays down failing the step
 * with its URL named — or the configured fallback reward used and counted — a slow server timed
 * out, the judge's verdicts as a reward source (bounded concurrency, cache, failures counted); and
 * the `--classmates` / `--classmate_weights` parsing and the grpo config keys.
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { copyFileSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { classmateScorer, combineRewards } from '@lathe/grpo';
import { grpoSchema, grpoTrainerOptions, judgeSource, mapPool, parseClassmates, remoteClassmate, withClassmates } from '@lathe/recipes';
import { Device } from '@lathe/runtime';
import { HfTokenizer } from '@lathe/tokenizer';
import { tinyServeModel } from './serve-helpers';
import type { ClassmateConfig } from '../src/classmate-config';

/** A scripted /v1/completions and /v1/chat/completions server. */
class Stub {
  server!: Server;
  url = '';
  requests: { path: string; body: Record<string, unknown> }[] = [];
  failures: number[] = [];
  delayMs = 0;
  inFlight = 0;
  maxInFlight = 0;
  complete: (prompt: string, j: number) => string = (_p, j) => `answer: ${j}`;
  chat: (content: string) => string = () => 'VERDICT: CORRECT';

  async start(): Promise<this> {
    this.server = createServer((req, res) => void this.handle(req, res));
    await new Promise<void>((r) => this.server.listen(0, '127.0.0.1', () => r()));
    this.url = `http://127.0.0.1:${(this.server.address() as AddressInfo).port}/v1`;
    return this;
  }

  private async handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    let raw = '';
    for await (const chunk of req) raw += chunk;
    const body = JSON.parse(raw) as Record<string, unknown>;
    this.requests.push({ path: req.url ?? '', body });
    this.inFlight++;
    this.maxInFlight = Math.max(this.maxInFlight, this.inFlight);
    await new Promise((r) => setTimeout(r, this.delayMs));
    this.inFlight--;
    const fail = this.failures.shift();
    if (fail !== undefined) {
      res.statusCode = fail;
      res.end('{"error": "scripted failure"}');
      return;
    }
    res.setHeader('content-type', 'application/json');
    if (req.url?.endsWith('/chat/completions')) {
      const content = (body.messages as { content: string }[]).at(-1)!.content;
      res.end(JSON.stringify({ id: 'c', object: 'chat.completion', created: 0, model: 'm', choices: [{ index: 0, message: { role: 'assistant', content: this.chat(content) }, finish_reason: 'stop' }] }));
      return;
    }
    const n = Number(body.n ?? 1);
    // choices deliberately out of order: the client sorts them by index
    const choices = Array.from({ length: n }, (_, j) => ({ index: j, text: this.complete(String(body.prompt), j), finish_reason: 'stop' })).reverse();
    res.end(JSON.stringify({ id: 'x', object: 'text_completion', model: 'm', choices }));
  }

  close(): Promise<void> {
    return new Promise((r) => this.server.close(() => r()));
  }
}

interface Meta {
  answer: string;
}
const base = combineRewards<Meta>([{ name: 'correct', fn: (_p, c, m) => (c.endsWith(`answer: ${m.answer}`) ? 1 : 0) }], { fallback: 0 });
const samples = ['<think>think</think>answer: 1', '<think>more</think>answer: 0', 'answer: 1'].map((completion) => ({ prompt: 'Q: ', completion, meta: { answer: '1' } }));

describe('a remote classmate', () => {
  let stub: Stub;
  beforeEach(async () => {
    stub = await new Stub().start();
  });
  afterEach(() => stub.close());

  test('K continuations per text from /completions with n = K; its reward is their mean grade', async () => {
    const cm = remoteClassmate({ name: 'api', url: stub.url, maxTokens: 16, retries: 0 });
    const out = await classmateScorer(base, { classmates: [cm], samples: 4, weight: 0.5 })(samples);
    // continuations answer 0, 1, 2, 3: one in four is right
    expect(out.bySource.classmate).toEqual([0.25, 0.25, 0]);
    expect(stub.requests).toHaveLength(2);
    expect(stub.requests[0]).toMatchObject({ path: '/v1/completions', body: { model: 'api', prompt: 'Q: <think>think</think>', n: 4, max_tokens: 16 } });
  });

  test('5xx answers are retried; a server that stays down fails the step naming its URL', async () => {
    stub.failures = [503, 500];
    const ok = remoteClassmate({ name: 'api', url: stub.url, maxTokens: 8, retries: 2 });
    await classmateScorer(base, { classmates: [ok], samples: 2 })(samples.slice(0, 1));
    expect(ok.client.stats.retries).toBe(2);
    const down = remoteClassmate({ name: 'api', url: 'http://127.0.0.1:9/v1', maxTokens: 8, retries: 1, timeoutMs: 2000 });
    await expect(classmateScorer(base, { classmates: [down] })(samples)).rejects.toThrow(/classmate 'api' \(http:\/\/127\.0\.0\.1:9\/v1\) failed: POST http:\/\/127\.0\.0\.1:9\/v1\/completions: .*\(after 2 attempts\)/);
  });

  test('a slow server times out; with a fallback reward the step goes on, the samples counted as failures', async () => {
    stub.delayMs = 300;
    const slow = remoteClassmate({ name: 'slow', url: stub.url, maxTokens: 8, retries: 0, timeoutMs: 50 });
    const warn = jest.spyOn(console, 'warn').mockImplementation(() => undefined);
    const out = await classmateScorer(base, { classmates: [slow], fallbackReward: -1 })(samples);
    warn.mockRestore();
    expect(out.bySource.classmate).toEqual([-1, -1, 0]); // the third has no CoT: 0 by the no-CoT rule, not a fallback
    expect(out.stats.classmate.failures).toBe(2);
    expect(out.failures.map((f) => f.detail)).toEqual([expect.stringContaining('no answer within 50 ms'), expect.stringContaining('no answer within 50 ms')]);
  });
});

describe('the LLM judge as a reward source', () => {
  let stub: Stub;
  beforeEach(async () => {
    stub = await new Stub().start();
  });
  afterEach(() => stub.close());

  const cfg = (over: Partial<ClassmateConfig> = {}): ClassmateConfig => ({
    ...(Object.fromEntries(Object.entries(grpoSchema).map(([k, v]) => [k, v.default])) as unknown as ClassmateConfig),
    ...over,
  });

  test('verdicts become the source, at most --classmate_concurrency requests at once, identical requests cached; no verdict counts as a failure', async () => {
    stub.delayMs = 20;
    stub.chat = (content) => (content.includes('sycophantic') ? 'no idea' : content.includes('answer: 1') ? 'VERDICT: CORRECT' : 'VERDICT: INCORRECT');
    const dir = mkdtempSync(join(tmpdir(), 'lathe-judge-'));
    writeFileSync(join(dir, 'prompt.txt'), 'Q: {question}\nA: {response}\nRef: {reference}');
    const source = judgeSource<Meta>(cfg({ judge_url: stub.url, judge_model: 'judge-m', judge_prompt: join(dir, 'prompt.txt'), classmate_concurrency: 2, judge_weight: 0.5 }))!;
    const warn = jest.spyOn(console, 'warn').mockImplementation(() => undefined);
    const scorer = combineRewards<Meta>([source], { fallback: -2 });
    const batch = [...Array(6).keys()].map((i) => ({ prompt: `p${i}`, completion: i === 5 ? 'sycophantic' : `answer: ${i % 2}`, meta: { answer: '1' } }));
    const out = await scorer(batch);
    expect(out.bySource.judge).toEqual([0, 1, 0, 1, 0, -2]);
    expect(out.weights).toEqual({ judge: 0.5 });
    expect(out.stats.judge.failures).toBe(1);
    expect(stub.maxInFlight).toBeLessThanOrEqual(2);
    expect(stub.requests[0].body).toMatchObject({ model: 'judge-m' });
    expect((stub.requests[0].body.messages as { content: string }[])[0].content).toMatch(/^Q: p\d\nA: answer: \d\nRef: 1$/);
    const sent = stub.requests.length;
    await scorer(batch.slice(0, 5));
    expect(stub.requests.length).toBe(sent); // all five served from the cache
    warn.mockRestore();
    expect(() => judgeSource<Meta>(cfg({ judge_url: stub.url }))).toThrow(/--judge_url needs --judge_model/);
    expect(judgeSource<Meta>(cfg())).toBeUndefined();
  });
});

describe('classmates read the prompt through a chat template (--prompt_format chat)', () => {
  let stub: Stub;
  beforeEach(async () => {
    stub = await new Stub().start();
  });
  afterEach(() => stub.close());

  const cfg = (over: Partial<ClassmateConfig>): ClassmateConfig => ({
    ...(Object.fromEntries(Object.entries(grpoSchema).map(([k, v]) => [k, v.default])) as unknown as ClassmateConfig),
    ...over,
  });
  const Q = 'What is 2+3?';
  const COT = '<think>two plus three</think>';
  // the policy's tokenizer: characters (another vocabulary than the Qwen3 classmate's; text is exchanged)
  const chars = { encode: (t: string) => [...t].map((c) => c.charCodeAt(0) % 200), decode: (ids: readonly number[]) => String.fromCharCode(...ids), padId: 0 };
  const policyRender = (p: string) => `<policy-user>${p}</policy-user>`;

  test('a resident classmate renders it with its own tokenizer’s template, thinking as the policy’s; a server classmate gets the policy’s rendering', async () => {
    const thinking = true;
    const dir = tinyServeModel('tiny-qwen3');
    const qwen = await HfTokenizer.fromFolder(dir);
    const device = Device.open('cpu');
    const made = await withClassmates<Meta>(cfg({ classmates: `small=${dir},api=${stub.url}`, classmate_samples: 2, classmate_max_new_tokens: 2 }), base, {
      device,
      tokenizer: chars,
      maxNewTokens: 4,
      seed: 1,
      renderPrompt: policyRender,
      chat: { enableThinking: thinking },
    });
    try {
      const [small, api] = made.classmates;
      // a stub around the resident classmate records what it is handed, then lets the real model continue it
      const seen: string[] = [];
      const real = small.continueTexts.bind(small);
      small.continueTexts = async (texts, k, seed) => {
        seen.push(...texts);
        return real(texts, k, seed);
      };
      const out = await made.rewards([{ prompt: Q, completion: `${COT}answer: 1`, meta: { answer: '1' } }]);
      const template = qwen.applyChatTemplate([{ role: 'user', content: Q }], { addGenerationPrompt: true, enableThinking: thinking });
      expect(template).toContain(`<|im_start|>user\n${Q}<|im_end|>\n<|im_start|>assistant\n`);
      expect(template).not.toContain('</think>'); // thinking on: the policy opens its own thinking block
      expect(seen).toEqual([template + COT]);
      expect(stub.requests.map((r) => r.body.prompt)).toEqual([policyRender(Q) + COT]);
      // the resident classmate's two continuations were decoded with its own tokenizer and graded: a mean of K = 2 grades
      expect(out.bySource.classmate_accuracy[0] * 4).toBeCloseTo(Math.round(out.bySource.classmate_accuracy[0] * 4), 12);
      expect(Number.isFinite(out.bySource.classmate[0])).toBe(true);
      void api;
      // thinking off: the same classmate built for it renders Qwen3's closed empty thinking block
      const off = await withClassmates<Meta>(cfg({ classmates: `small=${dir}` }), base, { device, tokenizer: chars, maxNewTokens: 4, seed: 1, chat: { enableThinking: false } });
      const offTemplate = qwen.applyChatTemplate([{ role: 'user', content: Q }], { addGenerationPrompt: true, enableThinking: false });
      expect(offTemplate).toContain('<think>\n\n</think>');
      expect(off.classmates[0].formatText!(Q, COT)).toBe(offTemplate + COT);
      off.dispose();
    } finally {
      made.dispose();
    }
  }, 120_000);

  test('raw prompts (no chat): every classmate reads prompt + CoT as text; a classmate tokenizer without a template is refused under chat', async () => {
    const made = await withClassmates<Meta>(cfg({ classmates: `api=${stub.url}`, classmate_samples: 1 }), base, { device: Device.open('cpu'), tokenizer: chars, maxNewTokens: 4, seed: 1 });
    await made.rewards([{ prompt: Q, completion: `${COT}answer: 1`, meta: { answer: '1' } }]);
    expect(stub.requests.map((r) => r.body.prompt)).toEqual([Q + COT]);
    const bare = mkdtempSync(join(tmpdir(), 'lathe-classmate-'));
    const dir = tinyServeModel('tiny-qwen3');
    for (const f of ['config.json', 'model.safetensors', 'tokenizer.json']) copyFileSync(join(dir, f), join(bare, f));
    const { chat_template: _template, ...tokConfig } = JSON.parse(readFileSync(join(dir, 'tokenizer_config.json'), 'utf8')) as Record<string, unknown>;
    writeFileSync(join(bare, 'tokenizer_config.json'), JSON.stringify(tokConfig));
    await expect(withClassmates<Meta>(cfg({ classmates: `small=${bare}` }), base, { device: Device.open('cpu'), tokenizer: chars, maxNewTokens: 4, seed: 1, chat: { enableThinking: false } })).rejects.toThrow(
      `--classmates small=${bare}: --prompt_format chat, and this classmate's tokenizer has no chat template`,
    );
  }, 120_000);
});

describe('options', () => {
  test('--classmates and --classmate_weights', () => {
    expect(parseClassmates('self=self, small=models/small,api=http://h:8000/v1', 'api=2')).toEqual([
      { name: 'self', kind: 'self', source: 'self', weight: 1 },
      { name: 'small', kind: 'folder', source: 'models/small', weight: 1 },
      { name: 'api', kind: 'url', source: 'http://h:8000/v1', weight: 2 },
    ]);
    expect(parseClassmates('')).toEqual([]);
    expect(() => parseClassmates('small')).toThrow(/--classmates: 'small' is not name=SOURCE/);
    expect(() => parseClassmates('a=self,a=x')).toThrow(/two classmates are named 'a'/);
    expect(() => parseClassmates('a=self', 'b=1')).toThrow(/--classmate_weights: 'b' is not a classmate/);
    expect(() => parseClassmates('a=self', 'a=-1')).toThrow(/--classmate_weights: 'a=-1' is not name=weight/);
  });

  test('the method’s keys are grpo options; rollout_is_threshold reaches the loss', () => {
    for (const k of ['classmate_reward_type', 'use_classmate_condition', 'token_level_classmate_reward_mode', 'rollout_is_threshold', 'estimator']) expect(grpoSchema).toHaveProperty(k);
    expect(grpoSchema.estimator.choices).toEqual(expect.arrayContaining(['gdpo', 'grpo_main_classmate_separated']));
    const defaults = Object.fromEntries(Object.entries(grpoSchema).map(([k, v]) => [k, v.default])) as Parameters<typeof grpoTrainerOptions>[0];
    // on by default at the method's C = 4 (the default); 0 turns it off; a cap below 1 is refused by flag
    expect(grpoSchema.rollout_is_threshold.default).toBe(4);
    expect((grpoTrainerOptions(defaults).loss as { rolloutIsThreshold?: number }).rolloutIsThreshold).toBe(4);
    expect((grpoTrainerOptions({ ...defaults, rollout_is_threshold: 0 }).loss as { rolloutIsThreshold?: number }).rolloutIsThreshold).toBe(0);
    expect((grpoTrainerOptions({ ...defaults, rollout_is_threshold: 2 }).loss as { rolloutIsThreshold?: number }).rolloutIsThreshold).toBe(2);
    expect(() => grpoTrainerOptions({ ...defaults, rollout_is_threshold: 0.5 })).toThrow(/--rollout_is_threshold 0\.5: must be 0 \(off\) or ≥ 1/);
  });

  test('mapPool keeps order and bounds concurrency', async () => {
    let live = 0;
    let peak = 0;
    const out = await mapPool([5, 1, 4, 2, 3], 2, async (x) => {
      peak = Math.max(peak, ++live);
      await new Promise((r) => setTimeout(r, x));
      live--;
      return x * 10;
    });
    expect(out).toEqual([50, 10, 40, 20, 30]);
    expect(peak).toBe(2);
  });
});
