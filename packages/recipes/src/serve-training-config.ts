/** The options of serving a training run's policy (`--serve_port`), shared by the training commands that have them. */
import type { OptionSchema } from './options';

/**
 * `--serve_port`, `--serve_host` and `--serve_max_rows` of a training command (lathe grpo, lathe
 * sft): the policy being trained, served over lathe serve's API. `source` says which of the
 * trainer's device weights the server reads and what that needs.
 */
export function serveTrainingOptions(source: string) {
  return {
    serve_port: {
      type: 'number',
      default: 0,
      integer: true,
      min: 0,
      describe: `Serve the policy being trained over lathe serve's OpenAI-compatible API on this port (0: off): ${source}, answered between weight updates, each response's system_fingerprint naming the step it saw (step-N); needs the model's Hugging Face tokenizer`,
    },
    serve_host: { type: 'string', default: '127.0.0.1', describe: 'With --serve_port: the address to listen on (0.0.0.0 exposes it)' },
    serve_max_rows: { type: 'number', default: 32, integer: true, min: 1, describe: 'With --serve_port: requests decoding at once (the server’s own KV-cache rows)' },
  } as const satisfies OptionSchema;
}
