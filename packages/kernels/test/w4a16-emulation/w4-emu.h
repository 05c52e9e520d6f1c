// CPU versions of the W4A16 kernel's device primitives, over test/emulation/emu.h (a std::thread per
// CUDA thread, mma.sync's fragment layouts): the loads copy, __byte_perm picks bytes as PTX's prmt does,
// and the dequantization subtracts exactly and rounds the product to T once, as __hsub2/__hmul2 do.
#pragma once
#include "emu.h"

#define __restrict__
#define W4_SHARED(name) unsigned char* name = emu::t_smem

inline uint4 w4_ld_stream(const void* p) { uint4 r; std::memcpy(&r, p, 16); return r; }
inline uint4 w4_ld(const void* p) { uint4 r; std::memcpy(&r, p, 16); return r; }
// cp.async copies at once (pred false: 16 zero bytes); the waits have nothing to wait for.
inline void w4_cp16(void* dst, const void* src, bool pred) { cp_async16(dst, src, pred); }
inline void w4_cp_commit() {}
template <int N> inline void w4_cp_wait() {}
// prmt.b32 (default mode): byte i of the result is byte sel[4i..4i+3] of the 8 bytes {x, y}.
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned sel) {
  const uint64_t both = uint64_t(x) | (uint64_t(y) << 32);
  unsigned r = 0;
  for (int i = 0; i < 4; ++i) r |= unsigned((both >> (8 * ((sel >> (4 * i)) & 7))) & 0xff) << (8 * i);
  return r;
}
template <typename T> T cvt_to(float f);
template <> inline __nv_bfloat16 cvt_to<__nv_bfloat16>(float f) { return __float2bfloat16(f); }
template <> inline __half cvt_to<__half>(float f) { return __float2half(f); }
template <typename T> inline uint16_t w4_bits(float f) { const T x = cvt_to<T>(f); uint16_t b; std::memcpy(&b, &x, 2); return b; }
template <typename T> unsigned w4_dequant2(unsigned q, unsigned z, unsigned s) {
  unsigned r = 0;
  for (int i = 0; i < 2; ++i) {
    const float qv = emu_bits_to_float<T>(uint16_t(q >> (16 * i))), zv = emu_bits_to_float<T>(uint16_t(z >> (16 * i))), sv = emu_bits_to_float<T>(uint16_t(s >> (16 * i)));
    r |= unsigned(w4_bits<T>((qv - zv) * sv)) << (16 * i);
  }
  return r;
}
