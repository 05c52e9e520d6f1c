/**
 * The two-stage sampler against an exact inverse CDF computed on the host in float64: which token a
 * uniform picks, that a token of zero probability is never picked (whatever the rounding), and the
 * log-probs — on the one-stage form (no chunk width divides V) and on chunked vocabularies,
 * Qwen's 151,936 included. Also checks the built graphs: no reduction or prefix sum spans the whole
 * vocabulary in one stage.
 */
import * as L from '@lathe/onnx';
import { filteredScores, sampleNext, uniformNoise, vocabChunkWidth, type SamplingOptions } from '@lathe/rollout';
import { compile, rng } from '../../../tools/testing/ort-cpu';

/** The exact distribution of one row of scores (−∞ = filtered), in float64. */
interface Exact {
  p: number[];
  /** Cumulative probability up to and including each token. */
  through: number[];
  logp: number[];
}

function exact(scores: ArrayLike<number>): Exact {
  const s = Array.from(scores);
  const m = s.reduce((a, b) => Math.max(a, b), -Infinity);
  const w = s.map((x) => Math.exp(x - m));
  const z = w.reduce((a, b) => a + b, 0);
  let acc = 0;
  return { p: w.map((x) => x / z), through: w.map((x) => (acc += x) / z), logp: s.map((x) => x - m - Math.log(z)) };
}

/** The inverse CDF: the first token of positive probability whose cumulative probability reaches u. */
function exactPick(d: Exact, u: number): number {
  const i = d.through.findIndex((c, j) => d.p[j] > 0 && c >= u);
  return i >= 0 ? i : d.p.map((x, j) => (x > 0 ? j : -1)).reduce((a, b) => Math.max(a, b));
}

/** Whether u lies in token t's cumulative interval, widened by tol (float32 rounding of the sums). */
function inInterval(d: Exact, t: number, u: number, tol: number): boolean {
  return u >= d.through[t] - d.p[t] - tol && u <= d.through[t] + tol;
}

/** A float32 next to x (up or down). */
function f32Neighbour(x: number, dir: 1 | -1): number {
  const f = new Float32Array([x]);
  const bits = new Int32Array(f.buffer);
  bits[0] += dir * (f[0] > 0 ? 1 : -1);
  return f[0];
}

/** Compiles sampleNext for [B, V] and runs it on rows of logits with one uniform each. */
async function sampler(V: number, o: SamplingOptions) {
  const g = new L.Graph('sample');
  const x = g.input('logits', 'float32', ['B', V]);
  const u = g.input('uniform', 'float32', ['B']);
  const s = sampleNext(x, o, u);
  g.output(s.tokens, 'tokens');
  g.output(s.logprobs, 'logprobs');
  g.output(s.rawLogprobs, 'raw');
  // The one-stage formulation the sampler replaced: a full log-softmax, gathered.
  g.output(L.squeeze(L.gatherElements(L.logSoftmax(filteredScores(x, o), -1), L.unsqueeze(s.tokens, [1]), 1), [1]), 'oneStage');
  const run = await compile(g);
  return async (rows: Float32Array[], uniforms: Float32Array) => {
    const logits = new Float32Array(rows.length * V);
    rows.forEach((r, i) => logits.set(r, i * V));
    const out = await run({ logits: { data: logits, dims: [rows.length, V] }, uniform: { data: uniforms, dims: [rows.length] } });
    return {
      tokens: Array.from(out.tokens.data as BigInt64Array, Number),
      logprobs: Array.from(out.logprobs.data as Float32Array),
      raw: Array.from(out.raw.data as Float32Array),
      oneStage: Array.from(out.oneStage.data as Float32Array),
    };
  };
}

/** Random logits (normal × 2.5) with a share of −∞ (filtered) tokens, including runs and whole chunks. */
function randomLogits(V: number, seed: number, filtered: number): Float32Array {
  const r = rng(seed);
  const out = new Float32Array(V);
  for (let i = 0; i < V; i++) out[i] = 2.5 * Math.sqrt(-2 * Math.log(1 - r())) * Math.cos(2 * Math.PI * r());
  for (let i = 0; i < V; i++) if (r() < filtered) out[i] = -Infinity;
  const k = vocabChunkWidth(V);
  if (filtered > 0 && k < V) out.fill(-Infinity, 0, k); // a whole empty chunk at the start
  if (filtered > 0) out.fill(-Infinity, V - 3); // a filtered tail
  return out;
}

