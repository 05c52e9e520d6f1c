/**
 * `lathe generate` and `lathe eval` over a quantized folder (`--quantized_weights`): a tiny Qwen3
 * quantized to int8, int4 and nf4 and saved as `lathe quantize` saves it, then generated from
 * greedily through its kernels (`auto`: the device holds the uint8 codes, ONNX Runtime's
 * MatMulNBits / MatMulBnb4 read them) and dequantized at load (`dequantize`): the same tokens, with
 * the kernels' path checked to hold the codes and not the dense projections. Also the planner over
 * every device, dtype and engine (INT4 on cuda → Lathe's W4A16 kernel), the W4A16 wiring through its
 * CPU op, the option in both schemas, and the refusals naming the flags.
 */
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { parse as parseYaml, stringify as toYaml } from 'yaml';
import { CausalLM } from '@lathe/models';
import { Device } from '@lathe/runtime';
import { QuantizedModel, saveQuantized, type QuantScheme } from '@lathe/quantization';
import { parquetInfo } from '@lathe/data';
import {
  defaults,
  describeWeights,
  engineWeights,
  evalSchema,
  generateSchema,
  planModelWeights,
  resolveConfig,
  runEval,
  runGenerate,
  TrajectoryGenerator,
  type GenerateConfig,
  type ModelWeights,
  type TrajectoryOptions,
} from '@lathe/recipes';
import { tinyQwen3 } from './tiny-qwen3';

const root = mkdtempSync(join(tmpdir(), 'lathe-quantized-generate-'));
// seed 7: the dequantized model's greedy continuations of these prompts are not one repeated token, so agreeing on them means something
const dense = tinyQwen3(join(root, 'dense'), { seed: 7, maxPositions: 256 });
const source = CausalLM.fromPretrainedSync(dense);
const SCHEMES: Record<string, QuantScheme> = { int8: { format: 'int8' }, int4: { format: 'int4', blockSize: 32 }, nf4: { format: 'nf4', doubleQuant: true } };
const folders = Object.fromEntries(
  Object.entries(SCHEMES).map(([name, scheme]) => {
    const dir = join(root, name);
    saveQuantized(dir, QuantizedModel.quantize(source.config, source.float32Weights(), scheme), { denseDtype: 'float32', tokenizerFrom: dense });
    return [name, dir];
  }),
);
source.dispose();

const PROMPTS = ['What is 2+3?', 'Name a prime number.', 'Hello'];
const options: TrajectoryOptions = { maxNewTokens: 8, format: 'raw', samplesThinking: 1, temperature: 0, stopIds: [], batchSize: 4, grade: 'none' };

async function greedy(model: string, o: Partial<TrajectoryOptions>): Promise<{ tokens: number[][]; weights: ModelWeights }> {
  const gen = await TrajectoryGenerator.create(model, { ...options, ...o });
  try {
    const tokens: number[][] = [];
    for await (const row of gen.generate(PROMPTS)) tokens.push(row.output_token_ids);
    return { tokens, weights: gen.weights };
  } finally {
    await gen.dispose();
  }
}

// one layer: q, k, v, o, gate, up, down
const PROJECTIONS = 7;

describe.each([
  ['int8', 'MatMulNBits'],
  ['int4', 'MatMulNBits'],
  ['nf4', 'MatMulBnb4'],
] as const)('%s folder on the cpu', (name, kernel) => {
  test(`auto runs ${kernel} over the codes and generates the dequantized model's greedy tokens`, async () => {
    const deq = await greedy(folders[name], { quantizedWeights: 'dequantize' });
    const auto = await greedy(folders[name], {});
    expect(new Set(deq.tokens.flat()).size).toBeGreaterThan(3);
    // both multiply by the same dequantized values in float32 (MatMulNBits and MatMulBnb4 dequantize, then GEMM)
    expect(auto.tokens).toEqual(deq.tokens);
    expect(deq.weights).toMatchObject({ format: name, runs: 'dequantized', codeTensors: 0 });
    expect(auto.weights).toMatchObject({ format: name, runs: kernel, codeTensors: PROJECTIONS });
    // the device holds the codes in place of the dense projections: 64×64 (q, k·2, v·2, o) and 64×64·3 float32 → ≤ 1 byte a weight plus scales
    const projectionFloats = 64 * (64 + 32 + 32 + 64) + 3 * 64 * 64;
    expect(deq.weights.deviceBytes! - auto.weights.deviceBytes!).toBeGreaterThan(projectionFloats * (4 - 1.2));
    expect(describeWeights(auto.weights)).toMatch(new RegExp(`^${name} .*: ONNX Runtime's ${kernel}; \\d\\.\\d+ GiB of weights on the device$`));
    expect(describeWeights(deq.weights)).toContain('dequantized to float32 at load (--quantized_weights dequantize)');
  }, 30_000);
});

