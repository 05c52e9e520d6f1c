/** Finding libnccl (CI has none): the search order, and a missing library named with the fix. */
import { mkdirSync, mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { diagnose } from '@lathe/runtime';
import { cudartCandidates, LocalGroup, loadFirst, NCCL_FIX, ncclCandidates, NcclCollectives, NcclLibraryError, ncclStatus } from '@lathe/distributed';

test('LATHE_NCCL_LIBRARY alone when set; else existing files on LD_LIBRARY_PATH and the toolkit, then the soname', () => {
  expect(ncclCandidates({ LATHE_NCCL_LIBRARY: '/opt/nccl/libnccl.so.2' })).toEqual(['/opt/nccl/libnccl.so.2']);
  const dir = mkdtempSync(join(tmpdir(), 'lathe-nccl-'));
  mkdirSync(join(dir, 'lib64'));
  writeFileSync(join(dir, 'lib64', 'libnccl.so.2'), '');
  writeFileSync(join(dir, 'libcudart.so.12'), '');
  expect(ncclCandidates({ CUDA_HOME: dir }, { python: false })[0]).toBe(join(dir, 'lib64', 'libnccl.so.2'));
  expect(ncclCandidates({ CUDA_HOME: dir }, { python: false }).at(-1)).toBe('libnccl.so.2');
  // the sonames first: ORT's CUDA provider may hold a runtime already, and one runtime is wanted
  expect(cudartCandidates({ LD_LIBRARY_PATH: dir }, { python: false }).slice(0, 3)).toEqual(['libcudart.so.13', 'libcudart.so.12', join(dir, 'libcudart.so.12')]);
});

test('a missing or wrong library is an error naming each path tried and the fix', () => {
  const dir = mkdtempSync(join(tmpdir(), 'lathe-nccl-'));
  const fake = join(dir, 'libnccl.so.2');
  writeFileSync(fake, 'not a library');
  let err: unknown;
  try {
    loadFirst('NCCL (libnccl.so.2)', [join(dir, 'absent.so'), fake], 'ncclGetVersion', NCCL_FIX);
  } catch (e) {
    err = e;
  }
  expect(err).toBeInstanceOf(NcclLibraryError);
  const msg = (err as Error).message;
  expect(msg).toContain(`NCCL (libnccl.so.2) could not be loaded; tried ${join(dir, 'absent.so')}: `);
  expect(msg).toContain(`; ${fake}: `);
  expect(msg).toContain('pip install nvidia-nccl-cu13');
  expect(msg).toContain('LATHE_NCCL_LIBRARY');
  // libc loads but is not NCCL
  expect(() => loadFirst('NCCL', ['libc.so.6'], 'ncclGetVersion', NCCL_FIX)).toThrow(/libc.so.6: does not export ncclGetVersion/);
});

test('ncclStatus reports a missing NCCL as a reason, not a throw (what lathe doctor prints)', () => {
  const s = ncclStatus();
  if (s.ok) expect(s.version).toMatch(/^\d+\.\d+\.\d+$/);
  else expect(s.error).toMatch(/could not be loaded; tried .*(Install NCCL|CUDA runtime)/);
});

test("lathe doctor's NCCL line: the file LATHE_NCCL_LIBRARY names, or a missing one named with the fix", () => {
  const dir = mkdtempSync(join(tmpdir(), 'lathe-nccl-'));
  const file = join(dir, 'libnccl.so.2');
  writeFileSync(file, '');
  const line = (env: string) => {
    const before = process.env.LATHE_NCCL_LIBRARY;
    process.env.LATHE_NCCL_LIBRARY = env;
    try {
      return diagnose({ tryCuda: false }).find((c) => c.name === 'NCCL (several GPUs)')!;
    } finally {
      if (before === undefined) delete process.env.LATHE_NCCL_LIBRARY;
      else process.env.LATHE_NCCL_LIBRARY = before;
    }
  };
  expect(line(file)).toEqual({ name: 'NCCL (several GPUs)', ok: true, gpuOnly: true, detail: `libnccl.so.2 found in ${file}; lathe launch --gpus N uses it with --device cuda` });
  const missing = line(join(dir, 'absent.so'));
  expect(missing.ok).toBe(false);
  expect(missing.detail).toContain(`LATHE_NCCL_LIBRARY=${join(dir, 'absent.so')} does not exist — pip install nvidia-nccl-cu13`);
});

test('NcclCollectives.create refuses an unknown stream priority by name, before loading NCCL', async () => {
  const [host] = LocalGroup.create(1);
  await expect(NcclCollectives.create(host, { deviceId: 0, streamPriority: 'highest' as 'high' })).rejects.toThrow(/streamPriority 'highest': 'default' or 'high'/);
});
