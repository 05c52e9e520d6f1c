/**
 * Quantized layers in the decoder graphs (CPU, float32): a tiny Qwen3's logits through the
 * kernels equal the dequantized model's (the hook changes where W comes from, not the math), stay
 * within a stated KL of the original for each format, and the KV-cache generator runs a quantized
 * model to the same greedy tokens as its dequantized copy.
 */
import * as L from '@lathe/onnx';
import { CausalLM, decoder, lmLogits, paddedCausalMask, paramSpecs, positionsFromPadding, weightInputs, type DecoderConfig, type Weights } from '@lathe/models';
import { Device } from '@lathe/runtime';
import { KvCacheGenerator } from '@lathe/rollout';
import { addDistributionShift, pearson, QuantizedModel, SHIFT_IO, ShiftAccumulator, type QuantScheme } from '@lathe/quantization';
import { compile } from '../../../tools/testing/ort-cpu';
import { tinyQwen3 } from './data';

const hf = tinyQwen3;
// std 0.08: logits spread enough (entropy well under log V) for the KL to measure something.
const original = CausalLM.random(hf, { seed: 3, std: 0.08 });
const config: DecoderConfig = original.config;
const weights = original.float32Weights();

const rows = [
  [5, 9, 2, 7, 1, 3, 8, 40],
  [4, 6, 11, 60, 0, 0, 0, 0],
];
const lens = [8, 4];

/** Logits [B, T, V] of a graph built over `w`. */
async function logits(build: (g: L.Graph) => { w: Weights; feeds: Record<string, { data: Float32Array | Uint8Array; dims: number[] }> }): Promise<Float32Array> {
  const g = new L.Graph('logits');
  const ids = g.input('input_ids', 'int64', [2, 8]);
  const mask = g.input('attention_mask', 'int64', [2, 8]);
  const { w, feeds } = build(g);
  const h = decoder(config, w, { inputIds: ids, positionIds: positionsFromPadding(mask), attentionMask: paddedCausalMask(mask) }).hidden;
  g.output(lmLogits(config, w, h), 'logits');
  const out = await (await compile(g))({
    ...feeds,
    input_ids: { data: BigInt64Array.from(rows.flat().map(BigInt)), dims: [2, 8] },
    attention_mask: { data: BigInt64Array.from(rows.flatMap((r, b) => r.map((_, t) => BigInt(t < lens[b] ? 1 : 0)))), dims: [2, 8] },
  });
  return out.logits.data as Float32Array;
}

const paramShape = new Map(paramSpecs(config).map((s) => [s.name, s.shape] as const));
/** A graph over dense float32 weights fed by HF name. */
const dense = (ws: Map<string, Float32Array>) => (g: L.Graph) => ({
  w: weightInputs(g, config, 'float32', 'float32').weights,
  feeds: Object.fromEntries([...ws].map(([k, v]) => [k, { data: v, dims: paramShape.get(k)! }])),
});

/** Mean and max over real tokens of KL(p ‖ q) between next-token distributions. */
function kl(p: Float32Array, q: Float32Array): { mean: number; max: number } {
  const V = config.vocabSize;
  let sum = 0;
  let max = 0;
  let n = 0;
  for (let b = 0; b < 2; b++) {
    for (let t = 0; t < lens[b]; t++) {
      const o = (b * 8 + t) * V;
      const lp = logSoftmax(p.subarray(o, o + V));
      const lq = logSoftmax(q.subarray(o, o + V));
      let d = 0;
      for (let v = 0; v < V; v++) d += Math.exp(lp[v]) * (lp[v] - lq[v]);
      sum += d;
      max = Math.max(max, d);
      n++;
    }
  }
  return { mean: sum / n, max };
}
function logSoftmax(x: Float32Array): number[] {
  const m = Math.max(...x);
  const lse = m + Math.log(x.reduce((s, v) => s + Math.exp(v - m), 0));
  return Array.from(x, (v) => v - lse);
}

let reference: Float32Array;
beforeAll(async () => {
  reference = await logits(dense(weights));
});

