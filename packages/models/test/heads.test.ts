/**
 * The heads on top of the decoder, on CPU in float32 with tiny random models: the value heads
 * (per token for critics, at the last non-pad token for reward models), the restricted-vocabulary
 * head, and reward-model checkpoints (transformers' …ForSequenceClassification with `score.weight`).
 * Expected values are computed here in float64 from the graph's own hidden states and logits.
 */
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { basename, join } from 'node:path';
import * as L from '@lathe/onnx';
import {
  chunkedLogprobsAndEntropy,
  decoder,
  lmHeadName,
  lmLogits,
  paddedCausalMask,
  paramSpecs,
  parseConfig,
  positionsFromPadding,
  randomModel,
  readConfig,
  readTensorBytes,
  readWeightIndex,
  restrictedLogits,
  restrictedLogprobs,
  saveHfModel,
  valueAtLastToken,
  valuePerToken,
  weightInitializers,
  weightInputs,
  type HfConfig,
} from '@lathe/models';
import { compile, rng, type HostTensor } from '../../../tools/testing/ort-cpu';
import { tinyModel, tinyQwen2, tinyQwen3, weightFeeds } from './tiny';
import { gradCheck } from '../../onnx/test/gradcheck';

const ids64 = (rows: number[][]): HostTensor => ({ data: BigInt64Array.from(rows.flat().map(BigInt)), dims: [rows.length, rows[0].length] });
const maxAbsDiff = (a: ArrayLike<number>, b: ArrayLike<number>) => {
  expect(a.length).toBe(b.length);
  let worst = 0;
  for (let i = 0; i < a.length; i++) worst = Math.max(worst, Math.abs(a[i] - b[i]));
  return worst;
};

