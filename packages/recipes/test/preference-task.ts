/**
 * The demo task's preference set at a size a test learns in seconds: every "a+b=" with a, b < 5,
 * the true sum preferred to each other digit and to three malformed answers (none, "+", "="), as
 * JSONL; and the same 25 problems as GRPO prompts with their answers.
 */
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';

/** The wrong answers each problem's true sum is preferred to. */
export const WRONG = ['0', '1', '2', '3', '4', '5', '6', '7', '8', '9', '', '+', '='];

/** Writes pairs.jsonl (25 × 12 pairs) and prompts.jsonl (25 problems) into `dir`; returns their paths. */
export function writeAdditionTask(dir: string): { pairs: string; prompts: string } {
  const pairs: string[] = [];
  const prompts: string[] = [];
  for (let a = 0; a < 5; a++) {
    for (let b = 0; b < 5; b++) {
      const prompt = `${a}+${b}=`;
      const sum = String(a + b);
      prompts.push(JSON.stringify({ prompt, answer: sum }));
      for (const wrong of WRONG) if (wrong !== sum) pairs.push(JSON.stringify({ prompt, chosen: sum, rejected: wrong }));
    }
  }
  const files = { pairs: join(dir, 'pairs.jsonl'), prompts: join(dir, 'prompts.jsonl') };
  writeFileSync(files.pairs, pairs.join('\n') + '\n');
  writeFileSync(files.prompts, prompts.join('\n') + '\n');
  return files;
}
