/** The demo's handler called in-process, for demo.test.ts and demo.slow.test.ts. */
import { demoCommand } from '../src/commands/demo';

/**
 * Calls the demo's handler with parsed flags (yargs 18 does not load under jest), returning the
 * JSON summary and the progress lines (stderr), which stay out of the test output.
 */
export async function runDemo(argv: Record<string, unknown>): Promise<{ summary: Record<string, unknown>; progress: string }> {
  let out = '';
  let progress = '';
  const spy = jest.spyOn(console, 'log').mockImplementation((s: string) => void (out += `${s}\n`));
  const err = jest.spyOn(process.stderr, 'write').mockImplementation((s: string | Uint8Array) => ((progress += String(s)), true));
  try {
    await demoCommand.handler({ _: ['demo'], $0: 'lathe', ...argv } as never);
  } finally {
    spy.mockRestore();
    err.mockRestore();
  }
  return { summary: JSON.parse(out.trim().split('\n').at(-1)!) as Record<string, unknown>, progress };
}
