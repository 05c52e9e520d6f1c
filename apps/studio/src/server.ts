/**
 * Lathe Studio's HTTP server (Node's own): the JSON API over the run directories under one root,
 * the chat proxy to a `lathe serve` API, and the built browser files. Every path a request names is
 * resolved inside the root and refused outside it.
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { existsSync, readFileSync, realpathSync, statSync } from 'node:fs';
import { extname, join, resolve, sep } from 'node:path';
import { isRunDir, listEvals, queryRollouts, ROLLOUT_SORTS, rolloutById, rolloutGroup, runPaths, type RolloutQuery, type RolloutSort, type RolloutTable } from '@lathe/data';
import { CHECKPOINT_PREFIX, listChatCheckpoints, type CheckpointChats } from './checkpoints';
import { listRunInfos, readMetricsFile, runInfo } from './runs';
import { listParquet, tokenCells, tokenizerFor, trajectoryGroup, trajectoryRows, trajectoryTokens } from './tokens';

/** What the server needs. */
export interface StudioServerOptions {
  /** The served root: run directories and Parquet files under it. */
  root: string;
  /** Directory of the built browser files. */
  assets: string;
  /** Base URL of an OpenAI-compatible API for chat (`…/v1`), or null for no chat. */
  chatUrl: string | null;
  /** Tokenizer choice of the token view (see studio-config.ts). */
  tokenizer: string;
  /** How often the browser re-reads a running run's metrics (ms). */
  pollMs: number;
  /** Answer only requests whose Host is a loopback name (when listening on a loopback address). */
  loopbackOnly?: boolean;
  /** The --serve_url the chat API is (null when chat is served in-process), shown on the chat page. */
  serveUrl?: string | null;
  /** Chat with the root's checkpoints, served in-process on demand; null: off (e.g. with --serve_url). */
  checkpoints?: CheckpointChats | null;
}

/** An error with an HTTP status. */
class HttpError extends Error {
  constructor(
    readonly status: number,
    message: string,
  ) {
    super(message);
  }
}

const TYPES: Record<string, string> = { '.html': 'text/html; charset=utf-8', '.js': 'text/javascript; charset=utf-8', '.css': 'text/css; charset=utf-8', '.png': 'image/png' };

/** `rel` resolved inside `root`, following links; a path that leaves the root is refused (403). */
export function insideRoot(root: string, rel: string): string {
  const base = realpathSync(root);
  const full = resolve(base, rel);
  const real = existsSync(full) ? realpathSync(full) : full;
  if (real !== base && !real.startsWith(base + sep)) throw new HttpError(403, `${rel}: outside the served root ${root}`);
  return real;
}

function runDir(root: string, name: string): string {
  if (name === '' || name.includes('/') || name.includes('\\') || name === '.' || name === '..') throw new HttpError(403, `run '${name}': not a run name under the served root`);
  const dir = insideRoot(root, name);
  if (!existsSync(dir) || !statSync(dir).isDirectory() || !isRunDir(dir)) throw new HttpError(404, `run '${name}': no run directory under ${root}`);
  return dir;
}

function num(q: URLSearchParams, key: string): number | undefined {
  const v = q.get(key);
  if (v === null || v.trim() === '') return undefined;
  const n = Number(v);
  if (!Number.isFinite(n)) throw new HttpError(400, `query parameter '${key}': expected a number, got '${v}'`);
  return n;
}

function table(q: URLSearchParams): RolloutTable {
  const t = q.get('table') ?? 'train';
  if (t !== 'train' && t !== 'eval') throw new HttpError(400, `query parameter 'table': expected train or eval, got '${t}'`);
  return t;
}

function sortOf(q: URLSearchParams): RolloutSort | undefined {
  const s = q.get('sort');
  if (s === null || s === '') return undefined;
  if (!(ROLLOUT_SORTS as readonly string[]).includes(s)) throw new HttpError(400, `query parameter 'sort': expected one of ${ROLLOUT_SORTS.join(', ')}, got '${s}'`);
  return s as RolloutSort;
}

