/** `lathe` as a child process in a working directory, for tests of commands that start processes of their own (`lathe launch`). */
import { spawn } from 'node:child_process';
import { join } from 'node:path';

const LATHE = join(__dirname, '..', 'bin', 'lathe.cjs');

/** Runs `lathe …args` in `cwd`; resolves with its exit status and output once it exits. */
export function spawnLathe(cwd: string, ...args: string[]): Promise<{ status: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    const p = spawn(process.execPath, [LATHE, ...args], { cwd, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    p.stdout.on('data', (c: Buffer) => (stdout += c.toString()));
    p.stderr.on('data', (c: Buffer) => (stderr += c.toString()));
    p.on('close', (status) => resolve({ status, stdout, stderr }));
  });
}
