/**
 * Hugging Face tokenizers (tokenizer.json + tokenizer_config.json, chat templates) through
 * @huggingface/transformers, from local folders only: Lathe never reaches a model hub.
 */
import { existsSync, readFileSync, statSync } from 'node:fs';
import { join, resolve } from 'node:path';
import type { PreTrainedTokenizer } from '@huggingface/transformers';
import { renderConversation, tokenizeConversation, type ConversationIds } from './chat-training';
import { loadTransformers } from './transformers';
import type { Tokenizer } from './types';

/** A chat message as chat templates take it. */
export interface ChatMessage {
  role: 'system' | 'user' | 'assistant' | 'tool';
  content: string;
}

/** Options of {@link HfTokenizer.applyChatTemplate}. */
export interface ChatTemplateOptions {
  /** End with the assistant's turn opened, ready for generation (default true). */
  addGenerationPrompt?: boolean;
  /** Qwen3's switch: false renders an empty `<think></think>` block so the model answers directly. */
  enableThinking?: boolean;
  /** Use this Jinja template instead of the tokenizer's own. */
  template?: string;
}

/** A tokenizer loaded from a Hugging Face model folder. */
export class HfTokenizer implements Tokenizer {
  readonly vocabSize: number;
  readonly padId: number;
  readonly eosId: number;
  readonly bosId?: number;

  private constructor(
    /** The folder it was loaded from. */
    readonly dir: string,
    private readonly tok: PreTrainedTokenizer,
  ) {
    const vocab = tok.get_vocab() as Map<string, number> | Record<string, number>;
    const ids = vocab instanceof Map ? [...vocab.values()] : Object.values(vocab);
    this.vocabSize = [...ids, ...tok.all_special_ids].reduce((m, id) => Math.max(m, id), -1) + 1;
    const eos = tok.eos_token_id;
    if (eos === undefined || eos === null) throw new Error(`${join(dir, 'tokenizer_config.json')}: no eos_token, so generation could not stop`);
    this.eosId = eos as number;
    // Without a pad token, padding reuses EOS (never attended, never in a loss).
    this.padId = (tok.pad_token_id as number | undefined | null) ?? this.eosId;
    const bos = tok.bos_token_id as number | undefined | null;
    if (bos !== undefined && bos !== null) this.bosId = bos;
  }

  /** Loads tokenizer.json and tokenizer_config.json from `dir`; a missing file is an error naming it. */
  static async fromFolder(dir: string): Promise<HfTokenizer> {
    const abs = resolve(dir);
    if (!existsSync(abs) || !statSync(abs).isDirectory()) throw new Error(`tokenizer folder ${abs} does not exist`);
    for (const f of ['tokenizer.json', 'tokenizer_config.json']) {
      if (!existsSync(join(abs, f))) throw new Error(`tokenizer folder ${abs} has no ${f}`);
    }
    // loaded on first use: transformers.js is large, and most of Lathe never needs it
    const { AutoTokenizer, env } = await loadTransformers();
    env.allowRemoteModels = false;
    env.allowLocalModels = true;
    env.localModelPath = '/';
    let tok: PreTrainedTokenizer;
    try {
      tok = await AutoTokenizer.from_pretrained(abs, { local_files_only: true });
    } catch (e) {
      throw new Error(`tokenizer folder ${abs}: ${(e as Error).message}`);
    }
    return new HfTokenizer(abs, tok);
  }

  encode(text: string, opts: { addSpecialTokens?: boolean } = {}): number[] {
    return this.tok.encode(text, { add_special_tokens: opts.addSpecialTokens ?? false });
  }

  decode(ids: readonly number[], opts: { skipSpecialTokens?: boolean } = {}): string {
    return this.tok.decode([...ids], { skip_special_tokens: opts.skipSpecialTokens ?? true });
  }

  private byteTable: { table: (Uint8Array | undefined)[]; special: Set<number> } | null | undefined;

  /**
   * The UTF-8 bytes each token id decodes to, for byte-level BPE tokenizers (GPT-2, Qwen, Llama 3:
   * `decoder.type` ByteLevel in tokenizer.json), where decoding a sequence is concatenating its
   * tokens' bytes — so text can be built one token at a time with no decode call. Special tokens
   * give no bytes when `skipSpecialTokens` (as {@link decode}). Undefined for other tokenizers.
   */
  tokenBytes(opts: { skipSpecialTokens?: boolean } = {}): ((id: number) => Uint8Array | undefined) | undefined {
    if (this.byteTable === undefined) this.byteTable = readByteTable(join(this.dir, 'tokenizer.json'));
    const t = this.byteTable;
    if (!t) return undefined;
    const skip = opts.skipSpecialTokens ?? true;
    const empty = new Uint8Array(0);
    return (id) => (skip && t.special.has(id) ? empty : t.table[id]);
  }

