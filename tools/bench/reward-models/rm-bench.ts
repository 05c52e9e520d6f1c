/**
 * Reward-model training and scoring speed: the Lathe side of tools/reference/reward-models/rm_bench.py,
 * which runs the same batch through transformers' AutoModelForSequenceClassification in the same call.
 *
 * Makes a reward model from a causal-LM folder (the trunk plus a score head drawn with --seed) and
 * saves it to --out, where the reference loads it, then
 *  - trains it as `lathe rm train` does (full fine-tuning: float32 master weights and AdamW, the
 *    Bradley-Terry loss in --compute, flash attention on cuda, clip 1.0, no weight decay): one
 *    warm-up step then --steps timed steps on the pairs of --batch;
 *  - scores every sequence of --batch with the starting weights in --compute, --score-rows rows per
 *    run, once to warm up and then --score-repeats times.
 *
 * usage: node rm-bench.js --model LM_DIR --out RM_DIR --batch batch.json [--device cuda|cpu]
 *          [--compute bfloat16|float32] [--steps 5] [--lr 1e-5] [--score-rows 32] [--score-repeats 3] [--seed 1] [--kernels] [--cuda-graph] [--attention-kernel]
 * batch.json: {"prompt_len": N, "chosen": [[...]], "rejected": [[...]]}: P pairs, each row a
 * prompt (its first prompt_len tokens, shared by the pair) and a response.
 * Prints one JSON line: losses, step_ms (runs + host per step), tokens per step, score_ms per repeat.
 */
import { readFileSync } from 'node:fs';
import { resolve } from 'node:path';
import type { DType } from '@lathe/onnx';
import { CausalLM } from '@lathe/models';
import { bradleyTerryLoss, pairBatch, pairFeeds, RewardModel, trainedWeights, type PreferencePair } from '@lathe/reward-models';
import { Device } from '@lathe/runtime';
import { cudaIncludeDir, FlashAttention, flashAttentionOps, Kernels } from '@lathe/kernels';
import { Trainer } from '@lathe/train';
import { arg, flag } from '../argv';

async function main(): Promise<void> {
  const kind = arg('device', 'cuda') as 'cuda' | 'cpu';
  const compute = arg('compute', kind === 'cuda' ? 'bfloat16' : 'float32') as DType;
  const steps = Number(arg('steps', '5'));
  const lr = Number(arg('lr', '1e-5'));
  const batch = JSON.parse(readFileSync(arg('batch'), 'utf8')) as { prompt_len: number; chosen: number[][]; rejected: number[][] };
  const pairs: PreferencePair[] = batch.chosen.map((c, i) => ({ prompt: c.slice(0, batch.prompt_len), chosen: c.slice(batch.prompt_len), rejected: batch.rejected[i].slice(batch.prompt_len) }));

  const rm = RewardModel.fromCausalLM(await CausalLM.fromPretrained(resolve(arg('model'))), { padTokenId: 0, seed: Number(arg('seed', '1')) });
  rm.save(resolve(arg('out')));
  // --kernels: the GPU through Lathe's kernels, so the Trainer takes the fused AdamW update (its default there).
  // --attention-kernel: attention through Lathe's flash-attention kernels (forward and backward) instead
  // of GroupQueryAttention with its composed backward; implies --kernels.
  const attentionKernel = kind === 'cuda' && flag('attention-kernel');
  const opened = kind === 'cuda' && (flag('kernels') || attentionKernel) ? Kernels.withDevice() : undefined;
  const device = opened?.device ?? Device.open(kind);
  const ops = attentionKernel ? flashAttentionOps('cuda', FlashAttention.compile(opened!.kernels, { includeDir: cudaIncludeDir() })) : undefined;
  const tw = trainedWeights(rm.config, rm.float32Weights(), { compute });
  // --cuda-graph: the step captured once and replayed, so the loss is compiled for the batch's one
  // shape (every pair has the same length); with --kernels the fused AdamW node is asked for, since
  // it is not the default under capture.
  const cudaGraph = flag('cuda-graph');
  const shape: [number, number] | undefined = cudaGraph ? [2 * pairs.length, batch.chosen[0].length] : undefined;
  const loss = bradleyTerryLoss(rm.config, {
    compute,
    weights: tw.weights,
    flashAttention: kind === 'cuda' && compute !== 'float32',
    ...(shape ? { shape } : {}),
    ...(ops ? { attentionKernel: (x, heads) => ops.attend(x, heads, 'kernels') } : {}),
  });
  const session = ops ? { session: { customOpDomains: [ops.domain.handle] } } : {};
  const trainer = Trainer.create(
    { params: tw.params, loss, optimizer: { weightDecay: 0, maxGradNorm: 1 } },
    { params: tw.init },
    { device, ...session, ...(cudaGraph ? { cudaGraph: true, fusedAdamW: flag('kernels') } : {}) },
  );
  const feeds = pairFeeds(pairBatch(pairs, { padId: 0 }), trainer.batchInputs);
  const run = (t: Trainer) => {
    const losses: number[] = [];
    const stepMs: number[] = [];
    for (let s = 0; s <= steps; s++) {
      const r = t.trainStep([feeds], lr);
      losses.push(r.loss);
      stepMs.push(r.runMs + r.hostMs);
    }
    t.dispose();
    return { losses, stepMs };
  };
  const { losses, stepMs } = run(trainer);
  // Under --cuda-graph the same steps again without capture and with the composed update: the losses
  // a replayed step (and the fused node inside it) must reproduce.
  const plainLosses = cudaGraph ? run(Trainer.create({ params: tw.params, loss, optimizer: { weightDecay: 0, maxGradNorm: 1 } }, { params: tw.init }, { device, ...session, fusedAdamW: false })).losses : undefined;

  const scoring = rm.to(device, compute);
  const rows = Number(arg('score-rows', '32'));
  const sequences = [...batch.chosen, ...batch.rejected];
  const T = sequences[0].length;
  const scoreMs: number[] = [];
  let first: number[] = [];
  for (let rep = 0; rep <= Number(arg('score-repeats', '3')); rep++) {
    const t0 = performance.now();
    const scores: number[] = [];
    for (let start = 0; start < sequences.length; start += rows) {
      const part = sequences.slice(start, start + rows);
      const ids = { data: BigInt64Array.from(part.flat().map(BigInt)), dims: [part.length, T] };
      const mask = { data: new BigInt64Array(part.length * T).fill(1n), dims: [part.length, T] };
      scores.push(...(await scoring.score({ inputIds: ids, attentionMask: mask })));
    }
    scoreMs.push(performance.now() - t0);
    if (rep === 0) first = scores;
  }
  console.log(JSON.stringify({ device: device.name, compute, cuda_graph: cudaGraph, attention: ops ? 'kernels' : 'gqa', pairs: pairs.length, seq: T, losses, ...(plainLosses ? { plain_losses: plainLosses } : {}), step_ms: stepMs, step_tokens: 2 * pairs.length * T, score_ms: scoreMs, score_sequences: sequences.length, first_scores: first.slice(0, 4) }));
  scoring.dispose();
  ops?.dispose();
  rm.dispose();
}

main().catch((e: unknown) => {
  console.error(e instanceof Error ? e.stack : e);
  process.exit(1);
});
