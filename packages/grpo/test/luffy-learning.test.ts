/**
 * The LUFFY claim in miniature (Yan et al. 2025, "zero-RL fails where off-policy guidance
 * succeeds"): from a random initialisation, where a sample is almost never rewarded, on-policy GRPO
 * has nothing to learn from and stays near zero, while the same loop with one correct off-policy
 * trace per group (7 samples + 1 trace, advantages over the mixed group, the shaped term f(π)·A)
 * learns the task, held-out prompts included. SFT on the traces then on-policy RL, and RL with an
 * SFT loss on the traces, are run beside it.
 *
 * Task: a prompt "p i" — a content token p and an instruction i of two — must be answered with the
 * instruction's two-token answer then the stop token (vocabulary 64: chance about (1/64)³ per
 * sample). Training prompts have p = 2…41, held-out prompts p = 42…57, unseen in training; accuracy
 * is greedy.
 */
import { combineRewards, GrpoTrainer, type GrpoStepMetrics, type GrpoTrainerOptions, type RlPrompt } from '@lathe/grpo';
import { tinyModel } from './tiny-qwen3';

type Meta = { answer: string };
const V = 64;
const STOP = 63;
/** The two instructions and their answers. */
const INSTRUCTIONS: Record<number, [number, number]> = { 1: [60, 61], 58: [61, 59] };
const pairs = (ps: number[]) => ps.flatMap((p) => Object.keys(INSTRUCTIONS).map((i) => [p, Number(i)] as const));
const TRAIN = pairs(Array.from({ length: 40 }, (_, i) => i + 2));
const HELD_OUT = pairs(Array.from({ length: 16 }, (_, i) => i + 42));
const tokenizer = { decode: (ids: readonly number[]) => ids.join(' '), padId: 0 };
const exact = combineRewards<Meta & { completionTokens: number; stopped: boolean }>([{ name: 'correct', fn: (_p, c, m) => (c === m.answer ? 1 : 0) }], { fallback: 0 });
const answerOf = (i: number) => INSTRUCTIONS[i].join(' ');
const trace = (i: number) => ({ tokens: [...INSTRUCTIONS[i], STOP], stopped: true });

/** Prompts of step s: 8 of the training prompts, with (or without) their trace. */
function prompts(step: number, withTraces: boolean): RlPrompt<Meta>[] {
  return Array.from({ length: 8 }, (_, k) => {
    const at = (step * 8 + k) % TRAIN.length;
    const [p, i] = TRAIN[at];
    return { ids: [p, i], text: `${p} ${i}`, meta: { answer: answerOf(i) }, key: step * 8 + k, index: at, ...(withTraces ? { offPolicy: [trace(i)] } : {}) };
  });
}

function make(overrides: Partial<GrpoTrainerOptions<Meta>>): GrpoTrainer<Meta> {
  return GrpoTrainer.create<Meta>({
    model: tinyModel(V, { seed: 11 }).lm,
    tokenizer,
    stopIds: [STOP],
    rewards: exact,
    groupSize: 8,
    maxNewTokens: 3,
    // LUFFY's recipe: no std normalisation, sum over tokens / max length, entropy bonus, no KL
    estimator: 'dr_grpo',
    loss: { aggregation: 'token-sum-norm', policyTerm: 'unclipped', entropyCoef: 0.001 },
    ...overrides,
  });
}

async function greedyAccuracy(t: GrpoTrainer<Meta>, ps: readonly (readonly [number, number])[]): Promise<number> {
  const out = await t.generateGreedy(ps.map((ids) => ({ ids })));
  return out.filter((c, k) => c.stopped && c.text === answerOf(ps[k][1])).length / ps.length;
}

const LR = 0.02;
const STEPS = 40;

