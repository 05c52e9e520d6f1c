/**
 * The reward sources of `lathe grpo` beyond its graders: a frozen reward model scoring every
 * completion of a step in one run (`--reward_model`), your own functions loaded from files
 * (`--reward_fn`), and the weights that combine them with the built-in ones (`--reward_weights`).
 * Each source is logged per step as `reward/<name>/mean`, `/std` and `/failures`.
 */
import { existsSync, readFileSync } from 'node:fs';
import { basename, extname, join, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { parse as parseYaml } from 'yaml';
import { combineRewards, type CombineRewardsOptions, type RewardFunction, type RewardSample, type RewardScorer, type RewardSource } from '@lathe/grpo';
import { RewardModel } from '@lathe/reward-models';
import type { Device } from '@lathe/runtime';
import { BUILTIN_TOKENIZER } from './demo-task';
import { preferenceEncoder, type PreferenceEncoder, type PromptFormatOptions } from './preference-data';
import { loadRunModel, type RunModel } from './scaffold';

/**
 * A reward scored over a whole batch of samples at once (a model: one run per batch) rather than
 * one call per sample. A failure is not a per-sample fallback: it fails the batch, since a model
 * that returns NaN for one row is broken for all.
 */
export interface BatchRewardSource<M = unknown> {
  /** Name in metrics (unique among the sources). */
  name: string;
  /** The batch's values, one per sample. */
  scoreBatch(samples: readonly RewardSample<M>[]): Promise<ArrayLike<number>>;
  /** Weight in the sum. Default 1. */
  weight?: number;
}

/** A per-sample or a batch reward source. */
export type AnyRewardSource<M> = RewardSource<M> | BatchRewardSource<M>;

/** An error of a batch source: the step that met it is refused (no per-sample fallback). */
export class RewardSourceError extends Error {
  override name = 'RewardSourceError';
}

const isBatch = <M>(s: AnyRewardSource<M>): s is BatchRewardSource<M> => 'scoreBatch' in s;

/**
 * `combineRewards` over per-sample and batch sources: each call scores the batch sources first
 * (each once, over every sample; an error or a value that is not a finite number throws a
 * {@link RewardSourceError} naming the source and rows), then every source goes through
 * `combineRewards` as usual (weights, per-source statistics, per-sample failures and fallback for
 * the per-sample ones).
 */
export function combineRewardSources<M>(sources: readonly AnyRewardSource<M>[], options: CombineRewardsOptions): RewardScorer<M> {
  interface Scored {
    meta: M;
    at: number;
    batch: Record<string, ArrayLike<number>>;
  }
  const combined = combineRewards<Scored>(
    sources.map((s) => ({
      name: s.name,
      ...(s.weight !== undefined ? { weight: s.weight } : {}),
      fn: isBatch(s) ? (_p: string, _c: string, m: Scored) => m.batch[s.name][m.at] : (p: string, c: string, m: Scored) => s.fn(p, c, m.meta),
    })),
    options,
  );
  const batchSources = sources.filter(isBatch);
  return async (samples) => {
    const batch: Record<string, ArrayLike<number>> = {};
    for (const s of batchSources) {
      let values: ArrayLike<number>;
      try {
        values = await s.scoreBatch(samples);
      } catch (e) {
        throw new RewardSourceError(`reward '${s.name}': ${(e as Error).message}`);
      }
      if (values.length !== samples.length) throw new RewardSourceError(`reward '${s.name}' returned ${values.length} values for ${samples.length} samples`);
      const bad = Array.from(values).flatMap((v, i) => (typeof v === 'number' && Number.isFinite(v) ? [] : [i]));
      if (bad.length) throw new RewardSourceError(`reward '${s.name}' is not a finite number for sample${bad.length > 1 ? 's' : ''} ${bad.slice(0, 10).join(', ')}${bad.length > 10 ? ', …' : ''} of ${samples.length}`);
      batch[s.name] = values;
    }
    return combined(samples.map((s, at) => ({ prompt: s.prompt, completion: s.completion, meta: { meta: s.meta, at, batch } })));
  };
}

/**
 * `--reward_weights`: 'source=weight,…' as a map (spaces allowed around the parts). A malformed
 * part, a weight that is not a finite number or a source named twice is an error naming the flag.
 */
export function parseRewardWeights(text: string): Map<string, number> {
  const out = new Map<string, number>();
  for (const part of text.split(',').map((p) => p.trim()).filter(Boolean)) {
    const m = /^([^=\s]+)\s*=\s*(\S+)$/.exec(part);
    const w = m ? Number(m[2]) : NaN;
    if (!m || !Number.isFinite(w)) throw new Error(`--reward_weights: '${part}' is not source=weight with a finite number (e.g. rm=1,correct=0.5)`);
    if (out.has(m[1])) throw new Error(`--reward_weights: source '${m[1]}' is given twice`);
    out.set(m[1], w);
  }
  return out;
}

/** `sources` with the weights of `--reward_weights` set; a weight for a source the run does not have is an error listing those it has. */
export function withRewardWeights<S extends { name: string; weight?: number }>(sources: readonly S[], weights: ReadonlyMap<string, number>): S[] {
  const names = sources.map((s) => s.name);
  for (const name of weights.keys()) {
    if (!names.includes(name)) throw new Error(`--reward_weights: this run has no reward source '${name}' (its sources: ${names.join(', ')})`);
  }
  return sources.map((s) => (weights.has(s.name) ? { ...s, weight: weights.get(s.name) } : s));
}

/**
 * Your reward functions, `--reward_fn 'file.ts#name,other.js#fn'`: each export must be a function
 * `(prompt, completion, meta) => number | Promise<number>`; `file.ts` alone means its default
 * export. The source is named after the export (after the file for a default export). A missing
 * file, a missing export or one that is not a function is an error naming the file and the export.
 */
export async function loadRewardFunctions<M>(spec: string, reserved: readonly string[] = []): Promise<RewardSource<M>[]> {
  const out: RewardSource<M>[] = [];
  for (const item of spec.split(',').map((s) => s.trim()).filter(Boolean)) {
    const hash = item.lastIndexOf('#');
    const file = hash >= 0 ? item.slice(0, hash) : item;
    const exportName = hash >= 0 ? item.slice(hash + 1) : 'default';
    if (file === '' || exportName === '') throw new Error(`--reward_fn ${item}: expected 'file.ts#name' (or 'file.ts' for its default export)`);
    const path = resolve(file);
    if (!existsSync(path)) throw new Error(`--reward_fn ${item}: no file ${path}`);
    const mod = await loadModule(path, item);
    const fn = exportName === 'default' ? (mod.default ?? (typeof mod === 'function' ? mod : undefined)) : mod[exportName];
    if (fn === undefined) {
      const functions = Object.keys(mod).filter((k) => typeof mod[k] === 'function');
      throw new Error(`--reward_fn ${item}: ${file} has no export '${exportName}' (its function exports: ${functions.length ? functions.join(', ') : 'none'})`);
    }
    if (typeof fn !== 'function') throw new Error(`--reward_fn ${item}: export '${exportName}' of ${file} is ${fn === null ? 'null' : `a ${typeof fn}`}, not a function (prompt, completion, meta) => number`);
    const name = exportName === 'default' ? basename(file, extname(file)) : exportName;
    if (reserved.includes(name) || out.some((s) => s.name === name)) throw new Error(`--reward_fn ${item}: a reward source is already named '${name}' (the sources: ${[...reserved, ...out.map((s) => s.name)].join(', ')}); export the function under another name`);
    out.push({ name, fn: fn as RewardFunction<M> });
  }
  return out;
}

/** A module's exports: `require` first (TypeScript under the CLI's loader and in tests, CommonJS), `import()` for an ES module. */
async function loadModule(path: string, item: string): Promise<Record<string, unknown>> {
  try {
    // eslint-disable-next-line @typescript-eslint/no-require-imports -- the caller's file, loaded by path at run time
    return require(path) as Record<string, unknown>;
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code !== 'ERR_REQUIRE_ESM') throw new Error(`--reward_fn ${item}: cannot load ${path} (${(e as Error).message.split('\n')[0]})`);
  }
  try {
    return (await import(pathToFileURL(path).href)) as Record<string, unknown>;
  } catch (e) {
    throw new Error(`--reward_fn ${item}: cannot load ${path} (${(e as Error).message.split('\n')[0]})`);
  }
}

