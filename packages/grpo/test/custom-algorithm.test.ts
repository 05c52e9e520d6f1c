/**
 * The custom-algorithm guide: its page shows the example program whole, region by region; the
 * program runs as written (a few RL steps of the demo's tiny model on the CPU, the model saved);
 * and on a toy task with a known answer its estimator and loss term do what the page says — reward
 * rises and, unlike plain GRPO, responses become short.
 */
import { mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { CausalLM } from '@lathe/models';
import { combineRewards, GrpoTrainer, type AdvantageFunction, type CustomObjective, type RlPrompt } from '@lathe/grpo';
import { conciseGrpo, proximalObjective, train } from '../../../docs/guides/custom-algorithm';
import { tinyModel } from './tiny-qwen3';

const guide = join(__dirname, '..', '..', '..', 'docs', 'guides');

test("the page's code blocks are the program's regions, in order, and the regions are the whole file", () => {
  const code = readFileSync(join(guide, 'custom-algorithm.ts'), 'utf8');
  const page = readFileSync(join(guide, 'custom-algorithm.md'), 'utf8');
  const regions = [...code.matchAll(/^\/\/ #region \w+\n([\s\S]*?)^\/\/ #endregion\n/gm)];
  expect(regions.map((r) => r[0]).join('\n')).toBe(code.trimEnd() + '\n'); // nothing outside a region but the blank lines between them
  const blocks = [...page.matchAll(/^```ts\n([\s\S]*?)^```$/gm)].map((b) => b[1]);
  expect(blocks).toEqual(regions.map((r) => r[1]));
});

test('the program runs as written: finite rewards and losses, the proximal term in the metrics, a saved model that moved', async () => {
  const runDir = mkdtempSync(join(tmpdir(), 'lathe-custom-algorithm-'));
  const printed: string[] = [];
  const log = jest.spyOn(console, 'log').mockImplementation((line: string) => void printed.push(line));
  const history = await train(runDir, 3).finally(() => log.mockRestore());
  expect(printed.map((l) => l.split(':')[0])).toEqual(['step 1', 'step 2', 'step 3']);
  expect(history.map((m) => [m.rl_step, m.samples, m.updates, m.nonfinite_updates])).toEqual([1, 2, 3].map((s) => [s, 64, 2, 0]));
  for (const m of history) {
    for (const v of [m.reward_mean, m.loss, m.grad_norm]) expect(Number.isFinite(v)).toBe(true);
    expect(m['objective/proximal_penalty']).toBeGreaterThanOrEqual(0);
  }
  // some completions were rewarded, so the updates had advantages to follow
  expect(history.some((m) => m.reward_mean > 0 && m.advantage_abs_mean > 0)).toBe(true);
  const before = (await CausalLM.fromPretrained(join(runDir, 'base-model'))).float32Weights();
  const after = (await CausalLM.fromPretrained(join(runDir, 'final'))).float32Weights();
  const moved = [...after].filter(([name, w]) => w.some((x, i) => x !== before.get(name)![i]));
  expect(moved.length).toBeGreaterThan(0);
  for (const [, w] of after) expect(w.every(Number.isFinite)).toBe(true);
}, 60_000);

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
// no advantage) before it learns to stop early. So the claim is checked over four model seeds, of
// which three must reach short answers, not on one.
test('on a toy task, the brevity-shaped estimator and the proximal loss term: reward ≥ 0.9 with short answers on most seeds; plain GRPO stays long', async () => {
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
