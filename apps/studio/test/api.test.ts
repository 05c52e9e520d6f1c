/**
 * The studio's JSON API over plain HTTP, on a root made by a real GRPO run: the run list and each
 * run's state (half-written and missing metrics, a corrupt rollout store named on its run only),
 * rollout filters against the same filter applied in JavaScript to every stored row, paths outside
 * the root refused, and a 100,000-rollout store answering its first page in under a second.
 */
import { join } from 'node:path';
import { copyFileSync, mkdirSync, rmSync, writeFileSync } from 'node:fs';
import Database from 'libsql';
import { request } from 'node:http';
import { readEvalRollouts, readMetrics, readParquet, readTrainRollouts, RolloutStore, writeTrajectories } from '@lathe/data';
import { startStudio, type RunningStudio, type RunInfo } from '@lathe/studio';
import { CRITIC_LABELLED, makeRoot, studioConfig } from './fixtures';

let studio: RunningStudio;
let root: string;
let grpo: string;
const get = async (path: string) => {
  const r = await fetch(new URL(path, studio.url));
  return { status: r.status, body: (await r.json()) as Record<string, unknown> & unknown[] };
};

beforeAll(async () => {
  ({ root, grpo } = await makeRoot());
  studio = await startStudio(studioConfig(root));
}, 60_000);
afterAll(() => studio?.close());

/**
 * What "under a second" is checked against: twice the goal, because CI's two cores run two test
 * files at once; a lost index or a scan per request costs several times more, which is what these
 * bounds catch.
 */
const LATENCY_BUDGET_MS = 2000;

test('the run list: every run with its metrics state; a corrupt rollout store is an error on that run only', async () => {
  const { status, body } = await get('/api/runs');
  expect(status).toBe(200);
  const runs = body as unknown as RunInfo[];
  expect(runs.map((r) => r.name).sort()).toEqual(['corrupt-store', grpo, 'no-metrics', 'sft-addition', 'torn-metrics']);
  expect(runs.find((r) => r.name === 'sft-addition')!.evals.map((e) => e.step)).toEqual([0, 15, 30]);
  const by = Object.fromEntries(runs.map((r) => [r.name, r]));
  const lines = readMetrics(join(root, grpo, 'metrics.jsonl'));
  expect(by[grpo].metrics).toMatchObject({ state: 'ok', lines: lines.length, lastStep: 3 });
  expect(by[grpo].rollouts).toMatchObject({ train: 3 * 4 * 4, lastStep: 3 });
  expect(by[grpo].checkpoints.map((c) => c.step)).toEqual([3]);
  expect(by['torn-metrics'].metrics).toMatchObject({ state: 'partial', lines: lines.length, lastStep: 3 });
  expect(by['torn-metrics'].metrics.message).toMatch(/torn-metrics\/metrics.jsonl:\d+: the last line is half-written/);
  expect(by['no-metrics'].metrics).toMatchObject({ state: 'missing', lines: 0 });
  expect(by['corrupt-store'].rolloutsError).toMatch(/corrupt-store\/rollouts.sqlite: .*file is not a database/);
  expect(by['corrupt-store'].metrics.state).toBe('ok');
  expect(by[grpo].rolloutsError).toBeNull();
  const bad = await get('/api/runs/corrupt-store/rollouts');
  expect(bad.status).toBe(500);
  expect(bad.body.error).toMatch(/corrupt-store\/rollouts.sqlite: .*not a database/);
});

test('metrics: all lines, then only the new ones from an offset', async () => {
  const lines = readMetrics(join(root, grpo, 'metrics.jsonl'));
  const all = await get(`/api/runs/${grpo}/metrics`);
  expect(all.body.lines).toEqual(lines);
  expect((await get(`/api/runs/${grpo}/metrics?from=2`)).body.lines).toEqual(lines.slice(2));
  expect((await get('/api/runs/torn-metrics/metrics')).body.lines).toEqual(lines);
});

