// Runs Lathe's W4A16 kernels (w4.cu, the TypeScript source written out by the test) on the CPU through
// w4-emu.h. Reads the problem from a binary file and writes C's bits to another; the test compares them
// with its float64 reference.
// usage: harness IN OUT bf16|fp16 M N n1 n2 K kb bs_log2 has_zp mt nt warps [tile]
//   (tile: the tiled kernel of mt, nt — a CTA of 128 threads over a [16·mt, 32·nt] tile of C; warps is ignored)
// OUT: C0 [M, n1], C1 [M, n2 - n1], C2 [M, N - n2] (16-bit values), one after another
// IN: A (M·K 16-bit values), B (N·kb·bs/2 bytes), scales (N·kb 16-bit values), zero points (N·ceil(kb/2) bytes, if has_zp)
#include "w4-emu.h"
#include <fstream>
#include <string>
#include "w4.cu"

template <typename T>
static int run(const char* in, const char* out, int M, int N, int n1, int n2, int K, int kb, int bs_log2, bool has_zp, int mt, int nt, int warps,
               bool tile, void (*kernel)(const T*, const unsigned char*, const T*, const unsigned char*, T*, T*, T*, int, int, int, int, int, int, int)) {
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
  const int bn = tile ? 32 * nt : 16 * nt, bm = tile ? 16 * mt : 8 * mt;
  const dim3 grid{unsigned((N + bn - 1) / bn), unsigned((M + bm - 1) / bm), 1};
  const unsigned threads = tile ? 128u : unsigned(32 * warps);
  const size_t smem = tile ? size_t(W4T_STAGES) * (bm * 256 + bn * 64) : size_t(warps) * nt * mt * 128 * 4;
  emu::launch(grid, threads, smem, [&] { kernel(A.data(), B.data(), S.data(), has_zp ? Z.data() : nullptr, C0, n2 > n1 ? C1 : nullptr, N > n2 ? C2 : nullptr, M, N, n1, n2, K, kb, bs_log2); });
  std::ofstream o(out, std::ios::binary);
  o.write(reinterpret_cast<const char*>(C.data()), C.size() * 2);
  return o ? 0 : 2;
}

int main(int argc, char** argv) {
  if (argc != 15 && argc != 16) { std::fprintf(stderr, "usage: harness IN OUT bf16|fp16 M N n1 n2 K kb bs_log2 has_zp mt nt warps [tile]\n"); return 2; }
  const bool tile = argc == 16 && std::string(argv[15]) == "tile";
  const std::string t = argv[3];
  const int M = std::atoi(argv[4]), N = std::atoi(argv[5]), n1 = std::atoi(argv[6]), n2 = std::atoi(argv[7]), K = std::atoi(argv[8]), kb = std::atoi(argv[9]), bs_log2 = std::atoi(argv[10]);
  const bool zp = std::atoi(argv[11]) != 0;
  const int mt = std::atoi(argv[12]), nt = std::atoi(argv[13]), warps = std::atoi(argv[14]);
#define RUN(SUF, T, NAME) return run<T>(argv[1], argv[2], M, N, n1, n2, K, kb, bs_log2, zp, mt, nt, warps, tile, NAME)
#define PICK(SUF, T)                                                  \
  if (tile && mt == 4 && nt == 2) RUN(SUF, T, w4a16_##SUF##_tile_m64_n64);  \
  if (tile && mt == 2 && nt == 2) RUN(SUF, T, w4a16_##SUF##_tile_m32_n64);  \
  if (tile && mt == 2 && nt == 1) RUN(SUF, T, w4a16_##SUF##_tile_m32_n32);  \
  if (tile) goto none;                                                \
  if (nt == 1 && mt == 1) RUN(SUF, T, w4a16_##SUF##_m8);              \
  if (nt == 1 && mt == 2) RUN(SUF, T, w4a16_##SUF##_m16);             \
  if (nt == 1 && mt == 4) RUN(SUF, T, w4a16_##SUF##_m32);             \
  if (nt == 1 && mt == 8) RUN(SUF, T, w4a16_##SUF##_m64);             \
  if (nt == 2 && mt == 1) RUN(SUF, T, w4a16_##SUF##_m8_n32);          \
  if (nt == 2 && mt == 2) RUN(SUF, T, w4a16_##SUF##_m16_n32);
  if (t == "bf16") { PICK(bf16, __nv_bfloat16) }
  else if (t == "fp16") { PICK(fp16, __half) }
none:
  std::fprintf(stderr, "no build for %s m%d n%d%s\n", t.c_str(), 8 * mt, 16 * nt, tile ? " (tiled)" : "");
  return 2;
}
