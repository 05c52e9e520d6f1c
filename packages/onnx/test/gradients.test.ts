/**
 * Every differentiable op's gradient rule against central finite differences (float64 on ORT's
 * CPU provider; float32 with looser tolerances where ORT has no float64 kernel), on shapes that
 * exercise broadcasting. The last test fails when a differentiable op has no case here.
 */
import * as L from '@lathe/onnx';
import { registeredOps, type Tensor } from '@lathe/onnx';
import { gradCheck, type GradCase } from './gradcheck';
import { compile } from '../../../tools/testing/ort-cpu';

/** cos/sin tables [positions, half] of RoPE angles p·10000^(−i/half), float32. */
function ropeTables(g: L.Graph, positions: number, half: number): [Tensor, Tensor] {
  const angle = (p: number, i: number) => p * Math.pow(10000, -i / half);
  const table = (f: (a: number) => number) => g.constant(Array.from({ length: positions * half }, (_, k) => f(angle(Math.floor(k / half), k % half))), 'float32', [positions, half]);
  return [table(Math.cos), table(Math.sin)];
}

const cases: GradCase[] = [
  // elementwise binary, with broadcasting both ways
  { name: 'add broadcast', inputs: [{ shape: [2, 3] }, { shape: [3] }], build: ([a, b]) => L.add(a, b) },
  { name: 'sub broadcast', inputs: [{ shape: [2, 1, 4] }, { shape: [3, 1] }], build: ([a, b]) => L.sub(a, b) },
  { name: 'mul broadcast', inputs: [{ shape: [2, 3] }, { shape: [2, 1] }], build: ([a, b]) => L.mul(a, b) },
  { name: 'mul by scalar', inputs: [{ shape: [3] }], build: ([a]) => a.mul(2.5).add(1) },
  { name: 'div broadcast', inputs: [{ shape: [2, 3] }, { shape: [3], fill: 'positive' }], build: ([a, b]) => L.div(a, b) },
  { name: 'pow', inputs: [{ shape: [2, 3], fill: 'positive' }, { shape: [3] }], build: ([a, b]) => L.pow(a, b) },
  { name: 'maximum', inputs: [{ shape: [2, 3], fill: 'distinct' }, { shape: [3], fill: 'distinct' }], build: ([a, b]) => L.maximum(a, b) },
  { name: 'minimum', inputs: [{ shape: [2, 3], fill: 'distinct' }, { shape: [2, 1], fill: 'distinct' }], build: ([a, b]) => L.minimum(a, b) },
  // unary
  { name: 'neg', inputs: [{ shape: [4] }], build: ([a]) => L.neg(a) },
  { name: 'exp', inputs: [{ shape: [2, 2] }], build: ([a]) => L.exp(a) },
  { name: 'log', inputs: [{ shape: [2, 2], fill: 'positive' }], build: ([a]) => L.log(a) },
  { name: 'sqrt', inputs: [{ shape: [3], fill: 'positive' }], build: ([a]) => L.sqrt(a) },
  { name: 'reciprocal', inputs: [{ shape: [3], fill: 'positive' }], build: ([a]) => L.reciprocal(a) },
  { name: 'tanh', inputs: [{ shape: [5] }], build: ([a]) => L.tanh(a) },
  { name: 'sigmoid', inputs: [{ shape: [5] }], build: ([a]) => L.sigmoid(a) },
  { name: 'erf', inputs: [{ shape: [5] }], build: ([a]) => L.erf(a), dtype: 'float32' },
  { name: 'sin', inputs: [{ shape: [4] }], build: ([a]) => L.sin(a) },
  { name: 'cos', inputs: [{ shape: [4] }], build: ([a]) => L.cos(a) },
  { name: 'abs', inputs: [{ shape: [6], fill: 'distinct' }], build: ([a]) => L.abs(a) },
  { name: 'relu', inputs: [{ shape: [6], fill: 'distinct' }], build: ([a]) => L.relu(a) },
  { name: 'identity', inputs: [{ shape: [3] }], build: ([a]) => L.identity(a) },
  {
    name: 'where',
    inputs: [{ shape: [2, 3], dtype: 'bool', fill: { bool: [1, 0, 1, 0, 0, 1] } }, { shape: [2, 3] }, { shape: [3] }],
    build: ([c, a, b]) => L.where(c, a, b),
  },
  { name: 'cast f32→f64→f32', inputs: [{ shape: [3] }], build: ([a]) => L.cast(L.cast(a, 'float64').mul(3), 'float32'), dtype: 'float32' },
  // linear algebra
  { name: 'matmul', inputs: [{ shape: [2, 3] }, { shape: [3, 4] }], build: ([a, b]) => L.matmul(a, b) },
  { name: 'matmul batch broadcast', inputs: [{ shape: [2, 1, 2, 3] }, { shape: [3, 3, 2] }], build: ([a, b]) => L.matmul(a, b) },
  { name: 'matmul of a batch by a 2-D weight (one GEMM for the weight gradient)', inputs: [{ shape: [2, 3, 4] }, { shape: [4, 5] }], build: ([a, b]) => L.matmul(a, b) },
  { name: 'matmul of a rank-4 batch by a 2-D weight', inputs: [{ shape: [2, 2, 3, 4] }, { shape: [4, 2] }], build: ([a, b]) => L.matmul(a, b) },
  // reductions and softmax
  { name: 'reduceSum', inputs: [{ shape: [2, 3, 2] }], build: ([a]) => L.reduceSum(a, [1]) },
  { name: 'reduceSum keepdims', inputs: [{ shape: [2, 3, 2] }], build: ([a]) => L.reduceSum(a, [0, 2], true) },
  { name: 'reduceSumSquare', inputs: [{ shape: [2, 3, 2] }], build: ([a]) => L.reduceSumSquare(a, [1]) },
  { name: 'reduceSumSquare all keepdims', inputs: [{ shape: [2, 3] }], build: ([a]) => L.reduceSumSquare(a, undefined, true) },
  { name: 'reduceMax', inputs: [{ shape: [2, 4], fill: 'distinct' }], build: ([a]) => L.reduceMax(a, [1]) },
  { name: 'reduceMin', inputs: [{ shape: [3, 2], fill: 'distinct' }], build: ([a]) => L.reduceMin(a, [0], true) },
  { name: 'softmax', inputs: [{ shape: [2, 5] }], build: ([a]) => L.softmax(a, -1) },
  { name: 'softmax axis 0', inputs: [{ shape: [3, 2] }], build: ([a]) => L.softmax(a, 0) },
  { name: 'logSoftmax', inputs: [{ shape: [2, 5] }], build: ([a]) => L.logSoftmax(a, -1) },
  { name: 'cumsum', inputs: [{ shape: [2, 4] }], build: ([a]) => L.cumsum(a, 1) },
  { name: 'cumsum exclusive reverse', inputs: [{ shape: [4, 2] }], build: ([a]) => L.cumsum(a, 0, { exclusive: true, reverse: true }) },
  { name: 'topK values', inputs: [{ shape: [2, 5], fill: 'distinct' }], build: ([a]) => L.topK(a, 3, -1)[0] },
  // shape ops
  { name: 'reshape', inputs: [{ shape: [2, 3, 2] }], build: ([a]) => L.reshape(a, [3, -1]) },
  { name: 'transpose', inputs: [{ shape: [2, 3, 4] }], build: ([a]) => L.transpose(a, [2, 0, 1]) },
  { name: 'concat', inputs: [{ shape: [2, 3] }, { shape: [2, 1] }], build: ([a, b]) => L.concat([a, b], 1) },
  { name: 'split', inputs: [{ shape: [5, 2] }], build: ([a]) => { const [p, q] = L.split(a, [2, 3], 0); return L.concat([q, p.mul(2)], 0); } },
  { name: 'split unused part', inputs: [{ shape: [4] }], build: ([a]) => L.split(a, [1, 3], 0)[1] },
  { name: 'slice', inputs: [{ shape: [3, 5] }], build: ([a]) => L.slice(a, [1], [1], [4]) },
  { name: 'slice negative start', inputs: [{ shape: [2, 6] }], build: ([a]) => L.slice(a, [0, 1], [0, -2]) },
  { name: 'pad', inputs: [{ shape: [2, 2] }], build: ([a]) => L.pad(a, [1, 0], [0, 2]) },
  { name: 'pad before and after, squared', inputs: [{ shape: [2, 3] }], build: ([a]) => L.pad(a, [0, 2], [1, 1]).mul(L.pad(a, [0, 2], [1, 1])) },
  { name: 'squeeze', inputs: [{ shape: [2, 1, 3] }], build: ([a]) => L.squeeze(a, [1]) },
  { name: 'unsqueeze', inputs: [{ shape: [2, 3] }], build: ([a]) => L.unsqueeze(a, [0, 2]) },
  { name: 'expand', inputs: [{ shape: [3, 1] }], build: ([a]) => L.expand(a, [2, 3, 4]) },
  { name: 'trilu lower', inputs: [{ shape: [3, 3] }], build: ([a]) => L.trilu(a, false, 0) },
  { name: 'trilu upper k=1', inputs: [{ shape: [2, 3, 4] }], build: ([a]) => L.trilu(a, true, 1) },
  // indexing
  { name: 'gather axis 0 (embedding)', inputs: [{ shape: [4, 3] }, { shape: [2, 3], dtype: 'int64', fill: { ints: [0, 2, 2, 3, 0, 1] } }], build: ([t, i]) => L.gather(t, i, 0) },
  {
    // an embedding tied to the LM head: the two gathers' rows are scatter-added into the matmuls' dense gradient
    name: 'a table gathered twice and multiplied by its transpose (a tied embedding)',
    inputs: [{ shape: [4, 3] }, { shape: [2], dtype: 'int64', fill: { ints: [1, 1] } }, { shape: [3], dtype: 'int64', fill: { ints: [3, 0, 3] } }, { shape: [2, 3] }],
    build: ([t, i, j, h]) => L.concat([L.matmul(L.add(L.gather(t, i, 0), h), L.transpose(t, [1, 0])), L.matmul(L.gather(t, j, 0), L.transpose(t, [1, 0]))], 0),
  },
  { name: 'gather axis 1', inputs: [{ shape: [2, 4, 3] }, { shape: [5], dtype: 'int64', fill: { ints: [3, 1, 1, 0, 3] } }], build: ([t, i]) => L.gather(t, i, 1) },
  {
    name: 'gatherElements',
    inputs: [{ shape: [2, 4] }, { shape: [2, 3], dtype: 'int64', fill: { ints: [0, 3, 3, 1, 2, 1] } }],
    build: ([t, i]) => L.gatherElements(t, i, 1),
  },
  {
    name: 'gatherND',
    inputs: [{ shape: [3, 2, 2] }, { shape: [4, 2], dtype: 'int64', fill: { ints: [0, 1, 2, 0, 0, 1, 1, 1] } }],
    build: ([t, i]) => L.gatherND(t, i),
  },
  {
    name: 'scatterElements',
    inputs: [{ shape: [2, 4] }, { shape: [2, 2], dtype: 'int64', fill: { ints: [1, 3, 0, 2] } }, { shape: [2, 2] }],
    build: ([d, i, u]) => L.scatterElements(d, i, u, 1),
  },
  {
    name: 'scatterElements add',
    inputs: [{ shape: [3] }, { shape: [4], dtype: 'int64', fill: { ints: [0, 2, 2, 1] } }, { shape: [4] }],
    build: ([d, i, u]) => L.scatterElements(d, i, u, 0, 'add'),
  },
  {
    name: 'scatterND',
    inputs: [{ shape: [4, 2] }, { shape: [2, 1], dtype: 'int64', fill: { ints: [3, 1] } }, { shape: [2, 2] }],
    build: ([d, i, u]) => L.scatterND(d, i, u),
  },
  // fused: GroupQueryAttention over right-padded rows (lengths 5 and 3), 4 query heads on 2 KV heads
  {
    name: 'groupQueryAttention, padded query rows zeroed as the decoder does',
    inputs: [{ shape: [2, 5, 32] }, { shape: [2, 5, 16] }, { shape: [2, 5, 16] }, { shape: [2], dtype: 'int32', fill: { ints: [4, 2] } }],
    build: ([q, k, v, seqlens]) => {
      const g = q.graph;
      const { output } = L.groupQueryAttention({ query: q, key: k, value: v, seqlensK: seqlens, totalSequenceLength: g.constant(5, 'int32', []) }, { numHeads: 4, kvNumHeads: 2 });
      const valid = g.constant([1, 1, 1, 1, 1, 1, 1, 1, 0, 0], 'bool', [2, 5, 1]);
      return L.where(valid, output, L.zerosLike(output));
    },
    dtype: 'float32',
  },
  {
    name: 'groupQueryAttention present key and value',
    inputs: [{ shape: [1, 3, 16] }, { shape: [1, 3, 8] }, { shape: [1, 3, 8] }, { shape: [1], dtype: 'int32', fill: { ints: [2] } }],
    build: ([q, k, v, seqlens]) => {
      const r = L.groupQueryAttention({ query: q, key: k, value: v, seqlensK: seqlens, totalSequenceLength: q.graph.constant(3, 'int32', []) }, { numHeads: 2, kvNumHeads: 1 });
      return L.add(L.mul(r.presentKey, r.presentValue), L.unsqueeze(L.reduceSum(r.output, [2], true), [1]));
    },
    dtype: 'float32',
  },
  // fused: QuickGelu (SiLU at α = 1), from its output and a recomputed sigmoid
  { name: 'quickGelu α = 1 (SiLU)', inputs: [{ shape: [2, 5] }], build: ([x]) => L.quickGelu(x, 1), dtype: 'float32' },
  { name: 'quickGelu α = 1.702', inputs: [{ shape: [2, 5] }], build: ([x]) => L.quickGelu(x, 1.702), dtype: 'float32' },
  // fused: RMSNorm with a scale, and RoPE (the gradient is the inverse rotation)
  { name: 'simplifiedLayerNorm', inputs: [{ shape: [2, 3, 4] }, { shape: [4] }], build: ([x, w]) => L.simplifiedLayerNorm(x, w, 1e-6), dtype: 'float32' },
  {
    name: 'rotaryEmbedding [B, heads, S, headDim]',
    inputs: [{ shape: [2, 2, 3, 4] }],
    build: ([x]) => L.rotaryEmbedding(x, x.graph.constant([0, 1, 2, 2, 3, 4], 'int64', [2, 3]), ...ropeTables(x.graph, 5, 2)),
    dtype: 'float32',
  },
  {
    name: 'rotaryEmbedding [B, S, heads·headDim]',
    inputs: [{ shape: [2, 3, 8] }],
    build: ([x]) => L.rotaryEmbedding(x, x.graph.constant([4, 0, 1, 1, 2, 3], 'int64', [2, 3]), ...ropeTables(x.graph, 5, 2)),
    dtype: 'float32',
  },
  // composites (no rule of their own: they test the primitives' rules in combination)
  { name: 'mean', inputs: [{ shape: [2, 3] }], build: ([a]) => L.mean(a, -1) },
  { name: 'logSumExp', inputs: [{ shape: [2, 4] }], build: ([a]) => L.logSumExp(a, 1) },
  // over a last axis long enough for the two-stage (MaxPool windows) max
  { name: 'logSumExp over 64, windowed max', inputs: [{ shape: [2, 3, 64] }], build: ([a]) => L.logSumExp(a, -1) },
  // a customGradient region: LogSoftmax forward, exp(y)·dy by its own rule
  { name: 'rowLogSumExp', inputs: [{ shape: [3, 7] }], build: ([a]) => L.rowLogSumExp(a) },
  { name: 'rowLogSumExp, x also used outside the region', inputs: [{ shape: [2, 5] }], build: ([a]) => L.add(L.mul(L.rowLogSumExp(L.mul(a, 3)), 2), L.reduceSum(L.mul(a, a), [1], true)) },
  { name: 'rmsNorm', inputs: [{ shape: [2, 4] }, { shape: [4] }], build: ([x, w]) => L.rmsNorm(x, w, 1e-6) },
  { name: 'layerNorm', inputs: [{ shape: [2, 4] }, { shape: [4] }, { shape: [4] }], build: ([x, w, b]) => L.layerNorm(x, w, b, 1e-5) },
  {
    name: 'crossEntropy',
    inputs: [{ shape: [2, 3, 5] }, { shape: [2, 3], dtype: 'int64', fill: { ints: [0, 4, 2, 1, 1, 3] } }],
    build: ([l, t]) => L.crossEntropy(l, t),
  },
  { name: 'entropy', inputs: [{ shape: [2, 5] }], build: ([l]) => L.entropy(l) },
  { name: 'silu', inputs: [{ shape: [5] }], build: ([a]) => L.silu(a) },
  { name: 'gelu', inputs: [{ shape: [5] }], build: ([a]) => L.gelu(a), dtype: 'float32' },
  { name: 'logSigmoid', inputs: [{ shape: [6] }], build: ([a]) => L.logSigmoid(a.mul(4)) },
  { name: 'clip', inputs: [{ shape: [6], fill: 'distinct' }], build: ([a]) => L.clip(a, -0.5, 0.4) },
  {
    name: 'maskedMean',
    inputs: [{ shape: [2, 3] }, { shape: [2, 3], dtype: 'bool', fill: { bool: [1, 1, 0, 0, 1, 0] } }],
    build: ([x, m]) => L.maskedMean(x, m, 1),
  },
  {
    name: 'masked attention block',
    inputs: [{ shape: [1, 3, 4] }, { shape: [4, 4] }, { shape: [4, 4] }],
    build: ([x, wq, wk]) => {
      const q = L.matmul(x, wq);
      const k = L.matmul(x, wk);
      const s = L.matmul(q, L.transpose(k, [0, 2, 1])).mul(0.5);
      return L.matmul(L.maskedSoftmax(s, L.causalMask(x, 1)), x);
    },
  },
  {
    name: '2-layer MLP with cross-entropy',
    inputs: [
      { shape: [4, 3] },
      { shape: [3, 5] },
      { shape: [5] },
      { shape: [5, 2] },
      { shape: [4], dtype: 'int64', fill: { ints: [0, 1, 1, 0] } },
    ],
    build: ([x, w1, b1, w2, t]) => L.crossEntropy(L.matmul(L.add(L.matmul(x, w1), b1).tanh(), w2), t).mean(),
  },
];

