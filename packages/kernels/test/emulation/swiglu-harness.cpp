// Runs Lathe's SwiGLU kernels (swiglu.cu, the TypeScript source written out by the test) on the CPU
// through emu.h against y = silu(g)·u and its gradients computed in double from the same rounded
// inputs, and prints one JSON line.
// usage: swiglu-harness bf16|fp16|fp32 n
//        swiglu-harness packed bf16|fp16|fp32 rows I
// (packed: swiglu_packed on gu [rows, 2·I] against swiglu_fwd on the same gate and up held apart, byte for byte)
// (inputs ~ N(0, 3) with ±30 and ±100 mixed in, so σ saturates both ways; guards past every output must stay untouched)
#include "emu.h"
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <type_traits>

#define SWIGLU_EMULATION 1
inline uint4 swiglu_ld(const void* p) { uint4 r; std::memcpy(&r, p, 16); return r; }

#include "swiglu.cu"


struct Err {
  double max_err = 0, max_ref = 0, max_rel = 0;
  bool finite = true;
};

// max_rel: each element's error over the size of its terms (|reference|, or for dg, where
// 1 + g·(1 − s) cancels near g ≈ −1.28, |dy·u·s|·(1 + |g|·(1 − s))), at least 10⁻⁶ of the
// output's largest |reference| (values that underflow when σ saturates) and twice T's smallest normal
// (fp16's subnormals are spaced 2⁻²⁴ apart)
template <typename T>
static void compare(Err& e, const std::vector<T>& got, const std::vector<double>& ref, const std::vector<double>& scale) {
  const double tiny = std::is_same_v<T, __half> ? 2 * 0x1p-14 : 2 * 0x1p-126;
  for (double r : ref) e.max_ref = std::max(e.max_ref, std::abs(r));
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = std::abs(double(emu_to_float(got[i])) - ref[i]);
    if (!std::isfinite(emu_to_float(got[i]))) e.finite = false;
    e.max_err = std::max(e.max_err, d);
    e.max_rel = std::max(e.max_rel, d / std::max({std::abs(ref[i]), scale[i], 1e-6 * e.max_ref, tiny}));
  }
}

static void print(const char* name, const Err& e, bool last) {
  std::printf("\"%s\":{\"max_err\":%.6g,\"max_ref\":%.6g,\"max_rel\":%.6g,\"finite\":%s}%s", name, e.max_err, e.max_ref, e.max_rel, e.finite ? "true" : "false", last ? "" : ",");
}

template <typename T>
static void run(long n) {
  const int V = 16 / int(sizeof(T)), guard = 64;
  const int nvec = int(n / V), tail = int(n % V), items = nvec + tail;
  const T poison = emu_from_float<T>(12345.f);
  std::vector<T> g(n), u(n), dy(n), y(n + guard, poison), dg(n + guard, poison), du(n + guard, poison);
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.f, 3.f);
  const float extremes[] = {30.f, -30.f, 100.f, -100.f};
  for (long i = 0; i < n; ++i) {
    g[i] = emu_from_float<T>(i % 97 == 5 ? extremes[(i / 97) % 4] : nd(rng));
    u[i] = emu_from_float<T>(nd(rng));
    dy[i] = emu_from_float<T>(nd(rng));
  }
  const unsigned grid = unsigned((items + SWIGLU_THREADS - 1) / SWIGLU_THREADS);
  emu::launch({grid, 1, 1}, SWIGLU_THREADS, 0, [&] { swiglu_fwd<T>(g.data(), u.data(), y.data(), nvec, tail); });
  emu::launch({grid, 1, 1}, SWIGLU_THREADS, 0, [&] { swiglu_bwd<T>(dy.data(), g.data(), u.data(), dg.data(), du.data(), nvec, tail); });
  std::vector<double> ry(n), rg(n), ru(n), sg(n);
  for (long i = 0; i < n; ++i) {
    const double x = emu_to_float(g[i]), z = emu_to_float(u[i]), d = emu_to_float(dy[i]);
    const double s = 1 / (1 + std::exp(-x));
    ry[i] = x * s * z;
    ru[i] = d * x * s;
    rg[i] = d * z * s * (1 + x * (1 - s));
    sg[i] = std::abs(d * z * s) * (1 + std::abs(x) * (1 - s));
  }
  Err ey, eg, eu;
  compare(ey, y, ry, ry);
  compare(eg, dg, rg, sg);
  compare(eu, du, ru, ru);
  bool guard_ok = true;
  for (int i = 0; i < guard; ++i)
    for (auto* v : {&y, &dg, &du}) guard_ok = guard_ok && emu_to_float((*v)[n + i]) == emu_to_float(poison);
  std::printf("{\"items\":%d,\"tail\":%d,", items, tail);
  print("y", ey, false);
  print("dg", eg, false);
  print("du", eu, false);
  std::printf("\"guard_ok\":%s}\n", guard_ok ? "true" : "false");
}

