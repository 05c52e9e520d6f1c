/**
 * @lathe/grpo — GRPO-family reinforcement learning: advantage estimators (GRPO, Dr.GRPO, RLOO,
 * ReMax, REINFORCE++, GAE), the PPO-style policy loss in the tensor DSL (clip ranges, GSPO ratios,
 * KL, entropy, aggregation modes), KL reward penalties, weighted reward functions with failure
 * accounting, and DAPO's dynamic sampling.
 */
export * from './advantages';
export * from './kl';
export * from './policy-loss';
export * from './policies';
export * from './rl-loss';
export * from './rewards';
export * from './dynamic-sampling';
export * from './estimators';
export * from './rollout-batch';
export * from './rollout-groups';
export * from './policy-sessions';
export * from './grpo-trainer';
export * from './grpo-options';
export * from './value-model';
export * from './gdpo';
export * from './classmate-tokens';
export * from './classmate';
export * from './classmate-models';
export * from './judge-rewards';
export type { GrpoStepMetrics, GrpoStepResult, RolloutRecord } from './grpo-metrics';
