/** `lathe serve`'s options: defaults, flags and YAML keys. */
import { SCHEDULER_DEFAULTS, SLOT_ENGINE_DEFAULTS } from '@lathe/rollout';
import { decodeOptions, deviceOption, quantizedWeightsOption } from './common-options';
import type { ConfigOf, OptionSchema } from './options';

/** Every option of `lathe serve`. */
export const serveSchema = {
  model: {
    type: 'string',
    default: '',
    describe:
      'Model folder to serve (config.json, *.safetensors, tokenizer.json + tokenizer_config.json), its id the folder name; NAME=DIR to choose the id; repeat --model (or separate entries with commas) to serve several models from one process [required]',
  },
  http_thread: {
    type: 'boolean',
    default: true,
    describe: 'Run the HTTP layer (sockets, parsing, chat templates, detokenising, streaming) on its own worker thread, leaving the thread that owns the device to the decode loop; false: one thread does both',
  },
  tokenizer: { type: 'string', default: 'model', describe: "'model' (each model folder's own tokenizer files), or a folder holding tokenizer.json and tokenizer_config.json for every model" },
  host: { type: 'string', default: '127.0.0.1', describe: 'Address to listen on (0.0.0.0 exposes the server to the network)' },
  port: { type: 'number', default: 8000, integer: true, min: 0, max: 65535, describe: 'Port to listen on (0: any free port, printed at start)' },
  device: deviceOption,
  compute_dtype: { type: 'string', default: 'auto', choices: ['auto', 'float32', 'bfloat16', 'float16'], describe: 'Compute dtype (auto: float32 on cpu, bfloat16 on cuda; bfloat16/float16 need --device cuda)' },
  max_rows: { type: 'number', default: 32, integer: true, min: 1, describe: "Sequences decoded at once per model (the KV cache's rows; a request's n samples take n rows)" },
  max_model_len: { type: 'number', default: 0, integer: true, min: 0, describe: "Context per row: prompt + max_tokens (0: the model's max_position_embeddings, at most 4096); with max_rows it sizes the KV cache" },
  max_num_tokens: { type: 'number', default: 0, integer: true, min: 0, describe: 'Cache positions the running rows may reserve in all, prompt + max_tokens each (0: max_rows × max_model_len)' },
  max_queue: { type: 'number', default: SCHEDULER_DEFAULTS.maxQueue, integer: true, min: 0, describe: 'Requests that may wait for a row per model; one more is answered 429 with Retry-After' },
  admit_wait_ms: { type: 'number', default: SCHEDULER_DEFAULTS.admitWaitMs, integer: true, min: 0, describe: 'While rows decode, how long a new request may wait for others to share its prefill (each prefill pays a fixed cost beside its per-prompt work); 0 admits at every step' },
  max_prefill_tokens: { type: 'number', default: SCHEDULER_DEFAULTS.maxPrefillTokens, integer: true, min: 1, describe: 'Prompt tokens prefilled between two decode steps (a longer single prompt still runs): bounds the pause new arrivals cause the running rows' },
  max_n: { type: 'number', default: 16, integer: true, min: 1, describe: 'Most samples (n) per request (and never more than max_rows)' },
  max_logprobs: { type: 'number', default: 20, integer: true, min: 0, max: 20, describe: 'Most top_logprobs (chat) or logprobs (completions) a request may ask for (0: none)' },
  cuda_graph: { type: 'boolean', default: false, describe: 'Replay the decode step as a CUDA graph (cuda only), and prefills of repeated shapes too (see --prefill_graphs)' },
  warm_prefill: {
    type: 'string',
    default: '',
    describe: 'Prompt lengths (comma-separated, e.g. 256,1024) whose prefill shapes are planned (and with --cuda_graph captured) at start, so the first requests do not pay for it; empty: none',
  },
  prefill_graphs: {
    type: 'number',
    default: SLOT_ENGINE_DEFAULTS.prefillGraphs,
    integer: true,
    min: 0,
    describe: 'With --cuda_graph: how many prefill shapes (prompts × width) are captured as CUDA graphs, each at its second use; a plain prefill pays a fixed launch cost per layer (0: none)',
  },
  // the KV-cache engine's decode options, as lathe generate and lathe eval take them (the slot engine is a KV-cache engine)
  quantized_weights: quantizedWeightsOption,
  ...decodeOptions,
} as const satisfies OptionSchema;

/** A resolved `lathe serve` config. */
export type ServeConfig = ConfigOf<typeof serveSchema>;
