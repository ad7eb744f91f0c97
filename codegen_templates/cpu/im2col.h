// The column matrix of NCHW convolutions, shared by the generated convolution kernels.
//
// col is [Cg*KH*KW rows, OH*OW cols]: row (c, i, j) holds, for every output pixel, the
// input under kernel tap (i, j) of channel c (0 in the padding).  A convolution is then
// one GEMM per image and group: out[Fg, OH*OW] = W[Fg, Cg*KH*KW] * col.  The forward and
// weight-gradient kernels read col through ImplicitConv's offsets without writing it; the
// input gradient writes dcol = W^T * dy and adds it back onto the image with col2im_add.
#pragma once
#include <cstdint>
#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "flowc_gemm.h"

namespace flowc {

struct ConvGeometry {
  int64_t C, H, W, KH, KW, OH, OW, sh, sw, pt, pl, dh, dw;
};

// The output columns [lo, hi) whose input column ow*sw - pl + j*dw lies inside [0, W): outside
// them a column reads padding.  Computing the range once per kernel tap keeps the inner loops
// free of bounds tests, so they vectorise (and become a memcpy when the stride is 1).
inline void valid_columns(const ConvGeometry& g, int64_t j, int64_t& lo, int64_t& hi) {
  const int64_t shift = j * g.dw - g.pl;          // iw = ow * sw + shift
  lo = shift >= 0 ? 0 : (-shift + g.sw - 1) / g.sw;
  hi = g.W - shift <= 0 ? 0 : (g.W - shift + g.sw - 1) / g.sw;
  if (hi > g.OW) hi = g.OW;
  if (lo > hi) lo = hi;
}

// Implicit GEMM: the column matrix read straight from the input, as an indexed B for
// gemm_indexed_b (flowc_gemm.h), so a convolution never writes it.  With xp the input padded by pt
// rows on top and pl columns on the left (Hp x Wp per channel, just large enough for every read):
//   col(k, p) = xp[tap[k] + pixel[p]],  k = (c, i, j): tap[k] = c*Hp*Wp + i*dh*Wp + j*dw,
//                                       p = (oh, ow):  pixel[p] = oh*sh*Wp + ow*sw.
// Built once per kernel (the offsets depend only on the geometry).  Offsets are int, which holds
// any padded channel group below 2^31 elements; shape inference (compiler/ops/conv.py) refuses
// larger ones.
struct ImplicitConv {
  int64_t Hp, Wp;
  bool padded;  // false: every read falls inside the unpadded input, which is used as it is
  std::vector<int> tap, pixel;

  explicit ImplicitConv(const ConvGeometry& g) {
    const int64_t h_need = (g.OH - 1) * g.sh + (g.KH - 1) * g.dh + 1;
    const int64_t w_need = (g.OW - 1) * g.sw + (g.KW - 1) * g.dw + 1;
    padded = !(g.pt == 0 && g.pl == 0 && h_need <= g.H && w_need <= g.W);
    Hp = padded ? h_need : g.H;
    Wp = padded ? w_need : g.W;
    for (int64_t c = 0; c < g.C; ++c)
      for (int64_t i = 0; i < g.KH; ++i)
        for (int64_t j = 0; j < g.KW; ++j) tap.push_back((int)(c * Hp * Wp + i * g.dh * Wp + j * g.dw));
    for (int64_t oh = 0; oh < g.OH; ++oh)
      for (int64_t ow = 0; ow < g.OW; ++ow) pixel.push_back((int)(oh * g.sh * Wp + ow * g.sw));
  }

