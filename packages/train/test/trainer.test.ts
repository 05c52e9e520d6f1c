import * as L from '@lathe/onnx';
import { Binding, Device, PlainSession, type DeviceTensor, type HostTensor } from '@lathe/runtime';
import { biasCorrections, captureError, compileTrainStep, stateNames, Trainer, type LossBuilder } from '@lathe/train';
import { batchOf, init, loss, params } from './tiny-regression';

// The small regression problem of tiny-regression.ts.
const optimizer = { weightDecay: 0.1, maxGradNorm: 0.5 };

test('device-resident steps equal the same steps with state passed through the host each run', async () => {
  const spec = { params, loss, optimizer };
  const trainer = Trainer.create(spec, { params: init() });
  // reference: the plain onnxruntime-node path, every tensor in and out of JS each step
  const graphs = compileTrainStep(spec);
  const plain = await PlainSession.create(graphs.step);
  let state: Record<string, HostTensor> = {};
  for (const [n, v] of init()) {
    const dims = params.find((p) => p.name === n)!.shape;
    state[n] = { data: v, dims };
    state[stateNames.m(n)] = { data: new Float32Array(v.length), dims };
    state[stateNames.v(n)] = { data: new Float32Array(v.length), dims };
  }
  for (let step = 0; step < 4; step++) {
    const batch = batchOf(16, 100 + step, 48);
    const lr = 0.05 / (step + 1);
    const mine = trainer.trainStep([batch], lr);
    const { bc1, bc2 } = biasCorrections(step + 1);
    const f = (v: number): HostTensor => ({ data: Float32Array.from([v]), dims: [] });
    const out = await plain.run({ ...state, ...batch, lr: f(lr), bc1: f(bc1), bc2: f(bc2) });
    expect(mine.loss).toBe((out.loss.data as Float32Array)[0]);
    expect(mine.gradNorm).toBe((out.grad_norm.data as Float32Array)[0]);
    expect(mine.metrics.abs_err).toBe((out.abs_err.data as Float32Array)[0]);
    const next: Record<string, HostTensor> = {};
    for (const p of params) for (const k of [p.name, stateNames.m(p.name), stateNames.v(p.name)]) next[k] = out[stateNames.next(k)];
    state = next;
  }
  const snap = trainer.snapshot();
  expect(snap.step).toBe(4);
  for (const p of params) {
    expect(Array.from(snap.params.get(p.name)!)).toEqual(Array.from(state[p.name].data as Float32Array));
    expect(Array.from(snap.v.get(p.name)!)).toEqual(Array.from(state[stateNames.v(p.name)].data as Float32Array));
  }
  trainer.dispose();
  await plain.dispose();
});

test('accumulating 4 micro-batches gives the update of one batch holding all of them', () => {
  const whole = Trainer.create({ params, loss, optimizer }, { params: init() });
  const parts = Trainer.create({ params, loss, optimizer }, { params: init() }, { microBatches: 4 });
  for (let step = 0; step < 3; step++) {
    const rows = Array.from({ length: 4 }, (_, k) => batchOf(4, 200 + 10 * step + k, 16));
    const joined: Record<string, HostTensor> = {
      x: { data: Float32Array.from(rows.flatMap((r) => Array.from(r.x.data as Float32Array))), dims: [16, 6] },
      t: { data: Float32Array.from(rows.flatMap((r) => Array.from(r.t.data as Float32Array))), dims: [16, 3] },
      n_total: rows[0].n_total,
    };
    const a = whole.trainStep([joined], 0.03);
    const b = parts.trainStep(rows, 0.03);
    expect(b.loss).toBeCloseTo(a.loss, 5);
    expect(b.gradNorm).toBeCloseTo(a.gradNorm, 5);
    expect(b.metrics.abs_err).toBeCloseTo(a.metrics.abs_err, 5);
  }
  const sa = whole.snapshot();
  const sb = parts.snapshot();
  for (const p of params) {
    const x = sa.params.get(p.name)!;
    const y = sb.params.get(p.name)!;
    x.forEach((v, i) => expect(y[i]).toBeCloseTo(v, 5));
  }
  whole.dispose();
  parts.dispose();
});

test('one micro-batch through a gradients hook: the single-run steps bitwise, the gradients written into one set of buffers (no running sum, no zeroing)', async () => {
  const plain = Trainer.create({ params, loss, optimizer }, { params: init() });
  const seen: Map<string, DeviceTensor>[] = [];
  const hooked = Trainer.create({ params, loss, optimizer }, { params: init() }, { onGradients: async (g) => void seen.push(g) });
  expect(hooked.batchGraph.inputs.filter((t) => t.name.startsWith('grad/'))).toEqual([]);
  const paramBytes = params.reduce((n, p) => n + 4 * p.shape.reduce((a, b) => a * b, 1), 0);
  expect(hooked.stateBytes - plain.stateBytes).toBe(paramBytes);
  // the step's session runs: the accumulate run and the apply run, nothing to zero after them
  let runs = 0;
  const runSync = Binding.prototype.runSync;
  const counting = jest.spyOn(Binding.prototype, 'runSync').mockImplementation(function (this: Binding, ...a) {
    runs++;
    return runSync.apply(this, a);
  });
  for (let step = 0; step < 3; step++) {
    const batch = batchOf(8, 300 + step, 8);
    const a = plain.trainStep([batch], 0.03);
    runs = 0;
    const b = await hooked.trainStepAsync([batch], 0.03);
    expect(runs).toBe(2);
    expect([b.loss, b.gradNorm, b.metrics.abs_err]).toEqual([a.loss, a.gradNorm, a.metrics.abs_err]);
  }
  counting.mockRestore();
  // the same buffers every step: nothing is zeroed or swapped between the run and the update
  expect(seen.every((g) => g === seen[0])).toBe(true);
  const [sa, sb] = [plain.snapshot(), hooked.snapshot()];
  for (const p of params) for (const k of ['params', 'm', 'v'] as const) expect(Array.from(sb[k].get(p.name)!)).toEqual(Array.from(sa[k].get(p.name)!));
  plain.dispose();
  hooked.dispose();
});

