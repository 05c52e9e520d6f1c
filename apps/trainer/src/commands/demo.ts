import { existsSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import type { CommandModule } from 'yargs';
import { DEMO_GRPO_OVERRIDES, DEMO_SFT_OVERRIDES, grpoSchema, runSft, sftSchema, type GrpoConfig, type SftConfig, type SftResult } from '@lathe/recipes';
import { addSchemaFlags, configFromArgv, resolveOptions, yamlSource } from '../config-flags';
import { runInterruptible, stopExitCode, type Interruptible } from '../interrupt';
import { sftReporter } from '../progress';
import { grpoRunInterruptible } from './grpo';

/** Runs the SFT stage with a progress bar; Ctrl-C or SIGTERM stops it after the current step with a checkpoint. */
async function sftStage(cfg: SftConfig): Promise<Interruptible<SftResult>> {
  const reporter = sftReporter(cfg);
  try {
    return await runInterruptible((signal) => runSft(cfg, reporter.events, signal));
  } finally {
    reporter.stop();
  }
}

/** The GRPO stage's config: the demo settings, the SFT stage's checkpoint, seed and held-out split, then `--grpo_config`, then `--grpo_steps`. */
export function demoGrpoConfig(sft: SftConfig, checkpoint: string, argv: Record<string, unknown>): GrpoConfig {
  const sources: { name: string; values: Record<string, unknown> }[] = [
    { name: 'demo settings', values: { ...DEMO_GRPO_OVERRIDES, model: checkpoint, run_dir: `${sft.run_dir}-grpo`, seed: sft.seed, eval_examples: sft.eval_examples, device: sft.device } },
  ];
  if (typeof argv.grpo_config === 'string') sources.push(yamlSource(grpoSchema, argv.grpo_config, '--grpo_config'));
  if (argv.grpo_steps !== undefined) sources.push({ name: 'command line', values: { steps: argv.grpo_steps } });
  return resolveOptions(grpoSchema, sources);
}

/**
 * `lathe demo`: the quick start's job — SFT of the built-in model on the built-in task (runs/demo),
 * then GRPO from its final checkpoint with an exact-match reward (runs/demo-grpo), each scored on
 * the same held-out problems. Prints one JSON summary line.
 */
export const demoCommand: CommandModule = {
  command: 'demo',
  describe: 'SFT, then GRPO, of a tiny random Qwen3 on synthetic two-digit addition, on the CPU with no downloads; prints held-out accuracy before SFT, after SFT and after GRPO',
  builder: (y) =>
    addSchemaFlags(y, sftSchema)
      .option('grpo_steps', { type: 'number', describe: `RL steps of the GRPO stage (0: skip it) [default: ${DEMO_GRPO_OVERRIDES.steps}]` })
      .option('grpo_config', { type: 'string', describe: 'YAML file of `lathe grpo` options for the GRPO stage (over the demo settings; --grpo_steps overrides it)' })
      .epilogue(`SFT stage settings (flags override them): ${JSON.stringify(DEMO_SFT_OVERRIDES)}\nGRPO stage settings (--grpo_config overrides them): ${JSON.stringify(DEMO_GRPO_OVERRIDES)}`),
  handler: async (argv) => {
    const started = performance.now();
    const sft = configFromArgv(sftSchema, argv, { name: 'demo settings', values: { ...DEMO_SFT_OVERRIDES } });
    const grpoSteps = argv.grpo_steps === undefined ? DEMO_GRPO_OVERRIDES.steps : Number(argv.grpo_steps);
    if (grpoSteps !== 0) demoGrpoConfig(sft, sft.run_dir, argv); // a bad --grpo_config fails now, not after the SFT stage
    const sftRun = await sftStage(sft);
    const sftResult = sftRun.value;
    let stoppedBy = sftRun.stoppedBy;
    const summary: Record<string, unknown> = {
      run_dir: sft.run_dir,
      steps: sftResult.steps,
      final_loss: Number(sftResult.finalLoss.toFixed(4)),
      acc_before_sft: sftResult.evals[0]?.accuracy,
      acc_after_sft: sftResult.evals.at(-1)?.accuracy,
      eval_examples: sftResult.evals.at(-1)?.examples,
      checkpoint: sftResult.checkpoint,
    };
    let interrupted = sftResult.interrupted;
    if (!interrupted && grpoSteps !== 0) {
      const cfg = demoGrpoConfig(sft, sftResult.checkpoint, argv);
      // the GRPO stage starts over from this SFT run's checkpoint
      if (existsSync(join(cfg.run_dir, 'config.yaml'))) rmSync(cfg.run_dir, { recursive: true, force: true });
      const grpoRun = await grpoRunInterruptible(cfg, 'grpo');
      const g = grpoRun.value;
      stoppedBy = grpoRun.stoppedBy;
      const rewards = (from: number, to?: number) => g.stepRewards.slice(from, to);
      const mean = (xs: number[]) => (xs.length ? Number((xs.reduce((a, b) => a + b, 0) / xs.length).toFixed(4)) : undefined);
      Object.assign(summary, {
        grpo_run_dir: cfg.run_dir,
        grpo_steps: g.steps,
        reward_first_10_steps: mean(rewards(0, 10)),
        reward_last_10_steps: mean(rewards(-10)),
        acc_after_grpo: g.evals.at(-1)?.accuracy,
        // mean@8 at temperature 1 on the held-out prompts: before the first GRPO step (the SFT
        // model) and after the last — the quantity the RL stage optimises
        sampled_acc_after_sft: g.evals[0]?.sampled_accuracy,
        sampled_acc_after_grpo: g.evals.at(-1)?.sampled_accuracy,
        grpo_checkpoint: g.checkpoint,
      });
      interrupted = g.interrupted;
    }
    summary.seconds = Math.round((performance.now() - started) / 1000);
    summary.interrupted = interrupted;
    console.log(JSON.stringify(summary));
    if (interrupted) process.exitCode = stopExitCode(stoppedBy);
  },
};
