/** Config and weight files: round trips and clear errors on bad input. */
import { mkdtempSync, readFileSync, truncateSync, writeFileSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import {
  parseConfig,
  readConfig,
  readTensorBytes,
  readWeightIndex,
  saveHfModel,
  paramSpecs,
  ModelConfigError,
  SafetensorsError,
  weightInitializers,
} from '@lathe/models';
import { Graph } from '@lathe/onnx';
import { tinyModel, tinyQwen3, tinyQwen2, tinyLlama } from './tiny';

test('config.json of each architecture parses; defaults follow transformers', () => {
  const q3 = parseConfig(tinyQwen3);
  expect(q3).toMatchObject({ architecture: 'Qwen3ForCausalLM', qkNorm: true, attentionBias: false, headDim: 8, numKvHeads: 2, tieWordEmbeddings: true });
  expect(parseConfig(tinyQwen2)).toMatchObject({ attentionBias: true, outputBias: false, qkNorm: false });
  expect(parseConfig(tinyLlama).ropeScaling).toEqual({ type: 'llama3', factor: 8, lowFreqFactor: 1, highFreqFactor: 4, originalMaxPositionEmbeddings: 32 });
  // transformers ≥ 5 spells RoPE settings as rope_parameters.
  const v5 = parseConfig({ ...tinyQwen3, rope_theta: undefined, rope_parameters: { rope_type: 'default', rope_theta: 1e6 } });
  expect(v5.ropeTheta).toBe(1e6);
  const v5llama = parseConfig({ ...tinyQwen3, rope_parameters: { rope_type: 'llama3', rope_theta: 5e5, factor: 8, low_freq_factor: 1, high_freq_factor: 4, original_max_position_embeddings: 32 } });
  expect(v5llama).toMatchObject({ ropeTheta: 5e5, ropeScaling: { type: 'llama3', factor: 8 } });
  const { head_dim: _hd, ...noHeadDim } = tinyQwen2;
  expect(parseConfig(noHeadDim).headDim).toBe(32 / 4);
});

test('unknown architectures and missing fields name the file and field', () => {
  expect(() => parseConfig({ ...tinyQwen3, architectures: ['GPT2LMHeadModel'] }, 'x/config.json')).toThrow(
    "x/config.json: architecture 'GPT2LMHeadModel' is not supported",
  );
  const { hidden_size: _h, ...missing } = tinyQwen3;
  expect(() => parseConfig(missing, 'x/config.json')).toThrow("x/config.json: missing field 'hidden_size'");
  expect(() => parseConfig({ ...tinyQwen3, num_key_value_heads: 3 })).toThrow(ModelConfigError);
  expect(() => readConfig('/nonexistent/model')).toThrow('/nonexistent/model/config.json: not found');
});

test('a saved model reads back byte-identical with an HF config', () => {
  const { dir, config } = tinyModel(tinyQwen2);
  const index = readWeightIndex(dir);
  const tensors = paramSpecs(config).map((s) => ({ name: s.name, dtype: index.get(s.name)!.dtype, shape: s.shape, data: readTensorBytes(index.get(s.name)!) }));
  const out = mkdtempSync(join(tmpdir(), 'lathe-save-'));
  writeFileSync(join(dir, 'tokenizer.json'), '{"fake": true}');
  saveHfModel(out, config, tensors, { tokenizerFrom: dir });
  const back = readWeightIndex(out);
  for (const t of tensors) expect(Buffer.compare(Buffer.from(readTensorBytes(back.get(t.name)!)), Buffer.from(t.data))).toBe(0);
  expect(readConfig(out).config).toEqual({ ...config, torchDtype: 'float32' });
  expect(JSON.parse(readFileSync(join(out, 'config.json'), 'utf8'))).toMatchObject({ model_type: 'qwen2', architectures: ['Qwen2ForCausalLM'] });
  expect(readFileSync(join(out, 'tokenizer.json'), 'utf8')).toBe('{"fake": true}');
});

test('truncated or corrupt safetensors files are clear errors naming file and tensor', () => {
  const { dir } = tinyModel(tinyQwen3);
  const file = join(dir, 'model.safetensors');
  truncateSync(file, statSync(file).size - 100);
  expect(() => readWeightIndex(dir)).toThrow(/model\.safetensors: tensor '.+' ends at byte \d+ but the file has \d+ bytes \(truncated\)/);
  writeFileSync(file, Buffer.from('not a safetensors file at all'));
  expect(() => readWeightIndex(dir)).toThrow(SafetensorsError);
  const empty = mkdtempSync(join(tmpdir(), 'lathe-empty-'));
  expect(() => readWeightIndex(empty)).toThrow('no model.safetensors or model.safetensors.index.json');
});

test('weights whose shapes disagree with the config are rejected naming the tensor', () => {
  const { dir } = tinyModel(tinyQwen3);
  const wrong = parseConfig({ ...tinyQwen3, intermediate_size: 40 });
  expect(() => weightInitializers(new Graph(), wrong, readWeightIndex(dir), 'float32', (f) => f)).toThrow(/model\.safetensors: tensor 'model\.layers\.0\.mlp\.gate_proj\.weight' has shape \[48,32\] but the config implies \[40,32\]/);
});
