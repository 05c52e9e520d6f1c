/** The options of `lathe extract generate|train|rft|eval`: defaults, flags, YAML keys and the config saved with each run. */
import { KL_DIRECTIONS } from '@lathe/policy-extraction';
import { deviceOption, loraOptions, modelOption, optimizerOptions, runDirOption, seedOption, tokenizerOption, trainRunOptions, trainStepOptions } from './common-options';
import type { ConfigOf, OptionSchema } from './options';

/** --tau: checked by the recipes (> 0), so that an error names the flag. */
const tauOption = { type: 'number', default: 0.1, describe: 'Temperature τ of the target π_ref·exp(Q/τ) over the candidates: small τ follows the critic, large τ the reference policy (must be > 0)' } as const;

/** How prompts are read and rendered: the file, its fields, the template and the thinking switch. */
const promptOptions = {
  data: { type: 'string', default: '', describe: "Prompts: a JSONL(.gz) or Parquet file, one prompt per row with 'prompt' and (to grade) 'answer' [required]" },
  prompt_field: { type: 'string', default: 'auto', describe: "Field holding the prompt text; auto: 'prompt', or 'problem' (MATH) when the first row has no 'prompt'" },
  answer_field: { type: 'string', default: 'answer', describe: 'Field holding the reference answer' },
  limit: { type: 'number', default: 0, integer: true, min: 0, describe: 'Only the first N prompts (0: all)' },
  prompt_format: { type: 'string', default: 'raw', choices: ['raw', 'chat'], describe: "Prompts as they are, or as the user turn of the model's chat template" },
  enable_thinking: { type: 'boolean', default: false, describe: "With --prompt_format chat: Qwen3's enable_thinking switch (thinking on or off)" },
  grader: { type: 'string', default: 'math', choices: ['math', 'exact', 'judge', 'none'], describe: "'correct' of rows whose prompt has an answer: the math grader (the answer after </think>, compared symbolically), exact (the response's text, trimmed, equals the answer), judge (an LLM judge: --judge_url), or none" },
  judge_url: { type: 'string', default: '', describe: 'With --grader judge: the OpenAI-compatible API root of the judge (e.g. http://127.0.0.1:8000/v1); a reply without a verdict counts as wrong' },
  judge_model: { type: 'string', default: '', describe: "With --grader judge: the judge server's model name" },
  judge_prompt: { type: 'string', default: '', describe: "With --grader judge: a file holding the prompt template ({question}, {response}, {reference}: the prompt, the response after its reasoning, the answer); '': the graders' correctness prompt" },
} as const satisfies OptionSchema;

/** The critic and the candidates it scores. */
const criticOptions = {
  critic: { type: 'string', default: '', describe: 'Critic checkpoint folder (lathe critic train writes one, with critic_bins.json) [required]' },
  bins: { type: 'string', default: '', describe: "A critic_bins.json the checkpoint must match (a checkpoint with another grid is refused); '': the checkpoint's own" },
  min_p: { type: 'number', default: 0.1, min: 0, max: 1, describe: "Candidates: the reference policy's tokens with p ≥ min_p × the most likely one's" },
  max_candidates: { type: 'number', default: 16, integer: true, min: 1, describe: 'At most this many candidates per step (the most likely first)' },
  context: { type: 'string', default: '', describe: "Trajectory Parquet of earlier attempts at the same prompts (prompt_idx, prompt_token_ids, output_token_ids, 'correct' or 'value'; e.g. lathe generate's) that the critic reads in context; with --context_attempts" },
  context_attempts: { type: 'number', default: 0, integer: true, min: 0, describe: "Attempts the critic reads before each sample, each with its reward and length as in its training format: --context's first N rows of the sample's prompt_idx, in file order (0: the prompt alone)" },
} as const satisfies OptionSchema;

/** Where and how fast sampling runs. */
const samplingRunOptions = {
  max_new_tokens: { type: 'number', default: 1024, integer: true, min: 1, describe: "Generation limit per sample (finish_reason 'length' when reached)" },
  batch_size: { type: 'number', default: 64, integer: true, min: 1, describe: 'Samples stepped together (one reference pass and one critic pass per step): speed and memory, not the samples' },
  device: deviceOption,
  compute_dtype: { type: 'string', default: 'float32', choices: ['float32', 'bfloat16'], describe: 'Compute dtype of the forward passes (weights stored float32; bfloat16 needs --device cuda)' },
} as const satisfies OptionSchema;

