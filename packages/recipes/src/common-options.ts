/**
 * Options that several commands share, written once and spread into each command's schema: the
 * model and device, prompt formatting, the train step's compute, the optimizer and its schedule,
 * LoRA, the run directory with its checkpoints and resume, and sampling filters. A command that
 * gives a shared option another default overrides that one field (`{ ...deviceOption, default }`).
 */
import { DEFAULT_BUCKET_BYTES } from '@lathe/distributed';
import { BUILTIN_MODEL, BUILTIN_TOKENIZER } from './demo-task';
import type { OptionSchema } from './options';

/** `options` marked in their help as ones `--resume` accepts with new values (the command's resume check skips them). */
export function resumableOptions<S extends OptionSchema>(options: S): S {
  return Object.fromEntries(Object.entries(options).map(([k, spec]) => [k, { ...spec, describe: `${spec.describe} [may change on resume]` }])) as S;
}

/** `--model` of a training command: the folder to start from, or the built-in model. */
export const modelOption = { type: 'string', default: BUILTIN_MODEL, describe: `Hugging Face model folder to start from (config.json, *.safetensors, tokenizer.json), e.g. another run's checkpoint, or ${BUILTIN_MODEL} (a tiny random Qwen3 with the built-in task's character tokenizer)` } as const;

/** `--tokenizer` of a command whose model folder may lack one (e.g. a checkpoint of a run on the built-in task). */
export const tokenizerOption = { type: 'string', default: 'model', describe: `'model' (the model folder's tokenizer.json), a folder holding tokenizer.json, or ${BUILTIN_TOKENIZER} (the character tokenizer of the built-in task)` } as const;

/** `--prompt_format` and `--enable_thinking`: how a training command turns a prompt's text into ids. */
export const promptFormatOptions = {
  prompt_format: { type: 'string', default: 'raw', choices: ['raw', 'chat'], describe: "Prompts as they are, or as the user turn of the model's chat template" },
  enable_thinking: { type: 'boolean', default: false, describe: "With --prompt_format chat: Qwen3's enable_thinking switch" },
} as const satisfies OptionSchema;

/** `--device`. */
export const deviceOption = { type: 'string', default: 'cpu', choices: ['cpu', 'cuda'], describe: 'Where to run (cuda needs the CUDA provider: see `lathe doctor`; never falls back to cpu)' } as const;

/** `--run_dir` of a training run; `files` names what it writes there. */
export function runDirOption(dir: string, files: string) {
  return { type: 'string', default: dir, describe: `Run directory: ${files} go here` } as const;
}

/** `--seed`; `drives` names what it seeds. */
export function seedOption(drives: string) {
  return { type: 'number', default: 0, integer: true, describe: `Seed of ${drives}` } as const;
}

// ---------------------------------------------------------------------------------------------
// The train step

/** `--compute_dtype` of a training command. */
export const trainComputeDtypeOption = { type: 'string', default: 'float32', choices: ['float32', 'bfloat16'], describe: 'Dtype of the compute (forward, backward and any generation); master weights and AdamW state stay float32 (bfloat16 needs --device cuda)' } as const;

/** `--attention` of the train step (and of scoring). */
export const attentionOption = { type: 'string', default: 'auto', choices: ['auto', 'composed', 'flash'], describe: "Attention in the train step and scoring: 'composed' (MatMul/Softmax, keeps [B, heads, T, T] activations), 'flash' (ONNX Runtime's GroupQueryAttention, the backward recomputing each layer's probabilities: faster and less memory on a GPU, use it with bfloat16 on cuda) or 'auto': flash on cuda with bfloat16 compute, composed otherwise (faster on cpu; GroupQueryAttention has no float32 CUDA kernel)" } as const;

/** What `--attention` of the training commands chooses between (each command adds what its other graphs do). */
export const trainAttentionChoicesHelp =
  "Attention in the train step: 'kernels' (Lathe's own flash-attention kernels, forward and backward; CUDA bfloat16, cpu float32 for tests; not with --packing or --cuda_graph; measured in docs/guides/kernels.md), 'flash' (ONNX Runtime's GroupQueryAttention, its backward recomputing each layer's probabilities), 'composed' (MatMul/Softmax, keeps [B, heads, T, T] activations; the cpu's fastest) or 'auto': kernels on cuda with bfloat16 compute wherever they apply (not with --packing, --cuda_graph, --quantize_base, lathe grpo under lathe launch, or where NVRTC is missing), else flash on cuda with bfloat16, composed otherwise.";