  // What to read for input x (C planes of H x W): x itself, or its padded copy in `scratch`.  The
  // copy's border is zeroed when the scratch is first sized and never written after, so each call
  // copies only the interior; a scratch buffer must therefore serve one geometry only.
  template <class T>
  const T* input(const ConvGeometry& g, const T* x, std::vector<T>& scratch) const {
    if (!padded) return x;
    const size_t plane = (size_t)(Hp * Wp);
    if (scratch.size() < g.C * plane) scratch.assign(g.C * plane, T(0));
    // A negative padding (the input gradient's view of dy, im2col.h's users) crops instead.
    const int64_t rows = std::min(g.H, Hp - g.pt), col0 = std::max<int64_t>(0, -g.pl);
    const int64_t cols = std::min(g.W, Wp - g.pl) - col0;
    for (int64_t c = 0; c < g.C; ++c)
      for (int64_t ih = std::max<int64_t>(0, -g.pt); ih < rows; ++ih) {
        const T* src = x + (c * g.H + ih) * g.W + col0;
        T* dst = scratch.data() + c * plane + (ih + g.pt) * Wp + g.pl + col0;
        std::memcpy(dst, src, sizeof(T) * (size_t)std::max<int64_t>(0, cols));
      }
    return scratch.data();
  }
};

// ---------------------------------------------------------------------------------------------
// Direct convolution tiles: the forward convolution, the stride-1 input gradient and the filter
// gradient all have the form
//   R(m, n) = sum_k src[m_off[m] + k_off[k]] * B(k, n)
// with src one image's (padded) channel group read through two offset tables, and B a matrix
// packed once into kConvNR-column panels (pack_panels: B(k, n) = from[n_off[n] + k_off[k]]):
//   forward:         m = output pixel, k = (c, i, j) tap,     n = filter;  B = the weights
//   input gradient:  m = input pixel,  k = (f, i, j) tap of dy, n = channel; B = flipped weights
//   filter gradient: m = (c, i, j) tap, k = output pixel,     n = filter;  B = dy of the image
// The 6 x kConvNR micro-kernel (6x16; 6x32 with AVX-512) broadcasts the src values of 6 rows m (6 base pointers, one shared
// offset k_off[k] per step) against two 8-wide loads of the packed B: no column matrix and no
// packing of the image, 6 x kConvNR accumulators in 12 registers.  The M tiling wastes at most 5
// rows (the forward's 196 pixels run as 198), the N tiling nothing when the filters are a
// multiple of kConvNR.  Results go out either transposed (out[n * ldo + m], the NCHW layout of the
// forward and input gradient, only the valid rows and columns) or added as rows
// (out[m * ldo + n], kConvNR columns per row: the filter gradient's per-thread [taps][filters] sums).
// ---------------------------------------------------------------------------------------------
constexpr int kConvNR = gemm_detail::kNR;  // B panel width: 16, or 32 with AVX-512 (two kernel vectors)
constexpr int kConvMR = 6;   // rows per micro-tile

// {0, step, 2 * step, ...}: n offsets, the row starts of a row-major matrix (or 0..n-1 for step 1).
inline std::vector<int> iota_offsets(int64_t n, int64_t step) {
  std::vector<int> v((size_t)n);
  for (int64_t i = 0; i < n; ++i) v[(size_t)i] = (int)(i * step);
  return v;
}

// The column offsets of the input gradient's B: for k = (f, i, j), where W[f, c, KH-1-i, KW-1-j]
// lies in the weights [F, Cg, KH, KW] relative to channel c's first tap.
inline std::vector<int> flipped_taps(int64_t F, int64_t Cg, int64_t KH, int64_t KW) {
  std::vector<int> v;
  for (int64_t f = 0; f < F; ++f)
    for (int64_t i = 0; i < KH; ++i)
      for (int64_t j = 0; j < KW; ++j) v.push_back((int)(f * Cg * KH * KW + (KH - 1 - i) * KW + (KW - 1 - j)));
  return v;
}

// The input gradient of a strided convolution as sh*sw stride-1 convolutions of dy, one per phase
// (a, b) of the input pixels (qh, qw) = (a + sh*u, b + sw*v): tap (i, j) reaches such a pixel from
// dy pixel (u + ri, v + rj) with ri = (a + pt - i*dh) / sh whenever that division is exact, so a
// phase is a convolution over dy (padded as every phase needs) with only those taps.  conv_tiles
// writes a phase's pixels contiguously; `out` then scatters them into dx.  g is the forward's
// geometry with C = the group's input channels; F the group's filters.
struct StridedInputGrad {
  struct Phase {
    std::vector<int> pixel, out;  // per phase pixel: offset in a padded dy plane, and in a dx plane
    std::vector<int> tap, wcol;   // per tap (f, i, j): offset in the padded dy, and in the weights
  };
  int64_t F, Hp, Wp, padT, padL, OH, OW;
  std::vector<Phase> phases;

