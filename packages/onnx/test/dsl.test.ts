import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import * as ort from 'onnxruntime-node';
import * as L from '@lathe/onnx';
import { compile } from '../../../tools/testing/ort-cpu';

const f32 = (xs: number[]) => Float32Array.from(xs);

describe('symbolic dims', () => {
  test('reshapes through B*T and back, checked at build time and correct at run time for any B, T', async () => {
    const g = new L.Graph();
    const x = g.input('x', 'float32', ['B', 'T', 4]);
    const flat = x.reshape(['B*T', 4]);
    expect(flat.shape).toEqual(['B*T', 4]);
    const back = flat.mul(2).reshape(['B', 'T', 2, 2]);
    expect(back.shape).toEqual(['B', 'T', 2, 2]);
    const m = back.mean([1, 2, 3]); // divides by a count read at run time
    g.output(m, 'm');
    const run = await compile(g);
    for (const [B, T] of [
      [1, 3],
      [3, 2],
    ]) {
      const data = Float32Array.from({ length: B * T * 4 }, (_, i) => i);
      const out = await run({ x: { data, dims: [B, T, 4] } });
      expect(out.m.dims).toEqual([B]);
      for (let b = 0; b < B; b++) {
        let s = 0;
        for (let i = 0; i < T * 4; i++) s += 2 * data[b * T * 4 + i];
        expect(out.m.data[b]).toBeCloseTo(s / (T * 4), 4);
      }
    }
  });

  test('a reshape that loses elements is rejected at build time', () => {
    const g = new L.Graph();
    const x = g.input('x', 'float32', ['B', 6]);
    expect(() => x.reshape(['B', 4])).toThrow(/Reshape: cannot reshape \[B, 6\] \(6\*B elements\) into \[B, 4\]/);
  });

  test('broadcasting distinct symbolic dims is an error; dtype mixing needs a cast', () => {
    const g = new L.Graph();
    const a = g.input('a', 'float32', ['B', 3]);
    const b = g.input('b', 'float32', ['T', 3]);
    const c = g.input('c', 'float16', ['B', 3]);
    expect(() => a.add(b)).toThrow(/Add: shapes \[B, 3\] and \[T, 3\] do not broadcast/);
    expect(() => a.add(c)).toThrow(/Add: dtypes differ \(float32 vs float16\); cast explicitly/);
  });

  test('causal mask and masked softmax over a symbolic sequence length', async () => {
    const g = new L.Graph();
    const s = g.input('s', 'float32', ['T', 'T']);
    const p = L.maskedSoftmax(s, L.causalMask(s));
    g.output(p, 'p');
    const out = await (await compile(g))({ s: { data: new Float32Array(9), dims: [3, 3] } });
    expect(Array.from(out.p.data as Float32Array).map((v) => +v.toFixed(4))).toEqual([1, 0, 0, 0.5, 0.5, 0, 0.3333, 0.3333, 0.3333]);
  });
});

