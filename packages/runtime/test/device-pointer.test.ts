import * as koffi from 'koffi';
import * as L from '@lathe/onnx';
import { Device } from '@lathe/runtime';

test("a tensor's device pointer is where its elements are, and a view's is its parent's", () => {
  const t = Device.cpu().upload({ data: Float32Array.from([1.5, -2, 3]), dims: [3] });
  expect(Array.from(koffi.decode(t.devicePointer(), 'float', 3) as number[])).toEqual([1.5, -2, 3]);
  const v = t.reshape([1, 3]);
  expect(v.devicePointer()).toBe(t.devicePointer());
  // writing through the pointer is what a kernel does: the tensor sees it
  koffi.encode(t.devicePointer(), 'float', 7);
  expect(Array.from(t.download().data as Float32Array)).toEqual([7, -2, 3]);
  v.dispose();
  t.dispose();
  expect(() => t.devicePointer()).toThrow(/was disposed/);
});

test('a tensor keeps its address across the runs it is bound to, so a kernel may hold the pointer', () => {
  const g = new L.Graph('double');
  g.output(L.mul(g.input('x', 'float32', [4]), 2), 'y');
  const cpu = Device.cpu();
  const s = cpu.compile(g);
  const x = cpu.upload({ data: Float32Array.from([1, 2, 3, 4]), dims: [4] });
  const y = cpu.empty('float32', [4]);
  const at = y.devicePointer();
  const b = s.binding().input('x', x).output('y', y);
  b.runSync();
  b.runSync({ synchronize: false });
  expect(y.devicePointer()).toBe(at);
  expect(Array.from(koffi.decode(at, 'float', 4) as number[])).toEqual([2, 4, 6, 8]);
  b.dispose();
  s.dispose();
  x.dispose();
  y.dispose();
});

test('isOpen tells whether a device was opened (options apply only on first open); the CPU has no compute stream', () => {
  expect(Device.isOpen('cuda', 7)).toBe(false);
  Device.cpu();
  expect(Device.isOpen('cpu')).toBe(true);
  expect(Device.cpu().computeStream).toBeUndefined();
});
