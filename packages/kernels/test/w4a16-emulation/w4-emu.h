// CPU versions of the W4A16 kernel's device primitives, over test/emulation/emu.h (a std::thread per
// CUDA thread, mma.sync's fragment layouts): the loads copy, __byte_perm picks bytes as PTX's prmt does,
// and the dequantization subtracts exactly and rounds the product to T once, as __hsub2/__hmul2 do.
#pragma once
#include "emu.h"
#include <type_traits>
#include <vector>

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

// Thread-block clusters along the grid's z: a cluster's CTAs run at once (each its own shared memory, block and warp
// barriers), with a barrier over all their threads and reads of another CTA's shared memory at the same offset.
#define __cluster_dims__(...)
namespace w4emu {
inline thread_local std::barrier<>* t_cluster;
inline thread_local unsigned char* const* t_bases;  // the cluster's CTAs' shared memory, by rank
inline thread_local std::barrier<>* t_wg;           // the thread's warpgroup (128 threads)
inline thread_local uint64_t* t_wg_slots;           // the warpgroup's 128 × 4 A-fragment slots
// Runs `kernel` over grid (x, y) × clusters of `ck` CTAs (z = rank), one cluster at a time.
inline void launch_clusters(dim3 grid, unsigned ck, unsigned threads, size_t smem_bytes, const std::function<void()>& kernel) {
  const size_t guard = 4096;
  for (unsigned by = 0; by < grid.y; ++by)
    for (unsigned bx = 0; bx < grid.x; ++bx) {
      std::vector<std::vector<unsigned char>> mem(ck, std::vector<unsigned char>(smem_bytes + guard + 128, 0xcd));
      std::vector<unsigned char*> bases(ck);
      for (unsigned r = 0; r < ck; ++r) bases[r] = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(mem[r].data()) + 127) & ~uintptr_t(127));
      std::barrier<> cluster(ck * threads);
      std::vector<std::unique_ptr<std::barrier<>>> blocks, warps, groups;
      const unsigned wgs = (threads + 127) / 128;
      std::vector<uint64_t> wg_slots(size_t(ck) * wgs * 128 * 4);
      std::vector<float> exchange(size_t(ck) * threads);
      std::vector<uint64_t> slots(size_t(ck) * threads * 8);
      for (unsigned r = 0; r < ck; ++r) {
        blocks.push_back(std::make_unique<std::barrier<>>(threads));
        for (unsigned w = 0; w < (threads + 31) / 32; ++w) warps.push_back(std::make_unique<std::barrier<>>(std::min(32u, threads - 32 * w)));
        for (unsigned w = 0; w < wgs; ++w) groups.push_back(std::make_unique<std::barrier<>>(std::min(128u, threads - 128 * w)));
      }
      const unsigned warps_per_block = (threads + 31) / 32;
      std::vector<std::thread> pool;
      for (unsigned r = 0; r < ck; ++r)
        for (unsigned t = 0; t < threads; ++t)
          pool.emplace_back([&, r, t] {
            blockIdx = {bx, by, r};
            threadIdx = {t, 0, 0};
            blockDim = {threads, 1, 1};
            gridDim = {grid.x, grid.y, ck};
            emu::t_smem = bases[r];
            emu::t_block = blocks[r].get();
            emu::t_warp = warps[r * warps_per_block + t / 32].get();
            emu::t_exchange = exchange.data() + size_t(r) * threads + (t / 32) * 32;
            emu::t_slots = slots.data() + (size_t(r) * threads + (t / 32) * 32) * 8;
            emu::t_lane = t % 32;
            t_cluster = &cluster;
            t_wg = groups[r * wgs + t / 128].get();
            t_wg_slots = wg_slots.data() + (size_t(r) * wgs + t / 128) * 128 * 4;
            t_bases = bases.data();
            kernel();
          });
      for (auto& th : pool) th.join();
      for (unsigned r = 0; r < ck; ++r)
        for (size_t i = 0; i < guard; ++i)
          if (bases[r][smem_bytes + i] != 0xcd) { std::fprintf(stderr, "kernel wrote shared memory past the %zu bytes launched with\n", smem_bytes); std::exit(3); }
    }
}
}  // namespace w4emu
// barrier.cluster.arrive + wait, and ld.shared::cluster at mapa's address: the same offset in CTA `rank`'s memory.
inline void w4_cluster_sync() { w4emu::t_cluster->arrive_and_wait(); }
inline float w4_ld_cluster(const float* p, unsigned rank) {
  const ptrdiff_t off = reinterpret_cast<const unsigned char*>(p) - emu::t_smem;
  float v;
  std::memcpy(&v, w4emu::t_bases[rank] + off, 4);
  return v;
}

