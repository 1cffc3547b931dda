// Batch-invariant matrix-vector kernels for CPU (AVX2 + FMA; AVX-512 where the CPU has it, same bits).
//
// y[m, n] = sum_k x[m, k] * w[n, k], where every (m, n) is reduced in ONE fixed order that depends
// on K only: two 8-lane accumulators over alternating 8-wide chunks of k, combined lane by lane, then
// the 8 lanes summed pairwise, then the K % 16 tail added one by one with fma. Nothing in that order
// depends on M (how many rows are computed together), on which rows they are, or on the thread that
// computes them, so the row a K+1-token verification produces is bit for bit the row a one-token
// decode step produces. BLAS libraries do not promise that (their M=1 path is a gemv with another
// reduction order than their gemm), which is why this file exists.
//
// Weights are read once per output column for all rows, so the cost stays that of streaming the
// weights (memory bound) for the small M of decoding and verification.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <omp.h>
#include <cstdint>
#include <cstring>
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

// Functions that use AVX-512 carry it as a target attribute (the file is built for AVX2), and run
// only after has_avx512() said yes.
#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))

#include "host.h"
#include "split.h"

namespace {

bool has_avx512() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
}

// The address `bytes` past `p`, for a prefetch only: it may lie past the end of the buffer (a
// prefetch never faults), where pointer arithmetic past the end would be undefined, so it is
// computed as an integer.
inline const char* ahead(const void* p, int64_t bytes) {
  return reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(p) + static_cast<uintptr_t>(bytes));
}

inline float hsum8(__m256 v) {
  // Fixed pairwise order: (0+4, 1+5, 2+6, 3+7), then (a+c, b+d), then (e+f).
  __m128 lo = _mm256_castps256_ps128(v);
  __m128 hi = _mm256_extractf128_ps(v, 1);
  __m128 s = _mm_add_ps(lo, hi);
  __m128 sh = _mm_movehl_ps(s, s);
  s = _mm_add_ps(s, sh);
  sh = _mm_shuffle_ps(s, s, 0x1);
  s = _mm_add_ss(s, sh);
  return _mm_cvtss_f32(s);
}

// Weight readers: give the 16 weights at (n, k..k+15) as two 8-lane float vectors, and one weight
// as a float for the K % 16 tail. The arithmetic that follows is the same for every format.
struct F32W {
  const float* w;
  int64_t K;
  inline void load16(int64_t n, int64_t k, __m256& w0, __m256& w1) const {
    const float* p = w + n * K + k;
    w0 = _mm256_loadu_ps(p);
    w1 = _mm256_loadu_ps(p + 8);
  }
  inline float at(int64_t n, int64_t k) const { return w[n * K + k]; }
  inline float out_scale(int64_t) const { return 1.0f; }
  AVX512 inline __m512 load16z(int64_t n, int64_t k) const { return _mm512_loadu_ps(w + n * K + k); }
};

inline __m256 bf16x8(const uint16_t* p) {
  __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

struct BF16W {
  const uint16_t* w;
  int64_t K;
  inline void load16(int64_t n, int64_t k, __m256& w0, __m256& w1) const {
    const uint16_t* p = w + n * K + k;
    w0 = bf16x8(p);
    w1 = bf16x8(p + 8);
  }
  inline float at(int64_t n, int64_t k) const {
    uint32_t b = static_cast<uint32_t>(w[n * K + k]) << 16;
    float f;
    std::memcpy(&f, &b, 4);
    return f;
  }
  inline float out_scale(int64_t) const { return 1.0f; }
  AVX512 inline __m512 load16z(int64_t n, int64_t k) const {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + n * K + k));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
};

inline __m256 i8x8(const int8_t* p) {
  __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
}

// int8 codes, one scale per output row applied to the finished sum (symmetric quantization).
struct I8W {
  const int8_t* w;
  const float* scale;
  int64_t K;
  inline void load16(int64_t n, int64_t k, __m256& w0, __m256& w1) const {
    const int8_t* p = w + n * K + k;
    w0 = i8x8(p);
    w1 = i8x8(p + 8);
  }
  inline float at(int64_t n, int64_t k) const { return static_cast<float>(w[n * K + k]); }
  inline float out_scale(int64_t n) const { return scale[n]; }
  AVX512 inline __m512 load16z(int64_t n, int64_t k) const {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + n * K + k));
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b));
  }
};

// int4 codes, two per byte (see harness/invariant.py: _pack_int4), dequantized per group as
// code * scale + offset before the multiply, so groups need no separate sums. K % 16 == 0.
struct I4W {
  const uint8_t* w;
  const float* scale;   // [N, K / group]
  const float* offset;  // [N, K / group]
  int64_t K, group;
  inline void load16(int64_t n, int64_t k, __m256& w0, __m256& w1) const {
    const uint8_t* p = w + n * (K / 2) + k / 2;
    __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    const int64_t g = n * (K / group) + k / group;
    const __m256 s = _mm256_set1_ps(scale[g]);
    const __m256 o = _mm256_set1_ps(offset[g]);
    w0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(v, _mm256_set1_epi32(15))), s, o);
    w1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(v, 4)), s, o);
  }
  inline float at(int64_t, int64_t) const { return 0.0f; }  // never called: K % 16 == 0
  inline float out_scale(int64_t) const { return 1.0f; }
  // Lanes 0-7 take the low nibbles (k..k+7), lanes 8-15 the high ones (k+8..k+15), as w0 and w1.
  AVX512 inline __m512 load16z(int64_t n, int64_t k) const {
    uint64_t b;
    std::memcpy(&b, w + n * (K / 2) + k / 2, 8);
    constexpr uint64_t low = 0x0F0F0F0F0F0F0F0FULL;
    const __m128i codes = _mm_set_epi64x(static_cast<int64_t>((b >> 4) & low), static_cast<int64_t>(b & low));
    const int64_t g = n * (K / group) + k / group;
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(codes)), _mm512_set1_ps(scale[g]),
                           _mm512_set1_ps(offset[g]));
  }
};

constexpr int RB = 4;  // rows per block: 8 accumulators + 2 weight registers + row loads fit 16 ymm

// One (m-block, n) cell: rows m0 .. m0+rows-1 of column n, in the fixed order described above.
template <typename W>
inline void cell(const float* x, const W& w, float* y, int64_t m0, int64_t rows, int64_t n, int64_t N,
                 int64_t K) {
  const int64_t K16 = K - K % 16;
  __m256 a0[RB], a1[RB];
  for (int r = 0; r < RB; ++r) { a0[r] = _mm256_setzero_ps(); a1[r] = _mm256_setzero_ps(); }
  for (int64_t k = 0; k < K16; k += 16) {
    __m256 w0, w1;
    w.load16(n, k, w0, w1);
    for (int r = 0; r < rows; ++r) {
      const float* xr = x + (m0 + r) * K + k;
      a0[r] = _mm256_fmadd_ps(_mm256_loadu_ps(xr), w0, a0[r]);
      a1[r] = _mm256_fmadd_ps(_mm256_loadu_ps(xr + 8), w1, a1[r]);
    }
  }
  for (int r = 0; r < rows; ++r) {
    float s = hsum8(_mm256_add_ps(a0[r], a1[r]));
    const float* xr = x + (m0 + r) * K;
    for (int64_t k = K16; k < K; ++k) s = std::fma(xr[k], w.at(n, k), s);
    y[(m0 + r) * N + n] = s * w.out_scale(n);
  }
}

// Columns in chunks of NC, rows in blocks of RB inside a chunk: for a long prompt (prefill) the
// chunk's weights stay in cache while every row block passes over them, instead of all rows being
// streamed again for every column. Only the visiting order changes; every cell is computed alike.
constexpr int64_t NC = 32;

// 32 weights as two 16-lane vectors; a reader with a cheaper way to read two runs at once (int4)
// overloads this.
template <typename W>
AVX512 inline void load32z(const W& w, int64_t n, int64_t k, __m512& w0, __m512& w1) {
  w0 = w.load16z(n, k);
  w1 = w.load16z(n, k + 16);
}

// Two runs of 16 codes are 16 bytes: one widening load, and the nibbles put back in order
// (run k: low nibbles of bytes 0-7, then their high nibbles; run k + 16: the same of bytes 8-15).
AVX512 inline void load32z(const I4W& w, int64_t n, int64_t k, __m512& w0, __m512& w1) {
  const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.w + n * (w.K / 2) + k / 2)));
  const __m512i lo = _mm512_and_si512(v, _mm512_set1_epi32(15));
  const __m512i hi = _mm512_srli_epi32(v, 4);
  const int64_t g0 = n * (w.K / w.group) + k / w.group, g1 = n * (w.K / w.group) + (k + 16) / w.group;
  w0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_shuffle_i64x2(lo, hi, 0x44)), _mm512_set1_ps(w.scale[g0]),
                       _mm512_set1_ps(w.offset[g0]));
  w1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_shuffle_i64x2(lo, hi, 0xEE)), _mm512_set1_ps(w.scale[g1]),
                       _mm512_set1_ps(w.offset[g1]));
}

