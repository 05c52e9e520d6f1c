/**
 * A memory-traffic model of the bf16 train step at the Qwen3-0.6B shape, built on the CPU without
 * running anything: every node that serialization keeps, its inputs' and outputs' bytes at a fixed
 * batch shape, summed by (op, forward/backward, input types). Elementwise kernels are bandwidth
 * bound, so this ranks where a GPU step's time can go before a profile is taken; it is a model,
 * not a measurement (fusions ONNX Runtime applies at load time are not seen).
 *
 * usage: npx tsx --conditions=lathe-source tools/bench/train/step-traffic.ts [--batch 4] [--seq 1024]
 *          [--flash-attention] [--recompute] [--top 40]
 */
import * as L from '@lathe/onnx';
import { parseConfig, paramSpecs } from '@lathe/models';
import { compileTrainStep, sftLoss } from '@lathe/train';
import { arg, flag } from '../argv';
import { QWEN3_0_6B } from '../shapes';

const config = parseConfig(QWEN3_0_6B);
const B = Number(arg('batch', '4'));
const T = Number(arg('seq', '1024'));
const params = paramSpecs(config).map((s) => ({ name: s.name, shape: s.shape, decay: s.kind === 'matrix' || s.kind === 'embedding' }));
const loss = sftLoss(config, { compute: 'bfloat16', shape: [B, T], flashAttention: flag('flash-attention'), recompute: flag('recompute') });
const step = compileTrainStep({ params, loss, optimizer: { maxGradNorm: 1 } }).step;
const live = new Set(L.toModelProto(step).graph!.node!.map((n) => n.name));
const itemBytes: Partial<Record<L.DType, number>> = { float32: 4, bfloat16: 2, float16: 2, int64: 8, int32: 4, bool: 1 };
const bytes = (t: L.Tensor | null) => (t ? t.shape.reduce<number>((a, d) => a * (d as number), 1) * (itemBytes[t.dtype] ?? 4) : 0);
const short = (t: L.Tensor | null) => (t ? `${t.dtype === 'bfloat16' ? 'bf16' : t.dtype.replace('float', 'f')}[${t.shape}]` : '-');

const groups = new Map<string, { nodes: number; gb: number }>();
let total = 0;
for (const n of step.nodes) {
  if (!live.has(n.name)) continue;
  const gb = (n.outputs.reduce((s, t) => s + bytes(t), 0) + n.inputs.reduce((s, t) => s + bytes(t), 0)) / 1e9;
  total += gb;
  const key = `${n.op.name} ${n.name.startsWith('grad/') ? 'bwd' : 'fwd'} ${n.inputs.map(short).join(', ')}`;
  const e = groups.get(key) ?? { nodes: 0, gb: 0 };
  e.nodes++;
  e.gb += gb;
  groups.set(key, e);
}
console.log(`batch ${B} × ${T}, ${flag('flash-attention') ? 'flash' : 'composed'} attention${flag('recompute') ? ', recompute' : ''}: ${live.size} live nodes, ${total.toFixed(1)} GB (${(total / 3).toFixed(0)} ms at 3 TB/s)`);
console.log('nodes      GB  op, pass, inputs');
for (const [k, e] of [...groups].sort((a, b) => b[1].gb - a[1].gb).slice(0, Number(arg('top', '40')))) console.log(`${String(e.nodes).padStart(5)} ${e.gb.toFixed(2).padStart(7)}  ${k}`);
