/**
 * The chat page: one or two models side by side (a base model and its trained checkpoint), the
 * same message sent to both through `lathe serve`'s OpenAI-compatible API, with thinking on/off and
 * the sampling settings.
 */
import { api, errorBox, h } from './dom';
import type { StudioSettings } from './main';

type Message = { role: 'user' | 'assistant'; content: string };
interface Completion {
  choices: { message: { content: string; reasoning_content?: string | null }; finish_reason: string }[];
  usage?: { completion_tokens: number };
}

export async function chatPage(view: HTMLElement, settings: StudioSettings): Promise<void> {
  view.append(h('h2', {}, 'Chat'));
  if (!settings.chat) {
    view.append(h('div', { class: 'panel muted' }, 'Chat is off: start lathe studio with --model DIR (a checkpoint folder, repeatable) or --serve_url http://HOST:PORT/v1.'));
    return;
  }
  const models = (await api<{ data: { id: string }[] }>('/api/chat/models')).data.map((m) => m.id);
  const temperature = h('input', { type: 'number', id: 'temperature', min: 0, step: 0.1, value: 0.7 });
  const topP = h('input', { type: 'number', id: 'top_p', min: 0, max: 1, step: 0.05, value: 1 });
  const maxTokens = h('input', { type: 'number', id: 'max_tokens', min: 1, value: 64 });
  const seed = h('input', { type: 'number', id: 'seed', value: 0 });
  const thinking = h('input', { type: 'checkbox', id: 'thinking' });
  const two = h('input', { type: 'checkbox', id: 'two', checked: models.length > 1 });
  const panes = h('div', { class: 'chatpanes' });
  const state = [0, 1].map((i) => ({ model: h('select', { class: 'model', id: `model-${i}` }, models.map((m) => h('option', { value: m }, m))), log: h('div', { class: 'log', id: `log-${i}` }), history: [] as Message[] }));
  if (models.length > 1) state[1].model.value = models[1];
  const layout = () => panes.replaceChildren(...state.slice(0, two.checked ? 2 : 1).map((s) => h('div', { class: 'panel' }, h('label', {}, 'model ', s.model), s.log)));
  two.addEventListener('change', layout);
  layout();
  const input = h('textarea', { id: 'message', rows: 3, style: 'width: 100%', placeholder: 'Message (Enter sends, Shift+Enter a new line)' });
  const send = h('button', { id: 'send', type: 'submit' }, 'Send');
  const ask = async (s: (typeof state)[number], text: string) => {
    s.history.push({ role: 'user', content: text });
    s.log.append(h('div', { class: 'msg user' }, text));
    const pending = h('div', { class: 'msg assistant muted' }, '…');
    s.log.append(pending);
    try {
      const body = {
        model: s.model.value,
        messages: s.history,
        temperature: Number(temperature.value),
        top_p: Number(topP.value),
        max_tokens: Number(maxTokens.value),
        seed: Number(seed.value),
        chat_template_kwargs: { enable_thinking: thinking.checked },
      };
      const r = await api<Completion>('/api/chat/completions', body);
      const c = r.choices[0];
      s.history.push({ role: 'assistant', content: c.message.content });
      pending.replaceWith(
        h('div', { class: 'msg assistant', 'data-finish': c.finish_reason }, c.message.reasoning_content ? h('div', { class: 'muted' }, c.message.reasoning_content) : null, h('span', { class: 'content' }, c.message.content || '(empty)'), h('div', { class: 'muted' }, `${s.model.value} · ${r.usage?.completion_tokens ?? '?'} tokens · ${c.finish_reason}`)),
      );
    } catch (e) {
      s.history.pop();
      pending.replaceWith(errorBox(e));
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
    h('div', { class: 'panel row' }, h('label', {}, 'temperature', temperature), h('label', {}, 'top_p', topP), h('label', {}, 'max tokens', maxTokens), h('label', {}, 'seed', seed), h('label', {}, h('span', {}, thinking, ' thinking')), h('label', {}, h('span', {}, two, ' two models side by side'))),
    panes,
    h('form', { class: 'panel', onsubmit: (e) => (e.preventDefault(), void submit()) }, input, h('div', { class: 'row' }, send, clear)),
  );
}
