/**
 * Lathe's fused cross-entropy kernels (log-prob / log-sum-exp / entropy, issue 37 item 3) checked and
 * timed on the GPU. Phases, one JSON line each:
 * - compile: NVRTC build of every variant (ms, cold or cached).
 * - check (per case): the fused op's forward and gradient in one ORT session on random logits with
 *   ignored targets, temperature and entropy, against the composed path (cast to float32, LogSoftmax,
 *   gather, their gradient rules) in the same precision and against the host rule in float64 from the
 *   same rounded logits. Max abs error / max |reference| of logp, lse, entropy and d(logits); a case
 *   passes when every fused error is at most max(2 × the composed path's, the floor: 2e-5 for the
 *   float32 statistics, one rounding of the logits' dtype for d(logits)) and ignored rows' log-probs
 *   are exactly 0 — else exit code 1.
 * - time: at --rows × --vocab (default 8192 × 151,936, Qwen3's vocabulary at 8 × 1024 tokens) bf16,
 *   the kernels launched directly (forward; backward; each with the entropy), device ms and GB/s, and
 *   the op in a session against the composed path: forward and forward+backward of log p(target).
 * - head: the LM head as training runs it (chunkedTargetLogprobs, and chunkedLogprobsAndEntropy as
 *   GRPO does, 16 chunks of 9,496 rows): hidden [rows, 1024] and the tied head [151,936, 1024] bf16,
 *   forward and backward (d hidden, d head), with and without the kernel: device ms, speedup, and the
 *   two paths' log-probs and gradients (within 2 %).
 * - sft: full SFT steps of Qwen3-0.6B (random init) at --batch 8x1024 bf16 with Lathe's flash-attention
 *   kernels (forward and backward), with and without the cross-entropy kernel: losses (within 1 %),
 *   step ms and tok/s of each.
 *
 * --cpu: a smoke test of this script on the CPU (float32, tiny shapes, the custom ops' host compute in
 * place of the kernels): what CI can run; it checks the script, not the kernels.
 *
 * usage: node .bundle/ce-check.js [--phases compile,check,time,head,sft] [--cases NAME,…] [--rows 8192] [--vocab 151936]
 *          [--reps 10] [--batch 8x1024] [--steps 4] [--cpu]
 */
import * as L from '@lathe/onnx';
import { CausalLM, chunkedLogprobsAndEntropy, chunkedTargetLogprobs, lmHeadName, parseConfig, TOTAL_LENGTH_INPUT, totalLengthTensor, type DecoderConfig, type HfConfig, type LogprobKernel, type Weights } from '@lathe/models';
import { sftLoss, Trainer } from '@lathe/train';
import { CrossEntropyKernels, crossEntropyOps, crossEntropyReference, FlashAttention, flashAttentionOps, Kernels, type CrossEntropyOps, type FlashAttentionOps } from '@lathe/kernels';
import { Device, type DeviceTensor } from '@lathe/runtime';
import { arg } from '../argv';
import { QWEN3_0_6B } from '../shapes';
import { trainedParams } from './plan';
import { compare, compilePhase, download, fromBits, phasesOf, rng, runCheck, toBits, type Dt } from './common';


interface Case {
  name: string;
  rows: number;
  vocab: number;
  dtype: Dt;
  temperature: number;
  entropy: boolean;
}

const CASES: Case[] = [
  { name: 'v151936_bf16_t0.7_entropy', rows: 64, vocab: 151_936, dtype: 'bfloat16', temperature: 0.7, entropy: true },
  { name: 'chunk_v9496_bf16', rows: 257, vocab: 9_496, dtype: 'bfloat16', temperature: 1, entropy: false },
  { name: 'v262144_bf16_entropy', rows: 8, vocab: 262_144, dtype: 'bfloat16', temperature: 1, entropy: true },
  { name: 'v1001_fp16_t1.3_entropy_unaligned', rows: 33, vocab: 1_001, dtype: 'float16', temperature: 1.3, entropy: true },
  { name: 'v151936_fp32_entropy', rows: 16, vocab: 151_936, dtype: 'float32', temperature: 1, entropy: true },
];

