/**
 * The token-value view of a Q-weighted run: one self-contained HTML file (no server, no external
 * resources) listing each prompt with its samples and outcomes; every generated token is coloured
 * by its Q (red 0 → green 1) or, switched in the page, by the critic's expected remaining length,
 * and on hover shows the candidates it was drawn from with their Q, π_ref and π* = π_ref·exp(Q/τ)
 * renormalised.
 */
import { writeAtomic, type Trajectory } from '@lathe/data';

/** What the page shows of one sample. */
export interface TokenValueRow extends Pick<Trajectory, 'prompt_idx' | 'prompt' | 'output_token_ids' | 'correct' | 'candidate_ids' | 'candidate_q_values' | 'candidate_ref_logprobs'> {
  token_q_values: ArrayLike<number>;
  /** Expected remaining length per token, when the critic gave it. */
  token_remaining?: ArrayLike<number>;
}

/** Options of {@link tokenValuePage}. */
export interface TokenValuePageOptions {
  title: string;
  /** The run's τ (the hover's π* column); Infinity: π_ref over the candidates. */
  tau: number;
  rows: readonly TokenValueRow[];
  /** A token id's text. */
  decode(id: number): string;
}

/** JSON for a `<script>` element: `<` escaped, so no text in it can close the element. */
const scriptJson = (v: unknown) => JSON.stringify(v).replace(/</g, '\\u003c');
const escapeHtml = (s: string) => s.replace(/[&<>"']/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' })[c]!);

/** The page's HTML. */
export function tokenValuePage(o: TokenValuePageOptions): string {
  const texts = new Map<number, string>();
  const text = (id: number) => {
    let t = texts.get(id);
    if (t === undefined) texts.set(id, (t = o.decode(id)));
    return t;
  };
  const prompts = new Map<number, { prompt: string; samples: unknown[] }>();
  for (const r of o.rows) {
    const entry = prompts.get(r.prompt_idx) ?? { prompt: r.prompt, samples: [] };
    prompts.set(r.prompt_idx, entry);
    const out = Array.from(r.output_token_ids);
    entry.samples.push({
      correct: r.correct ?? null,
      tokens: out.map((id, t) => ({
        id,
        q: r.token_q_values[t],
        rem: r.token_remaining && Number.isFinite(r.token_remaining[t]) ? r.token_remaining[t] : null,
        c: (r.candidate_ids?.[t] ? Array.from(r.candidate_ids[t]) : []).map((cid, k) => ({ id: cid, q: r.candidate_q_values?.[t]?.[k] ?? null, lp: r.candidate_ref_logprobs?.[t]?.[k] ?? null })),
      })),
    });
    for (const id of out) text(id);
    for (const cs of r.candidate_ids ?? []) for (const id of Array.from(cs)) text(id);
  }
  const remainders = o.rows.flatMap((r) => Array.from(r.token_remaining ?? []).filter((v) => Number.isFinite(v)));
  const hasRemaining = remainders.length > 0;
  const maxRemaining = Math.max(1, ...remainders);
  const data = { tau: Number.isFinite(o.tau) ? o.tau : null, maxRemaining, texts: Object.fromEntries(texts), prompts: [...prompts.entries()].sort((a, b) => a[0] - b[0]).map(([idx, p]) => ({ idx, ...p })) };
  return `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>${escapeHtml(o.title)}</title>
<style>
body { font: 14px/1.5 system-ui, sans-serif; margin: 24px; color: #222; }
h1 { font-size: 18px; } .legend { margin-bottom: 16px; color: #555; }
.prompt { border: 1px solid #ddd; border-radius: 6px; padding: 12px; margin-bottom: 16px; }
.prompt-text { white-space: pre-wrap; font-weight: 600; margin-bottom: 8px; }
.sample { margin: 6px 0; font-family: ui-monospace, monospace; white-space: pre-wrap; }
.outcome { display: inline-block; min-width: 64px; font-family: system-ui, sans-serif; font-size: 12px; }
.ok { color: #176b2c; } .bad { color: #a11; } .none { color: #777; }
.tok { border-radius: 3px; padding: 1px 0; cursor: default; }
#tip { position: fixed; display: none; background: #fff; border: 1px solid #999; border-radius: 4px; padding: 6px 8px; box-shadow: 0 2px 8px rgba(0,0,0,.2); font-size: 12px; z-index: 10; }
#tip table { border-collapse: collapse; } #tip td, #tip th { padding: 1px 6px; text-align: right; } #tip td:first-child, #tip th:first-child { text-align: left; font-family: ui-monospace, monospace; }
#tip tr.chosen { font-weight: 700; background: #eef; }
</style></head>
<body>
<h1>${escapeHtml(o.title)}</h1>
<div class="legend">Colour each token by <select id="colour-by"><option value="q">the critic's Q</option><option value="remaining"${hasRemaining ? '' : ' disabled'}>the expected remaining length</option></select>
<span id="legend-q">(Q: <span style="background:hsl(0,70%,80%)">0</span> → <span style="background:hsl(120,70%,80%)">1</span>)</span><span id="legend-remaining" hidden>(remaining: <span style="background:hsl(210,70%,92%)">0</span> → <span style="background:hsl(210,70%,60%)">${Math.round(maxRemaining)}</span> tokens)</span>;
hover a token for the candidates it was drawn from. τ = ${Number.isFinite(o.tau) ? o.tau : '∞'}.</div>
<div id="prompts"></div>
<div id="tip"></div>
<script id="data" type="application/json">${scriptJson(data)}</script>
<script>
(function () {
  var data = JSON.parse(document.getElementById('data').textContent);
  var tip = document.getElementById('tip');
  var root = document.getElementById('prompts');
  function show(id) { return JSON.stringify(data.texts[id] === undefined ? '#' + id : data.texts[id]).slice(1, -1); }
  function colour(q) { if (q === null || isNaN(q)) return '#eee'; var c = Math.max(0, Math.min(1, q)); return 'hsl(' + Math.round(120 * c) + ',70%,80%)'; }
  // remaining length: light (none left) to dark blue (the run's longest), whole percent steps of lightness
  function shade(r) { if (r === null || isNaN(r)) return '#eee'; var c = Math.max(0, Math.min(1, r / data.maxRemaining)); return 'hsl(210,70%,' + Math.round(92 - 32 * c) + '%)'; }
  var spans = [];
  function paint(by) {
    spans.forEach(function (x) { x.span.style.background = by === 'remaining' ? shade(x.t.rem) : colour(x.t.q); });
    document.getElementById('legend-q').hidden = by === 'remaining';
    document.getElementById('legend-remaining').hidden = by !== 'remaining';
  }
  document.getElementById('colour-by').addEventListener('change', function (ev) { paint(ev.target.value); });
  function fmt(v, d) { return v === null || isNaN(v) ? '–' : v.toFixed(d); }
  function target(cs) {
    var z = cs.map(function (c) { return (c.lp === null ? -Infinity : c.lp) + (data.tau === null || c.q === null ? 0 : c.q / data.tau); });
    var m = Math.max.apply(null, z); var e = z.map(function (v) { return Math.exp(v - m); }); var s = e.reduce(function (a, b) { return a + b; }, 0);
    return e.map(function (v) { return v / s; });
  }
  data.prompts.forEach(function (p) {
    var box = document.createElement('div'); box.className = 'prompt'; box.dataset.promptIdx = p.idx;
    var head = document.createElement('div'); head.className = 'prompt-text'; head.textContent = '#' + p.idx + '  ' + p.prompt; box.appendChild(head);
    p.samples.forEach(function (s) {
      var line = document.createElement('div'); line.className = 'sample';
      var out = document.createElement('span'); out.className = 'outcome ' + (s.correct === null ? 'none' : s.correct >= 0.5 ? 'ok' : 'bad');
      out.textContent = s.correct === null ? 'ungraded' : s.correct >= 0.5 ? '✓ correct' : '✗ wrong'; line.appendChild(out);
      s.tokens.forEach(function (t) {
        var span = document.createElement('span'); span.className = 'tok'; span.textContent = data.texts[t.id] === undefined ? '#' + t.id : data.texts[t.id];
        span.style.background = colour(t.q); span.dataset.q = t.q; spans.push({ span: span, t: t });
        span.addEventListener('mouseenter', function (ev) {
          var pstar = target(t.c);
          var rows = t.c.map(function (c, k) {
            return '<tr class="' + (c.id === t.id ? 'chosen' : '') + '"><td>' + show(c.id).replace(/&/g, '&amp;').replace(/</g, '&lt;') + '</td><td>' + fmt(c.q, 3) + '</td><td>' + fmt(c.lp === null ? null : Math.exp(c.lp), 3) + '</td><td>' + fmt(pstar[k], 3) + '</td></tr>';
          }).join('');
          tip.innerHTML = '<div>Q ' + fmt(t.q, 3) + (t.rem === null ? '' : ' · E[remaining] ' + fmt(t.rem, 1)) + '</div><table><tr><th>candidate</th><th>Q</th><th>π_ref</th><th>π*</th></tr>' + rows + '</table>';
          tip.style.display = 'block'; tip.style.left = (ev.clientX + 12) + 'px'; tip.style.top = (ev.clientY + 12) + 'px';
        });
        span.addEventListener('mouseleave', function () { tip.style.display = 'none'; });
        line.appendChild(span);
      });
      box.appendChild(line);
    });
    root.appendChild(box);
  });
})();
</script>
</body></html>
`;
}

/** Writes the page atomically. */
export function writeTokenValuePage(file: string, o: TokenValuePageOptions): void {
  writeAtomic(file, tokenValuePage(o));
}
