/**
 * The slot engine (continuous batching) against the batch KV-cache engine on CPU in float32:
 * rows admitted at different steps, sharing decode steps with rows of other lengths and other
 * sampling settings, give the same tokens as each prompt generated alone with its settings compiled
 * into the batch engine's graphs; slots are reused after release without disturbing the others.
 */
import { Device } from '@lathe/runtime';
import { KvCacheGenerator, Scheduler, SlotEngine, type RowSampling, type SlotToken } from '@lathe/rollout';
import { CausalLM, type HfConfig } from '@lathe/models';
import { tinyModel, tinyQwen3 } from './helpers';

const wideQwen3: HfConfig = { ...tinyQwen3, hidden_size: 64, head_dim: 16 };
const { dir } = tinyModel(wideQwen3, 5);
const device = Device.cpu();
const model = CausalLM.fromPretrainedSync(dir, { device });
afterAll(() => model.dispose());

/** What the batch engine gives for one prompt, one sample key, `sampling` compiled in. */
async function alone(prompt: number[], sampling: RowSampling, o: { seed: number; key: number; maxNew: number }, lm = model) {
  const kv = KvCacheGenerator.create(lm, { ...sampling, rows: 1, maxLength: 32 });
  const [c] = await kv.generate([prompt], { maxNewTokens: o.maxNew, seed: o.seed, sampleKeys: [[o.key]] });
  kv.dispose();
  return c;
}

/** Drives the engine: admissions at given steps, each row run for `maxNew` tokens then released. */
function drive(engine: SlotEngine, plan: { at: number; prompt: number[]; rows: { sampling: RowSampling; seed: number; key: number }[]; maxNew: number }[]) {
  const tokens = plan.map((p) => p.rows.map(() => [] as SlotToken[]));
  const owner = new Map<number, [number, number]>();
  const pending = [...plan.keys()];
  for (let step = 0; pending.length || owner.size; step++) {
    let free = engine.free;
    const now = pending.filter((i) => plan[i].at <= step && free >= plan[i].rows.length && (free -= plan[i].rows.length) >= 0);
    for (const i of now) pending.splice(pending.indexOf(i), 1);
    const admitted = engine.admit(now.map((i) => ({ prompt: plan[i].prompt, rows: plan[i].rows })));
    admitted.forEach((a, j) => a.slots.forEach((slot, r) => owner.set(slot, [now[j], r])));
    const take = (ts: SlotToken[]) => {
      for (const t of ts) {
        const [i, r] = owner.get(t.slot)!;
        tokens[i][r].push(t);
        if (tokens[i][r].length === plan[i].maxNew) {
          engine.release(t.slot);
          owner.delete(t.slot);
        }
      }
    };
    take(admitted.flatMap((a) => a.tokens));
    take(engine.step());
  }
  return tokens;
}

test('greedy rows admitted at different steps: the same tokens as each prompt alone', async () => {
  const engine = SlotEngine.create(model, { slots: 3, maxLength: 32 });
  const greedy = { temperature: 0 };
  const prompts = [[5, 9, 11, 3], [7, 2], [30, 31, 32, 33, 34, 35], [1], [8, 8, 8]];
  const maxNew = [6, 9, 3, 7, 5];
  // Two rows of prompt 1 (n = 2) and a queue longer than the slots: later prompts reuse freed slots.
  const plan = prompts.map((prompt, i) => ({ at: i, prompt, rows: (i === 1 ? [0, 1] : [0]).map((key) => ({ sampling: greedy, seed: 0, key })), maxNew: maxNew[i] }));
  const got = drive(engine, plan);
  for (const [i, p] of prompts.entries()) {
    const want = await alone(p, greedy, { seed: 0, key: 0, maxNew: maxNew[i] });
    for (const row of got[i]) {
      expect(row.map((t) => t.token)).toEqual(want.tokens);
      row.forEach((t, j) => expect(t.rawLogprob).toBeCloseTo(want.rawLogprobs[j], 4));
    }
  }
  expect(engine.free).toBe(3);
  expect(engine.counters.prefilledPrompts).toBe(5);
  engine.dispose();
});

