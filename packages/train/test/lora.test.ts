import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import * as L from '@lathe/onnx';
import { decoder, lmLogits, paddedCausalMask, paramSpecs, positionsFromPadding, randomModel, type Weights } from '@lathe/models';
import { initLora, loadFloat32, loraAdapters, loraWeights, mergeLora } from '@lathe/train';
import { compile, rng, type HostTensor } from '../../../tools/testing/ort-cpu';

const tiny = {
  architectures: ['Qwen2ForCausalLM'],
  vocab_size: 40,
  hidden_size: 16,
  intermediate_size: 24,
  num_hidden_layers: 2,
  num_attention_heads: 2,
  num_key_value_heads: 1,
  head_dim: 8,
  rms_norm_eps: 1e-6,
  rope_theta: 10000,
  max_position_embeddings: 64,
  tie_word_embeddings: false,
};

test('in-graph LoRA (base + scale·B·A) gives the logits of the host-merged weights', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'lathe-lora-'));
  const config = randomModel(dir, tiny, { seed: 5, std: 0.3 });
  const lora = { rank: 3, alpha: 6, targets: 'self_attn\\.(q|v)_proj|down_proj' };
  const adapters = loraAdapters(config, lora);
  expect(adapters.map((a) => a.target)).toHaveLength(6);
  const values = initLora(adapters, 1);
  // B starts at zero (training starts from the base); make it non-zero to test the merge.
  const r = rng(2);
  for (const a of adapters) values.set(a.b.name, Float32Array.from(values.get(a.b.name)!, () => r() - 0.5));
  const base = loadFloat32(dir, config);
  const merged = mergeLora(base, values, adapters, lora);

  const run = async (weights: (g: L.Graph) => Weights) => {
    const g = new L.Graph();
    const ids = g.input('input_ids', 'int64', ['B', 'T']);
    const mask = g.input('attention_mask', 'int64', ['B', 'T']);
    const w = weights(g);
    const { hidden } = decoder(config, w, { inputIds: ids, positionIds: positionsFromPadding(mask), attentionMask: paddedCausalMask(mask) });
    g.output(lmLogits(config, w, hidden), 'logits');
    const feeds: Record<string, HostTensor> = {
      input_ids: { data: BigInt64Array.from([3n, 9n, 27n, 1n, 0n, 5n, 6n, 7n]), dims: [2, 4] },
      attention_mask: { data: BigInt64Array.from([1n, 1n, 1n, 1n, 0n, 1n, 1n, 1n]), dims: [2, 4] },
    };
    for (const t of g.inputs) if (!feeds[t.name]) feeds[t.name] = { data: (t.name.startsWith('base/') ? base.get(t.name.slice(5)) : values.get(t.name) ?? merged.get(t.name))!, dims: t.shape as number[] };
    return (await (await compile(g))(feeds)).logits.data as Float32Array;
  };
  const specs = paramSpecs(config);
  const viaLora = await run((g) => {
    const b = new Map(specs.map((s) => [s.name, g.input(`base/${s.name}`, 'float32', s.shape)]));
    const trainable = new Map(adapters.flatMap((a) => [a.a, a.b]).map((p) => [p.name, g.input(p.name, 'float32', p.shape)]));
    return loraWeights((n) => b.get(n)!, trainable, adapters, lora, 'float32');
  });
  const viaMerged = await run((g) => {
    const w = new Map(specs.map((s) => [s.name, g.input(s.name, 'float32', s.shape)]));
    return (n) => w.get(n)!;
  });
  const viaBase = await run((g) => {
    const w = new Map(specs.map((s) => [s.name, g.input(`base/${s.name}`, 'float32', s.shape)]));
    return (n) => w.get(n)!;
  });
  let maxDiff = 0;
  let baseDiff = 0;
  viaLora.forEach((x, i) => {
    maxDiff = Math.max(maxDiff, Math.abs(x - viaMerged[i]));
    baseDiff = Math.max(baseDiff, Math.abs(x - viaBase[i]));
  });
  expect(maxDiff).toBeLessThan(1e-5);
  expect(baseDiff).toBeGreaterThan(1e-2); // the adapters matter
});

test('LoRA settings are checked', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'lathe-lora-'));
  const config = randomModel(dir, tiny, { seed: 5 });
  expect(() => loraAdapters(config, { rank: 0, alpha: 1, targets: 'q_proj' })).toThrow(/rank must be a positive integer/);
  expect(() => loraAdapters(config, { rank: 2, alpha: 1, targets: 'nothing' })).toThrow(/match no weight matrix/);
  expect(() => loraAdapters(config, { rank: 2, alpha: 1, targets: '(' })).toThrow(/not a valid regular expression/);
});
