/**
 * Computes logits (or per-token log-probs) of a batch with a Lathe decoder built from a Hugging
 * Face folder, on CUDA or CPU through onnxruntime-node, for parity and throughput checks.
 *
 * usage: node lathe-logits.js --model DIR --batch batch.json --dtype float32|bfloat16|float16
 *          [--device cuda|cpu] [--out logits.bin] [--logprobs] [--repeat N] [--primitives] [--gqa]
 *        node lathe-logits.js --model DIR --save OUT_DIR
 * --save: read the model's weights and write them with Lathe's saver (saveHfModel) to OUT_DIR,
 * then exit; the parity script checks that transformers loads that folder to the same logits.
 * --gqa: attention through ONNX Runtime's GroupQueryAttention (flash attention; fp16/bf16 on CUDA),
 * which takes right-padded rows: left-padded rows are moved left here and the results moved back.
 * batch.json: {"input_ids": [[...]], "attention_mask": [[...]]}
 * Writes float32 little-endian values to --out and prints one JSON line of timings.
 */
import { readFileSync, writeFileSync } from 'node:fs';
import { basename, join, resolve } from 'node:path';
import * as ort from 'onnxruntime-node';
import * as L from '@lathe/onnx';
import {
  chunkedTargetLogprobs,
  decoder,
  externalDataFolder,
  lmLogits,
  paddedCausalMask,
  paramSpecs,
  positionsFromPadding,
  readConfig,
  readTensorBytes,
  rightPaddedGqaInputs,
  totalLength,
  readWeightIndex,
  saveHfModel,
  weightInitializers,
} from '@lathe/models';
import { arg, flag } from '../argv';


/** Writes the model in `dir` to `out` through Lathe's saver (weights as stored, tokenizer files copied). */
function saveWithLathe(dir: string, out: string): void {
  const { config } = readConfig(dir);
  const index = readWeightIndex(dir);
  const tensors = paramSpecs(config).map((s) => {
    const e = index.get(s.name);
    if (!e) throw new Error(`${dir}: missing tensor '${s.name}'`);
    return { name: s.name, dtype: e.dtype, shape: e.shape, data: readTensorBytes(e) };
  });
  saveHfModel(out, config, tensors, { tokenizerFrom: dir });
  console.log(JSON.stringify({ model: basename(dir), saved: out, tensors: tensors.length }));
}

async function main(): Promise<void> {
  const dir = resolve(arg('model'));
  const saveTo = arg('save', '');
  if (saveTo) return saveWithLathe(dir, resolve(saveTo));
  const dtype = arg('dtype', 'float32') as L.DType;
  const device = arg('device', 'cuda');
  const logprobs = flag('logprobs');
  const repeat = Number(arg('repeat', '1'));
  const batch = JSON.parse(readFileSync(arg('batch'), 'utf8')) as { input_ids: number[][]; attention_mask: number[][] };
  const { config } = readConfig(dir);

  const t0 = performance.now();
  const g = new L.Graph('lathe_scoring');
  const ids = g.input('input_ids', 'int64', ['B', 'T']);
  const mask = g.input('attention_mask', 'int64', ['B', 'T']);
  const index = readWeightIndex(dir);
  const { dir: work, location } = externalDataFolder([...index.values()].map((e) => e.file));
  const w = weightInitializers(g, config, index, dtype, location);
  // Fused RMSNorm/RoPE kernels unless --primitives (the training graphs' composition) is asked for.
  const fused = !flag('primitives');
  const gqa = flag('gqa');
  const { hidden } = gqa
    ? // T: fed as a host input (GroupQueryAttention reads it on the CPU) unless the shape is static
      decoder(config, w, rightPaddedGqaInputs(ids, mask, totalLength(g, ids)))
    : decoder(config, w, { inputIds: ids, positionIds: positionsFromPadding(mask), attentionMask: paddedCausalMask(mask), fused });
  if (logprobs) {
    // log p(token t+1 | ≤ t) at every position (the last one scores the first token again, so
    // every shape stays static: it is dropped by whoever reads the result).
    const next = L.concat([L.slice(ids, [1], [1]), L.slice(ids, [1], [0], [1])], 1);
    g.output(chunkedTargetLogprobs(config, w, hidden, next), 'out');
  } else {
    g.output(L.cast(lmLogits(config, w, hidden), 'float32'), 'out');
  }
  const modelPath = join(work, 'model.onnx');
  writeFileSync(modelPath, L.toModelBytes(g));
  const tBuild = performance.now();
  const session = await ort.InferenceSession.create(modelPath, {
    executionProviders: device === 'cuda' ? [{ name: 'cuda', deviceId: 0 }] : ['cpu'],
    graphOptimizationLevel: 'all',
    // CPU fallback stays off on CUDA unless asked for (--allow-cpu-fallback --log 1 lists placements).
    extra: { session: { disable_cpu_ep_fallback: device === 'cuda' && !flag('allow-cpu-fallback') ? '1' : '0' } },
    logSeverityLevel: Number(arg('log', '3')) as 0 | 1 | 2 | 3 | 4,
  });
  const tSession = performance.now();
  const B = batch.input_ids.length;
  const T = batch.input_ids[0].length;
  // Left pads per row; with --gqa each row's tokens are moved to the front.
  const pads = batch.attention_mask.map((m) => m.indexOf(1) < 0 ? T : m.indexOf(1));
  const move = <X>(row: X[], p: number, fill: X) => (gqa ? [...row.slice(p), ...new Array<X>(p).fill(fill)] : row);
  const feeds = {
    input_ids: new ort.Tensor('int64', BigInt64Array.from(batch.input_ids.flatMap((r, b) => move(r, pads[b], 0)).map(BigInt)), [B, T]),
    attention_mask: new ort.Tensor('int64', BigInt64Array.from(batch.attention_mask.flatMap((r, b) => move(r, pads[b], 0)).map(BigInt)), [B, T]),
    ...(gqa ? { total_sequence_length: new ort.Tensor('int32', Int32Array.from([T]), []) } : {}),
  };
  let out = (await session.run(feeds)).out; // warm-up (and the result)
  const times: number[] = [];
  for (let i = 0; i < repeat; i++) {
    const s = performance.now();
    out = (await session.run(feeds)).out;
    times.push(performance.now() - s);
  }
  const outPath = arg('out', '');
  if (outPath) {
    let data = out.data as Float32Array;
    if (gqa) {
      // Move each row's positions back to where the left-padded batch had them.
      const per = data.length / (B * T);
      const back = new Float32Array(data.length);
      for (let b = 0; b < B; b++) for (let t = 0; t + pads[b] < T; t++) back.set(data.subarray((b * T + t) * per, (b * T + t + 1) * per), (b * T + t + pads[b]) * per);
      data = back;
    }
    writeFileSync(outPath, Buffer.from(data.buffer));
  }
  const best = Math.min(...times);
  console.log(
    JSON.stringify({
      model: basename(dir),
      dtype,
      device,
      attention: gqa ? 'GroupQueryAttention' : fused ? 'composed, fused norms/rope' : 'primitives',
      batch: [B, T],
      build_ms: +(tBuild - t0).toFixed(1),
      session_ms: +(tSession - tBuild).toFixed(1),
      run_ms_best: +best.toFixed(2),
      run_ms_median: +times.sort((a, b) => a - b)[Math.floor(times.length / 2)].toFixed(2),
      tokens_per_s: Math.round((B * T) / (best / 1000)),
      out_dims: out.dims,
    }),
  );
}

main().catch((e: unknown) => {
  console.error(e instanceof Error ? e.stack : e);
  process.exit(1);
});
