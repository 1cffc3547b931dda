// Batch-invariant products of GGUF k-quant weight blocks (Q4_K, Q6_K) with int8 activation blocks.
//
// Why by hand: no library runs a GGUF file's own blocks from torch with a reduction order that does
// not depend on how many rows are computed together (ggml's CPU kernels are not callable from torch,
// and their row order is ggml's own business). Reading the 4-bit blocks as stored is what puts a
// one-token step at the memory limit: ~4.6 bits per weight instead of 8 for int8.
//
// Activations are quantized per row in blocks of 256 (one float scale each, codes in [-127, 127],
// round to nearest even), like ggml's Q8_K. Each block's products are integer sums (exact in any
// order, so the AVX-512 VNNI and the AVX2 paths hold the same integers lane for lane), scaled into
// float lanes block after block in the same order by both paths, and the lanes summed in one fixed
// pairwise order at the end. A row's output therefore depends on that row's values only:
// batch-invariant by construction, and the same bits on either instruction set.
//
// Layouts (repacked once at load by harness.kquants):
//   activations: within every 128 codes, the order [0..31, 64..95, 32..63, 96..127] ("nibble
//     order"), so one 64-byte load lines up with the low or high nibbles of 64 weight bytes;
//     int16 sums of each 16 codes in natural order;
//   Q4_K: qs exactly as in the file (32-byte chunk c holds codes 64c+l in its low nibbles and
//     64c+32+l in its high ones), the 6-bit scales and mins decoded to bytes, d and dmin as float;
//   Q6_K: the low 4 bits in the Q4_K nibble layout, the high 2 bits regrouped so one 64-byte load
//     serves all four nibble vectors (see harness/kquants.py), int8 scales, d as float.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

namespace {

constexpr int64_t QK = 256;  // weights (and activation codes) per block
constexpr int64_t RB = 8;    // activation rows per pass over a weight row (registers hold their sums)

#define AVX512 __attribute__((target("avx2,fma,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))
#define AVX2 __attribute__((target("avx2,fma")))

bool has_vnni() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512vnni");
}

inline int64_t nibble_pos(int64_t k) {
  static const int64_t slot[4] = {0, 2, 1, 3};
  return (k & ~int64_t{127}) + slot[(k & 127) >> 5] * 32 + (k & 31);
}

struct Act {
  std::vector<int8_t> q;   // [M, K] in nibble order
  std::vector<float> d;    // [M, nb]
  std::vector<int16_t> s;  // [M, K / 16]
  int64_t K, nb;
};

// Scalar on purpose: both kernel paths read the same codes, and the cost is one pass over x.
void quantize_row(const float* x, int64_t K, int8_t* q, float* d, int16_t* s) {
  for (int64_t b = 0; b < K / QK; ++b) {
    const float* xb = x + b * QK;
    int8_t* qb = q + b * QK;
    int16_t* sb = s + b * (QK / 16);
    float amax = 0.0f;
    bool finite = true;
    for (int64_t i = 0; i < QK; ++i) {
      finite = finite && std::isfinite(xb[i]);
      amax = std::max(amax, std::fabs(xb[i]));
    }
    std::memset(qb, 0, QK);
    std::memset(sb, 0, sizeof(int16_t) * (QK / 16));
    if (!finite) {  // no scale represents a non-finite block: the output is NaN, as a float matmul's
      d[b] = std::numeric_limits<float>::quiet_NaN();
      continue;
    }
    if (amax == 0.0f) {
      d[b] = 0.0f;
      continue;
    }
    const float inv = 127.0f / amax;
    d[b] = amax / 127.0f;
    for (int64_t i = 0; i < QK; ++i) {
      const float v = std::min(127.0f, std::max(-127.0f, std::nearbyint(xb[i] * inv)));
      const int8_t c = static_cast<int8_t>(v);
      qb[nibble_pos(i)] = c;
      sb[i / 16] = static_cast<int16_t>(sb[i / 16] + c);
    }
  }
}