const CPU_CASES: Case[] = [
  { name: 'cpu_v301_t0.8_entropy', rows: 9, vocab: 301, dtype: 'float32', temperature: 0.8, entropy: true },
  { name: 'cpu_v64', rows: 4, vocab: 64, dtype: 'float32', temperature: 1, entropy: false },
];

const TINY: HfConfig = { architectures: ['Qwen3ForCausalLM'], vocab_size: 512, hidden_size: 64, intermediate_size: 192, num_hidden_layers: 2, num_attention_heads: 4, num_key_value_heads: 2, head_dim: 64, rms_norm_eps: 1e-6, rope_theta: 10000, max_position_embeddings: 1024, tie_word_embeddings: true };

/** Targets of a case: spread over the vocabulary, every fifth row ignored (−100). */
function targetsOf(rows: number, vocab: number): BigInt64Array {
  return BigInt64Array.from({ length: rows }, (_, r) => (r % 5 === 2 ? -100n : BigInt((r * 7919 + 13) % vocab)));
}

/** Logits shaped like an LM's: a spread of ±4 and a few ids per row far above it. */
function randomLogits(c: Case, seed: number): { bits: Uint16Array | Float32Array; values: Float32Array } {
  const r = rng(seed);
  const x = Float32Array.from({ length: c.rows * c.vocab }, (_, i) => 4 * r() + (i % 4099 === 0 ? 12 : 0));
  const bits = toBits(c.dtype, x);
  return { bits, values: fromBits(c.dtype, bits) };
}

/** The statistics and d(logits) of g_logp·logp + g_lse·lse + g_H·H, fused (the op) or composed (float32 LogSoftmax, gather). */
function checkGraph(c: Case, path: 'fused' | 'composed', ops: CrossEntropyOps): L.Graph {
  const g = new L.Graph(`ce_${path}`);
  const logits = g.input('logits', c.dtype, [c.rows, c.vocab]);
  const targets = g.input('targets', 'int64', [c.rows]);
  const [a, b, e] = ['g_logp', 'g_lse', 'g_entropy'].map((n) => g.input(n, 'float32', [c.rows]));
  let r: { logp: L.Tensor; lse: L.Tensor; entropy?: L.Tensor };
  if (path === 'fused') r = ops.tokenLogprobs(logits, targets, { temperature: c.temperature, entropy: c.entropy });
  else {
    const f = L.cast(logits, 'float32');
    const z = c.temperature === 1 ? f : L.div(f, c.temperature);
    const valid = L.greaterOrEqual(targets, g.constant(0, 'int64', []));
    const logp = L.where(valid, L.tokenLogprobs(z, L.where(valid, targets, g.constant(0, 'int64', []))), g.constant(0, 'float32', []));
    r = { logp, lse: L.logSumExp(z, -1), ...(c.entropy ? { entropy: L.entropy(z) } : {}) };
  }
  let loss = L.add(L.reduceSum(L.mul(r.logp, a)), L.reduceSum(L.mul(r.lse, b)));
  if (r.entropy) loss = L.add(loss, L.reduceSum(L.mul(r.entropy, e)));
  g.output(r.logp, 'logp');
  g.output(r.lse, 'lse');
  if (r.entropy) g.output(r.entropy, 'entropy');
  g.output(L.grad(loss, [logits])[0]!, 'dlogits');
  return g;
}

/** One rounding of the dtype, relative: the floor of d(logits)'s error (it is written in the logits' dtype). */
const ROUNDING: Record<Dt, number> = { bfloat16: 2 ** -8, float16: 2 ** -11, float32: 2e-5 };