/** Options of {@link rewardModelSource}. */
export interface RewardModelSourceOptions extends PromptFormatOptions {
  /** The policy's device: the reward model is put there, in `dtype`. */
  device: Device;
  dtype: 'float32' | 'bfloat16';
  /** The run's model: its tokenizer encodes for a reward model folder that has none. */
  policy: Pick<RunModel, 'tokenizerFrom'>;
  /** The run's directory (never written here) and seed, which loading a model folder asks for. */
  run_dir: string;
  seed: number;
}

/** A batch source that owns device memory. */
export interface RewardModelSource<M> extends BatchRewardSource<M> {
  readonly model: RewardModel;
  dispose(): void;
}

/**
 * Source 'rm': a frozen reward model's score of each prompt + completion, all of a batch's samples
 * in one run. The texts are encoded as `lathe rm train` encodes a pair (`preferenceEncoder`: BOS,
 * the prompt — raw, or as the chat template's user turn — then the completion without its thinking,
 * then EOS) with the folder's tokenizer, or the run's when the folder has none. A folder that is not
 * a reward model (a causal LM with no score head) is an error naming `--reward_model`; so is a
 * `lathe rm train` checkpoint trained with another prompt format.
 */
export async function rewardModelSource<M>(dir: string, o: RewardModelSourceOptions): Promise<RewardModelSource<M>> {
  const flag = `--reward_model ${dir}`;
  if (!existsSync(join(dir, 'config.json'))) throw new Error(`${flag}: no config.json in that folder (expected a reward model folder, e.g. a lathe rm train checkpoint)`);
  const saved = join(dir, 'config.yaml'); // a lathe checkpoint's run config
  if (existsSync(saved)) {
    const run = parseYaml(readFileSync(saved, 'utf8')) as Record<string, unknown> | null;
    for (const key of ['prompt_format', 'enable_thinking'] as const) {
      if (run && run[key] !== undefined && run[key] !== o[key]) throw new Error(`${flag}: the reward model was trained with --${key} ${String(run[key])}, this run has --${key} ${String(o[key])}`);
    }
  }
  let model: RewardModel;
  try {
    model = await RewardModel.fromPretrained(dir, { device: o.device, dtype: o.dtype });
  } catch (e) {
    throw new Error(`${flag}: ${(e as Error).message}`);
  }
  let encoder: PreferenceEncoder;
  let padId: number;
  try {
    const tokenizer = existsSync(join(dir, 'tokenizer.json')) ? 'model' : (o.policy.tokenizerFrom ?? BUILTIN_TOKENIZER);
    const loaded = await loadRunModel({ model: dir, tokenizer, prompt_format: o.prompt_format, enable_thinking: o.enable_thinking, run_dir: o.run_dir, seed: o.seed });
    encoder = await preferenceEncoder(loaded, o);
    padId = loaded.tokenizer.padId;
  } catch (e) {
    model.dispose();
    throw new Error(`${flag}: ${(e as Error).message}`);
  }
  const maxPositions = model.config.maxPositionEmbeddings;
  return {
    name: 'rm',
    model,
    scoreBatch: async (samples) => {
      if (samples.length === 0) return new Float32Array(0);
      const rows = samples.map((s) => [...encoder.prompt({ prompt: s.prompt, turns: [{ role: 'user', content: s.prompt }] }), ...encoder.response(s.completion)]);
      const T = Math.max(...rows.map((r) => r.length));
      if (T > maxPositions) throw new Error(`a prompt + completion of ${T} tokens is longer than the reward model's ${maxPositions} positions (${flag})`);
      const ids = new BigInt64Array(rows.length * T).fill(BigInt(padId));
      const mask = new BigInt64Array(rows.length * T);
      rows.forEach((r, i) =>
        r.forEach((id, t) => {
          ids[i * T + t] = BigInt(id);
          mask[i * T + t] = 1n;
        }),
      );
      return model.score({ inputIds: { data: ids, dims: [rows.length, T] }, attentionMask: { data: mask, dims: [rows.length, T] } });
    },
    dispose: () => model.dispose(),
  };
}
