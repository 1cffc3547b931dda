// Batch-invariant products of GGUF k-quant weight blocks (Q4_K, Q6_K) with int8 activation blocks.
//
// Why by hand: no library runs a GGUF file's own blocks from torch with a reduction order that does
// not depend on how many rows are computed together (ggml's CPU kernels are not callable from torch,
// and their row order is ggml's own business). Reading the 4-bit blocks as stored is what puts a
// one-token step at the memory limit: ~4.6 bits per weight instead of 8 for int8.
//
// Activations are quantized per row in blocks of 256 (one float scale each, codes in [-127, 127],
// round to nearest even), like ggml's Q8_K. Weights are re-packed once at load (harness.kquants) so
// that a vector's lanes are output columns: every product of a block is an integer sum (exact in any
// order, so the AVX-512 VNNI path and the AVX2 path hold the same integers), and the float steps
// after it are per column and the same in both paths. A row's output therefore depends on that row's
// values only: batch-invariant by construction, and the same bits on either instruction set.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "host.h"
#include "split.h"

namespace {

constexpr int64_t QK = 256;  // weights (and activation codes) per block

#define AVX512 __attribute__((target("avx2,fma,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))
#define AVX2 __attribute__((target("avx2,fma,f16c")))
// A block of a kernel: inlined into its loop, so the accumulators stay in registers.
#define ALWAYS_INLINE inline __attribute__((always_inline))

bool has_vnni() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512vnni");
}

// Weights as the kernels read them: output columns in groups of 16, and for each group and block
// one record, so a group's weights are one sequential stream. A record starts with its scales (and
// Q4_K's mins) and d (and dmin), then the codes, and a kernel touches its lines in that order, so
// the hardware prefetchers see one rising stream. With the scales behind the codes, read between
// them sub-block by sub-block, the stream stepped back 2 KB a sub-block and the prefetchers lost it:
// on AMD EPYC Zen 4 a one-row Q4_K product took 1.1-1.6x the time of a plain read of its bytes,
// 1.02-1.17x with this order (a 233 MB weight, interleaved in one process).
//   codes: per step of 4 inputs, 16 columns x 4 codes = 64 codes (column c at bytes 4c..4c+3), so one
//     vpdpbusd multiplies them with 4 broadcast activation codes and each 32-bit lane IS one output
//     column (no horizontal sums). Q4_K: two steps per 64 bytes (low and high nibbles); Q6_K: per
//     sub-block of 4 steps, 64 bytes of low nibbles for steps 0-1, 64 for steps 2-3, and 64 bytes
//     whose bit pairs 0-1 .. 6-7 are the top two bits of steps 0 .. 3;
//   scales (and Q4_K's mins) as [pair p][column][2]: lane c holds sub-blocks 2p and 2p+1 as two int16;
//   d (and Q4_K's dmin) as 16 float16, as the file stores them (widened exactly when read).
// A row's last block keeps only the pairs of sub-blocks up to its last input (harness.kquants
// .record_subs): the rest would multiply zero padding, adding nothing to any integer sum, so the
// short record gives the same bits and a 896-wide row reads 3.5 blocks' bytes, not 4.
constexpr int64_t G = 16;  // columns per group
// Passes of two rows or more prefetch each line they load twice: PREFETCH records ahead into L1 and
// PREFETCH_FAR records ahead into the outer caches. Their products are slow enough per byte that
// the hardware prefetchers alone left the stream short (four rows at 2.0-2.9x of the memory's pace
// without, on AMD EPYC Zen 4), and with the near prefetch alone a pass took about its products'
// time (weights hot) plus the read's, as if the two did not overlap: the far one keeps lines on
// their way while the products run. Interleaved on a 116 MB weight, the far one took Q4_K 3-8 rows
// to 0.77-0.96x of their time, Q6_K 4 rows to 0.75x and 8 to 0.84x; the target's whole forward of
// 4 rows from 50-57 ms to 40-43 (one row 35-43), of 8 rows 0.77x. Two rows read 0.69-1.19x with it
// across the host's memory phases (better in three runs of five), and without it the target's
// two-row forward cost 1.3-1.6x its three-row one in the same run; with it, 0.98-1.02x. A one-row
// AVX-512 pass, on Zen 4, reads faster with neither: the prefetches take load slots and miss buffers
// the hardware streams better (without them, 0.83-0.89x of its time with the near one, ~0.67x of its
// time with the far one; with both, 0.89-1.31x, mostly slower). On AMD EPYC Zen 5 (family 26 model 2)
// the other way round: without the near one a one-row pass leaves the stream short. The target's
// one-token forward onto a 200-token cache, variants alternated in one process (medians of 24-30): with
// the near prefetch 19.96 ms against 39.3 without (the host reading 77 GB/s), 31.0 against 50.7 in a
// slower phase (46 GB/s); near and far 21.9, far alone 22.1; the near one 2 or 8 records ahead read
// as 4 did. So a one-row pass takes the near prefetch on the host kinds `host_wants_near` names.
constexpr int64_t PREFETCH = 4, PREFETCH_FAR = 8;
constexpr int64_t Q4K_REC = 2048 + 128 + 128 + 32 + 32, Q6K_REC = 3072 + 256 + 32;

// The prefetches of the line a pass loads at `p`, in records of `rec` bytes, where `on`: a macro, so
// that both instruction sets' kernels take it inline (a plain inline helper, not marked for the
// kernels' instruction set, lost its prefetches in GCC's build). The AVX-512 passes prefetch from two
// rows up (above). The AVX2 passes prefetch at every row count: on AMD EPYC Zen 3 (family 25 model 1,
// no AVX-512), the MLP's weights of the 1.5B target streamed, four rows took 0.85x and eight 0.80x
// the time with it (Q6_K four rows 0.82x), interleaved in one process; one row, which then read each
// record in two passes of a half, 0.98-1.04x, and once it read each line whole in one pass
// (`halves_avx2`), 0.93-0.96x (Q4_K) and 0.85-0.91x (Q6_K).
// The addresses are computed as integers: ahead of a group's last records they lie past the end of
// the weights (a prefetch never faults), where pointer arithmetic would be undefined.
#define PREFETCH_AT(p, bytes, hint) \
  _mm_prefetch(reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(p) + (bytes)), hint)
#define PREFETCH_LINE(on, p, rec)                        \
  do {                                                   \
    if constexpr (on) {                                  \
      PREFETCH_AT(p, PREFETCH * (rec), _MM_HINT_T0);     \
      PREFETCH_AT(p, PREFETCH_FAR * (rec), _MM_HINT_T2); \
    }                                                    \
  } while (0)