  StridedInputGrad(const ConvGeometry& g, int64_t filters) : F(filters), OH(g.OH), OW(g.OW) {
    auto reach = [](int64_t phase, int64_t pad, int64_t t, int64_t d, int64_t s, int64_t& r) {
      const int64_t x = phase + pad - t * d;
      if (((x % s) + s) % s) return false;
      r = (x - ((x % s) + s) % s) / s;  // exact: x is a multiple of s
      return true;
    };
    // Padding that every phase's reads fit in: rows ri .. ri + U - 1 of dy for each valid tap.
    int64_t lo_h = 0, hi_h = g.OH, lo_w = 0, hi_w = g.OW, r;
    for (int64_t a = 0; a < g.sh; ++a)
      for (int64_t i = 0; i < g.KH; ++i)
        if (a < g.H && reach(a, g.pt, i, g.dh, g.sh, r)) {
          lo_h = std::min(lo_h, r);
          hi_h = std::max(hi_h, r + (g.H - a + g.sh - 1) / g.sh);
        }
    for (int64_t b = 0; b < g.sw; ++b)
      for (int64_t j = 0; j < g.KW; ++j)
        if (b < g.W && reach(b, g.pl, j, g.dw, g.sw, r)) {
          lo_w = std::min(lo_w, r);
          hi_w = std::max(hi_w, r + (g.W - b + g.sw - 1) / g.sw);
        }
    padT = -lo_h;
    padL = -lo_w;
    Hp = hi_h - lo_h;
    Wp = hi_w - lo_w;
    for (int64_t a = 0; a < std::min(g.sh, g.H); ++a)
      for (int64_t b = 0; b < std::min(g.sw, g.W); ++b) {
        Phase ph;
        for (int64_t u = 0; a + g.sh * u < g.H; ++u)
          for (int64_t v = 0; b + g.sw * v < g.W; ++v) {
            ph.pixel.push_back((int)(u * Wp + v));
            ph.out.push_back((int)((a + g.sh * u) * g.W + b + g.sw * v));
          }
        for (int64_t f = 0; f < F; ++f)
          for (int64_t i = 0; i < g.KH; ++i) {
            int64_t ri, rj;
            if (!reach(a, g.pt, i, g.dh, g.sh, ri)) continue;
            for (int64_t j = 0; j < g.KW; ++j) {
              if (!reach(b, g.pl, j, g.dw, g.sw, rj)) continue;
              ph.tap.push_back((int)(f * Hp * Wp + (ri + padT) * Wp + rj + padL));
              ph.wcol.push_back((int)(f * g.C * g.KH * g.KW + i * g.KW + j));
            }
          }
        phases.push_back(std::move(ph));
      }
  }

  // dy of one image's group (F planes of OH x OW) copied into scratch's padded planes; the border is
  // zeroed when the scratch is first sized and never written after (one geometry per scratch).
  template <class T>
  const T* padded(const T* dy, std::vector<T>& scratch) const {
    const size_t plane = (size_t)(Hp * Wp);
    if (scratch.size() < F * plane) scratch.assign(F * plane, T(0));
    for (int64_t f = 0; f < F; ++f)
      for (int64_t h = 0; h < OH; ++h)
        std::memcpy(scratch.data() + f * plane + (h + padT) * Wp + padL, dy + (f * OH + h) * OW,
                    sizeof(T) * (size_t)OW);
    return scratch.data();
  }
};

// Whether none of x[0, n) is NaN or infinite (x - x is 0 exactly for the finite values, NaN for the
// others).  An integer OR of per-element tests vectorises; a float sum of the differences did not
// (its order is fixed without -ffast-math): 1.2 ms against 0.1 ms for a 512 x 512 x 3 x 3 weight.
template <class T>
inline bool all_finite(const T* x, int64_t n) {
  int bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    const T z = x[i] - x[i];
    bad |= z != z;
  }
  return bad == 0;
}

constexpr int64_t conv_panel_floats(int64_t n, int64_t k) {
  return (n + kConvNR - 1) / kConvNR * kConvNR * k;
}

