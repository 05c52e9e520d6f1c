import * as koffi from 'koffi';
import * as L from '@lathe/onnx';
import { Device } from '@lathe/runtime';
import { CustomOpDomain, opFamily } from '@lathe/kernels';

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

test('opFamily: domains numbered per prefix, float32 only on the CPU, each op made once per key, the shared dtype error', () => {
  const a = opFamily({ name: 'fooOps', domainPrefix: 'lathe.test_family_', provider: 'cpu', cudaDtypes: ['bfloat16', 'float16'] });
  const b = opFamily({ name: 'fooOps', domainPrefix: 'lathe.test_family_', provider: 'cuda', cudaDtypes: ['bfloat16', 'float16'] });
  try {
    expect(Number(b.domain.domain.slice('lathe.test_family_'.length))).toBe(Number(a.domain.domain.slice('lathe.test_family_'.length)) + 1);
    expect(a.dtypes).toEqual(['float32']);
    expect(b.dtypes).toEqual(['bfloat16', 'float16']);
    let made = 0;
    const define = () => {
      made++;
      return a.domain.add({ name: `Op${a.size}`, inputs: ['float32'], outputs: ['float32'], provider: 'cpu', compute: () => undefined });
    };
    const first = a.op('float32', define);
    expect(a.op('float32', define)).toBe(first);
    a.op('packed/float32', define);
    expect([made, a.size]).toEqual([2, 2]);
    expect(() => a.supports('float32')).not.toThrow();
    expect(() => a.supports('bfloat16')).toThrow('fooOps (cpu): no kernel for dtype bfloat16 (takes float32)');
  } finally {
    a.dispose();
    b.dispose();
  }
});
