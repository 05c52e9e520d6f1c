import * as L from '@lathe/onnx';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { paramSpecs, randomModel, readTensorBytes, readWeightIndex } from '@lathe/models';
import { compileTrainStep, sftLoss, stateNames, useFlashAttention, type TrainableParam } from '@lathe/train';
import { compile, rng, type HostTensor } from '../../../tools/testing/ort-cpu';

const i64 = (rows: number[][]): HostTensor => ({ data: BigInt64Array.from(rows.flat().map(BigInt)), dims: [rows.length, rows[0].length] });
const scalar = (v: number): HostTensor => ({ data: Float32Array.from([v]), dims: [] });

// Two layers, so a leak across examples in layer 1 would also reach layer 2's keys.
const tiny = {
  architectures: ['Qwen3ForCausalLM'],
  vocab_size: 40,
  hidden_size: 16,
  intermediate_size: 32,
  num_hidden_layers: 2,
  num_attention_heads: 2,
  num_key_value_heads: 1,
  head_dim: 8,
  rms_norm_eps: 1e-6,
  rope_theta: 10000,
  max_position_embeddings: 64,
  tie_word_embeddings: true,
};

function setup() {
  const dir = mkdtempSync(join(tmpdir(), 'lathe-pack-'));
  const config = randomModel(dir, tiny, { seed: 5, std: 0.2 });
  const index = readWeightIndex(dir);
  const params: TrainableParam[] = paramSpecs(config).map((s) => ({ name: s.name, shape: s.shape, decay: s.kind === 'matrix' || s.kind === 'embedding' }));
  const state: Record<string, HostTensor> = {};
  for (const p of params) {
    const b = readTensorBytes(index.get(p.name)!);
    state[p.name] = { data: new Float32Array(b.buffer.slice(b.byteOffset, b.byteOffset + b.byteLength)), dims: p.shape };
    // accumulate from zero: the graph's next/grad outputs are then the gradients themselves
    state[stateNames.grad(p.name)] = { data: new Float32Array(p.shape.reduce((a, c) => a * c, 1)), dims: p.shape };
  }
  return { config, params, state };
}

// Five examples (ids, loss mask): prompt/response masks, and two trained on every token, whose
// first token a packed row must still not predict from the example before it.
const r = rng(11);
const lengths = [7, 4, 6, 3, 3];
const examples = lengths.map((n, k) => {
  const ids = Array.from({ length: n }, () => 1 + Math.floor(r() * 39));
  const lossMask = k % 2 === 1 ? ids.map(() => 1) : ids.map((_, t) => (t >= Math.floor(n / 2) ? 1 : 0));
  return { ids, lossMask };
});
// Tokens the loss predicts, counted per example: every masked token but the example's first.
const lossTokens = examples.reduce((s, e) => s + e.lossMask.slice(1).reduce((a, b) => a + b, 0), 0);

/** The unpacked batch: one example per row, right-padded to the longest (7). */
function unpacked() {
  const T = Math.max(...lengths);
  const pad = (xs: number[]) => [...xs, ...new Array(T - xs.length).fill(0)];
  return {
    input_ids: i64(examples.map((e) => pad(e.ids))),
    attention_mask: i64(examples.map((e) => pad(e.ids.map(() => 1)))),
    loss_mask: i64(examples.map((e) => pad(e.lossMask))),
  };
}

/**
 * The same examples packed by hand into two rows of 12: [0, 1, pad] and [2, 3, 4]. `segments:
 * false` is the control: each row attended as one sequence (one segment, running positions).
 */
function packed(opts: { segments?: boolean } = {}) {
  const T = 12;
  const cols = { input_ids: [] as number[][], segment_ids: [] as number[][], position_ids: [] as number[][], loss_mask: [] as number[][] };
  for (const ks of [[0, 1], [2, 3, 4]]) {
    const row = { input_ids: [] as number[], segment_ids: [] as number[], position_ids: [] as number[], loss_mask: [] as number[] };
    ks.forEach((k, s) => {
      const e = examples[k];
      e.ids.forEach((id, t) => {
        row.input_ids.push(id);
        row.segment_ids.push(opts.segments === false ? 1 : s + 1);
        row.position_ids.push(opts.segments === false ? row.position_ids.length : t);
        row.loss_mask.push(e.lossMask[t]);
      });
    });
    for (const [name, xs] of Object.entries(row)) cols[name as keyof typeof cols].push([...xs, ...new Array(T - xs.length).fill(0)]);
  }
  return { input_ids: i64(cols.input_ids), segment_ids: i64(cols.segment_ids), position_ids: i64(cols.position_ids), loss_mask: i64(cols.loss_mask) };
}

