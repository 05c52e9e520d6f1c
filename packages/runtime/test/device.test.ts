import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import type { DType } from '@lathe/onnx';
import { Device, DeviceTensor, hostTensor, toBfloat16Bits, toFloat16Bits, type HostArray } from '@lathe/runtime';

const cpu = Device.cpu();

const samples: [DType, HostArray][] = [
  ['float32', Float32Array.from([1.5, -2, 3.25, 0, 1e-30, -7])],
  ['float64', Float64Array.from([Math.PI, -1e300, 0, 2, 3, 4])],
  ['float16', toFloat16Bits([0.5, -1, 2, 65504, 1e-7, 3])],
  ['bfloat16', toBfloat16Bits([0.5, -1, 2, 1e30, 1e-7, 3])],
  ['int32', Int32Array.from([1, -2, 2 ** 31 - 1, -(2 ** 31), 0, 5])],
  ['int64', BigInt64Array.from([1n, -2n, 2n ** 62n, -(2n ** 63n), 0n, 5n])],
  ['bool', Uint8Array.from([1, 0, 1, 1, 0, 0])],
  ['uint8', Uint8Array.from([255, 0, 1, 2, 3, 4])],
  ['int8', Int8Array.from([-128, 127, 0, 1, -1, 2])],
];

test.each(samples)('%s: upload, download, fill, copy, reshape', (dtype, data) => {
  const t = cpu.upload({ data, dims: [2, 3] }, dtype);
  expect(t.dtype).toBe(dtype);
  expect(t.dims).toEqual([2, 3]);
  expect(t.download().data).toEqual(data);
  const c = cpu.empty(dtype, [3, 2]);
  c.copyFrom(t);
  expect(c.download()).toEqual({ data, dims: [3, 2] });
  const view = t.reshape([6]);
  expect(view.download().data).toEqual(data);
  const one = dtype === 'float16' ? toFloat16Bits([1])[0] : dtype === 'bfloat16' ? toBfloat16Bits([1])[0] : 1;
  t.fill(1);
  expect(Array.from(view.download().data as ArrayLike<number | bigint>)).toEqual(new Array(6).fill(dtype === 'int64' ? 1n : one));
  for (const x of [view, t, c]) x.dispose();
});

test('memory is counted, views share memory, disposal is idempotent and checked', () => {
  const before = cpu.memory();
  const a = cpu.zeros('float32', [256, 256]);
  expect(cpu.memory().bytes - before.bytes).toBe(256 * 256 * 4);
  const v = a.reshape([65536]);
  expect(cpu.memory().tensors - before.tensors).toBe(1); // views own nothing
  v.upload(new Float32Array(65536).fill(2));
  expect(a.download().data[100]).toBe(2);
  a.dispose();
  a.dispose();
  expect(cpu.memory().bytes).toBe(before.bytes);
  expect(() => a.download()).toThrow(/float32\[256, 256\] on cpu was disposed/);
  expect(() => v.download()).toThrow(/was disposed/);
  v.dispose();
});

test('leading(n): a view of the first n rows, sharing memory', () => {
  const before = cpu.memory();
  const a = cpu.upload({ data: Float32Array.from({ length: 12 }, (_, i) => i), dims: [4, 3] });
  const head = a.leading(2);
  expect(head.dims).toEqual([2, 3]);
  expect(Array.from(head.download().data as Float32Array)).toEqual([0, 1, 2, 3, 4, 5]);
  head.upload(new Float32Array(6).fill(-1));
  expect(Array.from(a.download().data as Float32Array)).toEqual([-1, -1, -1, -1, -1, -1, 6, 7, 8, 9, 10, 11]);
  expect(a.reshape([2, 6]).leading(1).dims).toEqual([1, 6]);
  expect(() => a.leading(5)).toThrow(/leading: 5 rows of float32\[4, 3\] on cpu \(1..4\)/);
  expect(() => a.leading(0)).toThrow(/leading: 0 rows/);
  expect(cpu.memory().bytes - before.bytes).toBe(48); // views own nothing
  a.dispose();
  expect(() => head.download()).toThrow(/was disposed/);
});

test('wrong host data is refused with the tensor named', () => {
  const t = cpu.empty('float32', [4]);
  expect(() => t.upload(new Float64Array(4))).toThrow(/upload into float32\[4\] on cpu: expected a Float32Array/);
  expect(() => t.upload(new Float32Array(3))).toThrow(/3 elements/);
  expect(() => cpu.upload({ data: new Uint16Array(2), dims: [2] })).toThrow(/pass the dtype/);
  expect(() => cpu.empty('float32', [2, -1])).toThrow(/invalid dims/);
  const c = cpu.empty('float32', [5]);
  expect(() => c.copyFrom(t)).toThrow(/element count must match/);
  t.dispose();
  c.dispose();
});

test('a tensor garbage-collected without dispose() is freed and counted as a leak', async () => {
  setFlagsFromString('--expose-gc');
  const gc = runInNewContext('gc') as () => void;
  const before = cpu.memory();
  (() => {
    for (let i = 0; i < 8; i++) cpu.zeros('float32', [1024]);
  })();
  expect(cpu.memory().bytes - before.bytes).toBe(8 * 4096);
  for (let i = 0; i < 20 && cpu.memory().leaked - before.leaked < 8; i++) {
    gc();
    await new Promise((r) => setTimeout(r, 10));
  }
  expect(cpu.memory().leaked - before.leaked).toBe(8);
  expect(cpu.memory().bytes).toBe(before.bytes);
});

test('hostTensor builds typed host data from numbers', () => {
  expect(hostTensor('int64', [2], [3, 4])).toEqual({ data: BigInt64Array.from([3n, 4n]), dims: [2] });
  expect(() => hostTensor('float32', [3], [1])).toThrow(/1 values for dims \[3\]/);
  expect(DeviceTensor).toBeDefined();
});

test('asking for CUDA where the provider is missing is an error that says what to do', () => {
  if (process.env.LATHE_TEST_CUDA) return; // on a GPU machine CUDA is there
  expect(() => Device.cuda()).toThrow(/CUDA execution provider could not start[\s\S]*install-cuda-provider/);
});
