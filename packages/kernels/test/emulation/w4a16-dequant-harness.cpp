// Runs Lathe's W4A16 dequantize kernels (w4a16-dequant.cu, written out by the test) on the CPU through emu.h and
// the W4A16 primitives of w4-emu.h against a per-element decode of MatMulNBits' layout (byte k / 2 of the row, the
// low nibble for even k; the block's scale and zero point, or 8), and prints one JSON line: the weights that differ
// bit for bit from it, the largest |weight| seen, and whether the guard past W stayed untouched.
// usage: w4a16-dequant-harness bf16|fp16 N K blockSize zp(0|1) grid
//        w4a16-dequant-harness group bf16|fp16 grid (N K blockSize zp){1..4}   (w4a16_dequant4: one launch, one buffer)
#include "../w4a16-emulation/w4-emu.h"
#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#define __ldg(p) (*(p))
#include "w4a16-dequant.cu"


// One weight: random codes, scales and zero points in MatMulNBits' layout, and its per-element reference.
template <typename T>
struct Weight {
  int N, K, bs, kb, bs_log2 = 0;
  bool zp;
  std::vector<unsigned> Bw;
  std::vector<T> S, ref;
  std::vector<unsigned char> Z;
  Weight(int n, int k, int b, bool z, unsigned seed) : N(n), K(k), bs(b), kb((k + b - 1) / b), zp(z) {
    while ((1 << bs_log2) < bs) ++bs_log2;
    const int row_bytes = kb * bs / 2, zcols = (kb + 1) / 2;
    std::mt19937 rng(seed);
    Bw.resize(size_t(N) * row_bytes / 4);
    for (auto& w : Bw) w = rng();
    std::normal_distribution<float> nd(0.f, 0.02f);
    S.resize(size_t(N) * kb);
    for (auto& s : S) s = emu_from_float<T>(nd(rng));
    Z.resize(size_t(N) * zcols);
    for (auto& q : Z) q = (unsigned char)(rng() & 0xff);
    const unsigned char* B = reinterpret_cast<const unsigned char*>(Bw.data());
    ref.resize(size_t(N) * K);
    for (int r = 0; r < N; ++r)
      for (int k = 0; k < K; ++k) {
        const unsigned char byte = B[size_t(r) * row_bytes + k / 2];
        const int q = k % 2 ? byte >> 4 : byte & 15;
        const int blk = k / bs;
        const int zv = zp ? (blk % 2 ? Z[size_t(r) * zcols + blk / 2] >> 4 : Z[size_t(r) * zcols + blk / 2] & 15) : 8;
        ref[size_t(r) * K + k] = emu_from_float<T>(float(q - zv) * emu_to_float(S[size_t(r) * kb + blk]));
      }
  }
  const unsigned char* zeros() const { return zp ? Z.data() : nullptr; }
};

// Runs `launch` into a poisoned buffer holding the weights one after the other (and a guard past them), then prints
// the weights that differ bit for bit from their references, the largest |weight|, and whether the guard is intact.
template <typename T>
static void check(const std::vector<Weight<T>>& ws, const std::function<void(T*)>& launch) {
  size_t total = 0;
  for (const auto& w : ws) total += w.ref.size();
  const int guard = 64;
  const T poison = emu_from_float<T>(12345.f);
  std::vector<T> W(total + guard, poison);
  launch(W.data());
  long bad = 0;
  double largest = 0;
  size_t at = 0;
  for (const auto& w : ws) {
    for (size_t i = 0; i < w.ref.size(); ++i) {
      bad += std::memcmp(&W[at + i], &w.ref[i], sizeof(T)) != 0;
      largest = std::max(largest, double(std::abs(emu_to_float(w.ref[i]))));
    }
    at += w.ref.size();
  }
  bool guard_ok = true;
  for (int i = 0; i < guard; ++i) guard_ok = guard_ok && std::memcmp(&W[total + i], &poison, sizeof(T)) == 0;
  std::printf("{\"weights\":%zu,\"bad\":%ld,\"largest\":%.6g,\"guard_ok\":%s}\n", total, bad, largest, guard_ok ? "true" : "false");
}

