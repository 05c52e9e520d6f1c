import type { CommandModule } from 'yargs';
import { describeDecode, describeWeights, serveSchema, startServe, type ServeConfig } from '@lathe/recipes';
import { addSchemaFlags, configFromArgv } from '../config-flags';
import { runInterruptible, stopExitCode } from '../interrupt';

/**
 * Starts the server and serves until Ctrl-C or SIGTERM, which stop new requests, let running ones
 * finish and exit 130 or 143. Prints one JSON line once it listens (the URL and model ids).
 */
export async function serveMain(cfg: ServeConfig): Promise<void> {
  const { stoppedBy } = await runInterruptible(async (signal) => {
    const running = await startServe(cfg, {
      onLoad: (m) => {
        const decode = describeDecode(m.decode);
        process.stderr.write(`serve: loading ${m.id} from ${m.dir} (${m.rows} rows × ${m.maxModelLen} positions, ${m.dtype} on ${cfg.device}${decode ? ` with ${decode}` : ''})\n`);
      },
      onLoaded: (m) => {
        const weights = describeWeights(m.weights);
        if (weights) process.stderr.write(`  weights: ${weights}\n`);
      },
      onRequest: (line) => process.stderr.write(`${line}\n`),
    });
    console.log(JSON.stringify({ url: running.url, models: running.models.map((m) => m.id) }));
    await new Promise<void>((r) => (signal.aborted ? r() : signal.addEventListener('abort', () => r(), { once: true })));
    await running.close();
  }, 'finishing the running requests, then stopping');
  if (stoppedBy) process.exitCode = stopExitCode(stoppedBy);
}

/** `lathe serve`: an OpenAI-compatible server with continuous batching. */
export const serveCommand: CommandModule = {
  command: 'serve',
  describe: 'Serve models over an OpenAI-compatible HTTP API (POST /v1/chat/completions, /v1/completions; GET /v1/models, /health) with continuous batching on the KV-cache engine',
  builder: (y) =>
    addSchemaFlags(y, serveSchema)
      .example('$0 serve --model models/Qwen3-0.6B --device cuda --port 8000', 'one model, id Qwen3-0.6B, on http://127.0.0.1:8000/v1')
      .example('$0 serve --model policy=runs/grpo/checkpoint --model judge=models/Qwen3-1.7B --device cuda', 'two models in one process, sharing the GPU'),
  // --model may be repeated: yargs gives a list, the schema a comma-separated string.
  handler: async (argv) => serveMain(configFromArgv(serveSchema, { ...argv, model: Array.isArray(argv.model) ? argv.model.join(',') : argv.model })),
};
