/**
 * An LLM judge as a reward source: the graders' `LlmJudge` (an OpenAI-compatible chat endpoint with
 * a bounded pool of requests in flight, retries with backoff, a per-request timeout and a cache of
 * identical requests) asked about each completion; its verdict is the source's value. The reward
 * scorer calls every sample's source concurrently, so a step's completions reach the judge as one
 * batch, at most `concurrency` requests at a time. A reply without a verdict, or a request that
 * fails after its retries, throws: the scorer counts it as a failure of the source and substitutes
 * its fallback (never a silent 0).
 */
import { LlmJudge, type JudgeOptions } from '@lathe/graders';
import type { RewardSource } from './rewards';

/** Options of {@link judgeRewardSource}. */
export interface JudgeRewardOptions<M> {
  /** Source name in metrics. Default 'judge'. */
  name?: string;
  /** Weight in the step's reward. Default 1. */
  weight?: number;
  /** The reference the template's `{reference}` reads, from a sample's metadata. Default none. */
  reference?: (meta: M) => string | undefined;
  /** Maps the verdict to the reward (e.g. `(s) => -s` for a sycophancy judge that says 1 when sycophantic). Default identity. */
  transform?: (score: number) => number;
}

/** A reward source asking `judge` (or a judge built from its options) about each (prompt, completion). */
export function judgeRewardSource<M>(judge: LlmJudge | (Partial<JudgeOptions> & Pick<JudgeOptions, 'baseUrl' | 'model'>), opts: JudgeRewardOptions<M> = {}): RewardSource<M> & { judge: LlmJudge } {
  const j = judge instanceof LlmJudge ? judge : new LlmJudge(judge);
  const transform = opts.transform ?? ((s: number) => s);
  return {
    name: opts.name ?? 'judge',
    weight: opts.weight,
    judge: j,
    fn: async (prompt, completion, meta) => {
      const v = await j.judge({ question: prompt, response: completion, reference: opts.reference?.(meta) });
      if (v.score === null) throw new Error(`the judge at ${j.options.baseUrl} gave no verdict: ${JSON.stringify(v.reply.slice(0, 200))}`);
      return transform(v.score);
    },
  };
}
