/**
 * A `Trainer.create` that fails part-way frees what it made: each `Device.compile` and each
 * `Device.empty` of a build, in turn, and then its last `Session.binding`, are made to throw, and
 * the device must hold the tensors it held before and every session compiled must be disposed.
 */
import * as L from '@lathe/onnx';
import { Device, Session } from '@lathe/runtime';
import { Trainer, type InGraphGradients, type ShardCollectives, type TrainerOptions } from '@lathe/train';
import { init, loss, params } from './tiny-regression';

const spec = { params, loss, optimizer: { weightDecay: 0.1, maxGradNorm: 0.5 } };

/** An in-run reduction hook without peers: one node output (so the trainer allocates its buffer), and a join for inGraphUpdate. */
const hook = (): InGraphGradients => ({
  customOpDomains: [],
  build: (_g, grads) => [grads[0].grad.sum()],
  buildReduced: (_g, grads) => ({ reduced: grads.map((x) => x.grad), joined: L.equal(grads[0].grad.sum(), grads[0].grad.sum()) }),
  attach: () => undefined,
  finish: () => Promise.resolve(),
});

/** ZeRO collectives of a world of one; a build runs none of them. */
const oneRank = (): ShardCollectives => ({
  rank: 0,
  worldSize: 1,
  reduceScatter: () => Promise.reject(new Error('not in a build')),
  allGather: () => Promise.reject(new Error('not in a build')),
  allReduceHost: () => Promise.resolve(),
});

interface Attempt {
  error?: unknown;
  compiles: number;
  allocations: number;
  bindings: number;
  /** Sessions compiled and not disposed. */
  live: number;
}

/** Creates a trainer with the `at.compile`th compile, `at.allocation`th allocation or `at.binding`th binding throwing (none: a build that succeeds, counted, then disposed). */
function attempt(opts: TrainerOptions, at: { compile?: number; allocation?: number; binding?: number }): Attempt {
  const compile = Device.prototype.compile;
  const empty = Device.prototype.empty;
  const binding = Session.prototype.binding;
  const dispose = Session.prototype.dispose;
  const compiled = new Set<Session>();
  const counts = { compiles: 0, allocations: 0, bindings: 0 };
  const spies = [
    jest.spyOn(Device.prototype, 'compile').mockImplementation(function (this: Device, ...a) {
      if (++counts.compiles === at.compile) throw new Error('injected compile failure');
      const s = compile.apply(this, a);
      compiled.add(s);
      return s;
    }),
    // zeros and full allocate through empty
    jest.spyOn(Device.prototype, 'empty').mockImplementation(function (this: Device, ...a) {
      if (++counts.allocations === at.allocation) throw new Error('injected allocation failure');
      return empty.apply(this, a);
    }),
    jest.spyOn(Session.prototype, 'binding').mockImplementation(function (this: Session) {
      if (++counts.bindings === at.binding) throw new Error('injected binding failure');
      return binding.apply(this);
    }),
    jest.spyOn(Session.prototype, 'dispose').mockImplementation(function (this: Session) {
      compiled.delete(this);
      dispose.apply(this);
    }),
  ];
  try {
    Trainer.create(spec, { params: init() }, opts).dispose();
    return { ...counts, live: compiled.size };
  } catch (error) {
    return { error, ...counts, live: compiled.size };
  } finally {
    for (const s of spies) s.mockRestore();
  }
}

test.each<[string, () => TrainerOptions]>([
  ['one run a step', () => ({})],
  ['fixed input buffers', () => ({ staticInputs: true })],
  ['a gradients hook, two micro-batches, bfloat16 casts', () => ({ microBatches: 2, onGradients: () => Promise.resolve(), gradReduceDtype: 'bfloat16' })],
  ['in-run reduction nodes, two micro-batches', () => ({ microBatches: 2, inGraphGradients: hook() })],
  ['the update in the in-run reduction', () => ({ inGraphGradients: hook(), inGraphUpdate: true })],
  ['ZeRO-1 over one rank, two micro-batches', () => ({ zero: oneRank(), microBatches: 2 })],
])('a build that fails at any compile, any allocation or its last binding leaves no tensor or session behind: %s', (_, options) => {
  const device = Device.cpu();
  const before = device.memory();
  const full = attempt(options(), {});
  expect({ error: full.error, live: full.live }).toEqual({ error: undefined, live: 0 });
  const nth = (n: number) => Array.from({ length: n }, (_, i) => i + 1);
  const failures = [...nth(full.compiles).map((compile) => ({ compile })), ...nth(full.allocations).map((allocation) => ({ allocation })), { binding: full.bindings }];
  for (const at of failures) {
    const r = attempt(options(), at);
    expect(String(r.error)).toMatch(/injected/);
    const after = device.memory();
    expect({ at, tensors: after.tensors, bytes: after.bytes, live: r.live }).toEqual({ at, tensors: before.tensors, bytes: before.bytes, live: 0 });
  }
  expect(device.memory().leaked).toBe(before.leaked);
});