function checkCase(device: Device, ops: CrossEntropyOps, c: Case): boolean {
  const x = randomLogits(c, 17);
  const targets = targetsOf(c.rows, c.vocab);
  const r = rng(23);
  const gs = [0, 1, 2].map(() => Float32Array.from({ length: c.rows }, () => r()));
  const logits = device.upload({ data: x.bits, dims: [c.rows, c.vocab] }, c.dtype);
  const names = ['logp', 'lse', ...(c.entropy ? ['entropy'] : []), 'dlogits'];
  const got: Record<string, Record<string, Float32Array>> = {};
  for (const path of ['fused', 'composed'] as const) {
    const session = device.compile(checkGraph(c, path, ops), path === 'fused' ? { customOpDomains: [ops.domain.handle] } : {});
    const b = session.binding().input('logits', logits).input('targets', { data: targets, dims: [c.rows] });
    ['g_logp', 'g_lse', 'g_entropy'].forEach((n, i) => b.input(n, { data: gs[i], dims: [c.rows] }));
    for (const n of names) b.output(n, 'device');
    b.runSync();
    ops.check();
    got[path] = Object.fromEntries(names.map((n) => [n, download(b.get(n))]));
    b.dispose();
    session.dispose();
  }
  logits.dispose();
  const ref = crossEntropyReference({ rows: c.rows, vocab: c.vocab, temperature: c.temperature }, { logits: x.values, targets, gLogp: gs[0], gLse: gs[1], ...(c.entropy ? { gEntropy: gs[2] } : {}) });
  const refOf: Record<string, Float32Array> = { logp: ref.logp!, lse: ref.lse, entropy: ref.entropy, dlogits: ref.dLogits! };
  const failures: string[] = [];
  const report: Record<string, unknown> = {};
  for (const n of names) {
    const fused = compare(got.fused[n], refOf[n]);
    const composed = compare(got.composed[n], refOf[n]);
    const bound = Math.max(2 * composed.rel, n === 'dlogits' ? ROUNDING[c.dtype] : 2e-5);
    const pass = fused.finite && fused.rel <= bound;
    if (!pass) failures.push(`${n}: fused rel ${fused.rel} > ${bound.toPrecision(3)}`);
    report[n] = { fused, composed, bound: +bound.toPrecision(3), pass };
  }
  const ignoredNonzero = Array.from(targets).filter((t, i) => t < 0n && got.fused.logp[i] !== 0).length;
  if (ignoredNonzero) failures.push(`${ignoredNonzero} ignored rows with a nonzero log-prob`);
  const ok = failures.length === 0;
  console.log(JSON.stringify({ phase: 'check', case: c.name, shape: { rows: c.rows, vocab: c.vocab, dtype: c.dtype, temperature: c.temperature, entropy: c.entropy }, vs_host_f64: report, ignored_rows_nonzero: ignoredNonzero, ok, failures }));
  return ok;
}

/** Device ms per call of `fn` (warm-up first), from events on the kernels' stream. */
function timer(kernels: Kernels, reps: number): (fn: () => void) => number {
  return (fn) => {
    for (let r = 0; r < 2; r++) fn();
    kernels.synchronize();
    return kernels.time(() => {
      for (let r = 0; r < reps; r++) fn();
    }) / reps;
  };
}

/** Hidden states [rows, D] and the tied head [V, D], random bf16 on the device (std 1 and 0.02: logits of a few units). */
function headInputs(device: Device, rows: number, vocab: number, width: number, dtype: Dt): { h: DeviceTensor; W: DeviceTensor } {
  const gen = (n: number, amp: number, seed: number) => {
    const r = rng(seed);
    return toBits(dtype, Float32Array.from({ length: n }, () => amp * r()));
  };
  return { h: device.upload({ data: gen(rows * width, 1.7, 5), dims: [rows, width] }, dtype), W: device.upload({ data: gen(vocab * width, 0.06, 6), dims: [vocab, width] }, dtype) };
}

