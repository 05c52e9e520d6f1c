import { FUSED_ADAMW_CHUNK } from '@lathe/train';
import { adamwPlan, trainedParams, vectorExpected } from '../../../tools/bench/kernels/plan';
import { QWEN3_0_6B } from '../../../tools/bench/shapes';

test("kernel-check's plan at the Qwen3-0.6B shape: 310 tensors, 596,049,920 elements, 32 bytes moved per element", () => {
  const params = trainedParams(QWEN3_0_6B);
  // embedding + 28 layers × (q, k, v, o, gate, up, down, two RMSNorms, q_norm, k_norm) + the final norm (tied head)
  expect(params.length).toBe(1 + 28 * 11 + 1);
  const perLayer = 2048 * 1024 * 2 + 1024 * 1024 * 2 + 3 * 3072 * 1024 + 2 * 1024 + 2 * 128;
  const elements = 151936 * 1024 + 28 * perLayer + 1024;
  expect(elements).toBe(596049920);
  const plan = adamwPlan(params);
  expect(plan).toEqual({ tensors: 310, elements, chunks: params.reduce((a, p) => a + Math.ceil(p.size / FUSED_ADAMW_CHUNK), 0), bytesPerStep: elements * 32 });
  expect(params.filter((p) => p.decay).length).toBe(1 + 28 * 7);
});

test('the vector check ends at start + rounds × (1 + x) per element', () => {
  const want = vectorExpected(8, 12);
  // replay the rounds literally: b = a + 1 (ORT), a = b + x (the kernel)
  const a = Float32Array.from({ length: 8 }, (_, i) => i % 7);
  for (let r = 0; r < 12; r++) for (let i = 0; i < 8; i++) a[i] = a[i] + 1 + (i % 5);
  expect(Array.from(want)).toEqual(Array.from(a));
});
