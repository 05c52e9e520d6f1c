import type { CommandModule } from 'yargs';
import {
  evaluationMarkdown,
  extractEvalSchema,
  extractGenerateSchema,
  extractRftSchema,
  extractTrainSchema,
  runExtractEval,
  runExtractGenerate,
  runExtractRft,
  runExtractTrain,
  type ExtractTrainEvents,
} from '@lathe/recipes';
import { addSchemaFlags, configFromArgv } from '../config-flags';
import { finishRun, runReported, type Reporter } from '../interrupt';

/** Progress of a train or rft run on stderr: a start line, then a line every --log_every steps. */
function trainReporter(name: string, cfg: { steps: number; log_every: number; device: string }): Reporter<ExtractTrainEvents> {
  return {
    events: {
      onStart: (i) =>
        process.stderr.write(`${name}: ${i.parameters.toLocaleString('en-US')} trained parameters; ${i.trajectories} trajectories (${i.skipped} over --max_length skipped${i.dropped ? `, ${i.dropped} unsuccessful dropped` : ''}); steps ${i.startStep} → ${i.totalSteps} on ${cfg.device}\n`),
      onStep: (m) => {
        if (m.step % cfg.log_every === 0 || m.step === cfg.steps) process.stderr.write(`step ${m.step}/${cfg.steps} loss ${m.loss.toFixed(4)} grad_norm ${m.grad_norm.toFixed(3)} ${Math.round(m.tokens_per_s)} tokens/s\n`);
      },
      onCheckpoint: (dir) => process.stderr.write(`checkpoint ${dir}\n`),
    },
    stop: () => undefined,
  };
}

/** Progress lines of a sampling pass, at most every two seconds. */
function progress(name: string) {
  let last = 0;
  return {
    onProgress: (done: number, total: number, tokens: number) => {
      if (done === total || performance.now() - last > 2000) {
        last = performance.now();
        process.stderr.write(`${name}: ${done}/${total} samples finished, ${tokens} tokens\n`);
      }
    },
  };
}

const generate: CommandModule = {
  command: 'generate',
  describe: "Sample from π_ref·exp(Q/τ): at each step the reference policy's min-p candidates are scored by the critic and the token drawn from the tilted distribution; trajectories with per-token candidates and Q to Parquet, and a token-value HTML page",
  builder: (y) => addSchemaFlags(y, extractGenerateSchema).example('$0 extract generate --model Qwen3-0.6B --critic runs/critic/checkpoints/step-00000500 --data math.jsonl --tau 0.1 --output q-samples.parquet --device cuda', 'Q-weighted samples and q-samples.html'),
  handler: async (argv) => console.log(JSON.stringify(await runExtractGenerate(configFromArgv(extractGenerateSchema, argv), progress('extract generate')))),
};

const train: CommandModule = {
  command: 'train',
  describe: 'Distil the policy towards π_ref·exp(Q/τ) over each position\'s candidates of a labelled Parquet file: KL(π_θ‖π*) (reverse, default) or KL(π*‖π_θ)',
  builder: (y) => addSchemaFlags(y, extractTrainSchema).example('$0 extract train --model Qwen3-0.6B --data labelled.parquet --tau 0.1 --device cuda --compute_dtype bfloat16', 'a policy that needs no critic at inference'),
  handler: async (argv) => {
    const cfg = configFromArgv(extractTrainSchema, argv);
    const run = await runReported(trainReporter('extract train', cfg), (events, signal) => runExtractTrain(cfg, events, signal));
    finishRun(run, { run_dir: cfg.run_dir, steps: run.value.steps, final_loss: Number(run.value.finalLoss.toFixed(4)), checkpoint: run.value.checkpoint, interrupted: run.value.interrupted });
  },
};

const rft: CommandModule = {
  command: 'rft',
  describe: 'Rejection-sampling fine-tuning, the baseline: SFT on the successful trajectories only',
  builder: (y) => addSchemaFlags(y, extractRftSchema),
  handler: async (argv) => {
    const cfg = configFromArgv(extractRftSchema, argv);
    const run = await runReported(trainReporter('extract rft', cfg), (events, signal) => runExtractRft(cfg, events, signal));
    finishRun(run, { run_dir: cfg.run_dir, steps: run.value.steps, final_loss: Number(run.value.finalLoss.toFixed(4)), checkpoint: run.value.checkpoint, interrupted: run.value.interrupted });
  },
};

const evaluate: CommandModule = {
  command: 'eval',
  describe: "Evaluate a policy: accuracy of single samples, the critic's best-of-n and majority vote at n = 1, 4, 16, sampling the policy alone or Q-weighted",
  builder: (y) => addSchemaFlags(y, extractEvalSchema),
  handler: async (argv) => {
    const result = await runExtractEval(configFromArgv(extractEvalSchema, argv), progress('extract eval'));
    console.log(`${result.prompts} prompts × ${result.samples} samples\n\n${evaluationMarkdown(result.table)}`);
  },
};

/** `lathe extract`: policy extraction from a critic (generate, train, rft, eval). */
export const extractCommand: CommandModule = {
  command: 'extract',
  describe: 'Policy extraction (ICL-V): Q-weighted sampling, KL distillation to π_ref·exp(Q/τ), the RFT baseline, best-of-n evaluation',
  builder: (y) => y.command(generate).command(train).command(rft).command(evaluate).demandCommand(1, 'name a subcommand: generate, train, rft or eval'),
  handler: () => undefined,
};