function timePhase(kernels: Kernels, ce: CrossEntropyKernels, device: Device, ops: CrossEntropyOps): void {
  const reps = Number(arg('reps', '10'));
  const rows = Number(arg('rows', '8192'));
  const vocab = Number(arg('vocab', '151936'));
  const time = timer(kernels, reps);
  const { h, W } = headInputs(device, rows, vocab, 1024, 'bfloat16');
  // the logits the head would give, made once on the device
  const mk = new L.Graph('logits');
  mk.output(L.matmul(mk.input('h', 'bfloat16', [rows, 1024]), L.transpose(mk.input('W', 'bfloat16', [vocab, 1024]), [1, 0])), 'logits');
  const mkSession = device.compile(mk);
  const mkBind = mkSession.binding().input('h', h).input('W', W).output('logits', 'device');
  mkBind.runSync();
  const logits = mkBind.get('logits');
  h.dispose();
  W.dispose();
  // every row a real target: the composed path's GatherElements would read −100 as an index from the end
  const targets = device.upload({ data: targetsOf(rows, vocab).map((t) => (t < 0n ? 0n : t)), dims: [rows] });
  const shape = { rows, vocab, dtype: 'bfloat16' as const };
  const f32 = () => device.empty('float32', [rows]);
  const [logp, lse, ent, ones] = [f32(), f32(), f32(), device.upload({ data: new Float32Array(rows).fill(1), dims: [rows] })];
  const dx = device.empty('bfloat16', [rows, vocab]);
  const direct = {
    fwd: time(() => ce.forward(shape, { logits, targets, logp, lse, entropy: 0n })),
    fwd_entropy: time(() => ce.forward(shape, { logits, targets, logp, lse, entropy: ent })),
    bwd: time(() => ce.backward(shape, { logits, targets, lse, entropy: 0n, gLogp: ones, gLse: 0n, gEntropy: 0n, dLogits: dx })),
    bwd_entropy: time(() => ce.backward(shape, { logits, targets, lse, entropy: ent, gLogp: ones, gLse: 0n, gEntropy: ones, dLogits: dx })),
  };
  const bytes = rows * vocab * 2;
  const gbs = (b: number, ms: number) => Math.round(b / (ms * 1e6));
  // sessions: log p(target) forward, and forward + d(logits) of Σ logp
  const sessionMs: Record<string, number | string> = {};
  for (const path of ['fused', 'composed'] as const) {
    for (const withGrad of [false, true]) {
      const key = `${path}_${withGrad ? 'fwd_bwd' : 'fwd'}`;
      try {
        const g = new L.Graph(key);
        const x = g.input('logits', 'bfloat16', [rows, vocab]);
        const t = g.input('targets', 'int64', [rows]);
        const lp = path === 'fused' ? ops.tokenLogprobs(x, t).logp : L.tokenLogprobs(L.cast(x, 'float32'), t);
        g.output(lp, 'logp');
        if (withGrad) g.output(L.grad(L.reduceSum(lp), [x])[0]!, 'dlogits');
        const session = device.compile(g, path === 'fused' ? { customOpDomains: [ops.domain.handle] } : {});
        const b = session.binding().input('logits', logits).input('targets', targets).output('logp', logp);
        if (withGrad) b.output('dlogits', dx);
        sessionMs[key] = +time(() => b.runSync({ synchronize: false })).toFixed(3);
        ops.check();
        b.dispose();
        session.dispose();
      } catch (e) {
        sessionMs[key] = `failed: ${(e as Error).message.split('\n')[0]}`;
      }
    }
  }
  const ratio = (a: number | string, b: number | string) => (typeof a === 'number' && typeof b === 'number' ? +(b / a).toFixed(2) : null);
  console.log(
    JSON.stringify({
      phase: 'time',
      shape: { rows, vocab, dtype: 'bfloat16' },
      reps,
      kernel_ms: Object.fromEntries(Object.entries(direct).map(([k, v]) => [k, +v.toFixed(3)])),
      kernel_gb_per_s: { fwd: gbs(bytes, direct.fwd), fwd_entropy: gbs(bytes, direct.fwd_entropy), bwd: gbs(2 * bytes, direct.bwd), bwd_entropy: gbs(2 * bytes, direct.bwd_entropy) },
      session_ms: sessionMs,
      speedup: { fwd: ratio(sessionMs.fused_fwd, sessionMs.composed_fwd), fwd_bwd: ratio(sessionMs.fused_fwd_bwd, sessionMs.composed_fwd_bwd) },
    }),
  );
  for (const t of [logp, lse, ent, ones, dx, targets]) t.dispose();
  mkBind.dispose();
  mkSession.dispose();
}