/** Every option of `lathe extract generate`. */
export const extractGenerateSchema = {
  model: { type: 'string', default: '', describe: 'Reference policy π_ref folder: it proposes the candidates and their probabilities [required]' },
  tokenizer: tokenizerOption,
  ...criticOptions,
  ...promptOptions,
  tau: tauOption,
  samples: { type: 'number', default: 4, integer: true, min: 1, describe: 'Samples per prompt' },
  ...samplingRunOptions,
  seed: { type: 'number', default: 0, integer: true, describe: 'Seed: sample j of prompt p reads noise stream p·samples + j of it, so samples do not depend on --batch_size' },
  output: { type: 'string', default: '', describe: 'Trajectory Parquet file (written atomically): the trajectory columns plus token_q_values and token_remaining (the critic\'s Q and expected remaining length after each drawn token), candidate_ids, candidate_q_values, candidate_ref_logprobs, candidate_remaining [required]' },
  html: { type: 'string', default: '', describe: "Token-value view written beside the output: a self-contained HTML page colouring each token by its Q or expected remaining length ('': <output>.html; 'none': no page)" },
} as const satisfies OptionSchema;

/** The options `lathe extract train` and `lathe extract rft` share. */
const policyTrainOptions = {
  model: { ...modelOption, describe: 'The policy to start from: the reference policy π_ref (a Hugging Face folder or checkpoint)' },
  tokenizer: tokenizerOption,
  ...trainStepOptions({ steps: 200, batch_size: 8, batch: 'Trajectories per optimizer step' }),
  max_length: { type: 'number', default: 4096, integer: true, min: 2, describe: 'Longest prompt + output trained on: a longer trajectory is skipped and counted' },
  ...optimizerOptions({ lr: 1e-5, schedule: 'cosine', warmup_steps: 10, weight_decay: 0.01, max_grad_norm: 1 }),
  ...loraOptions,
  seed: seedOption("the trajectories' order and the built-in model"),
  ...trainRunOptions(100, 'metrics'),
} as const satisfies OptionSchema;

/** Every option of `lathe extract train`. */
export const extractTrainSchema = {
  data: { type: 'string', default: '', describe: 'Labelled trajectory Parquet (lathe critic label or lathe extract generate): prompt_token_ids, output_token_ids, candidate_ids, candidate_q_values, candidate_ref_logprobs [required]' },
  run_dir: runDirOption('runs/extract', 'config.yaml, metrics.jsonl and checkpoints/'),
  tau: tauOption,
  kl: { type: 'string', default: 'reverse', choices: KL_DIRECTIONS, describe: 'reverse: KL(π_θ‖π*), mode-seeking (the original method); forward: KL(π*‖π_θ), mass-covering' },
  candidate_mass: { type: 'number', default: 1, min: 0, describe: "Weight of −log π_θ(C), the policy's full-softmax mass on each position's candidates: the KL sees π_θ renormalised over them only, so without it mass can drift onto other tokens (0: the KL alone)" },
  ...policyTrainOptions,
} as const satisfies OptionSchema;

/** Every option of `lathe extract rft`. */
export const extractRftSchema = {
  data: { type: 'string', default: '', describe: "Trajectory Parquet with 'correct' or 'value' (lathe generate, lathe critic data, lathe extract generate) [required]" },
  run_dir: runDirOption('runs/extract-rft', 'config.yaml, metrics.jsonl and checkpoints/'),
  success_threshold: { type: 'number', default: 1, min: 0, max: 1, describe: "Trajectories whose 'correct' (else 'value') is at least this are trained on; the rest are dropped" },
  ...policyTrainOptions,
} as const satisfies OptionSchema;

/** Every option of `lathe extract eval`. */
export const extractEvalSchema = {
  model: { type: 'string', default: '', describe: 'Policy to evaluate (π_ref, or a lathe extract train / rft checkpoint) [required]' },
  tokenizer: tokenizerOption,
  ...criticOptions,
  ...promptOptions,
  sampler: { type: 'string', default: 'policy', choices: ['policy', 'q_weighted'], describe: "How samples are drawn: policy (the model's min-p sampling, no critic in the loop) or q_weighted (π_ref·exp(Q/τ) over the candidates, the critic at every step)" },
  tau: { ...tauOption, describe: `${tauOption.describe}; with --sampler q_weighted` },
  samples: { type: 'number', default: 16, integer: true, min: 1, describe: 'Samples per prompt: the table has n = 1, 4, 16 (those up to this)' },
  ...samplingRunOptions,
  seed: { type: 'number', default: 0, integer: true, describe: 'Seed of the sampling noise' },
  output: { type: 'string', default: '', describe: "JSON report written (atomically) besides the table on stdout ('': none)" },
} as const satisfies OptionSchema;

/** A resolved `lathe extract generate` config. */
export type ExtractGenerateConfig = ConfigOf<typeof extractGenerateSchema>;
/** A resolved `lathe extract train` config. */
export type ExtractTrainConfig = ConfigOf<typeof extractTrainSchema>;
/** A resolved `lathe extract rft` config. */
export type ExtractRftConfig = ConfigOf<typeof extractRftSchema>;
/** A resolved `lathe extract eval` config. */
export type ExtractEvalConfig = ConfigOf<typeof extractEvalSchema>;

/** Options `--resume` of a train or rft run accepts with new values. */
export const EXTRACT_TRAIN_RESUMABLE_KEYS: readonly string[] = ['resume', 'force', 'overwrite', 'save_every', 'keep_last', 'log_every', 'gradient_checkpointing', 'report_to', 'wandb_project'];
