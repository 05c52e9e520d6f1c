/**
 * The Bradley-Terry loss: its value and metrics against numbers computed here from given rewards;
 * its gradient through a tiny reward model (margin and centring on) against central finite
 * differences in float64; split into micro-batches through the Trainer, the same step as the whole
 * batch.
 */
import * as L from '@lathe/onnx';
import { paramSpecs, SCORE_WEIGHT } from '@lathe/models';
import { Device, type HostTensor } from '@lathe/runtime';
import { Trainer } from '@lathe/train';
import {
  bradleyTerryLoss,
  bradleyTerryObjective,
  pairBatch,
  pairFeeds,
  preferenceMetrics,
  preferenceSums,
  RewardModel,
  trainedWeights,
  type PreferencePair,
} from '@lathe/reward-models';
import { additionPairs, PAD, tinyLm } from './tiny';

const logSigmoid = (x: number) => -Math.log1p(Math.exp(-x));

test('loss and metric sums from given rewards, by hand', async () => {
  const chosen = [1.5, -0.2, 0.3];
  const rejected = [0.5, 0.4, 0.3];
  const margin = [0.25, 0, -1];
  const coef = 0.01;
  const N = 5; // pairs in the whole optimizer batch: this micro-batch holds 3 of them
  const g = new L.Graph();
  const { loss, metrics } = bradleyTerryObjective({
    rewards: g.constant([...chosen, ...rejected], 'float64', [6]),
    margin: g.constant(margin, 'float32', [3]),
    pairCount: g.constant(N, 'float64', []),
    centerCoefficient: coef,
  });
  g.output(loss, 'loss');
  for (const [k, t] of Object.entries(metrics!)) g.output(t, k);
  const out = await Device.cpu().compile(g).run({});
  const value = (k: string) => Number(out[k].data[0]);
  const expected = chosen.reduce((s, c, i) => s - logSigmoid(c - rejected[i] - margin[i]) + coef * (c + rejected[i]) ** 2, 0) / N;
  expect(value('loss')).toBeCloseTo(expected, 12);
  const sums = preferenceSums(chosen, rejected);
  const hand = { pairs: 3, correct: 1, margin_sum: 1 - 0.6 + 0, chosen_sum: 1.6, chosen_sq_sum: 2.25 + 0.04 + 0.09, rejected_sum: 1.2, rejected_sq_sum: 0.25 + 0.16 + 0.09 }; // a tie (0.3, 0.3) is not correct
  for (const [k, v] of Object.entries(hand)) {
    expect(sums[k as keyof typeof sums]).toBeCloseTo(v, 12);
    expect(value(k)).toBeCloseTo(v, 5);
  }
});

test('metrics: accuracy, mean margin, reward means and population stds', () => {
  const m = preferenceMetrics(preferenceSums([1, 2, 0], [0, 3, -1]));
  expect(m.pairs).toBe(3);
  expect(m.accuracy).toBeCloseTo(2 / 3, 12);
  expect(m.margin).toBeCloseTo(1 / 3, 12);
  expect(m.chosenMean).toBeCloseTo(1, 12);
  expect(m.chosenStd).toBeCloseTo(Math.sqrt(2 / 3), 12);
  expect(m.rejectedMean).toBeCloseTo(2 / 3, 12);
  expect(m.rejectedStd).toBeCloseTo(Math.sqrt((0 + 9 + 1) / 3 - 4 / 9), 12);
  expect(() => preferenceMetrics(preferenceSums([], []))).toThrow('preferenceMetrics: no pairs');
  expect(() => preferenceMetrics({ pairs: 2, correct: 1 })).toThrow("preferenceMetrics: no metric sum 'margin_sum'");
});

