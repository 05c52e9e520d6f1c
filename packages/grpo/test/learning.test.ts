/**
 * Learning, shown on CPU: a tiny tabular policy must answer each of 4 prompts with a fixed 2-token
 * response (vocabulary 6, reward = fraction of correct tokens, chance ≈ 1/6). For each estimator
 * the loop samples G completions per prompt, scores them, computes advantages, takes old log-probs
 * from a scoring graph, and runs PPO updates on 2 minibatches through compileTrainStep's `step`
 * graph; the batch's mean reward must rise from near chance to ≥ 0.9.
 */
import * as L from '@lathe/onnx';
import { biasCorrections, compileTrainStep } from '@lathe/train';
import {
  advantageMatrix,
  drGrpoAdvantages,
  grpoAdvantages,
  klPenalisedRewards,
  lossNormaliser,
  reinforcePlusPlusAdvantages,
  remaxAdvantages,
  rlLoss,
  rlooAdvantages,
  type PolicyLossConfig,
  type SequenceAdvantages,
  type TokenAdvantages,
} from '@lathe/grpo';
import { compile, rng, type HostTensor } from '../../../tools/testing/ort-cpu';
import { nextState, tinyParams, tinyPolicy, tinyProbs, tinyState } from './tiny-policy';

const V = 6;
const ANSWERS = [
  [4, 1],
  [5, 2],
  [3, 0],
  [1, 5],
];
const P = ANSWERS.length;
const G = 8;
const B = P * G;
const T = 3; // [prompt, t1, t2]; predicting positions 0 and 1 are the response
const MAX_STEPS = 60;

interface Rollout {
  ids: number[][];
  rewards: number[];
  greedyRewards: number[];
}

const reward = (p: number, t1: number, t2: number) => (t1 === ANSWERS[p][0] ? 0.5 : 0) + (t2 === ANSWERS[p][1] ? 0.5 : 0);

function sampleFrom(probs: number[], u: number): number {
  let acc = 0;
  for (let v = 0; v < probs.length; v++) if ((acc += probs[v]) > u) return v;
  return probs.length - 1;
}
const argmax = (xs: number[]) => xs.indexOf(Math.max(...xs));

function rollout(state: Record<string, HostTensor>, rand: () => number): Rollout {
  const ids: number[][] = [];
  const rewards: number[] = [];
  for (let p = 0; p < P; p++) {
    for (let k = 0; k < G; k++) {
      const t1 = sampleFrom(tinyProbs(state, V, p, p), rand());
      const t2 = sampleFrom(tinyProbs(state, V, t1, p), rand());
      ids.push([p, t1, t2]);
      rewards.push(reward(p, t1, t2));
    }
  }
  const greedyRewards = ANSWERS.map((_a, p) => {
    const t1 = argmax(tinyProbs(state, V, p, p));
    return reward(p, t1, argmax(tinyProbs(state, V, t1, p)));
  });
  return { ids, rewards, greedyRewards };
}

const LENGTHS = new Array<number>(B).fill(2);
const MASK = Array.from({ length: B }, () => [1, 1, 0]).flat();

interface Method {
  name: string;
  loss: PolicyLossConfig;
  advantages: (r: Rollout, logp: Float32Array, refLogp: Float32Array) => SequenceAdvantages | TokenAdvantages;
}

/** Response log-probs of row b (positions 0 and 1). */
const responseLogp = (x: Float32Array) => Array.from({ length: B }, (_, b) => [x[b * T], x[b * T + 1]]);

const methods: Method[] = [
  { name: 'GRPO', loss: { aggregation: 'seq-mean-token-mean' }, advantages: (r) => grpoAdvantages({ rewards: r.rewards, groupSize: G }) },
  { name: 'GRPO + KL loss (k3)', loss: { aggregation: 'token-mean', klCoef: 0.01 }, advantages: (r) => grpoAdvantages({ rewards: r.rewards, groupSize: G }) },
  { name: 'Dr.GRPO', loss: { aggregation: 'token-sum-norm' }, advantages: (r) => drGrpoAdvantages({ rewards: r.rewards, groupSize: G }) },
  { name: 'GSPO (sequence ratio)', loss: { aggregation: 'seq-mean-token-mean', ratio: 'sequence', clipLow: 3e-3, clipHigh: 4e-3 }, advantages: (r) => grpoAdvantages({ rewards: r.rewards, groupSize: G }) },
  { name: 'DAPO clip-higher', loss: { aggregation: 'token-mean', clipLow: 0.2, clipHigh: 0.28 }, advantages: (r) => grpoAdvantages({ rewards: r.rewards, groupSize: G }) },
  { name: 'RLOO', loss: { aggregation: 'seq-mean-token-mean' }, advantages: (r) => rlooAdvantages({ rewards: r.rewards, groupSize: G }) },
  { name: 'ReMax', loss: { aggregation: 'token-mean' }, advantages: (r) => remaxAdvantages({ rewards: r.rewards, groupSize: G, greedyRewards: r.greedyRewards }) },
  { name: 'REINFORCE++', loss: { aggregation: 'token-mean' }, advantages: (r) => reinforcePlusPlusAdvantages({ rewards: r.rewards, groupSize: G, lengths: LENGTHS }) },
  {
    name: 'REINFORCE++-baseline + KL reward penalty',
    loss: { aggregation: 'token-mean' },
    advantages: (r, logp, ref) => {
      const kl = klPenalisedRewards({ rewards: r.rewards, logp: responseLogp(logp), refLogp: responseLogp(ref) }, { coef: 0.01 });
      return reinforcePlusPlusAdvantages({ rewards: r.rewards, groupSize: G, lengths: LENGTHS, tokenRewards: kl.tokenPenalties }, { baseline: 'group' });
    },
  },
];

