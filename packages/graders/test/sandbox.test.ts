import { existsSync } from 'node:fs';
import path from 'node:path';
import { runCodeTests, runSandboxed, startSandboxService, type SandboxService } from '@lathe/graders';

// Small limits keep the attack cases fast; each attack must end as a failed run, never escape.
const FAST = { cpuSeconds: 1, wallMs: 3000, memoryMb: 256, maxOutputBytes: 64 * 1024 };

// A sandbox that cannot run at all (a missing binary, bubblewrap refused by the kernel) fails every
// test here with its cause, instead of each one with a bare 'sandbox-error'.
beforeAll(async () => {
  const probe = await runSandboxed({ language: 'python', source: 'print(1)' });
  if (probe.status === 'sandbox-error') throw new Error(`the code sandbox cannot run here: ${probe.error}`);
});

describe('sandbox failures', () => {
  test("bubblewrap's own message is the run's error and the grader's case error", async () => {
    // a zero-size tmpfs is refused by bubblewrap itself, before any program starts
    const r = await runSandboxed({ language: 'python', source: 'print(1)', limits: { diskMb: 0 } });
    expect(r).toMatchObject({ status: 'sandbox-error', error: expect.stringContaining('bwrap: --size takes a non-zero number of bytes') });
    expect(r.error).toContain('/usr/bin/bwrap exited with code 1');
    const graded = await runCodeTests({ language: 'python', source: 'print(1)', tests: [{ input: '', output: '1' }], limits: { diskMb: 0 } });
    expect(graded.cases[0]).toMatchObject({ passed: false, status: 'sandbox-error', error: r.error });
  });
});

