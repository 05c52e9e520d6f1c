/**
 * `lathe generate`'s generation path — TrajectoryGenerator: prompts rendered with the chat
 * template, tokenised, sampled in runs of `--batch` samples (the samples of one prompt and thinking
 * mode sharing one prefill), rows built — timed end to end on a random Qwen3-0.6B-shape model.
 * Reports new tokens/s, the runs and prompt prefills counted by the generator, and, with
 * `--compare`, the KV-cache engine alone on the same prompt ids with one prefill per (prompt, mode)
 * against one prefill per sample (the layout before grouping), with its prefill/decode split.
 *
 * usage: node lathe-trajectories.js --tokenizer DIR [--model DIR] [--shape qwen3-0.6b|tiny]
 *          [--prompts 64] [--samples-thinking 8] [--samples-non-thinking 0] [--prompt-words 230]
 *          [--max-new 512] [--batch 256] [--device cuda|cpu] [--dtype bfloat16|float32]
 *          [--temperature 1] [--seed 0] [--repeat 1] [--compare] [--stop-at-eos] [--no-cuda-graph] [--out rows.json]
 *          [--quantize none|int8|int4|nf4] [--quantized-weights auto|dequantize]
 * --quantize: the model (random or --model) quantized on the host (int4: blocks of 64; nf4: double
 * quantization) and saved as `lathe quantize` saves it, then generated from as `lathe generate`
 * does with --quantized_weights (auto: through its kernels, INT4 on cuda through Lathe's W4A16 op
 * with plans tuned at load; dequantize: dense). The line reports how the weights ran, their bytes
 * on the device, the tuning time and the GPU memory in use after the timed call.
 * --tokenizer: a folder with tokenizer.json and tokenizer_config.json (build-device-bundles.sh
 * copies Qwen3's into .bundle/qwen3-tokenizer). Without --model a random model of --shape is
 * written to a temporary folder first (not timed). No stop tokens (`stopIds: []`), so every
 * sample runs to --max-new, as in the engine comparison. With lathe generate's stops
 * (--stop-at-eos: the tokenizer's <|im_end|>) a random model's near-flat next-token distribution
 * draws <|im_end|> about once per vocabulary size of tokens (an estimate: ~1.7 times in 262,144),
 * so a few samples end early and the count depends on the draws (262,144 in one measurement,
 * 261,123 in the next). The decode steps are the same either way (a run goes on while any row is
 * live), so fewer tokens read as fewer tokens/s. --no-cuda-graph:
 * the generator's KV engine in plain runs (its only mode before 2026-11-24; the comparison's engine
 * always replays CUDA graphs). One warm-up call (one prompt) compiles the engine before the timed
 * call; --repeat N times N calls of all the prompts (`calls`: each one's tokens/s and the engine's
 * prefill / decode seconds; new_tokens_per_s is the first's). Prints one JSON line.
 */
