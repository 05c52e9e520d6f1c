import * as L from '@lathe/onnx';
import { paramSpecs, randomModel, readTensorBytes, readWeightIndex, type DecoderConfig } from '@lathe/models';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { adamwUpdate, biasCorrections, smallParameterGroups, compileTrainStep, learningRate, loraAdapters, loraWeights, sftLoss, stateNames, type LossBuilder, type TrainableParam } from '@lathe/train';
import { compile, rng, type HostTensor } from '../../../tools/testing/ort-cpu';

const f32 = (a: ArrayLike<number>, dims: number[]): HostTensor => ({ data: Float32Array.from(a), dims });
const i64 = (rows: number[][]): HostTensor => ({ data: BigInt64Array.from(rows.flat().map(BigInt)), dims: [rows.length, rows[0].length] });
const scalar = (v: number): HostTensor => ({ data: Float32Array.from([v]), dims: [] });

/** torch.optim.AdamW + clip_grad_norm_, written out in float64 (the independent reference). */
function referenceAdamW(p: number[][], g: number[][], m: number[][], v: number[][], decay: boolean[], t: number, lr: number, maxNorm: number) {
  const [b1, b2, eps, wd] = [0.9, 0.999, 1e-8, 0.01];
  const norm = Math.sqrt(g.flat().reduce((s, x) => s + x * x, 0));
  const coef = Math.min(1, maxNorm / (norm + 1e-6));
  const bc1 = 1 - b1 ** t;
  const bc2 = 1 - b2 ** t;
  return p.map((pp, k) =>
    pp.map((x, i) => {
      const gi = g[k][i] * coef;
      const mi = b1 * m[k][i] + (1 - b1) * gi;
      const vi = b2 * v[k][i] + (1 - b2) * gi * gi;
      const decayed = decay[k] ? x * (1 - lr * wd) : x;
      return { p: decayed - (lr / bc1) * (mi / (Math.sqrt(vi) / Math.sqrt(bc2) + eps)), m: mi, v: vi };
    }),
  );
}

/** A graph with AdamW's inputs for parameters of these shapes: p/g/m/v{k} and the lr/bc1/bc2 scalars. */
function adamwInputs(shapes: number[][], decay: boolean[]) {
  const g = new L.Graph();
  const slots = shapes.map((sh, k) => ({
    param: g.input(`p${k}`, 'float32', sh),
    grad: g.input(`g${k}`, 'float32', sh),
    m: g.input(`m${k}`, 'float32', sh),
    v: g.input(`v${k}`, 'float32', sh),
    decay: decay[k],
  }));
  const sc = { lr: g.input('lr', 'float32', []), bc1: g.input('bc1', 'float32', []), bc2: g.input('bc2', 'float32', []) };
  return { g, slots, sc };
}

test('in-graph AdamW with clipping matches torch.optim.AdamW written out in float64', async () => {
  const r = rng(4);
  const shapes = [[3, 4], [4]];
  const decay = [true, false];
  const { g, slots, sc } = adamwInputs(shapes, decay);
  const out = adamwUpdate(slots, sc, { maxGradNorm: 0.5, weightDecay: 0.01 });
  out.params.forEach((t, k) => g.output(t, `np${k}`));
  out.m.forEach((t, k) => g.output(t, `nm${k}`));
  out.v.forEach((t, k) => g.output(t, `nv${k}`));
  g.output(out.gradNorm, 'norm');
  const run = await compile(g);
  const vals = (n: number, f: () => number) => Array.from({ length: n }, f);
  const sizes = shapes.map((s) => s.reduce((a, b) => a * b, 1));
  const p = sizes.map((n) => vals(n, () => r() - 0.5));
  const gr = sizes.map((n) => vals(n, () => r() * 2 - 1));
  const m = sizes.map((n) => vals(n, () => (r() - 0.5) * 0.1));
  const v = sizes.map((n) => vals(n, () => r() * 0.01));
  const t = 3;
  const lr = 0.01;
  const feeds: Record<string, HostTensor> = { lr: scalar(lr), ...Object.fromEntries(Object.entries(biasCorrections(t)).map(([k, x]) => [k, scalar(x)])) };
  shapes.forEach((s, k) => Object.assign(feeds, { [`p${k}`]: f32(p[k], s), [`g${k}`]: f32(gr[k], s), [`m${k}`]: f32(m[k], s), [`v${k}`]: f32(v[k], s) }));
  const res = await run(feeds);
  const ref = referenceAdamW(p, gr, m, v, decay, t, lr, 0.5);
  shapes.forEach((_s, k) => {
    ref[k].forEach((e, i) => {
      expect(res[`np${k}`].data[i]).toBeCloseTo(e.p, 6);
      expect(res[`nm${k}`].data[i]).toBeCloseTo(e.m, 7);
      expect(res[`nv${k}`].data[i]).toBeCloseTo(e.v, 7);
    });
  });
  expect(res.norm.data[0]).toBeCloseTo(Math.sqrt(gr.flat().reduce((s, x) => s + x * x, 0)), 5);
});

