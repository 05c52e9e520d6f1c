/**
 * `lathe eval`'s path timed on a random model: the benchmarks' problems under the qwen-boxed chat
 * template, n samples each through TrajectoryGenerator (the KV-cache engine), every completion
 * graded while generation continues (`evaluateBenchmarks`), and where the wall time goes —
 * generation, the grading left after the last completion, and, with --grade-references, the
 * grading cost per completion on real answers (each problem's reference solution graded against
 * its gold, since a random model's text has no answers to check).
 *
 * usage: node eval-bench.js --tokenizer DIR [--model DIR] [--shape qwen3-0.6b|tiny] [--data-dir DIR]
 *          [--benchmarks aime24,…] [--limit 0] [--n 8] [--max-new 4096] [--batch 128]
 *          [--device cuda|cpu] [--dtype bfloat16|float32] [--temperature 0.6] [--top-p 0.95]
 *          [--top-k 0] [--seed 0] [--stop-at-eos] [--grade-workers 4] [--grade-references]
 *          [--prompts-out FILE] [--out rows.json]
 *          [--fast | --kv-cache-dtype float8e4m3 --decode-attention gqa|kernel --swiglu-kernel|--no-swiglu-kernel --residual-dtype float32|compute]
 * --data-dir: the datasets in the public layout (fixtures/eval holds 8–14 rows of each set; carry a
 * copy of ../shared/datasets for the full sets). Without --model a random model of --shape is
 * written to a temporary folder (not timed). No stop tokens unless --stop-at-eos, so every sample
 * runs to --max-new (the same work as transformers with min_new_tokens). --prompts-out writes the
 * rendered prompt ids and sample counts, for tools/reference/eval/hf_generate_eval.py. One warm-up
 * call (one problem, one sample) compiles the engine before the timed call. Prints one JSON line.
 * The KV-cache engine's decode options go to TrajectoryGenerator as `lathe eval`'s flags of the same
 * names (their defaults unless given: the SwiGLU kernel is then on where NVRTC is, so an A/B against
 * it passes --no-swiglu-kernel); --fast is all of them: the e4m3 cache read by Lathe's decode
 * attention kernel, the SwiGLU kernel and the residual stream in the compute dtype (with
 * --temperature 0 the engine also picks greedily through its fused kernel). The JSON line has the
 * resolved options under `decode`.
 */
import { copyFileSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { randomModel, type HfConfig } from '@lathe/models';
import { MathGrader } from '@lathe/graders';
import { BENCHMARKS, evaluateBenchmarks, gradeCompletion, loadBenchmark, parseBenchmarkList, renderEvalTemplate, trajectorySampler, TrajectoryGenerator, type BenchmarkProblem, type DecodeOptionsConfig } from '@lathe/recipes';
import { arg, flag } from '../argv';
import { QWEN3_0_6B } from '../shapes';

const SHAPES: Record<string, HfConfig> = {
  tiny: { architectures: ['Qwen3ForCausalLM'], vocab_size: 151936, hidden_size: 64, intermediate_size: 64, num_hidden_layers: 1, num_attention_heads: 4, num_key_value_heads: 2, head_dim: 16, rms_norm_eps: 1e-6, rope_theta: 1e6, max_position_embeddings: 8192, tie_word_embeddings: true },
  'qwen3-0.6b': QWEN3_0_6B,
};

/** The reference solution of a problem where its file has one (MATH-500, Minerva, GSM8K, AIME24, OlympiadBench). */
function referenceSolutions(dataDir: string, benchmark: string, limit: number): (string | null)[] {
  const file = { aime24: 'aime24', aime25: 'aime25', amc23: 'amc23', math500: 'math500', minerva: 'minerva_math', olympiadbench: 'olympiadbench', gsm8k: 'gsm8k' }[benchmark] ?? benchmark;
  const rows = readFileSync(join(dataDir, file, 'test.jsonl'), 'utf8').split('\n').filter((l) => l.trim() !== '').map((l) => JSON.parse(l) as Record<string, unknown>);
  return rows.slice(0, limit > 0 ? limit : rows.length).map((r) => {
    const s = benchmark === 'gsm8k' ? r.answer : Array.isArray(r.solution) ? r.solution.join('\n') : r.solution;
    return typeof s === 'string' ? s : null;
  });
}

async function main(): Promise<void> {
  const tokenizer = resolve(arg('tokenizer'));
  const device = arg('device', 'cuda') as 'cuda' | 'cpu';
  const dtype = arg('dtype', device === 'cuda' ? 'bfloat16' : 'float32') as 'bfloat16' | 'float32';
  const dataDir = resolve(arg('data-dir', 'fixtures/eval'));
  const benchmarks = parseBenchmarkList(arg('benchmarks', BENCHMARKS.join(',')));
  const limit = Number(arg('limit', '0'));
  const n = Number(arg('n', '8'));
  const maxNew = Number(arg('max-new', '4096'));
  const batch = Number(arg('batch', '128'));
  const gradeWorkers = Number(arg('grade-workers', '4'));
  const shape = arg('shape', 'qwen3-0.6b');

  const t0 = performance.now();
  let model = arg('model', '');
  if (!model) {
    model = mkdtempSync(join(tmpdir(), 'lathe-eval-bench-'));
    // the random model (1.2 GB at the 0.6B shape) goes when the process does, however it ends
    const dir = model;
    process.on('exit', () => rmSync(dir, { recursive: true, force: true }));
    randomModel(model, SHAPES[shape], { seed: 1, std: 0.02 });
    for (const f of ['tokenizer.json', 'tokenizer_config.json']) copyFileSync(join(tokenizer, f), join(model, f));
  }
  const tModel = performance.now();

  const problems: BenchmarkProblem[] = [];
  for (const b of benchmarks) problems.push(...(await loadBenchmark(b, { dir: dataDir, limit })));
  const stopAtEos = flag('stop-at-eos');
  const fast = flag('fast');
  const decode = {
    kv_cache_dtype: (fast ? 'float8e4m3' : arg('kv-cache-dtype', 'auto')) as DecodeOptionsConfig['kv_cache_dtype'],
    decode_attention: (fast ? 'kernel' : arg('decode-attention', 'auto')) as DecodeOptionsConfig['decode_attention'],
    swiglu_kernel: fast || flag('swiglu-kernel') ? true : flag('no-swiglu-kernel') ? false : ('auto' as const),
    residual_dtype: (fast ? 'compute' : arg('residual-dtype', 'float32')) as DecodeOptionsConfig['residual_dtype'],
  };
  const gen = await TrajectoryGenerator.create(model, {
    format: 'chat',
    samplesThinking: 1,
    samplesNonThinking: 0,
    maxNewTokens: maxNew,
    temperature: Number(arg('temperature', '0.6')),
    topP: Number(arg('top-p', '0.95')),
    topK: Number(arg('top-k', '0')),
    seed: Number(arg('seed', '0')),
    device,
    dtype,
    engine: 'kv-cache',
    batchSize: Math.min(batch, problems.length * n),
    tokenizer,
    grade: 'none',
    decode,
    ...(stopAtEos ? {} : { stopIds: [] }),
  });
  const promptIds = problems.map((p) => gen.encode(renderEvalTemplate('qwen-boxed', p.problem), true));
  const longest = promptIds.reduce((m, ids) => Math.max(m, ids.length), 0);
  gen.reserve(longest); // caches sized once, for the longest prompt
  if (arg('prompts-out', '')) writeFileSync(arg('prompts-out', ''), JSON.stringify(problems.map((p, i) => ({ benchmark: p.benchmark, id: p.id, ids: promptIds[i], samples: n }))));

  // Warm-up: compiles the engine (and uploads the weights) on one sample.
  const tWarm = performance.now();
  const sampler = trajectorySampler(gen, true);
  await evaluateBenchmarks(problems.slice(0, 1), sampler, { samples: () => 1, grader: { casWorkers: 1 } });
  const tStart = performance.now();
  const r = await evaluateBenchmarks(problems, sampler, { samples: () => n, passK: [1, n], grader: { casWorkers: gradeWorkers, roundedTolerance: 'digits' } });
  const wall = performance.now() - tStart;
  await gen.dispose();
  if (arg('out', '')) writeFileSync(arg('out', ''), JSON.stringify(r.rows.map((x) => [x.benchmark, x.problem_id, x.sample_idx, x.output_tokens, x.finish_reason])));

  const result: Record<string, unknown> = {
    bench: 'eval-bench',
    shape: arg('model', '') ? model : shape,
    device,
    dtype,
    benchmarks,
    problems: problems.length,
    n,
    samples: r.rows.length,
    prompt_tokens: { min: Math.min(...promptIds.map((x) => x.length)), max: longest },
    max_new: maxNew,
    batch: Math.min(batch, problems.length * n),
    stop_ids: stopAtEos ? 'eos' : 'none',
    decode: gen.decode,
    model_s: +((tModel - t0) / 1000).toFixed(1),
    warmup_s: +((tStart - tWarm) / 1000).toFixed(1),
    wall_s: +(wall / 1000).toFixed(2),
    generation_s: +r.timing.generationS.toFixed(2),
    grading_tail_s: +r.timing.gradingTailS.toFixed(3),
    new_tokens: r.timing.tokens,
    new_tokens_per_s: Math.round(r.timing.tokens / r.timing.generationS),
    truncation_rate: +(r.rows.filter((x) => x.finish_reason === 'length').length / r.rows.length).toFixed(3),
    no_answer_rate: +(r.rows.filter((x) => x.extracted === null).length / r.rows.length).toFixed(3),
    average: r.average,
  };

  if (flag('grade-references')) {
    // Grading cost on real answers: each problem's reference solution as a completion.
    const grader = new MathGrader({ casWorkers: gradeWorkers, roundedTolerance: 'digits' });
    await grader.warmUp();
    const items = benchmarks.flatMap((b) => {
      const refs = referenceSolutions(dataDir, b, limit);
      return problems.filter((p) => p.benchmark === b).map((p, i) => ({ p, text: refs[i] }));
    }).filter((x): x is { p: BenchmarkProblem; text: string } => x.text !== null);
    const s = performance.now();
    const verdicts = await Promise.all(items.map((x) => gradeCompletion(grader, { text: x.text, opensThink: false }, x.p.answer, x.p.relTol ?? null)));
    const ms = performance.now() - s;
    await grader.close();
    result.reference_grading = { completions: items.length, s: +(ms / 1000).toFixed(3), ms_per_completion: +(ms / Math.max(1, items.length)).toFixed(3), correct: verdicts.filter((v) => v.correct).length, workers: gradeWorkers };
  }
  console.log(JSON.stringify(result));
}

main().catch((e: unknown) => {
  console.error(e instanceof Error ? e.stack : String(e));
  process.exit(1);
});
