/**
 * Conversations for training: a message list rendered with the model's own chat template (thinking
 * blocks, system turns and end-of-turn tokens exactly as the template writes them), with the
 * assistant's turns marked so a loss can cover only them (TRL's `assistant_only_loss`).
 *
 * An assistant turn is what the model would generate there: from the end of the template's
 * generation prompt for that turn (`<|im_start|>assistant\n` in ChatML) to the end of the
 * message's rendering, its end-of-turn token (`<|im_end|>`) and the line breaks after it included —
 * the span TRL's training templates wrap in `{% generation %}`. Chat templates carry no such
 * markers, so the spans are found by rendering: the start as the common prefix of the conversation
 * and the conversation before the turn with the generation prompt added; the end of the content by
 * rendering once more with a private-use character appended to the message (where the two
 * renderings first differ).
 */
import type { ChatMessage } from './hf';

/** Renders messages with a chat template: the whole conversation, or with the assistant's next turn opened. */
export type ChatRender = (messages: ChatMessage[], addGenerationPrompt: boolean) => string;

/** A rendered conversation and the [start, end) character ranges of its assistant turns. */
export interface RenderedConversation {
  text: string;
  assistantSpans: [number, number][];
}

/** A tokenized conversation: ids and a 0/1 mask that is 1 on the assistant turns' tokens. */
export interface ConversationIds {
  ids: number[];
  assistantMask: number[];
}

/** Appended to an assistant message to find where its content ends in the rendering (Unicode private use: never in real text). */
const CONTENT_END = '\uE000';

function commonPrefix(a: string, b: string): number {
  const n = Math.min(a.length, b.length);
  let i = 0;
  while (i < n && a.charCodeAt(i) === b.charCodeAt(i)) i++;
  return i;
}

/**
 * Renders a conversation and finds its assistant turns (see the module comment). `endOfTurn`: the
 * tokenizer's special tokens; the one that directly follows a turn's content (after optional
 * whitespace, e.g. `<|im_end|>`, `<|eot_id|>`, `</s>`) belongs to the turn, with the line breaks
 * after it. A template that drops an assistant message (or renders it nowhere) is an error naming
 * the message.
 */
export function renderConversation(messages: readonly ChatMessage[], render: ChatRender, endOfTurn: readonly string[]): RenderedConversation {
  const all = [...messages];
  const text = render(all, false);
  const specials = [...endOfTurn].filter((s) => s.length > 0).sort((a, b) => b.length - a.length);
  const assistantSpans: [number, number][] = [];
  let from = 0;
  all.forEach((m, i) => {
    if (m.role !== 'assistant') return;
    const marked = all.map((x, k) => (k === i ? { ...x, content: x.content + CONTENT_END } : x));
    const withMark = render(marked, false);
    if (withMark === text) throw new Error(`message ${i} (assistant): the chat template does not render its content, so its tokens cannot be marked`);
    const contentEnd = commonPrefix(text, withMark);
    let start: number;
    try {
      start = commonPrefix(text, render(all.slice(0, i), true));
    } catch {
      // a template that cannot render the messages before this one (e.g. none): the turn starts where its content does
      start = commonPrefix(text, render(all.map((x, k) => (k === i ? { ...x, content: CONTENT_END + x.content } : x)), false));
    }
    if (start < from || start > contentEnd) throw new Error(`message ${i} (assistant): its turn could not be located in the rendered conversation (the chat template renders earlier messages differently once it is added)`);
    let end = contentEnd;
    const rest = text.slice(contentEnd);
    const lead = /^\s*/.exec(rest)![0].length;
    const closer = specials.find((s) => rest.startsWith(s, lead));
    if (closer) {
      end = contentEnd + lead + closer.length;
      while (text[end] === '\n' || text[end] === '\r') end++;
    }
    assistantSpans.push([start, end]);
    from = end;
  });
  return { text, assistantSpans };
}

/**
 * Token ids of a rendered conversation with its assistant mask. The text is encoded in pieces cut
 * at the spans' ends, so each token lies wholly inside or outside a turn; when the pieces' ids
 * differ from the whole text's (a tokenizer that merges across a cut or adds a prefix per call),
 * the whole text's ids are used and each cut goes to the first token ending at or after it
 * (`decode` must then reproduce the text).
 */
export function tokenizeConversation(
  { text, assistantSpans }: RenderedConversation,
  encode: (text: string) => number[],
  decode: (ids: readonly number[]) => string,
): ConversationIds {
  const cuts = [0, ...assistantSpans.flat(), text.length];
  const ids: number[] = [];
  const assistantMask: number[] = [];
  for (let k = 0; k + 1 < cuts.length; k++) {
    const piece = cuts[k] < cuts[k + 1] ? encode(text.slice(cuts[k], cuts[k + 1])) : [];
    ids.push(...piece);
    assistantMask.push(...piece.map(() => k % 2));
  }
  const whole = encode(text);
  if (whole.length === ids.length && whole.every((id, i) => id === ids[i])) return { ids, assistantMask };
  if (decode(whole) !== text) throw new Error('the tokenizer does not decode the rendered conversation back to its text, so assistant tokens cannot be marked');
  // the token index where each cut falls: the first k whose decoded prefix reaches the cut
  const tokenAt = (chars: number) => {
    let lo = 0;
    let hi = whole.length;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (decode(whole.slice(0, mid)).length >= chars) hi = mid;
      else lo = mid + 1;
    }
    return lo;
  };
  const mask = whole.map(() => 0);
  for (const [s, e] of assistantSpans) for (let t = tokenAt(s), end = tokenAt(e); t < end; t++) mask[t] = 1;
  return { ids: whole, assistantMask: mask };
}
