/**
 * The one rule for the dtype a LoRA run binds its frozen base in (`loraBaseDtype`: the compute
 * dtype, except float32 compute or a target merged as base + B·A), the upload that follows it
 * (`uploadLoraBase`: half-precision bits rounded to nearest even), and the in-graph merge over a
 * base bound in bfloat16, which widens it to float32 before adding B·A (run on the CPU provider:
 * Cast, MatMul and Add in float32).
 */
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import * as L from '@lathe/onnx';
import { CausalLM, paramSpecs, randomModel } from '@lathe/models';
import { Device, fromBfloat16Bits, toBfloat16Bits, toFloat16Bits } from '@lathe/runtime';
import { tinyQwen3 } from '../../models/test/tiny';
import { initLora, loraAdapters, loraBaseDtype, mergedLoraWeights, mergeLora, uploadLoraBase, type LoraConfig } from '@lathe/train';

// one layer, untied: the LM head is its own matrix, so a LoRA target can merge into it
const hf = { ...tinyQwen3, num_hidden_layers: 1, tie_word_embeddings: false };
const dir = mkdtempSync(join(tmpdir(), 'lathe-lora-dtype-'));
const config = randomModel(dir, hf, { seed: 5, std: 0.3 });
const base = CausalLM.fromPretrainedSync(dir).float32Weights();
const lora: LoraConfig = { rank: 2, alpha: 4, targets: 'q_proj|down_proj|lm_head' };
const adapters = loraAdapters(config, lora);
const Q = 'model.layers.0.self_attn.q_proj.weight';
const K = 'model.layers.0.self_attn.k_proj.weight';
const HEAD = 'lm_head.weight';
const EMBED = 'model.embed_tokens.weight';

test('loraBaseDtype: the compute dtype for projections (targeted or not) and other weights, float32 for a merged target or with float32 compute', () => {
  expect(adapters.map((a) => a.target)).toEqual([Q, 'model.layers.0.mlp.down_proj.weight', HEAD]);
  const table = (compute: L.DType) => [Q, K, HEAD, EMBED].map((n) => loraBaseDtype(n, adapters, compute));
  expect(table('bfloat16')).toEqual(['bfloat16', 'bfloat16', 'float32', 'bfloat16']);
  expect(table('float16')).toEqual(['float16', 'float16', 'float32', 'float16']);
  expect(table('float32')).toEqual(['float32', 'float32', 'float32', 'float32']);
  // an LM head that is not a target is read like any other weight
  expect(loraBaseDtype(HEAD, loraAdapters(config, { ...lora, targets: 'q_proj' }), 'bfloat16')).toBe('bfloat16');
});

test('uploadLoraBase: bfloat16/float16 bits rounded to nearest even, a merged target and float32 compute as the float32 values', () => {
  const device = Device.cpu();
  const spec = (n: string) => paramSpecs(config).find((s) => s.name === n)!;
  const up = (n: string, compute: L.DType) => uploadLoraBase(device, n, { data: base.get(n)!, dims: spec(n).shape }, adapters, compute);
  const cases = [
    [Q, 'bfloat16', toBfloat16Bits(base.get(Q)!)],
    [Q, 'float16', toFloat16Bits(base.get(Q)!)],
    [Q, 'float32', base.get(Q)!],
    [HEAD, 'bfloat16', base.get(HEAD)!],
  ] as const;
  for (const [n, compute, expected] of cases) {
    const t = up(n, compute);
    const dtype = loraBaseDtype(n, adapters, compute);
    expect([n, compute, t.dtype, t.byteLength, t.dims]).toEqual([n, compute, dtype, base.get(n)!.length * L.dtypeBytes(dtype), spec(n).shape]);
    expect(t.download().data).toEqual(expected);
    t.dispose();
  }
  expect(() => up(Q, 'float64')).toThrow('uploadLoraBase: compute dtype float64 is not a LoRA base dtype (float32, bfloat16, float16)');
});

test('mergedLoraWeights over a bfloat16 base: the targeted projection is widened to float32 before B·A is added', () => {
  const device = Device.cpu();
  const values = initLora(adapters, 1);
  // B starts at zero; a non-zero B makes the sum matter
  for (const a of adapters) values.set(a.b.name, Float32Array.from(values.get(a.b.name)!, (_, i) => Math.sin(i + 1) / 4));
  const g = new L.Graph('merge');
  const spec = paramSpecs(config).find((s) => s.name === Q)!;
  const baseInput = g.input(`base/${Q}`, 'bfloat16', spec.shape);
  const trainable = new Map(adapters.flatMap((a) => [a.a, a.b]).map((p) => [p.name, g.input(p.name, 'float32', p.shape)]));
  g.output(mergedLoraWeights(() => baseInput, trainable, adapters, lora, 'float32')(Q), 'merged');
  const b = device.compile(g).binding();
  const owned = [device.upload({ data: toBfloat16Bits(base.get(Q)!), dims: spec.shape }, 'bfloat16'), ...[...trainable.keys()].map((n) => device.upload({ data: values.get(n)!, dims: trainable.get(n)!.shape as number[] }))];
  b.input(`base/${Q}`, owned[0]);
  [...trainable.keys()].forEach((n, i) => b.input(n, owned[i + 1]));
  b.output('merged', 'host').runSync();
  const merged = b.fetch('merged').data as Float32Array;
  const host = mergeLora(new Map([[Q, fromBfloat16Bits(toBfloat16Bits(base.get(Q)!))]]), values, adapters.filter((a) => a.target === Q), lora).get(Q)!;
  let diff = 0;
  for (let i = 0; i < host.length; i++) diff = Math.max(diff, Math.abs(merged[i] - host[i]));
  expect(diff).toBeLessThan(1e-6);
  // the adapters moved it off the bfloat16 grid
  expect(Math.max(...merged.map((v, i) => Math.abs(v - fromBfloat16Bits(toBfloat16Bits(base.get(Q)!))[i])))).toBeGreaterThan(1e-3);
  b.dispose();
  owned.forEach((t) => t.dispose());
});
