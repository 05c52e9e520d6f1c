/**
 * `lathe eval` end to end on a tiny random Qwen3 (head_dim 16: the KV-cache engine) with the real
 * Qwen3 tokenizer over slices of three benchmarks; `--regrade` reproducing the table from the saved
 * completions; two models in one table (best-of-n by a reward model: eval-best-of-n.slow.test.ts; the
 * prompt templates: eval-templates.slow.test.ts); the grading loop against a scripted sampler with known
 * verdicts; and each bad input's error.
 */
import { copyFileSync, cpSync, existsSync, mkdirSync, mkdtempSync, readFileSync, renameSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import type { MathGrader } from '@lathe/graders';
import { defaults, evalSchema, evalTable, evaluateBenchmarks, gradeCompletion, loadBenchmark, readEvalRows, runEval, type BenchmarkProblem, type EvalConfig, type EvalSampler } from '@lathe/recipes';
import { tinyQwen3 } from './tiny-qwen3';

const DATA = resolve(__dirname, '../../../fixtures/eval');
const root = mkdtempSync(join(tmpdir(), 'lathe-eval-'));
const model = tinyQwen3(join(root, 'tiny-a'), { seed: 2, maxPositions: 1024 });

const config = (over: Partial<EvalConfig> = {}): EvalConfig => ({
  ...defaults(evalSchema),
  model,
  benchmarks: 'aime24,math500,gsm8k',
  data_dir: DATA,
  limit: 2,
  n: 3,
  n_large: 1,
  pass_k: '1,2',
  max_new_tokens: 6,
  batch_size: 4,
  seed: 1,
  grade_workers: 1,
  run_dir: join(root, 'run'),
  ...over,
});

test('defaults are the papers\' sampling settings', () => {
  const d = defaults(evalSchema);
  expect([d.temperature, d.top_p, d.n, d.max_new_tokens, d.prompt_template, d.thinking]).toEqual([0.6, 0.95, 8, 4096, 'qwen-boxed', true]);
  expect(d.benchmarks).toBe('aime24,aime25,amc23,math500,minerva,olympiadbench,gsm8k');
});

let first: Awaited<ReturnType<typeof runEval>>;
test('two tiny models on three benchmarks: completions Parquet, summary JSON/Markdown, one paper table', async () => {
  const other = join(root, 'tiny-b');
  cpSync(model, other, { recursive: true });
  first = await runEval(config({ model: `${model},${other}` }));
  expect(first.interrupted).toBe(false);
  expect(first.benchmarks).toEqual(['aime24', 'math500', 'gsm8k']);
  expect(first.models.map((x) => x.label)).toEqual(['tiny-a', 'tiny-b']);
  const [m] = first.models;
  expect(m.engine).toBe('kv-cache');
  // 2 problems × 3 samples on AIME24, 2 × 1 on MATH-500 and GSM8K
  expect([m.metrics.aime24.samples, m.metrics.aime24.n, m.metrics.math500.samples, m.metrics.gsm8k.samples]).toEqual([6, 3, 2, 2]);
  expect(Object.keys(m.metrics.aime24.passAtK)).toEqual(['1', '2']);
  expect(Object.keys(m.metrics.math500.passAtK)).toEqual(['1']); // k = 2 > n = 1 is left out
  expect(m.metrics.aime24.truncationRate).toBe(1); // 6 tokens: every sample reaches the limit
  expect(m.metrics.math500.bySubject).toEqual({ Precalculus: { correct: 0, total: 1, accuracy: 0 }, 'Intermediate Algebra': { correct: 0, total: 1, accuracy: 0 } });
  expect(m.timing!.tokens).toBe(10 * 6);

  const rows = await readEvalRows(m.file);
  expect(rows).toHaveLength(10);
  expect(rows.map((r) => [r.benchmark, r.problem_id, r.sample_idx])).toEqual([
    ['aime24', '60', 0], ['aime24', '60', 1], ['aime24', '60', 2], ['aime24', '61', 0], ['aime24', '61', 1], ['aime24', '61', 2],
    ['math500', 'test/precalculus/807.json', 0], ['math500', 'test/intermediate_algebra/1994.json', 0], ['gsm8k', '0', 0], ['gsm8k', '1', 0],
  ]);
  expect(rows[0]).toMatchObject({ gold: '204', finish_reason: 'length', output_tokens: 6, level: null, score: null });
  expect(rows[6]).toMatchObject({ gold: '\\left( 3, \\frac{\\pi}{2} \\right)', subject: 'Precalculus', level: 2 });
  // a random model's words: wrong, or (when nothing reads as an answer) "no answer"
  for (const r of rows) expect(r.correct).toBe(false);
  for (const r of rows) expect(r.extracted === null).toBe(r.reason === 'no-answer');
  // the same weights and seed: the same completions, whatever the model's name
  expect((await readEvalRows(first.models[1].file)).map((r) => r.completion)).toEqual(rows.map((r) => r.completion));

  expect(first.table.split('\n')).toEqual([
    '| Model  | AIME24 (avg@3) | MATH-500 (avg@1) | GSM8K (avg@1) | Avg |',
    '| ------ | -------------: | ---------------: | ------------: | --: |',
    '| tiny-a |            0.0 |              0.0 |           0.0 | 0.0 |',
    '| tiny-b |            0.0 |              0.0 |           0.0 | 0.0 |',
  ]);
  const summary = JSON.parse(readFileSync(join(first.runDir, 'summary.json'), 'utf8')) as { models: { label: string; file: string; metrics: Record<string, { n: number }> }[]; regraded: boolean };
  expect(summary.models.map((x) => [x.label, x.file, x.metrics.aime24.n])).toEqual([['tiny-a', 'tiny-a.completions.parquet', 3], ['tiny-b', 'tiny-b.completions.parquet', 3]]);
  expect(summary.regraded).toBe(false);
  const md = readFileSync(join(first.runDir, 'summary.md'), 'utf8');
  expect(md).toContain(first.table);
  expect(md).toContain('MATH-500 by subject and level');
  expect(existsSync(join(first.runDir, 'config.yaml'))).toBe(true);
});

test('--regrade reproduces the table from the saved completions, without the models', async () => {
  const away = join(root, 'away');
  mkdirSync(away);
  renameSync(model, join(away, 'a'));
  try {
    const re = await runEval({ ...defaults(evalSchema), regrade: first.runDir }); // --pass_k is the saved run's (1,2)
    expect(re.table).toBe(first.table);
    expect(re.models.map((x) => x.metrics)).toEqual(first.models.map((x) => x.metrics));
    expect(JSON.parse(readFileSync(join(first.runDir, 'summary.json'), 'utf8')).regraded).toBe(true);
  } finally {
    renameSync(join(away, 'a'), model);
  }
});

/** A sampler that answers from a script: per (problem id, sample) a completion text. */
function scripted(texts: Record<string, string[]>): EvalSampler {
  return async function* (requests, call) {
    let done = 0;
    for (const r of requests) {
      for (let j = 0; j < r.samples; j++) {
        const text = texts[r.problem.id][j];
        done++;
        call.onProgress?.({ samples: done, total: requests.reduce((n, x) => n + x.samples, 0), tokens: done * 10 });
        yield { key: r.key, sampleIdx: j, text, finishReason: text.endsWith('…') ? 'length' : 'stop', outputTokens: text.length, opensThink: false };
      }
    }
  };
}

test('the grading loop against known verdicts: avg@n, pass@k, maj@n, best-of-n, "no answer" rows', async () => {
  const problems: BenchmarkProblem[] = (await loadBenchmark('aime24', { dir: DATA, limit: 2 })).concat(await loadBenchmark('gsm8k', { dir: DATA, limit: 1 }));
  const sampler = scripted({
    '60': ['<think>3 hours</think> The answer is $\\boxed{204}$.', 'So it is \\boxed{204}', '<think>still thinking…', 'I think \\boxed{205}'],
    '61': ['\\boxed{113}', 'I am not sure how to solve this problem at all', '\\boxed{11}', '\\boxed{11}'],
    '0': ['She makes $18 every day.\n#### 18', '\\boxed{18.0}', '\\boxed{$18}', 'I got \\boxed{16}'],
  });
  const r = await evaluateBenchmarks(problems, sampler, { samples: () => 4, passK: [1, 2, 4], score: async (rows) => rows.map((x, i) => (x.benchmark === 'gsm8k' ? 4 - (i % 4) : i % 4)) });
  expect(r.rows.map((x) => x.correct)).toEqual([true, true, false, false, true, false, false, false, true, true, true, false]);
  expect(r.rows.map((x) => x.reason)).toEqual(['string', 'string', 'no-answer', 'different', 'string', 'no-answer', 'different', 'different', 'string', 'numeric', 'string', 'different']);
  expect(r.rows[2].extracted).toBeNull();
  const aime = r.metrics.aime24;
  expect(aime.avgAtN).toBeCloseTo((2 / 4 + 1 / 4) / 2, 12);
  expect(aime.passAtK['2']).toBeCloseTo((1 - 1 / 6 + (1 - 3 / 6)) / 2, 12); // 1 − C(2,2)/C(4,2) and 1 − C(3,2)/C(4,2)
  expect(aime.passAtK['4']).toBe(1);
  expect(aime.majAtN).toBe(0.5); // 204 (2 votes) right; 11 (2 votes) beats 113 (1) and is wrong
  expect(aime.noAnswerRate).toBe(2 / 8);
  expect(aime.truncationRate).toBe(1 / 8);
  // scores 0,1,2,3 per problem on AIME (the last sample wins: wrong, wrong); 4,3,2,1 on GSM8K (the first: right)
  expect([aime.bestOfN, r.metrics.gsm8k.bestOfN]).toEqual([0, 1]);
  expect(r.average).toBeCloseTo((3 / 8 + 3 / 4) / 2, 12);
  expect(evalTable([{ label: 'scripted', metrics: r.metrics, average: r.average }], ['aime24', 'gsm8k'])).toBe(
    ['| Model    | AIME24 (avg@4) | GSM8K (avg@4) |  Avg |', '| -------- | -------------: | ------------: | ---: |', '| scripted |           37.5 |          75.0 | 56.3 |'].join('\n'),
  );
});

test('a completion without an answer, or one the grader fails on, is a wrong row, never an error', async () => {
  const failing = { grade: () => Promise.reject(new Error('parser exploded')) } as unknown as MathGrader;
  expect(await gradeCompletion(failing, { text: '\\boxed{5}', opensThink: false }, '5', null)).toEqual({ extracted: null, correct: false, reason: 'grader-error: parser exploded' });
  expect(await gradeCompletion(failing, { text: 'still thinking', opensThink: true }, '5', null)).toEqual({ extracted: null, correct: false, reason: 'no-answer' });
});

describe('bad input', () => {
  test('an unknown benchmark lists the known ones', async () => {
    await expect(runEval(config({ benchmarks: 'aime24,aime26' }))).rejects.toThrow("unknown benchmark 'aime26' (known: aime24, aime25, amc23, math500, minerva, olympiadbench, gsm8k)");
  });

  test('a model folder without a tokenizer is named', async () => {
    const bare = join(root, 'bare');
    mkdirSync(bare, { recursive: true });
    copyFileSync(join(model, 'config.json'), join(bare, 'config.json'));
    await expect(runEval(config({ model: bare }))).rejects.toThrow(`--model ${bare}: no tokenizer (tokenizer.json is not in that folder; name a tokenizer folder with --tokenizer)`);
  });

  test('an earlier run is not overwritten without --overwrite; --regrade of a folder that is no run', async () => {
    await expect(runEval(config())).rejects.toThrow(`--run_dir ${join(root, 'run')} holds an earlier eval: pass --overwrite to replace it, or --regrade ${join(root, 'run')} to grade it again`);
    await expect(runEval({ ...defaults(evalSchema), regrade: root })).rejects.toThrow(`--regrade ${root}: no config.yaml (not a lathe eval run directory)`);
    await expect(runEval(config({ pass_k: '1,0' }))).rejects.toThrow("--pass_k: '0' is not a positive integer");
    await expect(runEval(config({ prompt_template: 'solve it' }))).rejects.toThrow("--prompt_template 'solve it': not a preset (qwen-boxed, r1-zero) and has no {problem} placeholder");
  });
});