test('rollout filters return the rows the same filter picks from every stored row', async () => {
  const file = join(root, grpo, 'rollouts.sqlite');
  const rows = readTrainRollouts(file);
  const len = (r: (typeof rows)[number]) => (r.extra?.tokens as number[]).length;
  const cases: [string, (r: (typeof rows)[number]) => boolean][] = [
    ['step=2', (r) => r.step === 2],
    ['prompt=%2B1%3D', (r) => r.prompt.includes('+1=')],
    ['min_length=3&max_step=2', (r) => len(r) >= 3 && r.step <= 2],
    ['max_length=2', (r) => len(r) <= 2],
    [`min_reward=0.5`, (r) => (r.reward ?? -1) >= 0.5],
    ['min_advantage=0&max_advantage=0', (r) => r.advantage === 0],
  ];
  for (const [query, keep] of cases) {
    const want = rows.filter(keep).sort((a, b) => a.step - b.step || a.prompt_index - b.prompt_index || a.rollout_index - b.rollout_index || a.id - b.id);
    const got = await get(`/api/runs/${grpo}/rollouts?${query}&limit=1000`);
    expect([query, got.body.total]).toEqual([query, want.length]);
    expect((got.body.rows as { id: number }[]).map((r) => r.id)).toEqual(want.map((r) => r.id));
  }
  // sorted in the query: by each key, both ways, nulls last, ties in the store's order; with a filter and a page
  const order = (a: (typeof rows)[number], b: (typeof rows)[number]) => a.step - b.step || a.prompt_index - b.prompt_index || a.rollout_index - b.rollout_index || a.id - b.id;
  const keyOf: Record<string, (r: (typeof rows)[number]) => number | null> = { step: (r) => r.step, reward: (r) => r.reward ?? null, advantage: (r) => r.advantage ?? null, length: len };
  for (const [sort, key] of Object.entries(keyOf)) {
    for (const desc of [false, true]) {
      const want = rows
        .filter((r) => r.step >= 2)
        .sort((a, b) => {
          const [x, y] = [key(a), key(b)];
          if ((x === null) !== (y === null)) return x === null ? 1 : -1;
          if (sort === 'step') return (desc ? y! - x! : x! - y!) || a.prompt_index - b.prompt_index || a.rollout_index - b.rollout_index || a.id - b.id;
          return (x === null ? 0 : desc ? y! - x! : x! - y!) || order(a, b);
        });
      const got = (await get(`/api/runs/${grpo}/rollouts?min_step=2&sort=${sort}${desc ? '&desc=1' : ''}&offset=3&limit=7`)).body;
      expect([sort, desc, (got.rows as { id: number }[]).map((r) => r.id)]).toEqual([sort, desc, want.slice(3, 10).map((r) => r.id)]);
    }
  }
  expect(new Set(rows.map(len)).size).toBeGreaterThan(1); // the length sort has something to order
  expect((await get(`/api/runs/${grpo}/rollouts?sort=prompt`)).body.error).toBe("query parameter 'sort': expected one of step, reward, advantage, length, got 'prompt'");
  // paging: the second page of 5 is rows 5–9 of the whole order
  const whole = (await get(`/api/runs/${grpo}/rollouts?limit=1000`)).body.rows as { id: number }[];
  expect(((await get(`/api/runs/${grpo}/rollouts?offset=5&limit=5`)).body.rows as { id: number }[]).map((r) => r.id)).toEqual(whole.slice(5, 10).map((r) => r.id));
  // a group: every sample of one prompt at one step, with its stored rewards and advantages
  const first = rows.find((r) => r.step === 2)!;
  const group = (await get(`/api/runs/${grpo}/rollouts/group?step=2&prompt_index=${first.prompt_index}`)).body as unknown as { id: number; advantage: number; extra: unknown }[];
  const same = rows.filter((r) => r.step === 2 && r.prompt_index === first.prompt_index);
  expect(group.map((g) => [g.id, g.advantage, g.extra])).toEqual(same.map((r) => [r.id, r.advantage, r.extra]));
  expect((await get(`/api/runs/${grpo}/rollouts?min_reward=abc`)).body.error).toBe("query parameter 'min_reward': expected a number, got 'abc'");
});

