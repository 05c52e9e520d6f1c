import type { CommandModule } from 'yargs';
import { runSft, sftSchema, type SftConfig } from '@lathe/recipes';
import { addSchemaFlags, configFromArgv } from '../config-flags';
import { finishRun, runReported } from '../interrupt';
import { sftReporter } from '../progress';

/**
 * Runs SFT with a config, reporting progress and a one-line JSON summary. Ctrl-C or SIGTERM stops
 * it after the current step with a checkpoint (exit status 130 or 143).
 */
export async function sftMain(cfg: SftConfig): Promise<void> {
  const run = await runReported(sftReporter(cfg), (events, signal) => runSft(cfg, events, signal));
  const result = run.value;
  const first = result.evals[0];
  const last = result.evals.at(-1);
  finishRun(run, {
    run_dir: cfg.run_dir,
    steps: result.steps,
    final_loss: Number(result.finalLoss.toFixed(4)),
    acc_before_sft: first?.step === 0 ? first.accuracy : undefined,
    acc_after_sft: last?.accuracy,
    eval_examples: last?.examples,
    checkpoint: result.checkpoint,
    interrupted: result.interrupted,
  });
}

/** `lathe sft`: supervised fine-tuning. */
export const sftCommand: CommandModule = {
  command: 'sft',
  describe: 'Supervised fine-tuning on prompt/response pairs or conversations (masked next-token cross-entropy, AdamW; optional sequence packing)',
  builder: (y) => addSchemaFlags(y, sftSchema).example('$0 sft', 'train the built-in tiny model on synthetic addition (CPU, no downloads)').example('$0 sft --config sft.yaml --steps 1000', 'a YAML config with a flag overriding it'),
  handler: async (argv) => sftMain(configFromArgv(sftSchema, argv)),
};