template <typename T>
static void run(int N, int K, int bs, bool zp, unsigned grid, void (*kern)(const unsigned*, const T*, const unsigned char*, T*, int, int, int, int)) {
  const std::vector<Weight<T>> ws{Weight<T>(N, K, bs, zp, 11)};
  const Weight<T>& w = ws[0];
  check<T>(ws, [&](T* W) { emu::launch({grid, 1, 1}, 64, 0, [&] { kern(w.Bw.data(), w.S.data(), w.zeros(), W, N, K, w.kb, w.bs_log2); }); });
}

// Group mode: up to four weights in one w4a16_dequant4 launch (the rest N = 0), written one after the other.
template <typename T>
using Dequant4 = void (*)(const unsigned*, const T*, const unsigned char*, T*, int, int, int, int, const unsigned*, const T*, const unsigned char*, T*, int, int, int, int, const unsigned*,
                          const T*, const unsigned char*, T*, int, int, int, int, const unsigned*, const T*, const unsigned char*, T*, int, int, int, int);
template <typename T>
static void run_group(unsigned grid, const std::vector<std::array<int, 4>>& specs, Dequant4<T> kern) {
  std::vector<Weight<T>> ws;
  for (size_t i = 0; i < specs.size(); ++i) ws.emplace_back(specs[i][0], specs[i][1], specs[i][2], specs[i][3] != 0, unsigned(11 + i));
  check<T>(ws, [&](T* W) {
    const unsigned* B[4] = {};
    const T* S[4] = {};
    const unsigned char* Z[4] = {};
    T* D[4] = {};
    int N[4] = {0, 0, 0, 0}, K[4] = {8, 8, 8, 8}, KB[4] = {1, 1, 1, 1}, BS[4] = {5, 5, 5, 5};
    size_t at = 0;
    for (size_t i = 0; i < ws.size(); ++i) {
      B[i] = ws[i].Bw.data(), S[i] = ws[i].S.data(), Z[i] = ws[i].zeros(), D[i] = W + at;
      N[i] = ws[i].N, K[i] = ws[i].K, KB[i] = ws[i].kb, BS[i] = ws[i].bs_log2;
      at += ws[i].ref.size();
    }
    emu::launch({grid, 1, 1}, 64, 0, [&] {
      kern(B[0], S[0], Z[0], D[0], N[0], K[0], KB[0], BS[0], B[1], S[1], Z[1], D[1], N[1], K[1], KB[1], BS[1], B[2], S[2], Z[2], D[2], N[2], K[2], KB[2], BS[2], B[3], S[3], Z[3], D[3], N[3],
           K[3], KB[3], BS[3]);
    });
  });
}

int main(int argc, char** argv) {
  if (argc >= 4 && std::string(argv[1]) == "group") {
    // group bf16|fp16 grid (N K blockSize zp){1..4}
    const std::string dt = argv[2];
    const unsigned grid = unsigned(std::atoi(argv[3]));
    std::vector<std::array<int, 4>> specs;
    for (int i = 4; i + 3 < argc && specs.size() < 4; i += 4) specs.push_back({std::atoi(argv[i]), std::atoi(argv[i + 1]), std::atoi(argv[i + 2]), std::atoi(argv[i + 3])});
    if (dt == "bf16") run_group<__nv_bfloat16>(grid, specs, w4a16_dequant4_bf16);
    else run_group<__half>(grid, specs, w4a16_dequant4_fp16);
    return 0;
  }
  if (argc != 7) { std::fprintf(stderr, "usage: %s bf16|fp16 N K blockSize zp grid\n", argv[0]); return 2; }
  const std::string dt = argv[1];
  const int N = std::atoi(argv[2]), K = std::atoi(argv[3]), bs = std::atoi(argv[4]);
  const bool zp = std::atoi(argv[5]) != 0;
  const unsigned grid = unsigned(std::atoi(argv[6]));
  if (dt == "bf16") run<__nv_bfloat16>(N, K, bs, zp, grid, w4a16_dequant_bf16);
  else run<__half>(N, K, bs, zp, grid, w4a16_dequant_fp16);
  return 0;
}
