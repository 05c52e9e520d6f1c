/**
 * A client for OpenAI-compatible HTTP servers — `lathe serve`, vLLM, SGLang, OpenAI itself — on
 * Node's own fetch, with no dependencies, so that every layer of Lathe (the LLM judge in graders,
 * remote rewards, benchmarks) can use one piece of code: a timeout per attempt, retries with
 * exponential backoff and jitter on network errors, timeouts, 408, 409, 429 and 5xx (a server's
 * `Retry-After` / `retry-after-ms` wins over the backoff), OpenAI's error JSON surfaced as
 * {@link OpenAiError}, and server-sent-event streams read chunk by chunk up to `[DONE]`.
 */

/** How a client reaches its server. */
export interface OpenAiClientOptions {
  /** The API root, e.g. `http://127.0.0.1:8000/v1`. */
  baseUrl: string;
  /** Sent as `Authorization: Bearer …` when set. */
  apiKey?: string;
  /** Milliseconds one attempt may take (a stream: until its first byte). Default 60 000. */
  timeoutMs?: number;
  /** Attempts after the first, on retryable failures only. Default 4. */
  maxRetries?: number;
  /** First backoff in milliseconds, doubled each retry (with jitter), capped by `maxBackoffMs`. Defaults 500 and 8 000. */
  initialBackoffMs?: number;
  maxBackoffMs?: number;
  /** Extra headers on every request. */
  headers?: Record<string, string>;
}

/** A failed call: the server's status and OpenAI error fields, or status 0 for a network error or timeout. */
export class OpenAiError extends Error {
  constructor(
    message: string,
    readonly status: number,
    readonly type: string | null = null,
    readonly param: string | null = null,
    readonly code: string | null = null,
    /** Milliseconds the server asked to wait (Retry-After), when it did. */
    readonly retryAfterMs: number | null = null,
  ) {
    super(message);
    this.name = 'OpenAiError';
  }

  /** Whether trying again may succeed: network errors, timeouts, 408, 409, 429 and 5xx. */
  get retryable(): boolean {
    return this.status === 0 || this.status === 408 || this.status === 409 || this.status === 429 || this.status >= 500;
  }
}

/** A chat message. */
export interface ChatMessage {
  role: 'system' | 'developer' | 'user' | 'assistant' | 'tool';
  content: string;
}

/** Token usage, as every `lathe serve` response reports it. */
export interface Usage {
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens: number;
}

/** The fields of a chat completion request this client types; others pass through. */
export interface ChatRequest {
  model: string;
  messages: ChatMessage[];
  max_tokens?: number;
  temperature?: number;
  top_p?: number;
  top_k?: number;
  min_p?: number;
  n?: number;
  stop?: string | (string | number)[];
  seed?: number;
  logprobs?: boolean;
  top_logprobs?: number;
  chat_template_kwargs?: Record<string, unknown>;
  [extra: string]: unknown;
}

/** A chat completion response. */
export interface ChatResponse {
  id: string;
  object: 'chat.completion';
  created: number;
  model: string;
  choices: { index: number; message: { role: 'assistant'; content: string | null }; finish_reason: string | null; logprobs?: unknown }[];
  usage?: Usage;
  system_fingerprint?: string | null;
}

/** One chunk of a streamed chat completion. */
export interface ChatChunk {
  id: string;
  object: 'chat.completion.chunk';
  model: string;
  choices: { index: number; delta: { role?: string; content?: string | null }; finish_reason: string | null; logprobs?: unknown }[];
  usage?: Usage | null;
}

/** The fields of a text completion request this client types; others pass through. */
export interface CompletionRequest {
  model: string;
  prompt: string | number[] | (string | number[])[];
  max_tokens?: number;
  temperature?: number;
  top_p?: number;
  n?: number;
  stop?: string | (string | number)[];
  seed?: number;
  logprobs?: number;
  [extra: string]: unknown;
}

