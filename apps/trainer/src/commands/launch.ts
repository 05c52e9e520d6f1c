import type { CommandModule } from 'yargs';
import { launchSchema, runLaunch, type LaunchConfig } from '@lathe/recipes';
import { addSchemaFlags, configFromArgv } from '../config-flags';
import { runInterruptible } from '../interrupt';

/**
 * The lathe commands that join a data-parallel job (split the global batch, all-reduce gradients,
 * write the run directory from rank 0 only). Any other lathe command would run N independent copies
 * writing one run directory, so it is refused.
 */
export const DATA_PARALLEL_COMMANDS: ReadonlySet<string> = new Set<string>(['sft', 'rm train', 'dpo', 'grpo']);

/**
 * The program each rank runs: a lathe command (`sft …`) runs this CLI again, as it was started
 * (node, its loader flags and the entry script); anything else runs as given (`node train.js`).
 */
export async function rankCommand(words: readonly string[], dataParallel: ReadonlySet<string> = DATA_PARALLEL_COMMANDS): Promise<string[]> {
  // required here, not imported at the top: index.ts imports this file, and a cycle at load time
  // leaves one of the two undefined in whichever loads first
  // eslint-disable-next-line @typescript-eslint/no-require-imports
  const { commands } = require('./index') as typeof import('./index');
  const names = new Set(commands.map((c) => String(c.command).split(' ')[0]));
  if (!names.has(words[0])) return [...words];
  // an entry is a command ('sft') or a command and its subcommand ('rm train')
  if (!dataParallel.has(words[0]) && !dataParallel.has(words.slice(0, 2).join(' '))) {
    const which = dataParallel.size ? `the commands that do: ${[...dataParallel].join(', ')}` : 'none does yet in this build';
    throw new Error(`lathe ${words.slice(0, 2).join(' ')} does not join a data-parallel job (${which}); lathe launch would start independent copies writing one run directory`);
  }
  return [process.execPath, ...process.execArgv, process.argv[1], ...words];
}

/** Runs the ranks of this host and exits with the first failed rank's status (0 when all succeed). */
export async function launchMain(cfg: LaunchConfig, words: readonly string[]): Promise<void> {
  const command = await rankCommand(words);
  const { value } = await runInterruptible(
    (signal) => runLaunch(cfg, command, { stdout: (t) => process.stdout.write(t), stderr: (t) => process.stderr.write(t) }, signal),
    'stopping every rank (each saves a checkpoint after its current step)',
  );
  process.exitCode = value.exitCode;
}

/** `lathe launch`: one process per GPU of this host, with torchrun's variables. */
export const launchCommand: CommandModule = {
  command: 'launch',
  describe: 'Run a command as a data-parallel job: one process per GPU (or CPU rank), each with RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT set; a rank that fails stops the others',
  builder: (y) =>
    addSchemaFlags(y, launchSchema)
      .parserConfiguration({ 'populate--': true })
      .example('$0 launch --gpus 4 -- sft --config sft.yaml --device cuda', 'SFT on 4 GPUs (the global --batch_size split over them)')
      .example('$0 launch --gpus 8 --nnodes 2 --node_rank 0 --master_addr 10.0.0.1 -- sft --config sft.yaml --device cuda', 'node 0 of a two-node job (run node 1 with --node_rank 1)'),
  handler: async (argv) => {
    const words = ((argv['--'] as unknown[] | undefined) ?? []).map(String);
    await launchMain(configFromArgv(launchSchema, argv), words);
  },
};