// The packed forward (vectors when I is a multiple of V, else elements) against the forward on the same
// values: y identical, nothing written past y.
template <typename T>
static void run_packed(int rows, int I) {
  const int V = 16 / int(sizeof(T)), guard = 64;
  const long n = long(rows) * I;
  const bool vec = I % V == 0;
  const T poison = emu_from_float<T>(12345.f);
  std::vector<T> g(n), u(n), gu(2 * n), y(n + guard, poison), yp(n + guard, poison);
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.f, 3.f);
  for (long i = 0; i < n; ++i) {
    g[i] = emu_from_float<T>(i % 89 == 3 ? (i % 2 ? 40.f : -40.f) : nd(rng));
    u[i] = emu_from_float<T>(nd(rng));
    gu[(i / I) * 2 * I + i % I] = g[i];
    gu[(i / I) * 2 * I + I + i % I] = u[i];
  }
  const int nvec = int(n / V), tail = int(n % V);
  emu::launch({unsigned((nvec + tail + SWIGLU_THREADS - 1) / SWIGLU_THREADS), 1, 1}, SWIGLU_THREADS, 0, [&] { swiglu_fwd<T>(g.data(), u.data(), y.data(), nvec, tail); });
  const long threads = long(rows) * (vec ? I / V : I);
  emu::launch({unsigned((threads + SWIGLU_THREADS - 1) / SWIGLU_THREADS), 1, 1}, SWIGLU_THREADS, 0, [&] { swiglu_packed<T>(gu.data(), yp.data(), rows, I, vec ? 1 : 0); });
  double max_ref = 0;
  for (long i = 0; i < n; ++i) max_ref = std::max(max_ref, double(std::abs(emu_to_float(y[i]))));
  const bool equal = std::memcmp(y.data(), yp.data(), n * sizeof(T)) == 0;
  bool guard_ok = true;
  for (int i = 0; i < guard; ++i) guard_ok = guard_ok && emu_to_float(yp[n + i]) == emu_to_float(poison);
  std::printf("{\"vec\":%s,\"threads\":%ld,\"equal\":%s,\"max_ref\":%.6g,\"guard_ok\":%s}\n", vec ? "true" : "false", threads, equal ? "true" : "false", max_ref, guard_ok ? "true" : "false");
}

int main(int argc, char** argv) {
  if (argc >= 5 && std::string(argv[1]) == "packed") {
    const std::string dt = argv[2];
    const int rows = std::atoi(argv[3]), I = std::atoi(argv[4]);
    if (dt == "bf16") run_packed<__nv_bfloat16>(rows, I);
    else if (dt == "fp16") run_packed<__half>(rows, I);
    else run_packed<float>(rows, I);
    return 0;
  }
  if (argc < 3) { std::fprintf(stderr, "usage: %s bf16|fp16|fp32 n | packed bf16|fp16|fp32 rows I\n", argv[0]); return 2; }
  const std::string dt = argv[1];
  const long n = std::atol(argv[2]);
  if (dt == "bf16") run<__nv_bfloat16>(n);
  else if (dt == "fp16") run<__half>(n);
  else run<float>(n);
}
