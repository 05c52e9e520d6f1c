/**
 * Starts the code sandbox's HTTP service on 127.0.0.1 and keeps it running until interrupted.
 * Usage: npx tsx --conditions=lathe-source tools/graders/sandbox-service.ts [port] [concurrency]
 */
import { sandboxAvailable, startSandboxService } from '@lathe/graders';

async function main(): Promise<void> {
  const port = Number(process.argv[2] ?? 8080);
  const concurrency = Number(process.argv[3] ?? 4);
  if (!Number.isInteger(port) || port < 0 || port > 65535) throw new Error(`port must be an integer 0-65535, got ${process.argv[2]}`);
  if (!Number.isInteger(concurrency) || concurrency < 1) throw new Error(`concurrency must be a positive integer, got ${process.argv[3]}`);
  if (!sandboxAvailable()) throw new Error('bubblewrap (/usr/bin/bwrap) is not installed: run tools/setup/system-deps.sh as root');
  const service = await startSandboxService({ port, concurrency });
  console.log(`sandbox service on ${service.url} (POST /run, /tests, /run_code; GET /health), ${concurrency} runs at once`);
  const stop = () => void service.close().then(() => process.exit(0));
  process.on('SIGINT', stop);
  process.on('SIGTERM', stop);
}

main().catch((e: unknown) => {
  console.error(e instanceof Error ? e.message : String(e));
  process.exit(1);
});
