import { generationRunner, logitsRunner, logSoftmax, rowsOf, tinyModel, tinyQwen3 } from './helpers';

const { dir, config } = tinyModel();
const prompts = [
  [5, 9, 11, 3],
  [7, 2],
  [30, 31, 32, 33, 34, 35],
];

test('greedy generation equals step-by-step argmax under teacher forcing, raw log-probs included', async () => {
  const generate = await generationRunner(dir, config, { temperature: 0 }, 'greedy.onnx');
  const logits = await logitsRunner(dir, config);
  const out = await generate(prompts, { maxNew: 7 });
  const tokens = rowsOf(out.tokens);
  const raw = rowsOf(out.raw_logprobs);
  expect(out.tokens.dims).toEqual([3, 7]);
  for (let r = 0; r < prompts.length; r++) {
    const seq = [...prompts[r], ...tokens[r]];
    const teacher = await logits(seq);
    for (let t = 0; t < 7; t++) {
      const row = teacher[prompts[r].length - 1 + t];
      const argmax = row.indexOf(Math.max(...row));
      expect(tokens[r][t]).toBe(argmax);
      expect(raw[r][t]).toBeCloseTo(logSoftmax(row)[argmax], 4);
    }
  }
  expect(Array.from(out.lengths.data, Number)).toEqual([7, 7, 7]);
  expect(Array.from(out.stopped.data, Boolean)).toEqual([false, false, false]);
});

test('sampled tokens carry the log-probs the teacher-forced model assigns them (temperature 0.7, top-k 20)', async () => {
  const T = 0.7;
  const generate = await generationRunner(dir, config, { temperature: T, topK: 20 }, 'sample.onnx');
  const logits = await logitsRunner(dir, config);
  const out = await generate(prompts, { maxNew: 6, seed: 11 });
  const tokens = rowsOf(out.tokens);
  const lp = rowsOf(out.logprobs);
  const raw = rowsOf(out.raw_logprobs);
  for (let r = 0; r < prompts.length; r++) {
    const teacher = await logits([...prompts[r], ...tokens[r]]);
    for (let t = 0; t < 6; t++) {
      const row = teacher[prompts[r].length - 1 + t];
      const tok = tokens[r][t];
      // Under the sampling distribution: temperature, then renormalised over the 20 best tokens.
      const scaled = row.map((x) => x / T);
      const kth = [...scaled].sort((a, b) => b - a)[19];
      const kept = scaled.map((x) => (x >= kth ? x : -Infinity));
      expect(kept[tok]).toBeGreaterThan(-Infinity);
      expect(lp[r][t]).toBeCloseTo(logSoftmax(kept)[tok], 4);
      expect(raw[r][t]).toBeCloseTo(logSoftmax(row)[tok], 4);
    }
  }
});

test('rows stop at a stop token: pad after it, zero log-probs, lengths and stop flags, early loop exit', async () => {
  const generate = await generationRunner(dir, config, { temperature: 0, padTokenId: 47 }, 'stop.onnx');
  const free = rowsOf((await generate(prompts, { maxNew: 8 })).tokens);
  // Stop on row 0's third token and row 1's first; row 2 runs to the limit unless it meets either.
  const stop = [free[0][2], free[1][0]];
  const firstStop = (row: number[]) => row.findIndex((t) => stop.includes(t));
  const out = await generate(prompts, { maxNew: 8, stop });
  const tokens = rowsOf(out.tokens);
  const lp = rowsOf(out.raw_logprobs);
  const lengths = Array.from(out.lengths.data, Number);
  const stopped = Array.from(out.stopped.data, Boolean);
  for (let r = 0; r < 3; r++) {
    const end = firstStop(free[r]);
    const len = end < 0 ? 8 : end + 1;
    expect(lengths[r]).toBe(len);
    expect(stopped[r]).toBe(end >= 0);
    expect(tokens[r].slice(0, len)).toEqual(free[r].slice(0, len));
    expect(tokens[r].slice(len).every((t) => t === 47)).toBe(true);
    expect(lp[r].slice(len).every((x) => x === 0)).toBe(true);
    expect(lp[r].slice(0, len).every((x) => x < 0)).toBe(true);
  }
  // When every row stops, the loop ends early: the outputs are as long as the longest row.
  const two = await generate(prompts.slice(0, 2), { maxNew: 8, stop });
  expect(two.tokens.dims).toEqual([2, 3]);
});

test('same seed → same samples; another seed → different; a sample depends on its key, not its batch position', async () => {
  const generate = await generationRunner(dir, config, { temperature: 1 }, 'seeded.onnx');
  const a = rowsOf((await generate(prompts, { maxNew: 10, seed: 5 })).tokens);
  const b = rowsOf((await generate(prompts, { maxNew: 10, seed: 5 })).tokens);
  const c = rowsOf((await generate(prompts, { maxNew: 10, seed: 6 })).tokens);
  expect(b).toEqual(a);
  expect(c).not.toEqual(a);
  const alone = rowsOf((await generate([prompts[2]], { maxNew: 10, seed: 5, keys: [2] })).tokens);
  expect(alone[0]).toEqual(a[2]);
});

test('a group of n samples per prompt equals n separate generations keyed r·n + j (one shared prefill)', async () => {
  const n = 3;
  const grouped = await generationRunner(dir, config, { temperature: 1, topP: 0.9, groupSize: n }, 'group.onnx');
  const single = await generationRunner(dir, config, { temperature: 1, topP: 0.9 }, 'single.onnx');
  const out = await grouped(prompts, { maxNew: 5, seed: 9 });
  expect(out.tokens.dims).toEqual([prompts.length * n, 5]);
  const tokens = rowsOf(out.tokens);
  const lp = rowsOf(out.logprobs);
  for (let r = 0; r < prompts.length; r++) {
    const each = await single(Array(n).fill(prompts[r]), { maxNew: 5, seed: 9, keys: [...Array(n).keys()].map((j) => r * n + j) });
    expect(tokens.slice(r * n, r * n + n)).toEqual(rowsOf(each.tokens));
    rowsOf(each.logprobs).forEach((row, j) => row.forEach((x, t) => expect(lp[r * n + j][t]).toBeCloseTo(x, 5)));
  }
  // The group's samples differ from each other.
  expect(new Set(tokens.slice(0, n).map((t) => t.join(','))).size).toBeGreaterThan(1);
});

test("ONNX Runtime's fused RMSNorm/RoPE kernels give the primitives' results (Qwen3, and Llama with llama3 RoPE scaling)", async () => {
  const llama = tinyModel(
    {
      ...tinyQwen3,
      architectures: ['LlamaForCausalLM'],
      tie_word_embeddings: false,
      rope_scaling: { rope_type: 'llama3', factor: 8, low_freq_factor: 1, high_freq_factor: 4, original_max_position_embeddings: 16 },
    },
    5,
  );
  for (const m of [{ dir, config }, llama]) {
    const fused = await generationRunner(m.dir, m.config, { temperature: 1, fusedKernels: true }, 'fused.onnx');
    const plain = await generationRunner(m.dir, m.config, { temperature: 1, fusedKernels: false }, 'plain.onnx');
    const a = await fused(prompts, { maxNew: 8, seed: 4 });
    const b = await plain(prompts, { maxNew: 8, seed: 4 });
    expect(rowsOf(a.tokens)).toEqual(rowsOf(b.tokens));
    rowsOf(a.raw_logprobs).forEach((row, r) => row.forEach((x, t) => expect(x).toBeCloseTo(rowsOf(b.raw_logprobs)[r][t], 5)));
  }
});
