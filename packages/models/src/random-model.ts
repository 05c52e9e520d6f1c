/** Random-initialised Hugging Face model folders for tests, benchmarks and `lathe model init`. */
import { parseConfig, type DecoderConfig, type HfConfig } from './config';
import { paramSpecs } from './params';
import { saveHfModel } from './save';

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
  /**
   * Stores the weights in a 16-bit dtype: `encode` turns each tensor's float32 values into that
   * dtype's bit patterns (e.g. @lathe/runtime's toBfloat16Bits). Default: float32 as sampled.
   */
  store?: { dtype: 'bfloat16' | 'float16'; encode: (values: Float32Array) => Uint16Array };
  /** A folder whose tokenizer files (tokenizer.json, tokenizer_config.json, …) are copied beside the weights. */
  tokenizerFrom?: string;
}

/**
 * Writes `<dir>/config.json` and `<dir>/model.safetensors` for a config with random weights:
 * matrices ~ N(0, std²), norm weights around 1, biases small; the values depend only on the seed
 * (a 16-bit `store` rounds the same float32 samples). Returns the parsed config.
 */
export function randomModel(dir: string, config: HfConfig | DecoderConfig, opts: RandomModelOptions = {}): DecoderConfig {
  const cfg = 'architecture' in config ? (config as DecoderConfig) : parseConfig(config as HfConfig, 'randomModel config');
  const normal = normalSampler(opts.seed ?? 0);
  const std = opts.std ?? 0.02;
  const tensors = paramSpecs(cfg).map((spec) => {
    const n = spec.shape.reduce((a, b) => a * b, 1);
    const data = new Float32Array(n);
    for (let i = 0; i < n; i++) {
      const z = normal();
      data[i] = spec.kind === 'norm' ? 1 + 0.1 * z : spec.kind === 'bias' ? 0.02 * z : std * z;
    }
    // each tensor is encoded as it is sampled, so only one float32 copy is ever held
    const stored = opts.store ? opts.store.encode(data) : data;
    return { name: spec.name, dtype: opts.store?.dtype ?? ('float32' as const), shape: spec.shape, data: new Uint8Array(stored.buffer, stored.byteOffset, stored.byteLength) };
  });
  saveHfModel(dir, cfg, tensors, { tokenizerFrom: opts.tokenizerFrom });
  return cfg;
}
