// im2col / col2im for NCHW convolutions, shared by the generated convolution kernels.
//
// col is [Cg*KH*KW rows, OH*OW cols]: row (c, i, j) holds, for every output pixel, the
// input under kernel tap (i, j) of channel c (0 in the padding).  A convolution is then
// one GEMM per image and group: out[Fg, OH*OW] = W[Fg, Cg*KH*KW] * col.
#pragma once
#include <cstdint>
#include <cstring>

namespace flowc {

struct ConvGeometry {
  int64_t C, H, W, KH, KW, OH, OW, sh, sw, pt, pl, dh, dw;
};

template <class T>
inline void im2col(const ConvGeometry& g, const T* x, T* col) {
  const int64_t P = g.OH * g.OW;
  for (int64_t c = 0; c < g.C; ++c)
    for (int64_t i = 0; i < g.KH; ++i)
      for (int64_t j = 0; j < g.KW; ++j) {
        T* row = col + ((c * g.KH + i) * g.KW + j) * P;
        const T* plane = x + c * g.H * g.W;
        for (int64_t oh = 0; oh < g.OH; ++oh) {
          const int64_t ih = oh * g.sh - g.pt + i * g.dh;
          T* out = row + oh * g.OW;
          if (ih < 0 || ih >= g.H) {
            std::memset(out, 0, sizeof(T) * g.OW);
            continue;
          }
          const T* in = plane + ih * g.W;
          for (int64_t ow = 0; ow < g.OW; ++ow) {
            const int64_t iw = ow * g.sw - g.pl + j * g.dw;
            out[ow] = (iw >= 0 && iw < g.W) ? in[iw] : T(0);
          }
        }
      }
}

// The adjoint of im2col: adds each column entry back onto the input pixel it came from.
template <class T>
inline void col2im_add(const ConvGeometry& g, const T* col, T* x) {
  const int64_t P = g.OH * g.OW;
  for (int64_t c = 0; c < g.C; ++c)
    for (int64_t i = 0; i < g.KH; ++i)
      for (int64_t j = 0; j < g.KW; ++j) {
        const T* row = col + ((c * g.KH + i) * g.KW + j) * P;
        T* plane = x + c * g.H * g.W;
        for (int64_t oh = 0; oh < g.OH; ++oh) {
          const int64_t ih = oh * g.sh - g.pt + i * g.dh;
          if (ih < 0 || ih >= g.H) continue;
          T* out = plane + ih * g.W;
          const T* in = row + oh * g.OW;
          for (int64_t ow = 0; ow < g.OW; ++ow) {
            const int64_t iw = ow * g.sw - g.pl + j * g.dw;
            if (iw >= 0 && iw < g.W) out[iw] += in[ow];
          }
        }
      }
}

}  // namespace flowc
