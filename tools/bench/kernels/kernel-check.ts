/**
 * Lathe's own kernels on ONNX Runtime's stream, checked and timed on the GPU (issue 37). Phases:
 * - vector: an NVRTC-compiled kernel launched between bound ORT runs on the one stream, `--rounds`
 *   of each with no host sync between; the result must be exact (compile and cache-hit ms too).
 *   With --capture, the same rounds captured as one CUDA graph and replayed. `split`: a graph split
 *   around a kernel region, run by SplitProgram (segments and a launch), against the whole graph;
 *   `custom_op`: the kernel as an ORT custom op (a koffi callback that launches it) in one session.
 * - adamw: the fused AdamW against the composed `apply` graph on the parameters of --shape, from
 *   the same state, with and without clipping: mismatching elements, max ulps and max abs diff of
 *   p, m and v, both grad norms, and device ms per update (events on the stream); `node`: the same
 *   for the apply graph with the FusedAdamW node (the trainer's fusedAdamW path); `bfloat16-gradients`:
 *   the kernels on bfloat16 gradients against their float32 widening (must be bit for bit, `wrong` 0).
 * - sft (with --sft): full SFT steps of the trainer at --batch B×T with and without fusedAdamW
 *   (same random init and batch): losses and tok/s of each.
 * --dry-run prints the plan (parameters, chunks, bytes per update) without a device.
 *
 * usage: node kernel-check.js [--shape qwen3-0.6b|tiny] [--rounds 12] [--n 1048576] [--reps 20] [--capture]
 *          [--sft] [--phases vector,adamw,sft] [--batch 8x1024] [--steps 4] [--compute bfloat16] [--dry-run]
 * Prints one JSON line per phase.
 */
import { CausalLM, totalLengthTensor, TOTAL_LENGTH_INPUT, type HfConfig } from '@lathe/models';
import * as L from '@lathe/onnx';
import { CustomOpDomain, Kernels, kernelRegion, SplitProgram, type Kernel, type KernelImpl } from '@lathe/kernels';
import { type Device, type DeviceTensor } from '@lathe/runtime';
import { biasCorrections, compileApply, FusedAdamW, fusedAdamWNode, sftLoss, stateNames, Trainer, type AdamWConfig } from '@lathe/train';
import { arg, flag } from '../argv';
import { QWEN3_0_6B } from '../shapes';
import { adamwPlan, trainedParams, vectorExpected } from './plan';

const SHAPES: Record<string, HfConfig> = {
  tiny: { architectures: ['Qwen3ForCausalLM'], vocab_size: 512, hidden_size: 64, intermediate_size: 192, num_hidden_layers: 2, num_attention_heads: 4, num_key_value_heads: 2, head_dim: 16, rms_norm_eps: 1e-6, rope_theta: 10000, max_position_embeddings: 1024, tie_word_embeddings: true },
  'qwen3-0.6b': QWEN3_0_6B,
};

/** Helper kernels of the check: the vector step, a seeded fill, and an on-device comparison. */
const CHECK_SOURCE = String.raw`
typedef unsigned long long u64;
extern "C" __global__ void scale_into(float* y, const float* x, float a, long long n) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] * a;
}
extern "C" __global__ void add_into(float* a, const float* b, const float* x, long long n) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) a[i] = b[i] + x[i];
}
__device__ unsigned hash(unsigned x) { x ^= x >> 16; x *= 0x7feb352du; x ^= x >> 15; x *= 0x846ca68bu; x ^= x >> 16; return x; }
// y = offset + scale * u, u uniform in [-1, 1) (or [0, 1) when positive)
extern "C" __global__ void fill_random(float* y, long long n, unsigned seed, float scale, int positive) {
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    float u = (hash((unsigned)i * 2654435761u ^ hash(seed + (unsigned)(i >> 32))) >> 8) * (1.0f / 16777216.0f);
    y[i] = scale * (positive ? u : 2.0f * u - 1.0f);
  }
}
// out[0] += elements that differ, out[1] = max |bits(a) - bits(b)|, out[2] = max |a - b| as float bits
extern "C" __global__ void compare(const float* a, const float* b, long long n, u64* out) {
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    int ia = __float_as_int(a[i]), ib = __float_as_int(b[i]);
    if (ia != ib) {
      atomicAdd(&out[0], 1ull);
      long long d = (long long)ia - (long long)ib;
      atomicMax(&out[1], (u64)(d < 0 ? -d : d));
      atomicMax(&out[2], (u64)__float_as_uint(fabsf(a[i] - b[i])));
    }
  }
}
`;

