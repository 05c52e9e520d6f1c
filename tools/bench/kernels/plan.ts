/**
 * The host-side planning of kernel-check.ts, apart so the CPU tests run it: the parameters of a
 * model shape as the trainer sees them, the fused update's chunk count and its traffic, and the
 * values the vector check must end with.
 */
import { paramSpecs, parseConfig, type HfConfig } from '@lathe/models';
import { FUSED_ADAMW_CHUNK, planChunks, type FusedAdamWParam } from '@lathe/train';

/** Every weight of a decoder as a trained parameter (decay on matrices and embeddings, as lathe sft does it). */
export function trainedParams(shape: HfConfig): (FusedAdamWParam & { shape: number[] })[] {
  return paramSpecs(parseConfig(shape, 'kernel-check shape')).map((s) => ({ name: s.name, shape: s.shape, size: s.shape.reduce((a, b) => a * b, 1), decay: s.kind === 'matrix' || s.kind === 'embedding' }));
}

/** What the fused update of these parameters launches and moves. */
export function adamwPlan(params: readonly FusedAdamWParam[], chunk = FUSED_ADAMW_CHUNK): { tensors: number; elements: number; chunks: number; bytesPerStep: number } {
  const elements = params.reduce((a, p) => a + p.size, 0);
  // sum of squares reads g; the update reads p, m, v, g and writes p, m, v: 8 float32 per element
  return { tensors: params.length, elements, chunks: planChunks(params.map((p) => p.size), chunk).length / 2, bytesPerStep: elements * 4 * 8 };
}

/**
 * The vector check: `a` starts at i mod 7; each round ORT adds 1 into `b` and the kernel writes
 * b + x back into `a`, with x = i mod 5. Every value stays a small integer (exact in float32), so
 * any launch that overtakes the run before it leaves a wrong element.
 */
export function vectorExpected(n: number, rounds: number): Float32Array {
  return Float32Array.from({ length: n }, (_, i) => (i % 7) + rounds * (1 + (i % 5)));
}