describe('gradients match central finite differences', () => {
  const covered = new Set<string>();
  for (const c of cases) {
    test(c.name, async () => {
      const r = await gradCheck(c);
      r.ops.forEach((o) => covered.add(o));
      if (r.worst > 1) throw new Error(`${c.name}: gradient mismatch (${r.worst.toFixed(2)}× tolerance) at ${r.detail}`);
    });
  }

  test('every op with a gradient rule has a case', () => {
    const differentiable = registeredOps().filter((op) => typeof op.grad === 'function').map((op) => op.name);
    const missing = differentiable.filter((name) => !covered.has(name));
    expect(missing).toEqual([]);
  });
});

test('ops without gradient rules are rejected with the node name', () => {
  const g = new L.Graph();
  const x = g.input('x', 'float32', [2]);
  const [y] = L.loop([x], (_i, [c]) => ({ carried: [c.mul(2)] }), { maxTrips: 3 });
  expect(() => L.grad(y.sum(), [x])).toThrow(/Loop \(node Loop_\d+\) has no gradient rule/);
});

test('stopGradient treats its input as a constant', async () => {
  const g = new L.Graph();
  const x = g.input('x', 'float32', [3]);
  const [dx] = L.grad(x.mul(x.stopGradient()).sum(), [x]);
  g.output(dx, 'dx');
  const out = await (await compile(g))({ x: { data: Float32Array.from([1, -2, 3]), dims: [3] } });
  expect(Array.from(out.dx.data as Float32Array)).toEqual([1, -2, 3]); // d(x·c)/dx = c = x, not 2x
});