interface Helpers {
  scaleInto: Kernel<readonly ['ptr', 'ptr', 'f32', 'i64']>;
  addInto: Kernel<readonly ['ptr', 'ptr', 'ptr', 'i64']>;
  fill: Kernel<readonly ['ptr', 'i64', 'u32', 'f32', 'i32']>;
  compare: Kernel<readonly ['ptr', 'ptr', 'i64', 'ptr']>;
}

const grid = (n: number, block = 256) => Math.max(1, Math.min(Math.ceil(n / block), 65535 * 16));

function vectorPhase(kernels: Kernels, device: Device, h: Helpers, compileMs: { cold: number; cached: number }): void {
  const n = Number(arg('n', String(1 << 20)));
  const rounds = Number(arg('rounds', '12'));
  const g = new L.Graph('plus_one');
  g.output(L.add(g.input('a', 'float32', [n]), 1), 'b');
  const session = device.compile(g);
  const a = device.upload({ data: Float32Array.from({ length: n }, (_, i) => i % 7), dims: [n] });
  const x = device.upload({ data: Float32Array.from({ length: n }, (_, i) => i % 5), dims: [n] });
  const b = device.empty('float32', [n]);
  const run = session.binding().input('a', a).output('b', b);
  const round = () => {
    run.runSync({ synchronize: false });
    h.addInto.launch({ grid: Math.ceil(n / 256), block: 256 }, a, b, x, n);
  };
  const t0 = performance.now();
  for (let r = 0; r < rounds; r++) round();
  const got = a.download().data as Float32Array;
  const ms = performance.now() - t0;
  const want = vectorExpected(n, rounds);
  const wrong = got.reduce((c, v, i) => c + (v === want[i] ? 0 : 1), 0);
  const result: Record<string, unknown> = { phase: 'vector', n, rounds, exact: wrong === 0, wrong, wall_ms: +ms.toFixed(2), compile_ms: compileMs, arch: kernels.arch, target: kernels.target, nvrtc: kernels.nvrtc.version.join('.'), driver: kernels.driver.version.join('.') };
  if (flag('capture')) {
    // the same rounds recorded once as a CUDA graph, replayed from a fresh start
    a.upload(Float32Array.from({ length: n }, (_, i) => i % 7));
    try {
      const graph = kernels.driver.capture(kernels.stream, () => {
        for (let r = 0; r < rounds; r++) round();
      });
      graph.replay(kernels.stream);
      kernels.synchronize();
      const again = a.download().data as Float32Array;
      result.capture = { exact: again.every((v, i) => v === want[i]), wrong: again.reduce((c, v, i) => c + (v === want[i] ? 0 : 1), 0) };
      graph.dispose();
    } catch (e) {
      result.capture = { error: (e as Error).message.slice(0, 400) };
    }
  }
  result.split = splitCheck(device, h, n);
  result.custom_op = customOpCheck(kernels, device, h, n);
  console.log(JSON.stringify(result));
  run.dispose();
  session.dispose();
  for (const t of [a, x, b]) t.dispose();
}

/**
 * A graph split around a kernel region (y = 3·(2x + 1), the tripling a kernel), run as segments and
 * a launch by SplitProgram, against the whole graph on ORT: must be exact.
 */
function splitCheck(device: Device, h: Helpers, n: number): { exact: boolean; steps: string[] } {
  const g = new L.Graph('split_check');
  const x = g.input('x', 'float32', [n]);
  const a = L.add(L.mul(x, 2), 1);
  const b = kernelRegion(g, 'triple', () => L.mul(a, 3));
  g.output(L.sub(b, x), 'y');
  const triple: KernelImpl = ([input]) => {
    const out = device.empty('float32', input.dims);
    h.scaleInto.launch({ grid: Math.ceil(input.size / 256), block: 256 }, out, input, 3, input.size);
    return [out];
  };
  const program = SplitProgram.compile(device, g, { triple });
  const whole = device.compile(g);
  const xs = device.upload({ data: Float32Array.from({ length: n }, (_, i) => (i % 1000) / 8), dims: [n] });
  const got = program.run({ x: xs }).y.download().data as Float32Array;
  const bind = whole.binding().input('x', xs).output('y', 'host');
  bind.runSync();
  const want = bind.fetch('y').data as Float32Array;
  const steps = program.steps.map((s) => (s.kind === 'kernel' ? `kernel:${s.kernel}` : `ort(${s.nodes.length} nodes)`));
  bind.dispose();
  whole.dispose();
  program.dispose();
  xs.dispose();
  return { exact: got.every((v, i) => v === want[i]), steps };
}

