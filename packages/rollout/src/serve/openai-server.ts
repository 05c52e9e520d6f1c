/**
 * An OpenAI-compatible HTTP API over one or more {@link Scheduler}s, on Node's own http module:
 * `POST /v1/chat/completions`, `POST /v1/completions`, `GET /v1/models`, `GET /health`. Streaming
 * is server-sent events in OpenAI's chunk format, ending with `data: [DONE]`; every response
 * carries `usage` (a stream sends it in a last chunk with no choices). Errors are OpenAI's error
 * JSON: 400 naming the field for bad input, 404 for an unknown route, 429 with Retry-After when
 * the queue is full, 500 when the engine fails a request. A client that disconnects cancels its
 * request, which frees its rows before the next decode step.
 *
 * Log-probs are the raw model's (temperature 1, no filters), as vLLM reports them by default.
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { randomBytes, randomInt } from 'node:crypto';
import { refusalUnder, ServerBusyError, type FinishReason, type Scheduler, type ServeLimits } from './scheduler';
import { IncrementalText, type ServeTokenizer } from './text';
import type { RowSampling } from './slot-engine';

/** One model the server answers for. */
export interface ServedModel {
  /** The `model` field clients send, listed by GET /v1/models. */
  id: string;
  scheduler: Scheduler;
  tokenizer: ServeTokenizer;
  /** Token ids that end every sample (EOS, end of turn), besides a request's own. */
  stopIds: readonly number[];
  /** The most samples one request may ask for (`n`). */
  maxN: number;
  /** Reported as `system_fingerprint` (e.g. the training step whose weights answered). */
  fingerprint?: () => string;
}

/** One generation as the HTTP layer asks for it (see {@link ModelEndpoint.submit}). */
export interface EndpointRequest {
  prompt: number[];
  n: number;
  maxTokens: number;
  sampling: RowSampling;
  seed: number;
  topLogprobs: number;
  stopIds: ReadonlySet<number>;
  /** The rows entered the engine; `fingerprint` is the model's then. */
  onAdmit(fingerprint: string | null): void;
  /**
   * Sample `choice`'s next token with its raw log-prob and (when asked) top alternatives; `stop`:
   * a stop id (the sample ends with it). Returning true ends the sample ('stop', e.g. a stop string).
   */
  onToken(choice: number, token: number, rawLogprob: number, top: { ids: number[]; logprobs: number[] } | undefined, stop: boolean): boolean;
  onFinish(choice: number, reason: FinishReason): void;
}

/** A submitted {@link EndpointRequest}. */
export interface EndpointTicket {
  /** Resolves once the scheduler queued it; rejects with ServerBusyError (429) or an error naming what is wrong (400). */
  accepted: Promise<void>;
  /** Resolves when every sample finished; rejects with the engine's error. */
  done: Promise<void>;
  cancel(): void;
}

/**
 * A served model as the HTTP layer sees it: a {@link Scheduler} on this thread
 * ({@link schedulerEndpoint}), or, in the HTTP thread, a proxy of one on the thread that owns the
 * device (http-thread.ts).
 */
export interface ModelEndpoint {
  id: string;
  tokenizer: ServeTokenizer;
  stopIds: readonly number[];
  maxN: number;
  limits: ServeLimits;
  /** The `system_fingerprint` now (null: none). */
  fingerprint(): string | null;
  /** Busy and free rows, queued requests, reserved tokens (GET /health). */
  load(): Promise<Record<string, number>>;
  submit(req: EndpointRequest): EndpointTicket;
}

/** A {@link ServedModel} on this thread as a {@link ModelEndpoint}. */
export function schedulerEndpoint(m: ServedModel): ModelEndpoint {
  const s = m.scheduler;
  const fingerprint = () => m.fingerprint?.() ?? null;
  return {
    id: m.id,
    tokenizer: m.tokenizer,
    stopIds: m.stopIds,
    maxN: m.maxN,
    limits: s.limits,
    fingerprint,
    load: () => Promise.resolve({ ...s.load, slots: s.engine.slots }),
    submit: (req) => {
      try {
        const t = s.submit({
          prompt: req.prompt,
          n: req.n,
          maxTokens: req.maxTokens,
          sampling: req.sampling,
          seed: req.seed,
          topLogprobs: req.topLogprobs,
          stopIds: req.stopIds,
          onAdmit: () => req.onAdmit(fingerprint()),
          onToken: (j, t, stop) => req.onToken(j, t.token, t.rawLogprob, t.top, stop),
          onFinish: (j, reason) => req.onFinish(j, reason),
        });
        return { accepted: Promise.resolve(), done: t.done, cancel: () => t.cancel() };
      } catch (e) {
        const refused = Promise.reject(e as Error);
        refused.catch(() => undefined);
        return { accepted: refused, done: refused, cancel: () => undefined };
      }
    },
  };
}