/** `--attention` of the commands whose train step can attend through Lathe's own kernels (sft, rm train, dpo): {@link attentionOption} and `kernels`. */
export const trainAttentionOption = {
  ...attentionOption,
  choices: [...attentionOption.choices, 'kernels'],
  describe: `${trainAttentionChoicesHelp} The evaluation and scoring graphs are unchanged`,
} as const;

/** `--logprob_kernel` of the training commands whose attention can be Lathe's kernels (resolved by train-attention.ts's resolveLogprobKernel). */
export const logprobKernelOption = {
  type: 'boolean',
  default: 'auto',
  describe:
    "The LM head's per-token log-probs through Lathe's fused cross-entropy kernels (each vocabulary chunk's logits read once forward and once backward in the compute dtype, no float32 copy) instead of ONNX Runtime's cast, LogSoftmax and their backward; needs the attention kernels. 'auto': on exactly when the run's attention is Lathe's kernels (--attention kernels, or auto where it picks them; measured in docs/guides/kernels.md), off otherwise; true: on, an error where the attention is not the kernels; false: off",
} as const;

/** `--rope_kernel` of lathe sft (resolved by train-attention.ts's resolveRopeKernel). */
export const ropeKernelOption = {
  type: 'boolean',
  default: 'auto',
  describe:
    "Rotate queries and keys (RoPE) through Lathe's kernel, in the compute dtype with the inverse rotation as its gradient, instead of ONNX Runtime's RotaryEmbedding and its composed backward; needs the attention kernels. 'auto': on exactly when the run's attention is Lathe's kernels and the model's head size is one the kernel takes (measured in docs/guides/kernels.md), off otherwise; true: on, an error where it cannot be; false: off",
} as const;

/** `--swiglu_kernel` of lathe sft (resolved by train-attention.ts's resolveSwigluKernel). */
export const swigluKernelOption = {
  type: 'boolean',
  default: 'auto',
  describe:
    "Each MLP's activation silu(gate)·up through Lathe's SwiGLU kernel (one pass forward and one backward, in the compute dtype) instead of ONNX Runtime's QuickGelu, Mul and their composed gradients; needs the attention kernels. 'auto': on exactly when the run's attention is Lathe's kernels (measured in docs/guides/kernels.md), off otherwise; true: on, an error where the attention is not the kernels; false: off",
} as const;

/** `--gradient_checkpointing`. */
export const gradientCheckpointingOption = { type: 'boolean', default: false, describe: "Recompute each decoder layer's activations in the train step's backward pass instead of keeping them: less memory, one more forward pass of the layers" } as const;

/** `--micro_batches`: gradient accumulation. */
export const microBatchesOption = { type: 'number', default: 1, integer: true, min: 1, describe: "Split each optimizer step's batch into this many micro-batches (gradient accumulation: the same update, less memory)" } as const;

/**
 * `--zero_stage` of a data-parallel training command (under `lathe launch`): 0 keeps the whole
 * AdamW state on every rank; 1 and 2 split it over the ranks (@lathe/train's zero.ts), which
 * already reduce-scatters each micro-batch's gradients into 1/N-sized sums (ZeRO-2's gradient
 * partitioning), so both name the same path.
 */
export const zeroStageOption = { type: 'number', default: 0, integer: true, min: 0, max: 2, describe: "Under lathe launch: 0 keeps the whole AdamW state on every rank; 1 splits the AdamW moments (and an fp32 copy of the weights each rank updates) over the ranks — ZeRO-1: each GPU keeps 1/N of them and the weights once instead of twice; gradients are reduce-scattered and weights all-gathered, giving the same updates. Each micro-batch's gradients are reduce-scattered into 1/N-sized sums, so the full gradient exists for one micro-batch only: that is ZeRO-2's gradient partitioning, and 2 is accepted as the same path. No effect on one process [may change on resume]" } as const;

