// A CPU stand-in for the CUDA subset Lathe's flash-attention kernels use, so their indexing, masking
// and synchronization can be tested without a GPU: every CUDA thread of a block is a std::thread,
// __syncthreads and __syncwarp are barriers, warp shuffles go through a per-warp exchange slot,
// ldmatrix and mma.sync exchange lanes' addresses and registers through a per-warp slot array and
// give each lane the PTX fragment layout's elements; cp.async copies at once.
#pragma once
#include <algorithm>
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define FA_SHARED(name) unsigned char* name = emu::t_smem
#define FA_EMULATION 1

struct dim3 { unsigned x = 1, y = 1, z = 1; };
struct alignas(16) uint4 { unsigned x, y, z, w; };

namespace emu {
inline thread_local unsigned char* t_smem;
inline thread_local std::barrier<>* t_block;
inline thread_local std::barrier<>* t_warp;
inline thread_local float* t_exchange;  // the warp's 32 shuffle slots
inline thread_local uint64_t* t_slots;  // the warp's 32 × 8 register slots (ldmatrix, mma.sync)
inline thread_local unsigned t_lane;
}  // namespace emu
inline thread_local dim3 blockIdx, threadIdx, blockDim, gridDim;

inline void __syncthreads() { emu::t_block->arrive_and_wait(); }
inline void __syncwarp() { emu::t_warp->arrive_and_wait(); }
inline float __shfl_xor_sync(unsigned, float v, int lane_mask) {
  emu::t_exchange[emu::t_lane] = v;
  emu::t_warp->arrive_and_wait();
  const float other = emu::t_exchange[emu::t_lane ^ lane_mask];
  emu::t_warp->arrive_and_wait();
  return other;
}
inline float __expf(float x) { return std::exp(x); }
inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
using std::min;

struct __nv_bfloat16 { uint16_t bits; };
inline float __bfloat162float(__nv_bfloat16 x) { uint32_t u = uint32_t(x.bits) << 16; float f; std::memcpy(&f, &u, 4); return f; }
inline __nv_bfloat16 __float2bfloat16(float f) {
  uint32_t u; std::memcpy(&u, &f, 4);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x7fffffu)) return {uint16_t((u >> 16) | 0x40)};
  return {uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16)};
}
struct __half { _Float16 v; };
inline float __half2float(__half x) { return float(x.v); }
inline __half __float2half(float f) { return {_Float16(f)}; }
inline float emu_to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
inline float emu_to_float(__half x) { return __half2float(x); }
inline float emu_to_float(float x) { return x; }
// float → T rounded as the device's conversions round (the harnesses' inputs and references)
template <typename T> T emu_from_float(float x);
template <> inline __nv_bfloat16 emu_from_float(float x) { return __float2bfloat16(x); }
template <> inline __half emu_from_float(float x) { return __float2half(x); }
template <> inline float emu_from_float(float x) { return x; }


