/**
 * The critic's graphs on a tiny random Qwen3 (CPU, float32) against each sequence run alone
 * through the plain causal LM: the packed loss is the restricted-softmax cross-entropy of each
 * labelled token, and the tree pass gives each candidate what its own prefix + candidate gives.
 */
import * as L from '@lathe/onnx';
import { weightInputs } from '@lathe/models';
import { criticLoss, criticTreeProbs, type CriticBins } from '@lathe/critic';
import { compile, type HostTensor } from '../../../tools/testing/ort-cpu';
import { logitsRunner, tinyModel, tinyQwen3, weightFeeds } from '../../models/test/tiny';

const bins: CriticBins = { reward_values: [0, 1], length_edges: [0, 1, 2, 4, 8], first_token_id: 56 };
const CELLS = 8;
const { dir, config } = tinyModel(tinyQwen3, 3);
const feeds = weightFeeds(dir, config, 'float32');
const i64 = (rows: number[][]): HostTensor => ({ data: BigInt64Array.from(rows.flat().map(BigInt)), dims: [rows.length, rows[0].length] });

/** The grid's log-probs at every position of `ids` run alone: log-softmax over the logits of ids 56…63. */
async function aloneCellLogprobs(ids: number[]): Promise<number[][]> {
  const run = await logitsRunner(dir, config, 'padding');
  const logits = (await run({ input_ids: [ids], attention_mask: [ids.map(() => 1)] })).data as Float32Array;
  const V = config.vocabSize;
  return ids.map((_, t) => {
    const z = Array.from({ length: CELLS }, (_, c) => logits[t * V + bins.first_token_id + c]);
    const m = Math.max(...z);
    const lse = m + Math.log(z.reduce((s, v) => s + Math.exp(v - m), 0));
    return z.map((v) => v - lse);
  });
}

const A = { ids: [1, 2, 3, 4, 5], labels: [-1, -1, 6, 5, 4] };
const B = { ids: [7, 8, 9], labels: [-1, 1, 0] };
const C = { ids: [11, 12, 13, 14], labels: [-1, 3, 2, -1] };

async function lossGraph(packing: boolean) {
  const g = new L.Graph('critic-loss');
  const { inputs } = weightInputs(g, config, 'float32', 'float32');
  const { loss, metrics } = criticLoss(config, bins, { packing })(g, inputs);
  g.output(loss, 'loss');
  for (const [k, v] of Object.entries(metrics ?? {})) g.output(v, k);
  return compile(g);
}

async function expectedNll(examples: { ids: number[]; labels: number[] }[]): Promise<{ nll: number; correct: number }> {
  let nll = 0;
  let correct = 0;
  for (const e of examples) {
    const lp = await aloneCellLogprobs(e.ids);
    e.labels.forEach((l, t) => {
      if (l < 0) return;
      nll -= lp[t][l];
      if (lp[t].indexOf(Math.max(...lp[t])) === l) correct++;
    });
  }
  return { nll, correct };
}

describe('critic graphs', () => {
  test('packed loss: two sequences in one row and one alone give their restricted cross-entropy as if each ran alone', async () => {
    const run = await lossGraph(true);
    const W = 10;
    const pad = (xs: number[], v: number) => [...xs, ...Array.from({ length: W - xs.length }, () => v)];
    const out = await run({
      ...feeds,
      input_ids: i64([pad([...A.ids, ...B.ids], 0), pad(C.ids, 0)]),
      segment_ids: i64([pad([...A.ids.map(() => 1), ...B.ids.map(() => 2)], 0), pad(C.ids.map(() => 1), 0)]),
      position_ids: i64([pad([0, 1, 2, 3, 4, 0, 1, 2], 0), pad([0, 1, 2, 3], 0)]),
      labels: i64([pad([...A.labels, ...B.labels], -1), pad(C.labels, -1)]),
      loss_tokens: { data: Float32Array.from([7]), dims: [] },
    });
    const want = await expectedNll([A, B, C]);
    const nll = (out.cell_nll_sum.data as Float32Array)[0];
    expect(Math.abs(nll - want.nll)).toBeLessThan(1e-4);
    expect((out.loss.data as Float32Array)[0]).toBeCloseTo(want.nll / 7, 5);
    expect((out.cell_correct.data as Float32Array)[0]).toBe(want.correct);
  });

  test('padded (unpacked) rows give the same sum', async () => {
    const run = await lossGraph(false);
    const W = 5;
    const pad = (xs: number[], v: number) => [...xs, ...Array.from({ length: W - xs.length }, () => v)];
    const out = await run({
      ...feeds,
      input_ids: i64([A.ids, pad(B.ids, 0), pad(C.ids, 0)]),
      attention_mask: i64([A.ids.map(() => 1), pad(B.ids.map(() => 1), 0), pad(C.ids.map(() => 1), 0)]),
      labels: i64([A.labels, pad(B.labels, -1), pad(C.labels, -1)]),
      loss_tokens: { data: Float32Array.from([7]), dims: [] },
    });
    const want = await expectedNll([A, B, C]);
    expect(Math.abs((out.cell_nll_sum.data as Float32Array)[0] - want.nll)).toBeLessThan(1e-4);
  });

  test('tree pass: each candidate scores as its prefix + candidate alone; main tokens as the attempt alone', async () => {
    const g = new L.Graph('critic-tree');
    const { weights } = weightInputs(g, config, 'float32', 'float32');
    g.output(criticTreeProbs(g, config, bins, weights), 'cell_probs');
    const run = await compile(g);
    // attempt 1 2 3 4 5; candidates 9 and 11 in place of token 4 (position 3), 13 in place of 5 (position 4); one pad
    const ids = [1, 2, 3, 4, 5, 9, 11, 13, 0];
    const out = await run({
      ...feeds,
      input_ids: i64([ids]),
      position_ids: i64([[0, 1, 2, 3, 4, 3, 3, 4, 0]]),
      is_candidate: i64([[0, 0, 0, 0, 0, 1, 1, 1, 1]]),
    });
    const probs = out.cell_probs.data as Float32Array;
    const at = (n: number) => Array.from(probs.slice(n * CELLS, (n + 1) * CELLS));
    const close = (got: number[], lp: number[]) => got.forEach((p, c) => expect(Math.abs(p - Math.exp(lp[c]))).toBeLessThan(1e-5));
    const main = await aloneCellLogprobs([1, 2, 3, 4, 5]);
    for (let t = 0; t < 5; t++) close(at(t), main[t]);
    close(at(5), (await aloneCellLogprobs([1, 2, 3, 9]))[3]);
    close(at(6), (await aloneCellLogprobs([1, 2, 3, 11]))[3]);
    close(at(7), (await aloneCellLogprobs([1, 2, 3, 4, 13]))[4]);
  });
});
