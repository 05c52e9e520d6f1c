/**
 * `lathe extract generate --context --context_attempts`: the critic reads earlier attempts at the
 * prompt, each with its feedback, before scoring, as in its training format. Checked end to end
 * against the critic's own Q of [prompt, attempts with feedback (spelled by hand), output so far] for
 * every candidate of every step; and the refusals of context files that do not fit. The critic is
 * trained from the policy's folder, so its tokenizer holds the grid tokens the policy's lacks: the
 * pair is accepted (the tokenizers are compared without them).
 */
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { readTrajectories, writeTrajectories, type Trajectory } from '@lathe/data';
import { CausalLM, randomModel } from '@lathe/models';
import { Device } from '@lathe/runtime';
import { HfTokenizer } from '@lathe/tokenizer';
import { feedbackText, loadBins } from '@lathe/critic';
import { QWeightedModels } from '@lathe/policy-extraction';
import { defaults } from '../src/options';
import { criticTrainSchema } from '../src/critic-config';
import { runCriticTrain } from '../src/critic';
import { extractGenerateSchema } from '../src/extract-config';
import { criticPrefixes, runExtractGenerate } from '../src/extract';

const dir = mkdtempSync(join(tmpdir(), 'extract-context-'));
// a tiny random Qwen3 with a character-level Hugging Face tokenizer (id 0 end of text, then printable
// ASCII and newline) that can spell the feedback ("Reward: 1\nLength: 2\n"); ids 97 on are spare rows for the critic's grid
const reference = join(dir, 'policy');
randomModel(
  reference,
  { architectures: ['Qwen3ForCausalLM'], vocab_size: 128, hidden_size: 32, intermediate_size: 32, num_hidden_layers: 1, num_attention_heads: 2, num_key_value_heads: 1, head_dim: 16, rms_norm_eps: 1e-6, rope_theta: 1e6, max_position_embeddings: 256, tie_word_embeddings: true },
  { seed: 4, std: 0.5 },
);
const chars = ['<|endoftext|>', ...Array.from({ length: 95 }, (_, i) => String.fromCharCode(32 + i)), '\n'];
const special = { id: 0, content: chars[0], single_word: false, lstrip: false, rstrip: false, normalized: false, special: true };
const model = { type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: null, end_of_word_suffix: null, fuse_unk: false, byte_fallback: false, vocab: Object.fromEntries(chars.map((c, i) => [c, i])), merges: [] };
writeFileSync(join(reference, 'tokenizer.json'), JSON.stringify({ version: '1.0', truncation: null, padding: null, added_tokens: [special], normalizer: null, pre_tokenizer: null, post_processor: null, decoder: { type: 'Fuse' }, model }));
writeFileSync(join(reference, 'tokenizer_config.json'), JSON.stringify({ eos_token: chars[0], pad_token: chars[0], tokenizer_class: 'PreTrainedTokenizerFast' }));
const texts = ['1+2=', '4+4='];
const answers = [' 3', ' 33', ' 333'];
let encode: (text: string) => number[] = () => [];
let promptIds: number[][] = [];
let outputs: number[][] = [];
let rows: Trajectory[] = [];
const context = join(dir, 'context.parquet');
const prompts = join(dir, 'prompts.jsonl');
let critic = '';

beforeAll(async () => {
  const tok = await HfTokenizer.fromFolder(reference);
  encode = (t) => tok.encode(t);
  promptIds = texts.map(encode);
  outputs = answers.map((a) => [...encode(a), tok.eosId]);
  rows = [0, 1].flatMap((p) => outputs.map((out, k) => ({ prompt_idx: p, prompt: texts[p], prompt_token_ids: promptIds[p], output_token_ids: out, correct: k === 0 ? 1 : 0 })));
  await writeTrajectories(context, rows);
  writeFileSync(prompts, ['{"prompt":"1+2=","answer":"3"}', '{"prompt":"4+4=","answer":"8"}'].join('\n') + '\n');
  // the full format: attempts with their feedback in context
  const run = await runCriticTrain({ ...defaults(criticTrainSchema), data: context, model: reference, tokenizer: 'model', run_dir: join(dir, 'critic-run'), max_length: 96, max_remaining: 8, length_bins: 3, ablation: 'none', batch_size: 2, steps: 1, lr: 1e-3, save_every: 0 });
  critic = run.checkpoint;
}, 120_000);

