/**
 * What the in-run update's nodes are given, on the decoder losses (graph builds only, no run): the
 * gradients summed in place are tensors nothing else reads, so none is refused; with bfloat16 sums
 * each gradient the backward made in bfloat16 is taken as it is; and `halfGradients` hands the fused
 * update every gradient as bfloat16 but a gathered table's (the embedding, and an untied LM head whose
 * label rows the loss gathers), whose rows are summed in float32.
 */
import { parseConfig, paramSpecs } from '@lathe/models';
import type { Tensor } from '@lathe/onnx';
import { compileTrainStep, sftLoss, type AdamWUpdate, type InGraphGradients } from '@lathe/train';
import { inGraphUpdateNodes } from '../src/in-run-reduce';
import { tinyQwen3 } from '../../models/test/tiny';

/** The gradient dtypes an update receives (the step graph's), with a stand-in update that keeps the parameters. */
function gradDtypes(tied: boolean, compute: 'bfloat16' | 'float32', opts: { low?: boolean; halfGradients?: boolean }) {
  const config = parseConfig({ ...tinyQwen3, tie_word_embeddings: tied } as never, 'tiny');
  const params = paramSpecs(config).map((s) => ({ name: s.name, shape: s.shape, decay: true }));
  const seen: string[][] = [];
  const update: AdamWUpdate = (slots) => {
    seen.push(slots.map((x) => x.grad.dtype));
    return { params: slots.map((x) => x.param), m: slots.map((x) => x.m), v: slots.map((x) => x.v), gradNorm: slots[0].param };
  };
  // a hook that sums nothing: what it is handed is the point
  const hook: InGraphGradients = {
    customOpDomains: [],
    build: () => [],
    attach: () => undefined,
    finish: () => Promise.resolve(),
    buildReduced: (_g, grads) => ({ reduced: grads.map((x) => x.grad), joined: grads[0].grad as Tensor }),
  };
  const between = opts.low === undefined ? {} : { beforeUpdate: inGraphUpdateNodes(hook, opts.low) };
  compileTrainStep({ params, loss: sftLoss(config, { compute }), update }, { ...between, halfGradients: opts.halfGradients });
  const count = (d: string) => seen[0].filter((x) => x === d).length;
  return { params: params.length, bfloat16: count('bfloat16'), float32: count('float32') };
}

test.each([
  [true, 'bfloat16'],
  [false, 'bfloat16'],
  [true, 'float32'],
  [false, 'float32'],
] as const)('tied %s, %s compute: no gradient of the decoder loss is refused; bfloat16 sums are all bfloat16, float32 ones float32', (tied, compute) => {
  const low = gradDtypes(tied, compute, { low: true });
  expect(low).toEqual({ params: low.params, bfloat16: low.params, float32: 0 });
  const wide = gradDtypes(tied, compute, { low: false });
  expect(wide).toEqual({ params: wide.params, bfloat16: 0, float32: wide.params });
});

test('halfGradients: in bfloat16 compute every gradient but the gathered tables (float32 sums) reaches the update as bfloat16', () => {
  // tied: the one table, embedding and LM head
  const tied = gradDtypes(true, 'bfloat16', { halfGradients: true });
  expect(tied).toEqual({ params: tied.params, bfloat16: tied.params - 1, float32: 1 });
  // untied: the embedding and the LM head
  const untied = gradDtypes(false, 'bfloat16', { halfGradients: true });
  expect(untied).toEqual({ params: untied.params, bfloat16: untied.params - 2, float32: 2 });
  // float32 compute has no widening Cast to take
  const f32 = gradDtypes(true, 'float32', { halfGradients: true });
  expect(f32.bfloat16).toBe(0);
});
