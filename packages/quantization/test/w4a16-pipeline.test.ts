/**
 * The INT4 pipeline (`w4a16GemmOps` of @lathe/kernels behind `GenerationOptions.pipeline`): products of
 * many rows (prefill's, and decode batches past `kernelMaxRows`) go through it in the model's reading
 * order, each projection's prefetch node placed by ONNX Runtime just before the product after the one
 * it must follow (the order the CUDA side overlaps the dequantize in), and a KV-cache generator over it (the
 * ops' CPU path) generates what bound MatMulNBits does.
 */
import { readFileSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import * as L from '@lathe/onnx';
import { CausalLM, type DecoderConfig } from '@lathe/models';
import { Device } from '@lathe/runtime';
import { KvCacheGenerator, SlotEngine, type Completion, type SlotToken } from '@lathe/rollout';
import { w4a16GemmOps, w4a16Ops, type W4A16GemmOps } from '@lathe/kernels';
import { QuantizedModel, type NBitsPipeline } from '@lathe/quantization';
import { tinyQwen3 } from './data';

const original = CausalLM.random(tinyQwen3, { seed: 5, std: 0.08 });
const config: DecoderConfig = original.config;
const weights = original.float32Weights();
const int4 = QuantizedModel.quantize(config, weights, { format: 'int4', blockSize: 32, zeroPoints: true });

/** A pipeline that records the keys it is asked for. */
function recording(inner: W4A16GemmOps): NBitsPipeline & { keys: string[][] } {
  const r = {
    keys: [] as string[][],
    session: inner.session,
    unsupported: inner.unsupported,
    pipeline: (ps: Parameters<NBitsPipeline['pipeline']>[0]) => {
      const asked: string[] = [];
      r.keys.push(asked);
      const p = inner.pipeline(ps);
      return (key: string, x: L.Tensor, packed?: boolean) => (asked.push(key), p(key, x, packed));
    },
  };
  return r;
}

test('graphWeights sends products of unknown or many rows through the pipeline in the model order, and decode steps within kernelMaxRows through the kernel', () => {
  const kernel = w4a16Ops('cpu');
  const gemm = w4a16GemmOps('cpu', undefined, { slots: 2 });
  const pipe = recording(gemm);
  const route = (shape: (number | string)[]) => {
    const g = new L.Graph('route');
    const w = int4.graphWeights(g, { dtype: 'float32', quantizedWeights: 'kernel', kernel, pipeline: pipe }).weights;
    return { g, w, x: g.input('x', 'float32', shape) };
  };
  const prefill = route(['B', 'P', 64]);
  const [q, k, v] = ['q', 'k', 'v'].map((p) => prefill.w.matmul!(`model.layers.0.self_attn.${p}_proj.weight`, prefill.x)!);
  const node = (t: L.Tensor) => prefill.g.nodes.find((n) => n.outputs.includes(t))!;
  expect(node(q).op.name).toBe('W4A16GemmZp_float32_w64_32_32_s0_t2');
  expect([node(k) === node(q), node(v) === node(q), q.shape, k.shape]).toEqual([true, true, ['B', 'P', 64], ['B', 'P', 32]]);
  // the first product: its own prefetch and the next one's as inputs (slots 0 and 1, both made before it)
  const ins = node(q).inputs.slice(4).map((t) => prefill.g.nodes.find((n) => n.outputs.includes(t!))!.op.name);
  expect(ins).toEqual(['W4A16PrefetchZp_float32_s0_k64', 'W4A16PrefetchZp_float32_s1_k64']);
  // o_proj next; reading down_proj before gate/up breaks the order, named
  expect(node(prefill.w.matmul!('model.layers.0.self_attn.o_proj.weight', prefill.x)!).op.name).toBe('W4A16GemmZp_float32_s1_t2');
  expect(() => prefill.w.matmul!('model.layers.0.mlp.down_proj.weight', prefill.g.input('h', 'float32', ['B', 'P', 96]))).toThrow(/'model.layers.0.mlp.down_proj.weight' was asked for where 'model.layers.0.mlp.gate_up_proj.weight' \(2 of 8\) comes next/);
  // the prefetch of projection 2 (slot 0) reads projection 0's output: made after it, it runs after it
  const pf2 = prefill.g.nodes.filter((n) => n.op.name.startsWith('W4A16Prefetch'))[2];
  expect([pf2.op.name, pf2.inputs[0] === q]).toEqual(['W4A16PrefetchZp_float32_s0_k64_after', true]);
  // a group read packed (Weights.packed, for kernels that take it so): one product, one output [.., N]
  const packedRoute = route(['B', 'P', 64]);
  packedRoute.w.matmul!('model.layers.0.self_attn.q_proj.weight', packedRoute.x);
  packedRoute.w.matmul!('model.layers.0.self_attn.o_proj.weight', packedRoute.x);
  const gu = packedRoute.w.packed!('gate_up', 'model.layers.0.mlp', packedRoute.x)!;
  const guNode = packedRoute.g.nodes.find((n) => n.outputs.includes(gu))!;
  expect([guNode.op.name, guNode.outputs.length, gu.shape]).toEqual(['W4A16GemmZp_float32_s0_t2', 1, ['B', 'P', 192]]);
  // decode steps within kernelMaxRows keep the members (the kernel writes them apart)
  const packedSmall = route([4, 1, 64]);
  expect(packedSmall.w.packed!('qkv', 'model.layers.0.self_attn', packedSmall.x)).toBeUndefined();
  // a decode step of 4 rows: the kernel; of 128 rows (past kernelMaxRows 64): the pipeline
  const small = route([4, 1, 64]);
  const o = small.w.matmul!('model.layers.0.self_attn.q_proj.weight', small.x)!;
  expect(small.g.nodes.find((n) => n.outputs.includes(o))!.op.name).toBe('W4A16MatMulZp_float32_w64_32_32');
  const big = route([128, 1, 64]);
  const ob = big.w.matmul!('model.layers.0.self_attn.q_proj.weight', big.x)!;
  expect(big.g.nodes.find((n) => n.outputs.includes(ob))!.op.name).toBe('W4A16GemmZp_float32_w64_32_32_s0_t2');
  // the pipeline's list: 2 layers × (q/k/v, o, gate/up, down)
  expect(pipe.keys.filter((k) => k.length > 0).map((k) => k[0])).toEqual(['model.layers.0.self_attn.qkv_proj.weight', 'model.layers.0.self_attn.qkv_proj.weight', 'model.layers.0.self_attn.qkv_proj.weight']);
  // without slots or groups the products are independent: any order, and again
  const free = w4a16GemmOps('cpu', undefined, { group: 1 });
  const anyOrder = int4.graphWeights(new L.Graph('free'), { dtype: 'float32', quantizedWeights: 'kernel', kernel, pipeline: free, kernelMaxRows: 0 });
  const fx = [...anyOrder.inputs.values()][0].graph.input('x', 'float32', ['B', 'P', 96]);
  const down = () => anyOrder.weights.matmul!('model.layers.1.mlp.down_proj.weight', fx)!;
  expect([down().shape, down().shape]).toEqual([['B', 'P', 64], ['B', 'P', 64]]);
  free.dispose();
  expect(() => int4.generationPlan('cpu', 'float32', { pipeline: pipe })).toThrow(/pipeline .*needs quantizedWeights 'kernel', got 'inputs'/);
  expect(() => w4a16GemmOps('cpu', undefined, { slots: 9 })).toThrow(/slots must be an integer from 0 to 8, got 9/);
  expect([gemm.group, w4a16GemmOps('cpu').group, w4a16GemmOps('cpu', undefined, { group: 4 }).slots]).toEqual([1, 4, 0]);
  expect(() => w4a16GemmOps('cuda')).toThrow(/CUDA needs a W4A16Gemm/);
  for (const o of [kernel, gemm]) o.dispose();
});

const prompts = [[5, 9, 11, 3], [7, 2], [30, 31, 32]];

async function generate(q: QuantizedModel, opts: { kernel?: ReturnType<typeof w4a16Ops>; pipeline?: NBitsPipeline; profile?: string } = {}): Promise<{ completions: Completion[]; profiles: string[] }> {
  const device = Device.cpu();
  const plan = q.generation(device, 'float32', opts.kernel ? { quantizedWeights: 'kernel', kernel: opts.kernel, pipeline: opts.pipeline } : {});
  const gen = KvCacheGenerator.create(device, config, plan.tensors, { temperature: 1, rows: 4, maxLength: 24, graphWeights: plan.graphWeights, session: { ...plan.session, ...(opts.profile ? { profilePrefix: opts.profile } : {}) } });
  try {
    const completions = await gen.generate(prompts, { maxNewTokens: 12, seed: 7 });
    return { completions, profiles: opts.profile ? gen.endProfiling() : [] };
  } finally {
    gen.dispose();
    for (const t of plan.tensors.values()) t.dispose();
  }
}

test.each([1, 2, 3, 0])('a KV-cache generator with the pipeline (%i slots) generates what bound MatMulNBits does, each prefetch placed just before the product after the one it follows (CPU)', async (slots) => {
  const kernel = w4a16Ops('cpu');
  const gemm = w4a16GemmOps('cpu', undefined, { slots });
  const pipe = recording(gemm);
  const dir = mkdtempSync(join(tmpdir(), 'lathe-pipeline-'));
  try {
    const bound = await generate(int4);
    const viaPipeline = await generate(int4, { kernel, pipeline: pipe, profile: join(dir, 'p') });
    gemm.check();
    kernel.check();
    // prefill (rows unknown at build) read all 8 products through the pipeline; the decode step (4 rows) none
    expect(pipe.keys.map((k) => k.length)).toEqual([8]);
    expect(viaPipeline.completions.map((c) => c.tokens)).toEqual(bound.completions.map((c) => c.tokens));
    viaPipeline.completions.forEach((c, k) => c.rawLogprobs.forEach((x, t) => expect(Math.abs(x - bound.completions[k].rawLogprobs[t])).toBeLessThan(1e-4)));
    // ORT's order in the prefill run: the prefetch of j + slots just before product j + 1 (after the attention or norm between)
    const events = JSON.parse(readFileSync(viaPipeline.profiles[0], 'utf8')) as { cat: string; name: string; args?: { op_name?: string } }[];
    const ops = events.filter((e) => e.cat === 'Node' && e.name.endsWith('_kernel_time')).map((e) => e.args?.op_name ?? '');
    // the first prefill run: its 8 products and the prefetches before the last of them
    const gemms = ops.map((op, i) => (op.startsWith('W4A16Gemm') ? i : -1)).filter((i) => i >= 0).slice(0, 8);
    const prefetches = ops.map((op, i) => (op.startsWith('W4A16Prefetch') && i < gemms[7] ? i : -1)).filter((i) => i >= 0);
    expect(gemms.length).toBe(8);
    expect(prefetches.length).toBe(slots === 0 ? 0 : 8);
    for (let j = 0; j + slots < 8 && slots > 0; j++) expect(prefetches[j + slots]).toBe(gemms[j + 1] - 1);
    if (slots > 0) expect(prefetches.every((p, j) => p < gemms[j])).toBe(true);
  } finally {
    rmSync(dir, { recursive: true, force: true });
    kernel.dispose();
    gemm.dispose();
  }
});

test('with group 4 each layer dequantizes in one launch: the first product takes the four weights and the previous layer output, the others read the first output; the generator generates what bound MatMulNBits does (CPU)', async () => {
  const kernel = w4a16Ops('cpu');
  const gemm = w4a16GemmOps('cpu', undefined, { group: 4 });
  expect([gemm.slots, gemm.group]).toEqual([0, 4]);
  const g = new L.Graph('group');
  const w = int4.graphWeights(g, { dtype: 'float32', quantizedWeights: 'kernel', kernel, pipeline: gemm, kernelMaxRows: 0 }).weights;
  const x = g.input('x', 'float32', ['B', 'P', 64]);
  const node = (t: L.Tensor) => g.nodes.find((n) => n.outputs.includes(t))!;
  const layer = (i: number, h: L.Tensor) => {
    const p = `model.layers.${i}`;
    const q = w.matmul!(`${p}.self_attn.q_proj.weight`, h)!;
    const o = w.matmul!(`${p}.self_attn.o_proj.weight`, q)!;
    const gate = w.matmul!(`${p}.mlp.gate_proj.weight`, o)!;
    const down = w.matmul!(`${p}.mlp.down_proj.weight`, g.input(`m${i}`, 'float32', ['B', 'P', 96]))!;
    return { q, o, gate, down };
  };
  const l0 = layer(0, x);
  const l1 = layer(1, l0.down);
  // the first product: x, then B, scales and zero points of q/k/v, o, gate/up and down (K 64, 64, 64, 96)
  expect([node(l0.q).op.name, node(l0.q).inputs.length]).toEqual(['W4A16GemmGroup_float32_z64_z64_z64_z96_w64_32_32', 13]);
  // the others at their byte offsets in the scratch (q/k/v 128 × 64, o 64 × 64, gate/up 192 × 64, 2 bytes each), after the first
  expect([l0.o, l0.gate, l0.down].map((t) => [node(t).op.name, node(t).inputs.at(-1) === l0.q])).toEqual([
    ['W4A16GemmMemberZp_float32_at16384', true],
    ['W4A16GemmMemberZp_float32_w96_96_at24576', true],
    ['W4A16GemmMemberZp_float32_at49152', true],
  ]);
  // the next layer's launch waits for this layer's last product
  expect([node(l1.q).op.name, node(l1.q).inputs.at(-1) === l0.down]).toEqual(['W4A16GemmGroup_float32_z64_z64_z64_z96_w64_32_32_after', true]);
  expect(() => w.matmul!('model.layers.0.mlp.down_proj.weight', l1.q)).toThrow(/was asked for where none \(all 8 were read\) comes next/);
  expect(() => w4a16GemmOps('cpu', undefined, { group: 5 })).toThrow(/group must be an integer from 1 to 4, got 5/);
  expect(() => w4a16GemmOps('cpu', undefined, { group: 2, slots: 2 })).toThrow(/group 2 dequantizes on the compute stream and takes no slots/);
  gemm.dispose();
  const run = w4a16GemmOps('cpu', undefined, { group: 4 });
  try {
    const bound = await generate(int4);
    const grouped = await generate(int4, { kernel, pipeline: run });
    run.check();
    expect(grouped.completions.map((c) => c.tokens)).toEqual(bound.completions.map((c) => c.tokens));
    grouped.completions.forEach((c, k) => c.rawLogprobs.forEach((v, t) => expect(Math.abs(v - bound.completions[k].rawLogprobs[t])).toBeLessThan(1e-4)));
  } finally {
    kernel.dispose();
    run.dispose();
  }
});

test('the slot engine (lathe serve) over the group-4 pipeline, prefill and decode steps through it: the greedy tokens of bound MatMulNBits (CPU)', async () => {
  const device = Device.cpu();
  const kernel = w4a16Ops('cpu');
  const gemm = w4a16GemmOps('cpu', undefined, { group: 4 });
  const pipe = recording(gemm);
  const plan = int4.generation(device, 'float32', { quantizedWeights: 'kernel', kernel, pipeline: pipe, kernelMaxRows: 0 });
  const engine = SlotEngine.create(device, config, plan.tensors, { slots: 3, maxLength: 24, graphWeights: plan.graphWeights, session: plan.session });
  const boundPlan = int4.generation(device, 'float32');
  const boundGen = KvCacheGenerator.create(device, config, boundPlan.tensors, { temperature: 0, rows: 4, maxLength: 24, graphWeights: boundPlan.graphWeights, session: boundPlan.session });
  try {
    const admitted = engine.admit(prompts.map((prompt) => ({ prompt, rows: [{ sampling: { temperature: 0 }, seed: 0, key: 0 }] })));
    const got = new Map<number, number[]>(admitted.map((a) => [a.slots[0], a.tokens.map((t: SlotToken) => t.token)]));
    for (let step = 0; step < 5; step++) for (const t of engine.step()) got.get(t.slot)!.push(t.token);
    gemm.check();
    kernel.check();
    const bound = await boundGen.generate(prompts, { maxNewTokens: 6 });
    expect(admitted.map((a) => got.get(a.slots[0]))).toEqual(bound.map((c) => c.tokens));
    // every graph the engine built (prefill, decode) read all 8 products through the pipeline, in order
    const read = pipe.keys.filter((k) => k.length > 0);
    expect(read.length).toBeGreaterThanOrEqual(2);
    expect(read.every((k) => k.length === 8)).toBe(true);
  } finally {
    engine.dispose();
    boundGen.dispose();
    for (const t of [...plan.tensors.values(), ...boundPlan.tensors.values()]) t.dispose();
    kernel.dispose();
    gemm.dispose();
  }
});
