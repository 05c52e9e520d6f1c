/**
 * `--serve_port` of a training command: the policy being trained, served over `lathe serve`'s
 * OpenAI API from the trainer's own device weights, with no copy and no reload. Before the trainer
 * rewrites the weights the server reads, it stops admitting requests and lets the running ones
 * finish, so each request is answered by one version of the weights; its `system_fingerprint`
 * names the step (`step-N`).
 *
 * - `lathe grpo`: the compute-dtype buffers the rollouts generate from ({@link serveTrainingPolicy}).
 * - `lathe sft`: the Trainer's float32 parameters themselves, cast inside the served graphs (with
 *   LoRA: the frozen base plus the adapters being trained) ({@link serveTrainerWeights}).
 */
import type { AddressInfo } from 'node:net';
import type * as L from '@lathe/onnx';
import type { DecoderConfig, Weights } from '@lathe/models';
import type { DType } from '@lathe/onnx';
import type { Device, DeviceTensor } from '@lathe/runtime';
import type { GrpoTrainer } from '@lathe/grpo';
import type { TrainableParam, Trainer } from '@lathe/train';
import { createOpenAiServer, Scheduler, SlotEngine, startThreadedOpenAiServer } from '@lathe/rollout';
import { HfTokenizer } from '@lathe/tokenizer';
import { hfTokenizerSource, listenOn } from './serve';

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
  /**
   * The HTTP layer on its own worker thread (default true), so that connections are accepted and
   * parsed, and streams written, while the trainer holds this thread; false: on this thread.
   */
  httpThread?: boolean;
}

/** A listening server over `engine`, and how to stop it. */
interface Listening {
  url: string;
  scheduler: Scheduler;
  close(): Promise<void>;
}

/** The folder of the tokenizer `--serve_port` serves text with: the model's Hugging Face one (a run may check this before it compiles anything). */
export function servingTokenizerFolder(tokenizerFrom: string | undefined): string {
  if (!tokenizerFrom) throw new Error("--serve_port serves text through the model's Hugging Face tokenizer, and this run uses the built-in one: train a model folder with tokenizer files");
  return tokenizerFrom;
}

/** The tokenizer the server encodes and decodes text with. */
async function servingTokenizer(o: TrainingServeOptions): Promise<HfTokenizer> {
  return HfTokenizer.fromFolder(servingTokenizerFolder(o.tokenizerFrom));
}

/** The slot engine's pad id: the tokenizer's where the model has it, else 0. */
const padIdOf = (tokenizer: HfTokenizer, config: DecoderConfig) => (tokenizer.padId < config.vocabSize ? tokenizer.padId : 0);

/** Starts the OpenAI server over `engine` (disposed here if listening fails); `step` is the weights' version. */
async function listen(engine: SlotEngine, tokenizer: HfTokenizer, o: TrainingServeOptions, step: () => number): Promise<Listening> {
  const scheduler = new Scheduler(engine, {});
  const model = { id: o.id, scheduler, tokenizer, stopIds: o.stopIds, maxN: o.rows, fingerprint: () => `step-${step()}` };
  // lathe serve's message, with the training command's flags
  const flags = (e: unknown) => new Error((e as Error).message.replace(/^--host (\S+) --port (\d+)/, '--serve_host $1 --serve_port $2').replace('choose another with --port', 'choose another with --serve_port'));
  const host = o.host.includes(':') ? `[${o.host}]` : o.host;
  if (o.httpThread ?? true) {
    let threaded: Awaited<ReturnType<typeof startThreadedOpenAiServer>>;
    try {
      threaded = await startThreadedOpenAiServer({ models: [{ ...model, tokenizerSource: hfTokenizerSource(servingTokenizerFolder(o.tokenizerFrom)) }], host: o.host, port: o.port, ...(o.log ? { log: o.log } : {}) });
    } catch (e) {
      engine.dispose();
      throw flags(e);
    }
    return {
      url: `http://${host}:${threaded.port}/v1`,
      scheduler,
      close: async () => {
        scheduler.resume();
        await threaded.close();
        engine.dispose();
      },
    };
  }
  const server = createOpenAiServer({ models: [model], log: o.log });
  try {
    await listenOn(server, o.host, o.port);
  } catch (e) {
    engine.dispose();
    throw flags(e);
  }
  const port = (server.address() as AddressInfo).port;
  return {
    url: `http://${host}:${port}/v1`,
    scheduler,
    close: async () => {
      scheduler.resume();
      scheduler.close();
      const closed = new Promise<void>((r) => server.close(() => r()));
      server.closeIdleConnections();
      await scheduler.idle();
      server.closeAllConnections();
      await closed;
      engine.dispose();
    },
  };
}

