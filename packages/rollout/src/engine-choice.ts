/** Which generator runs a policy: the KV-cache engine where it can, else the in-graph generation loop. */
import type { DType } from '@lathe/onnx';
import type { DecoderConfig } from '@lathe/models';
import type { DeviceKind } from '@lathe/runtime';
import { kvCacheUnsupported } from './kv-cache-generator';

/**
 * A generation backend: 'kv-cache' (`KvCacheGenerator`: a prefill, then bound decode-step runs over
 * GroupQueryAttention with in-place KV caches) or 'graph' (the in-graph generation loop: any model,
 * any dtype). Both draw the same noise per sample, so they give the same samples up to rounding.
 */
export type GenerationEngine = 'kv-cache' | 'graph';

/** What may be asked for: an engine, or 'auto' (the KV-cache engine where it runs, else the graph). */
export type GenerationEngineRequest = 'auto' | GenerationEngine;

/** The engine chosen, and why the KV-cache engine was passed over when 'auto' passed it over. */
export interface EngineChoice {
  engine: GenerationEngine;
  why?: string;
}

const REQUESTS: readonly GenerationEngineRequest[] = ['auto', 'kv-cache', 'graph'];

/**
 * The engine for `config` in `dtype` on `device`: `requested`, or with 'auto' the KV-cache engine
 * unless {@link kvCacheUnsupported} names a reason. An explicit 'kv-cache' where it cannot run, or an
 * unknown request, is an error naming `option` (the flag or field the request came from).
 */
export function chooseGenerationEngine(requested: GenerationEngineRequest, config: Pick<DecoderConfig, 'headDim'>, device: DeviceKind, dtype: DType, option = 'engine'): EngineChoice {
  if (!REQUESTS.includes(requested)) throw new Error(`${option} must be 'auto', 'kv-cache' or 'graph', got '${String(requested)}'`);
  if (requested === 'graph') return { engine: 'graph' };
  const why = kvCacheUnsupported(config, device, dtype);
  if (requested === 'kv-cache' && why) throw new Error(`${option} 'kv-cache' cannot run this model: ${why}; use 'graph'`);
  return why ? { engine: 'graph', why } : { engine: 'kv-cache' };
}
