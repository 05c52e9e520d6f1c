/**
 * Quantized checkpoints: a Hugging Face folder whose config.json carries a `quantization_config`
 * and whose safetensors hold each quantized layer in the layout of the tool that defined it.
 *
 * - INT8: bitsandbytes' LLM.int8 serialization — `<m>.weight` int8 [N, K] and `<m>.SCB` float32
 *   [N] (the row's max |w|; the scale is SCB / 127); `quant_method: "bitsandbytes"`, `load_in_8bit`.
 * - NF4: bitsandbytes' 4-bit serialization (as transformers saves `Params4bit`) — `<m>.weight`
 *   uint8 [N·K/2, 1], `<m>.weight.absmax`, `.quant_map`, with double quantization
 *   `.nested_absmax`, `.nested_quant_map`, and `.quant_state.bitsandbytes__nf4` (the JSON of the
 *   rest of the quant state as bytes); `quant_method: "bitsandbytes"`, `load_in_4bit`.
 * - INT4: Lathe's own — `<m>.weight` uint8 [N, kBlocks, blockSize/2] (MatMulNBits' B, as ONNX
 *   Runtime reads it), `<m>.weight_scale` float32 [N, kBlocks], `<m>.weight_zero_point` uint8;
 *   `quant_method: "lathe"`, `format: "int4"`.
 * Dense parameters are saved in the source model's dtype.
 */