// A pass of R rows: both prefetches from two rows up; at one row the near one where NEAR1.
#define PREFETCH_PASS(R, NEAR1, p, rec)                   \
  do {                                                    \
    PREFETCH_LINE(R > 1, p, rec);                         \
    if constexpr (R == 1 && NEAR1) PREFETCH_AT(p, PREFETCH * (rec), _MM_HINT_T0); \
  } while (0)

// Whether a one-row AVX-512 pass takes the near prefetch on this host (above): on AMD from family 26
// (Zen 5) up, where it was measured to pay; elsewhere (Zen 4, where it was measured to cost, and
// hosts not measured) not. The prefetch moves no bit, only when lines arrive.
bool host_wants_near() { return amd_family() >= 26; }

// `one_row_near`: -1 this host's choice, 0 or 1 either variant (the tests run both, for their bits).
bool one_row_near(int64_t choice) { return choice < 0 ? host_wants_near() : choice != 0; }

// A record of S sub-blocks: Q4_K 16 scale and 16 min bytes per sub-block, d and dmin, then 256 code
// bytes per sub-block; Q6_K 16 scale bytes per sub-block, d, then 192 code bytes per sub-block.
constexpr int64_t q4k_rec(int64_t subs) { return 288 * subs + 64; }
constexpr int64_t q6k_rec(int64_t subs) { return 208 * subs + 32; }
// Where each part of a record of S sub-blocks starts.
constexpr int64_t q4k_mins(int64_t S) { return 16 * S; }
constexpr int64_t q4k_d(int64_t S) { return 32 * S; }
constexpr int64_t q4k_codes(int64_t S) { return 32 * S + 64; }
constexpr int64_t q6k_d(int64_t S) { return 16 * S; }
constexpr int64_t q6k_codes(int64_t S) { return 16 * S + 32; }
// Sub-blocks kept for a block holding `values` inputs: whole pairs (scales are stored by pair).
constexpr int64_t q4k_subs(int64_t values) { return 2 * ((values + 63) / 64); }
constexpr int64_t q6k_subs(int64_t values) { return 2 * ((values + 31) / 32); }

// Per block and column, integer sums: isum = sum_j scale_j * (codes . activations over sub-block j),
// imin = sum_j (Q4_K min | Q6_K scale)_j * (sum of the activations over j). Exact in any order, so
// both instruction sets hold the same integers. Then, the same float steps in both paths, block after
// block: v += float(isum) * (ad * d); o += float(imin) * (ad * dmin) (Q6_K: dmin = 32 * d, its codes
// being q + 32); y = v - o.

struct Act {
  std::vector<int8_t> q;    // [M, K] codes, natural order
  std::vector<float> d;     // [M, nb]
  std::vector<int16_t> s16;  // [M, K / 16] sums of 16 codes
  std::vector<int16_t> s32;  // [M, K / 32] sums of 32 codes
  int64_t K, nb;
  int64_t last;  // inputs in the last block (1..256): the rest of it is padding
  const int8_t* row(int64_t m) const { return q.data() + m * K; }
  // two consecutive sums as one int32 (low half first), what vpdpwssd pairs with a lane's two int16
  int32_t pair16(int64_t m, int64_t b, int p) const { return pack(s16.data() + m * (K / 16) + b * 16 + 2 * p); }
  int32_t pair32(int64_t m, int64_t b, int p) const { return pack(s32.data() + m * (K / 32) + b * 8 + 2 * p); }
  static int32_t pack(const int16_t* v) {
    int32_t out;
    std::memcpy(&out, v, 4);
    return out;
  }
};

// Eight lanes at a time (AVX2, the build's baseline, so both kernel paths read these same codes):
// the largest magnitude is exact in any order, and each code is the scalar steps' own IEEE product,
// rounded to nearest even and clamped. One call quantizes a row before the threads start, so its
// time is the threads' wait: scalar, it cost ~1 ns a value.
void quantize_row(const float* x, int64_t K, int8_t* q, float* d, int16_t* s16, int16_t* s32) {
  const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  const __m256 inf = _mm256_set1_ps(std::numeric_limits<float>::infinity());
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int64_t b = 0; b < K / QK; ++b) {
    const float* xb = x + b * QK;
    int8_t* qb = q + b * QK;
    __m256 top = _mm256_setzero_ps(), odd = _mm256_setzero_ps();
    for (int64_t i = 0; i < QK; i += 8) {
      const __m256 v = _mm256_and_ps(_mm256_loadu_ps(xb + i), magnitude);
      top = _mm256_max_ps(top, v);
      odd = _mm256_or_ps(odd, _mm256_cmp_ps(v, inf, _CMP_NLT_UQ));  // inf or NaN
    }
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, top);
    float amax = 0.0f;
    for (float l : lanes) amax = std::max(amax, l);
    std::memset(qb, 0, QK);
    if (_mm256_movemask_ps(odd) != 0) {  // no scale represents a non-finite block: the output is NaN, as a float matmul's
      d[b] = std::numeric_limits<float>::quiet_NaN();
    } else if (amax == 0.0f) {
      d[b] = 0.0f;
    } else {
      const float inv = 127.0f / amax;
      d[b] = amax / 127.0f;
      const __m256 scale = _mm256_set1_ps(inv), lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
      auto codes = [&](int64_t i) {
        const __m256 r = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(xb + i), scale),
                                         _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        return _mm256_cvtps_epi32(_mm256_min_ps(hi, _mm256_max_ps(lo, r)));
      };
      for (int64_t i = 0; i < QK; i += 32) {
        // codes are within +-127, so the saturating packs only narrow; the permute undoes their lane order
        const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(codes(i), codes(i + 8)),
                                             _mm256_packs_epi32(codes(i + 16), codes(i + 24)));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(qb + i), _mm256_permutevar8x32_epi32(p, order));
      }
    }
    for (int64_t g = 0; g < QK / 16; ++g) {
      int32_t t = 0;
      for (int64_t i = 0; i < 16; ++i) t += qb[16 * g + i];
      s16[b * 16 + g] = static_cast<int16_t>(t);
    }
    for (int64_t g = 0; g < QK / 32; ++g)
      s32[b * 8 + g] = static_cast<int16_t>(s16[b * 16 + 2 * g] + s16[b * 16 + 2 * g + 1]);
  }
}

