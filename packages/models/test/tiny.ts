/** Tiny random models and a CPU scoring graph for the models tests. */
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { basename, join } from 'node:path';
import * as L from '@lathe/onnx';
import {
  decoder,
  lmLogits,
  packedCausalMask,
  paddedCausalMask,
  positionsFromPadding,
  randomModel,
  readWeightIndex,
  weightInitializers,
  paramSpecs,
  readTensorBytes,
  type DecoderConfig,
  type HfConfig,
} from '@lathe/models';
import { compile, type HostTensor } from '../../../tools/testing/ort-cpu';

export const tinyQwen3: HfConfig = {
  architectures: ['Qwen3ForCausalLM'],
  vocab_size: 64,
  hidden_size: 32,
  intermediate_size: 48,
  num_hidden_layers: 2,
  num_attention_heads: 4,
  num_key_value_heads: 2,
  head_dim: 8,
  rms_norm_eps: 1e-6,
  rope_theta: 10000,
  max_position_embeddings: 128,
  tie_word_embeddings: true,
};

export const tinyQwen2: HfConfig = { ...tinyQwen3, architectures: ['Qwen2ForCausalLM'], tie_word_embeddings: false };
export const tinyLlama: HfConfig = {
  ...tinyQwen3,
  architectures: ['LlamaForCausalLM'],
  tie_word_embeddings: false,
  rope_scaling: { rope_type: 'llama3', factor: 8, low_freq_factor: 1, high_freq_factor: 4, original_max_position_embeddings: 32 },
};

/** Writes a random model to a temp dir. */
export function tinyModel(cfg: HfConfig, seed = 1): { dir: string; config: DecoderConfig } {
  const dir = mkdtempSync(join(tmpdir(), 'lathe-model-'));
  return { dir, config: randomModel(dir, cfg, { seed, std: 0.2 }) };
}

/** How a scoring run masks its rows. */
export type MaskMode = 'padding' | 'packed';

/**
 * A float32 CPU graph: ids [B, T] + mask/segments [B, T] (+ positions when packed) → logits
 * [B, T, V], with weights read by ORT from the model's safetensors file.
 */
export async function logitsRunner(dir: string, config: DecoderConfig, mode: MaskMode = 'padding') {
  const g = new L.Graph('tiny');
  const ids = g.input('input_ids', 'int64', ['B', 'T']);
  const mask = g.input(mode === 'padding' ? 'attention_mask' : 'segment_ids', 'int64', ['B', 'T']);
  const positions = mode === 'packed' ? g.input('position_ids', 'int64', ['B', 'T']) : positionsFromPadding(mask);
  const w = weightInitializers(g, config, readWeightIndex(dir), 'float32', (f) => basename(f));
  const { hidden } = decoder(config, w, {
    inputIds: ids,
    positionIds: positions,
    attentionMask: mode === 'padding' ? paddedCausalMask(mask) : packedCausalMask(mask),
  });
  g.output(lmLogits(config, w, hidden), 'logits');
  const path = join(dir, `${mode}.onnx`);
  writeFileSync(path, L.toModelBytes(g));
  const run = await compileFile(path, g);
  return async (feeds: Record<string, number[][]>) => {
    const host: Record<string, HostTensor> = {};
    for (const [k, rows] of Object.entries(feeds)) host[k] = { data: BigInt64Array.from(rows.flat().map(BigInt)), dims: [rows.length, rows[0].length] };
    return (await run(host)).logits;
  };
}

async function compileFile(path: string, g: L.Graph) {
  return compile(g, path);
}

/** Host feeds for every weight of a float32 model folder, as float64 or float32. */
export function weightFeeds(dir: string, config: DecoderConfig, dtype: 'float64' | 'float32'): Record<string, HostTensor> {
  const index = readWeightIndex(dir);
  const feeds: Record<string, HostTensor> = {};
  for (const spec of paramSpecs(config)) {
    const bytes = readTensorBytes(index.get(spec.name)!);
    const f32 = new Float32Array(bytes.buffer, bytes.byteOffset, bytes.byteLength / 4);
    feeds[spec.name] = { data: dtype === 'float64' ? Float64Array.from(f32) : Float32Array.from(f32), dims: spec.shape };
  }
  return feeds;
}
