/**
 * The runtime layer's device benchmark (run on the GPU machine; see docs/benchmarks.md):
 * 1. per-run overhead with bound device tensors vs onnxruntime-node's plain API;
 * 2. host↔device GB/s through DeviceTensor upload/download vs the plain API;
 * 3. residency: a weight updated by one session's run is read by another session's run, with no
 *    host copy (a 256 MB weight read per run in microseconds);
 * 4. CUDA graph capture on a decode-sized graph: per-run time with and without;
 * 5. the training-shaped loop (4-layer MLP, 4096 wide, batch 8192, forward + backward + AdamW in one
 *    run, 100 steps) — its initial weights and batch come from files written by
 *    tools/reference/runtime/mlp_bench.py, which trains the same in PyTorch and compares.
 *
 * usage: node .bundle/runtime-bench.js [--mlp DIR] [--steps 100] [--tf32] [--skip-micro]
 * Prints one JSON line per part.
 */
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import * as ort from 'onnxruntime-node';
import * as L from '@lathe/onnx';
import { Device, PlainSession, type DeviceTensor } from '@lathe/runtime';
import { Trainer, type LossBuilder, type TrainableParam } from '@lathe/train';

const argv = process.argv.slice(2);
const flag = (n: string) => argv.includes(`--${n}`);
const arg = (n: string, d: string) => {
  const i = argv.indexOf(`--${n}`);
  return i >= 0 ? argv[i + 1] : d;
};
const emit = (o: Record<string, unknown>) => console.log(JSON.stringify(o));
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

async function overhead(cuda: Device): Promise<void> {
  const g = new L.Graph('tiny');
  const x = g.input('x', 'float32', [1024]);
  g.output(L.add(x, 1), 'y');
  const s = cuda.compile(g);
  const a = cuda.zeros('float32', [1024]);
  const b = cuda.zeros('float32', [1024]);
  const ab = s.binding().input('x', a).output('y', b);
  const ba = s.binding().input('x', b).output('y', a);
  const N = 2000;
  for (let i = 0; i < 100; i++) (i % 2 ? ba : ab).runSync();
  let t0 = performance.now();
  for (let i = 0; i < N; i++) (i % 2 ? ba : ab).runSync();
  const boundUs = ((performance.now() - t0) / N) * 1000;
  const value = (N % 2 === 0 ? a : b).download().data[0];
  // the same graph through onnxruntime-node's JavaScript API (host tensors in and out each run)
  const plain = await PlainSession.create(g, { device: 'cuda' });
  let host = { data: new Float32Array(1024), dims: [1024] };
  for (let i = 0; i < 100; i++) host = (await plain.run({ x: host })).y as typeof host;
  t0 = performance.now();
  for (let i = 0; i < N; i++) host = (await plain.run({ x: host })).y as typeof host;
  const plainUs = ((performance.now() - t0) / N) * 1000;
  // async (worker-thread) bound runs
  t0 = performance.now();
  for (let i = 0; i < 500; i++) await (i % 2 ? ba : ab).run();
  const asyncUs = ((performance.now() - t0) / 500) * 1000;
  emit({ part: 'per_run_overhead', bound_sync_us: +boundUs.toFixed(1), bound_async_us: +asyncUs.toFixed(1), plain_api_us: +plainUs.toFixed(1), ratio: +(plainUs / boundUs).toFixed(1), bound_result_after_runs: value, expected: 2100 });
  s.dispose();
  await plain.dispose();
  a.dispose();
  b.dispose();
}

