/** `lathe studio`'s options: defaults, flags and YAML keys. */
import { deviceOption } from './common-options';
import type { ConfigOf, OptionSchema } from './options';

/** Every option of `lathe studio`. */
export const studioSchema = {
  root: { type: 'string', default: 'runs', describe: 'Folder holding run directories (and trajectory Parquet files); the app reads nothing outside it' },
  host: { type: 'string', default: '127.0.0.1', describe: 'Address to listen on (0.0.0.0 exposes your runs to the network)' },
  port: { type: 'number', default: 8080, integer: true, min: 0, max: 65535, describe: 'Port to listen on (0: any free port, printed at start)' },
  model: {
    type: 'string',
    default: '',
    describe: "Models to chat with, served in-process as by lathe serve: a model folder or NAME=DIR (a checkpoint folder works), repeated or comma-separated; '' and no --serve_url: no chat",
  },
  chat_checkpoints: {
    type: 'boolean',
    default: true,
    describe: 'Chat with any checkpoint of the runs under --root (the chat page lists them for each side): a checkpoint picked is served in-process on first use, at most two at a time, the least recently used closed first (not with --serve_url)',
  },
  serve_url: { type: 'string', default: '', describe: "Chat through a running lathe serve (or any OpenAI-compatible server) instead, e.g. http://127.0.0.1:8000/v1" },
  device: deviceOption,
  max_model_len: { type: 'number', default: 1024, integer: true, min: 2, describe: "Context per chat model (prompt + reply) when --model or a checkpoint is served in-process (a checkpoint's is at most its max_position_embeddings)" },
  tokenizer: { type: 'string', default: 'run', describe: "Tokenizer for the token view: 'run' (each run's config: builtin:addition or its model folder), builtin:addition, or a folder with tokenizer.json" },
  poll_ms: { type: 'number', default: 2000, integer: true, min: 100, describe: "How often the metrics page re-reads a running run's metrics.jsonl (milliseconds)" },
} as const satisfies OptionSchema;

/** A resolved `lathe studio` config. */
export type StudioConfig = ConfigOf<typeof studioSchema>;
