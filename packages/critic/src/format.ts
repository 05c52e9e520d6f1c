/**
 * The packed in-context format of the critic's training data:
 * `[prompt] [attempt 1] [feedback "Reward: X\nLength: Y"] … [target attempt]`. Every attempt from
 * `superviseFrom` on is a target (its tokens carry grid-cell labels) and, with its feedback, context
 * for the attempts after it; the ablations drop the attempts' text (`no_ans`), the feedback
 * (`no_feedback`) or all context (`no_context`).
 */
import { attemptLabels, type CriticBins } from './bins';

/** One sampled attempt at a prompt and its final reward in [0, 1]. */
export interface CriticAttempt {
  tokens: readonly number[];
  reward: number;
}

/** The ablations of the original method; `none` is the full format. */
export const CRITIC_ABLATIONS = ['none', 'no_ans', 'no_feedback', 'no_context'] as const;
export type CriticAblation = (typeof CRITIC_ABLATIONS)[number];

/** A training sequence: token ids and, per token, its grid cell (−1 where nothing is predicted). */
export interface CriticExample {
  ids: number[];
  labels: number[];
}

/** Options of {@link criticExamples}. */
export interface CriticFormatOptions {
  bins: CriticBins;
  /** Tokenizes feedback text (no special tokens added). */
  encode: (text: string) => number[];
  /** Attempts before this many earlier ones in their sequence are context only (default 0: every attempt is a target). */
  superviseFrom?: number;
  ablation?: CriticAblation;
  /** Longest sequence in tokens: a sequence that would grow past it is closed and the next begins afresh with the prompt; an attempt that cannot fit even alone is skipped. */
  maxLength?: number;
  /** Where the attempts come from, for errors (e.g. `prompt 12`). */
  where?: string;
}

/** The feedback after an attempt: its reward and its length in tokens. */
export function feedbackText(reward: number, length: number): string {
  return `Reward: ${Number(reward.toFixed(4))}\nLength: ${length}\n`;
}

/** Sequences for one prompt's attempts, and how many attempts were skipped for not fitting `maxLength`. */
export function criticExamples(prompt: readonly number[], attempts: readonly CriticAttempt[], opts: CriticFormatOptions): { examples: CriticExample[]; skipped: number } {
  const ablation = opts.ablation ?? 'none';
  const superviseFrom = opts.superviseFrom ?? 0;
  const max = opts.maxLength ?? Infinity;
  const where = opts.where ?? 'attempts';
  // no_context and no_feedback never show feedback: their tokenizer need not spell it
  const shown = ablation === 'none' || ablation === 'no_ans';
  const feedback = attempts.map((a) => (shown ? opts.encode(feedbackText(a.reward, a.tokens.length)) : []));
  const labels = attempts.map((a, i) => attemptLabels(opts.bins, a.reward, a.tokens.length, `${where}, attempt ${i}`));
  const examples: CriticExample[] = [];
  let skipped = 0;
  const fits = (i: number) => prompt.length + attempts[i].tokens.length <= max;

  if (ablation === 'no_ans' || ablation === 'no_context') {
    // Each target gets its own sequence: its own text must not become context for a later target.
    attempts.forEach((a, k) => {
      if (k < superviseFrom) return;
      const ids = [...prompt];
      if (ablation === 'no_ans') for (let i = 0; i < k; i++) ids.push(...feedback[i]);
      if (ids.length + a.tokens.length > max) {
        skipped++;
        return;
      }
      examples.push({ ids: [...ids, ...a.tokens], labels: [...ids.map(() => -1), ...labels[k]] });
    });
    return { examples, skipped };
  }

  // Full format (or without feedback): one sequence holds many attempts, each a target once enough context precedes it.
  let current: CriticExample | undefined;
  let inSequence = 0;
  const close = () => {
    if (current && current.labels.some((l) => l >= 0)) examples.push(current);
    current = undefined;
  };
  attempts.forEach((a, k) => {
    if (!fits(k)) {
      skipped++;
      return;
    }
    if (current && current.ids.length + a.tokens.length > max) close();
    if (!current) {
      current = { ids: [...prompt], labels: prompt.map(() => -1) };
      inSequence = 0;
    }
    const target = inSequence >= superviseFrom;
    current.ids.push(...a.tokens);
    current.labels.push(...(target ? labels[k] : a.tokens.map(() => -1)));
    inSequence++;
    const fb = feedback[k];
    // Feedback only where another attempt can still follow it in this sequence.
    if (k + 1 < attempts.length && current.ids.length + fb.length < max) {
      current.ids.push(...fb);
      current.labels.push(...fb.map(() => -1));
    } else if (k + 1 < attempts.length) close();
  });
  close();
  return { examples, skipped };
}

/** Target tokens (labels ≥ 0) of examples: the loss's normaliser. */
export function labelledTokenCount(examples: readonly { labels: readonly number[] }[]): number {
  let n = 0;
  for (const e of examples) for (const l of e.labels) if (l >= 0) n++;
  return n;
}

/** What the critic reads before a target attempt at inference: the prompt, then each context attempt with its feedback (the full format). */
export function contextPrefix(prompt: readonly number[], context: readonly CriticAttempt[], encode: (text: string) => number[]): number[] {
  const ids = [...prompt];
  for (const a of context) ids.push(...a.tokens, ...encode(feedbackText(a.reward, a.tokens.length)));
  return ids;
}
