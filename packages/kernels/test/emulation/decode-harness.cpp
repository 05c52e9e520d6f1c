// Runs Lathe's decode-attention kernels (da.cu, the TypeScript source's templates written out by the test)
// on the CPU through emu.h — append (QK-norm, RoPE, cache write or e4m3 quantization), the split-KV pass
// and the log-sum-exp merge — against the same step computed in double, the append again on q/k/v
// packed in one buffer (row strides (H + 2·KV)·D) against the first, byte for byte, and the split with the
// combine folded in against split + combine, byte for byte; prints one JSON line.
// usage: decode-harness R KV G D bf16|fp16 native|fp8 M qknorm(0|1) chunk elems unroll smem len0 len1 ...
// (chunk, elems a thread, passes in flight and shared bytes of the split as the TypeScript plans them: the harness
// checks chunk, elems and unroll against the templates it instantiates and launches with smem, so a short plan trips
// the emulator's guard; one length per row: the row's length after this step, the new token at len − 1)
#include "emu.h"
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <type_traits>

#define DA_EMULATION 1
#define DA_SHARED(name) unsigned char* name = emu::t_smem
struct alignas(8) uint2 { unsigned x, y; };
struct float2 { float x, y; };
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }

// e4m3 (bias 7, no infinities, ±448 largest) by bit arithmetic: round to nearest even, saturating.
static unsigned char e4m3_encode(float x) {
  const unsigned char sign = std::signbit(x) ? 0x80 : 0;
  const double a = std::fabs(double(x));
  if (std::isnan(x)) return 0x7f;
  if (a >= 448.0) return sign | 0x7e;
  if (a < std::ldexp(1.0, -6)) return sign | (unsigned char)std::nearbyint(a * 512.0);  // subnormal (8 → the smallest normal)
  int e;
  const double f = std::frexp(a, &e);  // a = f · 2^e, f in [0.5, 1)
  int E = e - 1 + 7;
  int m = int(std::nearbyint((2.0 * f - 1.0) * 8.0));
  if (m == 8) { m = 0; ++E; }
  if (E > 15 || (E == 15 && m == 7)) return sign | 0x7e;
  return sign | (unsigned char)((E << 3) | m);
}
static float e4m3_decode(unsigned char b) {
  const int E = (b >> 3) & 15, m = b & 7;
  const double v = E == 0 ? m * std::ldexp(1.0, -9) : (1.0 + m / 8.0) * std::ldexp(1.0, E - 7);
  return float(b & 0x80 ? -v : v);
}
inline unsigned char fp8_from(float x) { return e4m3_encode(x); }
inline float2 fp8x2_to(unsigned short v) { return {e4m3_decode((unsigned char)(v & 0xff)), e4m3_decode((unsigned char)(v >> 8))}; }

#include "da.cu"

template <typename T> double rnd(double x) { return emu_to_float(emu_from_float<T>(float(x))); }

struct Err { double max_err = 0, max_ref = 0; };
static void note(Err& e, double got, double ref) { e.max_err = std::max(e.max_err, std::abs(got - ref)); e.max_ref = std::max(e.max_ref, std::abs(ref)); }
static std::string js(const char* name, const Err& e) {
  char buf[200];
  std::snprintf(buf, sizeof buf, "\"%s\":{\"max_err\":%.6g,\"max_ref\":%.6g}", name, e.max_err, e.max_ref);
  return buf;
}

// The split's template arguments for a cache element and group (the TypeScript decodeSplitPlan's rule).
template <typename C, int G> constexpr int split_chunk = sizeof(C) == 1 ? (G <= 4 ? 512 : 256) : (G <= 4 ? 256 : 128);
template <typename C, int G> constexpr int split_elems = 8;
template <typename C, int G> constexpr int split_unroll = sizeof(C) == 1 && G <= 4 ? 8 : 4;

struct Split { int chunk, elems, unroll; size_t smem; };