describe('heads on a tiny Qwen3', () => {
  const START = 10;
  const COUNT = 7;
  const { dir, config } = tinyModel(tinyQwen3, 5);
  const D = config.hiddenSize;
  const V = config.vocabSize;
  const next = rng(11);
  const valueWeight = Float32Array.from({ length: D }, () => next() - 0.5);
  const valueBias = 0.25;

  // One graph with every head; weights fed from the model's float32 file.
  const graph = () => {
    const g = new L.Graph('heads');
    const ids = g.input('input_ids', 'int64', ['B', 'T']);
    const mask = g.input('attention_mask', 'int64', ['B', 'T']);
    const vw = g.input('value.weight', 'float32', [1, D]);
    const vb = g.input('value.bias', 'float32', [1]);
    const { weights } = weightInputs(g, config, 'float32', 'float32');
    const { hidden } = decoder(config, weights, { inputIds: ids, positionIds: positionsFromPadding(mask), attentionMask: paddedCausalMask(mask) });
    g.output(hidden, 'hidden');
    g.output(lmLogits(config, weights, hidden), 'logits');
    g.output(restrictedLogits(config, weights, hidden, START, COUNT), 'restricted');
    g.output(restrictedLogprobs(config, weights, hidden, START, COUNT), 'restricted_logprobs');
    g.output(valuePerToken(hidden, vw, vb), 'value_per_token');
    g.output(valueAtLastToken(hidden, mask, vw, vb), 'value_last');
    return g;
  };
  const run = async (rows: number[][], masks: number[][]) => {
    const exec = await compile(graph());
    const out = await exec({
      ...weightFeeds(dir, config, 'float32'),
      'value.weight': { data: valueWeight, dims: [1, D] },
      'value.bias': { data: Float32Array.from([valueBias]), dims: [1] },
      input_ids: ids64(rows),
      attention_mask: ids64(masks),
    });
    return Object.fromEntries(Object.entries(out).map(([k, v]) => [k, Array.from(v.data as Float32Array)])) as Record<string, number[]>;
  };

  // The same 5 tokens alone, left-padded by 2 and right-padded by 2 (rows of 7).
  const seq = [3, 14, 15, 9, 2];
  const rows = [
    [0, 0, ...seq],
    [...seq, 0, 0],
    [7, 1, 8, 2, 8, 1, 8],
  ];
  const masks = [
    [0, 0, 1, 1, 1, 1, 1],
    [1, 1, 1, 1, 1, 0, 0],
    [1, 1, 1, 1, 1, 1, 1],
  ];
  const lastToken = [6, 4, 6]; // the last index whose mask is 1, by hand
  const T = 7;

  test('the per-token value is hidden · w + b at every position', async () => {
    const out = await run(rows, masks);
    const expected: number[] = [];
    for (let p = 0; p < rows.length * T; p++) {
      let v = valueBias;
      for (let d = 0; d < D; d++) v += out.hidden[p * D + d] * valueWeight[d];
      expected.push(v);
    }
    expect(maxAbsDiff(out.value_per_token, expected)).toBeLessThan(1e-5);
  });

  test('the value at the last non-pad token equals the per-token value there, whatever the padding side', async () => {
    const out = await run(rows, masks);
    expect(out.value_last).toHaveLength(3);
    lastToken.forEach((t, b) => expect(out.value_last[b]).toBe(out.value_per_token[b * T + t]));
    const alone = await run([seq], [[1, 1, 1, 1, 1]]);
    expect(Math.abs(out.value_last[0] - alone.value_last[0])).toBeLessThan(1e-5);
    expect(Math.abs(out.value_last[1] - alone.value_last[0])).toBeLessThan(1e-5);
    // Not trivially equal: the value does depend on the tokens.
    expect(Math.abs(out.value_last[2] - alone.value_last[0])).toBeGreaterThan(1e-3);
  });

  test('the value at the last token puts nothing on the CPU: no run-time shape arithmetic, no op without a CUDA kernel (bf16)', () => {
    const g = new L.Graph('value_last');
    const hidden = g.input('hidden', 'bfloat16', ['B', 'T', D]);
    const mask = g.input('attention_mask', 'int64', ['B', 'T']);
    const value = valueAtLastToken(hidden, mask, g.input('score.weight', 'bfloat16', [1, D]));
    g.output(value, 'value_last');
    expect(value.dtype).toBe('float32');
    expect([...L.runtimeShapeNodes(g), ...L.noCudaKernelNodes(g)].map((n) => n.op.name)).toEqual([]);
  });

  test('the restricted head is the full LM logits sliced to the id range, renormalised over it', async () => {
    const out = await run(rows, masks);
    const positions = rows.length * T;
    const slice: number[] = [];
    for (let p = 0; p < positions; p++) for (let k = 0; k < COUNT; k++) slice.push(out.logits[p * V + START + k]);
    expect(out.restricted).toHaveLength(positions * COUNT);
    expect(maxAbsDiff(out.restricted, slice)).toBeLessThan(1e-5);
    // log-softmax over the range alone, in float64: slice − log Σ_range exp(slice).
    const expected: number[] = [];
    for (let p = 0; p < positions; p++) {
      const row = slice.slice(p * COUNT, (p + 1) * COUNT);
      const m = Math.max(...row);
      const logZ = m + Math.log(row.reduce((s, x) => s + Math.exp(x - m), 0));
      expected.push(...row.map((x) => x - logZ));
      const total = out.restricted_logprobs.slice(p * COUNT, (p + 1) * COUNT).reduce((s, x) => s + Math.exp(x), 0);
      expect(Math.abs(total - 1)).toBeLessThan(1e-5);
    }
    expect(maxAbsDiff(out.restricted_logprobs, expected)).toBeLessThan(1e-5);
  });

  test('a range outside the vocabulary is refused', () => {
    const g = new L.Graph();
    const { weights } = weightInputs(g, config, 'float32', 'float32');
    const hidden = g.input('h', 'float32', ['B', 'T', D]);
    expect(() => restrictedLogits(config, weights, hidden, V - 3, 4)).toThrow(`restricted head: ids [${V - 3}, ${V + 1}) fall outside the vocabulary of ${V}`);
  });
});

