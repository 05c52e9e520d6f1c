/**
 * `lathe serve` over a quantized folder (`--quantized_weights`): with `auto` the slot engine binds the
 * folder's codes (uint8) and runs ONNX Runtime's quantized kernels, with `dequantize` the dense weights
 * dequantized at load; greedy completions of both are the same tokens (the kernels compute the
 * dequantized weights' products). The load reports how the weights run; a LoRA adapter over a
 * quantized base is refused with `auto`, naming the flag.
 */
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { CausalLM } from '@lathe/models';
import { QuantizedModel, saveQuantized, type QuantScheme } from '@lathe/quantization';
import { defaults, describeWeights, serveSchema, startServe, type ModelWeights } from '@lathe/recipes';
import { serve, tinyServeModel } from './serve-helpers';

const dense = tinyServeModel('quantized-source', 7);
const source = CausalLM.fromPretrainedSync(dense);
const SCHEMES: Record<string, QuantScheme> = { int8: { format: 'int8' }, int4: { format: 'int4', blockSize: 32 }, nf4: { format: 'nf4', doubleQuant: true } };
const folders: Record<string, string> = {};
for (const [name, scheme] of Object.entries(SCHEMES)) {
  folders[name] = join(dense, '..', `quantized-${name}`);
  saveQuantized(folders[name], QuantizedModel.quantize(source.config, source.float32Weights(), scheme), { denseDtype: 'float32', tokenizerFrom: dense });
}
source.dispose();

test.each(Object.keys(SCHEMES))('%s: auto runs the quantized kernels over the codes, with the tokens of the dequantized run', async (name) => {
  const seen: ModelWeights[] = [];
  const run = async (q: 'auto' | 'dequantize') => {
    const s = await startServe({ ...defaults(serveSchema), port: 0, model: folders[name], device: 'cpu', max_rows: 4, max_model_len: 96, http_thread: false, quantized_weights: q }, { onLoaded: (m) => seen.push(m.weights) });
    try {
      const out: string[][] = [];
      for (const prompt of ['What is 2+3?', 'Name a prime.']) {
        const r = await fetch(`${s.url}/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: s.models[0].id, prompt, max_tokens: 8, temperature: 0, logprobs: 1 }) });
        expect(r.status).toBe(200);
        out.push(((await r.json()) as { choices: { logprobs: { tokens: string[] } }[] }).choices[0].logprobs.tokens);
      }
      return out;
    } finally {
      await s.close();
    }
  };
  const auto = await run('auto');
  const deq = await run('dequantize');
  expect(auto).toEqual(deq);
  expect(auto.flat().length).toBeGreaterThan(8);
  const [a, d] = seen;
  expect(a.runs).toBe(name === 'nf4' ? 'MatMulBnb4' : 'MatMulNBits');
  expect(d.runs).toBe('dequantized');
  // the quantized run binds the codes and fewer bytes: a silent dense fallback fails here
  expect(a.codeTensors).toBe(7);
  expect(d.codeTensors).toBe(0);
  expect(a.deviceBytes!).toBeLessThan(d.deviceBytes!);
  expect(describeWeights(a)).toMatch(new RegExp(`^${name}`));
}, 60_000);

test('a LoRA adapter over a quantized base: refused with auto, naming the flag', async () => {
  const adapter = join(dense, '..', 'adapter-over-int4');
  mkdirSync(adapter, { recursive: true });
  writeFileSync(join(adapter, 'adapter_config.json'), JSON.stringify({ base_model_name_or_path: folders.int4, r: 2, lora_alpha: 4, peft_type: 'LORA' }));
  await expect(serve({ model: adapter, device: 'cpu', max_rows: 2, max_model_len: 64, http_thread: false })).rejects.toThrow(
    `--model ${adapter}: a LoRA adapter over a quantized base (${folders.int4}, int4) is served merged into the dequantized base; pass --quantized_weights dequantize`,
  );
});