import { copyFileSync, existsSync, mkdirSync, renameSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import type { DType } from '@lathe/onnx';
import { paramSpecs, readConfig, readTensorBytes, readWeightIndex, toHfConfig, TOKENIZER_FILES, writeSafetensors, type DecoderConfig, type HfConfig, type TensorEntry, type TensorToWrite } from '@lathe/models';
import { bytesToFloat32, toBfloat16Bits, toFloat16Bits } from '@lathe/runtime';
import { DYNAMIC_CODE, NF4_CODE } from './codes';
import { kBlocks, type QuantizedMatrix } from './matrix';
import { QuantizedModel, type QuantScheme } from './model';
import { nestedAbsmax } from './quantize';

/** The dtypes dense parameters are saved in. */
export type DenseDtype = 'float32' | 'bfloat16' | 'float16';

/** Options of {@link saveQuantized}. */
export interface SaveQuantizedOptions {
  /** dtype of the dense parameters (default bfloat16). */
  denseDtype?: DenseDtype;
  /** The source's config.json, kept field for field (labels, token ids…); default: the config's own fields. */
  rawConfig?: HfConfig;
  /** A folder whose tokenizer files are copied beside the weights. */
  tokenizerFrom?: string;
}

/** The `quantization_config` of a scheme (bitsandbytes' keys for INT8 and NF4). */
export function quantizationConfig(s: QuantScheme, skipped: string[], computeDtype: DType): HfConfig {
  if (s.format === 'int4') return { quant_method: 'lathe', format: 'int4', block_size: s.blockSize ?? 64, zero_points: Boolean(s.zeroPoints), modules_not_converted: skipped };
  if (s.format === 'int8') return { quant_method: 'bitsandbytes', load_in_8bit: true, load_in_4bit: false, llm_int8_threshold: 0.0, llm_int8_skip_modules: skipped, llm_int8_has_fp16_weight: false };
  return {
    quant_method: 'bitsandbytes',
    load_in_4bit: true,
    load_in_8bit: false,
    bnb_4bit_quant_type: 'nf4',
    bnb_4bit_use_double_quant: Boolean(s.doubleQuant),
    bnb_4bit_compute_dtype: computeDtype,
    bnb_4bit_quant_storage: 'uint8',
    llm_int8_skip_modules: skipped,
  };
}

/** Writes `q` to `dir`: model.safetensors and config.json (atomically each), tokenizer files if asked. */
export function saveQuantized(dir: string, q: QuantizedModel, opts: SaveQuantizedOptions = {}): void {
  const dtype = opts.denseDtype ?? 'bfloat16';
  mkdirSync(dir, { recursive: true });
  const tensors: TensorToWrite[] = [];
  const bytes = (a: ArrayBufferView) => new Uint8Array(a.buffer, a.byteOffset, a.byteLength);
  const skipped: string[] = [];
  for (const spec of paramSpecs(q.config)) {
    const m = q.layers.get(spec.name);
    if (!m) {
      const d = q.dense.get(spec.name)!;
      const data = dtype === 'bfloat16' ? toBfloat16Bits(d) : dtype === 'float16' ? toFloat16Bits(d) : d;
      tensors.push({ name: spec.name, dtype, shape: spec.shape, data: bytes(data) });
      if (spec.kind === 'matrix') skipped.push(spec.name.replace(/\.weight$/, ''));
      continue;
    }
    tensors.push(...layerTensors(spec.name, m, dtype));
  }
  writeSafetensors(join(dir, 'model.safetensors'), tensors, { format: 'pt' });
  const base = opts.rawConfig ? { ...opts.rawConfig } : toHfConfig(q.config);
  const qc = quantizationConfig(q.scheme, skipped, dtype);
  // A quantized LM head is a copy of the dense one, re-made on load (quantizing is deterministic).
  if (q.lmHead) qc.lathe_lm_head = { format: q.lmHead.scheme.format, block_size: q.lmHead.scheme.blockSize ?? null, zero_points: Boolean(q.lmHead.scheme.zeroPoints), double_quant: Boolean(q.lmHead.scheme.doubleQuant) };
  const config = { ...base, torch_dtype: dtype, quantization_config: qc };
  const tmp = join(dir, `.config.json.tmp-${process.pid}`);
  writeFileSync(tmp, JSON.stringify(config, null, 2));
  renameSync(tmp, join(dir, 'config.json'));
  if (opts.tokenizerFrom) for (const f of TOKENIZER_FILES) if (existsSync(join(opts.tokenizerFrom, f))) copyFileSync(join(opts.tokenizerFrom, f), join(dir, f));
}

/** The tensors one quantized layer is saved as. */
function layerTensors(name: string, m: QuantizedMatrix, computeDtype: DType): TensorToWrite[] {
  const bytes = (a: ArrayBufferView) => new Uint8Array(a.buffer, a.byteOffset, a.byteLength);
  const mod = name.replace(/\.weight$/, '');
  if (m.format === 'int8') {
    // SCB is the row's max |w|: the scale s = fround(SCB / 127) is recomputed identically on load.
    const scb = m.absmax;
    return [
      { name, dtype: 'int8', shape: [m.rows, m.cols], data: bytes(m.q) },
      { name: `${mod}.SCB`, dtype: 'float32', shape: [m.rows], data: bytes(scb) },
    ];
  }
  if (m.format === 'int4') {
    const nb = kBlocks(m.cols, m.blockSize);
    const out: TensorToWrite[] = [
      { name, dtype: 'uint8', shape: [m.rows, nb, m.blockSize / 2], data: m.packed },
      { name: `${name}_scale`, dtype: 'float32', shape: [m.rows, nb], data: bytes(m.scales) },
    ];
    if (m.zeroPoints) out.push({ name: `${name}_zero_point`, dtype: 'uint8', shape: [m.rows, Math.ceil(nb / 2)], data: m.zeroPoints });
    return out;
  }
  const state: Record<string, unknown> = { quant_type: 'nf4', blocksize: m.blockSize, dtype: computeDtype, shape: [m.rows, m.cols] };
  const out: TensorToWrite[] = [
    { name, dtype: 'uint8', shape: [m.packed.length, 1], data: m.packed },
    { name: `${name}.quant_map`, dtype: 'float32', shape: [16], data: bytes(NF4_CODE) },
  ];
  if (m.nested) {
    Object.assign(state, { nested_blocksize: m.nested.blockSize, nested_dtype: 'float32', nested_offset: m.nested.offset });
    out.push(
      { name: `${name}.absmax`, dtype: 'uint8', shape: [m.nested.codes.length], data: m.nested.codes },
      { name: `${name}.nested_absmax`, dtype: 'float32', shape: [m.nested.absmax.length], data: bytes(m.nested.absmax) },
      { name: `${name}.nested_quant_map`, dtype: 'float32', shape: [256], data: bytes(DYNAMIC_CODE) },
    );
  } else out.push({ name: `${name}.absmax`, dtype: 'float32', shape: [m.absmax.length], data: bytes(m.absmax) });
  const json = Buffer.from(JSON.stringify(state), 'utf8');
  out.push({ name: `${name}.quant_state.bitsandbytes__nf4`, dtype: 'uint8', shape: [json.length], data: new Uint8Array(json) });
  return out;
}

/** Whether a parsed config.json describes a quantized checkpoint. */
export function isQuantizedConfig(raw: HfConfig): boolean {
  return raw.quantization_config !== undefined && raw.quantization_config !== null;
}

/** The scheme a `quantization_config` describes; an unknown one is an error naming the file. */
export function schemeFromConfig(raw: HfConfig, where: string): QuantScheme {
  const qc = raw.quantization_config as Record<string, unknown> | undefined;
  if (!qc || typeof qc !== 'object') throw new Error(`${where}: no quantization_config`);
  if (qc.quant_method === 'lathe' && qc.format === 'int4') {
    return { format: 'int4', blockSize: Number(qc.block_size), zeroPoints: Boolean(qc.zero_points) };
  }
  if (qc.quant_method === 'bitsandbytes' && qc.load_in_8bit) return { format: 'int8' };
  if (qc.quant_method === 'bitsandbytes' && qc.load_in_4bit) {
    if (qc.bnb_4bit_quant_type !== 'nf4') throw new Error(`${where}: quantization_config.bnb_4bit_quant_type '${String(qc.bnb_4bit_quant_type)}' is not supported (nf4)`);
    return { format: 'nf4', blockSize: 64, doubleQuant: Boolean(qc.bnb_4bit_use_double_quant) };
  }
  throw new Error(`${where}: quantization_config ${JSON.stringify(qc)} is not a format Lathe reads (bitsandbytes int8 / nf4, lathe int4)`);
}

/** Loads a quantized checkpoint folder. A quantized layer missing a tensor is an error naming it. */
export function loadQuantized(dir: string): QuantizedModel {
  const { config, raw } = readConfig(dir);
  const where = join(dir, 'config.json');
  if (!isQuantizedConfig(raw)) throw new Error(`${where}: not a quantized checkpoint (no quantization_config); load it with CausalLM.fromPretrained`);
  const scheme = schemeFromConfig(raw, where);
  const index = readWeightIndex(dir);
  const dense = new Map<string, Float32Array>();
  const layers = new Map<string, QuantizedMatrix>();
  for (const spec of paramSpecs(config)) {
    const e = index.get(spec.name);
    if (!e) throw new Error(`${dir}: missing weight '${spec.name}'`);
    if (e.dtype === 'uint8' || e.dtype === 'int8') {
      layers.set(spec.name, readLayer(dir, spec.name, spec.shape, scheme, index));
      continue;
    }
    if (e.shape.join(',') !== spec.shape.join(',')) throw new Error(`${e.file}: '${spec.name}' has shape [${e.shape}], the config implies [${spec.shape}]`);
    dense.set(spec.name, bytesToFloat32(readTensorBytes(e), e.dtype, `${e.file}: '${spec.name}'`));
  }
  return QuantizedModel.fromParts(config, scheme, dense, layers, headScheme(raw, where));
}

/** The scheme of the quantized LM head a `quantization_config` asks for, if any. */
function headScheme(raw: HfConfig, where: string): QuantScheme | undefined {
  const h = (raw.quantization_config as Record<string, unknown>).lathe_lm_head as Record<string, unknown> | undefined;
  if (!h) return undefined;
  if (h.format !== 'int8' && h.format !== 'int4' && h.format !== 'nf4') throw new Error(`${where}: quantization_config.lathe_lm_head.format '${String(h.format)}' is not int8, int4 or nf4`);
  return { format: h.format, blockSize: typeof h.block_size === 'number' ? h.block_size : undefined, zeroPoints: Boolean(h.zero_points) || undefined, doubleQuant: Boolean(h.double_quant) || undefined };
}

function readLayer(dir: string, name: string, [N, K]: number[], s: QuantScheme, index: Map<string, TensorEntry>): QuantizedMatrix {
  const need = (t: string, dtype: DType, numel?: number): TensorEntry => {
    const e = index.get(t);
    if (!e) throw new Error(`${dir}: quantized layer '${name}' (${s.format}) is missing tensor '${t}'`);
    if (e.dtype !== dtype) throw new Error(`${e.file}: '${t}' is ${e.dtype}, expected ${dtype}`);
    const n = e.shape.reduce((a, b) => a * b, 1);
    if (numel !== undefined && n !== numel) throw new Error(`${e.file}: '${t}' has ${n} elements [${e.shape}], expected ${numel} for a [${N}, ${K}] ${s.format} weight`);
    return e;
  };
  const u8 = (e: TensorEntry) => new Uint8Array(readTensorBytes(e));
  const f32 = (e: TensorEntry) => bytesToFloat32(readTensorBytes(e), 'float32', `${e.file}: '${e.name}'`);
  const mod = name.replace(/\.weight$/, '');
  if (s.format === 'int8') {
    const q = new Int8Array(u8(need(name, 'int8', N * K)).buffer);
    const scb = f32(need(`${mod}.SCB`, 'float32', N));
    return { format: 'int8', rows: N, cols: K, q, absmax: scb, scales: scb.map((a) => Math.fround(a / 127)) };
  }
  if (s.format === 'int4') {
    const bs = s.blockSize ?? 64;
    const nb = kBlocks(K, bs);
    const packed = u8(need(name, 'uint8', (N * nb * bs) / 2));
    const scales = f32(need(`${name}_scale`, 'float32', N * nb));
    const zeroPoints = s.zeroPoints ? u8(need(`${name}_zero_point`, 'uint8', N * Math.ceil(nb / 2))) : undefined;
    return { format: 'int4', rows: N, cols: K, blockSize: bs, packed, scales, zeroPoints };
  }
  const state = JSON.parse(Buffer.from(u8(need(`${name}.quant_state.bitsandbytes__nf4`, 'uint8'))).toString('utf8')) as Record<string, unknown>;
  const bs = Number(state.blocksize ?? 64);
  const nb = Math.ceil((N * K) / bs);
  const packed = u8(need(name, 'uint8', Math.ceil((N * K) / 2)));
  const map = f32(need(`${name}.quant_map`, 'float32', 16));
  if (map.some((v, i) => v !== NF4_CODE[i])) throw new Error(`${dir}: '${name}.quant_map' is not the NF4 code table`);
  if (state.nested_offset === undefined) return { format: 'nf4', rows: N, cols: K, blockSize: bs, packed, absmax: f32(need(`${name}.absmax`, 'float32', nb)) };
  const nbs = Number(state.nested_blocksize ?? 256);
  const nested = { codes: u8(need(`${name}.absmax`, 'uint8', nb)), absmax: f32(need(`${name}.nested_absmax`, 'float32', Math.ceil(nb / nbs))), offset: Number(state.nested_offset), blockSize: nbs };
  need(`${name}.nested_quant_map`, 'float32', 256);
  return { format: 'nf4', rows: N, cols: K, blockSize: bs, packed, absmax: nestedAbsmax(nested), nested };
}

/** Reads a quantized folder's weights dequantized to float32 (what `CausalLM.fromPretrained` loads). */
export function dequantizedFolderWeights(dir: string, _config: DecoderConfig, _raw: HfConfig): Map<string, Float32Array> {
  return loadQuantized(dir).dequantizedWeights();
}
