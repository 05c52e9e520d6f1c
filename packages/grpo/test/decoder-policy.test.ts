/**
 * The decoder as the RL policy: its log-probs and entropies against the rollout scoring graph (the
 * engine that produces old and reference log-probs) and against host softmax of the logits at a
 * temperature; then GRPO on a tiny random Qwen3 learning an answer token per prompt.
 */
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import * as L from '@lathe/onnx';
import {
  decoder,
  lmLogits,
  paddedCausalMask,
  paramSpecs,
  positionsFromPadding,
  randomModel,
  readTensorBytes,
  readWeightIndex,
  weightInputs,
  type DecoderConfig,
  type HfConfig,
} from '@lathe/models';
import { addScoring } from '@lathe/rollout';
import { biasCorrections, compileTrainStep, stateNames, type TrainableParam } from '@lathe/train';
import { advantageMatrix, decoderPolicy, grpoAdvantages, lossNormaliser, rlLoss } from '@lathe/grpo';
import { compile, rng, type HostTensor } from '../../../tools/testing/ort-cpu';
import { nextState } from './tiny-policy';

const qwen3 = (vocab: number): HfConfig => ({
  architectures: ['Qwen3ForCausalLM'],
  vocab_size: vocab,
  hidden_size: 16,
  intermediate_size: 32,
  num_hidden_layers: 1,
  num_attention_heads: 2,
  num_key_value_heads: 1,
  head_dim: 8,
  rms_norm_eps: 1e-6,
  rope_theta: 10000,
  max_position_embeddings: 32,
  tie_word_embeddings: true,
});

function model(vocab: number, std: number) {
  const dir = mkdtempSync(join(tmpdir(), 'lathe-grpo-'));
  const config = randomModel(dir, qwen3(vocab), { seed: 4, std });
  const index = readWeightIndex(dir);
  const params: TrainableParam[] = paramSpecs(config).map((s) => ({ name: s.name, shape: s.shape, decay: s.kind === 'matrix' || s.kind === 'embedding' }));
  const weights: Record<string, HostTensor> = {};
  for (const p of params) {
    const b = readTensorBytes(index.get(p.name)!);
    weights[p.name] = { data: new Float32Array(b.buffer.slice(b.byteOffset, b.byteOffset + b.byteLength)), dims: p.shape };
  }
  return { config, params, weights };
}

const i64 = (rows: number[][]): HostTensor => ({ data: BigInt64Array.from(rows.flat().map(BigInt)), dims: [rows.length, rows[0].length] });
const f32 = (xs: ArrayLike<number>, dims: number[]): HostTensor => ({ data: Float32Array.from(xs), dims });
const scalar = (v: number): HostTensor => ({ data: Float32Array.from([v]), dims: [] });

/** A graph of the policy's outputs with the weights as inputs. */
async function policyRunner(config: DecoderConfig, params: TrainableParam[], opts: Parameters<typeof decoderPolicy>[1]) {
  const g = new L.Graph('policy');
  const p = new Map(params.map((x) => [x.name, g.input(x.name, 'float32', x.shape)] as const));
  const out = decoderPolicy(config, opts)(g, p);
  g.output(out.logp, 'logp');
  if (out.entropy) g.output(out.entropy, 'entropy');
  return compile(g);
}

/** Full-vocabulary logits [B, T, V]. */
async function logitsRunner(config: DecoderConfig) {
  const g = new L.Graph('logits');
  const { weights } = weightInputs(g, config, 'float32', 'float32');
  const ids = g.input('input_ids', 'int64', ['B', 'T']);
  const mask = g.input('attention_mask', 'int64', ['B', 'T']);
  const { hidden } = decoder(config, weights, { inputIds: ids, positionIds: positionsFromPadding(mask), attentionMask: paddedCausalMask(mask) });
  g.output(lmLogits(config, weights, hidden), 'logits');
  return compile(g);
}

test('log-probs and entropies equal the rollout scoring graph’s (left padding, 3 vocabulary chunks)', async () => {
  const { config, params, weights } = model(24, 0.5);
  const seqs = [
    [0, 0, 3, 7, 11, 2],
    [5, 9, 1, 4, 4, 20],
    [0, 0, 0, 0, 13, 6],
  ];
  const attention = seqs.map((s, b) => s.map((_x, t) => (b === 0 ? (t >= 2 ? 1 : 0) : b === 2 ? (t >= 4 ? 1 : 0) : 1)));
  const sg = new L.Graph('score');
  addScoring(sg, config, weightInputs(sg, config, 'float32', 'float32').weights, { chunk: 10, fusedKernels: false });
  const [score, policy] = await Promise.all([compile(sg), policyRunner(config, params, { chunk: 10, entropy: true })]);
  const feeds = { ...weights, input_ids: i64(seqs), attention_mask: i64(attention) };
  const [s, p] = await Promise.all([score(feeds), policy(feeds)]);
  let compared = 0;
  for (let b = 0; b < 3; b++) {
    for (let t = 0; t < 5; t++) {
      if (!attention[b][t]) continue; // the scoring graph writes 0 where t is padding
      const i = b * 6 + t;
      expect(p.logp.data[i]).toBeCloseTo(Number(s.logprobs.data[i]), 5);
      expect(p.entropy.data[i]).toBeCloseTo(Number(s.entropies.data[i]), 5);
      compared++;
    }
  }
  expect(compared).toBe(9);
});

