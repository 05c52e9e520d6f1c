/** Lathe Studio's browser side: a hash router over five pages. */
import { api, h } from './dom';
import { runsPage, runPage } from './runs';
import { metricsPage } from './metrics';
import { rolloutsPage } from './rollouts';
import { tokensPage } from './tokens';
import { chatPage } from './chat';

/** Settings the server hands the page. */
export interface StudioSettings {
  root: string;
  chat: boolean;
  /** The server chat goes through (--serve_url), or null when models are served by the studio itself. */
  serveUrl: string | null;
  pollMs: number;
}

const app = document.getElementById('app')!;
let settings: StudioSettings | null = null;
/** Called when the page is left (stops polling). */
let leave: (() => void) | void = undefined;

async function route(): Promise<void> {
  settings ??= await api<StudioSettings>('/api/config');
  document.getElementById('root')!.textContent = settings.root;
  if (typeof leave === 'function') leave();
  leave = undefined;
  const path = location.hash.replace(/^#\/?/, '').split('?')[0];
  const [page, ...rest] = path.split('/');
  for (const a of document.querySelectorAll('nav a')) a.classList.toggle('active', (a as HTMLElement).dataset.page === (page || 'runs'));
  app.replaceChildren(h('div', { class: 'muted' }, 'loading…'));
  const view = h('div', { id: `page-${page || 'runs'}` });
  try {
    if (page === 'run') leave = await runPage(view, decodeURIComponent(rest.join('/')));
    else if (page === 'metrics') leave = await metricsPage(view, settings);
    else if (page === 'rollouts') leave = await rolloutsPage(view);
    else if (page === 'tokens') leave = await tokensPage(view);
    else if (page === 'chat') leave = await chatPage(view, settings);
    else leave = await runsPage(view);
  } catch (e) {
    view.append(h('div', { class: 'panel error' }, (e as Error).message));
  }
  app.replaceChildren(view);
  view.dataset.ready = '1';
}

let last = '';
window.addEventListener('hashchange', () => {
  // a page's own query edits (history.replaceState) do not fire hashchange; a new page does
  if (location.hash !== last) void route();
  last = location.hash;
});
last = location.hash;
void route();
