/**
 * Command options as data: one schema per command is the single source of truth for defaults, CLI
 * flags (the app turns each field into a yargs option), YAML config files and the config saved
 * with every checkpoint. Values resolve as defaults ← config file ← CLI flags.
 */

import { closest } from 'fastest-levenshtein';

/** One option: its type, default and help text. */
export type OptionSpec =
  | { type: 'string'; default: string; describe: string; choices?: readonly string[] }
  | { type: 'number'; default: number; describe: string; integer?: boolean; min?: number; max?: number; /** Exclusive upper bound. */ below?: number }
  | { type: 'boolean'; /** `'auto'`: the option also takes `auto`, which the command resolves when the run starts. */ default: boolean | 'auto'; describe: string };

/** A command's options by name (snake_case, as in YAML files and `--flags`). */
export type OptionSchema = Record<string, OptionSpec>;

/** The resolved config type of a schema. */
export type ConfigOf<S extends OptionSchema> = {
  -readonly [K in keyof S]: S[K] extends { type: 'string'; choices: readonly (infer C)[] }
    ? C
    : S[K] extends { type: 'string' }
      ? string
      : S[K] extends { type: 'number' }
        ? number
        : S[K] extends { type: 'boolean'; default: 'auto' }
          ? boolean | 'auto'
          : boolean;
};

/** The schema's defaults. */
export function defaults<S extends OptionSchema>(schema: S): ConfigOf<S> {
  return Object.fromEntries(Object.entries(schema).map(([k, s]) => [k, s.default])) as ConfigOf<S>;
}

/**
 * Checks and merges partial configs over the defaults, later sources winning. Each source is
 * named in errors (`"config.yaml"`, `"command line"`): an unknown key, a wrong type, a value
 * outside its range or choices is an error naming the source and the key.
 */
export function resolveConfig<S extends OptionSchema>(schema: S, sources: { name: string; values: Record<string, unknown> }[]): ConfigOf<S> {
  const out: Record<string, unknown> = { ...defaults(schema) };
  for (const { name, values } of sources) {
    for (const [key, value] of Object.entries(values)) {
      if (value === undefined) continue;
      const spec = schema[key];
      if (!spec) throw new Error(`${name}: unknown option '${key}' (did you mean '${closest(key, Object.keys(schema))}'?)`);
      out[key] = checkValue(spec, value, `${name}: option '${key}'`);
    }
  }
  return out as ConfigOf<S>;
}

/** A value as an error shows it (a flag that did not parse as a number reaches here as NaN). */
const shown = (v: unknown) => (typeof v === 'number' && Number.isNaN(v) ? 'text that is not a number' : JSON.stringify(v));

function checkValue(spec: OptionSpec, value: unknown, where: string): unknown {
  if (spec.type === 'number') {
    const v = typeof value === 'string' && value.trim() !== '' ? Number(value) : value;
    if (typeof v !== 'number' || !Number.isFinite(v)) throw new Error(`${where} must be a number, got ${shown(value)}`);
    if (spec.integer && !Number.isInteger(v)) throw new Error(`${where} must be an integer, got ${v}`);
    if (spec.min !== undefined && v < spec.min) throw new Error(`${where} must be ≥ ${spec.min}, got ${v}`);
    if (spec.max !== undefined && v > spec.max) throw new Error(`${where} must be ≤ ${spec.max}, got ${v}`);
    if (spec.below !== undefined && v >= spec.below) throw new Error(`${where} must be < ${spec.below}, got ${v}`);
    return v;
  }
  if (spec.type === 'boolean') {
    if (value === 'auto' && spec.default === 'auto') return value;
    if (typeof value !== 'boolean') throw new Error(`${where} must be true or false${spec.default === 'auto' ? " or 'auto'" : ''}, got ${shown(value)}`);
    return value;
  }
  if (typeof value !== 'string') throw new Error(`${where} must be a string, got ${shown(value)}`);
  if (spec.choices && !spec.choices.includes(value)) throw new Error(`${where} must be one of ${spec.choices.join(', ')}, got '${value}'`);
  return value;
}

// ---------------------------------------------------------------------------------------------
// The schema as documentation

/** A number as a table shows it: small magnitudes in exponent form (2e-5, not 0.00002). */
const shownNumber = (v: number) => (v !== 0 && Math.abs(v) < 1e-3 ? v.toExponential() : String(v));

/** Text for a markdown table cell: `|` escaped everywhere; outside code spans also `*` and `<` (emphasis, HTML tags). */
function tableCell(text: string): string {
  return text
    .split('`')
    .map((part, i) => (i % 2 === 1 ? part.replace(/\|/g, '\\|') : part.replace(/\\?\|/g, '\\|').replace(/\*/g, '\\*').replace(/</g, '&lt;')))
    .join('`');
}

/** The values an option takes beyond its type, in words: its choices, or a number's kind and range. */
function allowedValues(spec: OptionSpec): string {
  if (spec.type === 'string') return spec.choices ? spec.choices.map((c) => `\`${c}\``).join(', ').replace(/, ([^,]*)$/, ' or $1') : '';
  if (spec.type === 'boolean') return spec.default === 'auto' ? '`true`, `false` or `auto`' : '';
  const upper = spec.max !== undefined ? `${shownNumber(spec.max)}]` : spec.below !== undefined ? `${shownNumber(spec.below)})` : undefined;
  const range = spec.min !== undefined && upper ? `in [${shownNumber(spec.min)}, ${upper}` : spec.min !== undefined ? `≥ ${shownNumber(spec.min)}` : upper ? (spec.max !== undefined ? `≤ ${shownNumber(spec.max)}` : `< ${shownNumber(spec.below!)}`) : '';
  return [spec.integer ? 'integer' : range ? 'number' : '', range].filter(Boolean).join(' ');
}

/**
 * A schema as a markdown table — option, default, meaning (its help text, then its choices or its
 * range) — for the guides, whose option tables are written from the schemas by
 * `npm run docs:options`, so the docs say what the code does.
 */
export function optionTable(schema: OptionSchema): string {
  const rows = Object.entries(schema).map(([name, spec]) => {
    const shown = spec.type === 'number' ? shownNumber(spec.default) : String(spec.default);
    const values = allowedValues(spec);
    return `| \`${name}\` | ${spec.default === '' ? '—' : tableCell(`\`${shown}\``)} | ${tableCell(spec.describe)}${values ? ` — ${tableCell(values)}` : ''} |`;
  });
  return ['| option | default | meaning |', '| --- | --- | --- |', ...rows].join('\n');
}
