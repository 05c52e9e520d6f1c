import { combineRewards, dropUniformGroups, dynamicSampling, overlongReward, type RewardFailure } from '@lathe/grpo';

interface Meta {
  answer: string;
  completionTokens: number;
}

const samples = [
  { prompt: 'What is 2+2?', completion: '4', meta: { answer: '4', completionTokens: 10 } },
  { prompt: 'What is 3+3?', completion: 'five', meta: { answer: '6', completionTokens: 90 } },
  { prompt: 'Name a prime.', completion: '7', meta: { answer: '7', completionTokens: 100 } },
];

describe('combineRewards', () => {
  test('weighted sum of sync and async sources, per-source values and stats', async () => {
    const score = combineRewards<Meta>(
      [
        { name: 'correct', fn: (_p, c, m) => (c === m.answer ? 1 : 0) },
        { name: 'short', fn: async (_p, c) => (c.length <= 1 ? 1 : 0), weight: 0.5 },
      ],
      { fallback: -1 },
    );
    const out = await score(samples);
    expect(out.rewards).toEqual([1.5, 0, 1.5]);
    expect(out.bySource).toEqual({ correct: [1, 0, 1], short: [1, 0, 1] });
    expect(out.failures).toEqual([]);
    expect(out.stats.correct.mean).toBeCloseTo(2 / 3, 12);
    expect(out.stats.correct.std).toBeCloseTo(Math.sqrt(2 / 9), 12);
  });

  test('a throwing or NaN reward is reported with its prompt, counted, and given the fallback', async () => {
    const seen: RewardFailure[] = [];
    const score = combineRewards<Meta>(
      [
        { name: 'flaky', fn: (p) => (p.includes('3+3') ? Promise.reject(new Error('grader crashed')) : 1) },
        { name: 'nan', fn: (p) => (p.includes('prime') ? NaN : 0.25), weight: 2 },
      ],
      { fallback: -0.5, onFailure: (f) => seen.push(f) },
    );
    const out = await score(samples);
    expect(out.bySource.flaky).toEqual([1, -0.5, 1]);
    expect(out.bySource.nan).toEqual([0.25, 0.25, -0.5]);
    expect(out.rewards).toEqual([1.5, 0, 0]);
    expect(out.failures).toEqual([
      { source: 'flaky', index: 1, prompt: 'What is 3+3?', kind: 'threw', detail: 'grader crashed' },
      { source: 'nan', index: 2, prompt: 'Name a prime.', kind: 'non-finite', detail: 'NaN' },
    ]);
    expect(seen).toHaveLength(2);
    expect(out.stats.flaky.failures).toBe(1);
    expect(out.stats.nan.failures).toBe(1);
  });

  test('the default report goes to console.warn with the prompt', async () => {
    const warn = jest.spyOn(console, 'warn').mockImplementation(() => undefined);
    try {
      await combineRewards([{ name: 'inf', fn: () => Infinity }], { fallback: 0 })([{ prompt: 'p?', completion: 'c', meta: {} }]);
      expect(warn).toHaveBeenCalledWith(expect.stringMatching(/reward 'inf' returned Infinity on sample 0; using the fallback\. Prompt: "p\?"/));
    } finally {
      warn.mockRestore();
    }
  });

  test('configuration errors name the field', () => {
    const fn = () => 1;
    expect(() => combineRewards([], { fallback: 0 })).toThrow(/at least one reward source/);
    expect(() => combineRewards([{ name: 'a', fn }, { name: 'a', fn }], { fallback: 0 })).toThrow(/two reward sources are named 'a'/);
    expect(() => combineRewards([{ name: 'a', fn, weight: NaN }], { fallback: 0 })).toThrow(/source 'a' has weight NaN/);
    expect(() => combineRewards([{ name: 'a', fn }], { fallback: NaN })).toThrow(/fallback must be a finite number/);
  });
});

test('overlong penalty: 0 up to maxLength − buffer, linear to −maxPenalty at maxLength', async () => {
  const fn = overlongReward({ maxLength: 100, buffer: 20, maxPenalty: 1 });
  const at = (n: number) => fn('', '', { completionTokens: n });
  expect(await at(10)).toBe(0);
  expect(await at(80)).toBe(0);
  expect(await at(90)).toBeCloseTo(-0.5, 12);
  expect(await at(95)).toBeCloseTo(-0.75, 12);
  expect(await at(100)).toBe(-1);
  expect(await at(130)).toBe(-1);
  expect(() => overlongReward({ maxLength: 10, buffer: 20, maxPenalty: 1 })).toThrow(/buffer/);
  // as a weighted source beside a correctness reward
  const score = combineRewards<Meta>([{ name: 'correct', fn: (_p, c, m) => (c === m.answer ? 1 : 0) }, { name: 'overlong', fn }], { fallback: 0 });
  expect((await score(samples)).rewards).toEqual([1, -0.5, 0]);
});

describe('DAPO dynamic sampling', () => {
  test('dropUniformGroups keeps groups whose rewards differ', () => {
    const groups = [{ rewards: [1, 1, 1] }, { rewards: [1, 0, 1] }, { rewards: [0, 0, 0] }, { rewards: [0.5, 0.25, 0.5] }];
    expect(dropUniformGroups(groups)).toEqual({ kept: [groups[1], groups[3]], dropped: 2 });
  });

  test('samples rounds until the target is met, trims the surplus', async () => {
    const rounds = [
      [{ id: 'a', rewards: [1, 1] }, { id: 'b', rewards: [0, 1] }, { id: 'c', rewards: [0, 0] }],
      [{ id: 'd', rewards: [1, 0] }, { id: 'e', rewards: [1, 1] }, { id: 'f', rewards: [0, 1] }],
      [{ id: 'never', rewards: [0, 1] }],
    ];
    const calls: number[] = [];
    const r = await dynamicSampling(
      async (round) => {
        calls.push(round);
        return rounds[round];
      },
      { targetGroups: 2, maxRounds: 5 },
    );
    expect(r.groups.map((g) => g.id)).toEqual(['b', 'd']);
    expect(r).toMatchObject({ complete: true, rounds: 2, sampled: 6, dropped: 3, surplus: 1 });
    expect(calls).toEqual([0, 1]);
  });

  test('stops at maxRounds and reports the shortfall', async () => {
    const r = await dynamicSampling(() => [{ rewards: [1, 1] }, { rewards: [1, 0] }], { targetGroups: 5, maxRounds: 3 });
    expect(r).toMatchObject({ complete: false, rounds: 3, sampled: 6, dropped: 3, surplus: 0 });
    expect(r.groups).toHaveLength(3);
    await expect(dynamicSampling(() => [], { targetGroups: 0, maxRounds: 1 })).rejects.toThrow(/targetGroups must be a positive integer/);
  });
});
