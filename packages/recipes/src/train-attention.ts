/**
 * `--attention` (and `--logprob_kernel`, `--rope_kernel`, `--swiglu_kernel`) of the training commands whose loss can attend through Lathe's
 * own flash-attention kernels (`lathe sft`, `lathe rm train`, `lathe dpo`, `lathe grpo`): the choice refused where it cannot work, the
 * device opened through the kernels, the kernels compiled once per process, and what the loss and
 * the Trainer then take (the attention kernel, the custom-op domain in the step's sessions).
 */
import type { DecoderConfig } from '@lathe/models';
import { Device, type Ptr } from '@lathe/runtime';
import { CrossEntropyKernels, crossEntropyOps, cudaIncludeDir, FlashAttention, flashAttentionOps, flashAttentionUnsupported, probeKernels, RopeKernels, ropeOps, ropeUnsupported, SwigluKernels, swigluOps, type CrossEntropyOps, type FlashAttentionOps, type Kernels, type RopeOps, type SwigluOps } from '@lathe/kernels';
import { useFlashAttention, type AttentionChoice, type DecoderLossOptions } from '@lathe/train';
import { logprobKernelOption, ropeKernelOption, swigluKernelOption } from './common-options';
import { kernelsOfDevice, openDevice } from './scaffold';

/** `--attention` of sft, rm train and dpo: GRPO's choices and `kernels`. */
export type TrainAttentionChoice = AttentionChoice | 'kernels';

/** The options a run's attention depends on. */
export interface TrainAttentionConfig {
  device: 'cpu' | 'cuda';
  compute_dtype: 'float32' | 'bfloat16';
  attention: TrainAttentionChoice;
  /** `lathe sft --packing`. */
  packing?: boolean;
  /** `lathe sft --cuda_graph`. */
  cuda_graph?: boolean;
  /** `--quantize_base`: `auto` keeps flash attention under a quantized base (the kernels are not measured with one). */
  quantize_base?: string;
  /** `--logprob_kernel`: the LM head's log-partition through Lathe's fused cross-entropy kernels (with the attention kernels); see {@link resolveLogprobKernel}. Absent: off. */
  logprob_kernel?: boolean | 'auto';
  /** `--rope_kernel` (lathe sft): queries and keys rotated by Lathe's RoPE kernel (with the attention kernels); see {@link resolveRopeKernel}. Absent: off. */
  rope_kernel?: boolean | 'auto';
  /** `--swiglu_kernel` (lathe sft): each MLP's activation through Lathe's SwiGLU kernel (with the attention kernels); see {@link resolveSwigluKernel}. Absent: off. */
  swiglu_kernel?: boolean | 'auto';
}

/** What `auto` weighs beyond the options: facts known only once the run starts. */
export interface AutoAttentionFacts {
  /** Why the model's heads are not ones the kernels take, or undefined when they are. */
  unsupported?: string;
  /** Lathe's CUDA kernels can run on this GPU (NVRTC and the driver found, the device opened through them). */
  kernelsAvailable: boolean;
  /** The run is one rank of a data-parallel `lathe grpo` job, whose kernels path is not measured under lathe launch (sft, rm train and dpo take the kernels there: a same-call A/B on 2 GPUs, docs/benchmarks.md). */
  dataParallel: boolean;
}

/**
 * The attention a run uses: an explicit choice as given; `auto` is Lathe's own kernels on cuda with
 * half-precision compute wherever they apply — they beat GroupQueryAttention in same-call A/Bs of
 * full SFT, reward-model and DPO steps and a GRPO step (docs/benchmarks.md) — and otherwise what {@link useFlashAttention}
 * picks (flash on cuda, composed on the cpu or with packed rows).
 */
export function resolveTrainAttention(cfg: TrainAttentionConfig, facts: AutoAttentionFacts): TrainAttentionChoice {
  if (cfg.attention !== 'auto') return cfg.attention;
  const half = cfg.compute_dtype !== 'float32';
  const quantized = cfg.quantize_base !== undefined && cfg.quantize_base !== 'none';
  const kernels = cfg.device === 'cuda' && half && !cfg.packing && !cfg.cuda_graph && !quantized && !facts.dataParallel && facts.unsupported === undefined && facts.kernelsAvailable;
  return kernels ? 'kernels' : 'auto';
}

