/** Qwen2/Qwen3 special-token ids (tokenizer.json `added_tokens`), checked against the real tokenizer in tests. */
export const QWEN_SPECIAL_IDS = {
  endOfText: 151643,
  imStart: 151644,
  imEnd: 151645,
  thinkStart: 151667,
  thinkEnd: 151668,
} as const;
