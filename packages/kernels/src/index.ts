/**
 * @lathe/kernels — Lathe's own CUDA kernels, compiled at run time by NVRTC and launched through the
 * CUDA driver API on the stream ONNX Runtime's sessions run on, on the device pointers Lathe's
 * tensors hold: kernel launches and bound session runs interleave in order, with no copies.
 */
export { KernelLibraryError, libraryCandidates, libraryEnv, libraryFixes, loadLibrary, type KernelLibraryKind } from './library';
export { Nvrtc, NvrtcError, type CompiledImage } from './nvrtc';
export { CudaDriver, CudaError, captureModes, type CapturedGraph, type Handle, type LaunchConfig } from './driver';
export { KernelCache, compileKeyHash, defaultCacheDir, type CompileKey } from './cache';
export { packKernelArgs, type ArgType, type ArgValue, type ArgValues, type PackedArgs } from './args';
export { Kernels, KernelModule, Kernel, chooseTarget, checkVersions, probeKernels, type CompileOptions, type KernelProbe, type KernelsOptions } from './kernels';
export { CustomOpDomain, type CustomOpContext, type CustomOpInput, type CustomOpSpec } from './custom-op';
export { kernelRegion, regionOf, segmentGraph, splitGraph, SplitProgram, KERNEL_SCOPE, type KernelImpl, type SplitStep } from './split';
export { flashAttentionSource, flashForwardSmem, flashBackwardSmem, flashKernelName, FLASH_BM, FLASH_BN, FLASH_THREADS, FLASH_HEAD_DIMS, FLASH_TYPES } from './flash-attention-source';
export { FlashAttention, flashAttentionOps, flashAttentionReference, flashAttentionUnsupported, flashShapeOf, cudaIncludeDir, type FlashAttendInputs, type FlashAttentionMode, type FlashAttentionOps, type FlashAttentionShape, type FlashBackwardArgs, type FlashForwardArgs } from './flash-attention';
