/**
 * The reward model's graph on CPU in float32: the reward of a row is its last real token's hidden
 * state · score.weight, computed here in float64 from the trunk's hidden states of the row alone
 * (no padding); padded batches, left or right, must give the same numbers; per-token values are the
 * head at every position and 0 at padding.
 */
import * as L from '@lathe/onnx';
import { CausalLM, decoderHidden, parseConfig, SCORE_WEIGHT, weightInputs, type DecoderConfig } from '@lathe/models';
import { Device, type HostTensor } from '@lathe/runtime';
import { rewardModelConfig, RewardModel, RewardScorer, sequenceRewards, type TokenBatch } from '@lathe/reward-models';
import { PAD, tinyLm, tinyQwen3 } from './tiny';

const ROWS = [
  [3, 10, 4, 11, 7, 2],
  [1, 2],
  [9, 8, 7, 6, 5, 4, 3, 2],
];

/** The rows padded to one width, on the right or the left. */
function padded(rows: number[][], side: 'right' | 'left'): TokenBatch {
  const T = Math.max(...rows.map((r) => r.length));
  const ids = new BigInt64Array(rows.length * T).fill(BigInt(PAD));
  const mask = new BigInt64Array(rows.length * T);
  rows.forEach((r, i) => {
    const start = i * T + (side === 'left' ? T - r.length : 0);
    r.forEach((id, k) => {
      ids[start + k] = BigInt(id);
      mask[start + k] = 1n;
    });
  });
  return { inputIds: { data: ids, dims: [rows.length, T] }, attentionMask: { data: mask, dims: [rows.length, T] } };
}

/** Hidden states [T, D] of one unpadded row, from the trunk alone. */
async function hiddenOf(config: DecoderConfig, weights: Map<string, Float32Array>, row: number[]): Promise<Float32Array> {
  const g = new L.Graph('hidden');
  const ids = g.input('input_ids', 'int64', ['B', 'T']);
  const mask = g.input('attention_mask', 'int64', ['B', 'T']);
  g.output(decoderHidden(config, weightInputs(g, config, 'float32', 'float32').weights, ids, mask), 'hidden');
  const session = Device.cpu().compile(g);
  const ones = (values: number[]): HostTensor => ({ data: BigInt64Array.from(values, BigInt), dims: [1, values.length] });
  const out = await session.run({ ...hostWeights(config, weights), input_ids: ones(row), attention_mask: ones(row.map(() => 1)) });
  session.dispose();
  return out.hidden.data as Float32Array;
}

function hostWeights(config: DecoderConfig, weights: Map<string, Float32Array>): Record<string, HostTensor> {
  const g = new L.Graph();
  const { inputs } = weightInputs(g, config, 'float32', 'float32');
  return Object.fromEntries([...inputs].map(([name, t]) => [name, { data: weights.get(name)!, dims: t.shape as number[] }]));
}

const dot = (h: Float32Array, t: number, w: Float32Array) => w.reduce((s, x, d) => s + x * h[t * w.length + d], 0);

