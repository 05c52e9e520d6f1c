/**
 * The sandbox as a local HTTP service, bound to 127.0.0.1 only:
 *   GET  /health                 → {"ok": true}
 *   POST /run    RunRequest       → RunResult
 *   POST /tests  CodeTestRequest  → CodeTestResult
 *   POST /run_code {"code", "language", "stdin"?, "run_timeout"? (s), "memory_limit_MB"?}
 *        → {"status": "Success" | "Failed", "run_result": {"status", "return_code", "stdout", "stderr", "execution_time"}}
 *        (the field names of common code-sandbox APIs that RL trainers call)
 * Runs are queued beyond `concurrency`; a bad request gets 400 with a message naming the field.
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { runSandboxed, type RunRequest, type SandboxLanguage } from './sandbox';
import { runCodeTests, type CodeTestRequest } from './tests';

/** Options of {@link startSandboxService}. */
export interface SandboxServiceOptions {
  /** TCP port on 127.0.0.1 (0 picks a free one). */
  port: number;
  /** Sandboxed runs at once; more wait in a queue. */
  concurrency: number;
  /** Largest request body accepted, bytes. */
  maxBodyBytes: number;
}

/** Defaults of {@link SandboxServiceOptions}. */
export const SANDBOX_SERVICE_DEFAULTS: SandboxServiceOptions = { port: 0, concurrency: 4, maxBodyBytes: 4 << 20 };

/** A running service. */
export interface SandboxService {
  url: string;
  server: Server;
  close(): Promise<void>;
}

class BadRequest extends Error {}

function readBody(req: IncomingMessage, limit: number): Promise<unknown> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    req.on('data', (c: Buffer) => {
      size += c.length;
      if (size > limit) {
        reject(new BadRequest(`request body over ${limit} bytes`));
        req.destroy();
      } else chunks.push(c);
    });
    req.on('end', () => {
      try {
        resolve(JSON.parse(Buffer.concat(chunks).toString('utf8')));
      } catch {
        reject(new BadRequest('request body is not valid JSON'));
      }
    });
    req.on('error', reject);
  });
}

function language(v: unknown, field: string): SandboxLanguage {
  if (v === 'python' || v === 'python3') return 'python';
  if (v === 'javascript' || v === 'nodejs' || v === 'js') return 'javascript';
  throw new BadRequest(`"${field}" must be "python" or "javascript", got ${JSON.stringify(v)}`);
}

function text(v: unknown, field: string, optional = false): string {
  if (v === undefined && optional) return '';
  if (typeof v !== 'string') throw new BadRequest(`"${field}" must be a string`);
  return v;
}

function asObject(body: unknown): Record<string, unknown> {
  if (typeof body !== 'object' || body === null || Array.isArray(body)) throw new BadRequest('request body must be a JSON object');
  return body as Record<string, unknown>;
}

/** Starts the service; resolves once it listens. */
export async function startSandboxService(options: Partial<SandboxServiceOptions> = {}): Promise<SandboxService> {
  const opts = { ...SANDBOX_SERVICE_DEFAULTS, ...options };
  let running = 0;
  const waiting: (() => void)[] = [];
  const limited = async <T>(job: () => Promise<T>): Promise<T> => {
    if (running >= opts.concurrency) await new Promise<void>((r) => waiting.push(r));
    running++;
    try {
      return await job();
    } finally {
      running--;
      waiting.shift()?.();
    }
  };

  const handle = async (req: IncomingMessage, res: ServerResponse): Promise<unknown> => {
    if (req.method === 'GET' && req.url === '/health') return { ok: true, running, queued: waiting.length };
    if (req.method !== 'POST') throw new BadRequest(`${req.method} ${req.url}: use GET /health or POST /run, /tests, /run_code`);
    const body = asObject(await readBody(req, opts.maxBodyBytes));
    switch (req.url) {
      case '/run': {
        const run: RunRequest = { language: language(body.language, 'language'), source: text(body.source, 'source'), stdin: text(body.stdin, 'stdin', true), limits: body.limits as RunRequest['limits'] };
        return limited(() => runSandboxed(run));
      }
      case '/tests': {
        if (!Array.isArray(body.tests)) throw new BadRequest('"tests" must be an array of {input, output} or {args, expected}');
        const request: CodeTestRequest = { ...(body as unknown as CodeTestRequest), language: language(body.language, 'language'), source: text(body.source, 'source') };
        return limited(() => runCodeTests(request));
      }
      case '/run_code': {
        const timeout = body.run_timeout === undefined ? undefined : Number(body.run_timeout);
        if (timeout !== undefined && !(timeout > 0)) throw new BadRequest('"run_timeout" must be a positive number of seconds');
        const memory = body.memory_limit_MB === undefined ? undefined : Number(body.memory_limit_MB);
        const limits = { ...(timeout ? { cpuSeconds: Math.ceil(timeout), wallMs: timeout * 1000 + 1000 } : {}), ...(memory ? { memoryMb: memory } : {}) };
        const r = await limited(() => runSandboxed({ language: language(body.language, 'language'), source: text(body.code, 'code'), stdin: text(body.stdin, 'stdin', true), limits }));
        const runStatus = r.status === 'timeout' ? 'TimeLimitExceeded' : r.status === 'sandbox-error' ? 'Error' : 'Finished';
        res.statusCode = 200;
        return { status: r.status === 'ok' ? 'Success' : 'Failed', run_result: { status: runStatus, return_code: r.exitCode, stdout: r.stdout, stderr: r.stderr, execution_time: r.wallMs / 1000 } };
      }
      default:
        throw new BadRequest(`unknown path ${req.url}`);
    }
  };

  const server = createServer((req, res) => {
    handle(req, res).then(
      (out) => {
        res.setHeader('content-type', 'application/json');
        res.end(JSON.stringify(out));
      },
      (e: unknown) => {
        res.statusCode = e instanceof BadRequest ? 400 : 500;
        res.setHeader('content-type', 'application/json');
        res.end(JSON.stringify({ error: e instanceof Error ? e.message : String(e) }));
      },
    );
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(opts.port, '127.0.0.1', () => resolve());
  });
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    server,
    close: () => new Promise<void>((resolve) => server.close(() => resolve())),
  };
}
