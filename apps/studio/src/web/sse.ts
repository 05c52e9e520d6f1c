/** Server-sent events as the chat page reads them (no DOM: unit-tested under Node). */

/** The `data:` payloads of server-sent events in `text`, and the unfinished rest (kept for the next read). */
export function sseEvents(text: string): { events: string[]; rest: string } {
  const blocks = text.split(/\r?\n\r?\n/);
  const rest = blocks.pop() ?? '';
  const events = blocks.flatMap((b) => {
    const data = b
      .split(/\r?\n/)
      .filter((l) => l.startsWith('data:'))
      .map((l) => l.slice(5).replace(/^ /, ''));
    return data.length ? [data.join('\n')] : [];
  });
  return { events, rest };
}

/**
 * A reply's thinking and its answer: the text up to `</think>` (a leading `<think>` dropped) and
 * what follows; a reply still inside an open `<think>` is all thinking; one without tags all answer.
 */
export function splitThinking(text: string): { reasoning: string; answer: string } {
  const close = text.indexOf('</think>');
  const open = /^\s*<think>/.test(text);
  if (close < 0) return open ? { reasoning: text.replace(/^\s*<think>/, '').trim(), answer: '' } : { reasoning: '', answer: text };
  return { reasoning: text.slice(0, close).replace(/^\s*<think>/, '').trim(), answer: text.slice(close + '</think>'.length).replace(/^\s+/, '') };
}
