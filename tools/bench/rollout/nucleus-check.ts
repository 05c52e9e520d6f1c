/**
 * top-p without a two-stage top-k, on the GPU: the per-row sort (rows symbolic: a TopK over V per
 * row) against one sort of the whole batch (rows static: `nucleusOneSort`), on the same seeded
 * logits [rows, V] bound on the device. Prints, per case, how many tokens the two keep, how many
 * keep-flags differ (should be 0), and each graph's time per run.
 *
 * usage: node .bundle/nucleus-check.js [--rows 256] [--vocab 151936] [--runs 20] [--device cuda|cpu]
 * Cases: top_p 0.95 and 0.5 over logits uniform in [−s, s] for s = 2 (flat: most of the vocabulary
 * is in the nucleus) and s = 20 (peaked), and top_p 0.95 after temperature 0.6.
 */
import * as L from '@lathe/onnx';
import { Device } from '@lathe/runtime';
import { filteredScores, type SamplingOptions } from '@lathe/rollout';
import { arg } from '../argv';

function main(): void {
  const R = Number(arg('rows', '256'));
  const V = Number(arg('vocab', '151936'));
  const runs = Number(arg('runs', '20'));
  const device = Device.open(arg('device', 'cuda') as 'cuda' | 'cpu');
  const logits = device.empty('float32', [R, V]);
  const cases: [number, SamplingOptions][] = [
    [2, { topP: 0.95 }],
    [2, { topP: 0.5 }],
    [20, { topP: 0.95 }],
    [20, { topP: 0.5 }],
    [20, { temperature: 0.6, topP: 0.95 }],
  ];
  for (const [scale, o] of cases) {
    const host = new Float32Array(R * V);
    let s = 7;
    for (let i = 0; i < host.length; i++) {
      s = (s * 1103515245 + 12345) >>> 0;
      host[i] = ((s / 2 ** 32) * 2 - 1) * scale;
    }
    logits.upload(host);
    const kept: Uint8Array[] = [];
    const us: number[] = [];
    for (const rows of ['R', R]) {
      const g = new L.Graph(`nucleus-${rows}`);
      g.output(L.cast(L.greater(filteredScores(g.input('x', 'float32', [rows, V]), o), -Infinity), 'uint8'), 'keep');
      const session = device.compile(g, { name: g.name });
      const b = session.binding().input('x', logits).output('keep', 'device');
      b.runSync();
      const t0 = performance.now();
      for (let i = 0; i < runs; i++) b.runSync({ synchronize: false });
      b.synchronize();
      us.push(((performance.now() - t0) / runs) * 1000);
      kept.push(b.fetch('keep').data as Uint8Array);
      b.dispose();
      session.dispose();
    }
    let differ = 0;
    let perRow = 0;
    let oneSort = 0;
    for (let i = 0; i < R * V; i++) {
      perRow += kept[0][i];
      oneSort += kept[1][i];
      if (kept[0][i] !== kept[1][i]) differ++;
    }
    console.log(JSON.stringify({ scale, sampling: o, rows: R, vocab: V, kept_per_row_sort: perRow, kept_one_sort: oneSort, flags_differ: differ, us_per_row_sort: +us[0].toFixed(1), us_one_sort: +us[1].toFixed(1) }));
  }
  logits.dispose();
}

main();
