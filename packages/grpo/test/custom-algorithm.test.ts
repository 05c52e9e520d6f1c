/**
 * The custom-algorithm guide, end to end: the example file (a new advantage estimator and a new
 * loss term) is the code the guide shows, and GrpoTrainer runs it on a tiny Qwen3 — reward rises
 * and, unlike plain GRPO, responses become short.
 */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { combineRewards, GrpoTrainer, type AdvantageFunction, type CustomObjective, type RlPrompt } from '@lathe/grpo';
import { conciseGrpo, proximalObjective } from '../../../docs/guides/custom-algorithm';
import { tinyModel } from './tiny-qwen3';

const guide = join(__dirname, '..', '..', '..', 'docs', 'guides');

test('the guide shows the example file verbatim, and it is under 50 lines', () => {
  const code = readFileSync(join(guide, 'custom-algorithm.ts'), 'utf8');
  expect(readFileSync(join(guide, 'custom-algorithm.md'), 'utf8')).toContain('```ts\n' + code + '```');
  expect(code.trim().split('\n').length).toBeLessThan(50);
});

// Prompt token p (2…5) must be answered by ANSWERS[p − 2] as the first token; what follows is free
// until EOS (id 1) or the 4-token limit. Reward: 1 when the first token is right.
const ANSWERS = [5, 7, 3, 2];
type Meta = { answer: number };
const rewards = combineRewards<Meta & { completionTokens: number; stopped: boolean }>([{ name: 'first_token', fn: (_p, c, m) => (c.split(' ')[0] === String(m.answer) ? 1 : 0) }], { fallback: 0 });
const prompts = (step: number): RlPrompt<Meta>[] => ANSWERS.map((answer, i) => ({ ids: [i + 2], text: String(i + 2), meta: { answer }, key: step * 4 + i }));

/** Steps until the last three all have reward ≥ 0.9 and responses ≤ 2.5 tokens (the answer + EOS is 2), at most `maxSteps`. */
async function run(seed: number, estimator: AdvantageFunction | 'grpo', loss?: CustomObjective, maxSteps = 120) {
  const model = tinyModel(8, { seed });
  const t = GrpoTrainer.create<Meta>({ model: model.lm, tokenizer: { decode: (ids) => ids.join(' '), padId: 0 }, stopIds: [1], rewards, groupSize: 8, maxNewTokens: 4, estimator, loss, minibatches: 2 });
  const history: { reward: number; length: number; penalty: number }[] = [];
  for (let s = 0; s < maxSteps; s++) {
    const { metrics } = await t.step(prompts(s), 0.01);
    history.push({ reward: metrics.reward_mean, length: metrics.response_length_mean, penalty: metrics['objective/proximal_penalty'] });
    if (short(history)) break;
  }
  t.dispose();
  return history;
}

const short = (history: { reward: number; length: number }[]) => history.length >= 3 && history.slice(-3).every((h) => h.reward >= 0.9 && h.length <= 2.5);

// RL on a tiny model is a race: a policy can turn deterministic (all 8 samples of a prompt alike, so
// no advantage) before it learns to stop early. So the claim is checked over the first four model
// seeds, not one. Measured (2026-11-24, lr 0.01, ≤ 200 steps): the custom variant reached short
// answers on seeds 2, 3, 4 and 6 of 1–6 (in 46–70 steps); plain GRPO never did (length 4.0).
test('a brevity-shaped estimator and a proximal loss term: reward ≥ 0.9 with short answers on most seeds; plain GRPO stays long', async () => {
  const seeds = [1, 2, 3, 4];
  const mine = [];
  for (const seed of seeds) mine.push(await run(seed, conciseGrpo(0.2), proximalObjective(0.1)));
  console.log(`custom: ${mine.map((h, i) => `seed ${seeds[i]}: ${h.length} steps, reward ${h[0].reward.toFixed(2)} → ${h.at(-1)!.reward.toFixed(2)}, length ${h[0].length.toFixed(2)} → ${h.at(-1)!.length.toFixed(2)}`).join('; ')}`);
  expect(mine.every((h) => h[0].length > 3)).toBe(true);
  expect(mine.filter(short).length).toBeGreaterThanOrEqual(3);
  expect(mine.every((h) => h.every((s) => Number.isFinite(s.penalty) && s.penalty >= 0))).toBe(true);

  const plain = await run(seeds[2], 'grpo');
  const end = plain.slice(-5);
  console.log(`plain GRPO: ${plain.length} steps, reward → ${end[4].reward.toFixed(2)}, length → ${end[4].length.toFixed(2)}`);
  expect(end.every((h) => h.reward >= 0.8)).toBe(true);
  expect(Math.min(...end.map((h) => h.length))).toBeGreaterThan(3.5); // nothing rewards stopping
}, 120_000);
