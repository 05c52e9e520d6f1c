/**
 * The device bench (tools/bench/extract) at the tiny preset's shape with a 512-token vocabulary on the CPU: every measurement runs and
 * reports positive speeds, the candidates per step stay within --max-candidates, and
 * the train step compares the KL loss with the SFT loss on the same rows.
 */
import { MODEL_PRESETS } from '@lathe/models';
import { measureExtract, type TrainTiming } from '../../../tools/bench/extract/measure';

test('extract bench at a tiny shape on the CPU', async () => {
  const r = await measureExtract({ preset: 'tiny-qwen3', config: { ...MODEL_PRESETS['tiny-qwen3'].config, vocab_size: 512, hidden_size: 32, intermediate_size: 64 }, device: 'cpu', compute: 'float32', batches: [2, 3], prompt: 5, newTokens: 3, minP: 0.1, maxCandidates: 4, tau: 0.1, trainRows: 2, trainLength: 16, trainCandidates: 3, steps: 1, seed: 1, kvCache: true, recompute: true });
  expect(r.generation.map((g) => g.batch)).toEqual([2, 3]);
  for (const g of r.generation) {
    for (const v of [g.kv_cache_tokens_per_s!, g.step_plain_tokens_per_s, g.q_weighted_tokens_per_s, g.q_weighted_recompute_tokens_per_s!]) expect(v).toBeGreaterThan(0);
    // near-flat random logits: min-p keeps the top-4 cap, less the ids of the critic's grid (here about half the vocabulary)
    expect(g.candidates_per_step).toBeGreaterThanOrEqual(1);
    expect(g.candidates_per_step).toBeLessThanOrEqual(4);
    // 2 layers × (key, value) × batch × 2 KV heads × positions × head_dim 16 × 4 bytes; positions: prompt 5 + 3 new
    // tokens for the reference, and 4 more for the critic (its candidates' scratch slots)
    expect(g.q_weighted_cache_bytes).toBe(2 * 2 * g.batch * 2 * (8 + 12) * 16 * 4);
  }
  const speed = (t: TrainTiming): number => {
    if ('error' in t) throw new Error(t.error);
    return t.tokens_per_s;
  };
  expect(speed(r.train.kl)).toBeGreaterThan(0);
  expect(speed(r.train.kl_alone)).toBeGreaterThan(0);
  expect(speed(r.train.sft)).toBeGreaterThan(0);
  expect(r.train.kl_vs_sft).toBeCloseTo(speed(r.train.kl) / speed(r.train.sft), 2);
}, 120_000);
