/** Small DOM and fetch helpers shared by the pages. */

type Attrs = Record<string, string | number | boolean | null | undefined | ((e: Event) => void)>;
type Child = Node | string | number | null | undefined | false;

/** Creates an element: `h('td', { class: 'num' }, '1.5')`; `on*` attributes become listeners. */
export function h<K extends keyof HTMLElementTagNameMap>(tag: K, attrs: Attrs = {}, ...children: (Child | Child[])[]): HTMLElementTagNameMap[K] {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined || v === false) continue;
    if (typeof v === 'function') el.addEventListener(k.slice(2).toLowerCase(), v);
    else if (k === 'value' && 'value' in el) (el as HTMLInputElement).value = String(v);
    else if (k === 'checked' && 'checked' in el) (el as HTMLInputElement).checked = Boolean(v);
    else el.setAttribute(k, v === true ? '' : String(v));
  }
  for (const c of children.flat()) if (c !== null && c !== undefined && c !== false) el.append(c instanceof Node ? c : String(c));
  return el;
}

/** GETs or POSTs JSON from the studio API; a non-2xx answer throws its `error` text. */
export async function api<T>(path: string, body?: unknown): Promise<T> {
  const r = await fetch(path, body === undefined ? {} : { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
  const j = (await r.json()) as T & { error?: string | { message?: string } };
  if (!r.ok) throw new Error(typeof j.error === 'string' ? j.error : (j.error?.message ?? `${path}: HTTP ${r.status}`));
  return j;
}

/** A number for a table cell. */
export function fmt(v: unknown): string {
  if (typeof v !== 'number') return v === null || v === undefined ? '–' : String(v);
  if (Number.isInteger(v)) return String(v);
  return Math.abs(v) >= 1e4 || (Math.abs(v) < 1e-3 && v !== 0) ? v.toExponential(3) : v.toPrecision(4);
}

/** The hash route's query (`#/page?a=1` → a=1). */
export function routeQuery(): URLSearchParams {
  const i = location.hash.indexOf('?');
  return new URLSearchParams(i < 0 ? '' : location.hash.slice(i + 1));
}

/** Replaces the hash query without adding a history entry per change. */
export function setRouteQuery(page: string, q: URLSearchParams): void {
  history.replaceState(null, '', `#/${page}${q.toString() ? `?${q}` : ''}`);
}

/** An error line for a page. */
export const errorBox = (e: unknown) => h('div', { class: 'panel error' }, (e as Error).message ?? String(e));

/** A run as the API lists it (apps/studio/src/runs.ts RunInfo). */
export interface RunInfo {
  name: string;
  modified: string;
  config: Record<string, unknown> | null;
  configError: string | null;
  metrics: { state: 'ok' | 'missing' | 'partial' | 'bad'; message: string | null; lines: number; lastStep: number | null; keys: string[] };
  checkpoints: { step: number; dir: string }[];
  evals: { step: number; examples: number; accuracy: number | null }[];
  rollouts: { train: number; eval: number; lastStep: number | null; datasets: string[] } | null;
  rolloutsError: string | null;
}

/** The runs chosen for comparison (kept across pages in localStorage). */
export const selection = {
  get(): string[] {
    try {
      return JSON.parse(localStorage.getItem('studio.runs') ?? '[]') as string[];
    } catch {
      return [];
    }
  },
  set(runs: string[]): void {
    localStorage.setItem('studio.runs', JSON.stringify(runs));
  },
};
