/**
 * `attentionKernel`: GRPO's policy step, its scoring passes (policy and reference) and PPO's value
 * model attend through Lathe's flash-attention kernels (on the cpu their float32 host computation)
 * and give the steps of composed attention (MatMul/Softmax, an independent path) within 1e-4;
 * the graphs that attend through the kernel are named; a kernel with composed attention is refused.
 * `ropeKernel` beside it rotates q/k through Lathe's RoPE ops in the same graphs, with the same steps;
 * `swigluKernel` takes every MLP's activation through Lathe's SwiGLU ops, likewise.
 */
import { flashAttentionOps, ropeOps, swigluOps, type FlashAttentionOps, type RopeOps, type SwigluOps } from '@lathe/kernels';
import { combineRewards, GrpoTrainer, resolveGrpoOptions, type GrpoAttentionKernel, type GrpoStepMetrics, type GrpoTrainerOptions, type RlPrompt } from '@lathe/grpo';
import { tinyModel } from './tiny-qwen3';

type Meta = { answer: number[] };
const V = 12;
const ANSWERS = [
  [5, 7, 3],
  [3, 2, 9],
  [6, 4, 4],
  [2, 5, 8],
];
const tokenizer = { decode: (ids: readonly number[]) => ids.join(' '), padId: 0 };
const points = combineRewards<Meta & { completionTokens: number; stopped: boolean }>([{ name: 'correct', fn: (_p, c, m) => c.split(' ').reduce((s, x, k) => s + (Number(x) === m.answer[k] ? 1 / 3 : 0), 0) }], { fallback: 0 });
// prompts of different lengths, so rows are right-padded to different widths
const prompts = (step: number): RlPrompt<Meta>[] => ANSWERS.map((answer, p) => ({ ids: Array.from({ length: 1 + p }, (_, k) => 1 + ((p + k) % (V - 1))), text: String(p), meta: { answer }, key: step * ANSWERS.length + p, index: p }));

/** The metrics every step is compared on (a 2-layer model, so each layer's attention counts). */
const COMPARED = ['reward_mean', 'loss', 'pg_loss', 'grad_norm', 'entropy', 'kl_ref', 'approx_kl', 'advantage_abs_mean'] as const;
const VALUE_COMPARED = ['value/loss', 'value/grad_norm'] as const;

async function steps(over: Partial<GrpoTrainerOptions<Meta>>, n = 3): Promise<GrpoStepMetrics[]> {
  const t = GrpoTrainer.create<Meta>({
    model: tinyModel(V, { layers: 2, seed: 9 }).lm,
    tokenizer,
    stopIds: [],
    rewards: points,
    groupSize: 4,
    maxNewTokens: 3,
    kl: { coef: 0.05 },
    loss: { aggregation: 'token-mean', entropyCoef: 0.01 },
    minibatches: 2,
    generationEngine: 'graph',
    seed: 3,
    ...over,
  });
  try {
    const out: GrpoStepMetrics[] = [];
    for (let s = 0; s < n; s++) out.push((await t.step(prompts(s), 0.05)).metrics);
    return out;
  } finally {
    t.dispose();
  }
}

/** The kernel as GrpoTrainer takes it, recording the name of each graph built through it. */
function countingKernel(ops: FlashAttentionOps): { kernel: GrpoAttentionKernel; graphs: string[] } {
  const graphs: string[] = [];
  const kernel: GrpoAttentionKernel = {
    attend: (x, heads) => {
      graphs.push(x.query.graph.name);
      return ops.attend(x, heads, 'kernels');
    },
    customOpDomains: [ops.domain.handle],
  };
  return { kernel, graphs };
}

/**
 * Every metric of every step within `rel` of the reference's. The policy loss is a mean of ±A·ratio
 * terms whose sum nearly cancels (whitened advantages), so its rounding scales with |A|, not with it.
 */
function expectClose(got: GrpoStepMetrics[], want: GrpoStepMetrics[], keys: readonly string[], rel: number): void {
  expect(got).toHaveLength(want.length);
  got.forEach((g, i) => {
    for (const k of keys) {
      const a = (g as unknown as Record<string, number>)[k];
      const b = (want[i] as unknown as Record<string, number>)[k];
      const scale = Math.max(Math.abs(b), k === 'loss' || k === 'pg_loss' ? want[i].advantage_abs_mean : 1e-3);
      expect({ step: i + 1, metric: k, finite: Number.isFinite(b) }).toEqual({ step: i + 1, metric: k, finite: true });
      expect({ step: i + 1, metric: k, diff: Math.abs(a - b) <= rel * scale ? 0 : [a, b] }).toEqual({ step: i + 1, metric: k, diff: 0 });
    }
  });
}

