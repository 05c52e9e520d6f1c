/**
 * `lathe grpo --attention kernels` on the cpu, where the kernels' custom ops compute attention on
 * the host in float32: three GRPO steps, and three PPO steps with a separate value model, give the
 * losses, gradient norms and rewards of composed attention (MatMul/Softmax, an independent path);
 * the option is sft's (one choice list and help text); `auto` picks the kernels by sft's rules;
 * `--logprob_kernel` (auto, the default, with the kernels) gives the same steps through the fused log-prob ops, and
 * `--rope_kernel` (auto, the default, with the kernels) through the RoPE ops, the value model's included, and
 * `--swiglu_kernel` (auto, the default, with the kernels) through the SwiGLU ops; kernels with
 * float32 compute on cuda is refused before anything is loaded.
 */
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { defaults, grpoSchema, resolveTrainAttention, runGrpo, trainAttentionOption, type GrpoConfig } from '@lathe/recipes';

const root = mkdtempSync(join(tmpdir(), 'lathe-grpo-attention-'));
// a reward that differs within groups (the built-in model rarely answers correctly), so advantages are not 0
const rewardFile = join(root, 'digits.ts');
writeFileSync(rewardFile, "export const digits = (_prompt: string, completion: string): number => (completion.match(/[0-9]/g) ?? []).length / 3;\n");
const grpoConfig = (over: Partial<GrpoConfig> = {}): GrpoConfig => ({
  ...defaults(grpoSchema),
  run_dir: mkdtempSync(join(root, 'run-')),
  steps: 3,
  prompts_per_step: 4,
  group_size: 4,
  max_new_tokens: 3,
  eval_examples: 0,
  save_every: 0,
  lr: 3e-3,
  kl_coef: 0.05,
  reward_fn: `${rewardFile}#digits`,
  ...over,
});

type StepLog = { loss: number; grad_norm: number; reward_mean: number; advantage_abs_mean: number; value_loss?: number };

/** Each step's metrics, as the run reports them. */
async function stepsOf(cfg: GrpoConfig): Promise<StepLog[]> {
  const out: StepLog[] = [];
  await runGrpo(cfg, { onStep: (m) => out.push({ loss: m.loss, grad_norm: m.grad_norm, reward_mean: m.reward_mean, advantage_abs_mean: m.advantage_abs_mean, value_loss: (m as unknown as Record<string, number>)['value/loss'] }) });
  return out;
}

/**
 * Same number of steps, each metric within `rel` of the reference's. The policy loss nearly cancels
 * (a mean of ±A·ratio terms over normalised advantages), so its rounding scales with |A|.
 */
function expectClose(got: StepLog[], want: StepLog[], rel: number) {
  expect(got).toHaveLength(want.length);
  got.forEach((g, i) => {
    const w = want[i];
    expect(g.reward_mean).toBe(w.reward_mean);
    expect(Math.abs(g.loss - w.loss)).toBeLessThanOrEqual(rel * Math.max(Math.abs(w.loss), w.advantage_abs_mean));
    expect(Math.abs(g.grad_norm - w.grad_norm)).toBeLessThanOrEqual(rel * w.grad_norm);
    if (w.value_loss !== undefined) expect(Math.abs(g.value_loss! - w.value_loss)).toBeLessThanOrEqual(rel * Math.abs(w.value_loss));
  });
}

test('lathe grpo --attention kernels: 3 steps with the losses, gradient norms and rewards of composed attention (cpu, float32)', async () => {
  const composed = await stepsOf(grpoConfig({ attention: 'composed' }));
  const kernels = await stepsOf(grpoConfig({ attention: 'kernels', logprob_kernel: false }));
  expect(composed).toHaveLength(3);
  // the steps train: the loss moves and some group's rewards differ
  expect(composed[2].loss).not.toBe(composed[0].loss);
  expect(composed.some((s) => s.advantage_abs_mean > 0)).toBe(true);
  expectClose(kernels, composed, 1e-4);
}, 60_000);

test("lathe grpo --attention kernels --logprob_kernel: the policy's step, re-scoring and KL reference through the fused log-prob ops, 3 steps within 1e-4 of composed attention (cpu, float32); auto by default, refused without the attention kernels", async () => {
  expect(defaults(grpoSchema).logprob_kernel).toBe('auto');
  const composed = await stepsOf(grpoConfig({ attention: 'composed' }));
  const fused = await stepsOf(grpoConfig({ attention: 'kernels' }));
  expect(composed[2].loss).not.toBe(composed[0].loss);
  expectClose(fused, composed, 1e-4);
  await expect(runGrpo(grpoConfig({ attention: 'composed', logprob_kernel: true }))).rejects.toThrow(/--logprob_kernel needs the attention kernels.*'composed'/);
}, 60_000);

test("lathe grpo --estimator gae --attention kernels: PPO's value model trains through the kernels too, 3 steps within 1e-4 of composed attention (cpu, float32)", async () => {
  const ppo = { estimator: 'gae', group_size: 2, kl_coef: 0 } as const;
  const composed = await stepsOf(grpoConfig({ ...ppo, attention: 'composed' }));
  const kernels = await stepsOf(grpoConfig({ ...ppo, attention: 'kernels' }));
  expect(composed.every((s) => Number.isFinite(s.value_loss))).toBe(true);
  expect(composed[2].value_loss).not.toBe(composed[0].value_loss);
  expectClose(kernels, composed, 1e-4);
}, 60_000);

