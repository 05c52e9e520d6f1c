/**
 * One or more AdamW steps of SFT on a Hugging Face folder with Lathe's compiled train step, on CUDA
 * or CPU. `--path bound` (default): the Trainer keeps parameters and moments on the device (only
 * the batch and three scalars cross the host boundary); `--path plain`: onnxruntime-node's JS API,
 * every parameter and moment in and out of the host each step. Used for parity with PyTorch and for
 * step timing.
 *
 * usage: node lathe-step.js --model DIR --batch batch.json [--device cuda|cpu] [--compute float32|bfloat16]
 *          [--path bound|plain] [--micro-batches 1] [--shared-arena] [--static-shape] [--cuda-graph] [--recompute] [--flash-attention]
 *          [--kernels] [--attention-kernel [--logprob-kernel] [--rope-kernel] [--swiglu-kernel]] [--steps N] [--lr 1e-3] [--max-grad-norm 1]
 *          [--weight-decay 0.01] [--out updated.safetensors] [--profile PREFIX]
 *          [--lora-rank R [--lora-alpha 2R] [--lora-targets 'q_proj|k_proj|v_proj|o_proj'] [--seed 0]] [--freeze REGEX]
 * --lora-rank: LoRA as `lathe sft` trains it (packages/train/src/sft.ts): the base weights stay
 * float32 on the device, bound once as the loss's `base/<name>` inputs (the Trainer's `frozen`
 * option); the trainable parameters, and all AdamW state, are the adapters' A [R, in] and
 * B [out, R] of each matrix whose HF name matches --lora-targets (a regular expression). Each
 * targeted projection gets LoRA's side branch, x·Wᵀ + (alpha / R)·(x·Aᵀ)·Bᵀ with A and B cast to
 * --compute (`loraWeights`; the frozen base gets no [out, in] gradient). No LoRA dropout.
 * A ~ U(±1/√in) (seeded by --seed), B = 0. Only `--path bound`; --out then holds the adapters.
 * --freeze: full fine-tuning with the weights whose names match frozen the same way (e.g.
 * `embed_tokens`, to see how far two runs part without the embedding's scatter-add gradient).
 * --kernels opens the GPU through Lathe's kernels (the device `lathe sft` opens: its sessions on the
 * kernels' stream, AdamW as the fused node); --attention-kernel also attends through Lathe's
 * flash-attention kernels (what `lathe sft --attention auto` picks on cuda with bfloat16);
 * --logprob-kernel, with it, takes the LM head's log-partition through the fused cross-entropy kernel
 * (`lathe sft --logprob_kernel`); --rope-kernel, with it, rotates queries and keys through Lathe's RoPE
 * kernel instead of ONNX Runtime's RotaryEmbedding; --swiglu-kernel, with it, takes each MLP's
 * silu(gate)·up through Lathe's SwiGLU kernel instead of QuickGelu and Mul (`lathe sft --swiglu_kernel`).
 * --profile writes ORT's profile of the step session when the trainer is disposed (run with
 * CUDA_LAUNCH_BLOCKING=1 so each node's time includes its GPU work).
 * batch.json: {"input_ids": [[...]], "attention_mask": [[...]], "loss_mask": [[...]]}
 * Prints one JSON line: loss per step, grad norms, step times (run vs host), the trainable parameter
 * count (`trainable_params`), and writes the updated float32 parameters to --out.
 */
import { readFileSync } from 'node:fs';
import { resolve } from 'node:path';
import { CausalLM, paramSpecs, readConfig, TOTAL_LENGTH_INPUT, totalLengthTensor, writeSafetensors } from '@lathe/models';
import { Device, PlainSession, sizeOf, type DeviceTensor, type HostTensor } from '@lathe/runtime';
import {
  biasCorrections,
  castWeights,
  compileTrainStep,
  initLora,
  loraAdapters,
  loraBaseDtype,
  loraWeights,
  sftLoss,
  stateNames,
  Trainer,
  type LoraConfig,
  type SftLossOptions,
  type TrainableParam,
  uploadLoraBase,
} from '@lathe/train';
import { CrossEntropyKernels, crossEntropyOps, cudaIncludeDir, FlashAttention, flashAttentionOps, Kernels, RopeKernels, ropeOps, SwigluKernels, swigluOps } from '@lathe/kernels';
import { arg, flag } from '../argv';


