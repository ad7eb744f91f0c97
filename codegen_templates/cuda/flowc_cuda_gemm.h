// flowc_cuda_gemm.h -- the block-level GEMM tile behind flowc's matmul and convolution kernels.
//
//   flowc::gemm_tile<T, A_K_FAST, B_N_FAST>(M, N, k_begin, k_end, m0, n0, load_a, load_b, epi)
//
// One thread block computes the BM x BN tile of C = A * B whose top-left corner is (m0, n0),
// summing k over [k_begin, k_end).  The operands are not pointers but loaders,
//   T load_a(int m, int k)    T load_b(int k, int n)
// called only inside the bounds, so one tile serves a plain GEMM (transposed or not), an
// implicit-GEMM convolution (load_b gathers the im2col element on the fly: no column buffer)
// and the filter gradient.  A_K_FAST / B_N_FAST say which index walks contiguous memory, so the
// loads of a warp are coalesced.  Each finished element is handed to
//   epi(int m, int n, T acc)
// exactly once, by the thread that computed it; that is where the fused pointwise consumers
// (bias, activation, optimizer update) run.
//
// Every thread of the block must call it (it synchronizes).  The FP32 path is exact in the
// sense of the CPU backend: FP32 products and sums (with FMA).  gemm_tile_tf32 (sm_80+) runs
// the products on tensor cores with TF32 inputs and FP32 accumulation; the generator uses it
// only when asked (FLOWC_TF32=1).
#pragma once

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#include <mma.h>
#endif

namespace flowc {

constexpr int kGemmBM = 64, kGemmBN = 64, kGemmBK = 16;
constexpr int kGemmThreads = 256;        // 16 x 16 threads, 4 x 4 outputs each
constexpr int kGemmTf32Threads = 128;    // 4 warps, 32 x 32 outputs each

template <class T, bool A_K_FAST, bool B_N_FAST, class LoadA, class LoadB, class Epilogue>
__device__ __forceinline__ void gemm_tile(int M, int N, int k_begin, int k_end, int m0, int n0,
                                          LoadA load_a, LoadB load_b, Epilogue epi) {
  constexpr int BM = kGemmBM, BN = kGemmBN, BK = kGemmBK;
  // K-major tiles; the +1 keeps the column-wise stores of a warp off a single bank.
  __shared__ T As[BK][BM + 1];
  __shared__ T Bs[BK][BN + 1];
  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
  T acc[4][4];
#pragma unroll
  for (int r = 0; r < 4; ++r)
#pragma unroll
    for (int c = 0; c < 4; ++c) acc[r][c] = T(0);

  for (int k0 = k_begin; k0 < k_end; k0 += BK) {
#pragma unroll
    for (int e = tid; e < BM * BK; e += kGemmThreads) {
      const int m = A_K_FAST ? e / BK : e % BM;
      const int k = A_K_FAST ? e % BK : e / BM;
      const int gm = m0 + m, gk = k0 + k;
      As[k][m] = (gm < M && gk < k_end) ? load_a(gm, gk) : T(0);
    }
#pragma unroll
    for (int e = tid; e < BK * BN; e += kGemmThreads) {
      const int n = B_N_FAST ? e % BN : e / BK;
      const int k = B_N_FAST ? e / BN : e % BK;
      const int gn = n0 + n, gk = k0 + k;
      Bs[k][n] = (gn < N && gk < k_end) ? load_b(gk, gn) : T(0);
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < BK; ++k) {
      T a[4], b[4];
#pragma unroll
      for (int r = 0; r < 4; ++r) a[r] = As[k][ty + 16 * r];
#pragma unroll
      for (int c = 0; c < 4; ++c) b[c] = Bs[k][tx + 16 * c];
#pragma unroll
      for (int r = 0; r < 4; ++r)
#pragma unroll
        for (int c = 0; c < 4; ++c) acc[r][c] += a[r] * b[c];
    }
    __syncthreads();
  }
  // Rows ty + 16r and columns tx + 16c: neighbouring threads write neighbouring columns.
#pragma unroll
  for (int r = 0; r < 4; ++r)
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int gm = m0 + ty + 16 * r, gn = n0 + tx + 16 * c;
      if (gm < M && gn < N) epi(gm, gn, acc[r][c]);
    }
}

