/**
 * The graph side of Lathe's SwiGLU kernels on the CPU (the ops' host compute, float32): the host
 * rule against silu(g)·u and central differences; the op's values and gradients against the
 * composed graph's (Sigmoid/Mul and QuickGelu/Mul, differentiated by Lathe's autodiff) in one
 * session; and a tiny model's SFT loss with flash attention and the `swigluKernel` hook against the
 * same loss without it. The kernels themselves are tested in swiglu-emulated.test.ts (CPU emulation).
 */
import * as L from '@lathe/onnx';
import { Device } from '@lathe/runtime';
import { flashAttentionOps, ropeOps, swigluOps, swigluReference } from '@lathe/kernels';
import { tinyModel, tinyQwen3 } from '../../models/test/tiny';
import { expectSameOutputs, maxRel, sftLossWith } from './sft-hook';


const n = 24;
// gates from −12 to 12 (σ near both ends), ups and upstream weights of both signs
const gate = Float32Array.from({ length: n }, (_, i) => -12 + i + 0.37 * Math.sin(3 * i));
const up = Float32Array.from({ length: n }, (_, i) => 1.5 * Math.cos(0.7 * i + 0.3));
const w = Float32Array.from({ length: n }, (_, i) => Math.sin(1.3 * i + 1));

test('the host rule is silu(g)·u (float64 known answer), and its gradients match central differences of Σ w·y', () => {
  const y = swigluReference(gate, up);
  for (let i = 0; i < n; i++) expect(y[i]).toBeCloseTo((gate[i] / (1 + Math.exp(-gate[i]))) * up[i], 5);
  const { dGate, dUp } = swigluReference(gate, up, w);
  const f = (g: ArrayLike<number>, u: ArrayLike<number>) => {
    let s = 0;
    for (let i = 0; i < n; i++) s += w[i] * (g[i] / (1 + Math.exp(-g[i]))) * u[i];
    return s;
  };
  const h = 1e-5;
  const fd = (which: 'g' | 'u') =>
    Float64Array.from({ length: n }, (_, i) => {
      const a = Float64Array.from(which === 'g' ? gate : up);
      const b = Float64Array.from(a);
      a[i] += h;
      b[i] -= h;
      return which === 'g' ? (f(a, up) - f(b, up)) / (2 * h) : (f(gate, a) - f(gate, b)) / (2 * h);
    });
  for (const [got, want] of [
    [dGate, fd('g')],
    [dUp, fd('u')],
  ] as const) {
    const { err, scale } = maxRel(got, want);
    expect(scale).toBeGreaterThan(0.5);
    expect(err).toBeLessThan(1e-6);
  }
});

test('the op’s values and d(gate), d(up) equal the composed silu(g)·u’s and QuickGelu’s, differentiated by autodiff', () => {
  const ops = swigluOps('cpu');
  const g = new L.Graph('swiglu_vs_composed');
  const x = g.input('gate', 'float32', [2, 3, 4]);
  const u = g.input('up', 'float32', [2, 3, 4]);
  const weights = g.constant(Array.from(w), 'float32', [2, 3, 4]);
  for (const [name, y] of [
    ['kernel', ops.apply(x, u)],
    ['composed', L.mul(L.silu(x), u)],
    ['quickgelu', L.mul(L.quickGelu(x, 1), u)],
  ] as const) {
    g.output(y, `${name}/y`);
    // the square makes dy depend on y, so the gradient op's inputs are not just the weights
    const [dg, du] = L.grad(L.reduceSum(L.mul(L.mul(y, y), weights)), [x, u]);
    g.output(dg!, `${name}/dgate`);
    g.output(du!, `${name}/dup`);
  }
  expect(g.nodes.filter((nd) => nd.op.name === 'SwiGLU_float32').length).toBe(1);
  expect(g.nodes.filter((nd) => nd.op.name === 'SwiGLUGrad_float32').length).toBe(1);
  const session = Device.cpu().compile(g, { customOpDomains: [ops.domain.handle] });
  const bind = session.binding();
  bind.input('gate', { data: gate, dims: [2, 3, 4] });
  bind.input('up', { data: up, dims: [2, 3, 4] });
  const outs = ['y', 'dgate', 'dup'];
  for (const path of ['kernel', 'composed', 'quickgelu']) for (const o of outs) bind.output(`${path}/${o}`, 'host');
  bind.runSync();
  ops.check();
  for (const o of outs) {
    for (const other of ['composed', 'quickgelu']) {
      const { err, scale } = maxRel(bind.fetch(`kernel/${o}`).data as Float32Array, bind.fetch(`${other}/${o}`).data as Float32Array);
      expect([o, other, scale > 0.5, err < 1e-6]).toEqual([o, other, true, true]);
    }
  }
  bind.dispose();
  session.dispose();
  ops.dispose();
});

test('swigluOps refuses mismatched inputs and dtypes it has no kernel for, naming them', () => {
  const ops = swigluOps('cpu');
  const g = new L.Graph('swiglu_refusals');
  expect(() => ops.apply(g.input('a', 'float32', [2, 4]), g.input('b', 'float32', [2, 5]))).toThrow(/must have one shape/);
  expect(() => ops.apply(g.input('c', 'float32', [2, 4]), g.input('d', 'float16', [2, 4]))).toThrow(/gate is float32 and up float16/);
  expect(() => ops.apply(g.input('e', 'bfloat16', [2, 4]), g.input('f', 'bfloat16', [2, 4]))).toThrow(/no kernel for dtype bfloat16/);
  expect(() => swigluOps('cuda')).toThrow(/CUDA needs the compiled SwigluKernels/);
  ops.dispose();
});

test.each([
  ['GroupQueryAttention', false, false],
  ['GroupQueryAttention, recomputed layers', false, true],
  ['the attention and RoPE kernels’ ops (as lathe-step --attention-kernel --rope-kernel --swiglu-kernel)', true, false],
])('a tiny model’s SFT loss with flash attention through %s: with the swigluKernel hook, the same loss and weight gradients as without', (_, withKernels, recompute) => {
  const run = (withKernel: boolean) =>
    sftLossWith(
      () => {
        const ops = swigluOps('cpu');
        const fa = withKernels ? flashAttentionOps('cpu') : undefined;
        const rope = withKernels ? ropeOps('cpu') : undefined;
        return {
          options: { ...(fa ? { attentionKernel: (x, heads) => fa.attend(x, heads) } : {}), ...(rope ? { ropeKernel: rope.rotate } : {}), ...(withKernel ? { swigluKernel: ops.apply } : {}) },
          ops: [ops, ...(fa ? [fa] : []), ...(rope ? [rope] : [])],
        };
      },
      {
        recompute,
        inspect: (g) => {
          const count = (op: string) => g.nodes.filter((nd) => nd.op.name === op).length;
          const layers = tinyModel(tinyQwen3, 3).config.numLayers;
          // every layer's MLP forward (again when recomputed), and its gradient op once
          const fwd = (recompute ? 2 : 1) * layers;
          expect([count('SwiGLU_float32'), count('SwiGLUGrad_float32'), count('QuickGelu')]).toEqual(withKernel ? [fwd, layers, 0] : [0, 0, fwd]);
        },
      },
    );
  expectSameOutputs(run(true), run(false));
});
