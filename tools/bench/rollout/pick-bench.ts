/**
 * What picking the next token costs over a large vocabulary, one candidate graph at a time (GPU
 * machine): float32 logits [rows, V] bound on the device, each candidate run `--runs` times
 * back to back (synchronised once at the end), time per run reported. The candidates are the
 * decode step's current greedy tail (sampleNext at temperature 0) and the primitives a faster one
 * could be built from: max and argmax over 128-wide chunks by ReduceMax (what the tail uses) and
 * by MaxPool (windowMax: ONNX Runtime runs it as a pooling kernel, not a general reduction), as
 * [rows, 1, V], as [8, rows/8, V] (rows as channels) and as [8, 1, rows/8, V], lastAxisMax, TopK(1), and the
 * log-partition by Exp/ReduceSum or by LogSoftmax. A run's fixed overhead (an empty graph) is
 * printed too, to subtract.
 *
 * usage: node .bundle/pick-bench.js [--rows 256] [--vocab 151936] [--runs 200]
 * Prints one JSON line per candidate.
 */
import * as L from '@lathe/onnx';
import type { Tensor } from '@lathe/onnx';
import { Device } from '@lathe/runtime';
import { sampleNext } from '@lathe/rollout';
import { arg } from '../argv';

function main(): void {
  const R = Number(arg('rows', '256'));
  const V = Number(arg('vocab', '151936'));
  const runs = Number(arg('runs', '200'));
  const k = 128;
  const C = V / k;
  const device = Device.open('cuda');
  const logits = device.empty('float32', [R, V]);
  const host = new Float32Array(R * V);
  let s = 1;
  for (let i = 0; i < host.length; i++) {
    s = (s * 1103515245 + 12345) >>> 0;
    host[i] = (s / 2 ** 32) * 20 - 10;
  }
  logits.upload(host);

  const candidates: Record<string, (x: Tensor) => Tensor[]> = {
    empty: (x) => [L.slice(x, [1], [0], [1])],
    greedy_tail_now: (x) => {
      const r = sampleNext(x, { temperature: 0 });
      return [r.tokens, r.logprobs];
    },
    reducemax_chunks: (x) => [L.reduceMax(L.reshape(x, [R, C, k]), [2])],
    reducemax_row: (x) => [L.reduceMax(x, [1])],
    reducemax_bf16_chunks: (x) => [L.reduceMax(L.reshape(L.cast(x, 'bfloat16'), [R, C, k]), [2])],
    maxpool_chunks: (x) => [L.windowMax(L.reshape(x, [R, 1, V]), k)],
    maxpool_chunks_indices: (x) => L.windowMaxWithIndex(L.reshape(x, [R, 1, V]), k),
    maxpool_rows_as_channels: (x) => [L.windowMax(L.reshape(x, [8, R / 8, V]), k)],
    maxpool_rows_as_height: (x) => [L.windowMax(L.reshape(x, [8, 1, R / 8, V]), k)],
    lastaxismax_rank3: (x) => [L.lastAxisMax(L.reshape(x, [8, R / 8, V]))],
    lastaxismax: (x) => [L.lastAxisMax(x)],
    maxpool_two_stage: (x) => {
      const c = L.windowMax(L.reshape(x, [R, 1, V]), k);
      return [L.windowMax(c, C)];
    },
    topk1: (x) => L.topK(x, 1, -1),
    exp_sum_chunks: (x) => [L.reduceSum(L.exp(L.sub(L.reshape(x, [R, C, k]), 3)), [2])],
    logsoftmax_row: (x) => [L.logSoftmax(x, -1)],
    softmax_row: (x) => [L.softmax(x, -1)],
    cast_bf16: (x) => [L.cast(x, 'bfloat16')],
  };
  for (const [name, build] of Object.entries(candidates)) {
    try {
      const g = new L.Graph(name);
      const x = g.input('x', 'float32', [R, V]);
      build(x).forEach((t, i) => g.output(t, `y${i}`));
      const session = device.compile(g, { name });
      const b = session.binding().input('x', logits);
      session.outputs.forEach((o) => b.output(o.name, 'device'));
      for (let i = 0; i < 5; i++) b.runSync();
      const t0 = performance.now();
      for (let i = 0; i < runs; i++) b.runSync({ synchronize: false });
      b.synchronize();
      const us = ((performance.now() - t0) / runs) * 1000;
      console.log(JSON.stringify({ candidate: name, rows: R, vocab: V, us_per_run: +us.toFixed(1) }));
      b.dispose();
      session.dispose();
    } catch (e) {
      console.log(JSON.stringify({ candidate: name, error: String(e).slice(0, 300) }));
    }
  }
}

main();
