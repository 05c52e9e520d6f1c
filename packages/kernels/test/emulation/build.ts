/** Building a kernel's CPU-emulation harness (emu.h beside it): the test's sources written out, then g++. */
import { execFileSync } from 'node:child_process';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

/** This folder: emu.h, the stand-in CUDA headers and the harnesses. */
export const EMULATION_DIR = __dirname;

/**
 * Writes `sources` (file name → text, e.g. the kernel's CUDA source) into a fresh temporary folder and compiles
 * `harnessCpp` (a file of this folder) against them and emu.h with g++ (C++20); returns the binary's path.
 */
export function buildHarness(name: string, sources: Record<string, string>, harnessCpp: string): string {
  const dir = mkdtempSync(join(tmpdir(), `lathe-${name}-`));
  for (const [file, text] of Object.entries(sources)) writeFileSync(join(dir, file), text);
  const harness = join(dir, 'harness');
  execFileSync('g++', ['-std=c++20', '-O1', '-pthread', `-I${EMULATION_DIR}`, `-I${dir}`, '-o', harness, join(EMULATION_DIR, harnessCpp)], { stdio: 'pipe' });
  return harness;
}
