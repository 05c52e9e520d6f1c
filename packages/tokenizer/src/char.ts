/**
 * A character-level tokenizer for synthetic tasks (the built-in demo): ids 0, 1, 2 are the pad,
 * BOS and EOS specials, then one id per alphabet character in order.
 */
import type { Tokenizer } from './types';

/** Options of {@link CharTokenizer}. */
export interface CharTokenizerOptions {
  /** The characters, each once; e.g. `'0123456789+='`. */
  alphabet: string;
}

const SPECIALS = ['<pad>', '<bos>', '<eos>'] as const;

/** Character-level tokenizer with pad/bos/eos specials. */
export class CharTokenizer implements Tokenizer {
  readonly padId = 0;
  readonly bosId = 1;
  readonly eosId = 2;
  private readonly chars: string[];
  private readonly ids: Map<string, number>;

  constructor(opts: CharTokenizerOptions) {
    this.chars = [...opts.alphabet];
    if (this.chars.length === 0) throw new Error('CharTokenizer: the alphabet is empty');
    this.ids = new Map(this.chars.map((c, i) => [c, i + SPECIALS.length]));
    if (this.ids.size !== this.chars.length) {
      const repeated = this.chars.find((c, i) => this.chars.indexOf(c) !== i);
      throw new Error(`CharTokenizer: the alphabet repeats '${repeated}'`);
    }
  }

  get vocabSize(): number {
    return this.chars.length + SPECIALS.length;
  }

  /** One id per character; `addSpecialTokens` wraps the ids in BOS … EOS. */
  encode(text: string, opts: { addSpecialTokens?: boolean } = {}): number[] {
    const ids = [...text].map((c, i) => {
      const id = this.ids.get(c);
      if (id === undefined) throw new Error(`CharTokenizer: character ${JSON.stringify(c)} at position ${i} of ${JSON.stringify(text)} is not in the alphabet`);
      return id;
    });
    return opts.addSpecialTokens ? [this.bosId, ...ids, this.eosId] : ids;
  }

  decode(ids: readonly number[], opts: { skipSpecialTokens?: boolean } = {}): string {
    const skip = opts.skipSpecialTokens ?? true;
    return ids
      .map((id) => {
        if (!Number.isInteger(id) || id < 0 || id >= this.vocabSize) throw new Error(`CharTokenizer: id ${id} is outside 0..${this.vocabSize - 1}`);
        if (id < SPECIALS.length) return skip ? '' : SPECIALS[id];
        return this.chars[id - SPECIALS.length];
      })
      .join('');
  }

  tokenId(token: string): number {
    const special = (SPECIALS as readonly string[]).indexOf(token);
    if (special >= 0) return special;
    const id = this.ids.get(token);
    if (id === undefined) throw new Error(`CharTokenizer: unknown token ${JSON.stringify(token)}`);
    return id;
  }
}
