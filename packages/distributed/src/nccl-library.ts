/**
 * Finding libnccl and the CUDA runtime. NCCL comes with PyTorch's wheels (the pip package
 * nvidia-nccl-cu12 / -cu13: site-packages/nvidia/nccl/lib/libnccl.so.2), with NVIDIA's apt packages
 * (libnccl2) or a CUDA toolkit; LATHE_NCCL_LIBRARY names the file explicitly. A missing library is
 * an `NcclLibraryError` naming what was tried and the fix, raised only when NCCL is asked for.
 */
import { spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { delimiter, join } from 'node:path';
import { openNativeLibrary, type NativeLibrary } from '@lathe/runtime';

/** A loaded shared library (koffi's handle). */
export type Library = NativeLibrary;

/** How to get NCCL (docs/runtime.md says the same). */
export const NCCL_FIX =
  'Install NCCL: `pip install nvidia-nccl-cu13` (or -cu12; PyTorch\'s CUDA wheels bring it), or NVIDIA\'s apt package libnccl2, ' +
  'or point LATHE_NCCL_LIBRARY at libnccl.so.2. Without NCCL, lathe launch trains on --device cpu only (over TCP).';

/** NCCL or the CUDA runtime could not be loaded. */
export class NcclLibraryError extends Error {
  constructor(
    /** The paths or names tried, in order. */
    readonly tried: string[],
    message: string,
  ) {
    super(message);
    this.name = 'NcclLibraryError';
  }
}

/** Folders of Python's NVIDIA wheels (nvidia/nccl/lib, nvidia/cuda_runtime/lib) and torch/lib, as python3 reports them; [] without python3. */
function pythonLibDirs(): string[] {
  const script = [
    'import importlib, os',
    'for m in ("nvidia.nccl", "nvidia.cuda_runtime", "torch"):',
    '    try:',
    '        mod = importlib.import_module(m)',
    '        for p in list(getattr(mod, "__path__", [])):',
    '            print(os.path.join(p, "lib"))',
    '    except Exception:',
    '        pass',
  ].join('\n');
  const r = spawnSync('python3', ['-c', script], { encoding: 'utf8', timeout: 20_000 });
  return r.status === 0 ? r.stdout.split('\n').filter(Boolean) : [];
}

/** Folders to search, in order: LD_LIBRARY_PATH, the CUDA toolkits, the system's, Python's wheels. */
function searchDirs(env: NodeJS.ProcessEnv, python: boolean): string[] {
  const roots = [env.CUDA_HOME, env.CUDA_PATH, '/usr/local/cuda', '/usr/local/cuda-13.0', '/usr/local/cuda-12'].filter((r): r is string => Boolean(r));
  return [
    ...(env.LD_LIBRARY_PATH ?? '').split(delimiter).filter(Boolean),
    ...roots.flatMap((r) => [join(r, 'lib64'), join(r, 'lib')]),
    '/usr/lib/x86_64-linux-gnu',
    '/usr/lib64',
    ...(python ? pythonLibDirs() : []),
  ];
}

/** Where to look for libnccl: LATHE_NCCL_LIBRARY alone when set, else existing files in the search folders, then the soname for the loader. */
export function ncclCandidates(env: NodeJS.ProcessEnv = process.env, opts: { python?: boolean } = {}): string[] {
  if (env.LATHE_NCCL_LIBRARY) return [env.LATHE_NCCL_LIBRARY];
  const files = searchDirs(env, opts.python ?? true).map((d) => join(d, 'libnccl.so.2')).filter((f) => existsSync(f));
  return [...new Set([...files, 'libnccl.so.2'])];
}

/** Where to look for the CUDA runtime: LATHE_CUDART_LIBRARY alone when set, else the sonames the loader may already hold (ORT's CUDA provider loads one), then files. */
export function cudartCandidates(env: NodeJS.ProcessEnv = process.env, opts: { python?: boolean } = {}): string[] {
  if (env.LATHE_CUDART_LIBRARY) return [env.LATHE_CUDART_LIBRARY];
  const names = ['libcudart.so.13', 'libcudart.so.12'];
  const files = searchDirs(env, opts.python ?? true).flatMap((d) => names.map((n) => join(d, n))).filter((f) => existsSync(f));
  return [...new Set([...names, ...files])];
}

/** Loads the first candidate that opens and exports `probe`; else an `NcclLibraryError` listing each failure and the fix. */
export function loadFirst(what: string, candidates: string[], probe: string, fix: string): { lib: Library; path: string } {
  const opened = openNativeLibrary(candidates, probe);
  if ('lib' in opened) return opened;
  throw new NcclLibraryError(candidates, `${what} could not be loaded; tried ${opened.failures.join('; ')}. ${fix}`);
}
