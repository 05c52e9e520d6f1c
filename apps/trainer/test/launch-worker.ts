/**
 * A data-parallel training script for the launcher's tests (not a test itself): joins the job
 * from the environment as a lathe command does (`joinDataParallel`), trains a tiny decoder for a
 * few SFT steps on its share of each global batch, and prints one JSON line with the losses.
 *
 * Argument: a JSON config file; `%r` in its path is replaced by RANK (so ranks can be given
 * different configs). Config: { steps, batch_size, micro_batches, lr, die_at_step?, die_rank? }.
 */
import { mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { CausalLM, paramSpecs, randomModel } from '@lathe/models';
import type { HostTensor } from '@lathe/runtime';
import { joinDataParallel } from '@lathe/recipes';
import { sftLoss, Trainer, type TrainableParam } from '@lathe/train';

interface WorkerConfig {
  steps: number;
  batch_size: number;
  micro_batches: number;
  lr: number;
  die_at_step?: number;
  die_rank?: number;
}

const tiny = { architectures: ['Qwen3ForCausalLM'], vocab_size: 40, hidden_size: 16, intermediate_size: 24, num_hidden_layers: 1, num_attention_heads: 2, num_key_value_heads: 1, head_dim: 8, rms_norm_eps: 1e-6, rope_theta: 10000, max_position_embeddings: 64, tie_word_embeddings: false };

function rows(step: number, n: number): { ids: number[]; prompt: number }[] {
  let s = 77 + step;
  const next = () => (s = (Math.imul(s, 1664525) + 1013904223) >>> 0);
  return Array.from({ length: n }, () => ({ ids: Array.from({ length: 4 + (next() % 7) }, () => 1 + (next() % 39)), prompt: 1 + (next() % 2) }));
}

function batchOf(rs: { ids: number[]; prompt: number }[], lossTokens: number): Record<string, HostTensor> {
  const T = Math.max(...rs.map((r) => r.ids.length));
  const col = (f: (r: { ids: number[]; prompt: number }, t: number) => number) => BigInt64Array.from(rs.flatMap((r) => Array.from({ length: T }, (_, t) => BigInt(f(r, t)))));
  return {
    input_ids: { data: col((r, t) => r.ids[t] ?? 0), dims: [rs.length, T] },
    attention_mask: { data: col((r, t) => Number(t < r.ids.length)), dims: [rs.length, T] },
    loss_mask: { data: col((r, t) => Number(t < r.ids.length && t >= r.prompt)), dims: [rs.length, T] },
    loss_tokens: { data: Float32Array.from([lossTokens]), dims: [] },
  };
}

async function main(): Promise<void> {
  const file = process.argv[2].replace('%r', process.env.RANK ?? '0');
  const cfg = JSON.parse(readFileSync(file, 'utf8')) as WorkerConfig;
  const dp = await joinDataParallel({ device: 'cpu', config: { ...cfg }, batch: { rows: cfg.batch_size, microBatches: cfg.micro_batches }, timeoutMs: 20_000 });
  const dir = mkdtempSync(join(tmpdir(), 'lathe-launch-worker-'));
  const config = randomModel(dir, tiny, { seed: 4, std: 0.3 });
  const params: TrainableParam[] = paramSpecs(config).map((s) => ({ name: s.name, shape: s.shape, decay: s.kind === 'matrix' }));
  const trainer = Trainer.create({ params, loss: sftLoss(config) }, { params: CausalLM.fromPretrainedSync(dir).float32Weights() }, { microBatches: cfg.micro_batches, ...(dp ? { onGradients: dp.onGradients } : {}) });
  const losses: number[] = [];
  for (let step = 0; step < cfg.steps; step++) {
    if (cfg.die_at_step === step && Number(process.env.RANK ?? 0) === cfg.die_rank) {
      process.stderr.write(`worker: rank ${cfg.die_rank} exits on purpose at step ${step}\n`);
      process.exit(3);
    }
    const global = rows(step, cfg.batch_size);
    const lossTokens = global.reduce((s, r) => s + r.ids.length - r.prompt, 0);
    const mine = dp ? dp.shard(global) : global;
    const per = mine.length / cfg.micro_batches;
    const micro = Array.from({ length: cfg.micro_batches }, (_, k) => batchOf(mine.slice(k * per, (k + 1) * per), lossTokens));
    losses.push((await trainer.trainStepAsync(micro, cfg.lr)).loss);
  }
  trainer.dispose();
  await dp?.close();
  console.log(JSON.stringify({ rank: dp?.world.rank ?? 0, world: dp?.world.worldSize ?? 1, losses }));
}

main().catch((e: Error) => {
  process.stderr.write(`worker rank ${process.env.RANK ?? 0}: ${e.message}\n`);
  process.exit(1);
});
