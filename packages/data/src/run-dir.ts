/**
 * Run directories, as `lathe sft` and the RL trainers lay them out:
 *
 * ```
 * runs/<name>/config.yaml        the resolved config of the run
 * runs/<name>/metrics.jsonl      one JSON object per logged step ({"step": …, "loss": …, …})
 * runs/<name>/checkpoints/step-NNNNNNNN/   complete checkpoints (trainer_state.json marks one)
 * runs/<name>/rollouts.sqlite    the rollout store
 * runs/<name>/eval/step-NNNNNNNN.jsonl     per-example evaluation rows ({"correct": …, …})
 * ```
 *
 * Listing, reading, comparing configs and pruning checkpoints; the engine of `lathe runs`.
 */
import { appendFileSync, existsSync, mkdirSync, readdirSync, readFileSync, renameSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { basename, dirname, join } from 'node:path';
import { parse as parseYaml, stringify as toYaml } from 'yaml';
import { writeAtomic } from './atomic';
import { deleteRolloutsAfter, inspectRolloutStore } from './rollout-store';

/** The paths inside a run directory. */
export function runPaths(dir: string) {
  return {
    dir,
    config: join(dir, 'config.yaml'),
    metrics: join(dir, 'metrics.jsonl'),
    checkpoints: join(dir, 'checkpoints'),
    rollouts: join(dir, 'rollouts.sqlite'),
    eval: join(dir, 'eval'),
    /** The built-in model a run made for itself (`--model builtin:tiny`), which a resume reads back. */
    baseModel: join(dir, 'base-model'),
  };
}

const hasEntries = (dir: string) => existsSync(dir) && readdirSync(dir).length > 0;

/**
 * Prepares a run directory for a new run (not a resume): an earlier run's metrics, evaluations,
 * checkpoints or rollouts are an error naming what is there and the way on (--resume when it has a
 * checkpoint, --overwrite, another --run_dir), unless `overwrite`, which deletes them first. What
 * a run writes before its first step and would write again — config.yaml and the built-in model in
 * base-model/ — is deleted either way, so a failed run's copy is never taken for this run's.
 */
export function startRunDir(dir: string, options: { overwrite: boolean }): void {
  const p = runPaths(dir);
  const found = [
    ...(existsSync(p.metrics) ? ['metrics.jsonl'] : []),
    ...(hasEntries(p.checkpoints) ? ['checkpoints/'] : []),
    ...(hasEntries(p.eval) ? ['eval/'] : []),
    ...(existsSync(p.rollouts) ? ['rollouts.sqlite'] : []),
  ];
  if (found.length && !options.overwrite) {
    if (listRunCheckpoints(dir, { sizes: false }).length) throw new Error(`--run_dir ${dir} already holds checkpoints: pass --resume to continue that run, --overwrite to start over, or choose another --run_dir`);
    throw new Error(`--run_dir ${dir} holds an earlier run (${found.join(', ')}) with no checkpoint to resume from: pass --overwrite to start over, or choose another --run_dir`);
  }
  // config.yaml last: until the rest is gone, the folder still reads as a run directory
  for (const f of [p.metrics, p.eval, p.rollouts, `${p.rollouts}-wal`, `${p.rollouts}-shm`, p.checkpoints, p.baseModel, p.config]) rmSync(f, { recursive: true, force: true });
}

/** What {@link rewindRunDir} removed. */
export interface RewindResult {
  /** metrics.jsonl lines of later steps (and a line torn by a crash). */
  metricsLines: number;
  /** eval/step-N.jsonl files of later steps. */
  evalFiles: number;
  /** rollouts.sqlite rows of later steps. */
  trainRollouts: number;
  evalRollouts: number;
}

/**
 * Cuts a run's logs back to `step`, the checkpoint a resume starts from, so that the resumed run
 * writes each later step once and its files equal an uninterrupted run's: metrics.jsonl keeps its
 * lines of steps ≤ `step` (each as it was; rewritten atomically), eval/step-N.jsonl files and
 * rollouts.sqlite rows of later steps are deleted. Running it again after a crash midway finishes it.
 */
export function rewindRunDir(dir: string, step: number): RewindResult {
  const p = runPaths(dir);
  const result: RewindResult = { metricsLines: 0, evalFiles: 0, trainRollouts: 0, evalRollouts: 0 };
  if (existsSync(p.metrics)) {
    const { lines, torn } = metricsLines(p.metrics);
    const kept = lines.filter((l) => l.line.step <= step);
    result.metricsLines = lines.length - kept.length + torn;
    if (result.metricsLines) writeAtomic(p.metrics, kept.map((l) => `${l.text}\n`).join(''));
  }
  for (const e of listEvals(dir)) {
    if (e.step <= step) continue;
    rmSync(e.file, { force: true });
    result.evalFiles++;
  }
  if (existsSync(p.rollouts)) {
    const deleted = deleteRolloutsAfter(p.rollouts, step);
    result.trainRollouts = deleted.train;
    result.evalRollouts = deleted.eval;
  }
  return result;
}

/** Creates a run directory (config.yaml written atomically, checkpoints/ and eval/ made). */
export function createRunDir(dir: string, config: Record<string, unknown>): ReturnType<typeof runPaths> {
  const p = runPaths(dir);
  mkdirSync(p.checkpoints, { recursive: true });
  mkdirSync(p.eval, { recursive: true });
  const tmp = `${p.config}.tmp-${process.pid}`;
  writeFileSync(tmp, toYaml(config));
  renameSync(tmp, p.config);
  return p;
}

/** Appends metrics lines to `metrics.jsonl` (one `appendFileSync` per line: a crash loses at most the line being written). */
export class MetricsLog {
  constructor(
    readonly file: string,
    /** Where each line also goes (TensorBoard, Weights & Biases), as its step and the other fields. */
    private readonly sinks: readonly MetricSink[] = [],
  ) {}
  /** Appends one object (must have a numeric `step`). */
  log(metrics: { step: number } & Record<string, unknown>): void {
    if (!Number.isInteger(metrics.step)) throw new Error(`${this.file}: metrics need an integer 'step', got ${JSON.stringify(metrics.step)}`);
    appendFileSync(this.file, `${JSON.stringify(metrics)}\n`);
    const { step, ...values } = metrics;
    for (const s of this.sinks) s.log(step, values);
  }
  /** Flushes and closes the sinks (metrics.jsonl needs nothing: each line is appended whole). */
  async close(): Promise<void> {
    await Promise.all(this.sinks.map((s) => s.close?.()));
  }
}

/** Somewhere a run's metrics go besides metrics.jsonl. */
export interface MetricSink {
  /** One logged line: its step and its other fields (a sink takes the ones it can show). */
  log(step: number, values: Readonly<Record<string, unknown>>): void;
  /** Sends what is still buffered; called once at the end of the run. */
  close?(): Promise<void>;
}

/** One line of metrics.jsonl. */
export type MetricsLine = { step: number } & Record<string, unknown>;

/**
 * The lines of a metrics file. A torn last line (a crash mid-append) is skipped; a bad line elsewhere
 * is an error naming the file and line.
 */
export function readMetrics(file: string): MetricsLine[] {
  return existsSync(file) ? metricsLines(file).lines.map((l) => l.line) : [];
}

/** A metrics file's lines, each parsed and as written; `torn`: 1 when its last line was cut off by a crash. */
function metricsLines(file: string): { lines: { line: MetricsLine; text: string }[]; torn: number } {
  const texts = readFileSync(file, 'utf8').split('\n');
  const lines: { line: MetricsLine; text: string }[] = [];
  let torn = 0;
  texts.forEach((text, i) => {
    if (text.trim() === '') return;
    let v: unknown;
    try {
      v = JSON.parse(text);
    } catch {
      if (i >= texts.length - 2) return void torn++; // the last line, torn by a crash mid-append
      throw new Error(`${file}:${i + 1}: not valid JSON`);
    }
    if (v === null || typeof v !== 'object' || typeof (v as MetricsLine).step !== 'number') throw new Error(`${file}:${i + 1}: expected an object with a numeric 'step'`);
    lines.push({ line: v as MetricsLine, text });
  });
  return { lines, torn };
}

/** Reads a run's config.yaml as a plain object (null when absent). */
export function readRunConfig(dir: string): Record<string, unknown> | null {
  const file = runPaths(dir).config;
  if (!existsSync(file)) return null;
  let v: unknown;
  try {
    v = parseYaml(readFileSync(file, 'utf8'));
  } catch (e) {
    throw new Error(`${file}: not valid YAML (${(e as Error).message})`);
  }
  if (v === null || typeof v !== 'object' || Array.isArray(v)) throw new Error(`${file}: expected a mapping of option: value`);
  return v as Record<string, unknown>;
}

const STEP_DIR = /^step-(\d+)$/;

/** A complete checkpoint (one with trainer_state.json). */
export interface CheckpointEntry {
  step: number;
  dir: string;
  bytes: number;
}

function dirBytes(dir: string): number {
  let n = 0;
  for (const e of readdirSync(dir, { withFileTypes: true })) {
    const p = join(dir, e.name);
    n += e.isDirectory() ? dirBytes(p) : statSync(p).size;
  }
  return n;
}

/**
 * A run's complete checkpoints, oldest first (temporary and incomplete folders are ignored).
 * `sizes: false` skips measuring them (`bytes` is then 0).
 */
export function listRunCheckpoints(dir: string, options: { sizes?: boolean } = {}): CheckpointEntry[] {
  const root = runPaths(dir).checkpoints;
  if (!existsSync(root)) return [];
  return readdirSync(root)
    .map((name) => ({ m: STEP_DIR.exec(name), name }))
    .filter((e) => e.m && existsSync(join(root, e.name, 'trainer_state.json')))
    .map((e) => ({ step: Number(e.m![1]), dir: join(root, e.name), bytes: options.sizes === false ? 0 : dirBytes(join(root, e.name)) }))
    .sort((a, b) => a.step - b.step);
}

/** An evaluation file's summary: `eval_accuracy` is the mean of its rows' `correct`. */
export interface EvalSummary {
  step: number;
  file: string;
  examples: number;
  accuracy: number | null;
}

/** The run's eval/step-N.jsonl files, oldest first. */
export function listEvals(dir: string): EvalSummary[] {
  const root = runPaths(dir).eval;
  if (!existsSync(root)) return [];
  const out: EvalSummary[] = [];
  for (const name of readdirSync(root)) {
    const m = /^step-(\d+)\.jsonl$/.exec(name);
    if (!m) continue;
    const file = join(root, name);
    const rows = readFileSync(file, 'utf8').split('\n').filter((l) => l.trim() !== '');
    let correct = 0;
    let graded = 0;
    for (const l of rows) {
      try {
        const c = (JSON.parse(l) as { correct?: unknown }).correct;
        if (typeof c === 'boolean' || typeof c === 'number') {
          graded++;
          correct += Number(c);
        }
      } catch {
        /* a torn line */
      }
    }
    out.push({ step: Number(m[1]), file, examples: rows.length, accuracy: graded ? correct / graded : null });
  }
  return out.sort((a, b) => a.step - b.step);
}

/** What `lathe runs list` and `show` report about a run. */
export interface RunSummary {
  name: string;
  dir: string;
  /** Last modification of the run's files (ISO time). */
  modified: string;
  /** The last metrics line. */
  lastMetrics: MetricsLine | null;
  checkpoints: { step: number; bytes: number }[];
  evals: { step: number; examples: number; accuracy: number | null }[];
  /** Row counts of rollouts.sqlite, when present. */
  rollouts: { train: number; eval: number; lastStep: number | null } | null;
  hasConfig: boolean;
}

/** Whether a folder looks like a run directory. */
export function isRunDir(dir: string): boolean {
  const p = runPaths(dir);
  return existsSync(p.config) || existsSync(p.metrics) || existsSync(p.checkpoints);
}

/** Summarises one run directory. */
export function summarizeRun(dir: string): RunSummary {
  if (!existsSync(dir) || !statSync(dir).isDirectory()) throw new Error(`${dir}: no such run directory`);
  const p = runPaths(dir);
  const metrics = readMetrics(p.metrics);
  const mtimes = [p.dir, p.config, p.metrics, p.rollouts, p.eval, p.checkpoints].filter(existsSync).map((f) => statSync(f).mtimeMs);
  let rollouts: RunSummary['rollouts'] = null;
  if (existsSync(p.rollouts)) {
    const r = inspectRolloutStore(p.rollouts);
    rollouts = { train: r.train, eval: r.eval, lastStep: r.lastStep };
  }
  return {
    name: basename(dir),
    dir,
    modified: new Date(Math.max(...mtimes)).toISOString(),
    lastMetrics: metrics.at(-1) ?? null,
    checkpoints: listRunCheckpoints(dir).map((c) => ({ step: c.step, bytes: c.bytes })),
    evals: listEvals(dir).map((e) => ({ step: e.step, examples: e.examples, accuracy: e.accuracy })),
    rollouts,
    hasConfig: existsSync(p.config),
  };
}

/** The run directories directly under `root`, most recently modified first. */
export function listRuns(root: string): RunSummary[] {
  if (!existsSync(root)) throw new Error(`${root}: no such directory (pass --root to say where runs are)`);
  return readdirSync(root, { withFileTypes: true })
    .filter((e) => e.isDirectory() && isRunDir(join(root, e.name)))
    .map((e) => summarizeRun(join(root, e.name)))
    .sort((a, b) => (a.modified < b.modified ? 1 : a.modified > b.modified ? -1 : a.name.localeCompare(b.name)));
}

/** Finds a run by path or by name under `root`. */
export function resolveRun(run: string, root: string): string {
  if (existsSync(run) && statSync(run).isDirectory()) return run;
  const under = join(root, run);
  if (existsSync(under) && statSync(under).isDirectory()) return under;
  throw new Error(`run '${run}': neither a directory nor a run under ${root}`);
}

/** One difference between two configs (dotted key for nested values; undefined where absent). */
export interface ConfigDifference {
  key: string;
  a: unknown;
  b: unknown;
}

function flatten(v: unknown, prefix: string, out: Map<string, unknown>): void {
  if (v !== null && typeof v === 'object' && !Array.isArray(v)) {
    for (const [k, x] of Object.entries(v)) flatten(x, prefix ? `${prefix}.${k}` : k, out);
  } else out.set(prefix, v);
}

/** The keys whose values differ between two configs, sorted by key. */
export function diffConfigs(a: Record<string, unknown>, b: Record<string, unknown>): ConfigDifference[] {
  const fa = new Map<string, unknown>();
  const fb = new Map<string, unknown>();
  flatten(a, '', fa);
  flatten(b, '', fb);
  const keys = [...new Set([...fa.keys(), ...fb.keys()])].sort();
  return keys.filter((k) => JSON.stringify(fa.get(k)) !== JSON.stringify(fb.get(k))).map((k) => ({ key: k, a: fa.get(k), b: fb.get(k) }));
}

/** How to prune a run's checkpoints. */
export interface PruneOptions {
  /** Keep the newest N checkpoints. */
  keepLast: number;
  /** Also keep the K best by `metric` (0: none). */
  keepBest: number;
  /** The metric that ranks checkpoints: a key of metrics.jsonl at the checkpoint's step, or `eval_accuracy`. */
  metric: string;
  /** Whether larger (`max`) or smaller (`min`) values are better. */
  mode: 'max' | 'min';
  /** Report without deleting. */
  dryRun: boolean;
}

/** What a prune did (or would do, with `dryRun`). */
export interface PruneResult {
  kept: { step: number; dir: string; reason: string[]; metric: number | null }[];
  deleted: { step: number; dir: string; bytes: number; metric: number | null }[];
  freedBytes: number;
  dryRun: boolean;
}

/**
 * The value of `metric` for each step: from `eval_accuracy` (eval/step-N.jsonl) or from the last
 * metrics.jsonl line with that step and a numeric value of the key.
 */
export function metricByStep(dir: string, metric: string): Map<number, number> {
  const out = new Map<number, number>();
  if (metric === 'eval_accuracy') {
    for (const e of listEvals(dir)) if (e.accuracy !== null) out.set(e.step, e.accuracy);
    return out;
  }
  for (const line of readMetrics(runPaths(dir).metrics)) {
    const v = line[metric];
    if (typeof v === 'number' && Number.isFinite(v)) out.set(line.step, v);
  }
  return out;
}

/**
 * Deletes checkpoints other than the newest `keepLast` and the `keepBest` best by a metric.
 * Checkpoints with no value of the metric are never counted among the best. Refuses to delete every
 * checkpoint (keepLast + keepBest must be ≥ 1).
 */
export function pruneCheckpoints(dir: string, options: PruneOptions): PruneResult {
  if (options.keepLast + options.keepBest < 1) throw new Error(`prune ${dir}: --keep_last ${options.keepLast} and --keep_best ${options.keepBest} would delete every checkpoint`);
  const all = listRunCheckpoints(dir);
  const values = options.keepBest > 0 ? metricByStep(dir, options.metric) : new Map<number, number>();
  if (options.keepBest > 0 && all.length > 0 && !all.some((c) => values.has(c.step))) {
    throw new Error(`prune ${dir}: no checkpoint step has a value of '${options.metric}' (in metrics.jsonl, or eval_accuracy from eval/); pick another --metric`);
  }
  const reasons = new Map<number, string[]>();
  const why = (step: number, r: string) => reasons.set(step, [...(reasons.get(step) ?? []), r]);
  for (const c of all.slice(Math.max(0, all.length - options.keepLast))) why(c.step, `last ${options.keepLast}`);
  const ranked = all.filter((c) => values.has(c.step)).sort((a, b) => (options.mode === 'max' ? values.get(b.step)! - values.get(a.step)! : values.get(a.step)! - values.get(b.step)!) || b.step - a.step);
  for (const c of ranked.slice(0, options.keepBest)) why(c.step, `best ${options.keepBest} by ${options.metric} (${options.mode})`);
  const result: PruneResult = { kept: [], deleted: [], freedBytes: 0, dryRun: options.dryRun };
  for (const c of all) {
    const metric = values.get(c.step) ?? null;
    if (reasons.has(c.step)) result.kept.push({ step: c.step, dir: c.dir, reason: reasons.get(c.step)!, metric });
    else {
      result.deleted.push({ step: c.step, dir: c.dir, bytes: c.bytes, metric });
      result.freedBytes += c.bytes;
    }
  }
  if (!options.dryRun) {
    for (const d of result.deleted) {
      // Renamed out of the step-N namespace first: a crash mid-delete never leaves a partial checkpoint under a step name.
      const doomed = join(dirname(d.dir), `.${basename(d.dir)}.deleting-${process.pid}`);
      renameSync(d.dir, doomed);
      rmSync(doomed, { recursive: true, force: true });
    }
  }
  return result;
}
