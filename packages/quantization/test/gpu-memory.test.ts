/** The benchmarks' GPU memory reading names the process's own GPU: nvidia-smi ignores CUDA_VISIBLE_DEVICES. */
import { visibleGpuId } from '../../../tools/bench/gpu-memory';

test('visibleGpuId: the first visible GPU (index or UUID), or none when every GPU is visible', () => {
  expect(visibleGpuId({ CUDA_VISIBLE_DEVICES: '2' })).toBe('2');
  expect(visibleGpuId({ CUDA_VISIBLE_DEVICES: '3,1' })).toBe('3');
  expect(visibleGpuId({ CUDA_VISIBLE_DEVICES: 'GPU-5f1c2d3e' })).toBe('GPU-5f1c2d3e');
  expect(visibleGpuId({ CUDA_VISIBLE_DEVICES: '' })).toBeUndefined();
  expect(visibleGpuId({})).toBeUndefined();
});
