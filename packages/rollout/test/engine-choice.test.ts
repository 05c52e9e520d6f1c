/** The generation-engine choice that `lathe generate`'s trajectories and `GrpoTrainer` share. */
import { chooseGenerationEngine, type GenerationEngineRequest } from '@lathe/rollout';

test("'auto' takes the KV-cache engine where GroupQueryAttention runs, else the graph and why", () => {
  expect(chooseGenerationEngine('auto', { headDim: 16 }, 'cpu', 'float32')).toEqual({ engine: 'kv-cache' });
  expect(chooseGenerationEngine('auto', { headDim: 16 }, 'cuda', 'bfloat16')).toEqual({ engine: 'kv-cache' });
  expect(chooseGenerationEngine('auto', { headDim: 8 }, 'cpu', 'float32')).toEqual({ engine: 'graph', why: expect.stringMatching(/head_dim 8 is not a multiple of 16/) });
  expect(chooseGenerationEngine('auto', { headDim: 16 }, 'cuda', 'float32')).toEqual({ engine: 'graph', why: expect.stringMatching(/bfloat16\/float16 only/) });
});

test('an explicit engine is taken, or refused where it cannot run, naming the option', () => {
  expect(chooseGenerationEngine('graph', { headDim: 8 }, 'cpu', 'float32')).toEqual({ engine: 'graph' });
  expect(chooseGenerationEngine('kv-cache', { headDim: 16 }, 'cpu', 'float32')).toEqual({ engine: 'kv-cache' });
  expect(() => chooseGenerationEngine('kv-cache', { headDim: 8 }, 'cpu', 'float32', '--engine')).toThrow(
    "--engine 'kv-cache' cannot run this model: head_dim 8 is not a multiple of 16 (GroupQueryAttention's rotary needs one); use 'graph'",
  );
  expect(() => chooseGenerationEngine('kv-cache', { headDim: 16 }, 'cuda', 'float32')).toThrow(/engine 'kv-cache' cannot run this model: GroupQueryAttention on cuda runs in bfloat16\/float16 only, and the compute dtype is float32/);
  expect(() => chooseGenerationEngine('fast' as GenerationEngineRequest, { headDim: 16 }, 'cpu', 'float32')).toThrow("engine must be 'auto', 'kv-cache' or 'graph', got 'fast'");
});
