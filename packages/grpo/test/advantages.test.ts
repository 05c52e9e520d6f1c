import {
  advantageMatrix,
  builtinEstimator,
  discountedReturns,
  drGrpoAdvantages,
  gaeAdvantages,
  grpoAdvantages,
  klEstimate,
  klPenalisedRewards,
  reinforcePlusPlusAdvantages,
  remaxAdvantages,
  rlooAdvantages,
} from '@lathe/grpo';

const close = (actual: readonly number[], expected: readonly number[], digits = 9) => {
  expect(actual).toHaveLength(expected.length);
  actual.forEach((a, i) => expect(a).toBeCloseTo(expected[i], digits));
};

describe('GRPO', () => {
  test('group mean and unbiased std, eps 1e-6 added to the std', () => {
    // group 1: mean 0.5, unbiased std √(4·0.25/3) = √(1/3); group 2: mean 3, deviations 0 −2 −1 3, SS 14, std √(14/3)
    const { advantages, stats } = grpoAdvantages({ rewards: [1, 0, 0, 1, 3, 1, 2, 6], groupSize: 4 });
    const s1 = Math.sqrt(1 / 3) + 1e-6;
    const s2 = Math.sqrt(14 / 3) + 1e-6;
    close(advantages, [0.5 / s1, -0.5 / s1, -0.5 / s1, 0.5 / s1, 0, -2 / s2, -1 / s2, 3 / s2]);
    expect(stats).toEqual({ groups: 2, uniformGroups: 0, zeroAdvantages: 1 });
  });

  test('biased std and a custom epsilon', () => {
    const { advantages } = grpoAdvantages({ rewards: [1, 0, 0, 1], groupSize: 4 }, { unbiasedStd: false, stdEpsilon: 1e-4 });
    close(advantages, [0.5 / 0.5001, -0.5 / 0.5001, -0.5 / 0.5001, 0.5 / 0.5001]);
  });

  test('all-equal rewards give exactly zero advantage and are counted', () => {
    // The float mean of three 0.1s is 0.10000000000000002: zero must be set, not computed.
    const { advantages, stats } = grpoAdvantages({ rewards: [0.1, 0.1, 0.1, 1, 1, 1, 0, 1, 0], groupSize: 3 });
    expect(advantages.slice(0, 6)).toEqual([0, 0, 0, 0, 0, 0]);
    expect(stats).toEqual({ groups: 3, uniformGroups: 2, zeroAdvantages: 6 });
    const s = Math.sqrt(((1 / 3) ** 2 * 2 + (2 / 3) ** 2) / 2) + 1e-6;
    close(advantages.slice(6), [(-1 / 3) / s, (2 / 3) / s, (-1 / 3) / s]);
  });

  test('batch-level std (TRL scale_rewards="batch")', () => {
    // group means 0.5 and 3; batch [1, 0, 3, 3]: mean 1.75, SS 6.75, unbiased var 2.25, std 1.5
    const { advantages } = grpoAdvantages({ rewards: [1, 0, 3, 3], groupSize: 2 }, { scale: 'batch' });
    close(advantages, [0.5 / 1.500001, -0.5 / 1.500001, 0, 0]);
  });

  test('Dr.GRPO: centred, not divided', () => {
    close(drGrpoAdvantages({ rewards: [3, 1, 2, 6], groupSize: 4 }).advantages, [0, -2, -1, 3]);
  });

  test('bad input names the field', () => {
    expect(() => grpoAdvantages({ rewards: [1, 0, 1], groupSize: 2 })).toThrow(/groupSize 2/);
    expect(() => grpoAdvantages({ rewards: [1, NaN], groupSize: 2 })).toThrow(/rewards\[1\] is NaN/);
    expect(() => grpoAdvantages({ rewards: [1], groupSize: 1 })).toThrow(/groupSize must be an integer ≥ 2/);
  });
});

test('RLOO: leave-one-out baseline', () => {
  // total 12: 3 − 9/3, 1 − 11/3, 2 − 10/3, 6 − 6/3
  const { advantages, stats } = rlooAdvantages({ rewards: [3, 1, 2, 6, 5, 5, 5, 5], groupSize: 4 });
  close(advantages, [0, -8 / 3, -4 / 3, 4, 0, 0, 0, 0]);
  expect(stats.uniformGroups).toBe(1);
});

