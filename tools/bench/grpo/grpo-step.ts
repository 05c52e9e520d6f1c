/**
 * RL steps of GrpoTrainer on a random decoder, on CUDA or CPU: a smoke test of the whole step on a
 * device (generation bound to the trainer's buffers, re-scoring, the reference, updates) and its
 * time split. Prints one JSON line per step (the step's metrics) and a summary line.
 *
 * usage: node grpo-step.js [--device cuda|cpu] [--compute float32|bfloat16] [--shape tiny|qwen3-0.6b]
 *          [--prompts 8] [--group 8] [--prompt-len 32] [--new-tokens 32] [--steps 3] [--minibatches 2]
 *          [--old-logprobs rescore|generation] [--lora 0] [--prompts-per-run 0] [--micro-batches 1]
 *          [--reward-model] [--generation-engine kv-cache|graph] [--no-cuda-graph] [--shared-arena] [--recompute] [--attention composed|flash|kernels [--logprob-kernel] [--rope-kernel] [--swiglu-kernel]] [--kernels] [--release-generation-memory] [--memory-pattern on|off] [--allow-cpu-fallback] [--log-level 0..4]   (the last two: to see ORT's node placements)
 * On the GPU machine run it as a bundle (see ../shared/device/README.md):
 *   npx esbuild tools/bench/grpo/grpo-step.ts --bundle --platform=node --conditions=lathe-source \
 *     --external:onnxruntime-node --external:koffi --external:@huggingface/transformers --external:libsql \
 *     --outfile=.bundle/grpo-step.js     (koffi beside it, as tools/bench/build-device-bundles.sh copies it)
 * --reward-model: the reward is a frozen reward model's score instead (a random one at the policy's
 * shape, on the same device in the compute dtype), every sample of a step in one run; the summary's
 * rewards_s is then its share of the step.
 * --attention kernels: the policy step, re-scoring, the reference and a value model attend through
 * Lathe's flash-attention kernels (the GPU opened through Kernels.withDevice, so the trainer also
 * takes the fused AdamW update; on cpu their float32 host path). --kernels opens the GPU through
 * the kernels with any --attention: `--attention flash --kernels` against `--attention kernels` is
 * the attention-only A/B, plain `--attention flash` what lathe grpo runs with flash.
 * --logprob-kernel (with --attention kernels): the LM head's log-probs and entropy in the policy step,
 * re-scoring and the reference through Lathe's fused cross-entropy kernels (`lathe grpo
 * --logprob_kernel`); against plain `--attention kernels` it is that kernel's A/B.
 * --rope-kernel (with --attention kernels): q and k rotated by Lathe's RoPE kernel in every graph that
 * attends through the kernels, the value model's included (`lathe grpo`'s default, `--rope_kernel auto`,
 * with the kernels); against the same command without it it is that kernel's A/B.
 * --swiglu-kernel (with --attention kernels): each MLP's silu(gate)·up through Lathe's SwiGLU kernel in
 * the same graphs (`lathe grpo --swiglu_kernel`); against the same command without it it is that kernel's A/B.
 * Results: docs/benchmarks.md, "RL step".
 */
import { CausalLM, type HfConfig } from '@lathe/models';
import { Device } from '@lathe/runtime';
import { CrossEntropyKernels, crossEntropyOps, cudaIncludeDir, FlashAttention, flashAttentionOps, Kernels, RopeKernels, ropeOps, SwigluKernels, swigluOps } from '@lathe/kernels';
import { combineRewards, GrpoTrainer, type GrpoAttentionKernel, type GrpoStepMetrics, type RewardSample, type RewardScorer, type RlPrompt } from '@lathe/grpo';
import { RewardModel } from '@lathe/reward-models';
import { arg, flag } from '../argv';
import { QWEN3_0_6B } from '../shapes';


const SHAPES: Record<string, HfConfig> = {
  tiny: { architectures: ['Qwen3ForCausalLM'], vocab_size: 512, hidden_size: 64, intermediate_size: 192, num_hidden_layers: 2, num_attention_heads: 4, num_key_value_heads: 2, head_dim: 16, rms_norm_eps: 1e-6, rope_theta: 10000, max_position_embeddings: 1024, tie_word_embeddings: true },
  'qwen3-0.6b': QWEN3_0_6B,
};

/** --memory-pattern on|off: ORT's memory-pattern planning in every session; empty: each session's default. */
function memoryPattern(flagValue: string): { memoryPattern?: boolean } {
  if (flagValue === '') return {};
  if (flagValue !== 'on' && flagValue !== 'off') throw new Error(`--memory-pattern must be on or off, got ${flagValue}`);
  return { memoryPattern: flagValue === 'on' };
}

