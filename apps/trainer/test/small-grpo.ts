/** The small GRPO run the CLI tests share: 4 steps of 4 prompts × 4 samples, 2 minibatches, an evaluation and a checkpoint every 2 steps. */
import { join } from 'node:path';
import { defaults, grpoSchema, type GrpoConfig } from '@lathe/recipes';

/** The config of such a run in `root/run`, with `over` on top. */
export function smallGrpo(root: string, run: string, over: Partial<GrpoConfig> = {}): GrpoConfig {
  return {
    ...defaults(grpoSchema),
    run_dir: join(root, run),
    steps: 4,
    prompts_per_step: 4,
    group_size: 4,
    max_new_tokens: 4,
    eval_examples: 8,
    eval_every: 2,
    save_every: 2,
    keep_last: 5,
    n_minibatches: 2,
    lr: 1e-3,
    ...over,
  };
}
