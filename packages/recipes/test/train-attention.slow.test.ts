/**
 * `--attention kernels` in lathe sft, rm train and dpo on the cpu, where the kernels' custom ops
 * compute attention on the host in float32: three steps give the losses and gradient norms of
 * composed attention (MatMul/Softmax, an independent path); combinations that cannot work are
 * refused naming the flags.
 */
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { defaults, dpoSchema, openTrainDevice, resolveConfig, resolveLogprobKernel, resolveRopeKernel, resolveSwigluKernel, resolveTrainAttention, rmTrainSchema, runDpo, runRmTrain, runSft, sftSchema, type DpoRunConfig, type RmTrainConfig, type SftConfig } from '@lathe/recipes';
import { writeAdditionTask } from './preference-task';

const root = mkdtempSync(join(tmpdir(), 'lathe-train-attention-'));
const task = writeAdditionTask(root);
const sftConfig = (over: Partial<SftConfig> = {}): SftConfig => ({ ...defaults(sftSchema), run_dir: mkdtempSync(join(root, 'sft-')), steps: 3, batch_size: 8, eval_examples: 0, eval_every: 0, save_every: 0, warmup_steps: 0, lr: 3e-3, ...over });
const pairRun = { data: task.pairs, steps: 3, batch_size: 8, eval_examples: 0, eval_every: 0, save_every: 0, log_every: 1, lr: 1e-3 };
const rmConfig = (over: Partial<RmTrainConfig> = {}): RmTrainConfig => ({ ...defaults(rmTrainSchema), ...pairRun, run_dir: mkdtempSync(join(root, 'rm-')), ...over });
const dpoConfig = (over: Partial<DpoRunConfig> = {}): DpoRunConfig => ({ ...defaults(dpoSchema), ...pairRun, run_dir: mkdtempSync(join(root, 'dpo-')), ...over });

type StepLog = { loss: number; grad_norm: number };

/** Each step's loss and gradient norm, as a run reports them. */
async function stepsOf(run: (events: { onStep(m: StepLog): void }) => Promise<unknown>): Promise<StepLog[]> {
  const out: StepLog[] = [];
  await run({ onStep: (m) => out.push({ loss: m.loss, grad_norm: m.grad_norm }) });
  return out;
}

/** Same number of steps, every loss and gradient norm within `rel` of the reference's. */
function expectClose(got: StepLog[], want: StepLog[], rel: number) {
  expect(got).toHaveLength(want.length);
  got.forEach((g, i) => {
    expect(Math.abs(g.loss - want[i].loss)).toBeLessThanOrEqual(rel * Math.abs(want[i].loss));
    expect(Math.abs(g.grad_norm - want[i].grad_norm)).toBeLessThanOrEqual(rel * want[i].grad_norm);
  });
}

test('lathe sft --attention kernels: 3 steps with the losses and gradient norms of composed attention (cpu, float32)', async () => {
  const composed = await stepsOf((e) => runSft(sftConfig({ attention: 'composed' }), e));
  const kernels = await stepsOf((e) => runSft(sftConfig({ attention: 'kernels', logprob_kernel: false, rope_kernel: false }), e));
  expect(composed).toHaveLength(3);
  // the steps train: the loss moves, so equal losses are not three copies of the initial one
  expect(composed[2].loss).not.toBe(composed[0].loss);
  expectClose(kernels, composed, 1e-4);
}, 60_000);

test('lathe rm train and lathe dpo --attention kernels: 3 steps with the losses and gradient norms of composed attention (cpu, float32)', async () => {
  const rmComposed = await stepsOf((e) => runRmTrain(rmConfig({ attention: 'composed' }), e));
  const rmKernels = await stepsOf((e) => runRmTrain(rmConfig({ attention: 'kernels' }), e));
  expect(rmComposed).toHaveLength(3);
  expect(rmComposed[2].loss).not.toBe(rmComposed[0].loss);
  expectClose(rmKernels, rmComposed, 1e-4);
  // IPO's squared loss: the sigmoid loss's softplus has a zero subgradient at exactly z = 0, where
  // DPO starts (policy = reference), so its first step depends on rounding that differs by path.
  const dpoComposed = await stepsOf((e) => runDpo(dpoConfig({ attention: 'composed', loss_type: 'ipo' }), e));
  const dpoKernels = await stepsOf((e) => runDpo(dpoConfig({ attention: 'kernels', loss_type: 'ipo' }), e));
  expect(dpoComposed).toHaveLength(3);
  expect(dpoComposed[2].loss).not.toBe(dpoComposed[0].loss);
  expectClose(dpoKernels, dpoComposed, 1e-4);
}, 60_000);

