/**
 * Benchmark evaluation during training (`--eval_benchmarks`) on the built-in model and a fixture
 * benchmark of addition problems: it never changes what is trained (the same weights, bit for bit,
 * with and without it), it samples the live weights (at temperature 0 its verdicts at each step are
 * those of the held-out greedy evaluation's completions at that step, against golds made from them),
 * it logs eval/<benchmark>/avg@n at the evaluation steps, and GRPO draws n samples per problem in
 * rounds of the group size.
 */
import { mkdirSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { readMetrics } from '@lathe/data';
import { loadCheckpoint } from '@lathe/train';
import { additionTokenizer, builtinBaseModel, defaults, grpoSchema, readEvalRows, runGrpo, runSft, SftBenchmarkSampler, sftSchema, TrainBenchmarks, type GrpoConfig, type SftConfig } from '@lathe/recipes';
import { CausalLM, paramSpecs } from '@lathe/models';
import { Device } from '@lathe/runtime';

const DATA = resolve(__dirname, '../../../fixtures/train-eval');
const BENCH = { eval_benchmarks: 'math500', eval_data_dir: DATA, eval_template: '{problem}' };

function sft(over: Partial<SftConfig> = {}): SftConfig {
  return { ...defaults(sftSchema), run_dir: mkdtempSync(join(tmpdir(), 'lathe-sft-eval-')), steps: 12, batch_size: 8, eval_examples: 8, eval_every: 6, save_every: 0, warmup_steps: 2, lr: 3e-3, max_new_tokens: 6, ...over };
}

/** Every tensor of two checkpoints' models, compared byte for byte. */
function sameWeights(a: string, b: string): boolean {
  const x = loadCheckpoint(a).model;
  const y = loadCheckpoint(b).model;
  return x.size === y.size && [...x].every(([name, t]) => Buffer.from(t.buffer).equals(Buffer.from(y.get(name)!.buffer)));
}

/** metrics.jsonl's values of `key` by step. */
function logged(runDir: string, key: string): [number, number][] {
  return readMetrics(join(runDir, 'metrics.jsonl')).flatMap((l) => (typeof l[key] === 'number' ? [[l.step, l[key] as number] as [number, number]] : []));
}

/** A bare-digits completion's value (the grader compares numbers: 007 is 7); anything else has none. */
const digits = (s: string): bigint | null => (/^\d+$/.test(s.trim()) ? BigInt(s.trim()) : null);

test('SFT: the benchmark samples the live weights at each evaluation, and the weights are those of a run without it', async () => {
  const plain = await runSft(sft());
  // golds from the held-out greedy completions at the last step: digits where the model wrote digits, else an answer it never writes
  const evalRows = (step: number) =>
    readFileSync(join(plain.checkpoint, '..', '..', 'eval', `step-${String(step).padStart(8, '0')}.jsonl`), 'utf8')
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as { prompt: string; generated: string });
  const last = evalRows(12);
  const golds = last.map((r) => (digits(r.generated) === null ? '123456789' : r.generated.trim()));
  const dir = mkdtempSync(join(tmpdir(), 'lathe-bench-'));
  mkdirSync(join(dir, 'math500'));
  writeFileSync(join(dir, 'math500', 'test.jsonl'), last.map((r, i) => JSON.stringify({ problem: r.prompt, answer: golds[i], subject: 'Arithmetic', level: 1, unique_id: `p${i}` })).join('\n') + '\n');

  const withBench = await runSft(sft({ ...BENCH, eval_data_dir: dir, eval_samples: 1, eval_temperature: 0 }));
  expect(sameWeights(plain.checkpoint, withBench.checkpoint)).toBe(true);
  expect(withBench.finalLoss).toBe(plain.finalLoss);
  // expected avg@1 at each evaluation step: the greedy completions of that step against the golds
  const expected = (step: number) => evalRows(step).filter((r, i) => digits(r.generated) !== null && digits(r.generated) === digits(golds[i])).length / golds.length;
  expect(withBench.benchmarks.map((b) => b.step)).toEqual([0, 6, 12]);
  expect(withBench.benchmarks.map((b) => b.samples)).toEqual([8, 8, 8]);
  const got = logged(withBench.checkpoint.replace(/\/checkpoints\/.*$/, ''), 'eval/math500/avg@1');
  expect(got).toEqual([0, 6, 12].map((s) => [s, expected(s)]));
  // the golds are the last step's own answers wherever they are digits
  expect(got[2][1]).toBe(golds.filter((g) => g !== '123456789').length / golds.length);
  expect(last.some((r) => digits(r.generated) !== null)).toBe(true);
}, 120_000);

test('SFT: sampled benchmark evaluation is seeded: a problem\'s samples depend on neither the other problems nor the evaluation schedule', async () => {
  const a = await runSft(sft({ ...BENCH, eval_samples: 3, eval_limit: 4, steps: 4, eval_every: 0 }));
  const b = await runSft(sft({ ...BENCH, eval_samples: 3, eval_limit: 8, steps: 4, eval_every: 2 }));
  expect(a.benchmarks.map((x) => [x.step, x.samples])).toEqual([[0, 12], [4, 12]]);
  expect(b.benchmarks.map((x) => [x.step, x.samples])).toEqual([[0, 24], [2, 24], [4, 24]]);
  for (const [i, j] of [[0, 0], [1, 2]]) {
    const x = await readEvalRows(a.benchmarks[i].file!);
    const y = await readEvalRows(b.benchmarks[j].file!);
    expect(x.map((r) => [r.problem_id, r.sample_idx, r.completion, r.correct])).toEqual(y.slice(0, 12).map((r) => [r.problem_id, r.sample_idx, r.completion, r.correct]));
    // three samples of a problem at temperature 0.6 are not all the same text
    expect(new Set(x.map((r) => r.completion)).size).toBeGreaterThan(4);
    expect(x.every((r) => r.gold === String(r.problem.replace('=', '').split('+').reduce((t, v) => t + Number(v), 0)))).toBe(true);
  }
}, 120_000);