test('rows with different sampling settings share steps: each equals the batch engine with its settings compiled in', async () => {
  const engine = SlotEngine.create(model, { slots: 4, maxLength: 32, maxTopLogprobs: 3 });
  const settings: RowSampling[] = [{ temperature: 0.9, topK: 12 }, { temperature: 0.7, topP: 0.8 }, { temperature: 1.3, minP: 0.2 }, { temperature: 0 }, { temperature: 1, topK: 20, topP: 0.9, minP: 0.05 }];
  const prompts = [[5, 9, 11, 3], [7, 2], [30, 31, 32, 33], [1], [8, 8, 8]];
  const plan = settings.map((sampling, i) => ({ at: i % 3, prompt: prompts[i], rows: [{ sampling, seed: 11, key: 40 + i }], maxNew: 8 }));
  const got = drive(engine, plan);
  for (const [i, sampling] of settings.entries()) {
    const want = await alone(prompts[i], sampling, { seed: 11, key: 40 + i, maxNew: 8 });
    expect(got[i][0].map((t) => t.token)).toEqual(want.tokens);
    got[i][0].forEach((t, j) => {
      expect(t.logprob).toBeCloseTo(want.logprobs[j], 4);
      expect(t.rawLogprob).toBeCloseTo(want.rawLogprobs[j], 4);
    });
  }
  // The draws are not all greedy: the sampled rows differ from their argmax continuations.
  const argmax = await alone(prompts[0], { temperature: 0 }, { seed: 0, key: 0, maxNew: 8 });
  expect(got[0][0].map((t) => t.token)).not.toEqual(argmax.tokens);
  engine.dispose();
});

test('top log-probs: sorted raw log-probs that include the sampled token when it ranks', () => {
  const engine = SlotEngine.create(model, { slots: 2, maxLength: 16, maxTopLogprobs: 5 });
  const [a] = engine.admit([{ prompt: [3, 4, 5], rows: [{ sampling: { temperature: 0 }, seed: 0, key: 0, topLogprobs: 5 }] }]);
  const first = a.tokens[0];
  expect(first.top!.ids).toHaveLength(5);
  expect(first.top!.ids[0]).toBe(first.token); // greedy: the argmax is the most likely
  expect(first.top!.logprobs[0]).toBeCloseTo(first.rawLogprob, 5);
  for (let j = 1; j < 5; j++) expect(first.top!.logprobs[j]).toBeLessThanOrEqual(first.top!.logprobs[j - 1]);
  // Probabilities: the five sum to at most 1.
  expect(first.top!.logprobs.reduce((s, l) => s + Math.exp(l), 0)).toBeLessThanOrEqual(1 + 1e-5);
  const [b] = engine.admit([{ prompt: [9], rows: [{ sampling: { temperature: 0 }, seed: 0, key: 0 }] }]);
  const step = engine.step();
  expect(step.find((t) => t.slot === b.slots[0])!.top).toBeUndefined();
  expect(step.find((t) => t.slot === a.slots[0])!.top!.ids).toHaveLength(5);
  engine.dispose();
});

test('slot bookkeeping: positions, release, and errors that admit nothing', () => {
  const engine = SlotEngine.create(model, { slots: 2, maxLength: 8 });
  const row = { sampling: { temperature: 0 }, seed: 0, key: 0 };
  expect(() => engine.admit([{ prompt: [1, 2], rows: [row, row, row] }])).toThrow(/3 rows asked for, 2 slots free/);
  expect(() => engine.admit([{ prompt: [1, 99], rows: [row] }])).toThrow(/admission 0: token id 99 is outside the vocabulary/);
  expect(() => engine.admit([{ prompt: [1], rows: [{ ...row, sampling: { temperature: -1 } }] }])).toThrow(/temperature must be a finite number ≥ 0/);
  expect(engine.free).toBe(2);
  const [a] = engine.admit([{ prompt: [1, 2, 3], rows: [row] }]);
  expect(engine.position(a.slots[0])).toBe(3);
  engine.step();
  expect(engine.position(a.slots[0])).toBe(4);
  engine.release(a.slots[0]);
  expect(engine.position(a.slots[0])).toBeUndefined();
  expect(() => engine.release(a.slots[0])).toThrow(/slot 0 is not busy/);
  expect(engine.step()).toEqual([]);
  engine.dispose();
});

