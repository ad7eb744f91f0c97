// flowc_gemm.h -- the one GEMM used by flowc's generated CPU code.
//
// Self-contained C++17 header. It is #included by generated translation units that are built with
//   g++ -O3 -march=native -fopenmp -std=c++17 -fPIC -shared
// and it must also build without AVX2/FMA (portable path) and without OpenMP (serial).
//
//   namespace flowc {
//   template <class T, class Epilogue>
//   void gemm(int M, int N, int K,
//             const T* A, int lda, bool trans_a,
//             const T* B, int ldb, bool trans_b,
//             T* C, int ldc, Epilogue epi);
//   struct NoEpilogue;
//   }
//
// Row-major C = opA(A) * opB(B), opA(A) is [M,K], opB(B) is [K,N]:
//   trans_a == false: opA(A)(i,k) = A[i*lda + k]      true: A[k*lda + i]
//   trans_b == false: opB(B)(k,j) = B[k*ldb + j]      true: B[j*ldb + k]
// The raw product is *written* to C (no beta: C's old contents are never read, so C may be
// uninitialised scratch). As soon as a tile of C is final (all of K summed) the thread that
// computed it calls
//   epi(int i, int j0, int n, T* c_row)      // c_row == C + i*ldc + j0, n elements
// once for every row segment of the tile, while the tile is still in that core's L2. Over the
// whole call every element of C is passed to the epilogue exactly once. Segments of different
// tiles may be handed to the epilogue concurrently from different threads, so an epilogue must
// only touch data belonging to its own segment (reading shared read-only data, e.g. a bias, is fine).
// K == 0 yields C = 0 and still runs the epilogue.
//
// What the caller must know
//   * No alignment is assumed for A, B, C or the leading dimensions (packing absorbs it).
//   * lda/ldb/ldc are in elements and must be >= the row length actually addressed.
//   * A, B must not overlap C (C is written before all of A/B have been read).
//   * Thread-safety: gemm may be called concurrently from several caller threads. Packing buffers
//     are per-thread (thread_local), allocated on a thread's first call and grown if ever needed,
//     never freed until the thread exits; there is no other shared mutable state.
//   * Parallelism: OpenMP parallel region inside gemm when 2*M*N*K >= FLOWC_GEMM_PAR_MIN_FLOPS
//     (measured on Zen3, see below) using omp_get_max_threads() threads (so OMP_NUM_THREADS is
//     honoured). Called from inside a parallel region, OpenMP's default (no nesting) makes it run on
//     the calling thread only, which is still correct.
//   * Contention: with libgomp's default spin-waiting, a call on a 2-vCPU machine whose other CPU
//     is busy can stall for a scheduler time slice (measured 4-12 ms instead of 0.5 ms for the
//     100x512x784 product). With OMP_WAIT_POLICY=passive the same call degrades gracefully to
//     one-core speed (~1 ms) thanks to dynamic tile claiming; on an idle machine passive adds only
//     the futex wake-up of the worker per call. The runtime should choose (env var, set before
//     the first OpenMP call); this header does not touch global OpenMP state.
//   * T = float with AVX2+FMA uses the packed 6x16 micro-kernel (6x32 with AVX-512F), except C = A * B^T
//     with small N or batch-sized M (a dense layer's x @ W^T), which flowc_gemm_nt.h computes as dot
//     products straight from A's and B's rows (use_dot_path says when). Any other T (double, int, ...) or
//     a build without AVX2/FMA uses a portable cache-blocked loop that the compiler auto-vectorises;
//     T must be default-constructible, copyable and support T(0), + and *.
//
// Compile cost: kept low on purpose because generated TUs are compiled at a user's first call.
// The SIMD code uses GCC/Clang vector extensions and builtins rather than <immintrin.h> (which
// costs ~0.8 s of parsing by itself under -march=native); only small C headers are included.

#pragma once

#include <cstddef>
#include <cstdlib>

#if defined(__AVX2__) && defined(__FMA__) && defined(__GNUC__)
#define FLOWC_GEMM_AVX2 1
#else
#define FLOWC_GEMM_AVX2 0
#endif
// With AVX-512 the micro-kernel's two vectors per row are 16 floats wide (6x32 tiles): on a core
// with full-width 512-bit FMA units (Zen5, Intel server parts) that doubles the flops per cycle
// (measured on the Zen5 VM: 127 GFLOP/s per core with 256-bit FMAs, 257 with 512-bit).  Packing
// keeps its 8-wide transposes; only the micro-panels are twice as wide.
#if FLOWC_GEMM_AVX2 && defined(__AVX512F__)
#define FLOWC_GEMM_AVX512 1
#else
#define FLOWC_GEMM_AVX512 0
#endif

#ifdef _OPENMP
#include <omp.h>
#endif

#if defined(__GNUC__)
#define FLOWC_GEMM_NOINLINE __attribute__((noinline))
#else
#define FLOWC_GEMM_NOINLINE
#endif

