/**
 * The seven benchmark loaders on byte-for-byte prefixes of the public files (fixtures/eval, the
 * datasets folder's layout): rows, fields, known gold answers with each set's quirks, and each
 * bad input's error.
 */
import { mkdirSync, mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { BENCHMARKS, benchmarkFile, loadBenchmark, parseBenchmarkList } from '@lathe/recipes';

const DIR = resolve(__dirname, '../../../fixtures/eval');

test('every benchmark loads its slice: row counts, ids unique, problem and gold non-empty', async () => {
  const counts: Record<string, number> = {};
  for (const b of BENCHMARKS) {
    const ps = await loadBenchmark(b, { dir: DIR });
    counts[b] = ps.length;
    expect(new Set(ps.map((p) => p.id)).size).toBe(ps.length);
    for (const p of ps) {
      expect(p.benchmark).toBe(b);
      expect(p.problem.trim()).not.toBe('');
      expect(p.answer.trim()).not.toBe('');
    }
  }
  expect(counts).toEqual({ aime24: 8, aime25: 8, amc23: 8, math500: 8, minerva: 8, olympiadbench: 14, gsm8k: 8 });
});

test('AIME answers lose leading zeros ("025" → 25), AIME25 ints and AMC floats become integer text', async () => {
  const aime24 = await loadBenchmark('aime24', { dir: DIR });
  expect(aime24.map((p) => [p.id, p.answer])).toEqual([['60', '204'], ['61', '113'], ['62', '371'], ['63', '385'], ['64', '110'], ['65', '104'], ['66', '721'], ['67', '25']]);
  expect(aime24[0].problem).toMatch(/^Every morning Aya goes for a \$9\$-kilometer-long walk/);
  const aime25 = await loadBenchmark('aime25', { dir: DIR });
  expect(aime25.slice(0, 3).map((p) => [p.id, p.answer])).toEqual([['0', '70'], ['1', '588'], ['2', '16']]);
  const amc = await loadBenchmark('amc23', { dir: DIR });
  expect(amc.map((p) => p.answer)).toEqual(['27', '36', '45', '3159', '36', '7', '21', '3']);
});

test('MATH-500 keeps subject, level and unique_id; the gold is bare LaTeX', async () => {
  const ps = await loadBenchmark('math500', { dir: DIR });
  expect(ps[0]).toMatchObject({ id: 'test/precalculus/807.json', answer: '\\left( 3, \\frac{\\pi}{2} \\right)', subject: 'Precalculus', level: 2, index: 0 });
  expect(ps[1]).toMatchObject({ answer: 'p - q', subject: 'Intermediate Algebra', level: 5 });
  expect(ps[2]).toMatchObject({ answer: '\\frac{14}{3}', subject: 'Algebra', level: 3 });
});

test("Minerva's gold is the last \\boxed{} of the solution; the course is its subject", async () => {
  const ps = await loadBenchmark('minerva', { dir: DIR });
  expect(ps.slice(0, 5).map((p) => p.answer)).toEqual(['1.6', '4.5e33', '41.8', '20.39', '0.006']);
  expect(ps[0].subject).toBe('Introduction to Astronomy (8.282J Spring 2006)');
});

test('OlympiadBench: final_answer unwrapped from $…$, lists joined, the multiple-answer flag kept', async () => {
  const ps = await loadBenchmark('olympiadbench', { dir: DIR });
  expect(ps.slice(0, 3).map((p) => [p.id, p.answer, p.subject])).toEqual([['1606', '2', 'Combinatorics'], ['1610', '\\frac{1}{2 n+2}', 'Algebra'], ['1612', '2^{1009}', 'Number Theory']]);
  expect(ps[5]).toMatchObject({ answer: '(1,8,19), (2,7,13), (4,5,7)', multipleAnswers: true });
  expect(ps[13]).toMatchObject({ answer: '69, 84', multipleAnswers: true });
  expect(ps[0].multipleAnswers).toBe(false);
  expect(ps.filter((p) => p.multipleAnswers)).toHaveLength(2);
});

test('GSM8K: the number after "#### " (thousands commas dropped) is the gold', async () => {
  const ps = await loadBenchmark('gsm8k', { dir: DIR });
  expect(ps.slice(0, 3).map((p) => p.answer)).toEqual(['18', '3', '70000']);
  expect(ps[0].problem).toMatch(/^Janet’s ducks lay 16 eggs per day/);
});

test('OlympiadBench unit, context and relative tolerance ("error") are read from the row', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'lathe-bench-'));
  mkdirSync(join(dir, 'olympiadbench'));
  const row = { id: 7, subfield: 'Physics', context: 'A ball falls.', question: 'How fast?', solution: ['…'], final_answer: ['$4.2$'], is_multiple_answer: false, unit: '$m/s$', answer_type: 'Numerical', error: '1e-1' };
  writeFileSync(join(dir, 'olympiadbench/test.jsonl'), JSON.stringify(row) + '\n');
  const [p] = await loadBenchmark('olympiadbench', { dir });
  expect(p).toMatchObject({ id: '7', problem: 'A ball falls.\n\nHow fast?', answer: '4.2', unit: 'm/s', relTol: 0.1 });
});

describe('bad input', () => {
  test('an unknown benchmark name lists the known ones', () => {
    expect(() => parseBenchmarkList('aime24,math5000')).toThrow("unknown benchmark 'math5000' (known: aime24, aime25, amc23, math500, minerva, olympiadbench, gsm8k)");
    expect(parseBenchmarkList('all')).toEqual([...BENCHMARKS]);
    expect(parseBenchmarkList(' aime24, gsm8k,aime24 ')).toEqual(['aime24', 'gsm8k']);
    expect(() => benchmarkFile('mmlu', DIR)).toThrow(/unknown benchmark 'mmlu' \(known: aime24/);
  });

  test('a row without its answer field is named (file:line and field)', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'lathe-bench-'));
    mkdirSync(join(dir, 'math500'));
    const good = { problem: 'p', answer: '1', subject: 'Algebra', level: 1, unique_id: 'a' };
    writeFileSync(join(dir, 'math500/test.jsonl'), [good, { ...good, unique_id: 'b', answer: undefined }].map((r) => JSON.stringify(r)).join('\n') + '\n');
    await expect(loadBenchmark('math500', { dir })).rejects.toThrow(`${join(dir, 'math500/test.jsonl')}:2: no field 'answer' (the gold answer; the row has 'problem', 'subject', 'level', 'unique_id')`);
    mkdirSync(join(dir, 'minerva_math'));
    writeFileSync(join(dir, 'minerva_math/test.jsonl'), JSON.stringify({ problem: 'p', solution: 'no box here', type: 't', idx: 0 }) + '\n');
    await expect(loadBenchmark('minerva', { dir })).rejects.toThrow(`${join(dir, 'minerva_math/test.jsonl')}:1: field 'solution' has no \\boxed{} answer`);
  });

  test('a missing file names the benchmark and the flag', async () => {
    await expect(loadBenchmark('aime24', { dir: '/nonexistent' })).rejects.toThrow('benchmark aime24: /nonexistent/aime24/test.jsonl not found (set the datasets folder with --data_dir)');
  });
});
