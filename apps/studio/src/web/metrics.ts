/**
 * The metrics page: one line plot per chosen metric, a line per chosen run, over steps; EMA
 * smoothing, log scale, values on hover (uPlot's legend), and live updates while a run writes.
 */
import uPlot from 'uplot';
import { api, fmt, h, routeQuery, selection, setRouteQuery, type RunInfo } from './dom';
import type { StudioSettings } from './main';
import { forLogScale, series, smooth, stepTimeStack, type Line } from './series';

interface MetricsAnswer {
  state: RunInfo['metrics']['state'];
  message: string | null;
  total: number;
  lines: Line[];
  evals: { step: number; accuracy: number | null }[];
}

/** Tick spacings of the step axis: whole steps only. */
const STEP_INCRS = [1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1000, 2000, 2500, 5000, 10000, 20000, 50000, 100000];
const COLORS = ['#2f6feb', '#e5534b', '#2da44e', '#bf8700', '#8250df', '#1b7c83', '#cf222e', '#57606a'];
/** Phase colours of the step-time charts, bottom of the stack first. */
const PHASE_COLORS = ['#2f6feb', '#e5534b', '#bf8700', '#2da44e', '#8250df', '#57606a', '#1b7c83', '#cf222e'];

export async function metricsPage(view: HTMLElement, settings: StudioSettings): Promise<() => void> {
  const runs = await api<RunInfo[]>('/api/runs');
  const q = routeQuery();
  let chosen = (q.get('runs')?.split(',') ?? selection.get()).filter((n) => runs.some((r) => r.name === n));
  if (chosen.length === 0) chosen = runs.filter((r) => r.metrics.lines > 0).slice(0, 3).map((r) => r.name);
  const data = new Map<string, MetricsAnswer>();
  const load = async (name: string) => {
    const old = data.get(name);
    const got = await api<MetricsAnswer>(`/api/runs/${encodeURIComponent(name)}/metrics?from=${old?.total ?? 0}`);
    const changed = !old || got.lines.length > 0 || got.state !== old.state || got.evals.length !== old.evals.length;
    data.set(name, old && got.total >= old.total ? { ...got, lines: [...old.lines, ...got.lines] } : got);
    return changed;
  };
  await Promise.all(chosen.map(load));
  const keysOf = () => {
    const keys = new Set<string>();
    for (const n of chosen) {
      const d = data.get(n);
      d?.lines.forEach((l) => Object.entries(l).forEach(([k, v]) => k !== 'step' && typeof v === 'number' && keys.add(k)));
      if (d?.evals.some((e) => e.accuracy !== null)) keys.add('eval_accuracy');
    }
    return [...keys].sort();
  };
  const allKeys = keysOf();
  const wanted = q.get('keys')?.split(',').filter(Boolean);
  const shown = new Set(wanted ?? allKeys.filter((k) => /^(loss|reward_mean|kl|eval_accuracy|lr)$/.test(k)).concat(allKeys).slice(0, 4));
  let smoothing = Number(q.get('smooth') ?? 0);
  let logScale = q.get('log') === '1';
  let stacked = q.get('stack') !== '0';
  const save = () => {
    const p = new URLSearchParams({ runs: chosen.join(','), keys: [...shown].join(',') });
    if (smoothing) p.set('smooth', String(smoothing));
    if (logScale) p.set('log', '1');
    if (!stacked) p.set('stack', '0');
    setRouteQuery('metrics', p);
    selection.set(chosen);
  };

  const charts = h('div', { class: 'charts', id: 'charts' });
  const plots: uPlot[] = [];
  const lines = (name: string): Line[] => {
    const d = data.get(name)!;
    return [...d.lines, ...d.evals.filter((e) => e.accuracy !== null).map((e) => ({ step: e.step, eval_accuracy: e.accuracy }))];
  };
  const draw = () => {
    plots.splice(0).forEach((p) => p.destroy());
    charts.replaceChildren();
    for (const key of allKeys.filter((k) => shown.has(k))) {
      const points = Object.fromEntries(chosen.map((n) => [n, series(lines(n), key)]));
      const steps = [...new Set(Object.values(points).flatMap((p) => p.map(([s]) => s)))].sort((a, b) => a - b);
      const ys = chosen.map((n) => {
        const by = new Map(points[n]);
        const raw = steps.map((s) => (by.has(s) ? by.get(s)! : null));
        const y = smooth(raw, smoothing);
        return logScale ? forLogScale(y) : y;
      });
      // the logged points and the drawn (smoothed, log-filtered) values, for reading back
      const box = h('div', { class: 'chart panel', 'data-metric': key, 'data-points': JSON.stringify(points), 'data-drawn': JSON.stringify({ steps, ...Object.fromEntries(chosen.map((n, i) => [n, ys[i]])) }) }, h('h4', {}, key));
      charts.append(box);
      const many = steps.length > 60;
      const opts: uPlot.Options = {
        width: Math.max(360, box.clientWidth - 24 || 520),
        height: 220,
        // a flat line gets a range around its value (uPlot's default for 0 is 0–100)
        scales: { x: { time: false }, y: logScale ? { distr: 3 } : { range: (_u, lo, hi) => (lo === hi ? [lo - Math.max(1, Math.abs(lo)) * 0.1, hi + Math.max(1, Math.abs(hi)) * 0.1] : uPlot.rangeNum(lo, hi, 0.1, true)) } },
        axes: [{ label: 'step', incrs: STEP_INCRS }, { size: 70, values: (_u, vals) => vals.map((v) => (v === null ? '' : Math.abs(v) >= 1e5 || (v !== 0 && Math.abs(v) < 1e-4) ? v.toExponential(1) : String(+v.toPrecision(4)))) }],
        series: [{ label: 'step' }, ...chosen.map((n, i) => ({ label: n, stroke: COLORS[i % COLORS.length], width: 1.5, spanGaps: true, points: { show: !many, size: 5 }, value: (_u: uPlot, v: number | null) => (v === null ? '–' : fmt(v)) }))],
        legend: { live: true },
      };
      plots.push(new uPlot(opts, [steps, ...ys] as uPlot.AlignedData, box));
    }
    if (charts.childElementCount === 0) charts.append(h('div', { class: 'muted' }, chosen.length ? 'Choose a metric.' : 'Choose a run.'));
    drawStacks();
  };
  // per run, its step time split by phase: each phase filled from the phases below it to its own top
  const stackWrap = h('div', { id: 'step-time' });
  const drawStacks = () => {
    const stacks = h('div', { class: 'charts' });
    stackWrap.replaceChildren();
    if (!stacked || !chosen.some((n) => stepTimeStack(data.get(n)!.lines))) return;
    // in the page before the charts are made, so that each takes its column's width
    stackWrap.append(h('h3', {}, 'Step time'), stacks);
    for (const name of chosen) {
      const st = stepTimeStack(data.get(name)!.lines);
      if (!st) continue;
      const box = h('div', { class: 'chart panel', 'data-stack-run': name, 'data-stack': JSON.stringify(st) }, h('h4', {}, `${name}: step time by phase (ms)`));
      stacks.append(box);
      // drawn tallest first so that each lower phase paints over the one above it
      const order = st.phases.map((_, k) => k).reverse();
      const opts: uPlot.Options = {
        width: Math.max(360, box.clientWidth - 24 || 520),
        height: 220,
        scales: { x: { time: false }, y: { range: (_u, _lo, hi) => [0, hi > 0 ? hi * 1.05 : 1] } },
        axes: [{ label: 'step', incrs: STEP_INCRS }, { size: 70 }],
        series: [
          { label: 'step' },
          ...order.map((k) => ({
            label: st.phases[k].replace(/_ms$/, ''),
            // a phase keeps its colour in every run's chart
            stroke: PHASE_COLORS[k % PHASE_COLORS.length],
            fill: `${PHASE_COLORS[k % PHASE_COLORS.length]}aa`,
            width: 1,
            points: { show: st.steps.length <= 60, size: 4 },
            // the legend shows the phase's own time, not the stacked height
            value: (_u: uPlot, _v: number | null, _s: number, idx: number | null) => (idx === null ? '–' : fmt(st.values[k][idx])),
          })),
        ],
        legend: { live: true },
      };
      plots.push(new uPlot(opts, [st.steps, ...order.map((k) => st.top[k])] as uPlot.AlignedData, box));
    }
  };

  const status = h('div', { id: 'metrics-status' });
  const showStatus = () =>
    status.replaceChildren(
      ...chosen.filter((n) => data.get(n)!.state !== 'ok').map((n) => h('div', { class: data.get(n)!.state === 'bad' ? 'error' : 'muted', 'data-run': n }, `${n}: ${data.get(n)!.message}`)),
    );
  const runList = h(
    'div',
    { class: 'checklist', id: 'run-list' },
    runs.map((r) =>
      h('label', {}, h('input', {
        type: 'checkbox',
        value: r.name,
        checked: chosen.includes(r.name),
        onchange: async (e) => {
          const on = (e.target as HTMLInputElement).checked;
          chosen = on ? [...chosen, r.name] : chosen.filter((n) => n !== r.name);
          if (on) await load(r.name);
          refreshKeys();
          save();
          showStatus();
          draw();
        },
      }), ` ${r.name}`),
    ),
  );
  const keyList = h('div', { class: 'checklist', id: 'metric-list' });
  const refreshKeys = () => {
    allKeys.splice(0, allKeys.length, ...keysOf());
    keyList.replaceChildren(...allKeys.map((k) => h('label', {}, h('input', { type: 'checkbox', value: k, checked: shown.has(k), onchange: (e) => ((e.target as HTMLInputElement).checked ? shown.add(k) : shown.delete(k), save(), draw()) }), ` ${k}`)));
  };
  refreshKeys();
  const smoothIn = h('input', { type: 'range', min: 0, max: 0.99, step: 0.01, value: smoothing, id: 'smoothing', oninput: (e) => ((smoothing = Number((e.target as HTMLInputElement).value)), (smoothLabel.textContent = smoothing.toFixed(2)), save(), draw()) });
  const smoothLabel = h('span', {}, smoothing.toFixed(2));
  const logIn = h('input', { type: 'checkbox', id: 'log-scale', checked: logScale, onchange: (e) => ((logScale = (e.target as HTMLInputElement).checked), save(), draw()) });
  const stackIn = h('input', { type: 'checkbox', id: 'stacked', checked: stacked, onchange: (e) => ((stacked = (e.target as HTMLInputElement).checked), save(), draw()) });
  view.append(
    h('h2', {}, 'Metrics'),
    h(
      'div',
      { class: 'layout' },
      h('div', {}, h('div', { class: 'panel' }, h('h4', {}, 'Runs'), runList), h('div', { class: 'panel' }, h('h4', {}, 'Metrics'), keyList), h('div', { class: 'panel' }, h('label', {}, 'smoothing ', smoothIn, ' ', smoothLabel), h('br'), h('label', {}, logIn, ' log scale'), h('br'), h('label', {}, stackIn, ' step time by phase'))),
      h('div', {}, status, charts, stackWrap),
    ),
  );
  showStatus();
  requestAnimationFrame(draw);
  save();
  // live: re-read the chosen runs' new lines; redraw only when something arrived
  const timer = setInterval(async () => {
    try {
      const changed = (await Promise.all(chosen.map(load))).some(Boolean);
      if (changed) {
        refreshKeys();
        showStatus();
        draw();
      }
    } catch {
      /* the next poll retries */
    }
  }, settings.pollMs);
  return () => clearInterval(timer);
}