/** Options of {@link createOpenAiServer}. */
export interface OpenAiServerOptions {
  models: readonly ServedModel[];
  /** Largest request body accepted, bytes. Default 8 MiB. */
  maxBodyBytes?: number;
  /** One line per finished request (method, path, status, milliseconds). */
  log?: (line: string) => void;
}

/** An error that becomes OpenAI's error JSON with this status. */
export class ApiError extends Error {
  constructor(
    readonly status: number,
    message: string,
    readonly param: string | null = null,
    readonly type = status === 429 ? 'rate_limit_error' : status >= 500 ? 'server_error' : 'invalid_request_error',
    readonly code: string | null = null,
    readonly retryAfter?: number,
  ) {
    super(message);
  }
}

type Json = Record<string, unknown>;

function sendJson(res: ServerResponse, status: number, body: unknown, headers: Record<string, string> = {}): void {
  if (res.headersSent) return;
  const text = JSON.stringify(body);
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text), ...headers });
  res.end(text);
}

function sendError(res: ServerResponse, e: ApiError): void {
  sendJson(res, e.status, { error: { message: e.message, type: e.type, param: e.param, code: e.code } }, e.retryAfter ? { 'retry-after': String(e.retryAfter) } : {});
}

async function readBody(req: IncomingMessage, limit: number): Promise<Json> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const c of req as AsyncIterable<Buffer>) {
    size += c.length;
    if (size > limit) throw new ApiError(413, `the request body is over ${limit} bytes`);
    chunks.push(c);
  }
  let body: unknown;
  try {
    body = JSON.parse(Buffer.concat(chunks).toString('utf8'));
  } catch (e) {
    throw new ApiError(400, `the request body is not valid JSON: ${(e as Error).message}`, 'body', 'invalid_request_error', 'invalid_json');
  }
  if (typeof body !== 'object' || body === null || Array.isArray(body)) throw new ApiError(400, 'the request body must be a JSON object', 'body');
  return body as Json;
}

// ---------------------------------------------------------------------------------------------
// Field checks: each names its field.

const bad = (param: string, message: string) => new ApiError(400, `${param}: ${message}`, param);

function optNumber(body: Json, key: string, o: { min?: number; max?: number; integer?: boolean; minExclusive?: boolean }): number | undefined {
  const v = body[key];
  if (v === undefined || v === null) return undefined;
  if (typeof v !== 'number' || !Number.isFinite(v)) throw bad(key, `expected a number, got ${JSON.stringify(v)}`);
  if (o.integer && !Number.isInteger(v)) throw bad(key, `expected an integer, got ${v}`);
  if (o.min !== undefined && (o.minExclusive ? v <= o.min : v < o.min)) throw bad(key, `must be ${o.minExclusive ? '>' : '≥'} ${o.min}, got ${v}`);
  if (o.max !== undefined && v > o.max) throw bad(key, `must be ≤ ${o.max}, got ${v}`);
  return v;
}

function optBoolean(body: Json, key: string): boolean | undefined {
  const v = body[key];
  if (v === undefined || v === null) return undefined;
  if (typeof v !== 'boolean') throw bad(key, `expected true or false, got ${JSON.stringify(v)}`);
  return v;
}

/** What both endpoints share, read and checked. */
interface Common {
  model: ModelEndpoint;
  maxTokens: number | undefined;
  /** The field max_tokens came from (max_completion_tokens wins over max_tokens). */
  maxTokensField: string;
  temperature: number;
  topP: number;
  topK: number;
  minP: number;
  n: number;
  seed: number;
  stopStrings: string[];
  stopIds: Set<number>;
  stream: boolean;
}

