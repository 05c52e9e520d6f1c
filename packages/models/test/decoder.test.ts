/**
 * Decoder behaviour on CPU with tiny random models. Parity with transformers itself is checked on
 * the GPU machine (tools/reference/models); here: invariances the model must have whatever its
 * weights — padding, packing and KV caching never change a sequence's logits.
 */
import { logitsRunner, tinyLlama, tinyModel, tinyQwen2, tinyQwen3, weightFeeds } from './tiny';
import * as L from '@lathe/onnx';
import {
  chunkedTargetLogprobs,
  decoder,
  lmLogits,
  paddedCausalMask,
  positionsFromPadding,
  targetLogprobs,
  weightInputs,
  type HfConfig,
} from '@lathe/models';
import { compile } from '../../../tools/testing/ort-cpu';


function rowLogits(logits: { data: ArrayLike<number | bigint>; dims: number[] }, row: number, from: number, to: number): number[] {
  const [, T, V] = logits.dims;
  const out: number[] = [];
  for (let t = from; t < to; t++) for (let v = 0; v < V; v++) out.push(Number(logits.data[(row * T + t) * V + v]));
  return out;
}

function expectClose(a: number[], b: number[], tol: number): void {
  expect(a.length).toBe(b.length);
  let worst = 0;
  for (let i = 0; i < a.length; i++) worst = Math.max(worst, Math.abs(a[i] - b[i]));
  expect(worst).toBeLessThan(tol);
}

describe.each([
  ['Qwen3 (QK-norm, tied)', tinyQwen3],
  ['Qwen2 (q/k/v biases)', tinyQwen2],
  ['Llama (llama3 RoPE scaling)', tinyLlama],
] as [string, HfConfig][])('%s', (_name, hf) => {
  const { dir, config } = tinyModel(hf);

  test('left padding does not change a sequence’s logits', async () => {
    const run = await logitsRunner(dir, config, 'padding');
    const seq = [3, 14, 15, 9, 2];
    const alone = await run({ input_ids: [seq], attention_mask: [[1, 1, 1, 1, 1]] });
    const padded = await run({ input_ids: [[0, 0, ...seq], [7, 1, 8, 2, 8, 1, 8]], attention_mask: [[0, 0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1]] });
    expect(padded.dims).toEqual([2, 7, config.vocabSize]);
    expectClose(rowLogits(padded, 0, 2, 7), rowLogits(alone, 0, 0, 5), 1e-4);
  });

  test('packed sequences equal separate sequences', async () => {
    const packed = await logitsRunner(dir, config, 'packed');
    const a = [5, 6, 7];
    const b = [9, 10, 11, 12];
    const one = await packed({ input_ids: [[...a, ...b, 0]], segment_ids: [[1, 1, 1, 2, 2, 2, 2, 0]], position_ids: [[0, 1, 2, 0, 1, 2, 3, 0]] });
    const sepA = await packed({ input_ids: [a], segment_ids: [[1, 1, 1]], position_ids: [[0, 1, 2]] });
    const sepB = await packed({ input_ids: [b], segment_ids: [[1, 1, 1, 1]], position_ids: [[0, 1, 2, 3]] });
    expectClose(rowLogits(one, 0, 0, 3), rowLogits(sepA, 0, 0, 3), 1e-4);
    expectClose(rowLogits(one, 0, 3, 7), rowLogits(sepB, 0, 0, 4), 1e-4);
  });
});

test.each([
  ['Qwen3', tinyQwen3],
  ['Qwen2 (q/k/v biases)', tinyQwen2],
] as [string, HfConfig][])('the %s scoring graph has no run-time shape arithmetic (nothing for ORT to put on the CPU)', (_name, hf) => {
  const { config } = tinyModel(hf);
  const g = new L.Graph();
  const ids = g.input('input_ids', 'int64', ['B', 'T']);
  const mask = g.input('attention_mask', 'int64', ['B', 'T']);
  const { weights } = weightInputs(g, config, 'float32', 'bfloat16');
  const { hidden } = decoder(config, weights, { inputIds: ids, positionIds: positionsFromPadding(mask), attentionMask: paddedCausalMask(mask) });
  g.output(targetLogprobs(lmLogits(config, weights, hidden), ids), 'logprobs');
  expect(L.runtimeShapeNodes(g).map((n) => n.name)).toEqual([]);
});

test('chunked log-probs equal log-softmax of the full logits', async () => {
  const { config } = tinyModel(tinyQwen3, 9);
  const g = new L.Graph();
  const ids = g.input('input_ids', 'int64', ['B', 'T']);
  const mask = g.input('attention_mask', 'int64', ['B', 'T']);
  const { weights } = weightInputs(g, config, 'float32', 'float32');
  const { hidden } = decoder(config, weights, { inputIds: ids, positionIds: positionsFromPadding(mask), attentionMask: paddedCausalMask(mask) });
  g.output(targetLogprobs(lmLogits(config, weights, hidden), ids, 0.7), 'full');
  g.output(chunkedTargetLogprobs(config, weights, hidden, ids, { chunk: 24, temperature: 0.7 }), 'chunked'); // 64 = 24 + 24 + 16
  expect(L.runtimeShapeNodes(g)).toEqual([]);
  const { dir } = tinyModel(tinyQwen3, 9);
  const feeds = weightFeeds(dir, config, 'float32');
  const run = await compile(g);
  const out = await run({ ...feeds, input_ids: { data: BigInt64Array.from([1n, 5n, 9n, 33n, 2n, 7n]), dims: [2, 3] }, attention_mask: { data: BigInt64Array.from([1n, 1n, 1n, 0n, 1n, 1n]), dims: [2, 3] } });
  const a = Array.from(out.full.data as Float32Array);
  const b = Array.from(out.chunked.data as Float32Array);
  expect(Math.max(...a.map((v, i) => Math.abs(v - b[i])))).toBeLessThan(1e-5);
});

test('in bf16 the residual stream is float32 while the layers compute in bf16', () => {
  const { config } = tinyModel(tinyQwen3);
  const g = new L.Graph();
  const ids = g.input('input_ids', 'int64', ['B', 'T']);
  const mask = g.input('attention_mask', 'int64', ['B', 'T']);
  const { weights } = weightInputs(g, config, 'float32', 'bfloat16');
  const { hidden } = decoder(config, weights, { inputIds: ids, positionIds: positionsFromPadding(mask), attentionMask: paddedCausalMask(mask) });
  expect(hidden.dtype).toBe('bfloat16');
  // The two adds per layer outside its attn/ and mlp/ scopes are the residual adds.
  const residualAdds = g.nodes.filter((n) => /^layer\d+\/Add_\d+$/.test(n.name));
  expect(residualAdds).toHaveLength(2 * config.numLayers);
  for (const n of residualAdds) expect(n.inputs.map((t) => t!.dtype)).toEqual(['float32', 'float32']);
  const matmuls = g.nodes.filter((n) => n.op.name === 'MatMul');
  expect(matmuls.length).toBeGreaterThan(0);
  for (const n of matmuls) expect(n.outputs[0]!.dtype).toBe('bfloat16');
});