/**
 * Whether a kernel that joins the attention kernels (`--logprob_kernel`, `--rope_kernel`,
 * `--swiglu_kernel`) runs, given the attention the run resolved to: `auto` exactly when that is the
 * kernels, true likewise but an error otherwise (the kernel shares the attention kernels' device and
 * sessions), false or absent off. `defaultValue`: the option's default (its config's), which the refusal names.
 */
function resolveWithKernels(flag: string, value: boolean | 'auto' | undefined, attention: TrainAttentionChoice, choice: TrainAttentionChoice, defaultValue: boolean | 'auto'): boolean {
  if (value === 'auto') return choice === 'kernels';
  if (value !== true) return false;
  if (choice !== 'kernels') {
    const drop = defaultValue === 'auto' ? `drop ${flag} (its default, auto, takes it wherever the attention is the kernels)` : `drop ${flag}`;
    throw new Error(`${flag} needs the attention kernels, and the run's attention is ${attention === 'auto' ? "'auto', which did not pick them here (see --attention's help for where it does not)" : `'${attention}'`}: use --attention kernels, or ${drop}`);
  }
  return true;
}

/**
 * Whether a run's LM head takes Lathe's fused log-prob kernel ({@link resolveWithKernels}'s rule):
 * the fused kernel beat the attention kernels alone in same-call A/Bs of the full SFT step and the
 * GRPO step (docs/benchmarks.md), hence `auto` as the default.
 */
export function resolveLogprobKernel(cfg: Pick<TrainAttentionConfig, 'attention' | 'logprob_kernel'>, choice: TrainAttentionChoice): boolean {
  return resolveWithKernels('--logprob_kernel', cfg.logprob_kernel, cfg.attention, choice, logprobKernelOption.default);
}

/**
 * Whether a run's queries and keys go through Lathe's RoPE kernel instead of ONNX Runtime's
 * RotaryEmbedding ({@link resolveWithKernels}'s rule): it beat the attention and log-prob kernels
 * without it in a same-call A/B of the full and LoRA SFT steps (docs/benchmarks.md). `auto` stays off
 * where the model's head size is not one the kernel takes (`unsupported`).
 */
export function resolveRopeKernel(cfg: Pick<TrainAttentionConfig, 'attention' | 'rope_kernel'>, choice: TrainAttentionChoice, unsupported?: string): boolean {
  if (cfg.rope_kernel === 'auto' && unsupported) return false;
  const on = resolveWithKernels('--rope_kernel', cfg.rope_kernel, cfg.attention, choice, ropeKernelOption.default);
  if (on && unsupported) throw new Error(`--rope_kernel: the model's rotary embedding is not one the kernel takes: ${unsupported}; drop --rope_kernel`);
  return on;
}

/**
 * Whether each MLP's activation goes through Lathe's SwiGLU kernel instead of QuickGelu and Mul
 * ({@link resolveWithKernels}'s rule): it beat the attention, log-prob and RoPE kernels without it in a
 * same-call A/B of the full SFT step (docs/benchmarks.md), hence `auto` as the default.
 */
export function resolveSwigluKernel(cfg: Pick<TrainAttentionConfig, 'attention' | 'swiglu_kernel'>, choice: TrainAttentionChoice): boolean {
  return resolveWithKernels('--swiglu_kernel', cfg.swiglu_kernel, cfg.attention, choice, swigluKernelOption.default);
}

/**
 * Refuses `--attention kernels` where it cannot work, naming the flags, before anything is loaded:
 * packed rows (the kernels take right-padded rows, no segment mask), `--cuda_graph` (replaying the
 * kernels' custom op inside a captured step is not verified yet), float32 compute on cuda (the
 * kernels are bfloat16/float16 there).
 */
