/**
 * `lathe sft --cuda_graph`'s padded static-shape path, checked on the CPU: the loss compiled for
 * [batch_size, max_length], every batch right-padded to exactly that and copied into fixed buffers
 * (the Trainer's `staticInputs`, what CUDA graph replay binds) must train as the dynamic
 * path, whose batches are only as wide as their longest example. Padding is masked out of the loss
 * and attention is causal over right-padded rows, so only rounding may differ.
 */
import { existsSync, mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { CausalLM } from '@lathe/models';
import { initLora, loadCheckpoint, loraAdapters, loraFromOptions } from '@lathe/train';
import { defaults, padBatch, runSft, sftSchema, type SftConfig, type TokenizedExample } from '@lathe/recipes';

/** A short built-in run (2-layer model, character tokenizer, "a+b=" examples of ≤ 11 tokens) in a fresh directory. */
function config(over: Partial<SftConfig> = {}): SftConfig {
  return {
    ...defaults(sftSchema),
    run_dir: mkdtempSync(join(tmpdir(), 'lathe-sft-graph-')),
    steps: 6,
    batch_size: 8,
    max_length: 16, // wider than every built-in example: the static path pads each row by 5+ tokens
    eval_examples: 0,
    eval_every: 0,
    save_every: 0,
    warmup_steps: 2,
    lr: 3e-3,
    seed: 3,
    ...over,
  };
}

/** Per-step losses and gradient norms, and the trained values before and after, of one run. */
async function run(cfg: SftConfig, staticShape: boolean) {
  const losses: number[] = [];
  const gradNorms: number[] = [];
  const result = await runSft(cfg, { onStep: (m) => (losses.push(m.loss), gradNorms.push(m.grad_norm)) }, undefined, { staticShapeWithoutCudaGraph: staticShape });
  const base = await CausalLM.fromPretrained(join(cfg.run_dir, 'base-model'));
  const lora = loraFromOptions(cfg);
  const adapters = lora ? loraAdapters(base.config, lora) : undefined;
  const initial = adapters ? initLora(adapters, cfg.seed) : base.float32Weights();
  const final = loadCheckpoint(result.checkpoint, adapters?.flatMap((a) => [a.a, a.b])).values;
  return { losses, gradNorms, initial, final };
}

const maxRelative = (a: number[], b: number[]) => Math.max(...a.map((x, i) => Math.abs(b[i] - x) / Math.abs(x)));

describe.each([
  ['full fine-tuning, composed attention', { attention: 'composed' }],
  ['full fine-tuning, flash attention (no total_sequence_length fed)', { attention: 'flash' }],
  ['LoRA r=4, flash attention', { attention: 'flash', lora_rank: 4, lora_alpha: 8, lr: 1e-2 }],
] as [string, Partial<SftConfig>][])('padded static shape (--cuda_graph path on the CPU): %s', (_, over) => {
  test('per-step losses, gradient norms and final parameters equal the dynamic path to rounding', async () => {
    const cfg = config(over);
    const dynamic = await run(cfg, false);
    const padded = await run({ ...cfg, run_dir: mkdtempSync(join(tmpdir(), 'lathe-sft-graph-')) }, true);
    expect(padded.losses).toHaveLength(cfg.steps);
    // Measured (2 CPU cores): ≤ 1.1e-7 and ≤ 1.7e-7.
    expect(maxRelative(dynamic.losses, padded.losses)).toBeLessThan(1e-5);
    expect(maxRelative(dynamic.gradNorms, padded.gradNorms)).toBeLessThan(1e-5);
    // Parameters: AdamW divides each gradient by its own RMS, so an element whose gradient is
    // rounding noise (|g| ~ 1e-11, far below eps = 1e-8) moves by a noise-sized fraction of lr. Those
    // elements carry the largest differences (≤ 9e-6 here), as large as those from merely
    // reordering the sums (--micro_batches 2 against 1: ≤ 4e-6); measured against the whole update
    // the difference is ≤ 5e-6.
    let diff2 = 0;
    let update2 = 0;
    let maxDiff = 0;
    for (const [name, p] of dynamic.final) {
      const q = padded.final.get(name)!;
      const p0 = dynamic.initial.get(name)!;
      p.forEach((x, i) => {
        diff2 += (x - q[i]) ** 2;
        update2 += (x - p0[i]) ** 2;
        maxDiff = Math.max(maxDiff, Math.abs(x - q[i]));
      });
    }
    expect(update2).toBeGreaterThan(0.1); // the run did train
    expect(Math.sqrt(diff2 / update2)).toBeLessThan(2e-5);
    expect(maxDiff).toBeLessThan(0.01 * cfg.lr);
  }, 30_000);
});

test('--cuda_graph is off by default and refuses --device cpu and --micro_batches > 1 before loading anything', async () => {
  expect(defaults(sftSchema).cuda_graph).toBe(false);
  const cpu = config({ cuda_graph: true, device: 'cpu' });
  await expect(runSft(cpu)).rejects.toThrow('--cuda_graph needs --device cuda');
  expect(existsSync(join(cpu.run_dir, 'base-model'))).toBe(false);
  // (the device check passes on a machine without CUDA: the micro-batch check comes before the device is opened)
  const micro = config({ cuda_graph: true, device: 'cuda', micro_batches: 2 });
  await expect(runSft(micro)).rejects.toThrow('--cuda_graph needs --micro_batches 1 (got 2)');
  expect(existsSync(join(micro.run_dir, 'base-model'))).toBe(false);
  await expect(runSft(config({ micro_batches: 2 }), {}, undefined, { staticShapeWithoutCudaGraph: true })).rejects.toThrow('--cuda_graph needs --micro_batches 1 (got 2)');
});

test('padBatch: right-pads to the longest example by default, or to a given width no narrower than it', () => {
  const examples: TokenizedExample[] = [
    { ids: [5, 6, 7], lossMask: [0, 1, 1], promptLength: 1 },
    { ids: [8, 9], lossMask: [0, 1], promptLength: 1 },
  ];
  const plain = padBatch(examples, 0);
  expect(plain.input_ids.dims).toEqual([2, 3]);
  expect(Array.from(plain.input_ids.data as BigInt64Array, Number)).toEqual([5, 6, 7, 8, 9, 0]);
  const wide = padBatch(examples, 0, 5);
  expect(wide.input_ids.dims).toEqual([2, 5]);
  expect(Array.from(wide.input_ids.data as BigInt64Array, Number)).toEqual([5, 6, 7, 0, 0, 8, 9, 0, 0, 0]);
  expect(Array.from(wide.attention_mask.data as BigInt64Array, Number)).toEqual([1, 1, 1, 0, 0, 1, 1, 0, 0, 0]);
  expect(Array.from(wide.loss_mask.data as BigInt64Array, Number)).toEqual([0, 1, 1, 0, 0, 0, 1, 0, 0, 0]);
  expect(() => padBatch(examples, 0, 2)).toThrow(/width 2 .*longest example \(3 tokens\)/);
});
