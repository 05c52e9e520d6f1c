/** Writing Hugging Face model folders that transformers can load. */
import { copyFileSync, existsSync, mkdirSync, renameSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { toHfConfig, type DecoderConfig } from './config';
import { paramSpecs } from './params';
import { writeSafetensors, type TensorToWrite } from './safetensors';

/** Tokenizer files copied beside a saved model when present in the source folder. */
export const TOKENIZER_FILES = ['tokenizer.json', 'tokenizer_config.json', 'special_tokens_map.json', 'vocab.json', 'merges.txt', 'generation_config.json', 'chat_template.jinja'];

/**
 * Saves weights (raw bytes by HF name, in any dtype) and config.json to `dir`, copying tokenizer
 * files from `tokenizerFrom`. Every parameter of the config must be present with its shape.
 * Files are written atomically.
 */
export function saveHfModel(dir: string, config: DecoderConfig, tensors: TensorToWrite[], opts: { tokenizerFrom?: string } = {}): void {
  mkdirSync(dir, { recursive: true });
  const byName = new Map(tensors.map((t) => [t.name, t]));
  for (const spec of paramSpecs(config)) {
    const t = byName.get(spec.name);
    if (!t) throw new Error(`saveHfModel(${dir}): missing weight '${spec.name}'`);
    if (t.shape.join(',') !== spec.shape.join(',')) throw new Error(`saveHfModel(${dir}): '${spec.name}' has shape [${t.shape}], expected [${spec.shape}]`);
  }
  const dtype = tensors[0]?.dtype ?? 'float32';
  writeSafetensors(join(dir, 'model.safetensors'), tensors, { format: 'pt' });
  const tmp = join(dir, `.config.json.tmp-${process.pid}`);
  writeFileSync(tmp, JSON.stringify(toHfConfig({ ...config, torchDtype: dtype }), null, 2));
  renameSync(tmp, join(dir, 'config.json'));
  if (opts.tokenizerFrom) {
    for (const f of TOKENIZER_FILES) {
      const src = join(opts.tokenizerFrom, f);
      if (existsSync(src)) copyFileSync(src, join(dir, f));
    }
  }
}