test('a stored rollout\'s tokens carry the log-prob and entropy the store holds for each', async () => {
  const stored = readTrainRollouts(join(root, grpo, 'rollouts.sqlite'));
  const r = stored.find((x) => (x.logprobs?.length ?? 0) >= 2)!;
  expect(r.logprobs!.every((v) => v <= 0)).toBe(true);
  expect(r.entropies!.every((v) => v >= 0)).toBe(true);
  const got = (await get(`/api/runs/${grpo}/rollouts/${r.id}?table=train`)).body as unknown as { tokens: { id: number; logprob: number; entropy: number }[]; values: string[] };
  expect(got.values).toEqual(['logprob', 'entropy']);
  expect(got.tokens.map((t) => [t.id, t.logprob, t.entropy])).toEqual((r.extra!.tokens as number[]).map((id, i) => [id, r.logprobs![i], r.entropies![i]]));
  // a held-out (greedy) evaluation rollout: generation's log-probs, no entropy
  const e = readEvalRollouts(join(root, grpo, 'rollouts.sqlite')).find((x) => (x.logprobs?.length ?? 0) >= 1)!;
  expect(e.logprobs).toHaveLength((e.extra!.tokens as number[]).length);
  const ev = (await get(`/api/runs/${grpo}/rollouts/${e.id}?table=eval`)).body as unknown as { tokens: { logprob: number; entropy: number | null }[]; values: string[] };
  expect(ev.values).toEqual(['logprob']);
  expect(ev.tokens.map((t) => [t.logprob, t.entropy])).toEqual(e.logprobs!.map((v) => [v, null]));
});

test("lathe critic label's output: each token with the Q of the sampled token and the entropy the file stores for it", async () => {
  const table = await readParquet(join(root, grpo, CRITIC_LABELLED));
  const list = (name: string, i: number) => Array.from((table.getChild(name)!.get(i) as { toArray(): ArrayLike<number> }).toArray(), Number);
  const row = Array.from({ length: table.numRows }, (_, i) => i).find((i) => list('output_token_ids', i).length >= 3)!;
  expect(row).toBeDefined();
  const got = (await get(`/api/tokens?file=${grpo}/${CRITIC_LABELLED}&row=${row}`)).body as unknown as { values: string[]; tokens: { id: number; entropy: number; q: number }[] };
  const ids = list('output_token_ids', row);
  expect(got.tokens.map((t) => t.id)).toEqual(ids);
  expect(got.tokens.map((t) => t.entropy)).toEqual(list('token_entropies', row));
  // the sampled token's Q: its entry among the position's candidates, where it is one
  const cands = (table.getChild('candidate_ids')!.get(row) as { toArray(): { toArray(): ArrayLike<number> }[] }).toArray().map((c) => Array.from(c.toArray(), Number));
  const cq = (table.getChild('candidate_q_values')!.get(row) as { toArray(): { toArray(): ArrayLike<number> }[] }).toArray().map((c) => Array.from(c.toArray(), Number));
  const q = ids.map((id, k) => (cands[k].includes(id) ? cq[k][cands[k].indexOf(id)] : null));
  expect(got.tokens.map((t) => t.q)).toEqual(q);
  // no log-probs in the file; Q where some sampled token is among its position's candidates
  expect(got.values).toEqual(['entropy', ...(q.some((v) => v !== null) ? ['q'] : [])]);
});

