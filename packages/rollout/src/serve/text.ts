/**
 * Text of a growing token sequence for streaming: incremental detokenisation (with a byte-level
 * tokenizer, each token's bytes through a streaming UTF-8 decoder, which holds back an incomplete
 * character; otherwise one decode of a short window of recent tokens per token, text held back
 * while it ends in an incomplete character) and stop strings (the text is cut before the first stop string, and while the
 * text ends in a prefix of one, that tail is held back so a stream never shows part of a stop).
 */

import { TextDecoder } from 'node:util';

/** What the server needs of a tokenizer (`HfTokenizer` from @lathe/tokenizer has it). */
export interface ServeTokenizer {
  encode(text: string): number[];
  decode(ids: readonly number[], opts?: { skipSpecialTokens?: boolean }): string;
  /** Renders a conversation with the model's chat template; `enableThinking` is Qwen3's switch. */
  applyChatTemplate(messages: { role: 'system' | 'user' | 'assistant' | 'tool'; content: string }[], opts?: { addGenerationPrompt?: boolean; enableThinking?: boolean }): string;
  readonly hasChatTemplate: boolean;
  readonly eosId: number;
  readonly bosId?: number;
  /** Each id's UTF-8 bytes, where the tokenizer is byte-level (see `HfTokenizer.tokenBytes`): text then needs no decode call per token. */
  tokenBytes?(opts?: { skipSpecialTokens?: boolean }): ((id: number) => Uint8Array | undefined) | undefined;
}

const NO_BYTES = new Uint8Array(0);

/** Tokens decoded together at most, and kept as context when the window moves on (leading spaces, multi-token characters). */
const WINDOW = 6;
const CONTEXT = 2;

/** The growing text of one sample. */
export class IncrementalText {
  private readonly ids: number[] = [];
  private prefix = 0;
  private read = 0;
  /** The text of ids[prefix, read). */
  private before = '';
  /** The text so far (cut before a stop string once one appeared). */
  text = '';
  /** Characters of `text` already handed out by {@link flush}. */
  private sent = 0;
  private stopped = false;
  private readonly longestStop: number;

  private readonly tok: Pick<ServeTokenizer, 'decode'>;
  /** The byte path: each token's bytes, and the decoder that holds an incomplete character back. */
  private readonly bytes: ((id: number) => Uint8Array | undefined) | undefined;
  private readonly utf8: TextDecoder | undefined;

  constructor(
    tok: Pick<ServeTokenizer, 'decode' | 'tokenBytes'>,
    private readonly stops: readonly string[] = [],
  ) {
    this.longestStop = Math.max(0, ...stops.map((s) => s.length));
    this.bytes = tok.tokenBytes?.();
    // ignoreBOM: a U+FEFF the model writes is text, as decode keeps it
    if (this.bytes) this.utf8 = new TextDecoder('utf-8', { ignoreBOM: true });
    // some tokenizers (transformers.js) refuse to decode an empty list
    this.tok = { decode: (ids, o) => (ids.length === 0 ? '' : tok.decode(ids, o)) };
  }

  /** Appends a token; returns true when a stop string now appears (the text is cut before it). */
  push(id: number): boolean {
    if (this.stopped) return true;
    this.ids.push(id);
    const from = this.text.length;
    if (this.utf8) {
      const piece = this.utf8.decode(this.bytes!(id) ?? NO_BYTES, { stream: true });
      this.read = this.ids.length;
      if (!piece) return false;
      this.text += piece;
      return this.cutAtStop(from);
    }
    // One decode per token: the window's text up to `read` is the last decode's, kept while the
    // window start stays put; the start moves (one more decode) once the window is long.
    const now = this.tok.decode(this.ids.slice(this.prefix));
    if (now.length <= this.before.length || now.endsWith('\uFFFD')) return false; // an incomplete character: wait for more
    this.text += now.slice(this.before.length);
    this.read = this.ids.length;
    if (this.read - this.prefix > WINDOW) {
      this.prefix = this.read - CONTEXT;
      this.before = this.tok.decode(this.ids.slice(this.prefix, this.read));
    } else this.before = now;
    return this.cutAtStop(from);
  }

  /** Cuts the text before the first stop string that ends at or after `from`; true when one did. */
  private cutAtStop(from: number): boolean {
    let cut = -1;
    for (const s of this.stops) {
      const at = this.text.indexOf(s, Math.max(0, from - s.length + 1));
      if (at >= 0 && (cut < 0 || at < cut)) cut = at;
    }
    if (cut >= 0) {
      this.text = this.text.slice(0, cut);
      this.stopped = true;
    }
    return this.stopped;
  }

  /**
   * The text not yet handed out. With `final` false, a tail that could still become a stop string
   * is kept back; with `final` true (the sample ended) everything is handed out.
   */
  flush(final: boolean): string {
    if (final && !this.stopped && this.utf8) this.text += this.utf8.decode();
    else if (final && !this.stopped && this.read < this.ids.length) {
      // the sample ended inside a character: hand out what the tokens decode to
      this.text += this.tok.decode(this.ids.slice(this.prefix)).slice(this.before.length);
      this.read = this.ids.length;
    }
    let end = this.text.length;
    if (!final && !this.stopped) {
      for (let k = Math.min(this.longestStop - 1, end); k > 0; k--) {
        const tail = this.text.slice(end - k);
        if (this.stops.some((s) => s.startsWith(tail))) {
          end -= k;
          break;
        }
      }
    }
    const out = this.text.slice(this.sent, Math.max(this.sent, end));
    this.sent = Math.max(this.sent, end);
    return out;
  }
}
