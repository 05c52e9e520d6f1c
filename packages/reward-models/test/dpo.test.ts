/**
 * DPO and IPO: the objective against numbers computed here from given log-probs; response log-probs
 * against a float64 log-softmax of the model's full logits; the first train step's metrics against
 * the host formula over scored log-probs; LoRA's first loss against its known value (π = π_ref).
 */
import * as L from '@lathe/onnx';
import { decoderHidden, lmLogits, weightInputs, type DecoderConfig } from '@lathe/models';
import { Device, type HostTensor } from '@lathe/runtime';
import { Trainer } from '@lathe/train';
import {
  DPO_DEFAULTS,
  dpoLoss,
  dpoMetrics,
  dpoObjective,
  dpoReduction,
  dpoSums,
  pairBatch,
  pairFeeds,
  predictsResponse,
  REWARD_LORA_TARGETS,
  ResponseLogprobScorer,
  trainedWeights,
  type DpoConfig,
  type PreferencePair,
} from '@lathe/reward-models';
import { additionPairs, PAD, tinyLm } from './tiny';

const logSigmoid = (x: number) => -Math.log1p(Math.exp(-x));

/** Runs the objective over given [2P] log-probs; returns the loss and metric sums. */
async function objective(policy: number[], reference: number[], N: number, cfg: DpoConfig): Promise<Record<string, number>> {
  const g = new L.Graph();
  const P2 = policy.length;
  const { loss, metrics } = dpoObjective({ policy: g.constant(policy, 'float64', [P2]), reference: g.constant(reference, 'float32', [P2]), pairCount: g.constant(N, 'float64', []) }, cfg);
  g.output(loss, 'loss');
  for (const [k, t] of Object.entries(metrics!)) g.output(t, k);
  const out = await Device.cpu().compile(g).run({});
  return Object.fromEntries(Object.entries(out).map(([k, v]) => [k, Number(v.data[0])]));
}

const policy = [-1.2, -0.4, -2.0, -3.1, -0.9, -1.0]; // chosen rows of 3 pairs, then rejected rows
const reference = [-1.5, -0.5, -1.0, -3.0, -1.0, -0.5];
const z = [0, 1, 2].map((i) => policy[i] - policy[3 + i] - (reference[i] - reference[3 + i]));

test('sigmoid DPO with label smoothing, by hand', async () => {
  const beta = 0.5;
  const eps = 0.1;
  const out = await objective(policy, reference, 4, { beta, loss: 'sigmoid', labelSmoothing: eps });
  const want = z.reduce((s, x) => s - (1 - eps) * logSigmoid(beta * x) - eps * logSigmoid(-beta * x), 0) / 4;
  expect(out.loss).toBeCloseTo(want, 12);
  const chosen = [0, 1, 2].map((i) => beta * (policy[i] - reference[i]));
  const rejected = [0, 1, 2].map((i) => beta * (policy[3 + i] - reference[3 + i]));
  expect(out.pairs).toBe(3);
  expect(out.correct).toBe(chosen.filter((c, i) => c > rejected[i]).length);
  expect(out.margin_sum).toBeCloseTo(beta * (z[0] + z[1] + z[2]), 5);
  expect(out.chosen_reward_sum).toBeCloseTo(chosen[0] + chosen[1] + chosen[2], 5);
  expect(out.rejected_logp_sum).toBeCloseTo(policy[3] + policy[4] + policy[5], 5);
  // the host formula gives the same sums
  const host = dpoSums(policy, reference, beta);
  for (const [k, v] of Object.entries(host)) expect(out[k]).toBeCloseTo(v, 5);
  expect(dpoMetrics(host).accuracy).toBeCloseTo(host.correct / 3, 12);
});

