import * as L from '@lathe/onnx';
import { filteredScores, firstArgMax, hash32, sampleNext, uniformAt, uniformNoise, validateSampling, type SamplingOptions } from '@lathe/rollout';
import { compile } from '../../../tools/testing/ort-cpu';
import { rowsOf } from './helpers';

/** Runs `filteredScores` on crafted logits rows and returns which tokens stay sampleable. */
async function kept(logits: number[][], o: SamplingOptions): Promise<boolean[][]> {
  const V = logits[0].length;
  const g = new L.Graph();
  const x = g.input('logits', 'float32', ['B', V]);
  g.output(filteredScores(x, o), 'scores');
  const run = await compile(g);
  const out = await run({ logits: { data: Float32Array.from(logits.flat()), dims: [logits.length, V] } });
  return rowsOf(out.scores).map((row) => row.map((s) => s > -Infinity));
}

const lg = (p: number[]) => p.map(Math.log);

test('top-k keeps the k largest logits (ties at the k-th included)', async () => {
  expect(await kept([[1, 5, 3, 4, 2]], { topK: 2 })).toEqual([[false, true, false, true, false]]);
  expect(await kept([[1, 3, 3, 0]], { topK: 2 })).toEqual([[false, true, true, false]]);
});

test('top-p keeps the smallest most-likely set reaching p; the best token always stays', async () => {
  const probs = [0.05, 0.5, 0.3, 0.15];
  expect(await kept([lg(probs)], { topP: 0.5 })).toEqual([[false, true, false, false]]);
  expect(await kept([lg(probs)], { topP: 0.6 })).toEqual([[false, true, true, false]]);
  expect(await kept([lg(probs)], { topP: 0.9 })).toEqual([[false, true, true, true]]);
  expect(await kept([lg(probs)], { topP: 0.1 })).toEqual([[false, true, false, false]]);
});

test('min-p drops tokens below min_p · p_max, and filters compose after temperature', async () => {
  const probs = [0.4, 0.3, 0.2, 0.1];
  expect(await kept([lg(probs)], { minP: 0.5 })).toEqual([[true, true, true, false]]);
  // Temperature 0.5 squares the ratios: p ∝ 0.16, 0.09, 0.04, 0.01 → relative to max: 1, .56, .25, .06.
  expect(await kept([lg(probs)], { temperature: 0.5, minP: 0.3 })).toEqual([[true, true, false, false]]);
  // top-k then top-p: after top-3 the renormalised mass is .44/.33/.22; p = 0.7 keeps two.
  expect(await kept([lg(probs)], { topK: 3, topP: 0.7 })).toEqual([[true, true, false, false]]);
});

