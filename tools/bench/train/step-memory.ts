/**
 * Peak host memory of one SFT train step on ONNX Runtime's CPU provider, with and without
 * gradient checkpointing: a quick, GPU-free check of what the backward pass keeps alive. Builds a
 * random Qwen3 (hidden 256, 8 heads, `--layers` layers), runs one step of the compiled `step`
 * graph on a `--batch` × `--seq` batch through onnxruntime-node's JS API, and prints one JSON line
 * with the process's peak resident set size (the model and batch are small; the peak is the run's
 * activations).
 *
 * usage: npx tsx --conditions=lathe-source tools/bench/train/step-memory.ts [--layers 8] [--batch 4] [--seq 1024] [--recompute]
 * Run each variant in its own process (the peak is per process).
 */
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import * as ort from 'onnxruntime-node';
import { toModelBytes } from '@lathe/onnx';
import { CausalLM, paramSpecs, randomModel } from '@lathe/models';
import { compileTrainStep, sftLoss, stateNames } from '@lathe/train';
import { arg, flag } from '../argv';

async function main(): Promise<void> {
  const layers = Number(arg('layers', '8'));
  const B = Number(arg('batch', '4'));
  const T = Number(arg('seq', '1024'));
  const recompute = flag('recompute');
  const dir = mkdtempSync(join(tmpdir(), 'lathe-step-memory-'));
  const config = randomModel(dir, { architectures: ['Qwen3ForCausalLM'], vocab_size: 1000, hidden_size: 256, intermediate_size: 512, num_hidden_layers: layers, num_attention_heads: 8, num_key_value_heads: 4, head_dim: 32, rms_norm_eps: 1e-6, rope_theta: 10000, max_position_embeddings: Math.max(2048, T), tie_word_embeddings: true }, { seed: 1, std: 0.02 });
  const params = paramSpecs(config).map((s) => ({ name: s.name, shape: s.shape, decay: s.shape.length > 1 }));
  const step = compileTrainStep({ params, loss: sftLoss(config, { recompute }), optimizer: { weightDecay: 0.01, maxGradNorm: 1 } }).step;
  const weights = (await CausalLM.fromPretrained(dir)).float32Weights();
  const ids = Array.from({ length: B * T }, (_, i) => BigInt(1 + ((i * 104729) % 997)));
  const ones = () => new ort.Tensor('int64', BigInt64Array.from(ids, () => 1n), [B, T]);
  const scalar = (v: number) => new ort.Tensor('float32', Float32Array.from([v]), []);
  const feeds: Record<string, ort.Tensor> = { input_ids: new ort.Tensor('int64', BigInt64Array.from(ids), [B, T]), attention_mask: ones(), loss_mask: ones(), loss_tokens: scalar(B * T), lr: scalar(1e-3), bc1: scalar(0.1), bc2: scalar(0.001) };
  for (const p of params) {
    const w = weights.get(p.name)!;
    feeds[p.name] = new ort.Tensor('float32', w, p.shape);
    feeds[stateNames.m(p.name)] = new ort.Tensor('float32', new Float32Array(w.length), p.shape);
    feeds[stateNames.v(p.name)] = new ort.Tensor('float32', new Float32Array(w.length), p.shape);
  }
  const session = await ort.InferenceSession.create(toModelBytes(step), { executionProviders: ['cpu'], intraOpNumThreads: 2 });
  const beforeRunMB = process.resourceUsage().maxRSS / 1024;
  const t0 = performance.now();
  const out = await session.run(feeds);
  const runS = (performance.now() - t0) / 1000;
  console.log(JSON.stringify({ layers, batch: [B, T], recompute, loss: (out.loss.data as Float32Array)[0], run_s: Number(runS.toFixed(2)), peak_before_run_mb: Math.round(beforeRunMB), peak_rss_mb: Math.round(process.resourceUsage().maxRSS / 1024) }));
}

main().catch((e: unknown) => {
  console.error(e);
  process.exit(1);
});
