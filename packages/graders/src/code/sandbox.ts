/**
 * Runs untrusted Python 3 or JavaScript in an OS sandbox: bubblewrap namespaces (no network, a
 * private PID space, an empty root with only /usr read-only, the program read-only and a size-capped
 * tmpfs as the only writable place), an unprivileged user, rlimits on CPU time, memory, processes,
 * file size and open files, a wall-clock limit that kills the whole process group, and capped output.
 */
import { spawn } from 'node:child_process';
import { accessSync, chmodSync, constants, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';

/** Languages the sandbox runs. */
export type SandboxLanguage = 'python' | 'javascript';

/** Resource limits of one run. */
export interface SandboxLimits {
  /** CPU time (RLIMIT_CPU), seconds. */
  cpuSeconds: number;
  /** Wall-clock time after which the whole process group is killed, milliseconds. */
  wallMs: number;
  /** Writable memory (RLIMIT_DATA; also the V8 heap cap for JavaScript), MiB. */
  memoryMb: number;
  /** Processes and threads of the sandbox user (RLIMIT_NPROC). */
  maxProcesses: number;
  /** Bytes kept of stdout and of stderr; more output ends the run as `output-limit`. */
  maxOutputBytes: number;
  /** Largest file the program may write (RLIMIT_FSIZE), and the size of its tmpfs, MiB. */
  diskMb: number;
}

/** Defaults of {@link SandboxLimits}. */
export const SANDBOX_DEFAULTS: SandboxLimits = { cpuSeconds: 5, wallMs: 10_000, memoryMb: 512, maxProcesses: 64, maxOutputBytes: 1 << 20, diskMb: 16 };

/** How a run ended. */
export type RunStatus = 'ok' | 'runtime-error' | 'timeout' | 'output-limit' | 'sandbox-error';

/** The outcome of one run. */
export interface RunResult {
  status: RunStatus;
  exitCode: number | null;
  signal: string | null;
  stdout: string;
  stderr: string;
  wallMs: number;
  /** With `sandbox-error`: why the sandbox could not run the program (a missing binary, or bubblewrap's own message). */
  error?: string;
}

/** One program run. */
export interface RunRequest {
  language: SandboxLanguage;
  source: string;
  stdin?: string;
  limits?: Partial<SandboxLimits>;
}

/** The unprivileged user the sandbox runs as when the caller is root (nobody). */
const SANDBOX_UID = 65534;

const INTERPRETERS: Record<SandboxLanguage, { file: string; argv: (limits: SandboxLimits) => string[] }> = {
  python: { file: 'main.py', argv: () => ['/usr/bin/python3', '-I', '-S', '/sandbox/main.py'] },
  javascript: { file: 'main.js', argv: (l) => [process.execPath, `--max-old-space-size=${Math.max(16, Math.floor(l.memoryMb * 0.75))}`, '/sandbox/main.js'] },
};

/** The programs the sandbox runs, by absolute path, with the Debian package of each. */
const REQUIRED_BINARIES: { path: string; debianPackage: string; only?: SandboxLanguage }[] = [
  { path: '/usr/bin/bwrap', debianPackage: 'bubblewrap' },
  { path: '/usr/bin/prlimit', debianPackage: 'util-linux' },
  { path: '/usr/bin/python3', debianPackage: 'python3', only: 'python' },
];

/**
 * Why the sandbox cannot run `language` (any language when omitted) on this machine: the missing
 * binaries and the command that installs them; null when nothing is missing.
 */
export function sandboxMissing(language?: SandboxLanguage): string | null {
  const missing = REQUIRED_BINARIES.filter((b) => (language === undefined || b.only === undefined || b.only === language) && !executable(b.path));
  if (missing.length === 0) return null;
  const packages = missing.map((b) => b.debianPackage).join(' ');
  return `the code sandbox needs ${missing.map((b) => b.path).join(', ')}, not installed: run \`apt-get install -y ${packages}\` as root (in Lathe's repository: bash tools/setup/system-deps.sh)`;
}

/** True when the sandbox's binaries are installed (it refuses to run without them); see {@link sandboxMissing} for what is missing. */
export function sandboxAvailable(): boolean {
  return sandboxMissing() === null;
}

function executable(file: string): boolean {
  try {
    accessSync(file, constants.X_OK);
    return true;
  } catch {
    return false;
  }
}

function bwrapArgs(programDir: string, limits: SandboxLimits, argv: string[]): string[] {
  const mb = 1024 * 1024;
  const rlimits = [
    `--cpu=${limits.cpuSeconds}:${limits.cpuSeconds + 1}`, // SIGXCPU at the soft limit, SIGKILL a second later
    `--data=${limits.memoryMb * mb}`,
    `--nproc=${limits.maxProcesses}`,
    `--fsize=${limits.diskMb * mb}`,
    '--nofile=64',
    '--core=0',
  ];
  return [
    '--unshare-all', // user, pid, net, ipc, uts, cgroup namespaces: no network but a private loopback
    '--die-with-parent',
    '--new-session',
    '--ro-bind', '/usr', '/usr',
    '--symlink', 'usr/bin', '/bin',
    '--symlink', 'usr/lib', '/lib',
    '--symlink', 'usr/lib64', '/lib64',
    '--symlink', 'usr/sbin', '/sbin',
    '--proc', '/proc',
    '--dev', '/dev',
    '--size', String(limits.diskMb * mb), '--tmpfs', '/tmp',
    '--ro-bind', programDir, '/sandbox',
    // a Node.js installed outside /usr (nvm, a tarball) is made visible read-only where it lives
    ...(process.execPath.startsWith('/usr/') ? [] : ['--ro-bind', path.dirname(path.dirname(process.execPath)), path.dirname(path.dirname(process.execPath))]),
    '--chdir', '/tmp',
    '--clearenv',
    '--setenv', 'PATH', '/usr/bin',
    '--setenv', 'HOME', '/tmp',
    '--setenv', 'LANG', 'C.UTF-8',
    '--hostname', 'sandbox',
    '--',
    '/usr/bin/prlimit', ...rlimits, '--',
    ...argv,
  ];
}

/** Kills a detached child's whole process group, ignoring one that is already gone. */
function killGroup(pid: number | undefined): void {
  if (pid === undefined) return;
  try {
    process.kill(-pid, 'SIGKILL');
  } catch {
    // already exited
  }
}

/** Runs one program in the sandbox and reports how it ended; never throws for the program's behaviour. */
export async function runSandboxed(request: RunRequest): Promise<RunResult> {
  const limits: SandboxLimits = { ...SANDBOX_DEFAULTS, ...request.limits };
  const interpreter = INTERPRETERS[request.language];
  if (!interpreter) throw new Error(`runSandboxed: language must be python or javascript, got ${JSON.stringify(request.language)}`);
  const missing = sandboxMissing(request.language);
  if (missing) return { status: 'sandbox-error', exitCode: null, signal: null, stdout: '', stderr: missing, wallMs: 0, error: missing };
  const dir = mkdtempSync(path.join(tmpdir(), 'lathe-sandbox-'));
  try {
    writeFileSync(path.join(dir, interpreter.file), request.source);
    chmodSync(dir, 0o755);
    chmodSync(path.join(dir, interpreter.file), 0o644);
    return await execute(dir, limits, interpreter.argv(limits), request.stdin ?? '');
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

function execute(dir: string, limits: SandboxLimits, argv: string[], stdin: string): Promise<RunResult> {
  const started = performance.now();
  const asRoot = process.getuid?.() === 0;
  const child = spawn('/usr/bin/bwrap', bwrapArgs(dir, limits, argv), {
    detached: true, // its own process group, so that a timeout kills everything it started
    stdio: ['pipe', 'pipe', 'pipe'],
    ...(asRoot ? { uid: SANDBOX_UID, gid: SANDBOX_UID } : {}),
  });
  return new Promise((resolve) => {
    const out: Buffer[] = [];
    const err: Buffer[] = [];
    let outBytes = 0;
    let errBytes = 0;
    let ended: RunStatus | null = null;
    const stop = (why: RunStatus) => {
      if (ended === null) ended = why;
      killGroup(child.pid);
    };
    const timer = setTimeout(() => stop('timeout'), limits.wallMs);
    const collect = (chunks: Buffer[], add: (n: number) => number) => (chunk: Buffer) => {
      const total = add(chunk.length);
      if (total > limits.maxOutputBytes) {
        const keep = chunk.length - (total - limits.maxOutputBytes);
        if (keep > 0) chunks.push(chunk.subarray(0, keep));
        stop('output-limit');
      } else chunks.push(chunk);
    };
    child.stdout.on('data', collect(out, (n) => (outBytes += n)));
    child.stderr.on('data', collect(err, (n) => (errBytes += n)));
    child.stdin.on('error', () => undefined); // the program may exit without reading its input
    child.stdin.end(stdin);
    child.on('error', (e) => {
      clearTimeout(timer);
      const error = `cannot start /usr/bin/bwrap: ${e.message}`;
      resolve({ status: 'sandbox-error', exitCode: null, signal: null, stdout: '', stderr: error, wallMs: performance.now() - started, error });
    });
    child.on('close', (code, signal) => {
      clearTimeout(timer);
      killGroup(child.pid); // anything the program left behind in the group
      const stderr = Buffer.concat(err).toString('utf8');
      let status: RunStatus = ended ?? (code === 0 ? 'ok' : 'runtime-error');
      // RLIMIT_CPU ends a program with SIGXCPU (exit 152 through bwrap), or SIGKILL at the hard limit
      if (ended === null && (signal === 'SIGXCPU' || code === 128 + 24 || (code === 128 + 9 && performance.now() - started >= limits.cpuSeconds * 1000))) status = 'timeout';
      // bubblewrap (or prlimit inside it) failed before the program ran: its own lines say why
      const setupFailure = stderr.split('\n').filter((l) => /^(bwrap|prlimit): /.test(l));
      if (ended === null && code !== 0 && setupFailure.length > 0) status = 'sandbox-error';
      const error = status === 'sandbox-error' ? `/usr/bin/bwrap exited with ${signal ?? `code ${code}`}: ${setupFailure.join('; ')}` : undefined;
      resolve({ status, exitCode: code, signal, stdout: Buffer.concat(out).toString('utf8'), stderr, wallMs: performance.now() - started, ...(error ? { error } : {}) });
    });
  });
}
