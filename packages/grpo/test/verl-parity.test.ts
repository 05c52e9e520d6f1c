/**
 * Where Lathe's docs compare an estimator or loss with verl's (volcengine/verl,
 * verl/trainer/ppo/core_algos.py): verl's formula written out here by hand in float64, beside
 * Lathe's result — equal where the docs say they agree, and differing exactly as documented where
 * they do not.
 */
import * as L from '@lathe/onnx';
import { AdaptiveKlController, aggregateLoss, gaeAdvantages, lossNormaliser, meanCompletionKl, policyLoss, reinforcePlusPlusAdvantages } from '@lathe/grpo';
import { compile, rng, type HostTensor } from '../../../tools/testing/ort-cpu';

const f64 = (rows: number[][]): HostTensor => ({ data: Float64Array.from(rows.flat()), dims: [rows.length, rows[0].length] });
const scalar = (v: number): HostTensor => ({ data: Float64Array.from([v]), dims: [] });
const mean = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / xs.length;

/** verl's `masked_whiten`: (x − mean) · rsqrt(unbiased var + 1e-8) over the masked values. */
function verlWhiten(rows: number[][]): number[][] {
  const flat = rows.flat();
  const mu = mean(flat);
  const variance = flat.reduce((a, x) => a + (x - mu) ** 2, 0) / (flat.length - 1);
  return rows.map((r) => r.map((x) => (x - mu) / Math.sqrt(variance + 1e-8)));
}

test("token-sum-norm is verl's seq-mean-token-sum-norm divided by the sequences; lossScaleFactor reproduces verl's", async () => {
  const r = rng(3);
  const mask = [
    [1, 1, 1, 0],
    [0, 1, 1, 1],
    [1, 0, 0, 0],
  ];
  const perToken = mask.map((row) => row.map(() => r() * 2 - 1));
  const maxLength = 4;
  // verl: loss = Σ_b Σ_t loss·mask / loss_scale_factor
  const verl = perToken.flat().reduce((a, x, i) => a + x * mask.flat()[i], 0) / maxLength;
  const g = new L.Graph();
  const x = g.input('x', 'float64', [3, 4]);
  const m = g.input('m', 'float64', [3, 4]);
  g.output(aggregateLoss(x, m, 'token-sum-norm', g.input('n', 'float64', [])), 'loss');
  const run = await compile(g);
  const lengths = mask.map((row) => row.reduce((a, b) => a + b, 0));
  const at = async (n: number) => Number((await run({ x: f64(perToken), m: f64(mask), n: scalar(n) })).loss.data[0]);
  expect(await at(lossNormaliser('token-sum-norm', lengths, { maxLength }))).toBeCloseTo(verl / 3, 12);
  expect(await at(lossNormaliser('token-sum-norm', lengths, { maxLength, lossScaleFactor: maxLength }))).toBeCloseTo(verl, 12);
  expect(() => lossNormaliser('token-mean', lengths, { lossScaleFactor: 4 })).toThrow(/applies to 'token-sum-norm' only/);
});

describe("REINFORCE++-baseline against verl's reinforce_plus_plus_baseline", () => {
  const rewards = [1, 0, 0, 1, 1, 1];
  const lengths = [3, 2, 4, 1, 2, 3];

  /** verl: scores = Σ token rewards; centred on the group mean; tiled over the tokens; masked_whiten. */
  function verl(tokenRewards: number[][]): number[][] {
    const totals = tokenRewards.map((row) => row.reduce((a, b) => a + b, 0));
    const centred = totals.map((s, i) => s - mean(totals.slice(Math.floor(i / 3) * 3, Math.floor(i / 3) * 3 + 3)));
    return verlWhiten(centred.map((c, i) => new Array<number>(lengths[i]).fill(c)));
  }

  test('without per-token shaping the two agree (with the unbiased variance verl uses)', () => {
    const outcomeOnly = rewards.map((x, i) => [...new Array<number>(lengths[i] - 1).fill(0), x]);
    const lathe = reinforcePlusPlusAdvantages({ rewards, groupSize: 3, lengths }, { baseline: 'group', unbiasedVariance: true });
    const expected = verl(outcomeOnly);
    lathe.advantages.forEach((row, i) => row.forEach((a, t) => expect(a).toBeCloseTo(expected[i][t], 10)));
  });

  test('with a KL penalty per token they differ, as documented: verl spreads one centred total, Lathe forms returns', () => {
    const r = rng(5);
    const kl = lengths.map((n) => Array.from({ length: n }, () => -0.05 * r()));
    const withKl = kl.map((row, i) => row.map((x, t) => (t === row.length - 1 ? x + rewards[i] : x)));
    const lathe = reinforcePlusPlusAdvantages({ rewards, groupSize: 3, lengths, tokenRewards: kl }, { baseline: 'group', unbiasedVariance: true });
    const expected = verl(withKl);
    // verl's advantage is constant along each response; Lathe's per-token returns are not
    expect(expected.every((row) => row.every((a) => a === row[0]))).toBe(true);
    expect(lathe.advantages.some((row) => row.some((a) => a !== row[0]))).toBe(true);
    // Lathe's by hand: outcome centred on its group, returns of outcome + KL, whitened (unbiased)
    const centred = rewards.map((x, i) => x - mean(rewards.slice(Math.floor(i / 3) * 3, Math.floor(i / 3) * 3 + 3)));
    const returns = kl.map((row, i) => row.map((_, t) => row.slice(t).reduce((a, b) => a + b, 0) + centred[i]));
    const byHand = verlWhiten(returns);
    lathe.advantages.forEach((row, i) => row.forEach((a, t) => expect(a).toBeCloseTo(byHand[i][t], 10)));
  });
});

