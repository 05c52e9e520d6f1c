/**
 * safetensors files: an 8-byte little-endian header length, a JSON header mapping tensor names to
 * dtype, shape and data offsets, then the raw bytes. Lathe reads only headers in JavaScript;
 * tensor bytes are either read on demand or referenced by (file, offset, length) so ONNX Runtime
 * loads them itself. Sharded folders use model.safetensors.index.json.
 */
import { closeSync, existsSync, fstatSync, fsyncSync, openSync, readFileSync, readSync, renameSync, writeSync } from 'node:fs';
import { basename, dirname, join } from 'node:path';
import type { DType } from '@lathe/onnx';
import { dtypeBytes } from '@lathe/onnx';

const TO_DTYPE: Record<string, DType> = {
  F32: 'float32',
  F16: 'float16',
  BF16: 'bfloat16',
  F64: 'float64',
  I64: 'int64',
  I32: 'int32',
  U32: 'uint32',
  I8: 'int8',
  U8: 'uint8',
  BOOL: 'bool',
};
const FROM_DTYPE: Record<DType, string> = Object.fromEntries(Object.entries(TO_DTYPE).map(([k, v]) => [v, k])) as Record<DType, string>;

/** Where one tensor's bytes are. */
export interface TensorEntry {
  name: string;
  dtype: DType;
  shape: number[];
  /** Absolute path of the file holding it. */
  file: string;
  /** Byte offset of the data within the file (header included). */
  offset: number;
  /** Byte length of the data. */
  length: number;
}

/** A malformed or truncated weight file; the message names the file and tensor. */
export class SafetensorsError extends Error {
  override name = 'SafetensorsError';
}

/** Reads the header of one safetensors file and checks it against the file's size. */
export function readSafetensorsHeader(file: string): { tensors: TensorEntry[]; metadata: Record<string, string> } {
  const fd = openSync(file, 'r');
  try {
    const size = fstatSync(fd).size;
    if (size < 8) throw new SafetensorsError(`${file}: too short to be a safetensors file (${size} bytes)`);
    const lenBuf = Buffer.alloc(8);
    readSync(fd, lenBuf, 0, 8, 0);
    const headerLen = Number(lenBuf.readBigUInt64LE(0));
    if (headerLen > size - 8 || headerLen > 100_000_000) {
      throw new SafetensorsError(`${file}: header length ${headerLen} exceeds the file (${size} bytes): truncated or not safetensors`);
    }
    const headerBuf = Buffer.alloc(headerLen);
    readSync(fd, headerBuf, 0, headerLen, 8);
    let header: Record<string, unknown>;
    try {
      header = JSON.parse(headerBuf.toString('utf8')) as Record<string, unknown>;
    } catch (e) {
      throw new SafetensorsError(`${file}: header is not valid JSON (${(e as Error).message})`);
    }
    const base = 8 + headerLen;
    const tensors: TensorEntry[] = [];
    let metadata: Record<string, string> = {};
    for (const [name, info] of Object.entries(header)) {
      if (name === '__metadata__') {
        metadata = info as Record<string, string>;
        continue;
      }
      const { dtype, shape, data_offsets } = info as { dtype: string; shape: number[]; data_offsets: [number, number] };
      const dt = TO_DTYPE[dtype];
      if (!dt) throw new SafetensorsError(`${file}: tensor '${name}' has unsupported dtype ${dtype}`);
      const [start, end] = data_offsets;
      const expected = shape.reduce((a, b) => a * b, 1) * dtypeBytes(dt);
      if (end - start !== expected) {
        throw new SafetensorsError(`${file}: tensor '${name}' is ${dtype}[${shape}] (${expected} bytes) but spans ${end - start} bytes`);
      }
      if (base + end > size) {
        throw new SafetensorsError(`${file}: tensor '${name}' ends at byte ${base + end} but the file has ${size} bytes (truncated)`);
      }
      tensors.push({ name, dtype: dt, shape, file, offset: base + start, length: end - start });
    }
    return { tensors, metadata };
  } finally {
    closeSync(fd);
  }
}