describe('rewards and values of a tiny reward model', () => {
  const rm = RewardModel.fromCausalLM(tinyLm(3), { padTokenId: PAD, seed: 2, std: 0.5 });
  const weights = rm.float32Weights();
  const score = weights.get(SCORE_WEIGHT)!;

  test('the reward is hidden[last token] · score.weight, with right or left padding', async () => {
    const expected = await Promise.all(ROWS.map(async (r) => dot(await hiddenOf(rm.config, weights, r), r.length - 1, score)));
    const scorer = RewardScorer.create(rm.config, Device.cpu());
    for (const side of ['right', 'left'] as const) {
      const got = await scorer.score(padded(ROWS, side), weights);
      expect(got.length).toBe(ROWS.length);
      got.forEach((v, i) => expect(Math.abs(v - expected[i])).toBeLessThan(1e-5));
    }
    scorer.dispose();
  });

  test('values at every position are the head at each token, 0 at padding', async () => {
    const T = Math.max(...ROWS.map((r) => r.length));
    const scorer = RewardScorer.create(rm.config, Device.cpu(), { output: 'values' });
    for (const side of ['right', 'left'] as const) {
      const got = await scorer.score(padded(ROWS, side), weights);
      expect(got.length).toBe(ROWS.length * T);
      for (const [i, r] of ROWS.entries()) {
        const h = await hiddenOf(rm.config, weights, r);
        const start = side === 'left' ? T - r.length : 0;
        for (let t = 0; t < T; t++) {
          const k = t - start;
          const want = k >= 0 && k < r.length ? dot(h, k, score) : 0;
          expect(Math.abs(got[i * T + t] - want)).toBeLessThan(1e-5);
        }
      }
    }
    scorer.dispose();
  });

  test('RewardModel.score on a device equals the scorer over its weights; a host model is refused by name', async () => {
    const onCpu = rm.to('cpu');
    const batch = padded(ROWS, 'left');
    const scorer = RewardScorer.create(rm.config, Device.cpu());
    expect(Array.from(await onCpu.score(batch))).toEqual(Array.from(await scorer.score(batch, weights)));
    await expect(rm.score(batch)).rejects.toThrow(/RewardModel: the weights are on the host; load with \{ device \} or call \.to\(device\) to score/);
    scorer.dispose();
    onCpu.dispose();
  });

  test('a non-finite reward is an error naming its rows', async () => {
    const broken = new Map(weights);
    const h = Float32Array.from(weights.get('model.norm.weight')!);
    h[0] = NaN;
    broken.set('model.norm.weight', h);
    const scorer = RewardScorer.create(rm.config, Device.cpu());
    await expect(scorer.score(padded(ROWS, 'right'), broken)).rejects.toThrow('reward model: non-finite rewards for rows 0, 1, 2 of 3 (the weights or the head hold NaN or Inf)');
    scorer.dispose();
  });

  test('GroupQueryAttention scoring of right-padded rows equals composed attention', async () => {
    // ONNX Runtime's CPU GroupQueryAttention takes head sizes in multiples of 16.
    const wide = RewardModel.fromCausalLM(CausalLM.random({ ...tinyQwen3(), num_attention_heads: 2, num_key_value_heads: 1, head_dim: 16 }, { seed: 4, std: 0.1 }), { padTokenId: PAD, seed: 2, std: 0.5 });
    const batch = padded(ROWS, 'right');
    const composed = RewardScorer.create(wide.config, Device.cpu());
    const gqa = RewardScorer.create(wide.config, Device.cpu(), { attention: 'gqa' });
    const a = await composed.score(batch, wide.float32Weights());
    const b = await gqa.score(batch, wide.float32Weights());
    a.forEach((v, i) => expect(Math.abs(v - b[i])).toBeLessThan(1e-4));
    composed.dispose();
    gqa.dispose();
  });
});

describe('reward model configs', () => {
  test('a causal LM config becomes its …ForSequenceClassification with one label and a pad id', () => {
    const qwen3 = parseConfig(tinyQwen3());
    expect(rewardModelConfig(qwen3, 12)).toEqual({ ...qwen3, architecture: 'Qwen3ForSequenceClassification', scoreLabels: 1, padTokenId: 12 });
    expect(rewardModelConfig(parseConfig({ ...tinyQwen3(), architectures: ['LlamaForCausalLM'], pad_token_id: 5 })).architecture).toBe('LlamaForSequenceClassification');
    expect(rewardModelConfig({ ...qwen3, padTokenId: 5 }).padTokenId).toBe(5);
    expect(() => rewardModelConfig(qwen3)).toThrow(/Qwen3ForCausalLM: its config has no pad_token_id; pass padTokenId/);
    expect(() => rewardModelConfig(qwen3, 16)).toThrow(/padTokenId 16 is not a token id of a vocabulary of 16/);
  });

  test('the reward graph refuses a causal LM config, naming it', () => {
    const cfg = CausalLM.random(tinyQwen3(1), { seed: 1 }).config;
    const g = new L.Graph();
    const ids = g.input('input_ids', 'int64', ['B', 'T']);
    expect(() => sequenceRewards(cfg, weightInputs(g, cfg, 'float32', 'float32').weights, ids, ids)).toThrow(/Qwen3ForCausalLM is a causal LM \(no score head\); a reward model has one \(num_labels 1\)/);
  });
});
