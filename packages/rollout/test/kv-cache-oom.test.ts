/**
 * KvCacheGenerator under memory pressure and bad input: a run that fails for lack of memory is
 * split in halves (groups kept whole) and retried, with the same samples as an unsplit run; other
 * errors propagate; bad arguments are rejected before any run. Out-of-memory is injected on the
 * CPU through the `beforeRun` hook, with ONNX Runtime's CUDA allocation message.
 */
import { Device } from '@lathe/runtime';
import { isOutOfMemory, KvCacheGenerator, type Completion, type GenerateCallOptions } from '@lathe/rollout';
import { CausalLM, type HfConfig } from '@lathe/models';
import { tinyModel, tinyQwen3 } from './helpers';

// head_dim 16 for GroupQueryAttention's rotary; 96 tokens = 3 chunks of 32 (two-stage sampling).
const cfg: HfConfig = { ...tinyQwen3, hidden_size: 64, head_dim: 16, vocab_size: 96 };
const { dir } = tinyModel(cfg, 9);
const model = CausalLM.fromPretrainedSync(dir, { device: Device.cpu() });
afterAll(() => model.dispose());
const prompts = [[5, 9, 11, 3], [7, 2], [30, 31, 32, 33, 34, 35], [1], [8, 8, 8]];
const call: GenerateCallOptions = { maxNewTokens: 7, seed: 3, promptKeys: [40, 41, 42, 43, 44] };
const oom = () => new Error('[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : Failed to allocate memory for requested buffer of size 786432');

/** An engine (3 prompts × 2 samples per run) whose runs fail as `fault` says; records each run's size. */
function engine() {
  const runs: { phase: string; prompts: number }[] = [];
  let fault: (phase: 'prefill' | 'decode', prompts: number, step: number) => Error | undefined = () => undefined;
  let step = 0;
  const gen = KvCacheGenerator.create(model, {
    temperature: 0.9,
    groupSize: 2,
    rows: 6,
    maxLength: 16,
    beforeRun: (phase, n) => {
      step = phase === 'prefill' ? 0 : step + 1;
      if (phase === 'prefill') runs.push({ phase, prompts: n });
      const e = fault(phase, n, step);
      if (e) throw e;
    },
  });
  return { gen, runs, setFault: (f: typeof fault) => (fault = f) };
}

/**
 * Same samples: tokens and finish reasons exactly; log-probs to float32 rounding (a run's prompt
 * width, and so the prefill's padding and reduction lengths, depends on which prompts share it).
 */
function expectSame(got: Completion[], want: Completion[]): void {
  expect(got.map((c) => [c.promptIndex, c.sampleIndex, c.tokens, c.finishReason])).toEqual(want.map((c) => [c.promptIndex, c.sampleIndex, c.tokens, c.finishReason]));
  got.forEach((c, k) => {
    c.logprobs.forEach((x, t) => expect(Math.abs(x - want[k].logprobs[t])).toBeLessThan(1e-5));
    c.rawLogprobs.forEach((x, t) => expect(Math.abs(x - want[k].rawLogprobs[t])).toBeLessThan(1e-5));
  });
}

test('a prefill that runs out of memory is split in halves and retried: the same samples as an unsplit run', async () => {
  const { gen, runs, setFault } = engine();
  const want = await gen.generate(prompts, call);
  expect(runs.map((r) => r.prompts)).toEqual([3, 2]);
  runs.length = 0;
  setFault((phase, n) => (phase === 'prefill' && n > 1 ? oom() : undefined));
  const progress: number[] = [];
  const got = await gen.generate(prompts, { ...call, onProgress: (d) => progress.push(d) });
  expectSame(got, want);
  // 3 fails, its half of 2 fails, then single prompts; later runs start at the size that fit.
  expect(runs.map((r) => r.prompts)).toEqual([3, 2, 1, 1, 1, 1, 1]);
  expect(progress).toEqual([1, 2, 3, 4, 5]);
  gen.dispose();
});

test('a decode step that runs out of memory mid-run splits the run too; groups stay whole', async () => {
  const { gen, runs, setFault } = engine();
  const want = await gen.generate(prompts, call);
  runs.length = 0;
  setFault((phase, n, step) => (phase === 'decode' && n > 2 && step === 3 ? oom() : undefined));
  const got = await gen.generate(prompts, call);
  expectSame(got, want);
  expect(runs.map((r) => r.prompts)).toEqual([3, 2, 1, 2]);
  for (let p = 0; p < prompts.length; p++) expect(got.filter((c) => c.promptIndex === p).map((c) => c.sampleIndex)).toEqual([0, 1]);
  gen.dispose();
});