/** Rewards from `rm`: each sample's prompt and completion ids (texts of space-separated ids here) as one right-padded row, all in one run. */
function rewardModelScorer(rm: RewardModel): RewardScorer<Record<string, never>> {
  const byScore = combineRewards<{ score: number }>([{ name: 'rm', fn: (_p, _c, m) => m.score }], { fallback: 0 });
  return async (samples: readonly RewardSample<Record<string, never>>[]) => {
    const rows = samples.map((s) => `${s.prompt} ${s.completion}`.split(' ').filter(Boolean).map(Number));
    const T = Math.max(...rows.map((r) => r.length));
    const ids = new BigInt64Array(rows.length * T);
    const mask = new BigInt64Array(rows.length * T);
    rows.forEach((r, i) => r.forEach((id, t) => ((ids[i * T + t] = BigInt(id)), (mask[i * T + t] = 1n))));
    const scores = await rm.score({ inputIds: { data: ids, dims: [rows.length, T] }, attentionMask: { data: mask, dims: [rows.length, T] } });
    return byScore(samples.map((s, i) => ({ prompt: s.prompt, completion: s.completion, meta: { score: scores[i] } })));
  };
}

async function main(): Promise<void> {
  const kind = arg('device', 'cuda') as 'cuda' | 'cpu';
  const attention = arg('attention', 'composed');
  if (!['composed', 'flash', 'kernels'].includes(attention)) throw new Error(`--attention must be composed, flash or kernels, got ${attention}`);
  const useKernels = attention === 'kernels';
  // the kernels' custom ops join ORT's runs only on the stream the device was opened with
  const opened = kind === 'cuda' && (useKernels || flag('kernels')) ? Kernels.withDevice({ device: { sharedArena: flag('shared-arena') } }) : undefined;
  const device = opened ? opened.device : Device.open(kind, { sharedArena: flag('shared-arena') });
  const ops = useKernels ? (opened ? flashAttentionOps('cuda', FlashAttention.compile(opened.kernels, { includeDir: cudaIncludeDir() })) : flashAttentionOps('cpu')) : undefined;
  if (flag('logprob-kernel') && !useKernels) throw new Error('--logprob-kernel goes with --attention kernels');
  const ce = flag('logprob-kernel') ? (opened ? crossEntropyOps('cuda', CrossEntropyKernels.compile(opened.kernels, { includeDir: cudaIncludeDir() })) : crossEntropyOps('cpu')) : undefined;
  if (flag('rope-kernel') && !useKernels) throw new Error('--rope-kernel goes with --attention kernels');
  const rope = flag('rope-kernel') ? (opened ? ropeOps('cuda', RopeKernels.compile(opened.kernels, { includeDir: cudaIncludeDir() })) : ropeOps('cpu')) : undefined;
  if (flag('swiglu-kernel') && !useKernels) throw new Error('--swiglu-kernel goes with --attention kernels');
  const swiglu = flag('swiglu-kernel') ? (opened ? swigluOps('cuda', SwigluKernels.compile(opened.kernels, { includeDir: cudaIncludeDir() })) : swigluOps('cpu')) : undefined;
  const attentionKernel: GrpoAttentionKernel | undefined = ops && {
    attend: (x, heads) => ops.attend(x, heads, 'kernels'),
    customOpDomains: [ops.domain.handle, ...(ce ? [ce.domain.handle] : []), ...(rope ? [rope.domain.handle] : []), ...(swiglu ? [swiglu.domain.handle] : [])],
    ...(ce ? { logprobKernel: ce } : {}),
    ...(rope ? { ropeKernel: rope.rotate } : {}),
    ...(swiglu ? { swigluKernel: swiglu.apply } : {}),
  };
  const compute = arg('compute', 'float32') as 'float32' | 'bfloat16';
  const shape = arg('shape', 'tiny');
  const P = Number(arg('prompts', '8'));
  const G = Number(arg('group', '8'));
  const promptLen = Number(arg('prompt-len', '32'));
  const maxNew = Number(arg('new-tokens', '32'));
  const steps = Number(arg('steps', '3'));
  const lora = Number(arg('lora', '0'));
  const t0 = performance.now();
  const model = CausalLM.random(SHAPES[shape], { seed: 1, std: 0.02 });
  const { config } = model;
  const tModel = performance.now();
  // reward: the share of even token ids in the completion (non-uniform across a group)
  const even = combineRewards<Record<string, never>>([{ name: 'even', fn: (_p, c) => { const ids = c.split(' ').filter(Boolean).map(Number); return ids.length ? ids.filter((x) => x % 2 === 0).length / ids.length : 0; } }], { fallback: 0 });
  const rm = flag('reward-model') ? RewardModel.fromCausalLM(CausalLM.random(SHAPES[shape], { seed: 2, std: 0.02 }), { padTokenId: 0, device, dtype: compute }) : undefined;
  const rewards: RewardScorer<Record<string, never>> = rm ? rewardModelScorer(rm) : even;
  const trainer = GrpoTrainer.create<Record<string, never>>({
    model, tokenizer: { decode: (ids) => ids.join(' '), padId: 0 }, stopIds: [config.vocabSize - 1], rewards,
    groupSize: G, maxNewTokens: maxNew, loss: { aggregation: 'token-mean', clipHigh: 0.28 }, kl: { coef: 0.001 },
    minibatches: Number(arg('minibatches', '2')), device, compute, oldLogprobs: arg('old-logprobs', 'rescore') as 'rescore' | 'generation',
    generationEngine: (arg('generation-engine', '') || undefined) as 'kv-cache' | 'graph' | undefined,
    promptsPerRun: Number(arg('prompts-per-run', '0')), microBatches: Number(arg('micro-batches', '1')), gradientCheckpointing: flag('recompute'),
    attention: useKernels ? 'flash' : (attention as 'composed' | 'flash'), ...(attentionKernel ? { attentionKernel } : {}), releaseGenerationMemory: flag('release-generation-memory'),
    session: {
      allowCpuFallback: flag('allow-cpu-fallback'),
      ...(flag('no-cuda-graph') ? { cudaGraph: false } : {}),
      ...(arg('log-level', '') ? { logLevel: Number(arg('log-level', '')) as 0 | 1 | 2 | 3 | 4 } : {}),
      ...memoryPattern(arg('memory-pattern', '')),
    },
    lora: lora > 0 ? { rank: lora, alpha: 2 * lora, targets: 'q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj' } : undefined,
  });
  const tCreate = performance.now();
  let seed = 7;
  const rand = () => ((seed = (Math.imul(seed, 1664525) + 1013904223) >>> 0) / 2 ** 32);
  const lines: GrpoStepMetrics[] = [];
  for (let s = 0; s < steps; s++) {
    const prompts: RlPrompt<Record<string, never>>[] = Array.from({ length: P }, (_, i) => {
      const ids = Array.from({ length: promptLen }, () => 1 + Math.floor(rand() * (config.vocabSize - 2)));
      return { ids, text: ids.join(' '), meta: {}, key: s * P + i };
    });
    const { metrics } = await trainer.step(prompts, 1e-5);
    ops?.check();
    ce?.check();
    rope?.check();
    swiglu?.check();
    lines.push(metrics);
    console.log(JSON.stringify({ step: s + 1, ...metrics }));
  }
  const last = lines.at(-1)!;
  console.log(JSON.stringify({
    summary: true, device: device.name, compute, shape, attention, logprob_kernel: ce !== undefined, rope_kernel: rope !== undefined, swiglu_kernel: swiglu !== undefined, ...(ce ? { ce_fallbacks: Object.fromEntries(ce.fallbacks) } : {}), kernels_stream: opened !== undefined, reward: rm ? 'reward-model' : 'even-ids', prompts: P, group: G, prompt_len: promptLen, new_tokens: maxNew, lora,
    model_s: (tModel - t0) / 1000, create_s: (tCreate - tModel) / 1000,
    last_step_s: last.step_ms / 1000, generation_s: last.generation_ms / 1000, scoring_s: last.scoring_ms / 1000, training_s: last.training_ms / 1000, rewards_s: last.rewards_ms / 1000, host_s: last.host_ms / 1000,
    logp_parity_max: Math.max(...lines.map((l) => l.logp_parity)), logp_max_abs_diff: Math.max(...lines.map((l) => l.logp_max_abs_diff)), response_length_mean: last.response_length_mean,
    memory: device.memory(),
  }));
  trainer.dispose();
  rm?.dispose();
  ops?.dispose();
  ce?.dispose();
  rope?.dispose();
  swiglu?.dispose();
}

main().catch((e: unknown) => {
  console.error(e instanceof Error ? e.stack : String(e));
  process.exit(1);
});
