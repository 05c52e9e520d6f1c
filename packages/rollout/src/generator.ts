/**
 * The host API around the generation graph: `Generator.create(model)` compiles the graph once for
 * a `CausalLM` (weights read by ONNX Runtime from its safetensors files); `generate`
 * sorts prompts by length into buckets, splits them into runs whose KV caches fit a memory budget,
 * makes each sample's noise from (seed, sample key), and returns one completion per sample.
 *
 * The graph takes its group expansion (which prompt each sample row continues) as a host input, so
 * one compiled graph serves `groupSize` samples per prompt and calls that give each prompt its own
 * sample count (`sampleKeys`); either way a prompt is prefilled once per run.
 */
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import * as L from '@lathe/onnx';
import type { DType } from '@lathe/onnx';
import { CausalLM, checkSequenceLength, externalDataFolder, weightInitializers, type DecoderConfig } from '@lathe/models';
import { addGeneration, type GenerationGraphOptions } from './generation-graph';
import { PlainSession, type SessionDevice } from '@lathe/runtime';
import { uniformNoise } from './rng';

/** How a generator is compiled. */
export interface GeneratorOptions extends GenerationGraphOptions {
  device?: SessionDevice;
  /** Compute dtype (weights are cast on load). Default float32 on CPU, bfloat16 on CUDA. */
  dtype?: DType;
  /** Bytes the KV caches of one run may take. Default 4 GiB on CUDA, 512 MiB on CPU. */
  kvBudgetBytes?: number;
  /** At most this many prompts per run. Default 256. */
  maxPromptsPerRun?: number;
  /**
   * Called before every run with its prompts and sample rows (each prompt is prefilled once per
   * run). A hook that throws fails that run — tests count runs and inject errors with it.
   */
  beforeRun?: (prompts: number, rows: number) => void;
}

/** Per-call options. */
export interface GenerateCallOptions {
  maxNewTokens: number;
  seed?: number;
  /** Token ids that end a sample (e.g. EOS, <|im_end|>). */
  stopIds?: number[];
  /** Each prompt's random-stream key (default: its index); sample j of prompt i uses key·n + j. */
  promptKeys?: number[];
  /**
   * Each prompt's samples, as their random-stream keys (instead of `promptKeys` and the engine's
   * group size): prompt i gets `sampleKeys[i].length` samples, all from its one prefill, and its
   * sample j reads stream `sampleKeys[i][j]`. So one call can give prompts different sample counts,
   * and a sample's stream need not depend on how many samples its prompt has (with `promptKeys`,
   * key·n + j does).
   */
  sampleKeys?: readonly (readonly number[])[];
  /** Called after every run with the number of prompts finished so far. */
  onProgress?: (done: number, total: number) => void;
}

/** One sample. */
export interface Completion {
  promptIndex: number;
  sampleIndex: number;
  tokens: number[];
  /** Log-prob of each token under the sampling distribution. */
  logprobs: number[];
  /** Log-prob of each token under the raw model (temperature 1, no filters). */
  rawLogprobs: number[];
  finishReason: 'stop' | 'length';
}

/**
 * Each prompt's samples as their random-stream keys: `call.sampleKeys` as given, else `n` per prompt
 * with sample j of prompt i on stream promptKeys[i]·n + j (promptKeys default to the indices).
 * Rejects malformed keys by name.
 */
export function sampleKeysOf(prompts: number, call: Pick<GenerateCallOptions, 'promptKeys' | 'sampleKeys'>, n: number): number[][] {
  const integer = (k: number, where: string) => {
    if (!Number.isSafeInteger(k)) throw new Error(`${where} must be an integer, got ${k}`);
  };
  if (call.sampleKeys) {
    if (call.promptKeys) throw new Error('give promptKeys or sampleKeys, not both');
    if (call.sampleKeys.length !== prompts) throw new Error(`sampleKeys: ${call.sampleKeys.length} lists for ${prompts} prompts`);
    return call.sampleKeys.map((keys, i) => {
      if (keys.length === 0) throw new Error(`sampleKeys[${i}] is empty (every prompt needs a sample)`);
      keys.forEach((k, j) => integer(k, `sampleKeys[${i}][${j}]`));
      return [...keys];
    });
  }
  if (call.promptKeys && call.promptKeys.length !== prompts) throw new Error(`promptKeys: ${call.promptKeys.length} keys for ${prompts} prompts`);
  call.promptKeys?.forEach((k, i) => integer(k, `promptKeys[${i}]`));
  const keys = call.promptKeys ?? Array.from({ length: prompts }, (_, i) => i);
  return keys.map((k) => Array.from({ length: n }, (_, j) => k * n + j));
}