test('a version-1 rollout store (no per-token columns) still serves its rollouts, with tokens and no values', async () => {
  const dir = join(root, 'old-store');
  mkdirSync(dir);
  copyFileSync(join(root, grpo, 'config.yaml'), join(dir, 'config.yaml'));
  const db = new Database(join(dir, 'rollouts.sqlite'));
  db.exec(`CREATE TABLE train_rollouts (id INTEGER PRIMARY KEY, step INTEGER NOT NULL, epoch INTEGER NOT NULL, prompt_index INTEGER NOT NULL, rollout_index INTEGER NOT NULL, prompt TEXT NOT NULL, completion TEXT NOT NULL, reward REAL, advantage REAL, extra TEXT, created_at REAL NOT NULL);
CREATE TABLE eval_rollouts (id INTEGER PRIMARY KEY, step INTEGER NOT NULL, dataset TEXT NOT NULL, prompt_index INTEGER NOT NULL, rollout_index INTEGER NOT NULL, prompt TEXT NOT NULL, completion TEXT NOT NULL, reward REAL, correct INTEGER, extra TEXT, created_at REAL NOT NULL);
INSERT INTO train_rollouts VALUES (1, 1, 0, 3, 0, '1+2=', '3', 1.0, 0.5, '{"tokens":[3]}', 0);
PRAGMA user_version = 1;`);
  db.close();
  const page = (await get('/api/runs/old-store/rollouts')).body as unknown as { total: number };
  expect(page.total).toBe(1);
  const one = (await get('/api/runs/old-store/rollouts/1')).body as unknown as { tokens: { logprob: number | null; entropy: number | null }[]; values: string[]; logprobs: null };
  expect([one.values, one.logprobs, one.tokens.map((t) => [t.logprob, t.entropy])]).toEqual([[], null, [[null, null]]]);
  rmSync(dir, { recursive: true });
});

test('chat checkpoints: every checkpoint of every run, those without tokenizer files not servable and named so', async () => {
  const list = (await get('/api/chat/checkpoints')).body as unknown as { id: string; run: string; step: number; dir: string; servable: boolean; why?: string }[];
  expect(list.filter((c) => c.run === 'sft-addition').map((c) => [c.id, c.step, c.dir, c.servable])).toEqual([
    ['sft-addition@15', 15, join('sft-addition', 'checkpoints', 'step-00000015'), false],
    ['sft-addition@30', 30, join('sft-addition', 'checkpoints', 'step-00000030'), false],
  ]);
  expect(list.find((c) => c.id === `${grpo}@3`)!.why).toMatch(/no tokenizer\.json.*character tokenizer, which cannot chat/);
  expect((await get('/api/config')).body).toMatchObject({ chat: true, checkpointChat: true });
  expect((await get('/api/chat/models')).body).toEqual({ object: 'list', data: [] });
  const post = async (model: string) => {
    const r = await fetch(new URL('/api/chat/completions', studio.url), { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model, messages: [{ role: 'user', content: 'hi' }], stream: true }) });
    return { status: r.status, body: (await r.json()) as { error: string } };
  };
  expect(await post('checkpoint:nope@1')).toEqual({ status: 400, body: { error: "checkpoint 'nope@1': no such checkpoint under the root (run@step, as the chat page lists them)" } });
  expect((await post(`checkpoint:${grpo}@3`)).body.error).toMatch(new RegExp(`^checkpoint '${grpo}@3' \\(${grpo}/checkpoints/step-00000003\\): cannot be served: no tokenizer.json`));
  expect(await post('base')).toEqual({ status: 404, body: { error: 'chat is off: start lathe studio with --model DIR or --serve_url URL, or pick a checkpoint' } });
});

test('a bad line inside metrics.jsonl: state bad, naming the line; the good lines still served', async () => {
  const dir = join(root, 'bad-line');
  mkdirSync(dir);
  writeFileSync(join(dir, 'metrics.jsonl'), '{"step":1,"loss":2}\nnot json\n{"step":2,"loss":1}\n');
  const m = (await get('/api/runs/bad-line/metrics')).body;
  expect(m.state).toBe('bad');
  expect(m.message).toBe(`${join(dir, 'metrics.jsonl')}:2: not a JSON object with a numeric 'step'`);
  expect(m.lines).toEqual([{ step: 1, loss: 2 }, { step: 2, loss: 1 }]);
});

test('evaluation rollouts: filtered by dataset and step as the stored rows are', async () => {
  const file = join(root, grpo, 'rollouts.sqlite');
  const rows = readEvalRollouts(file);
  const datasets = [...new Set(rows.map((r) => r.dataset))];
  expect(datasets.length).toBeGreaterThan(0);
  for (const ds of datasets) {
    const want = rows.filter((r) => r.dataset === ds && r.step === 3);
    const got = (await get(`/api/runs/${grpo}/rollouts?table=eval&dataset=${ds}&step=3&limit=1000`)).body;
    expect([ds, got.total]).toEqual([ds, want.length]);
    expect((got.rows as { id: number; correct: boolean | null }[]).map((r) => [r.id, r.correct]).sort()).toEqual(want.map((r) => [r.id, r.correct]).sort());
  }
});

