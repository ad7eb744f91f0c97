// flowc_gemm_nt.h -- the dot-product path of flowc_gemm.h for C = A * B^T with both operands' rows
// contiguous in k (trans_a == false, trans_b == true): a dense layer's x @ W^T with OneFlow's
// (units, in) weight.  Included by flowc_gemm.h only (it uses its vector types and Problem/Plan).
//
// Why a second path: the packed 6 x kNR kernel needs opB as [k][kNR contiguous columns], so a
// transposed B is re-packed (8x8 transposes) on every call, and N is padded to a multiple of kNR.
// Here every micro-tile is kDotMR rows of A against kDotNR rows of B, each accumulator a vector of
// partial sums along k, read straight from A and B (no packing, no padding beyond one micro-tile
// of rows); the partial sums are folded to scalars once per K chunk (hsum_lanes).  Chosen by
// use_dot_path (flowc_gemm.h) where that wins: see the measurements there.

#pragma once

#include <cstdint>

namespace flowc {
namespace gemm_detail {

// Micro-tile: kDotMR x kDotNR accumulators plus kDotMR A vectors held across the B rows:
// 24 + 4 of the 32 zmm registers (AVX-512), 12 + 3 of the 16 ymm (AVX2; B is an FMA memory operand).
// Per k-vector that is kDotMR + kDotNR loads for kDotMR * kDotNR FMAs, well inside two loads/cycle.
constexpr int kDotMR = FLOWC_GEMM_AVX512 ? 4 : 3;
constexpr int kDotNR = FLOWC_GEMM_AVX512 ? 6 : 4;
// Tile limits: a K chunk of 1024 floats keeps a kDotNR-row block of B (24 KiB) in L1 while the
// tile's A rows (120 x 4 KiB) stream from L2.  Long chunks matter: each chunk pays one fold of
// every accumulator and one pass over C.  B's rows stream past kDotNR at a time whatever the
// tile's width, so tiles are wide and only split N between threads: with 96 make_plan cut the
// MLP's N = 512 into 5 x 90 + 62, one thread doing 270 columns and the other 242 (186 us against
// 178 with 258 + 254).
constexpr int kDotMC = 120;  // multiple of kDotMR
constexpr int kDotNC = 516;  // multiple of kDotNR
constexpr int kDotKC = 1024;
static_assert(kDotMC % kDotMR == 0 && kDotNC % kDotNR == 0, "dot tiles must be multiples of the micro-tile");

#if FLOWC_GEMM_AVX2 && defined(FLOWC_CORE_LIBRARY) && !defined(FLOWC_CORE_IMPLEMENTATION)
void f32_dot_tile(const Problem<float>& pr, const Plan& p, int i0, int mb, int j0, int nb);
#elif FLOWC_GEMM_AVX2

typedef int vki __attribute__((vector_size(kVL * 4)));
#if defined(__clang__)
#define FLOWC_SHUFK(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#else
#define FLOWC_SHUFK(a, b, ...) __builtin_shuffle(a, b, vki{__VA_ARGS__})
#endif

// One level of the folding tree.  x and y hold partial sums in groups of 2H lanes; the result's
// first half is x's groups, its second half y's, each group halved to H lanes by adding its upper
// H lanes to its lower H.
#if FLOWC_GEMM_AVX512
template <int H> inline vkf fold(vkf x, vkf y);
template <> inline vkf fold<8>(vkf x, vkf y) {
  return FLOWC_SHUFK(x, y, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
         FLOWC_SHUFK(x, y, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
}
template <> inline vkf fold<4>(vkf x, vkf y) {
  return FLOWC_SHUFK(x, y, 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
         FLOWC_SHUFK(x, y, 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
}
template <> inline vkf fold<2>(vkf x, vkf y) {
  return FLOWC_SHUFK(x, y, 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29) +
         FLOWC_SHUFK(x, y, 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31);
}
template <> inline vkf fold<1>(vkf x, vkf y) {
  return FLOWC_SHUFK(x, y, 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30) +
         FLOWC_SHUFK(x, y, 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
}
#else
template <int H> inline vkf fold(vkf x, vkf y);
template <> inline vkf fold<4>(vkf x, vkf y) {
  return FLOWC_SHUFK(x, y, 0, 1, 2, 3, 8, 9, 10, 11) + FLOWC_SHUFK(x, y, 4, 5, 6, 7, 12, 13, 14, 15);
}
template <> inline vkf fold<2>(vkf x, vkf y) {
  return FLOWC_SHUFK(x, y, 0, 1, 4, 5, 8, 9, 12, 13) + FLOWC_SHUFK(x, y, 2, 3, 6, 7, 10, 11, 14, 15);
}
template <> inline vkf fold<1>(vkf x, vkf y) {
  return FLOWC_SHUFK(x, y, 0, 2, 4, 6, 8, 10, 12, 14) + FLOWC_SHUFK(x, y, 1, 3, 5, 7, 9, 11, 13, 15);
}
#endif
#undef FLOWC_SHUFK

// out[t] = the sum of the lanes of v[t], t < N.  kVL vectors at a time go through a folding tree
// (kVL - 1 folds of two shuffles and an add, instead of log2(kVL) shuffle+add steps per vector):
// after the level of half-width H each vector holds 2 inputs' partial sums in H-lane groups,
// and after the last one lane t of w[0] is input t's total.
template <int N>
__attribute__((always_inline)) inline void hsum_lanes(const vkf (&v)[N], float* out) {
#pragma GCC unroll 4
  for (int g = 0; g < N; g += kVL) {
    vkf w[kVL];
#pragma GCC unroll 16
    for (int t = 0; t < kVL; ++t) w[t] = g + t < N ? v[g + t] : vkf{};
#if FLOWC_GEMM_AVX512
#pragma GCC unroll 8
    for (int q = 0; q < 8; ++q) w[q] = fold<8>(w[2 * q], w[2 * q + 1]);
#endif
#pragma GCC unroll 4
    for (int q = 0; q < 4; ++q) w[q] = fold<4>(w[2 * q], w[2 * q + 1]);
    w[0] = fold<2>(w[0], w[1]);
    w[1] = fold<2>(w[2], w[3]);
    w[0] = fold<1>(w[0], w[1]);
    alignas(64) float lanes[kVL];
    storeku(lanes, w[0]);
    const int n = N - g < kVL ? N - g : kVL;
#pragma GCC unroll 16
    for (int t = 0; t < n; ++t) out[g + t] = lanes[t];
  }
}

// Loads a vector once into a register: otherwise GCC folds it into each FMA that uses it as a
// memory operand (B's into kDotMR FMAs, and with AVX2 A's into kDotNR), several loads instead of one, and with rows not 64-byte aligned (any K that is not
// a multiple of 16) each of those loads is split across two cache lines: the kernel became
// load-bound at half the speed.
#if defined(__GNUC__) && !defined(__clang__)
#define FLOWC_IN_REGISTER(v) __asm__("" : "+v"(v))
#else
#define FLOWC_IN_REGISTER(v) (void)0
#endif

// Lanes [lo, hi) of the vector at p, the others 0.  Masked loads do not fault on masked-off lanes,
// so those may lie outside the array (before its start or past its end); the address is formed as
// an integer for the same reason.
#if FLOWC_GEMM_AVX512
inline vkf loadk_lanes(const float* row, int k, int lo, int hi) {
  const float* p = reinterpret_cast<const float*>(reinterpret_cast<std::intptr_t>(row) + (std::intptr_t)k * 4);
  return __builtin_ia32_loadups512_mask(p, vkf{}, (unsigned short)(((1u << hi) - 1u) & ~((1u << lo) - 1u)));
}
inline vkf rotate_lanes(vkf v, vki index) {
#if defined(__clang__)
  return __builtin_ia32_permvarsf512(v, index);
#else
  return __builtin_ia32_permvarsf512_mask(v, index, v, (unsigned short)0xFFFF);
#endif
}
#else
inline vkf loadk_lanes(const float* row, int k, int lo, int hi) {
  const float* p = reinterpret_cast<const float*>(reinterpret_cast<std::intptr_t>(row) + (std::intptr_t)k * 4);
  const v8i lane = {0, 1, 2, 3, 4, 5, 6, 7};
  return __builtin_ia32_maskloadps256(reinterpret_cast<const v8f*>(p), (lane >= lo) & (lane < hi));
}
inline vkf rotate_lanes(vkf v, vki index) { return __builtin_ia32_permvarsf256(v, index); }
#endif

// acc[r * kDotNR + c] += a[r][k:k+kVL] * b[c][k:k+kVL] (Full), or only its lanes [lo, hi).
template <bool Full>
__attribute__((always_inline)) inline void dot_step(vkf (&acc)[kDotMR * kDotNR], const float* const (&a)[kDotMR],
                                                    const float* const (&b)[kDotNR], int k, int lo, int hi) {
  vkf av[kDotMR];
#pragma GCC unroll 8
  for (int r = 0; r < kDotMR; ++r) {
    av[r] = Full ? loadku(a[r] + k) : loadk_lanes(a[r], k, lo, hi);
    FLOWC_IN_REGISTER(av[r]);
  }
#pragma GCC unroll 8
  for (int c = 0; c < kDotNR; ++c) {
    vkf bv = Full ? loadku(b[c] + k) : loadk_lanes(b[c], k, lo, hi);
    FLOWC_IN_REGISTER(bv);
#pragma GCC unroll 8
    for (int r = 0; r < kDotMR; ++r) acc[r * kDotNR + c] = fmaddk(av[r], bv, acc[r * kDotNR + c]);
  }
}

// out[r * kDotNR + c] = sum_k a[r][k] * b[c][k], k < kb.
// The full-vector loop starts where a[0] reaches a vector boundary: a batch fed from NumPy is
// 16 bytes off a cache line, and with neither operand aligned every load straddles two lines
// (204 against 186 us for the MLP's 100x512x784).  The products before it go in through a masked
// step ending at that boundary, so that throughout lane l sums k = head + l (mod kVL) in
// increasing k; the lanes are rotated back to k = l (mod kVL) before the fold.  Each output is so
// summed in the same order wherever the operands sit (a result must not depend on whether the
// runtime passed the caller's array or its own aligned copy); a masked last step takes the rest.
__attribute__((always_inline)) inline void dot_kernel(int kb, const float* const (&a)[kDotMR],
                                                      const float* const (&b)[kDotNR], float* out) {
  vkf acc[kDotMR * kDotNR];
#pragma GCC unroll 32
  for (int t = 0; t < kDotMR * kDotNR; ++t) acc[t] = vkf{};
  constexpr std::size_t kBytes = kVL * sizeof(float);
  int head = (int)((kBytes - (reinterpret_cast<std::size_t>(a[0]) & (kBytes - 1))) & (kBytes - 1)) / 4;
  if (head >= kb) head = 0;  // one masked step from k = 0 does it all
  if (head > 0) dot_step<false>(acc, a, b, head - kVL, kVL - head, kVL);
  int k = head;
  for (; k + kVL <= kb; k += kVL) dot_step<true>(acc, a, b, k, 0, kVL);
  if (k < kb) dot_step<false>(acc, a, b, k, 0, kb - k);
  if (head > 0) {
#if FLOWC_GEMM_AVX512
    const vki lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
#else
    const vki lane = {0, 1, 2, 3, 4, 5, 6, 7};
#endif
    const vki index = (lane + (kVL - head)) & (kVL - 1);
#pragma GCC unroll 32
    for (int t = 0; t < kDotMR * kDotNR; ++t) acc[t] = rotate_lanes(acc[t], index);
  }
  hsum_lanes(acc, out);
}

// C[i0:i0+mb, j0:j0+nb] over all of K.  Rows past the tile's edge read the tile's first row
// (valid memory) and their results are dropped.  Loop order: a kDotNR-row block of B stays in L1
// while the tile's A rows stream past it from L2.
FLOWC_GEMM_NOINLINE FLOWC_CORE_INLINE void f32_dot_tile(const Problem<float>& pr, const Plan& p, int i0,
                                                        int mb, int j0, int nb) {
  for (int kk = 0; kk < p.kt; ++kk) {
    const int k0 = kk * p.kc;
    const int kb = pr.K - k0 < p.kc ? pr.K - k0 : p.kc;
    const bool accumulate = kk > 0;
    for (int jp = 0; jp < nb; jp += kDotNR) {
      const int nr = nb - jp < kDotNR ? nb - jp : kDotNR;
      const float* b[kDotNR];
      for (int c = 0; c < kDotNR; ++c)
        b[c] = pr.B + (std::size_t)(j0 + jp + (c < nr ? c : 0)) * pr.ldb + k0;
      for (int ip = 0; ip < mb; ip += kDotMR) {
        const int mr = mb - ip < kDotMR ? mb - ip : kDotMR;
        const float* a[kDotMR];
        for (int r = 0; r < kDotMR; ++r)
          a[r] = pr.A + (std::size_t)(i0 + ip + (r < mr ? r : 0)) * pr.lda + k0;
        alignas(64) float out[kDotMR * kDotNR];
        dot_kernel(kb, a, b, out);
        for (int r = 0; r < mr; ++r) {
          float* crow = pr.C + (std::size_t)(i0 + ip + r) * pr.ldc + j0 + jp;
          const float* o = out + r * kDotNR;
          if (accumulate)
            for (int c = 0; c < nr; ++c) crow[c] += o[c];
          else
            for (int c = 0; c < nr; ++c) crow[c] = o[c];
        }
      }
    }
  }
}

#endif  // FLOWC_GEMM_AVX2

}  // namespace gemm_detail
}  // namespace flowc
