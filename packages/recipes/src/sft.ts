/**
 * An SFT run, top to bottom: load the model, tokenizer and data → compile the train step and the
 * evaluation (greedy generation) graphs → loop over optimizer steps, logging metrics, evaluating and
 * checkpointing → a final evaluation and checkpoint. Resumes exactly from a checkpoint (weights,
 * AdamW moments, step, data position) and saves one when interrupted.
 */
import { basename, resolve } from 'node:path';
import * as L from '@lathe/onnx';
import { paramSpecs, TOTAL_LENGTH_INPUT, totalLengthTensor, weightInputs, type DecoderConfig } from '@lathe/models';
import { MathGrader } from '@lathe/graders';
import { addGeneration } from '@lathe/rollout';
import { sizeOf, type Device, type DeviceTensor, type HostTensor, type Session } from '@lathe/runtime';
import {
  castWeights,
  fullTrainableParams,
  initLora,
  LORA_DROPOUT_KEY,
  loraAdapters,
  loraBaseDtype,
  loraDropoutKey,
  loraFromOptions,
  loraWeights,
  mergeLora,
  sftLoss,
  Trainer,
  uploadLoraBase,
  type DecoderLossOptions,
  type LoraConfig,
  type TrainableParam,
} from '@lathe/train';
import { additionExamples, BUILTIN_DATA } from './demo-task';
import { openTrainDevice, checkTrainAttention } from './train-attention';
import { checkComputeDtype, EpochStream, loadRunModel, scheduledLr, splitHeldOut, stepTiming, stopRequested, type RunTokenizer, type TrainRunEvents, type TrainRunResult } from './scaffold';
import { SFT_RESUMABLE_KEYS, type SftConfig } from './sft-config';
import { stripThinking } from '@lathe/tokenizer';
import { runPaths } from '@lathe/data';
import { SftBenchmarkSampler, TrainBenchmarks, type TrainBenchmarkResult } from './train-eval';
import { runTrainedWeights } from './quantize-lora';
import type { TrainedWeights } from '@lathe/reward-models';
import { anyRankStopped, joinDataParallel, joinsCheckpoint, openRankRunDir } from './launch-dp';
import { serveTrainerWeights, servingTokenizerFolder, type TrainerServe, type TrainerWeights } from './serve-training';
import { evalPromptIds, lossTokenCount, packExamples, padBatch, padPackedBatch, readSftData, tokenizeExample, type PackedRow, type SftExample, type TokenizedExample } from './sft-data';

/** Metrics of one optimizer step (one line of metrics.jsonl). */
export interface StepMetrics {
  step: number;
  /** Mean next-token NLL over the batch's loss tokens. */
  loss: number;
  grad_norm: number;
  lr: number;
  /** Loss tokens and all tokens in the batch. */
  loss_tokens: number;
  tokens: number;
  tokens_per_s: number;
  /** Milliseconds spent preparing the batch on the host and inside ONNX Runtime runs. */
  host_ms: number;
  run_ms: number;
  /** With --packing: examples in the step's packed rows. */
  examples?: number;
  /** With --packing: padding tokens in the step's batch. */
  pad_tokens?: number;
  /** With --packing: padding tokens fewer than the same examples one per row, each row as wide as the longest of them. */
  padding_saved?: number;
}

/** A greedy-generation evaluation on the held-out examples. */
export interface EvalResult {
  step: number;
  /** Fraction of generated responses judged correct (exact match or the math grader). */
  accuracy: number;
  examples: number;
  /** Accuracy per `subject` of the examples that have one. */
  bySubject?: Record<string, { accuracy: number; examples: number }>;
}

/** Callbacks for progress display. */
export interface SftEvents extends TrainRunEvents<StepMetrics, EvalResult> {
  onStart?(info: {
    startStep: number;
    totalSteps: number;
    trainExamples: number;
    evalExamples: number;
    dropped: number;
    truncated: number;
    parameters: number;
    /** With --packing: the rows the training examples were packed into, and the share of their max_length tokens that are examples' tokens. */
    packed?: { rows: number; fill: number };
  }): void;
  /** A benchmark evaluation (`--eval_benchmarks`) finished. */
  onBenchmarks?(r: TrainBenchmarkResult): void;
  /** `--serve_port`: the policy is served at this base URL. */
  onServe?(url: string): void;
}

