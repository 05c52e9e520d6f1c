/**
 * LoRA dropout in GrpoTrainer: only the train step draws masks (generation and re-scoring read the
 * adapters without dropout, so generation and scoring still agree), the masks change the update,
 * and a trainer resumed from a snapshot continues bit for bit (the masks are a function of seed,
 * optimizer step and micro-batch). The option is refused outside [0, 1) by name.
 */
import { LORA_DROPOUT_KEY } from '@lathe/train';
import { combineRewards, GrpoTrainer, type GrpoTrainerOptions, type RlPrompt } from '@lathe/grpo';
import { tinyModel } from './tiny-qwen3';

interface Meta {
  answer: number;
}

const ANSWERS = [5, 7, 3, 2];
const V = 8;
const firstToken = combineRewards<Meta & { completionTokens: number; stopped: boolean }>([{ name: 'first', fn: (_p, c, m) => (c.split(' ')[0] === String(m.answer) ? 1 : 0) }], { fallback: 0 });
const prompts = (step: number): RlPrompt<Meta>[] => ANSWERS.map((answer, p) => ({ ids: [p], text: String(p), meta: { answer }, key: step * ANSWERS.length + p, index: p }));
const lora = { rank: 4, alpha: 8, targets: 'q_proj|v_proj|up_proj|down_proj' };

function make(overrides: Partial<GrpoTrainerOptions<Meta>>, model: ReturnType<typeof tinyModel>): GrpoTrainer<Meta> {
  return GrpoTrainer.create<Meta>({
    model: model.lm,
    tokenizer: { decode: (ids) => ids.join(' '), padId: 0 },
    stopIds: [1],
    rewards: firstToken,
    groupSize: 4,
    maxNewTokens: 3,
    loss: { aggregation: 'seq-mean-token-mean' },
    minibatches: 2,
    microBatches: 2,
    lora: { ...lora, dropout: 0.3 },
    seed: 3,
    ...overrides,
  });
}

const bitEqual = (a: Float32Array, b: Float32Array) => Buffer.from(a.buffer, a.byteOffset, a.byteLength).equals(Buffer.from(b.buffer, b.byteOffset, b.byteLength));

test('LoRA dropout: masks in the train step only, a different update, and an exact resume', async () => {
  const model = tinyModel(V, { std: 0.4 });
  const straight = make({}, model);
  expect(straight.trainer.batchInputs).toContain(LORA_DROPOUT_KEY);
  for (let s = 0; s < 3; s++) {
    const { metrics } = await straight.step(prompts(s), 0.03);
    // generation (merged adapters) and re-scoring (the side branch, no dropout) read the same policy
    expect(metrics.logp_parity).toBeCloseTo(1, 4);
  }
  const plain = make({ lora }, model);
  expect(plain.trainer.batchInputs).not.toContain(LORA_DROPOUT_KEY);
  for (let s = 0; s < 3; s++) await plain.step(prompts(s), 0.03);

  // 1 step, a snapshot, then a new trainer resumed from it takes the other 2
  const first = make({}, model);
  await first.step(prompts(0), 0.03);
  const snap = first.snapshot();
  first.dispose();
  const resumed = make({ resume: { params: snap.values, m: snap.m, v: snap.v, optimizerStep: snap.optimizerStep, rlStep: snap.rlStep } }, model);
  for (let s = 1; s < 3; s++) await resumed.step(prompts(s), 0.03);

  const [a, b, c] = [straight.snapshot(), resumed.snapshot(), plain.snapshot()];
  expect(b.optimizerStep).toBe(a.optimizerStep);
  for (const [name, v] of a.values) {
    expect([name, bitEqual(b.values.get(name)!, v), bitEqual(b.m.get(name)!, a.m.get(name)!), bitEqual(b.v.get(name)!, a.v.get(name)!)]).toEqual([name, true, true, true]);
  }
  expect([...a.values].some(([name, v]) => !bitEqual(v, c.values.get(name)!))).toBe(true);
  for (const t of [straight, plain, resumed]) t.dispose();
}, 60_000);

test('lora_dropout outside [0, 1) is refused by name', () => {
  for (const bad of [-0.1, 1]) {
    expect(() => make({ lora: { ...lora, dropout: bad } }, tinyModel(V))).toThrow(/lora_dropout must be in \[0, 1\)/);
  }
});
