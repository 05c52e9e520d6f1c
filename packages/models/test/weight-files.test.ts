/**
 * Weight folders other than one float32 model.safetensors: sharded folders
 * (model.safetensors.index.json) and bfloat16 / float16 tensors. Each loads to the same logits as
 * a single float32 file holding the same values; bad index files are errors naming the file.
 */
import { copyFileSync, mkdirSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import {
  paramSpecs,
  readConfig,
  readTensorBytes,
  readWeightIndex,
  saveHfModel,
  SafetensorsError,
  writeSafetensors,
  type DecoderConfig,
  type TensorToWrite,
} from '@lathe/models';
import { logitsRunner, tinyModel, tinyQwen2, tinyQwen3 } from './tiny';

/** The model's float32 weights by name. */
function float32Weights(dir: string, config: DecoderConfig): Map<string, Float32Array> {
  const index = readWeightIndex(dir);
  return new Map(
    paramSpecs(config).map((s) => {
      const b = readTensorBytes(index.get(s.name)!);
      return [s.name, Float32Array.from(new Float32Array(b.buffer, b.byteOffset, b.byteLength / 4))];
    }),
  );
}

const bytes = (a: Float32Array | Uint16Array) => new Uint8Array(a.buffer, a.byteOffset, a.byteLength);
const batch = { input_ids: [[0, 0, 3, 14, 15, 9], [7, 1, 8, 2, 8, 1]], attention_mask: [[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]] };
const logitsOf = async (dir: string, config: DecoderConfig) => Array.from((await (await logitsRunner(dir, config))(batch)).data as Float32Array);

describe('sharded folders (model.safetensors.index.json)', () => {
  const { dir, config } = tinyModel(tinyQwen2, 2);
  const specs = paramSpecs(config);
  const shardNames = ['model-00001-of-00002.safetensors', 'model-00002-of-00002.safetensors'];

  /** Writes the model as two shards and an index; `edit` may change the index before it is written. */
  function shard(edit: (index: { metadata: object; weight_map: Record<string, string> }) => unknown = (i) => i): string {
    const out = mkdtempSync(join(tmpdir(), 'lathe-shards-'));
    const source = readWeightIndex(dir);
    const half = Math.ceil(specs.length / 2);
    const groups = [specs.slice(0, half), specs.slice(half)];
    const weightMap: Record<string, string> = {};
    groups.forEach((group, k) => {
      writeSafetensors(
        join(out, shardNames[k]),
        group.map((s) => ({ name: s.name, dtype: 'float32', shape: s.shape, data: readTensorBytes(source.get(s.name)!) })),
        { format: 'pt' },
      );
      for (const s of group) weightMap[s.name] = shardNames[k];
    });
    const total = specs.reduce((n, s) => n + 4 * s.shape.reduce((a, b) => a * b, 1), 0);
    const index = edit({ metadata: { total_size: total }, weight_map: weightMap });
    writeFileSync(join(out, 'model.safetensors.index.json'), typeof index === 'string' ? index : JSON.stringify(index));
    copyFileSync(join(dir, 'config.json'), join(out, 'config.json'));
    return out;
  }

  test('two shards load every tensor from its shard and give the single file’s logits', async () => {
    const out = shard();
    const index = readWeightIndex(out);
    const single = readWeightIndex(dir);
    expect([...index.keys()].sort()).toEqual(specs.map((s) => s.name).sort());
    expect(new Set([...index.values()].map((e) => e.file))).toEqual(new Set(shardNames.map((f) => join(out, f))));
    for (const s of specs) expect(Buffer.compare(Buffer.from(readTensorBytes(index.get(s.name)!)), Buffer.from(readTensorBytes(single.get(s.name)!)))).toBe(0);
    expect(await logitsOf(out, config)).toEqual(await logitsOf(dir, config));
  });

  test('a corrupt or unreadable index names the file', () => {
    const corrupt = shard(() => '{"weight_map": {"model.norm.weight": ');
    const indexFile = join(corrupt, 'model.safetensors.index.json');
    expect(() => readWeightIndex(corrupt)).toThrow(SafetensorsError);
    expect(() => readWeightIndex(corrupt)).toThrow(`${indexFile}: is not valid JSON`);
    // A directory where the file should be: reading it fails (EISDIR).
    const unreadable = mkdtempSync(join(tmpdir(), 'lathe-shards-'));
    mkdirSync(join(unreadable, 'model.safetensors.index.json'));
    expect(() => readWeightIndex(unreadable)).toThrow(`${join(unreadable, 'model.safetensors.index.json')}: cannot be read`);
    expect(() => readWeightIndex(shard(() => ({ metadata: {} })))).toThrow(/index\.json: missing 'weight_map'/);
    expect(() => readWeightIndex(shard((i) => ({ ...i, weight_map: { ...i.weight_map, 'model.norm.weight': 7 } })))).toThrow(
      /index\.json: weight_map entry 'model\.norm\.weight' should name a shard file, got 7/,
    );
  });

  test('an index that disagrees with its shards names the tensor and shard', () => {
    const first = specs[0].name; // written to shard 1
    const moved = shard((i) => ({ ...i, weight_map: { ...i.weight_map, [first]: shardNames[1] } }));
    expect(() => readWeightIndex(moved)).toThrow(`tensor '${first}' is listed in ${shardNames[1]} but found in ${shardNames[0]}`);
    const ghost = shard((i) => ({ ...i, weight_map: { ...i.weight_map, 'model.extra.weight': shardNames[0] } }));
    expect(() => readWeightIndex(ghost)).toThrow(`tensor 'model.extra.weight' is listed in ${shardNames[0]}, which does not hold it`);
    const missing = shard((i) => ({ ...i, weight_map: { ...i.weight_map, [first]: 'model-00003-of-00002.safetensors' } }));
    expect(() => readWeightIndex(missing)).toThrow(/model-00003-of-00002\.safetensors: listed in .*index\.json but missing/);
  });
});

// Half-precision encodings written out here from their definitions (sign, exponent, mantissa), so
// the test does not lean on the runtime's converters. Rounding need not be exact: the float32
// copy holds whatever value the half-precision bits decode to, so both files hold equal values.

/** bfloat16: the top 16 bits of a float32, rounded to nearest even. */
function toBf16(x: Float32Array): Uint16Array {
  const u = new Uint32Array(x.buffer, x.byteOffset, x.length);
  return Uint16Array.from(u, (b) => ((b + 0x7fff + ((b >>> 16) & 1)) >>> 16) & 0xffff);
}
function fromBf16(h: Uint16Array): Float32Array {
  return new Float32Array(Uint32Array.from(h, (b) => (b << 16) >>> 0).buffer);
}

/** IEEE binary16: 1 sign bit, 5 exponent bits (bias 15), 10 mantissa bits; subnormals below 2⁻¹⁴. */
function toF16(x: Float32Array): Uint16Array {
  return Uint16Array.from(x, (v) => {
    const sign = v < 0 ? 0x8000 : 0;
    const a = Math.abs(v);
    if (a >= 65504) throw new Error(`${v} does not fit float16`);
    if (a < 2 ** -14) return sign | Math.round(a / 2 ** -24); // 1024 is exactly 2⁻¹⁴'s bits
    let e = Math.floor(Math.log2(a));
    if (2 ** e > a) e -= 1;
    if (2 ** (e + 1) <= a) e += 1;
    let m = Math.round((a / 2 ** e - 1) * 1024);
    if (m === 1024) [m, e] = [0, e + 1];
    return sign | ((e + 15) << 10) | m;
  });
}
function fromF16(h: Uint16Array): Float32Array {
  return Float32Array.from(h, (b) => {
    const s = b & 0x8000 ? -1 : 1;
    const e = (b >> 10) & 0x1f;
    const m = b & 0x3ff;
    return e === 0 ? s * m * 2 ** -24 : s * (1 + m / 1024) * 2 ** (e - 15);
  });
}

describe.each([
  ['bfloat16', toBf16, fromBf16],
  ['float16', toF16, fromF16],
] as const)('%s weight files', (dtype, encode, decode) => {
  test(`a model saved in ${dtype} loads to the logits of its float32 copy`, async () => {
    const { dir, config } = tinyModel(tinyQwen3, 6);
    const weights = float32Weights(dir, config);
    const half: TensorToWrite[] = [];
    const exact: TensorToWrite[] = [];
    let changed = 0;
    for (const s of paramSpecs(config)) {
      const bits = encode(weights.get(s.name)!);
      const values = decode(bits);
      changed += values.filter((v, i) => v !== weights.get(s.name)![i]).length;
      half.push({ name: s.name, dtype, shape: s.shape, data: bytes(bits) });
      exact.push({ name: s.name, dtype: 'float32', shape: s.shape, data: bytes(values) });
    }
    expect(changed).toBeGreaterThan(1000); // the rounding did change the weights
    const halfDir = mkdtempSync(join(tmpdir(), `lathe-${dtype}-`));
    const exactDir = mkdtempSync(join(tmpdir(), 'lathe-f32-'));
    saveHfModel(halfDir, config, half);
    saveHfModel(exactDir, config, exact);
    expect(JSON.parse(readFileSync(join(halfDir, 'config.json'), 'utf8')).torch_dtype).toBe(dtype);
    expect([...readWeightIndex(halfDir).values()].every((e) => e.dtype === dtype)).toBe(true);
    const { config: loaded } = readConfig(halfDir);
    // Widening half precision to float32 is exact, so float32 compute sees equal weights.
    expect(await logitsOf(halfDir, loaded)).toEqual(await logitsOf(exactDir, config));
  });
});
