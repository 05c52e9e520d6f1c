/**
 * `lathe serve` takes the KV-cache engine's decode options (`decodeOptions` of common-options.ts):
 * one definition shared with lathe generate; flags and YAML; the resolution and its refusals naming
 * the flag on the cpu; the resolved record at load. Then the slot engine with each option on the
 * CPU (float32; the kernel ops' host rules): rows admitted at different steps into reused slots give
 * the batch engine's tokens and log-probs under the same options (independent truth: the batch
 * engine's graphs), and the lossless options give the default slot engine's tokens.
 */
import { parse as parseYaml } from 'yaml';
import * as L from '@lathe/onnx';
import { CausalLM, weightInputs, type DecoderConfig } from '@lathe/models';
import { Device } from '@lathe/runtime';
import { addSlotDecodeStep, addSlotPrefill, KvCacheGenerator, SlotEngine, type SlotGraphOptions, type Completion, type KvCacheGeneratorOptions, type SlotEngineOptions, type SlotToken } from '@lathe/rollout';
import { decodeAttentionOps, swigluOps } from '@lathe/kernels';
import { decodeOptions, defaults, describeDecode, generateSchema, resolveConfig, resolveServeDecode, serveSchema, startServe, type ResolvedDecodeOptions, type ServeConfig, type ServeEvents } from '@lathe/recipes';
import { tinyServeModel } from './serve-helpers';
import { slotGreedy } from '../../../tools/bench/serve/slot-decode-check';

const dir = tinyServeModel('decode-options');
const serve = (over: Partial<ServeConfig>, events?: ServeEvents) => startServe({ ...defaults(serveSchema), port: 0, ...over }, events);
const off: ResolvedDecodeOptions = { decodeAttention: 'gqa', kvCacheDtype: 'model', swiglu: false, residualDtype: 'float32', concatProjections: false };

describe('options', () => {
  test('lathe serve takes the same four options as lathe generate, with their defaults', () => {
    for (const [k, spec] of Object.entries(decodeOptions)) {
      expect((serveSchema as Record<string, unknown>)[k]).toBe(spec);
      expect((generateSchema as Record<string, unknown>)[k]).toBe(spec);
    }
    const d = defaults(serveSchema);
    expect([d.kv_cache_dtype, d.decode_attention, d.swiglu_kernel, d.residual_dtype]).toEqual(['auto', 'auto', 'auto', 'float32']);
  });

  test('YAML and flags resolve to the typed values; a value outside the choices names the source and the option', () => {
    const cfg = resolveConfig(serveSchema, [
      { name: 'serve.yaml', values: parseYaml('kv_cache_dtype: float8e4m3\nresidual_dtype: compute\n') as Record<string, unknown> },
      { name: 'command line', values: { decode_attention: 'kernel', swiglu_kernel: false } },
    ]);
    expect([cfg.kv_cache_dtype, cfg.decode_attention, cfg.swiglu_kernel, cfg.residual_dtype]).toEqual(['float8e4m3', 'kernel', false, 'compute']);
    expect(() => resolveConfig(serveSchema, [{ name: 'command line', values: { decode_attention: 'flash' } }])).toThrow("command line: option 'decode_attention' must be one of auto, gqa, kernel, got 'flash'");
  });

  test('on the cpu: auto values fall back to ONNX Runtime, kernel asks are refused naming the flag', () => {
    const { config } = CausalLM.fromPretrainedSync(dir);
    const cpu = { ...defaults(serveSchema), device: 'cpu' as const };
    expect(resolveServeDecode(cpu, config, 'float32')).toEqual(off);
    expect(resolveServeDecode({ ...cpu, residual_dtype: 'compute' }, config, 'float32')).toEqual({ ...off, residualDtype: 'compute' });
    expect(() => resolveServeDecode({ ...cpu, kv_cache_dtype: 'float8e4m3' }, config, 'float32')).toThrow("--kv_cache_dtype float8e4m3 needs --device cuda (Lathe's CUDA kernels); on the cpu drop it");
    expect(() => resolveServeDecode({ ...cpu, decode_attention: 'kernel', swiglu_kernel: true }, config, 'float32')).toThrow("--decode_attention kernel, --swiglu_kernel true need --device cuda (Lathe's CUDA kernels); on the cpu drop them");
  });

  test('startServe refuses a kernel ask on the cpu before loading, and reports the resolved options at load', async () => {
    let loads = 0;
    await expect(serve({ model: dir, device: 'cpu', kv_cache_dtype: 'float8e4m3' })).rejects.toThrow('--kv_cache_dtype float8e4m3 needs --device cuda');
    await expect(serve({ model: dir, device: 'cpu', swiglu_kernel: true }, { onLoad: () => loads++ })).rejects.toThrow('--swiglu_kernel true needs --device cuda');
    expect(loads).toBe(0);
    let decode: ResolvedDecodeOptions | undefined;
    const s = await serve({ model: dir, device: 'cpu', residual_dtype: 'compute', max_rows: 2, max_model_len: 64, http_thread: false }, { onLoad: (m) => (decode = m.decode) });
    await s.close();
    expect(decode).toEqual({ ...off, residualDtype: 'compute' });
    expect(describeDecode(decode!)).toBe('the residual stream in the compute dtype');
  }, 120_000);
});

