import type { CommandModule } from 'yargs';
import { SingleBar, Presets } from 'cli-progress';
import { describeDecode, describeWeights, generatePaths, generateSchema, runGenerate, type GenerateConfig, type GenerateEvents, type GenerateResult } from '@lathe/recipes';
import { addSchemaFlags, configFromArgv } from '../config-flags';
import { runInterruptible, stopExitCode, type StopSignal } from '../interrupt';

/** Progress for a generation run: a bar on stderr when it is a terminal, a line per part otherwise. */
export function generateReporter(cfg: GenerateConfig): { events: GenerateEvents; stop(): void } {
  const tty = Boolean(process.stderr.isTTY);
  const bar = new SingleBar({ format: 'generate |{bar}| {value}/{total} samples | {tps} tok/s | part {part}', stream: process.stderr, hideCursor: true }, Presets.shades_classic);
  let running = false;
  let started = 0;
  let tokens = 0;
  let parts = '-';
  const tps = () => Math.round(tokens / Math.max(1e-3, (performance.now() - started) / 1000));
  const events: GenerateEvents = {
    onStart: (i) => {
      const fallback = i.why ? ` (the kv-cache engine cannot run: ${i.why})` : '';
      const decode = describeDecode(i.decode);
      process.stderr.write(
        `generate: ${i.prompts} prompts × ${cfg.samples_thinking + cfg.samples_non_thinking} samples = ${i.samples} rows in ${i.parts} part${i.parts === 1 ? '' : 's'}` +
          `${i.partsDone ? ` (${i.partsDone} done before)` : ''}; ${i.engine} engine on ${cfg.device}${fallback}${decode ? ` with ${decode}` : ''}\n`,
      );
      const weights = describeWeights(i.weights);
      if (weights) process.stderr.write(`  weights: ${weights}\n`);
      started = performance.now();
      parts = `${i.partsDone}/${i.parts}`;
      if (tty) {
        bar.start(i.samples, i.samplesDone, { tps: '-', part: parts });
        running = true;
      }
    },
    onProgress: (p) => {
      tokens = p.tokens;
      if (tty) bar.update(p.samples, { tps: tps(), part: parts });
    },
    onEngineShrink: (from, to) => process.stderr.write(`\ngenerate: out of device memory with ${from} rows per run; retrying with ${to} (--batch_size ${to} avoids the retry)\n`),
    onPart: (p) => {
      parts = `${p.index + 1}/${parts.split('/')[1]}`;
      if (tty) bar.update({ part: parts });
      else process.stderr.write(`part ${p.index + 1} written (${p.rows} rows, ${tps()} tok/s): ${p.file}\n`);
    },
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
 * Runs generation and prints a one-line JSON summary. Ctrl-C or SIGTERM stops it before the next
 * generation run, keeping the complete parts (exit status 130 or 143); a second quits at once.
 */
export async function generateMain(cfg: GenerateConfig): Promise<GenerateResult> {
  const reporter = generateReporter(cfg);
  let result: GenerateResult;
  let stoppedBy: StopSignal | undefined;
  try {
    ({ value: result, stoppedBy } = await runInterruptible((signal) => runGenerate(cfg, reporter.events, signal), 'stopping before the next generation run (complete parts are kept)'));
  } finally {
    reporter.stop();
  }
  console.log(
    JSON.stringify({
      output: result.interrupted ? null : result.output,
      rows: result.rows,
      prompts: result.prompts,
      parts_generated: result.partsGenerated,
      parts_resumed: result.partsResumed,
      new_tokens: result.tokens,
      correct_mean: result.correctMean,
      prefill_s: result.engineSeconds.prefill,
      decode_s: result.engineSeconds.decode,
      interrupted: result.interrupted,
    }),
  );
  if (result.interrupted) {
    process.stderr.write(`interrupted: the complete parts are in ${generatePaths(cfg.output).parts}; run the same command with --resume to finish\n`);
    process.exitCode = stopExitCode(stoppedBy);
  }
  return result;
}

/** `lathe generate`: prompts in, trajectory Parquet out (thinking and non-thinking samples per prompt). */
export const generateCommand: CommandModule = {
  command: 'generate',
  describe:
    'Sample completions of JSONL/Parquet prompts (thinking on and off per prompt with --prompt_format chat) and write trajectory Parquet: prompt_idx, prompt, prompt_token_ids, output_token_ids, correct, thinking, sample_idx, finish_reason. ' +
    'Written in parts (--shard_prompts) so that a crash or Ctrl-C loses at most one; --resume finishes an interrupted run with the same result',
  builder: (y) =>
    addSchemaFlags(y, generateSchema)
      .example('$0 generate --model models/Qwen3-0.6B --data math500.jsonl --output gen/math500.parquet --device cuda --temperature 0.6 --top_p 0.95', '4 thinking + 4 non-thinking samples per MATH-500 problem, graded')
      .example('$0 generate --config gen.yaml --resume', 'finish an interrupted run (same config; --batch_size and --generation_engine may change)'),
  handler: async (argv) => {
    await generateMain(configFromArgv(generateSchema, argv));
  },
};
