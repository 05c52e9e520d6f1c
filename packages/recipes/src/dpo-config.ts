/** `lathe dpo`'s options: defaults, flags, YAML keys and the config saved with checkpoints. */
import { DPO_DEFAULTS } from '@lathe/reward-models';
import { modelOption, promptFormatOptions, runDirOption, tokenizerOption } from './common-options';
import type { ConfigOf, OptionSchema } from './options';
import { preferenceDataOption, preferenceRunOptions, preferenceStepOptions } from './rm-config';

/** Every option of a DPO run; the loss's defaults come from `DPO_DEFAULTS`. */
export const dpoSchema = {
  model: { ...modelOption, describe: `${modelOption.describe}; also the frozen reference (with LoRA, the base itself)` },
  tokenizer: tokenizerOption,
  data: preferenceDataOption,
  ...promptFormatOptions,
  run_dir: runDirOption('runs/dpo', 'config.yaml, metrics.jsonl, reference_logps.safetensors, checkpoints/ and eval/'),
  ...preferenceStepOptions,
  beta: { type: 'number', default: DPO_DEFAULTS.beta, min: 0, describe: 'β (> 0): how strongly the policy is held to the reference; the implicit reward of a response is β·(log π − log π_ref)' },
  loss_type: { type: 'string', default: DPO_DEFAULTS.loss, choices: ['sigmoid', 'ipo'], describe: "The loss: sigmoid (DPO, −log σ(β·z), response log-probs summed) or ipo (IPO, (z − 1/(2β))², log-probs averaged over each response's tokens, as TRL); z is the chosen-minus-rejected log-ratio margin" },
  label_smoothing: { type: 'number', default: DPO_DEFAULTS.labelSmoothing, min: 0, below: 0.5, describe: "cDPO's label smoothing ε with --loss_type sigmoid: the share of pairs assumed mislabelled" },
  ...preferenceRunOptions(1e-6, "data order, the held-out split and LoRA's initial adapters"),
} as const satisfies OptionSchema;

/** A resolved DPO config. */
export type DpoRunConfig = ConfigOf<typeof dpoSchema>;
