/**
 * causalLmLogprobs, the one next-token log-prob builder, on the CPU in float32: its log-probs and
 * entropies against a float64 log-softmax of the same graph's full logits, with a temperature,
 * left padding and a static batch shape; and shiftLeft's two forms.
 */
import * as L from '@lathe/onnx';
import { causalLmLogprobs, decoder, lmLogits, paddedCausalMask, positionsFromPadding, shiftLeft, weightInputs } from '@lathe/models';
import { compile, type HostTensor } from '../../../tools/testing/ort-cpu';
import { tinyModel, tinyQwen3, weightFeeds } from './tiny';

const ids64 = (rows: number[][]): HostTensor => ({ data: BigInt64Array.from(rows.flat().map(BigInt)), dims: [rows.length, rows[0].length] });

test.each([
  ['symbolic shape', undefined],
  ['static shape', [2, 6] as [number, number]],
])('log-probs and entropies match a float64 log-softmax of the full logits (%s, temperature 0.7)', async (_label, shape) => {
  const { dir, config } = tinyModel(tinyQwen3, 4);
  const T = 0.7;
  const g = new L.Graph('logprobs');
  const dims = shape ?? ['B', 'T'];
  const ids = g.input('input_ids', 'int64', dims);
  const mask = g.input('attention_mask', 'int64', dims);
  const { weights } = weightInputs(g, config, 'float32', 'float32');
  const out = causalLmLogprobs(config, weights, ids, mask, { temperature: T, entropy: true, chunk: 24 });
  g.output(out.logp, 'logp');
  g.output(out.entropy, 'entropy');
  const ref = decoder(config, weights, { inputIds: ids, positionIds: positionsFromPadding(mask), attentionMask: paddedCausalMask(mask) });
  g.output(lmLogits(config, weights, ref.hidden), 'logits');
  const rows = [
    [0, 0, 5, 9, 13, 2],
    [7, 1, 60, 33, 8, 21],
  ];
  const masks = [
    [0, 0, 1, 1, 1, 1],
    [1, 1, 1, 1, 1, 1],
  ];
  const res = await (await compile(g))({ ...weightFeeds(dir, config, 'float32'), input_ids: ids64(rows), attention_mask: ids64(masks) });
  const V = config.vocabSize;
  const logits = res.logits.data as Float32Array;
  for (let b = 0; b < 2; b++) {
    for (let t = 0; t < 5; t++) {
      if (!masks[b][t]) continue;
      const z = Array.from(logits.subarray((b * 6 + t) * V, (b * 6 + t + 1) * V), (x) => x / T);
      const max = Math.max(...z);
      const logZ = max + Math.log(z.reduce((s, x) => s + Math.exp(x - max), 0));
      const entropy = -z.reduce((s, x) => s + Math.exp(x - logZ) * (x - logZ), 0);
      expect((res.logp.data as Float32Array)[b * 6 + t]).toBeCloseTo(z[rows[b][t + 1]] - logZ, 4);
      expect((res.entropy.data as Float32Array)[b * 6 + t]).toBeCloseTo(entropy, 4);
    }
  }
});

test('shiftLeft: a Gather for a static width, a Concat for a symbolic one, the same values', async () => {
  const g = new L.Graph('shift');
  const a = g.input('a', 'int64', [2, 4]);
  const b = g.input('b', 'int64', ['B', 'T']);
  const sa = shiftLeft(a);
  const sb = shiftLeft(b);
  expect(sa.node?.op.name).toBe('Gather');
  expect(sb.node?.op.name).toBe('Concat');
  g.output(sa, 'sa');
  g.output(sb, 'sb');
  const x = ids64([
    [1, 2, 3, 4],
    [5, 6, 7, 8],
  ]);
  const res = await (await compile(g))({ a: x, b: x });
  expect(Array.from(res.sa.data as BigInt64Array, Number)).toEqual([2, 3, 4, 1, 6, 7, 8, 5]);
  expect(res.sb.data).toEqual(res.sa.data);
});