// AVX-512: the same arithmetic in 16-lane registers. Lane l of one accumulator does what lane l of
// a0 (l < 8) or lane l - 8 of a1 does in cell() (same fma on the same k), and the final low + high
// add is a0 + a1, so both paths give the same bits (tests/test_invariant.py compares them). What
// changes is the blocking: R rows x C columns per cell, so a one-token step runs C independent fma
// chains (cell() at M = 1 has two and waits on the fma latency), and the 32 registers hold up to
// 6 rows (a K+1 = 6 verification) in one pass over the weights.
template <typename W, int R, int C>
AVX512 inline void zcell(const float* x, const W& w, float* y, int64_t m0, int64_t n0, int64_t N, int64_t K) {
  const int64_t K16 = K - K % 16;
  __m512 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  int64_t k = 0;
  // Two steps of 16 per iteration (the same fmas in the same order as one step at a time).
  for (; k + 32 <= K16; k += 32) {
    __m512 wa[C], wb[C];
    for (int c = 0; c < C; ++c) load32z(w, n0 + c, k, wa[c], wb[c]);
    for (int r = 0; r < R; ++r) {
      const __m512 xa = _mm512_loadu_ps(x + (m0 + r) * K + k);
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_fmadd_ps(xa, wa[c], acc[r][c]);
      const __m512 xb = _mm512_loadu_ps(x + (m0 + r) * K + k + 16);
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_fmadd_ps(xb, wb[c], acc[r][c]);
    }
  }
  for (; k < K16; k += 16) {
    __m512 wv[C];
    for (int c = 0; c < C; ++c) wv[c] = w.load16z(n0 + c, k);
    for (int r = 0; r < R; ++r) {
      const __m512 xv = _mm512_loadu_ps(x + (m0 + r) * K + k);
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_fmadd_ps(xv, wv[c], acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r) {
    const float* xr = x + (m0 + r) * K;
    for (int c = 0; c < C; ++c) {
      const __m256 lo = _mm512_castps512_ps256(acc[r][c]);
      const __m256 hi = _mm512_extractf32x8_ps(acc[r][c], 1);
      float s = hsum8(_mm256_add_ps(lo, hi));
      for (int64_t k = K16; k < K; ++k) s = std::fma(xr[k], w.at(n0 + c, k), s);
      y[(m0 + r) * N + n0 + c] = s * w.out_scale(n0 + c);
    }
  }
}

constexpr int RBZ = 6;

template <typename W, int R>
AVX512 void zblock(const float* x, const W& w, float* y, int64_t m0, int64_t n0, int64_t n1, int64_t N,
                   int64_t K) {
  constexpr int C = R <= 2 ? 8 : 4;  // R * C accumulators + C weights + 1 row fit 32 registers
  int64_t n = n0;
  for (; n + C <= n1; n += C) zcell<W, R, C>(x, w, y, m0, n, N, K);
  for (; n < n1; ++n) zcell<W, R, 1>(x, w, y, m0, n, N, K);
}

template <typename W>
AVX512 void zkernel(const float* x, const W& w, float* y, int64_t M, int64_t N, int64_t K) {
  const int64_t chunks = (N + NC - 1) / NC;
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t n0 = c * NC, n1 = std::min<int64_t>(N, (c + 1) * NC);
    for (int64_t m0 = 0; m0 < M; m0 += RBZ) {
      switch (std::min<int64_t>(RBZ, M - m0)) {
        case 1: zblock<W, 1>(x, w, y, m0, n0, n1, N, K); break;
        case 2: zblock<W, 2>(x, w, y, m0, n0, n1, N, K); break;
        case 3: zblock<W, 3>(x, w, y, m0, n0, n1, N, K); break;
        case 4: zblock<W, 4>(x, w, y, m0, n0, n1, N, K); break;
        case 5: zblock<W, 5>(x, w, y, m0, n0, n1, N, K); break;
        default: zblock<W, 6>(x, w, y, m0, n0, n1, N, K); break;
      }
    }
  }
}

template <typename W>
void kernel(const float* x, const W& w, float* y, int64_t M, int64_t N, int64_t K, bool force_avx2) {
  if (!force_avx2 && has_avx512()) {
    zkernel(x, w, y, M, N, K);
    return;
  }
  const int64_t chunks = (N + NC - 1) / NC;
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t n_end = std::min<int64_t>(N, (c + 1) * NC);
    for (int64_t m0 = 0; m0 < M; m0 += RB) {
      const int64_t rows = std::min<int64_t>(RB, M - m0);
      for (int64_t n = c * NC; n < n_end; ++n) cell(x, w, y, m0, rows, n, N, K);
    }
  }
}

void check(const torch::Tensor& x, const torch::Tensor& w) {
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2, "x must be [M, K] and w [N, K]");
  TORCH_CHECK(x.scalar_type() == torch::kFloat32, "x must be float32");
  TORCH_CHECK(x.size(1) == w.size(1), "x and w disagree on K");
  TORCH_CHECK(x.is_contiguous() && w.is_contiguous(), "x and w must be contiguous");
}

torch::Tensor out(const torch::Tensor& x, int64_t n) { return torch::empty({x.size(0), n}, x.options()); }

torch::Tensor linear_f32(torch::Tensor x, torch::Tensor w, bool force_avx2) {
  check(x, w);
  TORCH_CHECK(w.scalar_type() == torch::kFloat32, "w must be float32");
  auto y = out(x, w.size(0));
  kernel(x.data_ptr<float>(), F32W{w.data_ptr<float>(), w.size(1)}, y.data_ptr<float>(), x.size(0), w.size(0),
         x.size(1), force_avx2);
  return y;
}

torch::Tensor linear_bf16(torch::Tensor x, torch::Tensor w, bool force_avx2) {
  check(x, w);
  TORCH_CHECK(w.scalar_type() == torch::kBFloat16, "w must be bfloat16");
  auto y = out(x, w.size(0));
  kernel(x.data_ptr<float>(), BF16W{reinterpret_cast<const uint16_t*>(w.data_ptr()), w.size(1)},
         y.data_ptr<float>(), x.size(0), w.size(0), x.size(1), force_avx2);
  return y;
}

torch::Tensor linear_i8(torch::Tensor x, torch::Tensor w, torch::Tensor scale, bool force_avx2) {
  check(x, w);
  TORCH_CHECK(w.scalar_type() == torch::kInt8, "w must be int8");
  TORCH_CHECK(scale.scalar_type() == torch::kFloat32 && scale.numel() == w.size(0) && scale.is_contiguous(),
              "scale must be float32 [N]");
  auto y = out(x, w.size(0));
  kernel(x.data_ptr<float>(), I8W{w.data_ptr<int8_t>(), scale.data_ptr<float>(), w.size(1)}, y.data_ptr<float>(),
         x.size(0), w.size(0), x.size(1), force_avx2);
  return y;
}

torch::Tensor linear_i4(torch::Tensor x, torch::Tensor w, torch::Tensor scale, torch::Tensor offset,
                        int64_t group, bool force_avx2) {
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2, "x must be [M, K] and w [N, K/2]");
  TORCH_CHECK(x.scalar_type() == torch::kFloat32 && w.scalar_type() == torch::kUInt8, "x float32, w uint8");
  TORCH_CHECK(x.is_contiguous() && w.is_contiguous(), "x and w must be contiguous");
  const int64_t K = x.size(1), N = w.size(0);
  TORCH_CHECK(w.size(1) * 2 == K, "w must hold K/2 bytes per row");
  TORCH_CHECK(group > 0 && group % 16 == 0 && K % group == 0, "group must divide K and be a multiple of 16");
  TORCH_CHECK(scale.scalar_type() == torch::kFloat32 && offset.scalar_type() == torch::kFloat32 &&
                  scale.numel() == N * (K / group) && offset.numel() == N * (K / group) &&
                  scale.is_contiguous() && offset.is_contiguous(),
              "scale and offset must be float32 [N, K/group]");
  auto y = out(x, N);
  kernel(x.data_ptr<float>(), I4W{w.data_ptr<uint8_t>(), scale.data_ptr<float>(), offset.data_ptr<float>(), K, group},
         y.data_ptr<float>(), x.size(0), N, K, force_avx2);
  return y;
}


// ------------------------------------------------------------------------------------------------
// int8 weights x int8 activations ("w8af32" on this path: what torch's dynamic quantization does,
// with the activation scale taken per ROW instead of per call).
//
// Why this is batch-invariant without any care about order: every row of x is quantized on its
// own (its scale and zero point depend on that row only), and the products are summed in int32,
// which is exact, so any blocking, vector width or thread split gives the same integers. The
// float epilogue is one expression per output element. The AVX-512 VNNI path and the AVX2
// fallback therefore agree bit for bit (tests/test_invariant.py checks that), and the kernel is
// free to pick whatever blocking is fastest.
//
// Layout: w holds int8 codes for [N, Kp], Kp a multiple of 64 with zeros past K, packed as
// described at I8A8 below; wscale [N] float32 (one symmetric scale per output row), wsum [N] int32
// (sum of the row's codes, for the zero point).
// Activation row m: q = clamp(round(x / s) + z, 0, 255), s = (max(x,0) - min(x,0)) / 255,
// z = clamp(round(-min(x,0) / s), 0, 255); y[m, n] = float(acc - z * wsum[n]) * (s * wscale[n]).

