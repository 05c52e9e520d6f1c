/**
 * Response masks with gaps (tokens inside a completion the policy did not sample, e.g. tool output
 * in a multi-turn rollout): the token batch's training mask, the loss over trained tokens only
 * (against the PPO loss at ratio 1 computed by hand), no KL penalty on untrained tokens, and
 * rollouts read from trajectory rows (`rolloutGroups`) with their `output_mask`.
 */
import { GrpoTrainer, grpoAdvantages, klEstimate, klPenalisedRewards, rolloutGroups, selectRows, tokenBatch, type RolloutGroup, type TrajectoryRollout } from '@lathe/grpo';
import { tinyModel } from './tiny-qwen3';

const V = 8;
/** What `rolloutGroups` puts in a prompt's meta. */
type Meta = { promptIdx: number };
const tokenizer = { decode: (ids: readonly number[]) => ids.join(' '), padId: 0 };

test('the training mask drops the untrained tokens from the loss positions, not from the row', () => {
  const batch = tokenBatch(
    [[1, 2], [3]],
    [
      { tokens: [4, 5, 6, 7], logprobs: [-1, -1, -1, -1], stopped: true, mask: [1, 0, 0, 1] },
      { tokens: [5, 6], logprobs: [-1, -1], stopped: false },
    ],
    0,
  );
  expect(batch.width).toBe(6);
  const row = (m: BigInt64Array, r: number) => Array.from(m.subarray(r * 6, r * 6 + 6), Number);
  // predicting positions: p − 1 + k
  expect(row(batch.responseMask, 0)).toEqual([0, 1, 1, 1, 1, 0]);
  expect(row(batch.trainMask, 0)).toEqual([0, 1, 0, 0, 1, 0]);
  expect(row(batch.trainMask, 1)).toEqual([1, 1, 0, 0, 0, 0]);
  expect(row(batch.attentionMask, 0)).toEqual([1, 1, 1, 1, 1, 1]);
  expect(batch.lengths).toEqual([4, 2]);
  expect(batch.trainedLengths).toEqual([2, 2]);
  expect(Array.from(selectRows(batch, [0]).response_mask.data as BigInt64Array, Number)).toEqual([0, 1, 0, 0, 1, 0]);
  // without any mask the training mask is the response mask itself
  const plain = tokenBatch([[1]], [{ tokens: [2, 3], logprobs: [0, 0], stopped: false }], 0);
  expect(plain.trainMask).toBe(plain.responseMask);
  expect(() => tokenBatch([[1]], [{ tokens: [2, 3], logprobs: [0, 0], stopped: false, mask: [1] }], 0)).toThrow("row 0 has 2 tokens but a mask of 1");
  expect(() => tokenBatch([[1]], [{ tokens: [2, 3], logprobs: [0, 0], stopped: false, mask: [1, 2] }], 0)).toThrow("row 0's mask has 2 at token 1 (expected 0 or 1)");
});

test('a KL penalty skips untrained tokens', () => {
  const logp = [[-1, -2, -0.5]];
  const refLogp = [[-1.5, -1, -0.7]];
  const r = klPenalisedRewards({ rewards: [1], logp, refLogp, mask: [[1, 0, 1]] }, { coef: 0.1, estimator: 'k3' });
  const k = (t: number) => klEstimate(logp[0][t], refLogp[0][t], 'k3');
  expect(r.tokenPenalties[0][1]).toBe(0);
  expect(r.tokenPenalties[0][0]).toBeCloseTo(-0.1 * k(0), 12);
  expect(r.sequenceRewards[0]).toBeCloseTo(1 - 0.1 * (k(0) + k(2)), 12);
});

