/**
 * GRPO with LoRA binds its frozen base once in `loraBaseDtype` (the compute dtype; a merged LM-head
 * target float32), and every session that reads it — the train step, the policy's scoring, the KL
 * reference, the graph engine's generation and the KV engine's weight merge — declares each base
 * tensor in that same dtype. The CPU provider runs no bfloat16 MatMul, so the sessions here are
 * compiled by a stand-in that records each graph and checks every tensor bound to it against the
 * graph's declared input dtype (what a real binding refuses); float32 LoRA runs for real in
 * grpo-trainer.test.ts, generation-engine.test.ts and lora-dropout.test.ts.
 */
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { DType, Graph } from '@lathe/onnx';
import { CausalLM, paramSpecs, randomModel } from '@lathe/models';
import { Device, DeviceTensor, sizeOf, type HostTensor, type Session } from '@lathe/runtime';
import { loraAdapters, loraBaseDtype, type LoraConfig } from '@lathe/train';
import { combineRewards, GrpoTrainer, tokenBatch, type GenerationEngine } from '@lathe/grpo';
import { tinyQwen3 } from './tiny-qwen3';

// an untied LM head, so that `lm_head` is a target LoRA merges (base + B·A) rather than a projection with a side branch
const dir = mkdtempSync(join(tmpdir(), 'lathe-grpo-lora-dtype-'));
randomModel(dir, { ...tinyQwen3(24, 2, 16), tie_word_embeddings: false }, { seed: 3, std: 0.4 });
const lm = CausalLM.fromPretrainedSync(dir);
const specs = paramSpecs(lm.config);
const lora: LoraConfig = { rank: 2, alpha: 4, targets: 'q_proj|v_proj|down_proj|lm_head' };
const adapters = loraAdapters(lm.config, lora);
const baseNames = new Set(specs.map((s) => s.name));

/** A compiled graph as the stand-in saw it, and the dtype of every device tensor bound to it. */
interface Compiled {
  graph: Graph;
  bound: Map<string, DType>;
}

/**
 * `device` with `compile` replaced: each graph is recorded, and its session's bindings refuse a
 * device tensor whose dtype is not the declared input's. Runs do nothing; fetched outputs are
 * zeros of the bound input_ids' [rows, width].
 */
function recordingCompile(device: Device): Compiled[] {
  const compiled: Compiled[] = [];
  jest.spyOn(device, 'compile').mockImplementation((model) => {
    const graph = model as Graph;
    const c: Compiled = { graph, bound: new Map() };
    compiled.push(c);
    const info = (t: { name: string; dtype: DType; shape: readonly (number | string | null)[] }) => ({ name: t.name, dtype: t.dtype, dims: [...t.shape] });
    const binding = (): object => {
      let rows: readonly number[] = [1, 1];
      const self: Record<string, unknown> = {
        input(name: string, t: DeviceTensor | HostTensor) {
          const declared = graph.inputs.find((i) => i.name === name);
          if (!declared) throw new Error(`${graph.name}: no input '${name}'`);
          if (t instanceof DeviceTensor) {
            if (t.dtype !== declared.dtype) throw new Error(`${graph.name}: input '${name}' is declared ${declared.dtype}, bound ${t.dtype}`);
            c.bound.set(name, t.dtype);
          }
          if (name === 'input_ids') rows = t.dims;
          return proxy;
        },
        fetch: () => ({ data: new Float32Array(rows[0] * rows[1]), dims: rows }),
        run: async () => {},
        runSync: () => {},
      };
      const proxy: object = new Proxy(self, { get: (target, key: string) => target[key] ?? (() => proxy) });
      return proxy;
    };
    return { name: graph.name, inputs: graph.inputs.map(info), outputs: [], binding, dispose: () => {} } as unknown as Session;
  });
  return compiled;
}

/** The HF weight a graph input holds: `base/<name>`, or (the KL reference's inputs) the name itself; undefined for any other input. */
const baseWeightOf = (input: string) => (input.startsWith('base/') ? input.slice(5) : baseNames.has(input) ? input : undefined);

describe.each([
  ['bfloat16', 'graph'],
  ['bfloat16', 'kv-cache'],
  ['float32', 'kv-cache'],
] as const)('%s compute, %s engine', (compute: 'bfloat16' | 'float32', engine: GenerationEngine) => {
  test('the base is bound once in loraBaseDtype, and every session declares and binds it so', async () => {
    const device = Device.cpu();
    const compiled = recordingCompile(device);
    const rewards = combineRewards<{ completionTokens: number; stopped: boolean }>([{ name: 'r', fn: () => 0 }], { fallback: 0 });
    const t = GrpoTrainer.create<unknown>({ model: lm, device, compute, tokenizer: { decode: (ids) => ids.join(' '), padId: 0 }, stopIds: [3], rewards, groupSize: 2, maxNewTokens: 2, kl: { coef: 0.05 }, generationEngine: engine, lora });
    const batch = tokenBatch([[5], [9, 1]], [{ tokens: [4, 3], logprobs: [0, 0], stopped: true }, { tokens: [7], logprobs: [0], stopped: false }], 0);
    // the sessions made on first use: the policy's scoring, the reference's, and generation's weights
    await t.rescore(batch);
    await t.referenceLogprobs(batch);
    if (engine === 'kv-cache') await t.servingWeights({ before: async () => {}, after: () => {} });
    else {
      await t.generateSamples([{ ids: [5], key: 0 }]);
      await t.generateGreedy([{ ids: [5] }]);
    }

    const expected = (name: string): DType => (compute === 'float32' || name === 'lm_head.weight' ? 'float32' : compute);
    for (const s of specs) expect([s.name, loraBaseDtype(s.name, adapters, compute)]).toEqual([s.name, expected(s.name)]);
    // one copy of the base, shared by every session: bfloat16 halves it, less the float32 LM head
    const reference = t.referenceWeights!;
    expect(new Map([...reference].map(([n, w]) => [n, w.dtype]))).toEqual(new Map(specs.map((s) => [s.name, expected(s.name)])));
    expect([...reference.values()].reduce((n, w) => n + w.byteLength, 0)).toBe(specs.reduce((n, s) => n + sizeOf(s.shape) * (expected(s.name) === 'float32' ? 4 : 2), 0));

    const readers = compiled.filter((c) => c.graph.inputs.some((i) => baseWeightOf(i.name)));
    const kinds = readers.map((c) => c.graph.name);
    expect(kinds.filter((k) => k === 'grpo_score')).toHaveLength(2);
    for (const k of engine === 'kv-cache' ? ['grpo_materialise_weights'] : ['grpo_generate', 'grpo_generate_greedy']) expect(kinds).toContain(k);
    // the train step: every graph besides scoring and generation that reads the base
    expect(kinds.filter((k) => !k.startsWith('grpo_')).length).toBeGreaterThan(0);
    for (const c of readers) {
      const declared = c.graph.inputs.flatMap((i) => (baseWeightOf(i.name) ? [[baseWeightOf(i.name)!, i.dtype] as const] : []));
      expect([c.graph.name, new Map(declared)]).toEqual([c.graph.name, new Map(specs.map((s) => [s.name, expected(s.name)]))]);
      // each of them bound (the stand-in refused any other dtype)
      expect([c.graph.name, declared.every(([n]) => c.bound.has(`base/${n}`) || c.bound.has(n))]).toEqual([c.graph.name, true]);
    }
    t.dispose();
  });
});
