/**
 * GroupQueryAttention's optional in-kernel Q/K norm (Qwen3's q_norm/k_norm): how it is wired into
 * the ONNX node. ONNX Runtime's CPU kernel refuses those inputs, so its numbers are checked on the
 * GPU (tools/reference/rollout/generate_bench.py: teacher-forced log-probs against transformers).
 */
import * as L from '@lathe/onnx';

function attentionInputs(g: L.Graph) {
  return {
    query: g.input('q', 'bfloat16', ['B', 1, 4 * 16]),
    key: g.input('k', 'bfloat16', ['B', 1, 2 * 16]),
    value: g.input('v', 'bfloat16', ['B', 1, 2 * 16]),
    seqlensK: g.input('seqlens', 'int32', ['B']),
    totalSequenceLength: g.input('total', 'int32', []),
  };
}
const rotary = (g: L.Graph) => ({ cos: g.input('cos', 'bfloat16', [32, 8]), sin: g.input('sin', 'bfloat16', [32, 8]) });

test('the Q/K norm weights go to inputs 14 and 15 (9–13 left empty), with qk_norm_epsilon', () => {
  const g = new L.Graph();
  const qw = g.input('q_norm', 'bfloat16', [16]);
  const kw = g.input('k_norm', 'bfloat16', [16]);
  const r = L.groupQueryAttention({ ...attentionInputs(g), rotary: rotary(g), qkNorm: { q: qw, k: kw, epsilon: 1e-6 } }, { numHeads: 4, kvNumHeads: 2 });
  g.output(r.output, 'out');
  const node = L.toModelProto(g).graph.node.find((n) => n.opType === 'GroupQueryAttention')!;
  expect(node.input).toHaveLength(16);
  expect(node.input.slice(9, 14)).toEqual(['', '', '', '', '']);
  expect(node.input.slice(14)).toEqual(['q_norm', 'k_norm']);
  const eps = (node.attribute ?? []).find((a) => a.name === 'qk_norm_epsilon');
  expect(eps?.f).toBeCloseTo(1e-6, 12);
});

test('without the norm the node keeps its 9 inputs and no epsilon', () => {
  const g = new L.Graph();
  const r = L.groupQueryAttention({ ...attentionInputs(g), rotary: rotary(g) }, { numHeads: 4, kvNumHeads: 2 });
  g.output(r.output, 'out');
  const node = L.toModelProto(g).graph.node.find((n) => n.opType === 'GroupQueryAttention')!;
  expect(node.input).toHaveLength(9);
  expect((node.attribute ?? []).map((a) => a.name)).not.toContain('qk_norm_epsilon');
});

test('refuses the norm without the in-kernel rotary, and weights of the wrong shape or dtype', () => {
  const g = new L.Graph();
  const x = attentionInputs(g);
  const cs = rotary(g);
  const w = g.input('w', 'bfloat16', [16]);
  const wide = g.input('wide', 'bfloat16', [32]);
  const f32 = g.input('f32', 'float32', [16]);
  const heads = { numHeads: 4, kvNumHeads: 2 };
  expect(() => L.groupQueryAttention({ ...x, qkNorm: { q: w, k: w, epsilon: 1e-6 } }, heads)).toThrow(/needs the in-kernel rotary/);
  expect(() => L.groupQueryAttention({ ...x, rotary: cs, qkNorm: { q: w, k: wide, epsilon: 1e-6 } }, heads)).toThrow(/bfloat16 \[16\]/);
  expect(() => L.groupQueryAttention({ ...x, rotary: cs, qkNorm: { q: f32, k: w, epsilon: 1e-6 } }, heads)).toThrow(/bfloat16 \[16\]/);
});

test('a packed query (key and value omitted): inputs 1 and 2 left empty, the output H·hd wide; refused when only one of key and value is given or the packed width is not (H + 2·KV)·hd', () => {
  const g = new L.Graph();
  const x = attentionInputs(g);
  const packed = g.input('qkv', 'bfloat16', ['B', 1, (4 + 2 * 2) * 16]);
  const r = L.groupQueryAttention({ query: packed, seqlensK: x.seqlensK, totalSequenceLength: x.totalSequenceLength, rotary: rotary(g) }, { numHeads: 4, kvNumHeads: 2 });
  expect(r.output.shape).toEqual(['B', 1, 4 * 16]);
  expect(r.presentKey.shape).toEqual(['B', 2, 1, 16]);
  g.output(r.output, 'out');
  const node = L.toModelProto(g).graph.node.find((n) => n.opType === 'GroupQueryAttention')!;
  expect(node.input.slice(0, 3)).toEqual(['qkv', '', '']);
  const heads = { numHeads: 4, kvNumHeads: 2 };
  expect(() => L.groupQueryAttention({ ...x, value: undefined }, heads)).toThrow(/both be given, or both omitted/);
  const odd = g.input('odd', 'bfloat16', ['B', 1, 100]);
  expect(() => L.groupQueryAttention({ query: odd, seqlensK: x.seqlensK, totalSequenceLength: x.totalSequenceLength }, heads)).toThrow(/packed query.*multiple of 8/);
});
