import type { Argv, CommandModule } from 'yargs';
import { quantizeEvalSchema, quantizeSchema, runQuantize, runQuantizeEval, type QuantizeConfig, type QuantizeEvalConfig } from '@lathe/recipes';
import { addSchemaFlags, configFromArgv, UsageError } from '../config-flags';

/** Quantizes a model folder, a line per 16 layers on stderr, and prints a one-line JSON summary. */
export function quantizeMain(cfg: QuantizeConfig): void {
  if (cfg.model === '') throw new UsageError('--model is required (the model folder to quantize)');
  if (cfg.out === '') throw new UsageError('--out is required (the folder to write the quantized checkpoint to)');
  const s = runQuantize(cfg, {
    onProgress: (done, total, name) => {
      if (done === total || done % 16 === 0) process.stderr.write(`quantize: ${done}/${total} layers (${name})\n`);
    },
  });
  if (s.padded.length > 0) process.stderr.write(`quantize: K of ${s.padded.length} layer(s) is not a multiple of the block size, padded with zero weights: ${s.padded.join(', ')}\n`);
  const round = (x: number) => Number(x.toFixed(4));
  console.log(
    JSON.stringify({
      out: s.out,
      format: s.format,
      layers: s.layers,
      quantized_params: s.quantizedParams,
      total_params: s.totalParams,
      bits_per_quantized_weight: round(s.bitsPerQuantizedWeight),
      bits_per_parameter: round(s.bitsPerParameter),
      padded: s.padded,
      skipped: s.skipped,
      ...(s.lmHead ? { lm_head: s.lmHead.format, lm_head_bytes: s.lmHead.bytes } : {}),
    }),
  );
}

/** Compares a quantized checkpoint with its original and prints a one-line JSON summary. */
export async function quantizeEvalMain(cfg: QuantizeEvalConfig): Promise<void> {
  let last = 0;
  const r = await runQuantizeEval(cfg, {
    onProgress: (done, total) => {
      if (done === total || performance.now() - last > 2000) {
        last = performance.now();
        process.stderr.write(`quantize eval: ${done}/${total} scored\n`);
      }
    },
  });
  const round = (x: number) => Number(x.toPrecision(5));
  if (r.kind === 'causal_lm') {
    const task = r.task ? { graded: r.task.graded, accuracy_original: round(r.task.accuracyOriginal), accuracy_quantized: round(r.task.accuracyQuantized) } : {};
    console.log(JSON.stringify({ kind: r.kind, prompts: r.prompts, tokens: r.tokens, kl_mean: round(r.klMean), kl_max: round(r.klMax), ppl_original: round(r.perplexityOriginal), ppl_quantized: round(r.perplexityQuantized), ppl_change: round(r.perplexityChange), ...task }));
  } else {
    console.log(
      JSON.stringify({
        kind: r.kind,
        pairs: r.pairs,
        accuracy_original: round(r.accuracyOriginal),
        accuracy_quantized: round(r.accuracyQuantized),
        score_correlation: round(r.scoreCorrelation),
        mean_abs_score_change: round(r.meanAbsScoreChange),
        skipped_over_length: r.skipped.overLength,
        skipped_identical: r.skipped.identical,
      }),
    );
  }
}

const evaluate: CommandModule = {
  command: 'eval',
  describe: 'What quantizing changed: for a causal LM, KL(original ‖ quantized) and perplexity on tokens the original generates; for a reward model, pairwise accuracy before and after and the rewards’ correlation',
  builder: (y) =>
    addSchemaFlags(y, quantizeEvalSchema).example('$0 quantize eval --model models/tiny --quantized models/tiny-nf4 --data prompts.jsonl', 'KL and perplexity change of an NF4 checkpoint'),
  handler: async (argv) => quantizeEvalMain(configFromArgv(quantizeEvalSchema, argv)),
};

/** `lathe quantize`: write a quantized checkpoint (INT8, INT4, NF4), or compare one with its original (`eval`). */
export const quantizeCommand: CommandModule = {
  command: 'quantize',
  describe: 'Quantize a model folder’s projections to int8, int4 or nf4 (optionally double-quantized) and write the checkpoint; `quantize eval` measures what it changed',
  builder: (y: Argv) =>
    addSchemaFlags(y, quantizeSchema)
      .command(evaluate)
      .example('$0 quantize --model models/qwen3-0.6b --format nf4 --double_quant --out models/qwen3-0.6b-nf4', 'NF4 with double quantization, in bitsandbytes’ layout')
      .example('$0 quantize --model runs/rm/final --format int8 --out runs/rm/final-int8', 'a reward model to INT8'),
  handler: (argv) => quantizeMain(configFromArgv(quantizeSchema, argv)),
};