struct RowQ {
  float scale;
  int32_t zero;
};

// Vectorized (8 lanes, AVX2) because a scalar pass costs as much as the matmul for small M; the
// scalar tail runs the same IEEE operations (divide, round to nearest even), so lanes and tail
// agree, and the codes depend on the row's values only.
RowQ quantize_row(const float* x, int64_t K, int64_t Kp, uint8_t* q) {
  const int64_t K8 = K - K % 8;
  __m256 vlo = _mm256_setzero_ps(), vhi = _mm256_setzero_ps();
  __m256 bad = _mm256_setzero_ps();  // any NaN lane
  for (int64_t k = 0; k < K8; k += 8) {
    const __m256 v = _mm256_loadu_ps(x + k);
    bad = _mm256_or_ps(bad, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    vlo = _mm256_min_ps(vlo, v);
    vhi = _mm256_max_ps(vhi, v);
  }
  alignas(32) float l8[8], h8[8];
  _mm256_store_ps(l8, vlo);
  _mm256_store_ps(h8, vhi);
  float lo = 0.0f, hi = 0.0f;
  bool finite = _mm256_movemask_ps(bad) == 0;
  for (int i = 0; i < 8; ++i) {
    lo = std::min(lo, l8[i]);
    hi = std::max(hi, h8[i]);
  }
  for (int64_t k = K8; k < K; ++k) {
    finite = finite && !std::isnan(x[k]);
    lo = std::min(lo, x[k]);
    hi = std::max(hi, x[k]);
  }
  const float scale = (hi - lo) / 255.0f;
  if (!finite || !std::isfinite(scale)) {
    // No scale can represent a non-finite row: it comes out NaN, as a float matmul's would.
    std::memset(q, 0, Kp);
    return RowQ{std::numeric_limits<float>::quiet_NaN(), 0};
  }
  if (!(scale > 0.0f)) {  // all zeros: codes 0, output 0
    std::memset(q, 0, Kp);
    return RowQ{0.0f, 0};
  }
  const int32_t zero = static_cast<int32_t>(std::min(255.0f, std::max(0.0f, std::nearbyint(-lo / scale))));
  const __m256 vs = _mm256_set1_ps(scale), vz = _mm256_set1_ps(static_cast<float>(zero));
  const __m256 v0 = _mm256_setzero_ps(), v255 = _mm256_set1_ps(255.0f);
  for (int64_t k = 0; k < K8; k += 8) {
    __m256 v = _mm256_round_ps(_mm256_div_ps(_mm256_loadu_ps(x + k), vs), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    v = _mm256_min_ps(v255, _mm256_max_ps(v0, _mm256_add_ps(v, vz)));
    const __m256i i = _mm256_cvtps_epi32(v);
    const __m128i w16 = _mm_packus_epi32(_mm256_castsi256_si128(i), _mm256_extracti128_si256(i, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(q + k), _mm_packus_epi16(w16, w16));
  }
  for (int64_t k = K8; k < K; ++k) {
    const float v = std::nearbyint(x[k] / scale) + static_cast<float>(zero);
    q[k] = static_cast<uint8_t>(std::min(255.0f, std::max(0.0f, v)));
  }
  std::memset(q + K, 0, Kp - K);
  return RowQ{scale, zero};
}

// Packed weights: [N/16][Kp/4][16][4]: for each group of 16 output columns, each run of 4 inputs
// holds 16 x 4 codes (column-major inside the run), so one 64-byte load feeds vpdpbusd with 16
// columns x 4 products and the accumulator's 16 lanes ARE 16 outputs (no horizontal sums).
struct I8A8 {
  const uint8_t* qa;  // [M, Kp]
  const RowQ* rq;     // [M]
  const int8_t* w;    // packed, [Np/16][Kp/4][16][4]
  const float* wscale;
  const int32_t* wsum;
  float* y;  // [M, N]
  int64_t M, N, Kp;
  inline const int8_t* group(int64_t g) const { return w + g * 16 * Kp; }
  inline float value(int64_t m, int64_t n, int32_t acc) const {
    const RowQ& r = rq[m];
    return static_cast<float>(acc - r.zero * wsum[n]) * (r.scale * wscale[n]);
  }
};

constexpr int GB = 4;    // column groups of 16 per VNNI cell (64 columns)
// Steps (64 bytes each) ahead that a cell prefetches in every column group's stream: one core's
// demand reads alone stayed well under the memory's bandwidth on a Xeon host.
constexpr int64_t I8A8_PREFETCH = 16;
constexpr int RB_I8 = 4;  // rows per VNNI cell: RB_I8 x GB = 16 accumulators

// AVX-512 VNNI: R rows x 64 columns, 4 inputs per step; the activations' 4 codes are broadcast.
template <int R>
__attribute__((target("avx512f,avx512bw,avx512vnni"))) void vnni_cell(const I8A8& p, int64_t m0, int64_t g0,
                                                                        int64_t groups) {
  __m512i acc[R][GB];
  for (int r = 0; r < R; ++r)
    for (int g = 0; g < GB; ++g) acc[r][g] = _mm512_setzero_si512();
  const int8_t* wg[GB];
  for (int g = 0; g < GB; ++g) wg[g] = p.group(g0 + std::min<int64_t>(g, groups - 1));
  const int32_t* a = reinterpret_cast<const int32_t*>(p.qa + m0 * p.Kp);
  const int64_t stride = p.Kp / 4;
  for (int64_t k4 = 0; k4 < stride; ++k4) {
    __m512i b[GB];
    for (int g = 0; g < GB; ++g) {
      // Past the end of a group's stream this touches the next group's (or past the buffer): never read.
      _mm_prefetch(ahead(wg[g], (k4 + I8A8_PREFETCH) * 64), _MM_HINT_T0);
      b[g] = _mm512_loadu_si512(wg[g] + k4 * 64);
    }
    for (int r = 0; r < R; ++r) {
      const __m512i av = _mm512_set1_epi32(a[r * stride + k4]);
      for (int g = 0; g < GB; ++g) acc[r][g] = _mm512_dpbusd_epi32(acc[r][g], av, b[g]);
    }
  }
  for (int r = 0; r < R; ++r) {
    const int64_t m = m0 + r;
    const RowQ& q = p.rq[m];
    const __m512 s = _mm512_set1_ps(q.scale);
    const __m512i z = _mm512_set1_epi32(q.zero);
    for (int g = 0; g < groups; ++g) {
      const int64_t n = (g0 + g) * 16;
      const __mmask16 mask = n + 16 <= p.N ? 0xFFFF : static_cast<__mmask16>((1u << (p.N - n)) - 1);
      const __m512i sum = _mm512_maskz_loadu_epi32(mask, p.wsum + n);
      const __m512 ws = _mm512_maskz_loadu_ps(mask, p.wscale + n);
      const __m512i d = _mm512_sub_epi32(acc[r][g], _mm512_mullo_epi32(z, sum));
      _mm512_mask_storeu_ps(p.y + m * p.N + n, mask, _mm512_mul_ps(_mm512_cvtepi32_ps(d), _mm512_mul_ps(s, ws)));
    }
  }
}

void vnni_block(const I8A8& p, int64_t m0, int64_t rows, int64_t g0, int64_t groups) {
  switch (rows) {
    case 1: vnni_cell<1>(p, m0, g0, groups); break;
    case 2: vnni_cell<2>(p, m0, g0, groups); break;
    case 3: vnni_cell<3>(p, m0, g0, groups); break;
    default: vnni_cell<4>(p, m0, g0, groups); break;
  }
}

// AVX2 fallback, one row x 16 columns: widen to int16 and multiply-add pairs (vpmaddwd). Lane
// 2j and 2j+1 of acc[h] hold two halves of column 4h+j; they are added in the epilogue. Exact in
// int32 like VNNI, so both paths give the same outputs.
__attribute__((target("avx2"))) void avx2_cell(const I8A8& p, int64_t m, int64_t g) {
  __m256i acc[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(),
                    _mm256_setzero_si256()};
  const int8_t* w = p.group(g);
  const int32_t* a = reinterpret_cast<const int32_t*>(p.qa + m * p.Kp);
  for (int64_t k4 = 0; k4 < p.Kp / 4; ++k4) {
    const __m256i av = _mm256_cvtepu8_epi16(_mm_set1_epi32(a[k4]));
    for (int h = 0; h < 4; ++h) {
      const __m256i wv = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + k4 * 64 + h * 16)));
      acc[h] = _mm256_add_epi32(acc[h], _mm256_madd_epi16(av, wv));
    }
  }
  alignas(32) int32_t lanes[4][8];
  for (int h = 0; h < 4; ++h) _mm256_store_si256(reinterpret_cast<__m256i*>(lanes[h]), acc[h]);
  for (int h = 0; h < 4; ++h)
    for (int j = 0; j < 4; ++j) {
      const int64_t n = g * 16 + h * 4 + j;
      if (n < p.N) p.y[m * p.N + n] = p.value(m, n, lanes[h][2 * j] + lanes[h][2 * j + 1]);
    }
}

