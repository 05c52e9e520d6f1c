/**
 * Chat with any checkpoint of the runs under the root: the chat page lists every checkpoint of
 * every run, and a checkpoint picked for a side is served in-process by `lathe serve`'s engine on
 * first use (a loopback port of its own), at most `max` at a time — the least recently used is
 * closed when another is needed.
 */
import { existsSync, readFileSync } from 'node:fs';
import { join, relative } from 'node:path';
import { defaults, serveSchema, startServe, type RunningServe } from '@lathe/recipes';
import { listRunInfos } from './runs';

/** One checkpoint as the chat page lists it. */
export interface ChatCheckpoint {
  /** `<run>@<step>`: what the chat page sends as the model. */
  id: string;
  run: string;
  step: number;
  /** Its folder, relative to the root. */
  dir: string;
  /** Whether it can be served (a Hugging Face folder with tokenizer files); `why` says what is missing. */
  servable: boolean;
  why?: string;
}

/** The prefix of a checkpoint's model id in chat requests. */
export const CHECKPOINT_PREFIX = 'checkpoint:';

/** Every checkpoint of every run under `root`, newest runs first, steps in order. */
export function listChatCheckpoints(root: string): ChatCheckpoint[] {
  return listRunInfos(root).flatMap((r) =>
    r.checkpoints.map((c) => {
      const missing = ['config.json', 'tokenizer.json', 'tokenizer_config.json'].filter((f) => !existsSync(join(c.dir, f)));
      return {
        id: `${r.name}@${c.step}`,
        run: r.name,
        step: c.step,
        dir: relative(root, c.dir),
        servable: missing.length === 0,
        ...(missing.length ? { why: `no ${missing.join(', ')} (${missing.includes('tokenizer.json') ? 'a run of the built-in task has a character tokenizer, which cannot chat' : 'not a Hugging Face model folder'})` } : {}),
      };
    }),
  );
}

/** The in-process servers of picked checkpoints. */
export class CheckpointChats {
  private readonly servers = new Map<string, { serve: Promise<RunningServe>; used: number }>();
  private clock = 0;

  constructor(
    private readonly root: string,
    private readonly opts: { device: 'cpu' | 'cuda'; maxModelLen: number; max?: number },
  ) {}

  /**
   * The chat API (base URL) and served model id of checkpoint `id` (`<run>@<step>`), starting its
   * server on first use; an unknown or unservable checkpoint is an error naming it.
   */
  async endpoint(id: string): Promise<{ url: string; model: string }> {
    const c = listChatCheckpoints(this.root).find((x) => x.id === id);
    if (!c) throw new Error(`checkpoint '${id}': no such checkpoint under the root (run@step, as the chat page lists them)`);
    if (!c.servable) throw new Error(`checkpoint '${id}' (${c.dir}): cannot be served: ${c.why}`);
    let entry = this.servers.get(id);
    if (!entry) {
      await this.evict(this.opts.max ?? 2);
      const dir = join(this.root, c.dir);
      const positions = Number((JSON.parse(readFileSync(join(dir, 'config.json'), 'utf8')) as { max_position_embeddings?: unknown }).max_position_embeddings) || this.opts.maxModelLen;
      const serve = startServe({ ...defaults(serveSchema), model: `checkpoint=${dir}`, device: this.opts.device, host: '127.0.0.1', port: 0, max_rows: 4, max_model_len: Math.min(this.opts.maxModelLen, positions) });
      entry = { serve, used: 0 };
      this.servers.set(id, entry);
      // a failed start is not kept: the next request tries again and names the error
      serve.catch(() => this.servers.delete(id));
    }
    entry.used = ++this.clock;
    const s = await entry.serve;
    return { url: s.url, model: 'checkpoint' };
  }

  /** Closes least recently used servers until fewer than `keep` are open. */
  private async evict(keep: number): Promise<void> {
    while (this.servers.size >= keep) {
      const [id, oldest] = [...this.servers].sort((a, b) => a[1].used - b[1].used)[0];
      this.servers.delete(id);
      await (await oldest.serve.catch(() => null))?.close();
    }
  }

  /** Ids of the checkpoints being served now. */
  get open(): string[] {
    return [...this.servers.keys()];
  }

  async close(): Promise<void> {
    const all = [...this.servers.values()];
    this.servers.clear();
    await Promise.all(all.map(async (e) => (await e.serve.catch(() => null))?.close()));
  }
}