test('integer inputs cannot be differentiated', () => {
  const g = new L.Graph();
  const i = g.input('i', 'int64', [2]);
  const x = g.input('x', 'float32', [2]);
  expect(() => L.grad(x.sum(), [i as Tensor])).toThrow(/cannot differentiate w.r.t. i of dtype int64/);
});

test('the gradient of a bfloat16 slice is padded in float32 (ONNX Runtime has no bfloat16 Pad on CUDA), with the same values', async () => {
  const pads = (g: L.Graph) => g.nodes.filter((n) => n.op.name === 'Pad').map((n) => n.inputs[0]!.dtype);
  const g = new L.Graph();
  const x = g.input('x', 'float32', [6, 4]);
  const w = g.input('w', 'float32', [2, 4]);
  const rows = L.slice(L.cast(x, 'bfloat16'), [0], [2], [4]);
  const [dx] = L.grad(L.cast(rows, 'float32').mul(w).sum(), [x]);
  g.output(dx, 'dx');
  expect(pads(g)).toEqual(['float32']);
  const out = await (await compile(g))({ x: { data: new Float32Array(24), dims: [6, 4] }, w: { data: Float32Array.from({ length: 8 }, (_, i) => i + 1), dims: [2, 4] } });
  expect(Array.from(out.dx.data as Float32Array)).toEqual([0, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 0, 0, 0, 0, 0, 0]);
});

