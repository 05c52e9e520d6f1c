/**
 * Learning, shown on CPU (seeded): a tiny tabular policy answers prompt p with two tokens, a
 * reasoning step c and an answer a, rendered "<think>c</think>a" — one table of logits per
 * position, indexed by the prompt, so the step and the answer are learned independently.
 *
 * 1. Classmate rewards. The answer is correct when a = ANSWERS[p]; the reasoning token does not
 *    change that, so plain GRPO leaves c wherever it drifts. A fixed classmate, "trained to continue
 *    such steps", reads c and answers c + 4 (right 90% of the time) when c is one of the steps it
 *    knows (0–3), and guesses among 4–7 otherwise: reasoning is useful to it only when c = p.
 *    With classmate rewards (λ = 0.5, vanilla_reward, K = 4) the classmate's accuracy continuing
 *    the policy's CoT must rise well above the GRPO baseline's (same loop, λ = 0: the classmate only
 *    measured), while the policy's own accuracy does not drop.
 * 2. GDPO against GRPO on two rewards, correctness (a = ANSWERS[p]) and format (c even), weight 1
 *    each: both learn, and the distinct advantage values per group — GRPO's collapse of
 *    (correct, unformatted) and (wrong, formatted) into one value — are counted along the way.
 */
import * as L from '@lathe/onnx';
import { biasCorrections, compileTrainStep } from '@lathe/train';
import { advantageMatrix, builtinEstimator, classmateScorer, combineRewards, distinctAdvantagesPerGroup, lossNormaliser, rlLoss, type ClassmateModel, type EstimatorName, type ScoredBatch } from '@lathe/grpo';
import { compile, rng, type HostTensor } from '../../../tools/testing/ort-cpu';
import { shiftLeft } from '@lathe/models';
import { stateNames, type TrainableParam } from '@lathe/train';
import type { PolicyBuilder } from '@lathe/grpo';
import { nextState } from './tiny-policy';

const V = 8;
const ANSWERS = [4, 5, 6, 7];
const P = ANSWERS.length;
const G = 8;
const B = P * G;
const T = 3; // [prompt, c, a]
const STEPS = 100;
const LENGTHS = new Array<number>(B).fill(2);
const MASK = Array.from({ length: B }, () => [1, 1, 0]).flat();

interface Meta {
  answer: number;
}
const text = (c: number, a: number) => `<think>${c}</think>${a}`;
const samplesOf = (ids: number[][]) => ids.map(([p, c, a]) => ({ prompt: `Q${p}:`, completion: text(c, a), meta: { answer: ANSWERS[p] } }));

/** The classmate: knows steps 0–3 (answers c + 4, 90% of the time), guesses among 4–7 otherwise. */
function classmate(): ClassmateModel {
  return {
    name: 'reader',
    async continueTexts(texts, k, seed) {
      const r = rng(seed);
      return texts.map((t) => {
        const c = Number(/<think>(\d)<\/think>$/.exec(t)![1]);
        return Array.from({ length: k }, () => String(c <= 3 && r() < 0.9 ? c + 4 : 4 + Math.floor(r() * 4)));
      });
    },
  };
}

const correct = { name: 'correct', fn: (_p: string, c: string, m: Meta) => (c.endsWith(`</think>${m.answer}`) ? 1 : 0) };
const format = { name: 'format', fn: (_p: string, c: string) => (Number(/<think>(\d)</.exec(c)?.[1]) % 2 === 0 ? 1 : 0) };

function sampleFrom(probs: number[], u: number): number {
  let acc = 0;
  for (let v = 0; v < probs.length; v++) if ((acc += probs[v]) > u) return v;
  return probs.length - 1;
}

