/**
 * Classmate chain-of-thought rewards against hand-computed values: the CoT rule, the reward types
 * (vanilla, random truncation, the no-CoT baseline subtracted), the conditions on the main answer,
 * two weighted classmates averaging K samples each, the combined reward and its per-source weights,
 * the characters credited (classmate_partial), completions without a CoT, and failures (named, or
 * the fallback counted). Then a resident classmate with another tokenizer than the policy's — text
 * is exchanged, not ids — inside a GrpoTrainer step.
 */
import { CLASSMATE_SOURCE, classmateScorer, combineRewards, findCot, GrpoTrainer, residentClassmate, type ClassmateModel, type ClassmateTokenizer, type RlPrompt } from '@lathe/grpo';
import { Device } from '@lathe/runtime';
import { tinyModel } from './tiny-qwen3';

interface Meta {
  answer: string;
}

test('the CoT: inside the thinking block (opened in the prompt or the completion), or before a marker', () => {
  expect(findCot('<think>3+4=7</think>answer: 7')).toEqual({ start: 7, end: 12, cut: 20 });
  expect(findCot('3+4=7</think>answer: 7')).toEqual({ start: 0, end: 5, cut: 13 }); // the template opened it
  expect(findCot('answer: 7')).toBeUndefined();
  expect(findCot('<think> </think>answer: 7')).toBeUndefined(); // an empty CoT is none
  expect(findCot('<think>unfinished')).toBeUndefined();
  expect(findCot('3+4=7 Answer: 7', { marker: 'Answer:' })).toEqual({ start: 0, end: 6, cut: 6 });
  expect(findCot('[r]x=1[/r] 1', { open: '[r]', close: '[/r]' })).toEqual({ start: 3, end: 6, cut: 10 });
});

// the base reward: correct (the completion ends with the answer) + 0.5 × format (a thinking block)
const base = combineRewards<Meta>(
  [
    { name: 'correct', fn: (_p, c, m) => (c.trimEnd().endsWith(`answer: ${m.answer}`) ? 1 : 0) },
    { name: 'format', fn: (_p, c) => (c.includes('<think>') ? 1 : 0), weight: 0.5 },
  ],
  { fallback: 0 },
);

/** Reads the last "=d" it is shown and answers d; without one it guesses 7 and 0 in turn. */
function reader(name: string, weight: number, calls: string[][] = []): ClassmateModel {
  return {
    name,
    weight,
    async continueTexts(texts, k) {
      calls.push([...texts]);
      return texts.map((t) => {
        const m = /=(\d)[^=]*$/.exec(t);
        return Array.from({ length: k }, (_, j) => `answer: ${m ? m[1] : j % 2 === 0 ? '7' : '0'}`);
      });
    },
  };
}
/** Always answers 0. */
const wrong = (weight: number): ClassmateModel => ({ name: 'wrong', weight, continueTexts: async (texts, k) => texts.map(() => new Array<string>(k).fill('answer: 0')) });

const samples = [
  '<think>3+4=7</think>answer: 7', // correct, legible reasoning
  '<think>hmm</think>answer: 7', // correct, reasoning nobody can follow
  '<think>3+4=8</think>answer: 8', // incorrect
  'answer: 7', // no CoT
].map((completion) => ({ prompt: 'Q: 3+4? ', completion, meta: { answer: '7' } }));