import { copyFileSync, mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { CausalLM, randomModel, type HfConfig } from '@lathe/models';
import { quantizedFolder } from '../quantization/quantized-folder';
import { KvCacheGenerator } from '@lathe/rollout';
import { describeWeights, groupsOf, TrajectoryGenerator, type GeneratedTrajectory, type QuantizedWeightsRequest, type TrajectoryPrompt } from '@lathe/recipes';
import { arg, flag } from '../argv';
import { gpuUsedMiB } from '../gpu-memory';
import { QWEN3_0_6B } from '../shapes';

const SHAPES: Record<string, HfConfig> = {
  tiny: { architectures: ['Qwen3ForCausalLM'], vocab_size: 151936, hidden_size: 64, intermediate_size: 64, num_hidden_layers: 1, num_attention_heads: 4, num_key_value_heads: 2, head_dim: 16, rms_norm_eps: 1e-6, rope_theta: 1e6, max_position_embeddings: 2048, tie_word_embeddings: true },
  'qwen3-0.6b': QWEN3_0_6B,
};

const WORDS = 'the of a sum prime number triangle circle area find compute integer value square root angle equal solve let real positive sequence'.split(' ');

/** Distinct math-flavoured prompts of about `words` words each (deterministic). */
function makePrompts(n: number, words: number): TrajectoryPrompt[] {
  return Array.from({ length: n }, (_, i) => ({
    prompt: `Problem ${i}: ` + Array.from({ length: words }, (_, w) => WORDS[(i * 7 + w * 13 + ((i * w) % 5)) % WORDS.length]).join(' ') + '?',
  }));
}

async function main(): Promise<void> {
  const tokenizer = resolve(arg('tokenizer'));
  const device = arg('device', 'cuda') as 'cuda' | 'cpu';
  const dtype = arg('dtype', device === 'cuda' ? 'bfloat16' : 'float32') as 'bfloat16' | 'float32';
  const nPrompts = Number(arg('prompts', '64'));
  const samplesThinking = Number(arg('samples-thinking', '8'));
  const samplesNonThinking = Number(arg('samples-non-thinking', '0'));
  const maxNew = Number(arg('max-new', '512'));
  const batch = Number(arg('batch', '256'));
  const repeat = Number(arg('repeat', '1'));
  if (!Number.isInteger(repeat) || repeat < 1) throw new Error(`--repeat: '${arg('repeat', '1')}' is not an integer ≥ 1`);
  const temperature = Number(arg('temperature', '1'));
  const seed = Number(arg('seed', '0'));
  const shape = arg('shape', 'qwen3-0.6b');

  const t0 = performance.now();
  let model = arg('model', '');
  if (!model) {
    model = mkdtempSync(join(tmpdir(), 'lathe-traj-bench-'));
    randomModel(model, SHAPES[shape], { seed: 1, std: 0.02 });
    for (const f of ['tokenizer.json', 'tokenizer_config.json']) copyFileSync(join(tokenizer, f), join(model, f));
  }
  const quantize = arg('quantize', 'none');
  model = quantizedFolder(model, quantize);
  const quantizedWeights = arg('quantized-weights', 'auto') as QuantizedWeightsRequest;
  const tModel = performance.now();

  const prompts = makePrompts(nPrompts, Number(arg('prompt-words', '230')));
  const stopAtEos = flag('stop-at-eos');
  const cudaGraph = device === 'cuda' && !flag('no-cuda-graph');
  const options = { maxNewTokens: maxNew, samplesThinking, samplesNonThinking, temperature, seed, device, dtype, batchSize: batch, tokenizer, grade: 'none' as const, engine: 'kv-cache' as const, cudaGraph, quantizedWeights, ...(stopAtEos ? {} : { stopIds: [] }) };
  const gen = await TrajectoryGenerator.create(model, options);
  const plan = gen.plan(prompts);
  gen.reserve(plan.reduce((m, s) => Math.max(m, s.ids.length), 0)); // caches sized once, as lathe generate does
  const promptTokens = plan.map((s) => s.ids.length);

  // Warm-up: compiles the engine (and uploads the weights) on one prompt.
  const tWarm = performance.now();
  for await (const row of gen.generate(prompts.slice(0, 1).map((p) => ({ ...p, prompt_idx: nPrompts })))) void row;
  const warm = gen.counters;
  const tStart = performance.now();
  // each timed call with the engine's prefill / decode split (the first call's is new_tokens_per_s)
  const calls: { s: number; new_tokens_per_s: number; prefill_s: number; decode_s: number; decode_steps: number }[] = [];
  let rows: GeneratedTrajectory[] = [];
  let ms = 0;
  let counters = gen.counters;
  for (let r = 0; r < repeat; r++) {
    const before = gen.engineTimings;
    const t = performance.now();
    const got: GeneratedTrajectory[] = [];
    for await (const row of gen.generate(prompts)) got.push(row);
    const callMs = performance.now() - t;
    const after = gen.engineTimings;
    const n = got.reduce((k, x) => k + x.output_token_ids.length, 0);
    calls.push({ s: +(callMs / 1000).toFixed(2), new_tokens_per_s: Math.round(n / (callMs / 1000)), prefill_s: +((after.prefillMs - before.prefillMs) / 1000).toFixed(3), decode_s: +((after.decodeMs - before.decodeMs) / 1000).toFixed(3), decode_steps: after.decodeSteps - before.decodeSteps });
    if (r === 0) [rows, ms, counters] = [got, callMs, gen.counters];
  }
  const weights = gen.weights;
  const gpuMiB = device === 'cuda' ? gpuUsedMiB() : undefined;
  await gen.dispose();
  const newTokens = rows.reduce((n, r) => n + r.output_token_ids.length, 0);
  if (arg('out', '')) writeFileSync(arg('out', ''), JSON.stringify(rows.map((r) => [r.prompt_idx, r.thinking, r.sample_idx, r.output_token_ids])));

  const result: Record<string, unknown> = {
    bench: 'lathe-trajectories',
    shape: arg('model', '') ? model : shape,
    device,
    dtype,
    prompts: nPrompts,
    samples_thinking: samplesThinking,
    samples_non_thinking: samplesNonThinking,
    prompt_tokens: { min: Math.min(...promptTokens), max: Math.max(...promptTokens) },
    max_new: maxNew,
    batch,
    stop_ids: stopAtEos ? 'eos' : 'none',
    cuda_graph: cudaGraph,
    model_s: +((tModel - t0) / 1000).toFixed(1),
    warmup_s: +((tStart - tWarm) / 1000).toFixed(1),
    rows: rows.length,
    new_tokens: newTokens,
    generate_s: +(ms / 1000).toFixed(2),
    new_tokens_per_s: Math.round(newTokens / (ms / 1000)),
    runs: counters.runs - warm.runs,
    prefilled_prompts: counters.prefilledPrompts - warm.prefilledPrompts,
    quantize,
    quantized_weights: quantizedWeights,
    weights: weights.runs,
    weights_line: describeWeights(weights),
    weight_bytes: weights.deviceBytes ?? null,
    tune_s: weights.tuneSeconds === undefined ? null : +weights.tuneSeconds.toFixed(2),
    gpu_used_mib: gpuMiB ?? null,
    calls,
  };

  if (flag('compare')) {
    // The KV-cache engine alone on the planned prompt ids and keys, in runs of `batch` samples:
    // grouped (sampleKeys: one prefill per (prompt, mode) group) and one row per sample (promptKeys).
    const lm = await CausalLM.fromPretrained(model, { device, dtype });
    const kv = KvCacheGenerator.create(lm, { temperature, rows: batch, maxLength: Math.ceil((Math.max(...promptTokens) + maxNew) / 64) * 64, dtype, cudaGraph: device === 'cuda' });
    const stopIds: number[] = []; // every sample runs to max-new: the same work in both layouts
    const time = async (label: string, call: (chunk: typeof plan) => Promise<unknown>) => {
      await call(plan.slice(0, Math.min(batch, plan.length))); // warm-up (and CUDA-graph capture)
      const sum = { prefillMs: 0, decodeMs: 0, transferMs: 0, decodeSteps: 0 };
      const s = performance.now();
      for (let i = 0; i < plan.length; i += batch) {
        await call(plan.slice(i, i + batch));
        for (const k of Object.keys(sum) as (keyof typeof sum)[]) sum[k] += kv.lastTimings[k];
      }
      const total = performance.now() - s;
      result[label] = { s: +(total / 1000).toFixed(2), new_tokens_per_s: Math.round((plan.length * maxNew) / (total / 1000)), prefill_s: +(sum.prefillMs / 1000).toFixed(3), decode_s: +(sum.decodeMs / 1000).toFixed(2), transfer_s: +(sum.transferMs / 1000).toFixed(2), decode_steps: sum.decodeSteps };
    };
    await time('engine_grouped', (chunk) => {
      const groups = groupsOf(chunk);
      return kv.generate(groups.map((g) => g[0].ids), { maxNewTokens: maxNew, seed, stopIds, sampleKeys: groups.map((g) => g.map((s) => s.key)) });
    });
    await time('engine_one_row_per_sample', (chunk) => kv.generate(chunk.map((s) => s.ids), { maxNewTokens: maxNew, seed, stopIds, promptKeys: chunk.map((s) => s.key) }));
    kv.dispose();
    lm.dispose();
  }
  console.log(JSON.stringify(result));
}

main().catch((e: unknown) => {
  console.error(e instanceof Error ? e.stack : String(e));
  process.exit(1);
});
