/**
 * @lathe/recipes — the runs behind Lathe's commands, above the libraries: SFT (`runSft`), GRPO
 * (`runGrpo`, with reward models and your functions as rewards), reward models (`runRmTrain`,
 * `runRmEval`), DPO (`runDpo`) and trajectory generation (`runGenerate`, `TrajectoryGenerator`), each with its option
 * schema (the single source of defaults, CLI flags, YAML keys and the saved config); the built-in
 * demo task; and the scaffold they share (model and tokenizer loading, the held-out split, the run
 * directory with resume and checkpoints, evaluation files).
 */
export * from './options';
export * from './common-options';
export * from './scaffold';
export * from './train-attention';
export * from './reporting';
export * from './demo-task';
export * from './sft-config';
export * from './sft-data';
export * from './sft';
export * from './grpo-config';
export * from './classmate-config';
export * from './grpo';
export * from './trajectories';
export * from './model-weights';
export * from './decode-options';
export * from './generate-config';
export * from './generate';
export * from './runs-options';
export * from './model-init-config';
export * from './preference-data';
export * from './preference-batches';
export * from './rm-config';
export * from './rm';
export * from './dpo-config';
export * from './dpo';
export * from './reward-sources';
export * from './eval-benchmarks';
export * from './eval-metrics';
export * from './eval-config';
export * from './eval';
export * from './train-eval-config';
export * from './train-eval';
export * from './serve-config';
export * from './serve';
export * from './serve-training';
export * from './studio-config';
export * from './quantize-config';
export * from './quantize';
export * from './quantize-lora';
export * from './critic-config';
export * from './critic-data';
export * from './critic';
export * from './critic-label';
export * from './extract-config';
export * from './extract-data';
export * from './extract';
export * from './extract-html';
export * from './launch-config';
export * from './launch';
export * from './launch-dp';