bool has_vnni() { return __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw"); }

std::string i8a8_isa() { return has_vnni() ? "avx512vnni" : "avx2"; }

torch::Tensor linear_i8a8(torch::Tensor x, torch::Tensor w, torch::Tensor wscale, torch::Tensor wsum,
                          bool force_avx2) {
  TORCH_CHECK(x.dim() == 2 && w.dim() == 4, "x must be [M, K] and w packed [N/16, Kp/4, 16, 4]");
  TORCH_CHECK(x.scalar_type() == torch::kFloat32 && w.scalar_type() == torch::kInt8, "x float32, w int8");
  TORCH_CHECK(x.is_contiguous() && w.is_contiguous(), "x and w must be contiguous");
  TORCH_CHECK(w.size(2) == 16 && w.size(3) == 4, "w must be packed [N/16, Kp/4, 16, 4]");
  const int64_t M = x.size(0), K = x.size(1), N = wscale.numel(), Kp = w.size(1) * 4;
  TORCH_CHECK(Kp % 64 == 0 && Kp >= K && Kp - K < 64, "w must be padded with zeros to K rounded up to 64");
  TORCH_CHECK(w.size(0) == (N + 15) / 16, "w must hold N rounded up to 16 columns");
  TORCH_CHECK(wscale.scalar_type() == torch::kFloat32 && wscale.is_contiguous(), "wscale must be float32 [N]");
  TORCH_CHECK(wsum.scalar_type() == torch::kInt32 && wsum.numel() == N && wsum.is_contiguous(),
              "wsum must be int32 [N]");
  std::vector<uint8_t> qa(static_cast<size_t>(M * Kp));
  std::vector<RowQ> rq(static_cast<size_t>(M));
  const float* xp = x.data_ptr<float>();
  for (int64_t m = 0; m < M; ++m) rq[m] = quantize_row(xp + m * K, K, Kp, qa.data() + m * Kp);
  auto y = out(x, N);
  const I8A8 p{qa.data(), rq.data(), w.data_ptr<int8_t>(), wscale.data_ptr<float>(), wsum.data_ptr<int32_t>(),
               y.data_ptr<float>(), M, N, Kp};
  const bool vnni = !force_avx2 && has_vnni();
  // One VNNI cell's columns (GB groups) per chunk, row blocks inside it, as in kernel() above: a
  // prefill's rows reuse the chunk's weights in cache.
  const int64_t G = w.size(0), chunks = (G + GB - 1) / GB;
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t g0 = c * GB, g1 = std::min<int64_t>(G, g0 + GB);
    for (int64_t m0 = 0; m0 < M; m0 += RB_I8) {
      const int64_t rows = std::min<int64_t>(RB_I8, M - m0);
      if (vnni) {
        vnni_block(p, m0, rows, g0, g1 - g0);
      } else {
        for (int64_t g = g0; g < g1; ++g)
          for (int64_t r = 0; r < rows; ++r) avx2_cell(p, m0 + r, g);
      }
    }
  }
  return y;
}

// ---------------------------------------------------------------- attention
//
// Causal attention for M query rows over an L-token cache (the last M cache entries are the rows'
// own), every row computed in one fixed order: its scores key by key (one 8-lane fused multiply-add
// accumulator over D, lanes summed pairwise), the max, the weights (exp8) and their sum in 8 lanes
// by key, the weighted values key by key, one division. Nothing depends on M, so a verification row
// is a decode step's row; and one call serves all M rows (SDPA per row cost ~150 us per row and
// layer in Python calls alone).
//
// Why rows are computed together: the query heads that share a key/value head (GQA), and the M rows
// of a verification, read the same keys and values. A thread takes up to GROUP rows at once, whose
// independent chains hide the latency a lone row waits on, and the passes run key tile by key tile
// (scores) and block of D by block (values) over all rows, so each key and value row comes from
// memory once per call, not once per head and row. No row's arithmetic moves: each takes exactly
// the chain it took computed alone (the same bits as a row at a time, checked by the tests).
//
// A token tree's verification (``visible``, [M, T] over the cache's last T entries, the rows' own
// last) skips each key a row does not see: not a masked score of -inf, but no step at all, so the
// row's sums run over exactly the keys, in exactly the order, of a one-token step onto a cache that
// holds only its path (the tree's nodes are stored parents first). That is what keeps a tree's
// output the target's own, bit for bit.

// Each loop over a chunk's rows unrolled in full before the compiler places its registers: left to
// GCC, the values' 12 accumulators of six rows went through the stack on every key, and the values
// took 2.7x the time on keys in cache (one thread, 6 rows of 16 floats over 256 keys). The target's
// forward of 4 rows onto 1K-2K cached tokens took 0.93-0.94x the time, of one row 0.97-0.99x (AMD
// EPYC Zen 3, old and new kernels interleaved in one process). The same instructions on registers:
// the same bits.
#define ROWS_UNROLLED _Pragma("GCC unroll 16")

constexpr int GROUP = 6;             // rows a thread computes together (values: 2 ymm accumulators each)
// Keys ahead whose rows a pass over consecutive keys asks the memory for before it reads them. A
// thread walks its head's keys and values row by row, and on its own the hardware kept about 12
// GB/s of them coming: with the request 8 rows ahead, one row's attention over 28 layers took
// 0.86-0.87x the time at 1K and 2K tokens, four rows' 0.95-0.98x (AMD EPYC Zen 3, interleaved, 21
// runs each, the same bits). A request changes no arithmetic. The AVX-512 scores (four keys a step)
// ask for the same rows: on AMD EPYC Zen 4 (family 25 model 17), whose hardware alone brought a
// one-row attention's keys and values at 11-12 GB/s at 1K-4K tokens (a third of a plain read), 28
// layers' attention of one row took 0.93x the time at 1K tokens and 0.74-0.78x at 4K, four rows'
// 0.92-0.93x at 2K (old and new kernels alternated in one process, the same bits).
constexpr int64_t KEY_AHEAD = 8;

// Asks for the lines of `rows` consecutive key rows (D floats each) KEY_AHEAD keys past `k`.
inline void request_keys(const float* k, int64_t rows, int64_t D) {
  for (int64_t e = 0; e < rows * D; e += 16) _mm_prefetch(ahead(k, sizeof(float) * (KEY_AHEAD * D + e)), _MM_HINT_T0);
}
constexpr int64_t KEY_TILE = 64;     // keys whose rows stay in L1 while each chunk of rows reads them
constexpr int64_t SHARED_ROWS = 16;  // up to this many query rows (M), each key and value row is read once for all

// Rows t0..t1-1 of a [L, D] head, floats d0..d1-1 of each, read one load a line, so that they are in
// cache when a pass reads them again. The values' pass below walks its rows a 16-float block at a
// time, one line of each row per walk, a stride the memory serves a line at a time; reading the
// tile ahead line by line first streams it. Loads, not prefetches: on AMD EPYC Zen 3 (family 25
// model 1), neither prefetches 8 or 64 keys ahead in the walks nor a tile's lines prefetched at once
// sped the values up, while these loads took the values' pass over a 2K-token cache (one row, 28
// layers' value rows streamed) from 7.1-8.7 to 4.7-5.0 ms, and the whole attention of one row to
// 0.78-0.94x its time at 1K-4K tokens, of four rows to 0.89-0.93x (interleaved, the same bits).
inline void touch_rows(const float* h, int64_t t0, int64_t t1, int64_t D, int64_t d0, int64_t d1) {
  for (int64_t t = t0; t < t1; ++t)
    for (int64_t e = d0; e < d1; e += 16) {
      const __m128 line = _mm_load_ss(h + t * D + e);
      asm volatile("" : : "x"(line));  // kept: the load is the point
    }
}

// The key a row's t-th seen key is: t itself (keys == nullptr), else keys[t - base].
inline int64_t key_at(const int32_t* keys, int64_t base, int64_t t) { return keys == nullptr ? t : keys[t - base]; }

// Scores of S rows (queries q[r], into p[r][t]) for their seen keys t0..t1-1, which they share:
// each row's one accumulator chain (fused multiply-adds) over D's 8-wide chunks, as dot8 sums.
template <int S>
void group_scores(const float* const* q, float* const* p, const float* kh, const int32_t* keys, int64_t base,
                  int64_t t0, int64_t t1, int64_t D, float scale) {
  const int64_t D8 = D / 8;
  for (int64_t t = t0; t < t1; ++t) {
    const float* kr = kh + key_at(keys, base, t) * D;
    if (keys == nullptr) request_keys(kr, 1, D);  // consecutive keys: the rows ahead are known
    __m256 a[S];
    ROWS_UNROLLED
    for (int r = 0; r < S; ++r) a[r] = _mm256_setzero_ps();
    for (int64_t c = 0; c < D8; ++c) {
      const __m256 k = _mm256_loadu_ps(kr + c * 8);
      ROWS_UNROLLED
      for (int r = 0; r < S; ++r) a[r] = _mm256_fmadd_ps(_mm256_loadu_ps(q[r] + c * 8), k, a[r]);
    }
    ROWS_UNROLLED
    for (int r = 0; r < S; ++r) {
      float s = hsum8(a[r]);
      for (int64_t d = D8 * 8; d < D; ++d) s = std::fma(q[r][d], kr[d], s);
      p[r][t] = s * scale;
    }
  }
}