Act quantize(const torch::Tensor& x) {
  const int64_t M = x.size(0), K = x.size(1);
  Act a{std::vector<int8_t>(M * K), std::vector<float>(M * (K / QK)), std::vector<int16_t>(M * (K / 16)), K,
        K / QK};
  const float* xp = x.data_ptr<float>();
  for (int64_t m = 0; m < M; ++m)
    quantize_row(xp + m * K, K, a.q.data() + m * K, a.d.data() + m * a.nb, a.s.data() + m * (K / 16));
  return a;
}

// Blocks as the kernels read them: one contiguous record per 256 weights, so a weight row is one
// sequential stream.
//   Q4_K (152 bytes): qs[128] (the file's), scales[8], mins[8] (6-bit values as bytes), d, dmin (float)
//   Q6_K (212 bytes): ql[128] (nibble layout), qh[64] (regrouped), scales[16] (int8), d (float)
constexpr int64_t Q4K_BYTES = 152, Q6K_BYTES = 212;

inline float f32_at(const uint8_t* p) {
  float f;
  std::memcpy(&f, p, 4);
  return f;
}

// Float arithmetic, the same in both paths: per block, the integer lane sums are converted and
// scaled lane by lane into 16 float lanes (AVX2 keeps them as two 8-lane halves) and the min or
// offset term into 8 more; a row ends with (lanes 0-7 + lanes 8-15) summed pairwise, minus the
// other 8 summed pairwise. Integer sums are exact, so equal lanes hold equal integers in both paths.

AVX2 inline int32_t hsum8_epi32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

AVX2 inline float hsum8_ps(__m256 v) {
  // fixed pairwise order: (0+4, 1+5, 2+6, 3+7), then (a+c, b+d), then (e+f)
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 0x1));
  return _mm_cvtss_f32(s);
}

// The 8 mins of a Q4_K block as 16 int16 lanes, each twice: one per 16-code activation sum.
AVX2 inline __m256i q4k_mins(const uint8_t* mn) {
  const __m128i twice = _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
  return _mm256_cvtepu8_epi16(_mm_shuffle_epi8(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(mn)), twice));
}

AVX2 inline __m256 scaled(__m256 acc, __m256i lanes, float f) {
  return _mm256_add_ps(acc, _mm256_mul_ps(_mm256_cvtepi32_ps(lanes), _mm256_set1_ps(f)));
}

// One block's weights decoded for the products: 4 nibble vectors of 64 codes (AVX2: 8 of 32), the
// int16 scale per lane, and the 16 int16 terms that multiply the activations' 16-code sums.
struct Q4KTag {};
struct Q6KTag {};

// ---------------------------------------------------------------- AVX2 (32 codes per load)

AVX2 inline void decode_avx2(Q4KTag, const uint8_t* blk, __m256i (&W)[8], __m256i (&S)[8], __m256i& off) {
  const __m256i low = _mm256_set1_epi8(0x0F);
  for (int c = 0; c < 4; ++c) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 32 * c));
    W[2 * c] = _mm256_and_si256(v, low);
    W[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
    S[2 * c] = _mm256_set1_epi16(blk[128 + 2 * c]);
    S[2 * c + 1] = _mm256_set1_epi16(blk[128 + 2 * c + 1]);
  }
  off = q4k_mins(blk + 136);
}

AVX2 inline void decode_avx2(Q6KTag, const uint8_t* blk, __m256i (&W)[8], __m256i (&S)[8], __m256i& off) {
  const __m256i low = _mm256_set1_epi8(0x0F), top = _mm256_set1_epi8(0x30);
  const int8_t* sc = reinterpret_cast<const int8_t*>(blk + 192);
  for (int c = 0; c < 4; ++c) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 32 * c));
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 128 + 32 * (c % 2)));
    const __m256i hl = c < 2 ? _mm256_slli_epi16(h, 4) : h;
    const __m256i hh = c < 2 ? _mm256_slli_epi16(h, 2) : _mm256_srli_epi16(h, 2);
    W[2 * c] = _mm256_or_si256(_mm256_and_si256(v, low), _mm256_and_si256(hl, top));
    W[2 * c + 1] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), low), _mm256_and_si256(hh, top));
    S[2 * c] = _mm256_set_m128i(_mm_set1_epi16(sc[4 * c + 1]), _mm_set1_epi16(sc[4 * c]));
    S[2 * c + 1] = _mm256_set_m128i(_mm_set1_epi16(sc[4 * c + 3]), _mm_set1_epi16(sc[4 * c + 2]));
  }
  off = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sc)));
}