/** What a run returns: with `--eval_benchmarks`, also this invocation's benchmark evaluations. */
export type SftResult = TrainRunResult<EvalResult> & { benchmarks: TrainBenchmarkResult[] };

/** Training and evaluation examples: a seeded split with `eval_examples` held out. */
async function loadExamples(cfg: SftConfig): Promise<{ train: SftExample[]; evaluation: SftExample[] }> {
  if (cfg.data === BUILTIN_DATA && cfg.data_format === 'messages') throw new Error(`--data_format messages: ${BUILTIN_DATA} has prompt/response rows`);
  return splitHeldOut(cfg.data === BUILTIN_DATA ? additionExamples() : await readSftData(cfg.data, cfg.data_format), cfg, 'examples');
}

const f32 = (v: number): HostTensor => ({ data: Float32Array.from([v]), dims: [] });

/** An evaluation's summary from its per-example rows (as eval/step-N.jsonl holds them). */
function summarizeEval(step: number, rows: readonly { correct: boolean; subject?: string }[]): EvalResult {
  const share = (rs: readonly { correct: boolean }[]) => (rs.length ? rs.filter((r) => r.correct).length / rs.length : 0);
  const subjects = [...new Set(rows.flatMap((r) => (r.subject ? [r.subject] : [])))].sort();
  const result: EvalResult = { step, accuracy: share(rows), examples: rows.length };
  if (subjects.length) {
    result.bySubject = Object.fromEntries(
      subjects.map((sub) => {
        const rs = rows.filter((r) => r.subject === sub);
        return [sub, { accuracy: share(rs), examples: rs.length }];
      }),
    );
  }
  return result;
}

/**
 * Test hooks of {@link runSft}: not options of `lathe sft` (not in `sftSchema`, never saved with
 * a run). Production callers pass nothing.
 */
export interface SftTestHooks {
  /**
   * Run `--cuda_graph`'s padded static-shape path — the loss compiled for [batch_size, max_length],
   * every batch padded to exactly that, the batch copied into fixed device buffers each step — but
   * with the Trainer's `staticInputs` instead of `cudaGraph`, so it runs on any device, the CPU
   * included. Graph capture needs a GPU; this lets CPU tests check that the padding and the fixed
   * shape leave every loss and update unchanged. `cuda_graph` may stay false (its --device cuda
   * check is then skipped); --micro_batches must still be 1.
   */
  staticShapeWithoutCudaGraph?: boolean;
}

/** What an SFT run trains: every weight, or LoRA adapters over a frozen base fed as `base/<name>` inputs; and the loss graph over them. */
function trainedTensors(config: DecoderConfig, cfg: SftConfig, lora: LoraConfig | undefined, compile: { compute: 'float32' | 'bfloat16'; flashAttention: boolean; staticShape: boolean; attentionKernel?: DecoderLossOptions['attentionKernel']; logprobKernel?: DecoderLossOptions['logprobKernel']; ropeKernel?: DecoderLossOptions['ropeKernel']; swigluKernel?: DecoderLossOptions['swigluKernel'] }, qlora?: TrainedWeights) {
  const packing = cfg.packing ? { packing: true } : {};
  const specs = paramSpecs(config);
  const adapters = qlora ? qlora.adapters : lora ? loraAdapters(config, lora) : [];
  const params: TrainableParam[] = qlora
    ? qlora.params
    : lora
      ? adapters.flatMap((a) => [a.a, a.b])
      : fullTrainableParams(config);
  const shape: { shape?: [number, number] } = compile.staticShape ? { shape: [cfg.batch_size, cfg.max_length] } : {};
  const kernel = { ...(compile.attentionKernel ? { attentionKernel: compile.attentionKernel } : {}), ...(compile.logprobKernel ? { logprobKernel: compile.logprobKernel } : {}), ...(compile.ropeKernel ? { ropeKernel: compile.ropeKernel } : {}), ...(compile.swigluKernel ? { swigluKernel: compile.swigluKernel } : {}) };
  const loss = lora
    ? sftLoss(config, {
        weights: qlora
          ? qlora.weights
          : (g, trainable) => {
              const base = new Map(specs.map((s) => [s.name, g.input(`base/${s.name}`, loraBaseDtype(s.name, adapters, compile.compute), s.shape)]));
              return loraWeights((name) => base.get(name)!, trainable, adapters, lora, compile.compute, { training: true });
            },
        recompute: cfg.gradient_checkpointing,
        flashAttention: compile.flashAttention,
        ...kernel,
        ...shape,
        ...packing,
      })
    : sftLoss(config, { compute: compile.compute, recompute: cfg.gradient_checkpointing, flashAttention: compile.flashAttention, ...kernel, ...shape, ...packing });
  return { specs, adapters, params, loss };
}

