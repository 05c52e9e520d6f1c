/**
 * The KV engine with Lathe's decode-attention op in its decode step (the op's CPU rule: QK-norm and
 * RoPE on the host, the new key/value appended into the bound cache in place, attention over each
 * row's length) against the same engine on ONNX Runtime's GroupQueryAttention (CPU, float32): the
 * same greedy tokens and log-probs; with an e4m3 cache (prefill's presents quantized by the quantize
 * op, the step reading bytes and scales) log-probs within e4m3's error and not equal (the op is in the path);
 * at groups that are not a power of two (G 5: 10 query heads over 2 KV heads; G 7: 7 over 1) the same.
 */
import { CausalLM, type HfConfig } from '@lathe/models';
import { Device } from '@lathe/runtime';
import { KvCacheGenerator, type Completion, type KvDecodeAttention } from '@lathe/rollout';
import { decodeAttentionOps, decodeChunks } from '@lathe/kernels';
import { tinyModel, tinyQwen3 } from '../../rollout/test/helpers';

// GroupQueryAttention's rotary needs head_dim ≥ 16; 4 query heads over 2 KV heads.
const wideQwen3: HfConfig = { ...tinyQwen3, hidden_size: 64, head_dim: 16 };
const { dir, config } = tinyModel(wideQwen3, 5);
const prompts = [[5, 9, 11, 3], [7, 2], [30, 31, 32, 33, 34, 35], [1], [8, 8, 8]];
const device = Device.cpu();
const model = CausalLM.fromPretrainedSync(dir, { device });
afterAll(() => model.dispose());

/** The ops with a count of the attention nodes built. */
function counted(cache: 'native' | 'float8e4m3'): { ops: KvDecodeAttention & { dispose(): void; stats: { cacheCopies: number; computes: number } }; nodes: () => number } {
  const ops = decodeAttentionOps('cpu', undefined, { cache, qkNormEpsilon: config.rmsNormEps });
  let n = 0;
  return {
    ops: { ...ops, attend: (x, heads) => (n++, ops.attend(x, heads)) },
    nodes: () => n,
  };
}

async function run(opts: { decodeAttention?: KvDecodeAttention; kvCacheDtype?: 'model' | 'float8e4m3' }): Promise<Completion[]> {
  const kv = KvCacheGenerator.create(model, { temperature: 0, rows: 2, maxLength: 20, ...opts });
  try {
    return await kv.generate(prompts, { maxNewTokens: 10 });
  } finally {
    kv.dispose();
  }
}

test('greedy: the op gives GroupQueryAttention’s tokens and log-probs over several runs (spare rows, ragged prompts)', async () => {
  const want = await run({});
  const { ops, nodes } = counted('native');
  const got = await run({ decodeAttention: ops });
  expect(nodes()).toBe(config.numLayers);
  // every decode step ran the op's host rule in each layer, on the cache bound in place (no copies)
  expect(ops.stats.computes).toBe(3 * 9 * config.numLayers);
  expect(ops.stats.cacheCopies).toBe(0);
  expect(got.map((c) => c.tokens)).toEqual(want.map((c) => c.tokens));
  got.forEach((c, k) => {
    c.logprobs.forEach((x, t) => expect(Math.abs(x - want[k].logprobs[t])).toBeLessThan(2e-4));
    c.rawLogprobs.forEach((x, t) => expect(Math.abs(x - want[k].rawLogprobs[t])).toBeLessThan(2e-4));
  });
  ops.dispose();
}, 120_000);

test('an e4m3 cache: the quantized prefill and step stay within e4m3’s error of the float32 cache', async () => {
  const want = await run({});
  const { ops, nodes } = counted('float8e4m3');
  const got = await run({ decodeAttention: ops, kvCacheDtype: 'float8e4m3' });
  expect(nodes()).toBe(config.numLayers);
  let maxDiff = 0;
  got.forEach((c, k) => {
    // step 0 comes from the prefill (no cache read): exact
    expect(c.tokens[0]).toBe(want[k].tokens[0]);
    expect(Math.abs(c.rawLogprobs[0] - want[k].rawLogprobs[0])).toBeLessThan(1e-5);
    // the first cache-reading step: the same greedy token, its log-prob close
    expect(c.tokens[1]).toBe(want[k].tokens[1]);
    maxDiff = Math.max(maxDiff, Math.abs(c.rawLogprobs[1] - want[k].rawLogprobs[1]));
  });
  expect(maxDiff).toBeGreaterThan(0);
  expect(maxDiff).toBeLessThan(0.1);
  ops.dispose();
}, 120_000);

