/**
 * Batch grading of JSONL lines `{"pred" | "response" | "completion": …, "gold" | "answer": …}` (or
 * fields named by `pred_field` / `gold_field`) into lines `{"correct": bool, "extracted": string | null}`,
 * in input order: the engine of `lathe grade`.
 */
import { createInterface } from 'node:readline';
import type { Readable, Writable } from 'node:stream';
import { ANSWER_FORMATS, type AnswerFormat } from './math/extract';
import { MathGrader, type MathReason } from './math/grade';
import { MATH_DEFAULTS } from './math/options';

/** Fields tried, in order, for the prediction when `pred_field` is auto. */
export const PRED_FIELDS = ['pred', 'response', 'completion'] as const;
/** Fields tried, in order, for the gold answer when `gold_field` is auto (`answer`: GSM8K, MATH-500, AIME; `final_answer`: OlympiadBench). */
export const GOLD_FIELDS = ['gold', 'answer', 'final_answer'] as const;

/** The options of `lathe grade`: the single source of its flags, defaults and help. */
export const gradeSchema = {
  pred_field: { type: 'string', default: 'auto', describe: `field holding the prediction (auto: the first of ${PRED_FIELDS.map((f) => `"${f}"`).join(', ')} a line has)` },
  gold_field: {
    type: 'string',
    default: 'auto',
    describe: `field holding the gold answer (auto: the first of ${GOLD_FIELDS.map((f) => `"${f}"`).join(', ')} a line has: GSM8K's and MATH-500's "answer" work as they are; a list of answers is graded as one comma list)`,
  },
  format: { type: 'string', default: 'auto', choices: ANSWER_FORMATS, describe: 'where answers are found: auto (a boxed answer or answer marker when present, else the text as an answer), boxed, r1_zero, gsm8k, raw (both are already answers)' },
  percent: { type: 'string', default: MATH_DEFAULTS.percent, choices: ['either', 'value', 'strip'], describe: '28% against 28 and 0.28: either accepts both, value only 0.28, strip only 28' },
  strip_units: { type: 'boolean', default: MATH_DEFAULTS.stripUnits, describe: 'drop units and currency signs before comparing' },
  list_order: { type: 'string', default: MATH_DEFAULTS.listOrder, choices: ['ignore', 'strict'], describe: 'whether bare comma lists must be in the same order (sets never, tuples always)' },
  set_relation: { type: 'boolean', default: MATH_DEFAULTS.setRelation, describe: 'accept an inequality (-2 <= x <= 7) for a gold interval or set ([-2, 7]), as Math-Verify allow_set_relation_comp' },
  rounded_tolerance: { type: 'string', default: MATH_DEFAULTS.roundedTolerance, choices: ['fixed', 'digits'], describe: 'a rounded decimal against an exact answer (1.414 for \\sqrt{2}) or a decimal of other precision in scientific notation: digits accepts it when the more precise value rounds to it (2+ significant digits shown), fixed compares at --float_rounding places (docs/graders.md)' },
  float_rounding: { type: 'number', default: MATH_DEFAULTS.floatRounding, integer: true, min: 0, max: 15, describe: 'decimal places compared when either answer is a decimal' },
  symbolic: { type: 'boolean', default: MATH_DEFAULTS.symbolic, describe: 'use the computer-algebra system when strings and numbers do not decide' },
  cas_timeout_ms: { type: 'number', default: MATH_DEFAULTS.casTimeoutMs, integer: true, min: 10, describe: 'wall-clock limit of one symbolic check (milliseconds); an overrun counts as wrong' },
  grade_timeout_ms: { type: 'number', default: MATH_DEFAULTS.gradeTimeoutMs, integer: true, min: 10, describe: 'no symbolic check starts after this many milliseconds on one line (long lists of answers)' },
  cas_workers: { type: 'number', default: 1, integer: true, min: 1, max: 64, describe: 'worker threads for symbolic checks' },
  concurrency: { type: 'number', default: 64, integer: true, min: 1, describe: 'lines graded at once (output order is kept)' },
  timing: { type: 'boolean', default: false, describe: 'add "ms" (time to grade the line) to each output line; the CAS worker is started before the first line' },
} as const;

