/** `lathe eval --reward_model`: every completion scored by the reward model, and best-of-n by those scores. */
import { copyFileSync, mkdirSync, mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { CausalLM } from '@lathe/models';
import { RewardModel } from '@lathe/reward-models';
import { Device } from '@lathe/runtime';
import { defaults, evalSchema, readEvalRows, rewardModelSource, runEval, type EvalConfig } from '@lathe/recipes';
import { tinyQwen3 } from './tiny-qwen3';

const root = mkdtempSync(join(tmpdir(), 'lathe-eval-rm-'));
const model = tinyQwen3(join(root, 'tiny'), { seed: 2, maxPositions: 1024 });

const config = (over: Partial<EvalConfig>): EvalConfig => ({ ...defaults(evalSchema), model, data_dir: resolve(__dirname, '../../../fixtures/eval'), max_new_tokens: 6, seed: 1, grade_workers: 1, ...over });

test('--reward_model: every completion scored as the reward model scores it; best-of-n reported', async () => {
  const rm = join(root, 'tiny-rm');
  mkdirSync(rm);
  RewardModel.fromCausalLM(await CausalLM.fromPretrained(model), { seed: 3, std: 1, padTokenId: 151643 }).save(rm); // Qwen3's <|endoftext|>
  for (const f of ['tokenizer.json', 'tokenizer_config.json']) copyFileSync(join(model, f), join(rm, f));
  const r = await runEval(config({ benchmarks: 'gsm8k', limit: 1, n_large: 3, reward_model: rm, run_dir: join(root, 'rm-run') }));
  const rows = await readEvalRows(r.models[0].file);
  expect(rows.every((x) => typeof x.score === 'number' && Number.isFinite(x.score))).toBe(true);
  expect(new Set(rows.map((x) => x.score)).size).toBe(3); // three different completions, three scores
  expect(r.models[0].metrics.gsm8k.bestOfN).toBe(0); // the best-scored of three wrong samples is wrong
  // the stored scores are the reward model's own, on (problem, completion)
  const source = await rewardModelSource<null>(rm, { device: Device.open('cpu'), dtype: 'float32', policy: {}, run_dir: root, seed: 0, prompt_format: 'raw', enable_thinking: false });
  const direct = await source.scoreBatch(rows.map((x) => ({ prompt: x.problem, completion: x.completion, meta: null })));
  source.dispose();
  rows.forEach((x, i) => expect(x.score).toBeCloseTo(direct[i], 4));
  expect(readFileSync(join(r.runDir, 'summary.md'), 'utf8')).toContain('best-of-n');
});