test('launch/collect: a slot released while its step is in flight gets no result, and its new occupant is untouched', () => {
  const engine = SlotEngine.create(model, { slots: 2, maxLength: 16 });
  const row = { sampling: { temperature: 0 }, seed: 0, key: 0 };
  const [a, b] = engine.admit([{ prompt: [1, 2, 3], rows: [row] }, { prompt: [4, 5], rows: [row] }]);
  expect(engine.launch()).toBe(true);
  expect(() => engine.admit([{ prompt: [6], rows: [row] }])).toThrow(/a decode step is in flight/);
  expect(() => engine.launch()).toThrow(/already in flight/);
  engine.release(a.slots[0]);
  const got = engine.collect();
  expect(got.map((t) => t.slot)).toEqual([b.slots[0]]);
  expect(engine.position(b.slots[0])).toBe(3);
  const [c] = engine.admit([{ prompt: [7, 8, 9, 10], rows: [row] }]);
  expect(c.slots).toEqual(a.slots); // the freed slot, reused
  expect(engine.position(c.slots[0])).toBe(4);
  expect(() => engine.collect()).toThrow(/no step in flight/);
  engine.dispose();
});

test('scheduler: requests through the queue equal each prompt alone; pause holds the steps, resume finishes them', async () => {
  const engine = SlotEngine.create(model, { slots: 2, maxLength: 32 });
  const scheduler = new Scheduler(engine, { maxQueue: 8 });
  const prompts = [[5, 9, 11, 3], [7, 2], [30, 31, 32], [1]];
  const got = prompts.map(() => [] as number[]);
  const finish: string[] = [];
  const tickets = prompts.map((prompt, i) =>
    scheduler.submit({ prompt, n: 1, maxTokens: 6, sampling: { temperature: 0 }, seed: 0, onToken: (_c, t) => void got[i].push(t.token), onFinish: (_c, why) => void finish.push(why) }),
  );
  // pause mid-run: after two decode steps, when at most 2 of the 4 requests (6 steps each, 2 slots) can be done
  for (let waited = 0; engine.counters.steps < 2 && waited < 30_000; waited += 1) await new Promise((r) => setTimeout(r, 1));
  await scheduler.pause();
  const steps = engine.counters.steps;
  expect(engine.stepInFlight).toBe(false);
  expect(finish.length).toBeLessThan(4);
  await new Promise((r) => setTimeout(r, 50));
  expect(engine.counters.steps).toBe(steps); // nothing ran while paused
  scheduler.resume();
  await Promise.all(tickets.map((t) => t.done));
  for (const [i, p] of prompts.entries()) expect(got[i]).toEqual((await alone(p, { temperature: 0 }, { seed: 0, key: 0, maxNew: 6 })).tokens);
  expect(finish).toEqual(['length', 'length', 'length', 'length']);
  expect([engine.busy, scheduler.load.queued, scheduler.load.reservedTokens]).toEqual([0, 0, 0]);
  expect(() => scheduler.submit({ prompt: [1], n: 3, maxTokens: 2, sampling: { temperature: 0 }, seed: 0, onToken: () => undefined, onFinish: () => undefined })).toThrow(/n is 3, more than the 2 rows/);
  engine.dispose();
});

