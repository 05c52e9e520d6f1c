/**
 * The multi-reward estimators against hand-computed values: GDPO (per-component group
 * normalisation, weighted sum, token-weighted batch whitening) and grpo_main_classmate_separated
 * (main and classmate GRPO advantages on their own token ranges), and GDPO's reason to exist: the
 * distinct advantage values per group where GRPO's normalised sum collapses them.
 */
import { builtinEstimator, classmateTokenMask, distinctAdvantagesPerGroup, gdpoAdvantages, grpoAdvantages, mainClassmateSeparatedAdvantages, type AdvantageBatch } from '@lathe/grpo';

const close = (actual: readonly number[], expected: readonly number[], digits = 9) => {
  expect(actual).toHaveLength(expected.length);
  actual.forEach((a, i) => expect(a).toBeCloseTo(expected[i], digits));
};

describe('GDPO', () => {
  // one group of 4: correctness [1, 1, 0, 0], format [0, 1, 1, 1]
  const components = { correct: [1, 1, 0, 0], format: [0, 1, 1, 1] };

  test('each component normalised in its group (unbiased std + 1e-6), summed, then whitened over tokens (unbiased, + 1e-8)', () => {
    // correct: mean 0.5, std √(1/3); format: mean 0.75, std √(0.75/3) = 0.5
    const s1 = Math.sqrt(1 / 3) + 1e-6;
    const s2 = 0.5 + 1e-6;
    const summed = [0.5 / s1 - 0.75 / s2, 0.5 / s1 + 0.25 / s2, -0.5 / s1 + 0.25 / s2, -0.5 / s1 + 0.25 / s2];
    close(summed, [-0.633973096, 1.366022904, -0.366024904, -0.366024904]);
    // whitening weighted by the response lengths [2, 1, 1, 3] (7 tokens, 6 degrees of freedom)
    const out = gdpoAdvantages({ components, groupSize: 4, lengths: [2, 1, 1, 3] });
    close(out.advantages, [-0.62698255028, 2.23055057014, -0.244146367393, -0.244146367393]);
    close(out.componentAdvantages.correct, [0.5 / s1, 0.5 / s1, -0.5 / s1, -0.5 / s1]);
    expect(out.stats).toEqual({ groups: 1, uniformGroups: 0, zeroAdvantages: 0 });
    // without whitening the sum itself
    close(gdpoAdvantages({ components, groupSize: 4 }, { whiten: 'none' }).advantages, summed);
  });

  test('weights scale each normalised component; weight 0 leaves a logged source out', () => {
    const s1 = Math.sqrt(1 / 3) + 1e-6;
    const s2 = 0.5 + 1e-6;
    const a = gdpoAdvantages({ components, weights: { format: 0.5 }, groupSize: 4 }, { whiten: 'none' });
    close(a.advantages, [0.5 / s1 - 0.375 / s2, 0.5 / s1 + 0.125 / s2, -0.5 / s1 + 0.125 / s2, -0.5 / s1 + 0.125 / s2]);
    const b = gdpoAdvantages({ components, weights: { format: 0 }, groupSize: 4 }, { whiten: 'none' });
    close(b.advantages, [0.5 / s1, 0.5 / s1, -0.5 / s1, -0.5 / s1]);
    expect(() => gdpoAdvantages({ components, weights: { format: 0, correct: 0 }, groupSize: 4 })).toThrow(/every reward component has weight 0/);
  });

  test('a group uniform in every component is counted; sequence whitening counts each completion once', () => {
    // group 1 is uniform in both components; in group 2 the two components cancel (±0.5/(√0.5 + ε) each)
    const out = gdpoAdvantages({ components: { correct: [1, 1, 1, 0], format: [1, 1, 0, 1] }, groupSize: 2 }, { whiten: 'sequence' });
    expect(out.stats.uniformGroups).toBe(1);
    expect(out.advantages).toEqual([0, 0, 0, 0]);
    // sequence whitening of the first example's sums: 4 completions, 3 degrees of freedom
    const S = [-0.633973096219, 1.366022903789, -0.366024903785, -0.366024903785];
    const mu = S.reduce((a, b) => a + b, 0) / 4;
    const sd = Math.sqrt(S.reduce((a, x) => a + (x - mu) ** 2, 0) / 3 + 1e-8);
    close(gdpoAdvantages({ components, groupSize: 4 }, { whiten: 'sequence' }).advantages, S.map((x) => (x - mu) / sd), 8);
  });

  test('bad input names the problem', () => {
    expect(() => gdpoAdvantages({ components: {}, groupSize: 2 })).toThrow(/no reward components/);
    expect(() => gdpoAdvantages({ components: { a: [1, 0], b: [1] }, groupSize: 2 })).toThrow(/component 'b' has 1 values, 'a' has 2/);
    expect(() => gdpoAdvantages({ components: { a: [1, 0] }, groupSize: 2 })).toThrow(/whiten 'token' needs the response lengths/);
    const est = builtinEstimator('gdpo').estimate;
    expect(() => est({ rewards: [1, 0], groupSize: 2, lengths: [1, 1], logp: [[0], [0]] })).toThrow(/estimator 'gdpo': the batch has no per-source rewards/);
  });
});

