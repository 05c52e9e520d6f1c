// Runs Lathe's W4A16 dequantize kernels (w4a16-dequant.cu, written out by the test) on the CPU through
// emu.h and the W4A16 primitives of w4-emu.h against a per-element decode of MatMulNBits' layout (byte k / 2 of the row, the low nibble for
// even k; the block's scale and zero point, or 8), and prints one JSON line: the weights that differ bit
// for bit from it, the largest |weight| seen, and whether the guard past W stayed untouched.
// usage: w4a16-dequant-harness bf16|fp16 N K blockSize zp(0|1) grid
#include "../w4a16-emulation/w4-emu.h"
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>

#define __ldg(p) (*(p))
#include "w4a16-dequant.cu"


template <typename T>
static void run(int N, int K, int bs, bool zp, unsigned grid, void (*kern)(const unsigned*, const T*, const unsigned char*, T*, int, int, int, int)) {
  const int kb = (K + bs - 1) / bs, row_bytes = kb * bs / 2, zcols = (kb + 1) / 2, guard = 64;
  int bs_log2 = 0;
  while ((1 << bs_log2) < bs) ++bs_log2;
  std::mt19937 rng(11);
  std::vector<unsigned> Bw(size_t(N) * row_bytes / 4);
  for (auto& w : Bw) w = rng();
  const unsigned char* B = reinterpret_cast<const unsigned char*>(Bw.data());
  std::normal_distribution<float> nd(0.f, 0.02f);
  std::vector<T> S(size_t(N) * kb);
  for (auto& s : S) s = emu_from_float<T>(nd(rng));
  std::vector<unsigned char> Z(size_t(N) * zcols);
  for (auto& z : Z) z = (unsigned char)(rng() & 0xff);
  std::vector<T> ref(size_t(N) * K);
  double largest = 0;
  for (int n = 0; n < N; ++n)
    for (int k = 0; k < K; ++k) {
      const unsigned char byte = B[size_t(n) * row_bytes + k / 2];
      const int q = k % 2 ? byte >> 4 : byte & 15;
      const int blk = k / bs;
      const int z = zp ? (blk % 2 ? Z[size_t(n) * zcols + blk / 2] >> 4 : Z[size_t(n) * zcols + blk / 2] & 15) : 8;
      ref[size_t(n) * K + k] = emu_from_float<T>(float(q - z) * emu_to_float(S[size_t(n) * kb + blk]));
      largest = std::max(largest, double(std::abs(emu_to_float(ref[size_t(n) * K + k]))));
    }
  const T poison = emu_from_float<T>(12345.f);
  std::vector<T> W(size_t(N) * K + guard, poison);
  emu::launch({grid, 1, 1}, 64, 0, [&] { kern(Bw.data(), S.data(), zp ? Z.data() : nullptr, W.data(), N, K, kb, bs_log2); });
  long bad = 0;
  for (size_t i = 0; i < ref.size(); ++i) bad += std::memcmp(&W[i], &ref[i], sizeof(T)) != 0;
  bool guard_ok = true;
  for (int i = 0; i < guard; ++i) guard_ok = guard_ok && std::memcmp(&W[ref.size() + i], &poison, sizeof(T)) == 0;
  std::printf("{\"weights\":%zu,\"bad\":%ld,\"largest\":%.6g,\"guard_ok\":%s}\n", ref.size(), bad, largest, guard_ok ? "true" : "false");
}

int main(int argc, char** argv) {
  if (argc != 7) { std::fprintf(stderr, "usage: %s bf16|fp16 N K blockSize zp grid\n", argv[0]); return 2; }
  const std::string dt = argv[1];
  const int N = std::atoi(argv[2]), K = std::atoi(argv[3]), bs = std::atoi(argv[4]);
  const bool zp = std::atoi(argv[5]) != 0;
  const unsigned grid = unsigned(std::atoi(argv[6]));
  if (dt == "bf16") run<__nv_bfloat16>(N, K, bs, zp, grid, w4a16_dequant_bf16);
  else run<__half>(N, K, bs, zp, grid, w4a16_dequant_fp16);
  return 0;
}