describe('reward models (…ForSequenceClassification, score.weight)', () => {
  const rewardQwen2: HfConfig = { ...tinyQwen2, architectures: ['Qwen2ForSequenceClassification'], id2label: { '0': 'LABEL_0' }, pad_token_id: 0 };

  test('config.json of a sequence classifier parses: a score head of num_labels rows and no LM head', () => {
    const c = parseConfig(rewardQwen2);
    expect(c).toMatchObject({ architecture: 'Qwen2ForSequenceClassification', scoreLabels: 1, attentionBias: true, padTokenId: 0 });
    const names = paramSpecs(c).map((s) => s.name);
    expect(paramSpecs(c).find((s) => s.name === 'score.weight')?.shape).toEqual([1, 32]);
    expect(names).not.toContain('lm_head.weight');
    expect(() => lmHeadName(c)).toThrow(/Qwen2ForSequenceClassification has a 'score' head \(1 outputs\) and no LM head/);
    // transformers' PretrainedConfig: num_labels when given that way, else 2 labels.
    const { id2label: _l, ...noLabels } = rewardQwen2;
    expect(parseConfig({ ...noLabels, num_labels: 3 }).scoreLabels).toBe(3);
    expect(parseConfig(noLabels).scoreLabels).toBe(2);
    expect(parseConfig({ ...tinyQwen3, architectures: ['Qwen3ForSequenceClassification'] })).toMatchObject({ qkNorm: true, scoreLabels: 2 });
  });

  test('score.weight saves and loads back byte-identical, with a config transformers reads as a classifier', () => {
    const src = mkdtempSync(join(tmpdir(), 'lathe-reward-'));
    const config = randomModel(src, rewardQwen2, { seed: 4, std: 0.2 });
    const index = readWeightIndex(src);
    const tensors = paramSpecs(config).map((s) => ({ name: s.name, dtype: index.get(s.name)!.dtype, shape: s.shape, data: readTensorBytes(index.get(s.name)!) }));
    const out = mkdtempSync(join(tmpdir(), 'lathe-reward-save-'));
    saveHfModel(out, config, tensors);
    const back = readWeightIndex(out);
    expect([...back.keys()].sort()).toEqual(tensors.map((t) => t.name).sort());
    for (const t of tensors) expect(Buffer.compare(Buffer.from(readTensorBytes(back.get(t.name)!)), Buffer.from(t.data))).toBe(0);
    const json = JSON.parse(readFileSync(join(out, 'config.json'), 'utf8')) as HfConfig;
    expect(json).toMatchObject({ architectures: ['Qwen2ForSequenceClassification'], model_type: 'qwen2', id2label: { '0': 'LABEL_0' }, label2id: { LABEL_0: 0 }, pad_token_id: 0 });
    expect(readConfig(out).config).toEqual({ ...config, torchDtype: 'float32' });
  });

  test('the reward is hidden[last token] · score.weight, read from the file', async () => {
    const src = mkdtempSync(join(tmpdir(), 'lathe-reward-run-'));
    const config = randomModel(src, rewardQwen2, { seed: 8, std: 0.2 });
    const D = config.hiddenSize;
    const g = new L.Graph('reward');
    const ids = g.input('input_ids', 'int64', ['B', 'T']);
    const mask = g.input('attention_mask', 'int64', ['B', 'T']);
    const w = weightInitializers(g, config, readWeightIndex(src), 'float32', (f) => basename(f));
    const { hidden } = decoder(config, w, { inputIds: ids, positionIds: positionsFromPadding(mask), attentionMask: paddedCausalMask(mask) });
    g.output(hidden, 'hidden');
    g.output(valueAtLastToken(hidden, mask, w('score.weight')), 'reward');
    const path = join(src, 'reward.onnx');
    writeFileSync(path, L.toModelBytes(g));
    const exec = await compile(g, path);
    const out = await exec({ input_ids: ids64([[0, 5, 6, 7], [8, 9, 0, 0]]), attention_mask: ids64([[0, 1, 1, 1], [1, 1, 0, 0]]) });
    const h = out.hidden.data as Float32Array;
    const scoreBytes = readTensorBytes(readWeightIndex(src).get('score.weight')!);
    const score = new Float32Array(scoreBytes.buffer, scoreBytes.byteOffset, D);
    const expected = [3, 5].map((flat) => score.reduce((s, x, d) => s + x * h[flat * D + d], 0)); // rows' last tokens: (0, 3) and (1, 1)
    expect(maxAbsDiff(out.reward.data as Float32Array, expected)).toBeLessThan(1e-5);
  });
});

