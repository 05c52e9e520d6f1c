/**
 * Turns a command's option schema (the single source of truth, kept with its recipe) into yargs
 * flags, and resolves defaults ← `--config file.yaml` ← flags. Every option also answers to its
 * kebab-case spelling (`--run-dir`) and to the name TRL gives it (`--learning_rate` for `--lr`),
 * on the command line and in YAML files alike; the resolved config uses the schema's names.
 */
import { readFileSync } from 'node:fs';
import { parse as parseYaml, YAMLParseError } from 'yaml';
import type { Argv, Options } from 'yargs';
import { resolveConfig, type ConfigOf, type OptionSchema } from '@lathe/recipes';

/** A mistake in how a command was called (a flag, a value, a config file): exit code 2, with a pointer to `--help`. */
export class UsageError extends Error {
  override name = 'UsageError';
}

/**
 * The names TRL's configs (and transformers' TrainingArguments under them) give Lathe's options, with
 * the same meaning; each is accepted wherever a command has the option.
 */
export const OPTION_ALIASES: Readonly<Record<string, readonly string[]>> = {
  lr: ['learning_rate'],
  steps: ['max_steps'],
  batch_size: ['per_device_train_batch_size'],
  max_length: ['max_seq_length'],
  run_dir: ['output_dir'],
  model: ['model_name_or_path'],
  schedule: ['lr_scheduler_type'],
  save_every: ['save_steps'],
  log_every: ['logging_steps'],
  eval_every: ['eval_steps'],
  keep_last: ['save_total_limit'],
  compute_dtype: ['torch_dtype'],
  group_size: ['num_generations'],
  max_new_tokens: ['max_completion_length'],
  kl_coef: ['beta'],
  clip_low: ['epsilon'],
  clip_high: ['epsilon_high'],
  epochs: ['num_iterations'],
  lora_rank: ['lora_r'],
  lora_targets: ['lora_target_modules'],
};

const kebab = (name: string) => name.replace(/_/g, '-');

/** The other names an option answers to: its kebab-case spelling, its aliases and theirs. */
export function alternativeNames(option: string): string[] {
  const names = [kebab(option), ...(OPTION_ALIASES[option] ?? []).flatMap((a) => [a, kebab(a)])];
  return [...new Set(names)].filter((n) => n !== option);
}

/** The option among `names` that `given` spells another way (kebab-case or an alias), or undefined. */
export function canonicalName(given: string, names: readonly string[]): string | undefined {
  const snake = given.replace(/-/g, '_');
  if (names.includes(snake)) return snake;
  return names.find((n) => OPTION_ALIASES[n]?.includes(snake));
}

/** Levenshtein distance: the fewest single-character insertions, deletions and substitutions from `a` to `b`. */
function editDistance(a: string, b: string): number {
  let row = Array.from({ length: b.length + 1 }, (_, j) => j);
  for (let i = 1; i <= a.length; i++) {
    const next = [i];
    for (let j = 1; j <= b.length; j++) next[j] = Math.min(row[j] + 1, next[j - 1] + 1, row[j - 1] + (a[i - 1] === b[j - 1] ? 0 : 1));
    row = next;
  }
  return row[b.length];
}

/** The nearest of `candidates` to `given` by edit distance, when it is close (at most a third of the word, and at least 2, apart). */
export function nearest(given: string, candidates: readonly string[]): string | undefined {
  let best: string | undefined;
  let distance = Infinity;
  for (const c of candidates) {
    const d = editDistance(given, c);
    if (d < distance) [best, distance] = [c, d];
  }
  return distance <= Math.max(2, Math.floor(given.length / 3)) ? best : undefined;
}

/**
 * The option of `names` that an unknown `given` most likely meant: the one it spells another way,
 * else the nearest by edit distance over the names and their other spellings; undefined when none is close.
 */
export function suggestName(given: string, names: readonly string[]): string | undefined {
  const canonical = canonicalName(given, names);
  if (canonical) return canonical;
  const spellings = new Map(names.flatMap((n) => [n, ...alternativeNames(n)].map((s) => [s.replace(/-/g, '_'), n] as const)));
  const hit = nearest(given.replace(/-/g, '_'), [...spellings.keys()]);
  return hit === undefined ? undefined : spellings.get(hit);
}

/** The value of a `true | false | auto` flag: bare or `true` is true, `false` (or `--no-flag`) false; anything else goes on to the schema's check. */
function autoBooleanFlag(v: unknown): unknown {
  return v === '' || v === 'true' ? true : v === 'false' ? false : v;
}

/**
 * Adds one flag per schema option (no yargs defaults: absence means "not given"), its other
 * spellings as hidden flags, and `--config` unless `config` is false.
 */
