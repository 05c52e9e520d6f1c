/**
 * QLoRA in GRPO: LoRA adapters over a frozen NF4 base (`quantizedFrozenBase`, what `lathe grpo
 * --quantize_base nf4` builds) — the train step, scoring, the KL reference and generation all read
 * the quantized base. A short seeded run on a two-token task moves the reward as LoRA over the
 * float32 base does, within a stated gap; the merged checkpoint is the adapters over the
 * dequantized base; bad combinations are refused by flag.
 */
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { CausalLM, randomModel } from '@lathe/models';
import { combineRewards, GrpoTrainer, type RlPrompt } from '@lathe/grpo';
import { mergeLora, loraAdapters } from '@lathe/train';
import { defaults, grpoSchema, quantizedFrozenBase, runGrpo } from '@lathe/recipes';

const V = 8;
// hidden 64, so every projection is whole NF4 blocks of 64 along its input
const CONFIG = { architectures: ['Qwen3ForCausalLM'], vocab_size: V, hidden_size: 64, intermediate_size: 128, num_hidden_layers: 1, num_attention_heads: 4, num_key_value_heads: 2, head_dim: 16, rms_norm_eps: 1e-6, rope_theta: 10000, max_position_embeddings: 32, tie_word_embeddings: true };
const ANSWERS = [
  [4, 1],
  [5, 2],
  [3, 6],
  [1, 5],
];
type Meta = { answer: number[] };
const tokenizer = { decode: (ids: readonly number[]) => ids.join(' '), padId: 0 };
const halfPoints = combineRewards<Meta>([{ name: 'correct', fn: (_p, c, m) => c.split(' ').reduce((s, x, k) => s + (Number(x) === m.answer[k] ? 0.5 : 0), 0) }], { fallback: 0 });
const prompts = (step: number): RlPrompt<Meta>[] => ANSWERS.map((answer, p) => ({ ids: [p], text: String(p), meta: { answer }, key: step * ANSWERS.length + p, index: p }));
const lora = { rank: 8, alpha: 16, targets: 'q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj' };
const STEPS = 30;
const LR = 0.02;

function model(): CausalLM {
  const dir = mkdtempSync(join(tmpdir(), 'lathe-qlora-grpo-'));
  randomModel(dir, CONFIG, { seed: 5, std: 0.5 });
  return CausalLM.fromPretrainedSync(dir);
}

async function run(lm: CausalLM, quantize: string): Promise<{ rewards: number[]; firstKl: number; trainer: GrpoTrainer<Meta> }> {
  const trainer = GrpoTrainer.create<Meta>({
    model: lm,
    tokenizer,
    stopIds: [],
    rewards: halfPoints,
    groupSize: 8,
    maxNewTokens: 2,
    lora,
    kl: { coef: 0.01 },
    ...(quantize !== 'none' ? { frozenBase: quantizedFrozenBase(lm.config, lm.float32Weights(), quantize, 'cpu') } : {}),
    seed: 3,
  });
  const rewards: number[] = [];
  let firstKl = NaN;
  for (let s = 0; s < STEPS; s++) {
    const { metrics } = await trainer.step(prompts(s), LR);
    rewards.push(metrics.reward_mean);
    if (s === 0) firstKl = metrics.kl_ref;
  }
  return { rewards, firstKl, trainer };
}

const mean = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / xs.length;