describe('chunkedLogprobsAndEntropy: one pass over each vocabulary chunk', () => {
  const V = 10;
  const D = 8;
  // Only vocabSize and the LM head's name are read; the head is an input here.
  const { config } = tinyModel(tinyQwen3, 2);
  const cfg = { ...config, vocabSize: V };
  const targets = [[3, 9, 0], [7, 7, 4]];
  const build = (hidden: L.Tensor, head: L.Tensor, opts: { chunk: number; temperature: number; recompute?: boolean }) => {
    const g = hidden.graph;
    const ids = g.constant(targets.flat(), 'int64', [2, 3]);
    return chunkedLogprobsAndEntropy(cfg, (name) => (name === lmHeadName(cfg) ? head : hidden), hidden, ids, opts);
  };

  test.each([
    [{ chunk: 4, temperature: 0.7 }], // 10 = 4 + 4 + 2
    [{ chunk: 16, temperature: 1 }], // one chunk
    [{ chunk: 3, temperature: 1.3, recompute: true }],
  ])('equal the full softmax in float64 (%j)', async (opts) => {
    const g = new L.Graph();
    const hidden = g.input('hidden', 'float64', [2, 3, D]);
    const head = g.input('head', 'float64', [V, D]);
    const { logp, entropy } = build(hidden, head, opts);
    g.output(logp, 'logp');
    g.output(entropy, 'entropy');
    const r = rng(4);
    const h = Float64Array.from({ length: 2 * 3 * D }, () => 3 * (r() - 0.5));
    const w = Float64Array.from({ length: V * D }, () => 3 * (r() - 0.5));
    const out = await (await compile(g))({ hidden: { data: h, dims: [2, 3, D] }, head: { data: w, dims: [V, D] } });
    for (let row = 0; row < 6; row++) {
      const logits = Array.from({ length: V }, (_, v) => {
        let s = 0;
        for (let d = 0; d < D; d++) s += h[row * D + d] * w[v * D + d];
        return s / opts.temperature;
      });
      const m = Math.max(...logits);
      const logZ = m + Math.log(logits.reduce((s, l) => s + Math.exp(l - m), 0));
      const wantLogp = logits[targets.flat()[row]] - logZ;
      const wantEntropy = -logits.reduce((s, l) => s + Math.exp(l - logZ) * (l - logZ), 0);
      // Not 1e-12: ONNX Runtime folds the division by the temperature into the LM-head MatMul as
      // a float32 `alpha` (1/0.7 to ~3e-8 relative, on logits up to ~25 here); at temperature 1
      // the match is to ~1e-15.
      const tol = opts.temperature === 1 ? 1e-12 : 1e-6;
      expect(Math.abs(Number(out.logp.data[row]) - wantLogp)).toBeLessThan(tol);
      expect(Math.abs(Number(out.entropy.data[row]) - wantEntropy)).toBeLessThan(tol);
    }
  });

  test.each([
    [{ chunk: 4, temperature: 0.7 }],
    [{ chunk: 4, temperature: 1, recompute: true }],
  ])('gradients match finite differences (%j)', async (opts) => {
    const result = await gradCheck({
      name: `logprobs and entropy ${JSON.stringify(opts)}`,
      inputs: [{ shape: [2, 3, D] }, { shape: [V, D] }],
      build: ([hidden, head]) => {
        const { logp, entropy } = build(hidden, head, opts);
        return L.concat([logp, entropy], 1);
      },
    });
    expect(result.worst).toBeLessThanOrEqual(1);
  });
});
