/**
 * The tokenizer loader of `lathe serve`'s HTTP thread: it loads each model's Hugging Face tokenizer
 * itself (a tokenizer object cannot cross threads). Imports only @lathe/tokenizer, so that the
 * thread loads this file and not the device's packages.
 */
import { HfTokenizer } from '@lathe/tokenizer';

/** The tokenizer of `folder` (tokenizer.json + tokenizer_config.json), its per-token byte table built. */
export async function loadServeTokenizer(folder: string): Promise<HfTokenizer> {
  const tokenizer = await HfTokenizer.fromFolder(folder);
  tokenizer.tokenBytes(); // built now rather than in the first request
  return tokenizer;
}