test('--attention kernels is refused, naming the flags, with --packing, --cuda_graph and float32 compute on cuda (before any device is opened)', async () => {
  await expect(runSft(sftConfig({ attention: 'kernels', packing: true }))).rejects.toThrow(/--attention kernels with --packing is not supported/);
  await expect(runSft(sftConfig({ attention: 'kernels', device: 'cuda', compute_dtype: 'bfloat16', cuda_graph: true }))).rejects.toThrow(/--attention kernels with --cuda_graph is not supported/);
  await expect(runSft(sftConfig({ attention: 'kernels', device: 'cuda', compute_dtype: 'float32' }))).rejects.toThrow(/--attention kernels on --device cuda needs --compute_dtype bfloat16/);
  await expect(runRmTrain(rmConfig({ attention: 'kernels', device: 'cuda', compute_dtype: 'float32' }))).rejects.toThrow(/--attention kernels on --device cuda needs --compute_dtype bfloat16/);
  await expect(runDpo(dpoConfig({ attention: 'kernels', device: 'cuda', compute_dtype: 'float32' }))).rejects.toThrow(/--attention kernels on --device cuda needs --compute_dtype bfloat16/);
});

test("--attention auto resolves to Lathe's kernels only on cuda with half-precision compute, where nothing rules them out", () => {
  const cuda = { device: 'cuda', compute_dtype: 'bfloat16', attention: 'auto' } as const;
  const facts = { kernelsAvailable: true, dataParallel: false };
  expect(resolveTrainAttention(cuda, facts)).toBe('kernels');
  // each condition alone keeps ONNX Runtime's choice ('auto': flash on cuda, composed on the cpu or with packing)
  expect(resolveTrainAttention({ ...cuda, device: 'cpu' }, facts)).toBe('auto');
  expect(resolveTrainAttention({ ...cuda, compute_dtype: 'float32' }, facts)).toBe('auto');
  expect(resolveTrainAttention({ ...cuda, packing: true }, facts)).toBe('auto');
  expect(resolveTrainAttention({ ...cuda, cuda_graph: true }, facts)).toBe('auto');
  expect(resolveTrainAttention({ ...cuda, quantize_base: 'nf4' }, facts)).toBe('auto');
  expect(resolveTrainAttention({ ...cuda, quantize_base: 'none' }, facts)).toBe('kernels');
  expect(resolveTrainAttention(cuda, { ...facts, kernelsAvailable: false })).toBe('auto');
  expect(resolveTrainAttention(cuda, { ...facts, dataParallel: true })).toBe('auto');
  expect(resolveTrainAttention(cuda, { ...facts, unsupported: 'head size 96' })).toBe('auto');
  // an explicit choice is kept as given
  for (const attention of ['composed', 'flash', 'kernels'] as const) expect(resolveTrainAttention({ ...cuda, attention }, { ...facts, kernelsAvailable: false })).toBe(attention);
});

test("--logprob_kernel auto (the default) takes the fused log-prob kernel exactly when the attention resolved to the kernels; true refuses any other attention; false is off", () => {
  expect(defaults(sftSchema).logprob_kernel).toBe('auto');
  expect(resolveLogprobKernel({ attention: 'auto', logprob_kernel: 'auto' }, 'kernels')).toBe(true);
  expect(resolveLogprobKernel({ attention: 'kernels', logprob_kernel: 'auto' }, 'kernels')).toBe(true);
  for (const choice of ['auto', 'flash', 'composed'] as const) {
    expect(resolveLogprobKernel({ attention: 'auto', logprob_kernel: 'auto' }, choice)).toBe(false);
    expect(resolveLogprobKernel({ attention: choice, logprob_kernel: false }, choice)).toBe(false);
    // dpo and rm train have no --logprob_kernel: absent is off
    expect(resolveLogprobKernel({ attention: choice }, choice)).toBe(false);
  }
  expect(resolveLogprobKernel({ attention: 'kernels', logprob_kernel: false }, 'kernels')).toBe(false);
  expect(resolveLogprobKernel({ attention: 'kernels', logprob_kernel: true }, 'kernels')).toBe(true);
  expect(resolveLogprobKernel({ attention: 'auto' }, 'kernels')).toBe(false);
  expect(() => resolveLogprobKernel({ attention: 'flash', logprob_kernel: true }, 'flash')).toThrow(/--logprob_kernel needs the attention kernels.*'flash'/);
  expect(() => resolveLogprobKernel({ attention: 'auto', logprob_kernel: true }, 'auto')).toThrow(/'auto', which did not pick them/);
  // a config file or flag gives true, false or auto; nothing else
  const given = (v: unknown) => resolveConfig(sftSchema, [{ name: 'sft.yaml', values: { logprob_kernel: v } }]).logprob_kernel;
  expect([given(true), given(false), given('auto')]).toEqual([true, false, 'auto']);
  expect(() => given('yes')).toThrow(/sft.yaml: option 'logprob_kernel' must be true or false or 'auto', got "yes"/);
});

