/**
 * Preference pairs in each form they come in: HH-RLHF transcripts (read as chat turns), prompt /
 * chosen / rejected texts, TRL's conversational messages and Parquet; bad rows are errors naming
 * the file and row; identical responses are skipped and reported.
 */
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { batchOf, loadPreferencePairs, parseTranscript, readJsonlAll, scalarData, transcriptOf, writeParquet } from '@lathe/data';

const dir = mkdtempSync(path.join(tmpdir(), 'lathe-preference-'));
const jsonl = (name: string, rows: unknown[]) => {
  const file = path.join(dir, name);
  writeFileSync(file, rows.map((r) => JSON.stringify(r)).join('\n') + '\n');
  return file;
};

test('an HH-RLHF transcript becomes chat turns; the open assistant turn is left out; other text is not a transcript', () => {
  const prompt = '\n\nHuman: hi there\n\nAssistant: hello!\n\nHuman:  2+2?\n\nAssistant:';
  const turns = [
    { role: 'user', content: 'hi there' },
    { role: 'assistant', content: 'hello!' },
    { role: 'user', content: '2+2?' },
  ];
  expect(parseTranscript(prompt)).toEqual(turns);
  expect(parseTranscript(transcriptOf(parseTranscript(prompt)!))).toEqual(turns);
  expect(parseTranscript('Human: hi\n\nAssistant:')).toBeNull();
  expect(parseTranscript('\n\nHuman: hi\n\nAssistant: done')).toBeNull();
});

test('the three row forms; margins kept; identical responses skipped and reported', async () => {
  const file = jsonl('mixed.jsonl', [
    { chosen: '\n\nHuman: 2+2?\n\nAssistant: 4', rejected: '\n\nHuman: 2+2?\n\nAssistant: 5', margin: 2 },
    { prompt: '3+4=', chosen: '7', rejected: '8' },
    { prompt: [{ role: 'system', content: 'be brief' }, { role: 'user', content: 'hi' }], chosen: [{ role: 'assistant', content: 'hello' }], rejected: [{ role: 'assistant', content: 'go away' }] },
    { chosen: [{ role: 'user', content: 'q' }, { role: 'assistant', content: 'a' }], rejected: [{ role: 'user', content: 'q' }, { role: 'assistant', content: 'b' }] },
    { prompt: '1+1=', chosen: '2', rejected: '2' },
  ]);
  const { examples, report } = await loadPreferencePairs(file);
  expect(examples.map((e) => [e.turns, e.chosen, e.rejected, e.margin, e.where])).toEqual([
    [[{ role: 'user', content: '2+2?' }], ' 4', ' 5', 2, `${file}:1`],
    [[{ role: 'user', content: '3+4=' }], '7', '8', undefined, `${file}:2`],
    [[{ role: 'system', content: 'be brief' }, { role: 'user', content: 'hi' }], 'hello', 'go away', undefined, `${file}:3`],
    [[{ role: 'user', content: 'q' }], 'a', 'b', undefined, `${file}:4`],
  ]);
  expect(examples[0].prompt).toBe('\n\nHuman: 2+2?\n\nAssistant:');
  expect(report).toMatchObject({ read: 5, loaded: 4, skipped: [{ where: `${file}:5`, reason: 'chosen and rejected responses are identical' }] });
});

test('a missing field, an unreadable transcript, a bad margin or message: errors naming the file and row', async () => {
  const cases: [unknown, RegExp][] = [
    [{ chosen: '\n\nHuman: a\n\nAssistant: b' }, /:2: field 'rejected' is missing/],
    [{ chosen: 'Human: a Assistant: b', rejected: 'Human: a Assistant: c' }, /:2: the 'chosen' and 'rejected' transcripts share no "Assistant:" turn/],
    [{ chosen: 'intro\n\nHuman: a\n\nAssistant: b', rejected: 'intro\n\nHuman: a\n\nAssistant: c' }, /:2: cannot read field 'chosen' as an HH-RLHF transcript .* it begins "intro/],
    [{ prompt: 'p', chosen: 'a', rejected: 'b', margin: 'big' }, /:2: field 'margin' is "big", expected a finite number/],
    [{ prompt: [{ role: 'robot', content: 'x' }], chosen: 'a', rejected: 'b' }, /:2: field 'prompt' message 0 is .*expected \{"role"/],
    [{ chosen: [{ role: 'user', content: 'q' }, { role: 'assistant', content: 'a' }], rejected: [{ role: 'user', content: 'r' }, { role: 'assistant', content: 'b' }] }, /:2: the 'chosen' and 'rejected' conversations differ before their last message/],
  ];
  for (const [row, error] of cases) {
    const file = jsonl('bad.jsonl', [{ prompt: 'ok', chosen: 'a', rejected: 'b' }, row]);
    await expect(loadPreferencePairs(file)).rejects.toThrow(error);
    await expect(loadPreferencePairs(file)).rejects.toThrow(file);
  }
});

test('Parquet rows are read as JSONL rows are, errors naming the row', async () => {
  const file = path.join(dir, 'pairs.parquet');
  await writeParquet(file, [batchOf([{ name: 'prompt', data: scalarData('string', ['3+4=', '1+2=']) }, { name: 'chosen', data: scalarData('string', ['7', '3']) }, { name: 'rejected', data: scalarData('string', ['8', '4']) }])]);
  const { examples } = await loadPreferencePairs(file);
  expect(examples.map((e) => [e.prompt, e.chosen, e.rejected, e.where])).toEqual([
    ['3+4=', '7', '8', `${file} row 0`],
    ['1+2=', '3', '4', `${file} row 1`],
  ]);
  const bad = path.join(dir, 'bad.parquet');
  await writeParquet(bad, [batchOf([{ name: 'prompt', data: scalarData('string', ['3+4=']) }, { name: 'chosen', data: scalarData('string', ['7']) }])]);
  await expect(loadPreferencePairs(bad)).rejects.toThrow(`${bad} row 0: field 'rejected' is missing`);
});

test("HH-RLHF slice (fixtures): every prompt reads as turns starting with the user's, each found in order in the transcript", async () => {
  const file = path.resolve(__dirname, '../../../fixtures/datasets/hh-rlhf-harmless-base-test-head40.jsonl.gz');
  const raw = (await readJsonlAll(file)).map((r) => r.value as { chosen: string });
  const { examples } = await loadPreferencePairs(file);
  expect(examples.length).toBeGreaterThan(30);
  for (const e of examples) {
    expect(e.turns[0].role).toBe('user');
    // each turn's text is in the original transcript, in order
    let at = 0;
    for (const t of e.turns) {
      const found = raw[Number(e.id)].chosen.indexOf(t.content, at);
      expect(found).toBeGreaterThanOrEqual(at);
      at = found + t.content.length;
    }
  }
});