  tokenId(token: string): number {
    const id = this.tok.convert_tokens_to_ids(token) as number | undefined | null;
    if (id === undefined || id === null) throw new Error(`${this.dir}: unknown token ${JSON.stringify(token)}`);
    return id;
  }

  /** Whether the folder's tokenizer_config.json carries a chat template. */
  get hasChatTemplate(): boolean {
    return Boolean(this.tok.chat_template);
  }

  /** Renders a conversation with the model's chat template (text, not ids). */
  applyChatTemplate(messages: ChatMessage[], opts: ChatTemplateOptions = {}): string {
    if (!opts.template && !this.hasChatTemplate) throw new Error(`${join(this.dir, 'tokenizer_config.json')}: no chat_template (pass one with { template })`);
    const rendered = this.tok.apply_chat_template(messages as never, {
      tokenize: false,
      add_generation_prompt: opts.addGenerationPrompt ?? true,
      ...(opts.template ? { chat_template: opts.template } : {}),
      ...(opts.enableThinking === undefined ? {} : { enable_thinking: opts.enableThinking }),
    });
    return rendered as unknown as string;
  }

  /** Token ids of a rendered conversation (the template's own special tokens included). */
  encodeChat(messages: ChatMessage[], opts: ChatTemplateOptions = {}): number[] {
    return this.encode(this.applyChatTemplate(messages, opts));
  }

  /** The special tokens as text (`<|im_start|>`, `<|im_end|>`, …). */
  get specialTokens(): string[] {
    return [...this.tok.all_special_tokens];
  }

  /**
   * A whole conversation for training: the ids of its rendering (no generation prompt) and a mask
   * that is 1 on the assistant's turns — what the model generates after each turn's generation
   * prompt, through its end-of-turn token (see `renderConversation` in chat-training.ts).
   */
  encodeConversation(messages: ChatMessage[], opts: Omit<ChatTemplateOptions, 'addGenerationPrompt'> = {}): ConversationIds {
    const render = (ms: ChatMessage[], addGenerationPrompt: boolean) => this.applyChatTemplate(ms, { ...opts, addGenerationPrompt });
    return tokenizeConversation(renderConversation(messages, render, this.specialTokens), (t) => this.encode(t), (ids) => this.decode(ids, { skipSpecialTokens: false }));
  }
}

/** GPT-2's byte ↔ printable-character map: bytes that print stand for themselves, the rest shift past 255. */
function byteLevelDecoder(): Map<string, number> {
  const printable = (b: number) => (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
  const map = new Map<string, number>();
  let n = 0;
  for (let b = 0; b < 256; b++) map.set(String.fromCodePoint(printable(b) ? b : 256 + n++), b);
  return map;
}

/** Each id's bytes from a byte-level BPE tokenizer.json, or null when it is not one (or unreadable). */
function readByteTable(file: string): { table: (Uint8Array | undefined)[]; special: Set<number> } | null {
  let j: { decoder?: { type?: string }; model?: { type?: string; vocab?: Record<string, number> }; added_tokens?: { id: number; content: string; special?: boolean }[] };
  try {
    j = JSON.parse(readFileSync(file, 'utf8')) as typeof j;
  } catch {
    return null;
  }
  if (j.decoder?.type !== 'ByteLevel' || j.model?.type !== 'BPE' || !j.model.vocab) return null;
  const chars = byteLevelDecoder();
  const table: (Uint8Array | undefined)[] = [];
  for (const [token, id] of Object.entries(j.model.vocab)) {
    const bytes = new Uint8Array(token.length);
    let k = 0;
    for (const ch of token) {
      const b = chars.get(ch);
      if (b === undefined) return null; // not a byte-level vocabulary after all
      bytes[k++] = b;
    }
    table[id] = bytes.subarray(0, k);
  }
  const special = new Set<number>();
  const utf8 = new TextEncoder();
  for (const a of j.added_tokens ?? []) {
    table[a.id] = utf8.encode(a.content);
    if (a.special) special.add(a.id);
  }
  return { table, special };
}
