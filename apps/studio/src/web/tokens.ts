/**
 * The token view: a trajectory's output tokens coloured by a per-token value — the sampling
 * log-prob, the Q of the sampled token among its labelled candidates, or the token advantage —
 * from red (lowest in the row) to green (highest), with the value and the candidate set on hover.
 */
import { api, errorBox, fmt, h, routeQuery, setRouteQuery } from './dom';

type Value = 'logprob' | 'q' | 'advantage';
interface Cell {
  id: number;
  text: string;
  logprob: number | null;
  q: number | null;
  advantage: number | null;
  candidates: { id: number; text: string; q: number | null; logprob: number | null }[] | null;
}
interface View {
  source: string;
  row: number;
  rows: number;
  prompt: string;
  tokens: Cell[];
  values: Value[];
  reward: number | null;
  correct: number | null;
  tokenizer: string;
}

/** The background of a value: hue 0 (red) at the row's lowest value to 120 (green) at its highest. */
export function colour(v: number, lo: number, hi: number): string {
  const t = hi > lo ? (v - lo) / (hi - lo) : 1;
  return `hsl(${Math.round(120 * t)}, 70%, 80%)`;
}

const show = (t: string) => t.replace(/\n/g, '↵\n').replace(/\t/g, '→') || '∅';

function tokensBox(cells: Cell[], by: Value | null): HTMLElement {
  const vals = by ? cells.map((c) => c[by]).filter((v): v is number => v !== null) : [];
  const lo = Math.min(...vals);
  const hi = Math.max(...vals);
  const box = h('div', { class: 'tokens', id: 'tokens' });
  cells.forEach((c, i) => {
    const v = by ? c[by] : null;
    const tip = [`#${i} id ${c.id}`, ...(['logprob', 'q', 'advantage'] as const).filter((k) => c[k] !== null).map((k) => `${k} ${fmt(c[k])}`)];
    if (c.candidates) tip.push('candidates:', ...c.candidates.map((x) => `  ${JSON.stringify(x.text)}  Q ${fmt(x.q)}${x.logprob !== null ? `  ref logprob ${fmt(x.logprob)}` : ''}`));
    const span = h('span', { class: 'tok', title: tip.join('\n'), 'data-i': i, 'data-value': v === null ? undefined : v }, show(c.text));
    if (v !== null) span.style.backgroundColor = colour(v, lo, hi);
    box.append(span);
  });
  return by && vals.length ? h('div', {}, h('div', { class: 'legend' }, `${by} ${fmt(lo)}`, h('span', { class: 'bar' }), fmt(hi)), box) : box;
}

