/**
 * The KV engine with concatProjections and Lathe's decode-attention and SwiGLU ops (their CPU rules,
 * float32): the packed ops (`DecodeAttentionPacked`, `SwiGLUPacked`) read each layer's q/k/v and
 * gate/up MatMul outputs as they are, and generate the tokens of the same engine with the projections
 * apart (no concatProjections), log-probs within 1e-5 — native and e4m3 caches, Qwen3 and Qwen2 (its
 * concatenated q/k/v bias added before the packed op). The packed host rules on their own: q/k/v and
 * gate/up cut out of one buffer as the separate ops read them.
 */
import { CausalLM, type HfConfig } from '@lathe/models';
import { Device } from '@lathe/runtime';
import * as L from '@lathe/onnx';
import { KvCacheGenerator, type Completion, type KvDecodeAttention, type KvSwiglu } from '@lathe/rollout';
import { decodeAttentionOps, packedQkvArgs, swigluOps, swigluPackedReference, swigluReference, unpackQkv } from '@lathe/kernels';
import { tinyModel, tinyQwen3 } from '../../rollout/test/helpers';

// GroupQueryAttention's rotary needs head_dim ≥ 16; 4 query heads over 2 KV heads.
const wideQwen3: HfConfig = { ...tinyQwen3, hidden_size: 64, head_dim: 16 };
const wideQwen2: HfConfig = { ...wideQwen3, architectures: ['Qwen2ForCausalLM'], tie_word_embeddings: false };
const prompts = [[5, 9, 11, 3], [7, 2], [30, 31, 32, 33, 34, 35], [1], [8, 8, 8]];
const device = Device.cpu();

type Cache = 'native' | 'float8e4m3';

/** One generate call with fresh CPU ops; counts the packed nodes built. */
async function run(model: CausalLM, cache: Cache, concatProjections: boolean): Promise<{ out: Completion[]; packedAttention: number; packedSwiglu: number; computes: number }> {
  const da = decodeAttentionOps('cpu', undefined, { cache, qkNormEpsilon: model.config.rmsNormEps });
  const sw = swigluOps('cpu');
  let packedAttention = 0;
  let packedSwiglu = 0;
  const decodeAttention: KvDecodeAttention = { ...da, attendPacked: (x, heads) => (packedAttention++, da.attendPacked(x, heads)) };
  const swiglu: KvSwiglu = { ...sw, apply: Object.assign((g: L.Tensor, u: L.Tensor) => sw.apply(g, u), { packed: (gu: L.Tensor) => (packedSwiglu++, sw.packed(gu)) }) };
  const kv = KvCacheGenerator.create(model, { temperature: 0, rows: 2, maxLength: 20, decodeAttention, swiglu, concatProjections, ...(cache === 'float8e4m3' ? { kvCacheDtype: 'float8e4m3' as const } : {}) });
  try {
    const out = await kv.generate(prompts, { maxNewTokens: 10 });
    return { out, packedAttention, packedSwiglu, computes: da.stats.computes };
  } finally {
    kv.dispose();
    da.dispose();
    sw.dispose();
  }
}

describe.each([
  ['Qwen3', wideQwen3, 5],
  ['Qwen2 (q/k/v biases)', wideQwen2, 6],
] as const)('%s', (_name, hf, seed) => {
  const { dir, config } = tinyModel(hf, seed);
  const model = CausalLM.fromPretrainedSync(dir, { device });
  afterAll(() => model.dispose());

  test.each(['native', 'float8e4m3'] as const)('%s cache: the packed ops generate the split engine’s greedy tokens, log-probs within 1e-5 (CPU, float32)', async (cache) => {
    const apart = await run(model, cache, false);
    const packed = await run(model, cache, true);
    expect([apart.packedAttention, apart.packedSwiglu]).toEqual([0, 0]);
    // every layer's decode node reads the packed q/k/v, the prefill's and the decode step's MLPs the packed gate/up, and every step ran them
    expect([packed.packedAttention, packed.packedSwiglu]).toEqual([config.numLayers, 2 * config.numLayers]);
    expect(packed.computes).toBe(apart.computes);
    expect(packed.computes).toBeGreaterThan(0);
    expect(packed.out.map((c) => c.tokens)).toEqual(apart.out.map((c) => c.tokens));
    expect(packed.out.flatMap((c) => c.tokens)).toHaveLength(prompts.length * 10);
    packed.out.forEach((c, k) => {
      c.logprobs.forEach((x, t) => expect(Math.abs(x - apart.out[k].logprobs[t])).toBeLessThan(1e-5));
      c.rawLogprobs.forEach((x, t) => expect(Math.abs(x - apart.out[k].rawLogprobs[t])).toBeLessThan(1e-5));
    });
  }, 120_000);
});

test('the packed host rules: q, k, v and gate, up are the packed rows’ column ranges; the kernel arguments offset k and v by whole heads', () => {
  const shape = { rows: 3, numHeads: 4, numKvHeads: 2, headDim: 2 };
  const W = (4 + 2 * 2) * 2;
  const qkv = Float32Array.from({ length: 3 * W }, (_, i) => i);
  const { q, k, v } = unpackQkv(qkv, shape);
  expect(Array.from(q.subarray(8, 16))).toEqual([16, 17, 18, 19, 20, 21, 22, 23]);
  expect(Array.from(k.subarray(4, 8))).toEqual([24, 25, 26, 27]);
  expect(Array.from(v.subarray(4, 8))).toEqual([28, 29, 30, 31]);
  expect(() => unpackQkv(qkv.subarray(1), shape)).toThrow(/unpackQkv: 47 values for 3 rows/);
  expect(packedQkvArgs(1000n, { ...shape, dtype: 'bfloat16' })).toEqual({ q: 1000n, k: 1016n, v: 1024n, qStride: W, kvStride: W });
  const gu = Float32Array.from({ length: 2 * 2 * 3 }, (_, i) => Math.sin(i) * 3);
  const gate = [0, 1, 2, 6, 7, 8].map((i) => gu[i]);
  const up = [3, 4, 5, 9, 10, 11].map((i) => gu[i]);
  expect(Array.from(swigluPackedReference(gu, 3))).toEqual(Array.from(swigluReference(gate, up)));
});

test('SwiGLUPacked is inference only: its gradient names the op; a gu of odd or symbolic width is refused', () => {
  const ops = swigluOps('cpu');
  const g = new L.Graph();
  const gu = g.input('gu', 'float32', [2, 8]);
  const y = ops.packed(gu);
  expect(y.shape).toEqual([2, 4]);
  expect(() => L.grad(L.reduceSum(y), [gu])).toThrow(/SwiGLUPacked_float32 is inference only/);
  expect(() => ops.packed(g.input('odd', 'float32', [2, 7]))).toThrow(/swigluOps.packed: gu .* needs a static, even last dim/);
  expect(() => ops.packed(g.input('sym', 'float32', [2, 'W']))).toThrow(/static, even last dim/);
  ops.dispose();
});