function rolloutsFile(dir: string, name: string): string {
  const file = runPaths(dir).rollouts;
  if (!existsSync(file)) throw new HttpError(404, `run '${name}': no rollout store (rollouts.sqlite)`);
  return file;
}

function send(res: ServerResponse, status: number, body: unknown): void {
  const text = JSON.stringify(body);
  res.writeHead(status, { 'content-type': 'application/json; charset=utf-8', 'cache-control': 'no-store' });
  res.end(text);
}

async function readBody(req: IncomingMessage): Promise<string> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const c of req) {
    size += (c as Buffer).length;
    if (size > 1 << 20) throw new HttpError(413, 'request body over 1 MiB');
    chunks.push(c as Buffer);
  }
  return Buffer.concat(chunks).toString('utf8');
}

async function proxy(opts: StudioServerOptions, path: string, init: RequestInit): Promise<{ status: number; body: unknown }> {
  if (!opts.chatUrl) throw new HttpError(404, 'chat is off: start lathe studio with --model DIR or --serve_url URL');
  let r: Response;
  try {
    r = await fetch(`${opts.chatUrl.replace(/\/$/, '')}${path}`, init);
  } catch (e) {
    throw new HttpError(502, `--serve_url ${opts.chatUrl}: cannot reach the server (${(e as Error).message})`);
  }
  const text = await r.text();
  try {
    return { status: r.status, body: JSON.parse(text) };
  } catch {
    return { status: 502, body: { error: `${opts.chatUrl}${path}: answered ${r.status} with non-JSON: ${text.slice(0, 200)}` } };
  }
}

