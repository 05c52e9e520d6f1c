/**
 * QLoRA's train step against LoRA's, in one process: LoRA adapters (AdamW on the device, Lathe's
 * compiled step) over a frozen base that is dense in the compute dtype, or NF4 through MatMulBnb4
 * (backward through the dequantized weights, or MatMulBnb4 with transB = 0: `--backward`), or INT4
 * through MatMulNBits. Random weights of a preset shape and random tokens; reports step time,
 * tokens/s, the loss of the first and last step, the frozen base's bytes on the device and the GPU
 * memory in use.
 *
 * usage: node qlora-step.js [--preset qwen3-0.6b] [--device cuda|cpu] [--compute bfloat16] [--bases dense,nf4,int4]
 *          [--backward dequantize|kernel] [--batch 8] [--seq 512] [--steps 6] [--rank 16]
 *          [--targets 'q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj'] [--no-flash] [--seed 0]
 * Prints one JSON line per base and a summary with tokens/s and base memory relative to dense.
 */
import type * as L from '@lathe/onnx';
import type { DType } from '@lathe/onnx';
import { CausalLM, MODEL_PRESETS, TOTAL_LENGTH_INPUT, totalLengthTensor, type Weights } from '@lathe/models';
import { overQuantizedBase, QuantizedModel, type QuantScheme } from '@lathe/quantization';
import { Device } from '@lathe/runtime';
import { initLora, loraAdapters, loraWeights, sftLoss, Trainer, type LoraConfig } from '@lathe/train';
import { arg, flag } from '../argv';
import { gpuUsedMiB } from '../gpu-memory';

const BASES: Record<string, QuantScheme | undefined> = { dense: undefined, nf4: { format: 'nf4', doubleQuant: true }, int4: { format: 'int4', blockSize: 64 }, int8: { format: 'int8' } };

async function main(): Promise<void> {
  const device = Device.open(arg('device', 'cuda') as 'cuda' | 'cpu');
  const compute = arg('compute', device.kind === 'cuda' ? 'bfloat16' : 'float32') as DType;
  const bases = arg('bases', 'dense,nf4,int4').split(',');
  for (const b of bases) if (!(b in BASES)) throw new Error(`--bases: unknown base '${b}' (${Object.keys(BASES).join(', ')})`);
  const backward = arg('backward', 'dequantize') as 'dequantize' | 'kernel';
  const B = Number(arg('batch', '8'));
  const T = Number(arg('seq', '512'));
  const steps = Number(arg('steps', '6'));
  const rank = Number(arg('rank', '16'));
  const flash = device.kind === 'cuda' && !flag('no-flash');
  const lora: LoraConfig = { rank, alpha: 2 * rank, targets: arg('targets', 'q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj') };
  const preset = arg('preset', 'qwen3-0.6b') as keyof typeof MODEL_PRESETS;
  const source = CausalLM.random(MODEL_PRESETS[preset].config, { seed: Number(arg('seed', '0')), std: 0.02 });
  const config = source.config;
  const master = source.float32Weights();
  const adapters = loraAdapters(config, lora);

  let x = 12345;
  const next = () => ((x = (Math.imul(x, 1103515245) + 12345) >>> 0) % config.vocabSize);
  const batch = {
    input_ids: { data: BigInt64Array.from({ length: B * T }, () => BigInt(next())), dims: [B, T] },
    attention_mask: { data: new BigInt64Array(B * T).fill(1n), dims: [B, T] },
    loss_mask: { data: new BigInt64Array(B * T).fill(1n), dims: [B, T] },
    loss_tokens: { data: Float32Array.of(B * T), dims: [] },
    // Flash attention over symbolic shapes reads the sequence length as an input.
    ...(flash ? { [TOTAL_LENGTH_INPUT]: totalLengthTensor(T) } : {}),
  };
  const results: Record<string, unknown>[] = [];
  for (const name of bases) {
    const scheme = BASES[name];
    const q = scheme ? QuantizedModel.quantize(config, master, scheme) : QuantizedModel.fromParts(config, { format: 'nf4' }, master, new Map());
    const frozen = q.deviceTensors(device, compute, 'base/');
    const baseBytes = [...frozen.values()].reduce((n, t) => n + t.byteLength, 0);
    const row: Record<string, unknown> = { base: name, backward: scheme?.format === 'nf4' ? backward : 'dequantize', base_bytes: baseBytes };
    let trainer: Trainer | undefined;
    try {
      trainer = Trainer.create(
        {
          params: adapters.flatMap((a) => [a.a, a.b]),
          loss: sftLoss(config, {
            compute,
            flashAttention: flash,
            weights: (g: L.Graph, t): Weights => {
              const base = q.graphWeights(g, { dtype: compute, prefix: 'base/', backward });
              const w = loraWeights((n) => base.weights(n), t, adapters, lora, compute, { training: true });
              return scheme ? overQuantizedBase(w, base.weights) : w;
            },
          }),
          optimizer: { weightDecay: 0, maxGradNorm: 1 },
        },
        { params: initLora(adapters, 1) },
        { device, frozen: Object.fromEntries(frozen) },
      );
      const losses: number[] = [];
      const times: number[] = [];
      for (let s = 0; s < steps; s++) {
        const t0 = performance.now();
        losses.push(trainer.trainStep([batch], 1e-4).loss);
        times.push(performance.now() - t0);
      }
      const timed = times.slice(1).sort((a, b) => a - b);
      const median = timed[Math.floor(timed.length / 2)] ?? times[0];
      Object.assign(row, { step_ms: +median.toFixed(1), tokens_s: +((B * T) / (median / 1000)).toFixed(0), loss_first: losses[0], loss_last: losses.at(-1), gpu_used_mib: gpuUsedMiB(), lathe_peak_bytes: device.memory().peakBytes, ort_arena: device.memory().arena });
    } catch (e) {
      row.error = (e as Error).message.slice(0, 500);
    } finally {
      trainer?.dispose();
      for (const t of frozen.values()) t.dispose();
    }
    console.log(JSON.stringify(row));
    results.push(row);
  }
  const dense = results.find((r) => r.base === 'dense');
  const rel = (r: Record<string, unknown>, k: string) => (dense && typeof r[k] === 'number' && typeof dense[k] === 'number' ? +((r[k] as number) / (dense[k] as number)).toFixed(3) : null);
  console.log(JSON.stringify({ summary: true, preset, device: device.kind, compute, batch: B, seq: T, rank, flash, results, vs_dense: Object.fromEntries(results.map((r) => [r.base, { tokens_s: rel(r, 'tokens_s'), base_bytes: rel(r, 'base_bytes') }])) }));
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