test('flash attention: the same log-probs, entropies and gradients as composed attention on right-padded rows', async () => {
  const { config, params, weights } = model(24, 0.5);
  const seqs = [
    [3, 7, 11, 2, 0, 0],
    [5, 9, 1, 4, 4, 20],
    [13, 6, 0, 0, 0, 0],
  ];
  const attention = seqs.map((s, b) => s.map((_x, t) => (t < [4, 6, 2][b] ? 1 : 0)));
  const run = async (flashAttention: boolean) => {
    const g = new L.Graph('policy_grads');
    const p = new Map(params.map((x) => [x.name, g.input(x.name, 'float32', x.shape)] as const));
    const o = decoderPolicy(config, { chunk: 10, entropy: true, flashAttention })(g, p);
    const mask = L.cast(g.inputs.find((t) => t.name === 'attention_mask')!, 'float32');
    // a different weight per token (the ids, shifted away from 0)
    const lossWeights = L.sin(L.add(L.cast(g.inputs.find((t) => t.name === 'input_ids')!, 'float32'), 0.5));
    g.output(o.logp, 'logp');
    g.output(o.entropy!, 'entropy');
    L.grad(L.reduceSum(L.mul(L.mul(L.add(o.logp, o.entropy!), lossWeights), mask)), [...p.values()]).forEach((d, i) => g.output(d, `d${i}`));
    const feeds = { ...weights, input_ids: i64(seqs), attention_mask: i64(attention) };
    return (await compile(g))(flashAttention ? { ...feeds, total_sequence_length: { data: Int32Array.of(6), dims: [] } } : feeds);
  };
  const [composed, flash] = await Promise.all([run(false), run(true)]);
  const out: Record<string, HostTensor> = {};
  for (const [k, v] of Object.entries(composed)) out[`composed/${k}`] = v;
  for (const [k, v] of Object.entries(flash)) out[`flash/${k}`] = v;
  for (let i = 0; i < 18; i++) {
    if (!attention.flat()[i]) continue;
    expect(out['flash/logp'].data[i]).toBeCloseTo(Number(out['composed/logp'].data[i]), 5);
    expect(out['flash/entropy'].data[i]).toBeCloseTo(Number(out['composed/entropy'].data[i]), 5);
  }
  params.forEach((_p, k) => {
    const a = out[`composed/d${k}`].data as Float32Array;
    const b = out[`flash/d${k}`].data as Float32Array;
    const scale = Math.max(...Array.from(a, Math.abs));
    expect(scale).toBeGreaterThan(0);
    expect(Math.max(...Array.from(a, (x, i) => Math.abs(x - b[i]))) / scale).toBeLessThan(1e-4);
  });
});

test('temperature: log-probs and entropy of softmax(logits / τ)', async () => {
  const { config, params, weights } = model(24, 0.5);
  const tau = 0.7;
  const seq = [4, 8, 15, 16, 23];
  const feeds = { ...weights, input_ids: i64([seq]), attention_mask: i64([seq.map(() => 1)]) };
  const [logits, policy] = await Promise.all([logitsRunner(config), policyRunner(config, params, { chunk: 7, entropy: true, temperature: tau })]);
  const l = (await logits(feeds)).logits.data as Float32Array;
  const p = await policy(feeds);
  for (let t = 0; t < seq.length - 1; t++) {
    const row = Array.from(l.slice(t * 24, (t + 1) * 24), (x) => x / tau);
    const m = Math.max(...row);
    const z = m + Math.log(row.reduce((a, x) => a + Math.exp(x - m), 0));
    expect(p.logp.data[t]).toBeCloseTo(row[seq[t + 1]] - z, 5);
    expect(p.entropy.data[t]).toBeCloseTo(-row.reduce((a, x) => a + Math.exp(x - z) * (x - z), 0), 5);
  }
});

