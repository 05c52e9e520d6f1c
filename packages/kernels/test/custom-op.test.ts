import * as koffi from 'koffi';
import * as L from '@lathe/onnx';
import { Device } from '@lathe/runtime';
import { CustomOpDomain } from '@lathe/kernels';

test('a custom op whose compute is a JavaScript callback runs as a node of an ORT session (CPU)', () => {
  const domain = new CustomOpDomain('lathe.test');
  let calls = 0;
  domain.add({
    name: 'Triple',
    inputs: ['float32'],
    outputs: ['float32'],
    provider: 'cpu',
    compute: (ctx) => {
      calls++;
      const [x] = ctx.inputs;
      const n = x.dims.reduce((a, b) => a * b, 1);
      const values = koffi.decode(x.data, 'float', n) as number[];
      const out = ctx.output(0, x.dims);
      koffi.encode(out, 'float', values.map((v) => v * 3), n);
    },
  });
  const g = new L.Graph('custom');
  const x = g.input('x', 'float32', ['n']);
  const [t] = domain.node('Triple', [L.add(x, 1)]);
  g.output(L.sub(t, x), 'y');
  const cpu = Device.cpu();
  const s = cpu.compile(g, { customOpDomains: [domain.handle] });
  for (const data of [Float32Array.of(1, 2, -4), Float32Array.of(0.5, 7)]) {
    const b = s.binding().input('x', { data, dims: [data.length] }).output('y', 'host');
    b.runSync();
    domain.check();
    // y = 3·(x + 1) − x
    expect(Array.from(b.fetch('y').data as Float32Array)).toEqual(Array.from(data, (v) => 3 * (v + 1) - v));
    b.dispose();
  }
  expect(calls).toBe(2);
  s.dispose();
  domain.dispose();
});

test("a compute that throws does not cross into ORT: the error comes back from check(), naming the domain", () => {
  const domain = new CustomOpDomain('lathe.failing');
  domain.add({
    name: 'Broken',
    inputs: ['float32'],
    outputs: ['float32'],
    provider: 'cpu',
    compute: (ctx) => {
      ctx.output(0, ctx.inputs[0].dims);
      throw new Error('no kernel for this shape');
    },
  });
  const g = new L.Graph('broken');
  g.output(domain.node('Broken', [g.input('x', 'float32', [2])])[0], 'y');
  const s = Device.cpu().compile(g, { customOpDomains: [domain.handle] });
  const b = s.binding().input('x', { data: Float32Array.of(1, 2), dims: [2] }).output('y', 'host');
  b.runSync();
  expect(() => domain.check()).toThrow("custom op in domain 'lathe.failing' failed: no kernel for this shape");
  expect(() => domain.check()).not.toThrow();
  expect(() => domain.node('Missing', [])).toThrow("custom-op domain 'lathe.failing' has no op 'Missing' (ops: Broken)");
  b.dispose();
  s.dispose();
  domain.dispose();
});