// A row whose width is not a multiple of 256 (a 0.5B draft's 896) is quantized as if padded with
// zeros to the next one, as its weights were (harness.kquants.quantize_q4k): the zeros add nothing
// to any sum, and the last block's scale is still that row's own.
Act quantize(const torch::Tensor& x) {
  const int64_t M = x.size(0), width = x.size(1), K = (width + QK - 1) / QK * QK;
  Act a{std::vector<int8_t>(M * K), std::vector<float>(M * (K / QK)), std::vector<int16_t>(M * (K / 16)),
        std::vector<int16_t>(M * (K / 32)), K, K / QK, width - (K / QK - 1) * QK};
  const float* xp = x.data_ptr<float>();
  std::vector<float> padded(width == K ? 0 : K, 0.0f);
  for (int64_t m = 0; m < M; ++m) {
    const float* row = xp + m * width;
    if (width != K) {
      std::copy(row, row + width, padded.begin());
      row = padded.data();
    }
    quantize_row(row, K, a.q.data() + m * K, a.d.data() + m * a.nb, a.s16.data() + m * (K / 16),
                 a.s32.data() + m * (K / 32));
  }
  return a;
}

inline int32_t load32(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// Four activation codes broadcast to every lane, straight from memory: spelled as set1 of a loaded
// int32, which GCC emits as a vpbroadcastd from memory (a load, no shuffle). A broadcast from a
// register took a vector pipe slot of its own: on AMD EPYC (Zen 4) a product with it ran at 0.37 ns
// against 0.27. Folding the load into vpdpbusd's own operand ({1to16}, forced by inline asm) read
// the same as this: 140 against 138 GMAC/s at four rows, weights hot on one Zen 4 core.
AVX512 inline __m512i bcast512(const int8_t* p) { return _mm512_set1_epi32(load32(p)); }

struct Q4KTag {};
struct Q6KTag {};

// The float steps of one block, the same for every block type and, lane for lane, on both
// instruction sets: v += float(isum) * (ad * d); o += float(imin) * (ad * dmin).
// v and o are separate sums, so which of a block's two steps comes first changes no bit.
AVX512 inline void add_sum_512(__m512& v, __m512i isum, float ad, __m512 d) {
  v = _mm512_add_ps(v, _mm512_mul_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(_mm512_set1_ps(ad), d)));
}
AVX512 inline void add_min_512(__m512& o, __m512i imin, float ad, __m512 dmin) {
  o = _mm512_add_ps(o, _mm512_mul_ps(_mm512_cvtepi32_ps(imin), _mm512_mul_ps(_mm512_set1_ps(ad), dmin)));
}

// y = v - o for the group's columns that exist (the last group may hold fewer than 16).
AVX512 inline void store_512(float* row, int64_t N, int64_t n0, __m512 v, __m512 o) {
  const __mmask16 keep = n0 + G <= N ? 0xFFFF : static_cast<__mmask16>((1u << (N - n0)) - 1);
  _mm512_mask_storeu_ps(row + n0, keep, _mm512_sub_ps(v, o));
}

// A row's last block, by the sub-blocks its record keeps: FN<R, S>(...) with S a compile-time count.
#define Q4K_LAST(FN, R, subs, ...)               \
  switch (subs) {                                \
    case 2: FN<R, 2>(__VA_ARGS__); break;        \
    case 4: FN<R, 4>(__VA_ARGS__); break;        \
    case 6: FN<R, 6>(__VA_ARGS__); break;        \
    default: FN<R, 8>(__VA_ARGS__); break;       \
  }
#define Q6K_LAST(FN, R, subs, ...)               \
  switch (subs) {                                \
    case 2: FN<R, 2>(__VA_ARGS__); break;        \
    case 4: FN<R, 4>(__VA_ARGS__); break;        \
    case 6: FN<R, 6>(__VA_ARGS__); break;        \
    case 8: FN<R, 8>(__VA_ARGS__); break;        \
    case 10: FN<R, 10>(__VA_ARGS__); break;      \
    case 12: FN<R, 12>(__VA_ARGS__); break;      \
    case 14: FN<R, 14>(__VA_ARGS__); break;      \
    default: FN<R, 16>(__VA_ARGS__); break;      \
  }

// ---------------------------------------------------------------- AVX-512 VNNI: 16 columns per vector

// One block's record (S sub-blocks) of a group, for R activation rows, added into v and o.
// NEAR1: a one-row pass's near prefetch (`one_row_near`); a row's last record, one of 4 to 35, goes without.
template <int R, int S, bool NEAR1 = false>
AVX512 ALWAYS_INLINE void q4k_block_512(const uint8_t* rec, const Act& a, int64_t m0, int64_t b, __m512 (&v)[R], __m512 (&o)[R]) {
  const __m512i low = _mm512_set1_epi8(0x0F), half = _mm512_set1_epi32(0xFFFF);
  // The record's head first, in address order (scales, mins, dmin): o's step needs nothing from the
  // codes, so it is taken here rather than after them. Passes of more than four rows load the scales
  // where they use them: their registers are the rows' sums' (held, eight rows ran 1.04-1.08x slower).
  __m256i scales[S / 2];
  if constexpr (R <= 4)
    for (int p = 0; p < S / 2; ++p) scales[p] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rec + 32 * p));
  {
    __m512i mins[S / 2];
    for (int p = 0; p < S / 2; ++p)
      mins[p] = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(rec + q4k_mins(S) + 32 * p)));
    const __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(rec + q4k_d(S) + 32)));
    for (int r = 0; r < R; ++r) {
      __m512i mn = _mm512_setzero_si512();
      for (int p = 0; p < S / 2; ++p) mn = _mm512_dpwssd_epi32(mn, mins[p], _mm512_set1_epi32(a.pair32(m0 + r, b, p)));
      add_min_512(o[r], mn, a.d[(m0 + r) * a.nb + b], dmin);
    }
  }
  const uint8_t* codes = rec + q4k_codes(S);
  __m512i tot[R];
  for (int r = 0; r < R; ++r) tot[r] = _mm512_setzero_si512();
  for (int j = 0; j < S; ++j) {
    __m512i s[R], s2[R];  // two dependency chains per row
    for (int r = 0; r < R; ++r) s[r] = s2[r] = _mm512_setzero_si512();
    for (int t = 0; t < 4; ++t) {
      PREFETCH_PASS(R, NEAR1, codes + 64 * (4 * j + t), Q4K_REC);
      const __m512i w = _mm512_loadu_si512(codes + 64 * (4 * j + t));
      const __m512i lo = _mm512_and_si512(w, low), hi = _mm512_and_si512(_mm512_srli_epi16(w, 4), low);
      const int64_t k = b * QK + 4 * (8 * j + 2 * t);
      for (int r = 0; r < R; ++r) {
        const int8_t* q = a.row(m0 + r) + k;
        s[r] = _mm512_dpbusd_epi32(s[r], lo, bcast512(q));
        s2[r] = _mm512_dpbusd_epi32(s2[r], hi, bcast512(q + 4));
      }
    }
    for (int r = 0; r < R; ++r) s[r] = _mm512_add_epi32(s[r], s2[r]);
    __m256i raw;
    if constexpr (R <= 4) raw = scales[j / 2];
    else raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rec + 32 * (j / 2)));
    const __m512i pr = _mm512_cvtepu8_epi16(raw);
    const __m512i sc = j % 2 == 0 ? _mm512_and_si512(pr, half) : _mm512_srli_epi32(pr, 16);
    for (int r = 0; r < R; ++r) tot[r] = _mm512_add_epi32(tot[r], _mm512_mullo_epi32(s[r], sc));
  }
  const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(rec + q4k_d(S))));
  for (int r = 0; r < R; ++r) add_sum_512(v[r], tot[r], a.d[(m0 + r) * a.nb + b], d);
}

