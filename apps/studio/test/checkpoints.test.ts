/**
 * The chat page's checkpoint servers: a checkpoint is served on first use, reused after, and with
 * the limit reached the least recently used one is closed (its port stops answering).
 */
import { cpSync, mkdirSync, mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { CheckpointChats, listChatCheckpoints } from '@lathe/studio';
import { tinyChatModel } from './chat-model';

test('served on first use, reused, and the least recently used closed at the limit', async () => {
  const root = mkdtempSync(join(tmpdir(), 'lathe-studio-ckpt-'));
  const model = tinyChatModel('tiny-qwen3');
  for (const step of [1, 2]) {
    const dir = join(root, 'run', 'checkpoints', `step-0000000${step}`);
    mkdirSync(dir, { recursive: true });
    cpSync(model, dir, { recursive: true });
    writeFileSync(join(dir, 'trainer_state.json'), JSON.stringify({ step }));
  }
  writeFileSync(join(root, 'run', 'config.yaml'), 'model: tiny\n');
  expect(listChatCheckpoints(root).map((c) => [c.id, c.servable])).toEqual([
    ['run@1', true],
    ['run@2', true],
  ]);
  const pool = new CheckpointChats(root, { device: 'cpu', maxModelLen: 1024, max: 1 });
  const answers = async (url: string) => ((await (await fetch(`${url}/models`)).json()) as { data: { id: string }[] }).data.map((m) => m.id);
  try {
    const a = await pool.endpoint('run@1');
    expect(await answers(a.url)).toEqual([a.model]);
    expect((await pool.endpoint('run@1')).url).toBe(a.url); // reused
    const b = await pool.endpoint('run@2');
    expect(pool.open).toEqual(['run@2']);
    await expect(fetch(`${a.url}/models`)).rejects.toThrow(); // closed
    expect(await answers(b.url)).toEqual([b.model]);
    await expect(pool.endpoint('run@3')).rejects.toThrow("checkpoint 'run@3': no such checkpoint under the root");
  } finally {
    await pool.close();
  }
  expect(pool.open).toEqual([]);
}, 60_000);