/** A compiled generation graph for one model and one set of sampling options. */
export class Generator {
  private constructor(
    readonly config: DecoderConfig,
    private readonly session: PlainSession,
    private readonly opts: GeneratorOptions,
  ) {}

  /**
   * Compiles generation for `model`, whose weights ONNX Runtime reads from its safetensors files (a
   * model without files is saved to a temporary folder first). Device and dtype default to the
   * model's when it is on a device, else to the CPU in float32 (CUDA: bfloat16).
   */
  static async create(model: CausalLM, opts: GeneratorOptions = {}): Promise<Generator> {
    const config = model.config;
    const device = opts.device ?? model.device?.kind ?? 'cpu';
    const dtype = opts.dtype ?? (model.device ? model.dtype : device === 'cuda' ? 'bfloat16' : 'float32');
    const index = model.weightFiles();
    const { dir: work, location } = externalDataFolder([...index.values()].map((e) => e.file));
    const g = new L.Graph('lathe_generate');
    // groupSize is the default sample count of a call; the rows themselves come from expand_index.
    addGeneration(g, config, weightInitializers(g, config, index, dtype, location), { ...opts, groupSize: 1, expandIndexInput: true });
    writeFileSync(join(work, 'generate.onnx'), L.toModelBytes(g));
    const session = await PlainSession.create(g, { device, modelPath: join(work, 'generate.onnx') });
    return new Generator(config, session, { ...opts, device, dtype });
  }

  /**
   * Samples `groupSize` completions for every prompt (or `call.sampleKeys[i].length` for prompt i),
   * token ids without padding, sorted by (prompt, sample).
   */
  async generate(prompts: number[][], call: GenerateCallOptions): Promise<Completion[]> {
    if (prompts.length === 0) return [];
    prompts.forEach((p, i) => {
      if (p.length === 0) throw new Error(`prompt ${i} is empty`);
      checkSequenceLength(this.config, p.length + call.maxNewTokens, `prompt ${i} (${p.length} tokens + ${call.maxNewTokens} new)`);
      const bad = p.find((t) => !Number.isInteger(t) || t < 0 || t >= this.config.vocabSize);
      if (bad !== undefined) throw new Error(`prompt ${i}: token id ${bad} is outside the vocabulary (0..${this.config.vocabSize - 1})`);
    });
    const samples = sampleKeysOf(prompts.length, call, this.opts.groupSize ?? 1);
    const results: Completion[] = [];
    let done = 0;
    const execute = async (run: number[]) => {
      const rows = run.map((i) => prompts[i]);
      const P = Math.max(...rows.map((p) => p.length));
      // Row k continues prompt expand[k] of the run: a prompt's samples are adjacent, in sample order.
      const sampleKeys = run.flatMap((i) => samples[i]);
      const expand = run.flatMap((i, b) => samples[i].map(() => BigInt(b)));
      const feeds = {
        input_ids: { data: BigInt64Array.from(rows.flatMap((p) => [...new Array(P - p.length).fill(0), ...p]).map(BigInt)), dims: [rows.length, P] },
        attention_mask: { data: BigInt64Array.from(rows.flatMap((p) => [...new Array(P - p.length).fill(0n), ...p.map(() => 1n)])), dims: [rows.length, P] },
        max_new_tokens: { data: BigInt64Array.from([BigInt(call.maxNewTokens)]), dims: [] },
        stop_ids: { data: BigInt64Array.from((call.stopIds?.length ? call.stopIds : [-1]).map(BigInt)), dims: [call.stopIds?.length || 1] },
        expand_index: { data: BigInt64Array.from(expand), dims: [expand.length] },
        ...((this.opts.temperature ?? 1) === 0 ? {} : { noise: { data: uniformNoise(call.seed ?? 0, sampleKeys, call.maxNewTokens), dims: [sampleKeys.length, call.maxNewTokens] } }),
      };
      this.opts.beforeRun?.(run.length, expand.length);
      const out = await this.session.run(feeds);
      const N = out.tokens.dims[1];
      let row = 0;
      run.forEach((promptIndex) => {
        for (let j = 0; j < samples[promptIndex].length; j++, row++) {
          const len = Number(out.lengths.data[row]);
          const slice = <T extends { slice(a: number, b: number): ArrayLike<number | bigint> }>(t: T) => Array.from(t.slice(row * N, row * N + len), Number);
          results.push({
            promptIndex,
            sampleIndex: j,
            tokens: slice(out.tokens.data as BigInt64Array),
            logprobs: slice(out.logprobs.data as Float32Array),
            rawLogprobs: slice(out.raw_logprobs.data as Float32Array),
            finishReason: out.stopped.data[row] ? 'stop' : 'length',
          });
        }
      });
      done += run.length;
      call.onProgress?.(done, prompts.length);
    };
    for (const run of this.schedule(prompts, call.maxNewTokens, samples.map((k) => k.length))) await splitOnOutOfMemory(run, execute);
    return results.sort((a, b) => a.promptIndex - b.promptIndex || a.sampleIndex - b.sampleIndex);
  }