describe('the slot graphs take the batch engine’s layers', () => {
  const { config } = CausalLM.fromPretrainedSync(dir);
  const build = (add: typeof addSlotDecodeStep, cfg: DecoderConfig, dtype: L.DType, o: Partial<SlotGraphOptions>) => {
    const g = new L.Graph();
    add(g, cfg, weightInputs(g, cfg, dtype, dtype).weights, dtype, { slots: 4, filters: 'none', topLogprobs: 0, ...o });
    return g;
  };
  const opNames = (g: L.Graph) => g.nodes.map((n) => n.op.name);

  test('bfloat16 residualDtype compute: fewer Casts, each residual add fused into its norm', () => {
    const cfg = { ...config, numLayers: 3 };
    for (const add of [addSlotDecodeStep, addSlotPrefill]) {
      const f32 = opNames(build(add, cfg, 'bfloat16', {}));
      const res = opNames(build(add, cfg, 'bfloat16', { residualDtype: 'compute' }));
      expect(res.filter((o) => o === 'Cast').length).toBeLessThan(f32.filter((o) => o === 'Cast').length - 4 * cfg.numLayers);
      expect(res.filter((o) => o === 'SkipSimplifiedLayerNormalization')).toHaveLength(2 * cfg.numLayers);
    }
  });

  test('the SwiGLU op in both graphs; the decode attention op in the step; an e4m3 prefill quantizes and scatters bytes and scales', () => {
    const swiglu = swigluOps('cpu');
    const fp8 = decodeAttentionOps('cpu', undefined, { cache: 'float8e4m3', qkNormEpsilon: config.rmsNormEps });
    try {
      for (const add of [addSlotDecodeStep, addSlotPrefill]) {
        const names = opNames(build(add, config, 'float32', { swiglu }));
        expect(names.filter((o) => o.startsWith('SwiGLU'))).toHaveLength(config.numLayers);
        expect(names).not.toContain('QuickGelu');
      }
      const step = build(addSlotDecodeStep, config, 'float32', { decodeAttention: fp8, concatProjections: true });
      expect(opNames(step).filter((o) => o.startsWith('DecodeAttentionPacked'))).toHaveLength(config.numLayers);
      expect(opNames(step)).not.toContain('GroupQueryAttention');
      expect(step.inputs.filter((t) => t.name.endsWith('_scale')).map((t) => [t.name, t.dtype])).toEqual([
        ['cache.0.key_scale', 'float32'],
        ['cache.0.value_scale', 'float32'],
      ]);
      expect(step.inputs.find((t) => t.name === 'cache.0.key')!.dtype).toBe('uint8');
      const prefill = build(addSlotPrefill, config, 'float32', { decodeAttention: fp8, concatProjections: true });
      expect(opNames(prefill).filter((o) => o.startsWith('QuantizeE4m3'))).toHaveLength(2 * config.numLayers);
      expect(opNames(prefill).filter((o) => o === 'ScatterND')).toHaveLength(4 * config.numLayers);
      expect(prefill.outputs.filter((t) => t.name.startsWith('present.')).map((t) => t.name)).toEqual(['present.0.key', 'present.0.key_scale', 'present.0.value', 'present.0.value_scale']);
    } finally {
      swiglu.dispose();
      fp8.dispose();
    }
  });
});

