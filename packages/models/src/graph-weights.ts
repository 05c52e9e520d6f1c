/**
 * How a graph reads a decoder's weights: as graph inputs (bound device buffers in training and
 * generation) or as external initializers backed by the model's safetensors files.
 */
import { linkSync, mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { basename, dirname, join } from 'node:path';
import * as L from '@lathe/onnx';
import type { DType, Graph, Tensor } from '@lathe/onnx';
import type { DecoderConfig } from './config';
import type { Weights } from './decoder';
import { paramSpecs } from './params';
import type { TensorEntry } from './safetensors';

/** Weights as graph inputs named by their HF names, stored in `storage` and cast to `compute`. */
export function weightInputs(graph: Graph, cfg: DecoderConfig, storage: DType, compute: DType): { weights: Weights; inputs: Map<string, Tensor> } {
  const inputs = new Map<string, Tensor>();
  const cast = new Map<string, Tensor>();
  for (const spec of paramSpecs(cfg)) inputs.set(spec.name, graph.input(spec.name, storage, spec.shape));
  const weights: Weights = (name) => {
    const t = inputs.get(name);
    if (!t) throw new Error(`weight '${name}' is not a parameter of this ${cfg.architecture}`);
    if (t.dtype === compute) return t;
    let c = cast.get(name);
    if (!c) cast.set(name, (c = L.cast(t, compute)));
    return c;
  };
  return { weights, inputs };
}

/**
 * Weights as external initializers pointing into safetensors files (ONNX Runtime reads the bytes
 * itself). `location` maps a safetensors path to the path recorded in the model (relative to
 * where the .onnx file will be written).
 */
export function weightInitializers(
  graph: Graph,
  cfg: DecoderConfig,
  index: Map<string, TensorEntry>,
  compute: DType,
  location: (file: string) => string,
): Weights {
  const cache = new Map<string, Tensor>();
  for (const spec of paramSpecs(cfg)) {
    const e = index.get(spec.name);
    if (!e) throw new Error(`${[...new Set([...index.values()].map((v) => v.file))].join(', ')}: missing tensor '${spec.name}'`);
    if (e.shape.join(',') !== spec.shape.join(',')) {
      throw new Error(`${e.file}: tensor '${spec.name}' has shape [${e.shape}] but the config implies [${spec.shape}]`);
    }
  }
  return (name) => {
    let t = cache.get(name);
    if (t) return t;
    const e = index.get(name);
    if (!e) throw new Error(`weight '${name}' is not in the model files`);
    const init = graph.initializer(name, e.dtype, e.shape, { kind: 'external', location: location(e.file), offset: e.offset, length: e.length });
    t = e.dtype === compute ? init : L.cast(init, compute);
    cache.set(name, t);
    return t;
  };
}

/**
 * A fresh folder for an .onnx file whose external initializers point into `files`, with each file
 * hard-linked in (ONNX Runtime refuses external data outside the model's folder, symlinks
 * included; a hard link is the same bytes, not a copy). Hard links need one filesystem, so the
 * folder is made beside the first file when the temp dir is elsewhere.
 */
export function externalDataFolder(files: string[]): { dir: string; location: (file: string) => string } {
  const tryIn = (parent: string) => {
    const dir = mkdtempSync(join(parent, 'lathe-graph-'));
    for (const f of new Set(files)) linkSync(f, join(dir, basename(f)));
    return dir;
  };
  let dir: string;
  try {
    dir = tryIn(tmpdir());
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code !== 'EXDEV') throw e;
    dir = tryIn(dirname(files[0]));
  }
  return { dir, location: (file) => basename(file) };
}