describe('advantage collapse: distinct advantage values per group', () => {
  // G = 4, correctness and format both binary and weight 1: completion 0 is correct but unformatted,
  // completion 2 wrong but formatted — the same sum (1), so GRPO cannot tell them apart
  const correct = [1, 1, 0, 0];
  const format = [0, 1, 1, 1];
  const sum = correct.map((c, i) => c + format[i]);

  test('GRPO on the sum: 2 values; GDPO: 3 (the two sum-1 completions are told apart)', () => {
    const grpo = grpoAdvantages({ rewards: sum, groupSize: 4 }).advantages;
    const gdpo = gdpoAdvantages({ components: { correct, format }, groupSize: 4, lengths: [1, 1, 1, 1] }).advantages;
    expect(distinctAdvantagesPerGroup(grpo, 4)).toEqual([2]);
    expect(distinctAdvantagesPerGroup(gdpo, 4)).toEqual([3]);
    expect(grpo[0]).toBe(grpo[2]);
    expect(gdpo[0]).not.toBeCloseTo(gdpo[2], 3);
  });

  test('a group whose sums are all equal is uniform to GRPO (1 value) but not to GDPO', () => {
    // sums all 1: (1,0) (0,1) (0,1) (0,1)
    const c = [1, 0, 0, 0];
    const f = [0, 1, 1, 1];
    const grpo = grpoAdvantages({ rewards: c.map((x, i) => x + f[i]), groupSize: 4 });
    expect(grpo.stats.uniformGroups).toBe(1);
    expect(distinctAdvantagesPerGroup(grpo.advantages, 4)).toEqual([1]);
    // GDPO with format weighted 0.5: correct ±(0.75, −0.25)/0.5, format ∓… /0.5 halved
    const gdpo = gdpoAdvantages({ components: { correct: c, format: f }, weights: { format: 0.5 }, groupSize: 4 }, { whiten: 'none' });
    const s = 0.5 + 1e-6;
    close(gdpo.advantages, [0.75 / s - 0.375 / s, -0.25 / s + 0.125 / s, -0.25 / s + 0.125 / s, -0.25 / s + 0.125 / s]);
    expect(distinctAdvantagesPerGroup(gdpo.advantages, 4)).toEqual([2]);
  });
});

describe('grpo_main_classmate_separated', () => {
  // G = 3; main = correct + 0.5·format = [1.5, 0.5, 0]; classmate weight 0.5: [0.5, 0.25, 0]
  const components = { correct: [1, 0, 0], format: [1, 1, 0], classmate: [1, 0.5, 0] };
  const weights = { format: 0.5, classmate: 0.5 };
  const lengths = [3, 2, 3];
  // main: mean 2/3, deviations 5/6, −1/6, −2/3, unbiased var 7/12; classmate: mean 0.25, std 0.25
  const sm = Math.sqrt(7 / 12) + 1e-6;
  const main = [5 / 6 / sm, -1 / 6 / sm, -2 / 3 / sm];
  const cm = [0.25 / 0.250001, 0, -0.25 / 0.250001];

  test('hand values: the main advantage on every token, the classmate one on the masked tokens', () => {
    close(main, [1.09108802261, -0.218217604522, -0.872870418088]);
    const out = mainClassmateSeparatedAdvantages({ components, weights, groupSize: 3, lengths, classmateMask: [[1, 1, 0], [1, 0], [0, 0, 0]] });
    close(out.main, main);
    close(out.classmate, cm);
    close(out.advantages[0], [main[0] + cm[0], main[0] + cm[0], main[0]]);
    close(out.advantages[1], [main[1], main[1]]);
    close(out.advantages[2], [main[2], main[2], main[2]]);
    expect(out.kind).toBe('token');
  });

  test("without a mask ('all') every token gets both", () => {
    const est = builtinEstimator('grpo_main_classmate_separated').estimate;
    const batch: AdvantageBatch = { rewards: [0, 0, 0], groupSize: 3, lengths, logp: [[], [], []], components, componentWeights: weights };
    const out = est(batch);
    expect(out.kind).toBe('token');
    if (out.kind === 'token') out.advantages.forEach((row, i) => close(row, new Array<number>(lengths[i]).fill(main[i] + cm[i])));
  });

  test('no classmate source, or a mask of the wrong length, is refused by name', () => {
    expect(() => mainClassmateSeparatedAdvantages({ components: { correct: [1, 0] }, groupSize: 2, lengths: [1, 1] })).toThrow(/no 'classmate' reward component/);
    expect(() => mainClassmateSeparatedAdvantages({ components, weights, groupSize: 3, lengths, classmateMask: [[1], [1, 0], [0, 0, 0]] })).toThrow(/classmateMask\[0\] has 1 entries for a response of 3 tokens/);
  });
});

describe('classmate token mask (characters the classmate read → policy tokens)', () => {
  // a toy tokenizer: token id k decodes to the string of k letters 'x'
  const decode = (ids: number[]) => ids.map((k) => 'x'.repeat(k)).join('');

  test('tokens up to the one that reaches the character count are credited', () => {
    expect(classmateTokenMask([2, 3, 1, 4], 5, decode)).toEqual([1, 1, 0, 0]); // 2 + 3 = 5 characters
    expect(classmateTokenMask([2, 3, 1, 4], 6, decode)).toEqual([1, 1, 1, 0]);
    expect(classmateTokenMask([2, 3, 1, 4], 4, decode)).toEqual([1, 1, 0, 0]); // the straddling token is credited
    expect(classmateTokenMask([2, 3], 0, decode)).toEqual([0, 0]);
    expect(classmateTokenMask([2, 3], undefined, decode)).toEqual([1, 1]);
    expect(classmateTokenMask([2, 3], 99, decode)).toEqual([1, 1]);
    expect(() => classmateTokenMask([2], -1, decode)).toThrow(/chars must be an integer ≥ 0/);
  });
});
