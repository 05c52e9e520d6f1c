/**
 * Truncated importance sampling in the RL loop: with sampling log-probs equal to the training
 * forward's, C = 4 changes nothing (every weight is exactly 1, the update is bit-identical to no
 * truncation); a rollout without sampling log-probs gets weight 1 and is counted; and the step's
 * clip fraction, mean weight and loss match weights computed by hand.
 */
import { GrpoTrainer, responseValues, tokenBatch, type PolicyLossConfig, type RolloutGroup } from '@lathe/grpo';
import { tinyModel } from './tiny-qwen3';

const V = 8;
type Meta = { i: number };
const tokenizer = { decode: (ids: readonly number[]) => ids.join(' '), padId: 0 };

/** One group of four completions of prompt [1, 2]; the second has tool output inside (two trained tokens of six). */
const group: RolloutGroup<Meta> = {
  prompt: { ids: [1, 2], text: '1 2', meta: { i: 0 }, key: 0, index: 0 },
  completions: [
    { tokens: [3, 4, 5], stopped: true },
    { tokens: [4, 6, 6, 6, 6, 5], stopped: true, mask: [1, 0, 0, 0, 0, 1] },
    { tokens: [7, 6, 3], stopped: false },
    { tokens: [3], stopped: false },
  ],
  rewards: [1, 0, 0.5, 0],
};
const TRAINED = [3, 2, 3, 1];

function trainer(loss: PolicyLossConfig): GrpoTrainer<Meta> {
  return GrpoTrainer.create<Meta>({
    model: tinyModel(V).lm,
    tokenizer,
    stopIds: [5],
    rewards: () => Promise.reject(new Error('stepOnRollouts calls no reward function')),
    groupSize: 4,
    maxNewTokens: 6,
    loss: { aggregation: 'token-mean', ...loss },
    minibatches: 1,
    shuffle: false,
  });
}

/** The training forward's log-probs of each completion's tokens (what re-scoring will give the step). */
async function trainingLogprobs(t: GrpoTrainer<Meta>): Promise<number[][]> {
  const batch = tokenBatch(
    group.completions.map(() => group.prompt.ids),
    group.completions.map((c) => ({ tokens: [...c.tokens], logprobs: c.tokens.map(() => 0), stopped: c.stopped })),
    0,
  );
  const { logp } = await t.rescore(batch);
  return responseValues(batch, logp);
}

const sameParams = (a: Map<string, Float32Array>, b: Map<string, Float32Array>) => {
  expect([...a.keys()]).toEqual([...b.keys()]);
  for (const [k, v] of a) expect(Buffer.from(v.buffer).equals(Buffer.from(b.get(k)!.buffer))).toBe(true);
};

test('C = 4 with sampling log-probs equal to the training forward’s: weights exactly 1, the update identical to no truncation', async () => {
  const plain = trainer({ rolloutIsThreshold: 0 });
  const tis = trainer({ rolloutIsThreshold: 4 });
  try {
    const lp = await trainingLogprobs(tis);
    const given = { ...group, completions: group.completions.map((c, r) => ({ ...c, logprobs: lp[r] })) };
    const a = await plain.stepOnRollouts([given], 1e-2);
    const b = await tis.stepOnRollouts([given], 1e-2);
    expect(b.metrics.rollout_is_clip_fraction).toBe(0);
    expect(b.metrics.rollout_is_weight_mean).toBe(1);
    expect(b.metrics.rollout_is_unweighted_tokens).toBe(0);
    expect(a.metrics.rollout_is_clip_fraction).toBeUndefined();
    expect(b.metrics.loss).toBe(a.metrics.loss);
    expect(b.metrics.grad_norm).toBe(a.metrics.grad_norm);
    sameParams(tis.trainer.downloadParams(), plain.trainer.downloadParams());
  } finally {
    plain.dispose();
    tis.dispose();
  }
});

test('rollouts without sampling log-probs get weight 1 (the update identical to no truncation), their tokens counted', async () => {
  const plain = trainer({ rolloutIsThreshold: 0 });
  const tis = trainer({ rolloutIsThreshold: 4 });
  try {
    const a = await plain.stepOnRollouts([group], 1e-2);
    const b = await tis.stepOnRollouts([group], 1e-2);
    expect(b.metrics.rollout_is_unweighted_tokens).toBe(TRAINED.reduce((x, y) => x + y, 0));
    expect(b.metrics.rollout_is_weight_mean).toBe(1);
    expect(b.metrics.rollout_is_clip_fraction).toBe(0);
    expect(b.metrics.loss).toBe(a.metrics.loss);
    sameParams(tis.trainer.downloadParams(), plain.trainer.downloadParams());
  } finally {
    plain.dispose();
    tis.dispose();
  }
});

test('hand-computed truncation: π_old/π_sample = 8, 2, 1 on three rows (C = 4), none given on the fourth', async () => {
  const t = trainer({ rolloutIsThreshold: 4 });
  try {
    const lp = await trainingLogprobs(t);
    // log π_sample = log π_old − log(ratio): row 0 at 8 (truncated to 4), row 1 at 2, row 2 at 1, row 3 without log-probs
    const ratios = [8, 2, 1];
    const given = {
      ...group,
      completions: group.completions.map((c, r) => (r < 3 ? { ...c, logprobs: lp[r].map((x) => x - Math.log(ratios[r])) } : c)),
    };
    const { metrics, rollouts } = await t.stepOnRollouts([given], 1e-2);
    const weights = [4, 2, 1, 1];
    const tokens = TRAINED.reduce((x, y) => x + y, 0);
    expect(metrics.rollout_is_clip_fraction).toBeCloseTo(3 / tokens, 6);
    expect(metrics.rollout_is_weight_mean).toBeCloseTo(TRAINED.reduce((s, n, r) => s + n * weights[r], 0) / tokens, 5);
    expect(metrics.rollout_is_unweighted_tokens).toBe(1);
    // one update from the stored batch at ratio 1: each trained token's loss is −w·A of its row
    const adv = rollouts.map((r) => r.advantage);
    expect(metrics.loss).toBeCloseTo(-adv.reduce((s, a, r) => s + weights[r] * a * TRAINED[r], 0) / tokens, 5);
  } finally {
    t.dispose();
  }
});