// Stated bounds on mean KL(original ‖ quantized) in nats for this seeded model (next-token entropy
// 4.3 nats); measured: int8 4.4e-5, int4/32 6.6e-3, int4/64 + zp 1.2e-2, nf4 1.2e-2 (double quant 1.2e-2).
const schemes: [string, QuantScheme, number][] = [
  ['int8', { format: 'int8' }, 1e-4],
  ['int4 block 32', { format: 'int4', blockSize: 32 }, 1e-2],
  ['int4 block 64 + zero points', { format: 'int4', blockSize: 64, zeroPoints: true }, 2e-2],
  ['nf4', { format: 'nf4' }, 2e-2],
  ['nf4 + double quant', { format: 'nf4', doubleQuant: true }, 2e-2],
];

describe.each(schemes)('%s', (_name, scheme, bound) => {
  const q = QuantizedModel.quantize(config, weights, scheme);

  test('kernel logits = dequantized-weights logits; fallback too; KL to the original within the bound', async () => {
    const viaKernel = await logits((g) => ({ w: q.graphWeights(g, { dtype: 'float32', inline: true }).weights, feeds: {} }));
    const viaFallback = await logits((g) => ({ w: q.graphWeights(g, { dtype: 'float32', inline: true, mode: 'dequantize' }).weights, feeds: {} }));
    const viaDense = await logits(dense(q.dequantizedWeights()));
    let worst = 0;
    for (let i = 0; i < viaDense.length; i++) worst = Math.max(worst, Math.abs(viaKernel[i] - viaDense[i]), Math.abs(viaFallback[i] - viaDense[i]));
    expect(worst).toBeLessThan(1e-4);
    const d = kl(reference, viaKernel);
    expect(d.mean).toBeGreaterThan(0);
    expect(d.mean).toBeLessThan(bound);
    expect(d.max).toBeLessThan(10 * bound);
    expect(kl(reference, reference).mean).toBeLessThan(1e-9);
  });
});

test('bits per parameter and padded layers are reported', () => {
  const r = QuantizedModel.quantize(config, weights, { format: 'int4', blockSize: 64 }).report();
  // 2 layers × (q, k, v, o, gate, up, down) = 14 projections; down_proj has K = 96: padded to 128.
  expect(r.layers).toBe(14);
  expect(r.padded).toEqual(['model.layers.0.mlp.down_proj.weight', 'model.layers.1.mlp.down_proj.weight']);
  expect(r.bitsPerQuantizedWeight).toBeGreaterThan(4.5);
  expect(r.bitsPerParameter).toBeLessThan(16);
  expect(() => QuantizedModel.quantize(config, weights, { format: 'int3' as never })).toThrow(/unknown quantization format 'int3' \(int8, int4, nf4\)/);
});

test('KV-cache generator over a quantized model: same greedy tokens as its dequantized copy', async () => {
  const device = Device.cpu();
  const q = QuantizedModel.quantize(config, weights, { format: 'nf4', doubleQuant: true });
  const prompts = [[5, 9, 11, 3], [7, 2], [30, 31, 32]];
  const gen = KvCacheGenerator.create(device, config, undefined, { temperature: 0, rows: 4, maxLength: 24, graphWeights: (g) => q.graphWeights(g, { dtype: 'float32' }).weights });
  const tensors = q.deviceTensors(device, 'float32');
  gen.bindWeights(tensors);
  const got = await gen.generate(prompts, { maxNewTokens: 12 });
  const deq = q.toCausalLM({ device });
  const ref = KvCacheGenerator.create(deq, { temperature: 0, rows: 4, maxLength: 24 });
  const want = await ref.generate(prompts, { maxNewTokens: 12 });
  expect(got.map((c) => c.tokens)).toEqual(want.map((c) => c.tokens));
  got.forEach((c, k) => c.rawLogprobs.forEach((x, t) => expect(x).toBeCloseTo(want[k].rawLogprobs[t], 4)));
  gen.dispose();
  ref.dispose();
  deq.dispose();
  for (const t of tensors.values()) t.dispose();
});


