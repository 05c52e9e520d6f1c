/** Random-initialised Hugging Face model folders for tests and benchmarks. */
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { parseConfig, toHfConfig, type DecoderConfig, type HfConfig } from './config';
import { paramSpecs } from './params';
import { writeSafetensors } from './safetensors';

/** Deterministic normal samples (mulberry32 + Box-Muller). */
export function normalSampler(seed: number): () => number {
  let a = seed >>> 0;
  const uniform = () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  return () => Math.sqrt(-2 * Math.log(1 - uniform())) * Math.cos(2 * Math.PI * uniform());
}

/** Options of `randomModel`. */
export interface RandomModelOptions {
  seed?: number;
  /** Standard deviation of matrix and embedding entries (transformers' initializer_range). */
  std?: number;
}

/**
 * Writes `<dir>/config.json` and `<dir>/model.safetensors` (float32) for a config with random
 * weights: matrices ~ N(0, std²), norm weights around 1, biases small. Returns the parsed config.
 */
export function randomModel(dir: string, config: HfConfig | DecoderConfig, opts: RandomModelOptions = {}): DecoderConfig {
  const cfg = 'architecture' in config ? (config as DecoderConfig) : parseConfig(config as HfConfig, 'randomModel config');
  const normal = normalSampler(opts.seed ?? 0);
  const std = opts.std ?? 0.02;
  mkdirSync(dir, { recursive: true });
  const tensors = paramSpecs(cfg).map((spec) => {
    const n = spec.shape.reduce((a, b) => a * b, 1);
    const data = new Float32Array(n);
    for (let i = 0; i < n; i++) {
      const z = normal();
      data[i] = spec.kind === 'norm' ? 1 + 0.1 * z : spec.kind === 'bias' ? 0.02 * z : std * z;
    }
    return { name: spec.name, dtype: 'float32' as const, shape: spec.shape, data: new Uint8Array(data.buffer) };
  });
  writeSafetensors(join(dir, 'model.safetensors'), tensors, { format: 'pt' });
  writeFileSync(join(dir, 'config.json'), JSON.stringify(toHfConfig({ ...cfg, torchDtype: 'float32' }), null, 2));
  return cfg;
}
