// Checks flowc_gemm.h's gemm with trans_a == false, trans_b == true (C = A * B^T: the path a dense
// layer takes, flowc_gemm_nt.h's dot-product kernels where use_dot_path picks them) against plain
// double loops: every tile edge in M and N, K around the vector width and past a K chunk, operands
// off a cache line, padded rows, NaN and Inf, the epilogue seeing every element once, and the
// result not depending on where the operands sit.
// tests/test_gemm_nt_dot.py builds it per instruction set, once as shipped and once with
// -DFLOWC_GEMM_NT_DOT=1 (every case through the dot path).  Prints one line per case:
//   <case> <path> <max |got - want| / (1 + |want|)>      path: dot | packed
// where a NaN or infinity in the result must be exactly where the double result has one.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "flowc_gemm.h"

static uint64_t state = 0x2545F4914F6CDD1Dull;
static float next_value() {  // xorshift: the same numbers on every build
  state ^= state << 13;
  state ^= state >> 7;
  state ^= state << 17;
  return (float)((state >> 40) % 2001) / 1000.0f - 1.0f;
}

static double error_of(double got, double want) {
  if (std::isnan(want) || std::isnan(got)) return std::isnan(want) && std::isnan(got) ? 0.0 : INFINITY;
  if (std::isinf(want) || std::isinf(got)) return got == want ? 0.0 : INFINITY;
  return std::fabs(got - want) / (1.0 + std::fabs(want));
}

// offset: floats A and B start past a 64-byte boundary; pad: extra floats per row (lda = K + pad);
// special: put a NaN in A's row 1 and +Inf in B's row 2 (when they exist).
static void check(int M, int N, int K, int offset, int pad, bool special) {
  const int lda = K + pad, ldb = K + pad;
  std::vector<float> a_store((size_t)M * lda + 32), b_store((size_t)N * ldb + 32), C((size_t)M * N, NAN);
  float* A = a_store.data() + ((16 - (reinterpret_cast<uintptr_t>(a_store.data()) / 4) % 16) % 16) + offset;
  float* B = b_store.data() + ((16 - (reinterpret_cast<uintptr_t>(b_store.data()) / 4) % 16) % 16) + offset;
  for (int i = 0; i < M; ++i)
    for (int k = 0; k < lda; ++k) A[(size_t)i * lda + k] = k < K ? next_value() : NAN;  // padding must stay unread
  for (int j = 0; j < N; ++j)
    for (int k = 0; k < ldb; ++k) B[(size_t)j * ldb + k] = k < K ? next_value() : NAN;
  if (special && M > 1 && K > 0) A[(size_t)1 * lda + K / 2] = NAN;
  if (special && N > 2 && K > 0) B[(size_t)2 * ldb + K - 1] = INFINITY;
  std::vector<int> seen((size_t)M * N, 0);
  flowc::gemm<float>(M, N, K, A, lda, false, B, ldb, true, C.data(), N,
                     [&](int i, int j0, int n, float*) { for (int j = j0; j < j0 + n; ++j) seen[(size_t)i * N + j]++; });
  double worst = 0;
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      double want = 0;
      for (int k = 0; k < K; ++k) want += (double)A[(size_t)i * lda + k] * (double)B[(size_t)j * ldb + k];
      const double e = seen[(size_t)i * N + j] == 1 ? error_of(C[(size_t)i * N + j], want) : INFINITY;
      worst = std::fmax(worst, e);
    }
#if FLOWC_GEMM_AVX2
  flowc::gemm_detail::Problem<float> pr{M, N, K, A, lda, false, B, ldb, true, C.data(), N};
  const char* path = flowc::gemm_detail::use_dot_path(pr) ? "dot" : "packed";
#else
  const char* path = "portable";
#endif
  std::printf("nt_%dx%dx%d_off%d_pad%d%s %s %.3g\n", M, N, K, offset, pad, special ? "_special" : "", path, worst);
}

// The same product with A and B at different offsets from a cache line must be bitwise the same
// (the runtime passes either the caller's array or its own 64-byte aligned copy).  Prints 0 when
// every placement matched the first bit for bit, inf otherwise.
static void check_placement(int M, int N, int K) {
  std::vector<float> a((size_t)M * K), b((size_t)N * K), first, got((size_t)M * N);
  for (float& x : a) x = next_value();
  for (float& x : b) x = next_value();
  std::vector<float> a_store(a.size() + 32), b_store(b.size() + 32);
  bool same = true;
  const char* path = "portable";
  for (int offset : {0, 1, 3, 4, 7, 8, 12, 15}) {
    float* A = a_store.data() + ((16 - (reinterpret_cast<uintptr_t>(a_store.data()) / 4) % 16) % 16) + offset;
    float* B = b_store.data() + ((16 - (reinterpret_cast<uintptr_t>(b_store.data()) / 4) % 16) % 16) + (offset * 5) % 16;
    std::memcpy(A, a.data(), a.size() * sizeof(float));
    std::memcpy(B, b.data(), b.size() * sizeof(float));
    flowc::gemm<float>(M, N, K, A, K, false, B, K, true, got.data(), N, flowc::NoEpilogue{});
    if (first.empty())
      first = got;
    else
      same = same && std::memcmp(first.data(), got.data(), got.size() * sizeof(float)) == 0;
#if FLOWC_GEMM_AVX2
    flowc::gemm_detail::Problem<float> pr{M, N, K, A, K, false, B, K, true, got.data(), N};
    path = flowc::gemm_detail::use_dot_path(pr) ? "dot" : "packed";
#endif
  }
  std::printf("nt_placement_%dx%dx%d %s %s\n", M, N, K, path, same ? "0" : "inf");
}

int main() {
  // (M, N, K): the MLP's two layers, LeNet's dense1, M and N off every micro-tile size (4/3 rows,
  // 6/4 columns, kNR), K below, at and around a vector and past a 1024-float K chunk.
  const int shapes[][3] = {{100, 512, 784}, {100, 10, 512}, {100, 512, 3136}, {1, 1, 1}, {7, 13, 5},
                           {5, 7, 33}, {9, 11, 40}, {3, 31, 64}, {130, 9, 300}, {33, 97, 257},
                           {2, 200, 2100}, {256, 40, 1024}, {257, 70, 256}, {64, 64, 64}};
  for (const auto& s : shapes) check(s[0], s[1], s[2], 0, 0, false);
  // Off a cache line, padded rows, NaN/Inf: on the shapes that take the dot path as shipped.
  const int odd[][3] = {{100, 10, 512}, {37, 29, 300}, {6, 5, 49}, {100, 512, 784}};
  for (const auto& s : odd) {
    check(s[0], s[1], s[2], 1, 0, false);
    check(s[0], s[1], s[2], 3, 5, false);
    check(s[0], s[1], s[2], 0, 0, true);
    check(s[0], s[1], s[2], 7, 2, true);
  }
  const int placed[][3] = {{100, 10, 512}, {37, 29, 300}, {6, 5, 49}, {9, 11, 40}, {5, 7, 13}, {100, 512, 784}};
  for (const auto& s : placed) check_placement(s[0], s[1], s[2]);
  return 0;
}