test('a wide vocabulary: top-k within the two-stage cap runs the capped graph, top-p alone the full sort; both equal the batch engine', async () => {
  // V = 4096: 16 chunks of 256, so top-k up to 16 is found in two stages (as the batch engine does).
  const wide = tinyModel({ ...wideQwen3, vocab_size: 4096 }, 7);
  const lm = CausalLM.fromPretrainedSync(wide.dir, { device });
  const engine = SlotEngine.create(lm, { slots: 3, maxLength: 32 });
  const settings: RowSampling[][] = [
    [{ temperature: 0.9, topK: 12, topP: 0.8 }, { temperature: 1, topK: 5 }, { temperature: 0.7, topK: 16, topP: 0.5, minP: 0.05 }],
    [{ temperature: 0.8, topP: 0.9 }, { temperature: 1, topK: 3 }, { temperature: 0 }],
  ];
  for (const [round, group] of settings.entries()) {
    const prompts = [[5, 9, 11, 3], [7, 2], [30, 31, 32, 33]];
    const got = drive(engine, group.map((sampling, i) => ({ at: 0, prompt: prompts[i], rows: [{ sampling, seed: 3, key: 10 * round + i }], maxNew: 6 })));
    for (const [i, sampling] of group.entries()) {
      const want = await alone(prompts[i], sampling, { seed: 3, key: 10 * round + i, maxNew: 6 }, lm);
      expect(got[i][0].map((t) => t.token)).toEqual(want.tokens);
      got[i][0].forEach((t, j) => expect(t.logprob).toBeCloseTo(want.logprobs[j], 4));
    }
  }
  expect(engine.compiled.filter((n) => n.startsWith('slot-decode')).sort()).toEqual(['slot-decode-capped', 'slot-decode-full']);
  engine.dispose();
  lm.dispose();
});

test('scheduler: while rows decode, arrivals wait up to admitWaitMs to share one prefill; a full batch goes at once', async () => {
  const engine = SlotEngine.create(model, { slots: 4, maxLength: 128 });
  const prefills: number[] = [];
  const scheduler = new Scheduler(engine, { admitWaitMs: 150, maxPrefillTokens: 6 });
  const base = (prompt: number[], maxTokens: number, onAdmit?: () => void, onToken: () => void = () => undefined) =>
    scheduler.submit({ prompt, n: 1, maxTokens, sampling: { temperature: 0 }, seed: 0, onToken, onFinish: () => undefined, ...(onAdmit ? { onAdmit } : {}) });
  const spy = engine.counters;
  // An idle engine admits at once. This request keeps a row decoding throughout: ≥ 3 ms a token
  // for up to 120 tokens (cancelled at the end).
  const slow = () => {
    const until = performance.now() + 3;
    while (performance.now() < until);
  };
  const first = base([5, 9], 120, undefined, slow);
  for (let waited = 0; spy.prefills < 1 && waited < 30_000; waited++) await new Promise((r) => setTimeout(r, 1));
  prefills.push(spy.prefills);
  // Two short arrivals while the first decodes (2 + 2 prompt tokens, under the budget of 6): they
  // wait, then share one prefill once the oldest has waited 150 ms.
  const queued = performance.now();
  const admittedAt: number[] = [];
  const pair = [base([7, 2], 2, () => admittedAt.push(performance.now() - queued)), base([3, 4], 2, () => admittedAt.push(performance.now() - queued))];
  await Promise.all(pair.map((t) => t.done));
  expect(spy.prefills).toBe(prefills[0] + 1);
  expect(Math.min(...admittedAt)).toBeGreaterThanOrEqual(140);
  // Arrivals that fill the prefill budget (6 tokens) go at the next step boundary.
  const before = spy.prefills;
  const t0 = performance.now();
  let at = 0;
  const full = [base([1, 2, 3], 2, () => (at = performance.now() - t0)), base([4, 5, 6], 2)];
  await Promise.all(full.map((t) => t.done));
  expect(spy.prefills).toBe(before + 1);
  expect(at).toBeLessThan(140);
  first.cancel();
  await first.done;
  expect(() => new Scheduler(engine, { admitWaitMs: -1 })).toThrow(/admitWaitMs must be a non-negative integer/);
  engine.dispose();
});

