/**
 * quant-bench's host model, built a tensor a job in worker threads: the random weights `CausalLM.random`
 * samples (the same values: its one normal stream entered at each tensor's offset), each tensor's 16-bit
 * bits for the upload, and each quantized format's matrices (`quantizeMatrix`, as `QuantizedModel.quantize`
 * makes them). One thread samples a Qwen3-8B shape in about ten minutes; the GPU host's cores do it in one.
 * The float32 weights and their bits live in SharedArrayBuffers: the sampling jobs write chunks of them in
 * place and the quantizing jobs read them, with no copy either way.
 */
import { availableParallelism } from 'node:os';
import { isMainThread, parentPort, Worker, workerData } from 'node:worker_threads';
import { isProjectionWeight, paramSpecs, type DecoderConfig, type ParamSpec } from '@lathe/models';
import { checkScheme, QuantizedModel, quantizeMatrix, type QuantizedMatrix, type QuantScheme } from '@lathe/quantization';
import { toBfloat16Bits, toFloat16Bits } from '@lathe/runtime';

/** The 16-bit formats whose bits the build precomputes for the upload. */
export type HalfDtype = 'bfloat16' | 'float16';

/** The host weights: float32 by HF name (paramSpecs order) and, when asked for, their 16-bit bits. */
export interface HostWeights {
  weights: Map<string, Float32Array>;
  bits?: { dtype: HalfDtype; tensors: Map<string, Uint16Array> };
}

const MULBERRY_STEP = 0x6d2b79f5;

/** mulberry32's state after `calls` uniforms from `seed` (`seededRandom` of @lathe/models): its state only adds a constant a call. */
export function mulberryStateAt(seed: number, calls: number): number {
  if (!Number.isSafeInteger(calls) || calls < 0) throw new Error(`mulberryStateAt: calls must be a whole number ≥ 0, got ${calls}`);
  return ((seed >>> 0) + Math.imul(calls % 4294967296 | 0, MULBERRY_STEP)) >>> 0;
}

/** Each spec's first element in the one stream `randomWeight` draws from, in paramSpecs order (one normal an element). */
export function streamOffsets(specs: readonly ParamSpec[]): number[] {
  let at = 0;
  return specs.map((s) => {
    const o = at;
    at += s.shape.reduce((a, b) => a * b, 1);
    return o;
  });
}

/**
 * The values `randomWeight({ seed, std })` gives a parameter of `kind` from stream element `offset` on (two
 * uniforms a normal, Box–Muller as `seededNormal`), `out.length` of them into `out`. Bit for bit the sequential sampler's.
 */