// dst[(n / NR) * K * NR + k * NR + n % NR] = from  (NR = kConvNR)[n_off[n] + k_off[k]]; columns n >= N are 0.
template <class T>
inline void pack_panels_generic(const T* from, const int* n_off, int N, const int* k_off, int K, T* dst) {
  for (int n0 = 0; n0 < N; n0 += kConvNR, dst += (size_t)kConvNR * K) {
    const int nv = N - n0 < kConvNR ? N - n0 : kConvNR;
    for (int c = 0; c < kConvNR; ++c) {
      if (c >= nv) {
        for (int k = 0; k < K; ++k) dst[(size_t)k * kConvNR + c] = T(0);
        continue;
      }
      const T* row = from + n_off[n0 + c];
      for (int k = 0; k < K; ++k) dst[(size_t)k * kConvNR + c] = row[k_off[k]];
    }
  }
}

// The tiles above, any T (the float AVX2 version below is the same arithmetic, vectorised).
template <class T>
inline void conv_tiles_generic(const T* src, const int* m_off, int M, const int* k_off, int K,
                               const T* bpack, int N, T* out, int64_t ldo, bool add_rows) {
  T acc[kConvNR];
  for (int n0 = 0; n0 < N; n0 += kConvNR) {
    const T* bp = bpack + (size_t)n0 * K;
    const int nv = N - n0 < kConvNR ? N - n0 : kConvNR;
    for (int m = 0; m < M; ++m) {
      for (int c = 0; c < kConvNR; ++c) acc[c] = T(0);
      const T* row = src + m_off[m];
      for (int k = 0; k < K; ++k) {
        const T a = row[k_off[k]];
        const T* b = bp + (size_t)k * kConvNR;
        for (int c = 0; c < kConvNR; ++c) acc[c] += a * b[c];
      }
      if (add_rows) {
        T* o = out + m * ldo + n0;
        for (int c = 0; c < kConvNR; ++c) o[c] += acc[c];
      } else {
        for (int c = 0; c < nv; ++c) out[(n0 + c) * ldo + m] = acc[c];
      }
    }
  }
}

#if FLOWC_GEMM_AVX2 && defined(FLOWC_CORE_LIBRARY) && !defined(FLOWC_CORE_IMPLEMENTATION)
void pack_panels_f32(const float* from, const int* n_off, int N, const int* k_off, int K, float* dst);
void conv_tiles_f32(const float* src, const int* m_off, int M, const int* k_off, int K, const float* bpack,
                    int N, float* out, int64_t ldo, bool add_rows);
#elif FLOWC_GEMM_AVX2
namespace gemm_detail {
// acc(r, c) = sum_k s_r[k_off[k]] * b[k * kConvNR + c] for r < 6, c < kConvNR; then written to tile
// rows (tile + r * ldt, kConvNR floats each), added to them when `add`.
inline void conv_kernel_6xNR(int K, const float* s0, const float* s1, const float* s2, const float* s3,
                             const float* s4, const float* s5, const int* __restrict k_off,
                             const float* __restrict b, float* tile, int64_t ldt, bool add) {
  vkf c00 = vkf{}, c01 = vkf{};
  vkf c10 = vkf{}, c11 = vkf{};
  vkf c20 = vkf{}, c21 = vkf{};
  vkf c30 = vkf{}, c31 = vkf{};
  vkf c40 = vkf{}, c41 = vkf{};
  vkf c50 = vkf{}, c51 = vkf{};
#pragma GCC unroll 4
  for (int k = 0; k < K; ++k) {
    const int o = k_off[k];
    const vkf b0 = loadku(b), b1 = loadku(b + kVL);  // the panels need not be aligned
    vkf av;
    av = splatk(s0[o]); c00 = fmaddk(av, b0, c00); c01 = fmaddk(av, b1, c01);
    av = splatk(s1[o]); c10 = fmaddk(av, b0, c10); c11 = fmaddk(av, b1, c11);
    av = splatk(s2[o]); c20 = fmaddk(av, b0, c20); c21 = fmaddk(av, b1, c21);
    av = splatk(s3[o]); c30 = fmaddk(av, b0, c30); c31 = fmaddk(av, b1, c31);
    av = splatk(s4[o]); c40 = fmaddk(av, b0, c40); c41 = fmaddk(av, b1, c41);
    av = splatk(s5[o]); c50 = fmaddk(av, b0, c50); c51 = fmaddk(av, b1, c51);
    b += kConvNR;
  }
  store_tile(tile, ldt, add, c00, c01, c10, c11, c20, c21, c30, c31, c40, c41, c50, c51);
}
}  // namespace gemm_detail