test('a request naming another host (DNS rebinding) is refused; chat takes JSON only', async () => {
  const status = (host: string) =>
    new Promise<number>((resolve, reject) => {
      const u = new URL('/api/runs', studio.url);
      request({ host: u.hostname, port: u.port, path: u.pathname, headers: { host } }, (res) => {
        res.resume();
        resolve(res.statusCode ?? 0);
      })
        .on('error', reject)
        .end();
    });
  expect(await status('evil.example:8080')).toBe(421);
  expect(await status(`localhost:${studio.port}`)).toBe(200);
  expect(await status(`127.0.0.1:${studio.port}`)).toBe(200);
  const r = await fetch(new URL('/api/chat/completions', studio.url), { method: 'POST', headers: { 'content-type': 'text/plain' }, body: '{}' });
  expect(r.status).toBe(415);
});

test('a trajectory file as a paged, filtered table, read a batch at a time', async () => {
  const dir = join(root, 'traj');
  mkdirSync(dir);
  // groups of 4 samples per prompt, 2 prompts a step
  const rows = Array.from({ length: 2500 }, (_, i) => ({ prompt_idx: Math.floor(i / 4), sample_idx: i % 4, step: Math.floor(i / 8), prompt: `problem ${Math.floor(i / 4)}`, prompt_token_ids: [1], output_token_ids: Array.from({ length: i % 7 }, () => 2), reward: (i % 10) / 10, advantage: (i % 5) - 2, correct: i % 2 }));
  await writeTrajectories(join(dir, 'gen.parquet'), rows);
  const page = (await get('/api/trajectories/rows?file=traj/gen.parquet&offset=3&limit=4&min_reward=0.85&prompt=problem%201')).body;
  const want = rows.map((r, i) => ({ ...r, row: i })).filter((r) => r.reward >= 0.85 && r.prompt.includes('problem 1'));
  expect(page.total).toBe(want.length);
  expect((page.rows as { row: number; length: number; correct: number }[]).map((r) => [r.row, r.length, r.correct])).toEqual(want.slice(3, 7).map((r) => [r.row, r.output_token_ids.length, r.correct]));
  // step, advantage and length bounds, as the same filter picks them from every row
  const some = (await get('/api/trajectories/rows?file=traj/gen.parquet&limit=1000&step=30&min_advantage=0&max_advantage=1&min_length=2&max_length=5')).body as unknown as { total: number; rows: { row: number }[] };
  const picked = rows.map((r, i) => ({ ...r, row: i })).filter((r) => r.step === 30 && r.advantage >= 0 && r.advantage <= 1 && r.output_token_ids.length >= 2 && r.output_token_ids.length <= 5);
  expect(picked.length).toBeGreaterThan(0);
  expect([some.total, some.rows.map((r) => r.row)]).toEqual([picked.length, picked.map((r) => r.row)]);
  // one prompt's group: its 4 samples, decoded (no tokenizer above the file: ids shown)
  const grp = (await get('/api/trajectories/group?file=traj/gen.parquet&prompt_idx=7&step=3')).body as unknown as { row: number; sample_idx: number; reward: number; advantage: number; text: string }[];
  expect(grp.map((g) => [g.row, g.sample_idx, g.reward, g.advantage, g.text])).toEqual([28, 29, 30, 31].map((i) => [i, i % 4, Math.fround((i % 10) / 10), (i % 5) - 2, '⟨2⟩'.repeat(i % 7)]));
  // without a step: every row of the prompt; a prompt the file lacks: none
  expect(((await get('/api/trajectories/group?file=traj/gen.parquet&prompt_idx=7')).body as unknown as { row: number }[]).map((g) => g.row)).toEqual([28, 29, 30, 31]);
  expect((await get('/api/trajectories/group?file=traj/gen.parquet&prompt_idx=7&step=4')).body).toEqual([]);
  expect((await get('/api/trajectories/group?file=traj/gen.parquet&prompt_idx=99999')).body).toEqual([]);
  // a file indexed by a group lookup, then rewritten (prompt 7 now at rows 0–2, at step 0): its cached index is not used
  await writeTrajectories(join(dir, 'gen2.parquet'), rows.slice(0, 100));
  expect(((await get('/api/trajectories/group?file=traj/gen2.parquet&prompt_idx=20')).body as unknown as { row: number }[]).map((g) => g.row)).toEqual([80, 81, 82, 83]);
  await writeTrajectories(join(dir, 'gen2.parquet'), [0, 1, 2].map((k) => ({ ...rows[28 + k], step: 0 })));
  expect(((await get('/api/trajectories/group?file=traj/gen2.parquet&prompt_idx=7&step=0')).body as unknown as { row: number; sample_idx: number }[]).map((g) => [g.row, g.sample_idx])).toEqual([[0, 0], [1, 1], [2, 2]]);
  expect((await get('/api/trajectories/group?file=traj/gen2.parquet&prompt_idx=20')).body).toEqual([]);
  rmSync(join(dir, 'gen2.parquet'));
  expect((await get('/api/trajectories/group?file=traj/gen.parquet')).body.error).toBe("trajectory group: give 'file' (a Parquet file under the root) and 'prompt_idx'");
  expect((await get('/api/trajectories')).body).toEqual([`${grpo}/${CRITIC_LABELLED}`, `${grpo}/labelled.parquet`, 'traj/gen.parquet']);
});

