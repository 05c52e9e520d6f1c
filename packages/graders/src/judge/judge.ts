/**
 * An LLM judge over an OpenAI-compatible chat endpoint (`lathe serve`, vLLM, SGLang, OpenAI): a
 * prompt template filled per item, a verdict parsed from the reply, a concurrency limit and a cache
 * keyed by the hash of the exact request. The HTTP side — per-attempt timeout, retries with
 * exponential backoff honouring Retry-After, OpenAI's error JSON — is `@lathe/openai-client`'s.
 */
import { createHash } from 'node:crypto';
import { OpenAiClient, type ChatMessage } from '@lathe/openai-client';

/** What the judge is asked about; every field fills the template placeholder of the same name. */
export interface JudgeItem {
  question: string;
  response: string;
  reference?: string;
}

/** The judge's decision on one item. */
export interface JudgeVerdict {
  /** 1 for correct, 0 for incorrect, a parsed score otherwise; null when the reply held no verdict. */
  score: number | null;
  /** The reply text. */
  reply: string;
  /** True when served from the cache. */
  cached: boolean;
}

/** Options of {@link LlmJudge}. */
export interface JudgeOptions {
  /** The API root, e.g. `http://127.0.0.1:8000/v1` (`/chat/completions` is appended). */
  baseUrl: string;
  model: string;
  /** Sent as `Authorization: Bearer …` when set. */
  apiKey?: string;
  /** The user message; `{question}`, `{response}` and `{reference}` are replaced. */
  promptTemplate: string;
  /** An optional system message. */
  systemPrompt?: string;
  /** Reads a verdict from the reply (default {@link parseVerdict}). */
  parse: (reply: string) => number | null;
  temperature: number;
  maxTokens: number;
  /** Requests in flight at once. */
  concurrency: number;
  /** Attempts after the first on network errors, 408, 429 and 5xx. */
  maxRetries: number;
  /** First backoff, doubled each retry (with jitter), capped by `maxBackoffMs`. */
  initialBackoffMs: number;
  maxBackoffMs: number;
  /** Per-request timeout, milliseconds. */
  timeoutMs: number;
  /**
   * The client to call through (e.g. one shared with other callers of the same server); default one
   * built from `baseUrl`, `apiKey`, `timeoutMs`, `maxRetries` and the backoff options.
   */
  client?: OpenAiClient;
}

/** A grading prompt for answers against a reference. */
export const DEFAULT_JUDGE_PROMPT = [
  'You are grading an answer to a problem.',
  'Problem:\n{question}',
  'Reference answer:\n{reference}',
  'Answer to grade:\n{response}',
  'Is the answer to grade correct, that is, equivalent to the reference answer? Reply with one line "VERDICT: CORRECT" or "VERDICT: INCORRECT".',
].join('\n\n');

/**
 * The default verdict parser: the last "VERDICT: CORRECT|INCORRECT" (or a bare CORRECT/INCORRECT,
 * YES/NO on the last line) gives 1 or 0; else the last "score: x" gives x; else null.
 */
export function parseVerdict(reply: string): number | null {
  const verdicts = [...reply.matchAll(/verdict\s*[:=]\s*\**\s*(correct|incorrect|yes|no)\b/gi)];
  const last = verdicts.at(-1);
  if (last) return /^(correct|yes)$/i.test(last[1]) ? 1 : 0;
  const lastLine = reply.trim().split('\n').at(-1)?.trim().replace(/[.*!]+$/g, '') ?? '';
  if (/^(correct|yes)$/i.test(lastLine)) return 1;
  if (/^(incorrect|no)$/i.test(lastLine)) return 0;
  const score = [...reply.matchAll(/score\s*[:=]\s*(-?\d+(?:\.\d+)?)/gi)].at(-1);
  return score ? Number(score[1]) : null;
}

/** Defaults of {@link JudgeOptions} other than the endpoint and model. */
export const JUDGE_DEFAULTS = {
  promptTemplate: DEFAULT_JUDGE_PROMPT,
  parse: parseVerdict,
  temperature: 0,
  maxTokens: 512,
  concurrency: 8,
  maxRetries: 4,
  initialBackoffMs: 500,
  maxBackoffMs: 8000,
  timeoutMs: 60_000,
} satisfies Partial<JudgeOptions>;

function fill(template: string, item: JudgeItem): string {
  return template.replace(/\{(question|response|reference)\}/g, (_, k: keyof JudgeItem) => item[k] ?? '');
}

/** Calls an OpenAI-compatible chat endpoint to judge items; safe to call concurrently. */
export class LlmJudge {
  readonly options: JudgeOptions;
  /** The client the requests go through. */
  readonly client: OpenAiClient;
  private readonly cache = new Map<string, string>();
  private running = 0;
  private readonly waiting: (() => void)[] = [];
  private cacheHits = 0;

  constructor(options: Partial<JudgeOptions> & Pick<JudgeOptions, 'baseUrl' | 'model'>) {
    this.options = { ...JUDGE_DEFAULTS, ...options };
    const o = this.options;
    if (!(o.concurrency >= 1)) throw new Error(`LlmJudge: concurrency must be ≥ 1, got ${o.concurrency}`);
    this.client = o.client ?? new OpenAiClient({ baseUrl: o.baseUrl, apiKey: o.apiKey, timeoutMs: o.timeoutMs, maxRetries: o.maxRetries, initialBackoffMs: o.initialBackoffMs, maxBackoffMs: o.maxBackoffMs });
  }

  /** Requests sent (retries included), retries, and items answered from the cache so far (requests and retries are the client's: all its callers'). */
  get stats(): { requests: number; retries: number; cacheHits: number } {
    return { requests: this.client.stats.requests, retries: this.client.stats.retries, cacheHits: this.cacheHits };
  }

  /** The chat request for an item (what is hashed for the cache). */
  request(item: JudgeItem): { model: string; messages: ChatMessage[]; temperature: number; max_tokens: number } {
    const o = this.options;
    const messages: ChatMessage[] = [...(o.systemPrompt ? [{ role: 'system' as const, content: o.systemPrompt }] : []), { role: 'user', content: fill(o.promptTemplate, item) }];
    return { model: o.model, messages, temperature: o.temperature, max_tokens: o.maxTokens };
  }

  /** Judges one item; throws (an `OpenAiError` naming the endpoint and status) once retries are exhausted. */
  async judge(item: JudgeItem): Promise<JudgeVerdict> {
    const body = this.request(item);
    const key = createHash('sha256').update(`${this.client.options.baseUrl}\n${JSON.stringify(body)}`).digest('hex');
    const hit = this.cache.get(key);
    if (hit !== undefined) {
      this.cacheHits++;
      return { score: this.options.parse(hit), reply: hit, cached: true };
    }
    const reply = await this.limited(async () => {
      const res = await this.client.chat(body);
      const content = res.choices?.[0]?.message?.content;
      if (typeof content !== 'string') throw new Error(`POST ${this.client.options.baseUrl}/chat/completions: the reply has no choices[0].message.content`);
      return content;
    });
    this.cache.set(key, reply);
    return { score: this.options.parse(reply), reply, cached: false };
  }

  /** Judges many items with the concurrency limit, in order. */
  judgeAll(items: readonly JudgeItem[]): Promise<JudgeVerdict[]> {
    return Promise.all(items.map((item) => this.judge(item)));
  }

  private async limited<T>(job: () => Promise<T>): Promise<T> {
    if (this.running >= this.options.concurrency) await new Promise<void>((r) => this.waiting.push(r));
    this.running++;
    try {
      return await job();
    } finally {
      this.running--;
      this.waiting.shift()?.();
    }
  }
}