/** `--grad_reduce_dtype` of a data-parallel training command: the dtype gradients cross between ranks in (@lathe/train's GradReduceDtype). */
export const gradReduceDtypeOption = {
  type: 'string',
  default: 'float32',
  choices: ['float32', 'bfloat16'],
  describe:
    "Under lathe launch: the dtype gradients are summed over the ranks in. bfloat16 sends half the bytes (PyTorch DDP's bf16_compress_hook): each rank's gradient is rounded to bfloat16, NCCL sums in bfloat16, and the sum is widened back to float32 for the update (and the ZeRO shards' sum over micro-batches). No effect on one process [may change on resume]",
} as const;

/**
 * `--grad_overlap` of a data-parallel training command: the gradients summed inside the backward's
 * run (@lathe/distributed's in-run all-reduce, or ZeRO's reduce-scatter) where the device allows it,
 * else after the backward (launch-dp.ts's gradientReduction decides).
 */
export const gradOverlapOption = {
  type: 'boolean',
  default: true,
  describe:
    "Under lathe launch: sum the gradients over the ranks inside the backward's run, one NCCL all-reduce (with --zero_stage 1|2 a reduce-scatter) per --grad_bucket_mb bucket as soon as the backward has produced it, overlapping the rest of the backward; false sums them after the backward (the bucketed post-backward all-reduce). Needs --device cuda (NCCL) and Lathe's CUDA kernels' compute stream; where either is missing — on the cpu, whose ranks join over TCP, or without NVRTC — the gradients are summed after the backward whatever this says. The same updates either way. No effect on one process [may change on resume]",
} as const;

/**
 * `--grad_bucket_mb` of a data-parallel training command: the gradients' bucket size of both
 * reductions (@lathe/distributed's `DEFAULT_BUCKET_BYTES` is its default).
 */
export const gradBucketMbOption = {
  type: 'number',
  default: DEFAULT_BUCKET_BYTES / 2 ** 20,
  min: 1,
  describe:
    'Under lathe launch: MiB of gradients per bucket, each bucket one NCCL all-reduce (or reduce-scatter) — in the backward\'s run with --grad_overlap, after it otherwise. Larger buckets mean fewer launches to enqueue and wait behind; smaller ones start summing earlier in the backward (PyTorch DDP\'s bucket_cap_mb, 25 by default there). The same updates whatever the size. No effect on one process [may change on resume]',
} as const;

/** Where a training command runs and its train step: device, compute, attention, recomputation, steps and batch (`batch` describes what a batch counts). */
export function trainStepOptions(d: { steps: number; batch_size: number; batch: string }) {
  return {
    device: deviceOption,
    compute_dtype: trainComputeDtypeOption,
    attention: attentionOption,
    gradient_checkpointing: gradientCheckpointingOption,
    steps: { type: 'number', default: d.steps, integer: true, min: 1, describe: 'Optimizer steps' },
    batch_size: { type: 'number', default: d.batch_size, integer: true, min: 1, describe: d.batch },
    micro_batches: microBatchesOption,
  } as const satisfies OptionSchema;
}

/** The AdamW and learning-rate options, with a command's defaults; schedules count the command's `--steps`. */
export function optimizerOptions(d: { lr: number; schedule: 'constant' | 'linear' | 'cosine'; warmup_steps: number; weight_decay: number; max_grad_norm: number }) {
  return {
    lr: { type: 'number', default: d.lr, min: 0, describe: 'Peak learning rate' },
    schedule: { type: 'string', default: d.schedule, choices: ['constant', 'linear', 'cosine'], describe: 'Learning-rate schedule over --steps after warm-up' },
    warmup_steps: { type: 'number', default: d.warmup_steps, integer: true, min: 0, describe: 'Linear warm-up over this many of --steps' },
    min_lr_ratio: { type: 'number', default: 0.1, min: 0, max: 1, describe: 'Cosine floor as a fraction of lr' },
    weight_decay: { type: 'number', default: d.weight_decay, min: 0, describe: 'AdamW decoupled weight decay (not applied to norms and biases)' },
    max_grad_norm: { type: 'number', default: d.max_grad_norm, min: 0, describe: 'Clip the global gradient norm of each update (0: off)' },
  } as const satisfies OptionSchema;
}

