import { overlongPenalty, r1ZeroFormatReward, thinkFormatReward } from '@lathe/graders';

describe('thinkFormatReward', () => {
  test.each([
    ['reasoning here</think> answer', 1], // the prompt opened <think>
    ['<think>reasoning</think> answer', 1],
    ['</think> answer', 0], // empty reasoning
    ['no closing tag at all', 0],
    ['a</think> b</think>', 0],
    ['<think>a<think>b</think>', 0],
  ])('%j → %d', (text, expected) => expect(thinkFormatReward(text)).toBe(expected));

  test('without a prompt-opened <think> the response must open it', () => {
    expect(thinkFormatReward('reasoning</think>', { promptEndsWithThink: false })).toBe(0);
    expect(thinkFormatReward('<think>reasoning</think>', { promptEndsWithThink: false })).toBe(1);
  });
});

describe('r1ZeroFormatReward', () => {
  test.each([
    ['2+2 is 4.</think> <answer>4</answer>', 1],
    ['2+2 is 4.</think>\n<answer> 4 </answer><|im_end|>', 1],
    ['2+2 is 4.</think> <answer>4</answer> and more text', 0],
    ['2+2 is 4.</think> <answer></answer>', 0],
    ['2+2 is 4. <answer>4</answer>', 0],
    ['<answer>4</answer>', 0],
  ])('%j → %d', (text, expected) => expect(r1ZeroFormatReward(text)).toBe(expected));
});

describe('overlongPenalty', () => {
  const opts = { maxLength: 100, buffer: 20, maxPenalty: 1 };
  test.each([
    [50, 0],
    [80, 0],
    [90, -0.5],
    [100, -1],
    [150, -1],
  ])('length %d → %d', (length, expected) => expect(overlongPenalty(length, opts)).toBeCloseTo(expected, 12));
  test('bad options are refused', () => expect(() => overlongPenalty(1, { maxLength: 10, buffer: 20, maxPenalty: 1 })).toThrow(/buffer/));
});
