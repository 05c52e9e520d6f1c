/**
 * The model object: a decoder's config and its weights, in one of three places — the safetensors
 * files of a Hugging Face folder (read when something needs them), float32 arrays in host memory,
 * or device tensors in a compute dtype. Generation, training, scoring and saving all start from a
 * `CausalLM`:
 *
 *   const model = await CausalLM.fromPretrained('runs/sft/final', { device: 'cuda' });
 *   const gen = KvCacheGenerator.create(model, { rows: 64, maxLength: 1024 });  // @lathe/rollout
 *   const master = model.float32Weights();                                     // a trainer's start
 *   model.save('out/model');
 *   model.dispose();
 */
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import * as L from '@lathe/onnx';
import type { DType } from '@lathe/onnx';
import { bytesToFloat32, Device, fromBfloat16Bits, fromFloat16Bits, toBfloat16Bits, toFloat16Bits, type DeviceKind, type DeviceTensor, type HostArray } from '@lathe/runtime';
import { parseConfig, readConfig, type DecoderConfig, type HfConfig } from './config';
import { paramSpecs, type ParamSpec } from './params';
import { readQuantizedFolder } from './quantized-folders';
import { randomWeight, type RandomWeightOptions } from './random-model';
import { readTensorBytes, readWeightIndex, type TensorEntry, type TensorToWrite } from './safetensors';
import { saveHfModel } from './save';

/** Where {@link CausalLM.fromPretrained} and friends put the weights. */
export interface CausalLMOptions {
  /**
   * The device to hold the weights on: a `Device`, or 'cpu' / 'cuda' for `Device.cpu()` /
   * `Device.cuda()`. Omitted: they stay on the host (in their files, for a folder) until something
   * reads them.
   */
  device?: Device | DeviceKind;
  /** dtype of the weights on the device: float32, bfloat16 or float16. Default bfloat16 on CUDA, float32 on the CPU. */
  dtype?: DType;
}

/** Options of {@link CausalLM.save}. */
export interface SaveOptions {
  /** dtype of the saved tensors. Default: the model's ({@link CausalLM.dtype}). */
  dtype?: 'float32' | 'bfloat16' | 'float16';
  /** A folder whose tokenizer files are copied beside the weights. */
  tokenizerFrom?: string;
}

type WeightStore =
  | { kind: 'files'; index: Map<string, TensorEntry> }
  | { kind: 'host'; tensors: ReadonlyMap<string, Float32Array> }
  | { kind: 'device'; device: Device; dtype: DType; tensors: Map<string, DeviceTensor> };

const WEIGHT_DTYPES: readonly DType[] = ['float32', 'bfloat16', 'float16'];

/** A causal LM (Qwen3, Qwen2, Llama): its config and weights, by Hugging Face parameter name. */
export class CausalLM {
  private released = false;

  private constructor(
    /** The decoder's shape. */
    readonly config: DecoderConfig,
    private readonly store: WeightStore,
    /** The folder the model was loaded from (its tokenizer files live there), if any. */
    readonly dir: string | undefined,
  ) {}

  /**
   * Loads a Hugging Face model folder (config.json + safetensors): onto `opts.device` in
   * `opts.dtype`, or, without a device, as a view of the files that reads them when asked. Async,
   * like every call that does I/O or touches the GPU, so loading can stream later without callers
   * changing; {@link fromPretrainedSync} is the same work today.
   */
  static async fromPretrained(dir: string, opts: CausalLMOptions = {}): Promise<CausalLM> {
    return CausalLM.fromPretrainedSync(dir, opts);
  }

  /** {@link fromPretrained} for synchronous code (constructors, checkpoint readers). */
  static fromPretrainedSync(dir: string, opts: CausalLMOptions = {}): CausalLM {
    const { config, raw } = readConfig(dir);
    // A quantized checkpoint loads dequantized (its quantized kernels: @lathe/quantization's QuantizedModel).
    const dequantized = readQuantizedFolder(dir, config, raw);
    if (dequantized) {
      const host = new CausalLM(config, { kind: 'host', tensors: dequantized }, dir);
      return opts.device ? host.to(opts.device, opts.dtype) : host;
    }
    const index = readWeightIndex(dir);
    for (const spec of paramSpecs(config)) {
      const e = index.get(spec.name);
      if (!e) throw new Error(`${dir}: missing weight '${spec.name}'`);
      if (e.shape.join(',') !== spec.shape.join(',')) throw new Error(`${e.file}: '${spec.name}' has shape [${e.shape}], the config implies [${spec.shape}]`);
    }
    const files = new CausalLM(config, { kind: 'files', index }, dir);
    return opts.device ? files.to(opts.device, opts.dtype) : files;
  }

