/**
 * LoRA as a side branch (y = x·Wᵀ + scale·(drop(x)·Aᵀ)·Bᵀ) against the merged form and the host
 * merge; the frozen base's missing [out, in] gradient; LoRA dropout — its gradient by finite
 * differences, training-only — and the in-graph hash its masks come from (an SFT run's exact resume
 * with dropout: packages/recipes/test/sft-lora.test.ts).
 */
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import * as ort from 'onnxruntime-node';
import * as L from '@lathe/onnx';
import { CausalLM, decoder, lmLogits, paddedCausalMask, paramSpecs, positionsFromPadding, randomModel, shiftLeft, type DecoderConfig, type Weights } from '@lathe/models';
import {
  compileTrainStep,
  droppedElements,
  initLora,
  LORA_DROPOUT_KEY,
  loraAdapters,
  loraDropoutKey,
  loraWeights,
  mergedLoraWeights,
  mergeLora,
  nextTokenLogprobs,
  permuteQpr,
  sftLoss,
  streamKey,
  type LoraAdapter,
  type LoraConfig,
  type TrainableParam,
} from '@lathe/train';
import { compile, rng, type HostTensor } from '../../../tools/testing/ort-cpu';

const tiny = {
  architectures: ['Qwen2ForCausalLM'],
  vocab_size: 40,
  hidden_size: 16,
  intermediate_size: 24,
  num_hidden_layers: 2,
  num_attention_heads: 2,
  num_key_value_heads: 1,
  head_dim: 8,
  rms_norm_eps: 1e-6,
  rope_theta: 10000,
  max_position_embeddings: 64,
  tie_word_embeddings: false,
};

/** The tiny model, adapters on q, v and down_proj with random (non-zero) B, and the host weights. */
function setup(lora: LoraConfig = { rank: 3, alpha: 6, targets: 'self_attn\\.(q|v)_proj|down_proj' }) {
  const dir = mkdtempSync(join(tmpdir(), 'lathe-lora-'));
  const config = randomModel(dir, tiny, { seed: 5, std: 0.3 });
  const adapters = loraAdapters(config, lora);
  const values = initLora(adapters, 1);
  // B starts at zero (training starts from the base); make it non-zero so the branch matters.
  const r = rng(2);
  for (const a of adapters) values.set(a.b.name, Float32Array.from(values.get(a.b.name)!, () => r() - 0.5));
  return { config, lora, adapters, values, base: CausalLM.fromPretrainedSync(dir).float32Weights() };
}

const batch: Record<string, HostTensor> = {
  input_ids: { data: BigInt64Array.from([3n, 9n, 27n, 1n, 14n, 0n, 5n, 6n, 7n, 8n]), dims: [2, 5] },
  attention_mask: { data: BigInt64Array.from([1n, 1n, 1n, 1n, 1n, 1n, 1n, 1n, 1n, 0n]), dims: [2, 5] },
  loss_mask: { data: BigInt64Array.from([0n, 1n, 1n, 1n, 1n, 0n, 0n, 1n, 1n, 0n]), dims: [2, 5] },
  loss_tokens: { data: Float32Array.of(6), dims: [] },
};

/** Feeds for every input of `g`: the batch, the dropout key, `base/<name>`, then `values` by name. */
function feedsFor(g: L.Graph, values: Map<string, Float32Array | Float64Array>, base: Map<string, Float32Array>, key = loraDropoutKey(7, 3, 0)): Record<string, HostTensor> {
  const feeds: Record<string, HostTensor> = {};
  for (const t of g.inputs) {
    const data = batch[t.name]?.data ?? (t.name === LORA_DROPOUT_KEY ? key.data : t.name.startsWith('base/') ? base.get(t.name.slice(5)) : values.get(t.name));
    if (!data) throw new Error(`no feed for ${t.name}`);
    feeds[t.name] = { data: t.dtype === 'float64' && data instanceof Float32Array ? Float64Array.from(data) : data, dims: t.name in batch ? batch[t.name].dims : (t.shape as number[]) };
  }
  return feeds;
}

const baseInputs = (g: L.Graph, config: DecoderConfig, dtype: L.DType = 'float32') => {
  const b = new Map(paramSpecs(config).map((s) => [s.name, g.input(`base/${s.name}`, dtype, s.shape)]));
  return (n: string) => b.get(n)!;
};

