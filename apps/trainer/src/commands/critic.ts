import type { CommandModule } from 'yargs';
import {
  criticEvalSchema,
  criticLabelSchema,
  criticTrainSchema,
  generateSchema,
  runCriticEval,
  runCriticLabel,
  runCriticTrain,
  runGenerate,
  type CriticTrainConfig,
  type CriticTrainEvents,
} from '@lathe/recipes';
import { addSchemaFlags, configFromArgv } from '../config-flags';
import { finishRun, runReported, type Reporter } from '../interrupt';

/** Progress of `lathe critic train` on stderr: a start line, then a line every --log_every steps. */
function criticReporter(cfg: CriticTrainConfig): Reporter<CriticTrainEvents> {
  return {
    events: {
      onStart: (i) =>
        process.stderr.write(
          `critic train: ${i.parameters.toLocaleString('en-US')} trained parameters; ${i.prompts} prompts → ${i.sequences} sequences packed into ${i.rows} rows of ${cfg.max_length} tokens (${i.skipped} attempts over it skipped); ` +
            `${i.cells} distribution tokens from id ${i.firstTokenId}${i.addedRows ? ` (${i.addedRows} embedding rows added)` : ''}; steps ${i.startStep} → ${i.totalSteps} on ${cfg.device}\n`,
        ),
      onStep: (m) => {
        if (m.step % cfg.log_every === 0 || m.step === cfg.steps) process.stderr.write(`step ${m.step}/${cfg.steps} loss ${m.loss.toFixed(4)} cell accuracy ${(100 * m.cell_accuracy).toFixed(1)}% grad_norm ${m.grad_norm.toFixed(3)} ${Math.round(m.tokens_per_s)} tokens/s\n`);
      },
      onCheckpoint: (dir) => process.stderr.write(`checkpoint ${dir}\n`),
    },
    stop: () => undefined,
  };
}

/** Progress lines of a pass over rows, at most every two seconds. */
function progress(name: string) {
  let last = 0;
  return {
    onProgress: (done: number, total: number) => {
      if (done === total || performance.now() - last > 2000) {
        last = performance.now();
        process.stderr.write(`${name}: ${done}/${total}\n`);
      }
    },
  };
}

const data: CommandModule = {
  command: 'data',
  describe: "Sample the critic's training data: per prompt, --samples_thinking attempts with thinking on and --samples_non_thinking with it off, graded, to Parquet (the run of `lathe generate`)",
  builder: (y) => addSchemaFlags(y, generateSchema).example('$0 critic data --model Qwen3-0.6B --data math.jsonl --samples_thinking 4 --samples_non_thinking 4 --output critic-data.parquet --device cuda', 'four attempts per prompt in each mode'),
  handler: async (argv) => {
    const result = await runGenerate(configFromArgv(generateSchema, argv));
    console.log(JSON.stringify(result));
  },
};

const train: CommandModule = {
  command: 'train',
  describe: 'Train an in-context critic: at each token of an attempt, the joint (reward, remaining length) bin as a distribution token, after the prompt and earlier attempts with their feedback',
  builder: (y) => addSchemaFlags(y, criticTrainSchema).example('$0 critic train --model Qwen3-0.6B --data critic-data.parquet --device cuda --compute_dtype bfloat16', 'a critic from trajectories'),
  handler: async (argv) => {
    const cfg = configFromArgv(criticTrainSchema, argv);
    const run = await runReported(criticReporter(cfg), (events, signal) => runCriticTrain(cfg, events, signal));
    finishRun(run, { run_dir: cfg.run_dir, steps: run.value.steps, final_loss: Number(run.value.finalLoss.toFixed(4)), checkpoint: run.value.checkpoint, interrupted: run.value.interrupted });
  },
};

const label: CommandModule = {
  command: 'label',
  describe: "Label trajectories with a critic: Q and expected remaining length of each output token and of every min-p candidate of the reference policy, to Parquet",
  builder: (y) => addSchemaFlags(y, criticLabelSchema),
  handler: async (argv) => console.log(JSON.stringify(await runCriticLabel(configFromArgv(criticLabelSchema, argv), progress('critic label')))),
};

const evaluate: CommandModule = {
  command: 'eval',
  describe: "Evaluate a critic on held-out trajectories: AUC and calibration (reliability table, ECE) of the first token's Q against the outcome, and remaining-length MAE, for 0…max_context in-context attempts",
  builder: (y) => addSchemaFlags(y, criticEvalSchema),
  handler: async (argv) => {
    const points = await runCriticEval(configFromArgv(criticEvalSchema, argv), progress('critic eval'));
    for (const p of points) console.log(JSON.stringify({ ...p, reliability: p.reliability.filter((b) => b.count > 0) }));
  },
};

/** `lathe critic`: the in-context critic (data, train, label, eval). */
export const criticCommand: CommandModule = {
  command: 'critic',
  describe: 'In-context critic (ICL-V): sample data, train, label trajectories with per-token Q, evaluate',
  builder: (y) => y.command(data).command(train).command(label).command(evaluate).demandCommand(1, 'name a subcommand: data, train, label or eval'),
  handler: () => undefined,
};
