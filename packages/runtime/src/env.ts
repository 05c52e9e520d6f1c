/**
 * The process-wide ONNX Runtime environment and the enums of the C API that Lathe passes around.
 * ORT keeps one environment per process (onnxruntime-node shares it when both are used).
 */
import { writeSync } from 'node:fs';
import { CApi, type Ptr } from './capi';

/** `OrtAllocatorType`. */
export const OrtAllocatorType = { device: 0, arena: 1 } as const;
/** `OrtMemType`. */
export const OrtMemType = { default: 0 } as const;
/** `GraphOptimizationLevel`. */
export const graphOptimizationLevels = { disabled: 0, basic: 1, extended: 2, all: 99 } as const;
/** ORT's logging severities: 0 verbose, 1 info, 2 warning, 3 error, 4 fatal. */
export type LogLevel = 0 | 1 | 2 | 3 | 4;

let env: Ptr | undefined;
let cpuMemInfoHandle: Ptr | undefined;
let cpuAllocatorHandle: Ptr | undefined;

/** The loaded C API and the process's OrtEnv (created on first use). */
export function ortEnv(): { api: CApi; env: Ptr } {
  const api = CApi.get();
  if (env === undefined) {
    // ORT's errors reach callers as exceptions with the same message, so its log stays quiet unless asked
    const level = Number(process.env.LATHE_ORT_LOG_LEVEL ?? 4);
    env = api.out('CreateEnv', Number.isInteger(level) && level >= 0 && level <= 4 ? level : 4, 'lathe');
  }
  return { api, env };
}

/** Memory info of plain CPU memory. */
export function cpuMemoryInfo(): Ptr {
  const { api } = ortEnv();
  return (cpuMemInfoHandle ??= api.out('CreateCpuMemoryInfo', OrtAllocatorType.arena, OrtMemType.default));
}

/** ORT's default CPU allocator (owned by ORT; never released). */
export function cpuAllocator(): Ptr {
  const { api } = ortEnv();
  return (cpuAllocatorHandle ??= api.out('GetAllocatorWithDefaultOptions'));
}

const TRACE = process.env.LATHE_TRACE_RUNS === '1';

/**
 * With LATHE_TRACE_RUNS=1, a line to stderr (every run's start and end, every tensor the garbage
 * collector releases), written synchronously so the last line survives a crash of the process: a
 * native fault names no JavaScript frame.
 */
export function trace(line: string): void {
  if (TRACE) writeSync(2, `[lathe-run] ${line} ${performance.now().toFixed(1)}\n`);
}