test('each step’s candidate Q is the critic’s Q after the prompt, the first N context attempts of its prompt with their feedback, and the output so far', async () => {
  const output = join(dir, 'gen.parquet');
  const N = 2;
  await runExtractGenerate({ ...defaults(extractGenerateSchema), tokenizer: 'model', grader: 'exact', data: prompts, min_p: 0.05, max_candidates: 6, max_new_tokens: 4, model: reference, critic, samples: 2, tau: 0.5, output, html: 'none', seed: 3, context, context_attempts: N });
  const got = await readTrajectories(output);
  expect(got).toHaveLength(4);
  // what the critic was trained to read: [prompt] [attempt 1] [feedback 1] [attempt 2] [feedback 2] … then the target
  const spelled = (p: number) => [...promptIds[p], ...outputs.slice(0, N).flatMap((out, k) => [...out, ...encode(feedbackText(k === 0 ? 1 : 0, out.length))])];
  expect(spelled(0).length).toBeGreaterThan(promptIds[0].length + outputs[0].length + outputs[1].length); // the feedback is spelled in tokens
  const lm = CausalLM.fromPretrainedSync(critic);
  const ref = CausalLM.fromPretrainedSync(reference);
  const models = QWeightedModels.open({
    device: Device.open('cpu'),
    reference: { name: reference, config: ref.config, weights: ref.float32Weights() },
    critic: { name: critic, config: lm.config, weights: lm.float32Weights() },
    bins: loadBins(critic),
    minP: 0.05,
    maxCandidates: 6,
    padId: 0,
  });
  try {
    let differs = 0;
    for (const r of got) {
      const out = Array.from(r.output_token_ids);
      const prefixes = out.map((_, t) => [...spelled(r.prompt_idx), ...out.slice(0, t)]);
      const candidates = out.map((_, t) => Array.from(r.candidate_ids![t]));
      const q = await models.scores(prefixes, candidates);
      q.forEach((row, t) => row.forEach((v, k) => expect(r.candidate_q_values![t][k]).toBeCloseTo(v, 4)));
      // not vacuous: without the attempts in context the critic says something else
      const alone = await models.scores(out.map((_, t) => [...promptIds[r.prompt_idx], ...out.slice(0, t)]), candidates);
      alone.forEach((row, t) => row.forEach((v, k) => (differs += Math.abs(v - q[t][k]) > 1e-3 ? 1 : 0)));
    }
    expect(differs).toBeGreaterThan(0);
  } finally {
    models.dispose();
  }
}, 120_000);

describe('context files that do not fit are refused by name', () => {
  const planned = () => [0, 0, 1].map((p) => ({ promptIdx: p, ids: promptIds[p] }));

  test('the first N rows of each prompt, in file order, with their rewards', async () => {
    const prefixes = await criticPrefixes({ context, context_attempts: 1 }, planned(), encode);
    expect(prefixes).toEqual([0, 0, 1].map((p) => [...promptIds[p], ...outputs[0], ...encode(feedbackText(1, outputs[0].length))]));
    expect(await criticPrefixes({ context: '', context_attempts: 0 }, planned(), encode)).toEqual(planned().map((s) => s.ids));
  });

  test('flags without each other, too few attempts, other prompt tokens, no reward, no file', async () => {
    await expect(criticPrefixes({ context: '', context_attempts: 2 }, planned(), encode)).rejects.toThrow(/--context_attempts 2 needs --context/);
    await expect(criticPrefixes({ context, context_attempts: 0 }, planned(), encode)).rejects.toThrow(/--context .*context\.parquet is read only with --context_attempts > 0/);
    await expect(criticPrefixes({ context, context_attempts: 4 }, planned(), encode)).rejects.toThrow(/--context .*: prompt_idx 0 has 3 attempts, fewer than --context_attempts 4/);
    await expect(criticPrefixes({ context: join(dir, 'none.parquet'), context_attempts: 1 }, planned(), encode)).rejects.toThrow(/none\.parquet: no such file/);
    const other = join(dir, 'other.parquet');
    await writeTrajectories(other, rows.map((r, i) => (i === 3 ? { ...r, prompt_token_ids: promptIds[0] } : r)));
    await expect(criticPrefixes({ context: other, context_attempts: 1 }, planned(), encode)).rejects.toThrow(/other\.parquet: row 3 \(prompt_idx 1\) has other prompt tokens than --data's prompt 1/);
    const unrewarded = join(dir, 'unrewarded.parquet');
    await writeTrajectories(unrewarded, rows.map((r) => ({ ...r, correct: null })));
    await expect(criticPrefixes({ context: unrewarded, context_attempts: 1 }, planned(), encode)).rejects.toThrow(/unrewarded\.parquet: row 0 has neither 'correct' nor 'value'/);
  });
});
