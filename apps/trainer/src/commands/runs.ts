import type { CommandModule } from 'yargs';
import {
  diffConfigs,
  listRuns,
  pruneCheckpoints,
  readMetrics,
  readRunConfig,
  resolveRun,
  runPaths,
  summarizeRun,
  type RunSummary,
} from '@lathe/data';
import { runsDiffSchema, runsListSchema, runsPruneSchema, runsShowSchema } from '@lathe/recipes';
import { addSchemaFlags, configFromArgv } from '../config-flags';

const out = (text: string) => process.stdout.write(`${text}\n`);
const json = (v: unknown) => out(JSON.stringify(v, null, 2));

function bytes(n: number): string {
  const units = ['B', 'KB', 'MB', 'GB', 'TB'];
  let i = 0;
  let v = n;
  while (v >= 1000 && i < units.length - 1) {
    v /= 1000;
    i++;
  }
  return `${v.toFixed(i ? 1 : 0)} ${units[i]}`;
}

const fmt = (v: unknown) => (typeof v === 'number' ? (Number.isInteger(v) ? String(v) : v.toPrecision(4)) : JSON.stringify(v));

/** A one-line summary of a run's latest metrics (step and the first few numeric keys). */
function metricsLine(m: RunSummary['lastMetrics']): string {
  if (!m) return '-';
  return Object.entries(m)
    .filter(([, v]) => typeof v === 'number')
    .slice(0, 4)
    .map(([k, v]) => `${k}=${fmt(v)}`)
    .join(' ');
}

function table(rows: string[][]): string {
  const widths = rows[0].map((_, c) => Math.max(...rows.map((r) => r[c].length)));
  return rows.map((r) => r.map((cell, c) => cell.padEnd(widths[c])).join('  ').trimEnd()).join('\n');
}

const listCommand: CommandModule = {
  command: 'list',
  describe: 'List the runs under --root, newest first: last metrics, checkpoints, evaluations, rollouts',
  builder: (y) => addSchemaFlags(y, runsListSchema, { config: false }).example('$0 runs list --root runs --json', 'every run as JSON'),
  handler: (argv) => {
    const o = configFromArgv(runsListSchema, argv);
    const runs = listRuns(o.root);
    if (o.json) {
      json(runs);
      return;
    }
    if (runs.length === 0) {
      out(`no runs under ${o.root}`);
      return;
    }
    const rows = [['run', 'modified', 'checkpoints', 'last eval', 'rollouts', 'last metrics']];
    for (const r of runs) {
      const ev = r.evals.at(-1);
      rows.push([
        r.name,
        r.modified.slice(0, 19).replace('T', ' '),
        r.checkpoints.length ? `${r.checkpoints.length} (last ${r.checkpoints.at(-1)!.step})` : '0',
        ev ? `step ${ev.step}: ${ev.accuracy === null ? '-' : ev.accuracy.toFixed(3)}` : '-',
        r.rollouts ? `${r.rollouts.train}+${r.rollouts.eval}` : '-',
        metricsLine(r.lastMetrics),
      ]);
    }
    out(table(rows));
  },
};

const showCommand: CommandModule = {
  command: 'show <run>',
  describe: "Show a run: its config, latest metrics, checkpoints, evaluations and rollout counts",
  builder: (y) =>
    addSchemaFlags(y.positional('run', { type: 'string', describe: 'Run name under --root, or a run directory' }), runsShowSchema, { config: false })
      .example('$0 runs show sft', 'runs/sft in words')
      .example('$0 runs show runs/sft --metrics 5 --json', 'as JSON with the last 5 metrics lines'),
  handler: (argv) => {
    const o = configFromArgv(runsShowSchema, argv);
    const dir = resolveRun(String(argv.run), o.root);
    const summary = summarizeRun(dir);
    const config = readRunConfig(dir);
    const metrics = o.metrics > 0 ? readMetrics(runPaths(dir).metrics).slice(-o.metrics) : [];
    if (o.json) {
      json({ ...summary, config, metrics });
      return;
    }
    out(`run ${summary.name} (${dir}), modified ${summary.modified}`);
    out(`config: ${config ? '' : '(no config.yaml)'}`);
    if (config) for (const [k, v] of Object.entries(config)) out(`  ${k}: ${fmt(v)}`);
    out(`metrics (last ${metrics.length}):`);
    for (const m of metrics) out(`  ${JSON.stringify(m)}`);
    out(`checkpoints: ${summary.checkpoints.map((c) => `step ${c.step} (${bytes(c.bytes)})`).join(', ') || 'none'}`);
    out(`evaluations: ${summary.evals.map((e) => `step ${e.step}: ${e.accuracy === null ? '-' : e.accuracy.toFixed(3)} on ${e.examples}`).join(', ') || 'none'}`);
    out(`rollouts: ${summary.rollouts ? `${summary.rollouts.train} train, ${summary.rollouts.eval} eval (last step ${summary.rollouts.lastStep ?? '-'})` : 'none'}`);
  },
};