function readCommon(body: Json, models: ReadonlyMap<string, ModelEndpoint>): Common {
  const id = body.model;
  if (typeof id !== 'string' || id === '') throw bad('model', `required: one of ${[...models.keys()].join(', ')}`);
  const model = models.get(id);
  if (!model) throw new ApiError(400, `model: '${id}' is not served here (GET /v1/models lists ${[...models.keys()].join(', ')})`, 'model', 'invalid_request_error', 'model_not_found');
  const V = model.limits.vocabSize;
  const maxTokens = optNumber(body, 'max_completion_tokens', { integer: true, min: 1 }) ?? optNumber(body, 'max_tokens', { integer: true, min: 1 });
  const n = optNumber(body, 'n', { integer: true, min: 1 }) ?? 1;
  if (n > model.maxN) throw bad('n', `at most ${model.maxN} samples per request here, got ${n}`);
  const topK = optNumber(body, 'top_k', { integer: true, min: -1 }) ?? 0;
  const seed = optNumber(body, 'seed', { integer: true }) ?? randomInt(2 ** 47);
  const stopStrings: string[] = [];
  // ignore_eos (vLLM's field): only the request's own stops end a sample — for benchmarks.
  const stopIds = new Set(optBoolean(body, 'ignore_eos') ? [] : model.stopIds);
  const stop = body.stop;
  const stops = stop === undefined || stop === null ? [] : Array.isArray(stop) ? stop : [stop];
  for (const s of stops) {
    if (typeof s === 'string' && s !== '') stopStrings.push(s);
    else if (typeof s === 'number' && Number.isInteger(s) && s >= 0 && s < V) stopIds.add(s);
    else throw bad('stop', `expected non-empty strings or token ids in [0, ${V}), got ${JSON.stringify(s)}`);
  }
  const ids = body.stop_token_ids;
  if (ids !== undefined && ids !== null) {
    if (!Array.isArray(ids)) throw bad('stop_token_ids', `expected a list of token ids, got ${JSON.stringify(ids)}`);
    for (const t of ids) {
      if (typeof t !== 'number' || !Number.isInteger(t) || t < 0 || t >= V) throw bad('stop_token_ids', `expected token ids in [0, ${V}), got ${JSON.stringify(t)}`);
      stopIds.add(t);
    }
  }
  return {
    model,
    maxTokens,
    maxTokensField: body.max_completion_tokens !== undefined && body.max_completion_tokens !== null ? 'max_completion_tokens' : 'max_tokens',
    temperature: optNumber(body, 'temperature', { min: 0 }) ?? 1,
    topP: optNumber(body, 'top_p', { min: 0, max: 1, minExclusive: true }) ?? 1,
    topK: topK <= 0 ? 0 : Math.min(topK, V),
    minP: optNumber(body, 'min_p', { min: 0, max: 1 }) ?? 0,
    n,
    seed,
    stopStrings,
    stopIds,
    stream: optBoolean(body, 'stream') ?? false,
  };
}

const CHAT_ROLES = new Set(['system', 'developer', 'user', 'assistant', 'tool']);

function readMessages(body: Json): { role: 'system' | 'user' | 'assistant' | 'tool'; content: string }[] {
  const ms = body.messages;
  if (!Array.isArray(ms) || ms.length === 0) throw bad('messages', 'required: a non-empty list of {role, content}');
  return ms.map((m: unknown, i) => {
    const at = `messages[${i}]`;
    if (typeof m !== 'object' || m === null) throw bad(at, 'expected an object {role, content}');
    const { role, content } = m as Json;
    if (typeof role !== 'string' || !CHAT_ROLES.has(role)) throw bad(`${at}.role`, `expected one of ${[...CHAT_ROLES].join(', ')}, got ${JSON.stringify(role)}`);
    let text: string;
    if (typeof content === 'string') text = content;
    else if (content === null || content === undefined) text = '';
    else if (Array.isArray(content)) {
      text = content
        .map((part: unknown, j) => {
          const p = part as Json;
          if (typeof p !== 'object' || p === null || p.type !== 'text' || typeof p.text !== 'string') throw bad(`${at}.content[${j}]`, 'only text parts ({type: "text", text}) are supported');
          return p.text;
        })
        .join('');
    } else throw bad(`${at}.content`, `expected a string or a list of text parts, got ${JSON.stringify(content)}`);
    return { role: role === 'developer' ? 'system' : (role as 'system' | 'user' | 'assistant' | 'tool'), content: text };
  });
}