/** The LM head alone as training runs it, forward and backward, with and without the kernel. */
function headPhase(device: Device, ops: CrossEntropyOps, o: { hf: HfConfig; rows: number; dtype: Dt; reps: number; chunk?: number; kernels?: Kernels }): boolean {
  const cfg: DecoderConfig = parseConfig(o.hf, 'ce-check head');
  const { rows, dtype } = o;
  const D = cfg.hiddenSize;
  const { h, W } = headInputs(device, rows, cfg.vocabSize, D, dtype);
  const targets = device.upload({ data: targetsOf(rows, cfg.vocabSize).map((t) => (t < 0n ? 0n : t)), dims: [1, rows] });
  const r = rng(31);
  const tokenWeights = device.upload({ data: Float32Array.from({ length: rows }, () => r()), dims: [1, rows] });
  let ok = true;
  for (const withEntropy of [false, true]) {
    const res: Record<string, { ms: number; values: Record<string, Float32Array> }> = {};
    let fusedNodes = 0;
    for (const path of ['composed', 'kernel'] as const) {
      const g = new L.Graph(`head_${path}`);
      const hidden = g.input('h', dtype, [1, rows, D]);
      const head = g.input('W', dtype, [cfg.vocabSize, D]);
      const tg = g.input('targets', 'int64', [1, rows]);
      const wt = g.input('weights', 'float32', [1, rows]);
      const w: Weights = (name: string) => {
        if (name !== lmHeadName(cfg)) throw new Error(`head phase: no weight ${name}`);
        return head;
      };
      const kernel: LogprobKernel | undefined = path === 'kernel' ? ops : undefined;
      const opts = { ...(o.chunk ? { chunk: o.chunk } : {}), ...(kernel ? { kernel } : {}) };
      let loss: L.Tensor;
      if (withEntropy) {
        const out = chunkedLogprobsAndEntropy(cfg, w, hidden, tg, opts);
        g.output(out.logp, 'logp');
        g.output(out.entropy, 'entropy');
        loss = L.add(L.reduceSum(L.mul(out.logp, wt)), L.reduceSum(L.mul(out.entropy, L.mul(wt, wt))));
      } else {
        const logp = chunkedTargetLogprobs(cfg, w, hidden, tg, opts);
        g.output(logp, 'logp');
        loss = L.reduceSum(L.mul(logp, wt));
      }
      if (kernel) fusedNodes = g.nodes.filter((n) => n.op.name.startsWith('FusedCrossEntropy_')).length;
      const [dh, dW] = L.grad(loss, [hidden, head]);
      g.output(dh!, 'dh');
      g.output(dW!, 'dW');
      const session = device.compile(g, kernel ? { customOpDomains: [ops.domain.handle] } : {});
      const b = session.binding().input('h', h.reshape([1, rows, D])).input('W', W).input('targets', targets).input('weights', tokenWeights);
      const names = ['logp', ...(withEntropy ? ['entropy'] : []), 'dh', 'dW'];
      for (const n of names) b.output(n, 'device');
      const ms = o.kernels ? timer(o.kernels, o.reps)(() => b.runSync({ synchronize: false })) : NaN;
      b.runSync();
      ops.check();
      res[path] = { ms, values: Object.fromEntries(names.map((n) => [n, download(b.get(n))])) };
      b.dispose();
      session.dispose();
    }
    const diff = Object.fromEntries(Object.keys(res.composed.values).map((n) => [n, compare(res.kernel.values[n], res.composed.values[n])]));
    const tol = dtype === 'float32' ? 1e-4 : 2e-2;
    // the kernel path must have used the kernel, one node a vocabulary chunk
    const pass = fusedNodes > 0 && Object.values(diff).every((d) => d.finite && d.rel <= tol);
    ok &&= pass;
    console.log(
      JSON.stringify({
        phase: 'head',
        head: withEntropy ? 'chunkedLogprobsAndEntropy' : 'chunkedTargetLogprobs',
        shape: { rows, vocab: cfg.vocabSize, hidden: D, dtype, chunk: o.chunk ?? 16384 },
        ms_fwd_bwd: { composed: +res.composed.ms.toFixed(3), kernel: +res.kernel.ms.toFixed(3) },
        speedup: +(res.composed.ms / res.kernel.ms).toFixed(3),
        fused_nodes: fusedNodes,
        kernel_vs_composed: diff,
        tolerance: tol,
        ok: pass,
      }),
    );
  }
  for (const t of [h, W, targets, tokenWeights]) t.dispose();
  return ok;
}