// Below this many flops (2*M*N*K) the work runs on the calling thread. Measured on the 2-vCPU
// Zen3 box (libgomp, team already warm, idle machine), serial vs 2 threads:
//   100x10x100   0.2 MFLOP    5.8 vs  4.2 us (min); with a cold team (2 ms idle) parallel loses
//   64x64x64     0.5 MFLOP    6.8 vs  6.1 us          break-even
//   100x10x512   1.0 MFLOP   27   vs 17   us
//   10x512x100   1.0 MFLOP   22   vs 14   us
//   100x512x10   1.0 MFLOP   17   vs 12   us
// so the three ~1 MFLOP products of the MLP backward/logits do gain from 2 threads when the team
// is warm; the threshold sits at the measured break-even. Override with -DFLOWC_GEMM_PAR_MIN_FLOPS=.
// On the 2-vCPU VM that runs the benchmarks the team is rarely warm, though: between two steps
// (Python feeding the next call) the worker parks, and waking it costs 50-150 us there. Measured
// inside the MLP train step (FLOWC_PROFILE, 2000 steps), the three 1 MFLOP products took 75-140 us
// each on 2 threads against 30-45 us on one, so the threshold was 4 MFLOP.  Since then a synchronous
// call runs its step on the caller's thread (runtime/pipeline.py run_now) about 15 us after the
// previous one, and libgomp's default wait policy keeps the worker spinning that long, so the team
// is warm again.  Measured on the 2-vCPU Zen5 VM (AVX-512 kernels, default wait policy, idle):
// the MLP predict's 100x10x512 logits right after its 100x512x784 product, 31 -> 22 us (mean of
// 3000); inside the MLP train step (FLOWC_PROFILE, 3000 steps) the three 1 MFLOP products
// 34 -> 28, 28 -> 25 and 12.7 -> 12.2 us.  Hence 0.9 MFLOP.  With OMP_WAIT_POLICY=passive (the
// test suite's setting) a worker parks at once and every region pays a wake-up.
#ifndef FLOWC_GEMM_PAR_MIN_FLOPS
#define FLOWC_GEMM_PAR_MIN_FLOPS 900000.0
#endif

// Tiles are claimed from a shared counter (1) rather than split statically (0). On a 2-vCPU box
// whose other CPU is busy (another process, the runtime's own threads), a static split makes the
// caller wait for the descheduled worker's share; with dynamic claiming the running thread takes
// the remaining tiles. (The end-of-region barrier still waits for every worker to show up: see
// the note on OMP_WAIT_POLICY in the header comment.)
#ifndef FLOWC_GEMM_DYNAMIC
#define FLOWC_GEMM_DYNAMIC 1
#endif