test('small parameters updated together (stacked, one set of passes, split back) get bit-identical results, with no host-table Concat/Split', async () => {
  const r = rng(9);
  // decayed [3, 4] ×3 (one group), undecayed [4] ×35 (groups of 32 and 3), one [5] and one [2, 6] alone
  const shapes = [[3, 4], [4], [5], [3, 4], ...Array.from({ length: 34 }, () => [4]), [2, 6], [3, 4]];
  const decay = shapes.map((sh, k) => sh.length === 2 && k !== shapes.length - 2);
  const { g, slots, sc } = adamwInputs(shapes, decay);
  // without clipping a parameter's update does not depend on the others: one-by-one is the reference
  const together = adamwUpdate(slots, sc, { maxGradNorm: 0, weightDecay: 0.1 });
  const alone = slots.map((x) => adamwUpdate([x], sc, { maxGradNorm: 0, weightDecay: 0.1 }));
  shapes.forEach((_s, k) => {
    for (const [name, t] of Object.entries({ tp: together.params[k], tm: together.m[k], tv: together.v[k], ap: alone[k].params[0], am: alone[k].m[0], av: alone[k].v[0] })) g.output(t, `${name}${k}`);
  });
  expect(smallParameterGroups(slots).map((idx) => idx.length)).toEqual([3, 32, 3]);
  // one Split per output kind per group, each of equal parts: nothing copied from the host per run
  expect(g.nodes.filter((n) => n.op.name === 'Split')).toHaveLength(9);
  expect(L.hostTableNodes(g)).toEqual([]);
  const feeds: Record<string, HostTensor> = { lr: scalar(0.03), ...Object.fromEntries(Object.entries(biasCorrections(5)).map(([k, x]) => [k, scalar(x)])) };
  shapes.forEach((sh, k) => {
    const n = sh.reduce((a, b) => a * b, 1);
    const vals = (f: () => number) => f32(Array.from({ length: n }, f), sh);
    Object.assign(feeds, { [`p${k}`]: vals(() => r() - 0.5), [`g${k}`]: vals(() => r() * 2 - 1), [`m${k}`]: vals(() => (r() - 0.5) * 0.1), [`v${k}`]: vals(() => r() * 0.01) });
  });
  const res = await (await compile(g))(feeds);
  shapes.forEach((sh, k) => {
    for (const kind of ['p', 'm', 'v']) {
      expect(res[`t${kind}${k}`].dims).toEqual(sh);
      expect(Array.from(res[`t${kind}${k}`].data as Float32Array)).toEqual(Array.from(res[`a${kind}${k}`].data as Float32Array));
    }
  });
});