// ---------------------------------------------------------------------------------------------
// Running one request

interface Choice {
  index: number;
  text: IncrementalText;
  tokens: number;
  finish: FinishReason | null;
  /** Log-prob entries not yet sent (stream) or all of them. */
  logprobs: { id: number; logprob: number; top?: { ids: number[]; logprobs: number[] } }[];
  sentLogprobs: number;
}

interface Job {
  prompts: number[][];
  common: Common;
  maxTokens: number;
  topLogprobs: number;
  logprobs: boolean;
  /** Called whenever a choice has news (streaming), and once at the end. */
  onUpdate?: (choice: Choice, final: boolean) => void;
  /** Called when the rows of a prompt enter the engine, with the model's fingerprint then. */
  onAdmit?: (fingerprint: string | null) => void;
  /** Called once every prompt is queued (a stream's headers go out then, so that a refusal can still be a 429). */
  onAccepted?: () => void;
}

/** Runs every prompt × n sample; resolves with the choices (index = prompt · n + sample). */
async function runJob(job: Job, signal: { onCancel: (f: () => void) => void }): Promise<Choice[]> {
  const { common, prompts } = job;
  const n = common.n;
  const choices: Choice[] = prompts.flatMap((_, p) => Array.from({ length: n }, (__, j) => ({ index: p * n + j, text: new IncrementalText(common.model.tokenizer, common.stopStrings), tokens: 0, finish: null, logprobs: [], sentLogprobs: 0 })));
  const tickets = prompts.map((prompt, p) =>
    common.model.submit({
      prompt,
      n,
      maxTokens: job.maxTokens,
      sampling: { temperature: common.temperature, topK: common.topK, topP: common.topP, minP: common.minP },
      seed: common.seed,
      topLogprobs: job.topLogprobs,
      stopIds: common.stopIds,
      onAdmit: (fingerprint) => job.onAdmit?.(fingerprint),
      onToken: (j, token, rawLogprob, top, stop) => {
        const c = choices[p * n + j];
        c.tokens++;
        if (stop) return true;
        if (job.logprobs) c.logprobs.push({ id: token, logprob: rawLogprob, top });
        const ended = c.text.push(token);
        job.onUpdate?.(c, false);
        return ended;
      },
      onFinish: (j, reason) => {
        const c = choices[p * n + j];
        c.finish = reason;
        if (reason === 'stop' || reason === 'length') job.onUpdate?.(c, true);
      },
    }),
  );
  const cancelAll = () => tickets.forEach((t) => t.cancel());
  signal.onCancel(cancelAll);
  try {
    await Promise.all(tickets.map((t) => t.accepted));
  } catch (e) {
    cancelAll();
    if (e instanceof ServerBusyError) throw new ApiError(429, e.message, null, 'rate_limit_error', 'rate_limit_exceeded', e.retryAfterSeconds);
    throw new ApiError(400, (e as Error).message, /max_tokens|context/.test((e as Error).message) ? 'max_tokens' : /^n /.test((e as Error).message) ? 'n' : null);
  }
  job.onAccepted?.();
  return Promise.all(tickets.map((t) => t.done)).then(
    () => choices,
    (e: Error) => {
      cancelAll();
      throw new ApiError(500, `generation failed: ${e.message}`);
    },
  );
}

/** Decides max_tokens and checks the prompts against the context (400 naming the field). */
function planTokens(common: Common, prompts: number[][], field: string): number {
  const M = common.model.limits.maxLength;
  const longest = Math.max(...prompts.map((p) => p.length));
  if (prompts.some((p) => p.length === 0)) throw bad(field, 'the prompt is empty');
  if (longest >= M) throw bad(field, `the prompt is ${longest} tokens; the context is ${M} (room for at least one new token is needed)`);
  const maxTokens = common.maxTokens ?? M - longest;
  if (longest + maxTokens > M) throw bad(common.maxTokens !== undefined ? common.maxTokensField : field, `${longest} prompt tokens + max_tokens ${maxTokens} exceed the context of ${M}`);
  const why = refusalUnder(common.model.limits, longest, common.n, maxTokens);
  if (why) throw bad(common.n > common.model.limits.slots ? 'n' : common.maxTokensField, why);
  return maxTokens;
}

