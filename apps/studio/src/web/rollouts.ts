/**
 * The rollouts page: a run's rollout store as a filtered, paged table (every filter and page is
 * one SQL query on the server) and, for a clicked row, its prompt's group side by side.
 */
import { api, errorBox, fmt, h, routeQuery, setRouteQuery, type RunInfo } from './dom';

interface Row {
  id: number;
  step: number;
  prompt_index: number;
  rollout_index: number;
  dataset: string | null;
  prompt: string;
  completion: string;
  reward: number | null;
  advantage: number | null;
  correct: boolean | null;
  length: number;
  extra?: Record<string, unknown> | null;
}
interface Page {
  total: number;
  offset: number;
  rows: Row[];
}

const FILTERS: [string, string, string][] = [
  ['step', 'step', 'number'],
  ['prompt', 'prompt contains', 'text'],
  ['completion', 'completion contains', 'text'],
  ['min_reward', 'reward ≥', 'number'],
  ['max_reward', 'reward ≤', 'number'],
  ['min_advantage', 'advantage ≥', 'number'],
  ['max_advantage', 'advantage ≤', 'number'],
  ['min_length', 'length ≥', 'number'],
  ['max_length', 'length ≤', 'number'],
];
const PAGE = 50;
/** Columns the table sorts by (in the server's SQL query), by their header. */
const SORTABLE: Record<string, string> = { step: 'step', reward: 'reward', advantage: 'advantage', length: 'length' };