/**
 * What packing saved in a step: its examples, the padding tokens of its micro-batches (`widths`,
 * `per` rows each), and how many fewer than the same examples one per row, padded to the longest.
 */
function packingMetrics(rows: readonly PackedRow[], widths: readonly number[], per: number, tokens: number): Pick<StepMetrics, 'examples' | 'pad_tokens' | 'padding_saved'> {
  const examples = rows.reduce((s, r) => s + r.examples, 0);
  const padTokens = widths.reduce((s, w) => s + w * per, 0) - tokens;
  const unpacked = examples * Math.max(...rows.map((r) => r.longest)) - tokens;
  return { examples, pad_tokens: padTokens, padding_saved: unpacked - padTokens };
}

/** One held-out example's evaluation row, as eval/step-N.jsonl holds it. */
interface EvalRow {
  prompt: string;
  expected: string;
  generated: string;
  correct: boolean;
  subject?: string;
  extracted?: string | null;
  reason?: string;
}

/**
 * `--serve_port`'s view of the trained tensors: the Trainer's parameters cast to the compute dtype
 * in the served graphs, or with LoRA the frozen base (`base/<name>`, as the loss reads it) plus
 * the adapters as a side branch of each projection (no dropout).
 */
function servedWeights(config: DecoderConfig, params: TrainableParam[], compute: L.DType, frozen: Record<string, DeviceTensor>, lora?: { config: LoraConfig; adapters: ReturnType<typeof loraAdapters> }): TrainerWeights {
  if (!lora) return { params, frozen, weights: (_g, trainable) => castWeights(trainable, compute) };
  const specs = paramSpecs(config);
  const weights = (g: L.Graph, trainable: Map<string, L.Tensor>) => {
    const base = new Map(specs.map((s) => [s.name, g.input(`base/${s.name}`, frozen[`base/${s.name}`].dtype, s.shape)] as const));
    return loraWeights((name) => base.get(name)!, trainable, lora.adapters, lora.config, compute);
  };
  return { params, frozen, weights };
}

/**
 * Greedy generation over the held-out examples, judged by exact match or the math grader: the
 * rows of one evaluation, with the model's float32 weights given per call.
 */
function greedyEvaluator(device: Device, config: DecoderConfig, tokenizer: RunTokenizer, cfg: SftConfig) {
  const gen = new L.Graph('sft_eval_generate');
  addGeneration(gen, config, weightInputs(gen, config, 'float32', 'float32').weights, { temperature: 0, padTokenId: tokenizer.padId });
  const session: Session = device.compile(gen);
  const grader = cfg.eval_grader === 'math' ? new MathGrader() : undefined;
  const evaluate = async (examples: readonly SftExample[], weights: Iterable<[string, HostTensor | DeviceTensor]>): Promise<EvalRow[]> => {
    const rows: EvalRow[] = [];
    const binding = session.binding();
    for (const [name, t] of weights) binding.input(name, t);
    for (const o of ['tokens', 'lengths', 'stopped']) binding.output(o, 'host');
    for (let start = 0; start < examples.length; start += 64) {
      const chunk = examples.slice(start, start + 64);
      const prompts = chunk.map((e) => evalPromptIds(tokenizer, e));
      const P = Math.max(...prompts.map((p) => p.length));
      const ids = prompts.flatMap((p) => [...new Array(P - p.length).fill(tokenizer.padId), ...p]);
      const mask = prompts.flatMap((p) => [...new Array(P - p.length).fill(0), ...p.map(() => 1)]);
      binding
        .input('input_ids', { data: BigInt64Array.from(ids.map(BigInt)), dims: [chunk.length, P] })
        .input('attention_mask', { data: BigInt64Array.from(mask.map(BigInt)), dims: [chunk.length, P] })
        .input('max_new_tokens', { data: BigInt64Array.from([BigInt(cfg.max_new_tokens)]), dims: [] })
        .input('stop_ids', { data: BigInt64Array.from([BigInt(tokenizer.eosId)]), dims: [1] });
      await binding.run();
      const out = { tokens: binding.fetch('tokens'), lengths: binding.fetch('lengths'), stopped: binding.fetch('stopped') };
      const N = out.tokens.dims[1];
      for (let r = 0; r < chunk.length; r++) {
        const e = chunk[r];
        const len = Number(out.lengths.data[r]);
        const stopped = Boolean(out.stopped.data[r]);
        const toks = Array.from(out.tokens.data.slice(r * N, r * N + len - (stopped ? 1 : 0)) as BigInt64Array, Number);
        const generated = tokenizer.decode(toks);
        const row = { prompt: e.prompt, expected: e.response, generated, ...(e.subject ? { subject: e.subject } : {}) };
        // a conversation's turn is judged by its answer, after any thinking block (as its template renders it)
        const [answer, expected] = e.messages ? [stripThinking(generated), stripThinking(e.response)] : [generated, e.response];
        if (grader) {
          const v = await grader.grade(answer, expected);
          rows.push({ ...row, correct: v.correct, extracted: v.extracted, reason: v.reason });
        } else rows.push({ ...row, correct: answer.trim() === expected.trim() });
      }
    }
    binding.dispose();
    return rows;
  };
  return {
    evaluate,
    dispose: async () => {
      session.dispose();
      await grader?.close();
    },
  };
}

