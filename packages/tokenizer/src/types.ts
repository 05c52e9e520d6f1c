/** What every Lathe tokenizer offers: ids in, text out, and the special ids training needs. */
export interface Tokenizer {
  /** Number of ids the model's embedding must cover. */
  readonly vocabSize: number;
  /** Id used for padding (never attended, never in a loss). */
  readonly padId: number;
  /** Id that ends a response (generation stops on it; SFT appends it to responses). */
  readonly eosId: number;
  /** Id prepended to sequences when the model expects one. */
  readonly bosId?: number;
  /** Token ids of `text`; `addSpecialTokens` adds what the tokenizer's post-processor adds (default false). */
  encode(text: string, opts?: { addSpecialTokens?: boolean }): number[];
  /** Text of `ids`; special tokens are dropped unless `skipSpecialTokens` is false (default true). */
  decode(ids: readonly number[], opts?: { skipSpecialTokens?: boolean }): string;
  /** The id of a token by its text (e.g. `<|im_end|>`); an unknown token is an error. */
  tokenId(token: string): number;
}