test('padded prefills (prompts, rows and width rounded up) give the same tokens and log-probs as exact ones', () => {
  const plan = [
    { at: 0, prompt: [5, 9, 11, 3, 8], rows: [{ sampling: { temperature: 0.9 }, seed: 4, key: 0 }, { sampling: { temperature: 0.9 }, seed: 4, key: 1 }], maxNew: 5 },
    { at: 0, prompt: [7, 2], rows: [{ sampling: { temperature: 0 }, seed: 0, key: 0 }], maxNew: 5 },
    { at: 0, prompt: [30, 31, 32], rows: [{ sampling: { temperature: 1, topK: 4 }, seed: 9, key: 2 }, { sampling: { temperature: 0.5 }, seed: 9, key: 3 }], maxNew: 5 },
    { at: 2, prompt: [1, 2, 3, 4, 5, 6, 7, 8, 9], rows: [{ sampling: { temperature: 0.7 }, seed: 1, key: 0 }], maxNew: 3 },
  ];
  const run = (padPrefill: boolean) => {
    const engine = SlotEngine.create(model, { slots: 8, maxLength: 32, padPrefill });
    const got = drive(engine, plan);
    const log = engine.prefillLog.map((p) => [p.prompts, p.rows, p.width]);
    engine.dispose();
    return { got, log };
  };
  const exact = run(false);
  const padded = run(true);
  expect(padded.got.map((p) => p.map((r) => r.map((t) => t.token)))).toEqual(exact.got.map((p) => p.map((r) => r.map((t) => t.token))));
  padded.got.forEach((p, i) => p.forEach((r, j) => r.forEach((t, k) => expect(t.logprob).toBeCloseTo(exact.got[i][j][k].logprob, 5))));
  // 3 prompts of ≤ 5 tokens with 5 rows, then 1 prompt of 9 tokens: logged as given; the runs were padded to 4 × 8 (8 rows) and 1 × 16.
  expect(exact.log).toEqual([[3, 5, 5], [1, 1, 9]]);
  expect(padded.log).toEqual([[3, 5, 8], [1, 1, 16]]);
});

test('plain rows (temperature 1 or 0, no filter) run the cheaper sampling graph: the same tokens and log-probs as the general graph', () => {
  const plan = (minP: number) => [
    { at: 0, prompt: [5, 9, 11, 3], rows: [{ sampling: { temperature: 1, minP }, seed: 2, key: 0 }, { sampling: { temperature: 1, minP }, seed: 2, key: 1 }], maxNew: 6 },
    { at: 1, prompt: [7, 2], rows: [{ sampling: { temperature: 0, minP }, seed: 0, key: 0 }], maxNew: 6 },
  ];
  const run = (minP: number) => {
    // (the batch engine's graph for steps of temperature-1 rows alone is the next test's)
    const engine = SlotEngine.create(model, { slots: 4, maxLength: 32, sampledGraph: false });
    const got = drive(engine, plan(minP));
    const compiled = engine.compiled.sort();
    engine.dispose();
    return { got, compiled };
  };
  const plain = run(0);
  // a min-p far below any probability here filters nothing, but needs the general graph
  const general = run(1e-30);
  // (a step over the 2 leading slots once only those are busy: slot-decode…-2, see the bucket test)
  expect(plain.compiled.filter((n) => !/-\d+$/.test(n))).toEqual(['slot-decode-plain', 'slot-prefill-plain']);
  expect(general.compiled.filter((n) => !/-\d+$/.test(n))).toEqual(['slot-decode', 'slot-prefill']);
  expect([...plain.compiled, ...general.compiled].filter((n) => /-\d+$/.test(n))).toEqual(['slot-decode-plain-2', 'slot-decode-2']);
  expect(plain.got.map((p) => p.map((r) => r.map((t) => t.token)))).toEqual(general.got.map((p) => p.map((r) => r.map((t) => t.token))));
  plain.got.forEach((p, i) =>
    p.forEach((r, j) =>
      r.forEach((t, k) => {
        expect(t.logprob).toBeCloseTo(general.got[i][j][k].logprob, 5);
        expect(t.rawLogprob).toBeCloseTo(general.got[i][j][k].rawLogprob, 5);
      }),
    ),
  );
});