export function checkTrainAttention(cfg: TrainAttentionConfig): void {
  if (cfg.attention !== 'kernels') return;
  if (cfg.packing) throw new Error('--attention kernels with --packing is not supported: the kernels attend causally over whole right-padded rows and take no segment mask, so each packed example would attend to those before it; use --attention composed (or auto) with --packing');
  if (cfg.cuda_graph) throw new Error("--attention kernels with --cuda_graph is not supported yet: the kernels' custom op has not been verified inside a captured step; drop --cuda_graph or use --attention flash");
  if (cfg.device === 'cuda' && cfg.compute_dtype === 'float32') throw new Error('--attention kernels on --device cuda needs --compute_dtype bfloat16 (the kernels are bfloat16/float16 on the GPU; float32 only on the cpu, for tests)');
}

/** A run's attention once its device is open: what the loss and the Trainer take, and the ops' lifetime. */
export interface TrainAttention {
  /** The attention the run resolved to (`auto` when it stayed with ONNX Runtime's choice). */
  choice: TrainAttentionChoice;
  /** The loss attends as flash attention (right-padded rows; with symbolic shapes `total_sequence_length` fed). */
  flashAttention: boolean;
  /** Loss options beyond `flashAttention`: the kernel to attend through, with `kernels`; the fused log-prob, RoPE and SwiGLU kernels where {@link resolveLogprobKernel}, {@link resolveRopeKernel} and {@link resolveSwigluKernel} take them. */
  loss: Pick<DecoderLossOptions, 'attentionKernel' | 'logprobKernel' | 'ropeKernel' | 'swigluKernel'>;
  /** Trainer options: the kernels' custom-op domain in the step's sessions, with `kernels`. */
  trainer: { session?: { customOpDomains: Ptr[] } };
  /** Rethrows an error the kernels' compute raised in the last run (computes cannot throw into ONNX Runtime). */
  check(): void;
  /** Frees the custom-op domain: after every session that runs it. */
  dispose(): void;
}

/** The kernels compiled once per set of device kernels. */
const compiled = new WeakMap<Kernels, FlashAttention>();
const compiledCe = new WeakMap<Kernels, CrossEntropyKernels>();
const compiledRope = new WeakMap<Kernels, RopeKernels>();
const compiledSwiglu = new WeakMap<Kernels, SwigluKernels>();

/**
 * Opens a training run's device (GPU `id`; `kernels: false` keeps ONNX Runtime's own stream, see
 * openDevice) and its attention: with `kernels`, the GPU through Lathe's kernels and the
 * flash-attention kernels compiled (on the cpu their float32 host computation, for tests); the
 * model's heads checked against what the kernels take. `kernelsOnlyForAttention`: the GPU goes
 * through Lathe's kernels only when the attention is theirs, else ONNX Runtime's own stream (GRPO's
 * generation, whose captured decode steps are measured there).
 */