export async function tokensPage(view: HTMLElement): Promise<void> {
  const q = routeQuery();
  const files = await api<string[]>('/api/trajectories');
  const fileSel = h('select', { id: 'file' }, h('option', { value: '' }, '(choose a Parquet file)'), files.map((f) => h('option', { value: f }, f)));
  fileSel.value = q.get('file') ?? '';
  const rowIn = h('input', { type: 'number', id: 'row', min: 0, value: q.get('row') ?? '0' });
  const bySel = h('select', { id: 'colour-by' });
  const out = h('div', { id: 'token-view' });
  let current: View | null = null;
  const render = () => {
    if (!current) return;
    const by = (bySel.value || null) as Value | null;
    out.replaceChildren(
      h('div', { class: 'panel' }, h('div', {}, `${current.source}, row ${current.row} of ${current.rows} · reward ${fmt(current.reward)} · correct ${fmt(current.correct)}`), h('div', { class: 'muted' }, `tokenizer: ${current.tokenizer}`), h('div', { class: 'mono' }, current.prompt)),
      tokensBox(current.tokens, by),
    );
  };
  const setValues = (values: Value[]) => {
    const keep = bySel.value;
    bySel.replaceChildren(...values.map((v) => h('option', { value: v }, v)), h('option', { value: '' }, 'none'));
    bySel.value = values.includes(keep as Value) ? keep : (q.get('by') ?? values[0] ?? '');
  };
  bySel.addEventListener('change', render);
  // the file's rows as a paged table (read a batch at a time on the server); a click shows a row's tokens
  const table = h('div', { id: 'trajectory-rows' });
  const promptIn = h('input', { type: 'text', id: 'traj-prompt', size: 14 });
  let offset = 0;
  const listRows = async () => {
    if (!fileSel.value) return table.replaceChildren();
    try {
      const p = new URLSearchParams({ file: fileSel.value, offset: String(offset), limit: '20' });
      if (promptIn.value.trim()) p.set('prompt', promptIn.value.trim());
      const page = await api<{ total: number; offset: number; rows: { row: number; prompt_idx: number | null; step: number | null; prompt: string; reward: number | null; correct: number | null; advantage: number | null; length: number }[] }>(`/api/trajectories/rows?${p}`);
      const last = page.offset + page.rows.length;
      table.replaceChildren(
        h(
          'div',
          { class: 'pager' },
          h('label', {}, 'prompt contains ', promptIn),
          h('button', { type: 'button', onclick: () => ((offset = 0), void listRows()) }, 'Filter'),
          h('button', { type: 'button', disabled: offset === 0, onclick: () => ((offset = Math.max(0, offset - 20)), void listRows()) }, '‹ prev'),
          h('span', {}, page.total ? `rows ${page.offset + 1}–${last} of ${page.total}` : 'no rows match'),
          h('button', { type: 'button', disabled: last >= page.total, onclick: () => ((offset += 20), void listRows()) }, 'next ›'),
        ),
        h(
          'table',
          {},
          h('thead', {}, h('tr', {}, ['row', 'prompt', 'step', 'prompt text', 'reward', 'correct', 'advantage', 'tokens'].map((t) => h('th', {}, t)))),
          h(
            'tbody',
            {},
            page.rows.map((r) =>
              h(
                'tr',
                { class: 'clickable', 'data-row': r.row, onclick: () => ((rowIn.value = String(r.row)), void loadFile()) },
                [r.row, r.prompt_idx, r.step].map((v) => h('td', { class: 'num' }, fmt(v))),
                h('td', { class: 'text' }, r.prompt.slice(0, 120)),
                [r.reward, r.correct, r.advantage, r.length].map((v) => h('td', { class: 'num' }, fmt(v))),
              ),
            ),
          ),
        ),
      );
    } catch (e) {
      table.replaceChildren(errorBox(e));
    }
  };
  fileSel.addEventListener('change', () => ((offset = 0), (rowIn.value = '0'), void listRows(), void loadFile()));
  const loadFile = async () => {
    if (!fileSel.value) return;
    setRouteQuery('tokens', new URLSearchParams({ file: fileSel.value, row: rowIn.value }));
    try {
      current = await api<View>(`/api/tokens?file=${encodeURIComponent(fileSel.value)}&row=${encodeURIComponent(rowIn.value)}`);
      setValues(current.values);
      render();
    } catch (e) {
      out.replaceChildren(errorBox(e));
    }
  };
  view.append(
    h('h2', {}, 'Token values'),
    h('form', { class: 'panel row', onsubmit: (e) => (e.preventDefault(), void loadFile()) }, h('label', {}, 'trajectory file', fileSel), h('label', {}, 'row', rowIn), h('label', {}, 'colour by', bySel), h('button', { type: 'submit', id: 'show' }, 'Show')),
    out,
    h('h3', {}, 'Rows'),
    table,
  );
  const run = q.get('run');
  if (run && q.get('id')) {
    // one stored rollout: its token ids decoded; the store keeps no per-token values
    try {
      const r = await api<{ id: number; step: number; prompt: string; completion: string; reward: number | null; tokens: Cell[] | null; tokenizer: string }>(`/api/runs/${encodeURIComponent(run)}/rollouts/${encodeURIComponent(q.get('id')!)}?table=${q.get('table') ?? 'train'}`);
      current = { source: `${run} rollout ${r.id} (step ${r.step})`, row: 0, rows: 1, prompt: r.prompt, tokens: r.tokens ?? [], values: [], reward: r.reward, correct: null, tokenizer: r.tokenizer };
      setValues([]);
      render();
      if (!r.tokens) out.append(h('div', { class: 'muted' }, 'This rollout stored no token ids; its text: ', h('span', { class: 'mono' }, r.completion)));
      else out.append(h('div', { class: 'muted' }, 'The rollout store keeps token ids but no per-token values: write trajectories (lathe generate, the critic labelling) for log-prob and Q colours.'));
    } catch (e) {
      out.replaceChildren(errorBox(e));
    }
  } else await Promise.all([loadFile(), listRows()]);
}
