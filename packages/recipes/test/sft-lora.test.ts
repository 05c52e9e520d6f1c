/**
 * `lathe sft` with LoRA: with dropout, an interrupted and resumed run equals an uninterrupted one bit for
 * bit (the masks are a function of seed, step and micro-batch), and bad values are refused by name.
 */
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { loadCheckpoint, loraAdapters, type LoraAdapter, type TrainableParam } from '@lathe/train';
import { defaults, resolveConfig, runSft, sftSchema, type SftConfig } from '@lathe/recipes';

const adapterParams = (adapters: LoraAdapter[]): TrainableParam[] => adapters.flatMap((a) => [a.a, a.b]);

/** A short built-in LoRA run in a fresh directory. */
function sftConfig(over: Partial<SftConfig> = {}): SftConfig {
  return {
    ...defaults(sftSchema),
    run_dir: mkdtempSync(join(tmpdir(), 'lathe-sft-lora-')),
    steps: 20,
    batch_size: 8,
    micro_batches: 2,
    eval_examples: 0,
    eval_every: 0,
    save_every: 0,
    warmup_steps: 2,
    lr: 1e-2,
    lora_rank: 4,
    lora_alpha: 8,
    lora_targets: 'q_proj|v_proj|down_proj',
    lora_dropout: 0.3,
    ...over,
  };
}

test('resume with lora_dropout 0.3 is exact: 20 steps == 10 + resume + 10 (adapters and moments bit-identical)', async () => {
  const losses: number[] = [];
  const straight = await runSft(sftConfig(), { onStep: (m) => losses.push(m.loss) });
  const dir = mkdtempSync(join(tmpdir(), 'lathe-sft-lora-'));
  const controller = new AbortController();
  const first = await runSft(sftConfig({ run_dir: dir }), { onStep: (m) => m.step === 10 && controller.abort() }, controller.signal);
  expect(first.steps).toBe(10);
  const resumed = await runSft(sftConfig({ run_dir: dir, resume: true }));
  expect(resumed.steps).toBe(20);
  const model = loadCheckpoint(straight.checkpoint, []).config;
  const trainable = adapterParams(loraAdapters(model, { rank: 4, alpha: 8, targets: 'q_proj|v_proj|down_proj' }));
  const a = loadCheckpoint(straight.checkpoint, trainable);
  const b = loadCheckpoint(resumed.checkpoint, trainable);
  expect(b.state).toEqual(a.state);
  expect(a.values.size).toBe(2 * 3 * model.numLayers);
  for (const [name, w] of a.model) expect([name, Buffer.from(b.model.get(name)!.buffer).equals(Buffer.from(w.buffer))]).toEqual([name, true]);
  for (const [name, v] of a.values) {
    expect([name, Buffer.from(b.values.get(name)!.buffer).equals(Buffer.from(v.buffer))]).toEqual([name, true]);
    expect([name, Buffer.from(b.m.get(name)!.buffer).equals(Buffer.from(a.m.get(name)!.buffer))]).toEqual([name, true]);
    expect([name, Buffer.from(b.v.get(name)!.buffer).equals(Buffer.from(a.v.get(name)!.buffer))]).toEqual([name, true]);
  }
  // dropout is on in these runs: without it the same steps give other losses (B = 0 at step 1, so from step 2)
  const plain: number[] = [];
  await runSft(sftConfig({ steps: 3, lora_dropout: 0 }), { onStep: (m) => plain.push(m.loss) });
  expect(plain[0]).toBe(losses[0]);
  expect(Math.abs(plain[2] - losses[2])).toBeGreaterThan(1e-6);
}, 120_000);

test('bad lora_dropout values are refused with a message naming lora_dropout', async () => {
  for (const bad of [-0.1, 1]) {
    expect(() => resolveConfig(sftSchema, [{ name: 'command line', values: { lora_dropout: bad } }])).toThrow(/lora_dropout/);
    await expect(runSft(sftConfig({ lora_dropout: bad, steps: 1 }))).rejects.toThrow(/lora_dropout/);
  }
  expect(resolveConfig(sftSchema, [{ name: 'command line', values: { lora_dropout: 0.05 } }]).lora_dropout).toBe(0.05);
  // dropout without LoRA is a mistake, not a silent no-op
  await expect(runSft(sftConfig({ lora_rank: 0, lora_dropout: 0.1, steps: 1 }))).rejects.toThrow(/--lora_dropout 0.1 applies to LoRA adapters/);
});

test('--quantize_base nf4 (QLoRA): the losses fall and track LoRA over the float32 base; the checkpoint holds the adapters and a merged model; without LoRA it is refused', async () => {
  const dense: number[] = [];
  const q: number[] = [];
  await runSft(sftConfig({ lora_dropout: 0 }), { onStep: (m) => dense.push(m.loss) });
  const result = await runSft(sftConfig({ lora_dropout: 0, quantize_base: 'nf4', save_every: 0 }), { onStep: (m) => q.push(m.loss) });
  expect(q).toHaveLength(20);
  // NF4 moves the frozen base a little: the first loss close to LoRA's over float32, never identical; then both learn
  expect(Math.abs(q[0] - dense[0]) / dense[0]).toBeLessThan(0.05);
  expect(q[0]).not.toBe(dense[0]);
  // measured: LoRA 2.780 → 2.347, QLoRA 2.783 → 2.338 over the 20 steps
  expect(q.at(-1)!).toBeLessThan(0.9 * q[0]);
  expect(Math.abs(q.at(-1)! - dense.at(-1)!) / dense.at(-1)!).toBeLessThan(0.05);
  const model = loadCheckpoint(result.checkpoint, []).config;
  const trainable = adapterParams(loraAdapters(model, { rank: 4, alpha: 8, targets: 'q_proj|v_proj|down_proj' }));
  const c = loadCheckpoint(result.checkpoint, trainable);
  expect([...c.values.keys()].sort()).toEqual(trainable.map((t) => t.name).sort());
  await expect(runSft(sftConfig({ lora_rank: 0, lora_dropout: 0, quantize_base: 'nf4' }))).rejects.toThrow('--quantize_base nf4 trains LoRA adapters over a frozen quantized base: set --lora_rank > 0');
}, 120_000);