async function main(): Promise<void> {
  const dir = resolve(arg('model'));
  const device = arg('device', 'cuda') as 'cuda' | 'cpu';
  const compute = arg('compute', 'float32') as 'float32' | 'bfloat16';
  const steps = Number(arg('steps', '1'));
  const lr = Number(arg('lr', '1e-3'));
  const batch = JSON.parse(readFileSync(arg('batch'), 'utf8')) as Record<'input_ids' | 'attention_mask' | 'loss_mask', number[][]>;
  const { config } = readConfig(dir);
  const specs = paramSpecs(config);
  // What is trained: every weight, or (--lora-rank) LoRA adapters over a frozen base, as runSft does it.
  const rank = Number(arg('lora-rank', '0'));
  const lora: LoraConfig | undefined = rank > 0 ? { rank, alpha: Number(arg('lora-alpha', String(2 * rank))), targets: arg('lora-targets', 'q_proj|k_proj|v_proj|o_proj') } : undefined;
  const adapters = lora ? loraAdapters(config, lora) : [];
  // --freeze REGEX: full fine-tuning with the matching weights frozen (bound once, like LoRA's base).
  const freeze = arg('freeze', '') ? new RegExp(arg('freeze', '')) : undefined;
  const frozenSpecs = lora ? specs : specs.filter((s) => freeze?.test(s.name));
  const params: TrainableParam[] = lora
    ? adapters.flatMap((a) => [a.a, a.b])
    : specs.filter((s) => !freeze?.test(s.name)).map((s) => ({ name: s.name, shape: s.shape, decay: s.kind === 'matrix' || s.kind === 'embedding' }));
  const trainableParams = params.reduce((s, p) => s + sizeOf(p.shape), 0);
  const optimizer = { weightDecay: Number(arg('weight-decay', '0.01')), maxGradNorm: Number(arg('max-grad-norm', '1')) };
  const path = arg('path', 'bound');
  if (lora && path !== 'bound') throw new Error(`--lora-rank needs --path bound (the plain path has no frozen-base inputs), got --path ${path}`);
  const B = batch.input_ids.length;
  const T = batch.input_ids[0].length;
  const i64 = (rows: number[][]): HostTensor => ({ data: BigInt64Array.from(rows.flat().map(BigInt)), dims: [rows.length, T] });
  // Tokens the loss predicts: loss-mask positions after the first column.
  const lossTokens = batch.loss_mask.reduce((s, r) => s + r.slice(1).reduce((a, b) => a + b, 0), 0);
  const f32 = (v: number): HostTensor => ({ data: Float32Array.from([v]), dims: [] });
  const losses: number[] = [];
  const norms: number[] = [];
  const runMs: number[] = [];
  const hostMs: number[] = [];
  const weights = (await CausalLM.fromPretrained(dir)).float32Weights();
  const t0 = performance.now();
  let tSession = t0;
  let final: Map<string, Float32Array>;
  let memory: unknown;
  if (path === 'bound') {
    const micro = Number(arg('micro-batches', '1'));
    const deviceOptions = { tf32: flag('tf32'), sharedArena: flag('shared-arena') };
    const attentionKernel = device === 'cuda' && flag('attention-kernel');
    const opened = device === 'cuda' && (flag('kernels') || attentionKernel) ? Kernels.withDevice({ device: deviceOptions }) : undefined;
    const dev = opened ? opened.device : Device.open(device, deviceOptions);
    const ops = attentionKernel ? flashAttentionOps('cuda', FlashAttention.compile(opened!.kernels, { includeDir: cudaIncludeDir() })) : undefined;
    if (flag('logprob-kernel') && !attentionKernel) throw new Error('--logprob-kernel goes with --attention-kernel (on cuda)');
    const ce = flag('logprob-kernel') ? crossEntropyOps('cuda', CrossEntropyKernels.compile(opened!.kernels, { includeDir: cudaIncludeDir() })) : undefined;
    if (flag('rope-kernel') && !attentionKernel) throw new Error('--rope-kernel goes with --attention-kernel (on cuda)');
    const rope = flag('rope-kernel') ? ropeOps('cuda', RopeKernels.compile(opened!.kernels, { includeDir: cudaIncludeDir() })) : undefined;
    if (flag('swiglu-kernel') && !attentionKernel) throw new Error('--swiglu-kernel goes with --attention-kernel (on cuda)');
    const swiglu = flag('swiglu-kernel') ? swigluOps('cuda', SwigluKernels.compile(opened!.kernels, { includeDir: cudaIncludeDir() })) : undefined;
    const graphMode = flag('cuda-graph');
    const staticShape = graphMode || flag('static-shape');
    const flash = flag('flash-attention') || attentionKernel; // rows must be right-padded (step_speed.py's batches have no padding)
    const lossOpts: SftLossOptions = {
      compute,
      recompute: flag('recompute'),
      flashAttention: flash,
      ...(ops ? { attentionKernel: (x, heads) => ops.attend(x, heads, 'kernels') } : {}),
      ...(ce ? { logprobKernel: ce } : {}),
      ...(rope ? { ropeKernel: rope.rotate } : {}),
      ...(swiglu ? { swigluKernel: swiglu.apply } : {}),
      ...(staticShape ? { shape: [B / micro, T] as [number, number] } : {}),
    };
    const loss = lora
      ? sftLoss(config, {
          ...lossOpts,
          weights: (g, trainable) => {
            const base = new Map(specs.map((s) => [s.name, g.input(`base/${s.name}`, loraBaseDtype(s.name, adapters, compute), s.shape)]));
            return loraWeights((name) => base.get(name)!, trainable, adapters, lora, compute);
          },
        })
      : freeze
        ? sftLoss(config, {
            ...lossOpts,
            weights: (g, trainable) => castWeights(new Map([...trainable, ...frozenSpecs.map((s) => [s.name, g.input(`base/${s.name}`, 'float32', s.shape)] as const)]), compute),
          })
        : sftLoss(config, lossOpts);
    // A LoRA base (in the compute dtype, as lathe sft binds it) or the --freeze weights (float32) are bound once, read-only, for every step.
    const frozen: Record<string, DeviceTensor> = Object.fromEntries(
      frozenSpecs.map((s) => [`base/${s.name}`, lora ? uploadLoraBase(dev, s.name, { data: weights.get(s.name)!, dims: s.shape }, adapters, compute) : dev.upload({ data: weights.get(s.name)!, dims: s.shape })]),
    );
    const init = lora ? initLora(adapters, Number(arg('seed', '0'))) : weights;
    const trainer = Trainer.create(
      { params, loss, optimizer },
      { params: init },
      { device: dev, microBatches: micro, cudaGraph: graphMode, frozen, session: { allowCpuFallback: flag('allow-cpu-fallback'), ...(ops ? { customOpDomains: [ops.domain.handle, ...(ce ? [ce.domain.handle] : []), ...(rope ? [rope.domain.handle] : []), ...(swiglu ? [swiglu.domain.handle] : [])] } : {}), ...(arg('profile', '') ? { profilePrefix: arg('profile', '') } : {}) } },
    );
    tSession = performance.now();
    const per = B / micro;
    const parts = Array.from({ length: micro }, (_, k) => {
      const rows = (x: number[][]) => x.slice(k * per, (k + 1) * per);
      // the batch lives on the device for the timing (a real run uploads each batch: its bind time is in host_ms)
      return {
        input_ids: dev.upload(i64(rows(batch.input_ids))),
        attention_mask: dev.upload(i64(rows(batch.attention_mask))),
        loss_mask: dev.upload(i64(rows(batch.loss_mask))),
        loss_tokens: f32(lossTokens),
        ...(flash && !staticShape ? { [TOTAL_LENGTH_INPUT]: totalLengthTensor(T) } : {}),
      };
    });
    for (let t = 0; t < steps; t++) {
      const h0 = performance.now();
      const r = trainer.trainStep(parts, lr);
      rope?.check();
      swiglu?.check();
      losses.push(r.loss);
      norms.push(r.gradNorm);
      runMs.push(r.runMs);
      hostMs.push(performance.now() - h0 - r.runMs);
    }
    memory = dev.memory();
    final = trainer.snapshot().params;
    trainer.dispose();
    for (const t of Object.values(frozen)) t.dispose();
    for (const part of parts) for (const t of [part.input_ids, part.attention_mask, part.loss_mask]) t.dispose();
  } else {
    const graphs = compileTrainStep({ params, loss: sftLoss(config, { compute }), optimizer });
    const session = await PlainSession.create(graphs.step, { device, allowCpuFallback: flag('allow-cpu-fallback'), logLevel: Number(arg('log', '3')) as 0 | 1 | 2 | 3 });
    tSession = performance.now();
    const state: Record<string, HostTensor> = {};
    for (const p of params) {
      state[p.name] = { data: weights.get(p.name)!, dims: p.shape };
      const n = p.shape.reduce((a, b) => a * b, 1);
      state[stateNames.m(p.name)] = { data: new Float32Array(n), dims: p.shape };
      state[stateNames.v(p.name)] = { data: new Float32Array(n), dims: p.shape };
    }
    for (let t = 0; t < steps; t++) {
      const h0 = performance.now();
      const { bc1, bc2 } = biasCorrections(t + 1);
      const feeds = { ...state, input_ids: i64(batch.input_ids), attention_mask: i64(batch.attention_mask), loss_mask: i64(batch.loss_mask), loss_tokens: f32(lossTokens), lr: f32(lr), bc1: f32(bc1), bc2: f32(bc2) };
      const r0 = performance.now();
      const out = await session.run(feeds);
      const r1 = performance.now();
      for (const p of params) {
        state[p.name] = out[stateNames.next(p.name)];
        state[stateNames.m(p.name)] = out[stateNames.next(stateNames.m(p.name))];
        state[stateNames.v(p.name)] = out[stateNames.next(stateNames.v(p.name))];
      }
      losses.push((out.loss.data as Float32Array)[0]);
      norms.push((out.grad_norm.data as Float32Array)[0]);
      runMs.push(r1 - r0);
      hostMs.push(r0 - h0 + (performance.now() - r1));
    }
    final = new Map(params.map((p) => [p.name, state[p.name].data as Float32Array]));
  }
  const outPath = arg('out', '');
  if (outPath) {
    writeSafetensors(
      outPath,
      params.map((p) => {
        const d = final.get(p.name)!;
        return { name: p.name, dtype: 'float32' as const, shape: p.shape, data: new Uint8Array(d.buffer, d.byteOffset, d.byteLength) };
      }),
    );
  }
  const tokens = B * T;
  const best = Math.min(...runMs.slice(steps > 1 ? 1 : 0));
  console.log(
    JSON.stringify({
      device,
      path,
      compute,
      memory,
      batch: [B, T],
      trainable_params: trainableParams,
      lora: lora ? { ...lora, adapters: adapters.length } : null,
      session_ms: +(tSession - t0).toFixed(0),
      losses,
      grad_norms: norms,
      run_ms: runMs.map((x) => +x.toFixed(1)),
      host_ms: hostMs.map((x) => +x.toFixed(1)),
      tokens_per_s_best: Math.round(tokens / (best / 1000)),
    }),
  );
}

main().catch((e: unknown) => {
  console.error(e instanceof Error ? e.stack : e);
  process.exit(1);
});