// exp for 8 lanes (Cephes' expf: range reduction by ln 2 in two parts, degree-6 polynomial), in
// plain multiplies and adds: the same bits on every AVX2 machine, whatever lane an element sits in.
// Attention's weights use it rather than std::exp, which is a call per element (a long cache's
// attention spent most of its time there) and libm's own variant per CPU. Below -87.3 it gives
// exp(-87.3), ~1e-38: a weight the sum of a row's weights (at least 1) does not see.
inline __m256 exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3365f)), _mm256_set1_ps(88.3762626647949f));
  const __m256 fx = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  x = _mm256_sub_ps(x, _mm256_mul_ps(fx, _mm256_set1_ps(0.693359375f)));
  x = _mm256_sub_ps(x, _mm256_mul_ps(fx, _mm256_set1_ps(-2.12194440e-4f)));
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  for (float c : {1.3981999507e-3f, 8.3334519073e-3f, 4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f})
    y = _mm256_add_ps(_mm256_mul_ps(y, x), _mm256_set1_ps(c));
  y = _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(y, _mm256_mul_ps(x, x)), x), _mm256_set1_ps(1.0f));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

// One row's weights in place: exp(score - max) for its n keys, returning their sum. The sum runs in
// 8 lanes (key t in lane t % 8, keys ascending) then pairwise across them, a fixed order that
// depends on n alone: a row's weights are the same whatever else the call computes.
inline float softmax_weights(float* p, int64_t n) {
  const int64_t n8 = n / 8 * 8;
  const int rest = static_cast<int>(n - n8);
  const __m256i tail = _mm256_cmpgt_epi32(_mm256_set1_epi32(rest), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  const __m256 ninf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  __m256 m8 = ninf;
  for (int64_t t = 0; t < n8; t += 8) m8 = _mm256_max_ps(m8, _mm256_loadu_ps(p + t));
  if (rest) m8 = _mm256_max_ps(m8, _mm256_blendv_ps(ninf, _mm256_maskload_ps(p + n8, tail), _mm256_castsi256_ps(tail)));
  float lanes[8];
  _mm256_storeu_ps(lanes, m8);
  float mx = lanes[0];
  for (int j = 1; j < 8; ++j) mx = std::max(mx, lanes[j]);
  const __m256 top = _mm256_set1_ps(mx);
  __m256 sum = _mm256_setzero_ps();
  for (int64_t t = 0; t < n8; t += 8) {
    const __m256 w = exp8(_mm256_sub_ps(_mm256_loadu_ps(p + t), top));
    _mm256_storeu_ps(p + t, w);
    sum = _mm256_add_ps(sum, w);
  }
  if (rest) {
    const __m256 w = _mm256_and_ps(exp8(_mm256_sub_ps(_mm256_maskload_ps(p + n8, tail), top)), _mm256_castsi256_ps(tail));
    _mm256_maskstore_ps(p + n8, tail, w);
    sum = _mm256_add_ps(sum, w);
  }
  return hsum8(sum);
}

// S rows' values for one block of D (``width`` 16, 8 or 1 floats at d), over seen keys t0..t1-1:
// o[r][d..] = o[r][d..] + p[r][t] * v[key][d..] (one fused multiply-add), t ascending. The blocks do
// not move a sum: every element takes the same chain whatever block it is in.
template <int S>
void group_values(const float* const* p, float* const* o, const float* vh, const int32_t* keys, int64_t base,
                  int64_t t0, int64_t t1, int64_t D, int64_t d, int width) {
  if (width == 16) {
    __m256 a0[S], a1[S];
    ROWS_UNROLLED
    for (int r = 0; r < S; ++r) {
      a0[r] = _mm256_loadu_ps(o[r] + d);
      a1[r] = _mm256_loadu_ps(o[r] + d + 8);
    }
    for (int64_t t = t0; t < t1; ++t) {
      const float* vr = vh + key_at(keys, base, t) * D + d;
      if (keys == nullptr) _mm_prefetch(ahead(vr, sizeof(float) * KEY_AHEAD * D), _MM_HINT_T0);
      const __m256 v0 = _mm256_loadu_ps(vr), v1 = _mm256_loadu_ps(vr + 8);
      ROWS_UNROLLED
      for (int r = 0; r < S; ++r) {
        const __m256 w = _mm256_broadcast_ss(p[r] + t);
        a0[r] = _mm256_fmadd_ps(w, v0, a0[r]);
        a1[r] = _mm256_fmadd_ps(w, v1, a1[r]);
      }
    }
    ROWS_UNROLLED
    for (int r = 0; r < S; ++r) {
      _mm256_storeu_ps(o[r] + d, a0[r]);
      _mm256_storeu_ps(o[r] + d + 8, a1[r]);
    }
  } else if (width == 8) {
    __m256 a[S];
    ROWS_UNROLLED
    for (int r = 0; r < S; ++r) a[r] = _mm256_loadu_ps(o[r] + d);
    for (int64_t t = t0; t < t1; ++t) {
      const __m256 v = _mm256_loadu_ps(vh + key_at(keys, base, t) * D + d);
      ROWS_UNROLLED
      for (int r = 0; r < S; ++r) a[r] = _mm256_fmadd_ps(_mm256_broadcast_ss(p[r] + t), v, a[r]);
    }
    ROWS_UNROLLED
    for (int r = 0; r < S; ++r) _mm256_storeu_ps(o[r] + d, a[r]);
  } else {
    for (int64_t t = t0; t < t1; ++t) {
      const float v = vh[key_at(keys, base, t) * D + d];
      ROWS_UNROLLED
      for (int r = 0; r < S; ++r) o[r][d] = std::fma(p[r][t], v, o[r][d]);
    }
  }
}

// group_values' 16-float block in one 16-lane register where the CPU has AVX-512 (each element's
// chain unchanged: the same bits).
template <int S>
AVX512 void group_values512(const float* const* p, float* const* o, const float* vh, const int32_t* keys,
                            int64_t base, int64_t t0, int64_t t1, int64_t D, int64_t d) {
  __m512 a[S];
  for (int r = 0; r < S; ++r) a[r] = _mm512_loadu_ps(o[r] + d);
  for (int64_t t = t0; t < t1; ++t) {
    const __m512 v = _mm512_loadu_ps(vh + key_at(keys, base, t) * D + d);
    for (int r = 0; r < S; ++r) a[r] = _mm512_fmadd_ps(_mm512_set1_ps(p[r][t]), v, a[r]);
  }
  for (int r = 0; r < S; ++r) _mm512_storeu_ps(o[r] + d, a[r]);
}

// Two 16-float blocks (32 floats at d) in one pass: each weight, broadcast once, serves both
// registers (half the broadcasts per product). Each element's chain is unchanged.
template <int S>
AVX512 void group_values512x2(const float* const* p, float* const* o, const float* vh, const int32_t* keys,
                              int64_t base, int64_t t0, int64_t t1, int64_t D, int64_t d) {
  __m512 a[S], b[S];
  for (int r = 0; r < S; ++r) {
    a[r] = _mm512_loadu_ps(o[r] + d);
    b[r] = _mm512_loadu_ps(o[r] + d + 16);
  }
  for (int64_t t = t0; t < t1; ++t) {
    const float* vr = vh + key_at(keys, base, t) * D + d;
    const __m512 v0 = _mm512_loadu_ps(vr), v1 = _mm512_loadu_ps(vr + 16);
    for (int r = 0; r < S; ++r) {
      const __m512 w = _mm512_set1_ps(p[r][t]);
      a[r] = _mm512_fmadd_ps(w, v0, a[r]);
      b[r] = _mm512_fmadd_ps(w, v1, b[r]);
    }
  }
  for (int r = 0; r < S; ++r) {
    _mm512_storeu_ps(o[r] + d, a[r]);
    _mm512_storeu_ps(o[r] + d + 16, b[r]);
  }
}

// Two keys' scores from one register's halves (group_scores' reduction and tail for each key).
template <int S>
AVX512 inline void scores_done512(const float* const* q, float* const* p, const __m512* a, const float* k0,
                                  const float* k1, int64_t t, int64_t D, float scale) {
  const int64_t D8 = D / 8;
  for (int r = 0; r < S; ++r) {
    float s0 = hsum8(_mm512_castps512_ps256(a[r]));
    float s1 = hsum8(_mm512_extractf32x8_ps(a[r], 1));
    for (int64_t d = D8 * 8; d < D; ++d) {
      s0 = std::fma(q[r][d], k0[d], s0);
      s1 = std::fma(q[r][d], k1[d], s1);
    }
    p[r][t] = s0 * scale;
    p[r][t + 1] = s1 * scale;
  }
}

AVX512 inline __m512 key_pair(const float* k0, const float* k1, int64_t c) {
  return _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps(k0 + c * 8)), _mm256_loadu_ps(k1 + c * 8), 1);
}