const tokenText = (tok: ServeTokenizer, id: number) => tok.decode([id], { skipSpecialTokens: false });
const bytesOf = (s: string) => [...Buffer.from(s, 'utf8')];

function chatLogprobs(tok: ServeTokenizer, entries: Choice['logprobs'], top: number) {
  return {
    content: entries.map((e) => {
      const t = tokenText(tok, e.id);
      return {
        token: t,
        logprob: e.logprob,
        bytes: bytesOf(t),
        top_logprobs: (e.top?.ids ?? []).slice(0, top).map((id, k) => {
          const s = tokenText(tok, id);
          return { token: s, logprob: e.top!.logprobs[k], bytes: bytesOf(s) };
        }),
      };
    }),
  };
}

function completionLogprobs(tok: ServeTokenizer, entries: Choice['logprobs'], top: number, offset: number) {
  const tokens = entries.map((e) => tokenText(tok, e.id));
  const textOffset: number[] = [];
  let at = offset;
  for (const t of tokens) {
    textOffset.push(at);
    at += t.length;
  }
  return {
    tokens,
    token_logprobs: entries.map((e) => e.logprob),
    top_logprobs: entries.map((e) => Object.fromEntries((e.top?.ids ?? []).slice(0, top).map((id, k) => [tokenText(tok, id), e.top!.logprobs[k]]))),
    text_offset: textOffset,
  };
}

const usageOf = (prompts: number[][], choices: Choice[]) => {
  const prompt = prompts.reduce((s, p) => s + p.length, 0);
  const completion = choices.reduce((s, c) => s + c.tokens, 0);
  return { prompt_tokens: prompt, completion_tokens: completion, total_tokens: prompt + completion };
};

const finishOf = (c: Choice) => (c.finish === 'length' ? 'length' : 'stop');

// ---------------------------------------------------------------------------------------------
// The server

/**
 * Creates (does not start) the HTTP server over schedulers on this thread; `listen(port, host)` it.
 * The HTTP work then shares the thread with the decode loop; startThreadedOpenAiServer
 * (http-thread.ts) moves it to a worker thread.
 */
export function createOpenAiServer(opts: OpenAiServerOptions): Server {
  return createEndpointServer(opts.models.map(schedulerEndpoint), opts);
}

