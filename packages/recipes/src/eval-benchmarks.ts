/**
 * The math benchmarks `lathe eval` reports — AIME24, AIME25, AMC23, MATH-500, Minerva, OlympiadBench
 * and GSM8K — read from their public JSONL files, each with its own answer field and quirks, into one
 * problem type: the text, the gold answer as bare LaTeX, and what breakdowns and grading need.
 */
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { readRecords, type SourceRecord } from '@lathe/data';
import { gsm8kAnswer, lastBoxed } from '@lathe/graders';

/** One evaluation problem, whatever set it came from. */
export interface BenchmarkProblem {
  /** The benchmark's name (one of {@link BENCHMARKS}). */
  benchmark: string;
  /** The problem's id in its set (`unique_id`, `id` or the row index), unique within the set. */
  id: string;
  /** 0-based row of the file. */
  index: number;
  /** The problem text, before any prompt template. */
  problem: string;
  /** The gold answer as bare LaTeX (no `$`), several answers joined by `, `. */
  answer: string;
  /** MATH subject, Minerva course or OlympiadBench subfield, for breakdowns. */
  subject?: string;
  /** MATH difficulty 1–5. */
  level?: number;
  /** OlympiadBench: the question asks for every answer (the gold lists them all). */
  multipleAnswers?: boolean;
  /** OlympiadBench: the unit the answer is given in (not part of the gold). */
  unit?: string;
  /** OlympiadBench: the relative tolerance its numerical answers are graded with, where the set gives one. */
  relTol?: number;
  /** Where the row is, for messages (`file:line`). */
  where: string;
}

/** How one benchmark's file is found and read. */
interface BenchmarkSpec {
  /** The file under the datasets folder. */
  file: string;
  /** The row's problem and gold answer (and breakdown fields); throws naming the row and field. */
  read(r: SourceRecord): Omit<BenchmarkProblem, 'benchmark' | 'index' | 'where'>;
}

/** A field's text (numbers as written by `String`), or an error naming the row and the field. */
function text(r: SourceRecord, field: string, what: string): string {
  const v = r.value[field];
  if (typeof v === 'string' && v.trim() !== '') return v;
  if (typeof v === 'number' && Number.isFinite(v)) return String(v);
  const fields = Object.keys(r.value).map((k) => `'${k}'`).join(', ') || 'none';
  throw new Error(`${r.where}: ${v === undefined || v === null ? `no field '${field}'` : `field '${field}' is ${JSON.stringify(v)}`} (${what}; the row has ${fields})`);
}

/** An integer answer without leading zeros (AIME `"025"` → `25`); other text unchanged. */
function integerAnswer(s: string): string {
  const t = s.trim();
  return /^[-+]?\d+(?:\.0+)?$/.test(t) ? String(Number(t)) : t;
}

/** `$x$`, `$$x$$` or `\(x\)` → `x`. */
function stripMath(s: string): string {
  return s.trim().replace(/^\$+|\$+$/g, '').replace(/^\\\(|\\\)$/g, '').trim();
}

