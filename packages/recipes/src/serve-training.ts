/**
 * `lathe grpo --serve_port`: the policy being trained, served over `lathe serve`'s OpenAI API from
 * the trainer's own device weights — the compute-dtype buffers the rollouts generate from, with no
 * copy and no reload. Before the trainer rewrites those buffers (after each RL step's update) the
 * server stops admitting requests and lets the running ones finish, so each request is answered
 * by one version of the weights; its `system_fingerprint` names the step (`step-N`).
 */
import type { AddressInfo } from 'node:net';
import type { DecoderConfig } from '@lathe/models';
import type { DType } from '@lathe/onnx';
import type { Device } from '@lathe/runtime';
import type { GrpoTrainer } from '@lathe/grpo';
import { createOpenAiServer, Scheduler, SlotEngine } from '@lathe/rollout';
import { HfTokenizer } from '@lathe/tokenizer';
import { listenOn } from './serve';

/** A server over a training policy. */
export interface TrainingServe {
  /** The API's base URL, e.g. `http://127.0.0.1:8000/v1`. */
  url: string;
  /** Rewrites the served weights from the trainer's current ones (after an update), pausing requests meanwhile. */
  refresh(): Promise<void>;
  /** Stops accepting requests, lets running ones finish, then frees the engine (not the weights). */
  close(): Promise<void>;
}

/** Where and how to serve a training policy. */
export interface TrainingServeOptions {
  host: string;
  /** 0: any free port. */
  port: number;
  /** The model id clients send (the run directory's name). */
  id: string;
  /** A folder with the policy's Hugging Face tokenizer files (`--serve_port` needs one). */
  tokenizerFrom: string | undefined;
  device: Device;
  config: DecoderConfig;
  dtype: DType;
  stopIds: readonly number[];
  /** Rows decoding at once, and the longest prompt + completion. */
  rows: number;
  maxModelLen: number;
  /** One line per finished request. */
  log?: (line: string) => void;
}

/** Starts serving `trainer`'s policy; resolves once the server listens. */
export async function serveTrainingPolicy<M>(trainer: GrpoTrainer<M>, o: TrainingServeOptions): Promise<TrainingServe> {
  if (!o.tokenizerFrom) throw new Error('--serve_port serves text through the model\'s Hugging Face tokenizer, and this run uses the built-in one: train a model folder with tokenizer files');
  const tokenizer = await HfTokenizer.fromFolder(o.tokenizerFrom);
  // the RL step whose weights the buffers hold
  let step = trainer.steps;
  // the scheduler exists only once the weights do: the guard reads it through this holder
  const served: { scheduler?: Scheduler } = {};
  const guard = {
    before: async () => {
      await served.scheduler?.quiesce();
    },
    after: () => {
      step = trainer.steps;
      served.scheduler?.resume();
    },
  };
  const weights = await trainer.servingWeights(guard);
  const engine = SlotEngine.create(o.device, o.config, weights, { slots: o.rows, maxLength: o.maxModelLen, dtype: o.dtype, padTokenId: tokenizer.padId < o.config.vocabSize ? tokenizer.padId : 0 });
  const running = new Scheduler(engine, {});
  served.scheduler = running;
  const server = createOpenAiServer({ models: [{ id: o.id, scheduler: running, tokenizer, stopIds: o.stopIds, maxN: o.rows, fingerprint: () => `step-${step}` }], log: o.log });
  try {
    await listenOn(server, o.host, o.port);
  } catch (e) {
    engine.dispose();
    throw e;
  }
  const port = (server.address() as AddressInfo).port;
  const host = o.host.includes(':') ? `[${o.host}]` : o.host;
  return {
    url: `http://${host}:${port}/v1`,
    refresh: async () => {
      await trainer.servingWeights(guard);
    },
    close: async () => {
      running.close();
      const closed = new Promise<void>((r) => server.close(() => r()));
      server.closeIdleConnections();
      await running.idle();
      server.closeAllConnections();
      await closed;
      engine.dispose();
    },
  };
}
