/**
 * QLoRA's weights: LoRA adapters (trainable side branches) over a frozen quantized base. The
 * adapters' `Weights` (e.g. `loraWeights` from @lathe/train, built over the base's dense lookups)
 * keep their side branches; the quantized projections keep their kernels. The decoder's
 * `project` then computes x·Wᵀ through the kernel plus the branch, and the backward pass reaches
 * the adapters through the kernel's gradient rule (the frozen base gets none).
 *
 *   const base = q.graphWeights(g, { dtype, prefix: 'base/' });                  // bind q.deviceTensors(device, dtype, 'base/') as frozen
 *   const lora = loraWeights((n) => base.weights(n), params, adapters, cfg, dtype, { training: true });
 *   return overQuantizedBase(lora, base.weights);
 */
import type { Weights } from '@lathe/models';

/** `adapters`' weights and side branches with `base`'s quantized projections (its `matmul` hook). */
export function overQuantizedBase(adapters: Weights, base: Weights): Weights {
  const w: Weights = (name) => adapters(name);
  w.branch = adapters.branch;
  w.matmul = base.matmul;
  return w;
}
