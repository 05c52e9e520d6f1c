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
export { CustomOpDomain, opFamily, type CustomOpContext, type CustomOpInput, type CustomOps, type CustomOpSpec, type OpFamily } from './custom-op';
export { kernelRegion, regionOf, segmentGraph, splitGraph, SplitProgram, KERNEL_SCOPE, type KernelImpl, type SplitStep } from './split';
export { flashAttentionSource, flashForwardSmem, flashBackwardSmem, flashKernelName, FLASH_BM, FLASH_BN, FLASH_THREADS, FLASH_HEAD_DIMS, FLASH_TYPES } from './flash-attention-source';
export { FlashAttention, flashAttentionOps, flashAttentionReference, flashAttentionUnsupported, flashShapeOf, cudaIncludeDir, type FlashAttendInputs, type FlashAttentionMode, type FlashAttentionOps, type FlashAttentionShape, type FlashBackwardArgs, type FlashForwardArgs } from './flash-attention';
export { w4a16Preamble, w4a16Source, w4a16KernelName, w4a16MaxWarps, w4a16Smem, W4A16_TILES, W4A16_TYPES } from './w4a16-source';
export { W4A16_TILE_STAGES, W4A16_TILE_THREADS, W4A16_TILE_VARIANTS, W4A16_VARIANTS, w4a16TileDims, w4a16TileKernelName, w4a16TileSmem, type W4A16TileVariant } from './w4a16-source';
export { W4A16, W4A16_BLOCK_SIZES, roundToDtype, w4a16Ops, w4a16Plan, w4a16Reference, w4a16Unsupported, type W4A16Args, type W4A16Attrs, type W4A16Ops, type W4A16Plan, type W4A16Shape } from './w4a16';
export { W4A16_DEFAULT_SMS, W4A16_ROUNDS_WARPS_PER_SM, W4A16_TILE_FROM_ROWS, W4A16_WG_FILL, w4a16DefaultChoice, w4a16WgChoice, w4a16MaxSharedBytes, w4a16TileEstimate, w4a16TilePlan, w4a16TileUnavailable, type W4A16LaunchOptions, type W4A16SplitChoice, type W4A16Tile, type W4A16TilePlan } from './w4a16';
export { W4A16_WG_BUILDS, w4a16WgBuild, w4a16WgDims, w4a16WgKernelName, w4a16WgKernels, w4a16WgLabel, w4a16WgSmem, w4a16WgSource, w4a16WgStages, type W4A16WgBuild } from './w4a16-wgmma-source';
export { W4A16Gemm, W4A16_GEMM_GROUP, W4A16_GEMM_MAX_GROUP, W4A16_GEMM_SLOTS, w4a16DequantSource, w4a16GemmOps, type W4A16DequantArgs, type W4A16GemmOps, type W4A16GemmPipeline, type W4A16GemmProjection } from './w4a16-gemm';
export { W4A16PlanTable, tuneW4A16, w4a16TimingWeights, w4a16TuneCandidates, type W4A16TuneEntry, type W4A16TuneOptions, type W4A16TuneShape, type W4A16TimingWeights, type W4A16TuneTiming } from './w4a16-tune';
export { decodeAttentionSource, decodeAttentionSourceFor, decodeGroupsOf, decodeAttentionCore, decodeKernelName, decodeSplitSweepSource, decodeSplitSweepVariants, decodeSplitDefaultVariant, decodeSplitVariantInvalid, decodeSweepKernelName, decodeSweepCombineName, sameDecodeSplitVariant, DECODE_SWEEP_SPACE, DECODE_SPLIT_UNROLL, decodeSplitSmem, decodeSplitPlan, decodeSplitChunk, decodeSplitChunks, decodeAppendSmem, DECODE_THREADS, DECODE_HEAD_DIMS, DECODE_GROUPS, DECODE_TYPES, FP8_E4M3_MAX, type DecodeCacheKind, type DecodeSplitPlan, type DecodeSourceOptions, type DecodeSplitVariant } from './decode-attention-source';
export { DecodeAttention, decodeAttentionOps, decodeAttentionReference, decodeAttentionUnsupported, decodeChunks, e4m3Decode, e4m3Encode, packedQkvArgs, quantizeE4m3Reference, unpackQkv, type DecodeAttendCommon, type DecodeAttendInputs, type DecodeAttendOutputs, type DecodePackedAttendInputs, type DecodeAttentionOps, type DecodeAttentionShape, type DecodeReferenceInputs, type DecodeStepArgs, type DecodeStepPart, type DecodeCombine, type DecodeStepOptions, type DecodeCompileOptions } from './decode-attention';
export { crossEntropySource, crossEntropyKernelName, CE_MAX_VOCAB, CE_THREADS, CE_TYPES } from './cross-entropy-source';
export { CrossEntropyKernels, crossEntropyOps, crossEntropyReference, crossEntropyUnsupported, type CrossEntropyBackwardArgs, type CrossEntropyCallOptions, type CrossEntropyForwardArgs, type CrossEntropyOps, type CrossEntropyShape } from './cross-entropy';
export { ropeSource, ropeKernelName, ROPE_THREADS, ROPE_TYPES } from './rope-source';
export { RopeKernels, ropeOps, ropeReference, ropeUnsupported, type RopeArgs, type RopeOps, type RopeShape } from './rope';
export { swigluSource, swigluKernelName, SWIGLU_THREADS, SWIGLU_TYPES } from './swiglu-source';
export { SwigluKernels, swigluOps, swigluPackedReference, swigluPackedUnsupported, swigluReference, swigluUnsupported, type SwigluBackwardArgs, type SwigluApply, type SwigluForwardArgs, type SwigluOps, type SwigluPackedArgs, type SwigluPackedShape, type SwigluShape } from './swiglu';
export { greedyPickSource, greedyPickKernelName, GREEDY_PICK_THREADS, GREEDY_PICK_TYPES } from './greedy-pick-source';
export { GreedyPickKernels, greedyPickOps, greedyPickReference, greedyPickUnsupported, type GreedyPickArgs, type GreedyPickOps, type GreedyPickShape } from './greedy-pick';