/** On-policy GRPO (zero-RL): G = 8 samples, no traces. */
async function zeroRl(): Promise<{ reward: number; heldOut: number }> {
  const t = make({});
  try {
    let reward = 0;
    for (let s = 0; s < STEPS; s++) reward += (await t.step(prompts(s, false), LR)).metrics.reward_mean / STEPS;
    return { reward, heldOut: await greedyAccuracy(t, HELD_OUT) };
  } finally {
    t.dispose();
  }
}

/** LUFFY: 7 samples + 1 correct trace per group. */
async function luffy(): Promise<{ onPolicy: number[]; last: GrpoStepMetrics; train: number; heldOut: number }> {
  const t = make({ offPolicy: { traces: 1 } });
  try {
    let last = {} as GrpoStepMetrics;
    const onPolicy: number[] = [];
    for (let s = 0; s < STEPS; s++) {
      last = (await t.step(prompts(s, true), LR)).metrics;
      onPolicy.push(last['on_policy/reward_mean']);
    }
    return { onPolicy, last, train: await greedyAccuracy(t, TRAIN), heldOut: await greedyAccuracy(t, HELD_OUT) };
  } finally {
    t.dispose();
  }
}

/** SFT on the traces (the 'sft' term on groups of traces alone), then on-policy RL on prompts without traces. */
async function sftThenRl(): Promise<{ afterSft: number; heldOut: number; last: GrpoStepMetrics }> {
  const t = make({ offPolicy: { traces: 1, term: 'sft' } });
  try {
    const half = STEPS / 2;
    for (let s = 0; s < half; s++) {
      const groups = prompts(s, true).map((prompt) => ({ prompt, completions: [0, 1].map(() => ({ ...prompt.offPolicy![0], offPolicy: true })), rewards: [1, 1] }));
      await t.stepOnRollouts(groups, LR);
    }
    const afterSft = await greedyAccuracy(t, HELD_OUT);
    let last = {} as GrpoStepMetrics;
    for (let s = half; s < STEPS; s++) last = (await t.step(prompts(s, false), LR)).metrics;
    return { afterSft, heldOut: await greedyAccuracy(t, HELD_OUT), last };
  } finally {
    t.dispose();
  }
}

/** RL with an SFT loss on the traces (the paper's third baseline): the samples' advantages among themselves, −log π on the trace. */
async function rlSftLoss(): Promise<{ onPolicy: number[]; heldOut: number }> {
  const t = make({ offPolicy: { traces: 1, term: 'sft', advantageStats: 'on-policy' } });
  try {
    const onPolicy: number[] = [];
    for (let s = 0; s < STEPS; s++) onPolicy.push((await t.step(prompts(s, true), LR)).metrics['on_policy/reward_mean']);
    return { onPolicy, heldOut: await greedyAccuracy(t, HELD_OUT) };
  } finally {
    t.dispose();
  }
}

test('from random init: on-policy GRPO stays near zero, LUFFY learns the task (held-out included), SFT-then-RL and RL + SFT loss beside it', async () => {
  const g = await zeroRl();
  console.log(`on-policy GRPO, ${STEPS} steps: mean reward ${g.reward.toFixed(3)}, held-out greedy accuracy ${g.heldOut.toFixed(2)}`);
  expect(g.reward).toBeLessThan(0.05);
  expect(g.heldOut).toBe(0);

  const l = await luffy();
  console.log(`LUFFY 7+1, ${STEPS} steps: on-policy reward ${l.onPolicy[0].toFixed(3)} → ${l.onPolicy.at(-1)!.toFixed(3)}, greedy accuracy train ${l.train.toFixed(2)}, held-out ${l.heldOut.toFixed(2)}; trace share ${l.last['off_policy/share']}, trace best in ${l.last['off_policy/best_fraction'].toFixed(2)} of groups, π on trace tokens ${l.last['off_policy/prob_mean'].toFixed(3)}`);
  expect(l.last['off_policy/share']).toBe(1 / 8);
  expect(l.last['off_policy/missing_groups']).toBe(0);
  expect(l.onPolicy.slice(-3).reduce((a, b) => a + b, 0) / 3).toBeGreaterThan(0.5);
  expect(l.train).toBeGreaterThanOrEqual(0.9);
  expect(l.heldOut).toBeGreaterThanOrEqual(0.5);

  const f = await sftThenRl();
  console.log(`SFT ${STEPS / 2} steps then RL ${STEPS / 2} steps: held-out greedy accuracy after SFT ${f.afterSft.toFixed(2)}, after RL ${f.heldOut.toFixed(2)}; last RL reward ${f.last.reward_mean.toFixed(3)}`);
  // groups without traces fall back to their 7 samples, and say so
  expect(f.last['off_policy/missing_groups']).toBe(8);
  expect(f.last['off_policy/share']).toBe(0);
  expect(f.heldOut).toBeGreaterThanOrEqual(0.5);

  const r = await rlSftLoss();
  console.log(`RL + SFT loss, ${STEPS} steps: on-policy reward ${r.onPolicy[0].toFixed(3)} → ${r.onPolicy.at(-1)!.toFixed(3)}, held-out greedy accuracy ${r.heldOut.toFixed(2)}`);
  expect(r.heldOut).toBeGreaterThanOrEqual(0.5);
}, 120_000);

