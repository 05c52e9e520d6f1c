import type { CommandModule } from 'yargs';
import { SingleBar, Presets } from 'cli-progress';
import { describeDecode, describeWeights, evalSchema, runEval, type EvalConfig, type EvalRunEvents, type EvalRunResult } from '@lathe/recipes';
import { addSchemaFlags, configFromArgv } from '../config-flags';
import { runInterruptible, stopExitCode, type StopSignal } from '../interrupt';

/** Progress of an eval: a bar per model on stderr when it is a terminal, a line per model otherwise. */
function evalReporter(cfg: EvalConfig): { events: EvalRunEvents; stop(): void } {
  const tty = Boolean(process.stderr.isTTY);
  const bar = new SingleBar({ format: 'eval {label} |{bar}| {value}/{total} samples | graded {graded} | {tps} tok/s', stream: process.stderr, hideCursor: true }, Presets.shades_classic);
  let running = false;
  let started = 0;
  let label = '';
  const stop = () => {
    if (running) bar.stop();
    running = false;
  };
  const events: EvalRunEvents = {
    onModelStart: (i) => {
      label = i.label;
      const fallback = i.why ? ` (the kv-cache engine cannot run: ${i.why})` : '';
      const decode = describeDecode(i.decode);
      process.stderr.write(`eval ${i.label}: ${i.problems} problems, ${i.samples} samples; ${i.engine} engine on ${cfg.device}${fallback}${decode ? ` with ${decode}` : ''}\n`);
      const weights = describeWeights(i.weights);
      if (weights) process.stderr.write(`  weights: ${weights}\n`);
      started = performance.now();
      if (tty) {
        bar.start(i.samples, 0, { label, graded: 0, tps: '-' });
        running = true;
      }
    },
    onProgress: (p) => {
      if (tty) bar.update(p.samples, { label, graded: p.graded, tps: Math.round(p.tokens / Math.max(1e-3, (performance.now() - started) / 1000)) });
    },
    onModelDone: (m) => {
      stop();
      const t = m.timing;
      const all = Object.values(m.metrics);
      const samples = all.reduce((s, x) => s + x.samples, 0);
      const share = (f: (x: (typeof all)[number]) => number) => `${((100 * all.reduce((s, x) => s + f(x) * x.samples, 0)) / Math.max(1, samples)).toFixed(1)}%`;
      process.stderr.write(
        `eval ${m.label}: avg ${(100 * m.average).toFixed(1)}%; no answer in ${share((x) => x.noAnswerRate)} of ${samples} completions, ${share((x) => x.truncationRate)} truncated` +
          `${t ? `; ${t.totalS.toFixed(1)} s (generation ${t.generationS.toFixed(1)} s, grading after it ${t.gradingTailS.toFixed(2)} s)` : ''}; ${m.file}\n`,
      );
    },
  };
  return { events, stop };
}

/** Runs the eval (or a regrade), prints the table and a one-line JSON summary. */
export async function evalMain(cfg: EvalConfig): Promise<EvalRunResult> {
  const reporter = evalReporter(cfg);
  let result: EvalRunResult;
  let stoppedBy: StopSignal | undefined;
  try {
    ({ value: result, stoppedBy } = await runInterruptible((signal) => runEval(cfg, reporter.events, signal), 'stopping before the next generation run (finished models are kept)'));
  } finally {
    reporter.stop();
  }
  process.stderr.write(`${result.table}\n`);
  console.log(JSON.stringify({ run_dir: result.runDir, models: result.models.map((m) => ({ label: m.label, average: m.average, ...Object.fromEntries(Object.entries(m.metrics).map(([b, x]) => [b, x.avgAtN])) })), interrupted: result.interrupted }));
  if (result.interrupted) process.exitCode = stopExitCode(stoppedBy);
  return result;
}

/** `lathe eval`: the math benchmark table of one or more models. */
export const evalCommand: CommandModule = {
  command: 'eval',
  describe:
    'Evaluate models on AIME24, AIME25, AMC23, MATH-500, Minerva, OlympiadBench and GSM8K: n samples per problem, graded while generating; avg@n, pass@k, maj@n (best-of-n with --reward_model), lengths and truncation; ' +
    'completions and verdicts as Parquet in --run_dir, the table on stderr and as summary.json / summary.md. --regrade RUN_DIR grades saved completions again',
  builder: (y) =>
    addSchemaFlags(y, evalSchema)
      .example('$0 eval --model models/Qwen3-0.6B --device cuda', 'the seven-benchmark table (n = 8 on AIME/AMC, 1 on the others)')
      .example('$0 eval --model a,b --benchmarks aime24,math500 --n 16 --run_dir runs/eval-ab', 'two models in one table')
      .example('$0 eval --regrade runs/eval-ab', 'grade the saved completions again'),
  handler: async (argv) => {
    await evalMain(configFromArgv(evalSchema, argv));
  },
};
