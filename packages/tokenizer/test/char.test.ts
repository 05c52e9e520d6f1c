import { CharTokenizer, encodePromptResponse, padSequences, splitThinking, stripThinking } from '@lathe/tokenizer';

const tok = new CharTokenizer({ alphabet: '0123456789+=' });

test('character ids follow the specials, round-trip, and specials are dropped on decode by default', () => {
  expect(tok.vocabSize).toBe(15);
  expect(tok.encode('12+3=')).toEqual([4, 5, 13, 6, 14]);
  expect(tok.encode('7', { addSpecialTokens: true })).toEqual([1, 10, 2]);
  expect(tok.decode([1, 4, 5, 2, 0])).toBe('12');
  expect(tok.decode([1, 4, 2], { skipSpecialTokens: false })).toBe('<bos>1<eos>');
  expect(tok.tokenId('<eos>')).toBe(2);
  expect(tok.tokenId('=')).toBe(14);
});

test('bad input is named: unknown characters, ids, tokens, repeated alphabet', () => {
  expect(() => tok.encode('1x')).toThrow(/character "x" at position 1 of "1x" is not in the alphabet/);
  expect(() => tok.decode([99])).toThrow(/id 99 is outside 0..14/);
  expect(() => tok.tokenId('?')).toThrow(/unknown token "\?"/);
  expect(() => new CharTokenizer({ alphabet: 'abca' })).toThrow(/repeats 'a'/);
});

test('prompt + response ids concatenate with the loss mask on the response and EOS', () => {
  const r = encodePromptResponse(tok, '1+1=', '2', { prependBos: true });
  expect(r.ids).toEqual([1, 4, 13, 4, 14, 5, 2]);
  expect(r.responseMask).toEqual([0, 0, 0, 0, 0, 1, 1]);
  expect(r.promptLength).toBe(5);
  // Given ids are used as they are.
  expect(encodePromptResponse(tok, [4], [5], { appendEos: false }).ids).toEqual([4, 5]);
});

test('left and right padding with masks and extra rows', () => {
  const left = padSequences([[5, 6, 7], [8]], 0, 'left', [[[0, 1, 1], [1]]]);
  expect(left.inputIds).toEqual([[5, 6, 7], [0, 0, 8]]);
  expect(left.attentionMask).toEqual([[1, 1, 1], [0, 0, 1]]);
  expect(left.extras[0]).toEqual([[0, 1, 1], [0, 0, 1]]);
  const right = padSequences([[5, 6, 7], [8]], 0, 'right');
  expect(right.inputIds).toEqual([[5, 6, 7], [8, 0, 0]]);
  expect(right.attentionMask).toEqual([[1, 1, 1], [1, 0, 0]]);
  expect(() => padSequences([[1, 2]], 0, 'left', [[[1]]])).toThrow(/extra 0, row 0 has 1 values for 2 tokens/);
});

test('thinking blocks: split, stripped, and an unclosed block has no answer', () => {
  expect(splitThinking('<think>\nlet me see\n</think>\n\nThe answer is 4.')).toEqual({ thinking: 'let me see', answer: 'The answer is 4.' });
  expect(splitThinking('no thinking here')).toEqual({ thinking: null, answer: 'no thinking here' });
  expect(splitThinking('<think>still going')).toEqual({ thinking: 'still going', answer: null });
  expect(stripThinking('<think>a</think>b')).toBe('b');
  expect(stripThinking('<think>cut off')).toBe('');
});