test('ReMax: the greedy completion’s reward is the baseline', () => {
  const a = remaxAdvantages({ rewards: [1, 0, 1, 0, 0, 0], groupSize: 3, greedyRewards: [1, 0] });
  expect(a.advantages).toEqual([0, -1, 0, 0, 0, 0]);
  expect(a.stats).toEqual({ groups: 2, uniformGroups: 1, zeroAdvantages: 5 });
  // a uniform group is not zeroed when the greedy reward differs
  expect(remaxAdvantages({ rewards: [0, 0], groupSize: 2, greedyRewards: [1] }).advantages).toEqual([-1, -1]);
  // group size 1 is fine
  expect(remaxAdvantages({ rewards: [0.5], groupSize: 1, greedyRewards: [0.25] }).advantages).toEqual([0.25]);
  expect(() => remaxAdvantages({ rewards: [1, 0], groupSize: 1, greedyRewards: [1] })).toThrow(/greedyRewards has 1 entries; expected one per group \(2\)/);
});

describe('REINFORCE++', () => {
  test('no baseline: returns whitened over the batch’s tokens (biased variance, eps 1e-8)', () => {
    // tokens [1, 1] and [0]: mean 2/3, variance (2·(1/3)² + (2/3)²)/3 = 2/9
    const r = reinforcePlusPlusAdvantages({ rewards: [1, 0], groupSize: 1, lengths: [2, 1] });
    const s = Math.sqrt(2 / 9 + 1e-8);
    close(r.advantages[0], [1 / 3 / s, 1 / 3 / s]);
    close(r.advantages[1], [-2 / 3 / s]);
    close(r.returns.flat(), [1, 1, 0]);
  });

  test('per-token shaping and discount: G_t = r_t + γ·G_{t+1}, outcome on the last token', () => {
    const r = reinforcePlusPlusAdvantages({ rewards: [1], groupSize: 1, lengths: [3], tokenRewards: [[-0.1, -0.2, -0.3]] }, { gamma: 0.5, whiten: 'none' });
    // per token [−0.1, −0.2, 0.7]: G2 = 0.7, G1 = −0.2 + 0.35 = 0.15, G0 = −0.1 + 0.075 = −0.025
    close(r.advantages[0], [-0.025, 0.15, 0.7]);
    close(discountedReturns([1, 2, 3], 0.1), [1.23, 2.3, 3]);
  });

  test('group baseline, std-only whitening keeps uniform groups at zero', () => {
    // centred outcomes [0.5, −0.5 | 0, 0]; tokens [0.5], [−0.5], [0, 0], [0]: mean 0, variance 0.5/5 = 0.1
    const r = reinforcePlusPlusAdvantages({ rewards: [1, 0, 1, 1], groupSize: 2, lengths: [1, 1, 2, 1] }, { baseline: 'group', whiten: 'std' });
    const s = Math.sqrt(0.1 + 1e-8);
    close(r.advantages.flat(), [0.5 / s, -0.5 / s, 0, 0, 0]);
    expect(r.advantages.slice(2)).toEqual([[0, 0], [0]]);
    expect(r.stats).toEqual({ groups: 2, uniformGroups: 1, zeroAdvantages: 2 });
  });

  test('group baseline with mean-std whitening (token-weighted mean)', () => {
    // centred [0.5, −0.5]; tokens [0.5, 0.5, −0.5]: mean 1/6, deviations 1/3 1/3 −2/3, variance 2/9
    const r = reinforcePlusPlusAdvantages({ rewards: [1, 0], groupSize: 2, lengths: [2, 1] }, { baseline: 'group' });
    const s = Math.sqrt(2 / 9 + 1e-8);
    close(r.advantages.flat(), [1 / 3 / s, 1 / 3 / s, -2 / 3 / s]);
  });

  test('lengths must match', () => {
    expect(() => reinforcePlusPlusAdvantages({ rewards: [1], groupSize: 1, lengths: [2], tokenRewards: [[0]] })).toThrow(/tokenRewards\[0\] has 1 entries for a response of 2 tokens/);
    expect(() => reinforcePlusPlusAdvantages({ rewards: [1], groupSize: 1, lengths: [0] })).toThrow(/lengths\[0\] must be a positive integer/);
  });
});

test('GAE: δ_t = r_t + γV_{t+1} − V_t, A_t = δ_t + γλA_{t+1}', () => {
  const a = gaeAdvantages({ tokenRewards: [[0, 0, 1]], values: [[0.5, 0.6, 0.8]] }, { gamma: 1, lambda: 0.9, whiten: false });
  // δ = [0.1, 0.2, 0.2]; A2 = 0.2, A1 = 0.2 + 0.18 = 0.38, A0 = 0.1 + 0.342 = 0.442
  close(a.advantages[0], [0.442, 0.38, 0.2]);
  close(a.returns[0], [0.942, 0.98, 1.0]);
  // λ = 1: A_t = discounted return − V_t
  const b = gaeAdvantages({ tokenRewards: [[0, 0, 1]], values: [[0.5, 0.6, 0.8]] }, { gamma: 0.9, lambda: 1, whiten: false });
  close(b.advantages[0], [0.81 - 0.5, 0.9 - 0.6, 1 - 0.8]);
});