namespace flowc {

struct NoEpilogue {
  template <class T>
  void operator()(int, int, int, T*) const {}
};

namespace gemm_detail {

// ---------------------------------------------------------------------------------------------
// Blocking parameters (float / AVX2 path).
//
//   MR x NR = 6 x 16 micro-tile: 12 ymm accumulators + 2 ymm for the B row + 1 broadcast of A = 15
//   of the 16 ymm registers (with AVX-512, 6 x 32 in zmm registers: the same 15 of 32). Zen3 has two 256-bit FMA pipes with 4-cycle latency, so at least 8
//   independent accumulators are needed to keep both busy; 12 gives slack. Per k the kernel issues
//   12 FMAs against 2 loads + 6 broadcasts, well under Zen3's 3 loads/cycle.
//
//   KC = 256: one packed B micro-panel (KC x 16 floats = 16 KiB; 32 KiB at 6x32) stays in L1d while the
//   kernel sweeps down the packed A block, with room left for the A micro-panel (6 KiB) and C.
//   K is split into ceil(K/KC) equal chunks (K=784 -> 4 chunks of 196), so no tiny leftover chunk.
//
//   MC = 144 (24 micro-rows): the packed A block MC x KC = 144 KiB lives in the 512 KiB L2 and is
//   reused NC/16 times; with the C tile (MC x NC <= 144 KiB) that is 288 KiB, leaving room for the
//   B micro-panels streaming through. The C tile is therefore still in L2 when the epilogue runs.
//   (Measured, 1 thread: MC 96/144/192, NC 128/256/512, KC 192/256/384 are all within noise of
//   each other, 85-91 GFLOP/s, i.e. at the speed of the micro-kernel alone, ~91 GFLOP/s.)
//
//   NC = 256: the packed B panel KC x NC = 256 KiB; each 16 KiB micro-panel of it is reused MC/6
//   times from L1. 256 also splits N=512 (the MLP hidden layer) exactly in two, one per core.
//
// Tiles (MC x NC blocks of C) are the unit of parallel work: a thread claims whole tiles, loops
// over all of K for a tile, and then runs the epilogue on it. A and B panels are packed per thread
// (a panel needed by tiles on two threads is packed twice; that costs ~1/MC resp. ~1/NC of the
// flops, a few percent, and needs no synchronisation). When a tile's row block and K chunk are the
// same as the previous tile's on this thread, the packed A block is reused.
// ---------------------------------------------------------------------------------------------
constexpr int kMR = 6;
constexpr int kNR = FLOWC_GEMM_AVX512 ? 32 : 16;  // two kernel vectors (see vkf below)
#ifndef FLOWC_GEMM_MC
#define FLOWC_GEMM_MC 144
#endif
#ifndef FLOWC_GEMM_NC
#define FLOWC_GEMM_NC 256
#endif
#ifndef FLOWC_GEMM_KC
#define FLOWC_GEMM_KC 256
#endif
constexpr int kMC = FLOWC_GEMM_MC;  // multiple of kMR
constexpr int kNC = FLOWC_GEMM_NC;  // multiple of kNR
constexpr int kKC = FLOWC_GEMM_KC;
static_assert(kMC % kMR == 0 && kNC % kNR == 0, "block sizes must be multiples of the micro-tile");

template <class T> struct is_float { static constexpr bool value = false; };
template <> struct is_float<float> { static constexpr bool value = true; };

inline int ceil_div(int a, int b) { return (a + b - 1) / b; }
inline int round_up(int a, int b) { return ceil_div(a, b) * b; }

// How C is cut into tiles and K into chunks, and how many threads run.
struct Plan {
  int mc, nc, kc;  // tile height, tile width, K chunk
  int mt, nt, kt;  // number of tiles down M, across N, and K chunks
  int threads;
};

// mr/nr: granularity the tile sizes are rounded to; mc_max/nc_max/kc_max: cache-derived limits.
inline Plan make_plan(int M, int N, int K, int mr, int nr, int mc_max, int nc_max, int kc_max) {
  Plan p;
  p.kt = K > 0 ? ceil_div(K, kc_max) : 1;
  p.kc = K > 0 ? ceil_div(K, p.kt) : 0;
  int mt = ceil_div(M, mc_max), nt = ceil_div(N, nc_max);

  int threads = 1;
#ifdef _OPENMP
  const double flops = 2.0 * M * N * (double)K;
  if (flops >= FLOWC_GEMM_PAR_MIN_FLOPS && !omp_in_parallel()) threads = omp_get_max_threads();
#endif
  // Give every thread work and avoid a lopsided last round: cut tiles further (the dimension with
  // more micro-tiles per tile first) until there are >= threads tiles and, unless there are
  // plenty, a multiple of `threads`.
  if (threads > 1) {
    for (int guard = 0; guard < 64; ++guard) {
      const int tiles = mt * nt;
      if (tiles >= threads && (tiles % threads == 0 || tiles >= 4 * threads)) break;
      const int m_units = ceil_div(ceil_div(M, mt), mr);  // micro-rows per tile
      const int n_units = ceil_div(ceil_div(N, nt), nr);  // micro-cols per tile
      if (m_units <= 1 && n_units <= 1) break;
      if (n_units >= m_units) ++nt; else ++mt;
    }
  }
  p.mc = round_up(ceil_div(M, mt), mr);
  p.nc = round_up(ceil_div(N, nt), nr);
  p.mt = ceil_div(M, p.mc);
  p.nt = ceil_div(N, p.nc);
  p.threads = threads < p.mt * p.nt ? threads : p.mt * p.nt;
  if (p.threads < 1) p.threads = 1;
  return p;
}

// Runs body(tid, nthreads) on p.threads threads (or inline when 1 / no OpenMP).
template <class Body>
inline void run_parallel(int threads, Body&& body) {
#ifdef _OPENMP
  if (threads > 1) {
#pragma omp parallel num_threads(threads)
    body(omp_get_thread_num(), omp_get_num_threads());
    return;
  }
#endif
  (void)threads;
  body(0, 1);
}

// Static split of `tiles` into `nth` contiguous ranges; tile t -> (row block t / nt, col block t % nt).
inline void tile_range(int tiles, int tid, int nth, int& t0, int& t1) {
  t0 = (int)((long long)tiles * tid / nth);
  t1 = (int)((long long)tiles * (tid + 1) / nth);
}

template <class T, class Epilogue>
inline void zero_and_epilogue(int M, int N, T* C, int ldc, Epilogue& epi) {
  for (int i = 0; i < M; ++i) {
    T* row = C + (std::size_t)i * ldc;
    for (int j = 0; j < N; ++j) row[j] = T(0);
    epi(i, 0, N, row);
  }
}

template <class T>
struct Problem {
  int M, N, K;
  const T* A;
  int lda;
  bool trans_a;
  const T* B;
  int ldb;
  bool trans_b;
  T* C;
  int ldc;
  // Indexed B (see gemm_indexed_b): when b_rows is set, opB(k, j) = B[b_rows[k] + b_cols[j]] and
  // ldb/trans_b are unused.  An implicit-GEMM convolution reads its input image this way.
  const int* b_rows = nullptr;
  const int* b_cols = nullptr;
};


// ---------------------------------------------------------------------------------------------
// Portable path: any T, and float when AVX2/FMA are unavailable.
// B chunk is packed row-major [kc][nc] so the inner loop is a contiguous axpy over the C row that
// the compiler vectorises; the C row segment (<= 256 elements) stays in L1 across the k loop.
// ---------------------------------------------------------------------------------------------
template <class T>
struct GenericBuf {
  T* p = nullptr;
  std::size_t n = 0;
  ~GenericBuf() { delete[] p; }
  T* get(std::size_t need) {
    if (n < need) {
      delete[] p;
      p = new T[need];
      n = need;
    }
    return p;
  }
};

// Computes one tile C[i0:i0+mb, j0:j0+nb] over all of K. Not a template on the epilogue (and not
// inlined), so every extra epilogue in a TU adds only the small driver below, not this code.
template <class T>
FLOWC_GEMM_NOINLINE void generic_tile(const Problem<T>& pr, const Plan& p, int i0, int mb,
                                            int j0, int nb) {
  static thread_local GenericBuf<T> buf;
  T* bp = buf.get((std::size_t)p.kc * p.nc);
  for (int i = i0; i < i0 + mb; ++i) {
    T* crow = pr.C + (std::size_t)i * pr.ldc + j0;
    for (int j = 0; j < nb; ++j) crow[j] = T(0);
  }
  for (int k0 = 0; k0 < pr.K; k0 += p.kc) {
    const int kb = pr.K - k0 < p.kc ? pr.K - k0 : p.kc;
    for (int k = 0; k < kb; ++k) {  // pack opB(k0:k0+kb, j0:j0+nb) as [k][j]
      T* dst = bp + (std::size_t)k * nb;
      if (pr.b_rows) {
        const T* src = pr.B + pr.b_rows[k0 + k];
        for (int j = 0; j < nb; ++j) dst[j] = src[pr.b_cols[j0 + j]];
      } else if (!pr.trans_b) {
        const T* src = pr.B + (std::size_t)(k0 + k) * pr.ldb + j0;
        for (int j = 0; j < nb; ++j) dst[j] = src[j];
      } else {
        const T* src = pr.B + (std::size_t)j0 * pr.ldb + (k0 + k);
        for (int j = 0; j < nb; ++j) dst[j] = src[(std::size_t)j * pr.ldb];
      }
    }
    for (int i = i0; i < i0 + mb; ++i) {
      T* __restrict crow = pr.C + (std::size_t)i * pr.ldc + j0;
      for (int k = 0; k < kb; ++k) {
        const T a = pr.trans_a ? pr.A[(std::size_t)(k0 + k) * pr.lda + i]
                               : pr.A[(std::size_t)i * pr.lda + k0 + k];
        const T* __restrict brow = bp + (std::size_t)k * nb;
        for (int j = 0; j < nb; ++j) crow[j] += a * brow[j];
      }
    }
  }
}

#if FLOWC_GEMM_AVX2 && defined(FLOWC_CORE_LIBRARY) && !defined(FLOWC_CORE_IMPLEMENTATION)
// Generated steps are built against flowc's core library (flowc_core.cpp, compiled once per
// machine and loaded before the step): only the declaration is compiled with each job, which
// saves most of a job's compile time.
void f32_tile(const Problem<float>& pr, const Plan& p, int im, int i0, int mb, int j0, int nb,
              int& packed_im);
#elif FLOWC_GEMM_AVX2
// ---------------------------------------------------------------------------------------------
// float / AVX2 + FMA path.
// Packed layouts:
//   A block: micro-panels of kMR rows; panel p holds opA(i0+6p+r, k0+k) at [p*6*kc + k*6 + r].
//   B panel: micro-panels of kNR cols; panel q holds opB(k0+k, j0+NRq+c) at [q*NR*kc + k*NR + c].
// Rows/cols past the matrix edge are packed as zeros, so the kernel always runs full 6 x kNR.
// ---------------------------------------------------------------------------------------------

// Per-thread packing storage, 64-byte aligned, allocated once per thread (max block sizes).
struct PackBuf {
  float* a = nullptr;  // kMC * kKC (+ slack for the overlapping stores in pack_a)
  float* b = nullptr;  // kKC * kNC
  PackBuf() {
    const std::size_t na = (std::size_t)kMC * kKC + 64, nb = (std::size_t)kKC * kNC;
    a = static_cast<float*>(std::aligned_alloc(64, na * sizeof(float)));
    b = static_cast<float*>(std::aligned_alloc(64, nb * sizeof(float)));
    if (!a || !b) std::abort();
  }
  ~PackBuf() {
    std::free(a);
    std::free(b);
  }
  PackBuf(const PackBuf&) = delete;
  PackBuf& operator=(const PackBuf&) = delete;
};

inline PackBuf& pack_buf() {
  static thread_local PackBuf buf;
  return buf;
}

// Vector types (GCC/Clang vector extensions instead of <immintrin.h>: that header alone costs
// ~0.8 s of parse time per TU with -march=native, more than the rest of a generated step).
// With -mavx2 -mfma these compile to the same vmovups / vbroadcastss / vfmadd231ps / vunpck* code.
typedef float v8f __attribute__((vector_size(32)));                        // 32-byte aligned
typedef float v8f_u __attribute__((vector_size(32), aligned(4), may_alias));  // unaligned access
typedef int v8i __attribute__((vector_size(32)));

inline v8f loadu(const float* p) { return *reinterpret_cast<const v8f_u*>(p); }
inline void storeu(float* p, v8f v) { *reinterpret_cast<v8f_u*>(p) = v; }
inline v8f load(const float* p) { return *reinterpret_cast<const v8f*>(p); }
inline void store(float* p, v8f v) { *reinterpret_cast<v8f*>(p) = v; }
inline v8f splat(float x) { return v8f{x, x, x, x, x, x, x, x}; }

// The micro-kernels' vector: kNR / 2 floats, so that a micro-tile row is two of them (v8f without
// AVX-512).  Packing and the transposes stay 8 wide.
constexpr int kVL = kNR / 2;
typedef float vkf __attribute__((vector_size(kVL * 4)));
typedef float vkf_u __attribute__((vector_size(kVL * 4), aligned(4), may_alias));
inline vkf loadk(const float* p) { return *reinterpret_cast<const vkf*>(p); }       // kVL*4-byte aligned
inline vkf loadku(const float* p) { return *reinterpret_cast<const vkf_u*>(p); }
inline void storeku(float* p, vkf v) { *reinterpret_cast<vkf_u*>(p) = v; }
inline vkf splatk(float x) { return vkf{} + x; }
inline v8f fmadd(v8f a, v8f b, v8f c) {
#if defined(__clang__)
  return a * b + c;  // contracted to vfmadd by clang's default -ffp-contract=on
#else
  return __builtin_ia32_vfmaddps256(a, b, c);  // explicit, so -ffp-contract=off cannot split it
#endif
}
#if FLOWC_GEMM_AVX512
inline vkf fmaddk(vkf a, vkf b, vkf c) {
#if defined(__clang__)
  return a * b + c;
#else
  return __builtin_ia32_vfmaddps512_mask(a, b, c, (unsigned short)0xFFFF, 4);  // 4: current rounding
#endif
}
#else
inline vkf fmaddk(vkf a, vkf b, vkf c) { return fmadd(a, b, c); }
#endif
#if defined(__clang__)
#define FLOWC_SHUF(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#else
#define FLOWC_SHUF(a, b, ...) __builtin_shuffle(a, b, v8i{__VA_ARGS__})
#endif

// In-register 8x8 transpose: on entry r[i] holds row i, on exit r[j] holds column j.
// (unpcklps/unpckhps, shufps 0x44/0xEE, vperm2f128 0x20/0x31: 24 shuffles per 64 floats.)
inline void transpose8(v8f r[8]) {
  const v8f t0 = FLOWC_SHUF(r[0], r[1], 0, 8, 1, 9, 4, 12, 5, 13);
  const v8f t1 = FLOWC_SHUF(r[0], r[1], 2, 10, 3, 11, 6, 14, 7, 15);
  const v8f t2 = FLOWC_SHUF(r[2], r[3], 0, 8, 1, 9, 4, 12, 5, 13);
  const v8f t3 = FLOWC_SHUF(r[2], r[3], 2, 10, 3, 11, 6, 14, 7, 15);
  const v8f t4 = FLOWC_SHUF(r[4], r[5], 0, 8, 1, 9, 4, 12, 5, 13);
  const v8f t5 = FLOWC_SHUF(r[4], r[5], 2, 10, 3, 11, 6, 14, 7, 15);
  const v8f t6 = FLOWC_SHUF(r[6], r[7], 0, 8, 1, 9, 4, 12, 5, 13);
  const v8f t7 = FLOWC_SHUF(r[6], r[7], 2, 10, 3, 11, 6, 14, 7, 15);
  const v8f s0 = FLOWC_SHUF(t0, t2, 0, 1, 8, 9, 4, 5, 12, 13);
  const v8f s1 = FLOWC_SHUF(t0, t2, 2, 3, 10, 11, 6, 7, 14, 15);
  const v8f s2 = FLOWC_SHUF(t1, t3, 0, 1, 8, 9, 4, 5, 12, 13);
  const v8f s3 = FLOWC_SHUF(t1, t3, 2, 3, 10, 11, 6, 7, 14, 15);
  const v8f s4 = FLOWC_SHUF(t4, t6, 0, 1, 8, 9, 4, 5, 12, 13);
  const v8f s5 = FLOWC_SHUF(t4, t6, 2, 3, 10, 11, 6, 7, 14, 15);
  const v8f s6 = FLOWC_SHUF(t5, t7, 0, 1, 8, 9, 4, 5, 12, 13);
  const v8f s7 = FLOWC_SHUF(t5, t7, 2, 3, 10, 11, 6, 7, 14, 15);
  r[0] = FLOWC_SHUF(s0, s4, 0, 1, 2, 3, 8, 9, 10, 11);
  r[1] = FLOWC_SHUF(s1, s5, 0, 1, 2, 3, 8, 9, 10, 11);
  r[2] = FLOWC_SHUF(s2, s6, 0, 1, 2, 3, 8, 9, 10, 11);
  r[3] = FLOWC_SHUF(s3, s7, 0, 1, 2, 3, 8, 9, 10, 11);
  r[4] = FLOWC_SHUF(s0, s4, 4, 5, 6, 7, 12, 13, 14, 15);
  r[5] = FLOWC_SHUF(s1, s5, 4, 5, 6, 7, 12, 13, 14, 15);
  r[6] = FLOWC_SHUF(s2, s6, 4, 5, 6, 7, 12, 13, 14, 15);
  r[7] = FLOWC_SHUF(s3, s7, 4, 5, 6, 7, 12, 13, 14, 15);
}
#undef FLOWC_SHUF

// Pack opA(i0:i0+mb, k0:k0+kb) into 6-row micro-panels at dst.
inline void pack_a(const float* A, int lda, bool trans_a, int M, int i0, int mb, int k0, int kb,
                   float* dst) {
  for (int ip = 0; ip < mb; ip += kMR, dst += (std::size_t)kMR * kb) {
    const int i = i0 + ip;
    const int mr = mb - ip < kMR ? mb - ip : kMR;
    if (!trans_a) {
      // opA(i,k) = A[i*lda+k]: rows are contiguous in k -> transpose 8(k) x 6(i) blocks.
      const float* src = A + (std::size_t)i * lda + k0;
      int k = 0;
      if (mr == kMR) {
        for (; k + 8 <= kb; k += 8) {
          v8f r[8];
          for (int q = 0; q < kMR; ++q) r[q] = loadu(src + (std::size_t)q * lda + k);
          r[6] = r[7] = v8f{};
          transpose8(r);
          // r[q] = the 6 values for k+q plus 2 junk lanes. Storing in increasing q lets each store
          // overwrite the previous one's junk; the last junk lands in the next panel (packed later)
          // or in the buffer's slack.
          for (int q = 0; q < 8; ++q) storeu(dst + (std::size_t)(k + q) * kMR, r[q]);
        }
      }
      for (; k < kb; ++k)
        for (int r = 0; r < kMR; ++r)
          dst[(std::size_t)k * kMR + r] = r < mr ? src[(std::size_t)r * lda + k] : 0.0f;
    } else {
      // opA(i,k) = A[k*lda+i]: the 6 values for one k are contiguous.
      const float* src = A + (std::size_t)k0 * lda + i;
      if (mr == kMR && i + 8 <= M) {  // the 8-wide load stays inside row k (it has >= M elements)
        for (int k = 0; k < kb; ++k)
          storeu(dst + (std::size_t)k * kMR, loadu(src + (std::size_t)k * lda));
      } else {
        for (int k = 0; k < kb; ++k)
          for (int r = 0; r < kMR; ++r)
            dst[(std::size_t)k * kMR + r] = r < mr ? src[(std::size_t)k * lda + r] : 0.0f;
      }
    }
  }
}

// Pack opB(k0:k0+kb, j0:j0+nb) into kNR-column micro-panels at dst (64-byte aligned).
inline void pack_b(const float* B, int ldb, bool trans_b, int j0, int nb, int k0, int kb, float* dst) {
  for (int jp = 0; jp < nb; jp += kNR, dst += (std::size_t)kNR * kb) {
    const int j = j0 + jp;
    const int nr = nb - jp < kNR ? nb - jp : kNR;
    if (!trans_b) {
      // opB(k,j) = B[k*ldb+j]: 16 contiguous floats per k.
      const float* src = B + (std::size_t)k0 * ldb + j;
      if (nr == kNR) {
        for (int k = 0; k < kb; ++k) {
          const float* s = src + (std::size_t)k * ldb;
          for (int h = 0; h < kNR; h += 8) store(dst + (std::size_t)k * kNR + h, loadu(s + h));
        }
      } else {
        for (int k = 0; k < kb; ++k)
          for (int c = 0; c < kNR; ++c)
            dst[(std::size_t)k * kNR + c] = c < nr ? src[(std::size_t)k * ldb + c] : 0.0f;
      }
    } else {
      // opB(k,j) = B[j*ldb+k]: each column j is contiguous in k -> kNR/8 8x8 transposes per 8 k.
      const float* src = B + (std::size_t)j * ldb + k0;
      int k = 0;
      if (nr == kNR) {
        for (; k + 8 <= kb; k += 8) {
          for (int h = 0; h < kNR; h += 8) {
            v8f r[8];
            for (int q = 0; q < 8; ++q) r[q] = loadu(src + (std::size_t)(h + q) * ldb + k);
            transpose8(r);
            for (int q = 0; q < 8; ++q) store(dst + (std::size_t)(k + q) * kNR + h, r[q]);
          }
        }
      }
      for (; k < kb; ++k)
        for (int c = 0; c < kNR; ++c)
          dst[(std::size_t)k * kNR + c] = c < nr ? src[(std::size_t)c * ldb + k] : 0.0f;
    }
  }
}

// Pack an indexed B, opB(k, j) = B[rows[k] + cols[j]], like pack_b.  A micro-panel whose 16
// column offsets are consecutive is kNR/8 plain loads per k; any other is kNR scalar copies.
inline void pack_b_indexed(const float* B, const int* rows, const int* cols, int j0, int nb, int k0,
                           int kb, float* dst) {
  for (int jp = 0; jp < nb; jp += kNR, dst += (std::size_t)kNR * kb) {
    const int* idx = cols + j0 + jp;
    const int nr = nb - jp < kNR ? nb - jp : kNR;
    if (nr < kNR) {
      for (int k = 0; k < kb; ++k) {
        const float* src = B + rows[k0 + k];
        for (int c = 0; c < kNR; ++c) dst[(std::size_t)k * kNR + c] = c < nr ? src[idx[c]] : 0.0f;
      }
      continue;
    }
    bool consecutive = true;
    for (int c = 1; c < kNR; ++c) consecutive = consecutive && idx[c] == idx[0] + c;
    if (consecutive) {
      for (int k = 0; k < kb; ++k) {
        const float* s = B + rows[k0 + k] + idx[0];
        for (int h = 0; h < kNR; h += 8) store(dst + (std::size_t)k * kNR + h, loadu(s + h));
      }
      continue;
    }
    // Scalar copies: measured faster than AVX2 gathers on Zen3 (LeNet conv2, per image: 320 us
    // against 370 for the whole GEMM; im2col then a plain GEMM took 410).
    for (int k = 0; k < kb; ++k) {
      const float* src = B + rows[k0 + k];
      for (int c = 0; c < kNR; ++c) dst[(std::size_t)k * kNR + c] = src[idx[c]];
    }
  }
}

// Stores a micro-tile's 6 x kNR accumulators at c (rows ldc floats apart), added to what is there
// when `accumulate`: the GEMM micro-kernel and the direct convolution's tile (im2col.h) end alike.
__attribute__((always_inline)) inline void store_tile(
    float* c, std::ptrdiff_t ldc, bool accumulate, vkf c00, vkf c01, vkf c10, vkf c11, vkf c20, vkf c21,
    vkf c30, vkf c31, vkf c40, vkf c41, vkf c50, vkf c51) {
  float* r0 = c;
  float* r1 = r0 + ldc;
  float* r2 = r1 + ldc;
  float* r3 = r2 + ldc;
  float* r4 = r3 + ldc;
  float* r5 = r4 + ldc;
  if (accumulate) {
    c00 += loadku(r0); c01 += loadku(r0 + kVL);
    c10 += loadku(r1); c11 += loadku(r1 + kVL);
    c20 += loadku(r2); c21 += loadku(r2 + kVL);
    c30 += loadku(r3); c31 += loadku(r3 + kVL);
    c40 += loadku(r4); c41 += loadku(r4 + kVL);
    c50 += loadku(r5); c51 += loadku(r5 + kVL);
  }
  storeku(r0, c00); storeku(r0 + kVL, c01);
  storeku(r1, c10); storeku(r1 + kVL, c11);
  storeku(r2, c20); storeku(r2 + kVL, c21);
  storeku(r3, c30); storeku(r3 + kVL, c31);
  storeku(r4, c40); storeku(r4 + kVL, c41);
  storeku(r5, c50); storeku(r5 + kVL, c51);
}

// 6 x kNR micro-kernel: acc = sum_k a[k*6+r] * b[k*kNR+c]; then C = acc (first K chunk) or C += acc.
inline void kernel_6xNR(int kc, const float* __restrict a, const float* __restrict b, float* c,
                        int ldc, bool accumulate) {
  vkf c00 = vkf{}, c01 = vkf{};
  vkf c10 = vkf{}, c11 = vkf{};
  vkf c20 = vkf{}, c21 = vkf{};
  vkf c30 = vkf{}, c31 = vkf{};
  vkf c40 = vkf{}, c41 = vkf{};
  vkf c50 = vkf{}, c51 = vkf{};
#pragma GCC unroll 4
  for (int k = 0; k < kc; ++k) {
    const vkf b0 = loadk(b), b1 = loadk(b + kVL);
    vkf av;
    av = splatk(a[0]); c00 = fmaddk(av, b0, c00); c01 = fmaddk(av, b1, c01);
    av = splatk(a[1]); c10 = fmaddk(av, b0, c10); c11 = fmaddk(av, b1, c11);
    av = splatk(a[2]); c20 = fmaddk(av, b0, c20); c21 = fmaddk(av, b1, c21);
    av = splatk(a[3]); c30 = fmaddk(av, b0, c30); c31 = fmaddk(av, b1, c31);
    av = splatk(a[4]); c40 = fmaddk(av, b0, c40); c41 = fmaddk(av, b1, c41);
    av = splatk(a[5]); c50 = fmaddk(av, b0, c50); c51 = fmaddk(av, b1, c51);
    a += kMR;
    b += kNR;
  }
  store_tile(c, ldc, accumulate, c00, c01, c10, c11, c20, c21, c30, c31, c40, c41, c50, c51);
}

// Edge micro-tile (mr < 6 or nr < kNR): run the full kernel into a local tile, copy the valid part.
inline void kernel_edge(int kc, const float* a, const float* b, float* c, int ldc, int mr, int nr,
                        bool accumulate) {
  alignas(64) float tmp[kMR * kNR];
  kernel_6xNR(kc, a, b, tmp, kNR, false);
  for (int r = 0; r < mr; ++r) {
    float* crow = c + (std::size_t)r * ldc;
    const float* trow = tmp + r * kNR;
    if (accumulate)
      for (int j = 0; j < nr; ++j) crow[j] += trow[j];
    else
      for (int j = 0; j < nr; ++j) crow[j] = trow[j];
  }
}

// Computes one tile C[i0:i0+mb, j0:j0+nb] over all of K (see generic_tile for why it is separate).
// packed_im: row block whose packed A is in buf.a from this thread's previous tile (reusable only
// when K is a single chunk), or -1.
#ifdef FLOWC_CORE_IMPLEMENTATION
#define FLOWC_CORE_INLINE __attribute__((visibility("default")))
#else
#define FLOWC_CORE_INLINE inline
#endif
FLOWC_GEMM_NOINLINE FLOWC_CORE_INLINE void f32_tile(const Problem<float>& pr, const Plan& p, int im,
                                               int i0, int mb, int j0, int nb, int& packed_im) {
  PackBuf& buf = pack_buf();
  for (int kk = 0; kk < p.kt; ++kk) {
    const int k0 = kk * p.kc;
    const int kb = pr.K - k0 < p.kc ? pr.K - k0 : p.kc;
    const bool acc = kk > 0;
    if (!(p.kt == 1 && packed_im == im)) {
      pack_a(pr.A, pr.lda, pr.trans_a, pr.M, i0, mb, k0, kb, buf.a);
      packed_im = p.kt == 1 ? im : -1;
    }
    if (pr.b_rows)
      pack_b_indexed(pr.B, pr.b_rows, pr.b_cols, j0, nb, k0, kb, buf.b);
    else
      pack_b(pr.B, pr.ldb, pr.trans_b, j0, nb, k0, kb, buf.b);
    // jr outer / ir inner: the 16 KiB B micro-panel stays in L1 while the A block streams from L2.
    for (int jp = 0; jp < nb; jp += kNR) {
      const int nr = nb - jp < kNR ? nb - jp : kNR;
      const float* bp = buf.b + (std::size_t)jp * kb;
      for (int ip = 0; ip < mb; ip += kMR) {
        const int mr = mb - ip < kMR ? mb - ip : kMR;
        const float* ap = buf.a + (std::size_t)ip * kb;
        float* cp = pr.C + (std::size_t)(i0 + ip) * pr.ldc + j0 + jp;
        if (mr == kMR && nr == kNR)
          kernel_6xNR(kb, ap, bp, cp, pr.ldc, acc);
        else
          kernel_edge(kb, ap, bp, cp, pr.ldc, mr, nr, acc);
      }
    }
  }
}

#endif  // FLOWC_GEMM_AVX2
}  // namespace gemm_detail
}  // namespace flowc