/** Full SFT steps with the flash-attention kernels, with and without the cross-entropy kernel, same init and batch. */
function sftPhase(device: Device, hf: HfConfig, fa: FlashAttentionOps, ce: CrossEntropyOps, o: { batch: [number, number]; steps: number; compute: 'float32' | 'bfloat16' }): boolean {
  const [B, T] = o.batch;
  const model = CausalLM.random(hf, { seed: 1, std: 0.02 });
  const params = trainedParams(hf).map((p) => ({ name: p.name, shape: p.shape, decay: p.decay }));
  const weights = model.float32Weights();
  const vocab = model.config.vocabSize;
  const ids = BigInt64Array.from({ length: B * T }, (_, i) => BigInt((i * 7919 + 13) % vocab));
  // one row shorter than the batch (right padding) where there are two rows
  const mask = BigInt64Array.from({ length: B * T }, (_, i) => (B > 1 && Math.floor(i / T) === 1 && i % T >= T - T / 4 ? 0n : 1n));
  const tokens = mask.reduce((a, m) => a + Number(m), 0);
  const batch = {
    input_ids: device.upload({ data: ids, dims: [B, T] }),
    attention_mask: device.upload({ data: mask, dims: [B, T] }),
    loss_mask: device.upload({ data: mask, dims: [B, T] }),
    loss_tokens: { data: Float32Array.of(tokens - B), dims: [] },
    [TOTAL_LENGTH_INPUT]: totalLengthTensor(T),
  };
  const optimizer = { weightDecay: 0.01, maxGradNorm: 1 };
  const runs: Record<string, { losses: number[]; grad_norms: number[]; step_ms: number[]; tokens_per_s_best: number }> = {};
  const attentionKernel = (x: Parameters<FlashAttentionOps['attend']>[0], heads: { numHeads: number; kvNumHeads: number }) => fa.attend(x, heads, 'kernels');
  for (const path of ['attention_kernels', 'attention_kernels+ce'] as const) {
    const withCe = path === 'attention_kernels+ce';
    const loss = sftLoss(model.config, { compute: o.compute, flashAttention: true, attentionKernel, ...(withCe ? { logprobKernel: ce } : {}) });
    const domains = withCe ? [fa.domain.handle, ce.domain.handle] : [fa.domain.handle];
    const trainer = Trainer.create({ params, loss, optimizer }, { params: weights }, { device, session: { customOpDomains: domains } });
    const r = { losses: [] as number[], grad_norms: [] as number[], step_ms: [] as number[], tokens_per_s_best: 0 };
    for (let s = 0; s < o.steps; s++) {
      const t0 = performance.now();
      const out = trainer.trainStep([batch], 1e-5);
      fa.check();
      ce.check();
      r.step_ms.push(+(performance.now() - t0).toFixed(1));
      r.losses.push(out.loss);
      r.grad_norms.push(out.gradNorm);
    }
    trainer.dispose();
    r.tokens_per_s_best = Math.round((B * T) / (Math.min(...r.step_ms.slice(o.steps > 1 ? 1 : 0)) / 1000));
    runs[path] = r;
  }
  const base = runs.attention_kernels;
  const fused = runs['attention_kernels+ce'];
  // the same model, batch and update: losses agree to the compute dtype's rounding
  const tol = o.compute === 'float32' ? 1e-5 : 1e-2;
  const worst = Math.max(...base.losses.map((l, i) => Math.abs(l - fused.losses[i]) / Math.abs(l)));
  const ok = fused.losses.every(Number.isFinite) && worst <= tol && ce.fallbacks.size === 0;
  console.log(JSON.stringify({ phase: 'sft', batch: [B, T], compute: o.compute, ...runs, ce_fallbacks: Object.fromEntries(ce.fallbacks), speedup: +(fused.tokens_per_s_best / base.tokens_per_s_best).toFixed(3), max_rel_loss_diff: +worst.toPrecision(3), tolerance: tol, ok }));
  for (const t of [batch.input_ids, batch.attention_mask, batch.loss_mask]) t.dispose();
  return ok;
}

