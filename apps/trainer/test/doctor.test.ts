import { spawnSync } from 'node:child_process';
import path from 'node:path';

const LATHE = path.join(__dirname, '..', 'bin', 'lathe.cjs');
const doctor = (...args: string[]) => spawnSync(process.execPath, [LATHE, 'doctor', ...args], { encoding: 'utf8', timeout: 60_000 });
const hasGpu = spawnSync('nvidia-smi', ['-L'], { encoding: 'utf8' }).status === 0;

describe('lathe doctor', () => {
  test('says the CPU is ready, opening a CPU device for real', () => {
    const r = doctor('--no-cuda');
    expect(r.status).toBe(0);
    expect(r.stdout).toMatch(/^ok +CPU device +cpu opened; .*round-tripped/m);
    expect(r.stdout).toMatch(/^CPU: ready — training and generation of small models run on the CPU \(--device cpu, the default\)/m);
  }, 60_000);

  (hasGpu ? test.skip : test)('on a machine without a GPU, the CUDA checks are not failures, and the summary says CUDA is only for GPU speed', () => {
    const r = doctor();
    expect(r.status).toBe(0);
    expect(r.stdout).not.toMatch(/^FAIL/m);
    expect(r.stdout).toMatch(/^-- +GPUs +none found/m);
    expect(r.stdout).toMatch(/^-- +CUDA device +not tried: no NVIDIA GPU found/m);
    expect(r.stdout).toMatch(/^GPU: none here\. That is fine for CPU use; CUDA is needed only for GPU speed/m);
    const json = JSON.parse(doctor('--json').stdout) as { name: string; ok: boolean; gpuOnly?: boolean }[];
    expect(json.filter((c) => !c.ok).every((c) => c.gpuOnly)).toBe(true);
  }, 60_000);
});