const params: TrainableParam[] = [
  { name: 'step', shape: [P, V], decay: false },
  { name: 'answer', shape: [P, V], decay: false },
];
/** Logits of position 0 (predicting c) from `step[p]`, of positions 1 and 2 from `answer[p]`. */
const tablePolicy: PolicyBuilder = (g, ps) => {
  const ids = g.input('input_ids', 'int64', ['B', T]);
  const prompt = L.slice(ids, [1], [0], [1]); // column 0: [B, 1]
  const a = L.gather(ps.get('step')!, prompt, 0); // [B, 1, V]
  const b = L.gather(ps.get('answer')!, prompt, 0);
  const logits = L.concat([a, b, b], 1);
  return { logp: L.tokenLogprobs(logits, shiftLeft(ids)) };
};
function initState(rand: () => number): Record<string, HostTensor> {
  const state: Record<string, HostTensor> = {};
  for (const p of params) {
    state[p.name] = { data: Float32Array.from({ length: P * V }, () => (rand() - 0.5) * 0.02), dims: p.shape };
    state[stateNames.m(p.name)] = { data: new Float32Array(P * V), dims: p.shape };
    state[stateNames.v(p.name)] = { data: new Float32Array(P * V), dims: p.shape };
  }
  return state;
}
function probs(state: Record<string, HostTensor>, table: 'step' | 'answer', p: number): number[] {
  const row = Array.from((state[table].data as Float32Array).subarray(p * V, (p + 1) * V));
  const m = Math.max(...row);
  const e = row.map((x) => Math.exp(x - m));
  const z = e.reduce((x, y) => x + y, 0);
  return e.map((x) => x / z);
}
const scalar = (v: number): HostTensor => ({ data: Float32Array.from([v]), dims: [] });
const i64 = (xs: number[], dims: number[]): HostTensor => ({ data: BigInt64Array.from(xs.map(BigInt)), dims });
const f32 = (xs: ArrayLike<number>, dims: number[]): HostTensor => ({ data: Float32Array.from(xs), dims });
const mean = (xs: readonly number[]) => xs.reduce((a, b) => a + b, 0) / xs.length;

/** Per step: the scored batch, the mean number of distinct advantages per group. */
interface StepLog {
  scored: ScoredBatch;
  distinct: number;
}

/** Runs STEPS RL steps of GRPO-family training with `rewards` and `estimator`. */
async function train(rewards: (s: ReturnType<typeof samplesOf>) => Promise<ScoredBatch>, estimator: EstimatorName, seed: number): Promise<StepLog[]> {
  const graphs = compileTrainStep({ params, loss: rlLoss(tablePolicy, { aggregation: 'seq-mean-token-mean' }), optimizer: { weightDecay: 0, maxGradNorm: 1 } });
  const g = new L.Graph('score');
  const p = new Map(params.map((x) => [x.name, g.input(x.name, 'float32', x.shape)] as const));
  g.output(tablePolicy(g, p).logp, 'logp');
  const [step, score] = await Promise.all([compile(graphs.step), compile(g)]);
  const estimate = builtinEstimator(estimator).estimate;
  const rand = rng(seed);
  let state = initState(rng(7));
  const log: StepLog[] = [];
  let t = 0;
  for (let it = 0; it < STEPS; it++) {
    const ids: number[][] = [];
    for (let q = 0; q < P; q++)
      for (let k = 0; k < G; k++) {
        const c = sampleFrom(probs(state, 'step', q), rand());
        ids.push([q, c, sampleFrom(probs(state, 'answer', q), rand())]);
      }
    const scored = await rewards(samplesOf(ids));
    const input = i64(ids.flat(), [B, T]);
    const oldLogp = (await score({ step: state.step, answer: state.answer, input_ids: input })).logp.data as Float32Array;
    const adv = estimate({ rewards: scored.rewards, groupSize: G, lengths: LENGTHS, logp: [], components: scored.bySource, componentWeights: scored.weights });
    if (adv.kind !== 'sequence') throw new Error('expected sequence advantages');
    log.push({ scored, distinct: mean(distinctAdvantagesPerGroup(adv.advantages, G)) });
    const batch = { input_ids: input, old_logp: f32(oldLogp, [B, T]), advantages: f32(advantageMatrix(adv, MASK, [B, T]), [B, T]), response_mask: i64(MASK, [B, T]) };
    for (const [from, to] of [
      [0, B / 2],
      [B / 2, B],
    ]) {
      t++;
      const feeds: Record<string, HostTensor> = { ...state, lr: scalar(0.1), ...Object.fromEntries(Object.entries(biasCorrections(t)).map(([k, x]) => [k, scalar(x)])) };
      for (const name of graphs.batchInputs) {
        const x = batch[name as keyof typeof batch];
        feeds[name] = name === 'loss_normaliser' ? scalar(lossNormaliser('seq-mean-token-mean', LENGTHS.slice(from, to))) : { data: x.data.slice(from * T, to * T) as HostTensor['data'], dims: [to - from, T] };
      }
      state = nextState(state, await step(feeds));
    }
  }
  return log;
}