// A one-row pass asks for the next block's activation codes while it works on this one. A group of a
// long row (a down projection's: 19 to 35 blocks) streams 45-83 KB of records through L1 between
// two uses of one block's codes, so without it each block's codes came back from L2 as the products
// waited on them: one row over every layer's down projections took 0.86-0.91x the time with it
// (AMD EPYC Zen 4, alternated call by call in one process), gate/up (a few KB of codes, kept in L1)
// the same. Passes of more rows are bound by their products: four rows read the same either way.
// Called for every block but the row's last, so block b + 1 is in the row.
template <int R>
AVX512 ALWAYS_INLINE void prefetch_act(const Act& a, int64_t m0, int64_t b) {
  if constexpr (R == 1) {
    const char* q = reinterpret_cast<const char*>(a.row(m0) + (b + 1) * QK);
    for (int l = 0; l < 4; ++l) _mm_prefetch(q + 64 * l, _MM_HINT_T0);
  }
}

template <int R, int S, bool NEAR1 = false>
AVX512 ALWAYS_INLINE void q6k_block_512(const uint8_t* rec, const Act& a, int64_t m0, int64_t b, __m512 (&v)[R], __m512 (&o)[R]) {
  const __m512i low = _mm512_set1_epi8(0x0F), top = _mm512_set1_epi8(0x30);
  const __m512 k32 = _mm512_set1_ps(32.0f);
  // The record's head first, in address order (scales, d), as q4k_block_512.
  const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(rec + q6k_d(S))));
  const __m512 dmin = _mm512_mul_ps(k32, d);
  for (int r = 0; r < R; ++r) {
    __m512i mn = _mm512_setzero_si512();
    for (int p = 0; p < S / 2; ++p) {
      const __m512i pairs = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(rec + 32 * p)));
      mn = _mm512_dpwssd_epi32(mn, pairs, _mm512_set1_epi32(a.pair16(m0 + r, b, p)));
    }
    add_min_512(o[r], mn, a.d[(m0 + r) * a.nb + b], dmin);
  }
  const uint8_t* codes = rec + q6k_codes(S);
  __m512i tot[R];
  for (int r = 0; r < R; ++r) tot[r] = _mm512_setzero_si512();
  for (int g = 0; g < S; ++g) {
    __m512i s[R], s2[R];  // two dependency chains per row
    for (int r = 0; r < R; ++r) s[r] = s2[r] = _mm512_setzero_si512();
    const uint8_t* sub = codes + 192 * g;
    for (int l = 0; l < 3; ++l) PREFETCH_PASS(R, NEAR1, sub + 64 * l, Q6K_REC);
    const __m512i n0 = _mm512_loadu_si512(sub), n1 = _mm512_loadu_si512(sub + 64);
    const __m512i hb = _mm512_loadu_si512(sub + 128);
    const __m512i W[4] = {
        _mm512_or_si512(_mm512_and_si512(n0, low), _mm512_and_si512(_mm512_slli_epi16(hb, 4), top)),
        _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(n0, 4), low), _mm512_and_si512(_mm512_slli_epi16(hb, 2), top)),
        _mm512_or_si512(_mm512_and_si512(n1, low), _mm512_and_si512(hb, top)),
        _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(n1, 4), low), _mm512_and_si512(_mm512_srli_epi16(hb, 2), top))};
    const int64_t k = b * QK + 16 * g;
    for (int r = 0; r < R; ++r) {
      const int8_t* q = a.row(m0 + r) + k;
      s[r] = _mm512_dpbusd_epi32(s[r], W[0], bcast512(q));
      s2[r] = _mm512_dpbusd_epi32(s2[r], W[1], bcast512(q + 4));
      s[r] = _mm512_dpbusd_epi32(s[r], W[2], bcast512(q + 8));
      s2[r] = _mm512_dpbusd_epi32(s2[r], W[3], bcast512(q + 12));
    }
    for (int r = 0; r < R; ++r) s[r] = _mm512_add_epi32(s[r], s2[r]);
    const __m512i pr = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(rec + 32 * (g / 2))));
    const __m512i sc = g % 2 == 0 ? _mm512_srai_epi32(_mm512_slli_epi32(pr, 16), 16) : _mm512_srai_epi32(pr, 16);
    for (int r = 0; r < R; ++r) tot[r] = _mm512_add_epi32(tot[r], _mm512_mullo_epi32(s[r], sc));
  }
  for (int r = 0; r < R; ++r) add_sum_512(v[r], tot[r], a.d[(m0 + r) * a.nb + b], d);
}

// A group's columns for rows m0 .. m0 + R - 1, block by block (the row's last block by the sub-blocks
// its record keeps).
template <bool Q4, int R, bool NEAR1>
AVX512 void group_512(const uint8_t* grp, const Act& a, int64_t m0, float* y, int64_t N, int64_t n0) {
  __m512 v[R], o[R];
  for (int r = 0; r < R; ++r) v[r] = o[r] = _mm512_setzero_ps();
  for (int64_t b = 0; b + 1 < a.nb; ++b) {
    prefetch_act<R>(a, m0, b);
    if constexpr (Q4) q4k_block_512<R, 8, NEAR1>(grp + b * Q4K_REC, a, m0, b, v, o);
    else q6k_block_512<R, 16, NEAR1>(grp + b * Q6K_REC, a, m0, b, v, o);
  }
  if constexpr (Q4) {
    Q4K_LAST(q4k_block_512, R, q4k_subs(a.last), grp + (a.nb - 1) * Q4K_REC, a, m0, a.nb - 1, v, o)
  } else {
    Q6K_LAST(q6k_block_512, R, q6k_subs(a.last), grp + (a.nb - 1) * Q6K_REC, a, m0, a.nb - 1, v, o)
  }
  for (int r = 0; r < R; ++r) store_512(y + (m0 + r) * N, N, n0, v[r], o[r]);
}
template <int R, bool NEAR1 = false>
AVX512 void q4k_512(const uint8_t* grp, const Act& a, int64_t m0, float* y, int64_t N, int64_t n0) {
  group_512<true, R, NEAR1>(grp, a, m0, y, N, n0);
}
template <int R, bool NEAR1 = false>
AVX512 void q6k_512(const uint8_t* grp, const Act& a, int64_t m0, float* y, int64_t N, int64_t n0) {
  group_512<false, R, NEAR1>(grp, a, m0, y, N, n0);
}

