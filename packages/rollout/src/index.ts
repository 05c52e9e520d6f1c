/** @lathe/rollout — whole-batch generation and scoring graphs, and the host API around them. */
export * from './rng';
export * from './sampling';
export * from './generation-graph';
export * from './scoring-graph';
export * from './generator';
export * from './kv-cache-graphs';
export * from './kv-cache-generator';
export * from './engine-choice';
export * from './serve/slot-graphs';
export * from './serve/slot-engine';
export * from './serve/scheduler';
export * from './serve/text';
export * from './serve/openai-server';
export * from './serve/http-thread';