// wgmma.mma_async with A in registers and B (K-major, 128-byte swizzle) in shared memory, run when the thread waits
// for its group, not when it is issued: the A registers and B's shared memory are read then, so a kernel that
// overwrites either before waiting computes the wrong product here, as it could on the device.
namespace w4emu {
struct WgOp {
  float* d;
  int regs;
  const unsigned* a;
  unsigned long long desc;
  bool bf16;
};
inline thread_local std::vector<std::vector<WgOp>> t_wg_groups;  // committed groups, oldest first
inline thread_local std::vector<WgOp> t_wg_open;                 // issued since the last commit
// B's element (k, n) of the operand at descriptor `desc`: the start address's low 18 bits name a byte of this CTA's
// shared memory (under 256 KB), rows 128 bytes apart in groups of 8 at the descriptor's stride, bits 4-6 of the
// address XOR-ed with bits 7-9.
inline uint16_t wg_b(unsigned long long desc, int k, int n) {
  const unsigned swizzle = unsigned(desc >> 62) & 3u, sbo = unsigned((desc >> 32) & 0x3fffu) << 4, start = unsigned(desc & 0x3fffu) << 4;
  if (swizzle != 1u) { std::fprintf(stderr, "wgmma emulation: swizzle mode %u (only 1, 128 bytes)\n", swizzle); std::exit(3); }
  const uintptr_t base = reinterpret_cast<uintptr_t>(emu::t_smem);
  const uintptr_t full = base + ((uintptr_t(start) - (base & 0x3ffffu)) & 0x3ffffu);
  uintptr_t addr = full + uintptr_t(n & 7) * 128 + uintptr_t(n >> 3) * sbo + uintptr_t(k) * 2;
  addr ^= ((addr >> 7) & 7u) << 4;
  uint16_t v;
  std::memcpy(&v, reinterpret_cast<const void*>(addr), 2);
  return v;
}
template <typename T>
inline void wg_run(const WgOp& op) {
  const unsigned me = threadIdx.x % 128;
  for (int i = 0; i < 4; ++i) t_wg_slots[me * 4 + i] = op.a[i];
  t_wg->arrive_and_wait();
  const unsigned w = me / 32, g = (me % 32) / 4, t = me % 4;
  const int cols = op.regs * 2;  // wgmma's N
  for (int j = 0; j < cols / 8; ++j)
    for (int e = 0; e < 4; ++e) {
      const unsigned row = 16 * w + g + 8 * (e >> 1);
      const int col = 8 * j + 2 * int(t) + (e & 1);
      float s = op.d[4 * j + e];
      for (int k = 0; k < 16; ++k) {
        // A (row, k): lane (row % 8, (k % 8) / 2) of warp row / 16, register (row % 16) / 8 + 2 (k / 8), half k % 2
        const unsigned lane = (row % 8) * 4 + (k % 8) / 2, reg = (row % 16) / 8 + 2 * (k / 8);
        const unsigned word = unsigned(t_wg_slots[((row / 16) * 32 + lane) * 4 + reg]);
        s += emu_bits_to_float<T>(uint16_t(word >> (16 * (k % 2)))) * emu_bits_to_float<T>(wg_b(op.desc, k, col));
      }
      op.d[4 * j + e] = s;
    }
  t_wg->arrive_and_wait();
}
}  // namespace w4emu
inline void wg_fence() {}
inline void wg_fence_proxy() {}
template <int R> inline void wg_fence_acc(float (&)[R]) {}
inline void wg_commit() {
  w4emu::t_wg_groups.push_back(std::move(w4emu::t_wg_open));
  w4emu::t_wg_open.clear();
}
template <int N> inline void wg_wait() {
  while (w4emu::t_wg_groups.size() > size_t(N)) {
    for (const auto& op : w4emu::t_wg_groups.front()) op.bf16 ? w4emu::wg_run<__nv_bfloat16>(op) : w4emu::wg_run<__half>(op);
    w4emu::t_wg_groups.erase(w4emu::t_wg_groups.begin());
  }
}
template <typename T, int BM> inline void wg_mma(float (&d)[BM / 2], const unsigned (&a)[4], unsigned long long desc) {
  w4emu::t_wg_open.push_back({d, BM / 2, a, desc, std::is_same_v<T, __nv_bfloat16>});
}
