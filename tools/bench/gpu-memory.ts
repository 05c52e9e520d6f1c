/**
 * GPU memory in use as nvidia-smi reports it, for the GPU this process runs on: nvidia-smi ignores
 * CUDA_VISIBLE_DEVICES, so a process given one GPU of several (device-lanes.sh) must name it with --id,
 * or it reads GPU 0's memory, which another lane may be filling.
 */
import { spawnSync } from 'node:child_process';

/** The nvidia-smi `--id` of this process's first visible GPU (an index or a UUID), or undefined when all are visible. */
export function visibleGpuId(env: NodeJS.ProcessEnv = process.env): string | undefined {
  const first = env.CUDA_VISIBLE_DEVICES?.split(',')[0]?.trim();
  return first ? first : undefined;
}

/** MiB in use on this process's GPU, or undefined where nvidia-smi is missing or fails. */
export function gpuUsedMiB(env: NodeJS.ProcessEnv = process.env): number | undefined {
  const id = visibleGpuId(env);
  const r = spawnSync('nvidia-smi', [...(id ? [`--id=${id}`] : []), '--query-gpu=memory.used', '--format=csv,noheader,nounits'], { encoding: 'utf8' });
  return r.status === 0 ? Number(r.stdout.trim().split('\n')[0]) : undefined;
}
