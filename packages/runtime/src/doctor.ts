/**
 * `diagnose()`: what this machine offers ONNX Runtime — versions, compiled-in providers, whether a
 * CPU device runs, whether the CUDA provider and the CUDA libraries it needs are present, the GPUs,
 * and whether a CUDA device actually opens. `lathe doctor` prints it. The CPU alone runs everything
 * (training and generation of small models); the CUDA checks matter only for GPU speed.
 */
import { execFileSync } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { join } from 'node:path';
import { koffiVersion, ortLibraryDir } from './capi';
import { Device } from './device';
import { ortEnv } from './env';

/** One check: what was found and whether it is fine. */
export interface DoctorCheck {
  name: string;
  ok: boolean;
  detail: string;
  /** Needed only to run on an NVIDIA GPU: when it fails, the CPU still runs training and generation. */
  gpuOnly?: boolean;
}

/** The CUDA libraries ORT 1.29's CUDA 13 provider links against. */
const CUDA_LIBS = ['libcudart.so.13', 'libcublas.so.13', 'libcublasLt.so.13', 'libcurand.so.10', 'libcuda.so.1'];

function version(pkg: string): string {
  try {
    const require = createRequire(__filename);
    return (JSON.parse(readFileSync(require.resolve(`${pkg}/package.json`), 'utf8')) as { version: string }).version;
  } catch {
    return 'not installed';
  }
}

/** ORT's compiled-in execution providers (present in the build, not necessarily loadable). */
export function availableProviders(): string[] {
  const { api } = ortEnv();
  const out: (bigint | null)[] = [null];
  const n: number[] = [0];
  api.check('GetAvailableProviders', api.fn('GetAvailableProviders')(out, n));
  const names = api.strings(out[0]!, n[0]);
  api.call('ReleaseAvailableProviders', out[0], n[0]);
  return names;
}

/** Opens the CPU device and runs an ORT session on it (the fill of a tensor), reading the result back. */
function cpuCheck(): DoctorCheck {
  try {
    const d = Device.cpu();
    const t = d.full('float32', [4], 2);
    const ok = (t.download().data as Float32Array).every((v) => v === 2);
    t.dispose();
    return { name: 'CPU device', ok, detail: ok ? `${d.name} opened; a tensor filled by an ORT session round-tripped` : 'a tensor filled on the CPU did not round-trip' };
  } catch (e) {
    return { name: 'CPU device', ok: false, detail: (e as Error).message.split('\n')[0] };
  }
}