const params = tinyParams(V);
const scalar = (v: number): HostTensor => ({ data: Float32Array.from([v]), dims: [] });
const i64 = (xs: number[], dims: number[]): HostTensor => ({ data: BigInt64Array.from(xs.map(BigInt)), dims });
const f32 = (xs: ArrayLike<number>, dims: number[]): HostTensor => ({ data: Float32Array.from(xs), dims });

/** Rows [from, to) of a [B, T] tensor. */
function rowsOf(t: HostTensor, from: number, to: number): HostTensor {
  const w = t.dims[1];
  return { data: t.data.slice(from * w, to * w) as HostTensor['data'], dims: [to - from, w] };
}

async function scorer() {
  const g = new L.Graph('score');
  const p = new Map(params.map((x) => [x.name, g.input(x.name, 'float32', x.shape)] as const));
  g.output(tinyPolicy(g, p).logp, 'logp');
  const run = await compile(g);
  return async (state: Record<string, HostTensor>, ids: HostTensor) => (await run({ prev: state.prev, prompt: state.prompt, input_ids: ids })).logp.data as Float32Array;
}

/** Runs the loop until the last 5 rollouts all score ≥ 0.9 or MAX_STEPS; returns each rollout's mean reward. */
async function train(method: Method): Promise<number[]> {
  const graphs = compileTrainStep({ params, loss: rlLoss(tinyPolicy, method.loss), optimizer: { weightDecay: 0, maxGradNorm: 1 } });
  const [step, score] = await Promise.all([compile(graphs.step), scorer()]);
  const rand = rng(1234);
  let state = tinyState(V, rng(7));
  const initial = state;
  const mean: number[] = [];
  let t = 0;
  for (let it = 0; it < MAX_STEPS; it++) {
    const r = rollout(state, rand);
    mean.push(r.rewards.reduce((a, b) => a + b, 0) / B);
    if (mean.length >= 5 && mean.slice(-5).every((m) => m >= 0.9)) break;
    const ids = i64(r.ids.flat(), [B, T]);
    const oldLogp = await score(state, ids);
    const refLogp = await score(initial, ids);
    const adv = method.advantages(r, oldLogp, refLogp);
    const batch = { input_ids: ids, old_logp: f32(oldLogp, [B, T]), advantages: f32(advantageMatrix(adv, MASK, [B, T]), [B, T]), response_mask: i64(MASK, [B, T]), ref_logp: f32(refLogp, [B, T]) };
    // two minibatches of two prompts each; each minibatch is one optimizer step
    for (const [from, to] of [
      [0, B / 2],
      [B / 2, B],
    ]) {
      t++;
      const feeds: Record<string, HostTensor> = { ...state, lr: scalar(0.1), ...Object.fromEntries(Object.entries(biasCorrections(t)).map(([k, x]) => [k, scalar(x)])) };
      for (const name of graphs.batchInputs) feeds[name] = name === 'loss_normaliser' ? scalar(lossNormaliser(method.loss.aggregation ?? 'token-mean', LENGTHS.slice(from, to), { maxLength: 2 })) : rowsOf(batch[name as keyof typeof batch], from, to);
      state = nextState(state, await step(feeds));
    }
  }
  return mean;
}

test.each(methods.map((m) => [m.name, m] as const))('%s: reward rises from chance to ≥ 0.9', async (_name, method) => {
  const mean = await train(method);
  console.log(`${method.name}: ${mean.length} rollouts, mean reward ${mean[0].toFixed(2)} → ${mean[mean.length - 1].toFixed(2)}`);
  expect(mean[0]).toBeLessThan(0.35); // chance: 1/6
  expect(mean.slice(-5).every((m) => m >= 0.9)).toBe(true);
});

test('control: the same loop with advantages shuffled across the batch does not learn', async () => {
  const shuffle = rng(3);
  const mean = await train({
    name: 'shuffled',
    loss: { aggregation: 'token-mean' },
    advantages: (r) => {
      const a = grpoAdvantages({ rewards: r.rewards, groupSize: G });
      const xs = a.advantages.slice();
      for (let i = xs.length - 1; i > 0; i--) {
        const j = Math.floor(shuffle() * (i + 1));
        [xs[i], xs[j]] = [xs[j], xs[i]];
      }
      return { ...a, advantages: xs };
    },
  });
  expect(mean).toHaveLength(MAX_STEPS);
  expect(Math.max(...mean.slice(-10))).toBeLessThan(0.6);
});
