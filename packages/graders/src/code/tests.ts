/**
 * Grading a program against test cases in the sandbox: stdin/stdout cases (the output compared
 * line by line, trailing whitespace ignored) and function-call cases (a driver calls the entry
 * function with JSON arguments and the JSON result is compared).
 */
import { randomBytes } from 'node:crypto';
import { runSandboxed, type RunResult, type RunStatus, type SandboxLanguage, type SandboxLimits } from './sandbox';

/** A stdin/stdout test: the program reads `input` and must print `output`. */
export interface StdioTestCase {
  input: string;
  output: string;
}

/** A function-call test: `entry(...args)` must return `expected` (compared as JSON). */
export interface CallTestCase {
  args: unknown[];
  expected: unknown;
}

/** A program and its tests. */
export interface CodeTestRequest {
  language: SandboxLanguage;
  source: string;
  tests: (StdioTestCase | CallTestCase)[];
  /** For function-call tests: the function (`solve`) or method (`Solution.twoSum`, instantiated without arguments). */
  entry?: string;
  limits?: Partial<SandboxLimits>;
  /** Stop at the first failing case (the rest count as failed, not run). */
  stopOnFirstFailure?: boolean;
}

/** One case's outcome. */
export interface CodeCaseResult {
  passed: boolean;
  status: RunStatus | 'wrong-answer' | 'not-run';
  /** The program's output (or returned JSON), truncated to 1000 characters. */
  got: string;
  stderr: string;
  /** With `sandbox-error`: why the sandbox could not run the program (see {@link RunResult.error}). */
  error?: string;
}

/** All cases' outcomes. */
export interface CodeTestResult {
  passed: number;
  total: number;
  /** passed / total (0 without tests). */
  score: number;
  cases: CodeCaseResult[];
}

const ENTRY = /^[A-Za-z_$][\w$]*(?:\.[A-Za-z_$][\w$]*)?$/;

function isCall(t: StdioTestCase | CallTestCase): t is CallTestCase {
  return Array.isArray((t as CallTestCase).args);
}

/** Output lines with trailing whitespace and trailing empty lines removed. */
export function normalizeOutput(text: string): string {
  return text.replace(/\r\n/g, '\n').split('\n').map((l) => l.trimEnd()).join('\n').replace(/\n+$/, '').replace(/^\n+/, '');
}

/** Deep equality of JSON values, numbers within a relative 1e-9. */
export function jsonEqual(a: unknown, b: unknown): boolean {
  if (typeof a === 'number' && typeof b === 'number') return a === b || Math.abs(a - b) <= 1e-9 * Math.max(1, Math.abs(a), Math.abs(b));
  if (Array.isArray(a) && Array.isArray(b)) return a.length === b.length && a.every((x, i) => jsonEqual(x, b[i]));
  if (a && b && typeof a === 'object' && typeof b === 'object' && !Array.isArray(a) && !Array.isArray(b)) {
    const ka = Object.keys(a).sort();
    const kb = Object.keys(b).sort();
    return jsonEqual(ka, kb) && ka.every((k) => jsonEqual((a as Record<string, unknown>)[k], (b as Record<string, unknown>)[k]));
  }
  return a === b;
}

/** The program followed by a driver that calls `entry` with JSON arguments from stdin and prints a marked JSON result. */
function withDriver(language: SandboxLanguage, source: string, entry: string, marker: string): string {
  const [owner, method] = entry.includes('.') ? entry.split('.') : [entry, null];
  if (language === 'python') {
    const target = method ? `getattr(${owner}(), ${JSON.stringify(method)})` : owner;
    return `${source}\n\nimport json as _lathe_json, sys as _lathe_sys\n_lathe_result = ${target}(*_lathe_json.loads(_lathe_sys.stdin.read()))\nprint("\\n${marker}" + _lathe_json.dumps(_lathe_result))\n`;
  }
  const target = method ? `new ${owner}().${method}.bind(new ${owner}())` : owner;
  return `${source}\n;(async () => {\n  const args = JSON.parse(require('fs').readFileSync(0, 'utf8'));\n  const result = await (${target})(...args);\n  process.stdout.write('\\n${marker}' + JSON.stringify(result === undefined ? null : result) + '\\n');\n})().catch((e) => { console.error(e); process.exit(1); });\n`;
}

function failedRun(run: RunResult, got: string): CodeCaseResult {
  return { passed: false, status: run.status, got, stderr: run.stderr.slice(-1000), ...(run.error ? { error: run.error } : {}) };
}

async function runCase(req: CodeTestRequest, test: StdioTestCase | CallTestCase): Promise<CodeCaseResult> {
  if (isCall(test)) {
    if (!req.entry || !ENTRY.test(req.entry)) throw new Error(`runCodeTests: function-call tests need "entry" as a name or Class.method, got ${JSON.stringify(req.entry)}`);
    const marker = `__lathe_result_${randomBytes(8).toString('hex')}__`;
    const run = await runSandboxed({ language: req.language, source: withDriver(req.language, req.source, req.entry, marker), stdin: JSON.stringify(test.args), limits: req.limits });
    if (run.status !== 'ok') return failedRun(run, run.stdout.slice(-1000));
    const line = run.stdout.split('\n').reverse().find((l) => l.startsWith(marker));
    let value: unknown = undefined;
    try {
      value = line === undefined ? undefined : JSON.parse(line.slice(marker.length));
    } catch {
      value = undefined;
    }
    const passed = line !== undefined && jsonEqual(value, test.expected);
    return { passed, status: passed ? 'ok' : 'wrong-answer', got: (line?.slice(marker.length) ?? '').slice(0, 1000), stderr: run.stderr.slice(-1000) };
  }
  const run = await runSandboxed({ language: req.language, source: req.source, stdin: test.input, limits: req.limits });
  if (run.status !== 'ok') return failedRun(run, run.stdout.slice(0, 1000));
  const passed = normalizeOutput(run.stdout) === normalizeOutput(test.output);
  return { passed, status: passed ? 'ok' : 'wrong-answer', got: run.stdout.slice(0, 1000), stderr: run.stderr.slice(-1000) };
}

/** Runs every test case in its own sandboxed process; a crash, timeout or escape attempt fails only its case. */
export async function runCodeTests(req: CodeTestRequest): Promise<CodeTestResult> {
  const cases: CodeCaseResult[] = [];
  let failed = false;
  for (const test of req.tests) {
    if (failed && req.stopOnFirstFailure) {
      cases.push({ passed: false, status: 'not-run', got: '', stderr: '' });
      continue;
    }
    const r = await runCase(req, test);
    cases.push(r);
    if (!r.passed) failed = true;
  }
  const passed = cases.filter((c) => c.passed).length;
  return { passed, total: cases.length, score: cases.length ? passed / cases.length : 0, cases };
}
