/**
 * The graph side of Lathe's RoPE kernel on the CPU (the ops' host compute, float32): the host rule
 * against a direct float64 rotation by angle, its inverse and its gradient (central differences);
 * the op's values and gradient against ONNX Runtime's RotaryEmbedding in one session; and a tiny
 * model's SFT loss with flash attention (GroupQueryAttention, recomputed layers, the attention kernel's
 * ops) and the `ropeKernel` hook against the same loss without it.
 * The kernel itself is tested in rope-emulated.test.ts (CPU emulation).
 */
import * as L from '@lathe/onnx';
import { Device } from '@lathe/runtime';
import { flashAttentionOps, ropeOps, ropeReference } from '@lathe/kernels';
import { tinyModel, tinyQwen3 } from '../../models/test/tiny';
import { expectSameOutputs, maxRel, sftLossWith } from './sft-hook';


// 3 rows of 2 heads, headDim 8, caches of 16 positions from the angles p·θ_i.
const shape = { rows: 3, heads: 2, half: 4, maxPositions: 16 };
const positions = [5, 0, 15];
const theta = [1, 0.3, 0.05, 0.001];
const cos = Float32Array.from({ length: 16 * 4 }, (_, k) => Math.cos(Math.floor(k / 4) * theta[k % 4]));
const sin = Float32Array.from({ length: 16 * 4 }, (_, k) => Math.sin(Math.floor(k / 4) * theta[k % 4]));
const xData = Float32Array.from({ length: 3 * 2 * 8 }, (_, i) => Math.sin(1.7 * i + 0.2) * 2);

test('the host rule rotates each (i, i + headDim/2) pair by position·θ_i (float64 known answer); sign −1 undoes it', () => {
  const y = ropeReference(shape, { x: xData, positionIds: positions, cos, sin });
  for (let r = 0; r < 3; r++) {
    for (let h = 0; h < 2; h++) {
      for (let i = 0; i < 4; i++) {
        const a = positions[r] * theta[i];
        const o = (r * 2 + h) * 8;
        const [x1, x2] = [xData[o + i], xData[o + i + 4]];
        expect(y[o + i]).toBeCloseTo(x1 * Math.cos(a) - x2 * Math.sin(a), 5);
        expect(y[o + i + 4]).toBeCloseTo(x2 * Math.cos(a) + x1 * Math.sin(a), 5);
      }
    }
  }
  const back = ropeReference(shape, { x: y, positionIds: positions, cos, sin }, -1);
  expect(maxRel(back, xData).err).toBeLessThan(1e-6);
});

test('the gradient rule (the inverse rotation of dy) matches central differences of Σ g·rope(x)', () => {
  const gData = Float32Array.from({ length: xData.length }, (_, i) => Math.cos(0.9 * i + 1));
  const f = (x: Float32Array) => ropeReference(shape, { x, positionIds: positions, cos, sin }).reduce((s, v, i) => s + v * gData[i], 0);
  const dx = ropeReference(shape, { x: gData, positionIds: positions, cos, sin }, -1);
  const h = 2 ** -6;
  const fd = Float64Array.from(xData, (_, i) => {
    const up = Float32Array.from(xData);
    const down = Float32Array.from(xData);
    up[i] += h;
    down[i] -= h;
    return (f(up) - f(down)) / (2 * h);
  });
  const { err, scale } = maxRel(dx, fd);
  expect(scale).toBeGreaterThan(0.5);
  expect(err).toBeLessThan(1e-4);
});

test('the op’s values and d(x) equal ONNX Runtime’s RotaryEmbedding on [B, S, heads·headDim]', () => {
  const ops = ropeOps('cpu');
  const g = new L.Graph('rope_vs_ort');
  const x = g.input('x', 'float32', [1, 3, 16]);
  const pos = g.input('pos', 'int64', [1, 3]);
  const c = g.constant(cos, 'float32', [16, 4]);
  const s = g.constant(sin, 'float32', [16, 4]);
  const weights = g.constant(Array.from(xData, (_, i) => Math.cos(0.9 * i + 1)), 'float32', [1, 3, 16]);
  for (const [name, y] of [
    ['kernel', ops.rotate(x, pos, c, s)],
    ['ort', L.rotaryEmbedding(x, pos, c, s)],
  ] as const) {
    g.output(y, `${name}/y`);
    // the square makes the gradient go through the op twice (forward and its inverse's gradient)
    g.output(L.grad(L.reduceSum(L.mul(L.mul(y, y), weights)), [x])[0]!, `${name}/dx`);
  }
  expect(g.nodes.filter((n) => n.op.name === 'Rope_float32').length).toBe(1);
  expect(g.nodes.filter((n) => n.op.name === 'RopeInverse_float32').length).toBe(1);
  const session = Device.cpu().compile(g, { customOpDomains: [ops.domain.handle] });
  const bind = session.binding();
  bind.input('x', { data: xData, dims: [1, 3, 16] });
  bind.input('pos', { data: BigInt64Array.from(positions.map(BigInt)), dims: [1, 3] });
  for (const n of ['kernel/y', 'kernel/dx', 'ort/y', 'ort/dx']) bind.output(n, 'host');
  bind.runSync();
  ops.check();
  for (const n of ['y', 'dx']) {
    const { err, scale } = maxRel(bind.fetch(`kernel/${n}`).data as Float32Array, bind.fetch(`ort/${n}`).data as Float32Array);
    expect(scale).toBeGreaterThan(0.5);
    expect(err).toBeLessThan(1e-6);
  }
  bind.dispose();
  session.dispose();
  ops.dispose();
});

test.each([
  ['GroupQueryAttention', false, false],
  ['GroupQueryAttention, recomputed layers', false, true],
  ['the attention kernel’s ops (as lathe-step --attention-kernel --rope-kernel)', true, false],
])('a tiny model’s SFT loss with flash attention through %s: with the ropeKernel hook, the same loss and weight gradients as without', (_, withAttentionKernel, recompute) => {
  const run = (withKernel: boolean) =>
    sftLossWith(
      () => {
        const ops = ropeOps('cpu');
        const fa = withAttentionKernel ? flashAttentionOps('cpu') : undefined;
        return {
          options: { ...(fa ? { attentionKernel: (x, heads) => fa.attend(x, heads) } : {}), ...(withKernel ? { ropeKernel: ops.rotate } : {}) },
          ops: [ops, ...(fa ? [fa] : [])],
        };
      },
      {
        recompute,
        inspect: (g) => {
          const count = (op: string) => g.nodes.filter((n) => n.op.name === op).length;
          const layers = tinyModel(tinyQwen3, 3).config.numLayers;
          // q and k of every layer forward (again when recomputed) and, as the gradient rule, inverse
          const fwd = (recompute ? 4 : 2) * layers;
          const inv = 2 * layers;
          expect([count('Rope_float32'), count('RopeInverse_float32'), count('RotaryEmbedding')]).toEqual(withKernel ? [fwd, inv, 0] : [0, 0, fwd + inv]);
        },
      },
    );
  expectSameOutputs(run(true), run(false));
});