/** LoRA instead of training every weight. */
export const loraOptions = {
  lora_rank: { type: 'number', default: 0, integer: true, min: 0, describe: 'LoRA rank (0: train every weight)' },
  lora_alpha: { type: 'number', default: 16, min: 0, describe: 'LoRA alpha (adapters are scaled by alpha / rank)' },
  lora_targets: { type: 'string', default: 'q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj', describe: 'Regular expression over HF weight names selecting the matrices LoRA adapts' },
  lora_dropout: { type: 'number', default: 0, min: 0, below: 1, describe: "Dropout on each LoRA adapter's input in the train step (PEFT's lora_dropout), never in generation or evaluation; masks from an in-graph hash of (seed, optimizer step, micro-batch), so --resume redraws them exactly" },
} as const satisfies OptionSchema;

/** `--quantize_base`: QLoRA, LoRA adapters over a base quantized in memory. */
export const quantizeBaseOption = {
  type: 'string',
  default: 'none',
  choices: ['none', 'nf4', 'int4', 'int8'],
  describe:
    "QLoRA: quantize the frozen base under the LoRA adapters in memory (nf4: bitsandbytes' NF4 with double quantization; int4: blocks of 64; int8: per output channel), every decoder projection; the adapters train in --compute_dtype and checkpoints hold them alone and merged into the dequantized base; needs --lora_rank > 0",
} as const;

// ---------------------------------------------------------------------------------------------
// Evaluation, checkpoints and resume

/** `--eval_examples`: the held-out split every training recipe makes. */
export const evalExamplesOption = { type: 'number', default: 64, integer: true, min: 0, describe: 'Held-out examples, scored by greedy generation (lathe sft and lathe grpo hold out the same ones for the same data, seed and count)' } as const;

/** `--save_every` and `--keep_last`. */
export function checkpointOptions(saveEvery: number) {
  return {
    save_every: { type: 'number', default: saveEvery, integer: true, min: 0, describe: 'Checkpoint every N steps (0: only at the end)' },
    keep_last: { type: 'number', default: 2, integer: true, min: 1, describe: 'Checkpoints kept (older ones are deleted)' },
  } as const satisfies OptionSchema;
}

/** `--resume`, `--overwrite` and `--force` of a training run; `logs` names what the run logs besides checkpoints. */
export function resumeOptions(logs: string) {
  return {
    resume: { type: 'boolean', default: false, describe: `Continue from the run directory's latest checkpoint (weights, AdamW state, step, data position); ${logs} of later steps are cut back to it` },
    overwrite: { type: 'boolean', default: false, describe: `Start over in a run directory that holds an earlier run, deleting its checkpoints, ${logs} (without it, such a directory is an error; ignored with --resume)` },
    force: { type: 'boolean', default: false, describe: 'With --resume: accept a config that differs from the checkpoint’s (the changed keys are listed)' },
  } as const satisfies OptionSchema;
}

/** `--log_every` of a training run that logs metrics every 10 steps by default. */
export const logEveryOption = { type: 'number', default: 10, integer: true, min: 1, describe: 'Write metrics every N steps' } as const;

/** `--report_to` and `--wandb_project`: where a training run's metrics go besides metrics.jsonl. */
export const reportOptions = {
  report_to: { type: 'string', default: 'none', describe: "Where metrics also go: tensorboard (event files in <run_dir>/tensorboard: tensorboard --logdir runs), wandb (Weights & Biases: needs WANDB_API_KEY; a resume continues the same W&B run), both comma-separated, or none" },
  wandb_project: { type: 'string', default: '', describe: "W&B project with --report_to wandb ('': WANDB_PROJECT, else 'lathe'); the W&B run is named after the run directory" },
} as const satisfies OptionSchema;

/** A training run's checkpoint, resume and logging options: `checkpointOptions(saveEvery)`, `resumeOptions(logs)`, `--log_every` and the reporting options. */
export function trainRunOptions(saveEvery: number, logs: string) {
  return { ...checkpointOptions(saveEvery), ...resumeOptions(logs), log_every: logEveryOption, ...reportOptions } as const satisfies OptionSchema;
}

// ---------------------------------------------------------------------------------------------
// Sampling

/** `--top_k`, `--top_p`, `--min_p`; `needs` is appended to each one's "off" note (a condition the command puts on filters). */
export function samplingFilterOptions(needs = '') {
  return {
    top_k: { type: 'number', default: 0, integer: true, min: 0, describe: `Sample from the k most likely tokens (0: off${needs})` },
    top_p: { type: 'number', default: 1, min: 0, max: 1, describe: `Nucleus sampling mass, in (0, 1] (1: off${needs}); without a top_k of at most 256 every step sorts the whole vocabulary, so pair it with one (Qwen3 recommends top_k 20)` },
    min_p: { type: 'number', default: 0, min: 0, max: 1, describe: `Drop tokens below min_p × the top probability (0: off${needs})` },
  } as const satisfies OptionSchema;
}