/**
 * The same tripling as an ORT custom op on the CUDA provider whose compute (a koffi callback)
 * launches the kernel on the session's stream: one session, y = 3·(2x + 1) − x, against the
 * composed graph. Must be exact; with --capture also replayed as ORT's CUDA graph.
 */
function customOpCheck(kernels: Kernels, device: Device, h: Helpers, n: number): Record<string, unknown> {
  const domain = new CustomOpDomain('lathe.check');
  let calls = 0;
  domain.add({
    name: 'Triple',
    inputs: ['float32'],
    outputs: ['float32'],
    provider: 'cuda',
    compute: (ctx) => {
      calls++;
      const [x] = ctx.inputs;
      const size = x.dims.reduce((a, b) => a * b, 1);
      const out = ctx.output(0, x.dims);
      h.scaleInto.launch({ grid: Math.ceil(size / 256), block: 256, stream: kernels.stream }, out, x.data, 3, size);
    },
  });
  const build = (custom: boolean) => {
    const g = new L.Graph(custom ? 'custom_op_check' : 'custom_op_reference');
    const x = g.input('x', 'float32', [n]);
    const a = L.add(L.mul(x, 2), 1);
    const t = custom ? domain.node('Triple', [a])[0] : L.mul(a, 3);
    g.output(L.sub(t, x), 'y');
    return g;
  };
  const xs = device.upload({ data: Float32Array.from({ length: n }, (_, i) => (i % 1000) / 8), dims: [n] });
  const result: Record<string, unknown> = {};
  try {
    const reference = device.compile(build(false));
    const rb = reference.binding().input('x', xs).output('y', 'host');
    rb.runSync();
    const want = rb.fetch('y').data as Float32Array;
    reference.dispose();
    for (const graphs of flag('capture') ? [false, true] : [false]) {
      const s = device.compile(build(true), { customOpDomains: [domain.handle], cudaGraph: graphs });
      const y = device.empty('float32', [n]);
      const b = s.binding().input('x', xs).output('y', y);
      for (let r = 0; r < 3; r++) b.runSync();
      domain.check();
      const got = y.download().data as Float32Array;
      result[graphs ? 'cuda_graph' : 'session'] = { exact: got.every((v, i) => v === want[i]), compute_calls: calls };
      s.dispose();
      y.dispose();
    }
  } catch (e) {
    result.error = (e as Error).message.slice(0, 400);
  }
  xs.dispose();
  domain.dispose();
  return result;
}