describe('classmate rewards by hand', () => {
  // classmate grades (base reward of prefix + continuation): reader(3) s0 1.5, s1 (1.5+0.5)/2 = 1, s2 0.5; wrong(1) 0.5 each
  const classmate = [(3 * 1.5 + 0.5) / 4, (3 * 1 + 0.5) / 4, (3 * 0.5 + 0.5) / 4, 0];
  const baseRewards = [1.5, 1.5, 0.5, 1];

  test('vanilla_reward, always: weighted mean over classmates of their K-sample means; (1 − λ)·base + λ·classmate', async () => {
    const calls: string[][] = [];
    const score = classmateScorer(base, { classmates: [reader('reader', 3, calls), wrong(1)], samples: 2, weight: 0.5 });
    const out = await score(samples);
    expect(out.bySource[CLASSMATE_SOURCE]).toEqual(classmate);
    expect(out.rewards).toEqual(baseRewards.map((b, i) => 0.5 * b + 0.5 * classmate[i]));
    expect(out.weights).toEqual({ correct: 0.5, format: 0.25, classmate: 0.5, classmate_no_cot: 0, classmate_accuracy: 0 });
    // the weights reproduce the reward from the sources
    out.rewards.forEach((r, i) => expect(Object.entries(out.weights!).reduce((a, [k, w]) => a + w * out.bySource[k][i], 0)).toBeCloseTo(r, 12));
    // the classmate read the prompt and the completion up to the end of its thinking block; the no-CoT one was not shown
    expect(calls[0]).toEqual(['Q: 3+4? <think>3+4=7</think>', 'Q: 3+4? <think>hmm</think>', 'Q: 3+4? <think>3+4=8</think>']);
    expect(out.classmateChars).toEqual([20, 18, 20, 0]);
    expect(out.bySource.classmate_no_cot).toEqual([0, 0, 0, 1]);
    expect(out.stats.classmate_no_cot.mean).toBe(0.25);
    expect(score.lastCounts()).toEqual({ noCot: 1, skipped: 0, fallbacks: 0 });
  });

  test("a classmate's own formatText (its chat template) decides what it reads; the others read the scorer's", async () => {
    const own: string[][] = [];
    const shared: string[][] = [];
    const templated = { ...reader('templated', 3, own), formatText: (p: string, prefix: string) => `<user>${p}</user><assistant>${prefix}` };
    const score = classmateScorer(base, { classmates: [templated, reader('plain', 3, shared)], samples: 1, formatText: (p, prefix) => `[${p}]${prefix}` });
    await score(samples.slice(0, 1));
    expect(own).toEqual([['<user>Q: 3+4? </user><assistant><think>3+4=7</think>']]);
    expect(shared).toEqual([['[Q: 3+4? ]<think>3+4=7</think>']]);
  });

  test('conditions on an incorrect main answer: no classmate (not even asked), or its reward negated', async () => {
    const calls: string[][] = [];
    const none = await classmateScorer(base, { classmates: [reader('reader', 3, calls), wrong(1)], samples: 2, condition: 'no_classmate_when_main_incorrect' })(samples);
    expect(none.bySource.classmate).toEqual([classmate[0], classmate[1], 0, 0]);
    expect(calls[0]).toHaveLength(2);
    const neg = await classmateScorer(base, { classmates: [reader('reader', 3), wrong(1)], samples: 2, condition: 'neg_classmate_when_main_incorrect' })(samples);
    expect(neg.bySource.classmate).toEqual([classmate[0], classmate[1], -classmate[2], 0]);
  });

  test('remove_wo_cot: the success without the CoT is subtracted', async () => {
    // without a CoT the reader guesses 7, 0 → grades 1, 0 → 0.5; wrong → 0: (3·0.5 + 0)/4 = 0.375
    const out = await classmateScorer(base, { classmates: [reader('reader', 3), wrong(1)], samples: 2, rewardType: 'remove_wo_cot' })(samples);
    expect(out.bySource.classmate).toEqual([classmate[0] - 0.375, classmate[1] - 0.375, classmate[2] - 0.375, 0]);
    expect(out.bySource.classmate_accuracy).toEqual(classmate);
  });

  test("random_truncate: the classmate reads the CoT cut at a seeded uniform point; 'all' credits every token", async () => {
    const calls: string[][] = [];
    const score = classmateScorer(base, { classmates: [reader('reader', 1, calls)], samples: 1, rewardType: 'random_truncate', seed: 5 });
    const cuts: number[][] = [];
    for (let i = 0; i < 20; i++) cuts.push((await score(samples)).classmateChars!.map((c) => c ?? -1));
    for (const c of cuts) {
      expect(c[0]).toBeGreaterThanOrEqual(7);
      expect(c[0]).toBeLessThanOrEqual(12);
      expect(c[1]).toBeGreaterThanOrEqual(7);
      expect(c[1]).toBeLessThanOrEqual(10);
    }
    expect(new Set(cuts.map((c) => c[0])).size).toBeGreaterThan(3); // the cuts spread over the CoT
    calls.forEach((texts, i) => expect(texts[0]).toBe(`Q: 3+4? ${samples[0].completion.slice(0, cuts[i][0])}`));
    // the same seed gives the same cuts
    const again = classmateScorer(base, { classmates: [reader('reader', 1)], samples: 1, rewardType: 'random_truncate', seed: 5 });
    expect((await again(samples)).classmateChars).toEqual(cuts[0]);
    const all = await classmateScorer(base, { classmates: [reader('reader', 1)], tokenMode: 'all' })(samples);
    expect(all.classmateChars).toBeUndefined();
  });

  test('a failing classmate fails the step naming it — or gives the configured fallback, counted, never a silent 0', async () => {
    const down: ClassmateModel = { name: 'remote', where: 'http://127.0.0.1:9/v1', continueTexts: async () => Promise.reject(new Error('connection refused')) };
    await expect(classmateScorer(base, { classmates: [down] })(samples)).rejects.toThrow("classmate 'remote' (http://127.0.0.1:9/v1) failed: connection refused");
    const warn = jest.spyOn(console, 'warn').mockImplementation(() => undefined);
    const score = classmateScorer(base, { classmates: [down], fallbackReward: -0.25 });
    const out = await score(samples);
    warn.mockRestore();
    expect(out.bySource.classmate).toEqual([-0.25, -0.25, -0.25, 0]);
    expect(out.stats.classmate.failures).toBe(3);
    expect(out.failures.filter((f) => f.source === 'classmate').map((f) => f.index)).toEqual([0, 1, 2]);
    expect(score.lastCounts()).toEqual({ noCot: 1, skipped: 0, fallbacks: 3 });
  });

  test('bad options are refused by name', () => {
    expect(() => classmateScorer(base, { classmates: [] })).toThrow(/at least one classmate/);
    expect(() => classmateScorer(base, { classmates: [wrong(1)], weight: 1.5 })).toThrow(/weight must be in \[0, 1\]/);
    expect(() => classmateScorer(base, { classmates: [wrong(1)], rewardType: 'x' as never })).toThrow(/rewardType must be one of vanilla_reward/);
    expect(() => classmateScorer(base, { classmates: [wrong(1), wrong(2)] })).toThrow(/two classmates are named 'wrong'/);
  });
});