// ---------------------------------------------------------------- AVX2: 8 columns per vector, two halves

AVX2 inline void store8(float* y, int64_t N, int64_t n0, __m256 val) {
  alignas(32) float tmp[8];
  _mm256_store_ps(tmp, val);
  for (int64_t c = 0; c < 8 && n0 + c < N; ++c) y[n0 + c] = tmp[c];
}

// add_sum_512's and add_min_512's steps on 8 lanes.
AVX2 inline void add_sum_256(__m256& v, __m256i isum, float ad, __m256 d) {
  v = _mm256_add_ps(v, _mm256_mul_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(_mm256_set1_ps(ad), d)));
}
AVX2 inline void add_min_256(__m256& o, __m256i imin, float ad, __m256 dmin) {
  o = _mm256_add_ps(o, _mm256_mul_ps(_mm256_cvtepi32_ps(imin), _mm256_mul_ps(_mm256_set1_ps(ad), dmin)));
}

// A sub-block's scale in both int16 halves of each column's lane, for vpmaddwd to multiply the two
// halves of that lane's sum with: from the record's 16 bytes of scale pairs (8 columns x sub-blocks
// 2p, 2p+1, as int16 once widened), the first (`odd` false) or the second of each pair.
AVX2 inline __m256i scale_pairs(__m256i widened, bool odd) {
  const __m256i even_mask = _mm256_setr_epi8(0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13,
                                             0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13);
  const __m256i odd_mask = _mm256_setr_epi8(2, 3, 2, 3, 6, 7, 6, 7, 10, 11, 10, 11, 14, 15, 14, 15,
                                            2, 3, 2, 3, 6, 7, 6, 7, 10, 11, 10, 11, 14, 15, 14, 15);
  return _mm256_shuffle_epi8(widened, odd ? odd_mask : even_mask);
}

// Halves of a record (8 columns each) a pass of R rows takes at once (group_avx2 walks a group block
// by block, each block's halves this many at a time). Taking both, a pass uses each 64-byte line
// whole as it arrives; a half per pass over the whole group had read the group's lines twice, the
// second pass from L2 with the memory idle. On AMD EPYC Zen 3 (family 25 model 1), over the 1.5B
// target's MLP weights streamed, interleaved in one process, both at once against a half per pass:
// one row Q4_K 0.90-0.91x the time and Q6_K 0.82-0.83x (weights held in cache: 51 -> 60 and 45 -> 56
// GB/s); two rows 0.73-0.85x and 0.79-0.96x; three 0.83x and 0.71x; Q6_K four rows 0.80-0.85x and
// eight 0.87x.
// Past two rows both halves' sums no longer fit the 16 registers, and where the products bound the
// pass the spills cost: Q4_K passes of three or four rows take a half at a time, block by block, so
// a record's second half comes from L1 right after its first while the memory streams the records
// ahead. Every projection of the same target streamed, interleaved in one process, the same bits:
// four rows 0.87-0.90x the time of a half per pass over the whole group, eight 0.94-0.95x; three rows
// 0.96-0.98x the time of both halves at once. Two rows read 1.05x a half at a time, and Q6_K's four
// 1.02x, so they keep both.
template <bool Q4> constexpr int halves_avx2(int R) { return Q4 && R > 2 ? 1 : 2; }

// Without VNNI a product of four codes is vpmaddubsw (two pairs to int16) and vpmaddwd (to int32).
// The int16 pairs of a Q4_K sub-block's eight steps are summed as int16 first (at most 8 x 2 x 15 x
// 127 = 30480, so no step saturates), and one vpmaddwd with the sub-block's scale takes them to
// int32: the integers of a vpmaddwd by ones per step and a vpmulld per sub-block, with half the
// multiplies and no vpmulld (llama.cpp's AVX2 k-quant products fold the scale in the same way). On
// AMD EPYC Zen 3 a one-row Q4_K product on a weight held in cache took half the time, and streamed
// from memory (the MLP's weights of the 1.5B target) 0.93x at one row and 0.94-0.96x at 2-8 rows.

template <int R, int S>
AVX2 ALWAYS_INLINE void q4k_block_avx2(const uint8_t* rec, const Act& a, int64_t m0, int64_t b, int h0, __m256 (&v)[2][R], __m256 (&o)[2][R]) {
  constexpr int H = halves_avx2<true>(R);
  const __m256i low = _mm256_set1_epi8(0x0F);
  // The record's head first (mins, dmin), as q4k_block_512.
  for (int hh = 0; hh < H; ++hh) {
    const int h = h0 + hh;
    const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rec + q4k_d(S) + 32 + 16 * h)));
    for (int r = 0; r < R; ++r) {
      __m256i mn = _mm256_setzero_si256();
      for (int p = 0; p < S / 2; ++p) {
        const __m256i pairs = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rec + q4k_mins(S) + 32 * p + 16 * h)));
        mn = _mm256_add_epi32(mn, _mm256_madd_epi16(pairs, _mm256_set1_epi32(a.pair32(m0 + r, b, p))));
      }
      add_min_256(o[h][r], mn, a.d[(m0 + r) * a.nb + b], dmin);
    }
  }
  __m256i tot[H][R];
  for (int hh = 0; hh < H; ++hh)
    for (int r = 0; r < R; ++r) tot[hh][r] = _mm256_setzero_si256();
  for (int j = 0; j < S; ++j) {
    __m256i s[H][R];
    for (int hh = 0; hh < H; ++hh)
      for (int r = 0; r < R; ++r) s[hh][r] = _mm256_setzero_si256();
    for (int t = 0; t < 4; ++t) {
      if (h0 == 0) PREFETCH_LINE(true, rec + q4k_codes(S) + 64 * (4 * j + t), Q4K_REC);  // each line once
      const int64_t k = b * QK + 4 * (8 * j + 2 * t);
      for (int hh = 0; hh < H; ++hh) {
        const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rec + q4k_codes(S) + 64 * (4 * j + t) + 32 * (h0 + hh)));
        const __m256i lo = _mm256_and_si256(w, low), hi = _mm256_and_si256(_mm256_srli_epi16(w, 4), low);
        for (int r = 0; r < R; ++r) {
          const int8_t* q = a.row(m0 + r) + k;
          s[hh][r] = _mm256_add_epi16(s[hh][r], _mm256_maddubs_epi16(lo, _mm256_set1_epi32(load32(q))));
          s[hh][r] = _mm256_add_epi16(s[hh][r], _mm256_maddubs_epi16(hi, _mm256_set1_epi32(load32(q + 4))));
        }
      }
    }
    for (int hh = 0; hh < H; ++hh) {
      const __m256i pr = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rec + 32 * (j / 2) + 16 * (h0 + hh))));
      const __m256i sc = scale_pairs(pr, j % 2 == 1);
      for (int r = 0; r < R; ++r) tot[hh][r] = _mm256_add_epi32(tot[hh][r], _mm256_madd_epi16(s[hh][r], sc));
    }
  }
  for (int hh = 0; hh < H; ++hh) {
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rec + q4k_d(S) + 16 * (h0 + hh))));
    for (int r = 0; r < R; ++r) add_sum_256(v[h0 + hh][r], tot[hh][r], a.d[(m0 + r) * a.nb + b], d);
  }
}

