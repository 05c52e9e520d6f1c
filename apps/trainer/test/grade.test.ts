import { spawnSync } from 'node:child_process';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';

const LATHE = path.join(__dirname, '..', 'bin', 'lathe.cjs');

function lathe(args: string[], input?: string) {
  const r = spawnSync(process.execPath, [LATHE, ...args], { input, encoding: 'utf8', timeout: 60_000 });
  return { status: r.status, stdout: r.stdout, stderr: r.stderr };
}

describe('lathe grade', () => {
  test('grades stdin in order, accepting "response" for "pred", with a summary on stderr', () => {
    const lines = [
      { pred: 'so \\boxed{\\frac{1}{2}}', gold: '0.5' },
      { response: '<think>x</think><answer>7</answer>', gold: 8 },
      { pred: 'I do not know, there is no answer in this long sentence at all', gold: '3' },
      { pred: '(x+1)^2', gold: 'x^2+2x+1' },
    ];
    const r = lathe(['grade'], lines.map((l) => JSON.stringify(l)).join('\n') + '\n');
    expect(r.status).toBe(0);
    const out = r.stdout.trim().split('\n').map((l) => JSON.parse(l));
    expect(out).toEqual([
      { correct: true, extracted: '\\frac{1}{2}' },
      { correct: false, extracted: '7' },
      { correct: false, extracted: null },
      { correct: true, extracted: '(x+1)^2' },
    ]);
    expect(r.stderr).toMatch(/graded 4: 2 correct \(50\.00%\), 1 without an answer/);
  });

  test('reads a file, honours --format and the option flags', () => {
    const dir = mkdtempSync(path.join(tmpdir(), 'lathe-grade-'));
    const file = path.join(dir, 'preds.jsonl');
    writeFileSync(file, [{ pred: 'Total: 5\n#### 5', gold: 'x\n#### 5' }, { pred: '28%', gold: '0.28' }].map((l) => JSON.stringify(l)).join('\n'));
    const gsm = lathe(['grade', file, '--format', 'gsm8k', '--percent', 'strip']);
    expect(gsm.status).toBe(0);
    expect(gsm.stdout.trim().split('\n').map((l) => JSON.parse(l).correct)).toEqual([true, false]);
  });

  test('--set_relation lets an inequality answer a gold interval; --timing adds each line\'s time', () => {
    const line = `${JSON.stringify({ pred: '$-2 \\le x \\le 7$', gold: '$[-2, 7]$' })}\n`;
    const verdict = (args: string[]) => JSON.parse(lathe(['grade', ...args], line).stdout.trim());
    expect(verdict([]).correct).toBe(false);
    expect(verdict(['--set_relation']).correct).toBe(true);
    const timed = verdict(['--timing']);
    expect(typeof timed.ms).toBe('number');
    expect(timed.ms).toBeLessThan(2000);
  });

  test('a malformed line is an error naming the source and line', () => {
    const r = lathe(['grade'], '{"pred": "1", "gold": "1"}\nnot json\n');
    expect(r.status).not.toBe(0);
    expect(r.stderr).toContain('stdin:2: not valid JSON');
  });

  test('a bad flag value is refused', () => {
    const r = lathe(['grade', '--format', 'nope'], '');
    expect(r.status).not.toBe(0);
    expect(r.stderr).toMatch(/format/);
  });
});
