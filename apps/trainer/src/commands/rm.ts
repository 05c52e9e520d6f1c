import type { Argv, CommandModule } from 'yargs';
import { rmEvalSchema, rmTrainSchema, runRmEval, runRmTrain, type RmEvalConfig, type RmTrainConfig, type TrainRunResult } from '@lathe/recipes';
import { addSchemaFlags, configFromArgv } from '../config-flags';
import { finishRun, runReported } from '../interrupt';
import { pairReporter } from '../progress';

/**
 * Trains a reward model, reporting progress and a one-line JSON summary. Ctrl-C or SIGTERM stops it
 * after the current step with a checkpoint (exit status 130 or 143).
 */
export async function rmTrainMain(cfg: RmTrainConfig): Promise<void> {
  const run = await runReported(pairReporter('rm train', cfg, { accuracyLabel: 'accuracy' }), (events, signal) => runRmTrain(cfg, events, signal));
  finishRun(run, pairRunSummary(cfg, run.value));
}

/** The JSON summary of a preference training run (rm train, dpo): held-out accuracy before and after. */
export function pairRunSummary(cfg: { run_dir: string }, result: TrainRunResult<{ step: number; accuracy: number; pairs: number }>): Record<string, unknown> {
  const first = result.evals[0];
  const last = result.evals.at(-1);
  return {
    run_dir: cfg.run_dir,
    steps: result.steps,
    final_loss: Number(result.finalLoss.toFixed(4)),
    acc_before: first?.step === 0 ? first.accuracy : undefined,
    acc_after: last?.accuracy,
    eval_pairs: last?.pairs,
    checkpoint: result.checkpoint,
    interrupted: result.interrupted,
  };
}

/** Scores a pair set with a reward model and prints a one-line JSON summary. */
export async function rmEvalMain(cfg: RmEvalConfig): Promise<void> {
  let last = 0;
  const summary = await runRmEval(cfg, {
    onProgress: (done, total) => {
      if (done === total || performance.now() - last > 2000) {
        last = performance.now();
        process.stderr.write(`rm eval: ${done}/${total} pairs scored\n`);
      }
    },
  });
  console.log(
    JSON.stringify({
      model: cfg.model,
      data: cfg.data,
      pairs: summary.pairs,
      accuracy: summary.accuracy,
      margin: summary.margin,
      chosen_mean: summary.chosen_mean,
      chosen_std: summary.chosen_std,
      rejected_mean: summary.rejected_mean,
      rejected_std: summary.rejected_std,
      skipped_over_length: summary.skipped.overLength,
      skipped_identical: summary.skipped.identical,
      output: summary.output,
    }),
  );
}

const train: CommandModule = {
  command: 'train',
  describe: 'Train a Bradley-Terry reward model on preference pairs (a score head on a causal LM, −log σ(r_chosen − r_rejected)); checkpoints are Hugging Face sequence-classification folders',
  builder: (y) =>
    addSchemaFlags(y, rmTrainSchema)
      .example('$0 rm train --steps 20', 'the built-in tiny model on the demo task’s pairs (CPU, no downloads)')
      .example('$0 rm train --model runs/sft/final --data hh-rlhf.jsonl.gz --prompt_format chat --device cuda --compute_dtype bfloat16', 'a reward model from an SFT checkpoint on HH-RLHF transcripts'),
  handler: async (argv) => rmTrainMain(configFromArgv(rmTrainSchema, argv)),
};

const evaluate: CommandModule = {
  command: 'eval',
  describe: "Score a preference pair set with a reward model: pairwise accuracy, margins, and every pair's rewards in a Parquet file",
  builder: (y) => addSchemaFlags(y, rmEvalSchema).example('$0 rm eval --model runs/rm/checkpoints/step-00000500 --data pairs.jsonl --output scores.parquet', 'accuracy of a trained reward model on a pair set'),
  handler: async (argv) => rmEvalMain(configFromArgv(rmEvalSchema, argv)),
};

/** `lathe rm`: reward models (train, eval). */
export const rmCommand: CommandModule = {
  command: 'rm',
  describe: 'Reward models: train one on preference pairs (Bradley-Terry), or score a pair set with one',
  builder: (y: Argv) => y.command(train).command(evaluate).demandCommand(1, 'name an rm subcommand: train, eval'),
  handler: () => undefined,
};