template <typename T, typename C, int D, int G>
static void run(int R, int KV, int M, bool qknorm, const Split& split, const std::vector<int>& lens) {
  constexpr bool FP8 = sizeof(C) == 1;
  constexpr int CHUNK = split_chunk<C, G>, E = split_elems<C, G>, U = split_unroll<C, G>;
  if (split.chunk != CHUNK || split.elems != E || split.unroll != U) {
    std::fprintf(stderr, "decode-harness: the plan says chunk %d, %d elements, unroll %d; the templates have %d, %d, %d\n", split.chunk, split.elems, split.unroll, CHUNK, E, U);
    std::exit(2);
  }
  const int H = KV * G, HALF = D / 2, NC = (M + CHUNK - 1) / CHUNK;
  const float eps = 1e-6f, scale = 1.0f / std::sqrt(float(D));
  std::mt19937 rng(4321);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  auto fill = [&](std::vector<T>& x, size_t n, float amp, float off = 0) { x.resize(n); for (auto& e : x) e = emu_from_float<T>(off + amp * u(rng)); };
  std::vector<T> q, k, v, cosT, sinT, qn, kn;
  fill(q, size_t(R) * H * D, 2.0f);
  fill(k, size_t(R) * KV * D, 2.0f);
  fill(v, size_t(R) * KV * D, 1.0f);
  fill(qn, D, 0.5f, 1.0f);
  fill(kn, D, 0.5f, 1.0f);
  cosT.resize(size_t(M) * HALF); sinT.resize(size_t(M) * HALF);
  for (int p = 0; p < M; ++p) for (int i = 0; i < HALF; ++i) { const double a = p / std::pow(10000.0, 2.0 * i / D); cosT[p * HALF + i] = emu_from_float<T>(float(std::cos(a))); sinT[p * HALF + i] = emu_from_float<T>(float(std::sin(a))); }
  // The cache: random past entries (a fp8 cache quantized per vector, as the kernels write it).
  const size_t vecs = size_t(R) * KV * M;
  std::vector<C> ck(vecs * D), cv(vecs * D);
  std::vector<float> ks(vecs, 1.0f), vs(vecs, 1.0f);
  auto quant = [&](const std::vector<double>& x, C* out, float* sc) {
    if constexpr (FP8) {
      double amax = 0; for (double e : x) amax = std::max(amax, std::abs(e));
      const float a = float(amax), inv = a > 0 ? 448.0f / a : 0.0f;
      for (int d = 0; d < D; ++d) out[d] = e4m3_encode(float(x[d]) * inv);
      *sc = a / 448.0f;
    } else { for (int d = 0; d < D; ++d) out[d] = emu_from_float<T>(float(x[d])); }
  };
  auto dequant = [&](const C* x, float sc, int d) -> double { if constexpr (FP8) return double(e4m3_decode(x[d])) * sc; else return emu_to_float(x[d]); };
  std::vector<T> pastK(vecs * D);
  for (size_t i = 0; i < vecs; ++i) {
    std::vector<double> a(D), b(D);
    for (int d = 0; d < D; ++d) { a[d] = rnd<T>(2.0f * u(rng)); b[d] = rnd<T>(u(rng)); pastK[i * D + d] = emu_from_float<T>(float(a[d])); }
    quant(a, &ck[i * D], &ks[i]);
    quant(b, &cv[i * D], &vs[i]);
  }
  // The prefill's quantize kernel on the first vectors of the key cache: the same bytes and scales as the harness's rule.
  bool quantize_equal = true;
  if constexpr (FP8) {
    const long long n = std::min<long long>(64, (long long)vecs);
    std::vector<unsigned char> qb(n * D, 0xff);
    std::vector<float> qs(n, -1.0f);
    emu::launch({unsigned((n + 3) / 4), 1, 1}, DA_THREADS, 0, [&] { da_quantize<T, D>(pastK.data(), qb.data(), qs.data(), n); });
    for (long long i = 0; i < n; ++i) {
      quantize_equal = quantize_equal && qs[i] == ks[i];
      for (int d = 0; d < D; ++d) quantize_equal = quantize_equal && qb[i * D + d] == ck[i * D + d];
    }
  }
  const std::vector<C> ck0 = ck, cv0 = cv;
  const std::vector<float> ks0 = ks, vs0 = vs;
  std::vector<int> seqlens(R);
  for (int r = 0; r < R; ++r) seqlens[r] = lens[r] - 1;
  std::vector<float> qrot(size_t(R) * H * D, -7.0f), opart(size_t(R) * H * NC * D, -7.0f), lsepart(size_t(R) * H * NC, -7.0f);
  std::vector<T> out(size_t(R) * H * D, emu_from_float<T>(-7.0f));

  emu::launch({unsigned(R), unsigned(KV), 1}, D, 4 * (D + 32), [&] {
    da_append<T, C, D>(q.data(), k.data(), v.data(), ck.data(), cv.data(), ks.data(), vs.data(), seqlens.data(), cosT.data(), sinT.data(), qknorm ? qn.data() : nullptr, qknorm ? kn.data() : nullptr, eps, qrot.data(), M, H, KV, H * D, KV * D);
  });
  // The same append reading q, k and v as column ranges of one packed [R, (H + 2·KV)·D] projection
  // through its row strides: the same cache bytes, scales and rotated queries, bit for bit.
  bool packed_equal = true;
  {
    const int W = (H + 2 * KV) * D;
    std::vector<T> qkv(size_t(R) * W);
    for (int r = 0; r < R; ++r) {
      std::copy_n(&q[size_t(r) * H * D], H * D, &qkv[size_t(r) * W]);
      std::copy_n(&k[size_t(r) * KV * D], KV * D, &qkv[size_t(r) * W + H * D]);
      std::copy_n(&v[size_t(r) * KV * D], KV * D, &qkv[size_t(r) * W + (H + KV) * D]);
    }
    std::vector<C> pk = ck0, pv = cv0;
    std::vector<float> pks = ks0, pvs = vs0, pq(qrot.size(), -7.0f);
    emu::launch({unsigned(R), unsigned(KV), 1}, D, 4 * (D + 32), [&] {
      da_append<T, C, D>(qkv.data(), qkv.data() + H * D, qkv.data() + (H + KV) * D, pk.data(), pv.data(), pks.data(), pvs.data(), seqlens.data(), cosT.data(), sinT.data(), qknorm ? qn.data() : nullptr, qknorm ? kn.data() : nullptr, eps, pq.data(), M, H, KV, W, W);
    });
    auto same = [](const auto& a, const auto& b) { return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(a[0])) == 0; };
    packed_equal = same(pk, ck) && same(pv, cv) && same(pks, ks) && same(pvs, vs) && same(pq, qrot);
  }
  emu::launch({unsigned(NC), unsigned(KV), unsigned(R)}, DA_THREADS, split.smem, [&] {
    da_split<C, D, G, CHUNK, E, float, false, U>(qrot.data(), ck.data(), cv.data(), ks.data(), vs.data(), seqlens.data(), opart.data(), lsepart.data(), M, KV, NC, scale);
  });
  emu::launch({unsigned(R * H), 1, 1}, D, 0, [&] { da_combine<T, D, CHUNK>(opart.data(), lsepart.data(), seqlens.data(), out.data(), M, H, NC); });

  // The split with the combine folded in, twice on the same counters (in launch order, then in reverse
  // with four CTAs at a time): the separate kernels' output bit for bit, every counter back to 0, and
  // each (row, KV head)'s adds returning 0, 1, …, chunks − 1 once each (exactly one CTA sees itself last).
  bool fused_equal = true, counters_zero = true, counts_exact = true;
  {
    std::vector<int> counters(size_t(R) * KV, 0);
    for (int pass = 0; pass < 2; ++pass) {
      std::vector<float> op(opart.size(), -7.0f), lp(lsepart.size(), -7.0f);
      std::vector<T> fo(out.size(), emu_from_float<T>(-7.0f));
      emu::atomic_log.clear();
      auto kernel = [&] { da_split<C, D, G, CHUNK, E, T, true, U>(qrot.data(), ck.data(), cv.data(), ks.data(), vs.data(), seqlens.data(), op.data(), lp.data(), M, KV, NC, scale, fo.data(), counters.data()); };
      if (pass == 0) emu::launch({unsigned(NC), unsigned(KV), unsigned(R)}, DA_THREADS, split.smem, kernel);
      else emu::launch_concurrent({unsigned(NC), unsigned(KV), unsigned(R)}, DA_THREADS, split.smem, 4, kernel);
      fused_equal = fused_equal && std::memcmp(fo.data(), out.data(), out.size() * sizeof(T)) == 0;
      for (int c : counters) counters_zero = counters_zero && c == 0;
      std::vector<std::vector<int>> seen(counters.size());
      for (const auto& [p, old] : emu::atomic_log) seen[p - counters.data()].push_back(old);
      for (int r = 0; r < R; ++r)
        for (int h = 0; h < KV; ++h) {
          std::vector<int>& got = seen[size_t(r) * KV + h];
          std::sort(got.begin(), got.end());
          const int want = (std::max(0, std::min(lens[r], M)) + CHUNK - 1) / CHUNK;
          counts_exact = counts_exact && int(got.size()) == want;
          for (int i = 0; i < int(got.size()); ++i) counts_exact = counts_exact && got[i] == i;
        }
    }
  }

  // The same step in double, rounded to T where the kernels keep T values.
  Err eo, eq, ek, ev;
  bool untouched = true;
  for (int r = 0; r < R; ++r) {
    const int pos = seqlens[r];
    if (pos < 0) continue;  // a row of length 0: nothing appended, its output 0 (the fused check compares it)
    for (int h = 0; h < KV; ++h) {
      auto prep = [&](const T* x, const T* w) {
        std::vector<double> y(D), z(D);
        double ss = 0;
        for (int d = 0; d < D; ++d) { y[d] = emu_to_float(x[d]); ss += y[d] * y[d]; }
        if (qknorm) for (int d = 0; d < D; ++d) y[d] = rnd<T>(y[d] / std::sqrt(ss / D + eps) * emu_to_float(w[d]));
        for (int d = 0; d < D; ++d) {
          const double c = emu_to_float(cosT[pos * HALF + d % HALF]), s = emu_to_float(sinT[pos * HALF + d % HALF]);
          z[d] = rnd<T>(d < HALF ? y[d] * c - y[d + HALF] * s : y[d] * c + y[d - HALF] * s);
        }
        return z;
      };
      const size_t vec = (size_t(r) * KV + h) * M;
      const std::vector<double> kr = prep(&k[(size_t(r) * KV + h) * D], kn.data());
      std::vector<double> vr(D);
      for (int d = 0; d < D; ++d) vr[d] = emu_to_float(v[(size_t(r) * KV + h) * D + d]);
      // The new entry, and every other position untouched.
      std::vector<C> kq(D), vq(D);
      float ksc = 1, vsc = 1;
      quant(kr, kq.data(), &ksc);
      quant(vr, vq.data(), &vsc);
      for (int d = 0; d < D; ++d) {
        note(ek, dequant(&ck[(vec + pos) * D], ks[vec + pos], d), kr[d]);
        note(ev, dequant(&cv[(vec + pos) * D], vs[vec + pos], d), vr[d]);
      }
      for (int p = 0; p < M; ++p) {
        if (p == pos) continue;
        for (int d = 0; d < D; ++d) untouched = untouched && std::memcmp(&ck[(vec + p) * D + d], &ck0[(vec + p) * D + d], sizeof(C)) == 0 && std::memcmp(&cv[(vec + p) * D + d], &cv0[(vec + p) * D + d], sizeof(C)) == 0;
      }
      for (int g = 0; g < G; ++g) {
        const int hq = h * G + g;
        const std::vector<double> qr = prep(&q[(size_t(r) * H + hq) * D], qn.data());
        for (int d = 0; d < D; ++d) note(eq, qrot[(size_t(r) * H + hq) * D + d], qr[d]);
        // Attention over positions 0..pos: the past as stored, the new entry as the reference quantized it.
        std::vector<double> s(pos + 1);
        double mx = -1e300;
        for (int p = 0; p <= pos; ++p) {
          double a = 0;
          for (int d = 0; d < D; ++d) a += qr[d] * (p == pos ? dequant(kq.data(), ksc, d) : dequant(&ck[(vec + p) * D], ks[vec + p], d));
          s[p] = a * scale;
          mx = std::max(mx, s[p]);
        }
        double den = 0;
        for (int p = 0; p <= pos; ++p) den += std::exp(s[p] - mx);
        for (int d = 0; d < D; ++d) {
          double o = 0;
          for (int p = 0; p <= pos; ++p) o += std::exp(s[p] - mx) / den * (p == pos ? dequant(vq.data(), vsc, d) : dequant(&cv[(vec + p) * D], vs[vec + p], d));
          note(eo, emu_to_float(out[(size_t(r) * H + hq) * D + d]), o);
        }
      }
    }
  }
  std::printf("{%s,%s,%s,%s,\"untouched\":%s,\"quantize_equal\":%s,\"packed_equal\":%s,\"fused_equal\":%s,\"counters_zero\":%s,\"counts_exact\":%s,\"chunks\":%d}\n", js("out", eo).c_str(), js("q", eq).c_str(), js("k_new", ek).c_str(), js("v_new", ev).c_str(), untouched ? "true" : "false", quantize_equal ? "true" : "false", packed_equal ? "true" : "false", fused_equal ? "true" : "false", counters_zero ? "true" : "false", counts_exact ? "true" : "false", NC);
}

