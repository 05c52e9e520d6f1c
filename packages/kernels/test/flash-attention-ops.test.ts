/**
 * The graph side of the flash-attention kernels on the CPU: the custom ops (host compute) with the
 * gradient rule that emits the backward op, placed in the decoder through `FlashAttentionInputs.kernel`,
 * against the decoder's GroupQueryAttention path with its composed gradient rule (ORT's CPU
 * kernels, float32): the same log-probs at every token of a right-padded batch and the same
 * gradient for every weight. The kernels themselves are tested in flash-attention-emulated.slow.test.ts
 * (CPU emulation) and on the GPU by tools/bench/kernels/flash-check.ts.
 */
import { mkdirSync, mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import * as L from '@lathe/onnx';
import { decoder, lmLogits, type FlashAttentionInputs, paddedCausalMask, paramSpecs, positionsFromPadding, rightPaddedAttention, targetLogprobs, weightInputs } from '@lathe/models';
import { Device } from '@lathe/runtime';
import { cudaIncludeDir, flashAttentionOps, flashAttentionUnsupported } from '@lathe/kernels';
import { tinyModel, tinyQwen3, weightFeeds } from '../../models/test/tiny';

const ids = [
  [3, 14, 15, 9, 2, 6],
  [7, 1, 8, 0, 0, 0], // right-padded: 3 tokens
  [5, 5, 4, 3, 2, 0],
];
const mask = ids.map((row, r) => row.map((_, t) => ((r === 1 ? t < 3 : r === 2 ? t < 5 : true) ? 1 : 0)));

describe.each([
  ['the kernels\' forward and backward', 'kernels', 'FlashAttention_float32', 'FlashAttentionGrad_float32'],
  ['GroupQueryAttention\'s forward and the kernels\' backward', 'backward', 'GroupQueryAttention', 'FlashAttentionGradAfterGqa_float32'],
] as const)('%s', (_name, mode, fwdOp, bwdOp) => {
  test('the decoder with the kernel ops gives GroupQueryAttention’s log-probs and weight gradients (CPU, float32)', () => {
    const { dir, config } = tinyModel(tinyQwen3, 3);
    const ops = flashAttentionOps('cpu');
    let calls = 0;
    const attend: FlashAttentionInputs['kernel'] = (x, heads) => {
      calls++;
      return ops.attend(x, heads, mode);
    };
    const g = new L.Graph('kernel_vs_gqa');
    const inputIds = g.input('input_ids', 'int64', [3, 6]);
    const padMask = g.input('attention_mask', 'int64', [3, 6]);
    const total = g.constant(6, 'int32', []);
    const { weights, inputs } = weightInputs(g, config, 'float32', 'float32');
    const positionIds = positionsFromPadding(padMask);
    const tokenWeights = g.input('token_weights', 'float32', [3, 6]);
    const names = paramSpecs(config).map((s) => s.name);
    const before = { fwd: 0, bwd: 0 };
    for (const path of ['gqa', 'kernel'] as const) {
      if (path === 'kernel') {
        before.fwd = g.nodes.filter((n) => n.op.name === fwdOp).length;
        before.bwd = g.nodes.filter((n) => n.op.name === bwdOp).length;
      }
      const rows = rightPaddedAttention(padMask, total);
      const { hidden } = decoder(config, weights, { inputIds, positionIds, attentionMask: paddedCausalMask(padMask), flashAttention: path === 'kernel' ? { ...rows, kernel: attend } : rows });
      const lp = targetLogprobs(lmLogits(config, weights, hidden), inputIds);
      g.output(lp, `${path}/logp`);
      const loss = L.reduceSum(L.mul(L.mul(lp, tokenWeights), L.cast(padMask, 'float32')));
      L.grad(loss, names.map((n) => inputs.get(n)!)).forEach((d, i) => g.output(d, `${path}/d/${names[i]}`));
    }
    expect(calls).toBe(config.numLayers);
    expect(g.nodes.filter((n) => n.op.name === fwdOp).length - before.fwd).toBe(config.numLayers);
    expect(g.nodes.filter((n) => n.op.name === bwdOp).length - before.bwd).toBe(config.numLayers);
    const session = Device.cpu().compile(g, { customOpDomains: [ops.domain.handle] });
    const b = session.binding();
    const feeds = {
      ...weightFeeds(dir, config, 'float32'),
      input_ids: { data: BigInt64Array.from(ids.flat().map(BigInt)), dims: [3, 6] },
      attention_mask: { data: BigInt64Array.from(mask.flat().map(BigInt)), dims: [3, 6] },
      token_weights: { data: Float32Array.from({ length: 18 }, (_, i) => Math.sin(i + 1)), dims: [3, 6] },
    };
    for (const [name, t] of Object.entries(feeds)) b.input(name, t);
    const outNames = ['gqa', 'kernel'].flatMap((p) => [`${p}/logp`, ...names.map((n) => `${p}/d/${n}`)]);
    for (const n of outNames) b.output(n, 'host');
    b.runSync();
    ops.check();
    const values = (name: string) => Array.from(b.fetch(name).data as Float32Array);
    const gqa = values('gqa/logp');
    const kernel = values('kernel/logp');
    mask.flat().forEach((m, i) => {
      if (m) expect(Math.abs(kernel[i] - gqa[i])).toBeLessThan(2e-5);
    });
    for (const name of names) {
      const a = values(`gqa/d/${name}`);
      const k = values(`kernel/d/${name}`);
      const scale = Math.max(...a.map(Math.abs));
      expect(scale).toBeGreaterThan(0);
      expect(Math.max(...a.map((x, i) => Math.abs(x - k[i]))) / scale).toBeLessThan(1e-4);
    }
    b.dispose();
    session.dispose();
    ops.dispose();
  });
});

test('shapes outside the kernels are named (the caller keeps the composed path)', () => {
  const shape = { batch: 8, seqLen: 1024, numHeads: 16, numKvHeads: 8, headDim: 128, dtype: 'bfloat16' as const };
  expect(flashAttentionUnsupported(shape)).toBeUndefined();
  expect(flashAttentionUnsupported({ ...shape, dtype: 'float32' })).toMatch(/dtype float32/);
  expect(flashAttentionUnsupported({ ...shape, headDim: 96 })).toMatch(/head size 96 .*64 or 128/);
  expect(flashAttentionUnsupported({ ...shape, numKvHeads: 3 })).toMatch(/16 query heads over 3 KV heads/);
});

test('CUDA ops need the compiled kernels; a dtype without a kernel is refused by name', () => {
  expect(() => flashAttentionOps('cuda')).toThrow(/CUDA needs the compiled FlashAttention kernels/);
  const ops = flashAttentionOps('cpu');
  const g = new L.Graph('half');
  const q = g.input('q', 'float16', [1, 4, 128]);
  const k = g.input('k', 'float16', [1, 4, 64]);
  const x = { query: q, key: k, value: k, seqlensK: g.input('s', 'int32', [1]), totalSequenceLength: g.constant(4, 'int32', []) };
  expect(() => ops.attend(x, { numHeads: 2, kvNumHeads: 1 })).toThrow(/no kernel for dtype float16 \(takes float32\)/);
  ops.dispose();
});

test('the CUDA include folder: LATHE_CUDA_INCLUDE wins and must hold mma.h; else CUDA_HOME/include', () => {
  const root = mkdtempSync(join(tmpdir(), 'lathe-cuda-include-'));
  const include = join(root, 'include');
  mkdirSync(include);
  expect(() => cudaIncludeDir({ LATHE_CUDA_INCLUDE: include })).toThrow(`LATHE_CUDA_INCLUDE=${include} holds no mma.h`);
  writeFileSync(join(include, 'mma.h'), '');
  expect(cudaIncludeDir({ LATHE_CUDA_INCLUDE: include })).toBe(include);
  expect(cudaIncludeDir({ CUDA_HOME: root })).toBe(include);
});
