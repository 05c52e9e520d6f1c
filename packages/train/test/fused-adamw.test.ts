import * as L from '@lathe/onnx';
import { Device } from '@lathe/runtime';
import { biasCorrections, compileTrainStep, Trainer, FUSED_ADAMW_CHUNK, fusedAdamWConstants, fusedAdamWReference, planChunks, SLOT_WORDS, slotTable, stateNames, type AdamWConfig, type TrainableParam } from '@lathe/train';
import { rng } from '../../../tools/testing/ort-cpu';

test('chunks: each tensor cut into chunk-sized pieces in order, the last one shorter; empty tensors get none', () => {
  expect(Array.from(planChunks([5, 0, 3, 4], 4), Number)).toEqual([0, 0, 0, 4, 2, 0, 3, 0]);
  expect(planChunks([FUSED_ADAMW_CHUNK * 2 + 1]).length).toBe(6);
  expect(planChunks([]).length).toBe(0);
  expect(() => planChunks([3], 0)).toThrow(/chunk must be a positive integer/);
  expect(() => planChunks([3, -1])).toThrow(/tensor 1 has an invalid size -1/);
});

test('chunks: every element of every tensor is in exactly one chunk (Qwen3-0.6B sizes)', () => {
  // hidden 1024, intermediate 3072, 28 layers, vocabulary 151936, q/k/v/o 2048/1024/1024/2048 wide
  const layer = [1024 * 2048, 1024 * 1024, 1024 * 1024, 2048 * 1024, 3072 * 1024, 3072 * 1024, 1024 * 3072, 1024, 1024, 128, 128];
  const sizes = [151936 * 1024, ...Array.from({ length: 28 }, () => layer).flat(), 1024];
  const plan = planChunks(sizes);
  const covered = sizes.map(() => 0);
  for (let c = 0; c < plan.length; c += 2) {
    const [t, start] = [Number(plan[c]), Number(plan[c + 1])];
    expect(start % FUSED_ADAMW_CHUNK).toBe(0);
    covered[t] += Math.min(FUSED_ADAMW_CHUNK, sizes[t] - start);
  }
  expect(covered).toEqual(sizes);
  expect(plan.length / 2).toBe(sizes.reduce((a, n) => a + Math.ceil(n / FUSED_ADAMW_CHUNK), 0));
});

test('slot table: seven addresses, the size, the decay flag and whether the gradient is bfloat16, per tensor', () => {
  const t = slotTable([
    { pointers: [1n, 2n, 3n, 4n, 5n, 6n, 7n], size: 10, decay: true },
    { pointers: [11n, 12n, 13n, 14n, 15n, 16n, 17n], size: 3, decay: false, grad: 'bfloat16' },
  ]);
  expect(SLOT_WORDS).toBe(10);
  expect(Array.from(t, Number)).toEqual([1, 2, 3, 4, 5, 6, 7, 10, 1, 0, 11, 12, 13, 14, 15, 16, 17, 3, 0, 1]);
  expect(() => slotTable([{ pointers: [1n], size: 1, decay: false }])).toThrow(/slot 0 has 1 addresses, expected 7/);
});

test('constants are the float32 values the composed graph holds', () => {
  const k = fusedAdamWConstants({ maxGradNorm: 1 });
  expect(k).toEqual({ b1: Math.fround(0.9), b2: Math.fround(0.999), omb1: Math.fround(1 - 0.9), omb2: Math.fround(1 - 0.999), eps: Math.fround(1e-8), wd: Math.fround(0.01), maxNorm: 1 });
});

/** Runs ORT's composed `apply` graph on the CPU and the kernels' host reference on the same state. */
async function compare(cfg: AdamWConfig, gradScale: number) {
  // two small equal-size decayed tensors (stacked into one group by adamwUpdate), a norm weight, one large tensor
  const params: TrainableParam[] = [
    { name: 'a', shape: [4, 8], decay: true },
    { name: 'b', shape: [4, 8], decay: true },
    { name: 'norm', shape: [8], decay: false },
    { name: 'big', shape: [70000], decay: true },
  ];
  const graphs = compileTrainStep({ params, loss: (g, ps) => ({ loss: L.reduceSum(L.mul(ps.get('a')!, ps.get('a')!), [0, 1], false) }), optimizer: cfg });
  const r = rng(37);
  const rand = (n: number, s: number) => Float32Array.from({ length: n }, () => (r() * 2 - 1) * s);
  const state = params.map((p) => {
    const n = p.shape.reduce((a, b) => a * b, 1);
    return { p: rand(n, 1), m: rand(n, 0.01), v: Float32Array.from(rand(n, 1e-4), Math.abs), g: rand(n, 0.05), decay: p.decay };
  });
  const { bc1, bc2 } = biasCorrections(3);
  const lr = 3e-4;
  const feeds: Record<string, { data: Float32Array; dims: number[] }> = { lr: { data: Float32Array.of(lr), dims: [] }, bc1: { data: Float32Array.of(bc1), dims: [] }, bc2: { data: Float32Array.of(bc2), dims: [] }, grad_scale: { data: Float32Array.of(gradScale), dims: [] } };
  params.forEach((p, i) => {
    feeds[p.name] = { data: state[i].p, dims: p.shape };
    feeds[stateNames.m(p.name)] = { data: state[i].m, dims: p.shape };
    feeds[stateNames.v(p.name)] = { data: state[i].v, dims: p.shape };
    feeds[stateNames.grad(p.name)] = { data: state[i].g, dims: p.shape };
  });
  const s = Device.cpu().compile(graphs.apply);
  const out = await s.run(feeds);
  s.dispose();
  const ref = fusedAdamWReference(state, { lr, bc1, bc2, gradScale }, cfg);
  return { params, out, ref, state };
}

