/** @lathe/tokenizer — Hugging Face tokenizers and chat templates, a character tokenizer, sequence assembly. */
export * from './types';
export * from './char';
export * from './hf';
export * from './chat-training';
export * from './text';
export * from './qwen';
