/**
 * CUDA C++ shared by the kernels' sources: text spliced into each source string, so that every
 * source stays one self-contained NVRTC compilation (and one emulation build) with its own names.
 */

/**
 * `<prefix>_to_f<T>(x)` and `<prefix>_from_f<T>(f)`: bf16, fp16 and float to and from float, the
 * conversions every kernel's loads and stores go through (round to nearest even on the way back).
 */
export function floatConversions(prefix: string): string {
  const to = `${prefix}_to_f`;
  const from = `${prefix}_from_f`;
  return [
    `template <typename T> __device__ __forceinline__ float ${to}(T x);`,
    `template <> __device__ __forceinline__ float ${to}<__nv_bfloat16>(__nv_bfloat16 x) { return __bfloat162float(x); }`,
    `template <> __device__ __forceinline__ float ${to}<__half>(__half x) { return __half2float(x); }`,
    `template <> __device__ __forceinline__ float ${to}<float>(float x) { return x; }`,
    `template <typename T> __device__ __forceinline__ T ${from}(float x);`,
    `template <> __device__ __forceinline__ __nv_bfloat16 ${from}<__nv_bfloat16>(float x) { return __float2bfloat16(x); }`,
    `template <> __device__ __forceinline__ __half ${from}<__half>(float x) { return __float2half(x); }`,
    `template <> __device__ __forceinline__ float ${from}<float>(float x) { return x; }`,
  ].join('\n');
}

/**
 * `__device__ uint4 <name>(const void* p)`: 16 bytes read once, through the non-coherent path and not
 * kept in L1 (`ld.global.nc.L1::no_allocate`), the load of every streamed operand.
 */
export function streamLoad(name: string): string {
  return [
    `__device__ __forceinline__ uint4 ${name}(const void* p) {`,
    '  uint4 r;',
    '  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\\n" : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));',
    '  return r;',
    '}',
  ].join('\n');
}
