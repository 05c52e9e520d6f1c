/**
 * Benchmark evaluation during training (`lathe grpo --eval_benchmarks`) timed on a random model: the
 * same short GRPO run twice, without and with `--eval_benchmarks` every `--eval-every` steps, on
 * prompts taken from the benchmark files. Reports each evaluation's wall time and samples, the
 * mean step time of both runs, and whether the two runs trained to the same weights (evaluation
 * must never change what is trained; on CUDA that holds only where a plain run is itself
 * reproducible, so `--check-determinism` runs the plain run a second time to say so).
 *
 * usage: node train-eval-bench.js --tokenizer DIR [--shape qwen3-0.6b|tiny] [--device cuda|cpu]
 *          [--data-dir fixtures/eval] [--benchmarks math500] [--limit 64] [--samples 1]
 *          [--steps 4] [--eval-every 2] [--max-new 512] [--prompts-per-step 8] [--group-size 8]
 *          [--check-determinism]
 * Prints one JSON line.
 */
import { createHash } from 'node:crypto';
import { copyFileSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { randomModel, type HfConfig } from '@lathe/models';
import { defaults, grpoSchema, loadBenchmark, parseBenchmarkList, runGrpo, type GrpoConfig, type TrainBenchmarkResult } from '@lathe/recipes';
import { arg, flag } from '../argv';
import { QWEN3_0_6B } from '../shapes';

const SHAPES: Record<string, HfConfig> = {
  tiny: { architectures: ['Qwen3ForCausalLM'], vocab_size: 151936, hidden_size: 64, intermediate_size: 64, num_hidden_layers: 1, num_attention_heads: 4, num_key_value_heads: 2, head_dim: 16, rms_norm_eps: 1e-6, rope_theta: 1e6, max_position_embeddings: 8192, tie_word_embeddings: true },
  'qwen3-0.6b': QWEN3_0_6B,
};

const sha = (file: string) => createHash('sha256').update(readFileSync(file)).digest('hex').slice(0, 16);

async function main(): Promise<void> {
  const tokenizer = resolve(arg('tokenizer'));
  const device = arg('device', 'cuda') as 'cuda' | 'cpu';
  const shape = arg('shape', 'qwen3-0.6b');
  const dataDir = resolve(arg('data-dir', 'fixtures/eval'));
  const benchmarks = arg('benchmarks', 'math500');
  const limit = Number(arg('limit', '64'));
  const steps = Number(arg('steps', '4'));

  const root = mkdtempSync(join(tmpdir(), 'lathe-train-eval-bench-'));
  const model = join(root, 'model');
  randomModel(model, SHAPES[shape], { seed: 1, std: 0.02 });
  for (const f of ['tokenizer.json', 'tokenizer_config.json']) copyFileSync(join(tokenizer, f), join(model, f));
  // training prompts: the benchmarks' own problems with their gold answers
  const problems = (await Promise.all(parseBenchmarkList(benchmarks).map((b) => loadBenchmark(b, { dir: dataDir })))).flat();
  const data = join(root, 'prompts.jsonl');
  writeFileSync(data, problems.map((p) => JSON.stringify({ prompt: `${p.problem}\nPut your final answer within \\boxed{}.`, answer: p.answer })).join('\n') + '\n');

  const base: GrpoConfig = {
    ...defaults(grpoSchema),
    model,
    data,
    device,
    prompt_format: 'chat',
    reward: 'math',
    steps,
    prompts_per_step: Number(arg('prompts-per-step', '8')),
    group_size: Number(arg('group-size', '8')),
    max_new_tokens: Number(arg('max-new', '512')),
    eval_examples: 0,
    eval_every: Number(arg('eval-every', '2')),
    save_every: 0,
    lr: 1e-6,
    overwrite: true,
  };
  const run = async (name: string, over: Partial<GrpoConfig>) => {
    const evals: TrainBenchmarkResult[] = [];
    const stepMs: number[] = [];
    const t0 = performance.now();
    const r = await runGrpo({ ...base, run_dir: join(root, name), ...over }, { onBenchmarks: (b) => evals.push(b), onStep: (m) => stepMs.push(m.step_ms) });
    return { wallS: (performance.now() - t0) / 1000, stepMsMean: stepMs.reduce((a, b) => a + b, 0) / Math.max(1, stepMs.length), evals, weights: sha(join(r.checkpoint, 'model.safetensors')) };
  };
  const plain = await run('plain', {});
  const withEval = await run('with-eval', { eval_benchmarks: benchmarks, eval_data_dir: dataDir, eval_limit: limit, eval_samples: Number(arg('samples', '1')) });
  const again = flag('check-determinism') ? await run('plain-again', {}) : undefined;
  console.log(
    JSON.stringify({
      shape,
      device,
      steps,
      benchmarks,
      eval_limit: limit,
      max_new_tokens: base.max_new_tokens,
      evals: withEval.evals.map((e) => ({ step: e.step, samples: e.samples, seconds: Number(e.seconds.toFixed(2)), ...e.entries })),
      eval_seconds_mean: Number((withEval.evals.reduce((a, e) => a + e.seconds, 0) / Math.max(1, withEval.evals.length)).toFixed(2)),
      step_ms_mean: { plain: Math.round(plain.stepMsMean), with_eval: Math.round(withEval.stepMsMean) },
      wall_s: { plain: Number(plain.wallS.toFixed(1)), with_eval: Number(withEval.wallS.toFixed(1)) },
      same_weights: plain.weights === withEval.weights,
      ...(again ? { plain_reproducible: plain.weights === again.weights } : {}),
    }),
  );
}

main().catch((e: unknown) => {
  console.error(e);
  process.exit(1);
});
