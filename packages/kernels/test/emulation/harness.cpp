// Runs Lathe's flash-attention kernels (fa.cu, the TypeScript source written out by the test) on the
// CPU through emu.h, against attention computed in double precision, and prints one JSON line.
// usage: harness B S H KV D bf16|fp16 len0 len1 ...   (D: 64 or 128; one length per batch row)
#include "emu.h"
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include "fa.cu"
#include "fa_sizes.h"  // fa_fwd_smem(D), fa_bwd_smem(D): the launcher's sizes, written by the test


struct Err { double max_err = 0, max_ref = 0; bool pad_zero = true; };
static void note(Err& e, double got, double ref) { e.max_err = std::max(e.max_err, std::abs(got - ref)); e.max_ref = std::max(e.max_ref, std::abs(ref)); }
static std::string js(const char* name, const Err& e) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "\"%s\":{\"max_err\":%.6g,\"max_ref\":%.6g,\"pad_zero\":%s}", name, e.max_err, e.max_ref, e.pad_zero ? "true" : "false");
  return buf;
}

template <typename T, int D>
static void run(int B, int S, int H, int KV, const std::vector<int>& lens,
                void (*fwd)(const T*, const T*, const T*, const int*, T*, float*, int, int, int, float),
                void (*lsek)(const T*, const T*, const int*, float*, int, int, int, float),
                void (*pre)(const T*, const T*, const int*, float*, float*, int, int, int),
                void (*bwd)(const T*, const T*, const T*, const T*, const float*, const float*, const int*, float*, T*, T*, int, int, int, float),
                void (*dqk)(const float*, T*, long long)) {
  const int G = H / KV;
  const float scale = 1.0f / std::sqrt(float(D));
  std::mt19937 rng(1234);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  auto fill = [&](std::vector<T>& x, std::vector<double>& xd, size_t n, float amp) {
    x.resize(n); xd.resize(n);
    for (size_t i = 0; i < n; ++i) { x[i] = emu_from_float<T>(amp * u(rng)); xd[i] = emu_to_float(x[i]); }
  };
  std::vector<T> q, k, v, dO; std::vector<double> qd, kd, vd, dOd;
  fill(q, qd, size_t(B) * S * H * D, 2.0f);
  fill(k, kd, size_t(B) * S * KV * D, 2.0f);
  fill(v, vd, size_t(B) * S * KV * D, 1.0f);
  fill(dO, dOd, size_t(B) * S * H * D, 1.0f);
  std::vector<int> seqlens(B);
  for (int b = 0; b < B; ++b) seqlens[b] = lens[b] - 1;
  // the decoder zeroes outputs at padding, so their gradients are 0
  for (int b = 0; b < B; ++b) for (int i = lens[b]; i < S; ++i) for (int h = 0; h < H; ++h) for (int d = 0; d < D; ++d) {
    size_t at = ((size_t(b) * S + i) * H + h) * D + d; dO[at] = emu_from_float<T>(0.0f); dOd[at] = 0;
  }
  std::vector<T> o(size_t(B) * S * H * D, emu_from_float<T>(7.0f)), dq(q.size(), emu_from_float<T>(7.0f)), dk(k.size(), emu_from_float<T>(7.0f)), dv(v.size(), emu_from_float<T>(7.0f));
  std::vector<float> lse(size_t(B) * H * S, 7.0f), delta(lse.size(), 7.0f), dq_acc(q.size(), 7.0f);
  emu::launch({unsigned((S + BM - 1) / BM), unsigned(H), unsigned(B)}, THREADS, fa_fwd_smem(D), [&] { fwd(q.data(), k.data(), v.data(), seqlens.data(), o.data(), lse.data(), S, H, KV, scale); });
  std::vector<float> lse_only(lse.size(), 7.0f);
  emu::launch({unsigned((S + BM - 1) / BM), unsigned(H), unsigned(B)}, THREADS, fa_fwd_smem(D), [&] { lsek(q.data(), k.data(), seqlens.data(), lse_only.data(), S, H, KV, scale); });
  const bool lse_same = lse_only == lse;  // the log-sum-exp pass alone writes what the forward writes
  emu::launch({unsigned((size_t(B) * S * H + WARPS - 1) / WARPS), 1, 1}, THREADS, 0, [&] { pre(o.data(), dO.data(), seqlens.data(), delta.data(), dq_acc.data(), B, S, H); });
  emu::launch({unsigned((S + BN - 1) / BN), unsigned(KV), unsigned(B)}, THREADS, fa_bwd_smem(D), [&] { bwd(q.data(), k.data(), v.data(), dO.data(), lse.data(), delta.data(), seqlens.data(), dq_acc.data(), dk.data(), dv.data(), S, H, KV, scale); });
  emu::launch({4, 1, 1}, THREADS, 0, [&] { dqk(dq_acc.data(), dq.data(), (long long)dq.size()); });

  // Reference in double.
  Err eo, el, edq, edk, edv;
  std::vector<double> rdk(k.size(), 0.0), rdv(v.size(), 0.0);
  for (int b = 0; b < B; ++b) for (int h = 0; h < H; ++h) {
    const int kh = h / G;
    for (int i = 0; i < S; ++i) {
      const size_t qi = ((size_t(b) * S + i) * H + h) * D;
      if (i >= lens[b]) {
        for (int d = 0; d < D; ++d) if (emu_to_float(o[qi + d]) != 0.0f || emu_to_float(dq[qi + d]) != 0.0f) eo.pad_zero = false;
        if (lse[(size_t(b) * H + h) * S + i] != 0.0f) el.pad_zero = false;
        continue;
      }
      std::vector<double> s(i + 1), p(i + 1);
      double mx = -1e300;
      for (int j = 0; j <= i; ++j) {
        const size_t kj = ((size_t(b) * S + j) * KV + kh) * D;
        double acc = 0; for (int d = 0; d < D; ++d) acc += qd[qi + d] * kd[kj + d];
        s[j] = acc * scale; mx = std::max(mx, s[j]);
      }
      double sum = 0; for (int j = 0; j <= i; ++j) sum += std::exp(s[j] - mx);
      const double L = mx + std::log(sum);
      note(el, lse[(size_t(b) * H + h) * S + i], L);
      std::vector<double> out(D, 0.0);
      for (int j = 0; j <= i; ++j) { p[j] = std::exp(s[j] - L); const size_t kj = ((size_t(b) * S + j) * KV + kh) * D; for (int d = 0; d < D; ++d) out[d] += p[j] * vd[kj + d]; }
      for (int d = 0; d < D; ++d) note(eo, emu_to_float(o[qi + d]), out[d]);
      double Dr = 0; for (int d = 0; d < D; ++d) Dr += dOd[qi + d] * out[d];
      std::vector<double> rdq(D, 0.0);
      for (int j = 0; j <= i; ++j) {
        const size_t kj = ((size_t(b) * S + j) * KV + kh) * D;
        double dp = 0; for (int d = 0; d < D; ++d) dp += dOd[qi + d] * vd[kj + d];
        const double ds = p[j] * (dp - Dr);
        for (int d = 0; d < D; ++d) { rdq[d] += scale * ds * kd[kj + d]; rdk[kj + d] += scale * ds * qd[qi + d]; rdv[kj + d] += p[j] * dOd[qi + d]; }
      }
      for (int d = 0; d < D; ++d) note(edq, emu_to_float(dq[qi + d]), rdq[d]);
    }
  }
  for (int b = 0; b < B; ++b) for (int j = 0; j < S; ++j) for (int kh = 0; kh < KV; ++kh) for (int d = 0; d < D; ++d) {
    const size_t kj = ((size_t(b) * S + j) * KV + kh) * D + d;
    if (j >= lens[b]) { if (emu_to_float(dk[kj]) != 0.0f || emu_to_float(dv[kj]) != 0.0f) edk.pad_zero = false; continue; }
    note(edk, emu_to_float(dk[kj]), rdk[kj]);
    note(edv, emu_to_float(dv[kj]), rdv[kj]);
  }
  std::printf("{\"lse_only_equal\":%s,%s,%s,%s,%s,%s}\n", lse_same ? "true" : "false", js("o", eo).c_str(), js("lse", el).c_str(), js("dq", edq).c_str(), js("dk", edk).c_str(), js("dv", edv).c_str());
}

