/**
 * concatProjections with kernels that read the packed projections in place (issue 37): the kernel
 * decode step whose attention takes the packed q/k/v (`attendPacked`) and whose SwiGLU takes the
 * packed gate/up (`packed`) has no Split or Concat inside its layers — one MatMul for q/k/v and one
 * for gate/up, their outputs straight into the kernels; `withConcatProjections`' `packed` is the
 * group's MatMul (+ bias), shared with the members' split when both are asked, and undefined for
 * weights with a side branch (LoRA's term would be lost). Stand-in ops here (graph building only);
 * the real ops' values: packages/kernels/test/decode-attention-packed-engine.test.ts.
 */
import * as L from '@lathe/onnx';
import { addKvDecodeStep, addKvPrefill, withConcatProjections, type KvDecodeAttention, type KvGraphOptions, type KvSwiglu } from '@lathe/rollout';
import { weightInputs, type DecoderConfig, type HfConfig, type SwigluKernel } from '@lathe/models';
import { tinyModel, tinyQwen3 } from './helpers';

const wideQwen3: HfConfig = { ...tinyQwen3, hidden_size: 64, head_dim: 16, num_hidden_layers: 3 };
const qwen3 = tinyModel(wideQwen3, 7);
const qwen2 = tinyModel({ ...wideQwen3, architectures: ['Qwen2ForCausalLM'], tie_word_embeddings: false }, 8);

/** A node of a test-only op with the given output shape (never run). */
function stub(name: string, x: L.Tensor, shape: (number | string)[]): L.Tensor {
  return L.applyOp({ name, domain: 'lathe.test', infer: () => [{ dtype: x.dtype, shape }] }, [x], {})[0];
}

/** Stand-ins for @lathe/kernels' decode attention and SwiGLU with their packed forms; records the packed widths they were given. */
function stubs(cfg: DecoderConfig, cache: KvDecodeAttention['cache'], packed: boolean): { attention: KvDecodeAttention; swiglu: KvSwiglu; widths: { qkv: number[]; gateUp: number[] } } {
  const widths = { qkv: [] as number[], gateUp: [] as number[] };
  const H = cfg.numHeads * cfg.headDim;
  const attention: KvDecodeAttention = {
    cache,
    cacheDtype: (dtype) => (cache === 'float8e4m3' ? 'uint8' : dtype),
    qkNormEpsilon: cfg.rmsNormEps,
    domain: { handle: 0n },
    attend: (x) => ({ output: x.query, presentKey: x.cacheKey, presentValue: x.cacheValue, presentKeyScale: x.keyScale, presentValueScale: x.valueScale }),
    ...(packed
      ? {
          attendPacked: (x: Parameters<NonNullable<KvDecodeAttention['attendPacked']>>[0]) => {
            widths.qkv.push(x.qkv.shape[2] as number);
            return { output: stub('StubAttendPacked', x.qkv, [x.qkv.shape[0], 1, H]), presentKey: x.cacheKey, presentValue: x.cacheValue, presentKeyScale: x.keyScale, presentValueScale: x.valueScale };
          },
        }
      : {}),
    quantize: (x) => ({ data: L.cast(x, 'uint8'), scale: L.cast(x, 'float32') }),
    check: () => {},
  };
  const apply: SwigluKernel = (gate, up) => L.mul(L.silu(gate), up);
  if (packed)
    apply.packed = (gu) => {
      const W = gu.shape[gu.rank - 1] as number;
      widths.gateUp.push(W);
      return stub('StubSwigluPacked', gu, [...gu.shape.slice(0, -1), W / 2]);
    };
  return { attention, swiglu: { apply, domain: { handle: 0n }, check: () => {} }, widths };
}

function graph(add: typeof addKvDecodeStep, cfg: DecoderConfig, opts: Partial<KvGraphOptions>, dtype: L.DType = 'bfloat16'): L.Graph {
  const g = new L.Graph();
  add(g, cfg, weightInputs(g, cfg, dtype, dtype).weights, dtype, { temperature: 0 }, { K: 2, rows: 4, qkNormInKernel: true, ...opts });
  return g;
}
const layerOps = (g: L.Graph, i: number) => g.nodes.filter((n) => n.name.startsWith(`layer${i}/`)).map((n) => n.op.name);

test.each([
  ['qwen3, native cache', qwen3.config, 'native'],
  ['qwen3, e4m3 cache', qwen3.config, 'float8e4m3'],
  ['qwen2 (q/k/v biases), native cache', qwen2.config, 'native'],
] as const)('%s: the kernel decode step with packed attention and SwiGLU has no Split or Concat in its layers: four MatMuls a layer, q/k/v and gate/up straight into the kernels', (_case, cfg, cache) => {
  const { attention, swiglu, widths } = stubs(cfg, cache, true);
  const step = graph(addKvDecodeStep, cfg, { concatProjections: true, decodeAttention: attention, swiglu });
  for (let i = 0; i < cfg.numLayers; i++) {
    const ops = layerOps(step, i);
    expect(ops.filter((o) => o === 'Split' || o === 'Concat' || o === 'Slice')).toEqual([]);
    // q/k/v, o, gate/up, down
    expect(ops.filter((o) => o === 'MatMul')).toHaveLength(4);
    expect(ops.filter((o) => o === 'StubAttendPacked' || o === 'StubSwigluPacked')).toHaveLength(2);
  }
  expect(widths.qkv).toEqual(new Array(cfg.numLayers).fill((cfg.numHeads + 2 * cfg.numKvHeads) * cfg.headDim));
  expect(widths.gateUp).toEqual(new Array(cfg.numLayers).fill(2 * cfg.intermediateSize));
  // the concatenated q/k/v bias is added once before the kernel (Qwen2), as before the split
  const split = stubs(cfg, cache, false);
  const adds = (g: L.Graph) => layerOps(g, 1).filter((o) => o === 'Add').length;
  expect(adds(step)).toBe(adds(graph(addKvDecodeStep, cfg, { concatProjections: true, decodeAttention: split.attention, swiglu: split.swiglu })));
  expect(L.hostTableNodes(step)).toEqual([]);
});

