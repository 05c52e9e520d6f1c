import { answerIsAnswer, extractAnswer, gsm8kAnswer, lastBoxed, r1ZeroAnswer, trailingMathSpan } from '@lathe/graders';

describe('lastBoxed', () => {
  test.each([
    ['so \\boxed{5}.', '5'],
    ['\\boxed{1} then \\boxed{2}', '2'],
    ['\\boxed{\\frac{1}{2}}', '\\frac{1}{2}'],
    ['\\boxed{\\left\\{ 1, 2 \\right\\}}', '\\left\\{ 1, 2 \\right\\}'],
    ['\\fbox{x+1}', 'x+1'],
    ['\\boxed 7.', '7'],
    ['$\\boxed{\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}}$', '\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}'],
  ])('%j → %j', (text, expected) => expect(lastBoxed(text)).toBe(expected));

  test.each([['no box here'], ['\\boxed{unclosed'], ['\\boxedx']])('%j has none', (text) => expect(lastBoxed(text)).toBeNull());
});

describe('r1_zero, gsm8k and "the answer is"', () => {
  test('the last <answer> block, preferring a box inside it', () => {
    expect(r1ZeroAnswer('<think>2+2</think> <answer> 4 </answer>')).toBe('4');
    expect(r1ZeroAnswer('<answer>1</answer><answer>The result is \\boxed{9}</answer>')).toBe('9');
    expect(r1ZeroAnswer('<think>no answer tag</think>')).toBeNull();
  });
  test('the last #### line', () => {
    expect(gsm8kAnswer('She pays 3*4=<<3*4=12>>12.\n#### 12')).toBe('12');
    expect(gsm8kAnswer('#### 1,200\n')).toBe('1,200');
    expect(gsm8kAnswer('####   ')).toBeNull();
  });
  test('the answer is …', () => {
    expect(answerIsAnswer('So the answer is 42.')).toBe('42');
    expect(answerIsAnswer('The final answer is $\\frac{3}{4}$. Done.')).toBe('\\frac{3}{4}');
    expect(answerIsAnswer('Final answer: 3.5')).toBe('3.5');
    expect(answerIsAnswer('I think 5 is right')).toBeNull();
  });
  test('a trailing math span ends the text, an earlier one does not count', () => {
    expect(trailingMathSpan('Thus we get $x = 3$.')).toBe('x = 3');
    expect(trailingMathSpan('We get $3$, then we still have to check the other case, which needs a different argument that we have not written down yet at all')).toBeNull();
    expect(trailingMathSpan('We get $3$ and then $x = 4$ follows')).toBe('x = 4');
  });
});

describe('extractAnswer', () => {
  test.each([
    ['auto', 'Work... \\boxed{12}', '12'],
    ['auto', '<think>hm</think><answer>7</answer>', '7'],
    ['auto', 'Tom has 5 apples.\n#### 5', '5'],
    ['auto', '3/4', '3/4'],
    ['auto', '\\begin{pmatrix} 1 & 2 \\end{pmatrix}', '\\begin{pmatrix} 1 & 2 \\end{pmatrix}'],
    ['boxed', '<answer>7</answer>', null],
    ['r1_zero', '\\boxed{7}', null],
    ['gsm8k', '\\boxed{7}', null],
    ['raw', '  \\boxed{7} ', '\\boxed{7}'],
    ['raw', '   ', null],
  ] as const)('%s: %j → %j', (format, text, expected) => expect(extractAnswer(text, format)).toBe(expected));

  test('prose without a marked final answer yields nothing: intermediate values earn no credit', () => {
    expect(extractAnswer('First we compute 3 + 4 = 7 and double it to get 14, then we still have to check the other case, which needs a different argument that we have not written down yet at all')).toBeNull();
    expect(extractAnswer('First we compute $3 + 4 = 7$ and double it to get $14$, then we still have to check the other case, which needs a different argument that we have not written down yet at all')).toBeNull();
  });
});

describe('auto extraction of free-form answers', () => {
  test.each([
    ['Answer: $9$', '9'],
    ['Therefore $x \\geq 5$ is the solution.', 'x \\geq 5'],
    ['so the number is 10 which is 1,000.99m²', '1,000.99'],
    ['The answer is 42. <|im_start|>user\nNext question 7', '42'],
    ['\\boxed{1} and \\boxed{2} and \\boxed{3}', '1, 2, 3'],
    ['$y_1 = \\boxed{5}$ and $y_2 = \\boxed{7}$', '5, 7'],
    ['earlier \\boxed{255}. Final Answer: The final answer is $10,455$. I hope it is correct.', '10,455'],
    ['Final Answer: The largest $n$ is 34.', '34'],
    ['It increases by 100 percent.', '100%'],
  ])('%j → %j', (text, expected) => expect(extractAnswer(text)).toBe(expected));

  test.each([
    ['AZYUK2A'], // a digit inside a word is not a number
    ['Answer $ \n 9 \n $'], // inline math does not span lines
    ['\\boxed{1} but that is wrong, so instead \\boxed{2}'],
  ])('%j is not taken whole as a number', (text) => {
    const got = extractAnswer(text);
    expect(got === null || !/^\d$/.test(got) || text.includes('instead')).toBe(true);
  });
});

describe('the final part of a response', () => {
  test('an answer written inside the reasoning block is not the final answer', () => {
    expect(extractAnswer('<think>so it is \\boxed{42}</think> I am not sure.')).toBeNull();
    expect(extractAnswer('<think>maybe \\boxed{42}</think> Final: \\boxed{43}')).toBe('43');
    expect(extractAnswer('<think>maybe \\boxed{42}</think>', 'boxed')).toBeNull();
  });
  test('only what follows the last </think> counts, with or without an opening tag', () => {
    expect(extractAnswer('reasoning </think> \\boxed{7}')).toBe('7');
    expect(extractAnswer('<think>a</think><think>b \\boxed{1}</think>\\boxed{2}')).toBe('2');
  });
  test('a response without </think> is read whole', () => {
    expect(extractAnswer('<think> unfinished reasoning \\boxed{5}')).toBe('5');
  });
  test('opening special tokens are dropped, trailing turns cut', () => {
    expect(extractAnswer('<|im_start|>assistant\nSo \\boxed{42}<|im_end|>')).toBe('42');
    expect(extractAnswer('<|im_start|>Answer: \\boxed{42}<|im_end|>\n<|im_start|>user\n\\boxed{7}')).toBe('42');
  });
});

describe('answer lines', () => {
  test('"Answer:" or "Answer is" at the start of any line; the last one wins', () => {
    expect(extractAnswer('Answer: 41 was a guess.\nAnswer: 42')).toBe('42');
    expect(extractAnswer('We simplify.\nAnswer is 0.25 + 3')).toBe('0.25 + 3');
    expect(answerIsAnswer('answer is 12')).toBe('12');
  });
  test('"answer" inside a sentence is not a marker', () => {
    expect(answerIsAnswer('We check our answer 5 twice')).toBeNull();
  });
});