export function sampleTensor(seed: number, std: number, kind: ParamSpec['kind'], offset: number, out: Float32Array): Float32Array {
  let a = mulberryStateAt(seed, 2 * offset);
  const uniform = () => {
    a = (a + MULBERRY_STEP) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  for (let i = 0; i < out.length; i++) {
    const z = Math.sqrt(-2 * Math.log(1 - uniform())) * Math.cos(2 * Math.PI * uniform());
    out[i] = kind === 'norm' ? 1 + 0.1 * z : kind === 'bias' ? 0.02 * z : std * z;
  }
  return out;
}

/** Worker threads a build uses by default: the machine's cores less one for the main thread, at most 32 (1: no workers). */
export function defaultThreads(): number {
  return Math.max(1, Math.min(32, availableParallelism() - 1));
}

/** Elements a sampling job fills: the embedding and an untied head are split, so no one tensor holds the pool up. */
const SAMPLE_CHUNK = 1 << 23;

/** Sampling writes elements [start, start + count) of shared arrays; quantizing reads one and returns its matrix. */
type Job =
  | { kind: 'sample'; seed: number; std: number; param: ParamSpec['kind']; offset: number; f32: Float32Array; bits?: { dtype: HalfDtype; out: Uint16Array }; start: number; count: number }
  | { kind: 'quantize'; w: Float32Array; N: number; K: number; scheme: QuantScheme };
type Reply = { matrix?: QuantizedMatrix; error?: string };

const POOL_TAG = 'lathe-quant-bench-host';

/** One job's work, the same on a worker or on the main thread. */
function runJob(job: Job): Reply {
  if (job.kind === 'sample') {
    const f32 = sampleTensor(job.seed, job.std, job.param, job.offset + job.start, job.f32.subarray(job.start, job.start + job.count));
    // the converters' `out` is typed over an ArrayBuffer but only has its elements written: a shared one serves
    const bits = job.bits?.out.subarray(job.start, job.start + job.count) as Uint16Array<ArrayBuffer> | undefined;
    if (job.bits?.dtype === 'bfloat16') toBfloat16Bits(f32, bits);
    else if (job.bits?.dtype === 'float16') toFloat16Bits(f32, bits);
    return {};
  }
  return { matrix: quantizeMatrix(job.w, job.N, job.K, job.scheme) };
}

/** The ArrayBuffers under a reply's typed arrays (not the shared ones), to transfer instead of copy. */
function transferables(x: unknown, out: ArrayBuffer[] = []): ArrayBuffer[] {
  if (ArrayBuffer.isView(x)) {
    if (x.buffer instanceof ArrayBuffer && !out.includes(x.buffer)) out.push(x.buffer);
  } else if (x && typeof x === 'object') for (const v of Object.values(x)) transferables(v, out);
  return out;
}

// A worker started by runJobs: loads this file (the bundle, under quant-bench.js) and answers jobs.
if (!isMainThread && (workerData as { pool?: string } | null)?.pool === POOL_TAG) {
  parentPort!.on('message', (job: Job) => {
    let reply: Reply;
    try {
      reply = runJob(job);
    } catch (e) {
      reply = { error: e instanceof Error ? (e.stack ?? e.message) : String(e) };
    }
    parentPort!.postMessage(reply, transferables(reply));
  });
}

/** Runs `jobs` on `threads` worker threads (inline when 1), replies in the jobs' order. */
async function runJobs(jobs: Job[], threads: number): Promise<Reply[]> {
  // from source (tsx) a worker could not load this .ts file: the bundle (build-device-bundles.sh) runs the threads
  if (threads <= 1 || jobs.length <= 1 || __filename.endsWith('.ts')) return jobs.map(runJob);
  const replies: Reply[] = new Array<Reply>(jobs.length);
  let next = 0;
  const workers = Array.from({ length: Math.min(threads, jobs.length) }, () => new Worker(__filename, { workerData: { pool: POOL_TAG } }));
  try {
    await Promise.all(
      workers.map(
        (w) =>
          new Promise<void>((resolve, reject) => {
            let current = -1;
            const give = () => {
              if (next >= jobs.length) return resolve();
              current = next++;
              w.postMessage(jobs[current]);
            };
            w.on('message', (r: Reply) => {
              if (r.error) return reject(new Error(`quant-bench host build: job ${current} failed in a worker: ${r.error}`));
              replies[current] = r;
              give();
            });
            w.on('error', reject);
            // after the pool settles, terminate's exits change nothing
            w.on('exit', (code) => code !== 0 && reject(new Error(`quant-bench host build: a worker exited with code ${code}`)));
            give();
          }),
      ),
    );
  } finally {
    await Promise.all(workers.map((w) => w.terminate()));
  }
  return replies;
}

/**
 * `CausalLM.random(config, { seed, std }).float32Weights()`'s values, sampled `chunk` elements a job (default
 * 8M) on `threads` threads, with each tensor's `bits` (bfloat16/float16) beside it when asked for.
 */
export async function randomHostWeights(config: DecoderConfig, o: { seed: number; std: number; bits?: HalfDtype; threads: number; chunk?: number }): Promise<HostWeights> {
  const chunk = o.chunk ?? SAMPLE_CHUNK;
  const specs = paramSpecs(config);
  const offsets = streamOffsets(specs);
  const weights = new Map<string, Float32Array>();
  const bits = new Map<string, Uint16Array>();
  const jobs: Job[] = [];
  specs.forEach((spec, i) => {
    const n = spec.shape.reduce((a, b) => a * b, 1);
    // shared, so every chunk's job writes its part in place
    const f32 = new Float32Array(new SharedArrayBuffer(4 * n));
    weights.set(spec.name, f32);
    const half = o.bits ? new Uint16Array(new SharedArrayBuffer(2 * n)) : undefined;
    if (half) bits.set(spec.name, half);
    for (let start = 0; start < n; start += chunk) jobs.push({ kind: 'sample', seed: o.seed, std: o.std, param: spec.kind, offset: offsets[i], f32, ...(half ? { bits: { dtype: o.bits!, out: half } } : {}), start, count: Math.min(chunk, n - start) });
  });
  await runJobs(jobs, o.threads);
  return { weights, ...(o.bits ? { bits: { dtype: o.bits, tensors: bits } } : {}) };
}

/**
 * `QuantizedModel.quantize(config, weights, { ...scheme, lmHead })`'s model (every decoder projection in
 * `scheme`), the projections quantized a job each on `threads` threads; the LM head copy, if any, on this one.
 */
export async function quantizeOnThreads(config: DecoderConfig, weights: ReadonlyMap<string, Float32Array>, scheme: QuantScheme, o: { threads: number; lmHead?: QuantScheme }): Promise<QuantizedModel> {
  checkScheme(scheme);
  const specs = paramSpecs(config);
  const chosen = specs.filter((s) => s.shape.length === 2 && isProjectionWeight(s.name));
  const replies = await runJobs(chosen.map((s) => ({ kind: 'quantize', w: weights.get(s.name)!, N: s.shape[0], K: s.shape[1], scheme })), o.threads);
  const layers = new Map(chosen.map((s, i) => [s.name, replies[i].matrix!] as const));
  const dense = new Map(specs.filter((s) => !layers.has(s.name)).map((s) => [s.name, weights.get(s.name)!] as const));
  return QuantizedModel.fromParts(config, normalScheme(scheme), dense, layers, o.lmHead);
}

/** The scheme with its defaults filled in, as `QuantizedModel.quantize` records it. */
function normalScheme(s: QuantScheme): QuantScheme {
  if (s.format === 'int8') return { format: 'int8' };
  if (s.format === 'int4') return { format: 'int4', blockSize: s.blockSize ?? 64, zeroPoints: s.zeroPoints ?? false };
  return { format: s.format, blockSize: s.blockSize ?? 64, doubleQuant: s.doubleQuant ?? false };
}