#ifdef FLOWC_CORE_IMPLEMENTATION
#define FLOWC_CONV_EXPORT __attribute__((visibility("default")))
#else
#define FLOWC_CONV_EXPORT inline
#endif
FLOWC_CONV_EXPORT void pack_panels_f32(const float* from, const int* n_off, int N, const int* k_off, int K,
                                       float* dst) {
  // Consecutive k offsets (dy's rows, the forward's weights): kConvNR rows x 8 k through 8x8
  // register transposes, instead of 128 scalar copies with 64-byte strided stores.
  bool consecutive = K > 0;
  for (int k = 1; k < K && consecutive; ++k) consecutive = k_off[k] == k_off[0] + k;
  if (!consecutive) {
    pack_panels_generic(from, n_off, N, k_off, K, dst);
    return;
  }
  using gemm_detail::v8f;
  for (int n0 = 0; n0 < N; n0 += kConvNR, dst += (size_t)kConvNR * K) {
    const int nv = N - n0 < kConvNR ? N - n0 : kConvNR;
    const float* rows[kConvNR];
    for (int c = 0; c < kConvNR; ++c) rows[c] = c < nv ? from + n_off[n0 + c] + k_off[0] : nullptr;
    int k = 0;
    for (; k + 8 <= K; k += 8)
      for (int h = 0; h < kConvNR; h += 8) {
        v8f r[8];
        for (int q = 0; q < 8; ++q) r[q] = rows[h + q] ? gemm_detail::loadu(rows[h + q] + k) : v8f{};
        gemm_detail::transpose8(r);
        for (int q = 0; q < 8; ++q) gemm_detail::storeu(dst + (size_t)(k + q) * kConvNR + h, r[q]);
      }
    for (; k < K; ++k)
      for (int c = 0; c < kConvNR; ++c) dst[(size_t)k * kConvNR + c] = rows[c] ? rows[c][k] : 0.0f;
  }
}

FLOWC_CONV_EXPORT void conv_tiles_f32(const float* src, const int* m_off, int M, const int* k_off, int K,
                                      const float* bpack, int N, float* out, int64_t ldo, bool add_rows) {
  alignas(64) float tile[kConvMR * kConvNR];
  for (int n0 = 0; n0 < N; n0 += kConvNR) {
    const float* bp = bpack + (size_t)n0 * K;
    const int nv = N - n0 < kConvNR ? N - n0 : kConvNR;
    for (int m0 = 0; m0 < M; m0 += kConvMR) {
      const int mv = M - m0 < kConvMR ? M - m0 : kConvMR;
      const float* s[kConvMR];
      for (int r = 0; r < kConvMR; ++r) s[r] = src + m_off[m0 + (r < mv ? r : mv - 1)];
      if (add_rows) {
        // Rows past M land in the caller's padding rows (it allocates M rounded up to 6).
        gemm_detail::conv_kernel_6xNR(K, s[0], s[1], s[2], s[3], s[4], s[5], k_off, bp,
                                      out + m0 * ldo + n0, ldo, true);
        continue;
      }
      gemm_detail::conv_kernel_6xNR(K, s[0], s[1], s[2], s[3], s[4], s[5], k_off, bp, tile, kConvNR, false);
      // Transposed out, 8 columns at a time through an 8x8 register transpose.  When 8 floats fit
      // before the row's end, each column goes out as one 8-wide store whose last 2 floats are
      // junk: they belong to the next tile of the same rows, which overwrites them.
      const bool wide = m0 + 8 <= M;
      for (int h = 0; h < kConvNR && h < nv; h += 8) {
        gemm_detail::v8f r[8];
        for (int q = 0; q < kConvMR; ++q) r[q] = gemm_detail::load(tile + q * kConvNR + h);
        r[6] = r[7] = gemm_detail::v8f{};
        gemm_detail::transpose8(r);
        const int cv = nv - h < 8 ? nv - h : 8;
        for (int q = 0; q < cv; ++q) {
          float* o = out + (n0 + h + q) * ldo + m0;
          if (wide) {
            gemm_detail::storeu(o, r[q]);
          } else {
            alignas(32) float col[8];
            gemm_detail::store(col, r[q]);
            for (int i = 0; i < mv; ++i) o[i] = col[i];
          }
        }
      }
    }
  }
}
#undef FLOWC_CONV_EXPORT
#endif

