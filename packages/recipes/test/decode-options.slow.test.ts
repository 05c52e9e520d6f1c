/**
 * The KV-cache engine's decode options of lathe generate and lathe eval: one definition shared by
 * both schemas; the resolver over every combination of values and run facts (errors name the
 * flags); config files, flags and the saved config; a resume that changes one is refused; the cpu
 * refusals through runGenerate and runEval; and TrajectoryGenerator handing the resolved options to
 * the KV-cache engine on a tiny float32 model (where --residual_dtype compute is float32: the same
 * greedy tokens).
 */
import { existsSync, mkdirSync, mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { parse as parseYaml, stringify as toYaml } from 'yaml';
import { KvCacheGenerator } from '@lathe/rollout';
import {
  configChanges,
  decodeOptions,
  defaults,
  describeDecode,
  evalSchema,
  GENERATE_RESUMABLE_KEYS,
  generateSchema,
  resolveConfig,
  resolveDecodeOptions,
  runEval,
  runGenerate,
  samplingEngineOptions,
  TrajectoryGenerator,
  type DecodeFacts,
  type DecodeOptionsConfig,
  type GenerateConfig,
  type ResolvedDecodeOptions,
} from '@lathe/recipes';
import { parquetInfo } from '@lathe/data';
import { tinyQwen3 } from './tiny-qwen3';

const root = mkdtempSync(join(tmpdir(), 'lathe-decode-options-'));
const model = tinyQwen3(join(root, 'tiny'), { seed: 3, maxPositions: 256 });

const KV_CACHE_DTYPES = ['auto', 'float8e4m3'] as const;
const ATTENTIONS = ['auto', 'gqa', 'kernel'] as const;
const SWIGLUS = ['auto', true, false] as const;
const RESIDUALS = ['float32', 'compute'] as const;
const every: DecodeOptionsConfig[] = KV_CACHE_DTYPES.flatMap((kv_cache_dtype) =>
  ATTENTIONS.flatMap((decode_attention) => SWIGLUS.flatMap((swiglu_kernel) => RESIDUALS.map((residual_dtype) => ({ kv_cache_dtype, decode_attention, swiglu_kernel, residual_dtype })))),
);

const cuda: DecodeFacts = { device: 'cuda', engine: 'kv-cache' };
const FACTS: Record<string, DecodeFacts> = {
  cpu: { device: 'cpu', engine: 'kv-cache' },
  'cpu, graph engine': { device: 'cpu', engine: 'graph' },
  'cuda, graph engine (auto)': { device: 'cuda', engine: 'graph', engineWhy: 'compute dtype float32 on cuda' },
  'cuda, no NVRTC': { ...cuda, kernelsUnavailable: 'libnvrtc.so not found' },
  'cuda, heads the kernel does not take': { ...cuda, attentionUnsupported: 'head size 96 (the kernels take 64 or 128)' },
  cuda,
};

/** The flags of `c` that ask for a kernel outright. */
const kernelAsks = (c: DecodeOptionsConfig) => [
  ...(c.kv_cache_dtype === 'float8e4m3' ? ['--kv_cache_dtype float8e4m3'] : []),
  ...(c.decode_attention === 'kernel' ? ['--decode_attention kernel'] : []),
  ...(c.swiglu_kernel === true ? ['--swiglu_kernel true'] : []),
];

describe('one definition', () => {
  test('lathe generate and lathe eval take the same four options, defaults off but the SwiGLU kernel (auto)', () => {
    for (const [k, spec] of Object.entries(decodeOptions)) {
      expect((generateSchema as Record<string, unknown>)[k]).toBe(spec);
      expect((evalSchema as Record<string, unknown>)[k]).toBe(spec);
    }
    expect(Object.keys(decodeOptions)).toEqual(['kv_cache_dtype', 'decode_attention', 'swiglu_kernel', 'residual_dtype']);
    const d = defaults(generateSchema);
    expect([d.kv_cache_dtype, d.decode_attention, d.swiglu_kernel, d.residual_dtype]).toEqual(['auto', 'auto', 'auto', 'float32']);
    // the measured facts are in the help
    expect(decodeOptions.kv_cache_dtype.describe).toContain('lossy');
    expect(decodeOptions.swiglu_kernel.describe).toContain('rounding changes on ties only');
    expect(decodeOptions.residual_dtype.describe).toContain('greedy outputs change on ties');
  });

  test('none of them may change on resume: they change the samples', () => {
    for (const k of Object.keys(decodeOptions)) expect(GENERATE_RESUMABLE_KEYS).not.toContain(k);
  });
});

describe('resolveDecodeOptions', () => {
  test('the defaults: GroupQueryAttention over a cache in the compute dtype, the SwiGLU kernel where the kernels run', () => {
    const off = { decodeAttention: 'gqa', kvCacheDtype: 'model', swiglu: false, residualDtype: 'float32', concatProjections: false };
    expect(resolveDecodeOptions({}, cuda)).toEqual({ ...off, swiglu: true });
    expect(resolveDecodeOptions({}, FACTS.cpu)).toEqual(off);
    expect(resolveDecodeOptions({}, FACTS['cuda, graph engine (auto)'])).toEqual(off);
    expect(resolveDecodeOptions({}, FACTS['cuda, no NVRTC'])).toEqual({ ...off, note: "note: --swiglu_kernel auto stays off: Lathe's CUDA kernels are not available (libnvrtc.so not found); ONNX Runtime's QuickGelu and Mul run instead" });
  });

  test('--fast as flags: the e4m3 cache read by the decode kernel over packed projections, the SwiGLU kernel, the compute-dtype residual', () => {
    expect(resolveDecodeOptions({ kv_cache_dtype: 'float8e4m3', swiglu_kernel: true, residual_dtype: 'compute' }, cuda)).toEqual({ decodeAttention: 'kernel', kvCacheDtype: 'float8e4m3', swiglu: true, residualDtype: 'compute', concatProjections: true });
    expect(resolveDecodeOptions({ decode_attention: 'kernel', swiglu_kernel: false }, cuda)).toEqual({ decodeAttention: 'kernel', kvCacheDtype: 'model', swiglu: false, residualDtype: 'float32', concatProjections: true });
  });

  test("each refusal's text", () => {
    expect(() => resolveDecodeOptions({ kv_cache_dtype: 'float8e4m3', decode_attention: 'gqa' }, cuda)).toThrow(
      '--kv_cache_dtype float8e4m3 with --decode_attention gqa: GroupQueryAttention reads a cache in the compute dtype only; use --decode_attention kernel (or auto, which takes it with the e4m3 cache), or drop --kv_cache_dtype',
    );
    expect(() => resolveDecodeOptions({ kv_cache_dtype: 'float8e4m3' }, FACTS.cpu)).toThrow("--kv_cache_dtype float8e4m3 needs --device cuda (Lathe's CUDA kernels); on the cpu drop it");
    expect(() => resolveDecodeOptions({ decode_attention: 'kernel', swiglu_kernel: true }, FACTS.cpu)).toThrow("--decode_attention kernel, --swiglu_kernel true need --device cuda (Lathe's CUDA kernels); on the cpu drop them");
    expect(() => resolveDecodeOptions({ residual_dtype: 'compute' }, FACTS['cpu, graph engine'])).toThrow(
      '--residual_dtype compute needs the kv-cache generation engine, and this run generates with the graph engine (--generation_engine graph); use --generation_engine kv-cache where it runs, or drop it',
    );
    expect(() => resolveDecodeOptions({ swiglu_kernel: true }, FACTS['cuda, graph engine (auto)'])).toThrow(
      '--swiglu_kernel true needs the kv-cache generation engine, and this run generates with the graph engine (the kv-cache engine cannot run: compute dtype float32 on cuda); use --generation_engine kv-cache where it runs, or drop it',
    );
    expect(() => resolveDecodeOptions({ decode_attention: 'kernel' }, FACTS['cuda, no NVRTC'])).toThrow(
      "--decode_attention kernel needs Lathe's CUDA kernels (NVRTC and the CUDA driver), which are not available: libnvrtc.so not found; install NVRTC (lathe doctor says what is missing), or drop it",
    );
    expect(() => resolveDecodeOptions({ kv_cache_dtype: 'float8e4m3' }, FACTS['cuda, heads the kernel does not take'])).toThrow(
      "--kv_cache_dtype float8e4m3: the model's attention is not one Lathe's decode attention kernel takes: head size 96 (the kernels take 64 or 128); drop --kv_cache_dtype float8e4m3",
    );
    expect(() => resolveDecodeOptions({ kv_cache_dtype: 'float8e4m3', decode_attention: 'kernel' }, FACTS['cuda, heads the kernel does not take'])).toThrow(
      "--decode_attention kernel: the model's attention is not one Lathe's decode attention kernel takes: head size 96 (the kernels take 64 or 128); drop --decode_attention kernel and --kv_cache_dtype float8e4m3",
    );
  });

  test.each(Object.keys(FACTS))('every combination of values, %s: a kernel only where asked for and able to run; refusals name the flags', (name) => {
    const facts = FACTS[name];
    for (const c of every) {
      const asks = kernelAsks(c);
      const conflict = c.kv_cache_dtype === 'float8e4m3' && c.decode_attention === 'gqa';
      const graphResidual = facts.engine === 'graph' && c.residual_dtype === 'compute';
      const kernel = c.decode_attention === 'kernel' || c.kv_cache_dtype === 'float8e4m3';
      const refused = conflict || graphResidual || (asks.length > 0 && (facts.device !== 'cuda' || facts.engine === 'graph' || facts.kernelsUnavailable !== undefined)) || (kernel && facts.attentionUnsupported !== undefined);
      const where = JSON.stringify(c);
      if (refused) {
        let message = '';
        try {
          resolveDecodeOptions(c, facts);
        } catch (e) {
          message = (e as Error).message;
        }
        expect([where, message === '' ? 'resolved' : 'refused']).toEqual([where, 'refused']);
        const named = conflict ? ['--kv_cache_dtype float8e4m3', '--decode_attention gqa'] : graphResidual && asks.length === 0 ? ['--residual_dtype compute'] : asks.length ? [asks.find((a) => message.includes(a))!] : [];
        for (const flag of named) expect([where, message]).toEqual([where, expect.stringContaining(flag)]);
        if (!conflict && facts.device !== 'cuda' && asks.length) expect(message).toContain('--device cuda');
        continue;
      }
      const r = resolveDecodeOptions(c, facts);
      const kernels = facts.device === 'cuda' && facts.engine === 'kv-cache' && facts.kernelsUnavailable === undefined;
      expect([where, r]).toEqual([
        where,
        {
          decodeAttention: kernel && kernels ? 'kernel' : 'gqa',
          kvCacheDtype: c.kv_cache_dtype === 'float8e4m3' ? 'float8e4m3' : 'model',
          swiglu: kernels && c.swiglu_kernel !== false,
          residualDtype: c.residual_dtype,
          concatProjections: kernel && kernels,
          ...(facts.kernelsUnavailable && facts.device === 'cuda' && facts.engine === 'kv-cache' && c.swiglu_kernel === 'auto' ? { note: expect.stringContaining('--swiglu_kernel auto stays off') } : {}),
        },
      ]);
    }
  });
});

describe('config files, flags and the saved config', () => {
  test('YAML and flags resolve to the typed values; a value outside the choices names the source and the option', () => {
    const cfg = resolveConfig(generateSchema, [
      { name: 'config.yaml', values: parseYaml('kv_cache_dtype: float8e4m3\nswiglu_kernel: auto\nresidual_dtype: compute\n') as Record<string, unknown> },
      { name: 'command line', values: { decode_attention: 'kernel', swiglu_kernel: true } },
    ]);
    expect([cfg.kv_cache_dtype, cfg.decode_attention, cfg.swiglu_kernel, cfg.residual_dtype]).toEqual(['float8e4m3', 'kernel', true, 'compute']);
    expect(samplingEngineOptions(cfg).decode).toEqual({ kv_cache_dtype: 'float8e4m3', decode_attention: 'kernel', swiglu_kernel: true, residual_dtype: 'compute' });
    expect(() => resolveConfig(evalSchema, [{ name: 'command line', values: { kv_cache_dtype: 'fp8' } }])).toThrow("command line: option 'kv_cache_dtype' must be one of auto, float8e4m3, got 'fp8'");
    expect(() => resolveConfig(evalSchema, [{ name: 'config.yaml', values: { swiglu_kernel: 'on' } }])).toThrow("config.yaml: option 'swiglu_kernel' must be true or false or 'auto', got \"on\"");
  });

  test('the saved config reads back the same, and a resume that changes one of them is listed', () => {
    const cfg: GenerateConfig = { ...defaults(generateSchema), model, data: 'p.jsonl', output: 'o.parquet', kv_cache_dtype: 'float8e4m3', residual_dtype: 'compute', swiglu_kernel: false };
    const file = join(root, 'saved.config.yaml');
    writeFileSync(file, toYaml(cfg));
    expect(resolveConfig(generateSchema, [{ name: file, values: parseYaml(toYaml(cfg)) as Record<string, unknown> }])).toEqual(cfg);
    expect(configChanges(file, { ...cfg, batch_size: 8 }, GENERATE_RESUMABLE_KEYS)).toEqual([]);
    expect(configChanges(file, { ...cfg, kv_cache_dtype: 'auto', swiglu_kernel: 'auto' }, GENERATE_RESUMABLE_KEYS).map((d) => d.text)).toEqual(['kv_cache_dtype: "float8e4m3" → "auto"', 'swiglu_kernel: false → "auto"']);
  });
});

describe('through the recipes on the cpu', () => {
  const data = join(root, 'prompts.jsonl');
  writeFileSync(data, '{"prompt": "What is 2+3?", "answer": "5"}\n');
  const generateConfig = (over: Partial<GenerateConfig>): GenerateConfig => ({ ...defaults(generateSchema), model, data, output: join(root, 'gen', 'out.parquet'), max_new_tokens: 4, samples_thinking: 1, samples_non_thinking: 0, prompt_format: 'raw', ...over });

  test('lathe generate: a kernel on the cpu is refused before any file is written, naming the flag and --device cuda', async () => {
    await expect(runGenerate(generateConfig({ kv_cache_dtype: 'float8e4m3' }))).rejects.toThrow("--kv_cache_dtype float8e4m3 needs --device cuda (Lathe's CUDA kernels); on the cpu drop it");
    await expect(runGenerate(generateConfig({ swiglu_kernel: true }))).rejects.toThrow('--swiglu_kernel true needs --device cuda');
    expect(existsSync(join(root, 'gen'))).toBe(false);
  });

  test("lathe generate: the resolved options reach onStart and the output's footer", async () => {
    const cfg = generateConfig({ output: join(root, 'footer', 'out.parquet'), residual_dtype: 'compute' });
    let started: ResolvedDecodeOptions | undefined;
    await runGenerate(cfg, { onStart: (i) => (started = i.decode) });
    const resolved = { decodeAttention: 'gqa', kvCacheDtype: 'model', swiglu: false, residualDtype: 'compute', concatProjections: false };
    expect(started).toEqual(resolved);
    expect(describeDecode(started!)).toBe('the residual stream in the compute dtype');
    const footer = JSON.parse((await parquetInfo(cfg.output)).metadata['lathe:generate']) as Record<string, unknown>;
    expect(footer.decode).toEqual({ kv_cache_dtype: 'model', decode_attention: 'gqa', swiglu_kernel: false, residual_dtype: 'compute' });
  }, 120_000);

  test('lathe generate --resume with another --residual_dtype than the saved run is refused', async () => {
    const cfg = generateConfig({ output: join(root, 'resume', 'out.parquet') });
    mkdirSync(join(root, 'resume'), { recursive: true });
    writeFileSync(join(root, 'resume', 'out.config.yaml'), toYaml({ ...cfg, residual_dtype: 'compute' }));
    await expect(runGenerate({ ...cfg, resume: true })).rejects.toThrow('--resume: the config differs from the earlier run\'s');
    await expect(runGenerate({ ...cfg, resume: true })).rejects.toThrow('residual_dtype: "compute" → "float32"');
  });

  test('lathe eval: the same refusal, under the model it concerns', async () => {
    const cfg = { ...defaults(evalSchema), model, benchmarks: 'gsm8k', data_dir: resolve(__dirname, '../../../fixtures/eval'), limit: 1, n_large: 1, max_new_tokens: 4, grade_workers: 1, run_dir: join(root, 'eval'), decode_attention: 'kernel' as const };
    await expect(runEval(cfg)).rejects.toThrow(`--model ${model}: --decode_attention kernel needs --device cuda (Lathe's CUDA kernels); on the cpu drop it`);
  });

  test('TrajectoryGenerator hands the resolved options to the KV-cache engine: --residual_dtype compute in float32 gives the same greedy tokens', async () => {
    const create = jest.spyOn(KvCacheGenerator, 'create');
    const tokensWith = async (residual_dtype: 'float32' | 'compute') => {
      const gen = await TrajectoryGenerator.create(model, { maxNewTokens: 5, format: 'raw', samplesThinking: 2, temperature: 0, stopIds: [], batchSize: 4, grade: 'none', decode: { residual_dtype } });
      try {
        expect(gen.engine.engine).toBe('kv-cache');
        expect(gen.decode).toEqual({ decodeAttention: 'gqa', kvCacheDtype: 'model', swiglu: false, residualDtype: residual_dtype, concatProjections: false });
        const rows = [];
        for await (const r of gen.generate(['What is 2+3?', 'Name a prime.'])) rows.push(r.output_token_ids);
        return rows;
      } finally {
        await gen.dispose();
      }
    };
    try {
      const plain = await tokensWith('float32');
      expect(create.mock.calls.at(-1)![1]).not.toHaveProperty('residualDtype');
      const compute = await tokensWith('compute');
      expect(create.mock.calls.at(-1)![1]).toMatchObject({ residualDtype: 'compute' });
      for (const k of ['decodeAttention', 'kvCacheDtype', 'swiglu', 'concatProjections']) expect(create.mock.calls.at(-1)![1]).not.toHaveProperty(k);
      expect(compute).toEqual(plain);
      expect(plain.flat()).toHaveLength(4 * 5);
    } finally {
      create.mockRestore();
    }
  }, 120_000);
});
