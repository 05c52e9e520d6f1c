/**
 * No node of the training graphs lands on the CPU under ONNX Runtime's CUDA placement rule
 * (cpuPlacedNodes), so their CUDA sessions build with CPU fallback off: lathe extract train's default
 * loss (the KL plus the candidate-mass term) and the KL alone, the SFT step and the GRPO step. The
 * candidate-mass term's earlier forms are rebuilt from git history to show the check finds what
 * they put on the CPU: the first candidate by Slice (c21e79e^: its gradient's pad arithmetic) and by
 * a Gather along K (c21e79e, also after 602c668's `like`: that Gather's gradient reads
 * Shape(Transpose(logits)), which ORT rewrites into a Gather over a shape).
 */
import * as L from '@lathe/onnx';
import type { Graph } from '@lathe/onnx';
import { mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import * as ort from 'onnxruntime-node';
import { MODEL_PRESETS, paramSpecs, parseConfig, type DecoderConfig, type HfConfig } from '@lathe/models';
import { compileTrainStep, sftLoss, type LossBuilder } from '@lathe/train';
import { decoderPolicy, rlLoss } from '@lathe/grpo';
import { extractionLoss } from '@lathe/policy-extraction';
import { tinyQwen2, tinyQwen3 } from '../../models/test/tiny';
import { checkPlacement, historicalMassLoss, stepGraph } from '../../../tools/bench/extract/placement';

const tied = parseConfig(tinyQwen3);
const untied = parseConfig(tinyQwen2);

function trainGraphs(config: DecoderConfig, loss: LossBuilder): Graph[] {
  const params = paramSpecs(config).map((s) => ({ name: s.name, shape: s.shape, decay: s.kind === 'matrix' }));
  const graphs = compileTrainStep({ params, loss, optimizer: { maxGradNorm: 1 } });
  return [graphs.step, graphs.accumulate, graphs.apply];
}

/** Every CPU-placed node of the graphs, one line each ('' when none). */
const cpuNodes = (graphs: Graph[]) => graphs.map((g) => L.describeCpuPlacement(L.cpuPlacedNodes(L.toModelProto(g)))).filter((s) => s !== '').join('\n');

describe('the candidate-mass term as it was is flagged', () => {
  test('first candidate by Slice (before c21e79e): the Slice gradient’s pad arithmetic (Add/Where/Max/Min/Sub/Concat over Shape) is on the CPU', () => {
    const found = L.cpuPlacedNodes(L.toModelProto(trainGraphs(tied, historicalMassLoss(tied, 'bfloat16', 'slice', false, 16))[0]));
    expect(found.length).toBeGreaterThan(0);
    expect(found.every((n) => n.name.startsWith('grad/Slice_') && n.reason === 'shape computation')).toBe(true);
    expect(found.map((n) => n.opType)).toContain('Concat');
  });

  test.each([
    ['c21e79e (by Gather, the ids’ shape)', false],
    ['602c668 (by Gather, `like` the candidate logits)', true],
  ])('first candidate by Gather along K, %s: Shape(Transpose(logits)) in the Gather’s gradient', (_, like) => {
    const found = L.cpuPlacedNodes(L.toModelProto(trainGraphs(tied, historicalMassLoss(tied, 'bfloat16', 'gather', like, 16))[0]));
    expect(found.map((n) => [n.opType, n.reason])).toEqual([['Shape', 'Shape of a Transpose']]);
    expect(found[0].name).toMatch(/^grad\/Gather_\d+\//);
  });
});

test('ONNX Runtime 1.29’s level-1 optimizer does turn that Shape(Transpose(logits)) into Gather(Shape(logits), perm) (its optimized model, saved on the CPU)', async () => {
  const model = L.toModelProto(stepGraph(tied, historicalMassLoss(tied, 'float32', 'gather', true, 16)));
  const [flagged] = L.cpuPlacedNodes(model);
  expect(flagged.reason).toBe('Shape of a Transpose');
  const shape = model.graph.node.find((n) => n.name === flagged.name)!;
  const read = (name: string) => model.graph.node.find((n) => n.output.includes(name))!;
  expect(read(shape.input[0]).opType).toBe('Transpose');
  const saved = join(mkdtempSync(join(tmpdir(), 'placement-')), 'basic.onnx');
  await ort.InferenceSession.create(L.toModelBytes(stepGraph(tied, historicalMassLoss(tied, 'float32', 'gather', true, 16))), { graphOptimizationLevel: 'basic', optimizedModelFilePath: saved });
  const optimized = L.decodeModelProto(new Uint8Array(readFileSync(saved)));
  const producer = optimized.graph.node.find((n) => n.output.includes(shape.output[0]))!;
  expect(producer.opType).toBe('Gather');
  const [data, perm] = producer.input;
  expect(optimized.graph.node.find((n) => n.output.includes(data))!.opType).toBe('Shape');
  expect(optimized.graph.initializer!.find((t) => t.name === perm)!.dims!.map(Number)).toEqual([3]); // a small initializer: the rule's CPU-ready input
});

describe('no training graph puts a node on the CPU', () => {
  test.each([
    ['bfloat16, tied embeddings', tied, 'bfloat16', false],
    ['bfloat16, untied, recompute', untied, 'bfloat16', true],
    ['float32, tied', tied, 'float32', false],
  ] as const)('lathe extract train’s default loss (KL + candidate mass), %s; the KL alone; forward KL', (_, config, compute, recompute) => {
    expect(cpuNodes(trainGraphs(config, extractionLoss(config, { tau: 0.5, compute, recompute, candidateMass: 1, chunk: 16 })))).toBe('');
    expect(cpuNodes(trainGraphs(config, extractionLoss(config, { tau: 0.5, compute, recompute })))).toBe('');
    expect(cpuNodes(trainGraphs(config, extractionLoss(config, { tau: Infinity, compute, recompute, direction: 'forward', candidateMass: 0.5 })))).toBe('');
  });

  test('the default loss at Qwen3-0.6B’s shape (bfloat16, the vocabulary in 16 chunks)', () => {
    const config = parseConfig(MODEL_PRESETS['qwen3-0.6b'].config as HfConfig);
    expect(cpuNodes(trainGraphs(config, extractionLoss(config, { tau: 1, compute: 'bfloat16', candidateMass: 1 })).slice(0, 1))).toBe('');
  });

  test.each([
    ['composed attention', false],
    ['flash attention', true],
  ])('the SFT step and the GRPO step (bfloat16, %s)', (_, flashAttention) => {
    expect(cpuNodes(trainGraphs(tied, sftLoss(tied, { compute: 'bfloat16', flashAttention, chunk: 16 })))).toBe('');
    const policy = decoderPolicy(tied, { compute: 'bfloat16', flashAttention, chunk: 16, entropy: true });
    expect(cpuNodes(trainGraphs(tied, rlLoss(policy, { klCoef: 0.01, entropyCoef: 0.001 }, { reference: true })))).toBe('');
  });
});

test('the device check (extract-bench.js --placement) on the CPU: every graph opens as a session, the predictions as above', () => {
  const results = checkPlacement({ device: 'cpu', config: tied, compute: 'float32', chunk: 16 });
  expect(results.map((r) => r.name)).toEqual(['extract-default', 'extract-kl-alone', 'extract-slice-before-c21e79e', 'extract-gather-602c668', 'sft', 'grpo']);
  for (const r of results) {
    expect(r.session).toBe('ok');
    expect(r.agrees).toBeNull(); // the rule is the CUDA provider's: only a CUDA session can confirm it
    expect(r.predicted.length > 0).toBe(r.name === 'extract-slice-before-c21e79e' || r.name === 'extract-gather-602c668');
  }
}, 60_000);
