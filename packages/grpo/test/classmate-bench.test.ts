/**
 * The classmate device bench (tools/bench/classmate) at a tiny shape on the CPU: both
 * configurations run a measured step, the classmate's sampling is timed inside the rewards phase
 * (completions × K rows, every completion having a CoT), and the configuration without classmates
 * samples none.
 */
import { measureClassmateStep } from '../../../tools/bench/classmate/measure';

test('classmate-step bench at a tiny shape on the CPU', async () => {
  const config = { architectures: ['Qwen3ForCausalLM'], vocab_size: 64, hidden_size: 16, intermediate_size: 32, num_hidden_layers: 1, num_attention_heads: 2, num_key_value_heads: 1, head_dim: 8, rms_norm_eps: 1e-6, rope_theta: 10000, max_position_embeddings: 64, tie_word_embeddings: true };
  const r = await measureClassmateStep({ config, device: 'cpu', compute: 'float32', prompts: 2, group: 4, promptLen: 5, newTokens: 6, samples: 4, warmup: 1, engine: 'graph' });
  expect(r.without.classmate_s).toBe(0);
  expect(r.without.classmate_rows).toBe(0);
  expect(r.with.classmate_rows).toBe(2 * 4 * 4);
  expect(r.with.classmate_s).toBeGreaterThan(0);
  expect(r.with.classmate_s).toBeLessThanOrEqual(r.with.rewards_s + 1e-3);
  for (const s of [r.without, r.with]) {
    expect(s.step_s).toBeGreaterThan(0);
    expect(s.generation_s + s.scoring_s + s.training_s + s.rewards_s + s.host_s).toBeCloseTo(s.step_s, 6);
  }
  expect(r.step_ratio).toBeCloseTo(r.with.step_s / r.without.step_s, 12);
}, 60_000);
