/**
 * The loop `lathe critic train` and `lathe extract rft` share (row-train.ts) on a non-finite loss
 * (CPU, the built-in model, lr 1e12): the run stops with a message naming the step and the stream
 * positions of its batch in each recipe's words, the weights before that step are the last
 * checkpoint, and no device tensor is left behind.
 */
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { writeTrajectories, type Trajectory } from '@lathe/data';
import { Device } from '@lathe/runtime';
import { listCheckpoints } from '@lathe/train';
import { defaults } from '../src/options';
import { criticTrainSchema } from '../src/critic-config';
import { extractRftSchema } from '../src/extract-config';
import { runCriticTrain } from '../src/critic';
import { runExtractRft } from '../src/extract';

const dir = mkdtempSync(join(tmpdir(), 'row-train-'));
// prompt "1+2=" (the built-in tokenizer: digit d is d + 3, '+' 13, '=' 14), every attempt correct
const rows: Trajectory[] = [0, 1].flatMap((p) => [[6, 2], [5, 5, 2], [6, 6, 6, 2]].map((out) => ({ prompt_idx: p, prompt: '1+2=', prompt_token_ids: [4, 13, 5, 14], output_token_ids: out, correct: 1 })));
const data = join(dir, 'data.parquet');
beforeAll(() => writeTrajectories(data, rows));

/** Runs `train`, expecting it to fail on a non-finite loss whose message `what` describes; the failing step and its batch's first position. */
async function nonFinite(train: () => Promise<unknown>, what: string): Promise<{ step: number; first: number; last: number }> {
  const tensorsBefore = Device.cpu().memory().tensors;
  const error = await train().then(
    () => undefined,
    (e: Error) => e,
  );
  const m = new RegExp(`^step (\\d+): the loss is (NaN|-?Infinity) on ${what} (\\d+)\\.\\.(\\d+)`).exec(error?.message ?? '');
  expect([error?.message, m !== null]).toEqual([error?.message, true]);
  expect(Device.cpu().memory().tensors).toBe(tensorsBefore);
  return { step: Number(m![1]), first: Number(m![3]), last: Number(m![4]) };
}

test('critic train: the step, its packed rows, and a checkpoint of the weights before it', async () => {
  const run_dir = join(dir, 'critic');
  const cfg = { ...defaults(criticTrainSchema), data, tokenizer: 'builtin:addition', run_dir, max_length: 32, max_remaining: 8, length_bins: 3, ablation: 'no_context' as const, batch_size: 2, steps: 20, lr: 1e12, warmup_steps: 0, save_every: 0 };
  const { step, first, last } = await nonFinite(() => runCriticTrain(cfg), 'packed rows');
  expect([first, last]).toEqual([(step - 1) * 2, (step - 1) * 2 + 1]);
  expect(listCheckpoints(run_dir).at(-1)!.step).toBe(step - 1);
}, 60_000);

test('extract rft: the step, its trajectories in epoch order, and a checkpoint of the weights before it', async () => {
  const run_dir = join(dir, 'rft');
  const cfg = { ...defaults(extractRftSchema), data, tokenizer: 'builtin:addition', run_dir, batch_size: 2, steps: 20, lr: 1e12, warmup_steps: 0, save_every: 0 };
  const { step, first, last } = await nonFinite(() => runExtractRft(cfg), 'trajectories');
  expect([first, last]).toEqual([(step - 1) * 2, (step - 1) * 2 + 1]);
  expect(listCheckpoints(run_dir).at(-1)!.step).toBe(step - 1);
}, 60_000);