/** Largest distance in units in the last place between two float32 arrays. */
function maxUlps(a: Float32Array, b: Float32Array): number {
  const ia = new Int32Array(a.buffer, a.byteOffset, a.length);
  const ib = new Int32Array(b.buffer, b.byteOffset, b.length);
  let worst = 0;
  for (let i = 0; i < a.length; i++) worst = Math.max(worst, Math.abs(ia[i] - ib[i]));
  return worst;
}

test('without clipping the fused arithmetic is bitwise the composed apply graph (grouped and single tensors, decay and not)', async () => {
  const { params, out, ref } = await compare({ weightDecay: 0.1 }, 0.5);
  params.forEach((p, i) => {
    expect(maxUlps(out[stateNames.next(p.name)].data as Float32Array, ref.p[i])).toBe(0);
    expect(maxUlps(out[stateNames.next(stateNames.m(p.name))].data as Float32Array, ref.m[i])).toBe(0);
    expect(maxUlps(out[stateNames.next(stateNames.v(p.name))].data as Float32Array, ref.v[i])).toBe(0);
  });
  expect(Math.abs((out.grad_norm.data[0] as number) - ref.norm) / ref.norm).toBeLessThan(1e-5);
});

test('with clipping that bites, the update is bitwise the composed one given the same norm; the norms differ only by summation order', async () => {
  const cfg = { maxGradNorm: 0.5 };
  const { params, out, state } = await compare(cfg, 1);
  const norm = out.grad_norm.data[0] as number;
  expect(norm).toBeGreaterThan(0.5);
  const ref = fusedAdamWReference(state, { lr: 3e-4, ...biasCorrections(3) }, cfg, norm);
  params.forEach((p, i) => {
    expect(maxUlps(out[stateNames.next(p.name)].data as Float32Array, ref.p[i])).toBe(0);
    expect(maxUlps(out[stateNames.next(stateNames.m(p.name))].data as Float32Array, ref.m[i])).toBe(0);
    expect(maxUlps(out[stateNames.next(stateNames.v(p.name))].data as Float32Array, ref.v[i])).toBe(0);
  });
  const own = fusedAdamWReference(state, { lr: 3e-4, ...biasCorrections(3) }, cfg);
  expect(Math.abs(own.norm - norm) / norm).toBeLessThan(1e-5);
});

/**
 * A small model's trainer state after `steps` steps, with the composed update or the fused node.
 * `castW`: `w` is read through bfloat16 (widened back, so the CPU provider computes in float32), so
 * its gradient is a bfloat16 value widened by a Cast — the pattern `halfGradients` hands to the
 * fused node as the bfloat16 value; `b` stays float32.
 */
function trainWith(fusedAdamW: boolean, optimizer: AdamWConfig, microBatches: number, steps = 3, staticInputs = false, opts: { castW?: boolean; halfGradients?: boolean } = {}) {
  const params: TrainableParam[] = [
    { name: 'w', shape: [6, 4], decay: true },
    { name: 'b', shape: [4], decay: false },
  ];
  // least squares: loss = Σ (x·w + b − y)² / rows, over a fixed batch
  const loss = (g: L.Graph, ps: Map<string, L.Tensor>) => {
    const x = g.input('x', 'float32', ['R', 6]);
    const y = g.input('y', 'float32', ['R', 4]);
    const w = opts.castW ? L.cast(L.cast(ps.get('w')!, 'bfloat16'), 'float32') : ps.get('w')!;
    const err = L.sub(L.add(L.matmul(x, w), ps.get('b')!), y);
    return { loss: L.div(L.reduceSum(L.mul(err, err), [0, 1], false), 8) };
  };
  const r = rng(5);
  const rand = (n: number) => Float32Array.from({ length: n }, () => r() * 2 - 1);
  const half = opts.halfGradients === undefined ? {} : { halfGradients: opts.halfGradients };
  const trainer = Trainer.create({ params, loss, optimizer }, { params: new Map([['w', rand(24)], ['b', rand(4)]]) }, { fusedAdamW, microBatches, staticInputs, ...half });
  // the update really is the node (and only the node) when asked for
  const graph = microBatches === 1 ? trainer.graphs.step : trainer.graphs.apply;
  const node = graph.nodes.find((n) => n.op.name.startsWith('FusedAdamW'));
  expect(node !== undefined).toBe(fusedAdamW);
  expect(graph.nodes.some((n) => n.op.name === 'Sqrt')).toBe(!fusedAdamW);
  const rows = 8 / microBatches;
  const batches = Array.from({ length: microBatches }, () => ({ x: { data: rand(rows * 6), dims: [rows, 6] }, y: { data: rand(rows * 4), dims: [rows, 4] } }));
  const norms: number[] = [];
  for (let t = 0; t < steps; t++) norms.push(trainer.trainStep(batches, 0.05).gradNorm);
  const state = trainer.snapshot();
  trainer.dispose();
  return { state, norms, op: node?.op.name, gradDtypes: node?.inputs.slice(2, 4).map((t) => t!.dtype) };
}

