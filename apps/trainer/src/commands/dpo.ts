import type { CommandModule } from 'yargs';
import { dpoSchema, runDpo, type DpoEvents, type DpoRunConfig } from '@lathe/recipes';
import { addSchemaFlags, configFromArgv } from '../config-flags';
import { finishRun, runReported } from '../interrupt';
import { pairReporter } from '../progress';
import { pairRunSummary } from './rm';

/**
 * Runs DPO, reporting progress and a one-line JSON summary. Ctrl-C or SIGTERM stops it after the
 * current step with a checkpoint (exit status 130 or 143).
 */
export async function dpoMain(cfg: DpoRunConfig): Promise<void> {
  const reporter = pairReporter('dpo', cfg, {
    accuracyLabel: 'implicit-reward accuracy',
    startNote: (i: Parameters<NonNullable<DpoEvents['onStart']>>[0]) => `reference log-probs ${i.referenceCached ? 'read from the run directory' : 'scored'}`,
  });
  const run = await runReported(reporter, (events, signal) => runDpo(cfg, events, signal));
  finishRun(run, pairRunSummary(cfg, run.value));
}

/** `lathe dpo`: direct preference optimisation. */
export const dpoCommand: CommandModule = {
  command: 'dpo',
  describe: 'Direct preference optimisation (DPO or IPO) of a causal LM on preference pairs against its frozen starting model; the reference log-probs are scored once and cached',
  builder: (y) =>
    addSchemaFlags(y, dpoSchema)
      .example('$0 dpo --steps 20', 'the built-in tiny model on the demo task’s pairs (CPU, no downloads)')
      .example('$0 dpo --model runs/sft/final --data pairs.jsonl --prompt_format chat --beta 0.1 --lr 5e-7 --device cuda --compute_dtype bfloat16', 'DPO after SFT'),
  handler: async (argv) => dpoMain(configFromArgv(dpoSchema, argv)),
};
