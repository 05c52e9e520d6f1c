import { generationRunner, logitsRunner, logSoftmax, rowsOf, scoringRunner, tinyModel, tinyQwen3 } from './helpers';

const { dir, config } = tinyModel();
const prompts = [
  [5, 9, 11, 3],
  [7, 2],
];

test("sampled tokens' raw log-probs equal the scoring graph's teacher-forced log-probs", async () => {
  const generate = await generationRunner(dir, config, { temperature: 1, groupSize: 2 }, 'gen.onnx');
  const score = await scoringRunner(dir, config, { chunk: 20 }); // 48-token vocabulary in 3 chunks
  const out = await generate(prompts, { maxNew: 6, seed: 3 });
  const tokens = rowsOf(out.tokens);
  const raw = rowsOf(out.raw_logprobs);
  const seqs = tokens.map((t, r) => [...prompts[Math.floor(r / 2)], ...t]);
  const scored = rowsOf((await score(seqs)).logprobs);
  seqs.forEach((seq, r) => {
    const p = prompts[Math.floor(r / 2)].length;
    for (let t = 0; t < 6; t++) expect(scored[r][p - 1 + t]).toBeCloseTo(raw[r][t], 4);
    expect(scored[r][seq.length - 1]).toBe(0);
  });
});

test('entropies and min-p candidate sets match the logits computed independently', async () => {
  const score = await scoringRunner(dir, config, { chunk: 16, candidates: { minP: 0.05, k: 8 } });
  const logits = await logitsRunner(dir, config);
  const seqs = [[1, 2, 3, 4, 5], [9, 8, 7]];
  const out = await score(seqs);
  const ent = rowsOf(out.entropies);
  const [B, T, K] = out.candidate_ids.dims;
  expect([B, T, K]).toEqual([2, 5, 8]);
  for (let r = 0; r < 2; r++) {
    const teacher = await logits(seqs[r]);
    for (let t = 0; t < T; t++) {
      if (t >= seqs[r].length) {
        expect(ent[r][t]).toBe(0);
        continue;
      }
      const lsm = logSoftmax(teacher[t]);
      expect(ent[r][t]).toBeCloseTo(-lsm.reduce((s, l) => s + Math.exp(l) * l, 0), 4);
      const best = Math.max(...lsm);
      const expected = lsm
        .map((l, id) => ({ l, id }))
        .filter((c) => c.l >= best + Math.log(0.05))
        .sort((a, b) => b.l - a.l)
        .slice(0, K);
      const base = (r * T + t) * K;
      const ids = Array.from(out.candidate_ids.data.slice(base, base + K) as BigInt64Array, Number);
      const lps = Array.from(out.candidate_logprobs.data.slice(base, base + K) as Float32Array);
      expect(ids.slice(0, expected.length)).toEqual(expected.map((c) => c.id));
      expect(ids.slice(expected.length).every((i) => i === -1)).toBe(true);
      expected.forEach((c, i) => expect(lps[i]).toBeCloseTo(c.l, 4));
    }
  }
});

test('with GroupQueryAttention: the same log-probs and entropies as the composed attention', async () => {
  // GroupQueryAttention's rotary needs head_dim ≥ 16.
  const wide = tinyModel({ ...tinyQwen3, hidden_size: 64, head_dim: 16 }, 9);
  const composed = await scoringRunner(wide.dir, wide.config, { chunk: 20 });
  const gqa = await scoringRunner(wide.dir, wide.config, { chunk: 20, groupQueryAttention: true });
  const seqs = [[1, 2, 3, 4, 5, 6, 7], [9, 8, 7], [40]];
  const a = await composed(seqs);
  const b = await gqa(seqs);
  for (const name of ['logprobs', 'entropies']) {
    const x = Array.from(a[name].data as Float32Array);
    const y = Array.from(b[name].data as Float32Array);
    expect(x.some((v) => Math.abs(v) > 0.1)).toBe(true);
    x.forEach((v, i) => expect(y[i]).toBeCloseTo(v, 4));
  }
});