async function api(opts: StudioServerOptions, req: IncomingMessage, url: URL): Promise<{ status: number; body: unknown }> {
  const parts = url.pathname.split('/').slice(2).map(decodeURIComponent); // after /api/
  const q = url.searchParams;
  const ok = (body: unknown) => ({ status: 200, body });
  if (parts[0] === 'config') return ok({ root: opts.root, chat: opts.chatUrl !== null || Boolean(opts.checkpoints), checkpointChat: Boolean(opts.checkpoints), serveUrl: opts.serveUrl ?? null, pollMs: opts.pollMs });
  if (parts[0] === 'runs' && parts.length === 1) return ok(listRunInfos(opts.root));
  if (parts[0] === 'runs' && parts.length >= 2) {
    const name = parts[1];
    const dir = runDir(opts.root, name);
    if (parts.length === 2) return ok(runInfo(dir, name));
    if (parts[2] === 'metrics') {
      const m = readMetricsFile(runPaths(dir).metrics);
      const from = num(q, 'from') ?? 0;
      return ok({ state: m.state, message: m.message, total: m.lines.length, lines: m.lines.slice(from), evals: listEvals(dir).map((e) => ({ step: e.step, accuracy: e.accuracy })) });
    }
    if (parts[2] === 'rollouts') {
      const file = rolloutsFile(dir, name);
      const t = table(q);
      if (parts[3] === 'group') {
        const step = num(q, 'step');
        const pi = num(q, 'prompt_index');
        if (step === undefined || pi === undefined) throw new HttpError(400, "rollout group: give 'step' and 'prompt_index'");
        return ok(rolloutGroup(file, t, step, pi, q.get('dataset') ?? undefined));
      }
      if (parts[3] !== undefined) {
        const id = Number(parts[3]);
        const row = Number.isInteger(id) ? rolloutById(file, t, id) : null;
        if (!row) throw new HttpError(404, `run '${name}': no ${t} rollout with id ${parts[3]}`);
        const decoder = await tokenizerFor(join(dir, 'config.yaml'), opts.root, opts.tokenizer);
        const ids = Array.isArray(row.extra?.tokens) ? (row.extra.tokens as number[]) : null;
        // per-token values where the store has them (log π_old and entropy; a version-1 store has none)
        const cells = ids ? tokenCells({ prompt_idx: row.prompt_index, prompt: row.prompt, prompt_token_ids: [], output_token_ids: ids, old_logprobs: row.logprobs }, decoder.decode, row.entropies) : null;
        return ok({ ...row, tokens: cells?.tokens ?? null, values: cells?.values ?? [], tokenizer: decoder.name });
      }
      const query: RolloutQuery = {
        table: t,
        step: num(q, 'step'),
        minStep: num(q, 'min_step'),
        maxStep: num(q, 'max_step'),
        promptIndex: num(q, 'prompt_index'),
        dataset: q.get('dataset') || undefined,
        prompt: q.get('prompt') || undefined,
        completion: q.get('completion') || undefined,
        minReward: num(q, 'min_reward'),
        maxReward: num(q, 'max_reward'),
        minAdvantage: num(q, 'min_advantage'),
        maxAdvantage: num(q, 'max_advantage'),
        minLength: num(q, 'min_length'),
        maxLength: num(q, 'max_length'),
        sort: sortOf(q),
        desc: q.get('desc') === '1',
        offset: num(q, 'offset'),
        limit: num(q, 'limit'),
      };
      return ok(queryRollouts(file, query));
    }
  }
  if (parts[0] === 'trajectories' && parts.length === 1) return ok(listParquet(opts.root));
  if (parts[0] === 'trajectories' && parts[1] === 'rows') {
    const rel = q.get('file');
    if (!rel) throw new HttpError(400, "trajectory rows: give 'file' (a Parquet file under the root)");
    const query = {
      offset: num(q, 'offset'),
      limit: num(q, 'limit'),
      prompt: q.get('prompt') || undefined,
      promptIdx: num(q, 'prompt_idx'),
      step: num(q, 'step'),
      minReward: num(q, 'min_reward'),
      maxReward: num(q, 'max_reward'),
      minAdvantage: num(q, 'min_advantage'),
      maxAdvantage: num(q, 'max_advantage'),
      minLength: num(q, 'min_length'),
      maxLength: num(q, 'max_length'),
    };
    return ok(await trajectoryRows(insideRoot(opts.root, rel), query, rel));
  }
  if (parts[0] === 'trajectories' && parts[1] === 'group') {
    const rel = q.get('file');
    const pi = num(q, 'prompt_idx');
    if (!rel || pi === undefined) throw new HttpError(400, "trajectory group: give 'file' (a Parquet file under the root) and 'prompt_idx'");
    const file = insideRoot(opts.root, rel);
    return ok(await trajectoryGroup(file, pi, num(q, 'step'), await tokenizerFor(file, opts.root, opts.tokenizer), rel));
  }
  if (parts[0] === 'tokens') {
    const rel = q.get('file');
    if (!rel) throw new HttpError(400, "token view: give 'file' (a Parquet file under the root)");
    const file = insideRoot(opts.root, rel);
    const row = num(q, 'row') ?? 0;
    return ok(await trajectoryTokens(file, row, await tokenizerFor(file, opts.root, opts.tokenizer), rel));
  }
  if (parts[0] === 'chat' && parts[1] === 'models' && req.method === 'GET') return opts.chatUrl ? proxy(opts, '/models', {}) : ok({ object: 'list', data: [] });
  if (parts[0] === 'chat' && parts[1] === 'checkpoints' && req.method === 'GET') return ok(opts.checkpoints ? listChatCheckpoints(opts.root) : []);
  throw new HttpError(404, `${url.pathname}: no such API`);
}

function serveFile(opts: StudioServerOptions, url: URL, res: ServerResponse): void {
  const name = url.pathname === '/' ? 'index.html' : decodeURIComponent(url.pathname.slice(1));
  const file = resolve(opts.assets, name);
  if (!file.startsWith(resolve(opts.assets) + sep)) return send(res, 403, { error: `${url.pathname}: outside the app's files` });
  if (!existsSync(file) || !statSync(file).isFile()) return send(res, 404, { error: `${url.pathname}: not found` });
  res.writeHead(200, { 'content-type': TYPES[extname(file)] ?? 'application/octet-stream' });
  res.end(readFileSync(file));
}

const LOOPBACK = new Set(['localhost', '127.0.0.1', '[::1]']);