// group_scores two keys at a time where the CPU has AVX-512: key t in the low 8 lanes and key t + 1
// in the high 8, each half the 8-lane chain group_scores runs for its key (the same bits), at twice
// the products per instruction: at long caches the verification rows' scores are arithmetic, not
// memory.
//
// Four keys (two registers) a step where there are four: each query chunk, broadcast once, serves
// both registers, which halves the broadcasts per product (on Zen 4 they take the shuffle unit's
// slots beside the half-width multiply-adds). Each key's chain is unchanged.
template <int S>
AVX512 void group_scores512(const float* const* q, float* const* p, const float* kh, const int32_t* keys,
                            int64_t base, int64_t t0, int64_t t1, int64_t D, float scale) {
  const int64_t D8 = D / 8;
  int64_t t = t0;
  for (; t + 3 < t1; t += 4) {
    const float* k0 = kh + key_at(keys, base, t) * D;
    const float* k1 = kh + key_at(keys, base, t + 1) * D;
    const float* k2 = kh + key_at(keys, base, t + 2) * D;
    const float* k3 = kh + key_at(keys, base, t + 3) * D;
    if (keys == nullptr) request_keys(k0, 4, D);  // consecutive keys: the rows ahead are known
    __m512 a[S], b[S];
    for (int r = 0; r < S; ++r) a[r] = b[r] = _mm512_setzero_ps();
    for (int64_t c = 0; c < D8; ++c) {
      const __m512 ka = key_pair(k0, k1, c), kb = key_pair(k2, k3, c);
      for (int r = 0; r < S; ++r) {
        const __m512 x = _mm512_broadcast_f32x8(_mm256_loadu_ps(q[r] + c * 8));
        a[r] = _mm512_fmadd_ps(x, ka, a[r]);
        b[r] = _mm512_fmadd_ps(x, kb, b[r]);
      }
    }
    scores_done512<S>(q, p, a, k0, k1, t, D, scale);
    scores_done512<S>(q, p, b, k2, k3, t + 2, D, scale);
  }
  for (; t + 1 < t1; t += 2) {
    const float* k0 = kh + key_at(keys, base, t) * D;
    const float* k1 = kh + key_at(keys, base, t + 1) * D;
    if (keys == nullptr) request_keys(k0, 2, D);
    __m512 a[S];
    for (int r = 0; r < S; ++r) a[r] = _mm512_setzero_ps();
    for (int64_t c = 0; c < D8; ++c) {
      const __m512 k = key_pair(k0, k1, c);
      for (int r = 0; r < S; ++r)
        a[r] = _mm512_fmadd_ps(_mm512_broadcast_f32x8(_mm256_loadu_ps(q[r] + c * 8)), k, a[r]);
    }
    scores_done512<S>(q, p, a, k0, k1, t, D, scale);
  }
  if (t < t1) group_scores<S>(q, p, kh, keys, base, t, t1, D, scale);
}

// Whether attention takes its AVX-512 variants (16 lanes a register; the same bits) on this host:
// where the CPU has AVX-512, but on AMD family 25 (Zen 4), whose units run a 512-bit vector as two
// 256-bit halves. There the 8-lane passes took 0.75-0.78x the AVX-512 ones' time for one row over
// 28 layers' caches of 1K-4K tokens, 0.83x for four rows and 0.88-0.92x for sixteen (0.92-0.96x at
// 200 tokens; family 25 model 17, alternated in one process, the same bits). Hosts where the wide
// passes were not measured against the narrow ones keep them.
bool wide_attention() { return has_avx512() && amd_family() != 25; }
const bool WIDE = wide_attention();

// f(std::integral_constant<int, n>{}) for 1 <= n <= GROUP: a chunk's size as the templates take it.
template <typename F>
void by_size(int n, F&& f) {
  switch (n) {
    case 1: return f(std::integral_constant<int, 1>{});
    case 2: return f(std::integral_constant<int, 2>{});
    case 3: return f(std::integral_constant<int, 3>{});
    case 4: return f(std::integral_constant<int, 4>{});
    case 5: return f(std::integral_constant<int, 5>{});
    case 6: return f(std::integral_constant<int, 6>{});
    default: return;
  }
}

// A chunk of up to GROUP rows, dispatched to the templates by its size.
struct Chunk {
  const float* q[GROUP];
  float* p[GROUP];
  float* o[GROUP];
  int n = 0;
  bool wide = WIDE;  // the AVX-512 variants (same bits); off to check that they are
  void scores(const float* kh, const int32_t* keys, int64_t base, int64_t t0, int64_t t1, int64_t D, float scale) const {
    by_size(n, [&](auto s) {
      if (wide)
        group_scores512<decltype(s)::value>(q, p, kh, keys, base, t0, t1, D, scale);
      else
        group_scores<decltype(s)::value>(q, p, kh, keys, base, t0, t1, D, scale);
    });
  }
  void values(const float* vh, const int32_t* keys, int64_t base, int64_t t0, int64_t t1, int64_t D, int64_t d,
              int width) const {
    by_size(n, [&](auto s) {
      constexpr int S = decltype(s)::value;
      if (wide && width == 32) {
        group_values512x2<S>(p, o, vh, keys, base, t0, t1, D, d);
      } else if (width == 32) {
        group_values<S>(p, o, vh, keys, base, t0, t1, D, d, 16);
        group_values<S>(p, o, vh, keys, base, t0, t1, D, d + 16, 16);
      } else if (wide && width == 16) {
        group_values512<S>(p, o, vh, keys, base, t0, t1, D, d);
      } else {
        group_values<S>(p, o, vh, keys, base, t0, t1, D, d, width);
      }
    });
  }
};

// D's blocks: 32 floats each, then 16, then 8, then one at a time.
std::vector<std::pair<int64_t, int>> d_blocks(int64_t D) {
  std::vector<std::pair<int64_t, int>> blocks;
  int64_t d = 0;
  for (; d + 32 <= D; d += 32) blocks.emplace_back(d, 32);
  for (; d + 16 <= D; d += 16) blocks.emplace_back(d, 16);
  for (; d + 8 <= D; d += 8) blocks.emplace_back(d, 8);
  for (; d < D; ++d) blocks.emplace_back(d, 1);
  return blocks;
}

