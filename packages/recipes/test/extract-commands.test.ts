/**
 * `lathe extract generate`, `train`, `rft` and `eval` end to end at a tiny size (CPU, the built-in
 * model and character tokenizer, a critic trained for three steps), and their refusals of bad input:
 * a labelled file without candidate columns, candidate lists that do not line up with the output,
 * τ ≤ 0, and a critic whose tokenizer or vocabulary is not the policy's.
 */
import { cpSync, existsSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import { batchOf, flattenNested, nestedListData, readParquet, readTrajectories, trajectoriesToBatch, writeParquet, writeTrajectories, type Trajectory } from '@lathe/data';
import { randomModel } from '@lathe/models';
import { targetLogprobs } from '@lathe/policy-extraction';
import { defaults } from '../src/options';
import { criticTrainSchema } from '../src/critic-config';
import { runCriticTrain } from '../src/critic';
import { extractEvalSchema, extractGenerateSchema, extractRftSchema, extractTrainSchema } from '../src/extract-config';
import { evaluationTable, runExtractEval, runExtractGenerate, runExtractRft, runExtractTrain } from '../src/extract';

const dir = mkdtempSync(join(tmpdir(), 'extract-cmd-'));
// prompt "1+2=" (the built-in tokenizer: digit d is d + 3, '+' 13, '=' 14)
const rows: Trajectory[] = [0, 1].flatMap((p) =>
  [[6, 2], [5, 5, 2], [6, 6, 6, 2]].map((out, k) => ({ prompt_idx: p, prompt: '1+2=', prompt_token_ids: [4, 13, 5, 14], output_token_ids: out, correct: k === 0 ? 1 : 0 })),
);
const data = join(dir, 'data.parquet');
const prompts = join(dir, 'prompts.jsonl');
let critic = '';
const reference = join(dir, 'critic-run', 'base-model');
const common = { tokenizer: 'builtin:addition', grader: 'exact' as const, data: prompts, min_p: 0.05, max_candidates: 6, max_new_tokens: 5 };

beforeAll(async () => {
  await writeTrajectories(data, rows);
  writeFileSync(prompts, ['{"prompt":"1+2=","answer":"3"}', '{"prompt":"4+4=","answer":"8"}'].join('\n') + '\n');
  const run = await runCriticTrain({ ...defaults(criticTrainSchema), data, tokenizer: 'builtin:addition', run_dir: join(dir, 'critic-run'), max_length: 32, max_remaining: 8, length_bins: 3, ablation: 'no_context', batch_size: 2, steps: 3, lr: 1e-3, save_every: 0 });
  critic = run.checkpoint;
}, 120_000);

test('generate: Q-weighted samples with candidates, Q and reference log-probs per token, and the token-value page', async () => {
  const output = join(dir, 'gen.parquet');
  let progress = 0;
  const result = await runExtractGenerate({ ...defaults(extractGenerateSchema), ...common, model: reference, critic, samples: 3, tau: 0.5, output, seed: 4 }, { onProgress: () => progress++ });
  expect(result).toMatchObject({ rows: 6, prompts: 2, output, html: join(dir, 'gen.html') });
  expect(progress).toBeGreaterThan(0);
  const got = await readTrajectories(output);
  const table = await readParquet(output);
  const chosenQ = table.getChild('token_q_values')!;
  const remaining = table.getChild('token_remaining')!;
  const candRemaining = table.getChild('candidate_remaining')!;
  const entropies = table.getChild('token_entropies')!;
  got.forEach((r, i) => {
    expect(Array.from(r.prompt_token_ids)).toEqual(r.prompt_idx === 0 ? [1, 4, 13, 5, 14] : [1, 7, 13, 7, 14]); // BOS, then the prompt
    const T = r.output_token_ids.length;
    expect(T).toBeGreaterThan(0);
    expect(T).toBeLessThanOrEqual(5);
    // one entropy of π_ref's whole next-token distribution per output token, within [0, log V]
    const h = Array.from((entropies.get(i) as { toArray(): Float32Array }).toArray());
    expect(h).toHaveLength(T);
    const V = (JSON.parse(readFileSync(join(reference, 'config.json'), 'utf8')) as { vocab_size: number }).vocab_size;
    for (const x of h) expect(x >= 0 && x <= Math.log(V) + 1e-5).toBe(true);
    const q = Array.from((chosenQ.get(i) as { toArray(): Float32Array }).toArray());
    for (let t = 0; t < T; t++) {
      const ids = Array.from(r.candidate_ids![t]);
      const k = ids.indexOf(r.output_token_ids[t]);
      expect(k).toBeGreaterThanOrEqual(0); // the drawn token is one of its candidates
      expect(q[t]).toBeCloseTo(r.candidate_q_values![t][k], 6);
      expect(r.candidate_ref_logprobs![t].length).toBe(ids.length);
      const rem = (candRemaining.get(i) as { get(t: number): { toArray(): Float32Array } }).get(t).toArray();
      expect(rem.length).toBe(ids.length);
      expect((remaining.get(i) as { toArray(): Float32Array }).toArray()[t]).toBeCloseTo(rem[k], 5);
    }
    expect([0, 1]).toContain(r.correct);
  });
  const html = readFileSync(join(dir, 'gen.html'), 'utf8');
  expect(html).toContain('lathe extract generate');
  expect(html).not.toMatch(/<(link|img)[^>]+(src|href)=["']?https?:/); // self-contained
});

test('train: KL distillation on the generated file, a checkpoint with the policy, an interrupted run resumed to the same weights; rft on the successful rows', async () => {
  const trained = await runExtractTrain({ ...defaults(extractTrainSchema), data: join(dir, 'gen.parquet'), model: reference, tokenizer: 'builtin:addition', run_dir: join(dir, 'train'), steps: 3, batch_size: 2, lr: 1e-3, save_every: 0, log_every: 1, tau: 0.5 });
  expect(trained.steps).toBe(3);
  expect(Number.isFinite(trained.finalLoss)).toBe(true);
  expect(trained.finalLoss).toBeGreaterThanOrEqual(0); // a KL
  expect(existsSync(join(trained.checkpoint, 'config.json'))).toBe(true);
  const metrics = readFileSync(join(dir, 'train', 'metrics.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l));
  expect(metrics.map((m) => m.step)).toEqual([1, 2, 3]);

  // interrupted after step 2 (as Ctrl-C does), then resumed to the end: the same weights as the uninterrupted run
  const stop = new AbortController();
  const resumable = { ...defaults(extractTrainSchema), data: join(dir, 'gen.parquet'), model: reference, tokenizer: 'builtin:addition', run_dir: join(dir, 'train-resume'), steps: 3, batch_size: 2, lr: 1e-3, save_every: 0, tau: 0.5 };
  const first = await runExtractTrain(resumable, { onStep: (m) => m.step === 2 && stop.abort() }, stop.signal);
  expect([first.interrupted, first.steps]).toEqual([true, 2]);
  const resumed = await runExtractTrain({ ...resumable, resume: true });
  expect(resumed.steps).toBe(3);
  expect(resumed.finalLoss).toBeCloseTo(trained.finalLoss, 5);
  expect(readFileSync(join(resumed.checkpoint, 'model.safetensors')).equals(readFileSync(join(trained.checkpoint, 'model.safetensors')))).toBe(true);

  let started: { trajectories: number; dropped: number } | undefined;
  const rft = await runExtractRft({ ...defaults(extractRftSchema), data, model: reference, tokenizer: 'builtin:addition', run_dir: join(dir, 'rft'), steps: 2, batch_size: 2, lr: 1e-3, save_every: 0 }, { onStart: (i) => (started = i) });
  expect(rft.steps).toBe(2);
  expect(started).toMatchObject({ trajectories: 2, dropped: 4 }); // the two correct rows of six
});

test('eval: the table at n = 1 and 4, with the policy alone and Q-weighted', async () => {
  for (const sampler of ['policy', 'q_weighted'] as const) {
    const output = join(dir, `eval-${sampler}.json`);
    const result = await runExtractEval({ ...defaults(extractEvalSchema), ...common, model: reference, critic, samples: 4, sampler, tau: 0.5, output });
    expect(result.table.map((r) => r.n)).toEqual([1, 4]);
    for (const r of result.table) for (const v of [r.single, r.critic_best_of_n, r.majority_vote, r.pass_at_n]) expect(v >= 0 && v <= 1).toBe(true);
    expect(JSON.parse(readFileSync(output, 'utf8')).sampler).toBe(sampler);
  }
});

test('eval with an LLM judge (a stand-in OpenAI-compatible server): the table of the exact grader it mimics, and all correct from a judge that passes everything', async () => {
  let requests = 0;
  let lenient = false;
  const server = createServer((req, res) => {
    let body = '';
    req.on('data', (c) => (body += c));
    req.on('end', () => {
      requests++;
      const prompt = (JSON.parse(body) as { messages: { content: string }[] }).messages.at(-1)!.content;
      const ref = /Reference answer:\n(.*)/.exec(prompt)![1].trim();
      const answer = /Answer to grade:\n(.*)/.exec(prompt)?.[1]?.trim() ?? '';
      res.setHeader('content-type', 'application/json');
      res.end(JSON.stringify({ choices: [{ message: { role: 'assistant', content: `VERDICT: ${lenient || answer === ref ? 'CORRECT' : 'INCORRECT'}` } }] }));
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  try {
    const port = (server.address() as AddressInfo).port;
    const base = { ...defaults(extractEvalSchema), ...common, model: reference, critic, samples: 4, seed: 9 };
    const exact = await runExtractEval(base);
    const judged = await runExtractEval({ ...base, grader: 'judge', judge_url: `http://127.0.0.1:${port}/v1`, judge_model: 'stand-in' });
    expect(judged.table).toEqual(exact.table);
    expect(requests).toBe(2 * 4); // two prompts × four samples
    // a judge that passes everything: every sample counts as correct
    lenient = true;
    const all = await runExtractEval({ ...base, grader: 'judge', judge_url: `http://127.0.0.1:${port}/v1`, judge_model: 'stand-in-lenient' });
    for (const row of all.table) expect([row.single, row.critic_best_of_n, row.pass_at_n]).toEqual([1, 1, 1]);
    await expect(runExtractEval({ ...base, grader: 'judge' })).rejects.toThrow('--grader judge needs --judge_url and --judge_model');
  } finally {
    server.close();
  }
});

test('the evaluation table against hand counts', () => {
  const s = (correct: boolean, score: number, answer: string | null) => ({ correct, score, answer });
  // prompt A: the critic prefers the one right sample; the vote goes to the wrong "5"
  // prompt B: all right; prompt C: none right
  const table = evaluationTable(
    [
      [s(false, 0.1, '5'), s(true, 0.9, '3'), s(false, 0.2, '5'), s(false, 0.3, '7')],
      [s(true, 0.5, '8'), s(true, 0.4, '8'), s(true, 0.6, '8'), s(true, 0.1, '8')],
      [s(false, 0.5, '1'), s(false, 0.4, '2'), s(false, 0.6, null), s(false, 0.1, '1')],
    ],
    [1, 4],
  );
  expect(table[0]).toEqual({ n: 1, single: 1 / 3, critic_best_of_n: 1 / 3, majority_vote: 1 / 3, pass_at_n: expect.closeTo((0.25 + 1 + 0) / 3, 12) });
  expect(table[1]).toEqual({ n: 4, single: expect.closeTo((0.25 + 1 + 0) / 3, 12), critic_best_of_n: 2 / 3, majority_vote: 1 / 3, pass_at_n: 2 / 3 });
});

describe('bad input', () => {
  test('a labelled file without candidate columns is refused, naming them', async () => {
    await expect(runExtractTrain({ ...defaults(extractTrainSchema), data, model: reference, tokenizer: 'builtin:addition', run_dir: join(dir, 'bad1') })).rejects.toThrow(
      `--data ${data}: no column 'candidate_ids', 'candidate_q_values', 'candidate_ref_logprobs'`,
    );
  });

  test('candidate lists that do not match the output, or each other, are refused naming the row', async () => {
    const file = join(dir, 'mismatch.parquet');
    const lp = targetLogprobs([0, 0], [0, 0], 1);
    const good = { candidate_ids: [[6, 5], [2, 7]], candidate_q_values: [[0.5, 0.2], [0.1, 0.9]], candidate_ref_logprobs: [lp, lp] };
    await writeTrajectories(file, [
      { ...rows[0], ...good },
      { ...rows[0], ...good, candidate_ids: [[6, 5]], candidate_q_values: [[0.5, 0.2]], candidate_ref_logprobs: [lp] },
    ]);
    await expect(runExtractTrain({ ...defaults(extractTrainSchema), data: file, model: reference, tokenizer: 'builtin:addition', run_dir: join(dir, 'bad2') })).rejects.toThrow(`row 1, column 'candidate_ids': 1 candidate lists for 2 output tokens`);
    // a file another writer made (the data package's writer refuses it): one Q short at token 1
    const batch = trajectoriesToBatch([{ ...rows[0], ...good }]);
    const { outer, inner } = flattenNested([[[0.5, 0.2], [0.1]]], (n) => new Float32Array(n));
    await writeParquet(file, [batchOf(batch.schema.fields.map((f, k) => ({ name: f.name, data: f.name === 'candidate_q_values' ? nestedListData(outer, inner) : batch.getChildAt(k)!.data[0], nullable: f.nullable })))]);
    await expect(runExtractTrain({ ...defaults(extractTrainSchema), data: file, model: reference, tokenizer: 'builtin:addition', run_dir: join(dir, 'bad3') })).rejects.toThrow('row 0, output token 1: 2 candidate_ids but 1 candidate_q_values');
  });

  test('τ ≤ 0 is refused naming --tau', async () => {
    await expect(runExtractTrain({ ...defaults(extractTrainSchema), data: join(dir, 'gen.parquet'), model: reference, tokenizer: 'builtin:addition', run_dir: join(dir, 'bad4'), tau: 0 })).rejects.toThrow('--tau must be > 0');
    await expect(runExtractGenerate({ ...defaults(extractGenerateSchema), ...common, model: reference, critic, tau: -1, output: join(dir, 'x.parquet') })).rejects.toThrow('--tau must be > 0');
  });

  test('a critic whose tokenizer is not the policy\'s is refused, naming both', async () => {
    const a = join(dir, 'tok-policy');
    const b = join(dir, 'tok-critic');
    for (const [folder, text] of [[a, '{"model":{"vocab":{"a":0}}}'], [b, '{"model":{"vocab":{"b":0}}}']]) {
      cpSync(folder === a ? reference : critic, folder, { recursive: true });
      writeFileSync(join(folder, 'tokenizer.json'), text);
    }
    await expect(runExtractGenerate({ ...defaults(extractGenerateSchema), ...common, tokenizer: 'model', model: a, critic: b, output: join(dir, 'z.parquet') })).rejects.toThrow(
      `the critic --critic ${b} and the policy --model ${a} have different tokenizers (${join(b, 'tokenizer.json')} differs from ${join(a, 'tokenizer.json')})`,
    );
  });

  test('a critic whose vocabulary is not the policy\'s is refused, naming both', async () => {
    const other = join(dir, 'other-policy');
    randomModel(other, { architectures: ['Qwen3ForCausalLM'], vocab_size: 40, hidden_size: 32, intermediate_size: 48, num_hidden_layers: 1, num_attention_heads: 2, num_key_value_heads: 1, head_dim: 16, rms_norm_eps: 1e-6, rope_theta: 10000, max_position_embeddings: 64, tie_word_embeddings: true }, { seed: 1 });
    await expect(runExtractGenerate({ ...defaults(extractGenerateSchema), ...common, model: other, critic, output: join(dir, 'y.parquet') })).rejects.toThrow(`the reference policy --model ${other} has a vocabulary of 40 and the critic --critic ${critic} one of`);
  });
});