/**
 * Whether a request's Host names this machine by a loopback name: a page of another site that
 * rebinds its DNS name to 127.0.0.1 still sends its own name, and is refused.
 */
export function loopbackHost(host: string | undefined): boolean {
  if (!host) return false;
  const name = host.startsWith('[') ? host.slice(0, host.indexOf(']') + 1) : host.split(':')[0];
  return LOOPBACK.has(name.toLowerCase());
}

/**
 * A chat completion: to the checkpoint's in-process server when the model is `checkpoint:<run>@<step>`,
 * else to the chat API. With `stream: true` the server-sent events are passed on as they arrive.
 */
async function chatCompletion(opts: StudioServerOptions, req: IncomingMessage, res: ServerResponse): Promise<void> {
  // JSON only: a cross-site form cannot send it without a CORS preflight, which is never granted
  if (!/^application\/json\b/.test(req.headers['content-type'] ?? '')) throw new HttpError(415, 'chat: the request body must be application/json');
  let body: Record<string, unknown>;
  try {
    body = JSON.parse(await readBody(req)) as Record<string, unknown>;
  } catch (e) {
    throw new HttpError(400, `chat: the request body is not JSON (${(e as Error).message})`);
  }
  let base = opts.chatUrl;
  if (typeof body.model === 'string' && body.model.startsWith(CHECKPOINT_PREFIX)) {
    if (!opts.checkpoints) throw new HttpError(404, 'chat with checkpoints is off (lathe studio --serve_url chats only through that server)');
    try {
      const ep = await opts.checkpoints.endpoint(body.model.slice(CHECKPOINT_PREFIX.length));
      [base, body.model] = [ep.url, ep.model];
    } catch (e) {
      throw new HttpError(400, (e as Error).message);
    }
  }
  if (!base) throw new HttpError(404, 'chat is off: start lathe studio with --model DIR or --serve_url URL, or pick a checkpoint');
  let r: Response;
  try {
    r = await fetch(`${base.replace(/\/$/, '')}/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
  } catch (e) {
    throw new HttpError(502, `${base}: cannot reach the chat server (${(e as Error).message})`);
  }
  const type = r.headers.get('content-type') ?? '';
  if (!type.startsWith('text/event-stream') || !r.body) {
    const text = await r.text();
    try {
      return send(res, r.status, JSON.parse(text));
    } catch {
      return send(res, 502, { error: `${base}/chat/completions: answered ${r.status} with non-JSON: ${text.slice(0, 200)}` });
    }
  }
  // each event is written as it arrives (no buffering), so the page shows tokens as they come
  res.writeHead(r.status, { 'content-type': 'text/event-stream', 'cache-control': 'no-store', connection: 'keep-alive' });
  const upstream = r.body.getReader();
  res.on('close', () => void upstream.cancel().catch(() => undefined));
  for (;;) {
    const { done, value } = await upstream.read();
    if (done || res.writableEnded) break;
    res.write(value);
  }
  res.end();
}

/** The studio's request handler as a server (not yet listening). */
export function createStudioServer(opts: StudioServerOptions): Server {
  return createServer((req, res) => {
    const url = new URL(req.url ?? '/', 'http://studio');
    const done = (status: number, body: unknown) => (res.headersSent ? res.end() : send(res, status, body));
    if (opts.loopbackOnly && !loopbackHost(req.headers.host)) return done(421, { error: `Host ${req.headers.host ?? '(none)'}: the studio answers only to localhost / 127.0.0.1 / [::1] while it listens on a loopback address` });
    if (url.pathname === '/api/chat/completions' && req.method === 'POST') {
      chatCompletion(opts, req, res).catch((e: Error) => done(e instanceof HttpError ? e.status : 500, { error: e.message }));
      return;
    }
    if (url.pathname.startsWith('/api/')) {
      api(opts, req, url).then(
        (r) => done(r.status, r.body),
        (e: Error) => done(e instanceof HttpError ? e.status : 500, { error: e.message }),
      );
      return;
    }
    try {
      serveFile(opts, url, res);
    } catch (e) {
      done(500, { error: (e as Error).message });
    }
  });
}
