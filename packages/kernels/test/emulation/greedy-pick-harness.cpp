// Runs Lathe's greedy-pick kernel (greedy-pick.cu, the TypeScript source written out by the test) on the
// CPU through emu.h against the first argmax and −log Σ e^(x − max) computed in double from the same
// rounded logits, and prints one JSON line. Build with -DGP_THREADS=n to emulate n-thread CTAs.
// usage: greedy-pick-harness bf16|fp16|fp32 V offset
// (offset: elements the logits start past a 16-byte boundary, so rows start unaligned; the rows are the
// kinds of `fill` below, in order; guards past both outputs must stay untouched)
#include "emu.h"
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <random>
#include <string>
#include <type_traits>

#define GP_EMULATION 1
#define __shared__ static  // blocks run one at a time, so a static local is the block's shared memory
inline uint4 gp_ld(const void* p) { uint4 r; std::memcpy(&r, p, 16); return r; }
inline int __float_as_int(float f) { int i; std::memcpy(&i, &f, 4); return i; }

#include "greedy-pick.cu"

constexpr int kRows = 9;
constexpr float kInf = std::numeric_limits<float>::infinity();

// Row r's logits (float, rounded to T by the caller):
// 0 random with the max tied at four places spread over head, vectors and tail; 1 all equal;
// 2 ±1e4 with −∞ every 5th and the max tied twice; 3 all −∞; 4 random with a NaN before the max;
// 5 +∞ twice; 6 random, the max only in the last element; 7 random (accidental ties in 16-bit types);
// 8 ±`huge` (near the type's largest finite value: differences overflow to −∞), the max tied twice.
static void fill(int r, std::vector<float>& x, std::mt19937& rng, float huge) {
  const int V = int(x.size());
  std::normal_distribution<float> nd(0.f, 3.f);
  std::uniform_real_distribution<float> big(-1e4f, 1e4f);
  for (auto& v : x) v = nd(rng);
  switch (r) {
    case 0: for (int j : {V - 1, V / 2 + 1, 9, 3}) if (j < V) x[j] = 40.f; break;
    case 1: for (auto& v : x) v = 1.5f; break;
    case 2:
      for (int j = 0; j < V; ++j) x[j] = j % 5 == 0 ? -kInf : big(rng);
      x[V / 3 | 1] = 1e4f;
      x[V - 2] = 1e4f;
      break;
    case 3: for (auto& v : x) v = -kInf; break;
    case 4: x[V / 4] = std::nanf(""); x[V / 2] = 50.f; break;
    case 5: x[V / 3] = kInf; x[V / 5] = kInf; break;
    case 6: x[V - 1] = 30.f; break;
    case 8:
      for (int j = 0; j < V; ++j) x[j] = j % 2 ? -huge : huge * 0.5f;
      x[V / 2] = huge;
      x[V - 1] = huge;
      break;
    default: break;
  }
}

// The first index whose value exceeds every earlier one (NaN never does; none above −∞: 0) and
// −log Σ e^(x − max) in double (NaN for no value above −∞, a NaN or a +∞ in the row).
static void reference(const std::vector<double>& x, long long& token, double& logprob) {
  double m = -kInf;
  long long t = -1;
  bool nan = false;
  for (size_t j = 0; j < x.size(); ++j) {
    if (std::isnan(x[j])) nan = true;
    else if (x[j] > m) { m = x[j]; t = (long long)j; }
  }
  token = t < 0 ? 0 : t;
  if (t < 0 || nan || std::isinf(m)) { logprob = std::nan(""); return; }
  double s = 0;
  for (double v : x) s += std::exp(v - m);
  logprob = -std::log(s);
}

template <typename T>
static void run(int V, int offset) {
  const int guard = 16;
  const size_t n = size_t(kRows) * V;
  std::vector<uint4> storage((n + offset) * sizeof(T) / 16 + 2);
  T* x = reinterpret_cast<T*>(storage.data()) + offset;
  std::vector<long long> tokens(kRows + guard, -7);
  std::vector<float> logprobs(kRows + guard, 12345.f);
  std::mt19937 rng(11);
  std::vector<std::vector<double>> rows(kRows);
  for (int r = 0; r < kRows; ++r) {
    std::vector<float> f(V);
    fill(r, f, rng, std::is_same_v<T, __half> ? 6e4f : 3e38f);
    for (int j = 0; j < V; ++j) {
      x[size_t(r) * V + j] = emu_from_float<T>(f[j]);
      rows[r].push_back(emu_to_float(x[size_t(r) * V + j]));
    }
  }
  emu::launch({kRows, 1, 1}, GP_THREADS, 0, [&] { greedy_pick<T>(x, tokens.data(), logprobs.data(), kRows, V); });
  bool tokens_ok = true, nan_ok = true, guard_ok = true;
  double max_err = 0;
  std::string got = "[", want = "[";
  for (int r = 0; r < kRows; ++r) {
    long long t;
    double lp;
    reference(rows[r], t, lp);
    tokens_ok = tokens_ok && tokens[r] == t;
    if (std::isnan(lp) || std::isnan(logprobs[r])) nan_ok = nan_ok && std::isnan(lp) && std::isnan(logprobs[r]);
    else max_err = std::max(max_err, std::abs(double(logprobs[r]) - lp));
    got += std::to_string(tokens[r]) + (r + 1 < kRows ? "," : "]");
    want += std::to_string(t) + (r + 1 < kRows ? "," : "]");
  }
  for (int i = kRows; i < kRows + guard; ++i) guard_ok = guard_ok && tokens[i] == -7 && logprobs[i] == 12345.f;
  std::printf("{\"threads\":%d,\"tokens\":%s,\"want\":%s,\"tokens_ok\":%s,\"max_err\":%.6g,\"nan_ok\":%s,\"guard_ok\":%s}\n", GP_THREADS, got.c_str(), want.c_str(),
              tokens_ok ? "true" : "false", max_err, nan_ok ? "true" : "false", guard_ok ? "true" : "false");
}

int main(int argc, char** argv) {
  if (argc < 4) { std::fprintf(stderr, "usage: %s bf16|fp16|fp32 V offset\n", argv[0]); return 2; }
  const std::string dt = argv[1];
  const int V = std::atoi(argv[2]), offset = std::atoi(argv[3]);
  if (dt == "bf16") run<__nv_bfloat16>(V, offset);
  else if (dt == "fp16") run<__half>(V, offset);
  else run<float>(V, offset);
}