test('Trainer fusedAdamW (CPU node): three steps bitwise equal to the composed update, one micro-batch and two', () => {
  for (const micro of [1, 2]) {
    const composed = trainWith(false, { weightDecay: 0.1 }, micro);
    const fused = trainWith(true, { weightDecay: 0.1 }, micro);
    for (const k of ['params', 'm', 'v'] as const) {
      for (const n of ['w', 'b']) expect(maxUlps(fused.state[k].get(n)!, composed.state[k].get(n)!)).toBe(0);
    }
    fused.norms.forEach((x, i) => expect(Math.abs(x - composed.norms[i]) / composed.norms[i]).toBeLessThan(1e-5));
  }
});

test('Trainer fusedAdamW (CPU node) with clipping that bites: within float32 rounding of the composed update', () => {
  const composed = trainWith(false, { maxGradNorm: 0.05 }, 1);
  const fused = trainWith(true, { maxGradNorm: 0.05 }, 1);
  expect(composed.norms[0]).toBeGreaterThan(0.05);
  for (const n of ['w', 'b']) {
    const [a, b] = [fused.state.params.get(n)!, composed.state.params.get(n)!];
    a.forEach((x, i) => expect(Math.abs(x - b[i])).toBeLessThan(1e-6));
  }
});

test('Trainer fusedAdamW with staticInputs (the fixed buffers of the CUDA-graph path, both bindings): bitwise equal to the composed update', () => {
  // four steps: each of the two ping-pong bindings runs twice, as replays of a captured graph would
  const composed = trainWith(false, { weightDecay: 0.1 }, 1, 4, true);
  const fused = trainWith(true, { weightDecay: 0.1 }, 1, 4, true);
  const plain = trainWith(false, { weightDecay: 0.1 }, 1, 4);
  for (const k of ['params', 'm', 'v'] as const) {
    for (const n of ['w', 'b']) {
      expect(maxUlps(fused.state[k].get(n)!, composed.state[k].get(n)!)).toBe(0);
      expect(maxUlps(fused.state[k].get(n)!, plain.state[k].get(n)!)).toBe(0);
    }
  }
  fused.norms.forEach((x, i) => expect(Math.abs(x - composed.norms[i]) / composed.norms[i]).toBeLessThan(1e-5));
});

test('halfGradients (the default with fusedAdamW): the node reads a widened bfloat16 gradient as bfloat16, and the update is bit for bit the float32 copy\'s', () => {
  const clip = { weightDecay: 0.1, maxGradNorm: 0.5 };
  const half = trainWith(true, clip, 1, 3, false, { castW: true });
  const wide = trainWith(true, clip, 1, 3, false, { castW: true, halfGradients: false });
  // the node's gradient inputs (w, b): the bfloat16 value the Cast widened, and b's float32 gradient as it was
  expect([half.op, half.gradDtypes]).toEqual(['FusedAdamW_hf', ['bfloat16', 'float32']]);
  expect([wide.op, wide.gradDtypes]).toEqual(['FusedAdamW', ['float32', 'float32']]);
  for (const k of ['params', 'm', 'v'] as const) for (const n of ['w', 'b']) expect(maxUlps(half.state[k].get(n)!, wide.state[k].get(n)!)).toBe(0);
  expect(half.norms).toEqual(wide.norms);
  // the clip bit: the norm is above 0.5 at the first step
  expect(half.norms[0]).toBeGreaterThan(0.5);
  // the composed update (no fused node) is not given bfloat16 gradients: it trains as before
  const composed = trainWith(false, clip, 1, 3, false, { castW: true, halfGradients: true });
  expect(composed.op).toBeUndefined();
  expect(maxUlps(composed.state.params.get('w')!, wide.state.params.get('w')!)).toBeLessThan(4);
});
