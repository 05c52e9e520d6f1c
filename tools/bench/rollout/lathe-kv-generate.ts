/**
 * Generation with the KV-cache generator (prefill + a loop of bound decode-step runs over
 * GroupQueryAttention, optionally replayed as CUDA graphs) from a Hugging Face folder; reports new
 * tokens/s and the time split between prefill, decode steps and host transfers, and the cost of a
 * weight swap (copying a new weight version into the bound weights on the device).
 *
 * usage: node lathe-kv-generate.js --model DIR --prompts prompts.json[,more.json] --max-new N
 *          [--dtype bfloat16] [--group N] [--temperature T] [--top-k K] [--top-p P] [--repeat N] [--cuda-graph] [--memory-pattern]
 *          [--out samples.json[,more-samples.json]] [--device cuda|cpu] [--profile PREFIX]
 *          [--fast | --decode-attention gqa|kernel [--kv-cache-dtype float8e4m3] [--fused-combine] --swiglu-kernel --greedy-pick --concat-projections --residual-dtype float32|compute]
 * With no stop ids every row runs to --max-new, so the token count is exact. Prints one JSON line
 * per prompt file, in order; several prompt files share one process and one weight upload (and
 * one generator while their row count and length agree). --out writes each row's tokens and their
 * raw log-probs ({ tokens, raw }[]) for agreement checks, one file per prompt file.
 * The engine's opt-in kernels (CUDA; the device is then opened through Lathe's kernels, whose stream
 * the sessions share): --decode-attention kernel (Lathe's decode attention in place of
 * GroupQueryAttention) [--kv-cache-dtype float8e4m3] [--fused-combine: its chunks merged inside the split
 * kernel, one launch fewer a layer; not part of --fast], --swiglu-kernel, --greedy-pick, and the graph
 * options --concat-projections and --residual-dtype compute; --fast is all of them with the e4m3 cache.
 */
import { readFileSync, writeFileSync } from 'node:fs';
import { basename, resolve } from 'node:path';
import type { DType } from '@lathe/onnx';
import { CausalLM } from '@lathe/models';
import { Device, DeviceTensor } from '@lathe/runtime';
import { KvCacheGenerator, type KvCacheGeneratorOptions } from '@lathe/rollout';
import { cudaIncludeDir, DecodeAttention, decodeAttentionOps, GreedyPickKernels, greedyPickOps, Kernels, SwigluKernels, swigluOps } from '@lathe/kernels';
import { arg, flag } from '../argv';


