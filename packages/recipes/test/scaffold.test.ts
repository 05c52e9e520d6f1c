/**
 * The recipes' shared scaffold: the held-out split and the training order, model and tokenizer
 * loading with errors that name the flag, and the run directory's start, resume, evaluation files
 * and config comparison.
 */
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { stringify as toYaml } from 'yaml';
import { randomModel } from '@lathe/models';
import { ADDITION_ALPHABET, BUILTIN_MODEL, BUILTIN_TOKENIZER, configChanges, EpochStream, heldOutSplit, loadRunModel, RunDir, splitHeldOut } from '@lathe/recipes';

const fresh = () => mkdtempSync(join(tmpdir(), 'lathe-scaffold-'));
const items = Array.from({ length: 50 }, (_, i) => i);

test('heldOutSplit: disjoint parts whose union is the input, the same for the same seed, another for another seed', () => {
  const a = heldOutSplit(items, 8, 3);
  expect(a.evaluation).toHaveLength(8);
  expect([...a.evaluation, ...a.train].sort((x, y) => x - y)).toEqual(items);
  expect(heldOutSplit(items, 8, 3)).toEqual(a);
  expect(heldOutSplit(items, 8, 4).evaluation).not.toEqual(a.evaluation);
  // a larger held-out count extends the smaller one's held-out set (one permutation, cut later)
  expect(heldOutSplit(items, 12, 3).evaluation.slice(0, 8)).toEqual(a.evaluation);
  expect(() => splitHeldOut(items, { data: 'd.jsonl', eval_examples: 50, seed: 0 }, 'prompts')).toThrow('--eval_examples 50 leaves no training prompts (50 prompts in d.jsonl)');
});

test('EpochStream: each epoch visits every item once; a stream resumed at a position continues the same order', () => {
  const stream = new EpochStream(items.slice(0, 7), 5);
  const first = stream.take(7);
  expect([...first].sort()).toEqual(items.slice(0, 7));
  const next = stream.take(10);
  expect([...next.slice(0, 7)].sort()).toEqual(items.slice(0, 7));
  expect(new EpochStream(items.slice(0, 7), 5, 7).take(10)).toEqual(next);
});

test('loadRunModel: the built-in model reads the built-in tokenizer; a folder without config.json, tokenizer.json or with too small a vocabulary is refused by flag', async () => {
  const runDir = fresh();
  const builtin = await loadRunModel({ model: BUILTIN_MODEL, prompt_format: 'raw', enable_thinking: false, run_dir: runDir, seed: 0 });
  expect(builtin.dir).toBe(join(runDir, 'base-model'));
  expect(builtin.tokenizerFrom).toBeUndefined();
  expect(builtin.tokenizer.decode(builtin.tokenizer.encodePrompt('12+3='))).toBe('12+3=');
  expect(builtin.config.vocabSize).toBeGreaterThanOrEqual(ADDITION_ALPHABET.length);
  await expect(loadRunModel({ model: BUILTIN_MODEL, prompt_format: 'chat', enable_thinking: false, run_dir: fresh(), seed: 0 })).rejects.toThrow(`--prompt_format chat: the ${BUILTIN_TOKENIZER} tokenizer has no chat template`);

  const empty = fresh();
  await expect(loadRunModel({ model: empty, prompt_format: 'raw', enable_thinking: false, run_dir: fresh(), seed: 0 })).rejects.toThrow(`--model ${empty}: no config.json in that folder`);
  // the built-in model's folder has weights but no tokenizer.json
  const base = builtin.dir;
  await expect(loadRunModel({ model: base, prompt_format: 'raw', enable_thinking: false, run_dir: fresh(), seed: 0 })).rejects.toThrow(`--model ${base}: no tokenizer.json in ${base}`);
  await expect(loadRunModel({ model: base, tokenizer: 'model', prompt_format: 'raw', enable_thinking: false, run_dir: fresh(), seed: 0 })).rejects.toThrow(`uses --tokenizer ${BUILTIN_TOKENIZER}`);
  // a named built-in tokenizer over a model folder; a vocabulary smaller than the tokenizer's is refused
  const loaded = await loadRunModel({ model: base, tokenizer: BUILTIN_TOKENIZER, prompt_format: 'raw', enable_thinking: false, run_dir: fresh(), seed: 0 });
  expect(loaded.tokenizer.encode('7')).toEqual(builtin.tokenizer.encode('7'));
  const small = fresh();
  randomModel(small, { architectures: ['Qwen3ForCausalLM'], vocab_size: 4, hidden_size: 8, intermediate_size: 16, num_hidden_layers: 1, num_attention_heads: 1, num_key_value_heads: 1, head_dim: 8, rms_norm_eps: 1e-6, rope_theta: 10000, max_position_embeddings: 16 }, { seed: 0 });
  await expect(loadRunModel({ model: small, tokenizer: BUILTIN_TOKENIZER, prompt_format: 'raw', enable_thinking: false, run_dir: fresh(), seed: 0 })).rejects.toThrow(
    new RegExp(`--tokenizer ${BUILTIN_TOKENIZER}: the tokenizer has \\d+ ids but the model's vocab_size is 4`),
  );
});

test('RunDir: a resume needs a checkpoint; evaluation files read back as written; config changes leave out the resumable keys', () => {
  const dir = fresh();
  expect(() => RunDir.open({ run_dir: dir, resume: true, overwrite: false })).toThrow(`--resume: no checkpoint in ${join(dir, 'checkpoints')}`);
  const run = RunDir.open({ run_dir: dir, resume: false, overwrite: false });
  expect(run.latest).toBeUndefined();
  run.saveConfig({ lr: 0.1, steps: 3 });
  run.writeEval(0, [{ correct: true }, { correct: false }]);
  run.writeEval(5, [{ correct: true }]);
  expect(run.readEvals<{ correct: boolean }>(4)).toEqual([{ step: 0, rows: [{ correct: true }, { correct: false }] }]);
  expect(run.readEvals(5).map((e) => e.step)).toEqual([0, 5]);
  expect(run.savedAt(0)).toBeUndefined();

  const saved = join(dir, 'saved.yaml');
  writeFileSync(saved, toYaml({ lr: 0.1, steps: 3, log_every: 1 }));
  expect(configChanges(saved, { lr: 0.2, steps: 3, log_every: 5 }, ['log_every'])).toEqual([{ key: 'lr', text: 'lr: 0.1 → 0.2' }]);
  // an option the saved run predates is not a change (a release that adds one still resumes old runs)
  expect(configChanges(saved, { lr: 0.1, steps: 3, log_every: 1, residual_dtype: 'compute' }, [])).toEqual([]);
});