/**
 * Uniforms: `count` random ones (the host noise), then its smallest and largest values, then float32
 * values on and beside cumulative-probability boundaries.
 */
function uniformsFor(d: Exact, count: number, seed: number): number[] {
  const u = Array.from(uniformNoise(seed, [...Array(count).keys()], 1));
  u.push(0.5 / 2 ** 24, 1 - 0.5 / 2 ** 24); // the smallest and largest uniformAt can return
  const r = rng(seed + 1);
  const positive = d.p.map((p, i) => (p > 0 ? i : -1)).filter((i) => i >= 0);
  for (let j = 0; j < 6; j++) {
    const b = Math.fround(d.through[positive[Math.floor(r() * (positive.length - 1))]]);
    u.push(...[b, f32Neighbour(b, 1), f32Neighbour(b, -1)].filter((x) => x > 0 && x < 1));
  }
  return u;
}

const RANDOM_UNIFORMS = 200;

/**
 * Runs the sampler on distinct logits rows × their uniforms and checks every pick against the exact
 * inverse CDF; returns how many of the random-uniform picks disagreed with it. (A pick may
 * disagree only when u lies within float32 rounding of a boundary — where the crafted uniforms
 * sit on purpose, and a random one lands with probability about V·10⁻⁷.)
 */
async function checkAgainstExact(V: number, logitRows: Float32Array[], o: SamplingOptions, hostScores: (row: Float32Array) => number[], tol: number): Promise<{ picks: number; mismatches: number }> {
  const run = await sampler(V, o);
  const rows: Float32Array[] = [];
  const us: number[] = [];
  const random: boolean[] = [];
  const dists: Exact[] = [];
  const raws: Exact[] = [];
  logitRows.forEach((row, i) => {
    const d = exact(hostScores(row));
    const raw = exact(row);
    uniformsFor(d, RANDOM_UNIFORMS, 11 + i).forEach((u, j) => {
      random.push(j < RANDOM_UNIFORMS);
      rows.push(row);
      us.push(u);
      dists.push(d);
      raws.push(raw);
    });
  });
  const uniforms = Float32Array.from(us);
  const out = await run(rows, uniforms);
  let mismatches = 0;
  out.tokens.forEach((t, i) => {
    const d = dists[i];
    const u = uniforms[i];
    expect(t).toBeGreaterThanOrEqual(0);
    expect(t).toBeLessThan(V);
    // Never a filtered token; always one whose interval holds u up to float32 rounding.
    if (!(d.p[t] > 0) || !inInterval(d, t, u, tol)) throw new Error(`row ${i}: u = ${u} picked token ${t} (p = ${d.p[t]}), exact pick ${exactPick(d, u)}`);
    if (random[i] && t !== exactPick(d, u)) mismatches++;
    expect(Math.abs(out.logprobs[i] - d.logp[t])).toBeLessThan(1e-5);
    expect(Math.abs(out.raw[i] - raws[i].logp[t])).toBeLessThan(1e-5);
    expect(Math.abs(out.logprobs[i] - out.oneStage[i])).toBeLessThan(1e-5);
  });
  return { picks: random.filter((x) => x).length, mismatches };
}

test('the chunk width: the widest of 256…32 giving two or more chunks, else the whole vocabulary', () => {
  expect(vocabChunkWidth(151936)).toBe(128);
  expect(vocabChunkWidth(96)).toBe(32);
  expect(vocabChunkWidth(4096)).toBe(256);
  expect(vocabChunkWidth(256)).toBe(128);
  expect(vocabChunkWidth(37)).toBe(37);
  expect(vocabChunkWidth(48)).toBe(48);
});

test.each([
  ['one stage (V = 37)', 37, 4],
  ['3 chunks of 32 (V = 96)', 96, 4],
  ['16 chunks of 256 (V = 4096)', 4096, 3],
])('picks the exact inverse-CDF token, never a filtered one: %s', async (_, V, nRows) => {
  const rows = Array.from({ length: nRows }, (__, i) => randomLogits(V, 100 + i, i === 0 ? 0 : 0.3));
  const { picks, mismatches } = await checkAgainstExact(V, rows, { temperature: 1 }, (r) => Array.from(r), 2e-6);
  expect(picks).toBe(nRows * RANDOM_UNIFORMS);
  expect(mismatches).toBe(0);
});