test('GRPO on a tiny Qwen3: the answer token of each prompt, reward from chance to ≥ 0.9', async () => {
  const V = 8;
  const answers = [5, 7, 3, 2]; // prompt token p → answer token
  const G = 8;
  const B = answers.length * G;
  const { config, params, weights } = model(V, 0.1);
  const loss = rlLoss(decoderPolicy(config, { entropy: true }), { aggregation: 'seq-mean-token-mean', clipHigh: 0.28, entropyCoef: 1e-3 });
  const graphs = compileTrainStep({ params, loss, optimizer: { weightDecay: 0, maxGradNorm: 1 } });
  const [step, logits, policy] = await Promise.all([compile(graphs.step), logitsRunner(config), policyRunner(config, params, {})]);
  let state: Record<string, HostTensor> = { ...weights };
  for (const p of params) {
    const n = p.shape.reduce((a, b) => a * b, 1);
    state[stateNames.m(p.name)] = f32(new Float32Array(n), p.shape);
    state[stateNames.v(p.name)] = f32(new Float32Array(n), p.shape);
  }
  const rand = rng(99);
  const sample = (row: Float32Array) => {
    const m = Math.max(...row);
    const e = Array.from(row, (x) => Math.exp(x - m));
    const u = rand() * e.reduce((a, b) => a + b, 0);
    let acc = 0;
    for (let v = 0; v < V; v++) if ((acc += e[v]) > u) return v;
    return V - 1;
  };
  const weightsOf = (s: Record<string, HostTensor>) => Object.fromEntries(params.map((p) => [p.name, s[p.name]]));
  const ones = (T: number) => i64(Array.from({ length: B }, () => new Array(T).fill(1)));
  const prompts = Array.from({ length: B }, (_, i) => Math.floor(i / G));
  const mask = prompts.map(() => [1, 0]); // position 0 predicts the answer token
  const mean: number[] = [];
  for (let t = 1; t <= 60; t++) {
    const l = (await logits({ ...weightsOf(state), input_ids: i64(prompts.map((p) => [p])), attention_mask: ones(1) })).logits.data as Float32Array;
    const answer = prompts.map((_p, b) => sample(l.slice(b * V, (b + 1) * V)));
    const rewards = prompts.map((p, b): number => (answer[b] === answers[p] ? 1 : 0));
    mean.push(rewards.reduce((a, b) => a + b, 0) / B);
    if (mean.length >= 5 && mean.slice(-5).every((m) => m >= 0.9)) break;

    const ids = i64(prompts.map((p, b) => [p, answer[b]]));
    const old = (await policy({ ...weightsOf(state), input_ids: ids, attention_mask: ones(2) })).logp.data as Float32Array;
    const out = await step({
      ...state,
      lr: scalar(0.03),
      ...Object.fromEntries(Object.entries(biasCorrections(t)).map(([k, x]) => [k, scalar(x)])),
      input_ids: ids,
      attention_mask: ones(2),
      old_logp: f32(old, [B, 2]),
      advantages: f32(advantageMatrix(grpoAdvantages({ rewards, groupSize: G }), mask.flat(), [B, 2]), [B, 2]),
      response_mask: i64(mask),
      loss_normaliser: scalar(lossNormaliser('seq-mean-token-mean', new Array(B).fill(1))),
    });
    state = nextState(state, out);
  }
  console.log(`tiny Qwen3 GRPO: ${mean.length} rollouts, mean reward ${mean[0].toFixed(2)} → ${mean[mean.length - 1].toFixed(2)}`);
  expect(mean[0]).toBeLessThan(0.35); // chance: 1/8
  expect(mean.slice(-5).every((m) => m >= 0.9)).toBe(true);
});

test('the bf16 RL train step (entropy, KL to the reference, GSPO ratios) has no run-time shape arithmetic and no op without a CUDA kernel', () => {
  // ORT would run such int64 arithmetic on the CPU; on CUDA (fallback off) the session is refused.
  const dir = mkdtempSync(join(tmpdir(), 'lathe-rl-shape-'));
  const config = randomModel(dir, { ...qwen3(64), head_dim: 16 }, { seed: 2 });
  const params: TrainableParam[] = paramSpecs(config).map((s) => ({ name: s.name, shape: s.shape, decay: false }));
  for (const ratio of ['token', 'sequence'] as const) {
    for (const flashAttention of [false, true]) {
      const policy = decoderPolicy(config, { compute: 'bfloat16', entropy: true, chunk: 24, flashAttention });
      const graphs = compileTrainStep({ params, loss: rlLoss(policy, { ratio, klCoef: 0.01, entropyCoef: 0.001 }, { reference: true }) });
      for (const g of [graphs.step, graphs.accumulate]) {
        expect([ratio, flashAttention, L.runtimeShapeNodes(g).map((n) => n.name)]).toEqual([ratio, flashAttention, []]);
        expect([ratio, flashAttention, L.noCudaKernelNodes(g).map((n) => `${n.op.name} ${n.outputs[0]?.dtype} ${n.name}`)]).toEqual([ratio, flashAttention, []]);
      }
    }
  }
});
