/**
 * Math grading throughput and MATH-500 self-consistency.
 * Each MATH-500 reference solution's final boxed answer is graded against the row's `answer` field
 * (all 500 should be correct), and the same predicted answers against the next row's answer of the
 * same subject (a mismatch set; equal answers are excluded). Times the in-process grader on one
 * thread (CAS on its worker thread) and prints answers per wall-clock second and per CPU second
 * (the process's user + system time, worker included): the second is the per-core rate, and it
 * holds on a machine shared with other work, where wall-clock rates fall.
 * Usage: npx tsx --conditions=lathe-source tools/bench/graders/math-throughput.ts [/work/shared/datasets]
 */
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { MathGrader, extractAnswer, normalizeAnswer } from '@lathe/graders';

interface MathRow {
  solution: string;
  answer: string;
  subject: string;
  unique_id: string;
}

async function main(): Promise<void> {
  const root = process.argv[2] ?? '/work/shared/datasets';
  const rows: MathRow[] = readFileSync(path.join(root, 'math500', 'test.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l) as MathRow);
  const preds = rows.map((r) => extractAnswer(r.solution, 'boxed') ?? '');
  const positives = rows.map((r, i) => ({ pred: preds[i], gold: r.answer, id: r.unique_id }));
  const negatives: { pred: string; gold: string; id: string }[] = [];
  rows.forEach((r, i) => {
    const j = rows.findIndex((s, k) => k > i && s.subject === r.subject && normalizeAnswer(s.answer) !== normalizeAnswer(r.answer));
    if (j >= 0) negatives.push({ pred: preds[i], gold: rows[j].answer, id: `${r.unique_id} vs ${rows[j].unique_id}` });
  });

  const grader = new MathGrader();
  // start the CAS worker before timing: its start-up is paid once per process
  await grader.grade('x+1', '1+x', 'raw');
  const misses: string[] = [];
  const run = async (cases: { pred: string; gold: string; id: string }[], expected: boolean, format: 'raw' | 'auto') => {
    const t0 = performance.now();
    const cpu0 = process.cpuUsage();
    let agree = 0;
    for (const c of cases) {
      const v = await grader.grade(c.pred, c.gold, format);
      if (v.correct === expected) agree++;
      else misses.push(`${expected ? 'missed match' : 'false match'} ${c.id}: pred ${JSON.stringify(c.pred)} gold ${JSON.stringify(c.gold)} (${v.reason})`);
    }
    const s = (performance.now() - t0) / 1000;
    const cpu = process.cpuUsage(cpu0);
    const cpuSeconds = (cpu.user + cpu.system) / 1e6;
    return { agree, n: cases.length, perSecond: Math.round(cases.length / s), perCpuSecond: Math.round(cases.length / cpuSeconds) };
  };
  const pos = await run(positives, true, 'raw');
  const neg = await run(negatives, false, 'raw');
  const full = await run(rows.map((r) => ({ pred: r.solution, gold: r.answer, id: r.unique_id })), true, 'auto');
  // a second pass over the answers: the steady state of a training run, with the CAS cache warm
  const warm = await run(positives, true, 'raw');
  await grader.close();
  const rate = (r: { perSecond: number; perCpuSecond: number }) => `${r.perSecond}/s wall, ${r.perCpuSecond}/CPU-s`;
  console.log(`MATH-500 boxed answer vs answer field: ${pos.agree}/${pos.n} correct, ${rate(pos)} (cold CAS cache)`);
  console.log(`MATH-500 answer vs another problem's answer: ${neg.agree}/${neg.n} judged different, ${rate(neg)}`);
  console.log(`MATH-500 whole solution (--format auto) vs answer field: ${full.agree}/${full.n} correct, ${rate(full)}`);
  console.log(`second pass over the answers (warm cache): ${rate(warm)}`);
  for (const m of misses) console.log(`MISS ${m}`);
}

main().catch((e: unknown) => {
  console.error(e);
  process.exit(1);
});
