import type { CommandModule } from 'yargs';
import { studioSchema, type StudioConfig } from '@lathe/recipes';
import { startStudio } from '@lathe/studio';
import { addSchemaFlags, configFromArgv } from '../config-flags';
import { runInterruptible, stopExitCode } from '../interrupt';

/** Starts the app and serves until Ctrl-C or SIGTERM (exit 130 or 143); prints one JSON line once it listens. */
export async function studioMain(cfg: StudioConfig): Promise<void> {
  const { stoppedBy } = await runInterruptible(async (signal) => {
    const studio = await startStudio(cfg, {
      onLoad: (m) => process.stderr.write(`studio: loading ${m.id} from ${m.dir} for chat (${m.dtype} on ${cfg.device})\n`),
    });
    console.log(JSON.stringify({ url: studio.url, root: cfg.root, chat: studio.chatUrl }));
    await new Promise<void>((r) => (signal.aborted ? r() : signal.addEventListener('abort', () => r(), { once: true })));
    await studio.close();
  }, 'stopping the app');
  if (stoppedBy) process.exitCode = stopExitCode(stoppedBy);
}

/** `lathe studio`: a local web app over the runs under --root. */
export const studioCommand: CommandModule = {
  command: 'studio',
  describe: 'A local web app over your runs: run list and configs, metric plots (live), the rollout store as a filtered table, token values, and chat with checkpoints through lathe serve',
  builder: (y) =>
    addSchemaFlags(y, studioSchema)
      .example('$0 studio --root runs', 'browse runs/ on http://127.0.0.1:8080/')
      .example('$0 studio --root runs --model base=models/Qwen3-0.6B --model tuned=runs/sft/checkpoints/step-00000100', 'and chat with a base model and its trained checkpoint side by side'),
  // --model may be repeated: yargs gives a list, the schema a comma-separated string.
  handler: async (argv) => studioMain(configFromArgv(studioSchema, { ...argv, model: Array.isArray(argv.model) ? argv.model.join(',') : argv.model })),
};