describe('non-differentiable ops compute what they say', () => {
  test('comparisons, logic, argmax, topk indices, one-hot, arange, cumsum', async () => {
    const g = new L.Graph();
    const x = g.input('x', 'float32', [2, 3]);
    g.output(x.gt(0).and(x.lt(2)).cast('int32'), 'between');
    g.output(x.argmax(1), 'argmax');
    g.output(L.topK(x, 2, 1)[1], 'top2');
    g.output(L.oneHot(x.argmax(1), 3, 'float32'), 'onehot');
    g.output(L.arange(4, 'int64', x), 'range');
    g.output(L.cumsum(x, 1, { exclusive: true }), 'excl');
    const out = await (await compile(g))({ x: { data: f32([3, 1, -1, 0.5, 2.5, 1.5]), dims: [2, 3] } });
    expect(Array.from(out.between.data as Int32Array)).toEqual([0, 1, 0, 1, 0, 1]);
    expect(Array.from(out.argmax.data as BigInt64Array, Number)).toEqual([0, 1]);
    expect(Array.from(out.top2.data as BigInt64Array, Number)).toEqual([0, 1, 1, 2]);
    expect(Array.from(out.onehot.data as Float32Array)).toEqual([1, 0, 0, 0, 1, 0]);
    expect(Array.from(out.range.data as BigInt64Array, Number)).toEqual([0, 1, 2, 3]);
    expect(Array.from(out.excl.data as Float32Array)).toEqual([0, 3, 4, 0, 0.5, 3]);
  });

  test('window max: each window\'s maximum and the flattened index of its first maximum', async () => {
    const g = new L.Graph();
    const x = g.input('x', 'float32', [2, 1, 7]);
    const [values, index] = L.windowMaxWithIndex(x, 3);
    expect(values.shape).toEqual([2, 1, 2]); // ⌊7 / 3⌋ windows; the 7th element is in none
    g.output(values, 'values');
    g.output(index, 'index');
    g.output(L.windowMax(x, 3), 'plain');
    const x4 = g.input('x4', 'float32', [1, 1, 2, 4]); // [N, C, H, W], pooled 1 × k along W
    g.output(L.windowMax(x4, 2), 'pooled4');
    // Row 0: windows [4, 9, 9] (a tie: the first wins) and [−1, −5, −1]; row 1: [0, 0, 0], [2, 8, 1].
    const data = f32([4, 9, 9, -1, -5, -1, 100, 0, 0, 0, 2, 8, 1, 7]);
    const out = await (await compile(g))({ x: { data, dims: [2, 1, 7] }, x4: { data: f32([1, 5, 2, 3, 9, 0, 4, 8]), dims: [1, 1, 2, 4] } });
    expect(out.pooled4.dims).toEqual([1, 1, 2, 2]);
    expect(Array.from(out.pooled4.data as Float32Array)).toEqual([5, 3, 9, 8]);
    expect(Array.from(out.values.data as Float32Array)).toEqual([9, -1, 0, 8]);
    expect(Array.from(out.plain.data as Float32Array)).toEqual([9, -1, 0, 8]);
    expect(Array.from(out.index.data as BigInt64Array, Number)).toEqual([1, 3, 7, 11]);
    expect(() => L.windowMax(g.input('w', 'float32', [2, 1, 'W']), 3)).toThrow(/static/);
    expect(() => L.windowMax(g.input('n', 'float32', [2, 2]), 2)).toThrow(/\[N, C, W\]/);
  });

  test('lastAxisMax and logSumExp over a long axis: two stages (MaxPool windows, then across), same values', async () => {
    const g = new L.Graph();
    const x3 = g.input('x3', 'float32', ['B', 'T', 256]); // two symbolic leading dims: the result's shape is read at run time
    const x2 = g.input('x2', 'float32', ['B', 96]);
    g.output(L.lastAxisMax(x3), 'max3');
    g.output(L.lastAxisMax(x2), 'max2');
    g.output(L.logSumExp(x3, -1), 'lse3');
    expect(g.nodes.filter((n) => n.op.name === 'MaxPool').map((n) => (n.attrs as { k: number }).k)).toEqual([128, 32, 128]);
    expect(g.nodes.filter((n) => n.op.name === 'ReduceMax').every((n) => n.inputs[0]!.shape.at(-1) === 2 || n.inputs[0]!.shape.at(-1) === 3)).toBe(true);
    expect(L.runtimeShapeNodes(g)).toEqual([]);
    const r = (n: number) => Float32Array.from({ length: n }, (_, i) => Math.sin(i * 12.9898) * 40);
    const a = r(3 * 2 * 256);
    const b = r(3 * 96);
    const out = await (await compile(g))({ x3: { data: a, dims: [3, 2, 256] }, x2: { data: b, dims: [3, 96] } });
    const rowsOf = (d: Float32Array, w: number) => Array.from({ length: d.length / w }, (_, i) => Array.from(d.subarray(i * w, (i + 1) * w)));
    expect(Array.from(out.max3.data as Float32Array)).toEqual(rowsOf(a, 256).map((row) => Math.max(...row)));
    expect(Array.from(out.max2.data as Float32Array)).toEqual(rowsOf(b, 96).map((row) => Math.max(...row)));
    expect(out.max3.dims).toEqual([3, 2, 1]);
    expect(out.max2.dims).toEqual([3, 1]);
    rowsOf(a, 256).forEach((row, i) => {
      const m = Math.max(...row);
      expect((out.lse3.data as Float32Array)[i]).toBeCloseTo(m + Math.log(row.reduce((s, v) => s + Math.exp(v - m), 0)), 4);
    });
  });

  test('random uniform stays in range; multinomial follows the distribution', async () => {
    const g = new L.Graph();
    const logits = g.input('logits', 'float32', [1, 3]);
    const noise = L.randomUniformLike(L.expand(logits, [1000, 3]), { low: 2, high: 3, seed: 7 });
    g.output(noise, 'noise');
    g.output(L.multinomial(logits, 6000, { seed: 3 }), 'samples');
    const p = [0.2, 0.5, 0.3];
    const out = await (await compile(g))({ logits: { data: f32(p.map(Math.log)), dims: [1, 3] } });
    const u = out.noise.data as Float32Array;
    expect(Math.min(...u)).toBeGreaterThanOrEqual(2);
    expect(Math.max(...u)).toBeLessThan(3);
    const counts = [0, 0, 0];
    for (const s of out.samples.data as BigInt64Array) counts[Number(s)]++;
    counts.forEach((c, i) => expect(Math.abs(c / 6000 - p[i])).toBeLessThan(0.03));
  });
});

