// Runs Lathe's fused cross-entropy kernels (ce.cu, the TypeScript source written out by the test) on the CPU
// through emu.h — the forward (log-sum-exp, target log-prob, entropy) and the backward (d logits) — against
// the same quantities computed in double from the same rounded logits, and prints one JSON line.
// usage: [CE_MASKED_ROWS=1] cross-entropy-harness bf16|fp16|fp32 ent(0|1) V temperature neginf(0|1) target0 target1 ...
// (one target per row; a target outside [0, V) is an ignored row, every row "x" means no targets at all;
// neginf sets every 7th logit of row 0 to −∞)
#include "emu.h"
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>

#define CE_EMULATION 1
#define __shared__ static  // blocks run one at a time, so a static local is the block's shared memory
inline uint4 ce_ld(const void* p) { uint4 r; std::memcpy(&r, p, 16); return r; }

#include "ce.cu"


// A row given as "x": when every row is, the kernels get no targets (null) and no g_logp.
constexpr long long kNoTarget = -(1ll << 62);
// CE_MASKED_ROWS: every 4th row from row 3 gets zero upstream gradients (a masked token).
static bool g_masked_rows = false;

struct Err { double max_err = 0, max_ref = 0; };
static void note(Err& e, double got, double ref) { e.max_err = std::max(e.max_err, std::abs(got - ref)); e.max_ref = std::max(e.max_ref, std::abs(ref)); }
static std::string js(const char* name, const Err& e) {
  char buf[200];
  std::snprintf(buf, sizeof buf, "\"%s\":{\"max_err\":%.6g,\"max_ref\":%.6g}", name, e.max_err, e.max_ref);
  return buf;
}

template <typename T>
static void run(bool ent, int V, float temp, bool neginf, const std::vector<long long>& targets) {
  const int R = int(targets.size());
  std::vector<T> x(size_t(R) * V), dx(size_t(R) * V, emu_from_float<T>(12345.f));
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.f, 3.f);
  for (size_t i = 0; i < x.size(); ++i) x[i] = emu_from_float<T>(nd(rng) + (i % 97 == 0 ? 9.f : 0.f));
  if (neginf) for (int j = 0; j < V; j += 7) x[j] = emu_from_float<T>(-INFINITY);
  std::vector<float> logp(R, -1.f), lse(R, -1.f), entropy(R, -1.f), g_logp(R), g_lse(R), g_ent(R);
  for (int r = 0; r < R; ++r) { g_logp[r] = nd(rng); g_lse[r] = nd(rng); g_ent[r] = nd(rng); }
  if (g_masked_rows) for (int r = 3; r < R; r += 4) g_logp[r] = g_lse[r] = g_ent[r] = 0.f;
  const bool none = std::all_of(targets.begin(), targets.end(), [](long long t) { return t == kNoTarget; });
  const long long* tp = none ? nullptr : targets.data();
  float* lp = none ? nullptr : logp.data();
  const float* glp = none ? nullptr : g_logp.data();
  const float inv_t = 1.f / temp;
  emu::launch({unsigned(R), 1, 1}, CE_THREADS, 0, [&] {
    if (ent) ce_fwd<T, true>(x.data(), tp, lp, lse.data(), entropy.data(), R, V, inv_t);
    else ce_fwd<T, false>(x.data(), tp, lp, lse.data(), nullptr, R, V, inv_t);
  });
  emu::launch({unsigned(R), 1, 1}, CE_THREADS, 0, [&] {
    if (ent) ce_bwd<T, true>(x.data(), tp, lse.data(), entropy.data(), glp, g_lse.data(), g_ent.data(), dx.data(), R, V, inv_t);
    else ce_bwd<T, false>(x.data(), tp, lse.data(), nullptr, glp, g_lse.data(), nullptr, dx.data(), R, V, inv_t);
  });
  Err e_lse, e_logp, e_ent, e_dx;
  bool ignored_zero = true;
  for (int r = 0; r < R; ++r) {
    const T* xr = x.data() + size_t(r) * V;
    double m = -INFINITY;
    for (int j = 0; j < V; ++j) m = std::max(m, double(emu_to_float(xr[j])) / temp);
    double s = 0, pz = 0;
    for (int j = 0; j < V; ++j) {
      const double z = double(emu_to_float(xr[j])) / temp, e = std::exp(z - m);
      s += e;
      if (e > 0) pz += e * (z - m);
    }
    const double L = m + std::log(s), H = std::log(s) - pz / s;
    note(e_lse, lse[r], L);
    if (ent) note(e_ent, entropy[r], H);
    const long long t = none ? -1 : targets[r];
    const bool valid = t >= 0 && t < V;
    if (valid) note(e_logp, logp[r], double(emu_to_float(xr[t])) / temp - L);
    else if (!none) ignored_zero = ignored_zero && logp[r] == 0.f;
    else ignored_zero = ignored_zero && logp[r] == -1.f;  // never written without targets
    const double gp = valid ? g_logp[r] : 0.0, gl = g_lse[r], gh = ent ? g_ent[r] : 0.0;
    for (int j = 0; j < V; ++j) {
      const double z = double(emu_to_float(xr[j])) / temp, p = std::exp(z - L);
      // d/dz of g_lse·lse + g_logp·(z_t − lse) + g_H·H, with dH/dz_j = −p_j·(log p_j + H)
      double dz = gl * p + gp * ((j == t ? 1.0 : 0.0) - p) - (p > 0 ? gh * p * (z - L + H) : 0.0);
      note(e_dx, emu_to_float(dx[size_t(r) * V + j]), dz / temp);
    }
  }
  std::printf("{%s,%s,%s,%s,\"ignored_zero\":%s}\n", js("lse", e_lse).c_str(), js("logp", e_logp).c_str(), js("entropy", e_ent).c_str(), js("dx", e_dx).c_str(), ignored_zero ? "true" : "false");
}

int main(int argc, char** argv) {
  if (argc < 7) { std::fprintf(stderr, "usage: %s bf16|fp16|fp32 ent V temperature neginf target...\n", argv[0]); return 2; }
  const std::string dt = argv[1];
  const bool ent = std::atoi(argv[2]) != 0;
  g_masked_rows = std::getenv("CE_MASKED_ROWS") != nullptr;
  const int V = std::atoi(argv[3]);
  const float temp = float(std::atof(argv[4]));
  const bool neginf = std::atoi(argv[5]) != 0;
  std::vector<long long> targets;
  for (int i = 6; i < argc; ++i) targets.push_back(std::string(argv[i]) == "x" ? kNoTarget : std::atoll(argv[i]));
  if (dt == "bf16") run<__nv_bfloat16>(ent, V, temp, neginf, targets);
  else if (dt == "fp16") run<__half>(ent, V, temp, neginf, targets);
  else run<float>(ent, V, temp, neginf, targets);
}
