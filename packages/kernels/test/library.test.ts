import { mkdirSync, mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { checkVersions, CudaDriver, KernelLibraryError, libraryCandidates, Nvrtc, probeKernels } from '@lathe/kernels';

test('a missing NVRTC is a KernelLibraryError naming the path tried and the fix', () => {
  const missing = '/nonexistent/lathe-test/libnvrtc.so.13';
  let err: unknown;
  try {
    Nvrtc.load([missing]);
  } catch (e) {
    err = e;
  }
  expect(err).toBeInstanceOf(KernelLibraryError);
  const e = err as KernelLibraryError;
  expect(e.library).toBe('nvrtc');
  expect(e.tried).toEqual([missing]);
  expect(e.message).toContain(missing);
  expect(e.message).toMatch(/LATHE_NVRTC_LIB/);
  expect(e.message).toMatch(/ONNX Runtime's kernels only/);
});

test('a library that is not NVRTC (libc) is refused for lacking nvrtcVersion', () => {
  expect(() => Nvrtc.load(['libc.so.6'])).toThrow(/libc\.so\.6: does not export nvrtcVersion/);
});

test('a file that is no shared library is refused with the loader\'s reason', () => {
  const dir = mkdtempSync(join(tmpdir(), 'lathe-kernels-'));
  const fake = join(dir, 'libnvrtc.so.13');
  writeFileSync(fake, 'not an ELF file');
  expect(() => Nvrtc.load([fake])).toThrow(new RegExp(`${fake.replace(/[.]/g, '\\.')}: `));
});

test('a missing CUDA driver is a KernelLibraryError with the driver fix', () => {
  expect(() => CudaDriver.get(['/nonexistent/libcuda.so.1'])).toThrow(KernelLibraryError);
  expect(() => CudaDriver.get(['/nonexistent/libcuda.so.1'])).toThrow(/NVIDIA driver.*LATHE_CUDA_DRIVER_LIB/);
});

test('candidates: the environment variable alone when set; else toolkit files that exist, then sonames', () => {
  expect(libraryCandidates('nvrtc', { LATHE_NVRTC_LIB: '/x/libnvrtc.so.13' })).toEqual(['/x/libnvrtc.so.13']);
  const dir = mkdtempSync(join(tmpdir(), 'lathe-cuda-'));
  const lib64 = join(dir, 'lib64');
  mkdirSync(lib64);
  writeFileSync(join(lib64, 'libnvrtc.so.13'), '');
  const c = libraryCandidates('nvrtc', { CUDA_HOME: dir });
  expect(c[0]).toBe(join(lib64, 'libnvrtc.so.13'));
  expect(c).toContain('libnvrtc.so.12');
  expect(c).not.toContain(join(lib64, 'libnvrtc.so.12'));
  expect(libraryCandidates('cuda-driver', {})[0]).toBe('libcuda.so.1');
});

test('an NVRTC newer than the driver is refused, naming both versions and the fix', () => {
  expect(() => checkVersions({ version: [13, 0], path: '/c/libnvrtc.so.13' }, { version: [12, 4] })).toThrow(/NVRTC 13\.0 \(\/c\/libnvrtc\.so\.13\) is newer than the driver's CUDA 12\.4.*libnvrtc\.so\.12/);
  expect(() => checkVersions({ version: [12, 8], path: 'x' }, { version: [13, 0] })).not.toThrow();
  expect(() => checkVersions({ version: [13, 0], path: 'x' }, { version: [13, 0] })).not.toThrow();
});

test('probe: without the driver (this machine) kernels are reported unavailable with the reason and the fix, nothing thrown', () => {
  const p = probeKernels({ driver: ['/nonexistent/libcuda.so.1'], nvrtc: ['/nonexistent/libnvrtc.so.13'] });
  expect(p.ok).toBe(false);
  expect(p.reason).toMatch(/CUDA driver library could not be loaded; tried \/nonexistent\/libcuda\.so\.1/);
  expect(p.reason).toMatch(/LATHE_CUDA_DRIVER_LIB/);
});