async function adamwPhase(kernels: Kernels, device: Device, h: Helpers, shape: HfConfig): Promise<void> {
  const params = trainedParams(shape);
  const reps = Number(arg('reps', '20'));
  const fill = (t: DeviceTensor, seed: number, scale: number, positive = false) => h.fill.launch({ grid: grid(t.size), block: 256 }, t, t.size, seed, scale, positive ? 1 : 0);
  const make = () => new Map(params.map((p) => [p.name, device.empty('float32', p.shape)]));
  const [P, M, V, G] = [make(), make(), make(), make()];
  const out = { composed: [make(), make(), make()], fused: [make(), make(), make()] };
  params.forEach((p, i) => {
    fill(P.get(p.name)!, 4 * i + 1, 0.05);
    fill(M.get(p.name)!, 4 * i + 2, 1e-3);
    fill(V.get(p.name)!, 4 * i + 3, 1e-6, true);
    fill(G.get(p.name)!, 4 * i + 4, 1e-3);
  });
  const counts = device.empty('int64', [3]);
  const diff = (a: Map<string, DeviceTensor>, b: Map<string, DeviceTensor>) => {
    let wrong = 0;
    let ulps = 0;
    let abs = 0;
    for (const p of params) {
      counts.fill(0);
      h.compare.launch({ grid: grid(p.size), block: 256 }, a.get(p.name)!, b.get(p.name)!, p.size, counts);
      const c = counts.download().data as BigInt64Array;
      wrong += Number(c[0]);
      ulps = Math.max(ulps, Number(c[1]));
      abs = Math.max(abs, new Float32Array(new Uint32Array([Number(c[2])]).buffer)[0]);
    }
    return { wrong, max_ulps: ulps, max_abs: abs };
  };
  const lr = 1e-4;
  const { bc1, bc2 } = biasCorrections(10);
  for (const [label, cfg] of [['no-clip', { weightDecay: 0.01 }], ['clip', { weightDecay: 0.01, maxGradNorm: 1e-3 }]] as [string, AdamWConfig][]) {
    const session = device.compile(compileApply(params, cfg), { name: `apply-${label}` });
    const gradNorm = device.empty('float32', []);
    const bind = session.binding();
    for (const p of params) {
      bind.input(p.name, P.get(p.name)!).input(stateNames.m(p.name), M.get(p.name)!).input(stateNames.v(p.name), V.get(p.name)!).input(stateNames.grad(p.name), G.get(p.name)!);
      bind.output(stateNames.next(p.name), out.composed[0].get(p.name)!).output(stateNames.next(stateNames.m(p.name)), out.composed[1].get(p.name)!).output(stateNames.next(stateNames.v(p.name)), out.composed[2].get(p.name)!);
    }
    bind.input('lr', { data: Float32Array.of(lr), dims: [] }).input('bc1', { data: Float32Array.of(bc1), dims: [] }).input('bc2', { data: Float32Array.of(bc2), dims: [] }).input('grad_scale', { data: Float32Array.of(1), dims: [] });
    bind.output('grad_norm', gradNorm);
    const fused = FusedAdamW.create(kernels, device, params, cfg);
    const tables = fused.bind(params.map((p) => ({ p: P.get(p.name)!, m: M.get(p.name)!, v: V.get(p.name)!, g: G.get(p.name)!, pOut: out.fused[0].get(p.name)!, mOut: out.fused[1].get(p.name)!, vOut: out.fused[2].get(p.name)! })));
    bind.runSync();
    fused.step(tables, { lr, bc1, bc2 });
    kernels.synchronize();
    const composedNorm = gradNorm.download().data[0] as number;
    const fusedNorm = fused.readGradNorm();
    const result = { phase: 'adamw', config: label, params: adamwPlan(params), grad_norm: { composed: composedNorm, fused: fusedNorm }, p: diff(out.composed[0], out.fused[0]), m: diff(out.composed[1], out.fused[1]), v: diff(out.composed[2], out.fused[2]) };
    bind.runSync();
    const composedMs = kernels.time(() => {
      for (let r = 0; r < reps; r++) bind.runSync({ synchronize: false });
    }) / reps;
    fused.step(tables, { lr, bc1, bc2 });
    const fusedMs = kernels.time(() => {
      for (let r = 0; r < reps; r++) fused.step(tables, { lr, bc1, bc2 });
    }) / reps;
    // the trainer's path: the apply graph with the FusedAdamW node in place of the composed update
    const node = fusedAdamWNode(device, params, cfg, kernels);
    const nodeResult: Record<string, unknown> = {};
    let nodeMs = NaN;
    try {
      const nodeSession = device.compile(compileApply(params, cfg, node.update), { name: `apply-node-${label}`, customOpDomains: [node.domain.handle] });
      const nb = nodeSession.binding();
      for (const p of params) {
        nb.input(p.name, P.get(p.name)!).input(stateNames.m(p.name), M.get(p.name)!).input(stateNames.v(p.name), V.get(p.name)!).input(stateNames.grad(p.name), G.get(p.name)!);
        nb.output(stateNames.next(p.name), out.fused[0].get(p.name)!).output(stateNames.next(stateNames.m(p.name)), out.fused[1].get(p.name)!).output(stateNames.next(stateNames.v(p.name)), out.fused[2].get(p.name)!);
      }
      nb.input('lr', { data: Float32Array.of(lr), dims: [] }).input('bc1', { data: Float32Array.of(bc1), dims: [] }).input('bc2', { data: Float32Array.of(bc2), dims: [] }).input('grad_scale', { data: Float32Array.of(1), dims: [] });
      nb.output('grad_norm', gradNorm);
      nb.runSync();
      node.check();
      Object.assign(nodeResult, { grad_norm: gradNorm.download().data[0], p: diff(out.composed[0], out.fused[0]), m: diff(out.composed[1], out.fused[1]), v: diff(out.composed[2], out.fused[2]) });
      nodeMs = kernels.time(() => {
        for (let r = 0; r < reps; r++) nb.runSync({ synchronize: false });
      }) / reps;
      node.check();
      nb.dispose();
      nodeSession.dispose();
    } catch (e) {
      nodeResult.error = (e as Error).message.slice(0, 400);
    }
    node.dispose();
    console.log(
      JSON.stringify({
        ...result,
        node: nodeResult,
        ms_per_update: { composed: +composedMs.toFixed(3), fused: +fusedMs.toFixed(3), node: +nodeMs.toFixed(3), speedup: +(composedMs / fusedMs).toFixed(2) },
      }),
    );
    fused.dispose();
    bind.dispose();
    session.dispose();
    gradNorm.dispose();
  }
  // bfloat16 gradients (TrainerOptions.halfGradients): the kernels widen them as the float32 copy holds them, so the
  // update from G rounded to bfloat16 equals the one from that rounding widened back to float32, bit for bit
  {
    const cfg: AdamWConfig = { weightDecay: 0.01, maxGradNorm: 1e-3 };
    const round = new L.Graph('round-bf16');
    for (const p of params) {
      const half = L.cast(round.input(p.name, 'float32', p.shape), 'bfloat16');
      round.output(half, `half/${p.name}`);
      round.output(L.cast(half, 'float32'), `wide/${p.name}`);
    }
    const half = new Map(params.map((p) => [p.name, device.empty('bfloat16', p.shape)]));
    const wide = make();
    const rs = device.compile(round, { name: 'round-bf16' });
    const rb = rs.binding();
    for (const p of params) rb.input(p.name, G.get(p.name)!).output(`half/${p.name}`, half.get(p.name)!).output(`wide/${p.name}`, wide.get(p.name)!);
    rb.runSync();
    const fused = FusedAdamW.create(kernels, device, params, cfg);
    const run = (g: Map<string, DeviceTensor>, to: Map<string, DeviceTensor>[]) => {
      const tables = fused.bind(params.map((p) => ({ p: P.get(p.name)!, m: M.get(p.name)!, v: V.get(p.name)!, g: g.get(p.name)!, pOut: to[0].get(p.name)!, mOut: to[1].get(p.name)!, vOut: to[2].get(p.name)! })));
      fused.step(tables, { lr, bc1, bc2 });
      kernels.synchronize();
      const norm = fused.readGradNorm();
      const ms = kernels.time(() => {
        for (let r = 0; r < reps; r++) fused.step(tables, { lr, bc1, bc2 });
      }) / reps;
      return { norm, ms };
    };
    const w = run(wide, out.composed);
    const hh = run(half, out.fused);
    console.log(JSON.stringify({ phase: 'adamw', config: 'bfloat16-gradients', grad_norm: { float32_copy: w.norm, bfloat16: hh.norm }, p: diff(out.composed[0], out.fused[0]), m: diff(out.composed[1], out.fused[1]), v: diff(out.composed[2], out.fused[2]), ms_per_update: { float32_copy: +w.ms.toFixed(3), bfloat16: +hh.ms.toFixed(3) } }));
    fused.dispose();
    rb.dispose();
    rs.dispose();
    for (const t of [...half.values(), ...wide.values()]) t.dispose();
  }
  counts.dispose();
  for (const m of [P, M, V, G, ...out.composed, ...out.fused]) for (const t of m.values()) t.dispose();
}