test('paths outside the served root are refused; unknown runs and files are named', async () => {
  for (const path of ['/api/runs/..%2F..%2Fetc/metrics', '/api/tokens?file=../../../etc/passwd', '/api/tokens?file=/etc/passwd']) {
    const r = await get(path);
    expect([path, r.status]).toEqual([path, 403]);
    expect(r.body.error).toMatch(/outside the served root|not a run name/);
  }
  expect(await get('/api/runs/nope')).toEqual({ status: 404, body: { error: `run 'nope': no run directory under ${root}` } });
  expect((await get('/api/tokens?file=grpo-addition/labelled.parquet&row=7')).body.error).toBe('grpo-addition/labelled.parquet: row 7 is out of range (the file has 2 rows, 0–1)');
  const r = await fetch(new URL('/..%2F..%2Fpackage.json', studio.url));
  expect(r.status).toBe(403);
});

test('a store of 100,000 rollouts: the first page, a filtered page and a deep page each under a second', async () => {
  const dir = join(root, 'big');
  mkdirSync(dir);
  writeFileSync(join(dir, 'config.yaml'), 'steps: 1563\n');
  const store = await RolloutStore.open(join(dir, 'rollouts.sqlite'), { batchSize: 20_000, flushIntervalMs: 0 });
  for (let i = 0; i < 100_000; i++) {
    const step = Math.floor(i / 64) + 1;
    store.addTrain({ step, epoch: 0, prompt_index: Math.floor(i / 8) % 8, rollout_index: i % 8, prompt: `question ${Math.floor(i / 8)}: ${'x'.repeat(80)}`, completion: `answer ${i} ${'y'.repeat(150)}`, reward: (i % 10) / 10, advantage: ((i % 8) - 3.5) / 3.5, extra: { tokens: Array.from({ length: 20 + (i % 50) }, (_, k) => k) } });
  }
  await store.close();
  const timed = async (q: string) => {
    const t0 = performance.now();
    const r = await get(`/api/runs/big/rollouts?${q}`);
    return { ms: performance.now() - t0, body: r.body };
  };
  const first = await timed('limit=50');
  expect(first.body.total).toBe(100_000);
  expect((first.body.rows as unknown[]).length).toBe(50);
  const filtered = await timed('min_reward=0.9&min_length=60&prompt=question%201');
  // i % 10 == 9 and 20 + i % 50 >= 60, prompts "question 1…": counted by brute force
  let want = 0;
  for (let i = 0; i < 100_000; i++) if (i % 10 === 9 && 20 + (i % 50) >= 60 && `question ${Math.floor(i / 8)}`.startsWith('question 1')) want++;
  expect(filtered.body.total).toBe(want);
  // sorted by length, longest first, and by reward, lowest first: still one query each
  const longest = await timed('sort=length&desc=1&limit=50');
  expect((longest.body.rows as { length: number; completion: string }[]).map((r) => [r.length, r.completion.split(' ')[1]])).toEqual(Array.from({ length: 50 }, (_, k) => [69, String(49 + 50 * k)]));
  const lowest = await timed('sort=reward&offset=50&limit=50');
  expect((lowest.body.rows as { reward: number; completion: string }[]).map((r) => [r.reward, r.completion.split(' ')[1]])).toEqual(Array.from({ length: 50 }, (_, k) => [0, String(10 * (50 + k))]));
  const deep = await timed('offset=99950&limit=50');
  expect((deep.body.rows as { completion: string }[]).at(-1)!.completion.startsWith('answer 99999 ')).toBe(true);
  for (const t of [first, filtered, longest, lowest, deep]) expect(t.ms).toBeLessThan(LATENCY_BUDGET_MS);
  const list = await get('/api/runs');
  expect((list.body as unknown as RunInfo[]).find((r) => r.name === 'big')!.rollouts!.train).toBe(100_000);
}, 60_000);