/** Every tensor of a model folder (model.safetensors, or the shards listed by the index). */
export function readWeightIndex(dir: string): Map<string, TensorEntry> {
  const single = join(dir, 'model.safetensors');
  const indexFile = join(dir, 'model.safetensors.index.json');
  let files: string[];
  let weightMap: Record<string, string> | undefined;
  if (existsSync(single)) files = [single];
  else if (existsSync(indexFile)) {
    weightMap = readIndexWeightMap(indexFile);
    files = [...new Set(Object.values(weightMap))].map((f) => join(dir, f));
  } else {
    throw new SafetensorsError(`${dir}: no model.safetensors or model.safetensors.index.json`);
  }
  const all = new Map<string, TensorEntry>();
  for (const f of files) {
    if (!existsSync(f)) throw new SafetensorsError(`${f}: listed in ${indexFile} but missing`);
    for (const t of readSafetensorsHeader(f).tensors) all.set(t.name, t);
  }
  // A stale index (shards rewritten, index not) would otherwise load a tensor from a shard it does
  // not name, or miss one it promises.
  for (const [name, shard] of Object.entries(weightMap ?? {})) {
    const e = all.get(name);
    if (!e) throw new SafetensorsError(`${indexFile}: tensor '${name}' is listed in ${shard}, which does not hold it`);
    if (e.file !== join(dir, shard)) throw new SafetensorsError(`${indexFile}: tensor '${name}' is listed in ${shard} but found in ${basename(e.file)}`);
  }
  return all;
}

/** The `weight_map` of a model.safetensors.index.json; unreadable or malformed files name the file. */
function readIndexWeightMap(indexFile: string): Record<string, string> {
  let index: unknown;
  try {
    index = JSON.parse(readFileSync(indexFile, 'utf8'));
  } catch (e) {
    const what = e instanceof SyntaxError ? 'is not valid JSON' : 'cannot be read';
    throw new SafetensorsError(`${indexFile}: ${what} (${(e as Error).message})`);
  }
  const map = index && typeof index === 'object' ? (index as { weight_map?: unknown }).weight_map : undefined;
  if (!map || typeof map !== 'object' || Array.isArray(map)) throw new SafetensorsError(`${indexFile}: missing 'weight_map' (an object from tensor name to shard file)`);
  for (const [name, shard] of Object.entries(map)) {
    if (typeof shard !== 'string' || shard === '') throw new SafetensorsError(`${indexFile}: weight_map entry '${name}' should name a shard file, got ${JSON.stringify(shard)}`);
  }
  return map as Record<string, string>;
}

/** Reads one tensor's raw bytes. */
export function readTensorBytes(entry: TensorEntry): Uint8Array {
  const buf = Buffer.alloc(entry.length);
  const fd = openSync(entry.file, 'r');
  try {
    let done = 0;
    while (done < entry.length) {
      const n = readSync(fd, buf, done, entry.length - done, entry.offset + done);
      if (n === 0) throw new SafetensorsError(`${entry.file}: tensor '${entry.name}' is truncated`);
      done += n;
    }
  } finally {
    closeSync(fd);
  }
  return new Uint8Array(buf.buffer, buf.byteOffset, buf.byteLength);
}

/** A tensor to write. */
export interface TensorToWrite {
  name: string;
  dtype: DType;
  shape: number[];
  data: Uint8Array;
}

/**
 * Writes a safetensors file atomically (temporary file, fsync, rename): a crash leaves either the
 * old file or the complete new one.
 */
export function writeSafetensors(file: string, tensors: TensorToWrite[], metadata: Record<string, string> = {}): void {
  const header: Record<string, unknown> = { __metadata__: metadata };
  let offset = 0;
  for (const t of tensors) {
    const expected = t.shape.reduce((a, b) => a * b, 1) * dtypeBytes(t.dtype);
    if (t.data.byteLength !== expected) {
      throw new SafetensorsError(`${file}: tensor '${t.name}' is ${t.dtype}[${t.shape}] (${expected} bytes) but has ${t.data.byteLength}`);
    }
    header[t.name] = { dtype: FROM_DTYPE[t.dtype], shape: t.shape, data_offsets: [offset, offset + t.data.byteLength] };
    offset += t.data.byteLength;
  }
  let json = Buffer.from(JSON.stringify(header), 'utf8');
  const pad = (8 - (json.length % 8)) % 8; // keep the data 8-byte aligned
  if (pad) json = Buffer.concat([json, Buffer.alloc(pad, 0x20)]);
  const len = Buffer.alloc(8);
  len.writeBigUInt64LE(BigInt(json.length));
  const tmp = join(dirname(file), `.${basename(file)}.tmp-${process.pid}`);
  const fd = openSync(tmp, 'w');
  try {
    writeSync(fd, len);
    writeSync(fd, json);
    for (const t of tensors) writeSync(fd, t.data);
    fsyncSync(fd);
  } finally {
    closeSync(fd);
  }
  renameSync(tmp, file);
}