// Row (h, i) of q at qp + h * q_h + i * q_m; its output at op + h * o_h + i * o_m; k and v [Hkv, L, D]
// with contiguous rows, head g at kp + g * k_h (vp + g * v_h): a cache kept in a buffer with room to
// grow is read where it lies. The layouts only move where a row is read and written, never the order
// of its sums.
//
// Row i sees the keys before ``common`` (all rows do), then its own tail: the keys up to its own
// (causal), or, for the last R rows where a mask is given, the ones it shows among the cache's last T
// (a tree) after every key before them. The rows before a mask's are causal: a prompt verified with
// a tree's nodes needs no [M, M] mask, whose per-row index lists would cost a long prompt's prefill
// more than its arithmetic. Up to SHARED_ROWS rows, the call runs in three passes over all rows at
// once (scores by key tile, weights by row, values by block of D), so each key and value row is read
// from memory once however many rows verify; past that (a prompt), a thread takes a chunk of one
// row's heads at a time. Both run the same arithmetic.
// ``variant``: -1 this host's choice (``WIDE``), 0 the 8-lane passes, 1 the AVX-512 ones where the
// CPU has them (the tests run both, for their bits).
void attend(const float* qp, int64_t q_h, int64_t q_m, const float* kp, int64_t k_h, const float* vp, int64_t v_h,
            float* op, int64_t o_h, int64_t o_m, int64_t H, int64_t M, int64_t D, int64_t Hkv, int64_t L,
            float scale, const uint8_t* visible = nullptr, int64_t R = 0, int64_t T = 0,
            int64_t variant = -1) {
  const int64_t heads = H / Hkv;
  const int64_t first = visible == nullptr ? M : M - R;  // the first masked row
  const int64_t common = visible == nullptr ? L - M + 1 : std::min(L - T, L - M + 1);
  // Each row's tail (the keys it sees at and after ``common``), as key indices; empty: consecutive.
  std::vector<std::vector<int32_t>> tails(static_cast<size_t>(M));
  std::vector<int64_t> seen(static_cast<size_t>(M));
  for (int64_t i = 0; i < M; ++i) {
    if (i < first) {
      seen[i] = L - M + 1 + i;
      continue;
    }
    const uint8_t* shown = visible + (i - first) * T;
    for (int64_t j = common; j < L - M + i + 1; ++j)
      if (j < L - T || shown[j - (L - T)]) tails[i].push_back(static_cast<int32_t>(j));
    seen[i] = common + static_cast<int64_t>(tails[i].size());
  }
  auto tail_keys = [&](int64_t i) -> const int32_t* { return i < first ? nullptr : tails[i].data(); };
  const auto blocks = d_blocks(D);
  const bool wide = variant < 0 ? WIDE : variant != 0 && has_avx512();
  // A chunk of rows: heads h0..h1-1 of key/value head g, query row i, weights at p(h, i).
  auto chunk_of = [&](int64_t h0, int64_t h1, int64_t i, auto&& p_of) {
    Chunk c;
    c.wide = wide;
    for (int64_t h = h0; h < h1; ++h, ++c.n) {
      c.q[c.n] = qp + h * q_h + i * q_m;
      c.o[c.n] = op + h * o_h + i * o_m;
      c.p[c.n] = p_of(h, i);
    }
    return c;
  };
  if (M <= SHARED_ROWS) {
    thread_local std::vector<float> weights;
    weights.resize(static_cast<size_t>(H * M * L));
    float* P = weights.data();
    auto p_of = [&](int64_t h, int64_t i) { return P + (h * M + i) * L; };
    std::vector<float> sums(static_cast<size_t>(H * M));
    // Per key/value head g and row i, its heads in chunks of GROUP: chunks[g * M + i].
    std::vector<std::vector<Chunk>> chunks(static_cast<size_t>(Hkv * M));
    for (int64_t g = 0; g < Hkv; ++g)
      for (int64_t i = 0; i < M; ++i)
        for (int64_t h0 = g * heads; h0 < (g + 1) * heads; h0 += GROUP)
          chunks[g * M + i].push_back(chunk_of(h0, std::min(h0 + GROUP, (g + 1) * heads), i, p_of));
    const int64_t tiles = (common + KEY_TILE - 1) / KEY_TILE;
    const int64_t nblocks = static_cast<int64_t>(blocks.size());
    // Units of the values' pass: a key/value head's blocks of D in as few shares as give every thread
    // one, so that each unit walks its value rows once, in key order.
    const int64_t splits = std::min(nblocks, std::max<int64_t>(1, (at::get_num_threads() + Hkv - 1) / Hkv));
#pragma omp parallel
    {
      // Scores over the keys all rows see, a tile at a time: unit u is head u / tiles's tile u % tiles.
      const auto [first, last] = even_share(Hkv * tiles, omp_get_thread_num(), omp_get_num_threads());
      for (int64_t u = first; u < last; ++u) {
        const int64_t g = u / tiles, t0 = (u % tiles) * KEY_TILE, t1 = std::min(common, t0 + KEY_TILE);
        for (int64_t i = 0; i < M; ++i)
          for (const Chunk& c : chunks[g * M + i]) c.scores(kp + g * k_h, nullptr, 0, t0, t1, D, scale);
      }
#pragma omp barrier
#pragma omp for schedule(static)
      for (int64_t u = 0; u < Hkv * M; ++u) {  // then each row's own tail
        const int64_t g = u / M, i = u % M;
        for (const Chunk& c : chunks[u]) c.scores(kp + g * k_h, tail_keys(i), common, common, seen[i], D, scale);
      }
#pragma omp for schedule(static)
      for (int64_t r = 0; r < H * M; ++r) sums[r] = softmax_weights(P + r * L, seen[r % M]);
#pragma omp for schedule(static)
      for (int64_t u = 0; u < Hkv * splits; ++u) {  // values: each unit's blocks of D, key tile by key tile
        const int64_t g = u / splits, b0 = (u % splits) * nblocks / splits, b1 = (u % splits + 1) * nblocks / splits;
        const float* vh = vp + g * v_h;
        // f(chunk, its query row, d, width) for every chunk of head g's rows and block of this unit.
        auto each = [&](auto&& f) {
          for (int64_t b = b0; b < b1; ++b)
            for (int64_t i = 0; i < M; ++i)
              for (const Chunk& c : chunks[g * M + i]) f(c, i, blocks[b].first, blocks[b].second);
        };
        each([](const Chunk& c, int64_t, int64_t d, int width) {
          for (int r = 0; r < c.n; ++r) std::fill(c.o[r] + d, c.o[r] + d + width, 0.0f);
        });
        const int64_t e0 = blocks[b0].first, e1 = blocks[b1 - 1].first + blocks[b1 - 1].second;
        touch_rows(vh, 0, std::min(common, KEY_TILE), D, e0, e1);
        for (int64_t t0 = 0; t0 < common; t0 += KEY_TILE) {
          // The next tile's value rows read line by line before this tile's blocks walk theirs.
          touch_rows(vh, t0 + KEY_TILE, std::min(common, t0 + 2 * KEY_TILE), D, e0, e1);
          each([&](const Chunk& c, int64_t, int64_t d, int width) {
            c.values(vh, nullptr, 0, t0, std::min(common, t0 + KEY_TILE), D, d, width);
          });
        }
        each([&](const Chunk& c, int64_t i, int64_t d, int width) {
          c.values(vh, tail_keys(i), common, common, seen[i], D, d, width);
          for (int r = 0; r < c.n; ++r) {
            const float sum = sums[(c.p[r] - P) / L];
            for (int64_t e = d; e < d + width; ++e) c.o[r][e] /= sum;
          }
        });
      }
    }
    return;
  }
  const int64_t parts = (heads + GROUP - 1) / GROUP;
  const int64_t size = (heads + parts - 1) / parts;
#pragma omp parallel
  {
    std::vector<float> p(static_cast<size_t>(GROUP * L));
#pragma omp for schedule(static)
    for (int64_t u = 0; u < Hkv * parts * M; ++u) {
      const int64_t i = u % M, gp = u / M, g = gp / parts, h0 = g * heads + (gp % parts) * size;
      const int64_t h1 = std::min(h0 + size, (g + 1) * heads);
      const Chunk c = chunk_of(h0, h1, i, [&](int64_t h, int64_t) { return p.data() + (h - h0) * L; });
      for (int64_t t0 = 0; t0 < common; t0 += KEY_TILE)
        c.scores(kp + g * k_h, nullptr, 0, t0, std::min(common, t0 + KEY_TILE), D, scale);
      c.scores(kp + g * k_h, tail_keys(i), common, common, seen[i], D, scale);
      float sums[GROUP];
      for (int r = 0; r < c.n; ++r) sums[r] = softmax_weights(c.p[r], seen[i]);
      for (const auto& [d, width] : blocks) {
        for (int r = 0; r < c.n; ++r) std::fill(c.o[r] + d, c.o[r] + d + width, 0.0f);
        for (int64_t t0 = 0; t0 < common; t0 += KEY_TILE)
          c.values(vp + g * v_h, nullptr, 0, t0, std::min(common, t0 + KEY_TILE), D, d, width);
        c.values(vp + g * v_h, tail_keys(i), common, common, seen[i], D, d, width);
        for (int r = 0; r < c.n; ++r)
          for (int64_t e = d; e < d + width; ++e) c.o[r][e] /= sums[r];
      }
    }
  }
}

// k or v as attend reads it: rows of D contiguous floats (any head stride), else a contiguous copy.
torch::Tensor kv_rows(const torch::Tensor& t) {
  return t.dim() == 3 && t.stride(2) == 1 && t.stride(1) == t.size(2) && t.stride(0) >= t.size(1) * t.size(2)
             ? t
             : t.contiguous();
}

void check_kv(const torch::Tensor& k, const torch::Tensor& v, int64_t H, int64_t M, int64_t D) {
  TORCH_CHECK(k.dim() == 3 && v.dim() == 3, "k and v must be [Hkv, L, D]");
  TORCH_CHECK(k.scalar_type() == torch::kFloat32 && v.scalar_type() == torch::kFloat32, "attention takes float32");
  TORCH_CHECK(k.size(2) == D && v.size(2) == D && v.size(1) == k.size(1) && v.size(0) == k.size(0),
              "k and v must match q");
  TORCH_CHECK(k.size(0) > 0 && H % k.size(0) == 0, "query heads must be a multiple of key/value heads");
  TORCH_CHECK(k.size(1) >= M, "the cache must hold the rows' own keys (L >= M)");
}

torch::Tensor attention_rows(torch::Tensor q, torch::Tensor k, torch::Tensor v, double scaling, int64_t variant) {
  // q [H, M, D]; k, v [Hkv, L, D], float32
  TORCH_CHECK(q.dim() == 3 && q.scalar_type() == torch::kFloat32, "q must be float32 [H, M, D]");
  q = q.contiguous();
  k = kv_rows(k);
  v = kv_rows(v);
  const int64_t H = q.size(0), M = q.size(1), D = q.size(2);
  check_kv(k, v, H, M, D);
  auto out = torch::empty({H, M, D}, q.options());
  attend(q.data_ptr<float>(), M * D, D, k.data_ptr<float>(), k.stride(0), v.data_ptr<float>(), v.stride(0),
         out.data_ptr<float>(), M * D, D, H, M, D, k.size(0), k.size(1), static_cast<float>(scaling), nullptr, 0, 0,
         variant);
  return out;
}

// The same attention on a layer's own layout: q [M, H * D] as the projection wrote it, the output
// [M, H * D] as the output projection reads it (no transposes between the calls).
// With ``visible`` (bool or uint8 [R, T], R <= T, R <= M): which of the cache's last T entries each
// of the last R rows sees (a token tree's ancestors; each must see its own entry, the last M being the
// rows' own), each also seeing every entry before them; the rows before the mask's are causal.
torch::Tensor attention_md(torch::Tensor q, torch::Tensor k, torch::Tensor v, int64_t H, double scaling,
                           c10::optional<torch::Tensor> visible = c10::nullopt) {
  TORCH_CHECK(q.dim() == 2 && q.scalar_type() == torch::kFloat32 && H > 0 && q.size(1) % H == 0,
              "q must be float32 [M, H * D]");
  q = q.contiguous();
  k = kv_rows(k);
  v = kv_rows(v);
  const int64_t M = q.size(0), D = q.size(1) / H;
  check_kv(k, v, H, M, D);
  torch::Tensor mask;
  int64_t R = 0, T = 0;
  if (visible.has_value()) {
    mask = visible->to(torch::kUInt8).contiguous();
    R = mask.dim() == 2 ? mask.size(0) : -1;
    T = mask.dim() == 2 ? mask.size(1) : -1;
    TORCH_CHECK(mask.dim() == 2 && R >= 1 && R <= M && T >= R && T <= k.size(1),
                "visible must be [R, T] for the last R rows (R <= M) with R <= T <= the cache's length");
    const uint8_t* mp = mask.data_ptr<uint8_t>();
    for (int64_t r = 0; r < R; ++r)
      TORCH_CHECK(mp[r * T + T - R + r], "row ", M - R + r, " must see its own entry");
  }
  auto out = torch::empty({M, H * D}, q.options());
  attend(q.data_ptr<float>(), D, H * D, k.data_ptr<float>(), k.stride(0), v.data_ptr<float>(), v.stride(0),
         out.data_ptr<float>(), D, H * D, H, M, D, k.size(0), k.size(1), static_cast<float>(scaling),
         visible.has_value() ? mask.data_ptr<uint8_t>() : nullptr, R, T);
  return out;
}