// pack_panels / conv_tiles for any T: float with AVX2 runs the 6 x kConvNR kernel (in the core library).
template <class T>
inline void pack_panels(const T* from, const int* n_off, int N, const int* k_off, int K, T* dst) {
#if FLOWC_GEMM_AVX2
  if constexpr (std::is_same<T, float>::value) {
    pack_panels_f32(from, n_off, N, k_off, K, dst);
    return;
  }
#endif
  pack_panels_generic(from, n_off, N, k_off, K, dst);
}

template <class T>
inline void conv_tiles(const T* src, const int* m_off, int M, const int* k_off, int K, const T* bpack, int N,
                       T* out, int64_t ldo, bool add_rows) {
#if FLOWC_GEMM_AVX2
  if constexpr (std::is_same<T, float>::value) {
    conv_tiles_f32(src, m_off, M, k_off, K, bpack, N, out, ldo, add_rows);
    return;
  }
#endif
  conv_tiles_generic(src, m_off, M, k_off, K, bpack, N, out, ldo, add_rows);
}

// The adjoint of im2col: adds each column entry back onto the input pixel it came from.  (Rows
// of 14 floats are fine here: this loop ran at 32 us per LeNet conv2 image where a contiguous
// variant with the padding entries zeroed first took 92 us.)
template <class T>
inline void col2im_add_generic(const ConvGeometry& g, const T* col, T* x) {
  const int64_t P = g.OH * g.OW;
  for (int64_t c = 0; c < g.C; ++c)
    for (int64_t i = 0; i < g.KH; ++i)
      for (int64_t j = 0; j < g.KW; ++j) {
        const T* row = col + ((c * g.KH + i) * g.KW + j) * P;
        T* plane = x + c * g.H * g.W;
        int64_t lo, hi;
        valid_columns(g, j, lo, hi);
        const int64_t shift = j * g.dw - g.pl;
        for (int64_t oh = 0; oh < g.OH; ++oh) {
          const int64_t ih = oh * g.sh - g.pt + i * g.dh;
          if (ih < 0 || ih >= g.H) continue;
          T* __restrict out = plane + ih * g.W + shift;
          const T* __restrict in = row + oh * g.OW;
          if (g.sw == 1) {
            for (int64_t ow = lo; ow < hi; ++ow) out[ow] += in[ow];
          } else {
            for (int64_t ow = lo; ow < hi; ++ow) out[ow * g.sw] += in[ow];
          }
        }
      }
}

// float col2im is compiled once into the core library (see flowc_core.cpp): inlined into every
// convolution kernel of a step, its vectorised loops (and im2col's, before the implicit GEMM)
// were most of a LeNet step's compile.
#if defined(FLOWC_CORE_LIBRARY) && !defined(FLOWC_CORE_IMPLEMENTATION)
void col2im_add_f32(const ConvGeometry& g, const float* col, float* x);
#elif defined(FLOWC_CORE_IMPLEMENTATION)
__attribute__((visibility("default"))) void col2im_add_f32(const ConvGeometry& g, const float* col, float* x) {
  col2im_add_generic(g, col, x);
}
#endif

template <class T>
inline void col2im_add(const ConvGeometry& g, const T* col, T* x) {
#ifdef FLOWC_CORE_LIBRARY
  if constexpr (std::is_same<T, float>::value) {
    col2im_add_f32(g, reinterpret_cast<const float*>(col), reinterpret_cast<float*>(x));
    return;
  }
#endif
  col2im_add_generic(g, col, x);
}

}  // namespace flowc

// The convolutions that are plain GEMMs (one output pixel per image, 1x1 kernels) use these helpers.
#include "conv_gemm.h"