test('advantageMatrix lays advantages on the masked positions', () => {
  const mask = [0, 1, 1, 0, 1, 1, 1, 1];
  const seq = advantageMatrix({ kind: 'sequence', advantages: [2, -1], stats: { groups: 1, uniformGroups: 0, zeroAdvantages: 0 } }, mask, [2, 4]);
  expect(Array.from(seq)).toEqual([0, 2, 2, 0, -1, -1, -1, -1]);
  const tok = advantageMatrix({ kind: 'token', advantages: [[0.5, 0.25], [1, 2, 3, 4]], returns: [], stats: { groups: 1, uniformGroups: 0, zeroAdvantages: 0 } }, mask, [2, 4]);
  expect(Array.from(tok)).toEqual([0, 0.5, 0.25, 0, 1, 2, 3, 4]);
  expect(() => advantageMatrix({ kind: 'token', advantages: [[1], [1, 2, 3, 4]], returns: [], stats: { groups: 1, uniformGroups: 0, zeroAdvantages: 0 } }, mask, [2, 4])).toThrow(
    /row 0 has more masked positions than its 1 token advantages/,
  );
});

describe('KL on the host', () => {
  test('k1, k2, k3 of x = logp − ref = 0.5', () => {
    expect(klEstimate(-1, -1.5, 'k1')).toBeCloseTo(0.5, 12);
    expect(klEstimate(-1, -1.5, 'k2')).toBeCloseTo(0.125, 12);
    expect(klEstimate(-1, -1.5, 'k3')).toBeCloseTo(0.6065306597126334 - 0.5, 12);
    expect(klEstimate(-2, -2, 'k3')).toBe(0);
  });

  test('as a reward penalty: −β·kl per token, r − β·Σkl per sequence', () => {
    const r = klPenalisedRewards({ rewards: [1, 0], logp: [[-1, -2], [-0.5]], refLogp: [[-1.5, -2], [-0.25]] }, { coef: 0.1 });
    close(r.tokenPenalties[0], [-0.05, 0]);
    close(r.tokenPenalties[1], [0.025]);
    close(r.sequenceRewards, [0.95, 0.025]);
    expect(r.meanSequenceKl).toBeCloseTo((0.5 - 0.25) / 2, 12);
    expect(() => klPenalisedRewards({ rewards: [1], logp: [[-1]], refLogp: [[-1, -2]] }, { coef: 0.1 })).toThrow(/completion 0 has 1 logp but 2 refLogp/);
  });
});

describe('uniform groups are decided on the outcome rewards (a KL reward penalty shapes the rewards after the outcome)', () => {
  test('GRPO, RLOO and ReMax with outcomeRewards', () => {
    // group 1: outcomes [1, 1] are uniform though the shaped rewards [0.9, 0.8] differ; group 2: [0.3, 1.1], mean 0.7, unbiased std √(2·0.16) = 0.4√2
    const batch = { rewards: [0.9, 0.8, 0.3, 1.1], groupSize: 2, outcomeRewards: [1, 1, 0, 1] };
    const s = 0.4 * Math.SQRT2 + 1e-6;
    const grpo = grpoAdvantages(batch);
    expect(grpo.advantages.slice(0, 2)).toEqual([0, 0]);
    close(grpo.advantages.slice(2), [-0.4 / s, 0.4 / s]);
    expect(grpo.stats).toEqual({ groups: 2, uniformGroups: 1, zeroAdvantages: 2 });
    // RLOO: 0.3 − 1.1 = −0.8, 1.1 − 0.3 = 0.8
    const rloo = rlooAdvantages(batch);
    expect(rloo.advantages.slice(0, 2)).toEqual([0, 0]);
    close(rloo.advantages.slice(2), [-0.8, 0.8]);
    expect(rloo.stats.uniformGroups).toBe(1);
    // ReMax does not zero uniform groups (the greedy reward is the baseline) but counts them on the outcome
    const remax = remaxAdvantages({ ...batch, greedyRewards: [0.5, 0.5] });
    close(remax.advantages, [0.4, 0.3, -0.2, 0.6]);
    expect(remax.stats.uniformGroups).toBe(1);
    // without outcomeRewards the shaped rewards decide: no uniform group
    expect(grpoAdvantages({ rewards: batch.rewards, groupSize: 2 }).stats.uniformGroups).toBe(0);
    expect(() => grpoAdvantages({ ...batch, outcomeRewards: [1, 1] })).toThrow(/2 outcomeRewards for 4 rewards/);
  });

  test('the built-in grpo estimator: KL-shaped sequence rewards, uniform groups from the outcome', () => {
    const est = builtinEstimator('grpo').estimate;
    const lengths = [1, 1, 1, 1];
    const logp = lengths.map(() => [0]);
    // outcomes [1, 1 | 0, 1], penalties −0.1, −0.2, 0, −0.1: group 2's sequence rewards [0, 0.9], mean 0.45, std 0.45√2
    const a = est({ rewards: [1, 1, 0, 1], groupSize: 2, lengths, logp, tokenRewards: [[-0.1], [-0.2], [0], [-0.1]] });
    const s = 0.45 * Math.SQRT2 + 1e-6;
    expect(a.advantages.slice(0, 2)).toEqual([0, 0]);
    close(a.advantages.slice(2) as number[], [-0.45 / s, 0.45 / s]);
    expect(a.stats.uniformGroups).toBe(1);
  });

  test('REINFORCE++-baseline with mean-std whitening counts uniform groups but does not zero them (batch mean, as verl)', () => {
    // centred outcomes [0.5, −0.5 | 0, 0], lengths [2, 1, 1, 1]: tokens [0.5, 0.5, −0.5, 0, 0], mean 0.1, variance 0.7/5 = 0.14
    const r = reinforcePlusPlusAdvantages({ rewards: [1, 0, 1, 1], groupSize: 2, lengths: [2, 1, 1, 1] }, { baseline: 'group' });
    const s = Math.sqrt(0.14 + 1e-8);
    close(r.advantages.flat(), [0.4 / s, 0.4 / s, -0.6 / s, -0.1 / s, -0.1 / s]);
    expect(r.stats).toEqual({ groups: 2, uniformGroups: 1, zeroAdvantages: 0 });
  });
});

