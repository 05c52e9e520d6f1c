/**
 * `lathe critic train`, `label` and `eval` end to end at a tiny size (CPU, the built-in model): the
 * labelled Parquet holds every column with one entry per output token, its realised Q agrees with
 * the evaluation's first-token Q, and a resume continues from the checkpoint.
 */
import { existsSync, mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { readParquet, writeTrajectories, type Trajectory } from '@lathe/data';
import { auc } from '@lathe/critic';
import { defaults } from '../src/options';
import { criticEvalSchema, criticLabelSchema, criticTrainSchema } from '../src/critic-config';
import { runCriticTrain } from '../src/critic';
import { runCriticEval, runCriticLabel } from '../src/critic-label';
import { additionTokenizer } from '../src/demo-task';

test('train, resume, label and eval a tiny critic', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'critic-cmd-'));
  // prompt "1+2=" (ids of the built-in character tokenizer: digit d is d + 3, '+' 13, '=' 14), attempts of digits
  const rows: Trajectory[] = [0, 1].flatMap((p) =>
    [[6, 2], [5, 5, 2], [6, 6, 6, 2]].map((out, k) => ({ prompt_idx: p, prompt: '1+2=', prompt_token_ids: [4, 13, 5, 14], output_token_ids: out, correct: k === 0 ? 1 : 0 })),
  );
  const data = join(dir, 'data.parquet');
  await writeTrajectories(data, rows);
  const base = { ...defaults(criticTrainSchema), data, tokenizer: 'builtin:addition', run_dir: join(dir, 'run'), max_length: 32, max_remaining: 8, length_bins: 3, ablation: 'no_feedback' as const, batch_size: 2, lr: 1e-3, save_every: 2, log_every: 1 };
  // interrupted after step 2 (as Ctrl-C does), then resumed to the end
  const stop = new AbortController();
  const first = await runCriticTrain({ ...base, steps: 3 }, { onStep: (m) => m.step === 2 && stop.abort() }, stop.signal);
  expect(first.interrupted).toBe(true);
  expect(first.checkpoint).toMatch(/step-00000002$/);
  expect(existsSync(join(first.checkpoint, 'critic_bins.json'))).toBe(true);
  const resumed = await runCriticTrain({ ...base, steps: 3, resume: true });
  expect(resumed.steps).toBe(3);

  const output = join(dir, 'labelled.parquet');
  const summary = await runCriticLabel({ ...defaults(criticLabelSchema), critic: resumed.checkpoint, model: join(dir, 'run', 'base-model'), tokenizer: 'builtin:addition', data, output, min_p: 0.5, max_candidates: 4 });
  expect(summary).toMatchObject({ rows: 6, positions: 18, output });
  const table = await readParquet(output);
  for (const col of ['candidate_ids', 'candidate_q_values', 'candidate_ref_logprobs', 'candidate_remaining', 'token_q_values', 'token_remaining', 'token_entropies', 'correct']) expect(table.schema.fields.map((f) => f.name)).toContain(col);
  const q = table.getChild('token_q_values')!;
  const cands = table.getChild('candidate_ids')!;
  for (let i = 0; i < 6; i++) {
    expect((q.get(i) as { length: number }).length).toBe(rows[i].output_token_ids.length);
    expect((cands.get(i) as { length: number }).length).toBe(rows[i].output_token_ids.length);
    // an entropy per output token, within [0, log V] of the built-in vocabulary
    const ent = Array.from((table.getChild('token_entropies')!.get(i) as { toArray(): Float32Array }).toArray());
    expect(ent).toHaveLength(rows[i].output_token_ids.length);
    for (const e of ent) expect(e >= 0 && e <= Math.log(additionTokenizer().vocabSize) + 1e-5).toBe(true);
  }

  const points = await runCriticEval({ ...defaults(criticEvalSchema), critic: resumed.checkpoint, tokenizer: 'builtin:addition', data, output: join(dir, 'eval.json') });
  expect(points.map((p) => p.context_attempts)).toEqual([0]);
  const firstQ = Array.from({ length: 6 }, (_, i) => Number((q.get(i) as { toArray(): Float32Array }).toArray()[0]));
  expect(points[0].auc).toBeCloseTo(auc(firstQ, rows.map((r) => r.correct!)), 5);
  expect(existsSync(join(dir, 'eval.json'))).toBe(true);
  // in-context attempts need their feedback spelled, which the digits-only tokenizer cannot
  await expect(runCriticEval({ ...defaults(criticEvalSchema), critic: resumed.checkpoint, tokenizer: 'builtin:addition', data, max_context: 1 })).rejects.toThrow('is not in the alphabet');
  await expect(runCriticEval({ ...defaults(criticEvalSchema), critic: resumed.checkpoint, tokenizer: 'builtin:addition', data, max_context: 3 })).rejects.toThrow('row 0 (prompt_idx 0) has 2 other attempts at its prompt, fewer than 3 in-context attempts');
}, 120_000);
