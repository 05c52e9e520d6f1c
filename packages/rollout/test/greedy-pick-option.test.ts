/**
 * The KV engine's greedyPick option, with a stand-in for @lathe/kernels' op (ONNX ArgMax and a
 * log-sum-exp, in an empty custom-op domain): greedy graphs hand it the LM head's logits in their own
 * dtype (no float32 Cast, no LogSoftmax left), sampling graphs never call it; on CPU in float32 the
 * engine with it generates the composed path's tokens and log-probs (within 1e-5), one log-prob for
 * both logprobs and rawLogprobs. The real op against the composed path: kernels'
 * greedy-pick-engine.test.ts; on the device: decode-check's +pick engines.
 */
import * as L from '@lathe/onnx';
import { CApi, Device } from '@lathe/runtime';
import { addKvDecodeStep, addKvPrefill, KvCacheGenerator, type Completion, type KvGreedyPick } from '@lathe/rollout';
import { CausalLM, weightInputs, type HfConfig } from '@lathe/models';
import { tinyModel, tinyQwen3 } from './helpers';

// GroupQueryAttention's rotary needs head_dim ≥ 16.
const wideQwen3: HfConfig = { ...tinyQwen3, hidden_size: 64, head_dim: 16 };
const { dir, config } = tinyModel(wideQwen3, 12);
const prompts = [[5, 9, 11, 3], [7, 2], [30, 31, 32, 33, 34, 35], [1]];

/** A stand-in pick from ONNX ops (ArgMax keeps the first maximum), recording the logits it was given. */
function stubPick(): KvGreedyPick & { seen: L.Tensor[]; dispose(): void } {
  const api = CApi.get();
  const handle = api.out('CreateCustomOpDomain', 'lathe.test_greedy_pick') as bigint;
  const seen: L.Tensor[] = [];
  return {
    seen,
    domain: { handle },
    apply: (logits) => {
      seen.push(logits);
      const x = L.cast(logits, 'float32');
      const max = L.reduceMax(x, [1], true);
      const logprobs = L.neg(L.log(L.reduceSum(L.exp(L.sub(x, max)), [1])));
      return { tokens: L.argMax(x, 1), logprobs };
    },
    check: () => {},
    dispose: () => api.fn('ReleaseCustomOpDomain')(handle),
  };
}

const opTypes = (g: L.Graph) => L.toModelProto(g).graph.node.map((n) => n.opType);

test.each([
  ['decode step', addKvDecodeStep],
  ['prefill', addKvPrefill],
] as const)('%s: greedy hands the pick the bfloat16 logits [R, V] and keeps no LogSoftmax; sampling never calls it', (_graph, add) => {
  const build = (temperature: number, pick?: KvGreedyPick) => {
    const g = new L.Graph();
    add(g, config, weightInputs(g, config, 'bfloat16', 'bfloat16').weights, 'bfloat16', { temperature }, { K: 2, rows: 4, greedyPick: pick });
    return g;
  };
  const pick = stubPick();
  const fused = opTypes(build(0, pick));
  expect(pick.seen.map((t) => [t.dtype, t.shape])).toEqual([['bfloat16', [4, config.vocabSize]]]);
  expect(fused.filter((o) => o === 'LogSoftmax')).toHaveLength(0);
  expect(opTypes(build(0)).filter((o) => o === 'LogSoftmax').length).toBeGreaterThan(0);
  const sampled = opTypes(build(1, pick));
  expect(pick.seen).toHaveLength(1);
  expect(sampled).toEqual(opTypes(build(1)));
  pick.dispose();
});

async function generate(greedyPick?: KvGreedyPick): Promise<Completion[]> {
  const model = CausalLM.fromPretrainedSync(dir, { device: Device.cpu() });
  const kv = KvCacheGenerator.create(model, { temperature: 0, rows: 2, maxLength: 16, greedyPick });
  try {
    return await kv.generate(prompts, { maxNewTokens: 8 });
  } finally {
    kv.dispose();
    model.dispose();
  }
}

test('greedy on CPU (float32): with the pick, the composed path’s tokens and log-probs within 1e-5, one log-prob for both columns', async () => {
  const want = await generate();
  const pick = stubPick();
  const got = await generate(pick);
  // the prefill's graph and the decode step's
  expect(pick.seen).toHaveLength(2);
  expect(got.map((c) => c.tokens)).toEqual(want.map((c) => c.tokens));
  expect(got.flatMap((c) => c.tokens)).toHaveLength(prompts.length * 8);
  got.forEach((c, k) => {
    expect(c.rawLogprobs).toEqual(c.logprobs);
    c.logprobs.forEach((x, t) => expect(Math.abs(x - want[k].logprobs[t])).toBeLessThan(1e-5));
  });
  pick.dispose();
}, 120_000);