export async function rolloutsPage(view: HTMLElement): Promise<void> {
  const runs = (await api<RunInfo[]>('/api/runs')).filter((r) => r.rollouts || r.rolloutsError);
  const q = routeQuery();
  if (runs.length === 0) {
    view.append(h('h2', {}, 'Rollouts'), h('div', { class: 'panel muted' }, 'No run under the root has a rollout store (rollouts.sqlite).'));
    return;
  }
  const run = runs.find((r) => r.name === q.get('run')) ?? runs[0];
  const tableSel = h('select', { id: 'table' }, h('option', { value: 'train' }, 'train'), h('option', { value: 'eval' }, 'eval'));
  tableSel.value = q.get('table') === 'eval' ? 'eval' : 'train';
  const runSel = h('select', { id: 'run', onchange: () => ((location.hash = `#/rollouts?run=${encodeURIComponent(runSel.value)}`)) }, runs.map((r) => h('option', { value: r.name }, r.name)));
  runSel.value = run.name;
  const inputs = new Map(FILTERS.map(([key, , type]) => [key, h('input', { type, name: key, value: q.get(key) ?? '', step: 'any', size: type === 'text' ? 14 : undefined })]));
  let offset = Number(q.get('offset') ?? 0);
  let sort = q.get('sort') && SORTABLE[q.get('sort')!] ? q.get('sort')! : 'step';
  let desc = q.get('desc') === '1';
  const result = h('div', { id: 'rollout-table' });
  const detail = h('div', { id: 'rollout-group' });
  const pager = h('div', { class: 'pager' });

  const params = () => {
    const p = new URLSearchParams({ run: run.name, table: tableSel.value });
    for (const [k, el] of inputs) if (el.value.trim() !== '') p.set(k, el.value.trim());
    if (sort !== 'step' || desc) p.set('sort', sort);
    if (desc) p.set('desc', '1');
    if (offset) p.set('offset', String(offset));
    return p;
  };
  const showGroup = async (r: Row) => {
    detail.replaceChildren(h('div', { class: 'muted' }, 'loading…'));
    try {
      const p = new URLSearchParams({ table: tableSel.value, step: String(r.step), prompt_index: String(r.prompt_index) });
      if (r.dataset) p.set('dataset', r.dataset);
      const rows = await api<Row[]>(`/api/runs/${encodeURIComponent(run.name)}/rollouts/group?${p}`);
      detail.replaceChildren(
        h('h3', {}, `Step ${r.step}, prompt ${r.prompt_index}: ${rows.length} completions`),
        h('div', { class: 'panel mono' }, rows[0]?.prompt ?? ''),
        h(
          'div',
          { class: 'group' },
          rows.map((c) => {
            const bySource = c.extra?.rewards && typeof c.extra.rewards === 'object' ? Object.entries(c.extra.rewards as Record<string, number>).map(([k, v]) => `${k} ${fmt(v)}`).join(', ') : '';
            return h(
              'div',
              { class: 'completion', 'data-id': c.id },
              h('div', {}, h('b', {}, `#${c.rollout_index}`), ` reward ${fmt(c.reward)}`, c.advantage !== null ? ` · advantage ${fmt(c.advantage)}` : '', c.correct !== null ? ` · ${c.correct ? 'correct' : 'wrong'}` : '', ` · ${c.length} tokens`),
              bySource ? h('div', { class: 'muted' }, bySource) : null,
              h('div', { class: 'mono' }, c.completion),
              h('a', { href: `#/tokens?run=${encodeURIComponent(run.name)}&table=${tableSel.value}&id=${c.id}` }, 'tokens'),
            );
          }),
        ),
      );
    } catch (e) {
      detail.replaceChildren(errorBox(e));
    }
  };
  // a sortable header: a click sorts by it, highest first; a second click flips the direction
  const header = (t: string) => {
    const key = SORTABLE[t];
    if (!key) return h('th', {}, t);
    const on = sort === key;
    const click = () => {
      desc = on ? !desc : key !== 'step';
      sort = key;
      offset = 0;
      void search();
    };
    return h('th', { class: 'sortable', 'data-sort': key, 'aria-sort': on ? (desc ? 'descending' : 'ascending') : null, title: `sort by ${t}`, onclick: click }, t, on ? (desc ? ' ▼' : ' ▲') : '');
  };
  const search = async () => {
    const p = params();
    setRouteQuery('rollouts', p);
    const api_ = new URLSearchParams(p);
    api_.delete('run');
    api_.set('limit', String(PAGE));
    result.replaceChildren(h('div', { class: 'muted' }, 'loading…'));
    try {
      const t0 = performance.now();
      const page = await api<Page>(`/api/runs/${encodeURIComponent(run.name)}/rollouts?${api_}`);
      const ms = performance.now() - t0;
      const last = Math.min(page.total, page.offset + page.rows.length);
      pager.replaceChildren(
        h('button', { id: 'prev', disabled: offset === 0, onclick: () => ((offset = Math.max(0, offset - PAGE)), void search()) }, '‹ prev'),
        h('span', { id: 'page-info' }, page.total ? `rows ${page.offset + 1}–${last} of ${page.total}` : 'no rows match', h('span', { class: 'muted' }, ` (${ms.toFixed(0)} ms)`)),
        h('button', { id: 'next', disabled: last >= page.total, onclick: () => ((offset += PAGE), void search()) }, 'next ›'),
      );
      const eval_ = tableSel.value === 'eval';
      result.replaceChildren(
        h(
          'table',
          {},
          h('thead', {}, h('tr', {}, ['step', 'prompt', 'sample', eval_ ? 'dataset' : null, 'prompt text', 'completion', 'reward', eval_ ? 'correct' : 'advantage', 'length'].filter((x) => x !== null).map((t) => header(t)))),
          h(
            'tbody',
            {},
            page.rows.map((r) =>
              h(
                'tr',
                { class: 'clickable', 'data-id': r.id, onclick: () => void showGroup(r) },
                h('td', { class: 'num' }, r.step),
                h('td', { class: 'num' }, r.prompt_index),
                h('td', { class: 'num' }, r.rollout_index),
                eval_ ? h('td', {}, r.dataset ?? '') : null,
                h('td', { class: 'text' }, r.prompt.slice(0, 120)),
                h('td', { class: 'text' }, r.completion.slice(0, 160)),
                h('td', { class: 'num' }, fmt(r.reward)),
                h('td', { class: 'num' }, eval_ ? (r.correct === null ? '–' : r.correct ? '✓' : '✗') : fmt(r.advantage)),
                h('td', { class: 'num' }, r.length),
              ),
            ),
          ),
        ),
      );
    } catch (e) {
      pager.replaceChildren();
      result.replaceChildren(errorBox(e));
    }
  };
  const form = h(
    'form',
    { class: 'panel row', id: 'filters', onsubmit: (e) => (e.preventDefault(), (offset = 0), void search()) },
    h('label', {}, 'run', runSel),
    h('label', {}, 'table', tableSel),
    FILTERS.map(([key, label]) => h('label', {}, label, inputs.get(key)!)),
    h('button', { type: 'submit', id: 'apply' }, 'Apply'),
  );
  view.append(h('h2', {}, 'Rollouts'), run.rolloutsError ? h('div', { class: 'panel error' }, run.rolloutsError) : '', form, pager, result, detail);
  if (!run.rolloutsError) await search();
}