/** The live nodes of a graph (what serialization emits): op type, output dtype and shape. */
function liveNodes(g: L.Graph): { op: string; out: L.Tensor }[] {
  const byName = new Map(g.nodes.flatMap((n) => n.outputs.map((o) => [o.name, o] as const)));
  return L.toModelProto(g).graph.node.map((n) => ({ op: n.opType, out: byName.get(n.output[0])! }));
}

test('a tied table gets one table-sized gradient: the gathers scatter their rows into the dense part (no zeros, no sums), and in bfloat16 it widens to the float32 master once', () => {
  const [V, H] = [64, 8];
  const table = (n: { out: L.Tensor }) => n.out.shape.length === 2 && n.out.shape[0] === V && n.out.shape[1] === H;
  for (const compute of ['float32', 'bfloat16'] as const) {
    const g = new L.Graph();
    const master = g.input('w', 'float32', [V, H]);
    const ids = g.input('ids', 'int64', [5]);
    const targets = g.input('targets', 'int64', [5]);
    const w = compute === 'float32' ? master : L.cast(master, compute);
    const hidden = L.gather(w, ids, 0);
    // the LM head's logits and the targets' rows (as the chunked log-prob gathers them)
    const logits = L.matmul(hidden, L.transpose(w, [1, 0]));
    const picked = L.reduceSum(L.mul(hidden, L.gather(w, targets, 0)), [1], false);
    const loss = L.cast(L.add(L.reduceSum(logits, [0, 1], false), L.reduceSum(picked, [0], false)), 'float32');
    const [dw] = L.grad(loss, [master]);
    g.output(dw, 'dw');
    // (the transposes are the dense part's: the logits' weight gradient comes out [H, V])
    const big = liveNodes(g).filter((n) => table(n) && n.op !== 'Transpose');
    expect({ compute, ops: big.map((n) => `${n.op}:${n.out.dtype}`) }).toEqual({
      compute,
      ops: compute === 'float32'
        ? ['ScatterND:float32', 'ScatterND:float32']
        : ['Cast:bfloat16', 'Cast:float32', 'ScatterND:float32', 'ScatterND:float32'],
    });
  }
});

test('a bfloat16 table gathered from a float32 master: the master receives the float32 sum of the rows, not its bfloat16 rounding', async () => {
  const g = new L.Graph();
  const master = g.input('w', 'float32', [4, 2]);
  const ids = g.input('ids', 'int64', [3]);
  const scale = g.input('s', 'float32', [3, 2]);
  const rows = L.cast(L.gather(L.cast(master, 'bfloat16'), ids, 0), 'float32');
  const [dw] = L.grad(L.reduceSum(L.mul(rows, scale), [0, 1], false), [master]);
  g.output(dw, 'dw');
  // each scale is a bfloat16 (the rows' gradient is bfloat16, as the forward's rows), but row 1's sums 1 + 2^-9 are not
  const e = 2 ** -9;
  const out = await (await compile(g))({
    w: { data: new Float32Array(8), dims: [4, 2] },
    ids: { data: BigInt64Array.from([1n, 3n, 1n]), dims: [3] },
    s: { data: Float32Array.from([1, e, 1, 2, e, 1]), dims: [3, 2] },
  });
  expect(Array.from(out.dw.data as Float32Array)).toEqual([0, 0, 1 + e, 1 + e, 0, 0, 1, 2]);
});
