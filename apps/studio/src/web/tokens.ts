/**
 * The token view: a trajectory's or a stored rollout's output tokens coloured by a per-token value
 * — the sampling log-prob, the entropy it was sampled at, the Q of the sampled token among its
 * labelled candidates, or the token advantage — from red (lowest in the row; for entropy, highest:
 * red is always the least confident or worst) to green, with a legend, and the values and the
 * candidate set on hover.
 */
import { api, errorBox, fmt, h, routeQuery, setRouteQuery } from './dom';

type Value = 'logprob' | 'entropy' | 'q' | 'advantage';
const VALUES: readonly Value[] = ['logprob', 'entropy', 'q', 'advantage'];
/** What each colouring means, for the legend. */
const MEANING: Record<Value, string> = {
  logprob: 'log-prob of the sampled token',
  entropy: "entropy of the next-token distribution at it (nats: the sampling policy's; in critic label output, the reference policy's)",
  q: 'Q of the sampled token',
  advantage: 'token advantage',
};
/** Values where higher is worse: entropy (uncertainty) is red where highest. */
const HIGH_IS_RED: ReadonlySet<Value> = new Set(['entropy']);
interface Cell {
  id: number;
  text: string;
  logprob: number | null;
  entropy: number | null;
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

/** The background of a value: hue 0 (red) at the row's lowest value to 120 (green) at its highest (`reverse`: red at the highest). */
export function colour(v: number, lo: number, hi: number, reverse = false): string {
  const t = hi > lo ? (v - lo) / (hi - lo) : 1;
  return `hsl(${Math.round(120 * (reverse ? 1 - t : t))}, 70%, 80%)`;
}

const show = (t: string) => t.replace(/\n/g, '↵\n').replace(/\t/g, '→') || '∅';

function tokensBox(cells: Cell[], by: Value | null): HTMLElement {
  const vals = by ? cells.map((c) => c[by]).filter((v): v is number => v !== null) : [];
  const lo = Math.min(...vals);
  const hi = Math.max(...vals);
  const reverse = by !== null && HIGH_IS_RED.has(by);
  const box = h('div', { class: 'tokens', id: 'tokens' });
  cells.forEach((c, i) => {
    const v = by ? c[by] : null;
    const tip = [`#${i} id ${c.id}`, ...VALUES.filter((k) => c[k] !== null && c[k] !== undefined).map((k) => `${k} ${fmt(c[k])}`)];
    if (c.candidates) tip.push('candidates:', ...c.candidates.map((x) => `  ${JSON.stringify(x.text)}  Q ${fmt(x.q)}${x.logprob !== null ? `  ref logprob ${fmt(x.logprob)}` : ''}`));
    const span = h('span', { class: 'tok', title: tip.join('\n'), 'data-i': i, 'data-value': v === null ? undefined : v }, show(c.text));
    if (v !== null && v !== undefined) span.style.backgroundColor = colour(v, lo, hi, reverse);
    box.append(span);
  });
  if (!by || !vals.length) return box;
  // the bar runs red → green; its ends are labelled with the values they stand for
  const [red, green] = reverse ? [hi, lo] : [lo, hi];
  const legend = h(
    'div',
    { class: 'legend', id: 'legend', 'data-by': by },
    h('b', {}, by),
    h('span', { class: 'muted' }, MEANING[by]),
    h('span', { class: 'end', 'data-end': 'red' }, `${fmt(red)} ${reverse ? '(highest)' : '(lowest)'}`),
    h('span', { class: 'bar' }),
    h('span', { class: 'end', 'data-end': 'green' }, `${fmt(green)} ${reverse ? '(lowest)' : '(highest)'}`),
    h('span', { class: 'muted' }, `· scaled to this ${cells.length}-token completion; hover a token for its values`),
  );
  return h('div', {}, legend, box);
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
  // a stored rollout (from the rollouts page) rather than a trajectory file's row
  const run = q.get('run');
  const render = () => {
    if (!current) return;
    const by = (bySel.value || null) as Value | null;
    out.replaceChildren(
      h('div', { class: 'panel' }, h('div', {}, `${current.source}${run && q.get('id') ? '' : `, row ${current.row} of ${current.rows}`} · reward ${fmt(current.reward)} · correct ${fmt(current.correct)}`), h('div', { class: 'muted' }, `tokenizer: ${current.tokenizer}`), h('div', { class: 'mono' }, current.prompt)),
      tokensBox(current.tokens, by),
    );
  };
  const setValues = (values: Value[]) => {
    const keep = bySel.value;
    bySel.replaceChildren(...values.map((v) => h('option', { value: v }, v)), h('option', { value: '' }, 'none'));
    bySel.value = values.includes(keep as Value) ? keep : (q.get('by') ?? values[0] ?? '');
  };
  bySel.addEventListener('change', render);
  // the file's rows as a paged, filtered table (read a batch at a time on the server); a click shows
  // a row's tokens and its prompt's group of completions side by side
  const table = h('div', { id: 'trajectory-rows' });
  const group = h('div', { id: 'trajectory-group' });
  const filters = (
    [
      ['prompt', 'prompt contains', 'text'],
      ['step', 'step', 'number'],
      ['min_reward', 'reward ≥', 'number'],
      ['max_reward', 'reward ≤', 'number'],
      ['min_advantage', 'advantage ≥', 'number'],
      ['max_advantage', 'advantage ≤', 'number'],
      ['min_length', 'tokens ≥', 'number'],
      ['max_length', 'tokens ≤', 'number'],
    ] as const
  ).map(([key, text, type]) => ({ key, text, input: h('input', { type, id: `traj-${key}`, step: 'any', size: type === 'text' ? 14 : 6 }) }));
  let offset = 0;
  const showGroup = async (r: { prompt_idx: number | null; step: number | null }) => {
    if (r.prompt_idx === null) return group.replaceChildren();
    try {
      const p = new URLSearchParams({ file: fileSel.value, prompt_idx: String(r.prompt_idx), ...(r.step === null ? {} : { step: String(r.step) }) });
      const rows = await api<{ row: number; sample_idx: number | null; reward: number | null; advantage: number | null; correct: number | null; length: number; text: string; prompt: string }[]>(`/api/trajectories/group?${p}`);
      group.replaceChildren(
        h('h3', {}, `Prompt ${r.prompt_idx}${r.step === null ? '' : ` at step ${r.step}`}: ${rows.length} completion${rows.length === 1 ? '' : 's'}`),
        h(
          'div',
          { class: 'group' },
          rows.map((c) =>
            h(
              'div',
              { class: 'completion clickable', 'data-row': c.row, onclick: () => ((rowIn.value = String(c.row)), void loadFile()) },
              h('div', {}, h('b', {}, `row ${c.row}${c.sample_idx === null ? '' : ` · sample ${c.sample_idx}`}`), ` reward ${fmt(c.reward)}`, c.advantage !== null ? ` · advantage ${fmt(c.advantage)}` : '', c.correct !== null ? ` · correct ${fmt(c.correct)}` : '', ` · ${c.length} tokens`),
              h('div', { class: 'mono' }, c.text),
            ),
          ),
        ),
      );
    } catch (e) {
      group.replaceChildren(errorBox(e));
    }
  };
  const listRows = async () => {
    if (!fileSel.value) return table.replaceChildren();
    try {
      const p = new URLSearchParams({ file: fileSel.value, offset: String(offset), limit: '20' });
      for (const f of filters) if (f.input.value.trim()) p.set(f.key, f.input.value.trim());
      const page = await api<{ total: number; offset: number; rows: { row: number; prompt_idx: number | null; step: number | null; prompt: string; reward: number | null; correct: number | null; advantage: number | null; length: number }[] }>(`/api/trajectories/rows?${p}`);
      const last = page.offset + page.rows.length;
      table.replaceChildren(
        h(
          'div',
          { class: 'pager' },
          filters.map((f) => h('label', {}, `${f.text} `, f.input)),
          h('button', { type: 'button', id: 'traj-filter', onclick: () => ((offset = 0), void listRows()) }, 'Filter'),
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
                { class: 'clickable', 'data-row': r.row, onclick: () => ((rowIn.value = String(r.row)), void loadFile(), void showGroup(r)) },
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
    ...(run && q.get('id') ? [] : [h('h3', {}, 'Rows'), table, group]),
  );
  if (run && q.get('id')) {
    // one stored rollout: its token ids decoded, with the per-token log-probs and entropies the store holds
    try {
      const r = await api<{ id: number; step: number; prompt: string; completion: string; reward: number | null; correct: boolean | null; tokens: Cell[] | null; values: Value[]; tokenizer: string }>(`/api/runs/${encodeURIComponent(run)}/rollouts/${encodeURIComponent(q.get('id')!)}?table=${q.get('table') ?? 'train'}`);
      current = { source: `${run} rollout ${r.id} (step ${r.step})`, row: 0, rows: 1, prompt: r.prompt, tokens: r.tokens ?? [], values: r.values, reward: r.reward, correct: r.correct === null ? null : Number(r.correct), tokenizer: r.tokenizer };
      setValues(r.values);
      render();
      if (!r.tokens) out.append(h('div', { class: 'muted' }, 'This rollout stored no token ids; its text: ', h('span', { class: 'mono' }, r.completion)));
      else if (r.values.length === 0) out.append(h('div', { class: 'muted' }, 'This rollout has token ids but no per-token values (a store written before Lathe kept them).'));
    } catch (e) {
      out.replaceChildren(errorBox(e));
    }
  } else await Promise.all([loadFile(), listRows()]);
}