test('a packed step (block-diagonal causal mask, positions restarting per example) has the loss and gradients of the same examples unpacked', async () => {
  const { config, params, state } = setup();
  const plainGraphs = compileTrainStep({ params, loss: sftLoss(config, { chunk: 16 }) });
  const packedGraphs = compileTrainStep({ params, loss: sftLoss(config, { chunk: 16, packing: true }) });
  expect(packedGraphs.batchInputs).toEqual(['input_ids', 'segment_ids', 'position_ids', 'loss_mask', 'loss_tokens']);
  const [plainRun, packedRun] = await Promise.all([compile(plainGraphs.accumulate), compile(packedGraphs.accumulate)]);
  const a = await plainRun({ ...state, ...unpacked(), loss_tokens: scalar(lossTokens) });
  const b = await packedRun({ ...state, ...packed(), loss_tokens: scalar(lossTokens) });
  const loss = Number(a.loss.data[0]);
  expect(loss).toBeGreaterThan(3); // ≈ ln 40 at this init: a real loss, not a masked-out zero
  expect(Math.abs(Number(b.loss.data[0]) - loss)).toBeLessThan(1e-6 * loss);
  expect(Number(b.token_nll_sum.data[0])).toBeCloseTo(Number(a.token_nll_sum.data[0]), 4);
  let maxDiff = 0;
  let maxGrad = 0;
  for (const p of params) {
    const ga = a[stateNames.next(stateNames.grad(p.name))].data as Float32Array;
    const gb = b[stateNames.next(stateNames.grad(p.name))].data as Float32Array;
    ga.forEach((x, i) => {
      maxDiff = Math.max(maxDiff, Math.abs(x - gb[i]));
      maxGrad = Math.max(maxGrad, Math.abs(x));
    });
  }
  expect(maxGrad).toBeGreaterThan(1e-2);
  expect(maxDiff).toBeLessThan(1e-6 * Math.max(1, maxGrad));

  // The control: the same rows attended as one sequence each (no segments, running positions)
  // give another loss — the test would see a leak across examples.
  const leaky = await packedRun({ ...state, ...packed({ segments: false }), loss_tokens: scalar(lossTokens) });
  expect(Math.abs(Number(leaky.loss.data[0]) - loss)).toBeGreaterThan(1e-3);
});

test('packing with flash attention is refused by name, and auto attention picks composed when packing', () => {
  const { config } = setup();
  expect(() => sftLoss(config, { packing: true, flashAttention: true })).toThrow(/packing with attention 'flash' is not supported: GroupQueryAttention .* takes no segment mask/);
  expect(() => useFlashAttention('flash', 'cuda', 'bfloat16', { packing: true })).toThrow(/packing with attention 'flash' is not supported/);
  expect(useFlashAttention('auto', 'cuda', 'bfloat16', { packing: true })).toBe(false);
  expect(useFlashAttention('auto', 'cuda', 'bfloat16')).toBe(true);
});

test('the packed bf16 train step has no run-time shape arithmetic and no op without a CUDA kernel; with a static shape no host-table Concat/Split', () => {
  const { config, params } = setup();
  const graphs = compileTrainStep({ params, loss: sftLoss(config, { compute: 'bfloat16', chunk: 24, packing: true }) });
  for (const g of [graphs.step, graphs.accumulate]) {
    expect(L.runtimeShapeNodes(g).map((n) => n.name)).toEqual([]);
    expect(L.noCudaKernelNodes(g).map((n) => `${n.op.name} ${n.outputs[0]?.dtype} ${n.name}`)).toEqual([]);
  }
  const fixed = compileTrainStep({ params, loss: sftLoss(config, { compute: 'bfloat16', chunk: 24, packing: true, shape: [2, 12] }) });
  expect(L.hostTableNodes(fixed.step)).toEqual([]);
});
