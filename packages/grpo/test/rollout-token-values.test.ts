/**
 * The per-token values a step's rollouts carry for the rollout store (and Studio's token view):
 * each response token's log π_old and the entropy of the distribution it was sampled from, and the
 * greedy (held-out evaluation) completions' log-probs, against log-softmax and entropy computed on
 * the host from a separate composed decoder graph's logits.
 */
import * as L from '@lathe/onnx';
import { decoder, lmLogits, paddedCausalMask, paramSpecs, positionsFromPadding, weightInputs } from '@lathe/models';
import { combineRewards, GrpoTrainer, type RlPrompt } from '@lathe/grpo';
import { compile } from '../../../tools/testing/ort-cpu';
import { tinyModel } from './tiny-qwen3';

type Meta = { answer: number };
const V = 24;

test('each rollout carries log π_old and the entropy of every response token, as the logits give them', async () => {
  const model = tinyModel(V, { layers: 2, std: 0.5, seed: 5 });
  const tau = 0.8;
  const ps: RlPrompt<Meta>[] = [[5], [9, 1, 4], [13, 6]].map((ids, i) => ({ ids, text: '', meta: { answer: 0 }, key: i }));
  const t = GrpoTrainer.create<Meta>({
    model: model.lm,
    tokenizer: { decode: (ids: readonly number[]) => ids.join(' '), padId: 0 },
    stopIds: [3],
    rewards: combineRewards<Meta & { completionTokens: number; stopped: boolean }>([{ name: 'len', fn: (_p, c) => c.length }], { fallback: 0 }),
    groupSize: 4,
    maxNewTokens: 4,
    sampling: { temperature: tau },
    minibatches: 1,
  });
  // greedy completions (the held-out evaluation's) before the update, with generation's log-probs
  const greedy = await t.generateGreedy(ps);
  const { rollouts } = await t.step(ps, 0.01);
  t.dispose();
  // the policy's logits before the update, from a composed decoder graph over each row
  const g = new L.Graph('logits');
  const { weights, inputs } = weightInputs(g, model.config, 'float32', 'float32');
  const ids = g.input('input_ids', 'int64', [1, 'T']);
  const mask = g.input('attention_mask', 'int64', [1, 'T']);
  const { hidden } = decoder(model.config, weights, { inputIds: ids, positionIds: positionsFromPadding(mask), attentionMask: paddedCausalMask(mask) });
  g.output(lmLogits(model.config, weights, hidden), 'logits');
  const run = await compile(g);
  const feeds = Object.fromEntries([...inputs.keys()].map((n) => [n, { data: model.weights.get(n)!, dims: paramSpecs(model.config).find((s) => s.name === n)!.shape }]));
  let checked = 0;
  for (const [k, r] of rollouts.entries()) {
    const prompt = ps[Math.floor(k / 4)].ids;
    const row = [...prompt, ...r.tokens];
    const out = await run({ ...feeds, input_ids: { data: BigInt64Array.from(row.map(BigInt)), dims: [1, row.length] }, attention_mask: { data: BigInt64Array.from(row.map(() => 1n)), dims: [1, row.length] } });
    const l = out.logits.data as Float32Array;
    expect(r.logprobs).toHaveLength(r.tokens.length);
    expect(r.entropies).toHaveLength(r.tokens.length);
    // token j is predicted at position prompt.length − 1 + j, from logits / τ
    r.tokens.forEach((tok, j) => {
      const pos = prompt.length - 1 + j;
      const z = Array.from(l.subarray(pos * V, (pos + 1) * V), (x) => x / tau);
      const m = Math.max(...z);
      const logZ = m + Math.log(z.reduce((a, x) => a + Math.exp(x - m), 0));
      expect(r.logprobs![j]).toBeCloseTo(z[tok] - logZ, 4);
      expect(r.entropies![j]).toBeCloseTo(-z.reduce((a, x) => a + Math.exp(x - logZ) * (x - logZ), 0), 4);
      checked++;
    });
  }
  expect(checked).toBe(rollouts.reduce((n, r) => n + r.tokens.length, 0));
  // greedy: each token the argmax, its log-prob the log-softmax of the logits (no temperature) there
  for (const [k, c] of greedy.entries()) {
    const prompt = ps[k].ids;
    const row = [...prompt, ...c.tokens];
    const l = (await run({ ...feeds, input_ids: { data: BigInt64Array.from(row.map(BigInt)), dims: [1, row.length] }, attention_mask: { data: BigInt64Array.from(row.map(() => 1n)), dims: [1, row.length] } })).logits.data as Float32Array;
    expect(c.logprobs).toHaveLength(c.tokens.length);
    c.tokens.forEach((tok, j) => {
      const z = Array.from(l.subarray((prompt.length - 1 + j) * V, (prompt.length + j) * V));
      const m = Math.max(...z);
      expect(z[tok]).toBe(m);
      expect(c.logprobs![j]).toBeCloseTo(z[tok] - (m + Math.log(z.reduce((a, x) => a + Math.exp(x - m), 0))), 4);
    });
  }
  expect(checked).toBeGreaterThan(rollouts.length); // several tokens a completion
});
