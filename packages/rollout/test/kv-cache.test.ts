/**
 * The KV-cache generator (prefill + a loop of bound decode-step runs over GroupQueryAttention)
 * against the in-graph generator (attention composed from primitives, caches grown by Concat):
 * same tokens, same log-probs, same stop handling, on CPU in float32.
 */
import * as L from '@lathe/onnx';
import { Device, DeviceTensor } from '@lathe/runtime';
import { addKvDecodeStep, addKvPrefill, Generator, KvCacheGenerator, vocabChunkWidth, type Completion } from '@lathe/rollout';
import { CausalLM, weightInputs, type HfConfig } from '@lathe/models';
import { logitsRunner, logSoftmax, tinyModel, tinyQwen3 } from './helpers';

// GroupQueryAttention's rotary needs head_dim ≥ 16.
const wideQwen3: HfConfig = { ...tinyQwen3, hidden_size: 64, head_dim: 16 };
const { dir, config } = tinyModel(wideQwen3, 5);
const prompts = [[5, 9, 11, 3], [7, 2], [30, 31, 32, 33, 34, 35], [1], [8, 8, 8]];
const device = Device.cpu();
const model = CausalLM.fromPretrainedSync(dir, { device });
const files = CausalLM.fromPretrainedSync(dir);
afterAll(() => model.dispose());

function expectSame(a: Completion[], b: Completion[]): void {
  expect(a.map((c) => [c.promptIndex, c.sampleIndex, c.tokens, c.finishReason])).toEqual(b.map((c) => [c.promptIndex, c.sampleIndex, c.tokens, c.finishReason]));
  a.forEach((c, k) => {
    c.logprobs.forEach((x, t) => expect(x).toBeCloseTo(b[k].logprobs[t], 4));
    c.rawLogprobs.forEach((x, t) => expect(x).toBeCloseTo(b[k].rawLogprobs[t], 4));
  });
}

test('greedy: same tokens and log-probs as the in-graph generator, over several runs', async () => {
  const reference = await Generator.create(files, { temperature: 0 });
  const want = await reference.generate(prompts, { maxNewTokens: 10 });
  // 2 rows per run: three runs, the last with a spare row.
  const kv = KvCacheGenerator.create(model, { temperature: 0, rows: 2, maxLength: 20 });
  const progress: number[] = [];
  const got = await kv.generate(prompts, { maxNewTokens: 10, onProgress: (d) => progress.push(d) });
  expectSame(got, want);
  expect(got.every((c) => c.tokens.length === 10 && c.finishReason === 'length')).toBe(true);
  expect(progress).toEqual([2, 4, 5]);
  expect(kv.lastTimings.decodeSteps).toBe(3 * 9);
  kv.dispose();
  await reference.dispose();
});

test('sampling with groups and stop tokens: same samples as the in-graph generator', async () => {
  const opts = { temperature: 0.9, topK: 12, groupSize: 3 };
  const reference = await Generator.create(files, opts);
  // Stop tokens that do occur: two tokens the samples draw without a stop set.
  const free = await reference.generate(prompts, { maxNewTokens: 8, seed: 7 });
  const call = { maxNewTokens: 8, seed: 7, stopIds: [free[0].tokens[2], free[7].tokens[4]] };
  const want = await reference.generate(prompts, call);
  // Independent counts: a stop only ends a sample, so each sample is its stop-free draw up to and
  // including the first stop id (all 8 tokens when there is none).
  const stopAt = free.map((c) => c.tokens.findIndex((t) => call.stopIds.includes(t)));
  const lengths = stopAt.map((i) => (i < 0 ? 8 : i + 1));
  // Stops that land inside a block of 3 steps (steps 0–2, 3–5, 6–7), not only on its last step.
  expect(stopAt.filter((i) => i >= 0 && i % 3 !== 2).length).toBeGreaterThan(0);
  expect(want.map((c) => c.tokens.length)).toEqual(lengths);
  // Results read after every step, every 3 steps (stops seen late: rows run on, their extra
  // tokens dropped) and once per run (8 > the 7 decode steps).
  for (const readEvery of [1, 3, 8]) {
    const kv = KvCacheGenerator.create(model, { ...opts, rows: 6, maxLength: 16, readEvery });
    const got = await kv.generate(prompts, call);
    expectSame(got, want);
    expect(got.map((c) => c.tokens.length)).toEqual(lengths);
    expect(got.map((c) => c.tokens)).toEqual(free.map((c, k) => c.tokens.slice(0, lengths[k])));
    expect(got.map((c) => c.finishReason)).toEqual(stopAt.map((i) => (i < 0 ? 'length' : 'stop')));
    expect(got.some((c) => c.finishReason === 'stop')).toBe(true);
    for (const c of got) if (c.finishReason === 'stop') expect(call.stopIds).toContain(c.tokens.at(-1));
    // A rerun of the same engine (caches hold the last run's values) gives the same samples.
    expectSame(await kv.generate(prompts, call), want);
    kv.dispose();
  }
  await reference.dispose();
});

