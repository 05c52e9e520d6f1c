/**
 * The graph side of the fused cross-entropy kernels on the CPU (the ops' host compute, float32):
 * the ops' values and gradients against the composed ops (LogSoftmax, gather, entropy and their
 * gradient rules) in the same session, the host rule's gradient against central differences in
 * float64, and the decoder's chunked heads with `kernel` against the composed heads — log-probs,
 * entropies and every weight's gradient, with a temperature. The kernels themselves are tested in
 * cross-entropy-emulated.test.ts (CPU emulation) and on the GPU by tools/bench/kernels/ce-check.ts.
 */
import * as L from '@lathe/onnx';
import { causalLmLogprobs, chunkedTargetLogprobs, paramSpecs, targetLogprobs, weightInputs } from '@lathe/models';
import { Device } from '@lathe/runtime';
import { crossEntropyOps, crossEntropyReference, crossEntropyUnsupported } from '@lathe/kernels';
import { tinyModel, tinyQwen3, weightFeeds } from '../../models/test/tiny';
import { maxRel } from './sft-hook';

const rows = 5;
const V = 37;
const logitsData = Float32Array.from({ length: rows * V }, (_, i) => 3 * Math.sin(0.7 * i + 0.3) + (i % 11 === 0 ? 4 : 0));
const targets = [3, 36, -100, 0, 20]; // row 2 ignored
const weightsOf = (seed: number) => Float32Array.from({ length: rows }, (_, i) => Math.cos(seed + 1.3 * i));

test.each([
  [1, true],
  [0.6, true],
  [1.7, false],
])('temperature %s, entropy %s: values and d(logits) equal the composed ops’ (an ignored target gives 0 and no gradient)', (temperature, withEntropy) => {
  const ops = crossEntropyOps('cpu');
  const g = new L.Graph('ce_vs_composed');
  const logits = g.input('logits', 'float32', [rows, V]);
  const tg = g.input('targets', 'int64', [rows]);
  const valid = g.input('valid', 'float32', [rows]);
  const a = g.constant(Array.from(weightsOf(1)), 'float32', [rows]);
  const b = g.constant(Array.from(weightsOf(2)), 'float32', [rows]);
  const c = g.constant(Array.from(weightsOf(3)), 'float32', [rows]);
  const fused = ops.tokenLogprobs(logits, tg, { temperature, entropy: withEntropy });
  // composed: the same quantities from LogSoftmax/gather; ignored rows gather id 0 and are masked out
  const z = L.div(logits, temperature);
  const safe = L.where(L.greaterOrEqual(tg, 0), tg, 0);
  const composed = { logp: L.mul(L.tokenLogprobs(z, safe), valid), lse: L.logSumExp(z, -1), entropy: L.entropy(z) };
  for (const [name, r] of [['fused', fused], ['composed', composed]] as const) {
    let loss = L.add(L.reduceSum(L.mul(r.logp, a)), L.reduceSum(L.mul(r.lse, b)));
    if (withEntropy) loss = L.add(loss, L.reduceSum(L.mul(r.entropy!, c)));
    g.output(r.logp, `${name}/logp`);
    g.output(r.lse, `${name}/lse`);
    if (withEntropy) g.output(r.entropy!, `${name}/entropy`);
    g.output(L.grad(loss, [logits])[0]!, `${name}/dlogits`);
  }
  expect(g.nodes.filter((n) => n.op.name.startsWith('FusedCrossEntropy_')).length).toBe(1);
  expect(g.nodes.filter((n) => n.op.name.startsWith('FusedCrossEntropyGrad_')).length).toBe(1);
  const session = Device.cpu().compile(g, { customOpDomains: [ops.domain.handle] });
  const bind = session.binding();
  bind.input('logits', { data: logitsData, dims: [rows, V] });
  bind.input('targets', { data: BigInt64Array.from(targets.map(BigInt)), dims: [rows] });
  bind.input('valid', { data: Float32Array.from(targets.map((t) => (t >= 0 ? 1 : 0))), dims: [rows] });
  const names = ['logp', 'lse', ...(withEntropy ? ['entropy'] : []), 'dlogits'];
  for (const p of ['fused', 'composed']) for (const n of names) bind.output(`${p}/${n}`, 'host');
  bind.runSync();
  ops.check();
  const get = (n: string) => bind.fetch(n).data as Float32Array;
  for (const n of names) {
    const { err, scale } = maxRel(get(`fused/${n}`), get(`composed/${n}`));
    expect(scale).toBeGreaterThan(0.1);
    expect(err).toBeLessThan(1e-5);
  }
  expect(get('fused/logp')[2]).toBe(0);
  bind.dispose();
  session.dispose();
  ops.dispose();
});

