import { existsSync, mkdtempSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import * as koffi from 'koffi';
import { Device } from '@lathe/runtime';
import { chooseTarget, compileKeyHash, defaultCacheDir, KernelCache, packKernelArgs, type CompileKey } from '@lathe/kernels';

/** Reads a parameter's value back through the pointer cuLaunchKernel would follow. */
const read = (p: bigint, type: string) => koffi.decode(p, type) as unknown;

test('arguments: each pointer in the array points at its value, in the C type of its slot', () => {
  const t = Device.cpu().upload({ data: Float32Array.from([1, 2, 3]), dims: [3] });
  const sig = ['ptr', 'ptr', 'i32', 'u32', 'i64', 'u64', 'f32', 'f64'] as const;
  const { params, slots } = packKernelArgs('k', sig, [0xdeadbeef00n, t, -7, 4000000000, -(2n ** 40n), 2 ** 40, 0.1, 0.1]);
  expect(params.length).toBe(8);
  expect(params[1] - params[0]).toBe(8n);
  expect(read(params[0], 'uint64_t')).toBe(0xdeadbeef00);
  expect(BigInt(read(params[1], 'uint64_t') as number)).toBe(t.devicePointer());
  // the tensor's pointer is where its data is
  expect(Array.from(koffi.decode(t.devicePointer(), 'float', 3) as number[])).toEqual([1, 2, 3]);
  expect(read(params[2], 'int32_t')).toBe(-7);
  expect(read(params[3], 'uint32_t')).toBe(4000000000);
  expect(read(params[4], 'int64_t')).toBe(-(2 ** 40));
  expect(read(params[5], 'uint64_t')).toBe(2 ** 40);
  expect(read(params[6], 'float')).toBe(Math.fround(0.1));
  expect(read(params[7], 'double')).toBe(0.1);
  expect(slots.byteLength).toBe(64);
  t.dispose();
});

test('arguments: a wrong count, a fraction for an integer or an out-of-range value names the kernel and the argument', () => {
  expect(() => packKernelArgs('axpy', ['ptr', 'f32'], [1n])).toThrow("kernel 'axpy' takes 2 arguments (ptr, f32), got 1");
  expect(() => packKernelArgs('axpy', ['i32'], [1.5])).toThrow("kernel 'axpy' argument 0 (i32): expected an integer in [-2147483648, 2147483647], got 1.5");
  expect(() => packKernelArgs('axpy', ['f32', 'u32'], [1, -1])).toThrow(/argument 1 \(u32\)/);
  expect(() => packKernelArgs('axpy', ['ptr'], [5])).toThrow(/argument 0 \(ptr\): expected a device pointer/);
  const t = Device.cpu().zeros('float32', [2]);
  t.dispose();
  expect(() => packKernelArgs('axpy', ['ptr'], [t])).toThrow(/was disposed/);
});

const key = (over: Partial<CompileKey> = {}): CompileKey => ({ source: 'extern "C" __global__ void k() {}', name: 'k', target: 'sm_90', options: ['-O3'], compiler: '13.0', ...over });

test('cache keys: any change of source, name, target, options (or their order) or compiler is another key', () => {
  const base = compileKeyHash(key());
  expect(base).toMatch(/^[0-9a-f]{64}$/);
  expect(compileKeyHash(key())).toBe(base);
  const others = [
    key({ source: 'extern "C" __global__ void k() { }' }),
    key({ name: 'k2' }),
    key({ target: 'sm_80' }),
    key({ options: ['-O3', '--use_fast_math'] }),
    key({ options: [] }),
    key({ compiler: '12.8' }),
    // fields are length-prefixed: moving text between fields changes the key
    key({ source: 'ab', name: 'c' }),
  ].map(compileKeyHash);
  expect(new Set([base, ...others]).size).toBe(others.length + 1);
  expect(compileKeyHash(key({ options: ['-a', '-b'] }))).not.toBe(compileKeyHash(key({ options: ['-b', '-a'] })));
  expect(compileKeyHash(key({ source: 'ab', name: 'c' }))).not.toBe(compileKeyHash(key({ source: 'a', name: 'bc' })));
});

test('cache: a stored image reads back; sm_ targets are cubins, compute_ targets PTX; no temporary file is left', () => {
  const dir = join(mkdtempSync(join(tmpdir(), 'lathe-kcache-')), 'nested', 'kernels');
  const cache = new KernelCache(dir);
  expect(cache.get(key())).toBeUndefined();
  expect(cache.put(key(), { kind: 'cubin', image: Uint8Array.from([1, 2, 3]), log: '' })).toBe(true);
  expect(cache.get(key())).toEqual({ kind: 'cubin', image: Uint8Array.from([1, 2, 3]), log: '' });
  expect(cache.file(key())).toBe(join(dir, `${compileKeyHash(key())}.cubin`));
  expect(cache.file(key({ target: 'compute_90' }))).toMatch(/\.ptx$/);
  cache.put(key({ target: 'compute_90' }), { kind: 'ptx', image: new TextEncoder().encode('.version 8.0\0'), log: '' });
  expect(cache.get(key({ target: 'compute_90' }))!.kind).toBe('ptx');
  expect(readdirSync(dir).filter((f) => f.endsWith('.tmp'))).toEqual([]);
  expect(readdirSync(dir).length).toBe(2);
  // an empty file (a crash before any byte) is a miss; drop removes a file
  writeFileSync(cache.file(key({ name: 'empty' })), '');
  expect(cache.get(key({ name: 'empty' }))).toBeUndefined();
  cache.drop(key());
  expect(existsSync(cache.file(key()))).toBe(false);
});

test('cache: an unwritable folder is skipped, not an error', () => {
  const file = join(mkdtempSync(join(tmpdir(), 'lathe-kcache-')), 'a-file');
  writeFileSync(file, 'x');
  const cache = new KernelCache(join(file, 'sub'));
  expect(cache.put(key(), { kind: 'cubin', image: Uint8Array.from([1]), log: '' })).toBe(false);
  expect(readFileSync(file, 'utf8')).toBe('x');
});

test('cache folder: LATHE_KERNEL_CACHE, else XDG_CACHE_HOME/lathe/kernels', () => {
  expect(defaultCacheDir({ LATHE_KERNEL_CACHE: '/k' })).toBe('/k');
  expect(defaultCacheDir({ XDG_CACHE_HOME: '/c' })).toBe('/c/lathe/kernels');
});

test('target: a cubin for a supported arch, else PTX of the newest arch below, else no build', () => {
  const supported = [75, 80, 86, 89, 90, 100, 120];
  expect(chooseTarget(90, supported)).toEqual({ target: 'sm_90' });
  const f = chooseTarget(121, supported);
  expect(f.target).toBe('compute_120');
  expect(f.fallback).toMatch(/cannot build sm_121.*compute_120 PTX/);
  expect(() => chooseTarget(70, supported)).toThrow(/no build for sm_70 \(it supports sm_75, sm_80/);
});
