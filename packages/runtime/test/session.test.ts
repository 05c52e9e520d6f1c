import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import * as L from '@lathe/onnx';
import { Device, PlainSession, type HostTensor } from '@lathe/runtime';

const cpu = Device.cpu();

function rand(n: number, seed: number): Float32Array {
  let s = seed >>> 0;
  return Float32Array.from({ length: n }, () => ((s = (Math.imul(s, 1664525) + 1013904223) >>> 0) / 2 ** 32) * 2 - 1);
}

/** A graph touching the op families models use: matmul, softmax, gather, cumsum, reductions, where. */
function mixedGraph(): L.Graph {
  const g = new L.Graph('mixed');
  const x = g.input('x', 'float32', ['B', 8]);
  const w = g.input('w', 'float32', [8, 16]);
  const ids = g.input('ids', 'int64', ['B', 3]);
  const h = L.matmul(x, w).tanh();
  const p = L.softmax(h, -1);
  g.output(p, 'probs');
  g.output(L.gatherElements(p, ids, 1), 'picked');
  g.output(L.cumsum(h, 1), 'cumsum');
  g.output(L.where(L.greater(h, 0), h, L.mul(h, 0.1)).sum(), 'total');
  return g;
}

test('the binding path and the plain onnxruntime-node path give identical results', async () => {
  const g = mixedGraph();
  const feeds: Record<string, HostTensor> = {
    x: { data: rand(40, 1), dims: [5, 8] },
    w: { data: rand(128, 2), dims: [8, 16] },
    ids: { data: BigInt64Array.from({ length: 15 }, (_, i) => BigInt((i * 7) % 16)), dims: [5, 3] },
  };
  const plain = await PlainSession.create(g);
  const bound = cpu.compile(g);
  const a = await plain.run(feeds);
  const b = await bound.run(feeds);
  // device tensors as inputs too
  const w = cpu.upload(feeds.w);
  const c = await bound.run({ ...feeds, w });
  for (const k of ['probs', 'picked', 'cumsum', 'total']) {
    expect(b[k].dims).toEqual(a[k].dims);
    expect(Array.from(b[k].data as Float32Array)).toEqual(Array.from(a[k].data as Float32Array));
    expect(Array.from(c[k].data as Float32Array)).toEqual(Array.from(a[k].data as Float32Array));
  }
  w.dispose();
  await plain.dispose();
  bound.dispose();
});

test('bindings persist: rebinding one input re-runs with the others unchanged; outputs in place, allocated, or on the host', () => {
  const g = new L.Graph('axpy');
  const a = g.input('a', 'float32', []);
  const x = g.input('x', 'float32', ['N']);
  const y = g.input('y', 'float32', ['N']);
  g.output(L.add(L.mul(x, a), y), 'out');
  g.output(L.mul(x, a).sum(), 'sum');
  const s = cpu.compile(g);
  expect(s.inputs.map((i) => `${i.name}:${i.dtype}[${i.dims.join(',')}]`)).toEqual(['a:float32[]', 'x:float32[N]', 'y:float32[N]']);
  const xs = cpu.upload({ data: Float32Array.from([1, 2, 3]), dims: [3] });
  const ys = cpu.upload({ data: Float32Array.from([10, 20, 30]), dims: [3] });
  const out = cpu.empty('float32', [3]);
  const b = s.binding().input('a', { data: Float32Array.from([2]), dims: [] }).input('x', xs).input('y', ys).output('out', out).output('sum', 'host');
  b.runSync();
  expect(Array.from(out.download().data as Float32Array)).toEqual([12, 24, 36]);
  expect(b.scalar('sum')).toBe(12);
  b.input('a', { data: Float32Array.from([-1]), dims: [] }).runSync();
  expect(Array.from(out.download().data as Float32Array)).toEqual([9, 18, 27]);
  // double buffering: the output of one run becomes the input of the next
  const other = cpu.empty('float32', [3]);
  b.input('y', out).output('out', other).runSync();
  expect(Array.from(other.download().data as Float32Array)).toEqual([8, 16, 24]);
  b.output('out', 'device').runSync();
  const kept = b.take('out');
  b.runSync();
  expect(Array.from(kept.download().data as Float32Array)).toEqual([8, 16, 24]);
  expect(kept.device).toBe(cpu);
  for (const t of [xs, ys, out, other, kept]) t.dispose();
  s.dispose();
  expect(() => b.runSync()).toThrow(/disposed/);
});

test('binding errors name the session, the input and what was expected', () => {
  const g = new L.Graph('typed');
  const x = g.input('x', 'float32', ['B', 4]);
  g.output(x.mul(2), 'y');
  const s = cpu.compile(g);
  const b = s.binding();
  expect(() => b.input('nope', { data: new Float32Array(4), dims: [1, 4] })).toThrow(/session 'typed' has no input 'nope' \(inputs: x\)/);
  expect(() => b.input('x', { data: new Float32Array(3), dims: [1, 3] })).toThrow(/input 'x' has dims \[B, 4\], got \[1, 3\]/);
  expect(() => b.input('x', cpu.empty('int32', [1, 4]))).toThrow(/input 'x' is float32, got int32\[1, 4\]/);
  expect(() => b.input('x', { data: new Float32Array(4), dims: [4] })).toThrow(/rank 2/);
  expect(() => b.runSync()).toThrow(/unbound inputs 'x'/);
  s.dispose();
});

