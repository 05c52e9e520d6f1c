/**
 * Critic speed at a model preset's shape with random weights (Qwen3-0.6B on the GPU):
 *  - training: tokens/s of the critic loss (packed in-context rows, restricted softmax over the grid)
 *    against the SFT loss on the very same packed rows, same train step, same process;
 *  - labelling: labelled output tokens/s of the tree pass (realised tokens and every min-p
 *    candidate of the reference policy in one forward per batch) against the naive baseline, one
 *    forward per candidate over its prefix, on the same candidates; the two must agree.
 *
 * usage: node critic-bench.js [--preset qwen3-0.6b] [--device cuda] [--compute bfloat16]
 *          [--rows 4] [--length 2048] [--steps 5] [--label-rows 4] [--label-length 512]
 *          [--prompt 64] [--min-p 0.1] [--max-candidates 4] [--naive-positions 32] [--seed 1]
 * Random weights give nearly flat next-token distributions, so min-p keeps every token up to
 * --max-candidates: its default 4 stands for a trained policy's typical min-p 0.1 set.
 * Prints one JSON line.
 */
import type { DType } from '@lathe/onnx';
import { MODEL_PRESETS, paramSpecs, parseConfig, randomWeight, seededRandom, type ModelPresetName } from '@lathe/models';
import { Device } from '@lathe/runtime';
import { sftLoss, Trainer, type LossBuilder } from '@lathe/train';
import { CriticLabeller, criticLoss, gridShape, logLengthEdges, type CriticBins } from '@lathe/critic';
import { arg } from '../argv';

