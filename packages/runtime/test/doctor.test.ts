import { availableProviders, diagnose } from '@lathe/runtime';

test('doctor reports versions and providers, and says how to get a missing CUDA provider', () => {
  const checks = diagnose({ tryCuda: !process.env.LATHE_TEST_CUDA });
  const by = Object.fromEntries(checks.map((c) => [c.name, c]));
  expect(by.onnxruntime.ok).toBe(true);
  expect(by.onnxruntime.detail).toMatch(/onnxruntime-node 1\.29\.0, C API library 1\.29\.0/);
  expect(by.koffi.detail).toMatch(/^\d+\.\d+\.\d+$/);
  expect(availableProviders()).toContain('CPUExecutionProvider');
  if (!by['CUDA provider files'].ok) {
    expect(by['CUDA provider files'].detail).toMatch(/install-cuda-provider/);
    expect(by['CUDA device'].ok).toBe(false);
  }
});
