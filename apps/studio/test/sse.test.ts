/** The chat page's reading of server-sent events, against hand-split streams (events cut across reads). */
import { splitThinking, sseEvents } from '../src/web/sse';

test('whole events are returned and a cut-off event is kept for the next read', () => {
  expect(sseEvents('data: {"a":1}\n\ndata: {"b":2}\n\ndata: {"c"')).toEqual({ events: ['{"a":1}', '{"b":2}'], rest: 'data: {"c"' });
  expect(sseEvents('data: {"c"' + ':3}\n\ndata: [DONE]\n\n')).toEqual({ events: ['{"c":3}', '[DONE]'], rest: '' });
});

test('CRLF line ends, several data lines joined by a newline, comments and other fields skipped', () => {
  expect(sseEvents('data: x\r\ndata: y\r\n\r\n: keep-alive\n\nevent: ping\ndata:z\n\n')).toEqual({ events: ['x\ny', 'z'], rest: '' });
});

test('a reply split into its thinking and its answer', () => {
  expect(splitThinking('<think>\nadd them\n</think>\n\n4')).toEqual({ reasoning: 'add them', answer: '4' });
  expect(splitThinking('<think>still going')).toEqual({ reasoning: 'still going', answer: '' });
  expect(splitThinking('just 4')).toEqual({ reasoning: '', answer: 'just 4' });
  // the template opened <think> in the prompt: the reply starts inside it
  expect(splitThinking('hmm</think>4')).toEqual({ reasoning: 'hmm', answer: '4' });
});