/** One option of {@link gradeSchema}. */
type GradeOptionSpec = (typeof gradeSchema)[keyof typeof gradeSchema];

/**
 * The options from `values` (flag name → value; absent or undefined means the default), checked
 * against {@link gradeSchema}; errors name the flag and say what was expected.
 */
export function resolveGradeOptions(values: Record<string, unknown>): GradeJsonlOptions {
  const out: Record<string, unknown> = {};
  for (const [name, spec] of Object.entries(gradeSchema) as [string, GradeOptionSpec][]) {
    const v = values[name] ?? spec.default;
    const flag = `--${name}`;
    if (spec.type === 'boolean' && typeof v !== 'boolean') throw new Error(`${flag}: expected true or false, got ${JSON.stringify(v)}`);
    if (spec.type === 'string' && typeof v !== 'string') throw new Error(`${flag}: expected a string, got ${JSON.stringify(v)}`);
    if (spec.type === 'string' && 'choices' in spec && !(spec.choices as readonly string[]).includes(v as string)) throw new Error(`${flag}: expected one of ${spec.choices.join(', ')}, got ${JSON.stringify(v)}`);
    if (spec.type === 'number') {
      const n = typeof v === 'string' ? Number(v) : v;
      if (typeof n !== 'number' || !Number.isInteger(n)) throw new Error(`${flag}: expected an integer, got ${JSON.stringify(v)}`);
      if ('min' in spec && n < spec.min) throw new Error(`${flag}: expected at least ${spec.min}, got ${n}`);
      if ('max' in spec && n > spec.max) throw new Error(`${flag}: expected at most ${spec.max}, got ${n}`);
      out[name] = n;
      continue;
    }
    out[name] = v;
  }
  return out as unknown as GradeJsonlOptions;
}

/** Resolved options of {@link gradeJsonl}. */
export interface GradeJsonlOptions {
  /** The prediction's field, or `auto` ({@link PRED_FIELDS}). */
  pred_field: string;
  /** The gold answer's field, or `auto` ({@link GOLD_FIELDS}). */
  gold_field: string;
  format: AnswerFormat;
  percent: 'either' | 'value' | 'strip';
  strip_units: boolean;
  list_order: 'ignore' | 'strict';
  set_relation: boolean;
  rounded_tolerance: 'fixed' | 'digits';
  float_rounding: number;
  symbolic: boolean;
  cas_timeout_ms: number;
  grade_timeout_ms: number;
  cas_workers: number;
  concurrency: number;
  timing: boolean;
}

/** Counts over a graded file. */
export interface GradeSummary {
  lines: number;
  correct: number;
  /** Predictions without an extractable final answer. */
  noAnswer: number;
  /** Gold answers that could not be parsed (scored 0). */
  unparseableGold: number;
  /** Symbolic checks cut off by the time limit. */
  timeouts: number;
  seconds: number;
}

interface InputLine {
  pred: string;
  gold: string;
}

/** A line's field by name, or the first of `auto` present; errors name the line, the field and the flag that picks it. */
function field(r: Record<string, unknown>, name: string, auto: readonly string[], what: string, flag: string, where: string): { key: string; value: unknown } {
  const has = Object.keys(r).map((k) => `"${k}"`).join(', ');
  if (name !== 'auto') {
    if (!(name in r)) throw new Error(`${where}: no field "${name}" (the line has ${has}; --${flag} names the ${what}'s)`);
    return { key: name, value: r[name] };
  }
  const key = auto.find((k) => r[k] !== undefined);
  if (key === undefined) throw new Error(`${where}: no ${what} field (looked for ${auto.map((k) => `"${k}"`).join(', ')}; the line has ${has}; --${flag} names it)`);
  return { key, value: r[key] };
}

