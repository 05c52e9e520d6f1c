/**
 * @lathe/studio — Lathe Studio, a local web app over run directories: runs, metric plots, the
 * rollout store, token values and chat with checkpoints through `lathe serve`'s API.
 *
 * ```ts
 * const studio = await startStudio({ ...defaults(studioSchema), root: 'runs', port: 0 });
 * console.log(studio.url); // http://127.0.0.1:PORT/
 * await studio.close();
 * ```
 */
import type { AddressInfo } from 'node:net';
import type { Server } from 'node:http';
import { existsSync, statSync } from 'node:fs';
import { resolve } from 'node:path';
import { defaults, listenOn, serveSchema, startServe, type RunningServe, type ServeEvents, type StudioConfig } from '@lathe/recipes';
import { ensureAssets } from './assets';
import { CheckpointChats } from './checkpoints';
import { createStudioServer } from './server';

export { buildAssets, ensureAssets, ASSETS_DIR } from './assets';
export { createStudioServer, insideRoot, loopbackHost, type StudioServerOptions } from './server';
export { listRunInfos, readMetricsFile, runInfo, type MetricsFile, type RunInfo } from './runs';
export { listParquet, tokenCells, trajectoryTokens, type TokenCell, type TokenView } from './tokens';
export { CheckpointChats, listChatCheckpoints, type ChatCheckpoint } from './checkpoints';

/** A running studio. */
export interface RunningStudio {
  server: Server;
  /** The app's address, e.g. `http://127.0.0.1:8080/`. */
  url: string;
  port: number;
  /** The chat API the app talks to (in-process `lathe serve`, `--serve_url`, or null). */
  chatUrl: string | null;
  /** Stops the app and the in-process chat server. */
  close(): Promise<void>;
}

/** Progress callbacks. */
export interface StudioEvents {
  /** A chat model is loading (--model). */
  onLoad?: ServeEvents['onLoad'];
}

/** Builds the browser files if needed, starts the chat server for --model and listens. */
export async function startStudio(cfg: StudioConfig, events: StudioEvents = {}): Promise<RunningStudio> {
  const root = resolve(cfg.root);
  if (!existsSync(root) || !statSync(root).isDirectory()) throw new Error(`--root ${cfg.root}: no such directory (the folder holding run directories)`);
  if (cfg.model && cfg.serve_url) throw new Error('--model and --serve_url: give one (chat with models served here, or through a running server)');
  if (cfg.serve_url && !/^https?:\/\//.test(cfg.serve_url)) throw new Error(`--serve_url ${cfg.serve_url}: expected an http:// or https:// URL such as http://127.0.0.1:8000/v1`);
  const assets = await ensureAssets();
  let chat: RunningServe | null = null;
  if (cfg.model) {
    chat = await startServe({ ...defaults(serveSchema), model: cfg.model, device: cfg.device, host: '127.0.0.1', port: 0, max_rows: 4, max_model_len: cfg.max_model_len }, { onLoad: events.onLoad });
  }
  const chatUrl = chat ? chat.url : cfg.serve_url || null;
  const loopbackOnly = /^(127\.|::1$|localhost$)/.test(cfg.host);
  const checkpoints = cfg.chat_checkpoints && !cfg.serve_url ? new CheckpointChats(root, { device: cfg.device, maxModelLen: cfg.max_model_len }) : null;
  const server = createStudioServer({ root, assets, chatUrl, serveUrl: cfg.serve_url || null, tokenizer: cfg.tokenizer, pollMs: cfg.poll_ms, loopbackOnly, checkpoints });
  try {
    await listenOn(server, cfg.host, cfg.port);
  } catch (e) {
    await chat?.close();
    throw e;
  }
  const port = (server.address() as AddressInfo).port;
  const host = cfg.host.includes(':') ? `[${cfg.host}]` : cfg.host;
  return {
    server,
    url: `http://${host}:${port}/`,
    port,
    chatUrl,
    close: async () => {
      const closed = new Promise<void>((r) => server.close(() => r()));
      server.closeAllConnections();
      await closed;
      await chat?.close();
      await checkpoints?.close();
    },
  };
}