/** The HTTP server over model endpoints (on this thread or proxies of another's); `listen(port, host)` it. */
export function createEndpointServer(endpoints: readonly ModelEndpoint[], opts: Omit<OpenAiServerOptions, 'models'>): Server {
  const models = new Map(endpoints.map((m) => [m.id, m]));
  if (models.size !== endpoints.length) throw new Error(`two served models share an id: ${endpoints.map((m) => m.id).join(', ')}`);
  const limit = opts.maxBodyBytes ?? 8 * 2 ** 20;
  const created = Math.floor(Date.now() / 1000);

  async function completion(body: Json, chat: boolean, req: IncomingMessage, res: ServerResponse): Promise<number> {
    const common = readCommon(body, models);
    const tok = common.model.tokenizer;
    let prompts: number[][];
    if (chat) {
      const messages = readMessages(body);
      const kwargs = body.chat_template_kwargs;
      if (kwargs !== undefined && kwargs !== null && (typeof kwargs !== 'object' || Array.isArray(kwargs))) throw bad('chat_template_kwargs', 'expected an object, e.g. {"enable_thinking": false}');
      const thinking = (kwargs as Json | undefined)?.enable_thinking;
      if (thinking !== undefined && typeof thinking !== 'boolean') throw bad('chat_template_kwargs.enable_thinking', `expected true or false, got ${JSON.stringify(thinking)}`);
      if (!tok.hasChatTemplate) throw bad('messages', `model '${common.model.id}' has no chat template; use /v1/completions`);
      const ids = tok.encode(tok.applyChatTemplate(messages, { addGenerationPrompt: true, enableThinking: thinking as boolean | undefined }));
      prompts = [tok.bosId === undefined || ids[0] === tok.bosId ? ids : [tok.bosId, ...ids]];
    } else {
      prompts = readPrompts(body, tok, common.model.limits.vocabSize);
      if (optBoolean(body, 'echo')) throw bad('echo', 'echo is not supported');
      if (body.suffix !== undefined && body.suffix !== null) throw bad('suffix', 'suffix is not supported');
    }
    let topLogprobs = 0;
    let logprobs = false;
    const maxTop = common.model.limits.maxTopLogprobs;
    if (chat) {
      logprobs = optBoolean(body, 'logprobs') ?? false;
      topLogprobs = optNumber(body, 'top_logprobs', { integer: true, min: 0, max: maxTop }) ?? 0;
      if (topLogprobs > 0 && !logprobs) throw bad('top_logprobs', 'needs logprobs: true');
    } else {
      const l = optNumber(body, 'logprobs', { integer: true, min: 0, max: maxTop });
      logprobs = l !== undefined;
      topLogprobs = l ?? 0;
    }
    const maxTokens = planTokens(common, prompts, chat ? 'messages' : 'prompt');
    const id = `${chat ? 'chatcmpl' : 'cmpl'}-${randomBytes(12).toString('hex')}`;
    const head = { id, object: chat ? 'chat.completion.chunk' : 'text_completion', created: Math.floor(Date.now() / 1000), model: common.model.id, system_fingerprint: common.model.fingerprint() };
    // the fingerprint (e.g. the training step whose weights answer) is the one when the rows enter the engine
    const onAdmit = (fingerprint: string | null) => void (head.system_fingerprint = fingerprint);
    let cancel: () => void = () => undefined;
    const signal = { onCancel: (f: () => void) => (cancel = f) };
    // A client that goes away: the response closing unfinished, or its socket ending or failing —
    // the socket's own events arrive first (the http server keeps a half-closed socket open while
    // it still writes), so the rows are freed before the next decode step.
    const gone = () => {
      if (!res.writableFinished) cancel();
    };
    const socket = req.socket;
    socket.once('end', gone);
    socket.once('error', gone);
    res.on('close', () => {
      gone();
      // a keep-alive socket serves the next request: drop this one's listeners
      socket.off('end', gone);
      socket.off('error', gone);
    });

    if (!common.stream) {
      const choices = await runJob({ prompts, common, maxTokens, topLogprobs, logprobs, onAdmit }, signal);
      const out = choices.map((c) => {
        const text = c.text.flush(true);
        if (chat) return { index: c.index, message: { role: 'assistant', content: text }, logprobs: logprobs ? chatLogprobs(tok, c.logprobs, topLogprobs) : null, finish_reason: finishOf(c) };
        return { index: c.index, text, logprobs: logprobs ? completionLogprobs(tok, c.logprobs, topLogprobs, 0) : null, finish_reason: finishOf(c) };
      });
      sendJson(res, 200, { ...head, object: chat ? 'chat.completion' : 'text_completion', choices: out, usage: usageOf(prompts, choices) });
      return 200;
    }

    const send = (o: unknown) => {
      if (!res.writableEnded) res.write(`data: ${JSON.stringify(o)}\n\n`);
    };
    // The headers go out once the request is queued (a refusal before then is still a 429 or 400).
    let opened = false;
    const open = () => {
      if (opened) return;
      opened = true;
      res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache', connection: 'keep-alive' });
      if (chat) for (let i = 0; i < prompts.length * common.n; i++) send({ ...head, choices: [{ index: i, delta: { role: 'assistant', content: '' }, logprobs: null, finish_reason: null }] });
    };
    const offsets = new Map<number, number>();
    const onUpdate = (c: Choice, final: boolean) => {
      open();
      const text = c.text.flush(final);
      const entries = c.logprobs.slice(c.sentLogprobs);
      // A chunk per token, as OpenAI streams (its text may be empty while held back), so clients
      // see every token's arrival.
      c.sentLogprobs = c.logprobs.length;
      const finish = final ? finishOf(c) : null;
      if (chat) {
        send({ ...head, choices: [{ index: c.index, delta: text || !final ? { content: text } : {}, logprobs: logprobs && entries.length ? chatLogprobs(tok, entries, topLogprobs) : null, finish_reason: finish }] });
      } else {
        const offset = offsets.get(c.index) ?? 0;
        offsets.set(c.index, offset + text.length);
        send({ ...head, choices: [{ index: c.index, text, logprobs: logprobs && entries.length ? completionLogprobs(tok, entries, topLogprobs, offset) : null, finish_reason: finish }] });
      }
    };
    try {
      const choices = await runJob({ prompts, common, maxTokens, topLogprobs, logprobs, onUpdate, onAdmit, onAccepted: open }, signal);
      open();
      send({ ...head, choices: [], usage: usageOf(prompts, choices) });
    } catch (e) {
      if (!opened) throw e;
      const err = e instanceof ApiError ? e : new ApiError(500, (e as Error).message);
      send({ error: { message: err.message, type: err.type, param: err.param, code: err.code } });
    }
    if (!res.writableEnded) res.end('data: [DONE]\n\n');
    return 200;
  }

  const server = createServer((req, res) => {
    const started = performance.now();
    const path = (req.url ?? '/').split('?')[0].replace(/\/+$/, '') || '/';
    const done = (status: number) => opts.log?.(`${req.method} ${path} ${status} ${Math.round(performance.now() - started)}ms`);
    const handle = async (): Promise<number> => {
      if (req.method === 'GET' && path === '/health') {
        const loads = await Promise.all(endpoints.map((m) => m.load()));
        sendJson(res, 200, { status: 'ok', models: endpoints.map((m, i) => ({ id: m.id, ...loads[i] })) });
        return 200;
      }
      if (req.method === 'GET' && path === '/v1/models') {
        sendJson(res, 200, { object: 'list', data: endpoints.map((m) => ({ id: m.id, object: 'model', created, owned_by: 'lathe', max_model_len: m.limits.maxLength })) });
        return 200;
      }
      const chat = path === '/v1/chat/completions';
      if (chat || path === '/v1/completions') {
        if (req.method !== 'POST') throw new ApiError(405, `${path} takes POST`);
        return completion(await readBody(req, limit), chat, req, res);
      }
      throw new ApiError(404, `no route ${req.method} ${path} (routes: POST /v1/chat/completions, POST /v1/completions, GET /v1/models, GET /health)`, null, 'invalid_request_error', 'not_found');
    };
    handle().then(done, (e: unknown) => {
      const err = e instanceof ApiError ? e : new ApiError(500, `internal error: ${(e as Error).message}`);
      if (res.headersSent) {
        if (!res.writableEnded) res.end();
      } else sendError(res, err);
      done(err.status);
    });
  });
  // Longer than clients' idle sockets live (the openai client keeps them): a socket the server closes
  // while a client reuses it is a connection reset on the client's next request.
  server.keepAliveTimeout = 75_000;
  server.headersTimeout = 80_000;
  return server;
}