test('top-p alone: the engine sorts all its rows at once and draws the in-graph generator samples (one sort per row)', async () => {
  const opts = { temperature: 1.3, topP: 0.6, groupSize: 2 };
  const reference = await Generator.create(files, opts);
  const call = { maxNewTokens: 6, seed: 3 };
  const want = await reference.generate(prompts, call);
  const kv = KvCacheGenerator.create(model, { ...opts, rows: 6, maxLength: 16 });
  // The engine's rows are static, so its graphs sort the batch once (TopK over [1, rows · V]).
  const g = new L.Graph('decode');
  addKvDecodeStep(g, config, weightInputs(g, config, 'float32', 'float32').weights, 'float32', opts, { K: 1, rows: 6 });
  expect(g.nodes.filter((n) => n.op.name === 'TopK').map((n) => n.inputs[0]!.shape)).toEqual([[1, 6 * config.vocabSize]]);
  expectSame(await kv.generate(prompts, call), want);
  // The filter bites: some sampled token's log-prob under the filtered distribution differs from its raw one.
  expect(want.some((c) => c.logprobs.some((x, t) => Math.abs(x - c.rawLogprobs[t]) > 1e-3))).toBe(true);
  kv.dispose();
  await reference.dispose();
});

test('two-stage sampling over a chunked vocabulary (96 = 3 × 32): the in-graph samples, the teacher-forced log-probs, one download per readEvery steps', async () => {
  const chunked: HfConfig = { ...wideQwen3, vocab_size: 96 };
  expect(vocabChunkWidth(96)).toBe(32);
  const m = tinyModel(chunked, 6);
  const opts = { temperature: 1, groupSize: 2 };
  const call = { maxNewTokens: 6, seed: 5 };
  const reference = await Generator.create(await CausalLM.fromPretrained(m.dir), opts);
  const onDevice = await CausalLM.fromPretrained(m.dir, { device });
  const want = await reference.generate(prompts, call);
  // Every host read goes through one packed history of the last readEvery steps: 3 runs (2 + 2 + 1
  // prompts) of 6 steps each (the prefill's and 5 decode steps) read 6, 2 (after steps 3 and 5)
  // or 1 times each.
  let kv: KvCacheGenerator | undefined;
  // (The default on the CPU is 1: its runs are synchronous, so queuing gains nothing.)
  for (const [readEvery, reads] of [[undefined, 6], [1, 6], [4, 2], [8, 1]] as const) {
    kv?.dispose();
    kv = KvCacheGenerator.create(onDevice, { ...opts, rows: 4, maxLength: 16, readEvery });
    const downloads = jest.spyOn(DeviceTensor.prototype, 'download');
    expectSame(await kv.generate(prompts, call), want);
    expect(downloads).toHaveBeenCalledTimes(3 * reads);
    expect(kv.lastTimings.decodeSteps).toBe(3 * 5);
    downloads.mockRestore();
  }
  const got = await kv!.generate(prompts, call);
  expectSame(got, want);
  // Independent truth: log-softmax (float64) of the teacher-forced logits at each sampled token.
  const logits = await logitsRunner(m.dir, m.config);
  for (const c of got) {
    const p = prompts[c.promptIndex];
    const teacher = await logits([...p, ...c.tokens]);
    c.tokens.forEach((tok, t) => {
      const lp = logSoftmax(teacher[p.length - 1 + t])[tok];
      expect(Math.abs(c.rawLogprobs[t] - lp)).toBeLessThan(1e-4);
      expect(c.logprobs[t]).toBe(c.rawLogprobs[t]); // temperature 1, no filters: the same distribution
    });
  }
  kv!.dispose();
  onDevice.dispose();
  await reference.dispose();
});

