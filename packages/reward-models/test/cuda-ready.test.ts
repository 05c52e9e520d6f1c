/**
 * What can be checked about the GPU on the CPU: the bf16 train steps of the Bradley-Terry and DPO
 * losses (full, recomputed layers, flash attention, LoRA) and the bf16 scoring graphs hold no
 * run-time shape arithmetic and no op without a CUDA kernel (a CUDA session with CPU fallback off
 * would refuse them), and the fixed-shape steps no Concat/Split that copies host tables per run.
 */
import * as L from '@lathe/onnx';
import { CausalLM, weightInputs } from '@lathe/models';
import { compileTrainStep, type LossBuilder } from '@lathe/train';
import { bradleyTerryLoss, dpoLoss, REWARD_LORA_TARGETS, responseLogprobs, RewardModel, sequenceRewards, tokenValues, trainedWeights, type TrainedWeights } from '@lathe/reward-models';
import { PAD, tinyQwen3 } from './tiny';

// head_dim 16: GroupQueryAttention's smallest
const hf = { ...tinyQwen3(1), num_attention_heads: 2, num_key_value_heads: 1, head_dim: 16 };
const lm = CausalLM.random(hf, { seed: 1 });
const rm = RewardModel.fromCausalLM(lm, { padTokenId: PAD });

function gpuTrouble(g: L.Graph): string[] {
  return [...L.runtimeShapeNodes(g).map((n) => `run-time shape: ${n.op.name} ${n.name}`), ...L.noCudaKernelNodes(g).map((n) => `no CUDA kernel: ${n.op.name} ${n.outputs[0]?.dtype} ${n.name}`)];
}

test('bf16 Bradley-Terry and DPO train steps put nothing on the CPU', () => {
  const variants = (tw: TrainedWeights, make: (o: { compute: 'bfloat16'; recompute?: boolean; flashAttention?: boolean; weights?: TrainedWeights['weights'] }) => LossBuilder): [string, LossBuilder][] => [
    ['plain', make({ compute: 'bfloat16' })],
    ['recomputed layers', make({ compute: 'bfloat16', recompute: true })],
    ['flash attention', make({ compute: 'bfloat16', flashAttention: true })],
    ['lora', make({ compute: 'bfloat16', weights: tw.weights })],
  ];
  const rmLora = trainedWeights(rm.config, rm.float32Weights(), { lora: { rank: 2, alpha: 4, targets: REWARD_LORA_TARGETS }, compute: 'bfloat16' });
  const lmLora = trainedWeights(lm.config, lm.float32Weights(), { lora: { rank: 2, alpha: 4, targets: REWARD_LORA_TARGETS }, compute: 'bfloat16' });
  const rmFull = trainedWeights(rm.config, rm.float32Weights());
  const lmFull = trainedWeights(lm.config, lm.float32Weights());
  const cases: [string, TrainedWeights, TrainedWeights, LossBuilder][] = [
    ...variants(rmLora, (o) => bradleyTerryLoss(rm.config, { ...o, margin: true, centerCoefficient: 0.01 })).map(([n, l]): [string, TrainedWeights, TrainedWeights, LossBuilder] => [`bradley-terry ${n}`, rmFull, rmLora, l]),
    ...variants(lmLora, (o) => dpoLoss(lm.config, { ...o, chunk: 8 })).map(([n, l]): [string, TrainedWeights, TrainedWeights, LossBuilder] => [`dpo ${n}`, lmFull, lmLora, l]),
    ...variants(lmLora, (o) => dpoLoss(lm.config, { ...o, loss: 'ipo' })).map(([n, l]): [string, TrainedWeights, TrainedWeights, LossBuilder] => [`ipo ${n}`, lmFull, lmLora, l]),
  ];
  for (const [name, full, lora, loss] of cases) {
    const params = name.endsWith('lora') ? lora.params : full.params;
    const graphs = compileTrainStep({ params, loss, optimizer: { maxGradNorm: 1 } });
    for (const g of [graphs.step, graphs.accumulate]) expect([name, gpuTrouble(g)]).toEqual([name, []]);
  }
});

test('fixed-shape steps (what CUDA graphs capture) copy no host tables', () => {
  const shape: [number, number] = [8, 12];
  const rmFull = trainedWeights(rm.config, rm.float32Weights());
  const lmFull = trainedWeights(lm.config, lm.float32Weights());
  for (const [params, loss] of [
    [rmFull.params, bradleyTerryLoss(rm.config, { compute: 'bfloat16', shape, margin: true })],
    [lmFull.params, dpoLoss(lm.config, { compute: 'bfloat16', shape, chunk: 8 })],
  ] as const) {
    const step = compileTrainStep({ params: [...params], loss, optimizer: { maxGradNorm: 1 } }).step;
    expect(L.hostTableNodes(step)).toEqual([]);
    expect(gpuTrouble(step)).toEqual([]);
  }
});

test('bf16 scoring graphs (rewards, values, response log-probs; composed and GQA) put nothing on the CPU', () => {
  for (const attention of ['composed', 'gqa'] as const) {
    const graph = (build: (g: L.Graph, ids: L.Tensor, mask: L.Tensor) => void) => {
      const g = new L.Graph();
      build(g, g.input('input_ids', 'int64', ['B', 'T']), g.input('attention_mask', 'int64', ['B', 'T']));
      return gpuTrouble(g);
    };
    const trunk = { attention, ...(attention === 'gqa' ? {} : { fused: true }) };
    const rewards = graph((g, ids, mask) => g.output(sequenceRewards(rm.config, weightInputs(g, rm.config, 'bfloat16', 'bfloat16').weights, ids, mask, trunk), 'rewards'));
    const values = graph((g, ids, mask) => g.output(tokenValues(rm.config, weightInputs(g, rm.config, 'bfloat16', 'bfloat16').weights, ids, mask, trunk), 'values'));
    const logp = graph((g, ids, mask) => {
      const response = g.input('loss_mask', 'int64', ['B', 'T']);
      g.output(responseLogprobs(lm.config, weightInputs(g, lm.config, 'bfloat16', 'bfloat16').weights, ids, mask, response, { ...trunk, reduction: 'mean', chunk: 8 }), 'logp');
    });
    expect({ attention, rewards, values, logp }).toEqual({ attention, rewards: [], values: [], logp: [] });
  }
});
