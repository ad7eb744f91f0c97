// Helpers of the convolutions that run as plain GEMMs (codegen_templates/cpu/conv_as_gemm.j2; which
// convolutions those are is decided at codegen time by compiler/codegen/conv_gemm.py).  Included by
// im2col.h.
//
// A "pixel" convolution has one output pixel per image: each kernel tap either reads one input
// pixel (a live tap) or only padding (a dead tap), so with W (F, C, KK = KH*KW) and tap[q] the live
// tap that reads the q-th of the L input pixels read (all H*W of them, unless the stride skips some),
//   out (N, F) = x (N, C*L) @ Wl^T,   Wl[f, c*L + q] = W[f, c, tap[q]]       (one GEMM per batch).
// The NumPy reference multiplies the padding's zeros by the dead taps' weights, so a NaN or an
// infinity there makes NaN: `dead` carries that per filter.
#pragma once
#include <cstdint>
#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

namespace flowc {

// Wl[f, c*HW + q] = W[f, c, tap[q]] for every filter f, channel c and read pixel q < HW (`transposed`:
// Wl^T[c*HW + q, f], the layout the forward's GEMM reads fastest).  Unless `dead` is null, dead[f] =
// NaN where filter f has a NaN or an infinite weight at a dead tap (tap_pixel[t] < 0), else 0.
// Reading the live weights brings in all of W's cache lines anyway (at 1x1, one float in nine), so
// testing every weight of the row (all_finite, vectorised; the dead taps are only looked at one by
// one in a row that has a non-finite weight at all) costs little: 0.1 ms for 512 x 512 x 3 x 3.  The filters go in blocks of 16, so
// the transposed writes are 16-float runs.
template <class T>
inline void gather_live_taps(const T* w, int64_t F, int64_t C, int64_t KK, const int* tap, int64_t HW,
                             const int* tap_pixel, bool transposed, T* wl, T* dead) {
  constexpr int64_t kBlock = 16;
  const int64_t K = C * HW;
#pragma omp parallel for schedule(static) if(F * C * KK >= (1 << 18))
  for (int64_t f0 = 0; f0 < F; f0 += kBlock) {
    const int64_t f1 = std::min<int64_t>(F, f0 + kBlock);
    for (int64_t f = f0; f < f1 && dead; ++f) {
      const T* row = w + f * C * KK;
      bool bad = !all_finite(row, C * KK);
      if (bad) {
        bad = false;
        for (int64_t e = 0; e < C * KK; ++e)
          if (tap_pixel[e % KK] < 0 && !(row[e] - row[e] == T(0))) bad = true;
      }
      dead[f] = bad ? std::numeric_limits<T>::quiet_NaN() : T(0);
    }
    if (transposed) {
      for (int64_t c = 0; c < C; ++c)
        for (int64_t q = 0; q < HW; ++q)
          for (int64_t f = f0; f < f1; ++f) wl[(c * HW + q) * F + f] = w[(f * C + c) * KK + tap[q]];
    } else {
      for (int64_t f = f0; f < f1; ++f)
        for (int64_t c = 0; c < C; ++c)
          for (int64_t q = 0; q < HW; ++q) wl[f * K + c * HW + q] = w[(f * C + c) * KK + tap[q]];
    }
  }
}

// dW[f, c, t] = dWl[f, c*HW + tap_pixel[t]] at the live taps and dead[f] at the dead ones: the
// reference's sum over images of dy[n, f] * 0, which is 0 unless some dy[n, f] is NaN or infinite.
template <class T>
inline void scatter_live_taps(const T* dwl, const T* dy, int64_t N, int64_t F, int64_t C, int64_t KK,
                              int64_t HW, const int* tap_pixel, T* dw) {
  std::vector<T> dead((size_t)F, T(0));
  if (!all_finite(dy, N * F))
    for (int64_t n = 0; n < N; ++n)
      for (int64_t f = 0; f < F; ++f)
        if (!(dy[n * F + f] - dy[n * F + f] == T(0))) dead[f] = std::numeric_limits<T>::quiet_NaN();
#pragma omp parallel for schedule(static) if(F * C * KK >= (1 << 18))
  for (int64_t f = 0; f < F; ++f) {
    const T* in = dwl + f * C * HW;
    T* out = dw + f * C * KK;
    std::fill(out, out + C * KK, dead[f]);
    for (int64_t t = 0; t < KK; ++t)
      if (tap_pixel[t] >= 0)
        for (int64_t c = 0; c < C; ++c) out[c * KK + t] = in[c * HW + tap_pixel[t]];
  }
}

// xs[r, l] = x[r, pixel[l]] for every row r < R (an image's channel) of HW pixels and l < L: the
// pixels a one-pixel convolution reads.
template <class T>
inline void gather_pixels(const T* x, int64_t R, int64_t HW, const int* pixel, int64_t L, T* xs) {
  for (int64_t r = 0; r < R; ++r)
    for (int64_t l = 0; l < L; ++l) xs[r * L + l] = x[r * HW + pixel[l]];
}

// The adjoint of gather_pixels: dx[r, pixel[l]] = dxs[r, l], 0 at the pixels not read.
template <class T>
inline void scatter_pixels(const T* dxs, int64_t R, int64_t HW, const int* pixel, int64_t L, T* dx) {
  std::memset(dx, 0, sizeof(T) * (size_t)(R * HW));
  for (int64_t r = 0; r < R; ++r)
    for (int64_t l = 0; l < L; ++l) dx[r * HW + pixel[l]] = dxs[r * L + l];
}

// xs[c, oh*OW + ow] = x[c, oh*sh, ow*sw]: one image's input under a strided 1x1 kernel.
template <class T>
inline void subsample(const T* x, int64_t C, int64_t H, int64_t W, int64_t sh, int64_t sw, int64_t OH,
                      int64_t OW, T* xs) {
  for (int64_t c = 0; c < C; ++c)
    for (int64_t oh = 0; oh < OH; ++oh) {
      const T* row = x + (c * H + oh * sh) * W;
      T* out = xs + (c * OH + oh) * OW;
      for (int64_t ow = 0; ow < OW; ++ow) out[ow] = row[ow * sw];
    }
}

// The adjoint of subsample: dx[c, oh*sh, ow*sw] = dxs[c, oh*OW + ow], 0 at the pixels no tap reads.
template <class T>
inline void upsample(const T* dxs, int64_t C, int64_t H, int64_t W, int64_t sh, int64_t sw, int64_t OH,
                     int64_t OW, T* dx) {
  std::memset(dx, 0, sizeof(T) * (size_t)(C * H * W));
  for (int64_t c = 0; c < C; ++c)
    for (int64_t oh = 0; oh < OH; ++oh) {
      T* row = dx + (c * H + oh * sh) * W;
      const T* in = dxs + (c * OH + oh) * OW;
      for (int64_t ow = 0; ow < OW; ++ow) row[ow * sw] = in[ow];
    }
}

}  // namespace flowc
