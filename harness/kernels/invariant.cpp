// Batch-invariant matrix-vector kernels for CPU (AVX2 + FMA).
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
#include <immintrin.h>
#include <cstdint>
#include <cstring>
#include <algorithm>
#include <cmath>

namespace {

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

template <typename W>
void kernel(const float* x, const W& w, float* y, int64_t M, int64_t N, int64_t K) {
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

torch::Tensor linear_f32(torch::Tensor x, torch::Tensor w) {
  check(x, w);
  TORCH_CHECK(w.scalar_type() == torch::kFloat32, "w must be float32");
  auto y = out(x, w.size(0));
  kernel(x.data_ptr<float>(), F32W{w.data_ptr<float>(), w.size(1)}, y.data_ptr<float>(), x.size(0), w.size(0),
         x.size(1));
  return y;
}

torch::Tensor linear_bf16(torch::Tensor x, torch::Tensor w) {
  check(x, w);
  TORCH_CHECK(w.scalar_type() == torch::kBFloat16, "w must be bfloat16");
  auto y = out(x, w.size(0));
  kernel(x.data_ptr<float>(), BF16W{reinterpret_cast<const uint16_t*>(w.data_ptr()), w.size(1)},
         y.data_ptr<float>(), x.size(0), w.size(0), x.size(1));
  return y;
}

torch::Tensor linear_i8(torch::Tensor x, torch::Tensor w, torch::Tensor scale) {
  check(x, w);
  TORCH_CHECK(w.scalar_type() == torch::kInt8, "w must be int8");
  TORCH_CHECK(scale.scalar_type() == torch::kFloat32 && scale.numel() == w.size(0) && scale.is_contiguous(),
              "scale must be float32 [N]");
  auto y = out(x, w.size(0));
  kernel(x.data_ptr<float>(), I8W{w.data_ptr<int8_t>(), scale.data_ptr<float>(), w.size(1)}, y.data_ptr<float>(),
         x.size(0), w.size(0), x.size(1));
  return y;
}

torch::Tensor linear_i4(torch::Tensor x, torch::Tensor w, torch::Tensor scale, torch::Tensor offset,
                        int64_t group) {
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
         y.data_ptr<float>(), x.size(0), N, K);
  return y;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("linear_f32", &linear_f32, "batch-invariant x @ w.T, float32 weights");
  m.def("linear_bf16", &linear_bf16, "batch-invariant x @ w.T, bfloat16 weights, float32 accumulation");
  m.def("linear_i8", &linear_i8, "batch-invariant (x @ w.T) * scale, int8 weights, float32 accumulation");
  m.def("linear_i4", &linear_i4, "batch-invariant x @ dequant(w).T, int4 group-wise weights, float32 accumulation");
}