test("lathe sft --logprob_kernel: the LM head's log-probs through the fused cross-entropy ops give composed attention's losses (cpu, float32), by default with --attention kernels; refused without the attention kernels", async () => {
  const composed = await stepsOf((e) => runSft(sftConfig({ attention: 'composed' }), e));
  const fused = await stepsOf((e) => runSft(sftConfig({ attention: 'kernels', logprob_kernel: true, rope_kernel: false }), e));
  expectClose(fused, composed, 1e-4);
  expectClose(await stepsOf((e) => runSft(sftConfig({ attention: 'kernels', rope_kernel: false }), e)), fused, 0);
  await expect(runSft(sftConfig({ attention: 'composed', logprob_kernel: true }))).rejects.toThrow(/--logprob_kernel needs the attention kernels.*'composed'/);
  await expect(runSft(sftConfig({ logprob_kernel: true }))).rejects.toThrow(/--logprob_kernel needs the attention kernels.*'auto', which did not pick them/);
}, 60_000);

test('lathe sft --attention kernels with --gradient_checkpointing and --micro_batches 2: composed attention\'s losses (cpu, float32)', async () => {
  const over = { gradient_checkpointing: true, micro_batches: 2 };
  const composed = await stepsOf((e) => runSft(sftConfig({ attention: 'composed', ...over }), e));
  const kernels = await stepsOf((e) => runSft(sftConfig({ attention: 'kernels', ...over }), e));
  expect(composed[2].loss).not.toBe(composed[0].loss);
  expectClose(kernels, composed, 1e-4);
}, 60_000);