const adapterParams = (adapters: LoraAdapter[]): TrainableParam[] => adapters.flatMap((a) => [a.a, a.b]);
const relDiff = (a: ArrayLike<number>, b: ArrayLike<number>) => {
  let num = 0;
  let den = 0;
  for (let i = 0; i < a.length; i++) {
    num = Math.max(num, Math.abs(a[i] - b[i]));
    den = Math.max(den, Math.abs(b[i]));
  }
  return num / den;
};

test('side-branch LoRA, the in-graph merge and the host merge give the same logits; eval-mode dropout changes nothing', async () => {
  const { config, lora, adapters, values, base } = setup();
  expect(adapters.map((a) => a.target)).toHaveLength(6);
  const merged = mergeLora(base, values, adapters, lora);
  const run = async (weights: (g: L.Graph) => Weights) => {
    const g = new L.Graph();
    const ids = g.input('input_ids', 'int64', ['B', 'T']);
    const mask = g.input('attention_mask', 'int64', ['B', 'T']);
    const w = weights(g);
    const { hidden } = decoder(config, w, { inputIds: ids, positionIds: positionsFromPadding(mask), attentionMask: paddedCausalMask(mask) });
    g.output(lmLogits(config, w, hidden), 'logits');
    expect(g.inputs.some((t) => t.name === LORA_DROPOUT_KEY)).toBe(false);
    return (await (await compile(g))(feedsFor(g, new Map([...values, ...merged]), base))).logits.data as Float32Array;
  };
  const specs = paramSpecs(config);
  const trainable = (g: L.Graph) => new Map(adapterParams(adapters).map((p) => [p.name, g.input(p.name, 'float32', p.shape)]));
  const side = await run((g) => loraWeights(baseInputs(g, config), trainable(g), adapters, lora, 'float32'));
  // not training: a dropout setting draws no mask and reads no key
  const sideDropout = await run((g) => loraWeights(baseInputs(g, config), trainable(g), adapters, { ...lora, dropout: 0.5 }, 'float32'));
  const inGraph = await run((g) => mergedLoraWeights(baseInputs(g, config), trainable(g), adapters, lora, 'float32'));
  const host = await run((g) => {
    const w = new Map(specs.map((s) => [s.name, g.input(s.name, 'float32', s.shape)]));
    return (n) => w.get(n)!;
  });
  const baseOnly = await run((g) => baseInputs(g, config));
  expect(relDiff(side, host)).toBeLessThan(1e-5);
  expect(relDiff(inGraph, host)).toBeLessThan(1e-5);
  expect(sideDropout).toEqual(side);
  expect(relDiff(baseOnly, host)).toBeGreaterThan(1e-2); // the adapters matter
});

/** The float32 SFT train step over LoRA adapters: side branch (with `dropout` in training) or merged. */
function loraStep(config: DecoderConfig, adapters: LoraAdapter[], lora: LoraConfig, form: 'side' | 'merged', compute: L.DType = 'float32', extra: Parameters<typeof sftLoss>[1] = {}) {
  return compileTrainStep({
    params: adapterParams(adapters),
    loss: sftLoss(config, {
      ...extra,
      weights: (g, t) => (form === 'side' ? loraWeights(baseInputs(g, config), t, adapters, lora, compute, { training: true }) : mergedLoraWeights(baseInputs(g, config), t, adapters, lora, compute)),
    }),
    optimizer: { weightDecay: 0.01, maxGradNorm: 0 },
  });
}

