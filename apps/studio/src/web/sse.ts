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