test('IPO, by hand: (z − 1/(2β))², and the reductions each loss defaults to', async () => {
  const beta = 0.25;
  const out = await objective(policy, reference, 3, { beta, loss: 'ipo', labelSmoothing: 0 });
  expect(out.loss).toBeCloseTo(z.reduce((s, x) => s + (x - 1 / (2 * beta)) ** 2, 0) / 3, 12);
  expect(dpoReduction({ loss: 'ipo' })).toBe('mean');
  expect(dpoReduction({ loss: 'sigmoid' })).toBe('sum');
  expect(dpoReduction({ loss: 'ipo', reduction: 'sum' })).toBe('sum');
  expect(DPO_DEFAULTS).toEqual({ beta: 0.1, loss: 'sigmoid', labelSmoothing: 0 });
  expect(() => dpoLoss(tinyLm(1, 1).config, { beta: 0 })).toThrow('dpo: beta must be positive, got 0');
  expect(() => dpoLoss(tinyLm(1, 1).config, { loss: 'ipo', labelSmoothing: 0.1 })).toThrow("labelSmoothing applies to the sigmoid loss, not 'ipo'");
});

/** log p of each row's response tokens from the full logits, in float64 on the host. */
async function responseLogprobsByHand(config: DecoderConfig, weights: Map<string, Float32Array>, rows: { ids: number[]; responseStart: number }[]): Promise<{ sum: number; mean: number }[]> {
  const g = new L.Graph();
  const ids = g.input('input_ids', 'int64', ['B', 'T']);
  const mask = g.input('attention_mask', 'int64', ['B', 'T']);
  const { weights: w, inputs } = weightInputs(g, config, 'float32', 'float32');
  g.output(lmLogits(config, w, decoderHidden(config, w, ids, mask)), 'logits');
  const session = Device.cpu().compile(g);
  const V = config.vocabSize;
  const out: { sum: number; mean: number }[] = [];
  for (const r of rows) {
    const feeds: Record<string, HostTensor> = Object.fromEntries([...inputs].map(([n, t]) => [n, { data: weights.get(n)!, dims: t.shape as number[] }]));
    feeds.input_ids = { data: BigInt64Array.from(r.ids, BigInt), dims: [1, r.ids.length] };
    feeds.attention_mask = { data: BigInt64Array.from(r.ids, () => 1n), dims: [1, r.ids.length] };
    const logits = (await session.run(feeds)).logits.data as Float32Array;
    let sum = 0;
    for (let t = r.responseStart; t < r.ids.length; t++) {
      const row = Array.from(logits.subarray((t - 1) * V, t * V));
      const max = Math.max(...row);
      sum += row[r.ids[t]] - max - Math.log(row.reduce((s, x) => s + Math.exp(x - max), 0));
    }
    out.push({ sum, mean: sum / (r.ids.length - r.responseStart) });
  }
  session.dispose();
  return out;
}

test('the predicted-response mask shifts the response mask left, with 0 in the last column (static or symbolic T)', async () => {
  const mask = [[1, 1, 0], [0, 1, 1], [1, 0, 1]];
  for (const dims of [[3, 3], ['B', 'T']] as const) {
    const g = new L.Graph();
    g.output(predictsResponse(g.input('m', 'int64', [...dims])), 'p');
    const out = await Device.cpu().compile(g).run({ m: { data: BigInt64Array.from(mask.flat(), BigInt), dims: [3, 3] } });
    expect(Array.from(out.p.data as BigInt64Array, Number)).toEqual([1, 0, 0, 1, 1, 0, 0, 1, 0]);
  }
});

test('response log-probs are the sum (or mean) of the response tokens’ log-softmax, with either padding', async () => {
  const lm = tinyLm(6);
  const weights = lm.float32Weights();
  const pairs: PreferencePair[] = [
    { prompt: [1, 10, 2, 11], chosen: [3], rejected: [4, 5, 6] },
    { prompt: [7], chosen: [8, 9, 0, 1], rejected: [2, 3] },
  ];
  const rows = [...pairs.map((p) => [p.prompt, p.chosen]), ...pairs.map((p) => [p.prompt, p.rejected])].map(([prompt, response]) => ({ ids: [...prompt, ...response], responseStart: prompt.length }));
  const want = await responseLogprobsByHand(lm.config, weights, rows);
  for (const reduction of ['sum', 'mean'] as const) {
    const scorer = ResponseLogprobScorer.create(lm.config, Device.cpu(), { reduction, chunk: 5 }); // 16 = 5 + 5 + 5 + 1: chunked
    for (const padding of ['right', 'left'] as const) {
      const got = await scorer.score(pairBatch(pairs, { padId: PAD, padding }), weights);
      got.forEach((v, i) => expect(Math.abs(v - want[i][reduction])).toBeLessThan(1e-5));
    }
    scorer.dispose();
  }
});