  /**
   * A model from float32 weights by HF name (a trainer's weights, a checkpoint's): every parameter
   * of `config` with its element count. The arrays are held, not copied, until `opts.device` asks
   * for an upload.
   */
  static fromWeights(config: DecoderConfig, weights: ReadonlyMap<string, Float32Array>, opts: CausalLMOptions = {}): CausalLM {
    for (const spec of paramSpecs(config)) {
      const w = weights.get(spec.name);
      if (!w) throw new Error(`CausalLM.fromWeights: missing weight '${spec.name}'`);
      if (w.length !== elements(spec)) throw new Error(`CausalLM.fromWeights: '${spec.name}' has ${w.length} elements, the config implies [${spec.shape}]`);
    }
    const host = new CausalLM(config, { kind: 'host', tensors: weights }, undefined);
    return opts.device ? host.to(opts.device, opts.dtype) : host;
  }

  /**
   * A model with random weights (as `randomModel` writes them: matrices ~ N(0, std²), norm weights
   * around 1, biases small; the values depend only on the seed) — for tests and experiments.
   */
  static random(config: HfConfig | DecoderConfig, opts: RandomWeightOptions & CausalLMOptions = {}): CausalLM {
    const cfg = 'architecture' in config ? (config as DecoderConfig) : parseConfig(config as HfConfig, 'CausalLM.random config');
    const sample = randomWeight(opts);
    return CausalLM.fromWeights(cfg, new Map(paramSpecs(cfg).map((spec) => [spec.name, sample(spec)] as const)), opts);
  }

  /** The device holding the weights, or undefined for a host model. */
  get device(): Device | undefined {
    return this.store.kind === 'device' ? this.store.device : undefined;
  }

  /** dtype of the weights: on the device, in the files (the first parameter's), or float32 in host memory. */
  get dtype(): DType {
    const s = this.store;
    if (s.kind === 'device') return s.dtype;
    if (s.kind === 'host') return 'float32';
    return s.index.get(paramSpecs(this.config)[0].name)!.dtype;
  }

  /** The weights on the device by HF name (to bind to sessions). A host model has none: load it with `{ device }` or call {@link to}. */
  get weights(): ReadonlyMap<string, DeviceTensor> {
    this.live('weights');
    if (this.store.kind !== 'device') throw new Error(`CausalLM: the weights are on the host${this.dir ? ` (${this.dir})` : ''}; load with { device } or call .to(device)`);
    return this.store.tensors;
  }

  /**
   * Every weight as float32 by HF name, in paramSpecs order: read from the files, downloaded from
   * the device, or (a host model) the model's own arrays, not copies — do not modify them.
   */
  float32Weights(): Map<string, Float32Array> {
    this.live('float32Weights');
    return new Map(paramSpecs(this.config).map((spec) => [spec.name, this.float32(spec)] as const));
  }

  /**
   * The same model on `device` in `dtype` (default bfloat16 on CUDA, float32 on the CPU), uploaded
   * one tensor at a time, so the model never sits in host memory as a whole. The new model owns its
   * device tensors; this one is unchanged.
   */
  to(device: Device | DeviceKind, dtype?: DType): CausalLM {
    this.live('to');
    const dev = typeof device === 'string' ? Device.open(device) : device;
    const target = dtype ?? (dev.kind === 'cuda' ? 'bfloat16' : 'float32');
    if (!WEIGHT_DTYPES.includes(target)) throw new Error(`CausalLM: dtype ${target} is not a weight dtype (${WEIGHT_DTYPES.join(', ')})`);
    const tensors = new Map<string, DeviceTensor>();
    try {
      for (const spec of paramSpecs(this.config)) {
        const src = this.store.kind === 'device' ? this.store.tensors.get(spec.name)! : undefined;
        if (src && src.device === dev && src.dtype === target) {
          const t = dev.empty(target, spec.shape);
          t.copyFrom(src);
          tensors.set(spec.name, t);
        } else {
          tensors.set(spec.name, dev.upload({ data: this.hostData(spec, target), dims: spec.shape }, target));
        }
      }
    } catch (e) {
      for (const t of tensors.values()) t.dispose(); // a failed load leaves nothing on the device
      throw e;
    }
    return new CausalLM(this.config, { kind: 'device', device: dev, dtype: target, tensors }, this.dir);
  }