function main(): boolean {
  const { cpu, phases } = phasesOf(['compile', 'check', 'time', 'head', 'sft'], ['check', 'head', 'sft']);
  const cases = cpu ? CPU_CASES : CASES;
  const names = arg('cases', cases.map((c) => c.name).join(',')).split(',');
  const unknown = names.filter((n) => !cases.some((c) => c.name === n));
  if (unknown.length) throw new Error(`--cases: unknown case(s) ${unknown.join(', ')} (${cases.map((c) => c.name).join(', ')})`);
  let ok = true;
  if (cpu) {
    const device = Device.cpu();
    const ops = crossEntropyOps('cpu');
    if (phases.includes('check')) for (const c of cases.filter((x) => names.includes(x.name))) ok = checkCase(device, ops, c) && ok;
    if (phases.includes('head')) ok = headPhase(device, ops, { hf: TINY, rows: 24, dtype: 'float32', reps: 1, chunk: 128 }) && ok;
    if (phases.includes('sft')) {
      const fa = flashAttentionOps('cpu');
      ok = sftPhase(device, TINY, fa, ops, { batch: [2, 16], steps: 2, compute: 'float32' }) && ok;
      fa.dispose();
    }
    ops.dispose();
  } else {
    const { kernels, device } = Kernels.withDevice();
    const { ce, fa } = compilePhase(kernels, (includeDir) => ({ ce: CrossEntropyKernels.compile(kernels, { includeDir }), fa: phases.includes('sft') ? FlashAttention.compile(kernels, { includeDir }) : undefined }));
    const ops = crossEntropyOps('cuda', ce);
    if (phases.includes('check')) for (const c of cases.filter((x) => names.includes(x.name))) ok = checkCase(device, ops, c) && ok;
    if (phases.includes('time')) timePhase(kernels, ce, device, ops);
    if (phases.includes('head')) ok = headPhase(device, ops, { hf: QWEN3_0_6B, rows: Number(arg('rows', '8192')), dtype: 'bfloat16', reps: Number(arg('reps', '10')), kernels }) && ok;
    if (phases.includes('sft')) {
      const faOps = flashAttentionOps('cuda', fa);
      const [B, T] = arg('batch', '8x1024').split('x').map(Number);
      ok = sftPhase(device, QWEN3_0_6B, faOps, ops, { batch: [B, T], steps: Number(arg('steps', '4')), compute: 'bfloat16' }) && ok;
      faOps.dispose();
    }
    ops.dispose();
    kernels.dispose();
  }
  return ok;
}

runCheck(main);