test('two-stage top-k, and top-p over its survivors, equal a direct sort (41 chunks of 32; ties; k up to the chunk count)', async () => {
  const V = 1312; // 41 × 32: no wider chunk divides it, so 41 chunks
  const rows = 6;
  let seed = 7;
  const rand = () => ((seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31);
  const logits = Array.from({ length: rows }, (_, r) => Array.from({ length: V }, () => (r + 1) * 1.5 * (rand() - 0.5)));
  logits[0][10] = logits[0][700] = logits[0][1300] = 5; // three tied maxima in different chunks
  logits[1].fill(0.25, 0, 64); // two whole chunks of one value
  logits[2][3] = logits[2][4] = 4; // a tie inside one chunk
  logits[3][3] = 4; // with k = 2: the k-th value 3.5 held by three tokens, two of them past the top-k list
  logits[3][100] = logits[3][500] = logits[3][900] = 3.5;
  // Direct: top-k keeps s ≥ the k-th largest; top-p ranks the survivors and keeps tokens while the
  // mass before them is < p, ties with the last kept value included.
  const want = (row: number[], k: number, p: number | undefined): boolean[] => {
    const sorted = [...row].sort((a, b) => b - a);
    const kth = sorted[k - 1];
    const survivors = sorted.filter((v) => v >= kth);
    if (p === undefined) return row.map((v) => v >= kth);
    const z = survivors.reduce((acc, v) => acc + Math.exp(v - sorted[0]), 0);
    let before = 0;
    let lowest = Infinity;
    for (const v of survivors) {
      if (before < p) lowest = v;
      before += Math.exp(v - sorted[0]) / z;
    }
    return row.map((v) => v >= lowest);
  };
  for (const [k, p] of [[1, undefined], [5, undefined], [20, undefined], [41, undefined], [20, 0.95], [20, 0.5], [5, 0.8], [41, 0.3], [2, 0.5], [2, 0.3]] as [number, number | undefined][]) {
    const got = await kept(logits, { topK: k, ...(p !== undefined ? { topP: p } : {}) });
    got.forEach((row, r) => expect([k, p, r, row]).toEqual([k, p, r, want(logits[r], k, p)]));
    if (p === undefined) expect(got.map((row) => row.filter(Boolean).length >= k)).toEqual(new Array(rows).fill(true));
  }
  // Which path ran: two TopKs over short rows (chunk maxima, then candidates) up to 41, one over V past it.
  const topKs = (k: number) => {
    const g = new L.Graph();
    filteredScores(g.input('logits', 'float32', ['B', V]), { topK: k });
    return g.nodes.filter((n) => n.op.name === 'TopK').map((n) => n.inputs[0]!.shape.at(-1));
  };
  expect(topKs(20)).toEqual([41, 20 * 32]);
  expect(topKs(42)).toEqual([V]);
});

test('top-p alone: one sort of the whole batch (static rows) equals a direct sort and the per-row sort (ties, dropped tokens, far-below scores)', async () => {
  const V = 300; // no chunk width divides it: top-k 5 below is one-stage, so its −∞ reach the nucleus
  const rows = 5;
  let seed = 11;
  const rand = () => ((seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31);
  const logits = Array.from({ length: rows }, (_, r) => Array.from({ length: V }, () => (r + 1) * 2 * (rand() - 0.5)));
  logits[0].fill(0.5, 40, 60); // a run of ties
  logits[1][7] = logits[1][200] = 6; // tied maxima
  logits[2][3] = 400; // the rest of the row lies far below (clamped keys)
  logits[3][5] = -1e30;
  const runBoth = async (o: SamplingOptions) => {
    const direct = await kept(logits, o); // 'B' symbolic: the per-row sort
    const g = new L.Graph();
    g.output(filteredScores(g.input('logits', 'float32', [rows, V]), o), 'scores');
    expect(g.nodes.filter((n) => n.op.name === 'TopK').map((n) => n.inputs[0]!.shape)).toEqual(o.topK ? [[rows, V], [1, rows * V]] : [[1, rows * V]]);
    const run = await compile(g);
    const out = await run({ logits: { data: Float32Array.from(logits.flat()), dims: [rows, V] } });
    return { direct, oneSort: rowsOf(out.scores).map((row) => row.map((x) => x > -Infinity)) };
  };
  // Direct: rank by score (ties by index), keep a token while the mass before it is < p.
  const want = (row: number[], p: number, k = 0): boolean[] => {
    const kth = k ? [...row].sort((a, b) => b - a)[k - 1] : -Infinity;
    const order = row.map((v, i) => ({ v: v >= kth ? v : -Infinity, i })).sort((a, b) => b.v - a.v || a.i - b.i);
    const z = order.reduce((acc, t) => acc + Math.exp(t.v - order[0].v), 0);
    const keep = new Array<boolean>(row.length).fill(false);
    let before = 0;
    for (const t of order) {
      if (before < p && t.v > -Infinity) keep[t.i] = true;
      before += Math.exp(t.v - order[0].v) / z;
    }
    return keep;
  };
  for (const o of [{ topP: 0.9 }, { topP: 0.3 }, { topP: 0.5, temperature: 0.7 }, { topP: 0.8, topK: 5 }] as SamplingOptions[]) {
    const { direct, oneSort } = await runBoth(o);
    const scaled = logits.map((row) => row.map((v) => v / (o.temperature ?? 1)));
    oneSort.forEach((row, r) => expect([o, r, row]).toEqual([o, r, want(scaled[r], o.topP!, o.topK)]));
    expect(oneSort).toEqual(direct);
  }
});

test('bad sampling options are rejected by name', () => {
  expect(() => validateSampling({ temperature: -1 }, 10)).toThrow(/temperature/);
  expect(() => validateSampling({ topK: 11 }, 10)).toThrow(/top_k/);
  expect(() => validateSampling({ topP: 0 }, 10)).toThrow(/top_p/);
  expect(() => validateSampling({ minP: 2 }, 10)).toThrow(/min_p/);
});

test('inverse-CDF sampling with host noise draws the filtered distribution (20,000 draws, χ² test, 3 seeds)', async () => {
  const probs = [0.02, 0.38, 0.25, 0.2, 0.1, 0.05];
  const V = probs.length;
  const R = 20000;
  const g = new L.Graph();
  const x = g.input('logits', 'float32', ['B', V]);
  const u = g.input('uniform', 'float32', ['B']);
  g.output(sampleNext(x, { topK: 5 }, u).tokens, 'tokens');
  const run = await compile(g);
  const logits = { data: Float32Array.from(Array.from({ length: R }, () => lg(probs)).flat()), dims: [R, V] };
  for (const seed of [1, 2, 3]) {
    const out = await run({ logits, uniform: { data: uniformNoise(seed, [...Array(R).keys()], 1), dims: [R] } });
    const counts = new Array(V).fill(0);
    for (const t of out.tokens.data) counts[Number(t)]++;
    expect(counts[0]).toBe(0); // removed by top-k
    const mass = 1 - probs[0];
    const chi2 = probs.slice(1).reduce((s, p, i) => s + (counts[i + 1] - (R * p) / mass) ** 2 / ((R * p) / mass), 0);
    // 4 degrees of freedom: P(χ² > 18.47) = 0.001.
    expect(chi2).toBeLessThan(18.47);
  }
});

test('host noise is uniform, reproducible, and distinct across seeds, keys and steps', () => {
  const a = uniformNoise(7, [0, 1, 2 ** 40], 4);
  expect(uniformNoise(7, [0, 1, 2 ** 40], 4)).toEqual(a);
  expect(new Set(a).size).toBe(a.length);
  expect(uniformNoise(8, [0], 1)[0]).not.toBe(a[0]);
  expect(uniformNoise(7, [2 ** 40 + 1], 1)[0]).not.toBe(a[8]);
  // Mean and variance of 100,000 draws: 1/2 and 1/12 within 4 standard errors.
  const u = uniformNoise(1, [...Array(1000).keys()], 100);
  const mean = u.reduce((s, x) => s + x, 0) / u.length;
  const variance = u.reduce((s, x) => s + (x - mean) ** 2, 0) / u.length;
  expect(Math.abs(mean - 0.5)).toBeLessThan(4 * Math.sqrt(1 / 12 / u.length));
  expect(Math.abs(variance - 1 / 12)).toBeLessThan(0.002);
  expect(Math.min(...u)).toBeGreaterThan(0);
  expect(Math.max(...u)).toBeLessThan(1);
});

test('host noise: every element is the per-element formula (the streams did not change when the hashes were hoisted); columns past `steps` of a wider buffer are 0', () => {
  // The formula as first written, one element at a time.
  const fold = (v: number) => hash32((v >>> 0) ^ hash32(Math.floor(v / 4294967296) + 0x9e3779b9));
  const reference = (seed: number, key: number, step: number) => ((hash32(fold(seed) ^ hash32(fold(key) ^ hash32(step + 0x632be5ab))) >>> 8) + 0.5) / 16777216;
  const keys = [0, 1, 65536 * 3 + 2, 2 ** 37 + 5, 2 ** 40 + 3, 123456789];
  for (const seed of [0, 11, -5, 2 ** 40 + 3]) {
    const wide = uniformNoise(seed, keys, 37, 50);
    const exact = uniformNoise(seed, keys, 37);
    keys.forEach((k, r) => {
      for (let t = 0; t < 50; t++) {
        const want = t < 37 ? Math.fround(reference(seed, k, t)) : 0;
        expect(wide[r * 50 + t]).toBe(want);
        if (t < 37) {
          expect(exact[r * 37 + t]).toBe(want);
          expect(uniformAt(seed, k, t)).toBe(reference(seed, k, t));
        }
      }
    });
  }
  // Pinned values of the stream (seed 0, key 0, steps 0–2).
  expect([0, 1, 2].map((t) => uniformAt(0, 0, t))).toEqual([0.116364985704422, 0.09470430016517639, 0.19944122433662415]);
  expect(() => uniformNoise(0, [0], 4, 3)).toThrow('width 3 is below steps 4');
});

test('firstArgMax equals the first maximum, one- and two-stage, ties included', async () => {
  for (const V of [256, 37]) { // two-stage (8 chunks of 32) and one-stage
    const g = new L.Graph('argmax');
    const x = g.input('x', 'float32', [3, V]);
    g.output(firstArgMax(x), 'i');
    const run = await compile(g);
    const data = new Float32Array(3 * V).map((_, i) => Math.sin(i * 1.7) * 3);
    data[5] = 9; data[V - 1] = 9; // row 0: a tie, the first wins
    data[V + V - 1] = 11; // row 1: the last position
    data[2 * V] = 7; // row 2: the first position
    const out = await run({ x: { data, dims: [3, V] } });
    expect(Array.from(out.i.data as BigInt64Array, Number)).toEqual([5, V - 1, 0]);
  }
});
