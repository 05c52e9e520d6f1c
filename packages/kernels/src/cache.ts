/**
 * The on-disk compile cache: a compiled image per (source, kernel name, target arch, NVRTC options,
 * NVRTC version), so a process compiles a kernel once per machine, not once per start. Files are
 * written atomically (temporary file + rename): a reader sees a whole image or none.
 */
import { createHash } from 'node:crypto';
import { mkdirSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { homedir } from 'node:os';
import { join } from 'node:path';
import type { CompiledImage } from './nvrtc';

/** What identifies a compilation. */
export interface CompileKey {
  source: string;
  /** The program's name (shows in NVRTC's messages). */
  name: string;
  /** NVRTC's target, e.g. `sm_90` (a cubin) or `compute_90` (PTX). */
  target: string;
  /** NVRTC options other than the target. */
  options: readonly string[];
  /** NVRTC's version, e.g. "13.0" (another compiler may emit other code). */
  compiler: string;
}

/** The cache folder: `LATHE_KERNEL_CACHE`, else `$XDG_CACHE_HOME/lathe/kernels`, else `~/.cache/lathe/kernels`. */
export function defaultCacheDir(env: NodeJS.ProcessEnv = process.env): string {
  if (env.LATHE_KERNEL_CACHE) return env.LATHE_KERNEL_CACHE;
  return join(env.XDG_CACHE_HOME || join(homedir(), '.cache'), 'lathe', 'kernels');
}

/** The hex SHA-256 of a compile key: every field and the options' order count. */
export function compileKeyHash(k: CompileKey): string {
  const h = createHash('sha256');
  // length-prefixed fields, so no two different keys serialize alike
  for (const part of [k.source, k.name, k.target, k.compiler, String(k.options.length), ...k.options]) h.update(`${Buffer.byteLength(part)}:${part}\n`);
  return h.digest('hex');
}

/** Compiled images on disk, keyed by `compileKeyHash`. */
export class KernelCache {
  constructor(readonly dir: string = defaultCacheDir()) {}

  /** The file an image of `key` lives in. */
  file(key: CompileKey): string {
    const kind = key.target.startsWith('sm_') ? 'cubin' : 'ptx';
    return join(this.dir, `${compileKeyHash(key)}.${kind}`);
  }

  /** The cached image of `key`, or undefined. */
  get(key: CompileKey): CompiledImage | undefined {
    const file = this.file(key);
    let bytes: Buffer;
    try {
      bytes = readFileSync(file);
    } catch {
      return undefined;
    }
    if (bytes.length === 0) return undefined;
    return { kind: file.endsWith('.cubin') ? 'cubin' : 'ptx', image: new Uint8Array(bytes), log: '' };
  }

  /** Stores an image atomically; a cache that cannot be written is skipped (the image is still used). */
  put(key: CompileKey, image: CompiledImage): boolean {
    const file = this.file(key);
    const tmp = `${file}.${process.pid}.${Math.random().toString(36).slice(2)}.tmp`;
    try {
      mkdirSync(this.dir, { recursive: true });
      writeFileSync(tmp, image.image);
      renameSync(tmp, file);
      return true;
    } catch {
      try {
        rmSync(tmp, { force: true });
      } catch {
        // the folder itself is unusable: nothing was written
      }
      return false;
    }
  }

  /** Removes a cached image (one the driver refused to load). */
  drop(key: CompileKey): void {
    rmSync(this.file(key), { force: true });
  }
}
