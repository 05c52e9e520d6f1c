/**
 * One data-parallel GRPO step on a random Qwen3 (the issue's "64 prompts × 8, 512 new tokens" at
 * the 0.6B shape; `tiny` for a CPU check), one process per rank under `lathe launch` (or alone):
 * each rank samples, scores and trains on its share of the prompts, rank 0 prints the step's time
 * split (the slowest rank's, per phase), its loss and mean reward, and a digest of every prompt's
 * completions — equal digests across world sizes mean the same rollouts (exact on fp32; bf16
 * generation may differ where batch composition changes the kernels' rounding).
 *
 * usage (each rank): node .bundle/grpo-dp.js [--shape 0.6b|tiny] [--device cuda|cpu] [--compute bfloat16|float32]
 *   [--prompts 64] [--group 8] [--prompt-len 64] [--new-tokens 512] [--steps 2] [--micro 16 on CUDA, 4 on the CPU] [--attention flash|composed]
 *   [--grad-reduce-dtype float32|bfloat16] [--out FILE]
 * run:  node .bundle/dp-launch.js --gpus 2 -- node .bundle/grpo-dp.js --out two.json
 * Every rank prints one JSON line (rank 0's first); --out writes rank 0's.
 */
import { createHash } from 'node:crypto';
import { writeFileSync } from 'node:fs';
import { CausalLM, type HfConfig } from '@lathe/models';
import { Device } from '@lathe/runtime';
import { combineRewards, GrpoTrainer, type GrpoStepMetrics, type RlPrompt } from '@lathe/grpo';
import { checkDataParallelBatch, checkSameConfig, gradientAllReduce, NcclCollectives, shardOf, TcpCollectives, worldFromEnv, type Collectives } from '@lathe/distributed';
import { arg } from '../argv';
import { QWEN3_0_6B } from '../shapes';

const TINY: HfConfig = { ...QWEN3_0_6B, vocab_size: 512, hidden_size: 64, intermediate_size: 128, num_hidden_layers: 2, num_attention_heads: 4, num_key_value_heads: 2, head_dim: 16 };
const SHAPES: Record<string, HfConfig> = { '0.6b': QWEN3_0_6B, tiny: TINY };

