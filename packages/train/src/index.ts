/** @lathe/train — compiled train steps, AdamW, schedules and losses. */
export * from './adamw';
export * from './schedule';
export * from './train-step';
export * from './losses';