describe('groups of unequal size, members in any order (groupIds)', () => {
  // groups: a = [1, 0, 1] (indices 0, 2, 5), b = [0, 1] (1, 4), c = [1, 1, 1, 1] (3, 6, 7, 8)
  const ids = ['a', 'b', 'a', 'c', 'b', 'a', 'c', 'c', 'c'];
  const rewards = [1, 0, 0, 1, 1, 1, 1, 1, 1];
  const batch = { rewards, groupSize: 0, groupIds: ids };

  test('GRPO and RLOO by hand, each group with its own size', () => {
    const sa = Math.sqrt(((1 - 2 / 3) ** 2 * 2 + (2 / 3) ** 2) / 2); // group a's unbiased std
    const sb = Math.sqrt(0.5);
    const grpo = grpoAdvantages(batch).advantages;
    const expected = [(1 - 2 / 3) / (sa + 1e-6), (0 - 0.5) / (sb + 1e-6), (0 - 2 / 3) / (sa + 1e-6), 0, (1 - 0.5) / (sb + 1e-6), (1 - 2 / 3) / (sa + 1e-6), 0, 0, 0];
    grpo.forEach((a, i) => expect(a).toBeCloseTo(expected[i], 12));
    // RLOO: r_i − mean of the others in its group (a: 3 members, b: 2)
    expect(rlooAdvantages(batch).advantages).toEqual([1 - 0.5, 0 - 1, 0 - 1, 0, 1 - 0, 1 - 0.5, 0, 0, 0]);
    expect(grpoAdvantages(batch).stats).toEqual({ groups: 3, uniformGroups: 1, zeroAdvantages: 4 });
  });

  test('the same groups laid out consecutively give the same advantages, permuted', () => {
    const order = [0, 2, 5, 1, 4, 3, 6, 7, 8]; // a, b, c
    const shuffled = grpoAdvantages(batch).advantages;
    const asConsecutive = grpoAdvantages({ rewards: order.map((i) => rewards[i]), groupSize: 0, groupIds: order.map((i) => ids[i]) }).advantages;
    order.forEach((i, k) => expect(asConsecutive[k]).toBe(shuffled[i]));
  });

  test('ReMax takes one greedy reward per group in order of first appearance; REINFORCE++-baseline centres per group', () => {
    expect(remaxAdvantages({ ...batch, greedyRewards: [1, 0, 0.5] }).advantages).toEqual([0, 0, -1, 0.5, 1, 0, 0.5, 0.5, 0.5]);
    const lengths = rewards.map(() => 1);
    const rpp = reinforcePlusPlusAdvantages({ ...batch, lengths }, { baseline: 'group', whiten: 'none' }).advantages.map((row) => row[0]);
    expect(rpp).toEqual([1 - 2 / 3, -0.5, -2 / 3, 0, 0.5, 1 - 2 / 3, 0, 0, 0].map((x) => expect.closeTo(x, 12)));
  });

  test('a group below the estimator\'s minimum is named', () => {
    expect(() => grpoAdvantages({ rewards: [1, 0, 1], groupSize: 0, groupIds: [7, 7, 9] })).toThrow(/group '9' has 1 completion\(s\); this estimator needs ≥ 2/);
    expect(() => grpoAdvantages({ rewards: [1, 0], groupSize: 0, groupIds: [1] })).toThrow(/1 groupIds for 2 rewards/);
  });
});
