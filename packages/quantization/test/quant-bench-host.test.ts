/**
 * quant-bench's host-side helpers (tools/bench/quantization): the threaded random model equals
 * `CausalLM.random`'s values and `QuantizedModel.quantize`'s matrices bit for bit (run inline here:
 * one job at a time, the same code the worker threads run), and a decode step's byte accounting.
 */
import { CausalLM, MODEL_PRESETS, paramSpecs, parseConfig, seededRandom, type HfConfig } from '@lathe/models';
import { QuantizedModel } from '@lathe/quantization';
import { toBfloat16Bits } from '@lathe/runtime';
import { mulberryStateAt, quantizeOnThreads, randomHostWeights, sampleTensor, streamOffsets } from '../../../tools/bench/quantization/host-model';
import { msAtPeak, stepCacheBytes, stepWeightBytes } from '../../../tools/bench/quantization/step-bytes';

// tiny-qwen3 with a small vocabulary: the embedding would be nearly all of its 9.8M parameters
const tiny = parseConfig({ ...MODEL_PRESETS['tiny-qwen3'].config, vocab_size: 512 } as HfConfig);
const same = (a: ArrayBufferView, b: ArrayBufferView) => Buffer.from(a.buffer, a.byteOffset, a.byteLength).equals(Buffer.from(b.buffer, b.byteOffset, b.byteLength));

test('mulberryStateAt skips the stream ahead: the next uniform is the one seededRandom gives after that many calls', () => {
  const u = seededRandom(7);
  const seen = Array.from({ length: 1000 }, () => u());
  for (const k of [0, 1, 2, 17, 999]) {
    let a = mulberryStateAt(7, k);
    a = (a + 0x6d2b79f5) >>> 0;
    let t = Math.imul(a ^ (a >>> 15), a | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    expect(((t ^ (t >>> 14)) >>> 0) / 4294967296).toBe(seen[k]);
  }
  // the state is 32 bits: 2^32 calls come back to the start, whatever the seed (offsets past 2^31 normals, as 4B and 8B reach)
  expect(mulberryStateAt(123, 2 ** 32)).toBe(123);
  expect(mulberryStateAt(123, 2 ** 33 + 5)).toBe(mulberryStateAt(123, 5));
});

test("randomHostWeights (inline) gives CausalLM.random's weights bit for bit, and their bfloat16 bits", async () => {
  const want = CausalLM.random(tiny, { seed: 3, std: 0.02 }).float32Weights();
  // chunks of 1000 elements: most tensors are several jobs, each writing its part of the shared arrays
  const got = await randomHostWeights(tiny, { seed: 3, std: 0.02, bits: 'bfloat16', threads: 1, chunk: 1000 });
  expect([...got.weights.keys()]).toEqual([...want.keys()]);
  for (const [name, w] of want) {
    expect(same(got.weights.get(name)!, w)).toBe(true);
    expect(same(got.bits!.tensors.get(name)!, toBfloat16Bits(w))).toBe(true);
  }
});

test('sampleTensor enters the stream at any offset: a tensor sampled at its offset alone equals the sequential one', () => {
  const specs = paramSpecs(tiny);
  const offsets = streamOffsets(specs);
  const want = CausalLM.random(tiny, { seed: 0 }).float32Weights();
  const last = specs.length - 1;
  const size = (i: number) => specs[i].shape.reduce((a, b) => a * b, 1);
  for (const i of [1, last - 1, last]) expect(same(sampleTensor(0, 0.02, specs[i].kind, offsets[i], new Float32Array(size(i))), want.get(specs[i].name)!)).toBe(true);
  // a chunk from the middle of the embedding: its elements from their own offset
  const embed = want.get(specs[0].name)!;
  expect(same(sampleTensor(0, 0.02, 'embedding', 1000, new Float32Array(500)), embed.subarray(1000, 1500))).toBe(true);
  expect(offsets[1]).toBe(specs[0].shape[0] * specs[0].shape[1]);
});

test("quantizeOnThreads (inline) gives QuantizedModel.quantize's matrices and scheme", async () => {
  const host = CausalLM.random(tiny, { seed: 1, std: 0.02 }).float32Weights();
  for (const scheme of [{ format: 'int4' as const, blockSize: 32 }, { format: 'int8' as const }, { format: 'nf4' as const, doubleQuant: true }]) {
    const want = QuantizedModel.quantize(tiny, host, scheme);
    const got = await quantizeOnThreads(tiny, host, scheme, { threads: 1 });
    expect(got.scheme).toEqual(want.scheme);
    expect([...got.layers.keys()]).toEqual([...want.layers.keys()]);
    for (const [name, m] of want.layers) expect(got.layers.get(name)).toEqual(m);
    expect([...got.dense.keys()].sort()).toEqual([...want.dense.keys()].sort());
    expect(got.report().bitsPerParameter).toBe(want.report().bitsPerParameter);
  }
});

test('stepWeightBytes: a tied embedding is the head and read whole; an untied one (or one with a quantized head copy) only its rows', () => {
  const q8 = parseConfig(MODEL_PRESETS['qwen3-8b'].config as HfConfig);
  const bf16 = (c: typeof q8) => paramSpecs(c).map((s) => [s.name, { byteLength: 2 * s.shape.reduce((a, b) => a * b, 1), dims: s.shape }] as const);
  const all8 = 2 * 8_190_735_360;
  // Qwen3-8B: lm_head.weight is read whole, the embedding only for the 16 rows' tokens
  expect(stepWeightBytes(bf16(q8), { embedding: 'model.embed_tokens.weight', embeddingIsHead: false, rows: 16 })).toBe(all8 - 2 * 151936 * 4096 + 16 * 2 * 4096);
  const q06 = parseConfig(MODEL_PRESETS['qwen3-0.6b'].config as HfConfig);
  expect(stepWeightBytes(bf16(q06), { embedding: 'model.embed_tokens.weight', embeddingIsHead: true, rows: 16 })).toBe(2 * 596_049_920);
  expect(stepWeightBytes(bf16(q06), { embedding: 'model.embed_tokens.weight', embeddingIsHead: false, rows: 1 })).toBe(2 * 596_049_920 - 2 * 151936 * 1024 + 2 * 1024);
});

test('stepCacheBytes: rows × mean positions × layers × K and V × KV heads × head dim × bytes; msAtPeak in ms', () => {
  const q06 = parseConfig(MODEL_PRESETS['qwen3-0.6b'].config as HfConfig);
  // 127 steps after a 64-token prompt: positions 65..191, mean 128
  expect(stepCacheBytes(q06, { rows: 256, promptLen: 64, steps: 127, bytesPerElement: 2 })).toBe(256 * 128 * 28 * 2 * 8 * 128 * 2);
  expect(msAtPeak(4.8e9, 4.8)).toBeCloseTo(1, 12);
  expect(msAtPeak(1, undefined)).toBeUndefined();
});