describe('control flow', () => {
  test('loop with carried values and scan outputs', async () => {
    const g = new L.Graph();
    const x = g.input('x', 'float32', [2]);
    const [final, scans] = L.loop([x], (_i, [c]) => {
      const next = c.mul(2);
      return { carried: [next], scans: [next.sum()] };
    }, { maxTrips: 3 });
    g.output(final, 'final');
    g.output(scans, 'scans');
    const out = await (await compile(g))({ x: { data: f32([1, 2]), dims: [2] } });
    expect(Array.from(out.final.data as Float32Array)).toEqual([8, 16]);
    expect(Array.from(out.scans.data as Float32Array)).toEqual([6, 12, 24]);
  });

  test('loop stopping on a condition, reading an outer value and the iteration counter', async () => {
    const g = new L.Graph();
    const limit = g.input('limit', 'float32', []);
    const step = g.input('step', 'float32', []);
    const [sum, iters] = L.loop([g.constant(0, 'float32', []), g.constant(0, 'int64', [])], (i, [s]) => {
      const next = s.add(step); // `step` comes from the enclosing graph
      return { carried: [next, i.add(1)], cond: next.lt(limit) };
    }, { maxTrips: 100 });
    g.output(sum, 'sum');
    g.output(iters, 'iters');
    const out = await (await compile(g))({ limit: { data: f32([10]), dims: [] }, step: { data: f32([3]), dims: [] } });
    expect(out.sum.data[0]).toBe(12);
    expect(Number(out.iters.data[0])).toBe(4);
  });

  test('if/else picks a branch at run time', async () => {
    const g = new L.Graph();
    const x = g.input('x', 'float32', [2]);
    const [y] = L.ifElse(x.sum().gt(0), () => [x.mul(10)], () => [x.neg()]);
    g.output(y, 'y');
    const run = await compile(g);
    expect(Array.from((await run({ x: { data: f32([1, 2]), dims: [2] } })).y.data as Float32Array)).toEqual([10, 20]);
    expect(Array.from((await run({ x: { data: f32([-1, -2]), dims: [2] } })).y.data as Float32Array)).toEqual([1, 2]);
  });
});

describe('serialization', () => {
  test('initializers can live in an external file at (location, offset, length)', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'lathe-ext-'));
    // A file with a 16-byte header before the weights, as in safetensors.
    const weights = f32([1, 2, 3, 4, 5, 6]);
    const file = Buffer.concat([Buffer.alloc(16, 7), Buffer.from(weights.buffer)]);
    writeFileSync(join(dir, 'weights.bin'), file);
    const g = new L.Graph();
    const x = g.input('x', 'float32', ['B', 2]);
    const w = g.initializer('w', 'float32', [2, 3], { kind: 'external', location: 'weights.bin', offset: 16, length: 24 });
    g.output(L.matmul(x, w), 'y');
    writeFileSync(join(dir, 'model.onnx'), L.toModelBytes(g));
    const session = await ort.InferenceSession.create(join(dir, 'model.onnx'));
    const out = await session.run({ x: new ort.Tensor('float32', f32([1, 1]), [1, 2]) });
    expect(Array.from(out.y.data as Float32Array)).toEqual([5, 7, 9]);
  });

  test('models round-trip through the protobuf codec', () => {
    const g = new L.Graph('roundtrip');
    const x = g.input('x', 'float32', ['B', 3]);
    g.output(x.softmax(-1), 'y');
    const decoded = L.decodeModelProto(L.toModelBytes(g, { metadata: { source: 'test' } }));
    expect(decoded.irVersion).toBe(L.IR_VERSION);
    expect(decoded.opsetImport[0].version).toBe(L.OPSET);
    expect(decoded.graph.node.map((n) => n.opType)).toEqual(['Softmax']);
    expect(decoded.graph.input[0].type?.tensorType?.shape?.dim).toEqual([{ dimParam: 'B' }, { dimValue: 3 }]);
    expect(decoded.metadataProps).toEqual([{ key: 'source', value: 'test' }]);
  });

  test('node names carry the scope they were built in', () => {
    const g = new L.Graph();
    const x = g.input('x', 'float32', [2]);
    const y = g.scope('layer0', () => g.scope('mlp', () => x.exp()));
    expect(y.node!.name).toMatch(/^layer0\/mlp\/Exp_\d+$/);
  });
});

