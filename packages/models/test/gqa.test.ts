/**
 * The GroupQueryAttention path (ONNX Runtime's fused kernel, used for scoring and generation)
 * against the decoder composed from primitives, on CPU in float32: same logits at every real
 * position of right-padded rows. GQA's rotary needs head_dim ≥ 16, so these models are wider.
 */
import { writeFileSync } from 'node:fs';
import { basename, join } from 'node:path';
import * as L from '@lathe/onnx';
import { decoder, lmLogits, rightPaddedGqaInputs, paddedCausalMask, positionsFromPadding, readWeightIndex, weightInitializers, type HfConfig } from '@lathe/models';
import { compile } from '../../../tools/testing/ort-cpu';
import { tinyLlama, tinyModel, tinyQwen2, tinyQwen3 } from './tiny';

const wide = (hf: HfConfig): HfConfig => ({ ...hf, hidden_size: 64, head_dim: 16, num_attention_heads: 4, num_key_value_heads: 2 });

describe.each([
  ['Qwen3', wide(tinyQwen3)],
  ['Qwen2 (biases)', { ...wide(tinyQwen2), num_attention_heads: 8, head_dim: 16, hidden_size: 64 }],
  ['Llama (llama3 RoPE scaling)', wide(tinyLlama)],
] as [string, HfConfig][])('%s: GroupQueryAttention decoder', (_name, hf) => {
  test('equals the composed decoder on right-padded rows', async () => {
    const { dir, config } = tinyModel(hf, 3);
    const g = new L.Graph('both');
    const ids = g.input('input_ids', 'int64', ['B', 'T']);
    const mask = g.input('attention_mask', 'int64', ['B', 'T']);
    const w = weightInitializers(g, config, readWeightIndex(dir), 'float32', (f) => basename(f));
    const composed = decoder(config, w, { inputIds: ids, positionIds: positionsFromPadding(mask), attentionMask: paddedCausalMask(mask) });
    const T = L.cast(L.squeeze(g.dimTensor(ids.shape[1]), [0]), 'int32'); // CPU-only test: from the shape
    const fused = decoder(config, w, rightPaddedGqaInputs(ids, mask, T));
    g.output(lmLogits(config, w, composed.hidden), 'composed');
    g.output(lmLogits(config, w, fused.hidden), 'gqa');
    const path = join(dir, 'both.onnx');
    writeFileSync(path, L.toModelBytes(g));
    const run = await compile(g, path);
    const rows = [[5, 9, 2, 7, 1, 3, 8], [4, 6, 11, 0, 0, 0, 0], [12, 0, 0, 0, 0, 0, 0]];
    const lens = [7, 3, 1];
    const out = await run({
      input_ids: { data: BigInt64Array.from(rows.flat().map(BigInt)), dims: [3, 7] },
      attention_mask: { data: BigInt64Array.from(rows.flatMap((r, b) => r.map((_, t) => BigInt(t < lens[b] ? 1 : 0)))), dims: [3, 7] },
    });
    const V = config.vocabSize;
    let worst = 0;
    let scale = 0;
    for (let b = 0; b < 3; b++) {
      for (let t = 0; t < lens[b]; t++) {
        for (let v = 0; v < V; v++) {
          const i = (b * 7 + t) * V + v;
          worst = Math.max(worst, Math.abs(Number(out.gqa.data[i]) - Number(out.composed.data[i])));
          scale = Math.max(scale, Math.abs(Number(out.composed.data[i])));
        }
      }
    }
    expect(scale).toBeGreaterThan(0.1);
    expect(worst).toBeLessThan(1e-4 * Math.max(1, scale));
  });
});