// The forward's PTX primitives (see the kernel source's FA_EMULATION block), lane by lane.
inline unsigned __cvta_generic_to_shared(const void* p) { return unsigned(reinterpret_cast<uintptr_t>(p)); }
inline void cp_async16(void* dst, const void* src, bool pred) {
  if (pred) std::memcpy(dst, src, 16);
  else std::memset(dst, 0, 16);
}
inline void cp_async_commit() {}
inline void cp_async_wait_all() {}
inline float fast_exp2(float x) { return std::exp2(x); }
inline void red_add2(float* p, float a, float b) {
  std::atomic_ref<float>(p[0]).fetch_add(a);
  std::atomic_ref<float>(p[1]).fetch_add(b);
}
inline uint16_t emu_lo(unsigned r) { return uint16_t(r & 0xffffu); }
inline uint16_t emu_hi(unsigned r) { return uint16_t(r >> 16); }
// Every lane's row address in, each lane's (row lane/4, columns 2(lane%4), +1) of matrix i out (transposed: column lane/4, rows 2(lane%4), +1).
inline void emu_ldsm(unsigned (&r)[4], const void* p, bool trans) {
  emu::t_slots[emu::t_lane * 8] = reinterpret_cast<uintptr_t>(p);
  emu::t_warp->arrive_and_wait();
  const unsigned g = emu::t_lane >> 2, t = emu::t_lane & 3;
  for (int i = 0; i < 4; ++i) {
    uint16_t e[2];
    for (int k = 0; k < 2; ++k) {
      const uint16_t* row = reinterpret_cast<const uint16_t*>(emu::t_slots[(8 * i + (trans ? 2 * t + k : g)) * 8]);
      e[k] = row[trans ? g : 2 * t + k];
    }
    r[i] = unsigned(e[0]) | (unsigned(e[1]) << 16);
  }
  emu::t_warp->arrive_and_wait();
}
inline void ldsm_x4(unsigned (&r)[4], const void* p) { emu_ldsm(r, p, false); }
inline void ldsm_x4_t(unsigned (&r)[4], const void* p) { emu_ldsm(r, p, true); }
template <typename T> inline float emu_bits_to_float(uint16_t b) { T x; std::memcpy(&x, &b, 2); return emu_to_float(x); }
// d += a · b with m16n8k16's layouts: a{0..3} = (g, 2t..), (g + 8, 2t..), (g, 2t + 8..), (g + 8, 2t + 8..);
// b{0,1} = (k 2t.., n g), (k 2t + 8.., n g); d = (g, 2t), (g, 2t + 1), (g + 8, 2t), (g + 8, 2t + 1).
template <typename T>
inline void mma16816(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  uint64_t* mine = emu::t_slots + emu::t_lane * 8;
  for (int i = 0; i < 4; ++i) mine[i] = a[i];
  mine[4] = b0;
  mine[5] = b1;
  emu::t_warp->arrive_and_wait();
  float A[16][16], B[16][8];
  for (unsigned l = 0; l < 32; ++l) {
    const uint64_t* x = emu::t_slots + l * 8;
    const unsigned g = l >> 2, t = l & 3;
    for (int i = 0; i < 4; ++i) {
      const unsigned row = g + (i & 1) * 8, col = 2 * t + (i >> 1) * 8;
      A[row][col] = emu_bits_to_float<T>(emu_lo(unsigned(x[i])));
      A[row][col + 1] = emu_bits_to_float<T>(emu_hi(unsigned(x[i])));
    }
    for (int i = 0; i < 2; ++i) {
      B[2 * t + i * 8][g] = emu_bits_to_float<T>(emu_lo(unsigned(x[4 + i])));
      B[2 * t + i * 8 + 1][g] = emu_bits_to_float<T>(emu_hi(unsigned(x[4 + i])));
    }
  }
  emu::t_warp->arrive_and_wait();
  const unsigned g = emu::t_lane >> 2, t = emu::t_lane & 3;
  for (int e = 0; e < 4; ++e) {
    const unsigned row = g + (e >> 1) * 8, col = 2 * t + (e & 1);
    float s = d[e];
    for (int k = 0; k < 16; ++k) s += A[row][k] * B[k][col];
    d[e] = s;
  }
}

namespace emu {
// Runs `kernel` over a grid, one block at a time, each block's threads concurrently.
inline void launch(dim3 grid, unsigned threads, size_t smem_bytes, const std::function<void()>& kernel) {
  const size_t guard = 4096;  // past the launch's size: must stay untouched
  std::vector<unsigned char> smem(smem_bytes + guard + 128);
  unsigned char* base = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem.data()) + 127) & ~uintptr_t(127));
  for (unsigned bz = 0; bz < grid.z; ++bz)
    for (unsigned by = 0; by < grid.y; ++by)
      for (unsigned bx = 0; bx < grid.x; ++bx) {
        std::fill(smem.begin(), smem.end(), 0xcd);  // garbage, as uninitialized shared memory would be
        std::barrier<> block(threads);
        std::vector<std::unique_ptr<std::barrier<>>> warps;
        std::vector<float> exchange(threads);
        std::vector<uint64_t> slots(size_t(threads) * 8);
        for (unsigned w = 0; w < (threads + 31) / 32; ++w) warps.push_back(std::make_unique<std::barrier<>>(std::min(32u, threads - 32 * w)));
        std::vector<std::thread> pool;
        for (unsigned t = 0; t < threads; ++t)
          pool.emplace_back([&, t] {
            blockIdx = {bx, by, bz};
            threadIdx = {t, 0, 0};
            blockDim = {threads, 1, 1};
            gridDim = grid;
            t_smem = base;
            t_block = &block;
            t_warp = warps[t / 32].get();
            t_exchange = exchange.data() + (t / 32) * 32;
            t_slots = slots.data() + (t / 32) * 32 * 8;
            t_lane = t % 32;
            kernel();
          });
        for (auto& th : pool) th.join();
        for (size_t i = 0; i < guard; ++i)
          if (base[smem_bytes + i] != 0xcd) { std::fprintf(stderr, "kernel wrote shared memory past the %zu bytes launched with\n", smem_bytes); std::exit(3); }
      }
}
}  // namespace emu

