/**
 * `customGradient`: a region differentiated by one rule of its own. Checked through
 * `rowLogSumExp` (LogSoftmax forward, exp(y)·dy backward): same values and gradients as the
 * composed `logSumExp`, inside a `checkpoint` region too, and a value leaking out of the region is
 * refused.
 */
import * as L from '@lathe/onnx';
import { compile, rng } from '../../../tools/testing/ort-cpu';

const R = 6;
const N = 40;
const r = rng(11);
const xs = Float32Array.from({ length: R * N }, () => (r() * 2 - 1) * 8);
const ws = Float32Array.from({ length: R }, () => r() * 2 - 1);

/** loss = Σ w ⊙ lse(x) and its gradient, by `rowLogSumExp` or the composed `logSumExp`. */
async function run(which: 'row' | 'composed', recompute = false) {
  const g = new L.Graph();
  const x = g.input('x', 'float32', [R, N]);
  const w = g.input('w', 'float32', [R, 1]);
  const lse = (t: L.Tensor) => (which === 'row' ? L.rowLogSumExp(t) : L.logSumExp(t, -1, true));
  const y = recompute ? L.checkpoint([x], () => lse(L.mul(x, 1.5))) : lse(L.mul(x, 1.5));
  const loss = L.reduceSum(L.mul(y, w));
  const [dx] = L.grad(loss, [x]);
  g.output(y, 'lse');
  g.output(dx, 'dx');
  const out = await (await compile(g))({ x: { data: xs, dims: [R, N] }, w: { data: ws, dims: [R, 1] } });
  return { nodes: g.nodes.map((n) => n.op.name), lse: out.lse.data as Float32Array, dx: out.dx.data as Float32Array };
}

const maxRel = (a: Float32Array, b: Float32Array) => Math.max(...Array.from(a, (v, i) => Math.abs(v - b[i]) / (1e-6 + Math.abs(b[i]))));

test('rowLogSumExp: the composed logSumExp’s values and gradients, in one LogSoftmax pass; the same inside a checkpoint region', async () => {
  const composed = await run('composed');
  for (const recompute of [false, true]) {
    const row = await run('row', recompute);
    expect(maxRel(row.lse, composed.lse)).toBeLessThan(1e-5);
    expect(maxRel(row.dx, composed.dx)).toBeLessThan(1e-4);
    // forward: one LogSoftmax, no max/exp-sum chain; backward: Exp of the saved log-softmax
    expect(row.nodes.filter((n) => n === 'LogSoftmax')).toHaveLength(recompute ? 2 : 1);
    expect(row.nodes).not.toContain('ReduceMax');
    expect(row.nodes).not.toContain('MaxPool');
  }
});

test('customGradient: a value built inside the region and used outside it on a path to the loss is refused', () => {
  const g = new L.Graph();
  const x = g.input('x', 'float32', [2, 3]);
  let inner: L.Tensor | undefined;
  const y = L.customGradient(
    [x],
    () => {
      inner = L.mul(x, 2);
      return { output: L.reduceSum(inner, [1], true) };
    },
    ({ dy }) => [L.mul(L.expand(dy, [2, 3]), 2)],
  );
  expect(() => L.grad(L.add(L.reduceSum(y), L.reduceSum(inner!)), [x])).toThrow(/built inside a customGradient region, is used outside it/);
  // used only through its output, the rule gives the gradient
  expect(() => L.grad(L.reduceSum(y), [x])).not.toThrow();
  expect(() => L.customGradient([x], () => ({ output: x }), () => [null])).toThrow(/the output must be built inside the region/);
});