test("the W4A16 op's wiring (its CPU host op, untuned) generates what MatMulNBits does", async () => {
  const device = Device.open('cpu');
  const run = async (runs: ModelWeights['runs']) => {
    const w = engineWeights(folders.int4, device, 'float32', runs, undefined);
    const gen = w.create({ temperature: 0, rows: 2, maxLength: 32, dtype: 'float32' });
    try {
      const out = await gen.generate([[1, 2, 3, 4], [5, 6, 7]], { maxNewTokens: 6, seed: 1 });
      w.check();
      return { tokens: out.map((c) => c.tokens), raw: out.flatMap((c) => c.rawLogprobs), loaded: w.loaded };
    } finally {
      gen.dispose();
      w.dispose();
    }
  };
  const nbits = await run('MatMulNBits');
  const w4 = await run('w4a16');
  expect(w4.tokens).toEqual(nbits.tokens);
  w4.raw.forEach((x, i) => expect(Math.abs(x - nbits.raw[i])).toBeLessThan(1e-4));
  // q/k/v and gate/up held concatenated: 2 fused code tensors + o + down
  expect(w4.loaded.codeTensors).toBe(4);
  expect(nbits.loaded.codeTensors).toBe(PROJECTIONS);
}, 30_000);

describe('planModelWeights', () => {
  const kv = { engine: 'kv-cache' } as const;
  const int4: QuantScheme = { format: 'int4', blockSize: 64, zeroPoints: false };
  test('auto: INT4 on cuda in 16 bits through the W4A16 kernel (MatMulNBits without NVRTC); INT8, CPU INT4 MatMulNBits; NF4 MatMulBnb4; dense folders dense', () => {
    const plan = (scheme: QuantScheme | undefined, device: 'cpu' | 'cuda', dtype: 'float32' | 'bfloat16' | 'float16', kernelsUnavailable?: string) =>
      planModelWeights(scheme, { request: 'auto', device, dtype, engine: kv, ...(kernelsUnavailable ? { kernelsUnavailable } : {}) });
    expect(plan(int4, 'cuda', 'bfloat16').runs).toBe('w4a16');
    expect(plan(int4, 'cuda', 'float16').runs).toBe('w4a16');
    expect(plan(int4, 'cuda', 'bfloat16', 'libnvrtc.so not found')).toMatchObject({ runs: 'MatMulNBits', note: "Lathe's W4A16 kernel is not available: libnvrtc.so not found" });
    expect(plan(int4, 'cpu', 'float32').runs).toBe('MatMulNBits');
    expect(plan({ format: 'int8' }, 'cuda', 'bfloat16').runs).toBe('MatMulNBits');
    expect(plan({ format: 'nf4', blockSize: 64 }, 'cuda', 'bfloat16').runs).toBe('MatMulBnb4');
    expect(plan(undefined, 'cuda', 'bfloat16')).toEqual({ format: 'dense', dtype: 'bfloat16', runs: 'dense' });
    expect(describeWeights({ ...plan(int4, 'cuda', 'bfloat16'), tuneSeconds: 2.14, deviceBytes: 5.5 * 2 ** 30 })).toBe(
      "int4 blocks of 64: Lathe's W4A16 kernel in decode steps of up to 64 rows (plans tuned in 2.1 s), its dequantize + cuBLAS otherwise; 5.50 GiB of weights on the device",
    );
    expect(describeWeights(plan(undefined, 'cpu', 'float32'))).toBe('');
  });

  test('the graph engine reads dense weights only: auto is refused naming --generation_engine and --quantized_weights dequantize; dequantize runs anywhere', () => {
    const graph = (why?: string) => planModelWeights(int4, { request: 'auto', device: 'cuda', dtype: 'float32', engine: { engine: 'graph', ...(why ? { why } : {}) } });
    expect(() => graph()).toThrow('--quantized_weights auto: a quantized model (int4) runs through its kernels in the kv-cache generation engine only, and this run generates with the graph engine (--generation_engine graph); use --generation_engine kv-cache where it runs, or --quantized_weights dequantize');
    expect(() => graph('compute dtype float32 on cuda')).toThrow('(the kv-cache engine cannot run: compute dtype float32 on cuda)');
    expect(planModelWeights(int4, { request: 'dequantize', device: 'cuda', dtype: 'float32', engine: { engine: 'graph' } }).runs).toBe('dequantized');
    expect(() => planModelWeights(int4, { request: 'fast' as never, device: 'cpu', dtype: 'float32', engine: kv })).toThrow("--quantized_weights must be 'auto' or 'dequantize', got 'fast'");
  });
});

