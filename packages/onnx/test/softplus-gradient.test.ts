/**
 * softplus (and so logSigmoid) has the gradient σ(x) everywhere, x = 0 included: DPO starts with
 * the policy equal to its reference, where every pair's margin is exactly 0.
 */
import * as L from '@lathe/onnx';
import { compile } from '../../../tools/testing/ort-cpu';

test('d/dx −log σ(x) = −σ(−x), at exactly 0 too (−½), and the values are log(1 + e^−x)', async () => {
  const xs = [0, 1e-7, -1e-7, 3, -3, 40, -40];
  const g = new L.Graph();
  const x = g.input('x', 'float32', [xs.length]);
  const y = L.neg(L.logSigmoid(x));
  const [dx] = L.grad(L.reduceSum(y), [x]);
  g.output(y, 'y');
  g.output(dx, 'dx');
  const out = await (await compile(g))({ x: { data: Float32Array.from(xs), dims: [xs.length] } });
  const sigma = (v: number) => 1 / (1 + Math.exp(-v));
  Array.from(out.dx.data as Float32Array).forEach((d, i) => expect(d).toBeCloseTo(-sigma(-xs[i]), 6));
  Array.from(out.y.data as Float32Array).forEach((v, i) => expect(v).toBeCloseTo(Math.log1p(Math.exp(-xs[i])), 5));
});
