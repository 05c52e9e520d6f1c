/**
 * Finding and loading NVRTC and the CUDA driver library. Neither is needed for the ONNX Runtime
 * path: a missing one is a `KernelLibraryError` naming what was tried and the fix, raised only when
 * kernels are asked for.
 */
import { existsSync } from 'node:fs';
import { delimiter, join } from 'node:path';
import { openNativeLibrary, type NativeLibrary } from '@lathe/runtime';

/** A loaded shared library (koffi's handle). */
export type Library = NativeLibrary;

/** Which library a kernel feature needs. */
export type KernelLibraryKind = 'nvrtc' | 'cuda-driver' | 'cublas';

/** NVRTC or the CUDA driver could not be loaded, or is not the library it should be. */
export class KernelLibraryError extends Error {
  constructor(
    readonly library: KernelLibraryKind,
    /** The paths or names tried, in order. */
    readonly tried: string[],
    message: string,
  ) {
    super(message);
    this.name = 'KernelLibraryError';
  }
}

/** What to do when a library is missing, per library. */
export const libraryFixes: Record<KernelLibraryKind, string> = {
  nvrtc:
    'Install NVRTC of the CUDA major version the driver supports (the toolkit\'s lib64/libnvrtc.so.13, apt package cuda-nvrtc-13-0, or pip package nvidia-cuda-nvrtc) ' +
    'or point LATHE_NVRTC_LIB at libnvrtc.so.N. Without it Lathe runs ONNX Runtime\'s kernels only (leave the kernel options off).',
  'cuda-driver':
    'The CUDA driver library (libcuda.so.1) comes with the NVIDIA driver; install the driver, or point LATHE_CUDA_DRIVER_LIB at libcuda.so.1. ' +
    'Without it Lathe runs ONNX Runtime\'s kernels only (leave the kernel options off).',
  cublas:
    'cuBLAS (libcublas.so.13) is the library ONNX Runtime\'s CUDA provider multiplies with: install the CUDA toolkit\'s lib64, apt package libcublas-13-0 or pip package nvidia-cublas, ' +
    'or point LATHE_CUBLAS_LIB at libcublas.so.N. Without it the W4A16 products of many rows stay on MatMulNBits.',
};

/** The environment variable that names each library's file explicitly. */
export const libraryEnv: Record<KernelLibraryKind, string> = { nvrtc: 'LATHE_NVRTC_LIB', 'cuda-driver': 'LATHE_CUDA_DRIVER_LIB', cublas: 'LATHE_CUBLAS_LIB' };

/** The symbol a library must export to be the one asked for. */
const probeSymbol: Record<KernelLibraryKind, string> = { nvrtc: 'nvrtcVersion', 'cuda-driver': 'cuInit', cublas: 'cublasCreate_v2' };

/**
 * Where to look for a library, in order: the environment variable's file alone when it is set,
 * else files under the CUDA toolkit folders that exist, then bare sonames for the dynamic loader.
 */
export function libraryCandidates(kind: KernelLibraryKind, env: NodeJS.ProcessEnv = process.env): string[] {
  const explicit = env[libraryEnv[kind]];
  if (explicit) return [explicit];
  if (kind === 'cuda-driver') return ['libcuda.so.1', '/usr/lib/x86_64-linux-gnu/libcuda.so.1', '/usr/lib64/libcuda.so.1'];
  const names = kind === 'cublas' ? ['libcublas.so.13', 'libcublas.so.12', 'libcublas.so'] : ['libnvrtc.so.13', 'libnvrtc.so.12', 'libnvrtc.so'];
  const roots = [env.CUDA_HOME, env.CUDA_PATH, '/usr/local/cuda', '/usr/local/cuda-13.0', '/usr/local/cuda-12'].filter((r): r is string => Boolean(r));
  const dirs = [...(env.LD_LIBRARY_PATH ?? '').split(delimiter).filter(Boolean), ...roots.flatMap((r) => [join(r, 'lib64'), join(r, 'lib')])];
  const files = dirs.flatMap((d) => names.map((n) => join(d, n))).filter((f) => existsSync(f));
  return [...new Set([...files, ...names])];
}

/**
 * Loads the first candidate that opens and exports the library's probe symbol. Throws a
 * `KernelLibraryError` listing every candidate and why it failed, with the fix.
 */
export function loadLibrary(kind: KernelLibraryKind, candidates: string[] = libraryCandidates(kind)): { lib: Library; path: string } {
  const opened = openNativeLibrary(candidates, probeSymbol[kind]);
  if ('lib' in opened) return opened;
  const what = kind === 'nvrtc' ? 'NVRTC (the CUDA runtime compiler)' : kind === 'cublas' ? 'cuBLAS' : 'the CUDA driver library';
  throw new KernelLibraryError(kind, candidates, `${what} could not be loaded; tried ${opened.failures.join('; ')}. ${libraryFixes[kind]}`);
}