describe('Expand folded into a broadcasting operand', () => {
  test("log-sum-exp's backward multiplies the [B, T, 1] gradient by exp's output with no Expand written", async () => {
    const g = new L.Graph();
    const x = g.input('x', 'float32', ['B', 3, 5]);
    const w = g.input('w', 'float32', ['B', 3]);
    const lse = L.logSumExp(x, -1);
    g.output(lse, 'lse');
    const [dx] = L.grad(L.reduceSum(L.mul(lse, w)), [x]);
    g.output(dx!, 'dx');
    const live = L.toModelProto(g).graph!.node!.map((n) => n.opType);
    expect(live).not.toContain('Expand');
    const run = await compile(g);
    const data = Float32Array.from({ length: 2 * 15 }, (_, i) => Math.sin(i));
    const weights = f32([1, 2, 3, -1, 0.5, 4]);
    const out = await run({ x: { data, dims: [2, 3, 5] }, w: { data: weights, dims: [2, 3] } });
    expect(out.dx.dims).toEqual([2, 3, 5]);
    // d Σ w·lse / dx = w · softmax(x) over the last axis
    for (let r = 0; r < 6; r++) {
      const row = Array.from(data.slice(r * 5, r * 5 + 5));
      const z = row.reduce((s, v) => s + Math.exp(v), 0);
      row.forEach((v, j) => expect(out.dx.data[r * 5 + j]).toBeCloseTo((weights[r] * Math.exp(v)) / z, 6));
    }
  });

  test('two expanded operands are not both unfolded when their sources would broadcast to less', async () => {
    const g = new L.Graph();
    const a = g.input('a', 'float32', [2, 1]);
    const c = g.input('c', 'float32', [2, 1]);
    const y = L.mul(L.expand(a, [2, 3]), L.expand(c, [2, 3]));
    expect(y.shape).toEqual([2, 3]);
    g.output(y, 'y');
    const run = await compile(g);
    const out = await run({ a: { data: f32([1, 2]), dims: [2, 1] }, c: { data: f32([3, 4]), dims: [2, 1] } });
    expect(out.y.dims).toEqual([2, 3]);
    expect(Array.from(out.y.data as Float32Array)).toEqual([3, 3, 3, 8, 8, 8]);
  });
});

test('hostTableNodes: Concat/Split with unequal, symbolic or more than 32 parts along the axis', () => {
  const g = new L.Graph();
  const x = g.input('x', 'float32', [4, 8]);
  const y = g.input('y', 'float32', ['T', 8]);
  const equal = L.concat([x, x, x], 0);
  const unequal = L.concat([x, L.slice(x, [0], [0], [2])], 0);
  const symbolic = L.concat([x, y], 0);
  const many = L.concat(Array.from({ length: 33 }, () => x), 1);
  const equalSplit = L.split(x, [4, 4], 1);
  const unequalSplit = L.split(x, [3, 5], 1);
  [equal, unequal, symbolic, many, ...equalSplit, ...unequalSplit].forEach((t, i) => g.output(t, `o${i}`));
  const flagged = new Set(L.hostTableNodes(g));
  const producer = (t: L.Tensor) => t.node!;
  expect([equal, unequal, symbolic, many, equalSplit[0], unequalSplit[0]].map((t) => flagged.has(producer(t)))).toEqual([false, true, true, true, false, true]);
});