/**
 * Runs SFT as configured. `signal` interrupts the run after the current step, with a checkpoint.
 * `testHooks` are for tests only (see {@link SftTestHooks}).
 */
export async function runSft(cfg: SftConfig, events: SftEvents = {}, signal?: AbortSignal, testHooks: SftTestHooks = {}): Promise<SftResult> {
  checkComputeDtype(cfg);
  const compute = cfg.compute_dtype;
  if (cfg.batch_size % cfg.micro_batches !== 0) throw new Error(`--batch_size ${cfg.batch_size} is not divisible by --micro_batches ${cfg.micro_batches}`);
  // --cuda_graph: one fixed batch shape [batch_size, max_length], captured once and replayed.
  const cudaGraph = cfg.cuda_graph && !testHooks.staticShapeWithoutCudaGraph;
  const staticShape = cfg.cuda_graph || Boolean(testHooks.staticShapeWithoutCudaGraph);
  if (cudaGraph && cfg.device !== 'cuda') throw new Error(`--cuda_graph needs --device cuda (got --device ${cfg.device})`);
  if (staticShape && cfg.micro_batches !== 1) throw new Error(`--cuda_graph needs --micro_batches 1 (got ${cfg.micro_batches})`);
  // Packed rows need a mask per example, which only composed attention takes ('auto' picks it).
  if (cfg.serve_port > 0 && cfg.quantize_base !== 'none') throw new Error(`--serve_port with --quantize_base ${cfg.quantize_base} is not supported: the server reads the trainer's float32 base, and a quantized one is read through its dequantization in the loss only; serve with plain LoRA, or serve the checkpoints (lathe serve)`);
  if (cfg.packing && cfg.attention === 'flash') {
    throw new Error("--packing with --attention flash is not supported: GroupQueryAttention takes no segment mask, so each packed example would attend to those before it in its row; use --attention composed (or auto, which picks composed with --packing)");
  }
  checkTrainAttention(cfg);
  // Under lathe launch (or torchrun's or Slurm's variables): this rank's place in a data-parallel
  // job, which takes its share of each global batch; rank 0 alone writes the run directory.
  const dp = await joinDataParallel({ device: cfg.device, config: cfg, batch: { rows: cfg.batch_size, microBatches: cfg.micro_batches }, zeroStage: cfg.zero_stage, gradReduceDtype: cfg.grad_reduce_dtype, gradOverlap: cfg.grad_overlap, gradBucketMb: cfg.grad_bucket_mb });
  if (dp && staticShape) throw new Error('--cuda_graph runs the train step as one captured run, which leaves no place for the gradient all-reduce of a data-parallel job (lathe launch): drop --cuda_graph');
  const run = await openRankRunDir(cfg, dp);
  // the built-in model is written into this rank's own run directory (rank 0's may not hold it yet)
  const { config, lm, tokenizer, tokenizerFrom } = await loadRunModel({ ...cfg, run_dir: run.dir });
  if (cfg.serve_port > 0) servingTokenizerFolder(tokenizerFrom);
  const { train, evaluation: heldOut } = await loadExamples(cfg);
  // evaluations run on rank 0 only (the other ranks wait for it at their next all-reduce)
  const evaluation = dp && !dp.main ? [] : heldOut;
  // loaded before anything is compiled: a bad --eval_benchmarks fails at once
  const benchmarks = dp && !dp.main ? undefined : await TrainBenchmarks.load(cfg);
  if (!tokenizer.chat && train.some((e) => e.messages)) throw new Error(`--data ${cfg.data}: conversational rows are rendered with a chat template, and the tokenizer of --model ${cfg.model} has none`);
  const tokenized = train.map((e) => tokenizeExample(tokenizer, e, { assistantOnly: cfg.assistant_only_loss }));
  const overlong = tokenized.filter((t) => t.ids.length > cfg.max_length).length;
  const kept =
    cfg.overlong === 'truncate'
      ? tokenized.filter((t) => t.promptLength < cfg.max_length).map((t) => ({ ...t, ids: t.ids.slice(0, cfg.max_length), lossMask: t.lossMask.slice(0, cfg.max_length) }))
      : tokenized.filter((t) => t.ids.length <= cfg.max_length);
  if (kept.length === 0) throw new Error(`--max_length ${cfg.max_length}: every training example is longer (--overlong ${cfg.overlong})`);

  // Flash attention needs right-padded rows, which padBatch makes, and each batch's width T (fed
  // as total_sequence_length, or with a static shape a constant in the graph).
  // The trainer holds parameters and AdamW state on the device (opened through the kernels with --attention kernels).
  const { device, attention } = openTrainDevice(cfg, config, { id: dp?.deviceId ?? 0, kernels: !cudaGraph });
  const { flashAttention } = attention;
  const lora = loraFromOptions(cfg);
  // State: fresh from the model folder, or from the latest checkpoint.
  const base = lm.float32Weights();
  // QLoRA (--quantize_base): the adapters over the base quantized in memory, merged into its dequantized weights
  const qlora = cfg.quantize_base !== 'none' ? runTrainedWeights(config, base, { lora, compute, seed: cfg.seed, quantize_base: cfg.quantize_base, device: cfg.device }) : undefined;
  const { specs, adapters, params, loss } = trainedTensors(config, cfg, lora, { compute, flashAttention, staticShape, ...attention.loss }, qlora);
  const mergeInto = (values: Map<string, Float32Array>) => (qlora ? qlora.merged(values) : mergeLora(base, values, adapters, lora!));
  const start = run.startFrom(params, cfg, SFT_RESUMABLE_KEYS, lora ? initLora(adapters, cfg.seed) : base);
  let { state } = start;
  const { init } = start;

  // a LoRA base is bound once, read-only
  const frozenBase = qlora ? qlora.frozenOn(device) : lora ? Object.fromEntries(specs.map((s) => [`base/${s.name}`, uploadLoraBase(device, s.name, { data: base.get(s.name)!, dims: s.shape }, adapters, compute)])) : {};
  const trainer = Trainer.create(
    { params, loss, optimizer: { weightDecay: cfg.weight_decay, maxGradNorm: cfg.max_grad_norm } },
    { ...init, step: state.step },
    { device, microBatches: cfg.micro_batches, frozen: frozenBase, ...attention.trainer, ...(cudaGraph ? { cudaGraph: true } : staticShape ? { staticInputs: true } : {}), ...(dp ? dp.trainerOptionsFor(device) : {}) },
  );
  const dropoutKeyed = trainer.batchInputs.includes(LORA_DROPOUT_KEY);
  // Everything below holds device memory: released however the run ends (a non-finite loss
  // throws after its checkpoint; a caller may go on to the next run in the same process).
  let evaluator: ReturnType<typeof greedyEvaluator> | undefined;
  let benchSampler: SftBenchmarkSampler | undefined;
  let serving: TrainerServe | undefined;
  try {
    // --serve_port (rank 0 of a data-parallel job: every rank holds the same weights)
    if (cfg.serve_port > 0 && (!dp || dp.main)) {
      const eos = config.eosTokenId;
      serving = await serveTrainerWeights(trainer, servedWeights(config, params, compute, frozenBase, lora ? { config: lora, adapters } : undefined), {
        host: cfg.serve_host,
        port: cfg.serve_port,
        id: basename(resolve(cfg.run_dir)),
        tokenizerFrom,
        device,
        config,
        dtype: compute,
        stopIds: [...new Set([tokenizer.eosId, ...(eos === undefined ? [] : Array.isArray(eos) ? eos : [eos])])],
        rows: cfg.serve_max_rows,
        maxModelLen: Math.min(config.maxPositionEmbeddings, 4096),
      });
      events.onServe?.(serving.url);
    }
    evaluator = greedyEvaluator(device, config, tokenizer, cfg);
    const greedy = evaluator;
    run.saveConfig(cfg);

    // Greedy generation reads float32 weights: the trainer's own buffers in full fine-tuning (no
    // copy), the base with the adapters merged in with LoRA.
    const evaluate = async (): Promise<EvalResult> => {
      const merged = lora ? mergeInto(trainer.downloadParams()) : undefined;
      const weights = merged ? specs.map((s): [string, HostTensor] => [s.name, { data: merged.get(s.name)!, dims: s.shape }]) : trainer.params();
      const rows = await greedy.evaluate(evaluation, weights);
      run.writeEval(state.step, rows);
      const result = summarizeEval(state.step, rows);
      events.onEval?.(result);
      return result;
    };
    // --eval_benchmarks: sampled from the same float32 weights, on noise streams of their own
    const benchResults: TrainBenchmarkResult[] = [];
    if (benchmarks) benchSampler = SftBenchmarkSampler.create(device, config, tokenizer, { temperature: cfg.eval_temperature, topP: cfg.eval_top_p, seed: cfg.seed, maxNewTokens: cfg.max_new_tokens, compute });
    const benchmarkEval = async (): Promise<void> => {
      if (!benchmarks || !benchSampler) return;
      const merged = lora ? mergeInto(trainer.downloadParams()) : undefined;
      const uploaded = merged ? specs.map((s) => [s.name, device.upload({ data: merged.get(s.name)!, dims: s.shape })] as const) : undefined;
      try {
        const r = await benchmarks.run(state.step, benchSampler.sampler(uploaded ?? trainer.params()), runPaths(cfg.run_dir).eval);
        run.metrics.log({ step: state.step, ...r.entries });
        benchResults.push(r);
        events.onBenchmarks?.(r);
      } finally {
        uploaded?.forEach(([, t]) => t.dispose());
      }
    };
    const checkpoint = async () => {
      // rank 0 saves the state; with ZeRO-1 every rank gives it its moment shards
      if (!joinsCheckpoint(dp)) return run.dir;
      const snap = await trainer.snapshotAsync();
      if (dp && !dp.main) return run.dir;
      const model = lora ? mergeInto(snap.params) : snap.params;
      return run.checkpoint({ config, model, trainable: params, values: snap.params, m: snap.m, v: snap.v, state, lora: Boolean(lora) }, { keepLast: cfg.keep_last, tokenizerFrom, onCheckpoint: (dir, step) => events.onCheckpoint?.(dir, step) });
    };

    // With --packing the stream's items are packed rows (made once, as TRL packs its dataset), else examples.
    const packed = cfg.packing ? packExamples(kept, cfg.max_length) : undefined;
    const fill = packed ? kept.reduce((s, e) => s + e.ids.length, 0) / (packed.length * cfg.max_length) : 0;
    events.onStart?.({
      startStep: state.step,
      totalSteps: cfg.steps,
      trainExamples: kept.length,
      evalExamples: evaluation.length,
      dropped: tokenized.length - kept.length,
      truncated: cfg.overlong === 'truncate' ? overlong - (tokenized.length - kept.length) : 0,
      parameters: params.reduce((s, p) => s + sizeOf(p.shape), 0),
      ...(packed ? { packed: { rows: packed.length, fill } } : {}),
    });
    /** A NaN/inf loss: keep the last good state in a checkpoint and stop with a message. */
    const nonFinite = async (loss: number, batchStart: number): Promise<never> => {
      const dir = await checkpoint();
      throw new Error(
        `step ${state.step + 1}: the loss is ${loss} on the batch of ${packed ? 'packed rows' : 'training examples'} ${batchStart}..${batchStart + cfg.batch_size - 1} (stream positions); ` +
          `the weights before this step are saved in ${dir}. Lower --lr or check the data.`,
      );
    };
    const stream = new EpochStream<TokenizedExample | PackedRow>(packed ?? kept, cfg.seed, state.dataPosition);
    // a resumed run's evaluations start with those before its checkpoint (acc_before_sft is the step-0 one)
    const evals: EvalResult[] = run.latest ? run.readEvals<EvalRow>(state.step).map((e) => summarizeEval(e.step, e.rows)) : [];
    let lastLoss = NaN;
    let interrupted = false;
    if (state.step === 0 && evaluation.length > 0) evals.push(await evaluate());
    if (state.step === 0) await benchmarkEval();

    while (state.step < cfg.steps) {
      const t0 = performance.now();
      const batchStart = stream.position;
      const batch = stream.take(cfg.batch_size); // always batch_size examples (or packed rows): the stream is endless
      const lossTokens = lossTokenCount(batch);
      const lr = scheduledLr(cfg, state.step);
      const lossTokensInput = f32(Math.max(1, lossTokens));
      // every rank reads the same global batch (so the loss-token count above is global) and trains on its share
      const mine = dp ? dp.shard(batch) : batch;
      const per = mine.length / cfg.micro_batches;
      const widths: number[] = [];
      const micro = Array.from({ length: cfg.micro_batches }, (_, k) => {
        // A static shape pads every row to max_length (kept examples are at most that long).
        const rows = mine.slice(k * per, (k + 1) * per);
        const width = staticShape ? cfg.max_length : undefined;
        const tensors = packed ? padPackedBatch(rows as PackedRow[], tokenizer.padId, width) : padBatch(rows as TokenizedExample[], tokenizer.padId, width);
        widths.push(tensors.input_ids.dims[1]);
        return {
          ...tensors,
          loss_tokens: lossTokensInput,
          ...(flashAttention && !staticShape ? { [TOTAL_LENGTH_INPUT]: totalLengthTensor(widths[k]) } : {}),
          // LoRA dropout's masks: a function of (seed, optimizer step, micro-batch), so a resume redraws them
          ...(dropoutKeyed ? { [LORA_DROPOUT_KEY]: loraDropoutKey(cfg.seed, trainer.step, (dp?.world.rank ?? 0) * cfg.micro_batches + k) } : {}),
        };
      });
      const hostMs0 = performance.now() - t0;
      // with --serve_port, no request runs while the step rewrites the weights
      const result = serving ? await serving.update(() => trainer.trainStepAsync(micro, lr)) : await trainer.trainStepAsync(micro, lr);
      attention.check();
      const loss = result.loss;
      if (!Number.isFinite(loss)) await nonFinite(loss, batchStart);
      state = { ...state, step: state.step + 1, dataPosition: stream.position };
      lastLoss = loss;
      const tokens = batch.reduce((s, e) => s + e.ids.length, 0);
      const metrics: StepMetrics = {
        step: state.step,
        loss,
        loss_tokens: lossTokens,
        ...stepTiming(result, { lr, tokens, prepMs: hostMs0 }),
        ...(packed ? packingMetrics(mine as PackedRow[], widths, per, mine.reduce((s, e) => s + e.ids.length, 0)) : {}),
      };
      events.onStep?.(metrics);
      // on the log_every schedule only, so a resumed run's metrics.jsonl equals an uninterrupted run's
      if (state.step % cfg.log_every === 0 || state.step === cfg.steps) run.metrics.log({ ...metrics });
      if (cfg.eval_every > 0 && state.step % cfg.eval_every === 0 && state.step < cfg.steps && evaluation.length > 0) evals.push(await evaluate());
      if (cfg.eval_every > 0 && state.step % cfg.eval_every === 0 && state.step < cfg.steps) await benchmarkEval();
      if (cfg.save_every > 0 && state.step % cfg.save_every === 0 && state.step < cfg.steps) await checkpoint();
      if (await anyRankStopped(dp, await stopRequested(signal))) {
        interrupted = true;
        break;
      }
    }
    if (!interrupted && evaluation.length > 0 && evals.at(-1)?.step !== state.step) evals.push(await evaluate());
    if (!interrupted && benchResults.at(-1)?.step !== state.step) await benchmarkEval();
    const last = run.savedAt(state.step) ?? (await checkpoint());
    return { steps: state.step, finalLoss: lastLoss, evals, checkpoint: last, interrupted, benchmarks: benchResults };
  } catch (e) {
    // the other ranks would wait for this one at their next all-reduce: they stop now, told why
    dp?.abort((e as Error).message);
    throw e;
  } finally {
    await serving?.close();
    await evaluator?.dispose();
    benchSampler?.dispose();
    trainer.dispose();
    attention.dispose();
    for (const t of Object.values(frozenBase)) t.dispose();
    await run.close();
    await dp?.close();
  }
}