test('SFT with LoRA: the benchmark reads the base with the adapters merged in, and trains the same adapters as without', async () => {
  const lora = { lora_rank: 4, steps: 3, eval_every: 0, eval_examples: 0 };
  const plain = await runSft(sft(lora));
  const r = await runSft(sft({ ...lora, ...BENCH, eval_samples: 1 }));
  for (const f of ['adapter_model.safetensors', 'optimizer.safetensors', 'model.safetensors']) expect(readFileSync(join(r.checkpoint, f)).equals(readFileSync(join(plain.checkpoint, f)))).toBe(true);
  expect(r.benchmarks.map((x) => [x.step, x.samples])).toEqual([[0, 8], [3, 8]]);
}, 60_000);

test('SFT sampler: the KV-cache engine and the in-graph loop draw the same samples for the same keys', async () => {
  const model = CausalLM.fromPretrainedSync(builtinBaseModel(mkdtempSync(join(tmpdir(), 'lathe-bench-model-')), 3).dir);
  const device = Device.open('cpu');
  const tok = additionTokenizer();
  const tokenizer = { encode: (t: string) => tok.encode(t), decode: (ids: readonly number[]) => tok.decode([...ids]), padId: tok.padId, eosId: tok.eosId, encodePrompt: (t: string) => tok.encode(t) };
  const bench = (await TrainBenchmarks.load({ ...BENCH, eval_limit: 0, eval_samples: 3 }))!;
  const weights = [...model.float32Weights()].map(([name, data]) => [name, device.upload({ data, dims: paramSpecs(model.config).find((s) => s.name === name)!.shape })] as const);
  const texts: string[][] = [];
  for (const engine of ['kv-cache', 'graph'] as const) {
    const s = SftBenchmarkSampler.create(device, model.config, tokenizer, { temperature: 0.8, topP: 1, seed: 4, maxNewTokens: 6, compute: 'float32', engine });
    expect(s.engine).toBe(engine);
    const dir = mkdtempSync(join(tmpdir(), 'lathe-bench-rows-'));
    const r = await bench.run(0, s.sampler(weights), dir);
    texts.push((await readEvalRows(r.file!)).map((x) => `${x.problem_id}/${x.sample_idx}: ${x.completion}`));
    s.dispose();
  }
  weights.forEach(([, t]) => t.dispose());
  expect(texts[0]).toHaveLength(24);
  expect(texts[1]).toEqual(texts[0]);
  expect(new Set(texts[0].map((t) => t.split(': ')[1])).size).toBeGreaterThan(8); // sampled, not one text
}, 60_000);

function grpo(over: Partial<GrpoConfig> = {}): GrpoConfig {
  return { ...defaults(grpoSchema), run_dir: mkdtempSync(join(tmpdir(), 'lathe-grpo-eval-')), steps: 4, prompts_per_step: 4, group_size: 2, max_new_tokens: 4, eval_examples: 4, eval_every: 2, save_every: 0, n_minibatches: 2, lr: 1e-3, ...over };
}

test('GRPO: n samples per problem in rounds of the group size, logged at the evaluation steps; the same weights as without', async () => {
  const plain = await runGrpo(grpo());
  const cfg = grpo({ ...BENCH, eval_samples: 3, eval_limit: 5 });
  const withBench = await runGrpo(cfg);
  expect(sameWeights(plain.checkpoint, withBench.checkpoint)).toBe(true);
  expect(withBench.stepRewards).toEqual(plain.stepRewards);
  expect(withBench.benchmarks!.map((b) => [b.step, b.samples, b.metrics.math500.n, b.metrics.math500.problems])).toEqual([0, 2, 4].map((s) => [s, 15, 3, 5]));
  const got = logged(cfg.run_dir, 'eval/math500/avg@3');
  expect(got.map(([s]) => s)).toEqual([0, 2, 4]);
  got.forEach(([, v], i) => expect(v).toBe(withBench.benchmarks![i].metrics.math500.avgAtN));
  // a multiple of 1/15: a fraction of the 15 samples (each problem's 3 weigh the same)
  for (const [, v] of got) expect(Math.abs(v * 15 - Math.round(v * 15))).toBeLessThan(1e-9);
}, 120_000);

test('bad --eval_benchmarks: an unknown name lists the known ones; a missing file names the flag', async () => {
  const cfg = { ...BENCH, eval_limit: 0, eval_samples: 1 };
  await expect(TrainBenchmarks.load({ ...cfg, eval_benchmarks: 'math5000' })).rejects.toThrow(/--eval_benchmarks math5000: unknown benchmark 'math5000' \(known: aime24, .*gsm8k\)/);
  await expect(TrainBenchmarks.load({ ...cfg, eval_benchmarks: 'gsm8k' })).rejects.toThrow(/--eval_benchmarks gsm8k: benchmark gsm8k: .*gsm8k\/test.jsonl not found \(set the datasets folder with --eval_data_dir\)/);
  await expect(TrainBenchmarks.load({ ...cfg, eval_template: 'no placeholder' })).rejects.toThrow(/--eval_template 'no placeholder'/);
  expect(await TrainBenchmarks.load({ ...cfg, eval_benchmarks: '' })).toBeUndefined();
  expect((await TrainBenchmarks.load({ ...cfg, eval_limit: 3 }))!.problems.map((p) => p.answer)).toEqual(['7', '42', '62']);
});
