/** Tiny random models, a generation runner and a teacher-forced logits runner for the rollout tests. */
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { basename, join } from 'node:path';
import * as L from '@lathe/onnx';
import {
  decoder,
  lmLogits,
  paddedCausalMask,
  positionsFromPadding,
  randomModel,
  readWeightIndex,
  weightInitializers,
  type DecoderConfig,
  type HfConfig,
} from '@lathe/models';
import { addGeneration, addScoring, uniformNoise, type GenerationGraphOptions, type ScoringGraphOptions } from '@lathe/rollout';
import { compile, type HostTensor } from '../../../tools/testing/ort-cpu';

export const tinyQwen3: HfConfig = {
  architectures: ['Qwen3ForCausalLM'],
  vocab_size: 48,
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

/** A random model folder; `std` large enough that the next-token distributions are not flat. */
export function tinyModel(cfg: HfConfig = tinyQwen3, seed = 3): { dir: string; config: DecoderConfig } {
  const dir = mkdtempSync(join(tmpdir(), 'lathe-rollout-'));
  return { dir, config: randomModel(dir, cfg, { seed, std: 0.5 }) };
}

export const i64 = (rows: number[][]): HostTensor => ({ data: BigInt64Array.from(rows.flat().map(BigInt)), dims: [rows.length, rows[0].length] });
export const i64v = (v: number[]): HostTensor => ({ data: BigInt64Array.from(v.map(BigInt)), dims: [v.length] });
export const i64s = (v: number): HostTensor => ({ data: BigInt64Array.from([BigInt(v)]), dims: [] });

/** Rows of a [R, N] host tensor as number arrays. */
export function rowsOf(t: HostTensor): number[][] {
  const [R, N] = t.dims;
  return Array.from({ length: R }, (_, r) => Array.from(t.data.slice(r * N, (r + 1) * N) as ArrayLike<number | bigint>, Number));
}

/** A float32 CPU generation graph over the model's safetensors; returns a run function. */
export async function generationRunner(dir: string, config: DecoderConfig, opts: GenerationGraphOptions, file = 'generate.onnx') {
  const g = new L.Graph('generate');
  addGeneration(g, config, weightInitializers(g, config, readWeightIndex(dir), 'float32', (f) => basename(f)), opts);
  const path = join(dir, file);
  writeFileSync(path, L.toModelBytes(g));
  const run = await compile(g, path);
  const n = opts.groupSize ?? 1;
  const sampling = (opts.temperature ?? 1) !== 0;
  return (prompts: number[][], o: { maxNew: number; seed?: number; keys?: number[]; stop?: number[] }) => {
    const keys = (o.keys ?? prompts.map((_, i) => i)).flatMap((k) => [...Array(n).keys()].map((j) => k * n + j));
    const P = Math.max(...prompts.map((p) => p.length));
    const ids = prompts.map((p) => [...new Array(P - p.length).fill(0), ...p]);
    const mask = prompts.map((p) => [...new Array(P - p.length).fill(0), ...new Array(p.length).fill(1)]);
    return run({
      input_ids: i64(ids),
      attention_mask: i64(mask),
      max_new_tokens: i64s(o.maxNew),
      stop_ids: i64v(o.stop ?? [-1]),
      ...(sampling ? { noise: { data: uniformNoise(o.seed ?? 0, keys, o.maxNew), dims: [keys.length, o.maxNew] } } : {}),
    });
  };
}

/** Teacher-forced float32 logits [1, T, V] of one unpadded sequence. */
export async function logitsRunner(dir: string, config: DecoderConfig) {
  const g = new L.Graph('logits');
  const ids = g.input('input_ids', 'int64', ['B', 'T']);
  const mask = g.input('attention_mask', 'int64', ['B', 'T']);
  const w = weightInitializers(g, config, readWeightIndex(dir), 'float32', (f) => basename(f));
  const { hidden } = decoder(config, w, { inputIds: ids, positionIds: positionsFromPadding(mask), attentionMask: paddedCausalMask(mask) });
  g.output(lmLogits(config, w, hidden), 'logits');
  const path = join(dir, 'logits.onnx');
  writeFileSync(path, L.toModelBytes(g));
  const run = await compile(g, path);
  return async (seq: number[]): Promise<number[][]> => {
    const out = (await run({ input_ids: i64([seq]), attention_mask: i64([seq.map(() => 1)]) })).logits;
    const V = out.dims[2];
    return Array.from({ length: seq.length }, (_, t) => Array.from(out.data.slice(t * V, (t + 1) * V) as Float32Array));
  };
}

/** log-softmax of a row of logits, in float64. */
export function logSoftmax(row: number[]): number[] {
  const m = Math.max(...row);
  const z = Math.log(row.reduce((s, x) => s + Math.exp(x - m), 0)) + m;
  return row.map((x) => x - z);
}

/** A float32 CPU scoring graph; feeds right-padded rows, returns every output. */
export async function scoringRunner(dir: string, config: DecoderConfig, opts: ScoringGraphOptions = {}) {
  const g = new L.Graph('score');
  addScoring(g, config, weightInitializers(g, config, readWeightIndex(dir), 'float32', (f) => basename(f)), opts);
  const path = join(dir, 'score.onnx');
  writeFileSync(path, L.toModelBytes(g));
  const run = await compile(g, path);
  return (seqs: number[][]) => {
    const T = Math.max(...seqs.map((s) => s.length));
    return run({
      input_ids: i64(seqs.map((s) => [...s, ...new Array(T - s.length).fill(0)])),
      attention_mask: i64(seqs.map((s) => [...s.map(() => 1), ...new Array(T - s.length).fill(0)])),
      ...(opts.groupQueryAttention ? { total_sequence_length: { data: Int32Array.from([T]), dims: [] } } : {}),
    });
  };
}