int main(int argc, char** argv) {
  if (argc < 8) { std::fprintf(stderr, "usage: harness B S H KV D bf16|fp16 len...\n"); return 2; }
  const int B = std::atoi(argv[1]), S = std::atoi(argv[2]), H = std::atoi(argv[3]), KV = std::atoi(argv[4]), D = std::atoi(argv[5]);
  const std::string t = argv[6];
  std::vector<int> lens;
  for (int i = 7; i < argc; ++i) lens.push_back(std::atoi(argv[i]));
  if (int(lens.size()) != B) { std::fprintf(stderr, "give one length per batch row\n"); return 2; }
#define RUN(SUF, T, DD) run<T, DD>(B, S, H, KV, lens, flash_fwd_##SUF##_d##DD, flash_lse_##SUF##_d##DD, flash_bwd_pre_##SUF##_d##DD, flash_bwd_##SUF##_d##DD, flash_bwd_dq_##SUF##_d##DD)
  if (t == "bf16" && D == 64) RUN(bf16, __nv_bfloat16, 64);
  else if (t == "bf16" && D == 128) RUN(bf16, __nv_bfloat16, 128);
  else if (t == "fp16" && D == 64) RUN(fp16, __half, 64);
  else if (t == "fp16" && D == 128) RUN(fp16, __half, 128);
  else { std::fprintf(stderr, "no build for %s d%d\n", t.c_str(), D); return 2; }
  return 0;
}
