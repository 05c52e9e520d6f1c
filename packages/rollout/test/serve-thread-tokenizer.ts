/** A one-character-per-id tokenizer for the HTTP-thread tests: the thread loads it from this file by path. */
import type { ServeTokenizer } from '@lathe/rollout';

export const LETTERS = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuv';

/** Id i is the letter LETTERS[i]; no chat template, EOS the last id. */
export async function loadLetterTokenizer(): Promise<ServeTokenizer> {
  return Promise.resolve({
    encode: (text: string) => [...text].map((c) => LETTERS.indexOf(c)),
    decode: (ids: readonly number[]) => ids.map((i) => LETTERS[i] ?? '?').join(''),
    applyChatTemplate: () => {
      throw new Error('no chat template');
    },
    hasChatTemplate: false,
    eosId: LETTERS.length - 1,
  });
}
