/**
 * The device check of cpuPlacedNodes (`extract-bench.js --placement`): each training graph below is
 * built at a preset's shape and opened as a session on the device with CPU fallback off; on CUDA a
 * graph the check predicts clean must open and one it flags must be refused. With `oRTLog`, each
 * flagged graph is opened again in a child process with fallback on and ORT's verbose log, and the
 * nodes ORT names in "Force fallback to CPU execution for node: …" are returned beside the predicted
 * ones. The graphs: lathe extract train's default loss (KL + candidate mass) and the KL alone, the
 * candidate-mass term's two earlier forms (first candidate by Slice, before c21e79e; by Gather along
 * K with `like`, 602c668), the SFT step and the GRPO step, composed and flash attention.
 */
import { spawnSync } from 'node:child_process';
import * as L from '@lathe/onnx';
import type { DType, Graph, Tensor } from '@lathe/onnx';
import { chunkedTargetLogprobs, decoderHidden, paramSpecs, type DecoderConfig } from '@lathe/models';
import { Device, type DeviceKind } from '@lathe/runtime';
import { castWeights, compileTrainStep, sftLoss, type LossBuilder } from '@lathe/train';
import { decoderPolicy, rlLoss } from '@lathe/grpo';
import { candidateLogits, extractionLoss } from '@lathe/policy-extraction';

/**
 * The candidate-mass term as it was, over composed attention: the first candidate by Slice (before
 * c21e79e) or by Gather along K (c21e79e), with or without 602c668's `like`.
 */
export function historicalMassLoss(config: DecoderConfig, compute: DType, first: 'slice' | 'gather', like: boolean, chunk?: number): LossBuilder {
  return (g, p) => {
    const ids = g.input('input_ids', 'int64', ['B', 'T']);
    const mask = g.input('attention_mask', 'int64', ['B', 'T']);
    const candIds = g.input('candidate_ids', 'int64', ['B', 'T', 'K']);
    const w = castWeights(p, compute);
    const hidden = decoderHidden(config, w, ids, mask, {});
    const logits = candidateLogits(config, w, hidden, candIds);
    const pick = first === 'slice' ? (x: Tensor) => L.squeeze(L.slice(x, [2], [0], [1]), [2]) : (x: Tensor) => L.gather(x, g.constant(0, 'int64', []), 2);
    const logp0 = L.cast(chunkedTargetLogprobs(config, w, hidden, pick(candIds), { chunk, ...(like ? { like: pick(logits) } : {}) }), logits.dtype);
    return { loss: L.reduceSum(L.add(L.sub(L.logSumExp(logits, -1), pick(logits)), logp0)) };
  };
}

/** The one-run train step graph of a loss. */
export function stepGraph(config: DecoderConfig, loss: LossBuilder): Graph {
  const params = paramSpecs(config).map((s) => ({ name: s.name, shape: s.shape, decay: s.kind === 'matrix' }));
  return compileTrainStep({ params, loss, optimizer: { maxGradNorm: 1 } }).step;
}

/** The graphs checked, by name: whether the check should flag each is part of the name's meaning. */
export function placementCases(config: DecoderConfig, compute: DType, chunk?: number): { name: string; graph: () => Graph }[] {
  const flashOk = compute !== 'float32';
  return [
    { name: 'extract-default', graph: () => stepGraph(config, extractionLoss(config, { tau: 0.1, compute, candidateMass: 1, chunk })) },
    { name: 'extract-kl-alone', graph: () => stepGraph(config, extractionLoss(config, { tau: 0.1, compute, chunk })) },
    { name: 'extract-slice-before-c21e79e', graph: () => stepGraph(config, historicalMassLoss(config, compute, 'slice', false, chunk)) },
    { name: 'extract-gather-602c668', graph: () => stepGraph(config, historicalMassLoss(config, compute, 'gather', true, chunk)) },
    { name: 'sft', graph: () => stepGraph(config, sftLoss(config, { compute, chunk })) },
    { name: 'grpo', graph: () => stepGraph(config, rlLoss(decoderPolicy(config, { compute, chunk, entropy: true }), { klCoef: 0.01, entropyCoef: 0.001 }, { reference: true })) },
    ...(flashOk
      ? [
          { name: 'sft-flash', graph: () => stepGraph(config, sftLoss(config, { compute, chunk, flashAttention: true })) },
          { name: 'grpo-flash', graph: () => stepGraph(config, rlLoss(decoderPolicy(config, { compute, chunk, entropy: true, flashAttention: true }), { klCoef: 0.01, entropyCoef: 0.001 }, { reference: true })) },
        ]
      : []),
  ];
}

/** One graph's prediction and what the device said. */
export interface PlacementResult {
  name: string;
  /** cpuPlacedNodes' nodes, one line each (name (op): reason). */
  predicted: string[];
  /** 'ok', or the session's error with CPU fallback off. */
  session: string;
  /** On CUDA: whether the session's outcome is the prediction's (opened iff nothing predicted); null on the CPU. */
  agrees: boolean | null;
  /** With the ORT log: the nodes ORT forced to the CPU (fallback on, verbose log of a child process). */
  ort_cpu_nodes?: string[];
}

/** Runs the check of every case (or those named) on the device. */
export function checkPlacement(o: { device: DeviceKind; config: DecoderConfig; compute: DType; chunk?: number; only?: string[]; ortLog?: (name: string) => string[] }): PlacementResult[] {
  const device = Device.open(o.device);
  const out: PlacementResult[] = [];
  for (const c of placementCases(o.config, o.compute, o.chunk)) {
    if (o.only && !o.only.includes(c.name)) continue;
    const graph = c.graph();
    const found = L.cpuPlacedNodes(L.toModelProto(graph));
    let session = 'ok';
    try {
      device.compile(graph).dispose();
    } catch (e) {
      session = (e as Error).message.split('\n')[0].slice(0, 400);
    }
    const result: PlacementResult = { name: c.name, predicted: L.describeCpuPlacement(found).split('\n').filter((s) => s), session, agrees: o.device === 'cuda' ? (session === 'ok') === (found.length === 0) : null };
    if (o.ortLog && found.length > 0) result.ort_cpu_nodes = o.ortLog(c.name);
    out.push(result);
  }
  return out;
}

/** In a child process: opens one case with fallback on and ORT's verbose log, and prints the log. */
export function openWithLog(o: { device: DeviceKind; config: DecoderConfig; compute: DType; chunk?: number; name: string }): void {
  const c = placementCases(o.config, o.compute, o.chunk).find((x) => x.name === o.name);
  if (!c) throw new Error(`no placement case ${o.name}`);
  Device.open(o.device).compile(c.graph(), { allowCpuFallback: true, logLevel: 1 }).dispose();
}

/** Runs `argv` as a child of this script and returns the node names of its "Force fallback to CPU" log lines. */
export function forcedCpuNodes(argv: string[]): string[] {
  // the "Force fallback" lines are INFO messages of ORT's default logger, whose level the environment sets
  const r = spawnSync(process.execPath, [...process.execArgv, ...argv], { encoding: 'utf8', maxBuffer: 1 << 28, env: { ...process.env, LATHE_ORT_LOG_LEVEL: '1' } });
  const text = `${r.stdout}\n${r.stderr}`;
  return [...text.matchAll(/Force fallback to CPU execution for node: (\S+)/g)].map((m) => m[1]);
}