// ---------------------------------------------------------------- a decoder layer's row-wise steps
//
// The norm, rotary embedding, residual and gated activation of a Llama-family decoder layer, one
// call each instead of ~40 small torch ops per layer (whose dispatch alone cost ~10 ms of a ~30 ms
// one-token step). Every output element depends on its own row only, computed in one fixed order,
// so these keep a row's bits independent of M like the kernels above.

void check_rows(const torch::Tensor& x, const char* name) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32 && x.is_contiguous(), name,
              " must be a contiguous float32 [M, N]");
}

// One 8-lane product accumulator over D, lanes summed pairwise, the D % 8 tail one by one.
inline float dot8(const float* a, const float* b, int64_t D) {
  __m256 acc = _mm256_setzero_ps();
  int64_t d = 0;
  for (; d + 8 <= D; d += 8) acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_loadu_ps(a + d), _mm256_loadu_ps(b + d)));
  float s = hsum8(acc);
  for (; d < D; ++d) s += a[d] * b[d];
  return s;
}

// y = w * (x * 1/sqrt(mean(x^2) + eps)), the sum of squares in dot8's order.
void norm_row(const float* x, const float* w, float* y, int64_t N, float eps) {
  const float r = 1.0f / std::sqrt(dot8(x, x, N) / static_cast<float>(N) + eps);
  for (int64_t i = 0; i < N; ++i) y[i] = w[i] * (x[i] * r);
}

torch::Tensor rms_norm(torch::Tensor x, torch::Tensor w, double eps) {
  check_rows(x, "x");
  TORCH_CHECK(w.dim() == 1 && w.numel() == x.size(1) && w.scalar_type() == torch::kFloat32 && w.is_contiguous(),
              "the norm's weight must be float32 [N]");
  auto y = torch::empty_like(x);
  const int64_t M = x.size(0), N = x.size(1);
  for (int64_t m = 0; m < M; ++m)
    norm_row(x.data_ptr<float>() + m * N, w.data_ptr<float>(), y.data_ptr<float>() + m * N, N,
             static_cast<float>(eps));
  return y;
}

// (x + r, rms_norm(x + r)): a residual step and the next norm, x left as it was.
std::vector<torch::Tensor> add_rms_norm(torch::Tensor x, torch::Tensor r, torch::Tensor w, double eps) {
  check_rows(x, "x");
  check_rows(r, "r");
  TORCH_CHECK(x.sizes() == r.sizes(), "x and r must have one shape");
  auto s = torch::empty_like(x);
  const int64_t n = x.numel();
  const float *xp = x.data_ptr<float>(), *rp = r.data_ptr<float>();
  float* sp = s.data_ptr<float>();
  for (int64_t i = 0; i < n; ++i) sp[i] = xp[i] + rp[i];
  return {s, rms_norm(s, w, eps)};
}

// In place on t [M, heads * D]: t * cos + rotate_half(t) * sin per head, cos and sin [M, D] (the
// model's own rotary tables). The products and the sum are the ones transformers spells, so the
// bits are those of its apply_rotary_pos_emb.
void rope_(torch::Tensor t, torch::Tensor cos, torch::Tensor sin, int64_t heads) {
  check_rows(t, "t");
  check_rows(cos, "cos");
  check_rows(sin, "sin");
  const int64_t M = t.size(0), D = cos.size(1), half = D / 2;
  TORCH_CHECK(heads > 0 && t.size(1) == heads * D && D % 2 == 0 && cos.size(0) == M && sin.sizes() == cos.sizes(),
              "t must be [M, heads * D] with cos and sin [M, D]");
  float* tp = t.data_ptr<float>();
  for (int64_t m = 0; m < M; ++m) {
    const float* c = cos.data_ptr<float>() + m * D;
    const float* s = sin.data_ptr<float>() + m * D;
    for (int64_t h = 0; h < heads; ++h) {
      float* x = tp + (m * heads + h) * D;
      for (int64_t i = 0; i < half; ++i) {
        const float a = x[i], b = x[i + half];
        x[i] = a * c[i] + (-b) * s[i];
        x[i + half] = b * c[i + half] + a * s[i + half];
      }
    }
  }
}

// silu(g) * u = g / (1 + exp(-g)) * u, 8 elements at a time (the tail through a padded copy, so an
// element's bits do not depend on where it falls).
inline void silu_mul8(const float* g, const float* u, float* out) {
  const __m256 gv = _mm256_loadu_ps(g);
  const __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), gv));
  _mm256_storeu_ps(out, _mm256_mul_ps(_mm256_div_ps(gv, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), _mm256_loadu_ps(u)));
}

torch::Tensor silu_mul(torch::Tensor g, torch::Tensor u) {
  check_rows(g, "g");
  check_rows(u, "u");
  TORCH_CHECK(g.sizes() == u.sizes(), "g and u must have one shape");
  auto out = torch::empty_like(g);
  const float *gp = g.data_ptr<float>(), *up = u.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t n = g.numel(), whole = n / 8;
  at::parallel_for(0, whole, 256, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) silu_mul8(gp + 8 * b, up + 8 * b, op + 8 * b);
  });
  if (n % 8) {
    float gt[8] = {0}, ut[8] = {0}, ot[8];
    std::memcpy(gt, gp + 8 * whole, (n % 8) * sizeof(float));
    std::memcpy(ut, up + 8 * whole, (n % 8) * sizeof(float));
    silu_mul8(gt, ut, ot);
    std::memcpy(op + 8 * whole, ot, (n % 8) * sizeof(float));
  }
  return out;
}

}  // namespace

// layer.cpp includes this file for its kernels and binds its own module.
#ifndef HARNESS_KERNELS_ONLY
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("linear_f32", &linear_f32, "batch-invariant x @ w.T, float32 weights", py::arg("x"), py::arg("w"),
        py::arg("force_avx2") = false);
  m.def("linear_bf16", &linear_bf16, "batch-invariant x @ w.T, bfloat16 weights, float32 accumulation",
        py::arg("x"), py::arg("w"), py::arg("force_avx2") = false);
  m.def("linear_i8", &linear_i8, "batch-invariant (x @ w.T) * scale, int8 weights, float32 accumulation",
        py::arg("x"), py::arg("w"), py::arg("scale"), py::arg("force_avx2") = false);
  m.def("float_isa", []() { return std::string(has_avx512() ? "avx512" : "avx2"); },
        "instruction set the float-accumulating kernels use on this CPU");
  m.def("linear_i8a8", &linear_i8a8, "batch-invariant int8 x int8 linear, activations quantized per row",
        py::arg("x"), py::arg("w"), py::arg("wscale"), py::arg("wsum"), py::arg("force_avx2") = false);
  m.def("attention_rows", &attention_rows,
        "batch-invariant causal attention, one fixed order per row (variant: -1 this host's, 0 AVX2, 1 AVX-512)",
        py::arg("q"), py::arg("k"), py::arg("v"), py::arg("scaling"), py::arg("variant") = -1);
  m.def("attention_md", &attention_md, "attention_rows on q [M, H * D], output [M, H * D]", py::arg("q"),
        py::arg("k"), py::arg("v"), py::arg("heads"), py::arg("scaling"), py::arg("visible") = py::none());
  m.def("rms_norm", &rms_norm, "row-wise RMS norm in one fixed order", py::arg("x"), py::arg("w"), py::arg("eps"));
  m.def("add_rms_norm", &add_rms_norm, "(x + r, rms_norm(x + r))", py::arg("x"), py::arg("r"), py::arg("w"),
        py::arg("eps"));
  m.def("rope_", &rope_, "rotary embedding in place, rotate-half convention", py::arg("t"), py::arg("cos"),
        py::arg("sin"), py::arg("heads"));
  m.def("silu_mul", &silu_mul, "silu(g) * u, element by element", py::arg("g"), py::arg("u"));
  m.def("i8a8_isa", &i8a8_isa, "instruction set linear_i8a8 uses on this CPU");
  m.def("linear_i4", &linear_i4, "batch-invariant x @ dequant(w).T, int4 group-wise weights, float32 accumulation",
        py::arg("x"), py::arg("w"), py::arg("scale"), py::arg("offset"), py::arg("group"),
        py::arg("force_avx2") = false);
}
#endif
