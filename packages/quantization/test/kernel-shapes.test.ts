/**
 * `QuantizedModel.kernelShapes`: the distinct INT4 weight shapes the `quantizedWeights: 'kernel'`
 * graphs send through Lathe's W4A16 op (what `lathe generate` tunes launch plans for at load): the
 * fused q/k/v and gate/up as concatenated, o and down as they are, an INT4 head's, each shape once.
 */
import { CausalLM } from '@lathe/models';
import { QuantizedModel } from '@lathe/quantization';
import { tinyQwen3 } from './data';

const model = CausalLM.random(tinyQwen3, { seed: 2, std: 0.05 });
const { config } = model;
const weights = model.float32Weights();

test('INT4: fused q/k/v and gate/up, o and down — once each over the layers; an INT4 head adds its shape', () => {
  const [H, I, q, kv] = [config.hiddenSize, config.intermediateSize, config.numHeads * config.headDim, config.numKvHeads * config.headDim];
  const int4 = QuantizedModel.quantize(config, weights, { format: 'int4', blockSize: 32 });
  expect(int4.kernelShapes()).toEqual([
    { name: 'self_attn.qkv_proj', N: q + 2 * kv, K: H, blockSize: 32 },
    { name: 'mlp.gate_up_proj', N: 2 * I, K: H, blockSize: 32 },
    { name: 'self_attn.o_proj', N: H, K: q, blockSize: 32 },
    { name: 'mlp.down_proj', N: H, K: I, blockSize: 32 },
  ]);
  const head = QuantizedModel.quantize(config, weights, { format: 'int4', lmHead: { format: 'int4', blockSize: 64 } });
  expect(head.kernelShapes().at(-1)).toEqual({ name: 'model.embed_tokens', N: config.vocabSize, K: H, blockSize: 64 });
});

test('INT8 and NF4 have no shapes the kernel takes; INT4 layers outside a complete group keep their own', () => {
  expect(QuantizedModel.quantize(config, weights, { format: 'int8' }).kernelShapes()).toEqual([]);
  expect(QuantizedModel.quantize(config, weights, { format: 'nf4' }).kernelShapes()).toEqual([]);
  // only q and v quantized: no complete q/k/v group, so each is its own shape
  const some = QuantizedModel.quantize(config, weights, { format: 'int4', include: (n) => /(q|v)_proj\.weight$/.test(n) });
  const [H, q, kv] = [config.hiddenSize, config.numHeads * config.headDim, config.numKvHeads * config.headDim];
  expect(some.kernelShapes()).toEqual([
    { name: 'self_attn.q_proj', N: q, K: H, blockSize: 64 },
    { name: 'self_attn.v_proj', N: kv, K: H, blockSize: 64 },
  ]);
});
