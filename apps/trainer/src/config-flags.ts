/**
 * Turns a command's option schema (the single source of truth, kept in its package) into yargs
 * flags, and resolves defaults ← `--config file.yaml` ← flags.
 */
import { readFileSync } from 'node:fs';
import { parse as parseYaml } from 'yaml';
import type { Argv, Options } from 'yargs';
import { resolveConfig, type ConfigOf, type OptionSchema } from '@lathe/data';

/** Adds `--config` and one flag per schema option (no yargs defaults: absence means "not given"). */
export function addSchemaFlags<T>(y: Argv<T>, schema: OptionSchema): Argv<T> {
  let out: Argv<T> = y.option('config', { type: 'string', describe: 'YAML file of options (flags given on the command line override it)' });
  for (const [name, spec] of Object.entries(schema)) {
    const o: Options = { type: spec.type, describe: `${spec.describe} [default: ${JSON.stringify(spec.default)}]` };
    if (spec.type === 'string' && spec.choices) o.choices = [...spec.choices];
    out = out.option(name, o) as Argv<T>;
  }
  return out;
}

/** The resolved config: schema defaults, then `base` (a command's own defaults), then the YAML file, then the flags present on the command line. */
export function configFromArgv<S extends OptionSchema>(schema: S, argv: Record<string, unknown>, base?: { name: string; values: Record<string, unknown> }): ConfigOf<S> {
  const sources: { name: string; values: Record<string, unknown> }[] = base ? [base] : [];
  if (typeof argv.config === 'string') sources.push(readYamlOptions(argv.config, '--config'));
  const flags = Object.fromEntries(Object.keys(schema).filter((k) => argv[k] !== undefined).map((k) => [k, argv[k]]));
  sources.push({ name: 'command line', values: flags });
  return resolveConfig(schema, sources);
}

/** Reads a YAML file of `option: value` pairs as a config source; errors name the flag and file. */
export function readYamlOptions(file: string, flag: string): { name: string; values: Record<string, unknown> } {
  let text: string;
  try {
    text = readFileSync(file, 'utf8');
  } catch (e) {
    throw new Error(`${flag} ${file}: cannot read (${(e as NodeJS.ErrnoException).code ?? (e as Error).message})`);
  }
  const values: unknown = parseYaml(text);
  if (values !== null && (typeof values !== 'object' || Array.isArray(values))) throw new Error(`${file}: expected a mapping of option: value`);
  return { name: file, values: (values ?? {}) as Record<string, unknown> };
}

/**
 * Runs a long job with Ctrl-C handling: the first SIGINT/SIGTERM aborts `signal` (the job stops
 * after its current step with a checkpoint), a second one exits at once.
 */
export async function withInterrupt<T>(job: (signal: AbortSignal) => Promise<T>): Promise<T> {
  const controller = new AbortController();
  const stop = () => {
    if (controller.signal.aborted) process.exit(130);
    process.stderr.write('\nstopping after this step (a checkpoint will be saved); press Ctrl-C again to quit now\n');
    controller.abort();
  };
  process.on('SIGINT', stop);
  process.on('SIGTERM', stop);
  try {
    return await job(controller.signal);
  } finally {
    process.off('SIGINT', stop);
    process.off('SIGTERM', stop);
  }
}
