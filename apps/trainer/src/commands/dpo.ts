import type { CommandModule } from 'yargs';
import { SingleBar, Presets } from 'cli-progress';
import { dpoSchema, runDpo, type DpoEvents, type DpoRunConfig } from '@lathe/recipes';
import { addSchemaFlags, configFromArgv } from '../config-flags';
import { runInterruptible, stopExitCode } from '../interrupt';

const pct = (x: number) => `${(100 * x).toFixed(1)}%`;

/** Progress for a DPO run: a bar on stderr when it is a terminal, log lines otherwise. */
export function dpoReporter(cfg: DpoRunConfig): { events: DpoEvents; stop(): void } {
  const tty = Boolean(process.stderr.isTTY);
  const bar = new SingleBar({ format: 'dpo |{bar}| {value}/{total} steps | loss {loss} | acc {acc} | held-out {eval}', stream: process.stderr, hideCursor: true }, Presets.shades_classic);
  let running = false;
  let held = '-';
  const log = (s: string) => (tty && running ? bar.update({ eval: held }) : process.stderr.write(s + '\n'));
  const events: DpoEvents = {
    onStart: (i) => {
      process.stderr.write(
        `dpo: ${i.parameters.toLocaleString('en-US')} parameters (${i.trainable.toLocaleString('en-US')} trained), ${i.trainPairs} training pairs, ${i.evalPairs} held out ` +
          `(${i.skipped.overLength} over ${cfg.max_length} tokens and ${i.skipped.identical} with identical responses skipped); reference log-probs ${i.referenceCached ? 'read from the run directory' : 'scored'}; steps ${i.startStep} → ${i.totalSteps} on ${cfg.device}\n`,
      );
      if (tty) {
        bar.start(i.totalSteps, i.startStep, { loss: '-', acc: '-', eval: held });
        running = true;
      }
    },
    onStep: (m) => {
      if (tty) bar.update(m.step, { loss: m.loss.toFixed(3), acc: pct(m.accuracy), eval: held });
      else if (m.step % cfg.log_every === 0) process.stderr.write(`step ${m.step}/${cfg.steps} loss ${m.loss.toFixed(4)} accuracy ${pct(m.accuracy)} margin ${m.margin.toFixed(3)} grad_norm ${m.grad_norm.toFixed(3)} lr ${m.lr.toExponential(2)}\n`);
    },
    onEval: (r) => {
      held = pct(r.accuracy);
      log(`held-out at step ${r.step}: implicit-reward accuracy ${held} of ${r.pairs} pairs, margin ${r.margin.toFixed(3)}`);
    },
    onCheckpoint: (dir) => log(`checkpoint ${dir}`),
  };
  return {
    events,
    stop: () => {
      if (running) bar.stop();
      running = false;
    },
  };
}

/**
 * Runs DPO, reporting progress and a one-line JSON summary. Ctrl-C or SIGTERM stops it after the
 * current step with a checkpoint (exit status 130 or 143).
 */
export async function dpoMain(cfg: DpoRunConfig): Promise<void> {
  const reporter = dpoReporter(cfg);
  let run;
  try {
    run = await runInterruptible((signal) => runDpo(cfg, reporter.events, signal));
  } finally {
    reporter.stop();
  }
  const result = run.value;
  const first = result.evals[0];
  const last = result.evals.at(-1);
  console.log(
    JSON.stringify({
      run_dir: cfg.run_dir,
      steps: result.steps,
      final_loss: Number(result.finalLoss.toFixed(4)),
      acc_before: first?.step === 0 ? first.accuracy : undefined,
      acc_after: last?.accuracy,
      eval_pairs: last?.pairs,
      checkpoint: result.checkpoint,
      interrupted: result.interrupted,
    }),
  );
  if (result.interrupted) process.exitCode = stopExitCode(run.stoppedBy);
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