test('10,000 runs with rebinding, allocated outputs and host inputs keep memory flat', () => {
  const g = new L.Graph('churn');
  const x = g.input('x', 'float32', ['N']);
  const w = g.input('w', 'float32', ['N']);
  g.output(L.mul(x, w), 'y');
  g.output(L.add(x, w), 'z');
  const s = cpu.compile(g);
  const N = 64 * 1024; // 256 KB per tensor: a leak of one per run would be 2.5 GB
  const w1 = cpu.upload({ data: rand(N, 3), dims: [N] });
  const w2 = cpu.upload({ data: rand(N, 4), dims: [N] });
  const y = cpu.empty('float32', [N]);
  const host = { data: rand(N, 5), dims: [N] };
  const b = s.binding().output('y', y).output('z', 'device');
  const step = (i: number) => {
    b.input('x', host).input('w', i % 2 ? w1 : w2).runSync();
    if (i % 100 === 0) b.take('z').dispose();
  };
  setFlagsFromString('--expose-gc');
  const gc = runInNewContext('gc') as () => void;
  for (let i = 0; i < 3000; i++) step(i); // allocators reach their working set
  const tensors = cpu.memory().tensors;
  gc();
  const rss = process.memoryUsage().rss;
  for (let i = 0; i < 10000; i++) step(i);
  gc();
  const growth = process.memoryUsage().rss - rss;
  expect(cpu.memory().tensors).toBe(tensors);
  expect(growth).toBeLessThan(256 * 1024 * 1024); // one leaked 256 KB buffer per run would be 2.5 GB
  expect(Array.from((y.download().data as Float32Array).slice(0, 3))).toEqual(Array.from(host.data.slice(0, 3)).map((v, i) => Math.fround(v * (w1.download().data as Float32Array)[i])));
  b.dispose();
  for (const t of [w1, w2, y]) t.dispose();
  s.dispose();
});

test('a long run can be aborted through its signal', async () => {
  const g = new L.Graph('spin');
  const x = g.input('x', 'float32', [64, 64]);
  const [out] = L.loop([x], (_i, [c]) => ({ carried: [L.matmul(c, c).tanh()] }), { maxTrips: 100_000_000 });
  g.output(out, 'y');
  const s = cpu.compile(g);
  const b = s.binding().input('x', { data: rand(4096, 6), dims: [64, 64] }).output('y', 'host');
  const controller = new AbortController();
  setTimeout(() => controller.abort(), 200);
  const t0 = performance.now();
  await expect(b.run({ signal: controller.signal })).rejects.toThrow(/terminate/i);
  expect(performance.now() - t0).toBeLessThan(10_000);
  s.dispose();
});

test('async runs leave the event loop free and give the same result as sync runs', async () => {
  const g = mixedGraph();
  const s = cpu.compile(g);
  const feeds = { x: { data: rand(16, 7), dims: [2, 8] }, w: { data: rand(128, 8), dims: [8, 16] }, ids: { data: BigInt64Array.from([0n, 1n, 2n, 3n, 4n, 5n]), dims: [2, 3] } };
  const b = s.binding();
  for (const [k, v] of Object.entries(feeds)) b.input(k, v);
  b.output('probs', 'host');
  b.runSync();
  const sync = b.fetch('probs');
  for (let i = 0; i < 50; i++) await b.run();
  expect(b.fetch('probs')).toEqual(sync);
  s.dispose();
});

test('allocated outputs follow the input shapes from run to run', () => {
  const g = new L.Graph('rows');
  const x = g.input('x', 'float32', ['B', 3]);
  g.output(x.mul(2), 'y');
  const s = cpu.compile(g);
  const b = s.binding().output('y', 'device');
  for (const rows of [2, 4, 1]) {
    b.input('x', { data: new Float32Array(rows * 3).fill(1), dims: [rows, 3] }).runSync();
    expect(b.get('y').dims).toEqual([rows, 3]);
    expect(Array.from(b.fetch('y').data as Float32Array)).toEqual(new Array(rows * 3).fill(2));
  }
  s.dispose();
});

test('a CUDA-graph session is refused, naming the node, when a Concat would copy host tables on every run', () => {
  const g = new L.Graph('host-table');
  const x = g.input('x', 'float32', [4, 8]);
  g.output(L.concat([x, L.slice(x, [0], [0], [2])], 0), 'y');
  expect(() => cpu.compile(g, { cudaGraph: true })).toThrow(/cudaGraph: 'host-table' has 1 Concat\/Split node\(s\).*Concat_\d+ \(Concat of 2 parts\)/);
});
