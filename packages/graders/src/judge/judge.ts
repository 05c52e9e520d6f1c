/**
 * An LLM judge over an OpenAI-compatible chat endpoint: a prompt template filled per item, a
 * verdict parsed from the reply, retries with exponential backoff (honouring Retry-After), a
 * concurrency limit, and a cache keyed by the hash of the exact request.
 */
import { createHash } from 'node:crypto';

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

class RetryableError extends Error {
  constructor(
    message: string,
    readonly retryAfterMs: number | null,
  ) {
    super(message);
  }
}

function fill(template: string, item: JudgeItem): string {
  return template.replace(/\{(question|response|reference)\}/g, (_, k: keyof JudgeItem) => item[k] ?? '');
}

/** Calls an OpenAI-compatible chat endpoint to judge items; safe to call concurrently. */
export class LlmJudge {
  readonly options: JudgeOptions;
  private readonly cache = new Map<string, string>();
  private running = 0;
  private readonly waiting: (() => void)[] = [];
  /** Requests sent (including retries) and cache hits so far. */
  readonly stats = { requests: 0, retries: 0, cacheHits: 0 };

  constructor(options: Partial<JudgeOptions> & Pick<JudgeOptions, 'baseUrl' | 'model'>) {
    this.options = { ...JUDGE_DEFAULTS, ...options };
    if (!(this.options.concurrency >= 1)) throw new Error(`LlmJudge: concurrency must be ≥ 1, got ${this.options.concurrency}`);
  }

  /** The chat request for an item (what is hashed for the cache). */
  request(item: JudgeItem): Record<string, unknown> {
    const o = this.options;
    const messages = [...(o.systemPrompt ? [{ role: 'system', content: o.systemPrompt }] : []), { role: 'user', content: fill(o.promptTemplate, item) }];
    return { model: o.model, messages, temperature: o.temperature, max_tokens: o.maxTokens };
  }

  /** Judges one item; throws (naming the endpoint and status) once retries are exhausted. */
  async judge(item: JudgeItem): Promise<JudgeVerdict> {
    const body = this.request(item);
    const key = createHash('sha256').update(`${this.options.baseUrl}\n${JSON.stringify(body)}`).digest('hex');
    const hit = this.cache.get(key);
    if (hit !== undefined) {
      this.stats.cacheHits++;
      return { score: this.options.parse(hit), reply: hit, cached: true };
    }
    const reply = await this.limited(() => this.withRetries(body));
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

  private async withRetries(body: Record<string, unknown>): Promise<string> {
    const o = this.options;
    for (let attempt = 0; ; attempt++) {
      try {
        return await this.call(body);
      } catch (e) {
        if (!(e instanceof RetryableError) || attempt >= o.maxRetries) throw e;
        this.stats.retries++;
        const backoff = Math.min(o.maxBackoffMs, o.initialBackoffMs * 2 ** attempt) * (0.5 + Math.random() / 2);
        await new Promise((r) => setTimeout(r, Math.max(backoff, e.retryAfterMs ?? 0)));
      }
    }
  }

  private async call(body: Record<string, unknown>): Promise<string> {
    const o = this.options;
    const url = `${o.baseUrl.replace(/\/+$/, '')}/chat/completions`;
    this.stats.requests++;
    let res: Response;
    try {
      res = await fetch(url, {
        method: 'POST',
        headers: { 'content-type': 'application/json', ...(o.apiKey ? { authorization: `Bearer ${o.apiKey}` } : {}) },
        body: JSON.stringify(body),
        signal: AbortSignal.timeout(o.timeoutMs),
      });
    } catch (e) {
      throw new RetryableError(`${url}: ${(e as Error).message}`, null);
    }
    if (res.status === 408 || res.status === 429 || res.status >= 500) {
      const after = Number(res.headers.get('retry-after'));
      throw new RetryableError(`${url}: HTTP ${res.status}`, Number.isFinite(after) && after > 0 ? after * 1000 : null);
    }
    const text = await res.text();
    if (!res.ok) throw new Error(`${url}: HTTP ${res.status}: ${text.slice(0, 300)}`);
    let json: { choices?: { message?: { content?: unknown } }[] };
    try {
      json = JSON.parse(text) as typeof json;
    } catch {
      throw new Error(`${url}: reply is not JSON: ${text.slice(0, 200)}`);
    }
    const content = json.choices?.[0]?.message?.content;
    if (typeof content !== 'string') throw new Error(`${url}: reply has no choices[0].message.content`);
    return content;
  }
}