/** Runs `g` once with zero moments/gradient sums and the step scalars; returns every output. */
async function runOnce(g: L.Graph, values: Map<string, Float32Array>, base: Map<string, Float32Array>, key?: ReturnType<typeof loraDropoutKey>) {
  const state = new Map(values);
  for (const t of g.inputs) if (/^(adam_[mv]|grad)\//.test(t.name)) state.set(t.name, new Float32Array(t.shape.reduce<number>((a, d) => a * (d as number), 1)));
  for (const [n, v] of [['lr', 1e-2], ['bc1', 0.1], ['bc2', 0.001], ['grad_scale', 1]] as const) state.set(n, Float32Array.of(v));
  return (await compile(g))(feedsFor(g, state, base, key));
}

test('at dropout 0 the side branch gives the merged form’s loss, adapter gradients and updated adapters', async () => {
  const { config, lora, adapters, values, base } = setup();
  const side = loraStep(config, adapters, lora, 'side');
  const merged = loraStep(config, adapters, lora, 'merged');
  expect(side.batchInputs).not.toContain(LORA_DROPOUT_KEY);
  for (const graph of ['accumulate', 'step'] as const) {
    const a = await runOnce(side[graph], values, base);
    const b = await runOnce(merged[graph], values, base);
    expect(relDiff(a.loss.data as Float32Array, b.loss.data as Float32Array)).toBeLessThan(1e-5);
    for (const p of adapterParams(adapters)) {
      const out = graph === 'accumulate' ? `next/grad/${p.name}` : `next/${p.name}`;
      expect([out, relDiff(a[out].data as Float32Array, b[out].data as Float32Array) < 1e-5]).toEqual([out, true]);
    }
  }
});

/** Live nodes of a graph: those its serialized form keeps. */
const liveNodes = (g: L.Graph) => {
  const names = new Set(L.toModelProto(g).graph!.node!.map((n) => n.name));
  return g.nodes.filter((n) => names.has(n.name));
};

test('the side branch builds no [out, in] gradient for the frozen base (the merged form does); no run-time shape arithmetic with dropout', () => {
  const { config, lora, adapters } = setup();
  const baseShapes = paramSpecs(config)
    .filter((s) => s.kind === 'matrix' || s.kind === 'embedding')
    .flatMap((s) => [s.shape.join('x'), [...s.shape].reverse().join('x')]);
  const weightSized = (g: L.Graph) => liveNodes(g).filter((n) => n.op.name === 'MatMul' && baseShapes.includes(n.outputs[0].shape.join('x')));
  for (const graph of ['step', 'accumulate'] as const) {
    const side = loraStep(config, adapters, { ...lora, dropout: 0.1 }, 'side')[graph];
    const merged = loraStep(config, adapters, lora, 'merged')[graph];
    expect(weightSized(side).map((n) => n.name)).toEqual([]);
    // control: the merged form forms B·A and its [out, in] gradient for each adapted matrix
    expect(weightSized(merged).filter((n) => n.name.startsWith('grad/')).length).toBeGreaterThanOrEqual(adapters.length);
  }
  // bf16 with dropout, composed, recomputed or flash attention: nothing ORT would run on the CPU
  for (const extra of [{}, { recompute: true }, { flashAttention: true }]) {
    const graphs = loraStep(config, adapters, { ...lora, dropout: 0.1 }, 'side', 'bfloat16', extra);
    expect(graphs.batchInputs).toContain(LORA_DROPOUT_KEY);
    for (const g of [graphs.step, graphs.accumulate]) expect([extra, L.runtimeShapeNodes(g).map((n) => n.name)]).toEqual([extra, []]);
  }
});

test('without dropout, adapters of projections that read one input share one A product (q, k, v; gate, up); with dropout each has its own', () => {
  const { config } = setup();
  const lora = { rank: 3, alpha: 6, targets: 'q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj' };
  const adapters = loraAdapters(config, lora);
  // products whose output has the adapters' rank as its last dim: x·Aᵀ, one per adapter or per group
  const rankProducts = (g: L.Graph, width: number) => liveNodes(g).filter((n) => n.op.name === 'MatMul' && !n.name.startsWith('grad/') && n.outputs[0].shape.at(-1) === width).length;
  const layers = config.numLayers;
  const fused = loraStep(config, adapters, lora, 'side').step;
  expect(rankProducts(fused, 3 * 3)).toBe(layers); // x·[A_q; A_k; A_v]ᵀ
  expect(rankProducts(fused, 2 * 3)).toBe(layers); // x·[A_gate; A_up]ᵀ
  expect(rankProducts(fused, 3)).toBe(layers); // o_proj alone
  const dropped = loraStep(config, adapters, { ...lora, dropout: 0.1 }, 'side').step;
  expect(rankProducts(dropped, 3 * 3) + rankProducts(dropped, 2 * 3)).toBe(0);
  expect(rankProducts(dropped, 3)).toBe(6 * layers);
});

/**
 * A CPU session at ORT's basic optimization level: the extended level fuses SiLU into QuickGelu,
 * which has no float64 kernel.
 */
async function compileFloat64(graph: L.Graph): Promise<(feeds: Record<string, HostTensor>) => Promise<Record<string, HostTensor>>> {
  const session = await ort.InferenceSession.create(L.toModelBytes(graph), { executionProviders: ['cpu'], graphOptimizationLevel: 'basic' });
  return async (feeds) => {
    const inputs = Object.fromEntries(graph.inputs.map((t) => [t.name, new ort.Tensor(t.dtype as 'float64', feeds[t.name].data as Float64Array, feeds[t.name].dims)]));
    const out = await session.run(inputs);
    return Object.fromEntries(Object.entries(out).map(([k, v]) => [k, { data: v.data as HostTensor['data'], dims: [...v.dims] }]));
  };
}

test('finite differences: the adapters’ gradients through the side branch with dropout 0.3 (float64, fixed key)', async () => {
  const { config, adapters, values, base } = setup();
  const lora = { rank: 3, alpha: 6, targets: 'self_attn\\.(q|v)_proj|down_proj', dropout: 0.3 };
  const params = adapterParams(adapters);
  const build = (withGrad: boolean, dropout: number) => {
    const g = new L.Graph();
    const ids = g.input('input_ids', 'int64', ['B', 'T']);
    const mask = g.input('attention_mask', 'int64', ['B', 'T']);
    const lossMask = g.input('loss_mask', 'int64', ['B', 'T']);
    const t = new Map(params.map((p) => [p.name, g.input(p.name, 'float64', p.shape)]));
    const w = loraWeights(baseInputs(g, config, 'float64'), t, adapters, { ...lora, dropout }, 'float64', { training: true });
    const logp = nextTokenLogprobs(config, w, ids, mask);
    const loss = L.neg(L.reduceSum(L.mul(logp, L.cast(shiftLeft(lossMask), 'float64'))));
    g.output(loss, 'loss');
    if (withGrad) L.grad(loss, [...t.values()]).forEach((d, i) => g.output(d, `d/${params[i].name}`));
    return g;
  };
  const f64 = new Map([...values].map(([k, v]) => [k, Float64Array.from(v)]));
  const withGrad = await compileFloat64(build(true, 0.3));
  const lossOnly = await compileFloat64(build(false, 0.3));
  const g0 = build(false, 0.3);
  const feeds = (vals: Map<string, Float64Array>) => feedsFor(g0, vals, base);
  const analytic = await withGrad(feeds(f64));
  // dropout is active: the loss differs from p = 0's
  const noDropout = (await (await compileFloat64(build(false, 0)))(feedsFor(build(false, 0), f64, base))).loss.data[0] as number;
  expect(Math.abs((analytic.loss.data[0] as number) - noDropout)).toBeGreaterThan(1e-3);
  const r = rng(11);
  const eps = 1e-6;
  let worst = 0;
  for (const p of params) {
    const n = p.shape[0] * p.shape[1];
    for (let k = 0; k < 4; k++) {
      const i = Math.floor(r() * n);
      const at = (delta: number) => {
        const v = new Map(f64);
        const x = Float64Array.from(f64.get(p.name)!);
        x[i] += delta;
        v.set(p.name, x);
        return lossOnly(feeds(v)).then((o) => o.loss.data[0] as number);
      };
      const fd = ((await at(eps)) - (await at(-eps))) / (2 * eps);
      const an = (analytic[`d/${p.name}`].data as Float64Array)[i];
      worst = Math.max(worst, Math.abs(fd - an) / Math.max(1e-3, Math.abs(an)));
    }
  }
  expect(worst).toBeLessThan(1e-6);
});

test('dropout in training changes the loss and the update, and differs by key; p = 0 reads no key', async () => {
  const { config, lora, adapters, values, base } = setup();
  const plain = loraStep(config, adapters, lora, 'side').step;
  const dropped = loraStep(config, adapters, { ...lora, dropout: 0.5 }, 'side').step;
  const a = await runOnce(plain, values, base);
  const b = await runOnce(dropped, values, base, loraDropoutKey(7, 3, 0));
  const b2 = await runOnce(dropped, values, base, loraDropoutKey(7, 3, 0));
  const c = await runOnce(dropped, values, base, loraDropoutKey(7, 4, 0));
  const loss = (o: Record<string, HostTensor>) => o.loss.data[0] as number;
  expect(Math.abs(loss(a) - loss(b))).toBeGreaterThan(1e-3);
  expect(Math.abs(loss(b) - loss(c))).toBeGreaterThan(1e-4);
  expect(loss(b2)).toBe(loss(b)); // the same key, the same masks
  const name = `next/${adapters[0].a.name}`;
  expect(relDiff(a[name].data as Float32Array, b[name].data as Float32Array)).toBeGreaterThan(1e-4);
});

// ---- the hash behind the masks ------------------------------------------------------------------

/** Q as dropout.ts states it, in BigInt (no overflow possible). */
function hostQpr(x: bigint): bigint {
  const P = 2n ** 31n - 1n;
  const r = (x * x) % P;
  return x <= P / 2n ? r : P - r;
}

test('the quadratic-residue permutation in the graph is the stated function exactly (int64 squares never overflow)', async () => {
  const g = new L.Graph();
  const x = g.input('x', 'int64', ['N']);
  g.output(permuteQpr(x), 'q');
  const r = rng(3);
  const P = 2 ** 31 - 1;
  const xs = [0, 1, 2, 46340, 46341, Math.floor(P / 2), Math.floor(P / 2) + 1, P - 2, P - 1, ...Array.from({ length: 200 }, () => Math.floor(r() * P))].map(BigInt);
  const out = (await (await compile(g))({ x: { data: BigInt64Array.from(xs), dims: [xs.length] } })).q.data as BigInt64Array;
  expect([...out]).toEqual(xs.map(hostQpr));
});

/** Masks over a [4, 50, 512] input (102,400 elements) for several keys and salts, as 0/1. */
async function masks(p: number, keys: [number, number, number][], salts: number[]): Promise<Int32Array[]> {
  const g = new L.Graph();
  const x = g.input('x', 'float32', ['B', 'T', 512]);
  const key = g.input('key', 'int64', [3]);
  for (const s of salts) g.output(L.cast(droppedElements(x, streamKey(key, s), p), 'int32'), `m${s}`);
  expect(L.runtimeShapeNodes(g).map((n) => n.name)).toEqual([]);
  const run = await compile(g);
  const xv = { data: new Float32Array(4 * 50 * 512).fill(1), dims: [4, 50, 512] };
  const out: Int32Array[] = [];
  for (const k of keys) {
    const o = await run({ x: xv, key: { data: BigInt64Array.from(k.map(BigInt)), dims: [3] } });
    for (const s of salts) out.push(o[`m${s}`].data as Int32Array);
  }
  return out;
}

/** Pearson correlation of two 0/1 sequences. */
function correlation(a: ArrayLike<number>, b: ArrayLike<number>): number {
  const n = a.length;
  let sa = 0;
  let sb = 0;
  let sab = 0;
  for (let i = 0; i < n; i++) {
    sa += a[i];
    sb += b[i];
    sab += a[i] * b[i];
  }
  const ma = sa / n;
  const mb = sb / n;
  return (sab / n - ma * mb) / Math.sqrt(ma * (1 - ma) * mb * (1 - mb));
}

test('dropout masks: keep rate 1 − p, independent across steps, micro-batches, adapters and seeds, and between neighbours; equal for equal keys', async () => {
  const N = 4 * 50 * 512;
  for (const p of [0.1, 0.5]) {
    // key (seed, step, micro-batch) × salt (adapter)
    const [m, mSalt, mStep, mStepSalt, mMicro, , mSeed, , mAgain] = await masks(p, [[7, 3, 0], [7, 4, 0], [7, 3, 1], [8, 3, 0], [7, 3, 0]], [0, 1]);
    const rate = m.reduce((s, v) => s + v, 0) / N;
    expect(Math.abs(rate - p)).toBeLessThan(4 * Math.sqrt((p * (1 - p)) / N));
    expect(mAgain).toEqual(m);
    const bound = 4 / Math.sqrt(N);
    for (const [what, other] of [['adapter', mSalt], ['step', mStep], ['step and adapter', mStepSalt], ['micro-batch', mMicro], ['seed', mSeed]] as const) {
      expect([p, what, Math.abs(correlation(m, other)) < bound]).toEqual([p, what, true]);
    }
    // neighbours: the next element of a row, the same feature of the next token, of the next row
    for (const lag of [1, 512, 50 * 512]) expect([p, lag, Math.abs(correlation(m.subarray(0, N - lag), m.subarray(lag))) < bound]).toEqual([p, lag, true]);
  }
});

test('bad lora_dropout values are refused with a message naming lora_dropout', () => {
  for (const bad of [-0.1, 1]) expect(() => loraAdapters(setup().config, { rank: 2, alpha: 4, targets: 'q_proj', dropout: bad })).toThrow(/lora_dropout must be in \[0, 1\)/);
});

test('LoRA settings are checked', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'lathe-lora-'));
  const config = randomModel(dir, tiny, { seed: 5 });
  expect(() => loraAdapters(config, { rank: 0, alpha: 1, targets: 'q_proj' })).toThrow(/rank must be a positive integer/);
  expect(() => loraAdapters(config, { rank: 2, alpha: 1, targets: 'nothing' })).toThrow(/match no weight matrix/);
  expect(() => loraAdapters(config, { rank: 2, alpha: 1, targets: '(' })).toThrow(/not a valid regular expression/);
});
