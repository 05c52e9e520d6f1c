/**
 * Q-weighted sampling against known answers. With a hand-made policy and critic the first token's
 * frequencies over 6,000 samples pass a chi-square test against π_ref·exp(Q/τ)/Z computed by hand,
 * and τ = ∞ against π_ref renormalised over the candidates; samples do not depend on the batch
 * they run in; stop tokens and the length limit end them. On tiny random Qwen3s the compiled step
 * models give the reference's min-p candidates and the critic's Q of prefix + candidate run alone,
 * and τ = ∞ reproduces the rollout engine's min-p samples token for token; stepping over KV caches
 * gives the samples, candidates and Q of reading each prefix whole.
 */
import { CausalLM, type HfConfig } from '@lathe/models';
import { Device } from '@lathe/runtime';
import { KvCacheGenerator } from '@lathe/rollout';
import { marginals, type CriticBins } from '@lathe/critic';
import { checkVocabularies, qWeightedSample, QWeightedModels, type Candidates, type StepModels } from '@lathe/policy-extraction';
import { logitsRunner, tinyModel, tinyQwen3 } from '../../models/test/tiny';

// a policy over tokens 1…4 at every step, token 9 ends; the critic's Q depends only on the candidate
const REF = [0.4, 0.3, 0.2, 0.1];
const Q = [0.1, 0.9, 0.5, 0.0];
const stub = (ref = REF, q = Q, extra: Partial<Candidates> = {}): StepModels & { calls: number[] } => {
  const calls: number[] = [];
  return {
    calls,
    async candidates(seqs) {
      calls.push(seqs.length);
      return seqs.map(() => ({ ids: extra.ids ?? [3, 1, 4, 2], logprobs: extra.logprobs ?? [ref[2], ref[0], ref[3], ref[1]].map(Math.log) }));
    },
    async scores(prefixes, cands) {
      return cands.map((cs) => cs.map((id) => q[id - 1]));
    },
  };
};

/** χ² of observed counts against expected probabilities. */
const chiSquare = (counts: number[], probs: number[], n: number) => counts.reduce((s, c, i) => s + (c - n * probs[i]) ** 2 / (n * probs[i]), 0);
// χ²(3) at p = 0.001
const CRITICAL_3 = 16.27;

async function firstTokenCounts(tau: number, n: number, seed = 5): Promise<number[]> {
  const requests = Array.from({ length: n }, (_, i) => ({ prompt: [7], key: i }));
  const samples = await qWeightedSample(requests, stub(), { tau, maxTokens: 1, seed, stopIds: [] });
  const counts = [0, 0, 0, 0];
  for (const s of samples) counts[s.output[0] - 1]++;
  return counts;
}

test('first-token frequencies match π_ref·exp(Q/τ) (χ², τ 0.25)', async () => {
  const tau = 0.25;
  const w = REF.map((p, i) => p * Math.exp(Q[i] / tau));
  const z = w.reduce((a, b) => a + b, 0);
  const want = w.map((v) => v / z); // ≈ 0.078, 0.725, 0.165, 0.032: the high-Q token dominates
  const counts = await firstTokenCounts(tau, 6000);
  expect(chiSquare(counts, want, 6000)).toBeLessThan(CRITICAL_3);
  expect(counts[1] / 6000).toBeGreaterThan(0.7);
});

