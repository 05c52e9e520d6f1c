/**
 * How long graph compilation takes for a decoder the size of Qwen3-0.6B (28 layers) with its full
 * backward pass: DSL build, autodiff, serialization, and ONNX Runtime session creation (CPU
 * provider, no weights inside the model: they are graph inputs, as in training). Prints one JSON
 * line per phase set.
 *
 * usage: npx tsx --conditions=lathe-source tools/bench/onnx/compile-time.ts [--layers 28] [--opt all|basic|disabled]
 */
import * as ort from 'onnxruntime-node';
import * as L from '@lathe/onnx';
import { decoder, lmLogits, paddedCausalMask, paramSpecs, parseConfig, positionsFromPadding, weightInputs } from '@lathe/models';
import { arg, flag } from '../argv';
import { QWEN3_0_6B } from '../shapes';


async function main(): Promise<void> {
  const layers = Number(arg('layers', '28'));
  const opt = arg('opt', 'all') as 'all' | 'basic' | 'disabled';
  const config = parseConfig({ ...QWEN3_0_6B, num_hidden_layers: layers });
  const t0 = performance.now();
  const g = new L.Graph('train_step');
  const dims: L.Dim[] = flag('static') ? [8, 1024] : ['B', 'T'];
  const ids = g.input('input_ids', 'int64', dims);
  const mask = g.input('attention_mask', 'int64', dims);
  const targets = g.input('targets', 'int64', dims);
  // float32 compute: ORT's CPU provider has no bf16 kernels (the graph's structure is the same).
  const { weights, inputs } = weightInputs(g, config, 'float32', arg('dtype', 'float32') as L.DType);
  const { hidden } = decoder(config, weights, { inputIds: ids, positionIds: positionsFromPadding(mask), attentionMask: paddedCausalMask(mask) });
  const loss = L.maskedMean(L.crossEntropy(L.cast(lmLogits(config, weights, hidden), 'float32'), targets), mask);
  const t1 = performance.now();
  const params = paramSpecs(config).map((s) => inputs.get(s.name)!);
  const grads = flag('forward-only') ? [] : L.grad(loss, params);
  g.output(loss, 'loss');
  grads.forEach((gr, i) => g.output(gr, `grad_${i}`));
  const t2 = performance.now();
  const bytes = L.toModelBytes(g);
  const t3 = performance.now();
  const device = arg('device', 'cpu');
  const session = await ort.InferenceSession.create(bytes, {
    executionProviders: device === 'cuda' ? [{ name: 'cuda', deviceId: 0 }] : ['cpu'],
    graphOptimizationLevel: opt,
  });
  const t4 = performance.now();
  console.log(
    JSON.stringify({
      layers,
      nodes: g.nodes.length,
      model_bytes: bytes.byteLength,
      build_forward_ms: +(t1 - t0).toFixed(1),
      autodiff_ms: +(t2 - t1).toFixed(1),
      serialize_ms: +(t3 - t2).toFixed(1),
      ort_session_ms: +(t4 - t3).toFixed(1),
      ort_optimization: opt,
      device,
      dtype: arg('dtype', 'float32'),
      total_ms: +(t4 - t0).toFixed(1),
      inputs: session.inputNames.length,
      outputs: session.outputNames.length,
    }),
  );
}

main().catch((e: unknown) => {
  console.error(e instanceof Error ? e.stack : e);
  process.exit(1);
});