test('a reader session bound to the parameter buffers sees each step with no copy (double buffering)', async () => {
  const trainer = Trainer.create({ params, loss, optimizer }, { params: init() });
  const g = new L.Graph('reader');
  g.output(g.input('b', 'float32', [3]).sum(), 'sum_b');
  const reader = Device.cpu().compile(g);
  const before = trainer.param('b');
  const r0 = await reader.run({ b: before });
  trainer.trainStep([batchOf(8, 7, 8)], 0.1);
  const after = trainer.param('b');
  expect(after).not.toBe(before); // the step wrote the other buffer
  const r1 = await reader.run({ b: after });
  const expected = (trainer.snapshot().params.get('b') as Float32Array).reduce((a, v) => a + v, 0);
  expect((r1.sum_b.data as Float32Array)[0]).toBeCloseTo(expected, 5);
  expect((r1.sum_b.data as Float32Array)[0]).not.toBe((r0.sum_b.data as Float32Array)[0]);
  reader.dispose();
  trainer.dispose();
});

test('a non-finite loss leaves the parameters at the last good step; bad batches are named', () => {
  const trainer = Trainer.create({ params, loss, optimizer }, { params: init() });
  const good = trainer.snapshot().params;
  const bad = batchOf(4, 9, 4);
  (bad.x.data as Float32Array)[0] = NaN;
  const r = trainer.trainStep([bad], 0.1);
  expect(Number.isNaN(r.loss)).toBe(true);
  expect(trainer.step).toBe(0);
  expect(Array.from(trainer.snapshot().params.get('w1')!)).toEqual(Array.from(good.get('w1')!));
  expect(() => trainer.trainStep([{ x: bad.x, t: bad.t }], 0.1)).toThrow(/the batch has no 'n_total'/);
  expect(() => trainer.trainStep([{ ...bad, extra: bad.n_total }], 0.1)).toThrow(/'extra', which the loss does not read/);
  expect(() => trainer.trainStep([bad, bad], 0.1)).toThrow(/2 micro-batches given, the trainer was built for 1/);
  expect(() => Trainer.create({ params, loss, optimizer }, { params: new Map() })).toThrow(/no initial value for parameter 'w1'/);
  trainer.dispose();
});

test('fixed input buffers (the CUDA-graph path) give the same steps; a changed batch shape is refused', () => {
  const normal = Trainer.create({ params, loss, optimizer }, { params: init() });
  const fixed = Trainer.create({ params, loss, optimizer }, { params: init() }, { staticInputs: true });
  for (let step = 0; step < 3; step++) {
    const batch = batchOf(8, 300 + step, 8);
    // the learning rate changes every step, as a schedule's does: the staged scalars must follow it
    const a = normal.trainStep([batch], 0.05 / (step + 1));
    const b = fixed.trainStep([batch], 0.05 / (step + 1));
    expect(b.loss).toBe(a.loss);
    expect(b.gradNorm).toBe(a.gradNorm);
    expect(b.metrics.abs_err).toBe(a.metrics.abs_err);
  }
  expect(Array.from(fixed.snapshot().params.get('w2')!)).toEqual(Array.from(normal.snapshot().params.get('w2')!));
  expect(() => fixed.trainStep([batchOf(4, 1, 4)], 0.05)).toThrow(/'x' is \[4, 6\], but a trainer with fixed input buffers \(cudaGraph\) was first given \[8, 6\]/);
  // refused before any device memory is taken: no tensor is left for the garbage collector
  const live = Device.cpu().memory().tensors;
  expect(() => Trainer.create({ params, loss, optimizer }, { params: init() }, { cudaGraph: true })).toThrow(/CUDA graphs need a CUDA device/);
  expect(() => Trainer.create({ params, loss, optimizer }, { params: init() }, { staticInputs: true, microBatches: 2 })).toThrow(/microBatches = 1/);
  // a loss over symbolic shapes (flash attention's host-read total length) cannot sit in fixed device buffers
  const symbolic: LossBuilder = (g, ps) => {
    const out = loss(g, ps);
    return { ...out, loss: L.add(out.loss, L.cast(L.mul(g.input('total_sequence_length', 'int32', []), g.constant(0, 'int32', [])), 'float32')) };
  };
  expect(() => Trainer.create({ params, loss: symbolic, optimizer }, { params: init() }, { staticInputs: true })).toThrow(/fixed batch shape \(its 'total_sequence_length' input says the shape is symbolic\)/);
  expect(Device.cpu().memory().tensors).toBe(live);
  normal.dispose();
  fixed.dispose();
});

test('a failed CUDA-graph capture is reported with the batch shape and what to do; other errors pass through', () => {
  const batch = { input_ids: { data: new BigInt64Array(32), dims: [2, 16] }, lr: { data: Float32Array.of(1), dims: [] } };
  const ort = new Error('RunWithBinding: CUDA failure 901: operation failed due to a previous error during capture ; expr=cudaStreamEndCapture(stream_, &graph);');
  const e = captureError(ort, batch);
  expect(e.message).toMatch(/^CUDA graph capture of the train step failed \(input_ids \[2, 16\]\)\. .*run with a smaller batch, or without cudaGraph \(lathe sft: without --cuda_graph\)/);
  expect(e.message).toContain('CUDA failure 901');
  const other = new Error('Failed to allocate memory for requested buffer');
  expect(captureError(other, batch)).toBe(other);
});