  /**
   * Runs as lists of prompt indices: prompts sorted by length (so each run pads little), cut
   * where the run's KV caches (sample rows × (longest prompt + new tokens)) would exceed the budget.
   * `samples[i]`: prompt i's sample rows (default: groupSize each).
   */
  schedule(prompts: number[][], maxNewTokens: number, samples?: readonly number[]): number[][] {
    const c = this.config;
    const rowsOf = (i: number) => samples?.[i] ?? this.opts.groupSize ?? 1;
    const bytes = L.dtypeBytes(this.opts.dtype ?? 'float32');
    const budget = this.opts.kvBudgetBytes ?? (this.opts.device === 'cuda' ? 4 * 2 ** 30 : 512 * 2 ** 20);
    const maxPrompts = this.opts.maxPromptsPerRun ?? 256;
    const perToken = 2 * c.numLayers * c.numKvHeads * c.headDim * bytes; // per sample row
    const order = prompts.map((p, i) => ({ i, len: p.length })).sort((a, b) => b.len - a.len);
    const single = Math.max(...order.map(({ i, len }) => (len + maxNewTokens) * perToken * rowsOf(i)));
    if (single > budget) throw new Error(`one prompt's KV cache (${single} bytes) exceeds kvBudgetBytes (${budget})`);
    const runs: number[][] = [];
    let cur: number[] = [];
    let rows = 0;
    let longest = 0;
    for (const { i, len } of order) {
      const nextLongest = Math.max(longest, len);
      if (cur.length > 0 && (cur.length >= maxPrompts || (rows + rowsOf(i)) * (nextLongest + maxNewTokens) * perToken > budget)) {
        runs.push(cur);
        cur = [];
        rows = 0;
        longest = 0;
      }
      cur.push(i);
      rows += rowsOf(i);
      longest = Math.max(longest, len);
    }
    if (cur.length) runs.push(cur);
    return runs;
  }

  /** Releases the session. */
  async dispose(): Promise<void> {
    await this.session.dispose();
  }
}

/** Whether an ONNX Runtime error is an allocation failure (worth retrying with a smaller batch). */
export function isOutOfMemory(e: unknown): boolean {
  return /out of memory|failed to allocate|CUDA_ERROR_OUT_OF_MEMORY|cudaErrorMemoryAllocation|bad_alloc/i.test(e instanceof Error ? e.message : String(e));
}

/**
 * Runs `attempt(rows)` with an engine of `rows` rows; when that fails for lack of memory (past what
 * {@link splitOnOutOfMemory} inside the engine fixes: its buffers, or a step over all its rows),
 * calls `onShrink(from, to)` — the caller frees the failed engine and remembers the new size — and
 * tries again with half the rows, rounded down to a multiple of `step` and never below `minRows`.
 * Other errors, and an out-of-memory at `minRows`, propagate.
 */
export async function shrinkOnOutOfMemory<T>(rows: number, opts: { minRows: number; step?: number; onShrink: (from: number, to: number) => void }, attempt: (rows: number) => Promise<T>): Promise<T> {
  const step = opts.step ?? 1;
  for (let r = rows; ; ) {
    try {
      return await attempt(r);
    } catch (e) {
      const smaller = Math.max(opts.minRows, Math.floor(r / 2 / step) * step);
      if (!isOutOfMemory(e) || smaller >= r) throw e;
      opts.onShrink(r, smaller);
      r = smaller;
    }
  }
}

/**
 * Runs `execute(items)`; when it fails for lack of memory, runs the two halves instead, recursively,
 * so an over-large batch degrades into smaller runs rather than failing the whole request. Other
 * errors, and a single item that still does not fit, propagate.
 */
export async function splitOnOutOfMemory<T>(items: T[], execute: (items: T[]) => Promise<void>): Promise<void> {
  try {
    await execute(items);
  } catch (e) {
    if (!isOutOfMemory(e) || items.length < 2) throw e;
    const half = Math.ceil(items.length / 2);
    await splitOnOutOfMemory(items.slice(0, half), execute);
    await splitOnOutOfMemory(items.slice(half), execute);
  }
}
