/** The runs page (every run under the root) and one run's page (config, status, checkpoints). */
import { api, fmt, h, selection, type RunInfo } from './dom';

const badge = (state: string, title?: string | null) => h('span', { class: `badge ${state}`, title: title ?? undefined }, state);

function rolloutCell(r: RunInfo) {
  if (r.rolloutsError) return h('span', { class: 'badge error', title: r.rolloutsError }, 'error');
  if (!r.rollouts) return '–';
  return `${r.rollouts.train} train, ${r.rollouts.eval} eval`;
}

/** Every run under the root: status, steps, checkpoints, evaluations, rollouts; checkboxes select runs to compare. */
export async function runsPage(view: HTMLElement): Promise<void> {
  const runs = await api<RunInfo[]>('/api/runs');
  const chosen = new Set(selection.get().filter((n) => runs.some((r) => r.name === n)));
  const compare = h('a', { href: '#/metrics', id: 'runs-compare' }, h('button', {}, 'Plot selected runs'));
  const rows = runs.map((r) =>
    h(
      'tr',
      { 'data-run': r.name },
      h('td', {}, h('input', { type: 'checkbox', checked: chosen.has(r.name), onchange: (e) => ((e.target as HTMLInputElement).checked ? chosen.add(r.name) : chosen.delete(r.name), selection.set([...chosen])) })),
      h('td', {}, h('a', { href: `#/run/${encodeURIComponent(r.name)}` }, r.name)),
      h('td', { class: 'mono' }, typeof r.config?.model === 'string' ? r.config.model : '–'),
      h('td', {}, badge(r.metrics.state, r.metrics.message), ' ', r.metrics.message ? h('span', { class: 'muted' }, r.metrics.state === 'missing' ? 'no metrics' : r.metrics.message.replace(/^.*:(\d+):/, 'line $1:')) : ''),
      h('td', { class: 'num' }, fmt(r.metrics.lastStep)),
      h('td', { class: 'num' }, r.checkpoints.length ? `${r.checkpoints.length} (last ${r.checkpoints.at(-1)!.step})` : '0'),
      h('td', {}, r.evals.length ? `step ${r.evals.at(-1)!.step}: ${fmt(r.evals.at(-1)!.accuracy)}` : '–'),
      h('td', {}, rolloutCell(r)),
      h('td', { class: 'muted' }, r.modified.slice(0, 19).replace('T', ' ')),
    ),
  );
  view.append(
    h('h2', {}, `Runs (${runs.length})`),
    runs.length === 0
      ? h('div', { class: 'panel muted' }, 'No run directories under the root.')
      : h('table', { id: 'runs' }, h('thead', {}, h('tr', {}, ['', 'run', 'model', 'metrics', 'last step', 'checkpoints', 'last eval', 'rollouts', 'modified'].map((t) => h('th', {}, t)))), h('tbody', {}, rows)),
    h('p', {}, compare),
  );
}

/** One run: status, config, checkpoints, evaluations, rollout counts. */
export async function runPage(view: HTMLElement, name: string): Promise<void> {
  const r = await api<RunInfo>(`/api/runs/${encodeURIComponent(name)}`);
  const cfg = r.config
    ? h('table', { id: 'config', class: 'compact' }, h('tbody', {}, Object.entries(r.config).map(([k, v]) => h('tr', {}, h('td', { class: 'mono' }, k), h('td', { class: 'mono' }, typeof v === 'object' ? JSON.stringify(v) : String(v))))))
    : h('div', { class: r.configError ? 'error' : 'muted' }, r.configError ?? 'no config.yaml');
  view.append(
    h('h2', {}, `Run ${r.name}`),
    h(
      'div',
      { class: 'panel' },
      h('div', {}, 'metrics: ', badge(r.metrics.state, r.metrics.message), ` ${r.metrics.lines} lines, last step ${fmt(r.metrics.lastStep)}`),
      r.metrics.message ? h('div', { class: r.metrics.state === 'bad' ? 'error' : 'muted' }, r.metrics.message) : null,
      h('div', {}, `logged: ${r.metrics.keys.join(', ') || '–'}`),
      h('div', {}, 'rollouts: ', r.rolloutsError ? h('span', { class: 'error', id: 'rollouts-error' }, r.rolloutsError) : r.rollouts ? `${r.rollouts.train} train, ${r.rollouts.eval} eval (last step ${fmt(r.rollouts.lastStep)})` : 'none'),
      h('div', { class: 'row' }, h('a', { href: `#/metrics?runs=${encodeURIComponent(r.name)}` }, 'plot metrics'), r.rollouts ? h('a', { href: `#/rollouts?run=${encodeURIComponent(r.name)}` }, 'browse rollouts') : null),
    ),
    h('h3', {}, 'Checkpoints'),
    r.checkpoints.length ? h('table', { id: 'checkpoints' }, h('tbody', {}, r.checkpoints.map((c) => h('tr', {}, h('td', { class: 'num' }, `step ${c.step}`), h('td', { class: 'mono' }, c.dir))))) : h('div', { class: 'muted' }, 'none'),
    h('h3', {}, 'Evaluations'),
    r.evals.length ? h('table', {}, h('tbody', {}, r.evals.map((e) => h('tr', {}, h('td', {}, `step ${e.step}`), h('td', { class: 'num' }, `${e.examples} examples`), h('td', { class: 'num' }, `accuracy ${fmt(e.accuracy)}`))))) : h('div', { class: 'muted' }, 'none'),
    h('h3', {}, 'Config'),
    cfg,
  );
}
