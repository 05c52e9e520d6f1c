/** The math grader: extraction, normalisation and equivalence of a prediction against a gold answer. */
import { CasPool } from './cas-pool';
import { answersEquivalent, type EquivalenceReason } from './equivalence';
import { goldChoice, predictedChoice } from './choice';
import { extractAnswer, finalPart, type AnswerFormat } from './extract';
import { normalizeAnswer } from './normalize';
import { MATH_DEFAULTS, type MathOptions } from './options';

/** Normalised answers longer than this skip structure and CAS checks. */
const MAX_ANSWER_CHARS = 2000;

/**
 * A gold whose `\boxed{` is never closed (a reference cut short) is read to its end: the missing
 * closing braces are added. Only golds are repaired: a prediction cut inside its box has no final answer.
 */
export function closeTruncatedBox(gold: string): string {
  if (!/\\(?:boxed|fbox)\s*\{/.test(gold)) return gold;
  let depth = 0;
  for (let i = 0; i < gold.length; i++) {
    if (gold[i] === '\\') i++;
    else if (gold[i] === '{') depth++;
    else if (gold[i] === '}' && depth > 0) depth--;
  }
  return depth > 0 && depth <= 8 ? gold + '}'.repeat(depth) : gold;
}

/** Why a verdict is what it is: how equality was shown, or why it was not. */
export type MathReason = EquivalenceReason | 'no-answer';

/** The outcome of grading one prediction. */
export interface MathVerdict {
  correct: boolean;
  /** The prediction's extracted final answer (before normalisation), or null when it has none. */
  extracted: string | null;
  /** The gold answer as extracted, or null when none could be. */
  gold: string | null;
  reason: MathReason;
}

/** Options of {@link MathGrader}: the equivalence options plus the CAS worker count. */
export interface MathGraderOptions extends MathOptions {
  /** CAS worker threads. */
  casWorkers: number;
}

/**
 * Grades math answers. The common path (equal strings, plain numbers) runs on the caller's thread;
 * symbolic checks go to time-bounded worker threads, started on first need. Call `close()` when done
 * (idle workers do not keep the process alive).
 */
export class MathGrader {
  /** The options in force, defaults filled in. */
  readonly options: MathGraderOptions;
  private pool: CasPool | null = null;

  constructor(options: Partial<MathGraderOptions> = {}) {
    this.options = { ...MATH_DEFAULTS, casWorkers: 1, ...options };
  }

  /** Symbolic checks cut off by the time limit so far. */
  get timeouts(): number {
    return this.pool?.timeouts ?? 0;
  }

  /**
   * Grades `pred` (a model response or an answer) against `gold` (a solution or an answer).
   * The gold is extracted under `format` too, falling back to taking it whole; a gold that yields
   * nothing usable scores 0 with reason `unparseable-gold`. `overrides` change the equivalence
   * options for this call only (e.g. a benchmark's own tolerance for one problem).
   */
  async grade(pred: string, gold: string, format: AnswerFormat = 'auto', overrides?: Partial<MathOptions>): Promise<MathVerdict> {
    const options: MathOptions = overrides ? { ...this.options, ...overrides } : this.options;
    const extracted = extractAnswer(pred, format);
    const goldText = closeTruncatedBox(gold);
    const goldAnswer = format === 'raw' ? extractAnswer(goldText, 'raw') : extractAnswer(goldText, format) ?? extractAnswer(goldText, 'auto');
    const normOptions = { stripUnits: options.stripUnits };
    const goldNorm = goldAnswer === null ? '' : normalizeAnswer(goldAnswer, normOptions);
    if (goldNorm === '') return { correct: false, extracted, gold: goldAnswer, reason: 'unparseable-gold' };
    // a choice letter: the prediction's letter, even with an explanation after it or in a sentence
    const choice = goldChoice(goldNorm);
    const letter = choice === null ? null : predictedChoice(extracted, format === 'raw' ? pred : finalPart(pred));
    if (letter !== null) return { correct: letter === choice, extracted: extracted ?? letter, gold: goldAnswer, reason: letter === choice ? 'string' : 'different' };
    if (extracted === null) return { correct: false, extracted, gold: goldAnswer, reason: 'no-answer' };
    const predNorm = normalizeAnswer(extracted, normOptions);
    if (predNorm === '') return { correct: false, extracted, gold: goldAnswer, reason: 'no-answer' };
    const symbolic = options.symbolic ? (req: Parameters<CasPool['check']>[0]) => this.casPool().check(req) : null;
    // answers this long are not answers anyone writes: compare them as strings only
    if (goldNorm.length > MAX_ANSWER_CHARS || predNorm.length > MAX_ANSWER_CHARS) {
      const equal = goldNorm === predNorm;
      return { correct: equal, extracted, gold: goldAnswer, reason: equal ? 'string' : 'different' };
    }
    let eq = await answersEquivalent(goldNorm, predNorm, options, symbolic);
    if (!eq.equal) {
      // `y = 2x + 1` against `2x - y + 1 = 0`: compare the whole equations when a prefix was dropped
      const keep = { ...normOptions, keepRelation: true };
      const goldFull = normalizeAnswer(goldAnswer as string, keep);
      const predFull = normalizeAnswer(extracted, keep);
      if ((goldFull !== goldNorm || predFull !== predNorm) && goldFull.includes('=') && predFull.includes('=')) {
        const full = await answersEquivalent(goldFull, predFull, options, symbolic);
        if (full.equal) eq = full;
      }
    }
    return { correct: eq.equal, extracted, gold: goldAnswer, reason: eq.reason };
  }

  /** Starts the CAS worker now and resolves once it has loaded (otherwise it starts on the first symbolic check). */
  async warmUp(): Promise<void> {
    if (this.options.symbolic) await this.casPool().warmUp();
  }

  /** Stops the CAS workers. */
  async close(): Promise<void> {
    const pool = this.pool;
    this.pool = null;
    await pool?.close();
  }

  private casPool(): CasPool {
    this.pool ??= new CasPool({ workers: this.options.casWorkers, timeoutMs: this.options.casTimeoutMs });
    return this.pool;
  }
}
