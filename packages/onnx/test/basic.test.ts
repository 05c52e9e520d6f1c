import { Graph, grad, GraphError, matmul } from '@lathe/onnx';
import { compile } from '../../../tools/testing/ort-cpu';

test('builds, differentiates and runs a small graph', async () => {
  const g = new Graph();
  const x = g.input('x', 'float32', ['B', 3]);
  const w = g.input('w', 'float32', [3, 2]);
  const y = matmul(x, w).tanh();
  const loss = y.square().mean();
  const [dw] = grad(loss, [w]);
  g.output(loss, 'loss');
  g.output(dw, 'dw');
  const run = await compile(g);
  const xs = new Float32Array([1, 2, 3, 4, 5, 6]);
  const ws = new Float32Array([0.1, -0.2, 0.3, 0.1, -0.1, 0.05]);
  const out = await run({ x: { data: xs, dims: [2, 3] }, w: { data: ws, dims: [3, 2] } });
  // Independent reference in plain JS.
  let l = 0;
  const dwRef = new Float64Array(6);
  for (let b = 0; b < 2; b++) {
    for (let j = 0; j < 2; j++) {
      let z = 0;
      for (let k = 0; k < 3; k++) z += xs[b * 3 + k] * ws[k * 2 + j];
      const t = Math.tanh(z);
      l += (t * t) / 4;
      for (let k = 0; k < 3; k++) dwRef[k * 2 + j] += ((2 * t) / 4) * (1 - t * t) * xs[b * 3 + k];
    }
  }
  expect(out.loss.data[0]).toBeCloseTo(l, 5);
  Array.from(out.dw.data as Float32Array).forEach((v, i) => expect(v).toBeCloseTo(dwRef[i], 5));
});

test('shape errors name the op, the shapes and the caller line', () => {
  const g = new Graph();
  const a = g.input('a', 'float32', ['B', 3]);
  const b = g.input('b', 'float32', [4, 2]);
  let err: unknown;
  try {
    matmul(a, b);
  } catch (e) {
    err = e;
  }
  expect(err).toBeInstanceOf(GraphError);
  const msg = (err as Error).message;
  expect(msg).toMatch(/^MatMul: inner dims differ/);
  expect(msg).toContain('float32[B, 3], float32[4, 2]');
  expect(msg).toMatch(/basic\.test\.ts:\d+/);
});
