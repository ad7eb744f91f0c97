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
    const int64_t rows = std::min(g.H, Hp - g.pt), cols = std::min(g.W, Wp - g.pl);
    for (int64_t c = 0; c < g.C; ++c)
      for (int64_t ih = std::max<int64_t>(0, -g.pt); ih < rows; ++ih) {
        const T* src = x + (c * g.H + ih) * g.W;
        T* dst = scratch.data() + c * plane + (ih + g.pt) * Wp + g.pl;
        std::memcpy(dst, src, sizeof(T) * (size_t)std::max<int64_t>(0, cols));
      }
    return scratch.data();
  }
};

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
