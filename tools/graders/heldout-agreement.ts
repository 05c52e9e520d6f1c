/**
 * Agreement of `lathe grade --format auto` with the expected verdicts of a held-out case file
 * (JSONL lines {"pred", "gold", "expected": bool, "source"?, "params"?: {"precision"?: n}, "disputed"?: reason}).
 * Cases run through the CLI exactly as a user would run it (one process per option group);
 * reports agreement overall, on the cases public graders agree on (no "disputed" mark), and the
 * slowest case. Usage: npx tsx tools/graders/heldout-agreement.ts cases.jsonl [--show-misses]
 */
import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import path from 'node:path';

interface Case {
  pred: string;
  gold: string;
  expected: boolean;
  source?: string;
  params?: { precision?: number };
  disputed?: string;
}

const [file, ...flags] = process.argv.slice(2);
if (!file) throw new Error('usage: heldout-agreement.ts cases.jsonl [--show-misses]');
const cases: Case[] = readFileSync(file, 'utf8')
  .split('\n')
  .filter((l) => l.trim() !== '')
  .map((l, i) => {
    const c = JSON.parse(l) as Case;
    if (typeof c.pred !== 'string' || typeof c.gold !== 'string' || typeof c.expected !== 'boolean') throw new Error(`${file}:${i + 1}: expected {"pred": string, "gold": string, "expected": boolean}`);
    return c;
  });

const lathe = path.join(__dirname, '..', '..', 'apps', 'trainer', 'bin', 'lathe.cjs');
const groups = new Map<number, number[]>();
cases.forEach((c, i) => {
  const p = c.params?.precision ?? 6;
  groups.set(p, [...(groups.get(p) ?? []), i]);
});

const got: { correct: boolean; extracted: string | null; ms: number }[] = new Array(cases.length);
for (const [precision, idx] of groups) {
  const input = idx.map((i) => JSON.stringify({ pred: cases[i].pred, gold: cases[i].gold })).join('\n');
  // concurrency 1 so that each line's time is its own, not its queue's
  const r = spawnSync(process.execPath, [lathe, 'grade', '--format', 'auto', '--timing', '--concurrency', '1', '--float_rounding', String(precision)], { input, encoding: 'utf8', maxBuffer: 1 << 28 });
  if (r.status !== 0) throw new Error(`lathe grade failed (${r.status}): ${r.stderr}`);
  const lines = r.stdout.trim().split('\n');
  if (lines.length !== idx.length) throw new Error(`lathe grade wrote ${lines.length} lines for ${idx.length} cases`);
  lines.forEach((l, k) => (got[idx[k]] = JSON.parse(l)));
  process.stderr.write(`float_rounding ${precision}: ${r.stderr.trim().split('\n').at(-1)}\n`);
}

let agree = 0;
let agreedTotal = 0;
let agreedHits = 0;
let slowest = 0;
const misses: string[] = [];
cases.forEach((c, i) => {
  const ok = got[i].correct === c.expected;
  slowest = Math.max(slowest, got[i].ms);
  if (ok) agree++;
  if (!c.disputed) {
    agreedTotal++;
    if (ok) agreedHits++;
  }
  if (!ok) misses.push(`${c.disputed ? '[disputed] ' : ''}expected ${c.expected} got ${got[i].correct} extracted=${JSON.stringify(got[i].extracted)} gold=${JSON.stringify(c.gold.slice(0, 120))} pred=${JSON.stringify(c.pred.slice(-160))} (${c.source ?? '?'})`);
});
const pct = (a: number, b: number) => `${a}/${b} = ${((100 * a) / b).toFixed(1)}%`;
console.log(`cases: ${cases.length}`);
console.log(`agreement overall: ${pct(agree, cases.length)}`);
console.log(`agreement where public graders agree (not disputed): ${pct(agreedHits, agreedTotal)}`);
console.log(`slowest case: ${slowest.toFixed(1)} ms`);
if (flags.includes('--show-misses')) for (const m of misses) console.log(`MISS ${m}`);
