/**
 * The decoder's flash-attention path (GroupQueryAttention with its gradient rule) against the
 * composed MatMul/Softmax attention, in float32 on ORT's CPU provider: the same log-probs at every
 * token of a right-padded batch, and the same gradient for every weight. The rule itself is checked
 * against finite differences in @lathe/onnx's gradient tests.
 */
import * as L from '@lathe/onnx';
import { decoder, lmLogits, paddedCausalMask, paramSpecs, positionsFromPadding, rightPaddedAttention, targetLogprobs, weightInputs, type HfConfig } from '@lathe/models';
import { compile } from '../../../tools/testing/ort-cpu';
import { tinyLlama, tinyModel, tinyQwen2, tinyQwen3, weightFeeds } from './tiny';

const ids = [
  [3, 14, 15, 9, 2, 6],
  [7, 1, 8, 0, 0, 0], // right-padded: 3 tokens
  [5, 5, 4, 3, 2, 0],
];
const mask = ids.map((row, r) => row.map((_, t) => (r === 1 ? t < 3 : r === 2 ? t < 5 : true) ? 1 : 0));

describe.each([
  ['Qwen3 (QK-norm, GQA 4:2, tied)', tinyQwen3],
  ['Qwen2 (q/k/v biases)', tinyQwen2],
  ['Llama (llama3 RoPE scaling)', tinyLlama],
] as [string, HfConfig][])('%s', (_name, hf) => {
  // Static dims (the rule's causal bias from constants) and symbolic ones (read at run time).
  test.each([
    ['static [3, 6]', [3, 6]],
    ['symbolic [B, T]', ['B', 'T']],
  ] as [string, L.Dim[]][])('flash attention gives the composed attention’s log-probs and weight gradients, %s', async (_dims, dims) => {
    const { dir, config } = tinyModel(hf, 3);
    const g = new L.Graph('flash_vs_composed');
    const inputIds = g.input('input_ids', 'int64', dims);
    const padMask = g.input('attention_mask', 'int64', dims);
    const total = g.input('total_sequence_length', 'int32', []);
    const { weights, inputs } = weightInputs(g, config, 'float32', 'float32');
    const positionIds = positionsFromPadding(padMask);
    const logprobs = (flash: boolean) => {
      const { hidden } = decoder(config, weights, {
        inputIds,
        positionIds,
        attentionMask: paddedCausalMask(padMask),
        ...(flash ? { flashAttention: rightPaddedAttention(padMask, total) } : {}),
      });
      return targetLogprobs(lmLogits(config, weights, hidden), inputIds); // [B, T]
    };
    // A loss that weighs every token differently (and ignores padding).
    const tokenWeights = g.input('token_weights', 'float32', dims);
    const lossOf = (lp: L.Tensor) => L.reduceSum(L.mul(L.mul(lp, tokenWeights), L.cast(padMask, 'float32')));
    const paths = { composed: logprobs(false), flash: logprobs(true) };
    const names = paramSpecs(config).map((s) => s.name);
    for (const [path, lp] of Object.entries(paths)) {
      g.output(lp, `${path}/logp`);
      L.grad(lossOf(lp), names.map((n) => inputs.get(n)!)).forEach((d, i) => g.output(d, `${path}/d/${names[i]}`));
    }
    const run = await compile(g);
    const out = await run({
      ...weightFeeds(dir, config, 'float32'),
      input_ids: { data: BigInt64Array.from(ids.flat().map(BigInt)), dims: [3, 6] },
      attention_mask: { data: BigInt64Array.from(mask.flat().map(BigInt)), dims: [3, 6] },
      total_sequence_length: { data: Int32Array.of(6), dims: [] },
      token_weights: { data: Float32Array.from({ length: 18 }, (_, i) => Math.sin(i + 1)), dims: [3, 6] },
    });
    const values = (name: string) => Array.from(out[name].data as Float32Array);
    const composed = values('composed/logp');
    const flash = values('flash/logp');
    mask.flat().forEach((m, i) => {
      if (m) expect(Math.abs(flash[i] - composed[i])).toBeLessThan(2e-5);
    });
    for (const name of names) {
      const a = values(`composed/d/${name}`);
      const b = values(`flash/d/${name}`);
      const scale = Math.max(...a.map(Math.abs));
      expect(scale).toBeGreaterThan(0); // every weight gets a gradient
      const worst = Math.max(...a.map((x, i) => Math.abs(x - b[i])));
      expect(worst / scale).toBeLessThan(1e-4);
    }
  });
});

test('flash attention with a KV cache is refused', () => {
  const { config } = tinyModel(tinyQwen3, 3);
  const g = new L.Graph();
  const inputIds = g.input('input_ids', 'int64', [1, 2]);
  const padMask = g.input('attention_mask', 'int64', [1, 2]);
  const { weights } = weightInputs(g, config, 'float32', 'float32');
  const past = Array.from({ length: config.numLayers }, (_, i) => ({ key: g.input(`past_key_${i}`, 'float32', [1, 2, 1, 8]), value: g.input(`past_value_${i}`, 'float32', [1, 2, 1, 8]) }));
  expect(() =>
    decoder(config, weights, { inputIds, positionIds: positionsFromPadding(padMask), attentionMask: paddedCausalMask(padMask), past, flashAttention: rightPaddedAttention(padMask, g.constant(2, 'int32', [])) }),
  ).toThrow(/flashAttention takes no KV cache/);
});

test('the flash path runs the fused RMSNorm, RoPE and SiLU kernels, and its backward the inverse rotation', () => {
  const { config } = tinyModel(tinyQwen3, 3);
  const g = new L.Graph('flash_kernels');
  const inputIds = g.input('input_ids', 'int64', ['B', 'T']);
  const padMask = g.input('attention_mask', 'int64', ['B', 'T']);
  const total = g.input('total_sequence_length', 'int32', []);
  const { weights, inputs } = weightInputs(g, config, 'float32', 'float32');
  const { hidden } = decoder(config, weights, { inputIds, positionIds: positionsFromPadding(padMask), attentionMask: paddedCausalMask(padMask), flashAttention: rightPaddedAttention(padMask, total) });
  const loss = L.reduceSum(targetLogprobs(lmLogits(config, weights, hidden), inputIds));
  const forward = (op: string) => g.nodes.filter((n) => n.op.name === op && !n.name.startsWith('grad/')).length;
  const L_ = config.numLayers;
  // two norms per layer, QK-norm on q and k, the final norm; RoPE on q and k
  expect(forward('SimplifiedLayerNormalization')).toBe(4 * L_ + 1);
  expect(forward('RotaryEmbedding')).toBe(2 * L_);
  expect(forward('QuickGelu')).toBe(L_); // SiLU in one kernel
  expect(forward('Sigmoid')).toBe(0);
  expect(forward('Sin') + forward('Cos')).toBe(0); // no composed RoPE tables
  L.grad(loss, [...inputs.values()]);
  const backward = g.nodes.filter((n) => n.op.name === 'RotaryEmbedding' && n.name.startsWith('grad/'));
  expect(backward).toHaveLength(2 * L_);
  for (const n of backward) expect(n.inputs[3]!.node?.op.name).toBe('Neg'); // the sine negated
});
