import * as L from '@lathe/onnx';
import { Device, type HostTensor } from '@lathe/runtime';
import { kernelRegion, regionOf, segmentGraph, splitGraph, SplitProgram, type KernelImpl } from '@lathe/kernels';

const names = (ts: L.Tensor[]) => ts.map((t) => t.name);

/**
 * x → a = 2x → [kernel 'triple': b = 3a] → c = b + x + k;  d = x + 1 (independent, built after the
 * region); outputs a, c, d. k is a constant read by two segments.
 */
function example() {
  const g = new L.Graph('example');
  const x = g.input('x', 'float32', ['n']);
  const k = g.constant(Float32Array.of(0.5), 'float32', []);
  const a = L.mul(L.add(x, k), 2);
  const b = kernelRegion(g, 'triple', () => L.mul(a, 3));
  const c = L.add(L.add(b, x), k);
  const d = L.add(x, 1);
  g.output(a, 'a');
  g.output(c, 'c');
  g.output(d, 'd');
  return { g, x, a, b, c, d };
}

test('a region is marked in node names; nodes outside have no region', () => {
  const { g } = example();
  const marked = g.nodes.map(regionOf).filter(Boolean);
  expect(marked).toEqual([{ key: 'kernel:triple', kernel: 'triple' }]);
  const g2 = new L.Graph('nested');
  const y = g2.scope('layer3', () => kernelRegion(g2, 'flash', () => L.neg(g2.input('y', 'float32', [2]))));
  expect(regionOf(y.node!)).toEqual({ key: 'layer3/kernel:flash', kernel: 'flash' });
  expect(() => kernelRegion(g2, 'bad/name', () => 0)).toThrow(/must be letters/);
});

test('split: one segment before the kernel (with the independent node), the kernel, one segment after; boundaries by name', () => {
  const { g, a, b, c, d } = example();
  const steps = splitGraph(g);
  expect(steps.map((s) => s.kind)).toEqual(['ort', 'kernel', 'ort']);
  const [s0, k, s1] = steps;
  expect(names(s0.inputs)).toEqual(['x']);
  expect(s0.outputs).toEqual([a, d]);
  expect(k.kind === 'kernel' && k.kernel).toBe('triple');
  expect(k.inputs).toEqual([a]);
  expect(k.outputs).toEqual([b]);
  expect(s1.inputs.map((t) => t === b || t.name === 'x')).toEqual([true, true]);
  expect(s1.outputs).toEqual([c]);
  // the constant is copied into both segments, never a boundary
  for (const s of steps) expect(s.inputs.every((t) => !g.initializers.has(t.name))).toBe(true);
});

test('segments compiled on their own and chained with the kernel (emulated on the host) give the whole graph\'s outputs', async () => {
  const { g } = example();
  const cpu = Device.cpu();
  const x: HostTensor = { data: Float32Array.of(1, -2, 3.5), dims: [3] };
  const whole = cpu.compile(g);
  const expected = await whole.run({ x });
  whole.dispose();
  const values = new Map<string, HostTensor>([['x', x]]);
  splitGraph(g).forEach((step, i) => {
    if (step.kind === 'kernel') {
      // what the 'triple' kernel computes
      const a = values.get(step.inputs[0].name)!;
      values.set(step.outputs[0].name, { data: Float32Array.from(a.data as Float32Array, (v) => v * 3), dims: a.dims });
      return;
    }
    const s = cpu.compile(segmentGraph(g, step, `segment${i}`));
    const b = s.binding();
    for (const t of step.inputs) b.input(t.name, values.get(t.name)!);
    for (const t of step.outputs) b.output(t.name, 'host');
    b.runSync();
    for (const t of step.outputs) values.set(t.name, b.fetch(t.name));
    b.dispose();
    s.dispose();
  });
  for (const n of ['a', 'c', 'd']) expect(Array.from(values.get(n)!.data as Float32Array)).toEqual(Array.from(expected[n].data as Float32Array));
});

test('two regions in sequence with ORT work between them, and dead nodes dropped', () => {
  const g = new L.Graph('two');
  const x = g.input('x', 'float32', [4]);
  const p = kernelRegion(g, 'k1', () => L.exp(x));
  L.sqrt(x); // dead: no output reads it
  const q = L.add(p, 1);
  const r = kernelRegion(g, 'k2', () => L.mul(q, q));
  g.output(r, 'r');
  const steps = splitGraph(g);
  expect(steps.map((s) => (s.kind === 'kernel' ? s.kernel : 'ort'))).toEqual(['k1', 'ort', 'k2']);
  expect(steps.flatMap((s) => s.nodes).length).toBe(3);
  expect(steps[2].outputs).toEqual([r]);
});

test('a region that reads itself through a node outside it is refused, naming the region', () => {
  const g = new L.Graph('loop');
  const x = g.input('x', 'float32', [4]);
  const p = kernelRegion(g, 'k', () => L.exp(x));
  const q = L.add(p, 1);
  const r = kernelRegion(g, 'k', () => L.mul(q, p));
  g.output(r, 'r');
  expect(() => splitGraph(g)).toThrow("splitGraph: region(s) 'kernel:k' of graph 'loop' read a value computed outside the region");
});

test('SplitProgram: segments as bound runs around a kernel implementation, rerun with new feeds, equal to the whole graph', async () => {
  const { g } = example();
  const cpu = Device.cpu();
  let launches = 0;
  // the 'triple' kernel, done on the host (a CUDA implementation would launch on the device's stream)
  const triple: KernelImpl = ([a]) => {
    launches++;
    return [cpu.upload({ data: Float32Array.from(a.download().data as Float32Array, (v) => v * 3), dims: [...a.dims] })];
  };
  const program = SplitProgram.compile(cpu, g, { triple });
  const whole = cpu.compile(g);
  for (const data of [Float32Array.of(1, -2, 3.5), Float32Array.of(0.25, 8, -1, 4, 2)]) {
    const x = { data, dims: [data.length] };
    const got = program.run({ x });
    const want = await whole.run({ x });
    for (const n of ['a', 'c', 'd']) expect(Array.from(got[n].download().data as Float32Array)).toEqual(Array.from(want[n].data as Float32Array));
  }
  expect(launches).toBe(2);
  whole.dispose();
  program.dispose();
  expect(() => SplitProgram.compile(cpu, g, {})).toThrow("SplitProgram: graph 'example' has region(s) of kernel(s) triple without an implementation (given: none)");
});