describe('the option', () => {
  test('one definition in both schemas, with help naming both values and the memory trade; a bad value names the option', () => {
    expect(generateSchema.quantized_weights).toBe(evalSchema.quantized_weights);
    expect(generateSchema.quantized_weights.default).toBe('auto');
    expect(generateSchema.quantized_weights.describe).toMatch(/auto: .*W4A16.*MatMulNBits.*MatMulBnb4.*dequantize: .*memory/s);
    expect(resolveConfig(generateSchema, [{ name: 'config.yaml', values: parseYaml('quantized_weights: dequantize\n') as Record<string, unknown> }]).quantized_weights).toBe('dequantize');
    expect(() => resolveConfig(evalSchema, [{ name: 'command line', values: { quantized_weights: 'kernel' } }])).toThrow("command line: option 'quantized_weights' must be one of auto, dequantize, got 'kernel'");
  });

  test('the saved config reads back the same', () => {
    const cfg: GenerateConfig = { ...defaults(generateSchema), model: folders.int4, data: 'p.jsonl', output: 'o.parquet', quantized_weights: 'dequantize' };
    expect(resolveConfig(generateSchema, [{ name: 'saved', values: parseYaml(toYaml(cfg)) as Record<string, unknown> }])).toEqual(cfg);
  });
});

describe('through the recipes', () => {
  const data = join(root, 'prompts.jsonl');
  writeFileSync(data, '{"prompt": "What is 2+3?", "answer": "5"}\n');
  const generateConfig = (over: Partial<GenerateConfig>): GenerateConfig => ({ ...defaults(generateSchema), model: folders.int4, data, output: join(root, 'gen', 'out.parquet'), max_new_tokens: 4, samples_thinking: 1, samples_non_thinking: 0, prompt_format: 'raw', ...over });

  test('lathe generate: the start line gets the loaded weights, the footer how they ran; --generation_engine graph is refused with the way out', async () => {
    const cfg = generateConfig({});
    let started: ModelWeights | undefined;
    const result = await runGenerate(cfg, { onStart: (i) => (started = i.weights) });
    expect(started).toMatchObject({ format: 'int4', runs: 'MatMulNBits', codeTensors: PROJECTIONS });
    // the kv-cache engine's own clocks: both phases ran
    expect(result.engineSeconds.prefill).toBeGreaterThan(0);
    expect(result.engineSeconds.decode).toBeGreaterThan(0);
    const footer = JSON.parse((await parquetInfo(cfg.output)).metadata['lathe:generate']) as Record<string, unknown>;
    expect(footer.weights).toBe('MatMulNBits');
    await expect(runGenerate(generateConfig({ generation_engine: 'graph', output: join(root, 'graph', 'out.parquet') }))).rejects.toThrow('--quantized_weights auto: a quantized model (int4) runs through its kernels in the kv-cache generation engine only');
  }, 30_000);

  test('lathe eval: the same path, its start event with the loaded weights', async () => {
    const cfg = { ...defaults(evalSchema), model: folders.nf4, benchmarks: 'gsm8k', data_dir: resolve(__dirname, '../../../fixtures/eval'), limit: 1, n_large: 1, max_new_tokens: 4, grade_workers: 1, run_dir: join(root, 'eval') };
    let started: ModelWeights | undefined;
    await runEval(cfg, { onModelStart: (i) => (started = i.weights) });
    expect(started).toMatchObject({ format: 'nf4', runs: 'MatMulBnb4', codeTensors: PROJECTIONS });
    await expect(runEval({ ...cfg, generation_engine: 'graph', run_dir: join(root, 'eval-graph') })).rejects.toThrow(`--model ${folders.nf4}: --quantized_weights auto:`);
  }, 30_000);
});
