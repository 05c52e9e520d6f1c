/**
 * One GRPO step with LoRA over a dense base against QLoRA (the same adapters over a frozen NF4,
 * INT4 or INT8 base: `quantizedFrozenBase`, what `lathe grpo --quantize_base` builds), in one
 * process, on a random decoder of a preset shape: per base, a fresh trainer, `--warmup` steps run
 * and dropped (compilation), then `--steps` measured, split by phase; the frozen base's bytes on
 * the device and the GPU memory in use (nvidia-smi) after the steps. Each base generates with
 * `--engine` (kv-cache: the dense base's compute-dtype copy, or a quantized base's kernels plus the
 * adapters' side branches).
 *
 * usage: node grpo-qlora-step.js [--device cuda|cpu] [--compute bfloat16|float32] [--shape tiny|qwen3-0.6b]
 *          [--bases lora,nf4,int4,int8] [--engine kv-cache|graph] [--prompts 8] [--group 8] [--prompt-len 64]
 *          [--new-tokens 64] [--rank 16] [--warmup 1] [--steps 2] [--attention composed|flash]
 * Prints one JSON line per base and a summary line with each base's step time relative to lora.
 */
import { CausalLM, type HfConfig } from '@lathe/models';
import { Device } from '@lathe/runtime';
import { combineRewards, GrpoTrainer, type GrpoStepMetrics, type RlPrompt } from '@lathe/grpo';
import { quantizedFrozenBase } from '@lathe/recipes';
import { arg } from '../argv';
import { gpuUsedMiB } from '../gpu-memory';
import { QWEN3_0_6B } from '../shapes';

const SHAPES: Record<string, HfConfig> = {
  tiny: { architectures: ['Qwen3ForCausalLM'], vocab_size: 512, hidden_size: 64, intermediate_size: 192, num_hidden_layers: 2, num_attention_heads: 4, num_key_value_heads: 2, head_dim: 16, rms_norm_eps: 1e-6, rope_theta: 10000, max_position_embeddings: 1024, tie_word_embeddings: true },
  'qwen3-0.6b': QWEN3_0_6B,
};
const BASES = ['lora', 'nf4', 'int4', 'int8'];

async function main(): Promise<void> {
  const device = Device.open(arg('device', 'cuda') as 'cuda' | 'cpu');
  const compute = arg('compute', device.kind === 'cuda' ? 'bfloat16' : 'float32') as 'bfloat16' | 'float32';
  const shape = arg('shape', 'qwen3-0.6b');
  if (!SHAPES[shape]) throw new Error(`--shape: '${shape}' is not one of ${Object.keys(SHAPES).join(', ')}`);
  const bases = arg('bases', 'lora,nf4').split(',');
  const engine = arg('engine', 'kv-cache') as 'kv-cache' | 'graph';
  for (const b of bases) if (!BASES.includes(b)) throw new Error(`--bases: unknown base '${b}' (${BASES.join(', ')})`);
  const P = Number(arg('prompts', '8'));
  const G = Number(arg('group', '8'));
  const promptLen = Number(arg('prompt-len', '64'));
  const maxNew = Number(arg('new-tokens', '64'));
  const rank = Number(arg('rank', '16'));
  const warmup = Number(arg('warmup', '1'));
  const steps = Number(arg('steps', '2'));
  const model = CausalLM.random(SHAPES[shape], { seed: 0, std: 0.02 });
  const config = model.config;
  const lora = { rank, alpha: 2 * rank, targets: 'q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj' };
  // a cheap reward that varies: the fraction of even ids in the completion
  const rewards = combineRewards<Record<string, never>>([{ name: 'even', fn: (_p, c) => c.split(' ').filter((x) => Number(x) % 2 === 0).length / Math.max(1, c.split(' ').length) }], { fallback: 0 });
  let seed = 7;
  const rand = () => ((seed = (Math.imul(seed, 1664525) + 1013904223) >>> 0) / 2 ** 32);
  const prompts = (s: number): RlPrompt<Record<string, never>>[] =>
    Array.from({ length: P }, (_, i) => {
      const ids = Array.from({ length: promptLen }, () => 1 + Math.floor(rand() * (config.vocabSize - 2)));
      return { ids, text: ids.join(' '), meta: {}, key: s * P + i };
    });
  const results: Record<string, number | string | undefined>[] = [];
  for (const base of bases) {
    const frozenBase = base === 'lora' ? undefined : quantizedFrozenBase(config, model.float32Weights(), base, device.kind);
    const trainer = GrpoTrainer.create<Record<string, never>>({
      model,
      tokenizer: { decode: (ids) => ids.join(' '), padId: 0 },
      stopIds: [config.vocabSize - 1],
      rewards,
      groupSize: G,
      maxNewTokens: maxNew,
      kl: { coef: 0.001 },
      device,
      compute,
      lora,
      generationEngine: engine,
      attention: arg('attention', device.kind === 'cuda' && compute === 'bfloat16' ? 'flash' : 'composed') as 'composed' | 'flash',
      ...(frozenBase ? { frozenBase } : {}),
    });
    try {
      for (let s = 0; s < warmup; s++) await trainer.step(prompts(s), 1e-5);
      const lines: GrpoStepMetrics[] = [];
      for (let s = 0; s < steps; s++) lines.push((await trainer.step(prompts(warmup + s), 1e-5)).metrics);
      const avg = (k: keyof GrpoStepMetrics) => lines.reduce((a, m) => a + (m[k] as number), 0) / lines.length / 1000;
      const baseBytes = frozenBase ? Object.values(frozenBase.upload(device, compute)).reduce((n, t) => {
            const bytes = t.byteLength;
            t.dispose();
            return n + bytes;
          }, 0) : undefined;
      const r = {
        base,
        engine: trainer.generationEngine,
        step_s: avg('step_ms'),
        generation_s: avg('generation_ms'),
        scoring_s: avg('scoring_ms'),
        training_s: avg('training_ms'),
        rewards_s: avg('rewards_ms'),
        host_s: avg('host_ms'),
        reward_mean: lines.at(-1)!.reward_mean,
        kl_ref: lines.at(-1)!.kl_ref,
        frozen_base_mib: baseBytes && baseBytes / 2 ** 20,
        gpu_used_mib: gpuUsedMiB(),
      };
      results.push(r);
      console.log(JSON.stringify(r));
    } finally {
      trainer.dispose();
    }
  }
  const ref = results.find((r) => r.base === 'lora');
  console.log(JSON.stringify({ summary: { shape, device: device.kind, compute, prompts: P, group: G, promptLen, newTokens: maxNew, rank, engine, relative_step_s: Object.fromEntries(results.map((r) => [r.base, ref ? (r.step_s as number) / (ref.step_s as number) : undefined])) } }));
}

main().catch((e: unknown) => {
  console.error(e instanceof Error ? e.stack : e);
  process.exit(1);
});
