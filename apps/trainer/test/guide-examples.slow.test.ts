/**
 * The guides' and the README's examples run as written: every ```bash block that runs `lathe` or
 * `npm start` is run here with bash, in a temporary folder that stands for the repository root
 * (`apps/` is linked into it, so `node apps/trainer/bin/lathe.cjs …` works verbatim and every
 * run directory is temporary), or carries `<!-- not run in tests: why -->` on the line above it.
 * A block's `# stdout: …` and `# stderr: …` comments are lines its output must hold (a JSON line's numbers
 * within 1 %: float32 results differ in their last digits from one CPU to another).
 */
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readdirSync, readFileSync, symlinkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

const REPO = join(__dirname, '..', '..', '..');

/** The docs whose examples are checked; the SFT guide goes first, since the GRPO guide's example starts from its run. */
const DOCS = ['README.md', 'docs/guides/sft.md', ...readdirSync(join(REPO, 'docs', 'guides')).filter((f) => f.endsWith('.md') && f !== 'sft.md').sort().map((f) => `docs/guides/${f}`)];

const NOT_RUN = /^<!-- not run in tests: (.+) -->$/;

interface Block {
  /** `doc:line` of the opening fence. */
  where: string;
  code: string;
  /** Why it is not run, from the marker above it. */
  notRun?: string;
}

/** The ```bash blocks of a doc, and the markers that are not directly above one. */
function bashBlocks(doc: string): { blocks: Block[]; strayMarkers: string[] } {
  const lines = readFileSync(join(REPO, doc), 'utf8').split('\n');
  const blocks: Block[] = [];
  const strayMarkers: string[] = [];
  lines.forEach((line, i) => {
    if (NOT_RUN.test(line.trim()) && lines[i + 1]?.trim() !== '```bash') strayMarkers.push(`${doc}:${i + 1}`);
    if (line.trim() !== '```bash') return;
    const end = lines.findIndex((l, j) => j > i && l.trim() === '```');
    blocks.push({ where: `${doc}:${i + 1}`, code: lines.slice(i + 1, end).join('\n'), notRun: NOT_RUN.exec(lines[i - 1]?.trim() ?? '')?.[1] });
  });
  return { blocks, strayMarkers };
}

/** Whether a block runs the CLI or the demo (comments aside). */
const runsLathe = (code: string) =>
  /(^|[\s;&|(])(node\s+\S*lathe\.cjs|npx\s+lathe|lathe|npm\s+start)(?=\s|$)/m.test(
    code
      .split('\n')
      .map((l) => l.replace(/(^|\s)#.*$/, ''))
      .join('\n'),
  );

/** The lines a block's `# stdout: …` / `# stderr: …` comments promise. */
const promised = (code: string, stream: 'stdout' | 'stderr') => [...code.matchAll(new RegExp(`^# ${stream}: (.*)$`, 'gm'))].map((m) => m[1].trim());

/** Whether JSON values agree: the same keys, strings and structure, numbers within 1 % (float32 sums differ by CPU). */
function close(a: unknown, b: unknown): boolean {
  if (typeof a === 'number' && typeof b === 'number') return Math.abs(a - b) <= 1e-2 * Math.max(Math.abs(a), Math.abs(b), 1e-12);
  if (Array.isArray(a) && Array.isArray(b)) return a.length === b.length && a.every((x, i) => close(x, b[i]));
  if (a && b && typeof a === 'object' && typeof b === 'object' && !Array.isArray(a) && !Array.isArray(b)) {
    const [ka, kb] = [Object.keys(a), Object.keys(b)];
    return ka.length === kb.length && ka.every((k) => k in b && close((a as Record<string, unknown>)[k], (b as Record<string, unknown>)[k]));
  }
  return a === b;
}

/** An output line that holds the promised one: the same text, or for a JSON line the same JSON up to {@link close}. */
function holds(lines: readonly string[], want: string): boolean {
  if (lines.includes(want)) return true;
  const json = (l: string): unknown => {
    try {
      return JSON.parse(l);
    } catch {
      return undefined;
    }
  };
  const w = json(want);
  return w !== undefined && typeof w === 'object' && lines.some((l) => close(json(l), w));
}

const found = DOCS.map(bashBlocks);
const examples = found.flatMap((f) => f.blocks).filter((b) => runsLathe(b.code));
const toRun = examples.filter((b) => b.notRun === undefined);

const root = mkdtempSync(join(tmpdir(), 'lathe-guide-examples-'));
symlinkSync(join(REPO, 'apps'), join(root, 'apps'));

test('every example that runs lathe or npm start is run below or says why not; markers sit right above a ```bash block', () => {
  expect(found.flatMap((f) => f.strayMarkers)).toEqual([]);
  // the examples the guides are written around are among those run (the parser found them)
  for (const doc of ['docs/guides/sft.md', 'docs/guides/grpo.md', 'docs/guides/model-init.md']) expect(toRun.some((b) => b.where.startsWith(`${doc}:`))).toBe(true);
  for (const b of examples.filter((e) => e.notRun !== undefined)) expect(b.notRun!.trim().length).toBeGreaterThan(10);
});

test.each(toRun.map((b) => [b.where, b] as const))('%s runs as written', (_where, block) => {
  const r = spawnSync('bash', ['-euo', 'pipefail', '-c', block.code], { cwd: root, encoding: 'utf8', timeout: 120_000 });
  if (r.status !== 0) throw new Error(`exit ${r.status ?? r.signal} from\n${block.code}\n--- stderr ---\n${r.stderr.slice(-3000)}`);
  for (const stream of ['stdout', 'stderr'] as const) {
    const lines = r[stream].split('\n').map((l) => l.trim());
    for (const line of promised(block.code, stream)) expect({ line, held: holds(lines, line) }).toEqual({ line, held: true });
  }
}, 120_000);
