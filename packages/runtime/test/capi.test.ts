import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import * as L from '@lathe/onnx';
import { CApi, Device, OrtError, ortLibraryDir } from '@lathe/runtime';

test('loads the C API of the ONNX Runtime that onnxruntime-node ships, at the same version', () => {
  const api = CApi.get();
  const pkg = JSON.parse(readFileSync(join(ortLibraryDir(), '../../../../package.json'), 'utf8')) as { version: string };
  expect(api.version).toBe(pkg.version);
  expect(api.libraryPath).toContain('libonnxruntime');
});

test('a status from ORT becomes an OrtError with its code and message', () => {
  const api = CApi.get();
  const status = api.fn('CreateStatus')(2, 'made up for the test');
  let err: unknown;
  try {
    api.check('CreateStatus', status);
  } catch (e) {
    err = e;
  }
  expect(err).toBeInstanceOf(OrtError);
  expect((err as OrtError).code).toBe('INVALID_ARGUMENT');
  expect((err as OrtError).message).toBe('CreateStatus: made up for the test');
});

test('a corrupt model fails session creation with ORT protobuf error', () => {
  expect(() => Device.cpu().compile(new Uint8Array([1, 2, 3, 4, 5]), { name: 'garbage' })).toThrow(/could not create a cpu session for 'garbage'/);
});

test('a failing node surfaces with its node name', async () => {
  const g = new L.Graph('bad_reshape');
  const x = g.input('x', 'float32', ['N']);
  const dims = g.input('dims', 'int64', [2]);
  // a reshape to run-time dims: ORT fails when the element counts differ
  const [y] = L.applyOp(L.reshapeOp, [x, dims], { dims: ['?a', '?b'] });
  g.output(y, 'y');
  const node = g.nodes.find((n) => n.op.name === 'Reshape')!;
  const s = Device.cpu().compile(g);
  await expect(s.run({ x: { data: new Float32Array(6), dims: [6] }, dims: { data: BigInt64Array.from([4n, 2n]), dims: [2] } })).rejects.toThrow(node.name);
  s.dispose();
});
