/**
 * What one decode step must read from device memory, so quant-bench can say how weight-bound each
 * measured step is: the weights' bytes (as the format stores them) and the KV cache's, and the time
 * each takes at the GPU's HBM peak.
 */
import type { DecoderConfig } from '@lathe/models';

/** A device tensor as far as the accounting needs: its size and dims. */
export interface SizedTensor {
  byteLength: number;
  dims: readonly number[];
}

/**
 * Bytes of weights one decode step of `rows` rows reads: every tensor in full, except the embedding
 * table when another tensor is the LM head (an untied head, or a quantized copy of a tied one): then
 * only the `rows` rows the step's tokens gather.
 */
export function stepWeightBytes(tensors: Iterable<readonly [string, SizedTensor]>, o: { embedding: string; embeddingIsHead: boolean; rows: number }): number {
  let bytes = 0;
  for (const [name, t] of tensors) {
    if (name === o.embedding && !o.embeddingIsHead) bytes += Math.min(o.rows, t.dims[0]) * (t.byteLength / t.dims[0]);
    else bytes += t.byteLength;
  }
  return bytes;
}

/**
 * Bytes of KV cache a decode step reads, averaged over a call's `steps` steps: each of `rows` rows reads
 * its keys and values at every layer, `promptLen + s` positions at step s = 1..steps.
 */
export function stepCacheBytes(config: DecoderConfig, o: { rows: number; promptLen: number; steps: number; bytesPerElement: number }): number {
  const perPosition = config.numLayers * 2 * config.numKvHeads * config.headDim * o.bytesPerElement;
  return o.rows * (o.promptLen + (o.steps + 1) / 2) * perPosition;
}

/** Milliseconds to move `bytes` at `peakTbPerS` TB/s (undefined without a known peak). */
export function msAtPeak(bytes: number, peakTbPerS: number | undefined): number | undefined {
  return peakTbPerS ? (bytes / (peakTbPerS * 1e12)) * 1000 : undefined;
}
