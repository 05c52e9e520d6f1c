/** Random-initialised weights and Hugging Face model folders for tests, benchmarks and `lathe model init`. */
import { parseConfig, type DecoderConfig, type HfConfig } from './config';
import { paramSpecs, type ParamSpec } from './params';
import { seededNormal } from './random';
import { saveHfModel } from './save';

/** How random weights are drawn. */
export interface RandomWeightOptions {
  seed?: number;
  /** Standard deviation of matrix and embedding entries (transformers' initializer_range). */
  std?: number;
}

/**
 * A sampler of random weights from one seeded normal stream: matrices and embeddings ~ N(0, std²),
 * norm weights 1 + 0.1·z, biases 0.02·z. Call it for each parameter in `paramSpecs` order — the
 * values depend only on the seed and that order.
 */
export function randomWeight(opts: RandomWeightOptions = {}): (spec: ParamSpec) => Float32Array {
  const normal = seededNormal(opts.seed ?? 0);
  const std = opts.std ?? 0.02;
  return (spec) => {
    const n = spec.shape.reduce((a, b) => a * b, 1);
    const data = new Float32Array(n);
    for (let i = 0; i < n; i++) {
      const z = normal();
      data[i] = spec.kind === 'norm' ? 1 + 0.1 * z : spec.kind === 'bias' ? 0.02 * z : std * z;
    }
    return data;
  };
}

/** Options of `randomModel`. */
export interface RandomModelOptions extends RandomWeightOptions {
  /**
   * Stores the weights in a 16-bit dtype: `encode` turns each tensor's float32 values into that
   * dtype's bit patterns (e.g. @lathe/runtime's toBfloat16Bits). Default: float32 as sampled.
   */
  store?: { dtype: 'bfloat16' | 'float16'; encode: (values: Float32Array) => Uint16Array };
  /** A folder whose tokenizer files (tokenizer.json, tokenizer_config.json, …) are copied beside the weights. */
  tokenizerFrom?: string;
}

/**
 * Writes `<dir>/config.json` and `<dir>/model.safetensors` for a config with random weights (see
 * {@link randomWeight}; a 16-bit `store` rounds the same float32 samples). Returns the parsed config.
 * For the model in memory instead, `CausalLM.random`.
 */
export function randomModel(dir: string, config: HfConfig | DecoderConfig, opts: RandomModelOptions = {}): DecoderConfig {
  const cfg = 'architecture' in config ? (config as DecoderConfig) : parseConfig(config as HfConfig, 'randomModel config');
  const sample = randomWeight(opts);
  const tensors = paramSpecs(cfg).map((spec) => {
    const data = sample(spec);
    // each tensor is encoded as it is sampled, so only one float32 copy is ever held
    const stored = opts.store ? opts.store.encode(data) : data;
    return { name: spec.name, dtype: opts.store?.dtype ?? ('float32' as const), shape: spec.shape, data: new Uint8Array(stored.buffer, stored.byteOffset, stored.byteLength) };
  });
  saveHfModel(dir, cfg, tensors, { tokenizerFrom: opts.tokenizerFrom });
  return cfg;
}
