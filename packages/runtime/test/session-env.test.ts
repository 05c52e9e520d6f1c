/**
 * SessionOptions.env: variables ONNX Runtime reads while it builds kernels are set for the session's
 * creation only — the environment is as it was afterwards, whether creation succeeded or failed.
 */
import * as L from '@lathe/onnx';
import { Device } from '@lathe/runtime';

const KEY = 'LATHE_TEST_SESSION_ENV';

function tiny(): L.Graph {
  const g = new L.Graph('env');
  g.output(L.mul(g.input('x', 'float32', [2]), 2), 'y');
  return g;
}

afterEach(() => {
  delete process.env[KEY];
});

test('a variable that was unset is unset again after the session is created, and the session runs', async () => {
  const s = Device.cpu().compile(tiny(), { env: { [KEY]: '1' } });
  expect(process.env[KEY]).toBeUndefined();
  const out = await s.run({ x: { data: Float32Array.from([1, 2]), dims: [2] } });
  expect(Array.from(out.y.data as Float32Array)).toEqual([2, 4]);
  s.dispose();
});

test('a variable that was set gets its value back', () => {
  process.env[KEY] = 'before';
  Device.cpu().compile(tiny(), { env: { [KEY]: '1' } }).dispose();
  expect(process.env[KEY]).toBe('before');
});

test('a failed creation restores the environment too', () => {
  process.env[KEY] = 'before';
  expect(() => Device.cpu().compile(new Uint8Array([1, 2, 3]), { env: { [KEY]: '1' } })).toThrow(/could not create/);
  expect(process.env[KEY]).toBe('before');
});