test('other errors propagate unsplit; out-of-memory at one prompt propagates; the engine still works after', async () => {
  const { gen, runs, setFault } = engine();
  const want = await gen.generate(prompts, call);
  runs.length = 0;
  setFault(() => new Error('Non-zero status code returned while running Gather node: indices out of range'));
  await expect(gen.generate(prompts, call)).rejects.toThrow(/indices out of range/);
  expect(runs.map((r) => r.prompts)).toEqual([3]);
  runs.length = 0;
  setFault((phase) => (phase === 'decode' ? oom() : undefined));
  const failure = gen.generate(prompts, call);
  await expect(failure).rejects.toThrow(/Failed to allocate/);
  expect(isOutOfMemory(await failure.catch((e: unknown) => e))).toBe(true);
  expect(runs.map((r) => r.prompts)).toEqual([3, 2, 1]);
  setFault(() => undefined);
  expectSame(await gen.generate(prompts, call), want);
  gen.dispose();
});

test('per-prompt sample counts (sampleKeys): whole prompts per run, one prefill each; the samples of one-row-per-sample calls, out-of-memory splits included', async () => {
  const { gen, runs, setFault } = engine();
  const counts = [3, 1, 2, 2, 1];
  const sampleKeys = counts.map((n, i) => Array.from({ length: n }, (_, j) => 1000 * i + 7 * j));
  const got = await gen.generate(prompts, { ...call, promptKeys: undefined, sampleKeys });
  // Longest first (prompts 2, 0, 4, 1, 3): 2 + 3 + 1 = 6 rows fill the first run, 2 + 1 the second.
  expect(runs.map((r) => r.prompts)).toEqual([3, 2]);
  expect(got.map((c) => [c.promptIndex, c.sampleIndex])).toEqual(counts.flatMap((n, i) => Array.from({ length: n }, (_, j) => [i, j])));
  // The old layout: each sample its own one-row prompt, prefilled once per sample, with the same key.
  const single = KvCacheGenerator.create(model, { temperature: 0.9, rows: 6, maxLength: 16 });
  const flat = await single.generate(counts.flatMap((n, i) => new Array<number[]>(n).fill(prompts[i])), { ...call, promptKeys: sampleKeys.flat() });
  single.dispose();
  expect(got.map((c) => [c.tokens, c.finishReason])).toEqual(flat.map((c) => [c.tokens, c.finishReason]));
  got.forEach((c, k) => c.rawLogprobs.forEach((x, t) => expect(Math.abs(x - flat[k].rawLogprobs[t])).toBeLessThan(1e-5)));
  runs.length = 0;
  setFault((phase, n) => (phase === 'prefill' && n > 1 ? oom() : undefined));
  expectSame(await gen.generate(prompts, { ...call, promptKeys: undefined, sampleKeys }), got);
  expect(runs.map((r) => r.prompts)).toEqual([3, 2, 1, 1, 1, 1, 1]);
  gen.dispose();
});

test('bad arguments are rejected by name before any run', async () => {
  const { gen, runs } = engine();
  const bad: [number[][], Partial<GenerateCallOptions>, RegExp][] = [
    [[[1], []], {}, /prompt 1 is empty/],
    [[[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]], {}, /prompt 0: 10 tokens \+ 7 new exceed the generator's maxLength of 16/],
    [[[1, 96]], {}, /prompt 0: token id 96 is outside the vocabulary \(0\.\.95\)/],
    [[[1, 2.5]], {}, /token id 2.5/],
    [[[1]], { maxNewTokens: 0 }, /maxNewTokens must be a positive integer/],
    [[[1]], { seed: 0.5 }, /seed must be an integer/],
    [[[1], [2]], { promptKeys: [1] }, /promptKeys: 1 keys for 2 prompts/],
    [[[1]], { promptKeys: [Number.NaN] }, /promptKeys\[0\] must be an integer/],
    [[[1]], { stopIds: [1.5] }, /stopIds must be integer token ids/],
    [[[1], [2]], { sampleKeys: [[1]] }, /sampleKeys: 1 lists for 2 prompts/],
    [[[1]], { sampleKeys: [[]] }, /sampleKeys\[0\] is empty/],
    [[[1]], { sampleKeys: [[1, 2.5]] }, /sampleKeys\[0\]\[1\] must be an integer/],
    [[[1]], { sampleKeys: [[1, 2, 3, 4, 5, 6, 7]] }, /sampleKeys\[0\]: 7 samples of one prompt exceed the generator's 6 rows/],
    [[[1]], { promptKeys: [1], sampleKeys: [[1]] }, /promptKeys or sampleKeys, not both/],
  ];
  for (const [ps, o, message] of bad) await expect(gen.generate(ps, { maxNewTokens: 7, ...o })).rejects.toThrow(message);
  expect(runs).toEqual([]);
  expect(await gen.generate([], { maxNewTokens: 3 })).toEqual([]);
  expect(runs).toEqual([]);
  gen.dispose();
  const opts = { rows: 2, maxLength: 8 };
  expect(() => KvCacheGenerator.create(model, { ...opts, topK: 97 })).toThrow(/top_k must be an integer in \[0, 96\]/);
  expect(() => KvCacheGenerator.create(model, { ...opts, temperature: Number.NaN })).toThrow(/temperature/);
  expect(() => KvCacheGenerator.create(model, { ...opts, minP: -0.1 })).toThrow(/min_p/);
  expect(() => KvCacheGenerator.create(model, { ...opts, padTokenId: 96 })).toThrow(/padTokenId must be a token id in \[0, 96\)/);
});
