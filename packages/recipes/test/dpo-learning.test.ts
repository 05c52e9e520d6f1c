/**
 * Learning, shown on CPU with the command's own recipe: `runDpo` on the demo task's preference set
 * (preference-task.ts) moves the built-in tiny model's held-out implicit-reward accuracy from no
 * preference at all (π = π_ref: every margin 0) to ≥ 0.9, and the saved policy's own answers — the
 * digit it finds most likely after "a+b=", read from the checkpoint — from chance to mostly right.
 */
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { CausalLM } from '@lathe/models';
import { ResponseLogprobScorer } from '@lathe/reward-models';
import { Device } from '@lathe/runtime';
import { additionTokenizer, defaults, dpoSchema, runDpo } from '@lathe/recipes';
import { writeAdditionTask } from './preference-task';

const root = mkdtempSync(join(tmpdir(), 'lathe-dpo-learning-'));
const task = writeAdditionTask(root);

/** The share of the 25 problems whose most likely next digit after "a+b=" is the sum, under the model in `dir`. */
async function greedyAccuracy(dir: string): Promise<number> {
  const tok = additionTokenizer();
  const model = CausalLM.fromPretrainedSync(dir);
  const scorer = ResponseLogprobScorer.create(model.config, Device.cpu());
  const rows: number[][] = [];
  for (let a = 0; a < 5; a++) for (let b = 0; b < 5; b++) for (let d = 0; d < 10; d++) rows.push([tok.bosId, ...tok.encode(`${a}+${b}=${d}`)]);
  const T = rows[0].length;
  const t = (f: (r: number[], k: number) => number) => ({ data: BigInt64Array.from(rows.flatMap((r) => r.map((_, k) => BigInt(f(r, k))))), dims: [rows.length, T] });
  const logp = await scorer.score({ inputIds: t((r, k) => r[k]), attentionMask: t(() => 1), responseMask: t((_, k) => (k === T - 1 ? 1 : 0)) }, model.float32Weights());
  scorer.dispose();
  let right = 0;
  for (let p = 0; p < 25; p++) {
    const digits = Array.from(logp.subarray(10 * p, 10 * p + 10));
    right += digits.indexOf(Math.max(...digits)) === Math.floor(p / 5) + (p % 5) ? 1 : 0;
  }
  return right / 25;
}

test("lathe dpo: held-out implicit-reward accuracy from no preference to ≥ 0.9; the policy's own answers from chance to mostly right", async () => {
  const t0 = performance.now();
  const result = await runDpo({ ...defaults(dpoSchema), data: task.pairs, run_dir: join(root, 'dpo'), steps: 200, batch_size: 32, lr: 1e-3, beta: 0.1, eval_examples: 40, eval_every: 50, log_every: 50, save_every: 0 });
  const seconds = (performance.now() - t0) / 1000;
  const [before, after] = [result.evals[0], result.evals.at(-1)!];
  const answersBefore = await greedyAccuracy(join(root, 'dpo', 'base-model'));
  const answersAfter = await greedyAccuracy(result.checkpoint);
  console.log(
    `dpo: held-out implicit-reward accuracy ${before.accuracy.toFixed(3)} (margin ${before.margin.toFixed(4)}) → ${after.accuracy.toFixed(3)} (margin ${after.margin.toFixed(3)}) in ${result.steps} steps, ${seconds.toFixed(1)} s; ` +
      `greedy answers right ${answersBefore.toFixed(2)} → ${answersAfter.toFixed(2)}`,
  );
  expect(before.margin).toBe(0); // π = π_ref: no preference at all
  expect(after.accuracy).toBeGreaterThanOrEqual(0.9);
  expect(after.margin).toBeGreaterThan(0);
  expect(after.chosen_logp).toBeGreaterThan(before.chosen_logp);
  expect(answersBefore).toBeLessThan(0.3); // about chance: 1 in 10 digits
  expect(answersAfter).toBeGreaterThanOrEqual(0.7);
}, 120_000);
