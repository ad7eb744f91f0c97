// im2col / col2im for NCHW convolutions, shared by the generated convolution kernels.
//
// col is [Cg*KH*KW rows, OH*OW cols]: row (c, i, j) holds, for every output pixel, the
// input under kernel tap (i, j) of channel c (0 in the padding).  A convolution is then
// one GEMM per image and group: out[Fg, OH*OW] = W[Fg, Cg*KH*KW] * col.
#pragma once
#include <cstdint>
#include <algorithm>
#include <cstring>
#include <type_traits>

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

// Stride 1 with OW == W (a SAME convolution): a tap's column row is the input plane shifted by
// a constant, so it is one contiguous copy, then the padding columns at the left and right edges
// of each output row and the rows above and below the plane are zeroed.  This is LeNet's case,
// where a row of the general loop below is only 14 or 28 floats and its set-up dominated.
template <class T>
inline void im2col_shifted(const ConvGeometry& g, const T* x, T* col) {
  const int64_t P = g.OH * g.OW, HW = g.H * g.W;
  for (int64_t c = 0; c < g.C; ++c)
    for (int64_t i = 0; i < g.KH; ++i) {
      const int64_t top = i * g.dh - g.pt;                         // ih = oh + top
      const int64_t oh_lo = std::min(g.OH, std::max<int64_t>(0, -top));
      const int64_t oh_hi = std::max(oh_lo, std::min(g.OH, g.H - top));
      for (int64_t j = 0; j < g.KW; ++j) {
        T* __restrict row = col + ((c * g.KH + i) * g.KW + j) * P;
        const T* __restrict plane = x + c * HW;
        const int64_t off = top * g.W + j * g.dw - g.pl;           // row[p] = plane[p + off]
        int64_t lo, hi;
        valid_columns(g, j, lo, hi);
        const int64_t p0 = std::max(oh_lo * g.OW, -off), p1 = std::min(oh_hi * g.OW, HW - off);
        for (int64_t p = 0; p < p0; ++p) row[p] = T(0);
        for (int64_t p = p0; p < p1; ++p) row[p] = plane[p + off];
        for (int64_t p = std::max(p0, p1); p < P; ++p) row[p] = T(0);
        for (int64_t oh = oh_lo; oh < oh_hi; ++oh) {               // the padding columns
          T* out = row + oh * g.OW;
          for (int64_t ow = 0; ow < lo; ++ow) out[ow] = T(0);
          for (int64_t ow = hi; ow < g.OW; ++ow) out[ow] = T(0);
        }
      }
    }
}

template <class T>
inline void im2col_generic(const ConvGeometry& g, const T* x, T* col) {
  if (g.sw == 1 && g.sh == 1 && g.OW == g.W) {
    im2col_shifted(g, x, col);
    return;
  }
  const int64_t P = g.OH * g.OW;
  for (int64_t c = 0; c < g.C; ++c)
    for (int64_t i = 0; i < g.KH; ++i)
      for (int64_t j = 0; j < g.KW; ++j) {
        T* row = col + ((c * g.KH + i) * g.KW + j) * P;
        const T* plane = x + c * g.H * g.W;
        int64_t lo, hi;
        valid_columns(g, j, lo, hi);
        const int64_t shift = j * g.dw - g.pl;
        for (int64_t oh = 0; oh < g.OH; ++oh) {
          const int64_t ih = oh * g.sh - g.pt + i * g.dh;
          T* out = row + oh * g.OW;
          if (ih < 0 || ih >= g.H) {
            std::memset(out, 0, sizeof(T) * g.OW);
            continue;
          }
          const T* in = plane + ih * g.W + shift;
          for (int64_t ow = 0; ow < lo; ++ow) out[ow] = T(0);
          if (g.sw == 1) {
            std::memcpy(out + lo, in + lo, sizeof(T) * (hi - lo));
          } else {
            for (int64_t ow = lo; ow < hi; ++ow) out[ow] = in[ow * g.sw];
          }
          for (int64_t ow = hi; ow < g.OW; ++ow) out[ow] = T(0);
        }
      }
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

// float im2col/col2im are compiled once into the core library (see flowc_core.cpp): inlined into
// every convolution kernel of a step, their vectorised loops were most of a LeNet step's compile.
#if defined(FLOWC_CORE_LIBRARY) && !defined(FLOWC_CORE_IMPLEMENTATION)
void im2col_f32(const ConvGeometry& g, const float* x, float* col);
void col2im_add_f32(const ConvGeometry& g, const float* col, float* x);
#elif defined(FLOWC_CORE_IMPLEMENTATION)
__attribute__((visibility("default"))) void im2col_f32(const ConvGeometry& g, const float* x, float* col) {
  im2col_generic(g, x, col);
}
__attribute__((visibility("default"))) void col2im_add_f32(const ConvGeometry& g, const float* col, float* x) {
  col2im_add_generic(g, col, x);
}
#endif

template <class T>
inline void im2col(const ConvGeometry& g, const T* x, T* col) {
#ifdef FLOWC_CORE_LIBRARY
  if constexpr (std::is_same<T, float>::value) {
    im2col_f32(g, reinterpret_cast<const float*>(x), reinterpret_cast<float*>(col));
    return;
  }
#endif
  im2col_generic(g, x, col);
}

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
