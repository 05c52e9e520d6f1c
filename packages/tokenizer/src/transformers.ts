/**
 * Loads @huggingface/transformers for its tokenizers and chat templates without letting it load a
 * second ONNX Runtime.
 *
 * transformers.js requires onnxruntime-node as it is imported and pins its own version of it
 * (4.3.1 pins 1.30.0), while Lathe runs on the version its CUDA provider matches (1.29.0). Without
 * an npm override in the consumer's project, npm installs both, and two ONNX Runtime native
 * libraries cannot share a process: whichever loads second fails (`version VERS_1.30.0 not found`).
 * Tokenizers never run a model, so when transformers' onnxruntime-node is another copy than the
 * one Lathe resolves, it is replaced, for transformers only, by its JavaScript half
 * (onnxruntime-common: tensors and `env`, no native binding); creating an inference session
 * through it fails with an error saying why.
 */
import Module, { createRequire } from 'node:module';

type Transformers = typeof import('@huggingface/transformers');

let loading: Promise<Transformers> | undefined;

/** @huggingface/transformers, imported once, with its ONNX Runtime binding kept out of the process when it is not Lathe's. */
export function loadTransformers(): Promise<Transformers> {
  loading ??= (async () => {
    keepTransformersOrtOut();
    return import('@huggingface/transformers');
  })().catch((e: unknown) => {
    loading = undefined;
    throw e;
  });
  return loading;
}

/**
 * The onnxruntime-node entry file that transformers would load, when it is a different copy from
 * the one this package resolves (Lathe's) and nothing has loaded it yet; otherwise null (the same
 * copy, shared safely, or a layout where transformers cannot be resolved and its own import
 * should report what is missing).
 */
export function transformersOrtToReplace(): string | null {
  const here = createRequire(__filename);
  let theirs: string;
  try {
    theirs = createRequire(here.resolve('@huggingface/transformers')).resolve('onnxruntime-node');
  } catch {
    return null;
  }
  if (here.cache[theirs]) return null;
  let ours: string | null;
  try {
    ours = here.resolve('onnxruntime-node');
  } catch {
    ours = null;
  }
  return ours === theirs ? null : theirs;
}

function keepTransformersOrtOut(): void {
  const entry = transformersOrtToReplace();
  if (entry === null) return;
  const common = createRequire(entry)('onnxruntime-common') as Record<string, unknown>;
  const refuse = (): never => {
    throw new Error(
      `@lathe/tokenizer loaded @huggingface/transformers for tokenizers only: its onnxruntime-node (${entry}) ` +
        'is left unloaded because a second ONNX Runtime version cannot share the process with Lathe\'s. ' +
        'Run models with @lathe/runtime, or give the project one onnxruntime-node (an npm "overrides" entry) to use transformers.js models.',
    );
  };
  const stub = new Module(entry);
  stub.filename = entry;
  stub.loaded = true;
  stub.exports = { ...common, InferenceSession: { create: async () => refuse() }, listSupportedBackends: () => [] };
  createRequire(__filename).cache[entry] = stub;
}