async function main(): Promise<void> {
  const dir = resolve(arg('model'));
  const dtype = arg('dtype', 'bfloat16') as DType;
  const maxNew = Number(arg('max-new', '128'));
  const temperature = Number(arg('temperature', '0'));
  const topK = Number(arg('top-k', '0'));
  const topP = Number(arg('top-p', '1'));
  const group = Number(arg('group', '1'));
  const repeat = Number(arg('repeat', '2'));
  const cudaGraph = flag('cuda-graph');
  const promptFiles = arg('prompts').split(',');
  const outPaths = arg('out', '') ? arg('out', '').split(',') : [];
  if (outPaths.length && outPaths.length !== promptFiles.length) throw new Error(`--out names ${outPaths.length} files for ${promptFiles.length} --prompts files`);
  const sets = promptFiles.map((f) => JSON.parse(readFileSync(f, 'utf8')) as number[][]);
  const fast = flag('fast');
  const decodeKernel = fast || arg('decode-attention', 'gqa') === 'kernel';
  const kvCacheDtype = fast ? 'float8e4m3' : arg('kv-cache-dtype', '');
  if (kvCacheDtype && kvCacheDtype !== 'float8e4m3') throw new Error(`--kv-cache-dtype ${kvCacheDtype}: float8e4m3 (or leave it out)`);
  if (kvCacheDtype && !decodeKernel) throw new Error('--kv-cache-dtype float8e4m3 needs --decode-attention kernel');
  const combine = flag('fused-combine') ? 'fused' : 'separate';
  if (combine === 'fused' && !decodeKernel) throw new Error('--fused-combine needs --decode-attention kernel (or --fast)');
  const useSwiglu = fast || flag('swiglu-kernel');
  const usePick = fast || flag('greedy-pick');
  const withKernels = decodeKernel || useSwiglu || usePick;
  const kind = arg('device', 'cuda') as 'cuda' | 'cpu';
  if (withKernels && kind !== 'cuda') throw new Error('--decode-attention kernel, --swiglu-kernel, --greedy-pick and --fast need --device cuda');
  const opened = withKernels ? Kernels.withDevice() : undefined;
  const device = opened?.device ?? Device.open(kind);
  const include = { includeDir: cudaIncludeDir() };
  const kernelOpts = (eps: number): Partial<KvCacheGeneratorOptions> => {
    if (!opened) return {};
    const k = opened.kernels;
    return {
      ...(decodeKernel ? { decodeAttention: decodeAttentionOps('cuda', DecodeAttention.compile(k, include), { cache: kvCacheDtype ? 'float8e4m3' : 'native', qkNormEpsilon: eps, combine }) } : {}),
      ...(kvCacheDtype ? { kvCacheDtype: 'float8e4m3' as const } : {}),
      ...(useSwiglu ? { swiglu: swigluOps('cuda', SwigluKernels.compile(k, include)) } : {}),
      ...(usePick ? { greedyPick: greedyPickOps('cuda', GreedyPickKernels.compile(k, include)) } : {}),
    };
  };
  const graphOpts: Partial<KvCacheGeneratorOptions> = {
    ...(fast || flag('concat-projections') ? { concatProjections: true } : {}),
    ...((fast ? 'compute' : arg('residual-dtype', 'float32')) === 'compute' ? { residualDtype: 'compute' as const } : {}),
  };

  const t0 = performance.now();
  const model = await CausalLM.fromPretrained(dir, { device, dtype });
  const weights = model.weights;
  const extra = { ...kernelOpts(model.config.rmsNormEps), ...graphOpts };
  const tUpload = performance.now();
  const profile = arg('profile', '');
  // --memory-pattern: ORT's memory-pattern planning back on in both sessions (the engine turns it
  // off by default), for an A/B of its cost.
  const session = { ...(profile ? { profilePrefix: profile } : {}), ...(flag('memory-pattern') ? { memoryPattern: true } : {}) };
  // One generator serves every prompt file with its row count: sized for the longest of them.
  const maxLengthFor = (rows: number) => Math.max(...sets.filter((p) => p.length * group === rows).map((p) => Math.max(...p.map((r) => r.length)))) + maxNew;
  let gen: KvCacheGenerator | undefined;
  let genRows = 0;
  for (const [k, prompts] of sets.entries()) {
    const P = Math.max(...prompts.map((p) => p.length));
    const rows = prompts.length * group;
    const s0 = performance.now();
    // CPU fallback stays off; if ORT moves a node to the CPU, rerun with it on (log level 1 lists
    // the placements on stderr) and say so in the report.
    let cpuFallback = false;
    if (!gen || genRows !== rows) {
      gen?.dispose();
      const genOpts = { temperature, topK, topP, groupSize: group, rows, maxLength: maxLengthFor(rows), dtype, cudaGraph, session, ...extra };
      try {
        gen = KvCacheGenerator.create(model, genOpts);
      } catch (e) {
        if (!/fallback to CPU EP has been explicitly disabled/.test(String(e))) throw e;
        cpuFallback = true;
        gen = KvCacheGenerator.create(model, { ...genOpts, session: { allowCpuFallback: true, logLevel: 1 } });
      }
      genRows = rows;
    }
    const tSession = performance.now();
    const report = await measure(gen, device, weights, prompts, { maxNew, repeat });
    if (outPaths[k]) writeFileSync(outPaths[k], JSON.stringify(report.out.map((c) => ({ tokens: c.tokens, raw: c.rawLogprobs }))));
    console.log(
      JSON.stringify({
        engine: 'kv-cache',
        model: basename(dir),
        dtype,
        sampling: { temperature, top_k: topK, top_p: topP },
        prompts: [prompts.length, P],
        group,
        rows,
        new_tokens: maxNew,
        cuda_graph: cudaGraph,
        ...(Object.keys(extra).length ? { options: Object.keys(extra).sort() } : {}),
        cpu_fallback: cpuFallback,
        upload_ms: k === 0 ? +(tUpload - t0).toFixed(1) : 0,
        session_ms: +(tSession - s0).toFixed(1),
        ...report.summary,
      }),
    );
  }
  if (profile) console.error(`profiles: ${gen!.endProfiling().join(' ')}`);
  gen?.dispose();
  model.dispose();
}