test('the scratch is sized by the split chunk of the cache kind and group (native 256 up to G 4, 128 past; e4m3 512 and 256)', () => {
  expect([decodeChunks(300, 'native', 8), decodeChunks(128, 'native', 8), decodeChunks(129, 'native', 8), decodeChunks(300, 'native', 2), decodeChunks(256, 'native', 2), decodeChunks(257, 'native', 2)]).toEqual([3, 1, 2, 2, 1, 2]);
  expect([decodeChunks(300, 'float8e4m3', 5), decodeChunks(256, 'float8e4m3', 5), decodeChunks(257, 'float8e4m3', 5), decodeChunks(512, 'float8e4m3', 2), decodeChunks(513, 'float8e4m3', 4)]).toEqual([2, 1, 2, 1, 2]);
});

test('bad options are named', () => {
  expect(() => KvCacheGenerator.create(model, { temperature: 0, rows: 2, maxLength: 20, kvCacheDtype: 'float8e4m3' })).toThrow(/kvCacheDtype 'float8e4m3' needs decodeAttention/);
  const { ops } = counted('float8e4m3');
  expect(() => KvCacheGenerator.create(model, { temperature: 0, rows: 2, maxLength: 20, decodeAttention: ops })).toThrow(/set kvCacheDtype 'float8e4m3'/);
  const wrongEps = decodeAttentionOps('cpu', undefined, { qkNormEpsilon: 1e-3 });
  expect(() => KvCacheGenerator.create(model, { temperature: 0, rows: 2, maxLength: 20, decodeAttention: wrongEps })).toThrow(/epsilon 0.001 is not the model's rms_norm_eps/);
  ops.dispose();
  wrongEps.dispose();
});

describe.each([
  [5, 10, 2],
  [7, 7, 1],
])('G %i (%i query heads over %i KV heads)', (G, H, KV) => {
  const { dir: gDir } = tinyModel({ ...wideQwen3, hidden_size: 48, num_attention_heads: H, num_key_value_heads: KV }, 11 + G);
  const gModel = CausalLM.fromPretrainedSync(gDir, { device });
  afterAll(() => gModel.dispose());
  const gRun = async (opts: { decodeAttention?: KvDecodeAttention; kvCacheDtype?: 'model' | 'float8e4m3' }): Promise<Completion[]> => {
    const kv = KvCacheGenerator.create(gModel, { temperature: 0, rows: 2, maxLength: 16, ...opts });
    try {
      return await kv.generate(prompts.slice(0, 3), { maxNewTokens: 6 });
    } finally {
      kv.dispose();
    }
  };

  test('the op gives GroupQueryAttention’s tokens and log-probs; an e4m3 cache its first cache-reading token', async () => {
    expect(gModel.config.numHeads / gModel.config.numKvHeads).toBe(G);
    const want = await gRun({});
    const native = decodeAttentionOps('cpu', undefined, { qkNormEpsilon: gModel.config.rmsNormEps });
    const got = await gRun({ decodeAttention: native });
    expect(native.stats.computes).toBeGreaterThan(0);
    expect(got.map((c) => c.tokens)).toEqual(want.map((c) => c.tokens));
    got.forEach((c, k) => c.logprobs.forEach((x, t) => expect(Math.abs(x - want[k].logprobs[t])).toBeLessThan(2e-4)));
    const fp8 = decodeAttentionOps('cpu', undefined, { cache: 'float8e4m3', qkNormEpsilon: gModel.config.rmsNormEps });
    const q = await gRun({ decodeAttention: fp8, kvCacheDtype: 'float8e4m3' });
    // the prefill's token exact; the first cache-reading step's log-prob moved by e4m3's rounding only (the op-level bound is decode-check-cpu's check phase)
    let maxDiff = 0;
    q.forEach((c, k) => {
      expect(c.tokens[0]).toBe(want[k].tokens[0]);
      maxDiff = Math.max(maxDiff, Math.abs(c.rawLogprobs[1] - want[k].rawLogprobs[1]));
    });
    expect(maxDiff).toBeGreaterThan(0);
    expect(maxDiff).toBeLessThan(0.25);
    native.dispose();
    fp8.dispose();
  }, 120_000);
});
