/**
 * Reward models as Hugging Face sequence-classification checkpoints (CPU): what the folder holds
 * (config fields transformers reads, the trunk under HF names, `score.weight`, no `lm_head`), a
 * load-back that scores identically, the score head's seeded initialisation, and the errors for a
 * causal-LM folder and a classifier folder without its head.
 */
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { CausalLM, readSafetensorsHeader, SCORE_WEIGHT } from '@lathe/models';
import { pairBatch, RewardModel } from '@lathe/reward-models';
import { additionPairs, PAD, tinyQwen3 } from './tiny';

const tmp = () => mkdtempSync(join(tmpdir(), 'lathe-rm-'));
// An untied LM, so that dropping lm_head is visible.
const lm = () => CausalLM.random({ ...tinyQwen3(1), tie_word_embeddings: false }, { seed: 9, std: 0.1 });

test('save writes a …ForSequenceClassification folder: one label, pad_token_id, the trunk and score.weight, no lm_head', () => {
  const rm = RewardModel.fromCausalLM(lm(), { padTokenId: PAD, seed: 1 });
  const dir = tmp();
  rm.save(dir);
  const config = JSON.parse(readFileSync(join(dir, 'config.json'), 'utf8')) as Record<string, unknown>;
  expect(config).toMatchObject({ architectures: ['Qwen3ForSequenceClassification'], model_type: 'qwen3', num_labels: 1, id2label: { '0': 'LABEL_0' }, label2id: { LABEL_0: 0 }, pad_token_id: PAD });
  const names = readSafetensorsHeader(join(dir, 'model.safetensors')).tensors.map((t) => t.name);
  const trunk = [...lm().float32Weights().keys()].filter((n) => n !== 'lm_head.weight');
  expect(names.sort()).toEqual([...trunk, SCORE_WEIGHT].sort());
  expect(rm.float32Weights().get(SCORE_WEIGHT)!.length).toBe(32);
});

test('a saved reward model loads back and scores identically', async () => {
  const rm = RewardModel.fromCausalLM(lm(), { padTokenId: PAD, seed: 1, device: 'cpu' });
  const dir = tmp();
  rm.save(dir);
  const back = await RewardModel.fromPretrained(dir, { device: 'cpu' });
  expect(back.config).toEqual({ ...rm.config, torchDtype: 'float32' });
  const batch = pairBatch(additionPairs(1).heldOut.slice(0, 8), { padId: PAD, padding: 'left' });
  const a = await rm.score(batch);
  const b = await back.score(batch);
  expect(Array.from(b)).toEqual(Array.from(a));
  expect(new Set(a).size).toBe(a.length); // the rows score differently: the comparison means something
  rm.dispose();
  back.dispose();
});

test('the score head starts from N(0, 0.02²) drawn by seed; the trunk is the LM’s', () => {
  const base = lm();
  const head = (seed: number, std?: number) => RewardModel.fromCausalLM(base, { padTokenId: PAD, seed, std }).float32Weights().get(SCORE_WEIGHT)!;
  expect(Array.from(head(1))).toEqual(Array.from(head(1)));
  expect(Array.from(head(1))).not.toEqual(Array.from(head(2)));
  const big = RewardModel.fromCausalLM(CausalLM.random({ ...tinyQwen3(1), hidden_size: 4096, intermediate_size: 8, num_attention_heads: 1, num_key_value_heads: 1, head_dim: 8, vocab_size: 4 }, { seed: 1 }), { padTokenId: 0, seed: 3 });
  const w = big.float32Weights().get(SCORE_WEIGHT)!;
  const mean = w.reduce((s, x) => s + x, 0) / w.length;
  const std = Math.sqrt(w.reduce((s, x) => s + (x - mean) ** 2, 0) / w.length);
  expect(Math.abs(mean)).toBeLessThan(0.002); // 4σ/√n
  expect(Math.abs(std - 0.02)).toBeLessThan(0.001);
  const rm = RewardModel.fromCausalLM(base, { padTokenId: PAD });
  for (const [name, values] of base.float32Weights()) if (name !== 'lm_head.weight') expect(rm.float32Weights().get(name)).toBe(values);
  expect(rm.float32Weights().has('lm_head.weight')).toBe(false);
});

test('loading a causal-LM folder, or a classifier folder without score.weight, is an error naming the folder', async () => {
  const dir = tmp();
  lm().save(dir);
  await expect(RewardModel.fromPretrained(dir)).rejects.toThrow(`${dir}: Qwen3ForCausalLM is a causal LM checkpoint with no score head (score.weight)`);
  const config = JSON.parse(readFileSync(join(dir, 'config.json'), 'utf8')) as Record<string, unknown>;
  writeFileSync(join(dir, 'config.json'), JSON.stringify({ ...config, architectures: ['Qwen3ForSequenceClassification'], num_labels: 1 }));
  await expect(RewardModel.fromPretrained(dir)).rejects.toThrow(`${dir}: missing weight 'score.weight'`);
  writeFileSync(join(dir, 'config.json'), JSON.stringify({ ...config, architectures: ['Qwen3ForSequenceClassification'], num_labels: 3 }));
  await expect(RewardModel.fromPretrained(dir)).rejects.toThrow(/a classifier with 3 score outputs; a reward model has one \(num_labels 1\)/);
});
