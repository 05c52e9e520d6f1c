/** Loaders for the public math evaluation sets (MATH-500, GSM8K) in their JSONL layouts. */
import { readFileSync } from 'node:fs';
import { gsm8kAnswer } from '../math/extract';

/** One evaluation problem: its text, gold answer and (MATH) subject and level. */
export interface MathProblem {
  id: string;
  problem: string;
  answer: string;
  subject?: string;
  level?: number;
}

function readJsonl(file: string): Record<string, unknown>[] {
  const text = readFileSync(file, 'utf8');
  return text
    .split('\n')
    .filter((l) => l.trim() !== '')
    .map((l, i) => {
      try {
        return JSON.parse(l) as Record<string, unknown>;
      } catch {
        throw new Error(`${file}:${i + 1}: not valid JSON`);
      }
    });
}

function field(row: Record<string, unknown>, name: string, file: string, line: number): string {
  const v = row[name];
  if (typeof v === 'string') return v;
  if (typeof v === 'number') return String(v);
  throw new Error(`${file}:${line}: field "${name}" missing or not a string`);
}

/** MATH-500 rows (`problem`, `answer`, `subject`, `level`, `unique_id`). */
export function loadMath500(file: string): MathProblem[] {
  return readJsonl(file).map((r, i) => ({
    id: typeof r.unique_id === 'string' ? r.unique_id : String(i),
    problem: field(r, 'problem', file, i + 1),
    answer: field(r, 'answer', file, i + 1),
    subject: field(r, 'subject', file, i + 1),
    level: Number(field(r, 'level', file, i + 1)),
  }));
}

/** GSM8K rows (`question`, `answer` with the final number after `#### `). */
export function loadGsm8k(file: string): MathProblem[] {
  return readJsonl(file).map((r, i) => {
    const solution = field(r, 'answer', file, i + 1);
    const answer = gsm8kAnswer(solution);
    if (answer === null) throw new Error(`${file}:${i + 1}: field "answer" has no "#### n" line`);
    return { id: String(i), problem: field(r, 'question', file, i + 1), answer: answer.replace(/,/g, '') };
  });
}