test('steps whose rows all sample at temperature 1 run the batch engine sampling graph: the same tokens and log-probs as the plain graph', () => {
  const plan = [
    { at: 0, prompt: [5, 9, 11, 3], rows: [{ sampling: { temperature: 1 }, seed: 2, key: 0 }, { sampling: {}, seed: 2, key: 1 }], maxNew: 6 },
    { at: 2, prompt: [7, 2], rows: [{ sampling: { temperature: 0 }, seed: 0, key: 0 }], maxNew: 2 },
    { at: 6, prompt: [30, 31], rows: [{ sampling: { temperature: 1 }, seed: 5, key: 3 }], maxNew: 5 },
  ];
  const run = (sampledGraph: boolean | undefined) => {
    const engine = SlotEngine.create(model, { slots: 4, maxLength: 32, decodeBuckets: false, ...(sampledGraph === undefined ? {} : { sampledGraph }) });
    const got = drive(engine, plan);
    const compiled = engine.compiled.filter((n) => n.startsWith('slot-decode')).sort();
    engine.dispose();
    return { got, compiled };
  };
  const plain = run(false);
  const sampled = run(undefined);
  expect(plain.compiled).toEqual(['slot-decode-plain']);
  // a greedy row in the step (step 2) needs the plain graph's argmax
  expect(sampled.compiled).toEqual(['slot-decode-plain', 'slot-decode-sampled']);
  expect(sampled.got.map((p) => p.map((r) => r.map((t) => t.token)))).toEqual(plain.got.map((p) => p.map((r) => r.map((t) => t.token))));
  sampled.got.forEach((p, i) =>
    p.forEach((r, j) =>
      r.forEach((t, k) => {
        expect(t.logprob).toBeCloseTo(plain.got[i][j][k].logprob, 6);
        expect(t.rawLogprob).toBeCloseTo(plain.got[i][j][k].rawLogprob, 6);
      }),
    ),
  );
  // the environment's switch, for A/B runs of lathe serve
  const before = process.env.LATHE_SLOT_SAMPLED_GRAPH;
  try {
    process.env.LATHE_SLOT_SAMPLED_GRAPH = '0';
    expect(run(undefined).compiled).toEqual(['slot-decode-plain']);
  } finally {
    if (before === undefined) delete process.env.LATHE_SLOT_SAMPLED_GRAPH;
    else process.env.LATHE_SLOT_SAMPLED_GRAPH = before;
  }
});

test('decode steps compile with the batch engine decode kernel choice (ORT_ENABLE_XQA=0 at 2 query heads per KV head), prefills with its prefill choice (ORT_ENABLE_CUDNN_FLASH_ATTENTION=0)', () => {
  const keys = ['ORT_ENABLE_XQA', 'ORT_ENABLE_CUDNN_FLASH_ATTENTION'] as const;
  const before = keys.map((k) => process.env[k]);
  const seen: [string, string | undefined, string | undefined][] = [];
  const compile = device.compile.bind(device);
  const spy = jest.spyOn(device, 'compile').mockImplementation((...args) => {
    seen.push([args[1]?.name ?? '', process.env.ORT_ENABLE_XQA, process.env.ORT_ENABLE_CUDNN_FLASH_ATTENTION]);
    return compile(...args);
  });
  try {
    for (const k of keys) delete process.env[k];
    const engine = SlotEngine.create(model, { slots: 2, maxLength: 16 });
    engine.warm();
    engine.dispose();
    expect(seen).toEqual([
      ['slot-prefill-plain', undefined, '0'],
      ['slot-decode-plain', '0', undefined],
      ['slot-decode-sampled', '0', undefined],
      ['slot-prefill', undefined, '0'],
      ['slot-decode', '0', undefined],
    ]);
    for (const k of keys) expect(process.env[k]).toBeUndefined();
  } finally {
    spy.mockRestore();
    keys.forEach((k, i) => {
      if (before[i] === undefined) delete process.env[k];
      else process.env[k] = before[i];
    });
  }
});