test('addDistributionShift: per-token KL and target log-probs equal the ones computed here from both models’ logits', async () => {
  const q = QuantizedModel.quantize(config, weights, { format: 'nf4' });
  const g = new L.Graph('shift');
  const orig = QuantizedModel.fromParts(config, q.scheme, weights, new Map());
  addDistributionShift(g, config, orig.graphWeights(g, { dtype: 'float32', inline: true, prefix: 'o/' }).weights, q.graphWeights(g, { dtype: 'float32', inline: true, prefix: 'q/' }).weights);
  const targets = rows.map((r) => [...r.slice(1), 0]);
  const out = await (await compile(g))({
    [SHIFT_IO.inputIds]: { data: BigInt64Array.from(rows.flat().map(BigInt)), dims: [2, 8] },
    [SHIFT_IO.attentionMask]: { data: BigInt64Array.from(rows.flatMap((r, b) => r.map((_, t) => BigInt(t < lens[b] ? 1 : 0)))), dims: [2, 8] },
    [SHIFT_IO.targets]: { data: BigInt64Array.from(targets.flat().map(BigInt)), dims: [2, 8] },
  });
  const quantLogits = await logits((gg) => ({ w: q.graphWeights(gg, { dtype: 'float32', inline: true }).weights, feeds: {} }));
  const V = config.vocabSize;
  const acc = new ShiftAccumulator();
  const scored = new Uint8Array(16);
  let klSum = 0;
  let nll = 0;
  for (let b = 0; b < 2; b++) {
    for (let t = 0; t + 1 < lens[b]; t++) {
      const i = b * 8 + t;
      scored[i] = 1;
      const lp = logSoftmax(reference.subarray(i * V, (i + 1) * V));
      const lq = logSoftmax(quantLogits.subarray(i * V, (i + 1) * V));
      const d = lp.reduce((s, x, v) => s + Math.exp(x) * (x - lq[v]), 0);
      klSum += d;
      nll -= lq[targets[b][t]];
      expect(out[SHIFT_IO.kl].data[i]).toBeCloseTo(d, 5);
      expect(out[SHIFT_IO.logpOriginal].data[i]).toBeCloseTo(lp[targets[b][t]], 4);
      expect(out[SHIFT_IO.logpQuantized].data[i]).toBeCloseTo(lq[targets[b][t]], 4);
    }
  }
  acc.add(out[SHIFT_IO.kl].data as Float32Array, out[SHIFT_IO.logpOriginal].data as Float32Array, out[SHIFT_IO.logpQuantized].data as Float32Array, scored);
  const s = acc.summary();
  expect(s.tokens).toBe(7 + 3);
  expect(s.klMean).toBeCloseTo(klSum / 10, 5);
  expect(s.perplexityQuantized).toBeCloseTo(Math.exp(nll / 10), 2);
});

test('pearson: hand-computed values', () => {
  expect(pearson([1, 2, 3], [2, 4, 6])).toBeCloseTo(1, 12);
  expect(pearson([1, 2, 3], [3, 2, 1])).toBeCloseTo(-1, 12);
  // deviations (−1.5, −0.5, 0.5, 1.5) and (−1.5, 0.5, −0.5, 1.5): Σdxdy = 4, Σdx² = Σdy² = 5, r = 4 / 5
  expect(pearson([1, 2, 3, 4], [1, 3, 2, 4])).toBeCloseTo(0.8, 12);
});

test('a quantized LM head (an int8 copy of the tied embedding) is read by lmLogits: kernel = fallback, KL still small, the embedding lookup stays dense', async () => {
  const plain = QuantizedModel.quantize(config, weights, { format: 'nf4' });
  const q = QuantizedModel.quantize(config, weights, { format: 'nf4', lmHead: { format: 'int8' } });
  const viaKernel = await logits((g) => ({ w: q.graphWeights(g, { dtype: 'float32', inline: true }).weights, feeds: {} }));
  const viaFallback = await logits((g) => ({ w: q.graphWeights(g, { dtype: 'float32', inline: true, mode: 'dequantize' }).weights, feeds: {} }));
  const withoutHead = await logits((g) => ({ w: plain.graphWeights(g, { dtype: 'float32', inline: true }).weights, feeds: {} }));
  let worst = 0;
  let moved = 0;
  for (let i = 0; i < viaKernel.length; i++) {
    worst = Math.max(worst, Math.abs(viaKernel[i] - viaFallback[i]));
    moved = Math.max(moved, Math.abs(viaKernel[i] - withoutHead[i]));
  }
  expect(worst).toBeLessThan(1e-4);
  expect(moved).toBeGreaterThan(1e-5); // the head's int8 rounding shows in the logits
  expect(kl(reference, viaKernel).mean).toBeLessThan(2e-2);
  expect(q.report().lmHead).toEqual({ format: 'int8', bytes: 96 * 64 + 96 * 4 });
  expect(q.dequantizedWeights().get('model.embed_tokens.weight')).toBe(weights.get('model.embed_tokens.weight'));
});