/** A text completion response. */
export interface CompletionResponse {
  id: string;
  object: 'text_completion';
  model: string;
  choices: { index: number; text: string; finish_reason: string | null; logprobs?: unknown }[];
  usage?: Usage;
}

const sleep = (ms: number, signal?: AbortSignal) =>
  new Promise<void>((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const t = setTimeout(resolve, ms);
    signal?.addEventListener('abort', () => (clearTimeout(t), reject(signal.reason)), { once: true });
  });

/** Milliseconds a response asks to wait: `retry-after-ms`, or `Retry-After` in seconds or as a date. */
function retryAfterOf(headers: Headers): number | null {
  const ms = Number(headers.get('retry-after-ms'));
  if (headers.get('retry-after-ms') !== null && Number.isFinite(ms) && ms >= 0) return ms;
  const v = headers.get('retry-after');
  if (v === null) return null;
  const s = Number(v);
  if (Number.isFinite(s) && s >= 0) return s * 1000;
  const at = Date.parse(v);
  return Number.isNaN(at) ? null : Math.max(0, at - Date.now());
}

async function errorOf(res: Response, what: string): Promise<OpenAiError> {
  const text = await res.text().catch(() => '');
  let e: { message?: string; type?: string; param?: string; code?: string } = {};
  try {
    const body = JSON.parse(text) as { error?: typeof e | string; message?: string };
    e = typeof body.error === 'object' && body.error ? body.error : { message: typeof body.error === 'string' ? body.error : body.message };
  } catch {
    e = { message: text.slice(0, 500) };
  }
  return new OpenAiError(`${what}: ${res.status} ${e.message ?? res.statusText}`, res.status, e.type ?? null, e.param ?? null, e.code ?? null, retryAfterOf(res.headers));
}

/** Calls one OpenAI-compatible server; safe to use concurrently. */
export class OpenAiClient {
  readonly options: Required<Omit<OpenAiClientOptions, 'apiKey' | 'headers'>> & Pick<OpenAiClientOptions, 'apiKey' | 'headers'>;
  /** Requests sent (retries included) and retries. */
  readonly stats = { requests: 0, retries: 0 };

  constructor(options: OpenAiClientOptions) {
    this.options = { timeoutMs: 60_000, maxRetries: 4, initialBackoffMs: 500, maxBackoffMs: 8000, ...options, baseUrl: options.baseUrl.replace(/\/+$/, '') };
    for (const k of ['timeoutMs', 'maxRetries', 'initialBackoffMs', 'maxBackoffMs'] as const) {
      const v = this.options[k];
      if (!(Number.isFinite(v) && v >= 0)) throw new Error(`OpenAiClient: ${k} must be a number ≥ 0, got ${v}`);
    }
  }

  /** POST /chat/completions. */
  chat(body: ChatRequest, opts: { signal?: AbortSignal } = {}): Promise<ChatResponse> {
    return this.json('POST', '/chat/completions', { ...body, stream: false }, opts.signal);
  }

  /** POST /completions. */
  completions(body: CompletionRequest, opts: { signal?: AbortSignal } = {}): Promise<CompletionResponse> {
    return this.json('POST', '/completions', { ...body, stream: false }, opts.signal);
  }

  /** GET /models: the ids served. */
  async models(opts: { signal?: AbortSignal } = {}): Promise<string[]> {
    const r = await this.json<{ data: { id: string }[] }>('GET', '/models', undefined, opts.signal);
    return r.data.map((m) => m.id);
  }

  /** POST /chat/completions with `stream: true`: the chunks as they arrive (retried only before the first). */
  chatStream(body: ChatRequest, opts: { signal?: AbortSignal } = {}): AsyncGenerator<ChatChunk> {
    return this.stream<ChatChunk>('/chat/completions', body, opts.signal);
  }

  /** POST /completions with `stream: true`. */
  completionsStream(body: CompletionRequest, opts: { signal?: AbortSignal } = {}): AsyncGenerator<{ choices: CompletionResponse['choices']; usage?: Usage | null }> {
    return this.stream('/completions', body, opts.signal);
  }