async function main(): Promise<void> {
  const kind = arg('device', 'cuda') as 'cuda' | 'cpu';
  const compute = arg('compute', kind === 'cuda' ? 'bfloat16' : 'float32') as DType;
  const preset = MODEL_PRESETS[arg('preset', 'qwen3-0.6b') as ModelPresetName];
  if (!preset) throw new Error(`--preset: one of ${Object.keys(MODEL_PRESETS).join(', ')}`);
  const config = parseConfig(preset.config);
  const next = seededRandom(Number(arg('seed', '1')));
  const init = randomWeight({ seed: Number(arg('seed', '1')), std: 0.02 });
  const weights = new Map(paramSpecs(config).map((s) => [s.name, init(s)]));
  const bins: CriticBins = { reward_values: [0, 1], length_edges: logLengthEdges(4096, 16), first_token_id: 151669 };
  const cells = gridShape(bins).cells;
  const device = Device.open(kind);
  const token = () => 10 + Math.floor(next() * 150000);

  // ---- training: the same packed rows through the critic loss and the SFT loss
  const rows = Number(arg('rows', '4'));
  const length = Number(arg('length', '2048'));
  const steps = Number(arg('steps', '5'));
  const seqLen = Math.floor(length / 4); // four in-context sequences per row
  const dims = [rows, length];
  const ids = new BigInt64Array(rows * length);
  const seg = new BigInt64Array(rows * length);
  const pos = new BigInt64Array(rows * length);
  const labels = new BigInt64Array(rows * length);
  const lossMask = new BigInt64Array(rows * length);
  for (let i = 0; i < rows * length; i++) {
    const t = i % length;
    ids[i] = BigInt(token());
    seg[i] = BigInt(Math.floor(t / seqLen) + 1);
    pos[i] = BigInt(t % seqLen);
    const target = t % seqLen >= Math.min(64, seqLen / 4); // each sequence's first tokens stand for its prompt
    labels[i] = target ? BigInt(Math.floor(next() * cells)) : -1n;
    lossMask[i] = target ? 1n : 0n;
  }
  const labelled = Number(labels.reduce((s, l) => s + (l >= 0n ? 1n : 0n), 0n));
  const shared = { input_ids: { data: ids, dims }, segment_ids: { data: seg, dims }, position_ids: { data: pos, dims }, loss_tokens: { data: Float32Array.from([labelled]), dims: [] } };
  const timeSteps = (loss: LossBuilder, feeds: Record<string, { data: BigInt64Array | Float32Array; dims: number[] }>) => {
    const params = paramSpecs(config).map((s) => ({ name: s.name, shape: s.shape, decay: s.kind === 'matrix' || s.kind === 'embedding' }));
    const trainer = Trainer.create({ params, loss, optimizer: { weightDecay: 0, maxGradNorm: 1 } }, { params: new Map([...weights].map(([k, v]) => [k, Float32Array.from(v)])) }, { device });
    const ms: number[] = [];
    for (let s = 0; s <= steps; s++) {
      const r = trainer.trainStep([feeds], 1e-5);
      if (s > 0) ms.push(r.runMs + r.hostMs);
    }
    trainer.dispose();
    const mean = ms.reduce((a, b) => a + b, 0) / ms.length;
    return { step_ms: Number(mean.toFixed(1)), tokens_per_s: Math.round((rows * length) / (mean / 1000)) };
  };
  const critic = timeSteps(criticLoss(config, bins, { packing: true, compute }), { ...shared, labels: { data: labels, dims } });
  const sft = timeSteps(sftLoss(config, { packing: true, compute }), { ...shared, loss_mask: { data: lossMask, dims } });

  // ---- labelling: tree pass vs one forward per candidate
  const labelRows = Number(arg('label-rows', '4'));
  const labelLength = Number(arg('label-length', '512'));
  const promptLen = Number(arg('prompt', '64'));
  const labeller = CriticLabeller.open({ device, critic: { config, weights }, reference: { config, weights }, bins, minP: Number(arg('min-p', '0.1')), maxCandidates: Number(arg('max-candidates', '4')), compute, padId: 0 });
  // outputs drawn from the reference policy's own top tokens would need generation; random ids with
  // random weights give the min-p sets random weights give
  const inputs = Array.from({ length: labelRows }, () => {
    const prompt = Array.from({ length: promptLen }, token);
    return { prompt, criticPrefix: prompt, output: Array.from({ length: labelLength }, token) };
  });
  const cands = await labeller.candidates(inputs); // warm-up and the candidates both sides score
  await labeller.score(inputs, cands.map((c) => c.ids));
  const t0 = performance.now();
  const cs = await labeller.candidates(inputs);
  const tree = await labeller.score(inputs, cs.map((c) => c.ids));
  const treeMs = performance.now() - t0;
  const candidateCount = cs.reduce((s, c) => s + c.ids.reduce((a, x) => a + x.length, 0), 0);
  // naive: each candidate of the first --naive-positions positions of row 0 in its own forward pass
  const naivePositions = Math.min(labelLength, Number(arg('naive-positions', '32')));
  let naiveRuns = 0;
  let worst = 0;
  const t1 = performance.now();
  for (let t = 0; t < naivePositions; t++) {
    for (const [j, c] of cs[0].ids[t].entries()) {
      const [one] = await labeller.score([{ prompt: [], criticPrefix: [...inputs[0].criticPrefix, ...inputs[0].output.slice(0, t)], output: [c] }], [[[]]]);
      worst = Math.max(worst, Math.abs(one.realised[0].q - tree[0].candidates[t][j].q));
      naiveRuns++;
    }
  }
  const naiveMs = performance.now() - t1;
  labeller.dispose();
  const naivePerToken = naiveMs / naivePositions;
  console.log(
    JSON.stringify({
      device: kind,
      compute,
      preset: arg('preset', 'qwen3-0.6b'),
      grid_cells: cells,
      train: { rows, length, labelled_tokens: labelled, critic, sft, critic_vs_sft: Number((critic.tokens_per_s / sft.tokens_per_s).toFixed(3)) },
      label: {
        rows: labelRows,
        output_tokens: labelRows * labelLength,
        candidates_per_position: Number((candidateCount / (labelRows * labelLength)).toFixed(2)),
        tree_ms: Math.round(treeMs),
        tree_labelled_tokens_per_s: Math.round((labelRows * labelLength) / (treeMs / 1000)),
        naive_runs: naiveRuns,
        naive_ms: Math.round(naiveMs),
        naive_labelled_tokens_per_s: Number((1000 / naivePerToken).toFixed(2)),
        speedup: Number((naivePerToken / (treeMs / (labelRows * labelLength))).toFixed(1)),
        max_q_difference: worst,
      },
    }),
  );
}

main().catch((e: unknown) => {
  console.error(e);
  process.exit(1);
});