template <int R, int S>
AVX2 ALWAYS_INLINE void q6k_block_avx2(const uint8_t* rec, const Act& a, int64_t m0, int64_t b, int h0, __m256 (&v)[2][R], __m256 (&o)[2][R]) {
  constexpr int H = halves_avx2<false>(R);
  const __m256 k32 = _mm256_set1_ps(32.0f);
  const __m256i low = _mm256_set1_epi8(0x0F), top = _mm256_set1_epi8(0x30);
  // The record's head first (scales, d), as q6k_block_512.
  for (int hh = 0; hh < H; ++hh) {
    const int h = h0 + hh;
    const __m256 dmin = _mm256_mul_ps(k32, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rec + q6k_d(S) + 16 * h))));
    for (int r = 0; r < R; ++r) {
      __m256i mn = _mm256_setzero_si256();
      for (int p = 0; p < S / 2; ++p) {
        const __m256i pairs = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rec + 32 * p + 16 * h)));
        mn = _mm256_add_epi32(mn, _mm256_madd_epi16(pairs, _mm256_set1_epi32(a.pair16(m0 + r, b, p))));
      }
      add_min_256(o[h][r], mn, a.d[(m0 + r) * a.nb + b], dmin);
    }
  }
  __m256i tot[H][R];
  for (int hh = 0; hh < H; ++hh)
    for (int r = 0; r < R; ++r) tot[hh][r] = _mm256_setzero_si256();
  for (int g = 0; g < S; ++g) {
    if (h0 == 0)
      for (int l = 0; l < 3; ++l) PREFETCH_LINE(true, rec + q6k_codes(S) + 192 * g + 64 * l, Q6K_REC);
    const int64_t k = b * QK + 16 * g;
    for (int hh = 0; hh < H; ++hh) {
      const uint8_t* sub = rec + q6k_codes(S) + 192 * g + 32 * (h0 + hh);
      const __m256i n0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sub));
      const __m256i n1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sub + 64));
      const __m256i hb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sub + 128));
      const __m256i W[4] = {
          _mm256_or_si256(_mm256_and_si256(n0, low), _mm256_and_si256(_mm256_slli_epi16(hb, 4), top)),
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(n0, 4), low), _mm256_and_si256(_mm256_slli_epi16(hb, 2), top)),
          _mm256_or_si256(_mm256_and_si256(n1, low), _mm256_and_si256(hb, top)),
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(n1, 4), low), _mm256_and_si256(_mm256_srli_epi16(hb, 2), top))};
      // Two steps' int16 pairs summed before vpmaddwd with the scale (at most 2 x 2 x 63 x 127 =
      // 32004: no saturation), as q4k_block_avx2 does over its sub-block's eight.
      const __m256i pr = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rec + 32 * (g / 2) + 16 * (h0 + hh))));
      const __m256i sc = scale_pairs(pr, g % 2 == 1);
      for (int t = 0; t < 4; t += 2)
        for (int r = 0; r < R; ++r) {
          const int8_t* q = a.row(m0 + r) + k + 4 * t;
          const __m256i two = _mm256_add_epi16(_mm256_maddubs_epi16(W[t], _mm256_set1_epi32(load32(q))),
                                               _mm256_maddubs_epi16(W[t + 1], _mm256_set1_epi32(load32(q + 4))));
          tot[hh][r] = _mm256_add_epi32(tot[hh][r], _mm256_madd_epi16(two, sc));
        }
    }
  }
  for (int hh = 0; hh < H; ++hh) {
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rec + q6k_d(S) + 16 * (h0 + hh))));
    for (int r = 0; r < R; ++r) add_sum_256(v[h0 + hh][r], tot[hh][r], a.d[(m0 + r) * a.nb + b], d);
  }
}

// A group's columns for rows m0 .. m0 + R - 1: block by block, each block's halves `halves_avx2` at
// a time. Each half's float sums are added block after block in the same order whichever way the
// halves are walked, so the same bits.
template <bool Q4, int R>
AVX2 void group_avx2(const uint8_t* grp, const Act& a, int64_t m0, float* y, int64_t N, int64_t n0) {
  constexpr int H = halves_avx2<Q4>(R);
  __m256 v[2][R], o[2][R];
  for (int h = 0; h < 2; ++h)
    for (int r = 0; r < R; ++r) v[h][r] = o[h][r] = _mm256_setzero_ps();
  for (int64_t b = 0; b + 1 < a.nb; ++b)
    for (int h0 = 0; h0 < 2; h0 += H) {
      if constexpr (Q4) q4k_block_avx2<R, 8>(grp + b * Q4K_REC, a, m0, b, h0, v, o);
      else q6k_block_avx2<R, 16>(grp + b * Q6K_REC, a, m0, b, h0, v, o);
    }
  for (int h0 = 0; h0 < 2; h0 += H) {
    if constexpr (Q4) {
      Q4K_LAST(q4k_block_avx2, R, q4k_subs(a.last), grp + (a.nb - 1) * Q4K_REC, a, m0, a.nb - 1, h0, v, o)
    } else {
      Q6K_LAST(q6k_block_avx2, R, q6k_subs(a.last), grp + (a.nb - 1) * Q6K_REC, a, m0, a.nb - 1, h0, v, o)
    }
  }
  for (int h = 0; h < 2; ++h)
    for (int r = 0; r < R; ++r) store8(y + (m0 + r) * N, N, n0 + 8 * h, _mm256_sub_ps(v[h][r], o[h][r]));
}
template <int R>
AVX2 void q4k_avx2(const uint8_t* grp, const Act& a, int64_t m0, float* y, int64_t N, int64_t n0) {
  group_avx2<true, R>(grp, a, m0, y, N, n0);
}
template <int R>
AVX2 void q6k_avx2(const uint8_t* grp, const Act& a, int64_t m0, float* y, int64_t N, int64_t n0) {
  group_avx2<false, R>(grp, a, m0, y, N, n0);
}

// ---------------------------------------------------------------- drivers