describe('a resident classmate with its own tokenizer (text exchanged, not ids)', () => {
  // the policy's tokens: id i is the letter 'a' + i; its reasoning is the text before the first 'c'
  const POLICY_V = 8;
  const policyTokenizer = { decode: (ids: readonly number[]) => ids.map((i) => String.fromCharCode(97 + i)).join(''), padId: 0 };
  // the classmate's: one id per character of its alphabet (unknown characters → id 0), 20 ids
  const ALPHABET = '?abcdefgh</>think:= ';
  const charTokenizer: ClassmateTokenizer = { encode: (t) => [...t].map((ch) => Math.max(0, ALPHABET.indexOf(ch))), decode: (ids) => ids.map((i) => ALPHABET[i] ?? '?').join(''), padId: 0 };

  test('continuations are the classmate tokenizer’s text, K per text, seeded', async () => {
    const device = Device.cpu();
    const cm = residentClassmate({ name: 'small', device, model: tinyModel(ALPHABET.length, { seed: 11, std: 0.5 }).lm, tokenizer: charTokenizer, maxNewTokens: 3, stopIds: [] });
    const texts = ['Q: a</think>', 'Q: bcd'];
    const a = await cm.continueTexts(texts, 2, 7);
    expect(a).toHaveLength(2);
    a.forEach((row) => {
      expect(row).toHaveLength(2);
      row.forEach((s) => expect([...s].every((ch) => ALPHABET.includes(ch))).toBe(true));
    });
    expect(await cm.continueTexts(texts, 2, 7)).toEqual(a);
    cm.dispose();
  });

  test('a GrpoTrainer step with a resident classmate of another vocabulary, estimator grpo_main_classmate_separated, truncated IS', async () => {
    const device = Device.cpu();
    const cm = residentClassmate({ name: 'small', device, model: tinyModel(ALPHABET.length, { seed: 11 }).lm, tokenizer: charTokenizer, maxNewTokens: 2, stopIds: [] });
    const correct = combineRewards<Meta & { completionTokens: number; stopped: boolean }>([{ name: 'correct', fn: (_p, c, m) => (c.endsWith(m.answer) ? 1 : 0) }], { fallback: 0 });
    const rewards = classmateScorer(correct, { classmates: [cm], samples: 2, weight: 0.5, cot: { marker: 'c' } });
    const t = GrpoTrainer.create<Meta>({
      model: tinyModel(POLICY_V, { seed: 3, std: 0.8 }).lm,
      tokenizer: policyTokenizer,
      stopIds: [],
      rewards,
      groupSize: 4,
      maxNewTokens: 4,
      estimator: 'grpo_main_classmate_separated',
      loss: { rolloutIsThreshold: 4 },
    });
    const prompts: RlPrompt<Meta>[] = [0, 2, 3].map((p) => ({ ids: [p], text: `Q${p}: `, meta: { answer: 'h' }, key: p, index: p }));
    const { metrics, rollouts } = await t.step(prompts, 0.01);
    const texts = rollouts.map((r) => r.completion);
    const withCot = texts.filter((s) => findCot(s, { marker: 'c' }) !== undefined).length;
    expect(withCot).toBeGreaterThan(0); // the random policy wrote some reasoning before the marker…
    expect(withCot).toBeLessThan(texts.length); // …and some completions without any
    expect(metrics['reward/classmate_no_cot/mean']).toBeCloseTo((texts.length - withCot) / texts.length, 12);
    expect(Number.isFinite(metrics['reward/classmate/mean'])).toBe(true);
    expect(metrics.rollout_is_clip_fraction).toBe(0); // re-scored old log-probs match generation's
    expect(metrics.rollout_is_weight_mean).toBeCloseTo(1, 4);
    expect(Number.isFinite(metrics.loss)).toBe(true);
    t.dispose();
    cm.dispose();
  });

  test('self-play: the policy continues its own CoT with its tokenizer, at the weights that sampled the step', async () => {
    const letters = (t: string) => [...t].map((ch) => ch.charCodeAt(0) - 97).filter((i) => i >= 0 && i < POLICY_V);
    const ref: { trainer?: GrpoTrainer<Meta> } = {};
    const self = GrpoTrainer.selfPlayClassmate(() => ref.trainer!, { tokenizer: { ...policyTokenizer, encode: letters }, maxNewTokens: 2 });
    const seen: string[][][] = [];
    const spy: typeof self = { ...self, continueTexts: async (texts, k, seed) => { const out = await self.continueTexts(texts, k, seed); seen.push(out); return out; } };
    const correct = combineRewards<Meta & { completionTokens: number; stopped: boolean }>([{ name: 'correct', fn: (_p, c, m) => (c.endsWith(m.answer) ? 1 : 0) }], { fallback: 0 });
    const trainer = (ref.trainer = GrpoTrainer.create<Meta>({ model: tinyModel(POLICY_V, { seed: 3, std: 0.8 }).lm, tokenizer: policyTokenizer, stopIds: [], rewards: classmateScorer(correct, { classmates: [spy], samples: 3, cot: { marker: 'c' } }), groupSize: 4, maxNewTokens: 4 }));
    const prompts: RlPrompt<Meta>[] = [0, 2].map((p) => ({ ids: [p], text: String.fromCharCode(97 + p), meta: { answer: 'h' }, key: p, index: p }));
    const { metrics } = await trainer.step(prompts, 0.01);
    expect(seen).toHaveLength(1);
    seen[0].forEach((row) => {
      expect(row).toHaveLength(3);
      row.forEach((t) => expect(t).toMatch(/^[a-h]{2}$/)); // two new tokens of the policy's vocabulary, as text
    });
    expect(Number.isFinite(metrics['reward/classmate_accuracy/mean'])).toBe(true);
    // the same texts and seed give the same continuations while the weights stay
    const texts = ['a', 'cd'];
    expect(await self.continueTexts(texts, 2, 5)).toEqual(await self.continueTexts(texts, 2, 5));
    trainer.dispose();
  });
});
