/**
 * CausalLM, the model object, on the CPU device: loading a folder lazily or onto a device in a
 * compute dtype, float32 weights from each place they can be, saving (byte-identical to
 * randomModel's folder for the same seed), and its errors. Expected values come from the
 * safetensors bytes and the runtime's own bfloat16 rounding.
 */
import { copyFileSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { CausalLM, paramSpecs, randomModel, readConfig, readTensorBytes, readWeightIndex } from '@lathe/models';
import { Device, fromBfloat16Bits, toBfloat16Bits } from '@lathe/runtime';
import { tinyModel, tinyQwen2, tinyQwen3 } from './tiny';

const fresh = () => mkdtempSync(join(tmpdir(), 'lathe-causal-lm-'));

/** The folder's weights as float32, straight from the file bytes. */
function fileWeights(dir: string): Map<string, Float32Array> {
  return new Map([...readWeightIndex(dir)].map(([name, e]) => {
    const b = readTensorBytes(e);
    return [name, new Float32Array(b.buffer.slice(b.byteOffset, b.byteOffset + b.byteLength))] as const;
  }));
}

describe('CausalLM on a tiny Qwen2 (untied LM head)', () => {
  const { dir, config } = tinyModel(tinyQwen2, 3);
  const expected = fileWeights(dir);

  test('fromPretrained without a device reads the files when asked, and has no device weights', async () => {
    const model = await CausalLM.fromPretrained(dir);
    expect(model.config).toEqual(readConfig(dir).config);
    expect(model.dir).toBe(dir);
    expect(model.device).toBeUndefined();
    expect(model.dtype).toBe('float32');
    expect(() => model.weights).toThrow(/on the host .*load with \{ device \}/);
    const w = model.float32Weights();
    expect([...w.keys()]).toEqual(paramSpecs(config).map((s) => s.name));
    for (const [name, values] of expected) expect(w.get(name)).toEqual(values);
    expect(model.weightFiles()).toEqual(readWeightIndex(dir));
  });

  test('onto the CPU device in float32 and in bfloat16', async () => {
    const f32 = await CausalLM.fromPretrained(dir, { device: 'cpu' });
    expect(f32.device).toBe(Device.cpu());
    expect(f32.dtype).toBe('float32');
    for (const [name, t] of f32.weights) {
      expect(t.dtype).toBe('float32');
      expect(t.download().data).toEqual(expected.get(name));
    }
    expect(f32.float32Weights()).toEqual(expected);

    const bf16 = await CausalLM.fromPretrained(dir, { device: Device.cpu(), dtype: 'bfloat16' });
    expect(bf16.dtype).toBe('bfloat16');
    const name = 'model.layers.1.mlp.down_proj.weight';
    expect(bf16.weights.get(name)!.download().data).toEqual(toBfloat16Bits(expected.get(name)!));
    expect(bf16.float32Weights().get(name)).toEqual(fromBfloat16Bits(toBfloat16Bits(expected.get(name)!)));
    f32.dispose();
    bf16.dispose();
    expect(() => bf16.float32Weights()).toThrow(/disposed/);
  });

  test('to() copies (device to device when it can); the copy outlives the original', async () => {
    const a = await CausalLM.fromPretrained(dir, { device: 'cpu' });
    const b = a.to('cpu', 'float32');
    a.dispose();
    expect(b.float32Weights()).toEqual(expected);
    const c = b.to('cpu', 'bfloat16').to('cpu', 'float32');
    const name = 'lm_head.weight';
    expect(c.float32Weights().get(name)).toEqual(fromBfloat16Bits(toBfloat16Bits(expected.get(name)!)));
    b.dispose();
    c.dispose();
    expect(() => CausalLM.fromWeights(config, expected).to('cpu', 'int8')).toThrow(/dtype int8 is not a weight dtype/);
  });

  test('save writes a folder that loads back, in float32 or bfloat16', async () => {
    const model = await CausalLM.fromPretrained(dir, { device: 'cpu', dtype: 'bfloat16' });
    const out = fresh();
    model.save(out);
    const index = readWeightIndex(out);
    expect([...index.values()].every((e) => e.dtype === 'bfloat16')).toBe(true);
    expect(JSON.parse(readFileSync(join(out, 'config.json'), 'utf8')).torch_dtype).toBe('bfloat16');
    const back = await CausalLM.fromPretrained(out);
    expect(back.config).toEqual({ ...config, torchDtype: 'bfloat16' });
    expect(back.float32Weights()).toEqual(model.float32Weights());
    const f32 = fresh();
    back.save(f32, { dtype: 'float32' });
    expect(fileWeights(f32)).toEqual(model.float32Weights());
    model.dispose();
  });

  test('fromWeights holds float32 arrays and checks them against the config', () => {
    const model = CausalLM.fromWeights(config, expected);
    expect(model.float32Weights().get('model.norm.weight')).toBe(expected.get('model.norm.weight'));
    const missing = new Map(expected);
    missing.delete('model.layers.0.self_attn.q_proj.bias');
    expect(() => CausalLM.fromWeights(config, missing)).toThrow(/missing weight 'model\.layers\.0\.self_attn\.q_proj\.bias'/);
    const short = new Map(expected).set('model.norm.weight', new Float32Array(3));
    expect(() => CausalLM.fromWeights(config, short)).toThrow(/'model\.norm\.weight' has 3 elements, the config implies \[32\]/);
    // a model without files writes them on demand, for graphs that read external initializers
    const files = model.weightFiles();
    expect(readTensorBytes(files.get('lm_head.weight')!)).toEqual(new Uint8Array(expected.get('lm_head.weight')!.buffer));
  });
});

test('CausalLM.random(...).save is byte-identical to randomModel for the same seed and std', () => {
  const a = fresh();
  const b = fresh();
  randomModel(a, tinyQwen3, { seed: 7, std: 0.2 });
  CausalLM.random(tinyQwen3, { seed: 7, std: 0.2 }).save(b);
  for (const f of ['model.safetensors', 'config.json']) expect(readFileSync(join(b, f))).toEqual(readFileSync(join(a, f)));
});

test('fromPretrained names a missing weight and a wrong shape', () => {
  const { dir } = tinyModel(tinyQwen3, 2);
  const cfg = JSON.parse(readFileSync(join(dir, 'config.json'), 'utf8'));
  const wrong = fresh();
  randomModel(wrong, { ...cfg, intermediate_size: 40 });
  const mixed = fresh();
  writeFileSync(join(mixed, 'config.json'), JSON.stringify(cfg));
  copyFileSync(join(wrong, 'model.safetensors'), join(mixed, 'model.safetensors'));
  expect(() => CausalLM.fromPretrainedSync(mixed)).toThrow(/model\.safetensors: 'model\.layers\.0\.mlp\.gate_proj\.weight' has shape \[40,32\], the config implies \[48,32\]/);
});
