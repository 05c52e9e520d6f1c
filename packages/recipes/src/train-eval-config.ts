/** The options of benchmark evaluation during training (`lathe sft` and `lathe grpo` with `--eval_benchmarks`; see train-eval.ts). */
import type { OptionSchema } from './options';

/** The options of benchmark evaluation during training, shared by `lathe sft` and `lathe grpo` (names follow `lathe eval`'s, with `eval_`). */
export const trainEvalOptions = {
  eval_benchmarks: {
    type: 'string',
    default: '',
    describe:
      "Benchmarks to evaluate at each evaluation (before the first step, every --eval_every steps, after the last), comma-separated, as lathe eval names them (aime24, aime25, amc23, math500, minerva, olympiadbench, gsm8k); logged as eval/<benchmark>/avg@n in metrics.jsonl (empty: none)",
  },
  eval_data_dir: { type: 'string', default: '../shared/datasets', describe: 'Folder holding the --eval_benchmarks files in the public layout (math500/test.jsonl, …)' },
  eval_limit: { type: 'number', default: 0, integer: true, min: 0, describe: 'Only the first N problems of each --eval_benchmarks set (0: all)' },
  eval_samples: { type: 'number', default: 1, integer: true, min: 1, describe: 'Samples per --eval_benchmarks problem (the n of avg@n)' },
  eval_template: {
    type: 'string',
    default: 'qwen-boxed',
    describe: "Prompt template of --eval_benchmarks problems: qwen-boxed (the problem, then 'Please reason step by step, and put your final answer within \\boxed{}.'), r1-zero, or your own text with {problem}; the result is encoded as training prompts are (--prompt_format)",
  },
} as const satisfies OptionSchema;

/** `lathe sft`'s sampling of benchmark problems (`lathe grpo` samples them as it samples rollouts). */
export const sftBenchmarkSamplingOptions = {
  eval_temperature: { type: 'number', default: 0.6, min: 0, describe: 'Sampling temperature of --eval_benchmarks samples (0: greedy); their length limit is --max_new_tokens' },
  eval_top_p: { type: 'number', default: 0.95, min: 0, max: 1, describe: 'Nucleus sampling mass of --eval_benchmarks samples, in (0, 1] (1: off)' },
} as const satisfies OptionSchema;

/** The benchmark options, which may change on `--resume` (they change neither the weights nor the data order). */
export const TRAIN_EVAL_KEYS = ['eval_benchmarks', 'eval_data_dir', 'eval_limit', 'eval_samples', 'eval_template'] as const;

/** The benchmark-evaluation fields of a training config. */
export interface TrainEvalConfig {
  eval_benchmarks: string;
  eval_data_dir: string;
  eval_limit: number;
  eval_samples: number;
  eval_template: string;
}