export function addSchemaFlags<T>(y: Argv<T>, schema: OptionSchema, { config = true }: { config?: boolean } = {}): Argv<T> {
  let out: Argv<T> = config ? y.option('config', { type: 'string', requiresArg: true, describe: 'YAML file of options (flags given on the command line override it)' }) : y;
  for (const [name, spec] of Object.entries(schema)) {
    const aliases = OPTION_ALIASES[name] ?? [];
    const also = aliases.length ? ` [also: ${aliases.map((a) => `--${a}`).join(', ')}]` : '';
    // a string or number flag with nothing after it is an error, not an empty value
    const o: Options = { type: spec.type, requiresArg: spec.type !== 'boolean', describe: `${spec.describe} [default: ${JSON.stringify(spec.default)}]${also}` };
    if (spec.type === 'string' && spec.choices) o.choices = [...spec.choices];
    // a boolean that also takes `auto` parses as text so that `--flag auto` reaches the schema; bare `--flag` stays true
    if (spec.type === 'boolean' && spec.default === 'auto') Object.assign(o, { type: 'string', requiresArg: false, coerce: autoBooleanFlag });
    out = out.option(name, o) as Argv<T>;
    for (const alt of alternativeNames(name)) if (!(alt in schema)) out = out.option(alt, { type: o.type, requiresArg: o.requiresArg, choices: o.choices, coerce: o.coerce, hidden: true }) as Argv<T>;
  }
  return out;
}

/** The schema options given on the command line under any of their names; one given under two names is an error. */
function flagValues(schema: OptionSchema, argv: Record<string, unknown>): Record<string, unknown> {
  const values: Record<string, unknown> = {};
  for (const name of Object.keys(schema)) {
    const given = [name, ...alternativeNames(name).filter((n) => !(n in schema))].filter((n) => argv[n] !== undefined);
    if (given.length > 1) throw new UsageError(`--${name} is given twice (as ${given.map((n) => `--${n}`).join(' and ')})`);
    if (given.length === 1) values[name] = argv[given[0]];
  }
  return values;
}

/** A config source with its keys under the schema's names; an unknown key is an error naming the source and the likely option. */
function canonicalSource(schema: OptionSchema, source: { name: string; values: Record<string, unknown> }): { name: string; values: Record<string, unknown> } {
  const names = Object.keys(schema);
  const values: Record<string, unknown> = {};
  const from: Record<string, string> = {};
  for (const [key, value] of Object.entries(source.values)) {
    const option = canonicalName(key, names);
    if (!option) {
      const hint = suggestName(key, names);
      throw new UsageError(`${source.name}: unknown option '${key}'${hint ? ` (did you mean '${hint}'?)` : ''}`);
    }
    if (option in from) throw new UsageError(`${source.name}: option '${option}' is given twice (as '${from[option]}' and '${key}')`);
    from[option] = key;
    values[option] = value;
  }
  return { name: source.name, values };
}

/** {@link resolveConfig} for the CLI: its errors (a wrong type, range or choice) are usage errors. */
export function resolveOptions<S extends OptionSchema>(schema: S, sources: { name: string; values: Record<string, unknown> }[]): ConfigOf<S> {
  try {
    return resolveConfig(schema, sources);
  } catch (e) {
    throw new UsageError((e as Error).message);
  }
}

/** The resolved config: schema defaults, then `base` (a command's own defaults), then the YAML file, then the flags present on the command line. */
export function configFromArgv<S extends OptionSchema>(schema: S, argv: Record<string, unknown>, base?: { name: string; values: Record<string, unknown> }): ConfigOf<S> {
  const sources: { name: string; values: Record<string, unknown> }[] = base ? [base] : [];
  if (typeof argv.config === 'string') sources.push(yamlSource(schema, argv.config, '--config'));
  sources.push({ name: 'command line', values: flagValues(schema, argv) });
  return resolveOptions(schema, sources);
}

/** A YAML file of options for `schema`, its keys under the schema's names (kebab-case and TRL names accepted). */
export function yamlSource(schema: OptionSchema, file: string, flag: string): { name: string; values: Record<string, unknown> } {
  return canonicalSource(schema, readYamlOptions(file, flag));
}

/** Reads a YAML file of `option: value` pairs as a config source; errors name the flag or the file and line. */
function readYamlOptions(file: string, flag: string): { name: string; values: Record<string, unknown> } {
  let text: string;
  try {
    text = readFileSync(file, 'utf8');
  } catch (e) {
    throw new UsageError(`${flag} ${file}: cannot read (${(e as NodeJS.ErrnoException).code ?? (e as Error).message})`);
  }
  let values: unknown;
  try {
    values = parseYaml(text);
  } catch (e) {
    if (!(e instanceof YAMLParseError)) throw e;
    const at = e.linePos?.[0];
    // yaml's message ends with the position and an excerpt of the file: the position goes in front, as file:line:column
    const what = e.message.split('\n')[0].replace(/ at line \d+, column \d+:?$/, '');
    throw new UsageError(`${file}${at ? `:${at.line}:${at.col}` : ''}: malformed YAML (${what})`);
  }
  if (values !== null && (typeof values !== 'object' || Array.isArray(values))) throw new UsageError(`${file}: expected a mapping of option: value`);
  return { name: file, values: (values ?? {}) as Record<string, unknown> };
}