describe('sandboxed runs', () => {
  test('Python and JavaScript read stdin and write stdout', async () => {
    const py = await runSandboxed({ language: 'python', source: 'print(input()[::-1])', stdin: 'abc\n' });
    expect(py).toMatchObject({ status: 'ok', exitCode: 0, stdout: 'cba\n' });
    const js = await runSandboxed({ language: 'javascript', source: 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>console.log(s.trim().toUpperCase()))', stdin: 'abc' });
    expect(js).toMatchObject({ status: 'ok', stdout: 'ABC\n' });
  });

  test('a program error is a runtime error with its traceback', async () => {
    const r = await runSandboxed({ language: 'python', source: 'raise ValueError("boom")' });
    expect(r.status).toBe('runtime-error');
    expect(r.stderr).toContain('ValueError: boom');
  });
});

describe('attacks are contained', () => {
  test('reading /etc/passwd finds nothing', async () => {
    const r = await runSandboxed({ language: 'python', source: 'print(open("/etc/passwd").read())', limits: FAST });
    expect(r.status).toBe('runtime-error');
    expect(r.stderr).toContain('FileNotFoundError');
    expect(r.stdout).not.toContain('root:');
  });

  test("the project's own files are not visible", async () => {
    const src = `import os\nprint(sorted(os.listdir("/")))\nprint(open(${JSON.stringify(__filename)}).read())`;
    const r = await runSandboxed({ language: 'python', source: src, limits: FAST });
    expect(r.status).toBe('runtime-error');
    expect(r.stdout).toContain("['bin', 'dev', 'lib', 'lib64', 'proc', 'sandbox', 'sbin', 'tmp', 'usr']");
    expect(r.stdout).not.toContain('attacks are contained');
  });

  test('no network connection can be opened (Python and JavaScript)', async () => {
    const py = await runSandboxed({ language: 'python', source: 'import socket\nsocket.create_connection(("1.1.1.1", 80), timeout=2)\nprint("connected")', limits: FAST });
    expect(py.status).toBe('runtime-error');
    expect(py.stdout).not.toContain('connected');
    expect(py.stderr).toMatch(/Network is unreachable|Errno/);
    const js = await runSandboxed({ language: 'javascript', source: 'require("net").connect(80, "1.1.1.1").on("connect", () => console.log("connected")).on("error", (e) => { console.error(e.code); process.exit(3); })', limits: FAST });
    expect(js.status).toBe('runtime-error');
    expect(js.stdout).not.toContain('connected');
  });

  test('writing outside the sandbox fails; its private /tmp is writable and size-capped', async () => {
    const outside = await runSandboxed({ language: 'python', source: 'open("/sandbox/x", "w").write("x")', limits: FAST });
    expect(outside.status).toBe('runtime-error');
    expect(outside.stderr).toContain('Read-only file system');
    const usr = await runSandboxed({ language: 'python', source: 'open("/usr/lathe-escape", "w").write("x")', limits: FAST });
    expect(usr.status).toBe('runtime-error');
    const big = await runSandboxed({ language: 'python', source: 'open("/tmp/big", "wb").write(b"x" * (64 * 1024 * 1024))', limits: { ...FAST, diskMb: 4 } });
    expect(big.status).not.toBe('ok');
    const tmp = await runSandboxed({ language: 'python', source: 'open("/tmp/x", "w").write("hi")\nprint(open("/tmp/x").read())', limits: FAST });
    expect(tmp).toMatchObject({ status: 'ok', stdout: 'hi\n' });
  });

  test('an infinite loop is stopped by the CPU limit', async () => {
    const r = await runSandboxed({ language: 'python', source: 'while True: pass', limits: FAST });
    expect(r.status).toBe('timeout');
    expect(r.wallMs).toBeLessThan(FAST.wallMs + 2000);
  });

  test('a sleeping program is stopped by the wall-clock limit', async () => {
    const r = await runSandboxed({ language: 'javascript', source: 'setTimeout(() => {}, 100000)', limits: { ...FAST, wallMs: 1000 } });
    expect(r.status).toBe('timeout');
  });

  test('a fork bomb is contained and its whole process group killed', async () => {
    const src = 'import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass';
    const r = await runSandboxed({ language: 'python', source: src, limits: { ...FAST, wallMs: 2000, maxProcesses: 32 } });
    expect(r.status).toBe('timeout');
    // nothing of it survives: the sandbox user owns no process afterwards
    await new Promise((res) => setTimeout(res, 300));
    const after = await runSandboxed({ language: 'python', source: 'print("alive")', limits: FAST });
    expect(after).toMatchObject({ status: 'ok', stdout: 'alive\n' });
  });

  test('a memory bomb fails (Python MemoryError, V8 heap limit)', async () => {
    const py = await runSandboxed({ language: 'python', source: 'x = bytearray(2 * 1024 ** 3)\nprint(len(x))', limits: FAST });
    expect(py.status).toBe('runtime-error');
    expect(py.stderr).toContain('MemoryError');
    const js = await runSandboxed({ language: 'javascript', source: 'const a = []; while (true) a.push(new Array(1e6).fill(1));', limits: FAST });
    expect(js.status).not.toBe('ok');
  });

  test('huge output is cut at the limit and the program killed', async () => {
    const r = await runSandboxed({ language: 'python', source: 'while True: print("y" * 1000)', limits: FAST });
    expect(r.status).toBe('output-limit');
    expect(r.stdout.length).toBeLessThanOrEqual(FAST.maxOutputBytes);
  });
});

describe('each attack, in Python and JavaScript, is a failed test case', () => {
  // every program prints ESCAPED only if its attack worked; the case expects ESCAPED, so a pass is an escape
  const hostFile = path.join(__dirname, `escape-${process.pid}.txt`);
  const ESCAPE = [{ input: '', output: 'ESCAPED' }];
  const attacks: Record<'python' | 'javascript', [string, string][]> = {
    python: [
      ['/etc/passwd', 'print("ESCAPED" if "root:" in open("/etc/passwd").read() else "")'],
      ['project files', `print("ESCAPED" if "each attack" in open(${JSON.stringify(__filename)}).read() else "")`],
      ['network', 'import socket\nsocket.create_connection(("1.1.1.1", 80), timeout=2)\nprint("ESCAPED")'],
      ['write outside', `open(${JSON.stringify(hostFile)}, "w").write("x")\nprint("ESCAPED")`],
      ['fork bomb', 'import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass'],
      ['infinite loop', 'while True: pass'],
      ['huge output', 'while True: print("ESCAPED" * 1000)'],
    ],
    javascript: [
      ['/etc/passwd', 'console.log(require("fs").readFileSync("/etc/passwd", "utf8").includes("root:") ? "ESCAPED" : "")'],
      ['project files', `console.log(require("fs").readFileSync(${JSON.stringify(__filename)}, "utf8").includes("each attack") ? "ESCAPED" : "")`],
      ['network', 'require("net").connect(80, "1.1.1.1").on("connect", () => console.log("ESCAPED")).on("error", () => process.exit(3))'],
      ['write outside', `require("fs").writeFileSync(${JSON.stringify(hostFile)}, "x"); console.log("ESCAPED")`],
      ['fork bomb', 'const cp = require("child_process"); for (;;) { try { cp.spawn(process.execPath, [__filename], { stdio: "ignore" }); } catch (e) {} }'],
      ['infinite loop', 'for (;;) {}'],
      ['huge output', 'for (;;) process.stdout.write("ESCAPED".repeat(1000) + "\\n")'],
    ],
  };
  afterAll(() => expect(existsSync(hostFile)).toBe(false));
  for (const language of ['python', 'javascript'] as const) {
    test.each(attacks[language])(`${language}: %s`, async (_name, source) => {
      const r = await runCodeTests({ language, source, tests: ESCAPE, limits: { ...FAST, wallMs: 2000, maxProcesses: 32 } });
      expect(r.cases[0].passed).toBe(false);
      expect(r.passed).toBe(0);
      expect(r.cases[0].got).not.toContain('root:');
    });
  }
  test('the sandbox still runs programs afterwards', async () => {
    await new Promise((res) => setTimeout(res, 300));
    expect(await runSandboxed({ language: 'javascript', source: 'console.log("alive")', limits: FAST })).toMatchObject({ status: 'ok', stdout: 'alive\n' });
  });
});

describe('code tests', () => {
  test('stdin/stdout cases: trailing whitespace ignored, a wrong line fails', async () => {
    const r = await runCodeTests({
      language: 'python',
      source: 'a, b = map(int, input().split())\nprint(a + b)   ',
      tests: [
        { input: '1 2\n', output: '3\n' },
        { input: '5 5\n', output: '10' },
        { input: '1 1\n', output: '3' },
      ],
    });
    expect(r.cases.map((c) => c.status)).toEqual(['ok', 'ok', 'wrong-answer']);
    expect(r).toMatchObject({ passed: 2, total: 3 });
    expect(r.score).toBeCloseTo(2 / 3, 12);
  });

  test('function-call cases in Python (function and Class.method) and JavaScript', async () => {
    const py = await runCodeTests({ language: 'python', source: 'def add(a, b):\n    print("noise")\n    return a + b', entry: 'add', tests: [{ args: [1, 2], expected: 3 }, { args: [[1], [2]], expected: [1, 2] }, { args: [1, 1], expected: 3 }] });
    expect(py.cases.map((c) => c.passed)).toEqual([true, true, false]);
    const cls = await runCodeTests({ language: 'python', source: 'class Solution:\n    def twice(self, x):\n        return 2 * x', entry: 'Solution.twice', tests: [{ args: [4], expected: 8 }] });
    expect(cls.passed).toBe(1);
    const js = await runCodeTests({ language: 'javascript', source: 'function sum(xs) { return xs.reduce((a, b) => a + b, 0); }', entry: 'sum', tests: [{ args: [[1, 2, 3]], expected: 6 }, { args: [[0.1, 0.2]], expected: 0.3 }] });
    expect(js.passed).toBe(2);
  });

  test('an attack in one case fails that case only; stopOnFirstFailure skips the rest', async () => {
    const src = 'x = input()\nif x == "loop":\n    while True: pass\nprint(x)';
    const r = await runCodeTests({ language: 'python', source: src, tests: [{ input: 'a', output: 'a' }, { input: 'loop', output: 'loop' }, { input: 'b', output: 'b' }], limits: FAST });
    expect(r.cases.map((c) => c.status)).toEqual(['ok', 'timeout', 'ok']);
    const stop = await runCodeTests({ language: 'python', source: src, tests: [{ input: 'loop', output: 'loop' }, { input: 'b', output: 'b' }], limits: FAST, stopOnFirstFailure: true });
    expect(stop.cases.map((c) => c.status)).toEqual(['timeout', 'not-run']);
  });

  test('a bad entry name is refused before anything runs', async () => {
    await expect(runCodeTests({ language: 'python', source: '', entry: 'os.system("x")', tests: [{ args: [], expected: null }] })).rejects.toThrow(/entry/);
  });
});

describe('sandbox HTTP service', () => {
  let service: SandboxService;
  beforeAll(async () => {
    service = await startSandboxService({ concurrency: 2 });
  }, 60_000); // a loaded machine (CI: 2 cores) can take longer than the 5 s default
  afterAll(() => service.close());

  const post = async (route: string, body: unknown) => {
    const r = await fetch(`${service.url}${route}`, { method: 'POST', body: JSON.stringify(body), headers: { 'content-type': 'application/json' } });
    return { status: r.status, body: (await r.json()) as Record<string, unknown> };
  };

  test('binds to 127.0.0.1 only', () => {
    expect(service.url).toMatch(/^http:\/\/127\.0\.0\.1:\d+$/);
  });

  test('runs code, runs tests, and keeps serving through attacks', async () => {
    const attacks = [
      'import os\nwhile True:\n    try: os.fork()\n    except OSError: pass',
      'while True: pass',
      'while True: print("y" * 10000)',
      'print(open("/etc/passwd").read())',
    ];
    const results = await Promise.all(attacks.map((code) => post('/run_code', { code, language: 'python', run_timeout: 1 })));
    for (const r of results) {
      expect(r.status).toBe(200);
      expect(r.body.status).toBe('Failed');
    }
    const ok = await post('/run_code', { code: 'print(6 * 7)', language: 'python' });
    expect(ok.body).toMatchObject({ status: 'Success', run_result: { status: 'Finished', return_code: 0, stdout: '42\n' } });
    const tests = await post('/tests', { language: 'javascript', source: 'function f(x) { return x * x; }', entry: 'f', tests: [{ args: [3], expected: 9 }] });
    expect(tests.body).toMatchObject({ passed: 1, total: 1 });
    const health = await fetch(`${service.url}/health`);
    expect(await health.json()).toMatchObject({ ok: true });
  }, 60_000);

  test('bad requests get 400 naming the field', async () => {
    expect(await post('/run', { language: 'cobol', source: '' })).toMatchObject({ status: 400, body: { error: expect.stringContaining('"language"') } });
    expect(await post('/tests', { language: 'python', source: '' })).toMatchObject({ status: 400, body: { error: expect.stringContaining('"tests"') } });
    const notJson = await fetch(`${service.url}/run`, { method: 'POST', body: '{' });
    expect(notJson.status).toBe(400);
  });
});
