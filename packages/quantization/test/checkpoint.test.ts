/**
 * Quantized checkpoints: saved → reloaded gives the same quantized matrices bit for bit and the
 * same logits; `CausalLM.fromPretrained` reads the folder dequantized; a missing scale tensor, an
 * unknown quantization_config and a non-quantized folder are errors that name the tensor or file.
 */
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import * as L from '@lathe/onnx';
import { CausalLM, decoder, lmLogits, paddedCausalMask, positionsFromPadding, readWeightIndex, readTensorBytes, writeSafetensors, type HfConfig } from '@lathe/models';
import { loadQuantized, QuantizedModel, saveQuantized, type QuantScheme } from '@lathe/quantization';
import { compile } from '../../../tools/testing/ort-cpu';

const hf: HfConfig = {
  architectures: ['Qwen3ForCausalLM'],
  vocab_size: 64,
  hidden_size: 64,
  intermediate_size: 80,
  num_hidden_layers: 1,
  num_attention_heads: 4,
  num_key_value_heads: 2,
  head_dim: 16,
  rms_norm_eps: 1e-6,
  rope_theta: 10000,
  max_position_embeddings: 64,
  tie_word_embeddings: false,
};
/** Logits [1, 6, V] of a fixed prompt through the quantized kernels. */
async function logits(q: QuantizedModel): Promise<Float32Array> {
  const g = new L.Graph('logits');
  const ids = g.input('input_ids', 'int64', [1, 6]);
  const mask = g.input('attention_mask', 'int64', [1, 6]);
  const w = q.graphWeights(g, { dtype: 'float32', inline: true }).weights;
  g.output(lmLogits(q.config, w, decoder(q.config, w, { inputIds: ids, positionIds: positionsFromPadding(mask), attentionMask: paddedCausalMask(mask) }).hidden), 'logits');
  const out = await (await compile(g))({ input_ids: { data: BigInt64Array.from([3n, 9n, 27n, 1n, 60n, 5n]), dims: [1, 6] }, attention_mask: { data: new BigInt64Array(6).fill(1n), dims: [1, 6] } });
  return out.logits.data as Float32Array;
}

const model = CausalLM.random(hf, { seed: 4, std: 0.05 });
const weights = model.float32Weights();

describe.each([
  ['int8', { format: 'int8' }],
  ['int4 block 32 + zero points', { format: 'int4', blockSize: 32, zeroPoints: true }],
  ['int4 block 128', { format: 'int4', blockSize: 128 }],
  ['nf4', { format: 'nf4' }],
  ['nf4 + double quant', { format: 'nf4', doubleQuant: true }],
] as [string, QuantScheme][])('%s', (_name, scheme) => {
  const q = QuantizedModel.quantize(model.config, weights, scheme);
  const dir = mkdtempSync(join(tmpdir(), 'lathe-q-'));
  saveQuantized(dir, q, { denseDtype: 'float32' });

  test('reloads to the same matrices, dense weights and scheme; CausalLM.fromPretrained reads it dequantized', () => {
    const back = loadQuantized(dir);
    expect(back.scheme).toEqual(q.scheme);
    expect([...back.layers.keys()]).toEqual([...q.layers.keys()]);
    for (const [name, m] of q.layers) expect(back.layers.get(name)).toEqual(m);
    for (const [name, d] of q.dense) expect(back.dense.get(name)).toEqual(d);
    const lm = CausalLM.fromPretrainedSync(dir);
    const deq = q.dequantizedWeights();
    for (const [name, w] of lm.float32Weights()) expect(w).toEqual(deq.get(name));
    expect(lm.dir).toBe(dir);
    expect(back.report().bitsPerQuantizedWeight).toBe(q.report().bitsPerQuantizedWeight);
  });

  test('the reloaded model computes identical logits', async () => {
    const [a, b] = await Promise.all([logits(q), logits(loadQuantized(dir))]);
    expect(Array.from(b)).toEqual(Array.from(a));
  });
});