#include "flowc_gemm_nt.h"

namespace flowc {
namespace gemm_detail {

// Whether A * B^T (both rows contiguous in k) goes through the dot-product path (flowc_gemm_nt.h).
// It saves re-packing B (N x K every call, which the M rows of a small batch do not amortise) and
// pads N only to kDotNR, but folds every output's partial sums once per K chunk, which short rows
// do not amortise.  Measured on the 2-vCPU Zen5 VM (AVX-512, B and A 4 bytes off a cache line,
// as a NumPy batch is; shared machine, minima), packed against dot:
//   100x512x784   2 threads  206 -> 178 us     100x10x512    2 threads  14 -> 3.2 us
//   200x300x384   1 thread   258 -> 226 us     100x10x64     1 thread   3.1 -> 1.5 us
//   1000x1000x256 1 thread   2.58 -> 2.80 ms   1000x1000x100 1 thread   1.00 -> 1.66 ms
//   500x300x37    2 threads  36 -> 87 us       2000x64x64    2 threads  49 -> 83 us
//   100x512x3136  2 threads  1.02 -> 0.79 ms   (AVX2 build, 1 thread: 100x512x784 720 -> 680 us,
//                                               100x10x512 18.6 -> 10.7 us)
// so: narrow B (the packed path pads N to a whole kNR panel) unless K is tiny, and batch-sized M
// with K long enough for the folds.  FLOWC_GEMM_NT_DOT=0/1 forces the packed / dot path.
inline bool use_dot_path(const Problem<float>& pr) {
  if (pr.b_rows || pr.trans_a || !pr.trans_b) return false;
#ifdef FLOWC_GEMM_NT_DOT
  return FLOWC_GEMM_NT_DOT != 0;
#else
  if (pr.N < kNR) return pr.K >= 32;
  return pr.M <= 256 && pr.K >= 256;
#endif
}
template <class T>
inline bool use_dot_path(const Problem<T>&) { return false; }

// The only part instantiated per epilogue: plan, parallel loop over tiles, epilogue per tile.
template <class T, class Epilogue>
void gemm_driver(const Problem<T>& pr, Epilogue& epi) {
#if FLOWC_GEMM_AVX2
  constexpr bool fast = is_float<T>::value;
#else
  constexpr bool fast = false;
#endif
  // Generic path: 64-row tiles, 256-wide rows (2 KiB of double per C row segment stays in L1
  // across the k loop), K chunk 128 (packed B chunk 128x256 doubles = 256 KiB, half of L2).
  const bool dot = fast && use_dot_path(pr);
  const Plan p = dot    ? make_plan(pr.M, pr.N, pr.K, kDotMR, kDotNR, kDotMC, kDotNC, kDotKC)
                 : fast ? make_plan(pr.M, pr.N, pr.K, kMR, kNR, kMC, kNC, kKC)
                        : make_plan(pr.M, pr.N, pr.K, 1, 8, 64, 256, 128);
  const int tiles = p.mt * p.nt;
  int next_tile = 0;  // shared tile counter (dynamic schedule)
  run_parallel(p.threads, [&](int tid, int nth) {
    int packed_im = -1;
#if FLOWC_GEMM_DYNAMIC
    (void)tid;
    for (;;) {
      int t;
      if (nth == 1) {
        t = next_tile++;
      } else {
#ifdef _OPENMP
#pragma omp atomic capture
#endif
        t = next_tile++;
      }
      if (t >= tiles) break;
#else
    (void)next_tile;
    int t0, t1;
    tile_range(tiles, tid, nth, t0, t1);
    for (int t = t0; t < t1; ++t) {
#endif
      const int im = t / p.nt, jn = t % p.nt;
      const int i0 = im * p.mc, j0 = jn * p.nc;
      const int mb = pr.M - i0 < p.mc ? pr.M - i0 : p.mc;
      const int nb = pr.N - j0 < p.nc ? pr.N - j0 : p.nc;
#if FLOWC_GEMM_AVX2
      if constexpr (fast) {
        if (dot)
          f32_dot_tile(pr, p, i0, mb, j0, nb);
        else
          f32_tile(pr, p, im, i0, mb, j0, nb, packed_im);
      } else
#endif
        generic_tile(pr, p, i0, mb, j0, nb);
      // The tile is final and still in this core's L2: hand its rows to the epilogue.
      for (int i = i0; i < i0 + mb; ++i) epi(i, j0, nb, pr.C + (std::size_t)i * pr.ldc + j0);
    }
    (void)packed_im;
  });
}

// The float driver behind one function pointer per row segment, so that a step built against the
// core library (FLOWC_CORE_LIBRARY) compiles none of the GEMM: it passes its epilogue as a plain
// function.  One indirect call per row segment of a tile is nothing next to the tile's K FMAs.
typedef void (*RowEpilogueFn)(void* ctx, int i, int j0, int n, float* c_row);

template <class Epilogue>
void call_epilogue(void* ctx, int i, int j0, int n, float* c_row) {
  (*static_cast<Epilogue*>(ctx))(i, j0, n, c_row);
}

#if FLOWC_GEMM_AVX2 && defined(FLOWC_CORE_LIBRARY) && !defined(FLOWC_CORE_IMPLEMENTATION)
void gemm_f32_core(const Problem<float>& pr, RowEpilogueFn epi, void* ctx);
#elif FLOWC_GEMM_AVX2 && defined(FLOWC_CORE_IMPLEMENTATION)
__attribute__((visibility("default"))) void gemm_f32_core(const Problem<float>& pr, RowEpilogueFn epi,
                                                          void* ctx) {
  auto row = [=](int i, int j0, int n, float* c_row) { epi(ctx, i, j0, n, c_row); };
  gemm_driver(pr, row);
}
#endif

template <class T, class Epilogue>
void run(const Problem<T>& pr, Epilogue& epi) {
  if (pr.M <= 0 || pr.N <= 0) return;
  if (pr.K <= 0) {
    zero_and_epilogue(pr.M, pr.N, pr.C, pr.ldc, epi);
    return;
  }
#if FLOWC_GEMM_AVX2 && defined(FLOWC_CORE_LIBRARY)
  if constexpr (is_float<T>::value) {
    gemm_f32_core(pr, &call_epilogue<Epilogue>, &epi);
  } else {
    gemm_driver(pr, epi);
  }
#else
  gemm_driver(pr, epi);
#endif
}
}  // namespace gemm_detail

template <class T, class Epilogue>
void gemm(int M, int N, int K, const T* A, int lda, bool trans_a, const T* B, int ldb, bool trans_b,
          T* C, int ldc, Epilogue epi) {
  gemm_detail::run(gemm_detail::Problem<T>{M, N, K, A, lda, trans_a, B, ldb, trans_b, C, ldc}, epi);
}

// gemm with an indexed B: opB(k, j) = B[b_rows[k] + b_cols[j]] (K resp. N int offsets, which must
// stay valid for the call).  A convolution's column matrix is such a B over its (padded) input, so
// the convolution runs as one GEMM without writing the column matrix (see im2col.h).
template <class T, class Epilogue>
void gemm_indexed_b(int M, int N, int K, const T* A, int lda, bool trans_a, const T* B,
                    const int* b_rows, const int* b_cols, T* C, int ldc, Epilogue epi) {
  gemm_detail::Problem<T> pr{M, N, K, A, lda, trans_a, B, 0, false, C, ldc};
  pr.b_rows = b_rows;
  pr.b_cols = b_cols;
  gemm_detail::run(pr, epi);
}

}  // namespace flowc
