/**
 * A child process for the crash test: writes training rollouts as fast as it can through a
 * RolloutStore and prints `committed N` after each batch is committed, until it is killed.
 * Usage: tsx rollout-writer.ts <db> <batchSize> <payloadBytes>
 */
import { RolloutStore } from '@lathe/data';

async function main(): Promise<void> {
  const [file, batch, payload] = [process.argv[2], Number(process.argv[3]), Number(process.argv[4])];
  const store = await RolloutStore.open(file, { batchSize: batch, flushIntervalMs: 0 });
  const text = 'x'.repeat(payload);
  for (let i = 0; ; i++) {
    store.addTrain({ step: Math.floor(i / 8), epoch: 0, prompt_index: i, rollout_index: i % 8, prompt: `prompt ${i}`, completion: `${i}:${text}`, reward: i % 2, advantage: -i, extra: { i } });
    if ((i + 1) % batch === 0) {
      await store.flush();
      process.stdout.write(`committed ${store.committed}\n`);
    }
  }
}

main().catch((e: unknown) => {
  process.stderr.write(`${e instanceof Error ? e.message : String(e)}\n`);
  process.exit(1);
});
