/**
 * The quantized generation path (`quantizedWeights: 'kernel'`, the W4A16 op's CPU path) with fewer
 * glue nodes a layer: the residual adds fused into the next RMSNorm (two nodes fewer) and, opted in,
 * the SwiGLU kernel (`swigluOps`' CPU path) in place of QuickGelu·Mul (one fewer); each generates
 * the greedy tokens and log-probs of the plain graphs (CPU, float32).
 */
import * as L from '@lathe/onnx';
import { CausalLM } from '@lathe/models';
import { Device } from '@lathe/runtime';
import { addKvDecodeStep, addKvPrefill, KvCacheGenerator, type Completion, type KvCacheGeneratorOptions } from '@lathe/rollout';
import { swigluOps, w4a16Ops } from '@lathe/kernels';
import { QuantizedModel } from '@lathe/quantization';
import { tinyQwen3 } from './data';

const original = CausalLM.random({ ...tinyQwen3, num_hidden_layers: 3 }, { seed: 5, std: 0.08 });
const config = original.config;
const q = QuantizedModel.quantize(config, original.float32Weights(), { format: 'int4', blockSize: 32 });
const prompts = [[5, 9, 11, 3], [7, 2], [30, 31, 32]];

test('decode step over the kernel: two nodes fewer a layer, the projections still through the op', () => {
  const ops = w4a16Ops('cpu');
  try {
    const nodes = (fuseResidualNorm: boolean) => {
      const g = new L.Graph();
      const w = q.graphWeights(g, { dtype: 'float32', quantizedWeights: 'kernel', kernel: ops }).weights;
      addKvDecodeStep(g, config, w, 'float32', { temperature: 0 }, { K: 1, rows: 4, fuseResidualNorm });
      return L.toModelProto(g).graph.node.map((n) => n.opType);
    };
    const plain = nodes(false);
    const fused = nodes(true);
    expect(plain.length - fused.length).toBe(2 * config.numLayers);
    expect(fused.filter((o) => o === 'SkipSimplifiedLayerNormalization')).toHaveLength(2 * config.numLayers);
    const kernelNodes = (n: string[]) => n.filter((o) => o.startsWith('W4A16MatMul')).length;
    expect(kernelNodes(fused)).toBe(kernelNodes(plain));
    expect(kernelNodes(fused)).toBe(4 * config.numLayers);
  } finally {
    ops.dispose();
  }
});

test('the SwiGLU kernel in the decode step and the prefill: one node a layer in place of QuickGelu and Mul', () => {
  const ops = w4a16Ops('cpu');
  const swiglu = swigluOps('cpu');
  try {
    const nodes = (withKernel: boolean, add = addKvDecodeStep) => {
      const g = new L.Graph();
      const w = q.graphWeights(g, { dtype: 'float32', quantizedWeights: 'kernel', kernel: ops }).weights;
      add(g, config, w, 'float32', { temperature: 0 }, { K: 1, rows: 4, ...(withKernel ? { swiglu } : {}) });
      return L.toModelProto(g).graph.node.map((n) => n.opType);
    };
    const prefill = nodes(true, addKvPrefill);
    expect(prefill.filter((o) => o === 'QuickGelu')).toEqual([]);
    expect(prefill.filter((o) => o.startsWith('SwiGLU'))).toHaveLength(config.numLayers);
    expect(nodes(false, addKvPrefill).length - prefill.length).toBe(config.numLayers);
    const plain = nodes(false);
    const kernel = nodes(true);
    expect(plain.length - kernel.length).toBe(config.numLayers);
    expect(kernel.filter((o) => o === 'QuickGelu')).toEqual([]);
    expect(kernel.filter((o) => o.startsWith('SwiGLU'))).toHaveLength(config.numLayers);
  } finally {
    ops.dispose();
    swiglu.dispose();
  }
});

test('greedy over the kernel: the fused graphs, and the SwiGLU kernel, generate the plain graphs’ tokens, log-probs within 1e-4 (CPU, float32)', async () => {
  const device = Device.cpu();
  const ops = w4a16Ops('cpu');
  const swiglu = swigluOps('cpu');
  const run = async (o: Pick<KvCacheGeneratorOptions, 'fuseResidualNorm' | 'swiglu'>): Promise<Completion[]> => {
    const plan = q.generation(device, 'float32', { quantizedWeights: 'kernel', kernel: ops });
    const gen = KvCacheGenerator.create(device, config, plan.tensors, { temperature: 0, rows: 4, maxLength: 24, graphWeights: plan.graphWeights, session: plan.session, ...o });
    try {
      return await gen.generate(prompts, { maxNewTokens: 10 });
    } finally {
      gen.dispose();
      for (const t of plan.tensors.values()) t.dispose();
    }
  };
  try {
    const plain = await run({ fuseResidualNorm: false });
    for (const fewer of [await run({}), await run({ swiglu })]) {
      ops.check();
      swiglu.check();
      expect(fewer.map((c) => c.tokens)).toEqual(plain.map((c) => c.tokens));
      expect(fewer.flatMap((c) => c.tokens)).toHaveLength(prompts.length * 10);
      fewer.forEach((c, k) => c.rawLogprobs.forEach((x, t) => expect(Math.abs(x - plain[k].rawLogprobs[t])).toBeLessThan(1e-4)));
    }
  } finally {
    ops.dispose();
    swiglu.dispose();
  }
});