test('decode steps over the leading slots that hold the busy rows (a power of two): the same tokens and log-probs as steps over every slot', () => {
  const plan = [
    { at: 0, prompt: [5, 9, 11, 3], rows: [{ sampling: { temperature: 0.8 }, seed: 3, key: 0 }], maxNew: 3 },
    { at: 1, prompt: [7, 2], rows: [{ sampling: { temperature: 0 }, seed: 0, key: 0 }, { sampling: { temperature: 0.9 }, seed: 3, key: 1 }], maxNew: 7 },
    { at: 2, prompt: [30, 31], rows: [{ sampling: { temperature: 1 }, seed: 5, key: 2 }, { sampling: { temperature: 1 }, seed: 5, key: 3 }, { sampling: { temperature: 0.5 }, seed: 5, key: 4 }], maxNew: 4 },
  ];
  const run = (decodeBuckets: boolean) => {
    const engine = SlotEngine.create(model, { slots: 8, maxLength: 32, decodeBuckets });
    const got = drive(engine, plan);
    const compiled = engine.compiled.filter((n) => n.startsWith('slot-decode')).sort();
    engine.dispose();
    return { got, compiled };
  };
  const all = run(false);
  const bucketed = run(true);
  expect(all.compiled).toEqual(['slot-decode']);
  // one busy row → 1 slot; rows in slots 0..2 → 4; all six (slots 0..5) → 8 = every slot
  expect(bucketed.compiled).toEqual(['slot-decode', 'slot-decode-1', 'slot-decode-4']);
  expect(bucketed.got.map((p) => p.map((r) => r.map((t) => t.token)))).toEqual(all.got.map((p) => p.map((r) => r.map((t) => t.token))));
  bucketed.got.forEach((p, i) => p.forEach((r, j) => r.forEach((t, k) => expect(t.logprob).toBeCloseTo(all.got[i][j][k].logprob, 5))));
});

test('static prefill buffers (what a captured prefill replays): a second wave of the same shapes, uploaded into the buffers of the first wave, gives the same tokens and log-probs as host-fed prefills', () => {
  // two waves of the same shapes: the second wave's prefills upload into the first wave's buffers
  const wave = (at: number, seed: number) => [
    { at, prompt: [5, 9, 11, 3, 8], rows: [{ sampling: { temperature: 0.9 }, seed, key: 0 }, { sampling: { temperature: 0.9 }, seed, key: 1 }], maxNew: 4 },
    { at, prompt: [7, 2], rows: [{ sampling: { temperature: 0 }, seed: 0, key: 0 }], maxNew: 4 },
    { at: at + 1, prompt: [30, 31, 32, 33, 34, 35, 36, 37, 38], rows: [{ sampling: { temperature: 1 }, seed, key: 2 }], maxNew: 3 },
  ];
  const plan = [...wave(0, 4), ...wave(6, 11)];
  const run = (staticPrefill: boolean) => {
    const engine = SlotEngine.create(model, { slots: 8, maxLength: 32, staticPrefill });
    const got = drive(engine, plan);
    engine.dispose();
    return got;
  };
  const fed = run(false);
  const fixed = run(true);
  expect(fixed.map((p) => p.map((r) => r.map((t) => t.token)))).toEqual(fed.map((p) => p.map((r) => r.map((t) => t.token))));
  fixed.forEach((p, i) => p.forEach((r, j) => r.forEach((t, k) => expect(t.logprob).toBeCloseTo(fed[i][j][k].logprob, 6))));
  // the two waves sampled differently (other seeds), so a buffer left holding the first wave's values would show
  expect(fixed[0][0].map((t) => t.token)).not.toEqual(fixed[3][0].map((t) => t.token));
});

test('warmPrefills runs every prompt count a length can be admitted in, twice per sampling graph, and leaves the engine idle and its results unchanged', () => {
  const plan = [
    { at: 0, prompt: [5, 9, 11, 3, 8], rows: [{ sampling: { temperature: 0.9 }, seed: 4, key: 0 }], maxNew: 4 },
    { at: 1, prompt: [7, 2, 4, 4, 1], rows: [{ sampling: { temperature: 1 }, seed: 2, key: 1 }], maxNew: 4 },
  ];
  const cold = SlotEngine.create(model, { slots: 8, maxLength: 32, staticPrefill: true });
  const want = drive(cold, plan);
  cold.dispose();
  const warm = SlotEngine.create(model, { slots: 8, maxLength: 32, staticPrefill: true });
  // 16 prompt tokens a boundary over prompts of 5: up to 3 prompts, padded to 4 → counts 1, 2, 4
  warm.warmPrefills([5], 16);
  expect(warm.prefillLog.map((p) => p.prompts)).toEqual([1, 1, 1, 1, 2, 2, 2, 2, 4, 4, 4, 4]);
  expect([warm.busy, warm.free]).toEqual([0, 8]);
  expect(drive(warm, plan)).toEqual(want);
  expect(() => warm.warmPrefills([32], 16)).toThrow(/a prompt length of 32 does not fit a context of 32/);
  warm.dispose();
});