test('NF4 QLoRA moves the reward like LoRA over the float32 base (last 5 steps within 0.15), from the same start', async () => {
  const lm = model();
  const f32 = await run(lm, 'none');
  const nf4 = await run(lm, 'nf4');
  try {
    const first = (r: number[]) => mean(r.slice(0, 3));
    const last = (r: number[]) => mean(r.slice(-5));
    console.log(`GRPO ${STEPS} steps, LoRA rank 8: float32 base ${first(f32.rewards).toFixed(2)} → ${last(f32.rewards).toFixed(2)}; NF4 base ${first(nf4.rewards).toFixed(2)} → ${last(nf4.rewards).toFixed(2)}`);
    expect(last(f32.rewards) - first(f32.rewards)).toBeGreaterThan(0.3);
    expect(last(nf4.rewards) - first(nf4.rewards)).toBeGreaterThan(0.3);
    expect(Math.abs(last(nf4.rewards) - last(f32.rewards))).toBeLessThan(0.15);
    // before the first update the adapters add nothing (B = 0): the KL reference reads the same NF4 base as the policy
    expect(Math.abs(nf4.firstKl)).toBeLessThan(1e-6);
    // the checkpoint: the adapters merged into the dequantized NF4 base (not into the float32 one)
    const snap = nf4.trainer.snapshot();
    const merged = snap.model;
    const base = quantizedFrozenBase(lm.config, lm.float32Weights(), 'nf4', 'cpu').dense();
    const expected = mergeLora(base, snap.values, loraAdapters(lm.config, lora), lora);
    for (const [name, w] of expected) expect(Array.from(merged.get(name)!)).toEqual(Array.from(w));
    expect(Array.from(merged.get('model.layers.0.self_attn.q_proj.weight')!)).not.toEqual(Array.from(lm.float32Weights().get('model.layers.0.self_attn.q_proj.weight')!));
  } finally {
    f32.trainer.dispose();
    nf4.trainer.dispose();
  }
}, 300_000);

test('the KV-cache engine generates from the NF4 base plus the adapters: the same samples as the graph engine, step after step', async () => {
  const lm = model();
  const make = (engine: 'kv-cache' | 'graph') =>
    GrpoTrainer.create<Meta>({ model: lm, tokenizer, stopIds: [], rewards: halfPoints, groupSize: 8, maxNewTokens: 2, lora, generationEngine: engine, frozenBase: quantizedFrozenBase(lm.config, lm.float32Weights(), 'nf4', 'cpu'), seed: 3 });
  const kv = make('kv-cache');
  const graph = make('graph');
  const still = make('graph'); // lr 0: the adapters stay 0, so its samples are the bare NF4 base's
  try {
    expect([kv.generationEngine, graph.generationEngine]).toEqual(['kv-cache', 'graph']);
    let same = 0;
    let bare = 0;
    let total = 0;
    // after the first update the adapters are non-zero: later steps' samples depend on them
    for (let s = 0; s < 4; s++) {
      const a = await kv.step(prompts(s), LR);
      const b = await graph.step(prompts(s), LR);
      const c = await still.step(prompts(s), 0);
      a.rollouts.forEach((r, i) => {
        total++;
        if (r.tokens.join() === b.rollouts[i].tokens.join()) same++;
        if (r.tokens.join() === c.rollouts[i].tokens.join()) bare++;
      });
    }
    console.log(`NF4 QLoRA, 4 steps: ${same} of ${total} samples identical between the KV-cache and graph engines; ${bare} equal to the untrained adapters'`);
    expect(same / total).toBeGreaterThanOrEqual(0.95);
    expect(bare).toBeLessThan(same); // the adapters moved the samples, and the KV engine read them
    await expect(kv.servingWeights({ before: async () => undefined, after: () => undefined })).rejects.toThrow('a frozenBase (QLoRA) policy');
  } finally {
    kv.dispose();
    graph.dispose();
    still.dispose();
  }
}, 300_000);

test('bad combinations are refused by flag', async () => {
  const cfg = { ...defaults(grpoSchema), run_dir: mkdtempSync(join(tmpdir(), 'lathe-qlora-bad-')), steps: 1 };
  await expect(runGrpo({ ...cfg, quantize_base: 'nf4' })).rejects.toThrow('--quantize_base nf4 trains LoRA adapters over a frozen quantized base: set --lora_rank > 0');
  await expect(runGrpo({ ...cfg, quantize_base: 'int8', lora_rank: 4, serve_port: 8123 })).rejects.toThrow('--serve_port with --quantize_base int8 is not supported');
  expect(() => quantizedFrozenBase(model().config, model().float32Weights(), 'fp3', 'cpu')).toThrow('--quantize_base fp3: not a format');
  const lm = model();
  expect(() => GrpoTrainer.create<Meta>({ model: lm, tokenizer, stopIds: [], rewards: halfPoints, groupSize: 2, maxNewTokens: 2, frozenBase: quantizedFrozenBase(lm.config, lm.float32Weights(), 'nf4', 'cpu') })).toThrow('frozenBase (nf4) trains LoRA adapters over it: set lora');
});