test("GAE with verl's λ = 1 equals verl's recursion before whitening; Lathe's default λ is 0.95", () => {
  const tokenRewards = [
    [0, -0.1, 1],
    [0.2, 0],
  ];
  const values = [
    [0.5, 0.4, 0.9],
    [0.1, 0.3],
  ];
  // verl's compute_gae_advantage_return, γ = 1, λ = 1: lastgaelam = δ_t + γλ·lastgaelam, V past the end 0
  const verl = tokenRewards.map((r, i) => {
    const out = new Array<number>(r.length);
    let last = 0;
    for (let t = r.length - 1; t >= 0; t--) {
      const next = t + 1 < r.length ? values[i][t + 1] : 0;
      out[t] = last = r[t] + next - values[i][t] + last;
    }
    return out;
  });
  const lathe = gaeAdvantages({ tokenRewards, values }, { lambda: 1, whiten: false });
  lathe.advantages.forEach((row, i) => row.forEach((a, t) => expect(a).toBeCloseTo(verl[i][t], 12)));
  const byDefault = gaeAdvantages({ tokenRewards, values }, { whiten: false });
  expect(byDefault.advantages[0][0]).not.toBeCloseTo(verl[0][0], 6);
});

test("GSPO's sequence log-ratio is clamped at ±20 (verl's GSPO: at 10, above only)", async () => {
  const g = new L.Graph();
  const t = (name: string) => g.input(name, 'float64', [1, 2]);
  const out = policyLoss({ logp: t('logp'), oldLogp: t('old'), advantages: t('adv'), mask: g.input('mask', 'int64', [1, 2]), normaliser: g.input('n', 'float64', []) }, { ratio: 'sequence', aggregation: 'token-mean' });
  g.output(out.loss, 'loss');
  const run = await compile(g);
  const loss = async (logRatio: number) =>
    Number((await run({ logp: f64([[logRatio, logRatio]]), old: f64([[0, 0]]), adv: f64([[-1, -1]]), mask: { data: BigInt64Array.from([1n, 1n]), dims: [1, 2] }, n: scalar(2) })).loss.data[0]);
  // A = −1: the unclipped branch −r·A = r is the larger; token-mean over 2 tokens of r each
  expect(await loss(15)).toBeCloseTo(Math.exp(15), 3); // verl: exp(min(15, 10)) = e^10
  expect(await loss(25)).toBeCloseTo(Math.exp(20), 1);
});

test("the adaptive KL controller follows verl's AdaptiveKLController update, written out by hand", () => {
  const ctl = new AdaptiveKlController(0.05, 0.1, 10000);
  let beta = 0.05;
  for (const [kl, n] of [
    [0.3, 512],
    [0.11, 512],
    [0.02, 256],
    [0.1, 64],
  ] as const) {
    // verl: proportional_error = clip(kl / target − 1, −0.2, 0.2); value *= 1 + error · n_steps / horizon
    beta *= 1 + (Math.min(Math.max(kl / 0.1 - 1, -0.2), 0.2) * n) / 10000;
    expect(ctl.update(kl, n)).toBeCloseTo(beta, 15);
  }
  expect(() => new AdaptiveKlController(0.05, 0, 100)).toThrow(/target must be > 0/);
  // the KL it reads: each completion's token mean, averaged over completions (k1 here)
  expect(meanCompletionKl([[0.1, 0.3], [0.5]], [[0, 0.1], [0.1]], 'k1')).toBeCloseTo(((0.1 + 0.2) / 2 + 0.4) / 2, 12);
});