/** One group of four completions of prompt [1, 2], the second and third with tool output inside. */
const group: RolloutGroup<Meta> = {
  prompt: { ids: [1, 2], text: '1 2', meta: { promptIdx: 0 }, key: 0, index: 0 },
  completions: [
    { tokens: [3, 4, 5], stopped: true },
    { tokens: [4, 6, 6, 6, 6, 5], stopped: true, mask: [1, 0, 0, 0, 0, 1] },
    { tokens: [7, 6, 6, 3], stopped: false, mask: [1, 1, 0, 0] },
    { tokens: [3], stopped: false },
  ],
  rewards: [1, 0, 0.5, 0],
};

function trainer(): GrpoTrainer<Meta> {
  return GrpoTrainer.create<Meta>({
    model: tinyModel(V).lm,
    tokenizer,
    stopIds: [5],
    rewards: () => Promise.reject(new Error('stepOnRollouts calls no reward function')),
    groupSize: 4,
    maxNewTokens: 6,
    loss: { aggregation: 'token-mean' },
    minibatches: 1,
    shuffle: false,
  });
}

test('stepOnRollouts: the loss is the PPO loss at ratio 1 over the trained tokens alone', async () => {
  const t = trainer();
  try {
    const { metrics, rollouts } = await t.stepOnRollouts([group], 1e-3);
    const adv = rollouts.map((r) => r.advantage);
    // one update from the stored batch: ratio 1, so each trained token's loss is −A of its row
    const trained = [3, 2, 2, 1];
    const all = [3, 6, 4, 1];
    const expected = -adv.reduce((s, a, r) => s + a * trained[r], 0) / trained.reduce((a, b) => a + b, 0);
    const ignoringGaps = -adv.reduce((s, a, r) => s + a * all[r], 0) / all.reduce((a, b) => a + b, 0);
    expect(Math.abs(expected - ignoringGaps)).toBeGreaterThan(0.05);
    expect(metrics.loss).toBeCloseTo(expected, 5);
    // GRPO's advantages come from the given rewards (mean 0.375), their order kept
    expect(adv[0]).toBeGreaterThan(adv[2]);
    expect(adv[2]).toBeGreaterThan(adv[1]);
    expect(adv[1]).toBeCloseTo(adv[3], 12);
    expect(metrics.response_length_mean).toBeCloseTo(14 / 4, 12);
    // no generation log-probs were given: the parity is the re-scored forward's own, exact
    expect(metrics.logp_parity).toBeCloseTo(1, 5);
  } finally {
    t.dispose();
  }
});

test('rolloutGroups reads trajectory rows (group_id, reward, output_mask, finish_reason) into the same step', async () => {
  const rows: TrajectoryRollout[] = group.completions.map((c, j) => ({
    prompt_idx: 0,
    prompt: '1 2',
    prompt_token_ids: Int32Array.from([1, 2]),
    output_token_ids: Int32Array.from(c.tokens),
    reward: group.rewards[j],
    group_id: 9,
    output_mask: c.mask ? Int32Array.from(c.mask) : null,
    finish_reason: c.stopped ? 'stop' : 'length',
  }));
  const groups = rolloutGroups(rows, 4);
  expect(groups).toHaveLength(1);
  expect(groups[0].completions.map((c) => c.mask ?? null)).toEqual(group.completions.map((c) => c.mask ?? null));
  expect(groups[0].completions.map((c) => c.stopped)).toEqual([true, true, false, false]);
  const a = trainer();
  const b = trainer();
  try {
    const fromRows = await a.stepOnRollouts(groups, 1e-3);
    const direct = await b.stepOnRollouts([group], 1e-3);
    expect(fromRows.metrics.loss).toBe(direct.metrics.loss);
    expect(fromRows.metrics.grad_norm).toBe(direct.metrics.grad_norm);
  } finally {
    a.dispose();
    b.dispose();
  }
  expect(() => rolloutGroups(rows.slice(0, 3), 4)).toThrow('group 9 (rows 0, 1, 2) has 3 completions, expected 4');
  expect(rolloutGroups(rows.slice(0, 3))[0].completions).toHaveLength(3);
  expect(() => rolloutGroups([{ ...rows[0], reward: null }], 1)).toThrow('row 0 has no finite reward');
});

