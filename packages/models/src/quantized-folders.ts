/**
 * Model folders whose config.json has a `quantization_config` (a quantized checkpoint): their
 * layers are not dense tensors, so `CausalLM.fromPretrained` asks a reader for float32 weights.
 * The reader lives above this layer (@lathe/quantization registers it when imported).
 */
import type { DecoderConfig, HfConfig } from './config';

/** Dequantized float32 weights by HF name (every parameter of `config`) from a quantized folder. */
export type QuantizedFolderReader = (dir: string, config: DecoderConfig, raw: HfConfig) => Map<string, Float32Array>;

let reader: QuantizedFolderReader | undefined;

/** Sets the reader of quantized folders (called by @lathe/quantization on import). */
export function setQuantizedFolderReader(r: QuantizedFolderReader): void {
  reader = r;
}

/** A quantized folder's dequantized weights, or undefined for a dense folder. */
export function readQuantizedFolder(dir: string, config: DecoderConfig, raw: HfConfig): Map<string, Float32Array> | undefined {
  if (raw.quantization_config === undefined || raw.quantization_config === null) return undefined;
  if (!reader) throw new Error(`${dir}: a quantized checkpoint (config.json has quantization_config): import '@lathe/quantization' to read it`);
  return reader(dir, config, raw);
}