test('the gradient through a tiny reward model matches central finite differences (float64, margin and centring)', async () => {
  const rm = RewardModel.fromCausalLM(tinyLm(4, 1), { padTokenId: PAD, seed: 3, std: 0.3 });
  const cfg = rm.config;
  const specs = paramSpecs(cfg);
  const g = new L.Graph('bt_fd');
  const params = new Map(specs.map((s) => [s.name, g.input(s.name, 'float64', s.shape)]));
  const { loss } = bradleyTerryLoss(cfg, { compute: 'float64', margin: true, centerCoefficient: 0.1 })(g, params);
  const checked = [SCORE_WEIGHT, 'model.embed_tokens.weight', 'model.layers.0.self_attn.q_proj.weight', 'model.layers.0.mlp.up_proj.weight', 'model.norm.weight'];
  g.output(loss, 'loss');
  L.grad(loss, checked.map((n) => params.get(n)!)).forEach((d, i) => g.output(d, `grad${i}`));
  const session = Device.cpu().compile(g, { optimization: 'basic' });
  const pairs: PreferencePair[] = [
    { prompt: [1, 10, 2, 11], chosen: [3], rejected: [5], margin: 0.3 },
    { prompt: [4, 10], chosen: [0, 11, 4], rejected: [9], margin: -0.2 },
  ];
  const batch = pairBatch(pairs, { padId: PAD, padding: 'left', pairCount: 3 });
  const weights = rm.float32Weights();
  const feeds: Record<string, HostTensor> = { ...(pairFeeds(batch, ['input_ids', 'attention_mask', 'margin', 'pair_count']) as Record<string, HostTensor>) };
  for (const s of specs) feeds[s.name] = { data: Float64Array.from(weights.get(s.name)!), dims: s.shape };
  const base = await session.run(feeds);
  const lossAt = async () => Number((await session.run(feeds, { outputs: ['loss'] })).loss.data[0]);
  const h = 1e-6;
  let worst = 0;
  for (const [k, name] of checked.entries()) {
    const w = feeds[name].data as Float64Array;
    const analytic = base[`grad${k}`].data as Float64Array;
    for (const j of [0, Math.floor(w.length / 3), w.length - 1]) {
      const orig = w[j];
      w[j] = orig + h;
      const plus = await lossAt();
      w[j] = orig - h;
      const minus = await lossAt();
      w[j] = orig;
      const numeric = (plus - minus) / (2 * h);
      worst = Math.max(worst, Math.abs(analytic[j] - numeric) / (1e-7 + 1e-5 * Math.abs(numeric)));
    }
  }
  expect(worst).toBeLessThan(1);
  expect(Math.abs((base.grad0.data as Float64Array)[0])).toBeGreaterThan(1e-4); // the head's gradient is not trivially 0
  session.dispose();
});

test('two micro-batches normalised by the whole batch’s pairs take the step of the whole batch', () => {
  const rm = RewardModel.fromCausalLM(tinyLm(4, 1), { padTokenId: PAD, seed: 3 });
  const init = () => new Map(paramSpecs(rm.config).map((s) => [s.name, Float32Array.from(rm.float32Weights().get(s.name)!)]));
  const params = paramSpecs(rm.config).map((s) => ({ name: s.name, shape: s.shape, decay: true }));
  const spec = { params, loss: bradleyTerryLoss(rm.config, { centerCoefficient: 0.05 }), optimizer: { weightDecay: 0.01, maxGradNorm: 1 } };
  const whole = Trainer.create(spec, { params: init() });
  const split = Trainer.create(spec, { params: init() }, { microBatches: 2 });
  const pairs = additionPairs(2).train.slice(0, 12);
  const a = whole.trainStep([pairFeeds(pairBatch(pairs, { padId: PAD }), whole.batchInputs)], 1e-3);
  const halves = [pairs.slice(0, 5), pairs.slice(5)].map((p) => pairFeeds(pairBatch(p, { padId: PAD, pairCount: 12 }), split.batchInputs));
  const b = split.trainStep(halves, 1e-3);
  expect(b.loss).toBeCloseTo(a.loss, 5);
  expect(b.gradNorm).toBeCloseTo(a.gradNorm, 5);
  for (const k of Object.keys(a.metrics)) expect(b.metrics[k]).toBeCloseTo(a.metrics[k], 4);
  expect(a.metrics.pairs).toBe(12);
  const pa = whole.downloadParams();
  const pb = split.downloadParams();
  for (const p of params) pa.get(p.name)!.forEach((v, i) => expect(Math.abs(pb.get(p.name)![i] - v)).toBeLessThan(1e-6));
  whole.dispose();
  split.dispose();
});

test('a loss compiled for a fixed [2P, T] shape gives the symbolic one’s loss and metrics', () => {
  const rm = RewardModel.fromCausalLM(tinyLm(4, 1), { padTokenId: PAD, seed: 3, std: 0.3 });
  const tw = trainedWeights(rm.config, rm.float32Weights());
  const pairs = additionPairs(6).train.slice(0, 4).map((p, i) => ({ ...p, margin: i / 4 }));
  const batch = pairBatch(pairs, { padId: PAD, width: 7 });
  const run = (shape?: [number, number]) => {
    const t = Trainer.create({ params: tw.params, loss: bradleyTerryLoss(rm.config, { margin: true, shape }) }, { params: tw.init });
    const r = t.trainStep([pairFeeds(batch, t.batchInputs)], 0);
    t.dispose();
    return r;
  };
  const symbolic = run();
  const fixed = run([8, 7]);
  expect(fixed.loss).toBeCloseTo(symbolic.loss, 6);
  for (const k of Object.keys(symbolic.metrics)) expect(fixed.metrics[k]).toBeCloseTo(symbolic.metrics[k], 5);
  expect(() => bradleyTerryLoss(rm.config, { shape: [7, 7] })(new L.Graph(), new Map())).toThrow('pair loss: shape [7, 7] needs an even, positive row count (2 rows per pair)');
});
