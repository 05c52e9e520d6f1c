/**
 * Ctrl-C and SIGTERM for long commands. The first request aborts the job's AbortSignal: the job
 * finishes its current step, keeps its work (a checkpoint, complete parts) and returns, and the
 * command exits 130 (SIGINT) or 143 (SIGTERM). A second request quits at once.
 *
 * One request can arrive as several signals: a Ctrl-C reaches every process of the terminal's
 * foreground group (bin/lathe.cjs, which passes signals on, and this process), and `timeout`
 * signals both its command and the command's group. Under bin/lathe.cjs the wrapper tells requests
 * apart and ends this process itself on the second one (its event loop is never busy, this
 * process's may be mid-step), so this process acts on its first signal only. Run directly, signals
 * within {@link SAME_REQUEST_MS} of the first count as the first.
 */

/** The signals a command stops on, and the exit status of a command they stopped. */
export const STOP_EXIT_CODES = { SIGINT: 130, SIGTERM: 143 } as const;

/** A signal that stops a command. */
export type StopSignal = keyof typeof STOP_EXIT_CODES;

/** Signals closer than this to the first are copies of the same request. */
export const SAME_REQUEST_MS = 500;

/** The environment variable through which bin/lathe.cjs tells the CLI that it handles second requests. */
export const WRAPPER_PID_ENV = 'LATHE_WRAPPER_PID';

/** What an interruptible job returned, and the signal that stopped it early (if one did). */
export interface Interruptible<T> {
  value: T;
  stoppedBy?: StopSignal;
}

/**
 * Runs `job` with SIGINT and SIGTERM handled: the first aborts `signal` with the signal's name as
 * its reason and prints `notice` (what the job will do now) on stderr; see the module comment for
 * later ones. The handlers are removed when the job settles.
 */
export async function runInterruptible<T>(job: (signal: AbortSignal) => Promise<T>, notice = 'stopping after this step (a checkpoint will be saved)'): Promise<Interruptible<T>> {
  const controller = new AbortController();
  const wrapped = process.env[WRAPPER_PID_ENV] === String(process.ppid);
  let first = 0;
  const onSignal = (sig: StopSignal) => {
    if (!controller.signal.aborted) {
      first = performance.now();
      process.stderr.write(`\n${sig}: ${notice}; a second Ctrl-C or SIGTERM quits at once\n`);
      controller.abort(sig);
    } else if (!wrapped && performance.now() - first > SAME_REQUEST_MS) process.exit(STOP_EXIT_CODES[sig]);
  };
  const onInt = () => onSignal('SIGINT');
  const onTerm = () => onSignal('SIGTERM');
  process.on('SIGINT', onInt);
  process.on('SIGTERM', onTerm);
  try {
    const value = await job(controller.signal);
    return controller.signal.aborted ? { value, stoppedBy: controller.signal.reason as StopSignal } : { value };
  } finally {
    process.off('SIGINT', onInt);
    process.off('SIGTERM', onTerm);
  }
}

/** The exit status of a command that `stoppedBy` interrupted (130 for Ctrl-C when the cause is unknown). */
export function stopExitCode(stoppedBy: StopSignal | undefined): number {
  return STOP_EXIT_CODES[stoppedBy ?? 'SIGINT'];
}

/** A run's progress display: the recipe's events, and `stop` to end its bar. */
export interface Reporter<E> {
  events: E;
  stop(): void;
}

/** Runs a recipe interruptibly with its progress display, which is stopped however the run ends. */
export async function runReported<E, T>(reporter: Reporter<E>, run: (events: E, signal: AbortSignal) => Promise<T>): Promise<Interruptible<T>> {
  try {
    return await runInterruptible((signal) => run(reporter.events, signal));
  } finally {
    reporter.stop();
  }
}

/** Prints a training command's one-line JSON summary; an interrupted run exits 130 (SIGINT) or 143 (SIGTERM). */
export function finishRun(run: Interruptible<{ interrupted: boolean }>, summary: Record<string, unknown>): void {
  console.log(JSON.stringify(summary));
  if (run.value.interrupted) process.exitCode = stopExitCode(run.stoppedBy);
}
