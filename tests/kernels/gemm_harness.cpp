// Checks flowc_gemm.h's gemm and im2col.h's conv_tiles / pack_panels against plain double loops, on
// shapes that hit every edge of the tiling (tests/test_gemm_kernels.py builds it once per
// instruction set: AVX-512, AVX2 and the portable path).  Prints one line per case:
//   <case> <max |got - want| / (1 + |want|)>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "flowc_gemm.h"
#include "im2col.h"

static uint64_t state = 0x9E3779B97F4A7C15ull;
static float next_value() {  // xorshift: the same numbers on every build
  state ^= state << 13;
  state ^= state >> 7;
  state ^= state << 17;
  return (float)((state >> 40) % 2001) / 1000.0f - 1.0f;
}

static double relative_error(double got, double want) { return std::fabs(got - want) / (1.0 + std::fabs(want)); }

static void check_gemm(int M, int N, int K, bool ta, bool tb) {
  std::vector<float> A((size_t)M * K), B((size_t)K * N), C((size_t)M * N, NAN);
  for (float& x : A) x = next_value();
  for (float& x : B) x = next_value();
  const int lda = ta ? M : K, ldb = tb ? K : N;
  std::vector<int> seen((size_t)M * N, 0);
  flowc::gemm<float>(M, N, K, A.data(), lda, ta, B.data(), ldb, tb, C.data(), N,
                     [&](int i, int j0, int n, float*) { for (int j = j0; j < j0 + n; ++j) seen[(size_t)i * N + j]++; });
  double worst = 0;
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      double want = 0;
      for (int k = 0; k < K; ++k)
        want += (double)(ta ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k]) *
                (double)(tb ? B[(size_t)j * ldb + k] : B[(size_t)k * ldb + j]);
      const double e = seen[(size_t)i * N + j] == 1 ? relative_error(C[(size_t)i * N + j], want) : INFINITY;
      worst = std::fmax(worst, std::isnan(e) ? INFINITY : e);
    }
  std::printf("gemm_%dx%dx%d_%c%c %.3g\n", M, N, K, ta ? 't' : 'n', tb ? 't' : 'n', worst);
}

// R(m, n) = sum_k src[m_off[m] + k_off[k]] * from[n_off[n] + k_off2[k]] through pack_panels and conv_tiles,
// written transposed (out[n * M + m]) or added as rows (out[m * ldo + n]).
static void check_conv_tiles(int M, int N, int K, bool consecutive_k, bool add_rows) {
  const int span = 3 * K + 7;
  std::vector<float> src((size_t)(M + 1) * span), from((size_t)N * span);
  for (float& x : src) x = next_value();
  for (float& x : from) x = next_value();
  std::vector<int> m_off(M), n_off(N), k_off(K);
  for (int m = 0; m < M; ++m) m_off[m] = m * span / 2;
  for (int n = 0; n < N; ++n) n_off[n] = n * span;
  for (int k = 0; k < K; ++k) k_off[k] = consecutive_k ? k : (3 * k) % span;
  std::vector<float> panels((size_t)flowc::conv_panel_floats(N, K));
  flowc::pack_panels<float>(from.data(), n_off.data(), N, k_off.data(), K, panels.data());
  const int64_t ldo = add_rows ? flowc::conv_panel_floats(N, 1) : M;
  const int rows = add_rows ? (M + 5) / 6 * 6 : N;
  std::vector<float> out((size_t)rows * ldo + 64, add_rows ? 0.5f : NAN);
  flowc::conv_tiles<float>(src.data(), m_off.data(), M, k_off.data(), K, panels.data(), N, out.data(), ldo, add_rows);
  double worst = 0;
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) {
      double want = add_rows ? 0.5 : 0.0;
      for (int k = 0; k < K; ++k) want += (double)src[m_off[m] + k_off[k]] * (double)from[n_off[n] + k_off[k]];
      const double got = add_rows ? out[(size_t)m * ldo + n] : out[(size_t)n * M + m];
      const double e = relative_error(got, want);
      worst = std::fmax(worst, std::isnan(e) ? INFINITY : e);
    }
  std::printf("conv_tiles_%dx%dx%d_%s_%s %.3g\n", M, N, K, consecutive_k ? "consecutive" : "strided",
              add_rows ? "rows" : "transposed", worst);
}

int main() {
  const int shapes[][3] = {{1, 1, 1}, {6, 16, 8}, {7, 33, 5}, {100, 10, 512}, {100, 512, 784}, {13, 47, 300},
                           {150, 70, 9}, {5, 300, 600}, {64, 64, 64}, {2, 513, 17}};
  for (const auto& s : shapes)
    for (int t = 0; t < 4; ++t) check_gemm(s[0], s[1], s[2], t & 1, t & 2);
  const int conv_shapes[][3] = {{1, 1, 1}, {7, 5, 9}, {196, 64, 800}, {13, 33, 25}, {20, 32, 16}, {6, 70, 3}};
  for (const auto& s : conv_shapes)
    for (int t = 0; t < 4; ++t) check_conv_tiles(s[0], s[1], s[2], t & 1, t & 2);
  std::printf("kNR %d\n", flowc::kConvNR);
  return 0;
}
