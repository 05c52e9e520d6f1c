/**
 * The token-value page of `lathe extract generate` in a real browser (Debian's Chromium, headless,
 * through puppeteer-core as the studio's browser test drives it), opened from its file with every
 * network request refused: each prompt and sample is listed with its outcome, each token's colour is
 * the hue of its Q (or, switched, the shade of its expected remaining length), and hovering a token
 * shows its candidates with their Q, π_ref and π* =
 * π_ref·exp(Q/τ) renormalised, computed here by hand. The screenshot goes to
 * $LATHE_EXTRACT_SCREENSHOTS (docs/images to refresh the guide's) or a temporary folder.
 */
import { existsSync, mkdirSync, mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import puppeteer, { type Browser } from 'puppeteer-core';
import { writeTokenValuePage, type TokenValueRow } from '@lathe/recipes';

const CHROMIUM = process.env.LATHE_CHROMIUM ?? '/usr/bin/chromium';
const SHOTS = process.env.LATHE_EXTRACT_SCREENSHOTS ?? mkdtempSync(join(tmpdir(), 'lathe-extract-shots-'));

/** hsl(h, 70%, l) as the browser reports it (CSS Color 4's formula, written out independently). */
function rgbOf(hue: number, l = 0.8): string {
  const s = 0.7;
  const f = (n: number) => {
    const k = (n + hue / 30) % 12;
    return Math.round(255 * (l - s * Math.min(l, 1 - l) * Math.max(-1, Math.min(k - 3, 9 - k, 1))));
  };
  return `rgb(${f(0)}, ${f(8)}, ${f(4)})`;
}

// a small vocabulary; id 9 is '<b>' to check that token text is never read as markup
const VOCAB = ['Let', ' me', ' add', ':', ' 17', ' + ', '25', ' = ', '42', '<b>', '32', ' carry', ' the', ' 1', '.', ' So', ' 41', ' 12', ' 13'];
const lp = (ps: number[]) => ps.map(Math.log);
const row = (prompt_idx: number, correct: number, toks: number[], qs: number[], cands: { ids: number[]; q: number[]; p: number[] }[]): TokenValueRow => ({
  prompt_idx,
  prompt: prompt_idx === 0 ? 'What is 17 + 25?' : 'What is 3 + 9?',
  output_token_ids: toks,
  correct,
  token_q_values: qs,
  candidate_ids: cands.map((c) => c.ids),
  candidate_q_values: cands.map((c) => c.q),
  candidate_ref_logprobs: cands.map((c) => lp(c.p)),
  token_remaining: toks.map((_, t) => toks.length - 1 - t + 0.25),
});
const same = (id: number, q: number) => ({ ids: [id], q: [q], p: [1] });
const ROWS: TokenValueRow[] = [
  row(0, 1, [0, 1, 2, 3, 4, 5, 6, 7, 8], [0.55, 0.56, 0.58, 0.6, 0.62, 0.63, 0.66, 0.7, 0.97], [same(0, 0.55), same(1, 0.56), same(2, 0.58), same(3, 0.6), same(4, 0.62), same(5, 0.63), same(6, 0.66), same(7, 0.7), { ids: [8, 10, 16], q: [0.97, 0.04, 0.02], p: [0.6, 0.3, 0.1] }]),
  row(0, 0, [0, 1, 2, 3, 4, 5, 6, 7, 10, 9], [0.55, 0.56, 0.58, 0.6, 0.62, 0.63, 0.66, 0.7, 0.04, 0.03], [same(0, 0.55), same(1, 0.56), same(2, 0.58), same(3, 0.6), same(4, 0.62), same(5, 0.63), same(6, 0.66), same(7, 0.7), { ids: [8, 10, 16], q: [0.97, 0.04, 0.02], p: [0.6, 0.3, 0.1] }, same(9, 0.03)]),
  row(1, 1, [11, 12, 13, 14, 15, 17], [0.4, 0.45, 0.5, 0.52, 0.6, 0.93], [same(11, 0.4), same(12, 0.45), same(13, 0.5), same(14, 0.52), same(15, 0.6), { ids: [17, 18], q: [0.93, 0.05], p: [0.5, 0.5] }]),
];
const TAU = 0.5;

let browser: Browser;
beforeAll(async () => {
  if (!existsSync(CHROMIUM)) throw new Error(`${CHROMIUM}: no Chromium (apt-get install chromium, or set LATHE_CHROMIUM)`);
  mkdirSync(SHOTS, { recursive: true });
  browser = await puppeteer.launch({ executablePath: CHROMIUM, headless: true, args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage'] });
}, 60_000);
afterAll(async () => {
  await browser?.close();
});

test('the page lists prompts, samples and outcomes, colours tokens by Q and shows the candidates on hover', async () => {
  const file = join(mkdtempSync(join(tmpdir(), 'extract-page-')), 'run.html');
  writeTokenValuePage(file, { title: 'lathe extract generate: math.jsonl', tau: TAU, rows: ROWS, decode: (id) => VOCAB[id] });
  const page = await browser.newPage();
  await page.setViewport({ width: 900, height: 420 });
  const requests: string[] = [];
  await page.setRequestInterception(true);
  page.on('request', (r) => {
    requests.push(r.url());
    if (r.url().startsWith('file:')) void r.continue();
    else void r.abort();
  });
  await page.goto(`file://${file}`);
  await page.waitForSelector('.prompt');
  expect(requests.every((u) => u.startsWith('file:'))).toBe(true); // self-contained: nothing fetched

  const boxes = await page.$$eval('.prompt', (els) => els.map((e) => ({ head: e.querySelector('.prompt-text')!.textContent, samples: [...e.querySelectorAll('.sample')].map((s) => ({ outcome: s.querySelector('.outcome')!.textContent, tokens: [...s.querySelectorAll('.tok')].map((t) => ({ text: t.textContent, bg: (globalThis as unknown as { getComputedStyle(e: unknown): { backgroundColor: string } }).getComputedStyle(t).backgroundColor })) })) })));
  expect(boxes.map((b) => b.head)).toEqual(['#0  What is 17 + 25?', '#1  What is 3 + 9?']);
  expect(boxes.map((b) => b.samples.map((s) => s.outcome))).toEqual([['✓ correct', '✗ wrong'], ['✓ correct']]);
  const byPrompt = [ROWS.slice(0, 2), ROWS.slice(2)];
  byPrompt.forEach((rows, p) =>
    rows.forEach((r, s) => {
      const shown = boxes[p].samples[s].tokens;
      expect(shown.map((t) => t.text)).toEqual(Array.from(r.output_token_ids).map((id) => VOCAB[id]));
      expect(shown.map((t) => t.bg)).toEqual(Array.from(r.token_q_values).map((q) => rgbOf(Math.round(120 * q))));
    }),
  );
  expect(await page.$('.tok b')).toBeNull(); // '<b>' is text, not an element

  // coloured by the expected remaining length instead: light (0) to dark (the longest, 9.25 here)
  await page.select('#colour-by', 'remaining');
  const shaded = await page.$$eval('.prompt:first-child .sample:nth-child(3) .tok', (els) => els.map((t) => (globalThis as unknown as { getComputedStyle(e: unknown): { backgroundColor: string } }).getComputedStyle(t).backgroundColor));
  const max = Math.max(...ROWS.flatMap((r) => Array.from(r.token_remaining!)));
  expect(shaded).toEqual(Array.from(ROWS[1].token_remaining!).map((r) => rgbOf(210, Math.round(92 - (32 * r) / max) / 100)));
  expect(await page.$eval('#legend-remaining', (e) => (e as unknown as { hidden: boolean }).hidden)).toBe(false);
  await page.select('#colour-by', 'q');
  expect(await page.$eval('.prompt:first-child .sample:nth-child(3) .tok', (t) => (globalThis as unknown as { getComputedStyle(e: unknown): { backgroundColor: string } }).getComputedStyle(t).backgroundColor)).toBe(rgbOf(Math.round(120 * ROWS[1].token_q_values[0])));

  // hover the wrong sample's '32': its candidates '42', '32', ' 41' with Q, π_ref and π* by hand
  const token = (await page.$$('.prompt:first-child .sample:nth-child(3) .tok'))[8];
  await token.hover();
  await page.waitForSelector('#tip', { visible: true });
  const tip = await page.$$eval('#tip tr', (trs) => trs.map((tr) => ({ chosen: tr.className === 'chosen', cells: [...tr.children].map((c) => c.textContent) })));
  const c = ROWS[1].candidate_ids![8];
  const q = ROWS[1].candidate_q_values![8];
  const p = [0.6, 0.3, 0.1];
  const w = p.map((pi, k) => pi * Math.exp(q[k] / TAU));
  const z = w.reduce((a, b) => a + b, 0);
  expect(tip[0].cells).toEqual(['candidate', 'Q', 'π_ref', 'π*']);
  expect(tip.slice(1).map((t) => t.cells)).toEqual(Array.from(c).map((id, k) => [VOCAB[id], q[k].toFixed(3), p[k].toFixed(3), (w[k] / z).toFixed(3)]));
  expect(tip.slice(1).map((t) => t.chosen)).toEqual([false, true, false]);
  expect(await page.$eval('#tip', (e) => e.textContent)).toContain('Q 0.040 · E[remaining] 1.3');
  await page.screenshot({ path: join(SHOTS, 'extract-tokens.png') as `${string}.png` });
  await token.hover().then(() => page.mouse.move(5, 5));
  await page.waitForSelector('#tip', { hidden: true });
}, 60_000);