// Device-wide atomics and fences for the "last CTA done" pattern: a std::atomic_ref add, a full fence,
// and an L2 load (a plain load: the host has no incoherent L1).
namespace emu {
// Every int atomicAdd's address and the value it returned, for a harness to check a counting protocol.
inline std::mutex atomic_log_lock;
inline std::vector<std::pair<const int*, int>> atomic_log;
}  // namespace emu
inline int atomicAdd(int* p, int v) {
  const int old = std::atomic_ref<int>(*p).fetch_add(v);
  std::lock_guard<std::mutex> hold(emu::atomic_log_lock);
  emu::atomic_log.emplace_back(p, old);
  return old;
}
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline float __ldcg(const float* p) { return std::atomic_ref<const float>(*p).load(std::memory_order_relaxed); }

namespace emu {
// Runs `kernel` over a grid in reverse block order, `concurrent` blocks at a time (each its own shared
// memory and barriers), so code that counts blocks done meets neither launch order nor one block alone.
inline void launch_concurrent(dim3 grid, unsigned threads, size_t smem_bytes, unsigned concurrent, const std::function<void()>& kernel) {
  const size_t guard = 4096;
  std::vector<dim3> blocks;
  for (unsigned bz = 0; bz < grid.z; ++bz)
    for (unsigned by = 0; by < grid.y; ++by)
      for (unsigned bx = 0; bx < grid.x; ++bx) blocks.push_back({bx, by, bz});
  std::reverse(blocks.begin(), blocks.end());
  for (size_t first = 0; first < blocks.size(); first += concurrent) {
    const size_t n = std::min<size_t>(concurrent, blocks.size() - first);
    struct Block {
      std::vector<unsigned char> smem;
      unsigned char* base;
      std::unique_ptr<std::barrier<>> block;
      std::vector<std::unique_ptr<std::barrier<>>> warps;
      std::vector<float> exchange;
      std::vector<uint64_t> slots;
    };
    std::vector<Block> bs(n);
    for (auto& b : bs) {
      b.smem.assign(smem_bytes + guard + 128, 0xcd);
      b.base = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(b.smem.data()) + 127) & ~uintptr_t(127));
      b.block = std::make_unique<std::barrier<>>(threads);
      for (unsigned w = 0; w < (threads + 31) / 32; ++w) b.warps.push_back(std::make_unique<std::barrier<>>(std::min(32u, threads - 32 * w)));
      b.exchange.resize(threads);
      b.slots.resize(size_t(threads) * 8);
    }
    std::vector<std::thread> pool;
    for (size_t i = 0; i < n; ++i)
      for (unsigned t = 0; t < threads; ++t)
        pool.emplace_back([&, i, t] {
          Block& b = bs[i];
          blockIdx = blocks[first + i];
          threadIdx = {t, 0, 0};
          blockDim = {threads, 1, 1};
          gridDim = grid;
          t_smem = b.base;
          t_block = b.block.get();
          t_warp = b.warps[t / 32].get();
          t_exchange = b.exchange.data() + (t / 32) * 32;
          t_slots = b.slots.data() + (t / 32) * 32 * 8;
          t_lane = t % 32;
          kernel();
        });
    for (auto& th : pool) th.join();
    for (auto& b : bs)
      for (size_t i = 0; i < guard; ++i)
        if (b.base[smem_bytes + i] != 0xcd) { std::fprintf(stderr, "kernel wrote shared memory past the %zu bytes launched with\n", smem_bytes); std::exit(3); }
  }
}
}  // namespace emu
