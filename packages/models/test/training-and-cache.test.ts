/**
 * Whole-model gradients against finite differences (float64, weights as graph inputs), and a KV
 * cache decode step against the full forward pass.
 */
import * as L from '@lathe/onnx';
import {
  decoder,
  lmLogits,
  paddedCausalMask,
  positionsFromPadding,
  weightInputs,
} from '@lathe/models';
import { compile, type HostTensor } from '../../../tools/testing/ort-cpu';
import { tinyModel, tinyQwen3, weightFeeds } from './tiny';


const ids = (rows: number[][]): HostTensor => ({ data: BigInt64Array.from(rows.flat().map(BigInt)), dims: [rows.length, rows[0].length] });

test('whole-model gradients match finite differences', async () => {
  const { dir, config } = tinyModel({ ...tinyQwen3, num_hidden_layers: 1 }, 3);
  const g = new L.Graph();
  const inputIds = g.input('input_ids', 'int64', ['B', 'T']);
  const mask = g.input('attention_mask', 'int64', ['B', 'T']);
  const targets = g.input('targets', 'int64', ['B', 'T']);
  const { weights, inputs } = weightInputs(g, config, 'float64', 'float64');
  const { hidden } = decoder(config, weights, { inputIds, positionIds: positionsFromPadding(mask), attentionMask: paddedCausalMask(mask) });
  const loss = L.maskedMean(L.crossEntropy(lmLogits(config, weights, hidden), targets), mask);
  const checked = ['model.embed_tokens.weight', 'model.layers.0.self_attn.q_norm.weight', 'model.layers.0.self_attn.k_proj.weight', 'model.layers.0.mlp.down_proj.weight', 'model.norm.weight'];
  const grads = L.grad(loss, checked.map((n) => inputs.get(n)!));
  g.output(loss, 'loss');
  grads.forEach((t, i) => g.output(t, `grad${i}`));
  const run = await compile(g);
  const feeds: Record<string, HostTensor> = { ...weightFeeds(dir, config, 'float64'), input_ids: ids([[0, 3, 5, 7], [1, 2, 3, 4]]), attention_mask: ids([[0, 1, 1, 1], [1, 1, 1, 1]]), targets: ids([[0, 5, 7, 9], [2, 3, 4, 5]]) };
  const base = await run(feeds);
  const h = 1e-6;
  for (const [k, name] of checked.entries()) {
    const w = feeds[name].data as Float64Array;
    const analytic = base[`grad${k}`].data as Float64Array;
    // A spread of elements of each checked parameter.
    for (const j of [0, Math.floor(w.length / 3), w.length - 1]) {
      const orig = w[j];
      w[j] = orig + h;
      const lp = Number((await run(feeds)).loss.data[0]);
      w[j] = orig - h;
      const lm = Number((await run(feeds)).loss.data[0]);
      w[j] = orig;
      const numeric = (lp - lm) / (2 * h);
      expect(Math.abs(analytic[j] - numeric)).toBeLessThan(1e-7 + 1e-5 * Math.abs(numeric));
    }
  }
});

test('one decode step with the KV cache equals the full forward pass', async () => {
  const { dir, config } = tinyModel(tinyQwen3, 5);
  const build = (withPast: boolean) => {
    const g = new L.Graph();
    const inputIds = g.input('input_ids', 'int64', ['B', 'T']);
    const positionIds = g.input('position_ids', 'int64', ['B', 'T']);
    const keyMask = g.input('key_mask', 'int64', ['B', withPast ? 'S' : 'T']); // which keys exist
    const { weights } = weightInputs(g, config, 'float32', 'float32');
    const past = withPast
      ? Array.from({ length: config.numLayers }, (_, i) => ({
          key: g.input(`past_key_${i}`, 'float32', ['B', config.numKvHeads, 'P', config.headDim]),
          value: g.input(`past_value_${i}`, 'float32', ['B', config.numKvHeads, 'P', config.headDim]),
        }))
      : undefined;
    const mask = withPast
      ? L.unsqueeze(L.cast(keyMask, 'bool'), [1, 2]) // [B, 1, 1, S]: one query sees all keys
      : paddedCausalMask(keyMask);
    const { hidden, present } = decoder(config, weights, { inputIds, positionIds, attentionMask: mask, past });
    g.output(lmLogits(config, weights, hidden), 'logits');
    present.forEach((p, i) => {
      g.output(p.key, `present_key_${i}`);
      g.output(p.value, `present_value_${i}`);
    });
    return compile(g);
  };
  const w = weightFeeds(dir, config, 'float32');
  const seq = [4, 8, 15, 16, 23, 42];
  const full = await (await build(false))({ ...w, input_ids: ids([seq]), position_ids: ids([[0, 1, 2, 3, 4, 5]]), key_mask: ids([[1, 1, 1, 1, 1, 1]]) });
  const prefill = await (await build(false))({ ...w, input_ids: ids([seq.slice(0, 5)]), position_ids: ids([[0, 1, 2, 3, 4]]), key_mask: ids([[1, 1, 1, 1, 1]]) });
  const past: Record<string, HostTensor> = {};
  for (let i = 0; i < config.numLayers; i++) {
    past[`past_key_${i}`] = prefill[`present_key_${i}`];
    past[`past_value_${i}`] = prefill[`present_value_${i}`];
  }
  const step = await (await build(true))({ ...w, ...past, input_ids: ids([[42]]), position_ids: ids([[5]]), key_mask: ids([[1, 1, 1, 1, 1, 1]]) });
  const V = config.vocabSize;
  const last = Array.from(full.logits.data as Float32Array).slice(5 * V, 6 * V);
  const got = Array.from(step.logits.data as Float32Array);
  expect(step.present_key_0.dims).toEqual([1, config.numKvHeads, 6, config.headDim]);
  expect(Math.max(...got.map((v, i) => Math.abs(v - last[i])))).toBeLessThan(1e-4);
});
