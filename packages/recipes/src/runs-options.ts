/**
 * The options of `lathe runs` and its subcommands: the single source of their flags, defaults and
 * help text (the CLI turns each entry into a flag; the library functions take the resolved values).
 */
import type { OptionSchema } from './options';

const root = { type: 'string', default: 'runs', describe: 'Folder holding run directories (a run may also be given as a path)' } as const;
const json = { type: 'boolean', default: false, describe: 'Print JSON (one document on stdout) for scripts' } as const;

/** `lathe runs list`. */
export const runsListSchema = { root, json } as const satisfies OptionSchema;

/** `lathe runs show <run>`. */
export const runsShowSchema = {
  root,
  json,
  metrics: { type: 'number', default: 1, integer: true, min: 0, describe: 'How many of the last metrics lines to show' },
} as const satisfies OptionSchema;

/** `lathe runs diff <a> <b>`. */
export const runsDiffSchema = { root, json } as const satisfies OptionSchema;

/** `lathe runs prune <run>`. */
export const runsPruneSchema = {
  root,
  json,
  keep_last: { type: 'number', default: 2, integer: true, min: 0, describe: 'Keep the newest N checkpoints' },
  keep_best: { type: 'number', default: 0, integer: true, min: 0, describe: 'Also keep the K best checkpoints by --metric' },
  metric: { type: 'string', default: 'eval_accuracy', describe: "Metric ranking checkpoints: a metrics.jsonl key at the checkpoint's step (e.g. loss), or eval_accuracy (mean 'correct' of eval/step-N.jsonl)" },
  mode: { type: 'string', default: 'max', choices: ['max', 'min'], describe: 'Whether larger or smaller metric values are better' },
  dry_run: { type: 'boolean', default: false, describe: 'Report what would be deleted without deleting' },
} as const satisfies OptionSchema;