test('bad traces are errors naming the prompt; behaviour log-probs set the old log-prob of a trace', async () => {
  const t = make({ offPolicy: { traces: 1 } });
  try {
    const [p] = prompts(0, false);
    await expect(t.step([{ ...p, offPolicy: [{ tokens: [60, 61, 62, STOP], stopped: true }] }], LR)).rejects.toThrow('prompt 0, off-policy trace 0 has 4 tokens, over maxNewTokens 3 (truncate or skip it first)');
    await expect(t.step([{ ...p, offPolicy: [{ tokens: [60, STOP], logprobs: [-1], stopped: true }] }], LR)).rejects.toThrow('prompt 0, off-policy trace 0 has 2 tokens but 1 log-probs');
    // a trace with its behaviour policy's log-probs: the step's p is π_θ/π_b, here far above 1
    const { metrics, rollouts } = await t.step([{ ...p, offPolicy: [{ tokens: [60, 61, STOP], logprobs: [-20, -20, -20], stopped: true, truncated: true }] }], 0);
    expect(metrics['off_policy/prob_mean']).toBeGreaterThan(1e6);
    expect(metrics['off_policy/truncated_traces']).toBe(1);
    expect(rollouts.map((r) => Boolean(r.offPolicy))).toEqual([false, false, false, false, false, false, false, true]);
  } finally {
    t.dispose();
  }
  expect(() => make({ offPolicy: { traces: 8 } })).toThrow('offPolicy.traces must be an integer in 1 … groupSize − 1 = 7');
  expect(() => make({ offPolicy: { traces: 1 }, estimator: 'remax' })).toThrow('offPolicy with a greedy baseline');
  const plain = make({});
  try {
    const [p] = prompts(0, false);
    await expect(plain.stepOnRollouts([{ prompt: p, completions: [{ tokens: [60], stopped: false, offPolicy: true }, { tokens: [61], stopped: false }], rewards: [1, 0] }], LR)).rejects.toThrow("completion 0 is off-policy, which needs the trainer's offPolicy options");
  } finally {
    plain.dispose();
  }
});

test('generateSamples with off-policy traces: G − n_off samples a prompt, each prompt its own', async () => {
  const t = make({ offPolicy: { traces: 1 } });
  try {
    const ps = [[1, 2], [3, 4], [5, 6]] as const;
    const groups = await t.generateSamples(ps.map((ids, k) => ({ ids, key: 100 + k })));
    expect(groups.map((g) => g.length)).toEqual([7, 7, 7]);
    // the same prompt alone under the same key gives the same samples: the groups are not shifted
    const alone = await t.generateSamples([{ ids: ps[2], key: 102 }]);
    expect(alone[0].map((c) => c.tokens)).toEqual(groups[2].map((c) => c.tokens));
  } finally {
    t.dispose();
  }
});