export function openTrainDevice(cfg: TrainAttentionConfig, config: DecoderConfig, opts: { id?: number; kernels?: boolean; dataParallel?: boolean; kernelsOnlyForAttention?: boolean } = {}): { device: Device; attention: TrainAttention } {
  checkTrainAttention(cfg);
  const id = opts.id ?? 0;
  const choice =
    cfg.attention === 'auto' && cfg.device === 'cuda'
      ? resolveTrainAttention(cfg, {
          unsupported: flashAttentionUnsupported({ batch: 1, seqLen: 1, numHeads: config.numHeads, numKvHeads: config.numKvHeads, headDim: config.headDim, dtype: cfg.compute_dtype }),
          kernelsAvailable: opts.kernels !== false && (Device.isOpen('cuda', id) ? kernelsOfDevice(id) !== undefined : probeKernels().ok),
          dataParallel: opts.dataParallel ?? false,
        })
      : cfg.attention;
  const logprobKernel = resolveLogprobKernel(cfg, choice);
  const ropeKernel = resolveRopeKernel(cfg, choice, ropeUnsupported({ rows: 1, heads: config.numHeads, half: config.headDim / 2, maxPositions: config.maxPositionEmbeddings, dtype: cfg.device === 'cpu' ? 'float32' : cfg.compute_dtype }));
  const swigluKernel = resolveSwigluKernel(cfg, choice);
  if (choice !== 'kernels') {
    const device = openDevice(cfg.device, id, opts.kernelsOnlyForAttention ? { kernels: false } : opts.kernels === undefined ? {} : { kernels: opts.kernels });
    const flashAttention = useFlashAttention(choice, cfg.device, cfg.compute_dtype, { packing: cfg.packing });
    return { device, attention: { choice, flashAttention, loss: {}, trainer: {}, check: () => {}, dispose: () => {} } };
  }
  let ops: FlashAttentionOps;
  let ce: CrossEntropyOps | undefined;
  let rope: RopeOps | undefined;
  let swiglu: SwigluOps | undefined;
  let device: Device;
  if (cfg.device === 'cpu') {
    device = Device.open('cpu');
    ops = flashAttentionOps('cpu');
    if (logprobKernel) ce = crossEntropyOps('cpu');
    if (ropeKernel) rope = ropeOps('cpu');
    if (swigluKernel) swiglu = swigluOps('cpu');
  } else {
    const unsupported = flashAttentionUnsupported({ batch: 1, seqLen: 1, numHeads: config.numHeads, numKvHeads: config.numKvHeads, headDim: config.headDim, dtype: cfg.compute_dtype });
    if (unsupported) throw new Error(`--attention kernels: the model's attention is not one the kernels take: ${unsupported}; use --attention flash`);
    if (!Device.isOpen('cuda', id)) {
      const probe = probeKernels();
      if (!probe.ok) throw new Error(`--attention kernels needs Lathe's CUDA kernels (NVRTC and the CUDA driver), which are not available: ${probe.reason}; use --attention flash`);
    }
    device = openDevice('cuda', id);
    const kernels = kernelsOfDevice(id);
    if (!kernels) throw new Error(`--attention kernels: cuda:${id} was opened in this process without Lathe's kernels (its sessions run on ONNX Runtime's own stream), so the kernels cannot join its steps; run the command in a fresh process`);
    let fa = compiled.get(kernels);
    if (!fa) compiled.set(kernels, (fa = FlashAttention.compile(kernels, { includeDir: cudaIncludeDir() })));
    ops = flashAttentionOps('cuda', fa);
    if (logprobKernel) {
      let k = compiledCe.get(kernels);
      if (!k) compiledCe.set(kernels, (k = CrossEntropyKernels.compile(kernels, { includeDir: cudaIncludeDir() })));
      ce = crossEntropyOps('cuda', k);
    }
    if (ropeKernel) {
      let k = compiledRope.get(kernels);
      if (!k) compiledRope.set(kernels, (k = RopeKernels.compile(kernels, { includeDir: cudaIncludeDir() })));
      rope = ropeOps('cuda', k);
    }
    if (swigluKernel) {
      let k = compiledSwiglu.get(kernels);
      if (!k) compiledSwiglu.set(kernels, (k = SwigluKernels.compile(kernels, { includeDir: cudaIncludeDir() })));
      swiglu = swigluOps('cuda', k);
    }
  }
  return {
    device,
    attention: {
      choice,
      flashAttention: true,
      loss: { attentionKernel: (x, heads) => ops.attend(x, heads, 'kernels'), ...(ce ? { logprobKernel: ce } : {}), ...(rope ? { ropeKernel: rope.rotate } : {}), ...(swiglu ? { swigluKernel: swiglu.apply } : {}) },
      trainer: { session: { customOpDomains: [ops.domain.handle, ...(ce ? [ce.domain.handle] : []), ...(rope ? [rope.domain.handle] : []), ...(swiglu ? [swiglu.domain.handle] : [])] } },
      check: () => {
        ops.check();
        ce?.check();
        rope?.check();
        swiglu?.check();
      },
      dispose: () => {
        ops.dispose();
        ce?.dispose();
        rope?.dispose();
        swiglu?.dispose();
      },
    },
  };
}
