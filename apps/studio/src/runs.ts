/**
 * What the app shows of run directories, read so that one broken file spoils only its own part: a
 * missing or half-written metrics file, a bad config or a corrupt rollout store is reported on that
 * run and the rest of the run (and every other run) still shows.
 */
import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { countRollouts, isRunDir, listEvals, listRunCheckpoints, readRunConfig, runPaths, type MetricsLine } from '@lathe/data';

/** The state of a run's metrics.jsonl. */
export interface MetricsFile {
  /** ok; missing (no file); partial (its last line was cut off mid-write); bad (a line that is not a metrics object). */
  state: 'ok' | 'missing' | 'partial' | 'bad';
  /** The lines that parsed. */
  lines: MetricsLine[];
  /** What is wrong, naming the file and line (null when ok). */
  message: string | null;
}

/** Reads metrics.jsonl keeping every good line; problems are described instead of thrown. */
export function readMetricsFile(file: string): MetricsFile {
  if (!existsSync(file)) return { state: 'missing', lines: [], message: `${file}: no metrics file yet` };
  // MetricsLog appends whole lines ending in a newline: only an unterminated tail is half-written
  const texts = readFileSync(file, 'utf8').split('\n');
  const lines: MetricsLine[] = [];
  let state: MetricsFile['state'] = 'ok';
  let message: string | null = null;
  texts.forEach((text, i) => {
    if (text.trim() === '') return;
    let v: unknown;
    try {
      v = JSON.parse(text);
    } catch {
      v = undefined;
    }
    if (v !== null && typeof v === 'object' && typeof (v as MetricsLine).step === 'number') lines.push(v as MetricsLine);
    else if (i === texts.length - 1 && state === 'ok') {
      state = 'partial';
      message = `${file}:${i + 1}: the last line is half-written (the run is writing it, or stopped mid-line)`;
    } else if (state !== 'bad') {
      state = 'bad';
      message = `${file}:${i + 1}: not a JSON object with a numeric 'step'`;
    }
  });
  return { state, lines, message };
}

/** One run as the runs page lists it. */
export interface RunInfo {
  name: string;
  modified: string;
  config: Record<string, unknown> | null;
  configError: string | null;
  metrics: { state: MetricsFile['state']; message: string | null; lines: number; lastStep: number | null; keys: string[] };
  checkpoints: { step: number; dir: string }[];
  evals: { step: number; examples: number; accuracy: number | null }[];
  rollouts: { train: number; eval: number; lastStep: number | null; datasets: string[] } | null;
  rolloutsError: string | null;
}

const attempt = <T>(f: () => T): { value: T | null; error: string | null } => {
  try {
    return { value: f(), error: null };
  } catch (e) {
    return { value: null, error: (e as Error).message };
  }
};

/** The numeric keys logged anywhere in the lines, step excepted, sorted. */
export function metricKeys(lines: readonly MetricsLine[]): string[] {
  const keys = new Set<string>();
  for (const l of lines) for (const [k, v] of Object.entries(l)) if (k !== 'step' && typeof v === 'number') keys.add(k);
  return [...keys].sort();
}

/** Everything the app shows of one run directory. */
export function runInfo(dir: string, name: string): RunInfo {
  const p = runPaths(dir);
  const m = readMetricsFile(p.metrics);
  const config = attempt(() => readRunConfig(dir));
  const rollouts = existsSync(p.rollouts) ? attempt(() => countRollouts(p.rollouts)) : { value: null, error: null };
  const mtimes = [p.dir, p.config, p.metrics, p.rollouts, p.eval, p.checkpoints].filter(existsSync).map((f) => statSync(f).mtimeMs);
  return {
    name,
    modified: new Date(Math.max(...mtimes)).toISOString(),
    config: config.value,
    configError: config.error,
    metrics: { state: m.state, message: m.message, lines: m.lines.length, lastStep: m.lines.at(-1)?.step ?? null, keys: metricKeys(m.lines) },
    checkpoints: attempt(() => listRunCheckpoints(dir, { sizes: false }).map((c) => ({ step: c.step, dir: c.dir }))).value ?? [],
    evals: attempt(() => listEvals(dir).map((e) => ({ step: e.step, examples: e.examples, accuracy: e.accuracy }))).value ?? [],
    rollouts: rollouts.value,
    rolloutsError: rollouts.error,
  };
}

/** The run directories directly under `root`, most recently modified first. */
export function listRunInfos(root: string): RunInfo[] {
  if (!existsSync(root)) throw new Error(`${root}: no such directory (pass --root to say where runs are)`);
  return readdirSync(root, { withFileTypes: true })
    .filter((e) => e.isDirectory() && isRunDir(join(root, e.name)))
    .map((e) => runInfo(join(root, e.name), e.name))
    .sort((a, b) => (a.modified < b.modified ? 1 : a.modified > b.modified ? -1 : a.name.localeCompare(b.name)));
}
