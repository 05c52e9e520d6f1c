// Runs Lathe's RoPE kernel (rope.cu, the TypeScript source written out by the test) on the CPU through
// emu.h against the rotation computed in double from the same rounded inputs, and prints one JSON line.
// usage: rope-harness bf16|fp16|fp32 rows heads headDim maxPositions sign(1|-1)
// (position ids cycle through −2 … maxPositions + 1, so both clamps are hit; a guard past y must stay untouched)
#include "emu.h"
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>

#define ROPE_EMULATION 1
inline uint4 rope_ld_stream(const void* p) { uint4 r; std::memcpy(&r, p, 16); return r; }
inline uint4 rope_ld_cache(const void* p) { uint4 r; std::memcpy(&r, p, 16); return r; }

#include "rope.cu"


template <typename T>
static void run(int rows, int heads, int hd, int max_pos, float sgn) {
  const int half = hd / 2, V = 16 / int(sizeof(T)), guard = 64;
  const size_t n = size_t(rows) * heads * hd;
  std::vector<T> x(n), y(n + guard, emu_from_float<T>(12345.f)), cs(size_t(max_pos) * half), sn(size_t(max_pos) * half);
  std::vector<long long> pos(rows);
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.f, 2.f);
  for (auto& v : x) v = emu_from_float<T>(nd(rng));
  for (int p = 0; p < max_pos; ++p)
    for (int i = 0; i < half; ++i) {
      const double a = p * std::pow(10000.0, -2.0 * i / hd);
      cs[size_t(p) * half + i] = emu_from_float<T>(float(std::cos(a)));
      sn[size_t(p) * half + i] = emu_from_float<T>(float(std::sin(a)));
    }
  for (int r = 0; r < rows; ++r) pos[r] = (r * 5) % (max_pos + 4) - 2;
  const int items = rows * heads * (half / V);
  emu::launch({unsigned((items + ROPE_THREADS - 1) / ROPE_THREADS), 1, 1}, ROPE_THREADS, 0, [&] {
    rope_kernel<T>(x.data(), pos.data(), cs.data(), sn.data(), y.data(), items, heads, half, max_pos, sgn);
  });
  double max_err = 0, max_ref = 0;
  for (int r = 0; r < rows; ++r) {
    const long long p = std::min<long long>(std::max<long long>(pos[r], 0), max_pos - 1);
    for (int h = 0; h < heads; ++h)
      for (int i = 0; i < half; ++i) {
        const size_t o = (size_t(r) * heads + h) * hd;
        const double c = emu_to_float(cs[size_t(p) * half + i]), s = sgn * double(emu_to_float(sn[size_t(p) * half + i]));
        const double x1 = emu_to_float(x[o + i]), x2 = emu_to_float(x[o + i + half]);
        const double r1 = x1 * c - x2 * s, r2 = x2 * c + x1 * s;
        max_err = std::max({max_err, std::abs(emu_to_float(y[o + i]) - r1), std::abs(emu_to_float(y[o + i + half]) - r2)});
        max_ref = std::max({max_ref, std::abs(r1), std::abs(r2)});
      }
  }
  bool guard_ok = true;
  for (int i = 0; i < guard; ++i) guard_ok = guard_ok && emu_to_float(y[n + i]) == emu_to_float(emu_from_float<T>(12345.f));
  std::printf("{\"max_err\":%.6g,\"max_ref\":%.6g,\"items\":%d,\"guard_ok\":%s}\n", max_err, max_ref, items, guard_ok ? "true" : "false");
}

int main(int argc, char** argv) {
  if (argc < 7) { std::fprintf(stderr, "usage: %s bf16|fp16|fp32 rows heads headDim maxPositions sign\n", argv[0]); return 2; }
  const std::string dt = argv[1];
  const int rows = std::atoi(argv[2]), heads = std::atoi(argv[3]), hd = std::atoi(argv[4]), max_pos = std::atoi(argv[5]);
  const float sgn = float(std::atof(argv[6]));
  if (dt == "bf16") run<__nv_bfloat16>(rows, heads, hd, max_pos, sgn);
  else if (dt == "fp16") run<__half>(rows, heads, hd, max_pos, sgn);
  else run<float>(rows, heads, hd, max_pos, sgn);
}
