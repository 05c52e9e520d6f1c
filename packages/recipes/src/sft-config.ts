/** `lathe sft`'s options: defaults, flags, YAML keys and the config saved with checkpoints. */
import { BUILTIN_DATA, BUILTIN_MODEL } from './demo-task';
import type { ConfigOf, OptionSchema } from './options';

/** Every option of an SFT run. */
export const sftSchema = {
  model: { type: 'string', default: BUILTIN_MODEL, describe: `Hugging Face model folder (config.json, *.safetensors, tokenizer.json), or ${BUILTIN_MODEL} (a tiny random Qwen3 and a character tokenizer)` },
  data: { type: 'string', default: BUILTIN_DATA, describe: `JSONL file of {"prompt", "response"[, "subject"]} rows, a .parquet file with those columns, or ${BUILTIN_DATA} (synthetic "a+b=" problems)` },
  prompt_format: { type: 'string', default: 'raw', choices: ['raw', 'chat'], describe: "Prompts as they are, or as the user turn of the model's chat template" },
  enable_thinking: { type: 'boolean', default: false, describe: "With --prompt_format chat: Qwen3's enable_thinking switch" },
  run_dir: { type: 'string', default: 'runs/sft', describe: 'Run directory: config.yaml, metrics.jsonl, checkpoints/ and eval/ go here' },
  device: { type: 'string', default: 'cpu', choices: ['cpu', 'cuda'], describe: 'Where to train (cuda needs the CUDA provider: see `lathe doctor`)' },
  compute_dtype: { type: 'string', default: 'float32', choices: ['float32', 'bfloat16'], describe: 'Dtype of forward/backward compute; master weights and AdamW state stay float32 (bfloat16 needs --device cuda)' },
  steps: { type: 'number', default: 1000, integer: true, min: 1, describe: 'Optimizer steps' },
  batch_size: { type: 'number', default: 32, integer: true, min: 1, describe: 'Sequences per optimizer step' },
  micro_batches: { type: 'number', default: 1, integer: true, min: 1, describe: 'Split each batch into this many micro-batches (gradient accumulation)' },
  attention: {
    type: 'string',
    default: 'auto',
    choices: ['auto', 'composed', 'flash'],
    describe: "Attention in the train step: 'composed' (MatMul/Softmax, keeps [B, heads, T, T] activations), 'flash' (ONNX Runtime's GroupQueryAttention forward, the backward recomputing the probabilities one layer at a time; 2.3× faster steps on an H100 at 8 × 1024) or 'auto': flash on cuda with bfloat16 compute, composed otherwise (faster on cpu; GroupQueryAttention has no float32 CUDA kernel)",
  },
  gradient_checkpointing: { type: 'boolean', default: false, describe: "Recompute each decoder layer's activations in the backward pass instead of keeping them: less memory, one more forward pass of the layers" },
  cuda_graph: {
    type: 'boolean',
    default: false,
    describe:
      'Replay the train step as a CUDA graph: no gaps between kernel launches (H100, 8 × 1024: step 277 → 260 ms full fine-tuning, 237 → 219 ms LoRA r=16). Every batch is padded to exactly [batch_size, max_length], so it pays off when examples are near max_length (e.g. long-context SFT) and wastes compute on short ones. Needs --device cuda and --micro_batches 1',
  },
  max_length: { type: 'number', default: 512, integer: true, min: 2, describe: 'Longest training sequence in tokens (see --overlong)' },
  overlong: { type: 'string', default: 'skip', choices: ['skip', 'truncate'], describe: 'Examples over max_length: skip them, or truncate the response (both counted)' },
  lr: { type: 'number', default: 2e-5, min: 0, describe: 'Peak learning rate' },
  schedule: { type: 'string', default: 'cosine', choices: ['constant', 'linear', 'cosine'], describe: 'Learning-rate schedule after warm-up' },
  warmup_steps: { type: 'number', default: 20, integer: true, min: 0, describe: 'Linear warm-up steps' },
  min_lr_ratio: { type: 'number', default: 0.1, min: 0, max: 1, describe: 'Cosine floor as a fraction of lr' },
  weight_decay: { type: 'number', default: 0.01, min: 0, describe: 'AdamW decoupled weight decay (not applied to norms and biases)' },
  max_grad_norm: { type: 'number', default: 1, min: 0, describe: 'Clip the global gradient norm (0: off)' },
  lora_rank: { type: 'number', default: 0, integer: true, min: 0, describe: 'LoRA rank (0: full fine-tuning)' },
  lora_alpha: { type: 'number', default: 16, min: 0, describe: 'LoRA alpha (adapters are scaled by alpha / rank)' },
  lora_targets: { type: 'string', default: 'q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj', describe: 'Regular expression over HF weight names selecting the matrices LoRA adapts' },
  lora_dropout: { type: 'number', default: 0, min: 0, below: 1, describe: "Dropout on each LoRA adapter's input in training (PEFT's lora_dropout), in [0, 1); masks from an in-graph hash of (seed, step, micro-batch), so --resume redraws them exactly" },
  seed: { type: 'number', default: 0, integer: true, describe: 'Seed of data order, splits and the built-in model' },
  eval_examples: { type: 'number', default: 64, integer: true, min: 0, describe: 'Held-out examples scored by greedy generation (exact match)' },
  eval_grader: { type: 'string', default: 'exact', choices: ['exact', 'math'], describe: 'How a generated response is judged: exact string match, or the math grader (final answers extracted and compared symbolically)' },
  eval_every: { type: 'number', default: 100, integer: true, min: 0, describe: 'Evaluate every N steps (0: only at the end)' },
  max_new_tokens: { type: 'number', default: 16, integer: true, min: 1, describe: 'Generation length limit during evaluation' },
  save_every: { type: 'number', default: 200, integer: true, min: 0, describe: 'Checkpoint every N steps (0: only at the end)' },
  keep_last: { type: 'number', default: 2, integer: true, min: 1, describe: 'Checkpoints kept (older ones are deleted)' },
  resume: { type: 'boolean', default: false, describe: "Continue from the run directory's latest checkpoint (metrics, evaluations of later steps are cut back to it)" },
  overwrite: { type: 'boolean', default: false, describe: 'Start over in a run directory that holds an earlier run, deleting its checkpoints, metrics and evaluations (without it, such a directory is an error; ignored with --resume)' },
  log_every: { type: 'number', default: 10, integer: true, min: 1, describe: 'Write metrics every N steps' },
} as const satisfies OptionSchema;

/** A resolved SFT config. */
export type SftConfig = ConfigOf<typeof sftSchema>;

/**
 * `lathe demo` (the README's main command): the built-in model and task, with the settings that
 * make a 2-layer model learn two-digit addition in under a minute on two CPU cores.
 */
export const DEMO_SFT_OVERRIDES: Partial<SftConfig> = {
  model: BUILTIN_MODEL,
  data: BUILTIN_DATA,
  run_dir: 'runs/demo',
  steps: 1000,
  batch_size: 64,
  lr: 5e-3,
  warmup_steps: 20,
  eval_every: 250,
  save_every: 500,
  // the quick start's command is run again as it is: each run replaces runs/demo
  overwrite: true,
};