#define KQ_DISPATCH(FN, rows, ...)          \
  switch (rows) {                           \
    case 1: FN<1>(__VA_ARGS__); break;      \
    case 2: FN<2>(__VA_ARGS__); break;      \
    case 3: FN<3>(__VA_ARGS__); break;      \
    default: FN<4>(__VA_ARGS__); break;     \
  }
#define KQ_DISPATCH8(FN, rows, near, ...)   \
  switch (rows) {                           \
    case 1:                                 \
      if (near) FN<1, true>(__VA_ARGS__);   \
      else FN<1>(__VA_ARGS__);              \
      break;                                \
    case 2: FN<2>(__VA_ARGS__); break;      \
    case 3: FN<3>(__VA_ARGS__); break;      \
    case 4: FN<4>(__VA_ARGS__); break;      \
    case 5: FN<5>(__VA_ARGS__); break;      \
    case 6: FN<6>(__VA_ARGS__); break;      \
    case 7: FN<7>(__VA_ARGS__); break;      \
    default: FN<8>(__VA_ARGS__); break;     \
  }

template <typename Tag>
void group_rows(bool avx512, bool near, const uint8_t* grp, const Act& a, int64_t m0, int64_t rows, float* y,
                int64_t N, int64_t n0) {
  if constexpr (std::is_same_v<Tag, Q4KTag>) {
    if (avx512) { KQ_DISPATCH8(q4k_512, rows, near, grp, a, m0, y, N, n0) }
    else { KQ_DISPATCH(q4k_avx2, rows, grp, a, m0, y, N, n0) }
  } else {
    if (avx512) { KQ_DISPATCH8(q6k_512, rows, near, grp, a, m0, y, N, n0) }
    else { KQ_DISPATCH(q6k_avx2, rows, grp, a, m0, y, N, n0) }
  }
}

// Activation rows per pass over a group's weights, at most: each pass unpacks the group's codes
// once for all its rows. AVX2 has 16 vector registers, which four rows' sums already fill. With
// AVX-512's 32, eight rows a pass ran 1.01-1.26x faster than passes of four at 8 to 16 rows,
// streaming a 1536 x 8960 weight (AMD EPYC Zen 4, interleaved in one process; the same at 1-4 rows).
constexpr int64_t ROWS_AVX2 = 4, ROWS_AVX512 = 8;

// The rows of the pass that starts at row `m0`: M split into as few passes of at most ROWS_AVX512
// (or ROWS_AVX2) as possible, as evenly as possible. Five rows as 4 + 1 left a pass of one row, whose two product
// chains wait on each other's latency: 3 + 2 keep the vector units busy. Each row's sums are its
// own whatever pass it is in, so the split changes no bits.
int64_t pass_rows(int64_t M, int64_t m0, bool avx512) {
  const int64_t most = avx512 ? ROWS_AVX512 : ROWS_AVX2;
  const int64_t n = (M + most - 1) / most, base = M / n, extra = M % n;
  // passes 0..extra-1 hold base + 1 rows, the rest base
  const int64_t big = extra * (base + 1);
  return m0 < big ? base + 1 : base;
}

// Bytes of one group's records: whole blocks, then the row's last block, short or whole.
int64_t row_bytes(bool q4, const Act& a) {
  return q4 ? (a.nb - 1) * Q4K_REC + q4k_rec(q4k_subs(a.last)) : (a.nb - 1) * Q6K_REC + q6k_rec(q6k_subs(a.last));
}

void check_blocks(const torch::Tensor& blocks, int64_t groups, int64_t row) {
  TORCH_CHECK(blocks.dim() == 2 && blocks.size(0) == groups && blocks.size(1) == row && blocks.is_contiguous() &&
                  blocks.element_size() == 1,
              "blocks must be contiguous bytes [ceil(N / 16) = ", groups, ", ", row, "] for this input width");
}

// Groups [0, total) shared out over torch's threads: each thread starts on its own contiguous share
// from the front, in steps of OWN_STEP groups, and once it is done takes STEAL_STEP groups at a time
// from the back of the others' shares, so a thread that got less of the memory's bandwidth, or woke
// late, no longer holds the others at the region's end. Each group is still computed whole by one
// thread, in the same order, so which thread takes it changes no bit. With at::parallel_for's even
// split, the second core of a 2-core AMD EPYC Zen 4 spent about a third of a draft step waiting;
// alternated forward by forward in one process (two runs of 80 each), the 1.5B target's one-token
// forward took 0.964-0.969x the time, the 0.5B draft's 0.943-0.973x, a four-row verification
// 0.981-0.991x. (Group counts stay far below 2^32.)
constexpr int64_t OWN_STEP = 4, STEAL_STEP = 2;

struct alignas(64) Share {  // a line each: the owners claim without invalidating each other
  std::atomic<uint64_t> span{0};  // [lo, hi) as lo | hi << 32
};

inline uint64_t span_of(uint64_t lo, uint64_t hi) { return lo | (hi << 32); }

// The next groups [a, b) of a share: from its front (its owner's) or its back (another thread's);
// false once the share is empty.
inline bool claim(Share& share, bool front, int64_t& a, int64_t& b) {
  uint64_t now = share.span.load(std::memory_order_relaxed), next;
  do {
    const int64_t lo = static_cast<int64_t>(now & 0xFFFFFFFFu), hi = static_cast<int64_t>(now >> 32);
    if (lo >= hi) return false;
    a = front ? lo : std::max(lo, hi - STEAL_STEP);
    b = front ? std::min(hi, lo + OWN_STEP) : hi;
    next = front ? span_of(b, hi) : span_of(lo, a);
  } while (!share.span.compare_exchange_weak(now, next, std::memory_order_relaxed));
  return true;
}

template <typename F>
void balanced_for(int64_t total, const F& body) {
  const int64_t n = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), total));
  if (n == 1) {
    at::parallel_for(0, total, 1, body);
    return;
  }
  std::unique_ptr<Share[]> shares(new Share[n]);
  for (int64_t t = 0; t < n; ++t) {
    const auto [lo, hi] = even_share(total, t, n);  // its own share, claimed from the front
    shares[t].span.store(span_of(lo, hi));
  }
  at::parallel_for(0, n, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t)
      for (int64_t k = 0; k < n; ++k)  // its own share first (k = 0), then the others'
        for (int64_t a, b; claim(shares[(t + k) % n], k == 0, a, b);) body(a, b);
  });
}