// bf16 has a build for every head size and power-of-two group, and 128/3, 5, 6, 7 and 64/3, 6; fp16 for 128/2 and 64/4 (the types share the split's code).
template <typename T, typename C>
static void dispatch(int R, int KV, int G, int D, int M, bool qknorm, const Split& split, const std::vector<int>& lens) {
  if (D == 128 && G == 2) return run<T, C, 128, 2>(R, KV, M, qknorm, split, lens);
  if (D == 64 && G == 4) return run<T, C, 64, 4>(R, KV, M, qknorm, split, lens);
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    if (D == 128 && G == 1) return run<T, C, 128, 1>(R, KV, M, qknorm, split, lens);
    if (D == 128 && G == 4) return run<T, C, 128, 4>(R, KV, M, qknorm, split, lens);
    if (D == 128 && G == 8) return run<T, C, 128, 8>(R, KV, M, qknorm, split, lens);
    if (D == 64 && G == 1) return run<T, C, 64, 1>(R, KV, M, qknorm, split, lens);
    if (D == 64 && G == 2) return run<T, C, 64, 2>(R, KV, M, qknorm, split, lens);
    if (D == 64 && G == 8) return run<T, C, 64, 8>(R, KV, M, qknorm, split, lens);
    // groups that are not a power of two: every one at 128, one a side of the e4m3 plan's G 4 switch at 64
    if (D == 128 && G == 3) return run<T, C, 128, 3>(R, KV, M, qknorm, split, lens);
    if (D == 128 && G == 5) return run<T, C, 128, 5>(R, KV, M, qknorm, split, lens);
    if (D == 128 && G == 6) return run<T, C, 128, 6>(R, KV, M, qknorm, split, lens);
    if (D == 128 && G == 7) return run<T, C, 128, 7>(R, KV, M, qknorm, split, lens);
    if (D == 64 && G == 3) return run<T, C, 64, 3>(R, KV, M, qknorm, split, lens);
    if (D == 64 && G == 6) return run<T, C, 64, 6>(R, KV, M, qknorm, split, lens);
  }
  std::fprintf(stderr, "decode-harness: no build for D %d, G %d\n", D, G);
  std::exit(2);
}