test('a trajectory file of 100,000 rows: the first page and then one prompt\'s group each under a second; a filtered page counted right', async () => {
  const dir = join(root, 'bigtraj');
  mkdirSync(dir);
  const n = 100_000;
  await writeTrajectories(
    join(dir, 'gen.parquet'),
    Array.from({ length: n }, (_, i) => ({ prompt_idx: Math.floor(i / 8), step: Math.floor(i / 64), prompt: `question ${Math.floor(i / 8)}: ${'x'.repeat(80)}`, prompt_token_ids: [1, 2, 3], output_token_ids: Array.from({ length: 20 + (i % 50) }, () => 5), reward: (i % 10) / 10, advantage: (i % 5) - 2 })),
  );
  const timed = async (q: string) => {
    const t0 = performance.now();
    const r = await get(q);
    return { ms: performance.now() - t0, body: r.body };
  };
  const first = await timed('/api/trajectories/rows?file=bigtraj/gen.parquet&limit=50');
  expect(first.body.total).toBe(n);
  expect((first.body.rows as { row: number; length: number; prompt: string }[]).map((r) => [r.row, r.length, r.prompt.slice(0, 11)])).toEqual(Array.from({ length: 50 }, (_, i) => [i, 20 + (i % 50), `question ${Math.floor(i / 8)}`.padEnd(11, ':').slice(0, 11)]));
  // the first page's pass indexed the file by prompt: a group then reads only its own row group
  const group = await timed('/api/trajectories/group?file=bigtraj/gen.parquet&prompt_idx=9000');
  expect((group.body as unknown as { row: number; length: number }[]).map((r) => [r.row, r.length])).toEqual(Array.from({ length: 8 }, (_, k) => [72_000 + k, 20 + ((72_000 + k) % 50)]));
  // a file never paged builds its index on its first group lookup (one pass over prompt_idx and step)
  copyFileSync(join(dir, 'gen.parquet'), join(dir, 'copy.parquet'));
  const cold = await timed('/api/trajectories/group?file=bigtraj/copy.parquet&prompt_idx=100');
  expect((cold.body as unknown as { row: number }[]).map((r) => r.row)).toEqual(Array.from({ length: 8 }, (_, k) => 800 + k));
  expect(first.ms).toBeLessThan(LATENCY_BUDGET_MS);
  expect(group.ms).toBeLessThan(LATENCY_BUDGET_MS);
  expect(cold.ms).toBeLessThan(2.5 * LATENCY_BUDGET_MS);
  const filtered = await get('/api/trajectories/rows?file=bigtraj/gen.parquet&min_reward=0.9&min_length=60&max_advantage=0&limit=5');
  let want = 0;
  for (let i = 0; i < n; i++) if (i % 10 === 9 && 20 + (i % 50) >= 60 && (i % 5) - 2 <= 0) want++;
  expect(filtered.body.total).toBe(want);
}, 60_000);