template <typename Tag>
torch::Tensor run(const torch::Tensor& x, const torch::Tensor& blocks, int64_t N, bool force_avx2, int64_t near1) {
  const Act a = quantize(x);
  const int64_t M = x.size(0), groups = (N + G - 1) / G, row = row_bytes(std::is_same_v<Tag, Q4KTag>, a);
  check_blocks(blocks, groups, row);
  const bool avx512 = !force_avx2 && has_vnni(), near = one_row_near(near1);
  auto y = torch::empty({M, N}, x.options());
  float* yp = y.data_ptr<float>();
  const uint8_t* w = blocks.data_ptr<uint8_t>();
  // Each output column is computed whole by one thread, in the order above: the split over threads
  // and rows changes nothing in the bits. torch's own thread pool, so the kernels and the model's
  // other ops share one set of threads.
  balanced_for(groups, [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g)
      for (int64_t m0 = 0, rows = 0; m0 < M; m0 += rows) {
        rows = pass_rows(M, m0, avx512);
        group_rows<Tag>(avx512, near, w + g * row, a, m0, rows, yp, N, g * G);
      }
  });
  return y;
}

void check_x(const torch::Tensor& x) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32 && x.is_contiguous(),
              "x must be a contiguous float32 [M, K]");
  TORCH_CHECK(x.size(1) > 0, "K must be positive");
}

torch::Tensor linear_q4k(torch::Tensor x, torch::Tensor blocks, int64_t n, bool force_avx2, int64_t near1) {
  check_x(x);
  return run<Q4KTag>(x, blocks, n, force_avx2, near1);
}

torch::Tensor linear_q6k(torch::Tensor x, torch::Tensor blocks, int64_t n, bool force_avx2, int64_t near1) {
  check_x(x);
  return run<Q6KTag>(x, blocks, n, force_avx2, near1);
}

// Several weights applied to one input (a layer's q, k and v; its gate and up): the input quantized
// once, and the groups of all weights shared out in one pass over the threads. Each output column is
// still computed whole, in the order above, by one thread: the same bits as one call per weight. A
// bias is added after the sum, one IEEE add per element, as `y + bias` would.
std::vector<torch::Tensor> linears(const torch::Tensor& x, const std::vector<torch::Tensor>& blocks,
                                   const std::vector<std::string>& kinds, const std::vector<int64_t>& ns,
                                   const std::vector<c10::optional<torch::Tensor>>& biases, bool force_avx2,
                                   int64_t near1) {
  check_x(x);
  const size_t n = blocks.size();
  TORCH_CHECK(n > 0 && kinds.size() == n && ns.size() == n && biases.size() == n,
              "blocks, kinds, ns and biases must be lists of one length");
  const Act a = quantize(x);
  const int64_t M = x.size(0);
  const bool avx512 = !force_avx2 && has_vnni(), near = one_row_near(near1);
  std::vector<int64_t> start(n + 1, 0);
  std::vector<bool> q4(n);
  std::vector<int64_t> rows(n);
  std::vector<torch::Tensor> ys;
  // The weights' and outputs' addresses, read once: data_ptr checks the type on every call, and the
  // loop below runs once per group of 16 columns (~15,000 a one-token step of the 0.5B draft).
  std::vector<const uint8_t*> ws(n);
  std::vector<float*> yps(n);
  for (size_t i = 0; i < n; ++i) {
    TORCH_CHECK(kinds[i] == "Q4_K" || kinds[i] == "Q6_K", "no k-quant kernel for block type ", kinds[i]);
    q4[i] = kinds[i] == "Q4_K";
    const int64_t groups = (ns[i] + G - 1) / G;
    rows[i] = row_bytes(q4[i], a);
    check_blocks(blocks[i], groups, rows[i]);
    if (biases[i].has_value())
      TORCH_CHECK(biases[i]->numel() == ns[i] && biases[i]->scalar_type() == torch::kFloat32 &&
                      biases[i]->is_contiguous(),
                  "a bias must be a contiguous float32 [N]");
    start[i + 1] = start[i] + groups;
    ys.push_back(torch::empty({M, ns[i]}, x.options()));
    ws[i] = blocks[i].data_ptr<uint8_t>();
    yps[i] = ys[i].data_ptr<float>();
  }
  balanced_for(start[n], [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g) {
      const size_t i = std::upper_bound(start.begin(), start.end(), g) - start.begin() - 1;
      const int64_t local = g - start[i], N = ns[i];
      const uint8_t* w = ws[i];
      float* yp = yps[i];
      for (int64_t m0 = 0, count = 0; m0 < M; m0 += count) {
        count = pass_rows(M, m0, avx512);
        if (q4[i]) group_rows<Q4KTag>(avx512, near, w + local * rows[i], a, m0, count, yp, N, local * G);
        else group_rows<Q6KTag>(avx512, near, w + local * rows[i], a, m0, count, yp, N, local * G);
      }
    }
  });
  for (size_t i = 0; i < n; ++i) {
    if (!biases[i].has_value()) continue;
    const float* b = biases[i]->data_ptr<float>();
    float* yp = ys[i].data_ptr<float>();
    for (int64_t m = 0; m < M; ++m)
      for (int64_t c = 0; c < ns[i]; ++c) yp[m * ns[i] + c] += b[c];
  }
  return ys;
}

// The activation codes and block scales the kernels use (for tests and the reference).
std::vector<torch::Tensor> quantize_act(torch::Tensor x) {
  check_x(x);
  const Act a = quantize(x);
  const int64_t M = x.size(0), K = a.K;
  auto q = torch::from_blob(const_cast<int8_t*>(a.q.data()), {M, K}, torch::kInt8).clone();
  auto d = torch::from_blob(const_cast<float*>(a.d.data()), {M, a.nb}, torch::kFloat32).clone();
  return {q, d};
}

}  // namespace

// layer.cpp includes this file for its kernels and binds its own module.
#ifndef HARNESS_KERNELS_ONLY
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("linear_q4k", &linear_q4k, "batch-invariant x @ Q4_K(w).T, int8 activation blocks", py::arg("x"),
        py::arg("blocks"), py::arg("n"), py::arg("force_avx2") = false, py::arg("one_row_near") = -1);
  m.def("linear_q6k", &linear_q6k, "batch-invariant x @ Q6_K(w).T, int8 activation blocks", py::arg("x"),
        py::arg("blocks"), py::arg("n"), py::arg("force_avx2") = false, py::arg("one_row_near") = -1);
  m.def("linears", &linears, "several batch-invariant k-quant linears of one input, quantized once",
        py::arg("x"), py::arg("blocks"), py::arg("kinds"), py::arg("ns"), py::arg("biases"),
        py::arg("force_avx2") = false, py::arg("one_row_near") = -1);
  m.def("quantize_act", &quantize_act, "the int8 activation codes and block scales the kernels use",
        py::arg("x"));
  m.def("isa", []() { return std::string(has_vnni() ? "avx512vnni" : "avx2"); },
        "instruction set the k-quant kernels use on this CPU");
  m.def("one_row_near", []() { return has_vnni() && host_wants_near(); },
        "whether a one-row pass takes the near prefetch on this CPU");
}
#endif
