/**
 * `--report_to`: where a training run's metrics go besides metrics.jsonl — TensorBoard event files
 * in `<run_dir>/tensorboard`, and Weights & Biases through its TypeScript SDK (`@wandb/sdk`),
 * loaded only when asked for. A resumed run continues the same W&B run (its id is kept in
 * `<run_dir>/wandb-run-id`).
 */
import { existsSync, readFileSync } from 'node:fs';
import { basename, join, resolve } from 'node:path';
import { TensorBoardWriter, writeAtomic, type MetricSink } from '@lathe/data';

/** What `--report_to` accepts, comma-separated. */
export const REPORT_TARGETS = ['none', 'tensorboard', 'wandb'] as const;

/** The options that say where metrics are reported. */
export interface ReportOptions {
  report_to: string;
  wandb_project: string;
}

/** The targets of `--report_to`; an unknown one is an error naming the flag and the known ones. */
export function reportTargets(value: string): ('tensorboard' | 'wandb')[] {
  const items = value.split(',').map((s) => s.trim()).filter(Boolean);
  for (const t of items) if (!(REPORT_TARGETS as readonly string[]).includes(t)) throw new Error(`--report_to ${value}: unknown target '${t}' (known: ${REPORT_TARGETS.join(', ')})`);
  if (items.includes('none') && items.length > 1) throw new Error(`--report_to ${value}: 'none' cannot be combined with other targets`);
  return [...new Set(items.filter((t): t is 'tensorboard' | 'wandb' => t !== 'none'))];
}

/**
 * The sinks `cfg` asks for, for the run in `runDir` whose whole config is `cfg` (W&B records it).
 * W&B needs an API key (WANDB_API_KEY, or WANDB_MODE=offline); without one it is an error before
 * the run starts, not a run that silently reports nowhere.
 */
export function metricSinks(runDir: string, cfg: Partial<ReportOptions> & { resume?: boolean }): MetricSink[] {
  const targets = reportTargets(cfg.report_to ?? 'none');
  const sinks: MetricSink[] = [];
  if (targets.includes('tensorboard')) sinks.push(new TensorBoardWriter(join(runDir, 'tensorboard')));
  if (targets.includes('wandb')) sinks.push(new WandbSink(runDir, cfg));
  return sinks;
}

/** The W&B run id file of a run directory. */
const WANDB_ID_FILE = 'wandb-run-id';

/** Metrics to a Weights & Biases run: created on the first use, each line logged at its step, finished by `close`. */
class WandbSink implements MetricSink {
  private readonly run: Promise<WandbRun | undefined>;

  constructor(runDir: string, cfg: Partial<ReportOptions> & { resume?: boolean }) {
    if (!process.env.WANDB_API_KEY && process.env.WANDB_MODE !== 'offline') throw new Error('--report_to wandb: set WANDB_API_KEY (your key from wandb.ai/authorize), or WANDB_MODE=offline');
    const idFile = join(runDir, WANDB_ID_FILE);
    const id = cfg.resume && existsSync(idFile) ? readFileSync(idFile, 'utf8').trim() : undefined;
    const project = cfg.wandb_project || process.env.WANDB_PROJECT || 'lathe';
    this.run = Promise.resolve()
      .then(async () => {
        // loaded only when asked for (its CommonJS build: this package is CommonJS)
        // eslint-disable-next-line @typescript-eslint/no-require-imports
        const { default: wandb } = require('@wandb/sdk') as typeof import('@wandb/sdk');
        const run = await wandb.init({ project, name: basename(resolve(runDir)), config: cfg, ...(id ? { id, resume: 'allow' } : {}) });
        writeAtomic(idFile, `${run.id}\n`);
        return run as WandbRun;
      })
      .catch((e: unknown) => {
        // the run goes on: metrics.jsonl holds everything, and W&B can be filled from it later
        console.warn(`--report_to wandb: ${(e as Error).message}; metrics go to ${join(runDir, 'metrics.jsonl')} only`);
        return undefined;
      });
  }

  log(step: number, values: Readonly<Record<string, unknown>>): void {
    void this.run.then((r) => r?.log({ ...values }, step));
  }

  async close(): Promise<void> {
    await (await this.run)?.finish();
  }
}

/** The part of @wandb/sdk's Run used here. */
interface WandbRun {
  id: string;
  log(data: Record<string, unknown>, step?: number): void;
  finish(): Promise<void>;
}