async function transfers(cuda: Device): Promise<void> {
  const rows: Record<string, unknown>[] = [];
  for (const mb of [4, 64, 256]) {
    const n = (mb * 1024 * 1024) / 4;
    const host = new Float32Array(n).map((_, i) => i % 997);
    const t = cuda.empty('float32', [n]);
    t.upload(host);
    const up: number[] = [];
    const down: number[] = [];
    for (let r = 0; r < 5; r++) {
      let t0 = performance.now();
      t.upload(host);
      up.push(performance.now() - t0);
      t0 = performance.now();
      const back = t.download();
      down.push(performance.now() - t0);
      if (r === 0 && (back.data[n - 1] !== host[n - 1] || back.data[12345] !== host[12345])) throw new Error('round trip mismatch');
    }
    // plain API: an Identity run moves the input in and the output out
    const plainSession = await ort.InferenceSession.create(L.toModelBytes(identity()), { executionProviders: ['cuda'] });
    const input = new ort.Tensor('float32', host, [n]);
    await plainSession.run({ x: input });
    const rt: number[] = [];
    for (let r = 0; r < 5; r++) {
      const t0 = performance.now();
      await plainSession.run({ x: input });
      rt.push(performance.now() - t0);
    }
    await plainSession.release();
    const gbps = (ms: number, bytes = mb * 1024 * 1024) => +(bytes / (ms / 1000) / 1e9).toFixed(2);
    rows.push({ mb, upload_gbps: gbps(median(up)), download_gbps: gbps(median(down)), plain_in_plus_out_gbps: gbps(median(rt), 2 * mb * 1024 * 1024) });
    t.dispose();
  }
  emit({ part: 'transfers', rows });
}

function identity(): L.Graph {
  const g = new L.Graph('identity');
  const x = g.input('x', 'float32', ['n']);
  g.output(L.applyOp(L.identityOp, [x], {})[0], 'y');
  return g;
}

async function residency(cuda: Device): Promise<void> {
  const n = 64 * 1024 * 1024; // 256 MB of float32
  const update = new L.Graph('update');
  const w = update.input('w', 'float32', [n]);
  update.output(L.add(L.mul(w, 0.5), 1), 'w_next');
  const read = new L.Graph('read');
  read.output(read.input('w', 'float32', [n]).sum(), 'total');
  const up = cuda.compile(update);
  const rd = cuda.compile(read);
  const buffers: DeviceTensor[] = [cuda.zeros('float32', [n]), cuda.empty('float32', [n])];
  const writers = [0, 1].map((k) => up.binding().input('w', buffers[k]).output('w_next', buffers[1 - k]));
  const readers = [0, 1].map((k) => rd.binding().input('w', buffers[k]).output('total', 'host'));
  let current = 0;
  let expected = 0;
  const readUs: number[] = [];
  const totals: number[] = [];
  for (let step = 0; step < 20; step++) {
    writers[current].runSync();
    current = 1 - current;
    expected = expected * 0.5 + 1;
    const t0 = performance.now();
    readers[current].runSync();
    readUs.push((performance.now() - t0) * 1000);
    totals.push(readers[current].scalar('total'));
  }
  // w starts at 0 and becomes w/2 + 1 per update: after k updates every element is 2 − 2^(1−k)
  const ok = totals.every((t, i) => Math.abs(t / n - (2 - 2 ** -i)) < 1e-3);
  // a host copy of the weight alone would take 256 MB / ~13 GB/s ≈ 20 ms per read
  emit({ part: 'residency', weight_mb: 256, reader_sees_every_update: ok, read_run_us_median: +median(readUs).toFixed(0), host_copy_would_cost_us: Math.round((n * 4) / 13e9 * 1e6), last_mean: totals.at(-1)! / n, expected_mean: expected, memory: cuda.memory() });
  for (const b of buffers) b.dispose();
  up.dispose();
  rd.dispose();
}

async function cudaGraph(cuda: Device): Promise<void> {
  // a decode-step-sized graph: 28 layers of [64, 1024] × [1024, 1024] matmuls with tanh
  const build = () => {
    const g = new L.Graph('decode_like');
    let h = g.input('h', 'float32', [64, 1024]);
    const ws = Array.from({ length: 28 }, (_, i) => g.input(`w${i}`, 'float32', [1024, 1024]));
    for (const w of ws) h = L.matmul(h, w).tanh();
    g.output(h, 'out');
    return g;
  };
  const result: Record<string, number> = {};
  const weights = Array.from({ length: 28 }, () => cuda.full('float32', [1024, 1024], 0.001));
  const h = cuda.full('float32', [64, 1024], 0.5);
  for (const captured of [false, true]) {
    const s = cuda.compile(build(), { cudaGraph: captured });
    const out = cuda.empty('float32', [64, 1024]);
    const b = s.binding().input('h', h).output('out', out);
    weights.forEach((w, i) => b.input(`w${i}`, w));
    for (let i = 0; i < 20; i++) b.runSync();
    const t0 = performance.now();
    for (let i = 0; i < 500; i++) b.runSync();
    result[captured ? 'cuda_graph_us' : 'plain_us'] = +(((performance.now() - t0) / 500) * 1000).toFixed(1);
    s.dispose();
    out.dispose();
  }
  emit({ part: 'cuda_graph', ...result, speedup: +(result.plain_us / result.cuda_graph_us).toFixed(2) });
  for (const w of weights) w.dispose();
  h.dispose();
}