test('a quantized LM head is saved as a config entry and re-made on load: same matrix, same logits', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'lathe-q-'));
  const q = QuantizedModel.quantize(model.config, weights, { format: 'int4', lmHead: { format: 'int4', blockSize: 32 } });
  saveQuantized(dir, q, { denseDtype: 'float32' });
  const cfg = JSON.parse(readFileSync(join(dir, 'config.json'), 'utf8')) as { quantization_config: Record<string, unknown> };
  expect(cfg.quantization_config.lathe_lm_head).toEqual({ format: 'int4', block_size: 32, zero_points: false, double_quant: false });
  const back = loadQuantized(dir);
  expect(back.lmHead?.matrix).toEqual(q.lmHead?.matrix);
  const [a, b] = await Promise.all([logits(q), logits(back)]);
  expect(Array.from(b)).toEqual(Array.from(a));
});

test('the config names the format as bitsandbytes / lathe do; the NF4 quant state is its JSON', () => {
  const dir = mkdtempSync(join(tmpdir(), 'lathe-q-'));
  saveQuantized(dir, QuantizedModel.quantize(model.config, weights, { format: 'nf4', doubleQuant: true }), { rawConfig: { ...hf, pad_token_id: 3 } });
  const cfg = JSON.parse(readFileSync(join(dir, 'config.json'), 'utf8')) as Record<string, unknown>;
  expect(cfg.pad_token_id).toBe(3);
  expect(cfg.quantization_config).toMatchObject({ quant_method: 'bitsandbytes', load_in_4bit: true, bnb_4bit_quant_type: 'nf4', bnb_4bit_use_double_quant: true, llm_int8_skip_modules: ['lm_head'] });
  const idx = readWeightIndex(dir);
  const name = 'model.layers.0.mlp.down_proj.weight';
  expect(idx.get(name)).toMatchObject({ dtype: 'uint8', shape: [(64 * 80) / 2, 1] });
  expect(idx.get(`${name}.absmax`)).toMatchObject({ dtype: 'uint8', shape: [80] });
  expect(idx.get(`${name}.nested_absmax`)).toMatchObject({ dtype: 'float32', shape: [1] });
  const state = JSON.parse(Buffer.from(readTensorBytes(idx.get(`${name}.quant_state.bitsandbytes__nf4`)!)).toString('utf8')) as Record<string, unknown>;
  expect(state).toMatchObject({ quant_type: 'nf4', blocksize: 64, shape: [64, 80], nested_blocksize: 256, dtype: 'bfloat16' });
});

test('a missing scale tensor is named; a non-quantized folder and an unknown quantization_config are refused', () => {
  const dir = mkdtempSync(join(tmpdir(), 'lathe-q-'));
  saveQuantized(dir, QuantizedModel.quantize(model.config, weights, { format: 'int4' }), { denseDtype: 'float32' });
  // Rewrite the weights without one layer's scales.
  const idx = readWeightIndex(dir);
  const drop = 'model.layers.0.self_attn.k_proj.weight_scale';
  const kept = [...idx.values()].filter((e) => e.name !== drop).map((e) => ({ name: e.name, dtype: e.dtype, shape: e.shape, data: new Uint8Array(readTensorBytes(e)) }));
  writeSafetensors(join(dir, 'model.safetensors'), kept);
  expect(() => loadQuantized(dir)).toThrow(`quantized layer 'model.layers.0.self_attn.k_proj.weight' (int4) is missing tensor '${drop}'`);
  expect(() => CausalLM.fromPretrainedSync(dir)).toThrow(drop);

  const plain = mkdtempSync(join(tmpdir(), 'lathe-plain-'));
  model.save(plain);
  expect(() => loadQuantized(plain)).toThrow(/not a quantized checkpoint \(no quantization_config\)/);

  const cfgPath = join(dir, 'config.json');
  const cfg = JSON.parse(readFileSync(cfgPath, 'utf8')) as Record<string, unknown>;
  writeFileSync(cfgPath, JSON.stringify({ ...cfg, quantization_config: { quant_method: 'gptq', bits: 4 } }));
  expect(() => loadQuantized(dir)).toThrow(/quantization_config \{"quant_method":"gptq","bits":4\} is not a format Lathe reads/);
});