/** `prompt` of /v1/completions: a string, token ids, or a list of either. */
function readPrompts(body: Json, tok: ServeTokenizer, V: number): number[][] {
  const p = body.prompt;
  const isIds = (x: unknown): x is number[] => Array.isArray(x) && x.length > 0 && x.every((t) => typeof t === 'number');
  const one = (x: unknown, at: string): number[] => {
    if (typeof x === 'string') {
      const ids = tok.encode(x);
      return tok.bosId === undefined || ids[0] === tok.bosId ? ids : [tok.bosId, ...ids];
    }
    if (isIds(x)) {
      const badId = x.find((t) => !Number.isInteger(t) || t < 0 || t >= V);
      if (badId !== undefined) throw bad(at, `token id ${badId} is outside the vocabulary (0..${V - 1})`);
      return [...x];
    }
    throw bad(at, `expected a string or a list of token ids, got ${JSON.stringify(x)?.slice(0, 80)}`);
  };
  if (p === undefined || p === null) throw bad('prompt', 'required: a string, token ids, or a list of them');
  if (typeof p === 'string' || isIds(p)) return [one(p, 'prompt')];
  if (Array.isArray(p) && p.length > 0) return p.map((x, i) => one(x, `prompt[${i}]`));
  throw bad('prompt', `expected a string, token ids, or a non-empty list of them, got ${JSON.stringify(p)?.slice(0, 80)}`);
}