const last = (log: StepLog[], source: string, n = 5) => mean(log.slice(-n).flatMap((s) => s.scored.bySource[source]));

test('classmate rewards: the classmate’s accuracy continuing the policy’s CoT rises well above the GRPO baseline’s; the policy’s accuracy does not drop', async () => {
  const base = combineRewards<Meta>([correct], { fallback: 0 });
  const run = (lambda: number) => train(classmateScorer(base, { classmates: [classmate()], samples: 4, weight: lambda, seed: 1 }), 'grpo', 1234);
  const [baseline, withClassmate] = [await run(0), await run(0.5)];
  const report = (name: string, log: StepLog[]) =>
    `${name}: classmate accuracy ${last(log, 'classmate_accuracy').toFixed(2)} (step 1: ${mean(log[0].scored.bySource.classmate_accuracy).toFixed(2)}), policy accuracy ${last(log, 'correct').toFixed(2)} (step 1: ${mean(log[0].scored.bySource.correct).toFixed(2)})`;
  console.log(`${report('GRPO baseline (λ = 0)', baseline)}\n${report('classmate rewards (λ = 0.5)', withClassmate)}`);
  expect(last(withClassmate, 'classmate_accuracy')).toBeGreaterThanOrEqual(0.8);
  expect(last(withClassmate, 'classmate_accuracy')).toBeGreaterThan(last(baseline, 'classmate_accuracy') + 0.3);
  expect(last(withClassmate, 'correct')).toBeGreaterThanOrEqual(0.9);
  expect(last(withClassmate, 'correct')).toBeGreaterThanOrEqual(last(baseline, 'correct') - 0.05);
});

test('GDPO against GRPO on correctness + format: both learn; GDPO keeps more distinct advantage values per group', async () => {
  const scorer = combineRewards<Meta>([correct, format], { fallback: 0 });
  const runs = { grpo: await train(scorer, 'grpo', 99), gdpo: await train(scorer, 'gdpo', 99) };
  const distinct = (log: StepLog[]) => mean(log.slice(0, 10).map((s) => s.distinct));
  // the first step after which 5 consecutive batches score ≥ 0.9 on both rewards
  const solvedAt = (log: StepLog[]) => log.findIndex((_, i) => i >= 4 && log.slice(i - 4, i + 1).every((s) => mean(s.scored.bySource.correct) >= 0.9 && mean(s.scored.bySource.format) >= 0.9)) + 1;
  for (const [name, log] of Object.entries(runs)) console.log(`${name}: correct ${last(log, 'correct').toFixed(2)}, format ${last(log, 'format').toFixed(2)}, distinct advantages per group (first 10 steps) ${distinct(log).toFixed(2)}, both ≥ 0.9 for 5 steps at step ${solvedAt(log)}`);
  for (const log of Object.values(runs)) {
    expect(last(log, 'correct')).toBeGreaterThanOrEqual(0.9);
    expect(last(log, 'format')).toBeGreaterThanOrEqual(0.9);
  }
  expect(distinct(runs.gdpo)).toBeGreaterThan(distinct(runs.grpo));
});