async function sftPhase(device: Device, shape: HfConfig): Promise<void> {
  const [B, T] = arg('batch', '8x1024').split('x').map(Number);
  const steps = Number(arg('steps', '4'));
  const compute = arg('compute', 'bfloat16') as 'float32' | 'bfloat16';
  const model = CausalLM.random(shape, { seed: 1, std: 0.02 });
  const params = trainedParams(shape).map((p) => ({ name: p.name, shape: p.shape, decay: p.decay }));
  const weights = model.float32Weights();
  const vocab = model.config.vocabSize;
  const ids = BigInt64Array.from({ length: B * T }, (_, i) => BigInt((i * 7919 + 13) % vocab));
  const ones = new BigInt64Array(B * T).fill(1n);
  const batch = {
    input_ids: device.upload({ data: ids, dims: [B, T] }),
    attention_mask: device.upload({ data: ones, dims: [B, T] }),
    loss_mask: device.upload({ data: ones, dims: [B, T] }),
    loss_tokens: { data: Float32Array.of(B * (T - 1)), dims: [] },
    [TOTAL_LENGTH_INPUT]: totalLengthTensor(T),
  };
  const optimizer = { weightDecay: 0.01, maxGradNorm: 1 };
  const runs: Record<string, unknown> = {};
  for (const fusedAdamW of [false, true]) {
    const trainer = Trainer.create({ params, loss: sftLoss(model.config, { compute, flashAttention: true }), optimizer }, { params: weights }, { device, fusedAdamW });
    const losses: number[] = [];
    const norms: number[] = [];
    const ms: number[] = [];
    for (let s = 0; s < steps; s++) {
      const t0 = performance.now();
      const r = trainer.trainStep([batch], 1e-5);
      ms.push(performance.now() - t0);
      losses.push(r.loss);
      norms.push(r.gradNorm);
    }
    trainer.dispose();
    const best = Math.min(...ms.slice(1));
    runs[fusedAdamW ? 'fused' : 'composed'] = { losses, grad_norms: norms, step_ms: ms.map((x) => +x.toFixed(1)), tokens_per_s_best: Math.round((B * T) / (best / 1000)) };
  }
  console.log(JSON.stringify({ phase: 'sft', batch: [B, T], compute, ...runs }));
  for (const t of [batch.input_ids, batch.attention_mask, batch.loss_mask]) t.dispose();
}

