/**
 * Activation recomputation (`checkpoint`): the same gradients as without it, computed from copies
 * of the region's nodes, so the backward pass never reads the region's forward activations, and
 * the copies cannot run before the backward pass reaches the region.
 */
import * as L from '@lathe/onnx';
import type { Node, Tensor } from '@lathe/onnx';
import { gradCheck } from './gradcheck';
import { compile, rng, type HostTensor } from '../../../tools/testing/ort-cpu';

/** One residual block with a softmax (its rule reads its output) and tanh. */
function block(h: Tensor, w: Tensor): Tensor {
  const a = L.softmax(L.matmul(h, w), -1);
  return L.add(h, L.tanh(L.mul(a, h)));
}

/** Three blocks with shared weights [D, D]; each in a checkpoint region when `recompute`. */
function build(recompute: boolean) {
  const g = new L.Graph();
  const x = g.input('x', 'float32', [2, 3, 4]);
  const w = g.input('w', 'float32', [4, 4]);
  const forward: Node[][] = [];
  const results: Tensor[] = [];
  let h = x;
  for (let i = 0; i < 3; i++) {
    const start = g.nodes.length;
    const inputs = h;
    h = recompute ? L.checkpoint([inputs], () => block(inputs, w)) : block(inputs, w);
    forward.push(g.nodes.slice(start));
    results.push(h);
  }
  const loss = L.reduceSum(L.mul(h, h), [0, 1, 2]);
  const forwardCount = g.nodes.length;
  const [dx, dw] = L.grad(loss, [x, w]);
  g.output(loss, 'loss');
  g.output(dx, 'dx');
  g.output(dw, 'dw');
  return { g, forward, results, forwardCount };
}

const random = rng(3);
const host = (dims: number[]): HostTensor => ({ data: Float32Array.from({ length: dims.reduce((a, d) => a * d, 1) }, () => random() * 2 - 1), dims });
const feeds = { x: host([2, 3, 4]), w: host([4, 4]) };

test('checkpointed blocks give the same loss and gradients as plain ones', async () => {
  const plain = await (await compile(build(false).g))(feeds);
  const checkpointed = await (await compile(build(true).g))(feeds);
  for (const k of ['loss', 'dx', 'dw']) {
    const a = Array.from(plain[k].data as Float32Array);
    const b = Array.from(checkpointed[k].data as Float32Array);
    expect(b.length).toBe(a.length);
    a.forEach((v, i) => expect(b[i]).toBeCloseTo(v, 5));
  }
});

test('the backward pass reads no activation computed inside a region (only its inputs and weights)', () => {
  // a region's result is the next region's input (kept either way); everything else inside is not
  const internal = (r: ReturnType<typeof build>) => new Set(r.forward.flat().flatMap((n) => n.outputs).filter((t) => !r.results.includes(t)));
  const checkpointed = build(true);
  const activations = internal(checkpointed);
  const backward = checkpointed.g.nodes.slice(checkpointed.forwardCount);
  expect(backward.filter((n) => n.inputs.some((t) => t && activations.has(t))).map((n) => n.name)).toEqual([]);
  // …while without checkpointing the same backward pass reads plenty of them.
  const plain = build(false);
  const plainActs = internal(plain);
  expect(plain.g.nodes.slice(plain.forwardCount).filter((n) => n.inputs.some((t) => t && plainActs.has(t))).length).toBeGreaterThan(10);
});

test('every recomputed node depends on a gradient (so ORT cannot run it during the forward pass)', () => {
  const { g, forwardCount } = build(true);
  const gradientValues = new Set<Tensor>();
  // values computed by the backward pass proper (not the copies)
  for (const n of g.nodes.slice(forwardCount)) if (!n.name.includes('recompute/')) for (const o of n.outputs) gradientValues.add(o);
  const dependsOnGradient = new Set<Tensor>(gradientValues);
  const copies = g.nodes.filter((n) => n.name.includes('recompute/'));
  expect(copies.length).toBeGreaterThan(0);
  for (const n of g.nodes) {
    if (n.inputs.some((t) => t && dependsOnGradient.has(t))) for (const o of n.outputs) dependsOnGradient.add(o);
  }
  const early = copies.filter((n) => !n.outputs.every((o) => dependsOnGradient.has(o)));
  expect(early.map((n) => n.name)).toEqual([]);
});

test('a checkpointed region passes the finite-difference check', async () => {
  const r = await gradCheck({
    name: 'checkpoint',
    inputs: [{ shape: [2, 3] }, { shape: [3, 3] }],
    build: ([h, w]) => L.checkpoint([h], () => block(block(h, w), w)),
  });
  expect(r.worst).toBeLessThanOrEqual(1);
});

test('serialization drops nodes no output depends on (the gradients autodiff built for constants, say)', () => {
  const g = new L.Graph();
  const x = g.input('x', 'float32', [2, 3]);
  const y = L.mul(x, 0.5); // Mul's rule also builds d/d(0.5) = Σ g·x, which nothing reads
  const [dx] = L.grad(L.reduceSum(L.mul(y, y), [0, 1]), [x]);
  g.output(dx, 'dx');
  const built = g.nodes.map((n) => n.name);
  const emitted = L.toModelProto(g).graph!.node!.map((n) => n.name);
  expect(emitted.length).toBeLessThan(built.length);
  expect(new Set(emitted).size).toBe(emitted.length);
  // every emitted node's outputs are read by another emitted node or are graph outputs
  const read = new Set(L.toModelProto(g).graph!.node!.flatMap((n) => n.input ?? []));
  for (const n of L.toModelProto(g).graph!.node!) expect((n.output ?? []).some((o) => read.has(o) || o === 'dx')).toBe(true);
});