test('τ = ∞ samples π_ref over its candidates (χ²); a huge τ gives the same draws', async () => {
  const counts = await firstTokenCounts(Infinity, 6000);
  expect(chiSquare(counts, REF, 6000)).toBeLessThan(CRITICAL_3);
  expect(await firstTokenCounts(1e12, 6000)).toEqual(counts);
  // without the critic (score: false) the same draws, and no critic pass
  const models = stub();
  let scored = 0;
  const unscored = await qWeightedSample(Array.from({ length: 50 }, (_, i) => ({ prompt: [7], key: i })), { ...models, scores: async (p, c) => ((scored += p.length), models.scores(p, c)) }, { tau: Infinity, maxTokens: 1, seed: 5, stopIds: [], score: false });
  const scoredRun = await qWeightedSample(Array.from({ length: 50 }, (_, i) => ({ prompt: [7], key: i })), stub(), { tau: Infinity, maxTokens: 1, seed: 5, stopIds: [] });
  expect(unscored.map((s) => s.output)).toEqual(scoredRun.map((s) => s.output));
  expect(scored).toBe(0);
  await expect(qWeightedSample([{ prompt: [7], key: 0 }], stub(), { tau: 1, maxTokens: 1, seed: 5, stopIds: [], score: false })).rejects.toThrow(/needs the critic's scores/);
});

test('the recorded candidates and chosen Q; samples independent of the batch; stop token and length limit', async () => {
  const ids = [3, 1, 4, 2, 9];
  const logprobs = [0.2, 0.2, 0.2, 0.2, 0.2].map(Math.log);
  const q = [0.1, 0.9, 0.5, 0.0, 0, 0, 0, 0, 0.3];
  const requests = Array.from({ length: 12 }, (_, i) => ({ prompt: [7, 8], key: 100 + i }));
  const opts = { tau: 0.5, maxTokens: 6, seed: 3, stopIds: [9] };
  const models = stub(REF, q, { ids, logprobs });
  const all = await qWeightedSample(requests, models, opts);
  const one = await qWeightedSample(requests, stub(REF, q, { ids, logprobs }), { ...opts, batchSize: 5 });
  expect(one).toEqual(all);
  expect(models.calls[0]).toBe(12);
  for (const s of all) {
    expect(s.candidate_ids).toEqual(s.output.map(() => ids));
    s.output.forEach((tok, t) => expect(s.token_q_values[t]).toBeCloseTo(q[tok - 1], 12));
    const stopped = s.output.indexOf(9);
    if (stopped >= 0) expect([s.finish_reason, stopped]).toEqual(['stop', s.output.length - 1]);
    else expect([s.finish_reason, s.output.length]).toEqual(['length', 6]);
  }
  expect(all.some((s) => s.finish_reason === 'stop') && all.some((s) => s.finish_reason === 'length')).toBe(true);
  await expect(qWeightedSample(requests, models, { ...opts, tau: 0 })).rejects.toThrow(/tau must be > 0/);
});

const bins: CriticBins = { reward_values: [0, 1], length_edges: [0, 1, 2, 4, 8], first_token_id: 56 };
// head_dim 16: the KV-cache engine's rotary needs a multiple of 16
const cfg16: HfConfig = { ...tinyQwen3, head_dim: 16 };

test('vocabularies: the same size, or a critic grown by exactly its grid, else refused naming both', () => {
  expect(() => checkVocabularies({ name: 'ref', vocabSize: 64 }, { name: 'critic', vocabSize: 64 }, bins)).not.toThrow();
  expect(() => checkVocabularies({ name: 'ref', vocabSize: 56 }, { name: 'critic', vocabSize: 64 }, bins)).not.toThrow();
  expect(() => checkVocabularies({ name: 'models/ref', vocabSize: 60 }, { name: 'runs/critic', vocabSize: 64 }, bins)).toThrow(/reference policy models\/ref has a vocabulary of 60 and the critic runs\/critic one of 64/);
});

test('compiled step models: min-p candidates of the reference and Q of prefix + candidate alone; τ = ∞ equals the engine', async () => {
  const critic = tinyModel(cfg16, 3);
  const reference = tinyModel({ ...cfg16, vocab_size: 56 }, 4);
  const refLm = CausalLM.fromPretrainedSync(reference.dir);
  const device = Device.open('cpu');
  const models = QWeightedModels.open({
    device,
    critic: { name: critic.dir, config: critic.config, weights: CausalLM.fromPretrainedSync(critic.dir).float32Weights() },
    reference: { name: reference.dir, config: reference.config, weights: refLm.float32Weights() },
    bins,
    minP: 0.2,
    maxCandidates: 56,
    padId: 0,
  });
  try {
    const seqs = [[5, 6, 7], [10]];
    const cands = await models.candidates(seqs);
    const refRun = await logitsRunner(reference.dir, reference.config, 'padding');
    const criticRun = await logitsRunner(critic.dir, critic.config, 'padding');
    const softmax = (z: number[]) => {
      const m = Math.max(...z);
      const e = z.map((v) => Math.exp(v - m));
      const s = e.reduce((a, b) => a + b, 0);
      return e.map((v) => v / s);
    };
    for (const [b, s] of seqs.entries()) {
      const logits = (await refRun({ input_ids: [s], attention_mask: [s.map(() => 1)] })).data as Float32Array;
      const p = softmax(Array.from(logits.slice((s.length - 1) * 56, s.length * 56)));
      const want = p.map((v, id) => ({ v, id })).filter((e) => e.v >= 0.2 * Math.max(...p)).sort((x, y) => y.v - x.v);
      expect(cands[b].ids).toEqual(want.map((e) => e.id));
      cands[b].logprobs.forEach((lp, k) => expect(lp).toBeCloseTo(Math.log(want[k].v), 4));
      // the entropy of the whole next-token distribution, not of the candidates alone
      expect(cands[b].entropy).toBeCloseTo(-p.reduce((a, v) => a + (v > 0 ? v * Math.log(v) : 0), 0), 4);
    }
    const prefixes = [[5, 6, 7, 8], [10, 11]];
    const qs = await models.scores(prefixes, cands.map((c) => c.ids));
    const est = await models.estimates(prefixes, cands.map((c) => c.ids));
    for (const [b, prefix] of prefixes.entries()) {
      for (const [k, id] of cands[b].ids.entries()) {
        const ids = [...prefix, id];
        const logits = (await criticRun({ input_ids: [ids], attention_mask: [ids.map(() => 1)] })).data as Float32Array;
        const probs = softmax(Array.from({ length: 8 }, (_, c) => logits[prefix.length * 64 + 56 + c]));
        expect(qs[b][k]).toBeCloseTo(marginals(bins, probs).q, 4);
        expect(est[b][k].remaining).toBeCloseTo(marginals(bins, probs).remaining, 3);
      }
    }

    // τ = ∞ against the rollout engine's min-p sampling with the same seed and keys
    const prompts = [[5, 6, 7], [10, 12], [3]];
    const keys = [11, 12, 13];
    const ours = await qWeightedSample(prompts.map((prompt, i) => ({ prompt, key: keys[i] })), models, { tau: Infinity, maxTokens: 6, seed: 21, stopIds: [] });
    // the model disposed with the engine: its weights left to the GC would leave the device's tensor count under a later test's feet
    const model = CausalLM.fromPretrainedSync(reference.dir, { device });
    const engine = KvCacheGenerator.create(model, { rows: 3, maxLength: 16, minP: 0.2, dtype: 'float32' });
    try {
      const theirs = await engine.generate(prompts, { maxNewTokens: 6, seed: 21, sampleKeys: keys.map((k) => [k]) });
      expect(ours.map((s) => s.output)).toEqual(theirs.map((c) => c.tokens));
      expect(new Set(ours.flatMap((s) => s.output)).size).toBeGreaterThan(4); // real draws, not one token repeated
    } finally {
      engine.dispose();
      model.dispose();
    }
  } finally {
    models.dispose();
  }
});

test('KV-cached steps give the samples, candidates, reference log-probs, Q and remaining lengths of reading each prefix whole', async () => {
  const critic = tinyModel(cfg16, 5);
  const reference = tinyModel({ ...cfg16, vocab_size: 56 }, 6);
  const device = Device.open('cpu');
  const open = (kvCache: boolean) =>
    QWeightedModels.open({
      device,
      critic: { name: critic.dir, config: critic.config, weights: CausalLM.fromPretrainedSync(critic.dir).float32Weights() },
      reference: { name: reference.dir, config: reference.config, weights: CausalLM.fromPretrainedSync(reference.dir).float32Weights() },
      bins,
      minP: 0.3,
      maxCandidates: 5,
      padId: 0,
      kvCache,
    });
  const cached = open(true);
  const whole = open(false);
  expect(typeof cached.open).toBe('function');
  expect(whole.open).toBeUndefined();
  try {
    // prompts of different lengths (one of a single token), critic prefixes unlike the prompts, stop tokens ending rows early
    const requests = [[5, 6, 7], [9], [10, 12, 3, 4, 8], [20, 21]].flatMap((prompt, p) => [0, 1, 2].map((j) => ({ prompt, criticPrefix: [40 + p, ...prompt], key: p * 3 + j })));
    for (const tau of [0.2, Infinity]) {
      const opts = { tau, maxTokens: 7, seed: 3, stopIds: [11, 17, 23], batchSize: 5 };
      const a = await qWeightedSample(requests, cached, opts);
      const b = await qWeightedSample(requests, whole, opts);
      expect(a.map((s) => s.output)).toEqual(b.map((s) => s.output));
      expect(a.map((s) => s.candidate_ids)).toEqual(b.map((s) => s.candidate_ids));
      expect(a.some((s) => s.finish_reason === 'stop') && a.some((s) => s.finish_reason === 'length')).toBe(true);
      a.forEach((s, i) =>
        s.output.forEach((_, t) => {
          s.candidate_ref_logprobs[t].forEach((lp, k) => expect(lp).toBeCloseTo(b[i].candidate_ref_logprobs[t][k], 4));
          expect(s.token_entropies[t]).toBeCloseTo(b[i].token_entropies[t], 4);
          expect(s.token_entropies[t]).toBeGreaterThan(0);
          s.candidate_q_values[t].forEach((q, k) => expect(q).toBeCloseTo(b[i].candidate_q_values[t][k], 4));
          if (Number.isFinite(tau)) {
            s.candidate_remaining[t].forEach((r, k) => expect(r).toBeCloseTo(b[i].candidate_remaining[t][k], 3));
            expect(s.token_remaining[t]).toBeCloseTo(b[i].token_remaining[t], 3);
            expect(s.token_remaining[t]).toBeGreaterThanOrEqual(0);
          }
        }),
      );
    }
  } finally {
    cached.dispose();
    whole.dispose();
  }
});

test('KV-cached sampling holds one pre-sized cache per model: no device allocation per step, memory flat over the steps, caches kept across calls of the same sizes', async () => {
  const critic = tinyModel(cfg16, 7);
  const reference = tinyModel({ ...cfg16, vocab_size: 56 }, 8);
  const device = Device.open('cpu');
  const K = 4;
  const models = QWeightedModels.open({
    device,
    critic: { name: critic.dir, config: critic.config, weights: CausalLM.fromPretrainedSync(critic.dir).float32Weights() },
    reference: { name: reference.dir, config: reference.config, weights: CausalLM.fromPretrainedSync(reference.dir).float32Weights() },
    bins,
    minP: 0.05,
    maxCandidates: K,
    padId: 0,
  });
  // every tensor Lathe allocates on a device (zeros, full, upload) comes from `empty`
  const empty = jest.spyOn(device, 'empty');
  const allocated = () => empty.mock.calls.length;
  try {
    const base = device.memory();
    // prompts up to 5 tokens, critic prefixes up to 7; 7 requests in batches of 3 (the last one 1 row, filled with padding rows)
    const requests = [[5, 6, 7], [9], [10, 12, 3, 4, 8], [20, 21], [30], [31, 32], [33]].map((prompt, i) => ({ prompt, criticPrefix: [40, 41, ...prompt], key: i }));
    // [layers × (key, value)] × rows × KV heads × positions × head_dim × 4 bytes (float32), per model; positions: the
    // longest prefix (prompt 5, critic prefix 7) + max tokens, and for the critic the K candidates' scratch slots
    const cacheBytes = (maxTokens: number) => [5 + maxTokens, 7 + maxTokens + K].reduce((s, positions) => s + 2 * 2 * 3 * 2 * positions * 16 * 4, 0);
    for (const maxTokens of [4, 12, 12]) {
      const perStep: { tensors: number; bytes: number; allocated: number }[] = [];
      await qWeightedSample(requests, models, {
        tau: 0.5,
        maxTokens,
        seed: 1,
        stopIds: [],
        batchSize: 3,
        onStep: () => perStep.push({ tensors: device.memory().tensors - base.tensors, bytes: device.memory().bytes - base.bytes, allocated: allocated() }),
      });
      expect(perStep).toHaveLength(3 * maxTokens); // three batches, no row stops
      // 2 layers × (key, value) × 2 models live, and the very bytes of the hand-computed caches, at every step of every batch
      for (const s of perStep) expect([s.tensors, s.bytes]).toEqual([8, cacheBytes(maxTokens)]);
      // nothing allocated on the device after the first step (inputs are host tensors, caches bound in place)
      expect(perStep[perStep.length - 1].allocated).toBe(perStep[0].allocated);
      expect(models.cacheBytes()).toBe(cacheBytes(maxTokens));
    }
    // the third call had the second's sizes: its caches were the second's, nothing allocated
    expect(allocated()).toBe(2 * 2 * 2 * 2); // two calls that allocated, 4 tensors per model each
  } finally {
    empty.mockRestore();
    models.dispose();
  }
  expect(models.cacheBytes()).toBe(0);
});