async function mlp(cuda: Device, dir: string): Promise<void> {
  const meta = JSON.parse(readFileSync(join(dir, 'meta.json'), 'utf8')) as { width: number; layers: number; batch: number; lr: number; weight_decay: number; max_grad_norm: number; steps: number };
  const { width: W, layers, batch: B } = meta;
  const steps = Number(arg('steps', String(meta.steps)));
  const read = (name: string) => {
    const buf = readFileSync(join(dir, `${name}.bin`));
    return new Float32Array(buf.buffer, buf.byteOffset, buf.byteLength / 4).slice();
  };
  const params: TrainableParam[] = [];
  for (let l = 0; l < layers; l++) params.push({ name: `w${l}`, shape: [W, W], decay: true }, { name: `b${l}`, shape: [W], decay: false });
  const loss: LossBuilder = (g, p) => {
    const x = g.input('x', 'float32', [B, W]);
    const t = g.input('t', 'float32', [B, W]);
    let h = x;
    for (let l = 0; l < layers; l++) {
      h = L.add(L.matmul(h, p.get(`w${l}`)!), p.get(`b${l}`)!);
      if (l < layers - 1) h = h.tanh();
    }
    const e = L.sub(h, t);
    return { loss: L.div(L.mul(e, e).sum(), B * W) };
  };
  const t0 = performance.now();
  const trainer = Trainer.create(
    { params, loss, optimizer: { weightDecay: meta.weight_decay, maxGradNorm: meta.max_grad_norm } },
    { params: new Map(params.map((p) => [p.name, read(p.name)])) },
    { device: cuda },
  );
  const compileMs = performance.now() - t0;
  const x = cuda.upload({ data: read('x'), dims: [B, W] });
  const t = cuda.upload({ data: read('t'), dims: [B, W] });
  const batch = { x, t };
  const losses: number[] = [];
  const stepMs: number[] = [];
  const hostMs: number[] = [];
  for (let s = 0; s < steps; s++) {
    const s0 = performance.now();
    const r = trainer.trainStep([batch], meta.lr);
    stepMs.push(performance.now() - s0);
    hostMs.push(r.hostMs);
    losses.push(r.loss);
  }
  const snap = trainer.snapshot();
  for (const p of params) writeFileSync(join(dir, `lathe_${p.name}.bin`), Buffer.from(snap.params.get(p.name)!.buffer));
  const total = stepMs.slice(5).reduce((a, b) => a + b, 0);
  emit({
    part: 'mlp',
    steps,
    compile_ms: Math.round(compileMs),
    step_ms_mean_after_5: +(total / (steps - 5)).toFixed(2),
    step_ms_median: +median(stepMs).toFixed(2),
    host_bind_ms_median: +median(hostMs).toFixed(3),
    host_share: +(hostMs.slice(5).reduce((a, b) => a + b, 0) / total).toFixed(4),
    bytes_per_step_host_to_device: 12, // lr, bc1, bc2 (the batch lives on the device)
    bytes_per_step_device_to_host: 8, // loss, grad norm
    losses: [losses[0], losses[Math.floor(steps / 2)], losses.at(-1)],
    memory: cuda.memory(),
  });
  writeFileSync(join(dir, 'lathe_losses.json'), JSON.stringify(losses));
  trainer.dispose();
  x.dispose();
  t.dispose();
}

async function main(): Promise<void> {
  const cuda = Device.cuda({ tf32: flag('tf32') });
  if (!flag('skip-micro')) {
    await overhead(cuda);
    await transfers(cuda);
    await residency(cuda);
    await cudaGraph(cuda);
  }
  const dir = arg('mlp', '');
  if (dir) await mlp(cuda, dir);
}

main().catch((e: unknown) => {
  console.error(e instanceof Error ? e.stack : e);
  process.exit(1);
});