  /** Any JSON request, with the timeout and retries. */
  async json<T>(method: 'GET' | 'POST', path: string, body: unknown, signal?: AbortSignal): Promise<T> {
    const res = await this.send(method, path, body, signal, async (r) => (await r.json()) as T);
    return res;
  }

  private async *stream<T>(path: string, body: object, signal?: AbortSignal): AsyncGenerator<T> {
    const res = await this.send('POST', path, { ...body, stream: true }, signal, async (r) => r);
    const reader = res.body!.getReader();
    const decoder = new TextDecoder();
    let buffer = '';
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += decoder.decode(value, { stream: true });
        let at: number;
        while ((at = buffer.indexOf('\n\n')) >= 0) {
          const event = buffer.slice(0, at);
          buffer = buffer.slice(at + 2);
          const data = event
            .split('\n')
            .filter((l) => l.startsWith('data:'))
            .map((l) => l.slice(5).trimStart())
            .join('\n');
          if (data === '') continue;
          if (data === '[DONE]') return;
          const parsed = JSON.parse(data) as T & { error?: { message?: string; type?: string; param?: string; code?: string } };
          if (parsed.error) throw new OpenAiError(`POST ${path} (stream): ${parsed.error.message}`, 500, parsed.error.type ?? null, parsed.error.param ?? null, parsed.error.code ?? null);
          yield parsed as T;
        }
      }
      throw new OpenAiError(`POST ${path} (stream): the stream ended without [DONE]`, 0);
    } finally {
      await reader.cancel().catch(() => undefined);
    }
  }

  /** One call with retries: `read` turns a 2xx response into the result (inside the attempt's timeout). */
  private async send<T>(method: string, path: string, body: unknown, signal: AbortSignal | undefined, read: (r: Response) => Promise<T>): Promise<T> {
    const o = this.options;
    const what = `${method} ${o.baseUrl}${path}`;
    for (let attempt = 0; ; attempt++) {
      const timeout = AbortSignal.timeout(o.timeoutMs);
      const attemptSignal = signal ? AbortSignal.any([signal, timeout]) : timeout;
      let error: OpenAiError;
      try {
        this.stats.requests++;
        const res = await fetch(`${o.baseUrl}${path}`, {
          method,
          signal: attemptSignal,
          headers: { ...(body === undefined ? {} : { 'content-type': 'application/json' }), ...(o.apiKey ? { authorization: `Bearer ${o.apiKey}` } : {}), ...o.headers },
          body: body === undefined ? undefined : JSON.stringify(body),
        });
        if (res.ok) {
          try {
            return await read(res);
          } catch (e) {
            // a server that answers 2xx with something else than JSON will not mend on a retry
            if ((e as Error).name === 'SyntaxError') throw new OpenAiError(`${what}: the reply is not JSON (${(e as Error).message})`, res.status);
            throw e;
          }
        }
        error = await errorOf(res, what);
      } catch (e) {
        if (e instanceof OpenAiError) throw e;
        if (signal?.aborted) throw e; // the caller's own abort
        const timedOut = timeout.aborted;
        const cause = (e as Error & { cause?: { code?: string; message?: string } }).cause;
        error = new OpenAiError(timedOut ? `${what}: no answer within ${o.timeoutMs} ms` : `${what}: ${cause?.code ?? cause?.message ?? (e as Error).message}`, 0);
      }
      if (!error.retryable || attempt >= o.maxRetries) {
        if (attempt > 0) error.message += ` (after ${attempt + 1} attempts)`;
        throw error;
      }
      this.stats.retries++;
      const backoff = Math.min(o.maxBackoffMs, o.initialBackoffMs * 2 ** attempt) * (0.5 + Math.random() / 2);
      await sleep(error.retryAfterMs ?? backoff, signal);
    }
  }
}
