/**
 * Truncated importance sampling in the policy loss against hand-computed values: each on-policy
 * token's policy term × min(π_old/π_sample, C), a constant (the gradient is the weight times the
 * unweighted term's), and the count of truncated weights.
 */
import * as L from '@lathe/onnx';
import { DEFAULT_ROLLOUT_IS_THRESHOLD, policyLoss, rlLoss, type PolicyBuilder, type PolicyLossConfig } from '@lathe/grpo';
import { compile, type HostTensor } from '../../../tools/testing/ort-cpu';

const row = (xs: number[]): HostTensor => ({ data: Float64Array.from(xs), dims: [1, xs.length] });

// three response tokens and one padding position:
//   t0: π_old/π_sample = 2 (kept), r = 1, A = 1
//   t1: π_old/π_sample = 8 → truncated at 4, r = 1, A = −0.5
//   t2: π_old/π_sample = 0.5, r = 1.1 (inside the clip), A = 2
const old = [-1, -2, -0.5, 0];
const inputs = {
  logp: row([old[0], old[1], old[2] + Math.log(1.1), -30]),
  old: row(old),
  rollout: row([old[0] - Math.log(2), old[1] - Math.log(8), old[2] - Math.log(0.5), 9]),
  adv: row([1, -0.5, 2, 7]),
  mask: { data: BigInt64Array.from([1n, 1n, 1n, 0n]), dims: [1, 4] },
  normaliser: { data: Float64Array.from([3]), dims: [] },
};

async function run(cfg: PolicyLossConfig) {
  const g = new L.Graph('tis');
  const t = (name: string) => g.input(name, 'float64', ['B', 'T']);
  const logp = t('logp');
  const out = policyLoss({ logp, oldLogp: t('old'), rolloutLogp: cfg.rolloutIsThreshold !== undefined ? t('rollout') : undefined, advantages: t('adv'), mask: g.input('mask', 'int64', ['B', 'T']), normaliser: g.input('normaliser', 'float64', []) }, cfg);
  g.output(out.loss, 'loss');
  for (const [k, v] of Object.entries(out.metrics)) if (v) g.output(v, k);
  g.output(L.grad(out.loss, [logp])[0], 'd_logp');
  const session = await compile(g);
  const feeds: Record<string, HostTensor> = { ...inputs };
  if (cfg.rolloutIsThreshold === undefined) delete feeds.rollout;
  const r = await session(feeds);
  const num = (k: string) => Number(r[k].data[0]);
  return { loss: num('loss'), clipped: r.rollout_is_clipped_tokens && num('rollout_is_clipped_tokens'), weights: r.rollout_is_weight_sum && num('rollout_is_weight_sum'), grad: Array.from(r.d_logp.data as Float64Array) };
}

test('the weight min(π_old/π_sample, 4) multiplies each token\'s term: loss, metrics and gradient by hand', async () => {
  expect(DEFAULT_ROLLOUT_IS_THRESHOLD).toBe(4);
  const out = await run({ rolloutIsThreshold: 4 });
  // pg: −r·A per token = −1, 0.5, −2.2; weighted by 2, 4, 0.5 → −2, 2, −1.1; token mean over 3
  expect(out.loss).toBeCloseTo(-1.1 / 3, 12);
  expect(out.clipped).toBe(1);
  expect(out.weights).toBeCloseTo(6.5, 12);
  // d/d logp of −w·r·A/3 = −w·r·A/3 (the weight is a constant): −2/3, 2/3, −1.1/3; padding 0
  const expected = [-2 / 3, 2 / 3, -1.1 / 3, 0];
  out.grad.forEach((g, i) => expect(g).toBeCloseTo(expected[i], 12));
});

test('without a threshold the loss is the unweighted one, and a lower threshold truncates more', async () => {
  const plain = await run({});
  expect(plain.loss).toBeCloseTo((-1 + 0.5 - 2.2) / 3, 12);
  expect(plain.clipped).toBeUndefined();
  const tight = await run({ rolloutIsThreshold: 1.5 });
  // weights 1.5, 1.5, 0.5 → −1.5 + 0.75 − 1.1
  expect(tight.loss).toBeCloseTo((-1.5 + 0.75 - 1.1) / 3, 12);
  expect(tight.clipped).toBe(2);
});

test('rlLoss declares rollout_logp only when the config truncates; bad thresholds are refused by name', () => {
  const policy: PolicyBuilder = (g) => ({ logp: g.input('policy_logp', 'float32', ['B', 'T']) });
  const names = (cfg: PolicyLossConfig) => {
    const g = new L.Graph();
    rlLoss(policy, cfg)(g, new Map());
    return g.inputs.map((i) => i.name);
  };
  expect(names({ rolloutIsThreshold: 4 })).toContain('rollout_logp');
  expect(names({})).not.toContain('rollout_logp');
  const g = new L.Graph();
  const x = g.input('x', 'float32', ['B', 'T']);
  const base = { logp: x, oldLogp: x, advantages: x, mask: x, normaliser: g.input('n', 'float32', []) };
  expect(() => policyLoss(base, { rolloutIsThreshold: 4 })).toThrow(/rolloutIsThreshold needs rolloutLogp/);
  expect(() => policyLoss({ ...base, rolloutLogp: x }, { rolloutIsThreshold: 0 })).toThrow(/rolloutIsThreshold must be ≥ 1/);
});
