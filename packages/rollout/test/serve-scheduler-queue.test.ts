/**
 * The scheduler's max_queue counts the requests that wait for rows, not those the free rows take:
 * requests that arrive together, before the loop admits any (e.g. one batch of messages from the
 * HTTP thread), are refused only past the free rows plus max_queue. Hand-counted cases.
 */
import { Device } from '@lathe/runtime';
import { CausalLM, type HfConfig } from '@lathe/models';
import { Scheduler, ServerBusyError, SlotEngine } from '@lathe/rollout';
import { tinyModel, tinyQwen3 } from './helpers';

const wideQwen3: HfConfig = { ...tinyQwen3, hidden_size: 64, head_dim: 16 };
const { dir } = tinyModel(wideQwen3, 5);
const model = CausalLM.fromPretrainedSync(dir, { device: Device.cpu() });
afterAll(() => model.dispose());

/** Submits requests of these sample counts in one turn; which were refused as busy. */
async function burst(slots: number, maxQueue: number, ns: number[]): Promise<boolean[]> {
  const engine = SlotEngine.create(model, { slots, maxLength: 16 });
  const scheduler = new Scheduler(engine, { maxQueue, admitWaitMs: 0 });
  const refused: boolean[] = [];
  const done: Promise<void>[] = [];
  for (const n of ns) {
    try {
      done.push(scheduler.submit({ prompt: [1, 2], n, maxTokens: 2, sampling: { temperature: 0 }, seed: 0, onToken: () => undefined, onFinish: () => undefined }).done);
      refused.push(false);
    } catch (e) {
      expect(e).toBeInstanceOf(ServerBusyError);
      refused.push(true);
    }
  }
  await Promise.all(done);
  expect([engine.busy, scheduler.load.queued]).toEqual([0, 0]);
  engine.dispose();
  return refused;
}

test('one free row, max_queue 1: of four at once, one takes the row, one waits, two are refused', async () => {
  expect(await burst(1, 1, [1, 1, 1, 1])).toEqual([false, false, true, true]);
});

test('max_queue 0: requests that the free rows take are served, the rest refused; n counts rows', async () => {
  expect(await burst(3, 0, [1, 1, 1, 1])).toEqual([false, false, false, true]);
  // 2 + 1 rows fit in 3; a request of 2 that does not fit waits (and max_queue 0 refuses it)
  expect(await burst(3, 0, [2, 1, 2])).toEqual([false, false, true]);
  // FIFO: a request that waits keeps later ones waiting too, even a small one
  expect(await burst(3, 1, [2, 2, 1])).toEqual([false, false, true]);
});