// The same tile on tensor cores: TF32 products, FP32 accumulation (wmma 16x16x8 fragments).
// The accumulators go through shared memory so the epilogue sees (m, n, acc) as above.
template <bool A_K_FAST, bool B_N_FAST, class LoadA, class LoadB, class Epilogue>
__device__ __forceinline__ void gemm_tile_tf32(int M, int N, int k_begin, int k_end, int m0, int n0,
                                               LoadA load_a, LoadB load_b, Epilogue epi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using namespace nvcuda;
  constexpr int BM = kGemmBM, BN = kGemmBN, BK = kGemmBK;
  // Leading dimensions are multiples of 4 floats and fragment origins 32-byte aligned, as
  // wmma::load_matrix_sync / store_matrix_sync require.
  constexpr int LDA = BK + 4, LDB = BN + 4, LDC = BN + 4;
  __shared__ __align__(32) float As[BM][LDA];
  __shared__ __align__(32) float Bs[BK][LDB];
  __shared__ __align__(32) float Cs[BM][LDC];
  const int tid = threadIdx.x, warp = tid / 32;
  const int wm = warp / 2, wn = warp % 2;          // this warp's 32 x 32 quarter of the tile
  wmma::fragment<wmma::accumulator, 16, 16, 8, float> acc[2][2];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[i][j], 0.0f);

  for (int k0 = k_begin; k0 < k_end; k0 += BK) {
    for (int e = tid; e < BM * BK; e += kGemmTf32Threads) {
      const int m = A_K_FAST ? e / BK : e % BM;
      const int k = A_K_FAST ? e % BK : e / BM;
      const int gm = m0 + m, gk = k0 + k;
      As[m][k] = (gm < M && gk < k_end) ? load_a(gm, gk) : 0.0f;
    }
    for (int e = tid; e < BK * BN; e += kGemmTf32Threads) {
      const int n = B_N_FAST ? e % BN : e / BK;
      const int k = B_N_FAST ? e / BN : e % BK;
      const int gn = n0 + n, gk = k0 + k;
      Bs[k][n] = (gn < N && gk < k_end) ? load_b(gk, gn) : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < BK; kk += 8) {
      wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, wmma::row_major> a[2];
      wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, wmma::row_major> b[2];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        wmma::load_matrix_sync(a[i], &As[wm * 32 + i * 16][kk], LDA);
#pragma unroll
        for (int t = 0; t < a[i].num_elements; ++t) a[i].x[t] = wmma::__float_to_tf32(a[i].x[t]);
      }
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        wmma::load_matrix_sync(b[j], &Bs[kk][wn * 32 + j * 16], LDB);
#pragma unroll
        for (int t = 0; t < b[j].num_elements; ++t) b[j].x[t] = wmma::__float_to_tf32(b[j].x[t]);
      }
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j) wmma::mma_sync(acc[i][j], a[i], b[j], acc[i][j]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j)
      wmma::store_matrix_sync(&Cs[wm * 32 + i * 16][wn * 32 + j * 16], acc[i][j], LDC, wmma::mem_row_major);
  __syncthreads();
  for (int e = tid; e < BM * BN; e += kGemmTf32Threads) {
    const int m = e / BN, n = e % BN;
    const int gm = m0 + m, gn = n0 + n;
    if (gm < M && gn < N) epi(gm, gn, Cs[m][n]);
  }
#else
  // The generator emits tensor-core kernels only for sm_80 and newer.
  __trap();
#endif
}

}  // namespace flowc