test('GRPO with attentionKernel: 3 steps (policy step, re-scoring, reference) with the metrics of composed attention within 1e-4 (cpu, float32)', async () => {
  const composed = await steps({ attention: 'composed' });
  // the steps train: the loss moves and rewards differ within groups
  expect(composed[2].loss).not.toBe(composed[0].loss);
  expect(composed.some((m) => m.advantage_abs_mean > 0)).toBe(true);
  const ops = flashAttentionOps('cpu');
  try {
    const { kernel, graphs } = countingKernel(ops);
    const kernels = await steps({ attention: 'flash', attentionKernel: kernel });
    ops.check();
    expectClose(kernels, composed, COMPARED, 1e-4);
    // the train step's graph, the policy's scoring and the reference's, each through both layers
    const scoring = graphs.filter((n) => n === 'grpo_score').length;
    expect(scoring).toBe(4);
    expect(graphs.length - scoring).toBeGreaterThanOrEqual(2);
  } finally {
    ops.dispose();
  }
}, 60_000);

test("PPO (a separate value model) with attentionKernel: the critic's step and scoring attend through it too; 3 steps with composed attention's metrics within 1e-4 (cpu, float32)", async () => {
  const ppo: Partial<GrpoTrainerOptions<Meta>> = { estimator: 'gae', valueModel: { gamma: 1, lambda: 0.95, clip: 0.2 }, kl: { coef: 0 }, loss: { aggregation: 'token-mean', rolloutIsThreshold: 0 } };
  const composed = await steps({ ...ppo, attention: 'composed' });
  expect(composed[2]['value/loss']).not.toBe(composed[0]['value/loss']);
  const ops = flashAttentionOps('cpu');
  try {
    const { kernel, graphs } = countingKernel(ops);
    const kernels = await steps({ ...ppo, attention: 'flash', attentionKernel: kernel });
    ops.check();
    expectClose(kernels, composed, [...COMPARED.filter((k) => k !== 'kl_ref'), ...VALUE_COMPARED], 1e-4);
    // the value model's scoring graph, both layers
    expect(graphs.filter((n) => n === 'value_model')).toHaveLength(2);
  } finally {
    ops.dispose();
  }
}, 60_000);

/** The attention kernel with `ropeKernel` through `rope`, recording the name of each graph that rotates through it. */
function withRope(kernel: GrpoAttentionKernel, rope: RopeOps): { kernel: GrpoAttentionKernel; graphs: string[] } {
  const graphs: string[] = [];
  const ropeKernel: GrpoAttentionKernel['ropeKernel'] = (x, positionIds, cos, sin) => {
    graphs.push(x.graph.name);
    return rope.rotate(x, positionIds, cos, sin);
  };
  return { kernel: { ...kernel, ropeKernel, customOpDomains: [...kernel.customOpDomains, rope.domain.handle] }, graphs };
}

test('GRPO with attentionKernel.ropeKernel: q and k of the policy step, re-scoring and reference rotate through the RoPE ops; 3 steps with composed attention\'s metrics within 1e-4 (cpu, float32)', async () => {
  const composed = await steps({ attention: 'composed' });
  const ops = flashAttentionOps('cpu');
  const rope = ropeOps('cpu');
  try {
    const { kernel, graphs } = withRope(countingKernel(ops).kernel, rope);
    const rotated = await steps({ attention: 'flash', attentionKernel: kernel });
    ops.check();
    rope.check();
    expectClose(rotated, composed, COMPARED, 1e-4);
    // the policy's scoring and the reference's, q and k of both layers, and the train step's graph
    expect(graphs.filter((n) => n === 'grpo_score')).toHaveLength(8);
    expect(graphs.filter((n) => n !== 'grpo_score').length).toBeGreaterThanOrEqual(4);
  } finally {
    rope.dispose();
    ops.dispose();
  }
}, 60_000);