int main(int argc, char** argv) {
  if (argc < 14) { std::fprintf(stderr, "usage: decode-harness R KV G D bf16|fp16 native|fp8 M qknorm chunk elems unroll smem len...\n"); return 2; }
  const int R = std::atoi(argv[1]), KV = std::atoi(argv[2]), G = std::atoi(argv[3]), D = std::atoi(argv[4]), M = std::atoi(argv[7]);
  const std::string dt = argv[5], cache = argv[6];
  const bool qknorm = std::atoi(argv[8]) != 0;
  const Split split{std::atoi(argv[9]), std::atoi(argv[10]), std::atoi(argv[11]), size_t(std::atoll(argv[12]))};
  std::vector<int> lens;
  for (int i = 13; i < argc; ++i) lens.push_back(std::atoi(argv[i]));
  if (int(lens.size()) != R) { std::fprintf(stderr, "decode-harness: %zu lengths for %d rows\n", lens.size(), R); return 2; }
  if (dt == "bf16") cache == "fp8" ? dispatch<__nv_bfloat16, unsigned char>(R, KV, G, D, M, qknorm, split, lens) : dispatch<__nv_bfloat16, __nv_bfloat16>(R, KV, G, D, M, qknorm, split, lens);
  else cache == "fp8" ? dispatch<__half, unsigned char>(R, KV, G, D, M, qknorm, split, lens) : dispatch<__half, __half>(R, KV, G, D, M, qknorm, split, lens);
  return 0;
}