test('an update after a boolean (AdamWScalars.after, the data-parallel join): every reader of a gradient goes through where(after, g, g), and the result is bitwise the update without it, signed zeros included', async () => {
  const r = rng(11);
  const shapes = [[3, 4], [4], [4], [2, 5]];
  const decay = [true, false, false, true];
  const cfg = { maxGradNorm: 0.5, weightDecay: 0.1 };
  const build = (gate: boolean) => {
    const { g, slots, sc } = adamwInputs(shapes, decay);
    const after = gate ? g.input('after', 'bool', []) : undefined;
    const out = adamwUpdate(slots, { ...sc, ...(after ? { after } : {}) }, cfg);
    shapes.forEach((_s, k) => {
      g.output(out.params[k], `np${k}`);
      g.output(out.m[k], `nm${k}`);
      g.output(out.v[k], `nv${k}`);
    });
    g.output(out.gradNorm, 'norm');
    return { g, slots, after };
  };
  const gated = build(true);
  // structurally: the gradients' only readers are the gates, one each, conditioned on `after`
  const gradNames = new Set(gated.slots.map((x) => x.grad.name));
  const readers = gated.g.nodes.filter((n) => n.inputs.some((t) => t !== null && gradNames.has(t.name)));
  expect(readers).toHaveLength(shapes.length);
  expect(readers.every((n) => n.op.name === 'Where' && n.inputs[0] === gated.after)).toBe(true);
  const feeds: Record<string, HostTensor> = { lr: scalar(0.02), ...Object.fromEntries(Object.entries(biasCorrections(2)).map(([k, x]) => [k, scalar(x)])) };
  shapes.forEach((sh, k) => {
    const n = sh.reduce((a, b) => a * b, 1);
    const vals = (f: (i: number) => number) => f32(Array.from({ length: n }, (_, i) => f(i)), sh);
    // some gradients and moments exactly ±0, where a gate that added zero would turn −0 into +0
    Object.assign(feeds, { [`p${k}`]: vals(() => r() - 0.5), [`g${k}`]: vals((i) => (i % 3 === 0 ? -0 : i % 3 === 1 ? 0 : r() * 2 - 1)), [`m${k}`]: vals((i) => (i % 2 ? -0 : (r() - 0.5) * 0.1)), [`v${k}`]: vals(() => r() * 0.01) });
  });
  // the condition's value does not matter: both branches are the gradient
  const withGate = await (await compile(gated.g))({ ...feeds, after: { data: Uint8Array.of(0), dims: [] } });
  const without = await (await compile(build(false).g))(feeds);
  const bits = (t: HostTensor) => Array.from(t.data as Float32Array, (x) => (Object.is(x, -0) ? '-0' : String(x)));
  for (const name of Object.keys(without)) expect({ name, bits: bits(withGate[name]) }).toEqual({ name, bits: bits(without[name]) });
  expect(Object.keys(without)).toHaveLength(3 * shapes.length + 1);
});

test('compileTrainStep beforeUpdate: the step graph\'s update reads the gradients it returns (in parameter order, named), after its boolean', () => {
  const params: TrainableParam[] = [
    { name: 'w', shape: [2, 3], decay: true },
    { name: 'b', shape: [3], decay: false },
  ];
  const loss: LossBuilder = (g, p) => ({ loss: L.reduceSum(L.add(L.matmul(g.input('x', 'float32', [4, 2]), p.get('w')!), p.get('b')!)) });
  const seen: string[] = [];
  let after: L.Tensor | undefined;
  const graphs = compileTrainStep(
    { params, loss },
    {
      beforeUpdate: (g, grads) => {
        seen.push(...grads.map((x) => x.name));
        after = g.input('after', 'bool', []);
        return { grads: grads.map((x) => L.mul(x.grad, 2)), after };
      },
    },
  );
  expect(seen).toEqual(['w', 'b']);
  // the composed update gates what beforeUpdate returned (the doubled gradients), not the backward's
  const gates = graphs.step.nodes.filter((n) => n.op.name === 'Where' && n.inputs[0] === after);
  expect(gates).toHaveLength(2);
  expect(gates.every((n) => n.inputs[1]!.node?.op.name === 'Mul')).toBe(true);
  // the accumulate graph is untouched
  expect(graphs.accumulate.inputs.map((t) => t.name)).not.toContain('after');
  expect(() => compileTrainStep({ params, loss }, { beforeUpdate: (_g, grads) => ({ grads: grads.slice(1).map((x) => x.grad) }) })).toThrow(/beforeUpdate returned 1 gradients for 2 parameters/);
});

test('learning-rate schedules', () => {
  expect(learningRate({ lr: 1, warmupSteps: 4 }, 0)).toBe(0.25);
  expect(learningRate({ lr: 1, warmupSteps: 4 }, 10)).toBe(1);
  expect(learningRate({ lr: 1, kind: 'linear', totalSteps: 10 }, 5)).toBeCloseTo(0.5);
  expect(learningRate({ lr: 1, kind: 'cosine', totalSteps: 10 }, 5)).toBeCloseTo(0.5);
  expect(learningRate({ lr: 1, kind: 'cosine', totalSteps: 10, minLrRatio: 0.1 }, 10)).toBeCloseTo(0.1);
  expect(() => learningRate({ lr: 1, kind: 'linear' }, 1)).toThrow(/needs totalSteps/);
});