test('temperature, top-k, top-p and min-p on a chunked vocabulary: the exact filtered distribution', async () => {
  const V = 1024;
  const rows = [randomLogits(V, 7, 0), randomLogits(V, 8, 0)];
  const host = (topK: number, minP: number) => (row: Float32Array) => {
    const s = Array.from(row, (x) => x / 0.7);
    const kth = [...s].sort((a, b) => b - a)[topK - 1];
    const kept = s.map((x) => (x >= kth ? x : -Infinity));
    const m = Math.max(...kept);
    return kept.map((x) => (Math.exp(x - m) >= minP ? x : -Infinity));
  };
  expect((await checkAgainstExact(V, rows, { temperature: 0.7, topK: 300 }, host(300, 0), 2e-6)).mismatches).toBe(0);
  expect((await checkAgainstExact(V, rows, { temperature: 0.7, minP: 0.02 }, host(V, 0.02), 2e-6)).mismatches).toBe(0);
  // top-p: keep a token when the mass of the more likely ones is below p (its prefix sum is chunked).
  const nucleus = (row: Float32Array) => {
    const s = Array.from(row, (x) => x / 0.7);
    const d = exact(s);
    const order = s.map((_, i) => i).sort((a, b) => s[b] - s[a]);
    const kept = new Array<number>(V).fill(-Infinity);
    let before = 0;
    for (const i of order) {
      if (before < 0.8) kept[i] = s[i];
      before += d.p[i];
    }
    return kept;
  };
  expect((await checkAgainstExact(V, rows, { temperature: 0.7, topP: 0.8 }, nucleus, 2e-6)).mismatches).toBe(0);
});

test("Qwen's vocabulary (151,936 = 1,187 chunks of 128): exact picks and log-probs", async () => {
  const V = 151936;
  const rows = [randomLogits(V, 1, 0), randomLogits(V, 2, 0.5)];
  const run = await sampler(V, { temperature: 1 });
  const dists = rows.map((r) => exact(r));
  const us = [0.5 / 2 ** 24, 0.013, 0.25, 0.5, 0.77, 0.999, 1 - 0.5 / 2 ** 24];
  const out = await run(rows.flatMap((r) => us.map(() => r)), Float32Array.from(rows.flatMap(() => us)));
  out.tokens.forEach((t, i) => {
    const d = dists[Math.floor(i / us.length)];
    const u = Math.fround(us[i % us.length]);
    expect(d.p[t]).toBeGreaterThan(0);
    expect(inInterval(d, t, u, 1e-5)).toBe(true);
    expect(t).toBe(exactPick(d, u)); // none of these u sits within rounding of a boundary
    expect(Math.abs(out.logprobs[i] - d.logp[t])).toBeLessThan(1e-5);
    expect(Math.abs(out.logprobs[i] - out.oneStage[i])).toBeLessThan(1e-5);
  });
});

test('crafted edges: empty chunks, filtered runs, u at 0, 1 and on a boundary before a filtered run', async () => {
  for (const V of [96, 37]) {
    const row = new Float32Array(V).fill(-Infinity);
    const first = V === 96 ? 41 : 5;
    const lastOfRun = V === 96 ? 60 : 12; // a positive token followed by filtered ones
    const nextRun = V === 96 ? 64 : 20;
    const last = V - 6;
    for (let i = first; i <= lastOfRun; i++) row[i] = Math.sin(i) * 2;
    for (let i = nextRun; i <= last; i++) row[i] = Math.cos(i) * 2;
    const d = exact(row);
    const boundary = Math.fround(d.through[lastOfRun]);
    const us = [0, 0.5 / 2 ** 24, 1 - 0.5 / 2 ** 24, 1, boundary - 1e-4, boundary + 1e-4, boundary, f32Neighbour(boundary, 1), f32Neighbour(boundary, -1)];
    const out = await (await sampler(V, { temperature: 1 }))(us.map(() => row), Float32Array.from(us));
    expect(out.tokens.slice(0, 6)).toEqual([first, first, last, last, lastOfRun, nextRun]);
    // On the boundary (within float32 rounding of it): the token before or after the filtered
    // run, never one inside it.
    for (const t of out.tokens.slice(6)) expect([lastOfRun, nextRun]).toContain(t);
    out.tokens.forEach((t, i) => expect(out.logprobs[i]).toBeCloseTo(d.logp[t], 5));
  }
  // A single sampleable token is picked for any u.
  const V = 64;
  const one = new Float32Array(V).fill(-Infinity);
  one[33] = 3;
  const out = await (await sampler(V, { temperature: 1 }))([one, one, one], Float32Array.from([0, 0.5, 1]));
  expect(out.tokens).toEqual([33, 33, 33]);
  expect(out.logprobs).toEqual([0, 0, 0]);
});