// Float factors of a block: (for the lane sums, for the activation-sum term)
inline void factors(Q4KTag, const uint8_t* blk, float ad, float& fv, float& fo) {
  fv = ad * f32_at(blk + 144);
  fo = ad * f32_at(blk + 148);
}
inline void factors(Q6KTag, const uint8_t* blk, float ad, float& fv, float& fo) {
  const float d = f32_at(blk + 208);
  fv = ad * d;
  fo = ad * (32.0f * d);  // codes are stored as q + 32
}

template <typename Tag, int R>
AVX2 void rows_avx2(const uint8_t* wrow, const Act& a, int64_t m0, float* y, int64_t bytes) {
  __m256 vlo[R], vhi[R], vo[R];
  for (int r = 0; r < R; ++r) vlo[r] = vhi[r] = vo[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < a.nb; ++b) {
    const uint8_t* blk = wrow + b * bytes;
    __m256i W[8], S[8], off;
    decode_avx2(Tag{}, blk, W, S, off);
    for (int r = 0; r < R; ++r) {
      const int64_t m = m0 + r;
      const int8_t* q = a.q.data() + m * a.K + b * QK;
      __m256i even = _mm256_setzero_si256(), odd = _mm256_setzero_si256();
      for (int c = 0; c < 4; ++c) {
        const int8_t* al = q + 128 * (c / 2) + 32 * (c % 2);
        const __m256i xl = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(al));
        const __m256i xh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(al + 64));
        const __m256i t = _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(W[2 * c], xl), S[2 * c]),
                                           _mm256_madd_epi16(_mm256_maddubs_epi16(W[2 * c + 1], xh), S[2 * c + 1]));
        if (c % 2 == 0) even = _mm256_add_epi32(even, t);
        else odd = _mm256_add_epi32(odd, t);
      }
      const __m256i bs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.s.data() + m * (a.K / 16) + b * 16));
      float fv, fo;
      factors(Tag{}, blk, a.d[m * a.nb + b], fv, fo);
      vlo[r] = scaled(vlo[r], even, fv);
      vhi[r] = scaled(vhi[r], odd, fv);
      vo[r] = scaled(vo[r], _mm256_madd_epi16(off, bs), fo);
    }
  }
  for (int r = 0; r < R; ++r) y[r] = hsum8_ps(_mm256_add_ps(vlo[r], vhi[r])) - hsum8_ps(vo[r]);
}

// ---------------------------------------------------------------- AVX-512 (64 codes per load)

// int16 lane -> which entry of the block's scales (as int16 lanes) multiplies it, per nibble vector.
AVX512 __m512i lane_index(const int (&four)[4]) {
  alignas(64) int16_t idx[32];
  for (int i = 0; i < 32; ++i) idx[i] = static_cast<int16_t>(four[i / 8]);
  return _mm512_load_si512(idx);
}

AVX512 inline void decode_512(Q4KTag, const uint8_t* blk, const __m512i (&I)[4], __m512i (&W)[4], __m512i (&S)[4],
                              __m256i& off) {
  const __m512i low = _mm512_set1_epi8(0x0F);
  const __m512i v0 = _mm512_loadu_si512(blk), v1 = _mm512_loadu_si512(blk + 64);
  W[0] = _mm512_and_si512(v0, low);
  W[1] = _mm512_and_si512(_mm512_srli_epi16(v0, 4), low);
  W[2] = _mm512_and_si512(v1, low);
  W[3] = _mm512_and_si512(_mm512_srli_epi16(v1, 4), low);
  const __m512i sc =
      _mm512_castsi128_si512(_mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk + 128))));
  for (int j = 0; j < 4; ++j) S[j] = _mm512_permutexvar_epi16(I[j], sc);
  off = q4k_mins(blk + 136);
}