/** `--generation_engine`. */
export const generationEngineOption = { type: 'string', default: 'auto', choices: ['auto', 'kv-cache', 'graph'], describe: 'How completions are generated: kv-cache (prefill, then bound decode-step runs over GroupQueryAttention with in-place KV caches; the fast one on a GPU; needs head_dim a multiple of 16 and, on cuda, bfloat16 or float16 compute), graph (the in-graph generation loop; any model and dtype), or auto (kv-cache where it runs, else graph); the same samples either way up to rounding' } as const;

/**
 * `--quantized_weights` of the commands that generate from model folders (lathe generate, lathe
 * eval): how a quantized folder (`lathe quantize`) runs; dense folders are unaffected.
 */
export const quantizedWeightsOption = {
  type: 'string',
  default: 'auto',
  choices: ['auto', 'dequantize'],
  describe:
    "How a quantized model folder (lathe quantize; config.json has quantization_config) runs. auto: through its quantized kernels in the kv-cache engine — the GPU holds the quantized bytes (4-bit projections about a quarter of their bf16 size, int8 half) and decode steps read them: int4 on cuda with bfloat16/float16 through Lathe's W4A16 kernel in decode steps of up to 64 rows (its launch plans tuned on the GPU at load, a few seconds) and Lathe's dequantize + cuBLAS in prefill and larger batches, int8 and nf4 (and int4 on cpu) through ONNX Runtime's MatMulNBits / MatMulBnb4; needs the kv-cache engine. dequantize: the weights dequantized to dense at load (the dense model's memory and speed, any engine; the projections' values are the same). Dense folders run the same either way",
} as const;

// ---------------------------------------------------------------------------------------------
// The KV-cache engine's decode options (lathe generate, lathe eval; resolved by decode-options.ts)

/**
 * `--kv_cache_dtype`, `--decode_attention`, `--swiglu_kernel` and `--residual_dtype` of the commands
 * that generate through the KV-cache engine: its opt-in kernels and graph options, each one's
 * numerics in its help; their measured speeds are in docs/guides/generate.md.
 */
export const decodeOptions = {
  kv_cache_dtype: {
    type: 'string',
    default: 'auto',
    choices: ['auto', 'float8e4m3'],
    describe:
      "How the KV-cache engine holds its keys and values: auto (the compute dtype) or float8e4m3 (e4m3 bytes with a float32 scale per row, head and position, read by Lathe's decode attention kernel: half the bytes a decode step reads; lossy: a small KL against the bf16 cache, faster decoding at large batches; docs/guides/generate.md). float8e4m3 needs --device cuda, NVRTC and the kv-cache engine",
  },
  decode_attention: {
    type: 'string',
    default: 'auto',
    choices: ['auto', 'gqa', 'kernel'],
    describe:
      "The decode step's attention: gqa (ONNX Runtime's GroupQueryAttention), kernel (Lathe's decode attention kernel, with each layer's q/k/v and gate/up projections packed into one MatMul each, which the kernel reads packed; needs --device cuda, NVRTC, bfloat16/float16 compute and head size 64 or 128), or auto: kernel with --kv_cache_dtype float8e4m3 (the only attention that reads it), else gqa (the kernel over a bf16 cache measured 0.98× of it)",
  },
  swiglu_kernel: {
    ...swigluKernelOption,
    describe:
      "Each MLP's activation silu(gate)·up through Lathe's SwiGLU kernel in the prefill and the decode step, instead of ONNX Runtime's QuickGelu and Mul (faster; rounding changes on ties only). auto: on with --device cuda where NVRTC is present and the kv-cache engine runs, else off; true: on, an error where it cannot be; false: off",
  },
  residual_dtype: {
    type: 'string',
    default: 'float32',
    choices: ['float32', 'compute'],
    describe:
      "The KV-cache engine's residual stream: float32 (it accumulates in float32) or compute (it stays in the compute dtype, as transformers does in bf16: no Casts between layers; faster; greedy outputs change on ties). The same graphs with float32 compute; needs the kv-cache engine",
  },
} as const satisfies OptionSchema;
