/**
 * A benchmark's `--quantize none|int8|int4|nf4`: the model folder quantized as `lathe quantize` writes it
 * (int4 in blocks of 64, nf4 with double quantization, the dense rest in bfloat16), into a temporary
 * folder beside the tokenizer files, so the command under test loads it as a user's quantized checkpoint.
 */
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { CausalLM } from '@lathe/models';
import { QuantizedModel, saveQuantized, type QuantFormat } from '@lathe/quantization';

/** The folder to load for `quantize` ('none': `model` itself); throws naming the flag for another value. */
export function quantizedFolder(model: string, quantize: string): string {
  if (quantize === 'none') return model;
  if (!['int8', 'int4', 'nf4'].includes(quantize)) throw new Error(`--quantize: '${quantize}' is not none, int8, int4 or nf4`);
  const format = quantize as QuantFormat;
  const source = CausalLM.fromPretrainedSync(model);
  try {
    const out = mkdtempSync(join(tmpdir(), `lathe-bench-${format}-`));
    const q = QuantizedModel.quantize(source.config, source.float32Weights(), { format, ...(format === 'int4' ? { blockSize: 64 } : {}), ...(format === 'nf4' ? { doubleQuant: true } : {}) });
    saveQuantized(out, q, { denseDtype: 'bfloat16', tokenizerFrom: model });
    return out;
  } finally {
    source.dispose();
  }
}