test('two-stage sampling draws the distribution (χ², 20,000 draws over 2 chunks)', async () => {
  const V = 64;
  const probs = new Array<number>(V).fill(0);
  // Mass on both sides of the chunk boundary at 32, with zero-probability tokens between.
  Object.assign(probs, { 3: 0.1, 30: 0.2, 31: 0.05, 32: 0.25, 40: 0.3, 63: 0.1 });
  const row = Float32Array.from(probs, Math.log);
  const R = 20000;
  const out = await (await sampler(V, { temperature: 1 }))(new Array(R).fill(row), uniformNoise(5, [...Array(R).keys()], 1));
  const counts = new Array<number>(V).fill(0);
  for (const t of out.tokens) counts[t]++;
  const support = probs.map((p, i) => (p > 0 ? i : -1)).filter((i) => i >= 0);
  expect(counts.reduce((a, c, i) => a + (probs[i] > 0 ? 0 : c), 0)).toBe(0);
  const chi2 = support.reduce((s, i) => s + (counts[i] - R * probs[i]) ** 2 / (R * probs[i]), 0);
  expect(chi2).toBeLessThan(20.52); // 5 degrees of freedom: P(χ² > 20.52) = 0.001
});

/** Lengths of the axes each reduction, prefix sum, softmax or window max in the graph runs over. */
function reducedAxisLengths(g: L.Graph): { op: string; length: number }[] {
  const out: { op: string; length: number }[] = [];
  for (const n of g.nodes) {
    const shape = n.inputs[0]?.shape ?? [];
    if (n.op.name === 'MaxPool') {
      out.push({ op: 'MaxPool', length: (n.attrs as { k: number }).k });
      continue;
    }
    const axesOf = (a: { axes?: number[]; axis?: number }) => a.axes ?? (a.axis !== undefined ? [a.axis] : []);
    if (!/^(Reduce|ArgM|CumSum|Softmax|LogSoftmax|TopK)/.test(n.op.name)) continue;
    for (const a of axesOf(n.attrs as { axes?: number[]; axis?: number })) {
      const d = shape[a < 0 ? shape.length + a : a];
      out.push({ op: n.op.name, length: typeof d === 'number' ? d : Infinity });
    }
  }
  return out;
}

test('over a 151,936-token vocabulary no sampling reduction or scan covers more than 1,187 elements in one stage (LogSoftmax, one row-wise kernel, aside), and no shape arithmetic lands on the CPU', () => {
  const cases: [SamplingOptions, number][] = [
    // [options, LogSoftmax kernels expected]: greedy and the raw log-prob of a tempered sample take
    // theirs from one LogSoftmax; a temperature-1 sample needs none (its masses give the log-prob).
    [{ temperature: 0 }, 1],
    [{ temperature: 1 }, 0],
    [{ temperature: 0.6 }, 1],
    [{ temperature: 0.8, minP: 0.05 }, 1],
  ];
  for (const [o, logSoftmaxes] of cases) {
    const g = new L.Graph('sample');
    const x = g.input('logits', 'float32', ['B', 151936]);
    const s = sampleNext(x, o, g.input('uniform', 'float32', ['B']));
    g.output(s.tokens, 'tokens');
    g.output(s.logprobs, 'logprobs');
    g.output(s.rawLogprobs, 'raw');
    const lengths = reducedAxisLengths(g);
    const staged = lengths.filter((l) => l.op !== 'LogSoftmax');
    expect(staged.length).toBeGreaterThan(2);
    expect(Math.max(...staged.map((l) => l.length))).toBe(1187);
    expect(staged.filter((l) => l.op === 'MaxPool').map((l) => l.length)).toEqual(expect.arrayContaining([128]));
    expect(lengths.filter((l) => l.op === 'LogSoftmax')).toEqual(new Array(logSoftmaxes).fill({ op: 'LogSoftmax', length: 151936 }));
    expect(L.runtimeShapeNodes(g).map((n) => n.name)).toEqual([]);
  }
});