test('the host rule’s d(logits) matches central differences of g_logp·logp + g_lse·lse + g_H·H (float64, with temperature)', () => {
  const shape = { rows, vocab: V, temperature: 0.8 };
  const gLogp = weightsOf(4);
  const gLse = weightsOf(5);
  const gEntropy = weightsOf(6);
  const f = (x: Float32Array) => {
    const r = crossEntropyReference(shape, { logits: x, targets });
    let s = 0;
    for (let i = 0; i < rows; i++) s += gLogp[i] * r.logp![i] + gLse[i] * r.lse[i] + gEntropy[i] * r.entropy[i];
    return s;
  };
  const { dLogits } = crossEntropyReference(shape, { logits: logitsData, targets, gLogp, gLse, gEntropy });
  // float32 inputs: a step of 2⁻⁶ is exact in them, and the second-order error stays well under the tolerance
  const h = 2 ** -6;
  const fd = new Float64Array(rows * V);
  for (let i = 0; i < rows * V; i++) {
    const up = Float32Array.from(logitsData);
    const down = Float32Array.from(logitsData);
    up[i] += h;
    down[i] -= h;
    fd[i] = (f(up) - f(down)) / (2 * h);
  }
  const { err, scale } = maxRel(dLogits!, fd);
  expect(scale).toBeGreaterThan(0.1);
  expect(err).toBeLessThan(2e-3);
  // the ignored row's gradient has no one-hot term: it sums to g_lse·1 − g_H·0 over the row (Σ p = 1, Σ p·(log p + H) = 0)
  const row2 = dLogits!.subarray(2 * V, 3 * V).reduce((s, v) => s + v, 0);
  expect(row2 * shape.temperature).toBeCloseTo(gLse[2], 5);
});

test('chunked heads with the kernel: the decoder’s log-probs, entropies and weight gradients equal the composed heads’ (4 vocabulary chunks, temperature 0.9)', () => {
  const { dir, config } = tinyModel(tinyQwen3, 5);
  const ops = crossEntropyOps('cpu');
  const g = new L.Graph('heads_kernel');
  const B = 2;
  const T = 6;
  const ids = g.input('input_ids', 'int64', [B, T]);
  const mask = g.input('attention_mask', 'int64', [B, T]);
  const tokenWeights = g.input('token_weights', 'float32', [B, T]);
  const { weights, inputs } = weightInputs(g, config, 'float32', 'float32');
  const names = paramSpecs(config).map((s) => s.name);
  for (const path of ['composed', 'kernel'] as const) {
    for (const withEntropy of [false, true]) {
      const r = causalLmLogprobs(config, weights, ids, mask, { chunk: 16, temperature: 0.9, entropy: withEntropy, ...(path === 'kernel' ? { logprobKernel: ops } : {}) });
      const tag = `${path}/${withEntropy ? 'ent' : 'lp'}`;
      g.output(r.logp, `${tag}/logp`);
      let loss = L.reduceSum(L.mul(r.logp, tokenWeights));
      if (r.entropy) {
        g.output(r.entropy, `${tag}/entropy`);
        loss = L.add(loss, L.reduceSum(L.mul(r.entropy, L.mul(tokenWeights, tokenWeights))));
      }
      L.grad(loss, names.map((n) => inputs.get(n)!)).forEach((d, i) => g.output(d, `${tag}/d/${names[i]}`));
    }
  }
  // 4 chunks each for the log-prob head and the entropy head
  expect(g.nodes.filter((n) => n.op.name.startsWith('FusedCrossEntropy_')).length).toBe(8);
  const session = Device.cpu().compile(g, { customOpDomains: [ops.domain.handle] });
  const bind = session.binding();
  const feeds = {
    ...weightFeeds(dir, config, 'float32'),
    input_ids: { data: BigInt64Array.from([3, 14, 15, 9, 2, 6, 7, 1, 8, 0, 0, 0].map(BigInt)), dims: [B, T] },
    attention_mask: { data: BigInt64Array.from([1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0].map(BigInt)), dims: [B, T] },
    token_weights: { data: Float32Array.from({ length: B * T }, (_, i) => Math.sin(i + 1)), dims: [B, T] },
  };
  for (const [name, t] of Object.entries(feeds)) bind.input(name, t);
  const outs = (tag: string) => [`${tag}/logp`, ...(tag.endsWith('ent') ? [`${tag}/entropy`] : []), ...names.map((n) => `${tag}/d/${n}`)];
  for (const p of ['composed', 'kernel']) for (const e of ['lp', 'ent']) for (const n of outs(`${p}/${e}`)) bind.output(n, 'host');
  bind.runSync();
  ops.check();
  for (const e of ['lp', 'ent']) {
    for (const n of outs(`composed/${e}`)) {
      const k = n.replace(/^composed/, 'kernel');
      const { err, scale } = maxRel(bind.fetch(k).data as Float32Array, bind.fetch(n).data as Float32Array);
      expect(scale).toBeGreaterThan(0);
      expect(err).toBeLessThan(1e-4);
    }
  }
  bind.dispose();
  session.dispose();
  ops.dispose();
});

