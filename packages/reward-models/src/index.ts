/** @lathe/reward-models — Bradley-Terry reward models, per-token value heads, DPO/IPO losses and preference-pair batches. */
export * from './reward-graph';
export * from './reward-model';
export * from './scorers';
export * from './trainable';
export * from './pairs';
export * from './pair-loss';
export * from './bradley-terry';
export * from './dpo';