test('stepOnRollouts takes groups of other sizes: each group gets the advantages it would get alone', async () => {
  const t = trainer();
  const small: RolloutGroup<Meta> = { prompt: { ids: [3], text: '3', meta: { promptIdx: 1 }, key: 1, index: 1 }, completions: [{ tokens: [4, 5], stopped: true }, { tokens: [6], stopped: false }], rewards: [0.25, 1] };
  try {
    const { rollouts } = await t.stepOnRollouts([{ ...group, completions: group.completions.slice(0, 3), rewards: [1, 0, 0.5] }, small], 1e-3);
    const alone = [grpoAdvantages({ rewards: [1, 0, 0.5], groupSize: 3 }), grpoAdvantages({ rewards: [0.25, 1], groupSize: 2 })].flatMap((a) => a.advantages);
    expect(rollouts.map((r) => r.advantage)).toEqual(alone);
    expect(alone[0]).toBeGreaterThan(0);
    await expect(t.stepOnRollouts([{ ...group, rewards: [1, 0] }], 1e-3)).rejects.toThrow('group 0 has 2 rewards for 4 completions');
  } finally {
    t.dispose();
  }
  const g = GrpoTrainer.create<Meta>({ model: tinyModel(V).lm, tokenizer, stopIds: [5], rewards: () => Promise.reject(new Error('unused')), groupSize: 4, maxNewTokens: 6, oldLogprobs: 'generation' });
  try {
    await expect(g.stepOnRollouts([group], 1e-3)).rejects.toThrow('group 0, completion 0 has no logprobs');
  } finally {
    g.dispose();
  }
});

test('learning through stepOnRollouts with tool output after each answer: reward rises from chance to ≥ 0.9', async () => {
  // one-token task: prompt p must be answered ANSWERS[p] (chance 1/8); every rollout's answer is
  // followed by two tokens of "tool output" the policy never sampled, masked out of the loss
  const ANSWERS = [5, 7, 3, 2];
  const TOOL = 6;
  const t = GrpoTrainer.create<Meta>({
    model: tinyModel(V).lm,
    tokenizer,
    stopIds: [],
    rewards: () => Promise.reject(new Error('stepOnRollouts calls no reward function')),
    groupSize: 8,
    maxNewTokens: 1,
    loss: { aggregation: 'token-mean', clipHigh: 0.28 },
    minibatches: 2,
  });
  try {
    const mean: number[] = [];
    for (let s = 0; s < 60 && !(mean.length >= 3 && mean.slice(-3).every((m) => m >= 0.9)); s++) {
      const prompts = ANSWERS.map((_a, p) => ({ ids: [p], text: String(p), meta: { promptIdx: p }, key: s * ANSWERS.length + p, index: p }));
      const samples = await t.generateSamples(prompts);
      const groups: RolloutGroup<Meta>[] = prompts.map((prompt, p) => ({
        prompt,
        completions: samples[p].map((c) => ({ tokens: [c.tokens[0], TOOL, TOOL], stopped: false, mask: [1, 0, 0] })),
        rewards: samples[p].map((c) => (c.tokens[0] === ANSWERS[p] ? 1 : 0)),
      }));
      await t.stepOnRollouts(groups, 0.03);
      mean.push(groups.flatMap((g) => g.rewards).reduce((a, b) => a + b, 0) / 32);
    }
    console.log(`stepOnRollouts with masked tool output: ${mean.length} steps, mean reward ${mean[0].toFixed(2)} → ${mean.at(-1)!.toFixed(2)}`);
    expect(mean[0]).toBeLessThan(0.4);
    expect(mean.slice(-3).every((m) => m >= 0.9)).toBe(true);
  } finally {
    t.dispose();
  }
});
