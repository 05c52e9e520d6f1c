/**
 * One RL step with classmate sampling (K continuations of each completion's chain of thought by a
 * resident classmate of the policy's shape, random weights) against the same step without it,
 * split by phase (measure.ts). Prints one JSON line.
 *
 * usage: node classmate-step.js [--device cuda|cpu] [--compute bfloat16|float32] [--shape qwen3-0.6b|tiny]
 *          [--prompts 8] [--group 8] [--prompt-len 64] [--new-tokens 128] [--samples 4]
 *          [--classmate-new-tokens 0 (= --new-tokens)] [--warmup 1] [--engine kv-cache|graph] [--micro-batches 1]
 * On the GPU machine, as a bundle: bash tools/bench/build-device-bundles.sh classmate-step, then
 *   node .bundle/classmate-step.js --device cuda --compute bfloat16 --shape qwen3-0.6b
 * The CPU test (packages/grpo/test/classmate-bench.test.ts) runs measure.ts at a tiny shape.
 */
import type { HfConfig } from '@lathe/models';
import { arg } from '../argv';
import { QWEN3_0_6B } from '../shapes';
import { measureClassmateStep } from './measure';

const SHAPES: Record<string, HfConfig> = {
  tiny: { architectures: ['Qwen3ForCausalLM'], vocab_size: 512, hidden_size: 64, intermediate_size: 192, num_hidden_layers: 2, num_attention_heads: 4, num_key_value_heads: 2, head_dim: 16, rms_norm_eps: 1e-6, rope_theta: 10000, max_position_embeddings: 1024, tie_word_embeddings: true },
  'qwen3-0.6b': QWEN3_0_6B,
};

async function main(): Promise<void> {
  const shape = arg('shape', 'qwen3-0.6b');
  const config = SHAPES[shape];
  if (!config) throw new Error(`--shape must be one of ${Object.keys(SHAPES).join(', ')}, got ${shape}`);
  const engine = arg('engine', '');
  if (engine !== '' && engine !== 'kv-cache' && engine !== 'graph') throw new Error(`--engine must be kv-cache or graph, got ${engine}`);
  const r = await measureClassmateStep({
    config,
    device: arg('device', 'cuda') as 'cuda' | 'cpu',
    compute: arg('compute', 'bfloat16') as 'float32' | 'bfloat16',
    prompts: Number(arg('prompts', '8')),
    group: Number(arg('group', '8')),
    promptLen: Number(arg('prompt-len', '64')),
    newTokens: Number(arg('new-tokens', '128')),
    samples: Number(arg('samples', '4')),
    classmateNewTokens: Number(arg('classmate-new-tokens', '0')) || undefined,
    warmup: Number(arg('warmup', '1')),
    microBatches: Number(arg('micro-batches', '1')),
    ...(engine ? { engine } : {}),
  });
  console.log(JSON.stringify({ bench: 'classmate-step', shape, ...r }));
}

main().catch((e: unknown) => {
  console.error(e instanceof Error ? e.stack : String(e));
  process.exit(1);
});
