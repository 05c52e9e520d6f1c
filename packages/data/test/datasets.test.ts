import { existsSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { gunzipSync } from 'node:zlib';
import { tmpdir } from 'node:os';
import path from 'node:path';
import * as arrow from 'apache-arrow';
import {
  batchOf,
  filterByTokenLength,
  lastBoxed,
  loadGsm8k,
  loadMath,
  loadPreferencePairs,
  loadPrompts,
  loadSftPairs,
  mathToSft,
  readJsonlAll,
  scalarData,
  splitPreference,
  writeJsonl,
  writeParquet,
} from '@lathe/data';

const dir = mkdtempSync(path.join(tmpdir(), 'lathe-datasets-'));
/** The shared datasets beside the repository (CI has them at ../shared). */
const SHARED = path.resolve(__dirname, '../../../../shared/datasets');
const shared = existsSync(SHARED) ? describe : describe.skip;

describe('JSONL', () => {
  test('plain and gzip round trips; gzip detected from content, not the name', async () => {
    const rows = [{ a: 1, s: 'é🙂\n"q"' }, { b: [1, 2], n: null }];
    for (const name of ['x.jsonl', 'x.jsonl.gz']) {
      const file = path.join(dir, name);
      expect(await writeJsonl(file, rows)).toBe(2);
      expect((await readJsonlAll(file)).map((r) => r.value)).toEqual(rows);
    }
    const gz = readFileSync(path.join(dir, 'x.jsonl.gz'));
    expect(gz[0]).toBe(0x1f);
    expect(gunzipSync(gz).toString()).toBe(rows.map((r) => JSON.stringify(r)).join('\n') + '\n');
    const misnamed = path.join(dir, 'gz-named-plain.jsonl');
    writeFileSync(misnamed, gz);
    expect((await readJsonlAll(misnamed)).map((r) => r.value)).toEqual(rows);
  });

  test('errors name the file and line: bad JSON, a non-object, a truncated gzip', async () => {
    const bad = path.join(dir, 'bad.jsonl');
    writeFileSync(bad, '{"a":1}\n\n{"a":\n');
    await expect(readJsonlAll(bad)).rejects.toThrow(`${bad}:3: not valid JSON`);
    const arr = path.join(dir, 'arr.jsonl');
    writeFileSync(arr, '{"a":1}\n[1,2]\n');
    await expect(readJsonlAll(arr)).rejects.toThrow(`${arr}:2: expected a JSON object, got an array`);
    const whole = readFileSync(path.join(dir, 'x.jsonl.gz'));
    const big = path.join(dir, 'big.jsonl.gz');
    await writeJsonl(big, Array.from({ length: 2000 }, (_, i) => ({ i, text: `line ${i} `.repeat(20) })));
    const cut = path.join(dir, 'cut.jsonl.gz');
    writeFileSync(cut, readFileSync(big).subarray(0, 3000));
    await expect(readJsonlAll(cut)).rejects.toThrow(new RegExp(`${cut.replace(/[.]/g, '\\.')}:\\d+: cannot read \\(gzip\\): unexpected end of file`));
    expect(whole.length).toBeGreaterThan(10);
  });
});

describe('loaders on small files made here', () => {
  test('MATH in its original form: the answer is the last \\boxed{}, "Level 3" is 3, `type` is the subject; rows without one are reported', async () => {
    const file = path.join(dir, 'math.jsonl');
    await writeJsonl(file, [
      { problem: 'P1', solution: 'so $\\boxed{\\frac{1}{2}}$ and \\boxed{x^{2}}', level: 'Level 3', type: 'Algebra' },
      { problem: 'P2', solution: 'no box here' },
      { problem: 'P3', solution: 'long', answer: '7', subject: 'Geometry', level: 5, unique_id: 'test/geometry/1.json' },
    ]);
    const { examples, report } = await loadMath(file);
    expect(examples).toEqual([
      { id: '0', problem: 'P1', solution: 'so $\\boxed{\\frac{1}{2}}$ and \\boxed{x^{2}}', answer: 'x^{2}', subject: 'Algebra', level: 3 },
      { id: 'test/geometry/1.json', problem: 'P3', solution: 'long', answer: '7', subject: 'Geometry', level: 5 },
    ]);
    expect(report).toEqual({ file, read: 3, loaded: 2, skipped: [{ where: `${file}:2`, reason: "no 'answer' field and no \\boxed{} in the solution" }] });
    expect(lastBoxed('\\fbox{a{b}c}')).toBe('a{b}c');
    expect(lastBoxed('\\boxed{unclosed')).toBeNull();
  });

  test('MATH as SFT pairs through a template; the SFT form read back; a missing field names file and line', async () => {
    const pairs = mathToSft([{ id: '0', problem: '1+1?', solution: 'It is \\boxed{2}', answer: '2', subject: 'Arithmetic' }], { template: 'Q: {question}\nA:' });
    expect(pairs).toEqual([{ prompt: 'Q: 1+1?\nA:', response: 'It is \\boxed{2}', meta: { answer: '2', subject: 'Arithmetic' } }]);
    const file = path.join(dir, 'sft.jsonl');
    await writeJsonl(file, pairs.map((p) => ({ prompt: p.prompt, response: p.response, subject: 'Arithmetic' })));
    expect((await loadSftPairs(file)).examples).toEqual([{ prompt: 'Q: 1+1?\nA:', response: 'It is \\boxed{2}', meta: { subject: 'Arithmetic' } }]);
    const bad = path.join(dir, 'sft-bad.jsonl');
    await writeJsonl(bad, [{ prompt: 'a', response: 'b' }, { prompt: 'c' }]);
    await expect(loadSftPairs(bad)).rejects.toThrow(`${bad}:2: field 'response' is missing`);
    expect(() => mathToSft([], { template: 'no placeholder' })).toThrow('{question}');
  });

  test('the same loaders read Parquet; errors then name the file and row', async () => {
    const file = path.join(dir, 'prompts.parquet');
    await writeParquet(file, new arrow.Table([batchOf([
      { name: 'question', data: scalarData('string', ['q0', 'q1']) },
      { name: 'answer', data: scalarData('string', ['#### 1,000', 'no marker']) },
      { name: 'level', data: scalarData('int64', [1, 2]) },
    ])]));
    const g = await loadGsm8k(file);
    expect(g.examples).toEqual([{ id: '0', question: 'q0', solution: '#### 1,000', answer: '1000' }]);
    expect(g.report.skipped).toEqual([{ where: `${file} row 1`, reason: "field 'answer' has no '#### n' line" }]);
    const p = await loadPrompts(file, { field: 'question', answerField: 'none' });
    expect(p.examples[1]).toEqual({ id: '1', prompt: 'q1', meta: { answer: 'no marker', level: 2 } });
    await expect(loadPrompts(file)).rejects.toThrow(`${file} row 0: field 'prompt' is missing`);
  });

  test('preference transcripts split at the last shared "\\n\\nAssistant:"', () => {
    const prompt = '\n\nHuman: hi\n\nAssistant: hello\n\nHuman: 2+2?\n\nAssistant:';
    expect(splitPreference(`${prompt} 4`, `${prompt} 5, I think`)).toEqual({ prompt, chosen: ' 4', rejected: ' 5, I think' });
    // Responses that begin alike still split at the turn, not inside the response.
    expect(splitPreference(`${prompt} It is 4.`, `${prompt} It is 5.`)).toEqual({ prompt, chosen: ' It is 4.', rejected: ' It is 5.' });
    expect(splitPreference('\n\nHuman: a', '\n\nHuman: b')).toBeNull();
  });
});

/** Slices (first 40 lines) of the same files, committed so these tests also run without ../shared. */
const FIXTURES = path.resolve(__dirname, '../../../fixtures/datasets');

describe('loaders on slices of the real datasets (fixtures/datasets)', () => {
  test('MATH-500 slice: every row loads, the first answer as in the README, answers match the solutions\' last box', async () => {
    const { examples, report } = await loadMath(path.join(FIXTURES, 'math500-test-head40.jsonl'));
    expect(report).toMatchObject({ read: 40, loaded: 40, skipped: [] });
    expect(examples[0]).toMatchObject({ id: 'test/precalculus/807.json', answer: '\\left( 3, \\frac{\\pi}{2} \\right)', subject: 'Precalculus', level: 2 });
    expect(examples.every((e) => e.level! >= 1 && e.level! <= 5)).toBe(true);
    expect(examples.filter((e) => lastBoxed(e.solution!) === e.answer).length).toBeGreaterThan(34);
  });

  test('GSM8K slice: the first answer is 18 (Janet\'s ducks), every answer a number', async () => {
    const { examples, report } = await loadGsm8k(path.join(FIXTURES, 'gsm8k-test-head40.jsonl'));
    expect(report).toMatchObject({ read: 40, loaded: 40, skipped: [] });
    expect(examples[0].question).toMatch(/^Janet’s ducks/);
    expect(examples[0].answer).toBe('18');
    expect(examples.every((e) => /^-?\d+(\.\d+)?$/.test(e.answer))).toBe(true);
  });

  test('HH-RLHF slice: prompt + response gives back each transcript; only the final turn differs', async () => {
    const file = path.join(FIXTURES, 'hh-rlhf-harmless-base-test-head40.jsonl.gz');
    const raw = (await readJsonlAll(file)).map((r) => r.value as { chosen: string; rejected: string });
    const { examples, report } = await loadPreferencePairs(file);
    expect(raw.length).toBe(40);
    expect(report.loaded + report.skipped.length).toBe(40);
    expect(report.loaded).toBeGreaterThan(30);
    for (const e of examples) {
      const source = raw[Number(e.id)];
      expect(e.prompt + e.chosen).toBe(source.chosen);
      expect(e.prompt + e.rejected).toBe(source.rejected);
      expect(e.prompt.endsWith('\n\nAssistant:')).toBe(true);
    }
  });
});

shared('loaders on the whole datasets in ../shared/datasets (where present)', () => {
  test('MATH-500: 500 problems, the README\'s first answer, 7 subjects, levels 1–5', async () => {
    const { examples, report } = await loadMath(path.join(SHARED, 'math500/test.jsonl'));
    expect(report.loaded).toBe(500);
    expect(examples[0]).toMatchObject({ id: 'test/precalculus/807.json', answer: '\\left( 3, \\frac{\\pi}{2} \\right)', subject: 'Precalculus', level: 2 });
    expect(new Set(examples.map((e) => e.subject)).size).toBe(7);
    expect([...new Set(examples.map((e) => e.level))].sort()).toEqual([1, 2, 3, 4, 5]);
    // The answer field mostly equals the solution's last \boxed{} (an independent check of both fields).
    const agree = examples.filter((e) => lastBoxed(e.solution!) === e.answer).length;
    expect(agree).toBeGreaterThan(450);
  });

  test('GSM8K test: 1,319 problems, the first answer is 18 (Janet\'s ducks), every answer a number', async () => {
    const { examples, report } = await loadGsm8k(path.join(SHARED, 'gsm8k/test.jsonl'));
    expect(report).toMatchObject({ read: 1319, loaded: 1319, skipped: [] });
    expect(examples[0].question).toMatch(/^Janet’s ducks/);
    expect(examples[0].answer).toBe('18');
    expect(examples.every((e) => /^-?\d+(\.\d+)?$/.test(e.answer))).toBe(true);
  });

  test('HH-RLHF harmless-base test: 2,312 pairs; prompt + response gives back each transcript; only the final turn differs', async () => {
    const file = path.join(SHARED, 'hh-rlhf/harmless-base-test.jsonl.gz');
    const raw = (await readJsonlAll(file)).map((r) => r.value as { chosen: string; rejected: string });
    const { examples, report } = await loadPreferencePairs(file);
    expect(raw.length).toBe(2312);
    expect(report.loaded + report.skipped.length).toBe(2312);
    for (const e of examples) {
      const source = raw[Number(e.id)];
      expect(e.prompt + e.chosen).toBe(source.chosen);
      expect(e.prompt + e.rejected).toBe(source.rejected);
      expect(e.prompt.endsWith('\n\nAssistant:')).toBe(true);
      expect(e.chosen.includes('\n\nHuman:') || e.rejected.includes('\n\nHuman:')).toBe(false);
    }
  });

  test('token-length filtering of GSM8K with a whitespace tokenizer, counts reported', async () => {
    const { examples: train } = await loadGsm8k(path.join(SHARED, 'gsm8k/test.jsonl'));
    expect(train.length).toBe(1319);
    const encode = (s: string) => s.split(/\s+/).filter(Boolean).map((w) => w.length);
    const { kept, report } = filterByTokenLength(train, { encode, maxTokens: 60, text: (e) => e.question });
    const expectedKept = train.filter((e) => e.question.split(/\s+/).filter(Boolean).length <= 60).length;
    expect(report).toMatchObject({ total: train.length, kept: expectedKept, dropped: train.length - expectedKept, limit: 60 });
    expect(kept.every((e) => encode(e.question).length <= 60)).toBe(true);
    expect(report.maxTokens).toBe(Math.max(...train.map((e) => encode(e.question).length)));
  });
});