test('targetLogprobs over full logits [B, T, V] and chunkedTargetLogprobs with recompute: with the kernel, the composed values and gradients', () => {
  const { config } = tinyModel(tinyQwen3, 2);
  const ops = crossEntropyOps('cpu');
  const g = new L.Graph('full_and_recompute');
  const B = 2;
  const T = 3;
  const D = config.hiddenSize;
  const logits = g.input('logits', 'float32', [B, T, config.vocabSize]);
  const hidden = g.input('hidden', 'float32', [B, T, D]);
  const head = g.input('head', 'float32', [config.vocabSize, D]);
  const tg = g.input('targets', 'int64', [B, T]);
  const w = () => head;
  for (const path of ['composed', 'kernel'] as const) {
    const kernel = path === 'kernel' ? ops : undefined;
    const full = targetLogprobs(logits, tg, 0.7, kernel);
    const chunked = chunkedTargetLogprobs(config, w, hidden, tg, { chunk: 16, recompute: true, temperature: 1.2, ...(kernel ? { kernel } : {}) });
    g.output(full, `${path}/full`);
    g.output(chunked, `${path}/chunked`);
    const [dLogits, dHidden, dHead] = L.grad(L.add(L.reduceSum(L.mul(full, full)), L.reduceSum(L.mul(chunked, chunked))), [logits, hidden, head]);
    g.output(dLogits!, `${path}/dlogits`);
    g.output(dHidden!, `${path}/dhidden`);
    g.output(dHead!, `${path}/dhead`);
  }
  const session = Device.cpu().compile(g, { customOpDomains: [ops.domain.handle] });
  const bind = session.binding();
  const fill = (n: number, f: (i: number) => number) => Float32Array.from({ length: n }, (_, i) => f(i));
  bind.input('logits', { data: fill(B * T * config.vocabSize, (i) => 2 * Math.sin(i * 0.37)), dims: [B, T, config.vocabSize] });
  bind.input('hidden', { data: fill(B * T * D, (i) => Math.cos(i * 0.11)), dims: [B, T, D] });
  bind.input('head', { data: fill(config.vocabSize * D, (i) => 0.3 * Math.sin(i * 0.53 + 1)), dims: [config.vocabSize, D] });
  bind.input('targets', { data: BigInt64Array.from([1, 63, 7, 0, 30, 12].map(BigInt)), dims: [B, T] });
  const names = ['full', 'chunked', 'dlogits', 'dhidden', 'dhead'];
  for (const p of ['composed', 'kernel']) for (const n of names) bind.output(`${p}/${n}`, 'host');
  bind.runSync();
  ops.check();
  for (const n of names) {
    const { err, scale } = maxRel(bind.fetch(`kernel/${n}`).data as Float32Array, bind.fetch(`composed/${n}`).data as Float32Array);
    expect([n, scale > 0.01, err < 1e-5]).toEqual([n, true, true]);
  }
  bind.dispose();
  session.dispose();
  ops.dispose();
});

test('shapes and dtypes outside the kernels are named; CUDA ops need the compiled kernels', () => {
  expect(crossEntropyUnsupported({ rows: 8192, vocab: 151_936, dtype: 'bfloat16' })).toBeUndefined();
  expect(crossEntropyUnsupported({ rows: 1, vocab: 300_000, dtype: 'bfloat16' })).toMatch(/vocabulary of 300000 .*1 to 262,144/);
  expect(crossEntropyUnsupported({ rows: 1, vocab: 8, dtype: 'float64' })).toMatch(/dtype float64/);
  expect(() => crossEntropyOps('cuda')).toThrow(/CUDA needs the compiled CrossEntropyKernels/);
  const ops = crossEntropyOps('cpu');
  const g = new L.Graph('bad');
  expect(() => ops.rowLogSumExp(g.input('h', 'float16', [2, 8]))).toThrow(/no kernel for dtype float16 \(takes float32\)/);
  expect(() => ops.rowLogSumExp(g.input('x', 'float32', [2, 3, 8]))).toThrow(/logits must be \[rows, vocab\]/);
  expect(() => ops.rowLogSumExp(g.input('y', 'float32', [2, 8]), { temperature: 0 })).toThrow(/temperature must be a positive number, got 0/);
  ops.dispose();
});

test('logits the ops cannot take keep the composed head, counted: float16 logits on the CPU ops give the composed log-probs', () => {
  const ops = crossEntropyOps('cpu');
  const g = new L.Graph('fallback');
  const logits = g.input('logits', 'float16', [2, 3, 5]);
  const tg = g.input('targets', 'int64', [2, 3]);
  const lp = targetLogprobs(logits, tg, 1, ops);
  expect(g.nodes.some((n) => n.op.name.startsWith('FusedCrossEntropy'))).toBe(false);
  expect(lp.dtype).toBe('float32');
  expect([...ops.fallbacks]).toEqual([['dtype float16 (the cpu ops take float32)', 1]]);
  expect(ops.unsupported('float32', 300_000)).toMatch(/vocabulary of 300000/);
  expect(ops.unsupported('float32', 64)).toBeUndefined();
  expect(ops.fallbacks.size).toBe(2);
  ops.dispose();
});
