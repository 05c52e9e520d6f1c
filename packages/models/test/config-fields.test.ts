/**
 * config.json fields with behaviour behind them: Qwen3's `attention_bias` (q/k/v/o biases, as
 * transformers' Qwen3Attention reads it) and `max_position_embeddings` (checkSequenceLength).
 */
import * as L from '@lathe/onnx';
import {
  checkSequenceLength,
  configFile,
  decoder,
  lmLogits,
  ModelConfigError,
  paddedCausalMask,
  paramSpecs,
  parseConfig,
  positionsFromPadding,
  readConfig,
  toHfConfig,
  weightInputs,
} from '@lathe/models';
import { compile, rng, type HostTensor } from '../../../tools/testing/ort-cpu';
import { tinyModel, tinyQwen3, weightFeeds } from './tiny';

describe('Qwen3 with attention_bias: true', () => {
  const hf = { ...tinyQwen3, attention_bias: true };

  test('parses to biases on q, k, v and o, and writes the field back', () => {
    const c = parseConfig(hf);
    expect(c).toMatchObject({ attentionBias: true, outputBias: true, qkNorm: true, mlpBias: false });
    const biases = paramSpecs(c).filter((s) => s.kind === 'bias' && s.name.startsWith('model.layers.0.'));
    expect(biases.map((s) => [s.name.split('.').slice(-2).join('.'), s.shape])).toEqual([
      ['q_proj.bias', [32]],
      ['k_proj.bias', [16]],
      ['v_proj.bias', [16]],
      ['o_proj.bias', [32]],
    ]);
    expect(toHfConfig(c).attention_bias).toBe(true);
    expect(parseConfig(toHfConfig(c))).toEqual({ ...c, torchDtype: 'float32' });
    expect(parseConfig(tinyQwen3)).toMatchObject({ attentionBias: false, outputBias: false });
  });

  test('the biases take part: a v bias equals the o bias W_o·v it induces, and a q bias changes the logits', async () => {
    // Attention weights of a query sum to 1, so adding b to every value adds b to each head's
    // output; o_proj then maps it to W_o·b. Hence (v bias b, o bias 0) ≡ (v bias 0, o bias W_o·b),
    // where head h reads KV head ⌊h / (H/KV)⌋'s slice of b.
    const { dir, config } = tinyModel(hf, 12);
    const g = new L.Graph('bias');
    const ids = g.input('input_ids', 'int64', ['B', 'T']);
    const mask = g.input('attention_mask', 'int64', ['B', 'T']);
    const { weights } = weightInputs(g, config, 'float32', 'float32');
    const { hidden } = decoder(config, weights, { inputIds: ids, positionIds: positionsFromPadding(mask), attentionMask: paddedCausalMask(mask) });
    g.output(lmLogits(config, weights, hidden), 'logits');
    const run = await compile(g);
    const base = weightFeeds(dir, config, 'float32');
    const { numHeads: H, numKvHeads: KV, headDim: hd, hiddenSize: D } = config;
    const next = rng(3);
    const feedsA: Record<string, HostTensor> = { ...base };
    const feedsB: Record<string, HostTensor> = { ...base };
    for (let l = 0; l < config.numLayers; l++) {
      const a = `model.layers.${l}.self_attn`;
      const b = Float32Array.from({ length: KV * hd }, () => next() - 0.5);
      const Wo = base[`${a}.o_proj.weight`].data as Float32Array; // [D, H·hd]
      const induced = new Float64Array(D); // summed in float64, fed as float32
      for (let o = 0; o < D; o++) for (let h = 0; h < H; h++) for (let e = 0; e < hd; e++) induced[o] += Wo[o * H * hd + h * hd + e] * b[Math.floor(h / (H / KV)) * hd + e];
      feedsA[`${a}.v_proj.bias`] = { data: b, dims: [KV * hd] };
      feedsA[`${a}.o_proj.bias`] = { data: new Float32Array(D), dims: [D] };
      feedsB[`${a}.v_proj.bias`] = { data: new Float32Array(KV * hd), dims: [KV * hd] };
      feedsB[`${a}.o_proj.bias`] = { data: Float32Array.from(induced), dims: [D] };
    }
    // float32 (ORT's CPU fusions of SiLU take no float64); no padding: a fully masked query row would have no weights summing to 1.
    const batch = { input_ids: { data: BigInt64Array.from([3n, 14n, 15n, 9n, 2n, 6n]), dims: [1, 6] }, attention_mask: { data: BigInt64Array.from([1n, 1n, 1n, 1n, 1n, 1n]), dims: [1, 6] } };
    const la = Array.from((await run({ ...feedsA, ...batch })).logits.data as Float32Array);
    const lb = Array.from((await run({ ...feedsB, ...batch })).logits.data as Float32Array);
    const lbase = Array.from((await run({ ...base, ...batch })).logits.data as Float32Array);
    const diff = (x: number[], y: number[]) => Math.max(...x.map((v, i) => Math.abs(v - y[i])));
    expect(diff(la, lb)).toBeLessThan(2e-5);
    expect(diff(la, lbase)).toBeGreaterThan(1e-3); // the v bias did change the model
    const q = 'model.layers.0.self_attn.q_proj.bias';
    const shiftedQ = { ...base, [q]: { data: (base[q].data as Float32Array).map((v) => v + 0.5), dims: base[q].dims } };
    expect(diff(Array.from((await run({ ...shiftedQ, ...batch })).logits.data as Float32Array), lbase)).toBeGreaterThan(1e-4);
  });
});

describe('checkSequenceLength (max_position_embeddings)', () => {
  test('accepts up to max_position_embeddings and names the config file and field past it', () => {
    const { dir } = tinyModel(tinyQwen3); // max_position_embeddings 128
    const { config } = readConfig(dir);
    expect(configFile(config)).toBe(`${dir}/config.json`);
    expect(() => checkSequenceLength(config, 128, 'prompt 0')).not.toThrow();
    expect(() => checkSequenceLength(config, 0, 'prompt 0')).not.toThrow();
    expect(() => checkSequenceLength(config, 129, 'prompt 2')).toThrow(ModelConfigError);
    expect(() => checkSequenceLength(config, 129, 'prompt 2')).toThrow(`prompt 2: 129 positions exceed max_position_embeddings = 128 (${dir}/config.json)`);
  });

  test('a config not read from a file (or a copy of one) still names the field', () => {
    const parsed = parseConfig(tinyQwen3);
    expect(configFile(parsed)).toBeUndefined();
    expect(() => checkSequenceLength(parsed, 200, 'batch row 1')).toThrow('batch row 1: 200 positions exceed max_position_embeddings = 128 (config.json)');
    const { dir } = tinyModel(tinyQwen3);
    expect(configFile({ ...readConfig(dir).config })).toBeUndefined();
    expect(() => checkSequenceLength(parsed, 3.5, 'x')).toThrow('x: sequence length 3.5 is not a non-negative integer');
  });
});
