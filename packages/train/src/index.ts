/** @lathe/train — compiled train steps, AdamW, schedules and losses. */
export * from './adamw';
export * from './schedule';
export * from './train-step';
export * from './losses';
export * from './checkpoint';
export * from './lora';
export * from './dropout';
export * from './trainer';
export type { InGraphGradients, InGraphShards } from './in-run-reduce';
export * from './fused-adamw';
export * from './zero';