/** Starts serving `trainer`'s policy (`lathe grpo`); resolves once the server listens. */
export async function serveTrainingPolicy<M>(trainer: GrpoTrainer<M>, o: TrainingServeOptions): Promise<TrainingServe> {
  const tokenizer = await servingTokenizer(o);
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
  const engine = SlotEngine.create(o.device, o.config, weights, { slots: o.rows, maxLength: o.maxModelLen, dtype: o.dtype, padTokenId: padIdOf(tokenizer, o.config) });
  const listening = await listen(engine, tokenizer, o, () => step);
  served.scheduler = listening.scheduler;
  return {
    url: listening.url,
    refresh: async () => {
      await trainer.servingWeights(guard);
    },
    close: listening.close,
  };
}

/** The weights an SFT-style Trainer trains, as the served graphs read them. */
export interface TrainerWeights {
  /** What the Trainer updates (every weight, or the LoRA adapters), fed to the graphs by name in float32. */
  params: readonly TrainableParam[];
  /** The decoder's weights in the compute dtype from those parameters (and any inputs it declares itself, e.g. LoRA's `base/<name>`). */
  weights: (g: L.Graph, params: Map<string, L.Tensor>) => Weights;
  /** Device tensors for the inputs `weights` declares besides the parameters (the Trainer's `frozen`). */
  frozen: Readonly<Record<string, DeviceTensor>>;
}

/** A server over a Trainer's parameters: {@link TrainerServe.update} wraps each optimizer step. */
export interface TrainerServe {
  /** The API's base URL, e.g. `http://127.0.0.1:8000/v1`. */
  url: string;
  /**
   * Runs `step` (an optimizer step, which moves the Trainer's parameters) once no request is
   * running — new ones wait — then serves the parameters it wrote, as step `trainer.step`, and
   * lets the waiting requests in before it returns.
   */
  update<T>(step: () => Promise<T>): Promise<T>;
  /** Stops accepting requests, lets running ones finish, then frees the engine (not the weights). */
  close(): Promise<void>;
}

/** One turn of the event loop: requests that arrived while the trainer held it are read. */
const ioTurn = () => new Promise<void>((r) => setImmediate(r));

/**
 * Starts serving the policy `trainer` trains (`lathe sft`), reading its float32 parameters in
 * place: the served graphs take them as inputs and cast them to `o.dtype` themselves, and after
 * each step the engine is pointed at the buffers the step wrote (the Trainer alternates two sets).
 */
export async function serveTrainerWeights(trainer: Trainer, source: TrainerWeights, o: TrainingServeOptions): Promise<TrainerServe> {
  const tokenizer = await servingTokenizer(o);
  const graphWeights = (g: L.Graph) => source.weights(g, new Map(source.params.map((p) => [p.name, g.input(p.name, 'float32', p.shape)] as const)));
  const engine = SlotEngine.create(o.device, o.config, undefined, { slots: o.rows, maxLength: o.maxModelLen, dtype: o.dtype, padTokenId: padIdOf(tokenizer, o.config), graphWeights });
  try {
    engine.bindWeights(Object.entries(source.frozen), trainer.params());
  } catch (e) {
    engine.dispose();
    throw e;
  }
  let step = trainer.step;
  const listening = await listen(engine, tokenizer, o, () => step);
  const { scheduler } = listening;
  return {
    url: listening.url,
    update: async (train) => {
      await scheduler.quiesce();
      try {
        return await train();
      } finally {
        engine.bindWeights(trainer.params());
        step = trainer.step;
        scheduler.resume();
        // a synchronous train step held the event loop: read the requests that arrived meanwhile
        // (a few turns: accept, headers, body) and admit them before the next step quiesces
        for (let turns = 0, quiet = 0; quiet < 3 && turns < 1000; turns++) {
          await ioTurn();
          quiet = scheduler.load.queued > 0 && scheduler.load.free > 0 ? 0 : quiet + 1;
        }
      }
    },
    close: listening.close,
  };
}