// ---- a tiny model trained with the compiled graphs ------------------------------------------------

const tiny = {
  architectures: ['Qwen3ForCausalLM'],
  vocab_size: 32,
  hidden_size: 16,
  intermediate_size: 32,
  num_hidden_layers: 1,
  num_attention_heads: 2,
  num_key_value_heads: 1,
  head_dim: 8,
  rms_norm_eps: 1e-6,
  rope_theta: 10000,
  max_position_embeddings: 64,
  tie_word_embeddings: true,
};

function setup(): { config: DecoderConfig; params: TrainableParam[]; state: Record<string, HostTensor> } {
  const dir = mkdtempSync(join(tmpdir(), 'lathe-train-'));
  const config = randomModel(dir, tiny, { seed: 2, std: 0.1 });
  const index = readWeightIndex(dir);
  const params = paramSpecs(config).map((s) => ({ name: s.name, shape: s.shape, decay: s.kind === 'matrix' || s.kind === 'embedding' }));
  const state: Record<string, HostTensor> = {};
  for (const p of params) {
    const b = readTensorBytes(index.get(p.name)!);
    state[p.name] = { data: new Float32Array(b.buffer.slice(b.byteOffset, b.byteOffset + b.byteLength)), dims: p.shape };
    const n = p.shape.reduce((a, c) => a * c, 1);
    state[stateNames.m(p.name)] = f32(new Float32Array(n), p.shape);
    state[stateNames.v(p.name)] = f32(new Float32Array(n), p.shape);
  }
  return { config, params, state };
}

const batch = {
  ids: [
    [0, 0, 5, 6, 7, 8],
    [1, 2, 3, 4, 5, 6],
    [0, 9, 10, 11, 12, 13],
    [0, 0, 0, 7, 8, 9],
  ],
  attn: [
    [0, 0, 1, 1, 1, 1],
    [1, 1, 1, 1, 1, 1],
    [0, 1, 1, 1, 1, 1],
    [0, 0, 0, 1, 1, 1],
  ],
  loss: [
    [0, 0, 0, 0, 1, 1],
    [0, 0, 0, 1, 1, 1],
    [0, 0, 1, 1, 1, 1],
    [0, 0, 0, 0, 1, 1],
  ],
};
// Tokens the loss predicts: every loss-mask position but the first column (nothing precedes it).
const lossTokens = batch.loss.flatMap((r) => r.slice(1)).reduce((a, b) => a + b, 0);

function nextState(state: Record<string, HostTensor>, out: Record<string, HostTensor>): Record<string, HostTensor> {
  const s = { ...state };
  for (const [k, v] of Object.entries(out)) if (k.startsWith('next/')) s[k.slice(5)] = v;
  return s;
}

test('gradient accumulation: 4 micro-batches of 1 give the same update as 1 batch of 4', async () => {
  const { config, params, state } = setup();
  const graphs = compileTrainStep({ params, loss: sftLoss(config), optimizer: { maxGradNorm: 1 } });
  expect(graphs.batchInputs).toEqual(['input_ids', 'attention_mask', 'loss_mask', 'loss_tokens']);
  const [step, accumulate, apply] = await Promise.all([compile(graphs.step), compile(graphs.accumulate), compile(graphs.apply)]);
  const sc = { lr: scalar(0.01), ...Object.fromEntries(Object.entries(biasCorrections(1)).map(([k, x]) => [k, scalar(x)])) };
  const whole = await step({ ...state, ...sc, input_ids: i64(batch.ids), attention_mask: i64(batch.attn), loss_mask: i64(batch.loss), loss_tokens: scalar(lossTokens) });

  let acc: Record<string, HostTensor> = {};
  for (const p of params) acc[stateNames.grad(p.name)] = f32(new Float32Array(p.shape.reduce((a, b) => a * b, 1)), p.shape);
  let lossSum = 0;
  for (let b = 0; b < 4; b++) {
    const out = await accumulate({ ...state, ...acc, input_ids: i64([batch.ids[b]]), attention_mask: i64([batch.attn[b]]), loss_mask: i64([batch.loss[b]]), loss_tokens: scalar(lossTokens) });
    lossSum += Number(out.loss.data[0]);
    acc = Object.fromEntries(params.map((p) => [stateNames.grad(p.name), out[stateNames.next(stateNames.grad(p.name))]]));
  }
  const applied = await apply({ ...state, ...acc, ...sc, grad_scale: scalar(1) });
  expect(lossSum).toBeCloseTo(Number(whole.loss.data[0]), 5);
  expect(applied.grad_norm.data[0]).toBeCloseTo(Number(whole.grad_norm.data[0]), 4);
  for (const p of params) {
    const a = whole[stateNames.next(p.name)].data as Float32Array;
    const b = applied[stateNames.next(p.name)].data as Float32Array;
    for (let i = 0; i < a.length; i++) expect(Math.abs(a[i] - b[i])).toBeLessThan(1e-6);
  }
});