const SPECS: Record<string, BenchmarkSpec> = {
  aime24: {
    file: 'aime24/test.jsonl',
    // answers are strings with leading zeros kept ("025")
    read: (r) => ({ id: text(r, 'id', 'the problem id'), problem: text(r, 'problem', 'the problem text'), answer: integerAnswer(text(r, 'answer', 'the gold answer')) }),
  },
  aime25: {
    file: 'aime25/test.jsonl',
    // answers are ints; ids are strings "0".."29"
    read: (r) => ({ id: text(r, 'id', 'the problem id'), problem: text(r, 'problem', 'the problem text'), answer: integerAnswer(text(r, 'answer', 'the gold answer')) }),
  },
  amc23: {
    file: 'amc23/test.jsonl',
    // answers are floats (27.0): integers are written without ".0"
    read: (r) => ({ id: text(r, 'id', 'the problem id'), problem: text(r, 'problem', 'the problem text'), answer: integerAnswer(text(r, 'answer', 'the gold answer')) }),
  },
  math500: {
    file: 'math500/test.jsonl',
    read: (r) => ({
      id: text(r, 'unique_id', 'the problem id'),
      problem: text(r, 'problem', 'the problem text'),
      answer: text(r, 'answer', 'the gold answer'),
      subject: text(r, 'subject', 'the MATH subject'),
      level: Number(text(r, 'level', 'the MATH level')),
    }),
  },
  minerva: {
    file: 'minerva_math/test.jsonl',
    // no answer field: the gold is the last \boxed{} of the solution, often followed by its unit
    read: (r) => {
      const solution = text(r, 'solution', 'the worked solution, whose last \\boxed{} is the gold answer');
      const answer = lastBoxed(solution);
      if (answer === null || answer.trim() === '') throw new Error(`${r.where}: field 'solution' has no \\boxed{} answer`);
      return { id: text(r, 'idx', 'the problem id'), problem: text(r, 'problem', 'the problem text'), answer: answer.trim(), subject: text(r, 'type', 'the course') };
    },
  },
  olympiadbench: {
    file: 'olympiadbench/test.jsonl',
    // final_answer: a list of strings, each often `$…$` and itself sometimes a list (`$69$,$84$`)
    read: (r) => {
      const finals = r.value.final_answer;
      if (!Array.isArray(finals) || finals.length === 0 || !finals.every((f) => typeof f === 'string' && f.trim() !== '')) {
        text(r, 'final_answer', 'the list of final answers'); // throws naming the field when it is missing
        throw new Error(`${r.where}: field 'final_answer' is ${JSON.stringify(finals)}, expected a list of answer strings`);
      }
      const answer = (finals as string[]).map((f) => f.split(/\$\s*,\s*\$/).map(stripMath).join(', ')).join(', ');
      const context = typeof r.value.context === 'string' && r.value.context.trim() !== '' ? `${r.value.context}\n\n` : '';
      const unit = typeof r.value.unit === 'string' && r.value.unit.trim() !== '' ? stripMath(r.value.unit) : undefined;
      const tol = typeof r.value.error === 'string' ? Number(r.value.error) : NaN;
      return {
        id: text(r, 'id', 'the problem id'),
        problem: context + text(r, 'question', 'the problem text'),
        answer,
        subject: typeof r.value.subfield === 'string' ? r.value.subfield : undefined,
        multipleAnswers: r.value.is_multiple_answer === true,
        ...(unit === undefined ? {} : { unit }),
        ...(Number.isFinite(tol) && tol > 0 ? { relTol: tol } : {}),
      };
    },
  },
  gsm8k: {
    file: 'gsm8k/test.jsonl',
    // the answer field is a worked solution; the final number follows "#### " (thousands commas dropped)
    read: (r) => {
      const solution = text(r, 'answer', 'the worked solution ending in "#### n"');
      const answer = gsm8kAnswer(solution);
      if (answer === null) throw new Error(`${r.where}: field 'answer' has no "#### n" line`);
      return { id: String(r.index), problem: text(r, 'question', 'the problem text'), answer: answer.replace(/,/g, '') };
    },
  },
};

/** Every benchmark `lathe eval` knows, in the order papers tabulate them. */
export const BENCHMARKS: readonly string[] = ['aime24', 'aime25', 'amc23', 'math500', 'minerva', 'olympiadbench', 'gsm8k'];

/** The file of benchmark `name` under the datasets folder `dir`. */
export function benchmarkFile(name: string, dir: string): string {
  return join(dir, specOf(name).file);
}

function specOf(name: string): BenchmarkSpec {
  const spec = SPECS[name];
  if (!spec) throw new Error(`unknown benchmark '${name}' (known: ${BENCHMARKS.join(', ')})`);
  return spec;
}

/**
 * Parses a comma-separated benchmark list (`aime24,math500`; `all` for every one), checking each
 * name; an unknown name is an error listing the known ones.
 */
export function parseBenchmarkList(list: string): string[] {
  const names = list.split(',').map((s) => s.trim()).filter((s) => s !== '');
  if (names.length === 0) throw new Error(`no benchmark named (known: ${BENCHMARKS.join(', ')})`);
  if (names.length === 1 && names[0] === 'all') return [...BENCHMARKS];
  for (const n of names) specOf(n);
  return [...new Set(names)];
}

/**
 * The problems of benchmark `name` from its file under `dir` (default layout of the public copies:
 * `aime24/test.jsonl`, `minerva_math/test.jsonl`, …), or from `file` when given. Errors name the
 * benchmark, the file, and for a bad row its line and the missing field.
 */
export async function loadBenchmark(name: string, options: { dir?: string; file?: string; limit?: number }): Promise<BenchmarkProblem[]> {
  const spec = specOf(name);
  const file = options.file ?? join(options.dir ?? '.', spec.file);
  if (!existsSync(file)) throw new Error(`benchmark ${name}: ${file} not found (set the datasets folder with --data_dir)`);
  let records = await readRecords(file);
  if (options.limit !== undefined && options.limit > 0) records = records.slice(0, options.limit);
  if (records.length === 0) throw new Error(`benchmark ${name}: ${file} has no rows`);
  const seen = new Set<string>();
  return records.map((r) => {
    const p: BenchmarkProblem = { benchmark: name, index: r.index, where: r.where, ...spec.read(r) };
    if (seen.has(p.id)) throw new Error(`${r.where}: problem id '${p.id}' appears twice in ${file}`);
    seen.add(p.id);
    return p;
  });
}