test('bad input is rejected before any run', () => {
  const kv = KvCacheGenerator.create(model, { temperature: 0, rows: 2, maxLength: 8 });
  expect(() => KvCacheGenerator.create(model, { temperature: 0, rows: 3, maxLength: 8, groupSize: 2 })).toThrow(/multiple of groupSize/);
  expect(() => KvCacheGenerator.create(model, { temperature: 0, rows: 2, maxLength: 4096 })).toThrow(/max_position_embeddings/);
  expect(() => KvCacheGenerator.create(model, { topP: 1.5, rows: 2, maxLength: 8 })).toThrow(/top_p/);
  expect(() => KvCacheGenerator.create(model, { temperature: 0, rows: 2, maxLength: 8, readEvery: 0 })).toThrow(/readEvery must be a positive integer, got 0/);
  return Promise.all([
    expect(kv.generate([[1, 2, 3, 4, 5, 6]], { maxNewTokens: 4 })).rejects.toThrow(/prompt 0: 6 tokens \+ 4 new exceed the generator's maxLength of 8/),
    expect(kv.generate([[1], []], { maxNewTokens: 2 })).rejects.toThrow(/prompt 1 is empty/),
  ]).finally(() => kv.dispose());
});

test("the CUDA variant of the graphs: Qwen3's Q/K norm inside GroupQueryAttention, two norm nodes fewer per layer", () => {
  const build = (qkNormInKernel: boolean, add: typeof addKvDecodeStep) => {
    const g = new L.Graph();
    add(g, config, weightInputs(g, config, 'bfloat16', 'bfloat16').weights, 'bfloat16', { temperature: 0 }, { K: 4, qkNormInKernel });
    return L.toModelProto(g).graph.node;
  };
  for (const add of [addKvDecodeStep, addKvPrefill]) {
    const plain = build(false, add);
    const inKernel = build(true, add);
    const norms = (nodes: typeof plain) => nodes.filter((n) => n.opType === 'SimplifiedLayerNormalization').length;
    expect(norms(plain) - norms(inKernel)).toBe(2 * config.numLayers);
    for (const n of inKernel.filter((x) => x.opType === 'GroupQueryAttention')) {
      const layer = /layer(\d+)/.exec(n.name ?? '')![1];
      expect(n.input.slice(14)).toEqual([`model.layers.${layer}.self_attn.q_norm.weight`, `model.layers.${layer}.self_attn.k_norm.weight`]);
    }
  }
});

test('the decode kernel switch (ORT_ENABLE_XQA) is set only while the decode session compiles, and never over a user value', () => {
  const before = process.env.ORT_ENABLE_XQA;
  const fourKvHeads = CausalLM.fromPretrainedSync(tinyModel({ ...wideQwen3, num_key_value_heads: 4 }, 5).dir, { device });
  try {
    delete process.env.ORT_ENABLE_XQA;
    const seen: (string | undefined)[] = [];
    const compile = device.compile.bind(device);
    const spy = jest.spyOn(device, 'compile').mockImplementation((...args) => {
      seen.push(process.env.ORT_ENABLE_XQA);
      return compile(...args);
    });
    KvCacheGenerator.create(model, { temperature: 0, rows: 2, maxLength: 8 }).dispose();
    expect(seen).toEqual([undefined, '0']); // prefill, then the decode step (2 query heads per KV head)
    expect(process.env.ORT_ENABLE_XQA).toBeUndefined();
    seen.length = 0;
    process.env.ORT_ENABLE_XQA = '1';
    KvCacheGenerator.create(model, { temperature: 0, rows: 2, maxLength: 8 }).dispose();
    expect(seen).toEqual(['1', '1']);
    // Another group size (1 query head per KV head here) was not measured: ORT's default stays.
    seen.length = 0;
    delete process.env.ORT_ENABLE_XQA;
    KvCacheGenerator.create(fourKvHeads, { temperature: 0, rows: 2, maxLength: 8 }).dispose();
    expect(seen).toEqual([undefined, undefined]);
    spy.mockRestore();
  } finally {
    fourKvHeads.dispose();
    if (before === undefined) delete process.env.ORT_ENABLE_XQA;
    else process.env.ORT_ENABLE_XQA = before;
  }
});

test('the prefill attention switch (ORT_ENABLE_CUDNN_FLASH_ATTENTION=0) is set only while the prefill session compiles, and never over a user value', () => {
  const before = process.env.ORT_ENABLE_CUDNN_FLASH_ATTENTION;
  const compile = device.compile.bind(device);
  const seen: (string | undefined)[] = [];
  const spy = jest.spyOn(device, 'compile').mockImplementation((...args) => {
    seen.push(process.env.ORT_ENABLE_CUDNN_FLASH_ATTENTION);
    return compile(...args);
  });
  try {
    delete process.env.ORT_ENABLE_CUDNN_FLASH_ATTENTION;
    KvCacheGenerator.create(model, { temperature: 0, rows: 2, maxLength: 8 }).dispose();
    expect(seen).toEqual(['0', undefined]); // the prefill (a new [B, P] each run), then the decode step (fixed shapes) as ORT chooses
    expect(process.env.ORT_ENABLE_CUDNN_FLASH_ATTENTION).toBeUndefined();
    seen.length = 0;
    process.env.ORT_ENABLE_CUDNN_FLASH_ATTENTION = '1';
    KvCacheGenerator.create(model, { temperature: 0, rows: 2, maxLength: 8 }).dispose();
    expect(seen).toEqual(['1', '1']);
  } finally {
    spy.mockRestore();
    if (before === undefined) delete process.env.ORT_ENABLE_CUDNN_FLASH_ATTENTION;
    else process.env.ORT_ENABLE_CUDNN_FLASH_ATTENTION = before;
  }
});

test('both sessions compile with ORT memory-pattern planning off, unless the caller turns it on', () => {
  const compile = device.compile.bind(device);
  const patterns: (boolean | undefined)[] = [];
  const spy = jest.spyOn(device, 'compile').mockImplementation((graph, opts) => {
    patterns.push(opts?.memoryPattern);
    return compile(graph, opts);
  });
  try {
    KvCacheGenerator.create(model, { temperature: 0, rows: 2, maxLength: 8, session: { allowCpuFallback: false } }).dispose();
    expect(patterns).toEqual([false, false]);
    patterns.length = 0;
    KvCacheGenerator.create(model, { temperature: 0, rows: 2, maxLength: 8, session: { memoryPattern: true } }).dispose();
    expect(patterns).toEqual([true, true]);
  } finally {
    spy.mockRestore();
  }
});

test('a model on the host, or in another dtype than asked for, is refused by name', async () => {
  expect(() => KvCacheGenerator.create(files, { temperature: 0, rows: 2, maxLength: 8 })).toThrow(/the model's weights are on the host; load it with \{ device \}/);
  expect(() => KvCacheGenerator.create(model, { temperature: 0, rows: 2, maxLength: 8, dtype: 'bfloat16' })).toThrow(/dtype bfloat16 was asked for, but the model's weights are float32/);
});

test("bad options are refused before anything is allocated, and dispose frees the engine's buffers but not the model's weights", () => {
  const live = () => device.memory().tensors;
  const before = live();
  expect(() => KvCacheGenerator.create(model, { topP: 1.5, rows: 2, maxLength: 8 })).toThrow(/top_p/);
  expect(live()).toBe(before);
  const kv = KvCacheGenerator.create(model, { temperature: 0, rows: 2, maxLength: 8 });
  expect(live()).toBeGreaterThan(before);
  kv.dispose();
  expect(live()).toBe(before);
  expect(model.weights.get('model.norm.weight')!.download().data).toEqual(files.float32Weights().get('model.norm.weight'));
});
