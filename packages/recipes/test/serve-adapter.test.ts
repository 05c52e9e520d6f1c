/**
 * `lathe serve --model ADAPTER_DIR`: a PEFT LoRA adapter folder served with its adapters merged
 * into its base at load. Independent truth: the same base merged by hand here (W + (alpha/r)·B·A in
 * float64) and saved as a plain model folder gives the same greedy text, which differs from the
 * base's own.
 */
import { mkdirSync, mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, relative } from 'node:path';
import { CausalLM, paramSpecs, saveHfModel, writeSafetensors } from '@lathe/models';
import { parseServeModels } from '@lathe/recipes';
import { serve, tinyServeModel } from './serve-helpers';

const base = tinyServeModel('policy');
const root = mkdtempSync(join(tmpdir(), 'lathe-serve-adapter-'));
const bytes = (a: Float32Array) => new Uint8Array(a.buffer, a.byteOffset, a.byteLength);

/** A seeded value in [-1, 1). */
function noise(seed: number): () => number {
  let s = seed >>> 0;
  return () => ((s = (Math.imul(s, 1664525) + 1013904223) >>> 0) / 2 ** 32) * 2 - 1;
}

/** Writes a rank-2 adapter on layer 0's q_proj and down_proj (PEFT names, its base_model.model. prefix), and the hand-merged model. */
function writeAdapterAndMerged(): { adapter: string; merged: string } {
  const lm = CausalLM.fromPretrainedSync(base);
  const weights = lm.float32Weights();
  const { config } = lm;
  const rank = 2;
  const alpha = 8;
  const rand = noise(7);
  const tensors = [];
  for (const module of ['model.layers.0.self_attn.q_proj', 'model.layers.0.mlp.down_proj']) {
    const W = weights.get(`${module}.weight`)!;
    const inn = module.endsWith('q_proj') ? config.hiddenSize : config.intermediateSize;
    const out = W.length / inn;
    const A = Float32Array.from({ length: rank * inn }, () => rand());
    const B = Float32Array.from({ length: out * rank }, () => rand());
    const merged = new Float32Array(W.length);
    for (let o = 0; o < out; o++) for (let i = 0; i < inn; i++) {
      let d = 0;
      for (let k = 0; k < rank; k++) d += B[o * rank + k] * A[k * inn + i];
      merged[o * inn + i] = W[o * inn + i] + (alpha / rank) * d;
    }
    weights.set(`${module}.weight`, merged);
    tensors.push({ name: `base_model.model.${module}.lora_A.weight`, dtype: 'float32' as const, shape: [rank, inn], data: bytes(A) });
    tensors.push({ name: `base_model.model.${module}.lora_B.weight`, dtype: 'float32' as const, shape: [out, rank], data: bytes(B) });
  }
  const adapter = join(root, 'adapter');
  mkdirSync(adapter);
  writeSafetensors(join(adapter, 'adapter_model.safetensors'), tensors, { format: 'pt' });
  writeFileSync(join(adapter, 'adapter_config.json'), JSON.stringify({ peft_type: 'LORA', r: rank, lora_alpha: alpha, target_modules: ['q_proj', 'down_proj'], base_model_name_or_path: relative(adapter, base) }));
  const merged = join(root, 'merged');
  saveHfModel(merged, config, paramSpecs(config).map((sp) => ({ name: sp.name, dtype: 'float32' as const, shape: sp.shape, data: bytes(weights.get(sp.name)!) })), { tokenizerFrom: base });
  return { adapter, merged };
}

/** A greedy completion from a server. */
async function complete(url: string, model: string): Promise<string> {
  const res = await fetch(`${url}/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model, prompt: 'The sum of two and three is', max_tokens: 8, temperature: 0 }) });
  const body = (await res.json()) as { choices: { text: string }[] };
  if (res.status !== 200) throw new Error(JSON.stringify(body));
  return body.choices[0].text;
}

test('an adapter folder is served merged into its base: the same greedy text as the base merged by hand, not the base’s', async () => {
  const { adapter, merged } = writeAdapterAndMerged();
  expect(parseServeModels(`a=${adapter}`)).toEqual([{ id: 'a', dir: adapter, base }]);
  const s = await serve({ model: `adapter=${adapter},merged=${merged},base=${base}`, max_rows: 2, max_model_len: 64 });
  try {
    const [a, m, b] = [await complete(s.url, 'adapter'), await complete(s.url, 'merged'), await complete(s.url, 'base')];
    expect(a).toBe(m);
    expect(a).not.toBe(b);
  } finally {
    await s.close();
  }
}, 120_000);

test('bad adapter folders: errors name the file and field', () => {
  const dir = join(root, 'bad');
  mkdirSync(dir);
  const write = (cfg: object) => writeFileSync(join(dir, 'adapter_config.json'), JSON.stringify(cfg));
  write({ r: 2, lora_alpha: 4, base_model_name_or_path: 'no/such/folder' });
  expect(() => parseServeModels(dir)).toThrow(`--model ${dir}: ${join(dir, 'adapter_config.json')}: base_model_name_or_path 'no/such/folder' is not a model folder here`);
  write({ r: 0, lora_alpha: 4, base_model_name_or_path: base });
  expect(() => parseServeModels(dir)).toThrow(/adapter_config\.json: r should be a positive integer, got 0/);
  write({ peft_type: 'IA3', base_model_name_or_path: base });
  expect(() => parseServeModels(dir)).toThrow(/peft_type is "IA3"; only LORA adapters can be merged/);
  write({ r: 2, lora_alpha: 4, use_dora: true, base_model_name_or_path: base });
  expect(() => parseServeModels(dir)).toThrow(/DoRA adapters are not supported/);
});
