/** The in-context format against sequences built by hand. */
import { contextPrefix, criticExamples, feedbackText, labelledTokenCount, type CriticAttempt, type CriticBins } from '@lathe/critic';

const bins: CriticBins = { reward_values: [0, 1], length_edges: [0, 1, 2, 4, 8], first_token_id: 56 };
// Feedback text as one token per character, 1000 + char code, so sequences read back by hand.
const encode = (text: string) => [...text].map((c) => 1000 + c.charCodeAt(0));
const fb = (reward: number, length: number) => encode(feedbackText(reward, length));
const prompt = [1, 2];
const attempts: CriticAttempt[] = [
  { tokens: [10, 11, 12], reward: 1 },
  { tokens: [20, 21], reward: 0 },
  { tokens: [30], reward: 1 },
];
// Labels by hand: reward 1, T = 3: remaining 2, 1, 0 → bins 2, 1, 0 → cells 6, 5, 4; reward 0, T = 2: 1, 0 → 1, 0; reward 1, T = 1: 0 → 4.
const L0 = [6, 5, 4];
const L1 = [1, 0];
const L2 = [4];
const none = (n: number) => Array.from({ length: n }, () => -1);

describe('critic in-context format', () => {
  test('feedback text', () => {
    expect(feedbackText(1, 3)).toBe('Reward: 1\nLength: 3\n');
    expect(feedbackText(0.25, 12)).toBe('Reward: 0.25\nLength: 12\n');
  });

  test('full: one sequence, every attempt a target and then context with its feedback', () => {
    const { examples, skipped } = criticExamples(prompt, attempts, { bins, encode });
    expect(skipped).toBe(0);
    expect(examples).toEqual([
      {
        ids: [1, 2, 10, 11, 12, ...fb(1, 3), 20, 21, ...fb(0, 2), 30],
        labels: [-1, -1, ...L0, ...none(fb(1, 3).length), ...L1, ...none(fb(0, 2).length), ...L2],
      },
    ]);
    expect(labelledTokenCount(examples)).toBe(6);
  });

  test('supervise_from_trajectory 2: the first two attempts are context only', () => {
    const { examples } = criticExamples(prompt, attempts, { bins, encode, superviseFrom: 2 });
    expect(examples[0].labels).toEqual([-1, -1, ...none(3 + fb(1, 3).length + 2 + fb(0, 2).length), ...L2]);
  });

  test('no_feedback: attempts back to back', () => {
    const { examples } = criticExamples(prompt, attempts, { bins, encode, ablation: 'no_feedback' });
    expect(examples).toEqual([{ ids: [1, 2, 10, 11, 12, 20, 21, 30], labels: [-1, -1, ...L0, ...L1, ...L2] }]);
  });

  test('no_ans: each target after the earlier feedback only', () => {
    const { examples } = criticExamples(prompt, attempts, { bins, encode, ablation: 'no_ans', superviseFrom: 1 });
    expect(examples).toEqual([
      { ids: [1, 2, ...fb(1, 3), 20, 21], labels: [-1, -1, ...none(fb(1, 3).length), ...L1] },
      { ids: [1, 2, ...fb(1, 3), ...fb(0, 2), 30], labels: [-1, -1, ...none(fb(1, 3).length + fb(0, 2).length), ...L2] },
    ]);
  });

  test('no_context: each target after the prompt alone', () => {
    const { examples } = criticExamples(prompt, attempts, { bins, encode, ablation: 'no_context' });
    expect(examples).toEqual([
      { ids: [1, 2, 10, 11, 12], labels: [-1, -1, ...L0] },
      { ids: [1, 2, 20, 21], labels: [-1, -1, ...L1] },
      { ids: [1, 2, 30], labels: [-1, -1, ...L2] },
    ]);
  });

  test('max length: a full sequence closes and the next starts with the prompt; an attempt too long alone is skipped and counted', () => {
    const long: CriticAttempt[] = [{ tokens: [40, 41, 42, 43, 44, 45, 46, 47], reward: 0 }, ...attempts];
    const { examples, skipped } = criticExamples(prompt, long, { bins, encode, ablation: 'no_feedback', maxLength: 6 });
    expect(skipped).toBe(1);
    expect(examples).toEqual([
      { ids: [1, 2, 10, 11, 12], labels: [-1, -1, ...L0] },
      { ids: [1, 2, 20, 21, 30], labels: [-1, -1, ...L1, ...L2] },
    ]);
  });

  test('the inference prefix is the full format up to the target', () => {
    const full = criticExamples(prompt, attempts, { bins, encode }).examples[0].ids;
    const prefix = contextPrefix(prompt, attempts.slice(0, 2), encode);
    expect(full.slice(0, prefix.length)).toEqual(prefix);
    expect(full.slice(prefix.length)).toEqual([30]);
  });

  test('a reward outside [0, 1] names the attempt', () => {
    expect(() => criticExamples(prompt, [{ tokens: [5], reward: 2 }], { bins, encode, where: 'row 7' })).toThrow('row 7, attempt 0: 2 is outside [0, 1]');
  });

  test('an attempt longer than the length bins names the value', () => {
    expect(() => criticExamples(prompt, [{ tokens: Array.from({ length: 9 }, () => 5), reward: 1 }], { bins, encode })).toThrow('attempts, attempt 0: 8 is not covered by the length bins');
  });
});