const diffCommand: CommandModule = {
  command: 'diff <a> <b>',
  describe: "Compare two runs' configs: the options whose values differ",
  builder: (y) =>
    addSchemaFlags(
      y.positional('a', { type: 'string', describe: 'First run (name under --root, or a directory)' }).positional('b', { type: 'string', describe: 'Second run' }),
      runsDiffSchema,
      { config: false },
    ).example('$0 runs diff sft-lr1e-5 sft-lr2e-5', 'what changed between two runs'),
  handler: (argv) => {
    const o = configFromArgv(runsDiffSchema, argv);
    const [a, b] = [String(argv.a), String(argv.b)].map((r) => resolveRun(r, o.root));
    const load = (dir: string) => {
      const c = readRunConfig(dir);
      if (!c) throw new Error(`${runPaths(dir).config}: missing (the run has no config to compare)`);
      return c;
    };
    const diff = diffConfigs(load(a), load(b));
    if (o.json) {
      json({ a, b, differences: diff });
      return;
    }
    if (diff.length === 0) {
      out(`${a} and ${b}: same config`);
      return;
    }
    out(table([['option', a, b], ...diff.map((d) => [d.key, d.a === undefined ? '(absent)' : fmt(d.a), d.b === undefined ? '(absent)' : fmt(d.b)])]));
  },
};

const pruneCommand: CommandModule = {
  command: 'prune <run>',
  describe: 'Delete checkpoints except the newest --keep_last and the --keep_best best by --metric',
  builder: (y) =>
    addSchemaFlags(y.positional('run', { type: 'string', describe: 'Run name under --root, or a run directory' }), runsPruneSchema, { config: false })
      .example('$0 runs prune sft --keep_last 1', 'keep only the newest checkpoint')
      .example('$0 runs prune sft --keep_last 1 --keep_best 1 --metric eval_accuracy --dry_run', 'also keep the most accurate; only report'),
  handler: (argv) => {
    const o = configFromArgv(runsPruneSchema, argv);
    const dir = resolveRun(String(argv.run), o.root);
    const r = pruneCheckpoints(dir, { keepLast: o.keep_last, keepBest: o.keep_best, metric: o.metric, mode: o.mode, dryRun: o.dry_run });
    if (o.json) {
      json(r);
      return;
    }
    const verb = r.dryRun ? 'would delete' : 'deleted';
    for (const k of r.kept) out(`keep    step ${k.step}  (${k.reason.join('; ')})${k.metric === null ? '' : `  ${o.metric}=${fmt(k.metric)}`}`);
    for (const d of r.deleted) out(`${r.dryRun ? 'would delete' : 'delete '} step ${d.step}  ${bytes(d.bytes)}${d.metric === null ? '' : `  ${o.metric}=${fmt(d.metric)}`}`);
    out(`${verb} ${r.deleted.length} checkpoint(s), ${bytes(r.freedBytes)}; kept ${r.kept.length}`);
  },
};

/** The subcommands of `lathe runs` (exported for tests, which call their handlers directly). */
export const runsSubcommands = { list: listCommand, show: showCommand, diff: diffCommand, prune: pruneCommand };

/** `lathe runs`: list, show, compare and prune run directories. */
export const runsCommand: CommandModule = {
  command: 'runs',
  describe: 'Inspect run directories: list, show, diff configs, prune checkpoints',
  builder: (y) => y.command(listCommand).command(showCommand).command(diffCommand).command(pruneCommand).demandCommand(1, 'name a runs subcommand: list, show, diff, prune'),
  handler: () => undefined,
};
