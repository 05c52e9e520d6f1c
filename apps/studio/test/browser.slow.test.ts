/**
 * Lathe Studio in a real browser: Debian's Chromium driven headless by puppeteer-core, on a root made
 * by a real GRPO run (test/fixtures.ts). Each page is checked against the files it shows: the runs
 * and their states, a metric plot's points against metrics.jsonl (and a line appended while the page
 * is open), a rollout filter against the stored rows, the token colours against hand-set values and a
 * stored rollout's against its stored log-probs and entropies, and
 * a chat round-trip against the same request sent to the serve API directly. Screenshots go to
 * $LATHE_STUDIO_SCREENSHOTS (docs/images to refresh the guide's) or a temporary folder.
 */
import { appendFileSync, copyFileSync, existsSync, mkdirSync, mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import puppeteer, { type Browser, type Page } from 'puppeteer-core';
import { readEvalRollouts, readMetrics, readParquet, readTrainRollouts, RolloutStore } from '@lathe/data';
import { startStudio, type RunningStudio } from '@lathe/studio';
import { defaults, serveSchema, startServe } from '@lathe/recipes';
import { CHAT_RUN, CRITIC_LABELLED, LABELLED, makeRoot, studioConfig } from './fixtures';
import { tinyChatModel } from './chat-model';
import { splitThinking } from '../src/web/sse';

const CHROMIUM = process.env.LATHE_CHROMIUM ?? '/usr/bin/chromium';
const SHOTS = process.env.LATHE_STUDIO_SCREENSHOTS ?? mkdtempSync(join(tmpdir(), 'lathe-studio-shots-'));

let studio: RunningStudio;
let browser: Browser;
let page: Page;
let root: string;
let grpo: string;
let loads = 0;

/** Loads the app fresh at a route and waits until the page has rendered. */
async function open(route: string): Promise<void> {
  await page.goto(`${studio.url}?load=${++loads}#/${route}`);
  await page.waitForSelector('#app > div[data-ready]', { timeout: 20_000 });
}

const shot = (name: string, fullPage = true) => page.screenshot({ path: join(SHOTS, `studio-${name}.png`) as `${string}.png`, fullPage });

/** hsl(h, 70%, 80%) as the browser reports it (CSS Color 4's formula, written out here independently). */
function rgbOf(hue: number): string {
  const s = 0.7;
  const l = 0.8;
  const f = (n: number) => {
    const k = (n + hue / 30) % 12;
    return Math.round(255 * (l - s * Math.min(l, 1 - l) * Math.max(-1, Math.min(k - 3, 9 - k, 1))));
  };
  return `rgb(${f(0)}, ${f(8)}, ${f(4)})`;
}

beforeAll(async () => {
  if (!existsSync(CHROMIUM)) throw new Error(`${CHROMIUM}: no Chromium (apt-get install chromium, or set LATHE_CHROMIUM)`);
  mkdirSync(SHOTS, { recursive: true });
  const model = tinyChatModel('tiny-qwen3');
  ({ root, grpo } = await makeRoot({ chatRun: model }));
  studio = await startStudio(studioConfig(root, { model: `base=${model},tuned=${model}`, max_model_len: 128, poll_ms: 200 }));
  browser = await puppeteer.launch({ executablePath: CHROMIUM, headless: true, args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage'] });
  page = await browser.newPage();
  await page.setViewport({ width: 1280, height: 800 });
}, 120_000);
afterAll(async () => {
  await browser?.close();
  await studio?.close();
});

test('the runs page lists every run with its state; a run page shows its config and checkpoints', async () => {
  await open('runs');
  const rows = await page.$$eval('#runs tbody tr', (trs) => trs.map((tr) => ({ run: tr.getAttribute('data-run'), cells: [...tr.querySelectorAll('td')].map((td) => td.textContent ?? '') })));
  const by = Object.fromEntries(rows.map((r) => [r.run, r.cells]));
  expect(Object.keys(by).sort()).toEqual(['corrupt-store', grpo, 'no-metrics', 'sft-addition', CHAT_RUN, 'torn-metrics']);
  expect(by[grpo][3]).toMatch(/^ok/);
  expect(by[grpo][4]).toBe('3');
  expect(by[grpo][5]).toBe('1 (last 3)');
  const store = join(root, grpo, 'rollouts.sqlite');
  expect(by[grpo][7]).toBe(`${readTrainRollouts(store).length} train, ${readEvalRollouts(store).length} eval`);
  expect(by['torn-metrics'][3]).toMatch(/^partial.*half-written/);
  expect(by['no-metrics'][3]).toMatch(/^missing/);
  expect(by['corrupt-store'][7]).toBe('error');
  expect(by['corrupt-store'][3]).toMatch(/^ok/);
  await shot('runs');
  await open(`run/${grpo}`);
  expect(await page.$eval('#checkpoints', (t) => t.textContent)).toContain('step 3');
  expect(await page.$eval('#config', (t) => t.textContent)).toContain('builtin:addition');
  await shot('run', false);
  await open('run/corrupt-store');
  expect(await page.$eval('#rollouts-error', (e) => e.textContent)).toMatch(/corrupt-store\/rollouts.sqlite: .*not a database/);
  // two runs ticked on the runs page are the ones the metrics page compares
  await open('runs');
  for (const run of ['sft-addition', grpo]) await page.click(`#runs tbody tr[data-run="${run}"] input[type=checkbox]`);
  await page.click('#runs-compare button');
  await page.waitForSelector('#page-metrics .chart[data-metric] canvas');
  expect(await page.$$eval('#run-list input:checked', (i) => i.map((x) => (x as unknown as { value: string }).value).sort())).toEqual([grpo, 'sft-addition'].sort());
  expect(await page.$$eval('.chart[data-metric]', (c) => Object.keys(JSON.parse(c[0].getAttribute('data-points')!)).sort())).toEqual([grpo, 'sft-addition'].sort());
});

test('a metric plot holds the logged points, and a line appended while the page is open', async () => {
  await open(`metrics?runs=${grpo},torn-metrics&keys=loss,entropy,reward_mean,response_length_mean&smooth=0`);
  await page.waitForSelector('.chart[data-metric="entropy"] canvas');
  const lines = readMetrics(join(root, grpo, 'metrics.jsonl'));
  const want = lines.filter((l) => typeof l.entropy === 'number').map((l) => [l.step, l.entropy]);
  expect(want.length).toBe(3);
  const points = JSON.parse((await page.$eval('.chart[data-metric="entropy"]', (e) => e.getAttribute('data-points')))!);
  expect(points).toEqual({ [grpo]: want, 'torn-metrics': want });
  expect(await page.$eval('#metrics-status', (e) => e.textContent)).toMatch(/torn-metrics: .*half-written/);
  // hover: uPlot's legend shows the values under the cursor
  const over = (await page.$('.chart[data-metric="entropy"] .u-over'))!;
  const box = (await over.boundingBox())!;
  await page.mouse.move(box.x + box.width - 2, box.y + box.height / 2);
  const legend = await page.$$eval('.chart[data-metric="entropy"] .u-legend .u-value', (v) => v.map((x) => x.textContent));
  expect(Number(legend[1])).toBeCloseTo(want[2][1] as number, 3);

  // smoothing 0.5 draws the EMA of the points (hand-written here); log scale leaves zero losses out
  await open(`metrics?runs=${grpo}&keys=entropy,loss&smooth=0.5&log=1`);
  await page.waitForSelector('.chart[data-metric="loss"] canvas');
  const drawn = JSON.parse((await page.$eval('.chart[data-metric="entropy"]', (e) => e.getAttribute('data-drawn')))!);
  const e = want.map(([, v]) => v as number);
  expect(drawn.steps).toEqual(want.map(([s]) => s));
  expect(drawn[grpo][0]).toBeCloseTo(e[0], 12);
  expect(drawn[grpo][1]).toBeCloseTo(0.5 * e[0] + 0.5 * e[1], 12);
  expect(drawn[grpo][2]).toBeCloseTo(0.5 * (0.5 * e[0] + 0.5 * e[1]) + 0.5 * e[2], 12);
  const lossDrawn = JSON.parse((await page.$eval('.chart[data-metric="loss"]', (e) => e.getAttribute('data-drawn')))!);
  const losses = lines.filter((l) => typeof l.loss === 'number').map((l) => l.loss as number);
  let acc = losses[0];
  const ema = losses.map((v, i) => (i === 0 ? v : (acc = 0.5 * acc + 0.5 * v)));
  expect(lossDrawn[grpo]).toEqual(ema.map((v) => (v > 0 ? v : null)));

  // two kinds of run compared: the SFT run's loss points as logged
  await open(`metrics?runs=sft-addition,${grpo}&keys=loss,lr,grad_norm,eval_accuracy&smooth=0`);
  await page.waitForSelector('.chart[data-metric="eval_accuracy"] canvas');
  const sftLoss = readMetrics(join(root, 'sft-addition', 'metrics.jsonl')).filter((l) => typeof l.loss === 'number');
  expect(sftLoss.length).toBe(30);
  const loss = JSON.parse((await page.$eval('.chart[data-metric="loss"]', (e) => e.getAttribute('data-points')))!);
  expect(loss['sft-addition']).toEqual(sftLoss.map((l) => [l.step, l.loss]));
  await shot('metrics');

  const live = join(root, 'live');
  mkdirSync(live);
  copyFileSync(join(root, grpo, 'metrics.jsonl'), join(live, 'metrics.jsonl'));
  await open('metrics?runs=live&keys=loss');
  await page.waitForSelector('.chart[data-metric="loss"] canvas');
  appendFileSync(join(live, 'metrics.jsonl'), `${JSON.stringify({ step: 9, loss: 0.25 })}\n`);
  await page.waitForFunction(`document.querySelector('.chart[data-metric="loss"]')?.getAttribute('data-points')?.includes('[9,0.25]')`, { timeout: 5000 });
});

test('the step time of a run, stacked by phase: each phase as logged, the top of the stack at the logged step_ms', async () => {
  await open(`metrics?runs=${grpo},sft-addition&keys=loss&smooth=0`);
  await page.waitForSelector(`.chart[data-stack-run="${grpo}"] canvas`);
  const lines = readMetrics(join(root, grpo, 'metrics.jsonl')).filter((l) => typeof l.step_ms === 'number');
  expect(lines.length).toBe(3);
  const st = JSON.parse((await page.$eval(`.chart[data-stack-run="${grpo}"]`, (e) => e.getAttribute('data-stack')))!) as { phases: string[]; steps: number[]; values: number[][]; top: number[][] };
  expect(st.phases).toEqual(['generation_ms', 'scoring_ms', 'rewards_ms', 'training_ms', 'host_ms']);
  expect(st.steps).toEqual(lines.map((l) => l.step));
  expect(st.values).toEqual(st.phases.map((k) => lines.map((l) => l[k])));
  for (const [i, l] of lines.entries()) expect(st.top[st.phases.length - 1][i]).toBeCloseTo(l.step_ms as number, 6);
  // the SFT run's split (its host and run time) is drawn too; hover shows a phase's own time, not its stacked height
  expect(await page.$$eval('#step-time .chart', (c) => c.map((x) => x.getAttribute('data-stack-run')))).toEqual([grpo, 'sft-addition']);
  const over = (await page.$(`.chart[data-stack-run="${grpo}"] .u-over`))!;
  const box = (await over.boundingBox())!;
  await page.mouse.move(box.x + box.width - 2, box.y + box.height / 2);
  const legend = await page.$$eval(`.chart[data-stack-run="${grpo}"] .u-legend tr`, (rows) => rows.map((r) => [r.querySelector('.u-label')?.textContent, r.querySelector('.u-value')?.textContent]));
  const training = legend.find(([label]) => label === 'training')!;
  // four significant digits, as the legend writes them
  expect(Math.abs(Number(training[1]) / (lines[2].training_ms as number) - 1)).toBeLessThan(1e-3);
  await shot('step-time', false);
  // off: no stacked chart, and the address remembers it
  await page.click('#stacked');
  expect(await page.$$('#step-time .chart')).toHaveLength(0);
  expect(page.url()).toContain('stack=0');
});

test('a rollout filter shows the rows the same filter picks from the store; a row opens its group', async () => {
  const stored = readTrainRollouts(join(root, grpo, 'rollouts.sqlite'));
  const want = stored.filter((r) => r.step === 2 && r.prompt.includes('+1=')).sort((a, b) => a.prompt_index - b.prompt_index || a.rollout_index - b.rollout_index);
  await open(`rollouts?run=${grpo}`);
  await page.waitForSelector('#rollout-table tbody tr');
  await page.type('#filters input[name=step]', '2');
  await page.type('#filters input[name=prompt]', '+1=');
  await page.click('#apply');
  await page.waitForFunction(`document.querySelector('#page-info')?.textContent?.includes('of ${want.length}') && document.querySelectorAll('#rollout-table tbody tr').length === ${want.length}`);
  const ids = await page.$$eval('#rollout-table tbody tr', (trs) => trs.map((tr) => Number(tr.getAttribute('data-id'))));
  expect(want.length).toBeGreaterThan(0);
  expect(ids).toEqual(want.map((r) => r.id));
  await page.click('#rollout-table tbody tr');
  await page.waitForSelector('#rollout-group .completion');
  const group = await page.$$eval('#rollout-group .completion', (d) => d.map((x) => Number(x.getAttribute('data-id'))));
  expect(group).toEqual(stored.filter((r) => r.step === 2 && r.prompt_index === want[0].prompt_index).map((r) => r.id));
  await shot('rollouts');
});

test('a click on a header sorts the table in the query: the first row is the longest, then the shortest; by reward, the highest, then the lowest', async () => {
  type Stored = { id: number; step: number; prompt_index: number; rollout_index: number; reward?: number | null; advantage?: number | null; extra?: Record<string, unknown> | null };
  const order = (a: Stored, b: Stored) => a.step - b.step || a.prompt_index - b.prompt_index || a.rollout_index - b.rollout_index || a.id - b.id;
  const firstBy = (rows: Stored[], key: (r: Stored) => number, desc: boolean) => [...rows].sort((a, b) => (desc ? key(b) - key(a) : key(a) - key(b)) || order(a, b))[0].id;
  const firstId = () => page.$eval('#rollout-table tbody tr', (tr) => Number(tr.getAttribute('data-id')));
  /** Clicks a header and waits for the table the answer rebuilds, sorted that way. */
  const sortBy = async (key: string, dir: 'ascending' | 'descending') => {
    await page.click(`#rollout-table th[data-sort=${key}]`);
    await page.waitForFunction(`document.querySelector('#rollout-table th[data-sort=${key}]')?.getAttribute('aria-sort') === '${dir}'`);
    return firstId();
  };
  // the GRPO run's completions differ in length (its rewards are all 0 after 3 steps of a random model)
  const stored = readTrainRollouts(join(root, grpo, 'rollouts.sqlite'));
  const len = (r: Stored) => (r.extra!.tokens as number[]).length;
  expect(new Set(stored.map(len)).size).toBeGreaterThan(1);
  await open(`rollouts?run=${grpo}`);
  await page.waitForSelector('#rollout-table tbody tr');
  expect(await sortBy('length', 'descending')).toBe(firstBy(stored, len, true));
  expect(await sortBy('length', 'ascending')).toBe(firstBy(stored, len, false));
  // step starts from its natural order (oldest first); a second click shows the newest first
  expect(await sortBy('step', 'ascending')).toBe(firstBy(stored, (r) => r.step, false));
  expect(await sortBy('step', 'descending')).toBe(firstBy(stored, (r) => r.step, true));

  // a store with rewards and advantages spread out: 64 rollouts, written as the trainer writes them
  const dir = join(root, 'mixed-rewards');
  mkdirSync(dir);
  copyFileSync(join(root, grpo, 'config.yaml'), join(dir, 'config.yaml'));
  const store = await RolloutStore.open(join(dir, 'rollouts.sqlite'), { flushIntervalMs: 0 });
  for (let i = 0; i < 64; i++) store.addTrain({ step: 1 + (i >> 4), epoch: 0, prompt_index: (i >> 2) % 4, rollout_index: i % 4, prompt: `${i % 5}+${i % 3}=`, completion: String((i * 7) % 10), reward: ((i * 37) % 64) / 64, advantage: (((i * 11) % 16) - 8) / 8, extra: { tokens: [3 + (i % 10)] } });
  await store.close();
  const mixed = readTrainRollouts(join(dir, 'rollouts.sqlite'));
  await open('rollouts?run=mixed-rewards');
  await page.waitForSelector('#rollout-table tbody tr');
  expect(await sortBy('reward', 'descending')).toBe(firstBy(mixed, (r) => r.reward!, true));
  await shot('rollouts-sorted');
  expect(await sortBy('reward', 'ascending')).toBe(firstBy(mixed, (r) => r.reward!, false));
  expect(await sortBy('advantage', 'descending')).toBe(firstBy(mixed, (r) => r.advantage!, true));
  // the sort is kept in the address: a reload shows the same first row
  expect(page.url()).toContain('sort=advantage&desc=1');
  await page.reload();
  await page.waitForSelector('#rollout-table tbody tr');
  expect(await firstId()).toBe(firstBy(mixed, (r) => r.advantage!, true));
});

test('the token view colours each token by its log-prob and by its Q, red lowest to green highest', async () => {
  await open(`tokens?file=${grpo}/labelled.parquet&row=1`);
  await page.waitForSelector('#tokens .tok');
  const read = () => page.$$eval('#tokens .tok', (s) => s.map((x) => ({ text: x.textContent, bg: (globalThis as unknown as { getComputedStyle(e: unknown): { backgroundColor: string } }).getComputedStyle(x).backgroundColor, title: x.getAttribute('title') })));
  const hue = (vals: number[], v: number) => Math.round((120 * (v - Math.min(...vals))) / (Math.max(...vals) - Math.min(...vals)));
  let cells = await read();
  expect(cells.map((c) => c.text).join('')).toBe(LABELLED.text);
  expect(cells.map((c) => c.bg)).toEqual(LABELLED.logprobs.map((v) => rgbOf(hue(LABELLED.logprobs, v))));
  expect(cells[3].bg).toBe('rgb(240, 168, 168)'); // -6, the lowest log-prob: red
  expect(cells[0].bg).toBe('rgb(168, 240, 168)'); // -0.05, the highest: green
  expect(cells[1].title).toContain('"9"  Q 0.8');
  await shot('tokens');
  expect(await page.$$eval('#trajectory-rows tbody tr', (t) => t.map((x) => x.getAttribute('data-row')))).toEqual(['0', '1']);
  await page.select('#colour-by', 'q');
  cells = await read();
  const q = LABELLED.q.map((c) => c[0]);
  expect(cells.map((c) => c.bg)).toEqual(q.map((v) => rgbOf(hue(q, v))));
  expect(cells[3].bg).toBe('rgb(240, 168, 168)'); // Q 0.05
  // a click on row 0 of the table shows its tokens (no values stored: uncoloured)
  await page.click('#trajectory-rows tbody tr[data-row="0"]');
  await page.waitForFunction(`[...document.querySelectorAll('#tokens .tok')].map((t) => t.textContent).join('') === '12'`);
  expect((await read()).map((c) => c.bg)).toEqual(['rgba(0, 0, 0, 0)', 'rgba(0, 0, 0, 0)']);
  // …and its prompt's group: the one completion of prompt 0, decoded
  await page.waitForSelector('#trajectory-group .completion');
  expect(await page.$$eval('#trajectory-group .completion', (d) => d.map((x) => [x.getAttribute('data-row'), x.querySelector('.mono')?.textContent]))).toEqual([['0', '12']]);
  // a length filter: only the 4-token row has at least 3 tokens
  await page.type('#traj-min_length', '3');
  await page.click('#traj-filter');
  await page.waitForFunction(`document.querySelectorAll('#trajectory-rows tbody tr').length === 1`);
  expect(await page.$$eval('#trajectory-rows tbody tr', (t) => t.map((x) => x.getAttribute('data-row')))).toEqual(['1']);
});

test('a stored rollout: tokens coloured by their log-prob and by their entropy, with a legend naming both ends', async () => {
  const stored = readTrainRollouts(join(root, grpo, 'rollouts.sqlite'));
  // a completion whose tokens' values differ, so every colour is defined by the row's range
  const r = stored.find((x) => (x.logprobs?.length ?? 0) >= 5 && new Set(x.logprobs).size >= 4 && new Set(x.entropies).size >= 4)!;
  expect(r).toBeDefined();
  await open(`tokens?run=${grpo}&table=train&id=${r.id}`);
  await page.waitForSelector('#tokens .tok');
  const read = () => page.$$eval('#tokens .tok', (s) => s.map((x) => ({ bg: (globalThis as unknown as { getComputedStyle(e: unknown): { backgroundColor: string } }).getComputedStyle(x).backgroundColor, title: x.getAttribute('title') })));
  const t = (vals: number[], v: number) => (v - Math.min(...vals)) / (Math.max(...vals) - Math.min(...vals));
  const lp = r.logprobs!;
  let cells = await read();
  expect(cells.length).toBe(lp.length);
  // log-prob: red at the least likely token, green at the most likely
  expect(cells.map((c) => c.bg)).toEqual(lp.map((v) => rgbOf(Math.round(120 * t(lp, v)))));
  expect(cells[lp.indexOf(Math.min(...lp))].bg).toBe('rgb(240, 168, 168)');
  expect(cells[0].title).toContain(`logprob ${lp[0].toPrecision(4)}`);
  expect(cells[0].title).toContain(`entropy ${r.entropies![0].toPrecision(4)}`);
  let legend = await page.$eval('#legend', (e) => e.textContent);
  expect(legend).toContain(`logprob`);
  expect(legend).toContain(`${Math.min(...lp).toPrecision(4)} (lowest)`);
  expect(legend).toContain(`${Math.max(...lp).toPrecision(4)} (highest)`);
  await shot('logprobs', false);
  // entropy: red where the policy was most uncertain (highest), green where it was surest
  await page.select('#colour-by', 'entropy');
  const ent = r.entropies!;
  cells = await read();
  expect(cells.map((c) => c.bg)).toEqual(ent.map((v) => rgbOf(Math.round(120 * (1 - t(ent, v))))));
  expect(cells[ent.indexOf(Math.max(...ent))].bg).toBe('rgb(240, 168, 168)');
  legend = await page.$eval('#legend', (e) => e.textContent);
  expect(legend).toContain(`${Math.max(...ent).toPrecision(4)} (highest)`);
  await shot('entropy', false);
});

test("lathe critic label's output: tokens coloured by the reference policy's entropy, red where it was least sure", async () => {
  const table = await readParquet(join(root, grpo, CRITIC_LABELLED));
  const list = (name: string, i: number) => Array.from((table.getChild(name)!.get(i) as { toArray(): ArrayLike<number> }).toArray(), Number);
  // the completion whose entropies differ most often (the first such), so the colours span the row's range
  const distinct = (i: number) => new Set(list('token_entropies', i)).size;
  const row = Array.from({ length: table.numRows }, (_, i) => i).reduce((best, i) => (distinct(i) > distinct(best) ? i : best), 0);
  expect(distinct(row)).toBeGreaterThanOrEqual(3);
  const ent = list('token_entropies', row);
  await open(`tokens?file=${grpo}/${CRITIC_LABELLED}&row=${row}`);
  await page.waitForSelector('#tokens .tok');
  // entropy first (the file has no log-probs); q only where a sampled token is among its position's candidates
  const options = await page.$$eval('#colour-by option', (o) => o.map((x) => (x as unknown as { value: string }).value));
  expect([options[0], options.at(-1)]).toEqual(['entropy', '']);
  const cells = await page.$$eval('#tokens .tok', (s) => s.map((x) => ({ bg: (globalThis as unknown as { getComputedStyle(e: unknown): { backgroundColor: string } }).getComputedStyle(x).backgroundColor, title: x.getAttribute('title') })));
  const t = (v: number) => (v - Math.min(...ent)) / (Math.max(...ent) - Math.min(...ent));
  expect(cells.map((c) => c.bg)).toEqual(ent.map((v) => rgbOf(Math.round(120 * (1 - t(v))))));
  expect(cells[ent.indexOf(Math.max(...ent))].bg).toBe('rgb(240, 168, 168)');
  expect(cells[0].title).toContain(`entropy ${ent[0].toPrecision(4)}`);
  await shot('critic-entropy', false);
});

test('chat with two models side by side answers as the serve API does', async () => {
  await open('chat');
  expect(await page.$$eval('#model-0 optgroup[label="served models"] option', (o) => o.map((x) => x.textContent))).toEqual(['base', 'tuned']);
  await page.select('#model-0', 'base');
  await page.select('#model-1', 'tuned');
  for (const [sel, v] of [['#max_tokens', '12'], ['#seed', '5']]) {
    await page.$eval(sel, (e) => ((e as unknown as { value: string }).value = ''));
    await page.type(sel, v);
  }
  await page.type('#message', 'What is 2+2?');
  await page.click('#send');
  await page.waitForSelector('#log-1 .msg.assistant[data-finish]', { timeout: 30_000 });
  await page.waitForSelector('#log-0 .msg.assistant[data-finish]', { timeout: 30_000 });
  const shown = await page.$$eval('.msg.assistant .content', (e) => e.map((x) => x.textContent));
  const direct = async (model: string) => {
    const r = await fetch(`${studio.chatUrl}/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model, messages: [{ role: 'user', content: 'What is 2+2?' }], temperature: 0.7, top_p: 1, max_tokens: 12, seed: 5, chat_template_kwargs: { enable_thinking: false } }),
    });
    return ((await r.json()) as { choices: { message: { content: string } }[] }).choices[0].message.content;
  };
  const answers = [await direct('base'), await direct('tuned')];
  expect(answers[0].length).toBeGreaterThan(0);
  expect(shown).toEqual(answers.map((a) => a || '(empty)'));
  await shot('chat');
}, 60_000);

/**
 * `lathe studio --serve_url` against a running `lathe serve` of the two checkpoints (s1, s2): the
 * picker lists the models that server lists at GET /v1/models (and no in-process checkpoints), and
 * each side's reply equals that server's own answer (`answers`).
 */
async function checkpointsThroughServeUrl(serveUrl: string, answers: string[], thinkingReplies: string[]): Promise<void> {
  const listed = ((await (await fetch(`${serveUrl}/models`)).json()) as { data: { id: string }[] }).data.map((m) => m.id);
  expect(listed).toEqual(['s1', 's2']);
  const remote = await startStudio(studioConfig(root, { serve_url: serveUrl }));
  const tab = await browser.newPage();
  try {
    await tab.setViewport({ width: 1280, height: 800 });
    await tab.goto(`${remote.url}#/chat`);
    await tab.waitForSelector('#app > div[data-ready]', { timeout: 20_000 });
    const groups = await tab.$$eval('#model-0 optgroup', (g) => g.map((x) => [x.getAttribute('label'), [...x.querySelectorAll('option')].map((o) => o.textContent)]));
    expect(groups).toEqual([[`models at ${serveUrl}`, listed]]);
    expect(await tab.$eval('#serve-url', (e) => e.textContent)).toContain(serveUrl);
    await tab.select('#model-0', 's1');
    await tab.select('#model-1', 's2');
    for (const [sel, v] of [['#max_tokens', '40'], ['#seed', '3']]) {
      await tab.$eval(sel, (e) => ((e as unknown as { value: string }).value = ''));
      await tab.type(sel, v);
    }
    await tab.type('#message', 'What is 2+2?');
    await tab.click('#send');
    await tab.waitForSelector('#log-0 .msg.assistant[data-finish]', { timeout: 60_000 });
    await tab.waitForSelector('#log-1 .msg.assistant[data-finish]', { timeout: 60_000 });
    expect(await tab.$$eval('.msg.assistant .content', (e) => e.map((x) => x.textContent))).toEqual(answers.map((a) => a || '(empty)'));
    await tab.screenshot({ path: join(SHOTS, 'studio-chat-serve-url.png') as `${string}.png`, fullPage: true });
    // A new conversation with thinking on: each side shows the reply's thinking apart from its answer,
    // as the server's own reply (asked with enable_thinking: true) splits at </think>.
    await tab.reload();
    await tab.waitForSelector('#app > div[data-ready]', { timeout: 20_000 });
    await tab.select('#model-0', 's1');
    await tab.select('#model-1', 's2');
    for (const [sel, v] of [['#max_tokens', '40'], ['#seed', '3']]) {
      await tab.$eval(sel, (e) => ((e as unknown as { value: string }).value = ''));
      await tab.type(sel, v);
    }
    await tab.click('#thinking');
    expect(await tab.$eval('#thinking', (e) => (e as unknown as { checked: boolean }).checked)).toBe(true);
    await tab.type('#message', 'What is 2+2?');
    await tab.click('#send');
    await tab.waitForSelector('#log-0 .msg.assistant[data-finish]', { timeout: 60_000 });
    await tab.waitForSelector('#log-1 .msg.assistant[data-finish]', { timeout: 60_000 });
    const split = thinkingReplies.map((r) => splitThinking(r));
    expect(await tab.$$eval('.msg.assistant .content', (e) => e.map((x) => x.textContent))).toEqual(split.map((x) => x.answer || '(empty)'));
    const thoughts = await tab.$$eval('.msg.assistant', (e) => e.map((x) => x.querySelector('.thinking')?.textContent ?? ''));
    expect(thoughts).toEqual(split.map((x) => x.reasoning));
  } finally {
    await tab.close();
    await remote.close();
  }
}

test('chat with two checkpoints of a run, one per side: each reply streams in token by token and equals the checkpoint served directly', async () => {
  await open('chat');
  const options = await page.$$eval('#model-0 option', (o) => o.map((x) => ({ value: (x as unknown as { value: string }).value, text: x.textContent, disabled: (x as unknown as { disabled: boolean }).disabled })));
  // every checkpoint of every run is listed: the chat run's two, and the built-in runs' (no tokenizer files: disabled)
  expect(options.filter((o) => o.value.startsWith(`checkpoint:${CHAT_RUN}@`)).map((o) => [o.text, o.disabled])).toEqual([
    [`${CHAT_RUN} · step 1`, false],
    [`${CHAT_RUN} · step 2`, false],
  ]);
  expect(options.find((o) => o.value === `checkpoint:${grpo}@3`)).toMatchObject({ disabled: true, text: `${grpo} · step 3 (cannot chat)` });
  await page.select('#model-0', `checkpoint:${CHAT_RUN}@1`);
  await page.select('#model-1', `checkpoint:${CHAT_RUN}@2`);
  for (const [sel, v] of [['#max_tokens', '40'], ['#seed', '3']]) {
    await page.$eval(sel, (e) => ((e as unknown as { value: string }).value = ''));
    await page.type(sel, v);
  }
  // record the reply's text each time the page changes it (one record per task that changed it)
  await page.evaluate(() => {
    const g = globalThis as unknown as { seen: string[][]; MutationObserver: new (f: () => void) => { observe(n: unknown, o: unknown): void }; document: { querySelector(s: string): { textContent: string } | null } };
    g.seen = [[], []];
    for (const i of [0, 1]) new g.MutationObserver(() => g.seen[i].push(g.document.querySelector(`#log-${i} .msg.assistant.streaming .content`)?.textContent ?? '')).observe(g.document.querySelector(`#log-${i}`), { subtree: true, childList: true, characterData: true, attributes: true });
  });
  await page.type('#message', 'What is 2+2?');
  await page.click('#send');
  await page.waitForSelector('#log-0 .msg.assistant[data-finish]', { timeout: 60_000 });
  await page.waitForSelector('#log-1 .msg.assistant[data-finish]', { timeout: 60_000 });
  const shown = await page.$$eval('.msg.assistant .content', (e) => e.map((x) => x.textContent));
  const seen = (await page.evaluate('seen')) as string[][];
  const stored = join(root, CHAT_RUN, 'checkpoints');
  // both checkpoints served by lathe serve itself, asked the same without streaming
  const serve = await startServe({ ...defaults(serveSchema), model: [1, 2].map((s) => `s${s}=${join(stored, `step-${String(s).padStart(8, '0')}`)}`).join(','), port: 0, max_model_len: 256, max_rows: 4 });
  const direct = async (model: string, thinking = false) => {
    const r = await fetch(`${serve.url}/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model, messages: [{ role: 'user', content: 'What is 2+2?' }], temperature: 0.7, top_p: 1, max_tokens: 40, seed: 3, chat_template_kwargs: { enable_thinking: thinking } }),
    });
    return ((await r.json()) as { choices: { message: { content: string } }[] }).choices[0].message.content;
  };
  const answers = [await direct('s1'), await direct('s2')];
  const thinkingReplies = [await direct('s1', true), await direct('s2', true)];
  expect(thinkingReplies).not.toEqual(answers); // the switch reached the template
  try {
    await checkpointsThroughServeUrl(serve.url, answers, thinkingReplies);
  } finally {
    await serve.close();
  }
  expect(shown).toEqual(answers.map((a) => a || '(empty)'));
  expect(answers[0]).not.toBe(answers[1]); // two different checkpoints answered
  for (const [i, answer] of answers.entries()) {
    // the text grew in steps, each a prefix of the reply: shown before the reply was complete
    const partial = [...new Set(seen[i].filter((t) => t !== '' && t !== answer))];
    expect(partial.length).toBeGreaterThanOrEqual(2);
    for (const t of partial) expect(answer.startsWith(t)).toBe(true);
  }
  await shot('chat-checkpoints');
}, 180_000);