/** A warm-up call (which captures the CUDA graphs), `repeat` timed calls and a weight swap: the report's timings. */
async function measure(gen: KvCacheGenerator, device: Device, weights: ReadonlyMap<string, DeviceTensor>, prompts: number[][], o: { maxNew: number; repeat: number }) {
  const call = { maxNewTokens: o.maxNew, seed: 1 };
  const w0 = performance.now();
  let out = await gen.generate(prompts, call);
  const warmUp = { ms: performance.now() - w0, timings: { ...gen.lastTimings } };
  const runs: { ms: number; timings: typeof gen.lastTimings }[] = [];
  for (let i = 0; i < o.repeat; i++) {
    const s = performance.now();
    out = await gen.generate(prompts, call);
    runs.push({ ms: performance.now() - s, timings: { ...gen.lastTimings } });
  }
  const best = runs.reduce((a, b) => (b.ms < a.ms ? b : a));

  // A weight swap: a second weight set copied into the bound weights (device to device).
  const copy = new Map<string, DeviceTensor>();
  for (const [name, t] of weights) {
    const c = device.empty(t.dtype, t.dims);
    c.copyFrom(t);
    copy.set(name, c);
  }
  const swaps: number[] = [];
  for (let i = 0; i < 3; i++) {
    const s = performance.now();
    gen.loadWeights(copy);
    swaps.push(performance.now() - s);
  }
  const after = await gen.generate(prompts.slice(0, 1), { maxNewTokens: 4, seed: 1 });
  for (const c of copy.values()) c.dispose();
  const tokens = out.reduce((s, c) => s + c.tokens.length, 0);
  const t = best.timings;
  return {
    out,
    summary: {
      run_ms_best: +best.ms.toFixed(1),
      run_ms_all: runs.map((r) => +r.ms.toFixed(1)),
      // Each timed run's split, to tell a slow prefill from a slow decode loop.
      runs: [warmUp, ...runs].map((r, i) => ({
        run: i === 0 ? 'warm-up' : i,
        ms: +r.ms.toFixed(1),
        prefill_ms: +r.timings.prefillMs.toFixed(1),
        decode_ms: +r.timings.decodeMs.toFixed(1),
        transfer_ms: +r.timings.transferMs.toFixed(1),
      })),
      prefill_ms: +t.prefillMs.toFixed(1),
      decode_ms: +t.decodeMs.toFixed(1),
      transfer_ms: +t.transferMs.toFixed(1),
      decode_steps: t.decodeSteps,
      decode_step_ms: +(t.decodeMs / Math.max(1, t.decodeSteps)).toFixed(3),
      new_tokens_per_s: Math.round(tokens / (best.ms / 1000)),
      weight_swap_ms: +Math.min(...swaps).toFixed(2),
      weight_bytes: [...weights.values()].reduce((s, w) => s + w.byteLength, 0),
      after_swap_tokens: after[0].tokens,
      first_tokens: out[0].tokens.slice(0, 8),
    },
  };
}

main().catch((e: unknown) => {
  console.error(e instanceof Error ? e.stack : e);
  process.exit(1);
});
