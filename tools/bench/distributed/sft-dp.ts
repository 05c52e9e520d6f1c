/**
 * `lathe sft` through the recipe under `lathe launch` (or alone): the built-in demo task and model on
 * cuda, one process per rank, so the recipe's own data-parallel path runs — joinDataParallel, the
 * device opened through Lathe's kernels, and the gradient reduction it picks (`--grad_overlap`: the
 * all-reduce inside the backward's run by default; `--zero-stage` 1|2 its reduce-scatter form).
 * Every world size trains on the same global batches, so the losses of N ranks with either
 * reduction must equal one process's: with --reference ONE.json rank 0 prints the largest relative
 * loss difference and whether it is within --tol (default 1e-5, float32). --attention is the recipe's
 * option (default: its default): `kernels` trains with Lathe's attention kernels under launch (and,
 * through the recipe's `auto` defaults, the fused log-prob and RoPE kernels beside them; on cuda
 * with --compute bfloat16, on the cpu their float32 host computes). The built-in model's head size
 * (16) is not one the CUDA kernels take, so `--model tiny64` trains a random 2-layer Qwen3 with head
 * size 64 on the built-in task instead (any other --model is the recipe's: a model folder).
 *
 * --lora-rank R: the recipe's LoRA (`--lora_rank`; with --compute bfloat16 its base bound in bfloat16).
 * --grad-bucket-mb: the recipe's `--grad_bucket_mb`.
 *
 * usage (each rank): node .bundle/sft-dp.js [--steps 20] [--grad-overlap true|false] [--zero-stage 0|1|2] [--lora-rank 0] [--grad-bucket-mb 100]
 *   [--attention auto|kernels|flash|composed] [--model builtin:tiny|tiny64|DIR]
 *   [--compute float32|bfloat16] [--device cuda|cpu] [--reference ONE.json] [--tol X] [--out FILE] [--run-dir DIR]
 * (--device cpu: a smoke test of the script over TCP, where every reduction is post-backward)
 * run:  node .bundle/dp-launch.js --gpus 2 -- node .bundle/sft-dp.js --reference one.json --out two.json
 * Prints one JSON line per rank (rank 0's first): the reduction the rank's device allows, the
 * losses, seconds; --out writes rank 0's.
 */
import { existsSync, renameSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { randomModel, type HfConfig } from '@lathe/models';
import { Device } from '@lathe/runtime';
import { worldFromEnv } from '@lathe/distributed';
import { defaults, gradientReduction, runSft, sftSchema, trainAttentionOption, type SftConfig, type TrainAttentionChoice } from '@lathe/recipes';
import { lossParity, reportResult } from './report';
import { arg } from '../argv';
import { QWEN3_0_6B } from '../shapes';

/** The built-in model's size with head size 64, the smallest the CUDA attention kernels take (vocabulary: the built-in character tokenizer's ids fit). */
const TINY64: HfConfig = { ...QWEN3_0_6B, vocab_size: 64, hidden_size: 256, intermediate_size: 512, num_hidden_layers: 2, num_attention_heads: 4, num_key_value_heads: 2, head_dim: 64, max_position_embeddings: 1024 };

/** A random TINY64 in one folder for every rank (seeded, so each rank would write the same): written to a folder of its own, then renamed into place unless another rank got there first. */
function tiny64Model(): string {
  const dir = join(tmpdir(), 'sft-dp-tiny64');
  if (existsSync(join(dir, 'config.json'))) return dir;
  const tmp = `${dir}.tmp-${process.pid}`;
  randomModel(tmp, TINY64, { seed: 1, std: 0.02 });
  try {
    renameSync(tmp, dir);
  } catch (e) {
    rmSync(tmp, { recursive: true, force: true });
    if (!existsSync(join(dir, 'config.json'))) throw e;
  }
  return dir;
}

async function main(): Promise<void> {
  const world = worldFromEnv();
  const steps = Number(arg('steps', '20'));
  const gradOverlap = arg('grad-overlap', 'true') !== 'false';
  const zeroStage = Number(arg('zero-stage', '0'));
  const loraRank = Number(arg('lora-rank', String(defaults(sftSchema).lora_rank)));
  const gradBucketMb = Number(arg('grad-bucket-mb', String(defaults(sftSchema).grad_bucket_mb)));
  const compute = arg('compute', 'float32') as 'float32' | 'bfloat16';
  const deviceKind = arg('device', 'cuda') as 'cuda' | 'cpu';
  const attention = arg('attention', defaults(sftSchema).attention) as TrainAttentionChoice;
  if (!(trainAttentionOption.choices as readonly string[]).includes(attention)) throw new Error(`--attention ${attention}: one of ${trainAttentionOption.choices.join(', ')}`);
  const modelArg = arg('model', defaults(sftSchema).model);
  const model = modelArg === 'tiny64' ? tiny64Model() : modelArg;
  const losses: number[] = [];
  const t0 = performance.now();
  // built apart from the call: `grad_overlap` is the recipe's option (launch-dp.ts's DataParallelOptions.gradOverlap)
  // lathe sft has no --tokenizer flag, but its model loading reads one: the built-in task's characters for tiny64
  const cfg: SftConfig & { tokenizer?: string } = {
    ...defaults(sftSchema),
    model,
    ...(modelArg === 'tiny64' ? { tokenizer: 'builtin:addition' } : {}),
    device: deviceKind,
    compute_dtype: compute,
    attention,
    steps,
    eval_examples: 0,
    eval_every: 0,
    save_every: 0,
    log_every: steps,
    zero_stage: zeroStage,
    grad_overlap: gradOverlap,
    grad_bucket_mb: gradBucketMb,
    lora_rank: loraRank,
    // one run directory for every rank (the ranks check they have the same config), rewritten by each run
    run_dir: arg('run-dir', `/tmp/sft-dp-${world.worldSize}-${world.masterPort}`),
    overwrite: true,
  };
  await runSft(cfg, { onStep: (m) => losses.push(m.loss) });
  const device = Device.open(deviceKind, { id: world.localRank });
  const reduction = gradientReduction({ device: deviceKind, worldSize: world.worldSize, zeroStage, gradOverlap, computeStream: device.computeStream !== undefined });
  const result: Record<string, unknown> = { rank: world.rank, world: world.worldSize, grad_overlap: gradOverlap, grad_bucket_mb: gradBucketMb, lora_rank: loraRank, zero_stage: zeroStage, compute, attention, model: modelArg, reduction, steps, losses, seconds: +((performance.now() - t0) / 1000).toFixed(2) };
  const parity = lossParity(losses, world.rank, compute);
  if (parity) result.parity = parity;
  reportResult(result, world.rank);
}

main().catch((e: Error) => {
  process.stderr.write(`sft-dp rank ${process.env.RANK ?? 0}: ${e.stack ?? e.message}\n`);
  process.exit(1);
});