test("--rope_kernel auto (the default) takes the RoPE kernel exactly when the attention resolved to the kernels and the model's heads fit it; true refuses otherwise; false is off", () => {
  expect(defaults(sftSchema).rope_kernel).toBe('auto');
  expect(resolveRopeKernel({ attention: 'auto', rope_kernel: 'auto' }, 'kernels')).toBe(true);
  expect(resolveRopeKernel({ attention: 'auto', rope_kernel: 'auto' }, 'kernels', 'headDim 6')).toBe(false);
  expect(() => resolveRopeKernel({ attention: 'kernels', rope_kernel: true }, 'kernels', 'headDim 6')).toThrow(/--rope_kernel: the model's rotary embedding is not one the kernel takes: headDim 6/);
  for (const choice of ['auto', 'flash', 'composed'] as const) {
    expect(resolveRopeKernel({ attention: 'auto', rope_kernel: 'auto' }, choice)).toBe(false);
    // rm train and dpo have no --rope_kernel: absent is off
    expect(resolveRopeKernel({ attention: choice }, choice)).toBe(false);
  }
  expect(resolveRopeKernel({ attention: 'kernels', rope_kernel: false }, 'kernels')).toBe(false);
  expect(() => resolveRopeKernel({ attention: 'flash', rope_kernel: true }, 'flash')).toThrow(/--rope_kernel needs the attention kernels.*'flash'/);
  // the resolved kernel reaches the loss and the sessions: its op and its custom-op domain beside the attention's
  const config = { vocabSize: 64, hiddenSize: 32, intermediateSize: 48, numLayers: 1, numHeads: 4, numKvHeads: 2, headDim: 8, rmsNormEps: 1e-6, ropeTheta: 1e4, maxPositionEmbeddings: 64, tieWordEmbeddings: true } as unknown as Parameters<typeof openTrainDevice>[1];
  const opened = (rope_kernel: boolean | 'auto') => openTrainDevice({ device: 'cpu', compute_dtype: 'float32', attention: 'kernels', logprob_kernel: false, rope_kernel }, config).attention;
  const on = opened('auto');
  expect(on.loss.ropeKernel).toBeDefined();
  expect(on.trainer.session?.customOpDomains).toHaveLength(2);
  on.dispose();
  const off = opened(false);
  expect(off.loss.ropeKernel).toBeUndefined();
  expect(off.trainer.session?.customOpDomains).toHaveLength(1);
  off.dispose();
});

test("lathe sft --rope_kernel: queries and keys rotated by the RoPE ops give composed attention's losses (cpu, float32), by default with --attention kernels; refused without the attention kernels", async () => {
  const composed = await stepsOf((e) => runSft(sftConfig({ attention: 'composed' }), e));
  const rope = await stepsOf((e) => runSft(sftConfig({ attention: 'kernels', logprob_kernel: false, rope_kernel: true }), e));
  expect(composed[2].loss).not.toBe(composed[0].loss);
  expectClose(rope, composed, 1e-4);
  // the defaults (auto) with the kernels: the log-prob, RoPE and SwiGLU kernels
  expectClose(await stepsOf((e) => runSft(sftConfig({ attention: 'kernels' }), e)), await stepsOf((e) => runSft(sftConfig({ attention: 'kernels', logprob_kernel: true, rope_kernel: true, swiglu_kernel: true }), e)), 0);
  await expect(runSft(sftConfig({ attention: 'composed', rope_kernel: true }))).rejects.toThrow(/--rope_kernel needs the attention kernels.*'composed'/);
}, 90_000);

test('--swiglu_kernel auto (the default) takes the SwiGLU kernel exactly when the attention resolved to the kernels; true refuses any other attention, naming the flags; false is off', () => {
  expect(defaults(sftSchema).swiglu_kernel).toBe('auto');
  expect(resolveSwigluKernel({ attention: 'auto', swiglu_kernel: 'auto' }, 'kernels')).toBe(true);
  for (const choice of ['flash', 'composed'] as const) expect(resolveSwigluKernel({ attention: 'auto', swiglu_kernel: 'auto' }, choice)).toBe(false);
  expect(resolveSwigluKernel({ attention: 'kernels', swiglu_kernel: true }, 'kernels')).toBe(true);
  expect(resolveSwigluKernel({ attention: 'kernels', swiglu_kernel: false }, 'kernels')).toBe(false);
  // rm train, dpo and grpo have no --swiglu_kernel: absent is off
  expect(resolveSwigluKernel({ attention: 'kernels' }, 'kernels')).toBe(false);
  for (const choice of ['auto', 'flash', 'composed'] as const) expect(() => resolveSwigluKernel({ attention: choice, swiglu_kernel: true }, choice)).toThrow(/--swiglu_kernel needs the attention kernels.*use --attention kernels, or drop --swiglu_kernel \(its default, auto/);
  // the resolved kernel reaches the loss and the sessions: its op and its custom-op domain beside the attention's
  const config = { vocabSize: 64, hiddenSize: 32, intermediateSize: 48, numLayers: 1, numHeads: 4, numKvHeads: 2, headDim: 8, rmsNormEps: 1e-6, ropeTheta: 1e4, maxPositionEmbeddings: 64, tieWordEmbeddings: true } as unknown as Parameters<typeof openTrainDevice>[1];
  const opened = (swiglu_kernel: boolean) => openTrainDevice({ device: 'cpu', compute_dtype: 'float32', attention: 'kernels', logprob_kernel: false, rope_kernel: false, swiglu_kernel }, config).attention;
  const on = opened(true);
  expect(on.loss.swigluKernel).toBeDefined();
  expect(on.trainer.session?.customOpDomains).toHaveLength(2);
  on.dispose();
  const off = opened(false);
  expect(off.loss.swigluKernel).toBeUndefined();
  expect(off.trainer.session?.customOpDomains).toHaveLength(1);
  off.dispose();
});

test("lathe sft --swiglu_kernel true: each MLP's activation through the SwiGLU ops gives composed attention's losses (cpu, float32), with the other kernels too; refused without the attention kernels", async () => {
  const composed = await stepsOf((e) => runSft(sftConfig({ attention: 'composed' }), e));
  const swiglu = await stepsOf((e) => runSft(sftConfig({ attention: 'kernels', logprob_kernel: false, rope_kernel: false, swiglu_kernel: true }), e));
  expect(composed[2].loss).not.toBe(composed[0].loss);
  expectClose(swiglu, composed, 1e-4);
  expectClose(await stepsOf((e) => runSft(sftConfig({ attention: 'kernels', swiglu_kernel: true }), e)), composed, 1e-4);
  await expect(runSft(sftConfig({ attention: 'composed', swiglu_kernel: true }))).rejects.toThrow(/--swiglu_kernel needs the attention kernels.*'composed'/);
}, 90_000);
