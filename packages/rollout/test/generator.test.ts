import { CausalLM } from '@lathe/models';
import { Generator, splitOnOutOfMemory } from '@lathe/rollout';
import { generationRunner, rowsOf, tinyModel } from './helpers';

const { dir, config } = tinyModel();
const model = CausalLM.fromPretrainedSync(dir);
const prompts = [[5, 9, 11, 3], [7, 2], [30, 31, 32, 33, 34, 35], [1], [8, 8, 8]];

test('generate() returns per-sample completions equal to the raw graph, cut at the stop token', async () => {
  const gen = await Generator.create(model, { temperature: 1, topK: 10, groupSize: 2 });
  const stopIds = [4, 17];
  const got = await gen.generate(prompts, { maxNewTokens: 6, seed: 3, stopIds });
  expect(got).toHaveLength(prompts.length * 2);
  const raw = await generationRunner(dir, config, { temperature: 1, topK: 10, groupSize: 2 }, 'raw.onnx');
  const out = await raw(prompts, { maxNew: 6, seed: 3, stop: stopIds });
  const tokens = rowsOf(out.tokens);
  got.forEach((c) => {
    const row = c.promptIndex * 2 + c.sampleIndex;
    const len = Number(out.lengths.data[row]);
    expect(c.tokens).toEqual(tokens[row].slice(0, len));
    expect(c.logprobs).toHaveLength(len);
    expect(c.finishReason).toBe(out.stopped.data[row] ? 'stop' : 'length');
    if (c.finishReason === 'stop') expect(stopIds).toContain(c.tokens.at(-1));
  });
  await gen.dispose();
});

test('splitting into length-sorted runs under a small memory budget changes nothing', async () => {
  const big = await Generator.create(model, { temperature: 0.8, groupSize: 3 });
  // KV bytes per token per prompt: 2 (K, V) · 2 layers · 2 heads · 8 dims · 4 bytes · 3 samples = 768.
  const small = await Generator.create(model, { temperature: 0.8, groupSize: 3, kvBudgetBytes: 768 * 2 * 12 });
  expect(big.schedule(prompts, 6)).toHaveLength(1);
  const runs = small.schedule(prompts, 6);
  expect(runs.length).toBeGreaterThan(2);
  expect(runs.flat().sort()).toEqual([0, 1, 2, 3, 4]);
  // Longest prompts first, so each run pads little.
  expect(runs[0][0]).toBe(2);
  const progress: number[] = [];
  const a = await big.generate(prompts, { maxNewTokens: 6, seed: 11 });
  const b = await small.generate(prompts, { maxNewTokens: 6, seed: 11, onProgress: (d) => progress.push(d) });
  // Same tokens; log-probs equal to float32 rounding (padding changes the reduction lengths).
  expect(b.map((c) => [c.promptIndex, c.sampleIndex, c.tokens, c.finishReason])).toEqual(a.map((c) => [c.promptIndex, c.sampleIndex, c.tokens, c.finishReason]));
  b.forEach((c, k) => c.rawLogprobs.forEach((x, t) => expect(x).toBeCloseTo(a[k].rawLogprobs[t], 5)));
  expect(progress.at(-1)).toBe(prompts.length);
  expect(() => small.schedule([new Array(40).fill(1)], 6)).toThrow(/exceeds kvBudgetBytes/);
});

test('sampleKeys: per-prompt sample counts in one run, one prefill per prompt, equal to one-sample-per-prompt generation with the same keys', async () => {
  const runs: [number, number][] = [];
  const gen = await Generator.create(model, { temperature: 1, topK: 10, beforeRun: (p, rows) => runs.push([p, rows]) });
  const counts = [3, 1, 2, 2, 1];
  const sampleKeys = counts.map((n, i) => Array.from({ length: n }, (_, j) => 1000 * i + 7 * j));
  const call = { maxNewTokens: 6, seed: 3, stopIds: [4, 17] };
  const got = await gen.generate(prompts, { ...call, sampleKeys });
  expect(runs).toEqual([[5, 9]]); // 5 prompts prefilled once, 9 sample rows
  expect(got.map((c) => [c.promptIndex, c.sampleIndex])).toEqual(counts.flatMap((n, i) => Array.from({ length: n }, (_, j) => [i, j])));
  const flat = await gen.generate(counts.flatMap((n, i) => new Array<number[]>(n).fill(prompts[i])), { ...call, promptKeys: sampleKeys.flat() });
  expect(runs[1]).toEqual([9, 9]);
  expect(got.map((c) => [c.tokens, c.finishReason])).toEqual(flat.map((c) => [c.tokens, c.finishReason]));
  got.forEach((c, k) => c.rawLogprobs.forEach((x, t) => expect(x).toBeCloseTo(flat[k].rawLogprobs[t], 5)));
  // The memory budget counts sample rows (256 bytes per row and position): with room for 8 rows of
  // 12 positions, these 9 rows take two runs; one row per prompt takes one.
  const tight = await Generator.create(model, { temperature: 1, kvBudgetBytes: 256 * 8 * 12 });
  expect(tight.schedule(prompts, 6, counts)).toHaveLength(2);
  expect(tight.schedule(prompts, 6)).toHaveLength(1);
  await expect(gen.generate(prompts, { ...call, sampleKeys: [[1]] })).rejects.toThrow(/sampleKeys: 1 lists for 5 prompts/);
  await Promise.all([gen.dispose(), tight.dispose()]);
});

test('bad prompts are rejected by index', async () => {
  const gen = await Generator.create(model, { temperature: 0 });
  await expect(gen.generate([[1, 2], []], { maxNewTokens: 2 })).rejects.toThrow(/prompt 1 is empty/);
  await expect(gen.generate([[1, 99]], { maxNewTokens: 2 })).rejects.toThrow(/prompt 0: token id 99 is outside the vocabulary/);
  await expect(gen.generate([[1]], { maxNewTokens: 500 })).rejects.toThrow(/prompt 0 \(1 tokens \+ 500 new\): 501 positions exceed max_position_embeddings = 128 \(.*config\.json\)/);
});

test('a run that fails for lack of memory is split in halves and retried; other errors propagate', async () => {
  const ran: number[][] = [];
  await splitOnOutOfMemory([1, 2, 3, 4, 5], async (items) => {
    if (items.length > 2) throw new Error('[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : CUDA failure 2: out of memory');
    ran.push(items);
  });
  expect(ran).toEqual([[1, 2], [3], [4, 5]]);
  await expect(splitOnOutOfMemory([1, 2], async () => Promise.reject(new Error('shape mismatch')))).rejects.toThrow(/shape mismatch/);
  await expect(splitOnOutOfMemory([1], async () => Promise.reject(new Error('Failed to allocate memory')))).rejects.toThrow(/Failed to allocate/);
});

test('a model without files (in memory) generates what its folder does', async () => {
  const call = { maxNewTokens: 5, seed: 2 };
  const fromFolder = await Generator.create(model, { temperature: 1, groupSize: 2 });
  const want = await fromFolder.generate(prompts, call);
  const inMemory = await Generator.create(CausalLM.fromWeights(config, model.float32Weights()), { temperature: 1, groupSize: 2 });
  expect(await inMemory.generate(prompts, call)).toEqual(want);
  await Promise.all([fromFolder.dispose(), inMemory.dispose()]);
});
