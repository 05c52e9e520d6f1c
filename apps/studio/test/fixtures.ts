/**
 * A served root made by real short runs, as the studio tests see it: a GRPO run of the built-in
 * addition task (metrics, rollout store, evaluation, checkpoint), a short SFT run, and beside them the bad cases — a
 * run whose metrics file ends half-written, a run with no metrics file, a run whose rollout store is
 * not a SQLite file — a labelled trajectory Parquet file with hand-set log-probs and Q-values, and
 * `lathe critic label`'s output for the GRPO run's first step (with per-token entropies).
 */
import { appendFileSync, copyFileSync, mkdirSync, mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { readTrainRollouts, writeTrajectories } from '@lathe/data';
import { DEMO_SFT_OVERRIDES, additionTokenizer, criticLabelSchema, criticTrainSchema, defaults, grpoSchema, runCriticLabel, runCriticTrain, runGrpo, runSft, sftSchema, studioSchema, type StudioConfig } from '@lathe/recipes';

/** The hand-set values of the labelled trajectory: output "12+3" and per token its log-prob and candidates. */
export const LABELLED = {
  text: '12+3',
  logprobs: [-0.05, -2.5, -0.4, -6],
  /** candidates per position: the sampled token first, then another; the sampled token's Q is the first entry. */
  q: [
    [0.9, 0.2],
    [0.3, 0.8],
    [0.6, 0.1],
    [0.05, 0.7],
  ],
};

/** The run whose checkpoints the chat tests talk to (with `chatRun`): a short SFT run of a tiny Qwen3 with its real tokenizer. */
export const CHAT_RUN = 'sft-chat';

/**
 * Writes the root; returns it and the GRPO run's name (the SFT run is `sft-addition`). With
 * `chatRun` (a model folder with Qwen3's tokenizer), also {@link CHAT_RUN}: two SFT steps of it on
 * conversations, a checkpoint after each.
 */
export async function makeRoot(options: { chatRun?: string } = {}): Promise<{ root: string; grpo: string }> {
  const root = mkdtempSync(join(tmpdir(), 'lathe-studio-'));
  const prompts = join(root, 'prompts.jsonl');
  const lines: string[] = [];
  for (let a = 0; a < 5; a++) for (let b = 0; b < 5; b++) lines.push(JSON.stringify({ prompt: `${a}+${b}=`, answer: String(a + b) }));
  writeFileSync(prompts, `${lines.join('\n')}\n`);
  const grpo = 'grpo-addition';
  await runGrpo({ ...defaults(grpoSchema), data: prompts, tokenizer: 'builtin:addition', run_dir: join(root, grpo), steps: 3, prompts_per_step: 4, group_size: 4, max_new_tokens: 8, eval_examples: 4, eval_every: 3, save_every: 3, log_every: 1 });

  // a short SFT run of the demo task: a loss curve to plot beside the GRPO run's
  await runSft({ ...defaults(sftSchema), ...DEMO_SFT_OVERRIDES, run_dir: join(root, 'sft-addition'), steps: 30, batch_size: 16, warmup_steps: 5, eval_every: 15, save_every: 15, eval_examples: 16, log_every: 1, overwrite: false });

  if (options.chatRun) {
    const data = join(root, 'chat.jsonl');
    writeFileSync(data, ['What is 2+2?\t4', 'Name a colour.\tBlue.', 'Say hi.\tHi!', 'Count to 3.\t1 2 3'].map((l) => JSON.stringify({ messages: [{ role: 'user', content: l.split('\t')[0] }, { role: 'assistant', content: l.split('\t')[1] }] })).join('\n') + '\n');
    // a high learning rate: the two checkpoints answer differently
    await runSft({ ...defaults(sftSchema), model: options.chatRun, data, run_dir: join(root, CHAT_RUN), steps: 2, batch_size: 2, max_length: 64, eval_examples: 0, eval_every: 0, save_every: 1, keep_last: 5, lr: 5e-2, warmup_steps: 0, log_every: 1 });
  }

  // half-written: the GRPO run's lines, then a line cut off mid-write
  const torn = join(root, 'torn-metrics');
  mkdirSync(torn);
  copyFileSync(join(root, grpo, 'config.yaml'), join(torn, 'config.yaml'));
  copyFileSync(join(root, grpo, 'metrics.jsonl'), join(torn, 'metrics.jsonl'));
  appendFileSync(join(torn, 'metrics.jsonl'), '{"step": 4, "loss": 0.1');

  const empty = join(root, 'no-metrics');
  mkdirSync(empty);
  copyFileSync(join(root, grpo, 'config.yaml'), join(empty, 'config.yaml'));

  const corrupt = join(root, 'corrupt-store');
  mkdirSync(corrupt);
  copyFileSync(join(root, grpo, 'config.yaml'), join(corrupt, 'config.yaml'));
  copyFileSync(join(root, grpo, 'metrics.jsonl'), join(corrupt, 'metrics.jsonl'));
  writeFileSync(join(corrupt, 'rollouts.sqlite'), 'this is not a SQLite database\n'.repeat(200));

  const tok = additionTokenizer();
  const ids = tok.encode(LABELLED.text);
  const other = tok.encode('9')[0];
  await writeTrajectories(join(root, grpo, 'labelled.parquet'), [
    { prompt_idx: 0, prompt: '9+3=', prompt_token_ids: tok.encode('9+3='), output_token_ids: tok.encode('12'), correct: 1 },
    {
      prompt_idx: 1,
      prompt: '9+3=',
      prompt_token_ids: tok.encode('9+3='),
      output_token_ids: ids,
      correct: 0,
      old_logprobs: LABELLED.logprobs,
      candidate_ids: ids.map((id) => [id, other]),
      candidate_q_values: LABELLED.q,
      candidate_ref_logprobs: ids.map(() => [-0.1, -3]),
    },
  ]);
  await criticLabelled(root, grpo);
  return { root, grpo };
}

/** Where {@link makeRoot} puts `lathe critic label`'s output: the GRPO run's step-1 rollouts, labelled. */
export const CRITIC_LABELLED = 'critic-labelled.parquet';

/**
 * A real short `lathe critic train` (outside the root: 2 steps) on the GRPO run's step-1 rollouts,
 * then `lathe critic label` of them into `<grpo>/critic-labelled.parquet` (Q-values, candidates and
 * the reference policy's per-token entropies), the SFT run's last checkpoint the reference policy (a
 * trained model: its entropies differ more from token to token than a random one's).
 */
async function criticLabelled(root: string, grpo: string): Promise<void> {
  const tok = additionTokenizer();
  const rows = readTrainRollouts(join(root, grpo, 'rollouts.sqlite'))
    .filter((r) => r.step === 1)
    .map((r) => ({ prompt_idx: r.prompt_index, sample_idx: r.rollout_index, prompt: r.prompt, prompt_token_ids: tok.encode(r.prompt), output_token_ids: r.extra!.tokens as number[], correct: r.reward ?? 0, reward: r.reward ?? 0 }));
  const work = mkdtempSync(join(tmpdir(), 'lathe-studio-critic-'));
  const data = join(work, 'rollouts.parquet');
  await writeTrajectories(data, rows);
  const run = await runCriticTrain({ ...defaults(criticTrainSchema), data, tokenizer: 'builtin:addition', run_dir: join(work, 'critic'), steps: 2, max_length: 32, max_remaining: 8, length_bins: 3, ablation: 'no_feedback', batch_size: 4, lr: 1e-3, save_every: 2, log_every: 1 });
  await runCriticLabel({ ...defaults(criticLabelSchema), critic: run.checkpoint, model: join(root, 'sft-addition', 'checkpoints', 'step-00000030'), tokenizer: 'builtin:addition', data, output: join(root, grpo, CRITIC_LABELLED), min_p: 0.3, max_candidates: 4 });
}

/** The studio's config for a root, on a free loopback port. */
export const studioConfig = (root: string, over: Partial<StudioConfig> = {}): StudioConfig => ({ ...defaults(studioSchema), root, port: 0, ...over });
