// Runs Lathe's W4A16 kernels (w4.cu, the TypeScript source written out by the test) on the CPU through
// w4-emu.h. Reads the problem from a binary file and writes C's bits to another; the test compares them
// with its float64 reference.
// usage: harness IN OUT bf16|fp16 M N n1 n2 K kb bs_log2 has_zp mt nt warps
//        harness IN OUT bf16|fp16 M N n1 n2 K kb bs_log2 has_zp tile NAME BM BN THREADS SMEM CK
//   (the tiled or wgmma kernel NAME — from w4-tiles.h, which the test writes from the builds' lists — over [BM, BN] tiles of C,
//   in clusters of CK CTAs along z where CK > 1)
// OUT: C0 [M, n1], C1 [M, n2 - n1], C2 [M, N - n2] (16-bit values), one after another
// IN: A (M·K 16-bit values), B (N·kb·bs/2 bytes), scales (N·kb 16-bit values), zero points (N·ceil(kb/2) bytes, if has_zp)
#include "w4-emu.h"
#include <fstream>
#include <string>
#include "w4.cu"
#include "w4-wg.cu"
#include "w4-tiles.h"

template <typename T>
static int run(const char* in, const char* out, int M, int N, int n1, int n2, int K, int kb, int bs_log2, bool has_zp, int bm, int bn, unsigned threads,
               size_t smem, unsigned ck, void (*kernel)(const T*, const unsigned char*, const T*, const unsigned char*, T*, T*, T*, int, int, int, int, int, int, int)) {
  const size_t bs = size_t(1) << bs_log2;
  std::vector<T> A(size_t(M) * K), S(size_t(N) * kb), C(size_t(M) * N);
  T* C0 = C.data();
  T* C1 = C0 + size_t(M) * n1;
  T* C2 = C1 + size_t(M) * (n2 - n1);
  std::vector<unsigned char> B(size_t(N) * kb * bs / 2), Z(has_zp ? size_t(N) * ((kb + 1) / 2) : 0);
  std::ifstream f(in, std::ios::binary);
  f.read(reinterpret_cast<char*>(A.data()), A.size() * 2);
  f.read(reinterpret_cast<char*>(B.data()), B.size());
  f.read(reinterpret_cast<char*>(S.data()), S.size() * 2);
  if (has_zp) f.read(reinterpret_cast<char*>(Z.data()), Z.size());
  if (!f) { std::fprintf(stderr, "short input file\n"); return 2; }
  for (auto& c : C) std::memset(&c, 0x7f, 2);  // rows and columns the kernel must not write keep this pattern
  const dim3 grid{unsigned((N + bn - 1) / bn), unsigned((M + bm - 1) / bm), 1};
  const auto body = [&] { kernel(A.data(), B.data(), S.data(), has_zp ? Z.data() : nullptr, C0, n2 > n1 ? C1 : nullptr, N > n2 ? C2 : nullptr, M, N, n1, n2, K, kb, bs_log2); };
  // tiled and wgmma builds: clusters of ck CTAs (1: each alone), with warpgroups for wgmma
  if (ck > 0) w4emu::launch_clusters(grid, ck, threads, smem, body);
  else emu::launch(grid, threads, smem, body);
  std::ofstream o(out, std::ios::binary);
  o.write(reinterpret_cast<const char*>(C.data()), C.size() * 2);
  return o ? 0 : 2;
}

int main(int argc, char** argv) {
  const bool tile = argc == 19 && std::string(argv[12]) == "tile";
  if (argc != 15 && !tile) { std::fprintf(stderr, "usage: harness IN OUT bf16|fp16 M N n1 n2 K kb bs_log2 has_zp (mt nt warps | tile NAME BM BN THREADS SMEM CK)\n"); return 2; }
  const std::string t = argv[3];
  const int M = std::atoi(argv[4]), N = std::atoi(argv[5]), n1 = std::atoi(argv[6]), n2 = std::atoi(argv[7]), K = std::atoi(argv[8]), kb = std::atoi(argv[9]), bs_log2 = std::atoi(argv[10]);
  const bool zp = std::atoi(argv[11]) != 0;
  if (tile) {
    const std::string name = argv[13];
    const int bm = std::atoi(argv[14]), bn = std::atoi(argv[15]);
    const unsigned threads = unsigned(std::atoi(argv[16]));
    const size_t smem = size_t(std::atoll(argv[17]));
    const unsigned ck = unsigned(std::atoi(argv[18]));
    if (t == "bf16")
      for (const auto& [n, k] : w4_tiles_bf16) if (name == n) return run<__nv_bfloat16>(argv[1], argv[2], M, N, n1, n2, K, kb, bs_log2, zp, bm, bn, threads, smem, ck, k);
    if (t == "fp16")
      for (const auto& [n, k] : w4_tiles_fp16) if (name == n) return run<__half>(argv[1], argv[2], M, N, n1, n2, K, kb, bs_log2, zp, bm, bn, threads, smem, ck, k);
    std::fprintf(stderr, "no tiled build %s for %s\n", name.c_str(), t.c_str());
    return 2;
  }
  const int mt = std::atoi(argv[12]), nt = std::atoi(argv[13]), warps = std::atoi(argv[14]);
  const int bm = 8 * mt, bn = 16 * nt;
  const unsigned threads = unsigned(32 * warps);
  const size_t smem = size_t(warps) * nt * mt * 128 * 4;
#define RUN(SUF, T, NAME) return run<T>(argv[1], argv[2], M, N, n1, n2, K, kb, bs_log2, zp, bm, bn, threads, smem, 0u, NAME)
#define PICK(SUF, T)                                                  \
  if (nt == 1 && mt == 1) RUN(SUF, T, w4a16_##SUF##_m8);              \
  if (nt == 1 && mt == 2) RUN(SUF, T, w4a16_##SUF##_m16);             \
  if (nt == 1 && mt == 4) RUN(SUF, T, w4a16_##SUF##_m32);             \
  if (nt == 1 && mt == 8) RUN(SUF, T, w4a16_##SUF##_m64);             \
  if (nt == 2 && mt == 1) RUN(SUF, T, w4a16_##SUF##_m8_n32);          \
  if (nt == 2 && mt == 2) RUN(SUF, T, w4a16_##SUF##_m16_n32);
  if (t == "bf16") { PICK(bf16, __nv_bfloat16) }
  else if (t == "fp16") { PICK(fp16, __half) }
  std::fprintf(stderr, "no build for %s m%d n%d\n", t.c_str(), 8 * mt, 16 * nt);
  return 2;
}