describe('the slot engine with each decode option (CPU, float32)', () => {
  const device = Device.cpu();
  const model = CausalLM.fromPretrainedSync(dir, { device });
  afterAll(() => model.dispose());
  const eps = model.config.rmsNormEps;
  const prompts = [[5, 9, 11, 3], [7, 2], [30, 31, 32, 33, 34, 35], [1], [8, 8, 8]];
  const maxNew = [6, 9, 3, 7, 5];
  type Options = Pick<SlotEngineOptions, 'decodeAttention' | 'kvCacheDtype' | 'swiglu' | 'residualDtype' | 'concatProjections'>;

  /** Greedy rows of every prompt, one admitted per step into 3 slots (later ones reuse freed slots). */
  function slots(o: Options & Pick<SlotEngineOptions, 'staticPrefill'>): SlotToken[][] {
    const engine = SlotEngine.create(model, { slots: 3, maxLength: 32, ...o });
    try {
      const got = slotGreedy(engine, prompts, maxNew);
      expect(engine.free).toBe(3);
      return got;
    } finally {
      engine.dispose();
    }
  }

  /** The batch engine's greedy completions of every prompt, each alone, under the same options. */
  async function batch(o: Options): Promise<Completion[]> {
    const out: Completion[] = [];
    for (const [i, p] of prompts.entries()) {
      const kv = KvCacheGenerator.create(model, { temperature: 0, rows: 1, maxLength: 32, ...(o as Partial<KvCacheGeneratorOptions>) });
      try {
        out.push(...(await kv.generate([p], { maxNewTokens: maxNew[i] })));
      } finally {
        kv.dispose();
      }
    }
    return out;
  }

  const expectBatch = (got: SlotToken[][], want: Completion[]) =>
    got.forEach((row, i) => {
      expect(row.map((t) => t.token)).toEqual(want[i].tokens);
      row.forEach((t, j) => expect(Math.abs(t.rawLogprob - want[i].rawLogprobs[j])).toBeLessThan(1e-4));
    });

  let plain: SlotToken[][];
  beforeAll(() => {
    plain = slots({});
  });

  /** Each option's engine options and the disposal of the ops they hold. */
  const options: [string, () => { o: Options; dispose(): void }][] = [
    ['residualDtype compute', () => ({ o: { residualDtype: 'compute' }, dispose: () => {} })],
    ['the SwiGLU op', () => {
      const swiglu = swigluOps('cpu');
      return { o: { swiglu }, dispose: () => swiglu.dispose() };
    }],
    ['the decode attention op over packed projections', () => {
      const decodeAttention = decodeAttentionOps('cpu', undefined, { qkNormEpsilon: eps });
      return { o: { decodeAttention, concatProjections: true }, dispose: () => decodeAttention.dispose() };
    }],
  ];

  test.each(options)('%s: the default slot engine’s tokens, and the batch engine’s under the same option', async (_name, make) => {
    const { o, dispose } = make();
    try {
      const got = slots(o);
      expect(got.map((r) => r.map((t) => t.token))).toEqual(plain.map((r) => r.map((t) => t.token)));
      got.forEach((row, i) => row.forEach((t, j) => expect(Math.abs(t.rawLogprob - plain[i][j].rawLogprob)).toBeLessThan(2e-4)));
      expectBatch(got, await batch(o));
    } finally {
      dispose();
    }
  }, 120_000);

  test('an e4m3 cache: prefills quantized into reused slots; the batch engine’s e4m3 tokens and log-probs, within e4m3’s error of the default cache', async () => {
    const decodeAttention = decodeAttentionOps('cpu', undefined, { cache: 'float8e4m3', qkNormEpsilon: eps });
    try {
      const o: Options = { decodeAttention, kvCacheDtype: 'float8e4m3', concatProjections: true };
      const got = slots(o);
      expect(decodeAttention.stats.computes).toBeGreaterThan(0);
      expect(decodeAttention.stats.cacheCopies).toBe(0);
      // each prefill shape bound to its own buffers (a captured prefill's path) writes the same caches
      expect(slots({ ...o, staticPrefill: true })).toEqual(got);
      expectBatch(got, await batch(o));
      let maxDiff = 0;
      got.forEach((row, i) => {
        // step 0 comes from the prefill (no cache read): exact; step 1 reads the quantized cache
        expect(row[0].token).toBe(plain[i][0].token);
        expect(Math.abs(row[0].rawLogprob - plain[i][0].rawLogprob)).toBeLessThan(1e-5);
        maxDiff = Math.max(maxDiff, Math.abs(row[1].rawLogprob - plain[i][1].rawLogprob));
      });
      // the op is in the path; this model's large random activations (std 0.5) make e4m3's error larger
      // than a trained model's, and the batch engine's e4m3 cache shows the same (expectBatch above)
      expect(maxDiff).toBeGreaterThan(0);
      expect(maxDiff).toBeLessThan(1);
    } finally {
      decodeAttention.dispose();
    }
  }, 120_000);

  test('bad combinations are named', () => {
    const fp8 = decodeAttentionOps('cpu', undefined, { cache: 'float8e4m3', qkNormEpsilon: eps });
    try {
      expect(() => SlotEngine.create(model, { slots: 1, maxLength: 8, kvCacheDtype: 'float8e4m3' })).toThrow("kvCacheDtype 'float8e4m3' needs decodeAttention built for an e4m3 cache");
      expect(() => SlotEngine.create(model, { slots: 1, maxLength: 8, decodeAttention: fp8 })).toThrow("decodeAttention holds an e4m3 cache: set kvCacheDtype 'float8e4m3'");
      expect(() => SlotEngine.create(model.device!, model.config, undefined, { slots: 1, maxLength: 8, concatProjections: true, graphWeights: (g) => weightInputs(g, model.config, 'float32', 'float32').weights })).toThrow('concatProjections: the slot engine packs the weights once');
    } finally {
      fp8.dispose();
    }
  });
});
