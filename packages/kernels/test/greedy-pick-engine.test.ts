/**
 * The KV engine with Lathe's greedy-pick op choosing its tokens (the op's CPU rule, float32) against
 * the same engine on the composed greedy path (Cast, firstArgMax, LogSoftmax, gather): the same
 * tokens and log-probs over several runs with spare rows and ragged prompts, the op in both graphs
 * (the prefill's first token and every decode step); a sampling engine ignores the option.
 */
import { CausalLM, type HfConfig } from '@lathe/models';
import { Device } from '@lathe/runtime';
import { KvCacheGenerator, type Completion, type KvCacheGeneratorOptions, type KvGreedyPick } from '@lathe/rollout';
import { greedyPickOps } from '@lathe/kernels';
import { tinyModel, tinyQwen3 } from '../../rollout/test/helpers';

// GroupQueryAttention's rotary needs head_dim ≥ 16.
const wideQwen3: HfConfig = { ...tinyQwen3, hidden_size: 64, head_dim: 16 };
const { dir } = tinyModel(wideQwen3, 6);
const prompts = [[5, 9, 11, 3], [7, 2], [30, 31, 32, 33, 34, 35], [1], [8, 8, 8]];
const model = CausalLM.fromPretrainedSync(dir, { device: Device.cpu() });
afterAll(() => model.dispose());

/** The ops, counting the nodes built. */
function counted(): { pick: KvGreedyPick & { dispose(): void }; nodes: () => number } {
  const ops = greedyPickOps('cpu');
  let nodes = 0;
  return {
    pick: { ...ops, apply: (x) => (nodes++, ops.apply(x)) },
    nodes: () => nodes,
  };
}

async function run(opts: Partial<KvCacheGeneratorOptions>, call: { seed?: number } = {}): Promise<Completion[]> {
  const kv = KvCacheGenerator.create(model, { temperature: 0, rows: 2, maxLength: 20, ...opts });
  try {
    return await kv.generate(prompts, { maxNewTokens: 10, ...call });
  } finally {
    kv.dispose();
  }
}

test('greedy: the op gives the composed path’s tokens, and its log-prob as both logprobs and rawLogprobs within 1e-5', async () => {
  const want = await run({});
  const { pick, nodes } = counted();
  const got = await run({ greedyPick: pick });
  // one node in the prefill, one in the decode step
  expect(nodes()).toBe(2);
  expect(got.map((c) => c.tokens)).toEqual(want.map((c) => c.tokens));
  expect(got.flatMap((c) => c.tokens)).toHaveLength(prompts.length * 10);
  got.forEach((c, k) => {
    expect(c.logprobs).toEqual(c.rawLogprobs);
    c.logprobs.forEach((x, t) => expect(Math.abs(x - want[k].logprobs[t])).toBeLessThan(1e-5));
    c.rawLogprobs.forEach((x, t) => expect(Math.abs(x - want[k].rawLogprobs[t])).toBeLessThan(1e-5));
  });
  pick.dispose();
}, 120_000);

test('sampling (temperature 0.8, top-k 5): the option is ignored — no node built, the same samples', async () => {
  const call = { seed: 4 };
  const want = await run({ temperature: 0.8, topK: 5 }, call);
  const { pick, nodes } = counted();
  const got = await run({ temperature: 0.8, topK: 5, greedyPick: pick }, call);
  expect(nodes()).toBe(0);
  expect(got).toEqual(want);
  pick.dispose();
}, 120_000);