AVX512 inline void decode_512(Q6KTag, const uint8_t* blk, const __m512i (&I)[4], __m512i (&W)[4], __m512i (&S)[4],
                              __m256i& off) {
  const __m512i low = _mm512_set1_epi8(0x0F), top = _mm512_set1_epi8(0x30);
  const __m512i v0 = _mm512_loadu_si512(blk), v1 = _mm512_loadu_si512(blk + 64);
  const __m512i h = _mm512_loadu_si512(blk + 128);
  W[0] = _mm512_or_si512(_mm512_and_si512(v0, low), _mm512_and_si512(_mm512_slli_epi16(h, 4), top));
  W[1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(v0, 4), low), _mm512_and_si512(_mm512_slli_epi16(h, 2), top));
  W[2] = _mm512_or_si512(_mm512_and_si512(v1, low), _mm512_and_si512(h, top));
  W[3] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(v1, 4), low), _mm512_and_si512(_mm512_srli_epi16(h, 2), top));
  off = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 192)));
  const __m512i sc = _mm512_castsi256_si512(off);
  for (int j = 0; j < 4; ++j) S[j] = _mm512_permutexvar_epi16(I[j], sc);
}

template <typename Tag>
AVX512 void indices(Tag, __m512i (&I)[4]) {
  if constexpr (std::is_same_v<Tag, Q4KTag>) {
    I[0] = lane_index({0, 0, 2, 2});
    I[1] = lane_index({1, 1, 3, 3});
    I[2] = lane_index({4, 4, 6, 6});
    I[3] = lane_index({5, 5, 7, 7});
  } else {
    I[0] = lane_index({0, 1, 4, 5});
    I[1] = lane_index({2, 3, 6, 7});
    I[2] = lane_index({8, 9, 12, 13});
    I[3] = lane_index({10, 11, 14, 15});
  }
}

template <typename Tag, int R>
AVX512 void rows_512(const uint8_t* wrow, const Act& a, int64_t m0, float* y, int64_t bytes) {
  __m512i I[4];
  indices(Tag{}, I);
  __m512 v[R];
  __m256 vo[R];
  for (int r = 0; r < R; ++r) {
    v[r] = _mm512_setzero_ps();
    vo[r] = _mm256_setzero_ps();
  }
  for (int64_t b = 0; b < a.nb; ++b) {
    const uint8_t* blk = wrow + b * bytes;
    _mm_prefetch(reinterpret_cast<const char*>(blk + 4 * bytes), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(blk + 4 * bytes + 64), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(blk + 4 * bytes + 128), _MM_HINT_T0);
    __m512i W[4], S[4];
    __m256i off;
    decode_512(Tag{}, blk, I, W, S, off);
    for (int r = 0; r < R; ++r) {
      const int64_t m = m0 + r;
      const int8_t* q = a.q.data() + m * a.K + b * QK;
      __m512i s = _mm512_setzero_si512();
      for (int j = 0; j < 4; ++j)
        s = _mm512_dpwssd_epi32(s, _mm512_maddubs_epi16(W[j], _mm512_loadu_si512(q + 64 * j)), S[j]);
      const __m256i bs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.s.data() + m * (a.K / 16) + b * 16));
      float fv, fo;
      factors(Tag{}, blk, a.d[m * a.nb + b], fv, fo);
      v[r] = _mm512_add_ps(v[r], _mm512_mul_ps(_mm512_cvtepi32_ps(s), _mm512_set1_ps(fv)));
      vo[r] = scaled(vo[r], _mm256_madd_epi16(off, bs), fo);
    }
  }
  for (int r = 0; r < R; ++r) {
    const __m256 lo = _mm512_castps512_ps256(v[r]), hi = _mm512_extractf32x8_ps(v[r], 1);
    y[r] = hsum8_ps(_mm256_add_ps(lo, hi)) - hsum8_ps(vo[r]);
  }
}

// ---------------------------------------------------------------- drivers

template <typename Tag, int R>
void rows(bool avx512, const uint8_t* wrow, const Act& a, int64_t m0, float* y, int64_t bytes) {
  if (avx512) rows_512<Tag, R>(wrow, a, m0, y, bytes);
  else rows_avx2<Tag, R>(wrow, a, m0, y, bytes);
}

