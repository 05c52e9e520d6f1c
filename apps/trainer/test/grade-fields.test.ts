import { spawnSync } from 'node:child_process';
import path from 'node:path';

const LATHE = path.join(__dirname, '..', 'bin', 'lathe.cjs');
const lathe = (args: string[], rows: object[]) =>
  spawnSync(process.execPath, [LATHE, 'grade', ...args], { input: rows.map((r) => JSON.stringify(r)).join('\n') + '\n', encoding: 'utf8', timeout: 60_000 });
const verdicts = (stdout: string) => stdout.trim().split('\n').map((l) => (JSON.parse(l) as { correct: boolean }).correct);

// GSM8K's own fields (openai/grade-school-math test.jsonl, first row): the gold is a worked solution ending in "#### n"
const gsm8k = {
  question: 'Janet’s ducks lay 16 eggs per day. She eats three for breakfast every morning and bakes muffins for her friends every day with four. She sells the remainder at the farmers\' market daily for $2 per fresh duck egg. How much in dollars does she make every day at the farmers\' market?',
  answer: 'Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 duck eggs a day.\nShe makes 9 * 2 = $<<9*2=18>>18 every day at the farmer’s market.\n#### 18',
};

describe('lathe grade: which fields hold the prediction and the gold answer', () => {
  test('GSM8K rows with a model response grade with no flags (gold from "answer", its "#### n" line)', () => {
    const r = lathe([], [
      { ...gsm8k, response: 'She sells 9 eggs for $2 each.\n#### 18' },
      { ...gsm8k, response: 'The answer is \\boxed{18}.' },
      { ...gsm8k, response: '#### 16' },
    ]);
    expect(r.stderr).not.toMatch(/^lathe grade:/m);
    expect(r.status).toBe(0);
    expect(verdicts(r.stdout)).toEqual([true, true, false]);
  }, 60_000);

  test('--pred_field and --gold_field name other fields; a list of answers (OlympiadBench final_answer) is one comma list', () => {
    const r = lathe(['--pred_field', 'output', '--gold_field', 'final_answer'], [
      { output: '\\boxed{3, 5}', final_answer: ['$3$', '$5$'] },
      { output: '\\boxed{7}', final_answer: ['$8$'] },
    ]);
    expect(r.status).toBe(0);
    expect(verdicts(r.stdout)).toEqual([true, false]);
  }, 60_000);

  test('a line without the named field is an error naming the line, the field and the fields it has', () => {
    const r = lathe(['--pred_field', 'output'], [{ response: '1', gold: '1' }]);
    expect(r.status).toBe(1);
    expect(r.stderr.trimEnd().split('\n')[0]).toBe('lathe grade: stdin:1: no field "output" (the line has "response", "gold"; --pred_field names the prediction\'s)');
    const none = lathe([], [{ text: '1', gold: '1' }]);
    expect(none.stderr.trimEnd().split('\n')[0]).toBe('lathe grade: stdin:1: no prediction field (looked for "pred", "response", "completion"; the line has "text", "gold"; --pred_field names it)');
  }, 60_000);
});
