/**
 * The chat page: one or two models side by side (a base model and its trained checkpoint), the
 * same message sent to both through `lathe serve`'s OpenAI-compatible API, with thinking on/off and
 * the sampling settings. Each side picks a served model or any checkpoint of any run under the
 * root (served on first use), and replies stream in token by token (server-sent events).
 */
import { api, errorBox, h } from './dom';
import { splitThinking, sseEvents } from './sse';
import type { StudioSettings } from './main';

type Message = { role: 'user' | 'assistant'; content: string };
interface Completion {
  choices: { message: { content: string; reasoning_content?: string | null }; finish_reason: string }[];
  usage?: { completion_tokens: number };
}
/** One server-sent event of a streamed chat completion. */
interface Chunk {
  choices: { delta: { content?: string; reasoning_content?: string }; finish_reason: string | null }[];
  usage?: { completion_tokens: number };
  error?: { message: string };
}
interface Checkpoint {
  id: string;
  run: string;
  step: number;
  dir: string;
  servable: boolean;
  why?: string;
}

/** POSTs a streamed chat completion, calling `onChunk` per event; throws the error the server sends. */
async function streamChat(body: unknown, onChunk: (c: Chunk) => void): Promise<void> {
  const r = await fetch('/api/chat/completions', { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
  if (!r.ok || !(r.headers.get('content-type') ?? '').startsWith('text/event-stream') || !r.body) {
    const j = (await r.json().catch(() => ({}))) as { error?: string | { message?: string } };
    throw new Error(typeof j.error === 'string' ? j.error : (j.error?.message ?? `chat: HTTP ${r.status}`));
  }
  const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = '';
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    const { events, rest } = sseEvents(buffer + value);
    buffer = rest;
    for (const e of events) {
      if (e === '[DONE]') return;
      const chunk = JSON.parse(e) as Chunk;
      if (chunk.error) throw new Error(chunk.error.message);
      onChunk(chunk);
    }
  }
}

export async function chatPage(view: HTMLElement, settings: StudioSettings): Promise<void> {
  view.append(h('h2', {}, 'Chat'), settings.serveUrl ? h('div', { class: 'muted', id: 'serve-url' }, `through ${settings.serveUrl} (--serve_url): its models, as GET /models lists them`) : '');
  if (!settings.chat) {
    view.append(h('div', { class: 'panel muted' }, 'Chat is off: start lathe studio with --model DIR (a checkpoint folder, repeatable) or --serve_url http://HOST:PORT/v1, or leave --chat_checkpoints on to chat with the runs’ checkpoints.'));
    return;
  }
  // the served models: --model's, or every model the --serve_url server lists at GET /v1/models
  const listed = (await api<{ data: { id: string; max_model_len?: number }[] }>('/api/chat/models')).data;
  const models = listed.map((m) => m.id);
  const checkpoints = await api<Checkpoint[]>('/api/chat/checkpoints');
  const runs = [...new Set(checkpoints.map((c) => c.run))];
  if (models.length === 0 && !checkpoints.some((c) => c.servable)) {
    view.append(h('div', { class: 'panel muted', id: 'no-models' }, settings.serveUrl ? `No model to chat with: ${settings.serveUrl} lists none at GET /models.` : 'No model to chat with: no --model, and no run under the root has a checkpoint with tokenizer files.'));
    return;
  }
  const temperature = h('input', { type: 'number', id: 'temperature', min: 0, step: 0.1, value: 0.7 });
  const topP = h('input', { type: 'number', id: 'top_p', min: 0, max: 1, step: 0.05, value: 1 });
  const maxTokens = h('input', { type: 'number', id: 'max_tokens', min: 1, value: 64 });
  const seed = h('input', { type: 'number', id: 'seed', value: 0 });
  const thinking = h('input', { type: 'checkbox', id: 'thinking' });
  const stream = h('input', { type: 'checkbox', id: 'stream', checked: true });
  const choices = () => [
    ...(models.length ? [h('optgroup', { label: settings.serveUrl ? `models at ${settings.serveUrl}` : 'served models' }, listed.map((m) => h('option', { value: m.id, title: m.max_model_len ? `context ${m.max_model_len} tokens` : m.id }, m.id)))] : []),
    // every checkpoint of every run: one that cannot be served is listed, disabled, with the reason
    ...runs.map((run) =>
      h(
        'optgroup',
        { label: run },
        checkpoints.filter((c) => c.run === run).map((c) => h('option', { value: `checkpoint:${c.id}`, disabled: !c.servable, title: c.why ?? c.dir }, `${run} · step ${c.step}${c.servable ? '' : ' (cannot chat)'}`)),
      ),
    ),
  ];
  const servable = [...models, ...checkpoints.filter((c) => c.servable).map((c) => `checkpoint:${c.id}`)];
  const two = h('input', { type: 'checkbox', id: 'two', checked: servable.length > 1 });
  const panes = h('div', { class: 'chatpanes' });
  const state = [0, 1].map((i) => ({ model: h('select', { class: 'model', id: `model-${i}` }, choices()), log: h('div', { class: 'log', id: `log-${i}` }), history: [] as Message[] }));
  // by default: the first served model (or checkpoint) on the left, the last one on the right
  state[0].model.value = servable[0];
  state[1].model.value = servable[servable.length - 1];
  const layout = () => panes.replaceChildren(...state.slice(0, two.checked ? 2 : 1).map((s) => h('div', { class: 'panel' }, h('label', {}, 'model ', s.model), s.log)));
  two.addEventListener('change', layout);
  layout();
  const input = h('textarea', { id: 'message', rows: 3, style: 'width: 100%', placeholder: 'Message (Enter sends, Shift+Enter a new line)' });
  const send = h('button', { id: 'send', type: 'submit' }, 'Send');
  const label = (s: (typeof state)[number]) => s.model.selectedOptions[0]?.textContent ?? s.model.value;
  const ask = async (s: (typeof state)[number], text: string) => {
    s.history.push({ role: 'user', content: text });
    s.log.append(h('div', { class: 'msg user' }, text));
    const pending = h('div', { class: 'msg assistant muted' }, '…');
    s.log.append(pending);
    const body = {
      model: s.model.value,
      messages: s.history,
      temperature: Number(temperature.value),
      top_p: Number(topP.value),
      max_tokens: Number(maxTokens.value),
      seed: Number(seed.value),
      chat_template_kwargs: { enable_thinking: thinking.checked },
    };
    const done = (content: string, reasoning: string, finish: string, tokens: number | string) => {
      s.history.push({ role: 'assistant', content });
      // the thinking (a server's reasoning_content, or the text up to </think>) apart from the answer
      const shown = reasoning ? { reasoning, answer: content } : splitThinking(content);
      return h('div', { class: 'msg assistant', 'data-finish': finish }, shown.reasoning ? h('div', { class: 'muted thinking' }, shown.reasoning) : null, h('span', { class: 'content' }, shown.answer || '(empty)'), h('div', { class: 'muted' }, `${label(s)} · ${tokens} tokens · ${finish}`));
    };
    try {
      if (!stream.checked) {
        const r = await api<Completion>('/api/chat/completions', body);
        const c = r.choices[0];
        pending.replaceWith(done(c.message.content, c.message.reasoning_content ?? '', c.finish_reason, r.usage?.completion_tokens ?? '?'));
        return;
      }
      // streamed: the reply grows in place as tokens arrive; data-chunks counts the events shown
      const content = h('span', { class: 'content' });
      const reasoning = h('div', { class: 'muted' });
      const live = h('div', { class: 'msg assistant streaming', 'data-chunks': 0 }, reasoning, content);
      pending.replaceWith(live);
      let [text, thought, finish, tokens, chunks] = ['', '', 'stop', '?' as number | string, 0];
      await streamChat({ ...body, stream: true }, (c) => {
        const ch = c.choices[0];
        if (ch) {
          text += ch.delta.content ?? '';
          thought += ch.delta.reasoning_content ?? '';
          if (ch.finish_reason) finish = ch.finish_reason;
          const shown = thought ? { reasoning: thought, answer: text } : splitThinking(text);
          content.textContent = shown.answer;
          reasoning.textContent = shown.reasoning;
          live.setAttribute('data-chunks', String(++chunks));
        }
        if (c.usage) tokens = c.usage.completion_tokens;
      });
      live.replaceWith(done(text, thought, finish, tokens));
    } catch (e) {
      s.history.pop();
      s.log.querySelector('.msg.assistant.streaming')?.remove();
      if (pending.isConnected) pending.replaceWith(errorBox(e));
      else s.log.append(errorBox(e));
    }
  };
  const submit = async () => {
    const text = input.value.trim();
    if (!text) return;
    input.value = '';
    send.disabled = true;
    await Promise.all(state.slice(0, two.checked ? 2 : 1).map((s) => ask(s, text)));
    send.disabled = false;
  };
  input.addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && !e.shiftKey) {
      e.preventDefault();
      void submit();
    }
  });
  const clear = h('button', { type: 'button', onclick: () => state.forEach((s) => ((s.history = []), s.log.replaceChildren())) }, 'Clear');
  view.append(
    h(
      'div',
      { class: 'panel row' },
      h('label', {}, 'temperature', temperature),
      h('label', {}, 'top_p', topP),
      h('label', {}, 'max tokens', maxTokens),
      h('label', {}, 'seed', seed),
      h('label', {}, h('span', {}, thinking, ' thinking')),
      h('label', {}, h('span', {}, stream, ' stream')),
      h('label', {}, h('span', {}, two, ' two models side by side')),
    ),
    panes,
    h('form', { class: 'panel', onsubmit: (e) => (e.preventDefault(), void submit()) }, input, h('div', { class: 'row' }, send, clear)),
  );
}
