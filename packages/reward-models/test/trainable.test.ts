/**
 * A reward model trained with LoRA: adapters on q, k, v, o and the score head in full; the frozen
 * base is every other weight; the rewards the step's side-branch graph computes equal the merged
 * model's, scored separately.
 */
import { SCORE_WEIGHT } from '@lathe/models';
import { Device } from '@lathe/runtime';
import { Trainer } from '@lathe/train';
import { bradleyTerryLoss, pairBatch, pairFeeds, REWARD_LORA_TARGETS, RewardModel, RewardScorer, trainedWeights } from '@lathe/reward-models';
import { additionPairs, PAD, tinyLm } from './tiny';

test('LoRA on a reward model: adapters and the score head train, the merged model scores as the step did', async () => {
  const rm = RewardModel.fromCausalLM(tinyLm(2, 1), { padTokenId: PAD, seed: 5, std: 0.3 });
  const master = rm.float32Weights();
  const lora = { rank: 4, alpha: 8, targets: REWARD_LORA_TARGETS };
  const tw = trainedWeights(rm.config, master, { lora, seed: 2 });
  const names = tw.params.map((p) => p.name);
  expect(names.filter((n) => n.includes('lora_A'))).toEqual(['q', 'k', 'v', 'o'].map((m) => `model.layers.0.self_attn.${m}_proj.lora_A.weight`));
  expect(names[names.length - 1]).toBe(SCORE_WEIGHT);
  expect([...tw.frozen.keys()]).toEqual([...master.keys()].filter((n) => n !== SCORE_WEIGHT).map((n) => `base/${n}`));
  // B = 0 at the start: the merged model is the master, exactly
  for (const [n, v] of tw.merged(tw.init)) expect(Array.from(v)).toEqual(Array.from(master.get(n)!));

  const trainer = Trainer.create({ params: tw.params, loss: bradleyTerryLoss(rm.config, { weights: tw.weights }) }, { params: tw.init }, { frozen: tw.frozenOn(Device.cpu()) });
  const batch = pairBatch(additionPairs(5).train.slice(0, 16), { padId: PAD });
  const feeds = pairFeeds(batch, trainer.batchInputs);
  const first = trainer.trainStep([feeds], 1e-2);
  for (let k = 0; k < 5; k++) trainer.trainStep([feeds], 1e-2);
  const values = trainer.downloadParams();
  expect(Array.from(values.get(SCORE_WEIGHT)!)).not.toEqual(Array.from(master.get(SCORE_WEIGHT)!));
  expect(values.get('model.layers.0.self_attn.v_proj.lora_B.weight')!.some((x) => x !== 0)).toBe(true);
  const now = trainer.trainStep([feeds], 0);
  expect(now.loss).toBeLessThan(first.loss);
  const scorer = RewardScorer.create(rm.config, Device.cpu());
  const r = await scorer.score(batch, tw.merged(values));
  const chosen = Array.from(r.subarray(0, 16)).reduce((s, x) => s + x, 0);
  const rejected = Array.from(r.subarray(16)).reduce((s, x) => s + x, 0);
  expect(now.metrics.chosen_sum).toBeCloseTo(chosen, 4);
  expect(now.metrics.rejected_sum).toBeCloseTo(rejected, 4);
  scorer.dispose();
  trainer.dispose();
});

test('LoRA targets that match the score head are refused, naming it', () => {
  const rm = RewardModel.fromCausalLM(tinyLm(2, 1), { padTokenId: PAD });
  expect(() => trainedWeights(rm.config, rm.float32Weights(), { lora: { rank: 2, alpha: 2, targets: 'o_proj|score' } })).toThrow("lora targets 'o_proj|score' match score.weight, which trains in full in a reward model");
});