/** Runs every check (opening CUDA only when `tryCuda`). */
export function diagnose(opts: { tryCuda?: boolean } = {}): DoctorCheck[] {
  const checks: DoctorCheck[] = [];
  checks.push({ name: 'node', ok: Number(process.versions.node.split('.')[0]) >= 20, detail: `${process.version} ${process.platform} ${process.arch}` });
  const ortNode = version('onnxruntime-node');
  const dir = ortLibraryDir();
  let core = 'not loaded';
  try {
    core = ortEnv().api.version;
    checks.push({ name: 'onnxruntime', ok: core === ortNode, detail: `onnxruntime-node ${ortNode}, C API library ${core} (${dir})` });
  } catch (e) {
    checks.push({ name: 'onnxruntime', ok: false, detail: `cannot load ${dir}: ${(e as Error).message}` });
    return checks;
  }
  checks.push({ name: 'koffi', ok: true, detail: koffiVersion });
  checks.push({ name: 'providers (compiled in)', ok: true, detail: availableProviders().join(', ') });
  checks.push(cpuCheck());
  const gpu = (c: Omit<DoctorCheck, 'gpuOnly'>) => checks.push({ ...c, gpuOnly: true });
  const files = ['libonnxruntime_providers_cuda.so', 'libonnxruntime_providers_shared.so'];
  const present = files.filter((f) => existsSync(join(dir, f)));
  gpu({
    name: 'CUDA provider files',
    ok: present.length === files.length,
    detail: present.length === files.length ? `present in ${dir}` : `missing ${files.filter((f) => !present.includes(f)).join(', ')} — run node tools/install-cuda-provider.mjs`,
  });
  let cache = '';
  try {
    cache = execFileSync('ldconfig', ['-p'], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] });
  } catch {
    // no ldconfig: LD_LIBRARY_PATH alone
  }
  const search = (process.env.LD_LIBRARY_PATH ?? '').split(':').filter(Boolean);
  const found = CUDA_LIBS.filter((l) => cache.includes(l) || search.some((d) => existsSync(join(d, l))));
  gpu({ name: 'CUDA 13 libraries', ok: found.length === CUDA_LIBS.length, detail: found.length === CUDA_LIBS.length ? 'all found' : `missing ${CUDA_LIBS.filter((l) => !found.includes(l)).join(', ')}` });
  let gpus = '';
  try {
    gpus = execFileSync('nvidia-smi', ['--query-gpu=name,memory.total,driver_version', '--format=csv,noheader'], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] }).trim();
  } catch {
    // no driver: no GPU to use
  }
  gpu({ name: 'GPUs', ok: gpus.length > 0, detail: gpus ? gpus.split('\n').join('; ') : 'none found (nvidia-smi not found or no NVIDIA driver)' });
  checks.push({ ...ncclCheck(cache, search, gpus ? gpus.split('\n').length : 0), gpuOnly: true });
  if (opts.tryCuda && !gpus) gpu({ name: 'CUDA device', ok: false, detail: 'not tried: no NVIDIA GPU found' });
  else if (opts.tryCuda) {
    try {
      const d = Device.cuda();
      const t = d.full('float32', [4], 2);
      const ok = (t.download().data as Float32Array).every((v) => v === 2);
      t.dispose();
      gpu({ name: 'CUDA device', ok, detail: ok ? `${d.name} opened; a tensor round-tripped (transfers ${d.pinned ? 'through pinned memory' : 'through pageable memory'})` : 'a tensor did not round-trip' });
    } catch (e) {
      gpu({ name: 'CUDA device', ok: false, detail: (e as Error).message.split('\n')[0] });
    }
  }
  return checks;
}

/**
 * Whether libnccl.so.2 is where @lathe/distributed looks for it (LATHE_NCCL_LIBRARY, the loader's
 * cache and LD_LIBRARY_PATH, Python's nvidia-nccl wheel); that package loads it for `lathe launch`
 * on several GPUs. Missing is a failure only where there are several GPUs to use it.
 */
function ncclCheck(cache: string, search: string[], gpuCount: number): Omit<DoctorCheck, 'gpuOnly'> {
  const explicit = process.env.LATHE_NCCL_LIBRARY;
  let where = explicit && existsSync(explicit) ? explicit : cache.includes('libnccl.so.2') ? 'the loader cache (ldconfig)' : search.find((d) => existsSync(join(d, 'libnccl.so.2')));
  if (!where && !explicit) {
    try {
      const dir = execFileSync('python3', ['-c', 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))'], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'], timeout: 20_000 }).trim();
      if (existsSync(join(dir, 'libnccl.so.2'))) where = join(dir, 'libnccl.so.2');
    } catch {
      // no python3 or no nvidia-nccl wheel
    }
  }
  const fix = 'pip install nvidia-nccl-cu13 (PyTorch\'s CUDA wheels bring it), apt install libnccl2, or LATHE_NCCL_LIBRARY=/path/to/libnccl.so.2 (docs/runtime.md)';
  if (where) return { name: 'NCCL (several GPUs)', ok: true, detail: `libnccl.so.2 found in ${where}; lathe launch --gpus N uses it with --device cuda` };
  if (explicit) return { name: 'NCCL (several GPUs)', ok: false, detail: `LATHE_NCCL_LIBRARY=${explicit} does not exist — ${fix}` };
  return { name: 'NCCL (several GPUs)', ok: gpuCount < 2, detail: `libnccl.so.2 not found${gpuCount < 2 ? ' (needed only to train on several GPUs)' : ''} — ${fix}` };
}
