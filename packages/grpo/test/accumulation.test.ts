/**
 * Gradient-accumulation invariance of the RL loss, for every aggregation mode, through
 * compileTrainStep's graphs: one batch of 8 (one `step` run, and one `accumulate` run) against 8
 * micro-batches of 1 (`accumulate` × 8 + `apply`), each micro-batch padded only to its own length.
 */
import { biasCorrections, compileTrainStep, stateNames } from '@lathe/train';
import { LOSS_AGGREGATIONS, lossNormaliser, rlLoss, type PolicyLossConfig } from '@lathe/grpo';
import { compile, rng, type HostTensor } from '../../../tools/testing/ort-cpu';
import { tinyParams, tinyPolicy, tinyState } from './tiny-policy';

const V = 6;
const lengths = [3, 1, 5, 2, 4, 1, 5, 3]; // response tokens per sequence
const rand = rng(11);
const rows = lengths.map((n) => ({
  ids: [Math.floor(rand() * V), ...Array.from({ length: n }, () => Math.floor(rand() * V))], // prompt token, response
  // predicting positions 0 … n−1 predict the response tokens 1 … n
  old: Array.from({ length: n }, () => -Math.log(V) + (rand() - 0.5)),
  ref: Array.from({ length: n }, () => -Math.log(V) + (rand() - 0.5) * 0.4),
  adv: Array.from({ length: n }, () => rand() * 2 - 1),
}));

/** The batch tensors of `rows`, right-padded to the longest of them. */
function batchOf(sel: typeof rows, normaliser: number, withRef: boolean): Record<string, HostTensor> {
  const T = Math.max(...sel.map((r) => r.ids.length));
  const B = sel.length;
  const ids = new BigInt64Array(B * T);
  const mask = new BigInt64Array(B * T);
  const old = new Float32Array(B * T);
  const ref = new Float32Array(B * T);
  const adv = new Float32Array(B * T);
  sel.forEach((r, b) => {
    r.ids.forEach((id, t) => (ids[b * T + t] = BigInt(id)));
    r.old.forEach((x, t) => {
      mask[b * T + t] = 1n;
      old[b * T + t] = x;
      ref[b * T + t] = r.ref[t];
      adv[b * T + t] = r.adv[t];
    });
  });
  const feeds: Record<string, HostTensor> = {
    input_ids: { data: ids, dims: [B, T] },
    old_logp: { data: old, dims: [B, T] },
    advantages: { data: adv, dims: [B, T] },
    response_mask: { data: mask, dims: [B, T] },
    loss_normaliser: { data: Float32Array.from([normaliser]), dims: [] },
  };
  if (withRef) feeds.ref_logp = { data: ref, dims: [B, T] };
  return feeds;
}

const scalar = (v: number): HostTensor => ({ data: Float32Array.from([v]), dims: [] });
const params = tinyParams(V);
const zeroGrads = () => Object.fromEntries(params.map((p) => [stateNames.grad(p.name), { data: new Float32Array(V * V), dims: p.shape }]));
const maxAbsDiff = (a: HostTensor, b: HostTensor) => Math.max(...Array.from(a.data as Float32Array, (x, i) => Math.abs(x - Number(b.data[i]))));

const cases: [string, PolicyLossConfig][] = [
  ...LOSS_AGGREGATIONS.map((aggregation): [string, PolicyLossConfig] => [aggregation, { aggregation, clipHigh: 0.28, klCoef: 0.05, entropyCoef: 0.01 }]),
  ['seq-mean-token-mean, sequence ratio (GSPO)', { aggregation: 'seq-mean-token-mean', ratio: 'sequence', clipLow: 3e-4, clipHigh: 4e-4 }],
];

async function compileAll(cfg: PolicyLossConfig) {
  const graphs = compileTrainStep({ params, loss: rlLoss(tinyPolicy, cfg), optimizer: { maxGradNorm: 1, weightDecay: 0 } });
  const [step, accumulate, apply] = await Promise.all([compile(graphs.step), compile(graphs.accumulate), compile(graphs.apply)]);
  return { step, accumulate, apply, graphs };
}

test.each(cases)('8 micro-batches of 1 = 1 batch of 8: %s', async (_name, cfg) => {
  const { step, accumulate, apply, graphs } = await compileAll(cfg);
  const withRef = (cfg.klCoef ?? 0) > 0;
  expect(graphs.batchInputs).toEqual(['input_ids', 'old_logp', 'advantages', 'response_mask', 'loss_normaliser', ...(withRef ? ['ref_logp'] : [])]);
  const state = tinyState(V, rng(5));
  const normaliser = lossNormaliser(cfg.aggregation ?? 'token-mean', lengths, { maxLength: 6 });
  const sc = { lr: scalar(0.01), ...Object.fromEntries(Object.entries(biasCorrections(1)).map(([k, x]) => [k, scalar(x)])) };

  const whole = await step({ ...state, ...sc, ...batchOf(rows, normaliser, withRef) });
  const wholeGrads = await accumulate({ ...state, ...zeroGrads(), ...batchOf(rows, normaliser, withRef) });

  let acc: Record<string, HostTensor> = zeroGrads();
  const sums: Record<string, number> = {};
  for (const row of rows) {
    const out = await accumulate({ ...state, ...acc, ...batchOf([row], normaliser, withRef) });
    for (const k of ['loss', ...graphs.metrics]) sums[k] = (sums[k] ?? 0) + Number(out[k].data[0]);
    acc = Object.fromEntries(params.map((p) => [stateNames.grad(p.name), out[stateNames.next(stateNames.grad(p.name))]]));
  }
  const applied = await apply({ ...state, ...acc, ...sc, grad_scale: scalar(1) });

  // loss and every metric add up; the clipping really happened in the clipped cases
  for (const k of ['loss', ...graphs.metrics]) expect([k, sums[k]]).toEqual([k, expect.closeTo(Number(whole[k].data[0]), 5)]);
  expect(sums.clipped_tokens).toBeGreaterThan(0);
  // gradients, gradient norm and the AdamW update agree
  for (const p of params) expect(maxAbsDiff(acc[stateNames.grad(p.name)], wholeGrads[stateNames.next(stateNames.grad(p.name))])).toBeLessThan(1e-6);
  expect(Number(applied.grad_norm.data[0])).toBeCloseTo(Number(whole.grad_norm.data[0]), 5);
  expect(Number(whole.grad_norm.data[0])).toBeGreaterThan(1e-3);
  for (const p of params) expect(maxAbsDiff(applied[stateNames.next(p.name)], whole[stateNames.next(p.name)])).toBeLessThan(1e-6);
});

test('control: a per-micro-batch normaliser breaks the invariance the batch-level one keeps', async () => {
  const { accumulate } = await compileAll({ aggregation: 'token-mean' });
  const state = tinyState(V, rng(5));
  const whole = await accumulate({ ...state, ...zeroGrads(), ...batchOf(rows, lossNormaliser('token-mean', lengths), false) });
  let acc: Record<string, HostTensor> = zeroGrads();
  for (const row of rows) {
    const out = await accumulate({ ...state, ...acc, ...batchOf([row], row.old.length * rows.length, false) }); // mean per micro-batch, / 8
    acc = Object.fromEntries(params.map((p) => [stateNames.grad(p.name), out[stateNames.next(stateNames.grad(p.name))]]));
  }
  const diff = Math.max(...params.map((p) => maxAbsDiff(acc[stateNames.grad(p.name)], whole[stateNames.next(stateNames.grad(p.name))])));
  expect(diff).toBeGreaterThan(1e-3);
});