test('the first DPO step’s metrics equal the host formula over scored log-probs', async () => {
  const lm = tinyLm(7, 1);
  const master = lm.float32Weights();
  const beta = 0.3;
  const pairs = additionPairs(3).train.slice(0, 6);
  const batch = pairBatch(pairs, { padId: PAD });
  // A reference that differs from the policy: the policy with its embeddings scaled.
  const refWeights = new Map(master);
  refWeights.set('model.embed_tokens.weight', master.get('model.embed_tokens.weight')!.map((x) => 1.3 * x));
  const scorer = ResponseLogprobScorer.create(lm.config, Device.cpu());
  const ref = await scorer.score(batch, refWeights);
  const pol = await scorer.score(batch, master);
  const tw = trainedWeights(lm.config, master);
  const trainer = Trainer.create({ params: tw.params, loss: dpoLoss(lm.config, { beta }) }, { params: tw.init });
  const step = trainer.trainStep([pairFeeds(batch, trainer.batchInputs, { ref_logp: { data: ref, dims: [ref.length] } })], 1e-3);
  const host = dpoSums(pol, ref, beta);
  for (const [k, v] of Object.entries(host)) expect(step.metrics[k]).toBeCloseTo(v, 4);
  const zs = [...Array(pairs.length).keys()].map((i) => pol[i] - pol[6 + i] - (ref[i] - ref[6 + i]));
  expect(step.loss).toBeCloseTo(zs.reduce((s, z) => s - logSigmoid(beta * z), 0) / pairs.length, 5);
  scorer.dispose();
  trainer.dispose();
});

test('DPO with LoRA trains only the adapters and starts at loss log 2 (π = π_ref)', async () => {
  const lm = tinyLm(8, 1);
  const master = lm.float32Weights();
  const tw = trainedWeights(lm.config, master, { lora: { rank: 2, alpha: 4, targets: REWARD_LORA_TARGETS }, seed: 1 });
  expect(tw.params.map((p) => p.name)).toEqual(['q', 'k', 'v', 'o'].flatMap((m) => [`model.layers.0.self_attn.${m}_proj.lora_A.weight`, `model.layers.0.self_attn.${m}_proj.lora_B.weight`]));
  expect(tw.frozen.size).toBe(master.size);
  const trainer = Trainer.create({ params: tw.params, loss: dpoLoss(lm.config, { weights: tw.weights }) }, { params: tw.init }, { frozen: tw.frozenOn(Device.cpu()) });
  // The reference is the frozen base; B starts at 0, so the policy starts as the reference.
  const batch = pairBatch(additionPairs(4).train.slice(0, 4), { padId: PAD, pairCount: 8 });
  const scorer = ResponseLogprobScorer.create(lm.config, Device.cpu());
  const ref = await scorer.score(batch, master);
  const feeds = pairFeeds(batch, trainer.batchInputs, { ref_logp: { data: ref, dims: [ref.length] } });
  const first = trainer.trainStep([feeds], 1e-2);
  expect(first.loss).toBeCloseTo((4 * Math.LN2) / 8, 6);
  expect(first.metrics.margin_sum).toBeCloseTo(0, 6);
  for (let k = 0; k < 3; k++) trainer.trainStep([feeds], 1e-2);
  expect(trainer.trainStep([feeds], 0).loss).toBeLessThan(first.loss);
  // the merged model scores what the adapters' side branch computed in the step
  const values = trainer.downloadParams();
  const merged = tw.merged(values);
  const after = trainer.trainStep([feeds], 0).metrics;
  const pol = await scorer.score(batch, merged);
  expect(after.chosen_logp_sum).toBeCloseTo(pol[0] + pol[1] + pol[2] + pol[3], 4);
  scorer.dispose();
  trainer.dispose();
});