test('kernels without the packed forms, or concatProjections off: the step keeps its Split (q/k/v and gate/up) and Concat (the query)', () => {
  const cfg = qwen3.config;
  const plain = stubs(cfg, 'native', false);
  const split = graph(addKvDecodeStep, cfg, { concatProjections: true, decodeAttention: plain.attention, swiglu: plain.swiglu });
  expect(layerOps(split, 1).filter((o) => o === 'Split')).toHaveLength(2);
  expect(layerOps(split, 1).filter((o) => o === 'Concat')).toHaveLength(1);
  const packed = stubs(cfg, 'native', true);
  const off = graph(addKvDecodeStep, cfg, { decodeAttention: packed.attention, swiglu: packed.swiglu });
  expect(layerOps(off, 1).filter((o) => o === 'MatMul')).toHaveLength(7);
  expect([packed.widths.qkv, packed.widths.gateUp]).toEqual([[], []]);
});

test('the prefill under concatProjections: GroupQueryAttention takes q/k/v packed (Q/K norm in its kernel); gate/up split without a SwiGLU kernel, packed with one; LATHE_GQA_PACKED_QKV=0 splits q/k/v again', () => {
  const cfg = qwen3.config;
  const count = (g: L.Graph, op: string) => layerOps(g, 1).filter((o) => o === op).length;
  const prefill = graph(addKvPrefill, cfg, { concatProjections: true });
  expect([count(prefill, 'Split'), count(prefill, 'Concat')]).toEqual([1, 0]);
  const gqa = L.toModelProto(prefill).graph.node.find((n) => n.opType === 'GroupQueryAttention' && (n.name ?? '').startsWith('layer1/'))!;
  expect(gqa.input.slice(1, 3)).toEqual(['', '']);
  const withKernel = graph(addKvPrefill, cfg, { concatProjections: true, swiglu: stubs(cfg, 'native', true).swiglu });
  expect([count(withKernel, 'Split'), count(withKernel, 'Concat')]).toEqual([0, 0]);
  process.env.LATHE_GQA_PACKED_QKV = '0';
  try {
    const split = graph(addKvPrefill, cfg, { concatProjections: true });
    expect([count(split, 'Split'), count(split, 'Concat')]).toEqual([2, 1]);
  } finally {
    delete process.env.LATHE_GQA_PACKED_QKV;
  }
});

test('withConcatProjections’ packed: the group’s one MatMul, shared with the members asked with the same input; undefined for other prefixes and for weights with a side branch', () => {
  const cfg = qwen2.config;
  const g = new L.Graph();
  const base = weightInputs(g, cfg, 'float32', 'float32').weights;
  const w = withConcatProjections(g, cfg, base, 'float32');
  const x = g.input('x', 'float32', [4, 1, cfg.hiddenSize]);
  const qkv = w.packed!('qkv', 'model.layers.0.self_attn', x)!;
  expect(qkv.shape).toEqual([4, 1, (cfg.numHeads + 2 * cfg.numKvHeads) * cfg.headDim]);
  expect(w.packed!('qkv', 'model.layers.0.self_attn', x)).toBe(qkv);
  const gu = w.packed!('gate_up', 'model.layers.0.mlp', x)!;
  expect(gu.shape).toEqual([4, 1, 2 * cfg.intermediateSize]);
  const matmuls = () => g.nodes.filter((n) => n.op.name === 'MatMul').length;
  expect(matmuls()).toBe(2);
  expect(g.nodes.filter((n) => n.op.name === 'Split')).toHaveLength(0);
  // a member asked through matmul splits the packed output (built now, once): no second MatMul
  const k = w.matmul!('model.layers.0.self_attn.k_proj.weight', x)!;
  expect(k.shape).toEqual([4, 1, cfg.numKvHeads * cfg.headDim]);
  expect(matmuls()).toBe(2);
  expect(g.nodes.filter((n) => n.op.name === 'Split')).toHaveLength(1);
  w.matmul!('model.layers.0.self_attn.v_proj.weight', x);
  expect(g.nodes.filter((n) => n.op.name === 'Split')).toHaveLength(1);
  expect(w.packed!('qkv', 'model.layers.0.mlp', x)).toBeUndefined();
  const g2 = new L.Graph();
  const base2 = weightInputs(g2, cfg, 'float32', 'float32').weights;
  const lora = withConcatProjections(g2, cfg, Object.assign((n: string) => base2(n), base2, { branch: () => undefined }), 'float32');
  expect(lora.packed!('qkv', 'model.layers.0.self_attn', g2.input('x', 'float32', [4, 1, cfg.hiddenSize]))).toBeUndefined();
});