test("PPO (a separate value model) with attentionKernel.ropeKernel: the critic's step and scoring rotate through it too; 3 steps with composed attention's metrics within 1e-4 (cpu, float32)", async () => {
  const ppo: Partial<GrpoTrainerOptions<Meta>> = { estimator: 'gae', valueModel: { gamma: 1, lambda: 0.95, clip: 0.2 }, kl: { coef: 0 }, loss: { aggregation: 'token-mean', rolloutIsThreshold: 0 } };
  const composed = await steps({ ...ppo, attention: 'composed' });
  const ops = flashAttentionOps('cpu');
  const rope = ropeOps('cpu');
  try {
    const { kernel, graphs } = withRope(countingKernel(ops).kernel, rope);
    const rotated = await steps({ ...ppo, attention: 'flash', attentionKernel: kernel });
    rope.check();
    expectClose(rotated, composed, [...COMPARED.filter((k) => k !== 'kl_ref'), ...VALUE_COMPARED], 1e-4);
    // the value model's scoring graph: q and k of both layers
    expect(graphs.filter((n) => n === 'value_model')).toHaveLength(4);
  } finally {
    rope.dispose();
    ops.dispose();
  }
}, 60_000);

/** The attention kernel with `swigluKernel` through `swiglu`, recording the name of each graph whose MLP goes through it. */
function withSwiglu(kernel: GrpoAttentionKernel, swiglu: SwigluOps): { kernel: GrpoAttentionKernel; graphs: string[] } {
  const graphs: string[] = [];
  const swigluKernel: GrpoAttentionKernel['swigluKernel'] = (gate, up) => {
    graphs.push(gate.graph.name);
    return swiglu.apply(gate, up);
  };
  return { kernel: { ...kernel, swigluKernel, customOpDomains: [...kernel.customOpDomains, swiglu.domain.handle] }, graphs };
}

test("GRPO and PPO with attentionKernel.swigluKernel: every MLP of the policy step, re-scoring, reference and the value model through the SwiGLU ops; 3 steps with composed attention's metrics within 1e-4 (cpu, float32)", async () => {
  const ops = flashAttentionOps('cpu');
  const swiglu = swigluOps('cpu');
  try {
    const { kernel, graphs } = withSwiglu(countingKernel(ops).kernel, swiglu);
    expectClose(await steps({ attention: 'flash', attentionKernel: kernel }), await steps({ attention: 'composed' }), COMPARED, 1e-4);
    // the policy's scoring and the reference's, both layers, and the train step's graph
    expect(graphs.filter((n) => n === 'grpo_score')).toHaveLength(4);
    expect(graphs.filter((n) => n !== 'grpo_score').length).toBeGreaterThanOrEqual(2);
    const ppo: Partial<GrpoTrainerOptions<Meta>> = { estimator: 'gae', valueModel: { gamma: 1, lambda: 0.95, clip: 0.2 }, kl: { coef: 0 }, loss: { aggregation: 'token-mean', rolloutIsThreshold: 0 } };
    graphs.length = 0;
    expectClose(await steps({ ...ppo, attention: 'flash', attentionKernel: kernel }), await steps({ ...ppo, attention: 'composed' }), [...COMPARED.filter((k) => k !== 'kl_ref'), ...VALUE_COMPARED], 1e-4);
    // the value model's scoring graph, both layers
    expect(graphs.filter((n) => n === 'value_model')).toHaveLength(2);
    swiglu.check();
  } finally {
    swiglu.dispose();
    ops.dispose();
  }
}, 90_000);

test("attentionKernel with attention 'composed' is refused, naming both", () => {
  const ops = flashAttentionOps('cpu');
  try {
    const attentionKernel = { attend: (x: Parameters<GrpoAttentionKernel['attend']>[0], heads: Parameters<GrpoAttentionKernel['attend']>[1]) => ops.attend(x, heads, 'kernels'), customOpDomains: [ops.domain.handle] };
    const base = { model: tinyModel(V).lm, tokenizer, stopIds: [], rewards: points, groupSize: 2, maxNewTokens: 2 };
    expect(() => resolveGrpoOptions<Meta>({ ...base, attention: 'composed', attentionKernel })).toThrow("attentionKernel with attention 'composed'");
    expect(resolveGrpoOptions<Meta>({ ...base, attention: 'flash', attentionKernel }).attentionKernel).toBe(attentionKernel);
  } finally {
    ops.dispose();
  }
});
