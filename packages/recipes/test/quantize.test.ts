/**
 * `lathe quantize` and `lathe quantize eval` on the built-in tiny model (CPU): the checkpoint is
 * written with its quantization_config and loads back through the ordinary loader; eval measures
 * a small positive KL on the original's own greedy tokens (INT8 far below NF4) and, for a reward
 * model, accuracies and a score correlation near 1; bad input is refused naming the flag or file.
 */
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { CausalLM } from '@lathe/models';
import { RewardModel } from '@lathe/reward-models';
import { builtinBaseModel, defaults, quantizeEvalSchema, quantizeSchema, runQuantize, runQuantizeEval, type QuantizeConfig, type QuantizeEvalConfig } from '@lathe/recipes';
import { writeAdditionTask } from './preference-task';

const root = mkdtempSync(join(tmpdir(), 'lathe-quantize-'));
const base = builtinBaseModel(join(root, 'run'), 0).dir;
const task = writeAdditionTask(root);
const q = (over: Partial<QuantizeConfig>): QuantizeConfig => ({ ...defaults(quantizeSchema), model: base, ...over });
const e = (over: Partial<QuantizeEvalConfig>): QuantizeEvalConfig => ({ ...defaults(quantizeEvalSchema), model: base, tokenizer: 'builtin:addition', data: task.prompts, max_new_tokens: 6, limit: 12, batch_size: 5, ...over });

test('writes the checkpoint, which CausalLM.fromPretrained loads; quantize eval: KL on generated tokens, int8 ≪ nf4', async () => {
  const int8 = runQuantize(q({ format: 'int8', out: join(root, 'int8') }));
  const nf4 = runQuantize(q({ format: 'nf4', double_quant: true, out: join(root, 'nf4') }));
  expect(int8).toMatchObject({ format: 'int8', padded: [], skipped: [] });
  expect(nf4.bitsPerQuantizedWeight).toBeGreaterThan(4.12);
  expect(nf4.bitsPerQuantizedWeight).toBeLessThan(4.14);
  const cfg = JSON.parse(readFileSync(join(root, 'nf4', 'config.json'), 'utf8')) as Record<string, unknown>;
  expect(cfg.quantization_config).toMatchObject({ quant_method: 'bitsandbytes', bnb_4bit_use_double_quant: true });
  const lm = CausalLM.fromPretrainedSync(join(root, 'nf4'));
  expect(lm.float32Weights().size).toBe(CausalLM.fromPretrainedSync(base).float32Weights().size);

  const r8 = await runQuantizeEval(e({ quantized: join(root, 'int8') }));
  const r4 = await runQuantizeEval(e({ quantized: join(root, 'nf4') }));
  const rd = await runQuantizeEval(e({ quantized: join(root, 'nf4'), kernels: 'dequantize' }));
  if (r8.kind !== 'causal_lm' || r4.kind !== 'causal_lm' || rd.kind !== 'causal_lm') throw new Error('expected causal LM summaries');
  expect(r8.prompts).toBe(12);
  // The prompts carry answers: both models' greedy answers are graded (a random model gets none right).
  expect(r8.task).toEqual({ graded: 12, accuracyOriginal: 0, accuracyQuantized: 0 });
  expect(r8.tokens).toBe(12 * 6); // the random model never emits EOS within 6 tokens
  expect(r8.klMean).toBeGreaterThan(0);
  expect(r8.klMean * 20).toBeLessThan(r4.klMean);
  expect(r4.klMean).toBeLessThan(0.05);
  expect(r4.klMax).toBeGreaterThanOrEqual(r4.klMean);
  expect(Math.abs(r4.perplexityChange)).toBeLessThan(0.2);
  // The kernels and the dequantize fallback agree.
  expect(rd.klMean).toBeCloseTo(r4.klMean, 6);
  // With the LM head quantized too (int8), the KL grows a little and stays small.
  const head = runQuantize(q({ format: 'nf4', double_quant: true, lm_head: 'int8', out: join(root, 'nf4-head') }));
  expect(head.lmHead?.format).toBe('int8');
  const rh = await runQuantizeEval(e({ quantized: join(root, 'nf4-head') }));
  if (rh.kind !== 'causal_lm') throw new Error('expected a causal LM summary');
  expect(rh.klMean).toBeGreaterThan(r4.klMean);
  expect(rh.klMean).toBeLessThan(0.05);
});

test('a reward model: accuracy before and after, score correlation', async () => {
  const rmDir = join(root, 'rm');
  RewardModel.fromCausalLM(CausalLM.fromPretrainedSync(base), { padTokenId: 0, seed: 1 }).save(rmDir);
  runQuantize(q({ model: rmDir, format: 'int8', out: join(root, 'rm-int8') }));
  const r = await runQuantizeEval(e({ model: rmDir, quantized: join(root, 'rm-int8'), data: task.pairs, limit: 40, batch_size: 16 }));
  if (r.kind !== 'reward_model') throw new Error('expected a reward model summary');
  expect(r.pairs).toBe(40);
  expect(r.accuracyOriginal).toBeGreaterThanOrEqual(0);
  expect(Math.abs(r.accuracyQuantized - r.accuracyOriginal)).toBeLessThanOrEqual(0.1);
  expect(r.scoreCorrelation).toBeGreaterThan(0.99);
});

test('bad input is refused, naming the flag or file', async () => {
  const out = join(root, 'again');
  expect(() => runQuantize(q({ model: join(root, 'nf4'), out }))).toThrow(/is already quantized \(config\.json quantization_config, quant_method "bitsandbytes"\): quantize the original model/);
  expect(() => runQuantize(q({ out: base }))).toThrow(/--out .* is the model folder/);
  expect(() => runQuantize(q({ out: join(root, 'int8') }))).toThrow(/already holds a model \(pass --overwrite/);
  expect(() => runQuantize(q({ format: 'int4', block_size: 48, out }))).toThrow('--block_size: int4 block size 48 is not one of 32, 64, 128');
  expect(() => runQuantize(q({ format: 'int8', double_quant: true, out }))).toThrow('--double_quant: double quantization is for nf4, not int8');
  expect(() => runQuantize(q({ skip: 'nothing_like_this', out }))).toThrow(/--skip nothing_like_this: no projection weight name contains/);
  expect(() => runQuantize(q({ model: '', out }))).toThrow(/--model is required/);
  expect(() => runQuantize(q({ model: join(root, 'rm'), lm_head: 'int8', out }))).toThrow(/--lm_head int8: .* is a reward model/);
  const bad = join(root, 'bad.jsonl');
  writeFileSync(bad, '{"prompt": "1+1="}\n{"text": "no prompt"}\n');
  await expect(runQuantizeEval(e({ quantized: join(root, 'int8'), data: bad }))).rejects.toThrow(`--data ${bad}: line 2 has no "prompt" text`);
  await expect(runQuantizeEval(e({ quantized: base }))).rejects.toThrow(/not a quantized checkpoint/);
});