test("lathe grpo --attention kernels --rope_kernel true: q/k of the policy's step, re-scoring and KL reference through the RoPE ops, 3 steps within 1e-4 of composed attention (cpu, float32); auto by default, refused without the attention kernels", async () => {
  expect(defaults(grpoSchema).rope_kernel).toBe('auto');
  expect(grpoSchema.rope_kernel.describe).toContain("the GRPO step's A/B");
  const composed = await stepsOf(grpoConfig({ attention: 'composed' }));
  const rope = await stepsOf(grpoConfig({ attention: 'kernels', rope_kernel: true }));
  expect(composed[2].loss).not.toBe(composed[0].loss);
  expectClose(rope, composed, 1e-4);
  await expect(runGrpo(grpoConfig({ attention: 'composed', rope_kernel: true }))).rejects.toThrow(/--rope_kernel needs the attention kernels.*'composed'/);
}, 60_000);

test("lathe grpo --estimator gae --attention kernels --rope_kernel true: PPO's value model rotates q/k through the RoPE ops too, 3 steps within 1e-4 of composed attention (cpu, float32)", async () => {
  const ppo = { estimator: 'gae', group_size: 2, kl_coef: 0 } as const;
  const composed = await stepsOf(grpoConfig({ ...ppo, attention: 'composed' }));
  const rope = await stepsOf(grpoConfig({ ...ppo, attention: 'kernels', rope_kernel: true }));
  expect(composed.every((s) => Number.isFinite(s.value_loss))).toBe(true);
  expectClose(rope, composed, 1e-4);
}, 60_000);

test("lathe grpo --attention kernels --swiglu_kernel true: every MLP of the policy's step, re-scoring, KL reference and PPO's value model through the SwiGLU ops, 3 steps within 1e-4 of composed attention (cpu, float32); auto by default, refused without the attention kernels", async () => {
  expect(defaults(grpoSchema).swiglu_kernel).toBe('auto');
  const composed = await stepsOf(grpoConfig({ attention: 'composed' }));
  expectClose(await stepsOf(grpoConfig({ attention: 'kernels', swiglu_kernel: true })), composed, 1e-4);
  expectClose(await stepsOf(grpoConfig({ attention: 'kernels' })), composed, 1e-4);
  const ppo = { estimator: 'gae', group_size: 2, kl_coef: 0 } as const;
  const ppoComposed = await stepsOf(grpoConfig({ ...ppo, attention: 'composed' }));
  expectClose(await stepsOf(grpoConfig({ ...ppo, attention: 'kernels', swiglu_kernel: true })), ppoComposed, 1e-4);
  await expect(runGrpo(grpoConfig({ attention: 'composed', swiglu_kernel: true }))).rejects.toThrow(/--swiglu_kernel needs the attention kernels.*'composed': use --attention kernels, or drop --swiglu_kernel \(its default, auto/);
}, 90_000);

test("lathe grpo's --attention is sft's option (kernels among its choices, one help text), default auto", () => {
  expect(grpoSchema.attention.choices).toEqual(trainAttentionOption.choices);
  expect(grpoSchema.attention.choices).toContain('kernels');
  // sft's text, its last sentence (sft's scoring graphs keep flash) replaced by what GRPO's passes do
  expect(grpoSchema.attention.describe.startsWith(trainAttentionOption.describe.slice(0, trainAttentionOption.describe.indexOf('. The evaluation')))).toBe(true);
  expect(grpoSchema.attention.describe).toContain('re-scoring, reference and value passes attend through the kernels too');
  expect(defaults(grpoSchema).attention).toBe('auto');
});

test("--attention auto on a GRPO config: the kernels on cuda with bfloat16 compute, by sft's rules (not on the cpu, in float32, under a quantized base, under lathe launch or without NVRTC)", () => {
  const cuda: GrpoConfig = { ...defaults(grpoSchema), device: 'cuda', compute_dtype: 'bfloat16' };
  const facts = { kernelsAvailable: true, dataParallel: false };
  expect(resolveTrainAttention(cuda, facts)).toBe('kernels');
  expect(grpoSchema.attention.describe).not.toMatch(/'auto' keeps flash/);
  expect(resolveTrainAttention({ ...cuda, device: 'cpu' }, facts)).toBe('auto');
  expect(resolveTrainAttention({ ...cuda, compute_dtype: 'float32' }, facts)).toBe('auto');
  expect(resolveTrainAttention({ ...cuda, quantize_base: 'nf4' }, facts)).toBe('auto');
  expect(resolveTrainAttention(cuda, { ...facts, dataParallel: true })).toBe('auto');
  expect(resolveTrainAttention(cuda, { ...facts, kernelsAvailable: false })).toBe('auto');
  expect(resolveTrainAttention({ ...cuda, attention: 'flash' }, facts)).toBe('flash');
});

test('lathe grpo --attention kernels with float32 compute on cuda is refused, naming the flags, before anything is loaded', async () => {
  await expect(runGrpo(grpoConfig({ attention: 'kernels', device: 'cuda', compute_dtype: 'float32', model: join(root, 'no-such-model') }))).rejects.toThrow(/--attention kernels on --device cuda needs --compute_dtype bfloat16/);
});