test('gradient checkpointing (each layer recomputed in the backward pass) gives the same step, and its backward reads no layer activation', async () => {
  const { config, params, state } = setup();
  const feeds = { ...state, lr: scalar(0.01), ...Object.fromEntries(Object.entries(biasCorrections(1)).map(([k, x]) => [k, scalar(x)])), input_ids: i64(batch.ids), attention_mask: i64(batch.attn), loss_mask: i64(batch.loss), loss_tokens: scalar(lossTokens) };
  // chunk 8: the LM head's log-partition in several vocabulary chunks, each its own recomputed region
  const plainGraphs = compileTrainStep({ params, loss: sftLoss(config, { chunk: 8 }), optimizer: { maxGradNorm: 1 } });
  const recomputeGraphs = compileTrainStep({ params, loss: sftLoss(config, { chunk: 8, recompute: true }), optimizer: { maxGradNorm: 1 } });
  expect(config.vocabSize).toBeGreaterThan(16);
  const [plain, recomputed] = await Promise.all([compile(plainGraphs.step).then((f) => f(feeds)), compile(recomputeGraphs.step).then((f) => f(feeds))]);
  expect(Number(recomputed.loss.data[0])).toBeCloseTo(Number(plain.loss.data[0]), 6);
  for (const p of params) {
    const a = plain[stateNames.next(p.name)].data as Float32Array;
    const b = recomputed[stateNames.next(p.name)].data as Float32Array;
    for (let i = 0; i < a.length; i++) expect(Math.abs(a[i] - b[i])).toBeLessThan(1e-6);
  }
  // Memory: no backward node reads an activation computed inside a layer — a value that depends on
  // the token ids, other than a layer's result (the next layer's input, kept either way).
  const activations = (g: L.Graph) => {
    const dependent = new Set<L.Tensor>(g.inputs.filter((t) => t.name === 'input_ids'));
    for (const n of g.nodes) if (n.inputs.some((t) => t && dependent.has(t))) for (const o of n.outputs) dependent.add(o);
    const scopeOf = (n: L.Node) => /^layer\d+\//.exec(n.name)?.[0];
    const exported = new Set(g.nodes.filter((n) => !n.name.startsWith('grad/')).flatMap((n) => n.inputs.filter((t) => t?.node && scopeOf(t.node) && scopeOf(t.node) !== scopeOf(n)))) as Set<L.Tensor>;
    return new Set(g.nodes.filter((n) => scopeOf(n)).flatMap((n) => n.outputs).filter((t) => dependent.has(t) && !exported.has(t)));
  };
  const readsActivation = (g: L.Graph) => {
    const acts = activations(g);
    return g.nodes.filter((n) => n.name.startsWith('grad/') && !n.name.startsWith('grad/recompute/') && n.inputs.some((t) => t && acts.has(t))).map((n) => n.name);
  };
  expect(readsActivation(recomputeGraphs.step)).toEqual([]);
  // …nor a vocabulary chunk's values (the head's [B·T, chunk] logits, exps, …: forward values
  // outside the layers with a row per token and the chunk as last dim)
  const chunkLogits = (g: L.Graph) => new Set(g.nodes.filter((n) => !n.name.startsWith('grad/') && !/^layer\d+\//.test(n.name)).flatMap((n) => n.outputs).filter((t) => t.rank === 2 && typeof t.shape[0] === 'string' && t.shape[1] === 8 && t.dtype === 'float32'));
  const readsChunk = (g: L.Graph) => { const c = chunkLogits(g); return g.nodes.filter((n) => n.name.startsWith('grad/') && !n.name.startsWith('grad/recompute/') && n.inputs.some((t) => t && c.has(t))).length; };
  expect(chunkLogits(recomputeGraphs.step).size).toBeGreaterThan(1);
  expect(readsChunk(recomputeGraphs.step)).toBe(0);
  expect(readsChunk(plainGraphs.step)).toBeGreaterThan(0);
  const plainReaders = readsActivation(plainGraphs.step);
  expect(plainReaders.length).toBeGreaterThan(20);
});

test('flash attention (GroupQueryAttention forward, composed backward) gives the same step as composed attention', async () => {
  const { config, params, state } = setup();
  const common = { ...state, lr: scalar(0.01), ...Object.fromEntries(Object.entries(biasCorrections(1)).map(([k, x]) => [k, scalar(x)])), loss_tokens: scalar(lossTokens) };
  // The same rows right-padded (tokens first), as flash attention requires and padBatch makes.
  const right = (rows: number[][]) => rows.map((r, i) => { const pad = batch.attn[i].indexOf(1); return [...r.slice(pad), ...r.slice(0, pad).map(() => 0)]; });
  const composedGraphs = compileTrainStep({ params, loss: sftLoss(config, { chunk: 8 }), optimizer: { maxGradNorm: 1 } });
  const flashGraphs = compileTrainStep({ params, loss: sftLoss(config, { chunk: 8, flashAttention: true }), optimizer: { maxGradNorm: 1 } });
  const flashRecomputed = compileTrainStep({ params, loss: sftLoss(config, { chunk: 8, flashAttention: true, recompute: true }), optimizer: { maxGradNorm: 1 } });
  expect(flashGraphs.batchInputs).toEqual(['input_ids', 'attention_mask', 'loss_mask', 'loss_tokens', 'total_sequence_length']);
  const rightFeeds = { ...common, input_ids: i64(right(batch.ids)), attention_mask: i64(right(batch.attn)), loss_mask: i64(right(batch.loss)), total_sequence_length: { data: Int32Array.of(6), dims: [] } };
  const [composed, flash, flashRe] = await Promise.all([
    compile(composedGraphs.step).then((f) => f({ ...common, input_ids: i64(batch.ids), attention_mask: i64(batch.attn), loss_mask: i64(batch.loss) })),
    compile(flashGraphs.step).then((f) => f(rightFeeds)),
    compile(flashRecomputed.step).then((f) => f(rightFeeds)),
  ]);
  for (const out of [flash, flashRe]) {
    expect(Number(out.loss.data[0])).toBeCloseTo(Number(composed.loss.data[0]), 5);
    expect(Number(out.grad_norm.data[0])).toBeCloseTo(Number(composed.grad_norm.data[0]), 4);
    for (const p of params) {
      const a = composed[stateNames.next(p.name)].data as Float32Array;
      const b = out[stateNames.next(p.name)].data as Float32Array;
      for (let i = 0; i < a.length; i++) expect(Math.abs(a[i] - b[i])).toBeLessThan(1e-5);
    }
  }
  // No [B, heads, T, T] value of the forward pass reaches the backward pass: the probabilities
  // exist only inside each layer's gradient rule.
  const square = (t: L.Tensor) => t.rank >= 4 && t.shape[t.rank - 1] === t.shape[t.rank - 2] && t.shape[t.rank - 1] !== 1;
  const keptSquares = (g: L.Graph) => g.nodes.filter((n) => n.name.startsWith('grad/')).flatMap((n) => n.inputs).filter((t) => t?.node && !t.node.name.startsWith('grad/') && square(t)).length;
  expect(keptSquares(composedGraphs.step)).toBeGreaterThan(0);
  expect(keptSquares(flashGraphs.step)).toBe(0);
});

test('SFT on a fixed batch drives the loss down', async () => {
  const { config, params, state: init } = setup();
  const graphs = compileTrainStep({ params, loss: sftLoss(config), optimizer: { maxGradNorm: 1, weightDecay: 0 } });
  const step = await compile(graphs.step);
  let state = init;
  const losses: number[] = [];
  for (let t = 1; t <= 30; t++) {
    const { bc1, bc2 } = biasCorrections(t);
    const out = await step({ ...state, lr: scalar(0.02), bc1: scalar(bc1), bc2: scalar(bc2), input_ids: i64(batch.ids), attention_mask: i64(batch.attn), loss_mask: i64(batch.loss), loss_tokens: scalar(lossTokens) });
    losses.push(Number(out.loss.data[0]));
    state = nextState(state, out);
  }
  expect(losses[0]).toBeGreaterThan(3); // ≈ ln 32 at random init
  expect(losses[29]).toBeLessThan(0.5 * losses[0]);
});

test('bf16 train-step graphs (full and LoRA) have no run-time shape arithmetic and no op without a CUDA kernel: nothing ORT must put on the CPU', () => {
  // Backward rules (Concat → Split sizes, Slice → Pad amounts) once read shapes at run time; ORT runs
  // such int64 arithmetic on the CPU, and a CUDA session with CPU fallback off refuses it.
  const dir = mkdtempSync(join(tmpdir(), 'lathe-shape-'));
  const config = randomModel(dir, { architectures: ['Qwen3ForCausalLM'], vocab_size: 64, hidden_size: 32, intermediate_size: 64, num_hidden_layers: 1, num_attention_heads: 2, num_key_value_heads: 1, head_dim: 16, rms_norm_eps: 1e-6, rope_theta: 10000, max_position_embeddings: 64, tie_word_embeddings: true }, { seed: 1 });
  const full = paramSpecs(config).map((s) => ({ name: s.name, shape: s.shape, decay: s.shape.length > 1 }));
  const lora = { rank: 2, alpha: 4, targets: 'q_proj|v_proj' };
  const adapters = loraAdapters(config, lora);
  const variants: [string, TrainableParam[], LossBuilder][] = [
    ['full', full, sftLoss(config, { compute: 'bfloat16', chunk: 24 })],
    ['full, recomputed layers', full, sftLoss(config, { compute: 'bfloat16', chunk: 24, recompute: true })],
    ['full, flash attention', full, sftLoss(config, { compute: 'bfloat16', chunk: 24, flashAttention: true })],
    [
      'lora',
      adapters.flatMap((a) => [a.a, a.b]),
      sftLoss(config, {
        compute: 'bfloat16',
        weights: (g, t) => loraWeights((n) => g.input(`base/${n}`, 'float32', paramSpecs(config).find((s) => s.name === n)!.shape), t, adapters, lora, 'bfloat16'),
      }),
    ],
  ];
  for (const [name, params, loss] of variants) {
    const graphs = compileTrainStep({ params, loss });
    for (const g of [graphs.step, graphs.accumulate, graphs.apply]) {
      expect([name, L.runtimeShapeNodes(g).map((n) => n.name)]).toEqual([name, []]);
      // nor a node the CUDA provider has no kernel for (bf16 Pad, ReduceMax, …)
      expect([name, L.noCudaKernelNodes(g).map((n) => `${n.op.name} ${n.outputs[0]?.dtype} ${n.name}`)]).toEqual([name, []]);
    }
  }
});

test('the train steps a CUDA graph captures (static batch shape) hold no Concat/Split that copies host tables, full and LoRA, at 40 layers', () => {
  // 40 layers: 80 norm weights and 320 LoRA adapter matrices, well past the 32 parts ORT passes by value
  const dir = mkdtempSync(join(tmpdir(), 'lathe-train-'));
  const config = randomModel(dir, { ...tiny, vocab_size: 300, num_hidden_layers: 40 }, { seed: 2, std: 0.1 });
  const specs = paramSpecs(config);
  const full = specs.map((s) => ({ name: s.name, shape: s.shape, decay: s.kind === 'matrix' || s.kind === 'embedding' }));
  const shape: [number, number] = [2, 8];
  expect(L.hostTableNodes(compileTrainStep({ params: full, loss: sftLoss(config, { chunk: 64, shape }), optimizer: { maxGradNorm: 1 } }).step)).toEqual([]);
  const lora = { rank: 4, alpha: 8, targets: 'q_proj|k_proj|v_proj|o_proj' };
  const adapters = loraAdapters(config, lora);
  const loss = sftLoss(config, {
    chunk: 64,
    shape,
    weights: (g, trainable) => {
      const base = new Map(specs.map((s) => [s.name, g.input(`base/${s.name}`, 'float32', s.shape)]));
      return loraWeights((name) => base.get(name)!, trainable, adapters, lora, 'float32');
    },
  });
  expect(L.hostTableNodes(compileTrainStep({ params: adapters.flatMap((a) => [a.a, a.b]), loss, optimizer: { maxGradNorm: 1 } }).step)).toEqual([]);
});