async function main(): Promise<void> {
  const shapeName = arg('shape', 'qwen3-0.6b');
  const shape = SHAPES[shapeName];
  if (!shape) throw new Error(`--shape must be one of ${Object.keys(SHAPES).join(', ')}, got ${shapeName}`);
  if (flag('dry-run')) {
    console.log(JSON.stringify({ phase: 'plan', shape: shapeName, ...adamwPlan(trainedParams(shape)), vector_check_first: Array.from(vectorExpected(4, Number(arg('rounds', '12')))) }));
    return;
  }
  const phases = arg('phases', flag('sft') ? 'vector,adamw,sft' : 'vector,adamw').split(',');
  for (const p of phases) if (!['vector', 'adamw', 'sft'].includes(p)) throw new Error(`--phases: unknown phase '${p}' (vector, adamw, sft)`);
  const t0 = performance.now();
  const { kernels, device } = Kernels.withDevice();
  const cold0 = performance.now();
  const mod = kernels.compile(CHECK_SOURCE, { name: 'kernel_check' });
  const cold = performance.now() - cold0;
  const cached0 = performance.now();
  kernels.compile(CHECK_SOURCE, { name: 'kernel_check' });
  const cached = performance.now() - cached0;
  const helpers: Helpers = {
    scaleInto: mod.kernel('scale_into', ['ptr', 'ptr', 'f32', 'i64'] as const),
    addInto: mod.kernel('add_into', ['ptr', 'ptr', 'ptr', 'i64'] as const),
    fill: mod.kernel('fill_random', ['ptr', 'i64', 'u32', 'f32', 'i32'] as const),
    compare: mod.kernel('compare', ['ptr', 'ptr', 'i64', 'ptr'] as const),
  };
  console.error(`kernel-check: device and kernels ready in ${(performance.now() - t0).toFixed(0)} ms (${kernels.counts.compiled} compiled, ${kernels.counts.cached} from the cache)`);
  if (phases.includes('vector')) vectorPhase(kernels, device, helpers, { cold: +cold.toFixed(2), cached: +cached.toFixed(2) });
  if (phases.includes('adamw')) await adamwPhase(kernels, device, helpers, shape);
  if (phases.includes('sft')) await sftPhase(device, shape);
  kernels.dispose();
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