  /**
   * The safetensors entries holding the weights, for graphs that read them as external
   * initializers: the model's own files, or, for a model without files, a temporary folder it is
   * saved to (in its dtype) first.
   */
  weightFiles(): Map<string, TensorEntry> {
    this.live('weightFiles');
    if (this.store.kind === 'files') return this.store.index;
    const dir = mkdtempSync(join(tmpdir(), 'lathe-model-'));
    this.save(dir);
    return readWeightIndex(dir);
  }

  /** Writes config.json and model.safetensors to `dir` (a folder transformers loads), atomically per file. */
  save(dir: string, opts: SaveOptions = {}): void {
    this.live('save');
    const dtype = opts.dtype ?? this.dtype;
    if (!WEIGHT_DTYPES.includes(dtype)) throw new Error(`CausalLM.save: dtype ${dtype} is not a weight dtype (${WEIGHT_DTYPES.join(', ')})`);
    const tensors: TensorToWrite[] = paramSpecs(this.config).map((spec) => {
      const data = this.hostData(spec, dtype);
      return { name: spec.name, dtype, shape: spec.shape, data: new Uint8Array(data.buffer, data.byteOffset, data.byteLength) };
    });
    saveHfModel(dir, this.config, tensors, { tokenizerFrom: opts.tokenizerFrom });
  }

  /** Frees the device tensors the model owns (a host model holds none). The model is unusable afterwards. */
  dispose(): void {
    if (this.released) return;
    this.released = true;
    if (this.store.kind === 'device') for (const t of this.store.tensors.values()) t.dispose();
  }

  private live(what: string): void {
    if (this.released) throw new Error(`CausalLM.${what}: the model was disposed`);
  }

  /** One weight as float32 (a host model's own array). */
  private float32(spec: ParamSpec): Float32Array {
    const s = this.store;
    if (s.kind === 'host') return s.tensors.get(spec.name)!;
    if (s.kind === 'files') {
      const e = s.index.get(spec.name)!;
      return bytesToFloat32(readTensorBytes(e), e.dtype, `${e.file}: '${spec.name}'`);
    }
    const data = s.tensors.get(spec.name)!.download().data;
    if (s.dtype === 'bfloat16') return fromBfloat16Bits(data as Uint16Array);
    if (s.dtype === 'float16') return fromFloat16Bits(data as Uint16Array);
    return data as Float32Array;
  }

  /** One weight's host representation in `dtype` (16-bit dtypes as bit patterns), converting only when the dtypes differ. */
  private hostData(spec: ParamSpec, dtype: DType): HostArray {
    const s = this.store;
    if (s.kind === 'device' && s.dtype === dtype) return s.tensors.get(spec.name)!.download().data;
    if (s.kind === 'files') {
      const e = s.index.get(spec.name)!;
      if (e.dtype === dtype && L.dtypeBytes(dtype) === 2) {
        const bytes = readTensorBytes(e);
        return new Uint16Array(bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength));
      }
    }
    const f32 = this.float32(spec);
    if (dtype === 'float32') return f32;
    if (dtype === 'bfloat16') return toBfloat16Bits(f32);
    if (dtype === 'float16') return toFloat16Bits(f32);
    throw new Error(`CausalLM: dtype ${dtype} is not a weight dtype (${WEIGHT_DTYPES.join(', ')})`);
  }
}

function elements(spec: ParamSpec): number {
  return spec.shape.reduce((a, b) => a * b, 1);
}
