/**
 * RoPE inverse frequencies and attention scale for each rope-scaling variant, against values
 * derived here from the published definitions (transformers' `_compute_linear_scaling_rope_parameters`
 * and `_compute_yarn_parameters`; YaRN, arXiv 2309.00071): bounds worked out by hand in comments.
 */
import { parseConfig, ropeInverseFrequencies, ModelConfigError, type HfConfig } from '@lathe/models';
import { tinyQwen3 } from './tiny';

// head_dim 16 → 8 frequency pairs; base 10000: pair i turns at 10000^(−2i/16) = 10^(−i/2) rad/token.
const base: HfConfig = { ...tinyQwen3, head_dim: 16, hidden_size: 64, rope_theta: 10000, max_position_embeddings: 16384 };
const plain = Array.from({ length: 8 }, (_, i) => 10 ** (-i / 2));
const withScaling = (rope_scaling: HfConfig) => ropeInverseFrequencies(parseConfig({ ...base, rope_scaling }));

function expectAllClose(actual: number[], expected: number[]): void {
  expect(actual).toHaveLength(expected.length);
  actual.forEach((v, i) => expect(v).toBeCloseTo(expected[i], 12));
}

test('default RoPE: 10^(−i/2) for head_dim 16 and base 10000, no attention scale', () => {
  const { inverse, attentionScale } = ropeInverseFrequencies(parseConfig(base));
  expectAllClose(inverse, plain);
  expect(attentionScale).toBe(1);
});

test('linear scaling divides every frequency by the factor (positions slowed by it)', () => {
  const { inverse, attentionScale } = withScaling({ rope_type: 'linear', factor: 4 });
  expectAllClose(inverse, plain.map((f) => f / 4));
  expect(attentionScale).toBe(1);
});

describe('YaRN', () => {
  // Over the original context L = 4096, pair i turns L·f_i/(2π) times:
  //   i:          0     1      2     3     4     5     6      7
  //   rotations:  652   206    65.2  20.6  6.52  2.06  0.652  0.206
  // Pairs turning more than beta_fast = 32 times keep f_i; fewer than beta_slow = 1 become f_i/factor.
  // The bounds are where rotations = beta: i* = 16·ln(L / (2π·beta)) / (2·ln 10000), giving
  // 2.618 for beta 32 and 5.628 for beta 1; truncated: floor → 2 and ceil → 6. Between them the
  // ramp is linear in i: f_i·(1 − r) + (f_i/factor)·r with r = (i − low)/(high − low).
  const blend = (low: number, high: number, factor: number) =>
    plain.map((f, i) => {
      const r = Math.min(1, Math.max(0, (i - low) / (high - low)));
      return f * (1 - r) + (f / factor) * r;
    });
  const yarn = { rope_type: 'yarn', factor: 4, original_max_position_embeddings: 4096 };

  test('the rotation counts in the table above bracket the hand-derived bounds', () => {
    const rotations = plain.map((f) => (4096 * f) / (2 * Math.PI));
    expect(rotations[2]).toBeGreaterThan(32);
    expect(rotations[3]).toBeLessThan(32);
    expect(rotations[5]).toBeGreaterThan(1);
    expect(rotations[6]).toBeLessThan(1);
  });

  test('frequencies: kept below pair 2, divided by the factor from pair 6, ramped between', () => {
    const { inverse } = withScaling(yarn);
    const expected = blend(2, 6, 4);
    expectAllClose(inverse, expected);
    // Spelled out: pairs 0–2 untouched, pair 4 halfway, pairs 6–7 divided by 4.
    expect(inverse[2]).toBeCloseTo(plain[2], 15);
    expect(inverse[4]).toBeCloseTo(plain[4] * (0.5 + 0.5 / 4), 15);
    expect(inverse[7]).toBeCloseTo(plain[7] / 4, 15);
  });

  test('attention scale 0.1·ln(factor) + 1 by default, or as given', () => {
    expect(withScaling(yarn).attentionScale).toBeCloseTo(1.1386294361119891, 14); // 0.1·ln 4 + 1
    expect(withScaling({ ...yarn, attention_factor: 0.75 }).attentionScale).toBe(0.75);
    expect(withScaling({ ...yarn, factor: 1 }).attentionScale).toBe(1); // no stretch, no scale
    // DeepSeek's mscale / mscale_all_dim: (0.1·1·ln 4 + 1) / (0.1·0.5·ln 4 + 1).
    expect(withScaling({ ...yarn, mscale: 1, mscale_all_dim: 0.5 }).attentionScale).toBeCloseTo((0.1 * Math.log(4) + 1) / (0.05 * Math.log(4) + 1), 14);
  });

  test('truncate: false keeps the real-valued bounds 2.618… and 5.628…', () => {
    const bound = (beta: number) => (16 * Math.log(4096 / (2 * Math.PI * beta))) / (2 * Math.log(10000));
    expect(bound(32)).toBeCloseTo(2.61806, 5);
    expect(bound(1)).toBeCloseTo(5.62836, 5);
    expectAllClose(withScaling({ ...yarn, truncate: false }).inverse, blend(bound(32), bound(1), 4));
  });

  test('beta_fast / beta_slow move the band: 128 and 4 give pairs 1 to 5', () => {
    // beta 128: 16·ln(4096/(2π·128))/(2·ln 10⁴) = 1.414 → floor 1; beta 4: 4.424 → ceil 5.
    expectAllClose(withScaling({ ...yarn, beta_fast: 128, beta_slow: 4 }).inverse, blend(1, 5, 4));
  });

  test('original_max_position_embeddings defaults to max_position_embeddings', () => {
    const { original_max_position_embeddings: _o, ...noOriginal } = yarn;
    // L = 16384: beta 32 → 16·ln(81.5)/18.42 = 3.822 → 3; beta 1 → 16·ln(2607.6)/18.42 = 6.832 → 7.
    expectAllClose(withScaling(noOriginal).inverse, blend(3, 7, 4));
  });
});

test("dynamic NTK scaling is refused naming the field (its frequencies follow each batch's length)", () => {
  expect(() => parseConfig({ ...base, rope_scaling: { rope_type: 'dynamic', factor: 2 } }, 'm/config.json')).toThrow(ModelConfigError);
  expect(() => parseConfig({ ...base, rope_scaling: { type: 'dynamic', factor: 2 } }, 'm/config.json')).toThrow(
    "m/config.json: rope_scaling rope_type 'dynamic' (dynamic NTK) is not supported",
  );
  expect(() => parseConfig({ ...base, rope_scaling: { rope_type: 'longrope', factor: 2 } })).toThrow("rope_type 'longrope' is not supported");
});