async function main(): Promise<void> {
  const shape = arg('shape', '0.6b');
  const hf = SHAPES[shape];
  if (!hf) throw new Error(`--shape ${shape}: one of ${Object.keys(SHAPES).join(', ')}`);
  const deviceKind = arg('device', 'cuda') as 'cuda' | 'cpu';
  const compute = arg('compute', deviceKind === 'cuda' ? 'bfloat16' : 'float32') as 'float32' | 'bfloat16';
  const P = Number(arg('prompts', '64'));
  const G = Number(arg('group', '8'));
  const promptLen = Number(arg('prompt-len', '64'));
  const maxNew = Number(arg('new-tokens', '512'));
  const steps = Number(arg('steps', '2'));
  // As the device suite's GRPO step runs it: 16 micro-batches and flash attention on CUDA (with 4
  // micro-batches, 128 rows × 576 tokens of 151,936-wide logits a micro-batch ran out of memory).
  const micro = Number(arg('micro', deviceKind === 'cuda' ? '16' : '4'));
  const attention = arg('attention', deviceKind === 'cuda' ? 'flash' : 'composed') as 'composed' | 'flash';
  const gradReduceDtype = arg('grad-reduce-dtype', 'float32') as 'float32' | 'bfloat16';
  if (gradReduceDtype !== 'float32' && gradReduceDtype !== 'bfloat16') throw new Error(`--grad-reduce-dtype ${String(gradReduceDtype)}: float32 or bfloat16`);
  const world = worldFromEnv();
  checkDataParallelBatch(P, 1, world.worldSize, { batch: '--prompts', micro: '--micro' });
  let group: Collectives | undefined;
  if (world.worldSize > 1) {
    const tcp = await TcpCollectives.connect({ rank: world.rank, worldSize: world.worldSize, addr: world.masterAddr, port: world.masterPort });
    await checkSameConfig(tcp, { shape, compute, P, G, promptLen, maxNew, steps, micro, attention, gradReduceDtype });
    group = deviceKind === 'cuda' ? await NcclCollectives.create(tcp, { deviceId: world.localRank }) : tcp;
  }
  const device = Device.open(deviceKind, { id: world.localRank, sharedArena: deviceKind === 'cuda' });
  const model = CausalLM.random(hf, { seed: 1, std: 0.02 });
  const V = model.config.vocabSize;
  // reward: the share of even token ids in the completion (differs within a group)
  const rewards = combineRewards<Record<string, never>>([{ name: 'even', fn: (_p, c) => { const ids = c.split(' ').filter(Boolean).map(Number); return ids.length ? ids.filter((x) => x % 2 === 0).length / ids.length : 0; } }], { fallback: 0 });
  const trainer = GrpoTrainer.create<Record<string, never>>({
    model, tokenizer: { decode: (ids) => ids.join(' '), padId: 0 }, stopIds: [V - 1], rewards,
    groupSize: G, maxNewTokens: maxNew, loss: { aggregation: 'token-mean', clipHigh: 0.28 }, device, compute, microBatches: micro, attention,
    ...(group ? { dataParallel: { rank: group.rank, worldSize: group.worldSize, allGatherBytes: (b: Uint8Array) => group!.allGatherBytes(b), trainerOptions: { onGradients: gradientAllReduce(group), gradReduceDtype } } } : {}),
  });
  let seed = 7;
  const rand = () => ((seed = (Math.imul(seed, 1664525) + 1013904223) >>> 0) / 2 ** 32);
  const out: Record<string, unknown>[] = [];
  for (let s = 0; s < steps; s++) {
    // every rank draws the same global prompts and keys, then takes its share
    const prompts: RlPrompt<Record<string, never>>[] = Array.from({ length: P }, (_, i) => {
      const ids = Array.from({ length: promptLen }, () => 1 + Math.floor(rand() * (V - 2)));
      return { ids, text: ids.join(' '), meta: {}, key: s * P + i };
    });
    const t0 = performance.now();
    const { metrics, rollouts } = await trainer.step(shardOf(prompts, world.rank, world.worldSize, '--prompts'), 1e-5);
    const wall = performance.now() - t0;
    const mine = { wall, metrics, digests: chunk(rollouts.map((r) => r.completion), G).map((cs) => createHash('sha256').update(cs.join('\n')).digest('hex').slice(0, 12)) };
    const all = group ? (await group.allGatherBytes(new TextEncoder().encode(JSON.stringify(mine)))).map((b) => JSON.parse(new TextDecoder().decode(b)) as typeof mine) : [mine];
    const slowest = (k: keyof GrpoStepMetrics) => Math.max(...all.map((a) => a.metrics[k] as number)) / 1000;
    out.push({
      step: s + 1,
      step_s: Math.max(...all.map((a) => a.wall)) / 1000,
      generation_s: slowest('generation_ms'),
      rewards_s: slowest('rewards_ms'),
      scoring_s: slowest('scoring_ms'),
      training_s: slowest('training_ms'),
      loss: metrics.loss,
      reward_mean: all.reduce((x, a) => x + a.metrics.reward_mean, 0) / all.length,
      response_length_mean: all.reduce((x, a) => x + a.metrics.response_length_mean, 0) / all.length,
      digests: all.flatMap((a) => a.digests),
    });
  }
  const result = { rank: world.rank, world: world.worldSize, backend: group?.backend ?? 'none', shape, compute, prompts: P, group: G, new_tokens: maxNew, micro, grad_reduce_dtype: gradReduceDtype, steps: out, memory: device.memory() };
  trainer.dispose();
  await group?.close();
  const line = JSON.stringify(result);
  if (world.rank === 0 && arg('out', '')) writeFileSync(arg('out', ''), line + '\n');
  console.log(line);
}

function chunk<T>(xs: readonly T[], n: number): T[][] {
  return Array.from({ length: Math.ceil(xs.length / n) }, (_, i) => xs.slice(i * n, (i + 1) * n));
}

main().catch((e: Error) => {
  process.stderr.write(`grpo-dp rank ${process.env.RANK ?? 0}: ${e.stack ?? e.message}\n`);
  process.exit(1);
});
