import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import * as arrow from 'apache-arrow';
import { loadConversations, writeParquet } from '@lathe/data';

const dir = mkdtempSync(join(tmpdir(), 'lathe-conv-'));
const jsonl = (name: string, rows: unknown[]) => {
  const file = join(dir, name);
  writeFileSync(file, rows.map((r) => JSON.stringify(r)).join('\n') + '\n');
  return file;
};
const chat = [
  { role: 'system', content: 'Be brief.' },
  { role: 'user', content: 'hi' },
  { role: 'assistant', content: 'yo' },
];

test('conversations from JSONL and from Parquet (a list<struct<role, content>> column) are the same; other string fields go to meta', async () => {
  const file = jsonl('c.jsonl', [{ messages: chat, subject: 'greetings' }, { messages: chat.slice(1) }]);
  const fromJsonl = await loadConversations(file);
  expect(fromJsonl.examples).toEqual([
    { messages: chat, where: `${file}:1`, meta: { subject: 'greetings' } },
    { messages: chat.slice(1), where: `${file}:2` },
  ]);
  const type = new arrow.List(new arrow.Field('item', new arrow.Struct([new arrow.Field('role', new arrow.Utf8(), true), new arrow.Field('content', new arrow.Utf8(), true)]), true));
  const table = new arrow.Table({ messages: arrow.vectorFromArray([chat, chat.slice(1)], type), subject: arrow.vectorFromArray(['greetings', null], new arrow.Utf8()) });
  await writeParquet(join(dir, 'c.parquet'), table);
  const fromParquet = (await loadConversations(join(dir, 'c.parquet'))).examples;
  expect(fromParquet.map((c) => c.where)).toEqual([`${join(dir, 'c.parquet')} row 0`, `${join(dir, 'c.parquet')} row 1`]);
  expect(fromParquet.map(({ where: _, ...c }) => c)).toEqual(fromJsonl.examples.map(({ where: _, ...c }) => c));
});

test('a malformed conversation is an error naming the file, the row and the message', async () => {
  const bad = async (messages: unknown) => loadConversations(jsonl('bad.jsonl', [{ messages: chat }, { messages }]));
  const at = `${join(dir, 'bad.jsonl')}:2`;
  await expect(loadConversations(jsonl('none.jsonl', [{ prompt: 'p', response: 'r' }]))).rejects.toThrow(`none.jsonl:1: field 'messages' is missing`);
  await expect(bad([{ role: 'user', content: 'hi' }])).rejects.toThrow(`${at}: no assistant message in 'messages'`);
  await expect(bad([{ content: 'hi' }, chat[2]])).rejects.toThrow(`${at}: messages[0]: field 'role' is missing`);
  await expect(bad([{ role: 'user' }, chat[2]])).rejects.toThrow(`${at}: messages[0]: field 'content' is missing`);
  await expect(bad([chat[1], { role: 'bot', content: 'yo' }])).rejects.toThrow(`${at}: messages[1]: unknown role "bot" (expected system, user, assistant, tool)`);
  await expect(bad([chat[1], { role: 'assistant', content: 3 }])).rejects.toThrow(`${at}: messages[1]: field 'content' is 3, expected a string`);
  await expect(bad('hi')).rejects.toThrow(`${at}: field 'messages' is "hi", expected a list of {role, content}`);
  await expect(bad([])).rejects.toThrow(`${at}: field 'messages' is empty`);
});