template <typename Tag>
torch::Tensor run(const torch::Tensor& x, const torch::Tensor& blocks, int64_t bytes, bool force_avx2) {
  const Act a = quantize(x);
  const int64_t M = x.size(0), N = blocks.size(0);
  TORCH_CHECK(blocks.dim() == 2 && blocks.size(1) == a.nb * bytes && blocks.is_contiguous() &&
                  blocks.element_size() == 1,
              "blocks must be contiguous bytes [N, K / 256 * ", bytes, "]");
  const bool avx512 = !force_avx2 && has_vnni();
  auto y = torch::empty({M, N}, x.options());
  float* yp = y.data_ptr<float>();
  const uint8_t* w = blocks.data_ptr<uint8_t>();
  // Each output column is computed whole by one thread, in the order above: the split over threads
  // and rows changes nothing in the bits. torch's own thread pool, so the kernels and the model's
  // other ops share one set of threads.
  at::parallel_for(0, N, 16, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      const uint8_t* wrow = w + n * a.nb * bytes;
      float out[RB];
      for (int64_t m0 = 0; m0 < M; m0 += RB) {
        const int64_t r = std::min(RB, M - m0);
        switch (r) {
          case 1: rows<Tag, 1>(avx512, wrow, a, m0, out, bytes); break;
          case 2: rows<Tag, 2>(avx512, wrow, a, m0, out, bytes); break;
          case 3: rows<Tag, 3>(avx512, wrow, a, m0, out, bytes); break;
          case 4: rows<Tag, 4>(avx512, wrow, a, m0, out, bytes); break;
          case 5: rows<Tag, 5>(avx512, wrow, a, m0, out, bytes); break;
          case 6: rows<Tag, 6>(avx512, wrow, a, m0, out, bytes); break;
          case 7: rows<Tag, 7>(avx512, wrow, a, m0, out, bytes); break;
          default: rows<Tag, 8>(avx512, wrow, a, m0, out, bytes); break;
        }
        for (int64_t i = 0; i < r; ++i) yp[(m0 + i) * N + n] = out[i];
      }
    }
  });
  return y;
}

void check_x(const torch::Tensor& x) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32 && x.is_contiguous(),
              "x must be a contiguous float32 [M, K]");
  TORCH_CHECK(x.size(1) % QK == 0, "K must be a multiple of 256 (the k-quant block)");
}

torch::Tensor linear_q4k(torch::Tensor x, torch::Tensor blocks, bool force_avx2) {
  check_x(x);
  return run<Q4KTag>(x, blocks, Q4K_BYTES, force_avx2);
}

torch::Tensor linear_q6k(torch::Tensor x, torch::Tensor blocks, bool force_avx2) {
  check_x(x);
  return run<Q6KTag>(x, blocks, Q6K_BYTES, force_avx2);
}

// The activation codes as the kernels see them, in natural order: for tests and the reference.
std::vector<torch::Tensor> quantize_act(torch::Tensor x) {
  check_x(x);
  const Act a = quantize(x);
  const int64_t M = x.size(0), K = x.size(1);
  auto q = torch::empty({M, K}, torch::kInt8);
  int8_t* qp = q.data_ptr<int8_t>();
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k) qp[m * K + k] = a.q[m * K + nibble_pos(k)];
  auto d = torch::from_blob(const_cast<float*>(a.d.data()), {M, a.nb}, torch::kFloat32).clone();
  return {q, d};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("linear_q4k", &linear_q4k, "batch-invariant x @ Q4_K(w).T, int8 activation blocks", py::arg("x"),
        py::arg("blocks"), py::arg("force_avx2") = false);
  m.def("linear_q6k", &linear_q6k, "batch-invariant x @ Q6_K(w).T, int8 activation blocks", py::arg("x"),
        py::arg("blocks"), py::arg("force_avx2") = false);
  m.def("quantize_act", &quantize_act, "the int8 activation codes and block scales the kernels use",
        py::arg("x"));
  m.def("isa", []() { return std::string(has_vnni() ? "avx512vnni" : "avx2"); },
        "instruction set the k-quant kernels use on this CPU");
}