function readLine(text: string, where: string, options: Pick<GradeJsonlOptions, 'pred_field' | 'gold_field'>): InputLine {
  let row: unknown;
  try {
    row = JSON.parse(text);
  } catch {
    throw new Error(`${where}: not valid JSON (expected an object with a prediction and a gold answer, e.g. {"pred": ..., "gold": ...})`);
  }
  if (typeof row !== 'object' || row === null || Array.isArray(row)) throw new Error(`${where}: expected a JSON object with a prediction ("pred") and a gold answer ("gold")`);
  const r = row as Record<string, unknown>;
  const asText = ({ key, value }: { key: string; value: unknown }, lists: boolean): string => {
    if (typeof value === 'string') return value;
    if (typeof value === 'number' || typeof value === 'bigint') return String(value);
    // several gold answers (OlympiadBench's final_answer) grade as one comma list
    if (lists && Array.isArray(value) && value.length > 0 && value.every((v) => typeof v === 'string' || typeof v === 'number')) return value.join(', ');
    throw new Error(`${where}: field "${key}" must be a string or a number${lists ? ' (or a list of them)' : ''}, got ${value === undefined ? 'nothing' : JSON.stringify(value)}`);
  };
  return {
    pred: asText(field(r, options.pred_field, PRED_FIELDS, 'prediction', 'pred_field', where), false),
    gold: asText(field(r, options.gold_field, GOLD_FIELDS, 'gold answer', 'gold_field', where), true),
  };
}

/**
 * Grades every non-blank line of `input`, writing one result line per input line to `output` in
 * order. `source` names the input in errors (`preds.jsonl:12: ...`).
 */
export async function gradeJsonl(input: Readable, output: Writable, options: GradeJsonlOptions, source = 'stdin'): Promise<GradeSummary> {
  const t0 = performance.now();
  const grader = new MathGrader({
    percent: options.percent,
    stripUnits: options.strip_units,
    listOrder: options.list_order,
    setRelation: options.set_relation,
    roundedTolerance: options.rounded_tolerance,
    floatRounding: options.float_rounding,
    symbolic: options.symbolic,
    casTimeoutMs: options.cas_timeout_ms,
    gradeTimeoutMs: options.grade_timeout_ms,
    casWorkers: options.cas_workers,
  });
  const summary: GradeSummary = { lines: 0, correct: 0, noAnswer: 0, unparseableGold: 0, timeouts: 0, seconds: 0 };
  const inFlight: Promise<string>[] = [];
  const count = (correct: boolean, reason: MathReason) => {
    summary.lines++;
    if (correct) summary.correct++;
    if (reason === 'no-answer') summary.noAnswer++;
    if (reason === 'unparseable-gold') summary.unparseableGold++;
  };
  const write = (text: string) => new Promise<void>((resolve, reject) => output.write(text, (err) => (err ? reject(err) : resolve())));
  try {
    // with --timing, each line's time is its own: the CAS worker's one-off start-up is paid first
    if (options.timing) await grader.warmUp();
    let lineNo = 0;
    for await (const text of createInterface({ input, crlfDelay: Infinity })) {
      lineNo++;
      if (text.trim() === '') continue;
      const { pred, gold } = readLine(text, `${source}:${lineNo}`, options);
      const started = performance.now();
      inFlight.push(
        grader.grade(pred, gold, options.format).then((v) => {
          count(v.correct, v.reason);
          const out: Record<string, unknown> = { correct: v.correct, extracted: v.extracted };
          if (options.timing) out.ms = Number((performance.now() - started).toFixed(2));
          return `${JSON.stringify(out)}\n`;
        }),
      );
      if (inFlight.length >= options.concurrency) await write(await (inFlight.shift() as Promise<string>));
    }
    while (inFlight.length > 0) await write(await (inFlight.shift() as Promise<string>));
  } finally {
    summary.timeouts = grader.timeouts;
    await grader.close();
  }
  summary.seconds = (performance.now() - t0) / 1000;
  return summary;
}

/** The one-line human summary `lathe grade` prints on stderr. */
export function formatGradeSummary(s: GradeSummary): string {
  const pct = s.lines ? ((100 * s.correct) / s.lines).toFixed(2) : '0.00';
  const rate = s.seconds > 0 ? Math.round(s.lines / s.seconds) : 0;
  return `graded ${s.lines}: ${s.correct} correct (${pct}%), ${s.noAnswer} without an answer, ${s.unparseableGold} unparseable gold, ${s.timeouts} CAS timeouts; ${s.seconds.toFixed(2)} s (${rate}/s)`;
}
